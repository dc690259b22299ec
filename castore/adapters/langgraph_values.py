"""How a LangGraph saver stores channel values and task writes as castore objects.

Values go through the saver's serializer (``dumps_typed`` / ``loads_typed``): small ones
inline in the tree that names them, larger ones as content-addressed
:class:`~castore.objects.Value` objects, so a value that did not change keeps its object.
A list value (the ``messages`` channel) is stored element by element in a persistent list:
complete blocks of ``R**k`` elements are trees shared by every later snapshot, so appending
one message costs O(1) new bytes, not a copy of the list.

Decoded values of immutable objects (messages, strings, numbers) are cached and shared
between snapshots, so listing a long thread decodes each message once. Elements of list
channels are treated as immutable once checkpointed, as LangGraph's reducers treat them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import objects as o
from ..objects import Commit, Tree, Value

if TYPE_CHECKING:
    from ..session import SessionHost

#: fan-out of the persistent lists: complete blocks hold R**k elements
R = 8
#: serialized values up to this size are kept inside the tree that names them
INLINE_MAX = 96
_CACHE_MAX = 200_000
#: elements whose serialized entry is kept (by object identity), newest last
_RECENT_MAX = 64
_IMMUTABLE = (str, int, float, bool, bytes, type(None), BaseMessage)

Entry = Any  # an element as stored: 32 raw id bytes (a Value) or a (type, data) tuple
Top = tuple[int, str, Any]  # (size, "e" element entry | "n" node raw id, ref)


def _shareable(obj: Any) -> bool:
    if isinstance(obj, tuple):
        return all(_shareable(x) for x in obj)
    return isinstance(obj, _IMMUTABLE)


def _block_sizes(n: int) -> list[int]:
    """Sizes of the complete blocks a list of ``n`` elements is made of, oldest first."""
    sizes: list[int] = []
    k, p = 0, 1
    while p * R <= n:
        p *= R
        k += 1
    while p >= 1:
        d, n = divmod(n, p)
        sizes.extend([p] * d)
        p //= R
    return sizes


@dataclass
class _ListState:
    """A stored list, with what is needed to append to it without rewriting it."""

    items: list[Any]
    entries: list[Entry]
    tops: list[Top]
    prefix: tuple[int, bytes] | None = None  # (elements covered, id) of the root's prefix tree
    shareable: bool = False  # every element is immutable: ``items`` may be handed out as the list


def remember(cache: OrderedDict, key: Hashable, value: Any) -> None:
    """Put ``key`` in a bounded cache, dropping the oldest entry when it is full."""
    cache[key] = value
    if len(cache) > _CACHE_MAX:
        cache.popitem(last=False)


class ChannelValues:
    """Encodes and decodes channel values and writes, with caches shared across snapshots.

    Args:
        store: the castore store objects are read from (and cached in).
        serde: the saver's LangGraph serializer.
    """

    def __init__(self, store: SessionHost, serde: SerializerProtocol) -> None:
        self.store = store
        self.serde = serde
        self._decoded: OrderedDict[str, Any] = OrderedDict()  # Value id -> shared decoded value
        self._nodes: OrderedDict[str, tuple[Entry, ...]] = OrderedDict()  # node id -> entries
        self._node_objs: OrderedDict[str, tuple[Any, ...]] = OrderedDict()  # node id -> shared elements
        self._lists: OrderedDict[str, _ListState] = OrderedDict()  # root id -> state
        # id(element) -> (element, its entry, its Value's canonical bytes): a message a task
        # wrote is stored again as the new element of the channel it went to (same object)
        self._recent: OrderedDict[int, tuple[Any, Entry, bytes | None]] = OrderedDict()

    # -- small caches ----------------------------------------------------------------------
    def loads(self, typed: Any) -> Any:
        """Decode a ``(type, data)`` pair with the serializer."""
        return self.serde.loads_typed((typed[0], typed[1]))

    def value(self, raw: bytes) -> Any:
        """Decode a Value holding ``[type, data]``; immutable results are shared.

        Raises:
            IntegrityError: the object is not a Value. ObjectNotFound, StorageError.
        """
        vid = o.hex_id(raw)
        got = self._decoded.get(vid, _MISSING)
        if got is not _MISSING:
            return got
        obj = self.store.objects.get(vid)
        if not isinstance(obj, Value):
            raise o.IntegrityError(vid, "expected a value")
        out = self.loads(obj.value)
        if _shareable(out):
            remember(self._decoded, vid, out)
        return out

    # -- encoding values -------------------------------------------------------------------
    def put_obj(self, pending: dict[str, bytes], obj: Any) -> bytes:
        """Encode ``obj`` into ``pending`` (written by the caller with its commit); return its raw id."""
        oid, canonical = self.store.objects.codec.encode(obj)
        pending[oid] = canonical
        self.store.objects.cache(oid, obj)
        return o.raw_id(oid)

    def _entry(self, pending: dict[str, bytes], obj: Any) -> Entry:
        got = self._recent.get(id(obj))
        if got is not None and got[0] is obj:
            if got[2] is not None:
                pending[o.hex_id(got[1])] = got[2]
            return got[1]
        typ, data = self.serde.dumps_typed(obj)
        if len(data) <= INLINE_MAX:
            entry: Entry = (typ, data)
            canonical = None
        else:
            entry = self.put_obj(pending, Value([typ, data]))
            canonical = pending[o.hex_id(entry)]
        if _shareable(obj):
            if canonical is not None:
                remember(self._decoded, o.hex_id(entry), obj)
            self._recent[id(obj)] = (obj, entry, canonical)
            if len(self._recent) > _RECENT_MAX:
                self._recent.popitem(last=False)
        return entry

    @staticmethod
    def _place(tree: dict[str, dict[str, Any]], key: str, kind: str, ref: Any) -> None:
        if kind == "n":
            tree["sub"][key] = ref
        elif isinstance(ref, bytes):
            tree["refs"][key] = ref
        else:
            tree["values"][key] = list(ref)

    def _node(self, pending: dict[str, bytes], children: list[Top]) -> bytes:
        parts: dict[str, dict[str, Any]] = {"values": {}, "refs": {}, "sub": {}}
        for i, (_, kind, ref) in enumerate(children):
            self._place(parts, str(i), kind, ref)
        return self.put_obj(pending, Tree(**parts))

    def store_list(self, pending: dict[str, bytes], value: list[Any], base: str | None) -> bytes:
        """Store a list as a persistent list; return its root tree's raw id."""
        state = self.list_state(base) if base is not None else None
        tops: list[Top] = []
        entries: list[Entry] = []
        start = pos = 0
        if state is not None:
            old, n = state.items, min(len(state.items), len(value))
            p = 0
            while p < n and value[p] is old[p]:
                p += 1
            pos = 0
            for top in state.tops:
                if pos + top[0] > p:
                    break
                tops.append(top)
                pos += top[0]
            entries = state.entries[:pos]
            redo = state.entries[pos:p]
            start = p
        else:
            redo = []
        new = redo + [self._entry(pending, x) for x in value[start:]]
        for e in new:
            entries.append(e)
            tops.append((1, "e", e))
            while len(tops) >= R and all(t[0] == tops[-1][0] for t in tops[-R:]):
                size = tops[-1][0] * R
                nid = self._node(pending, tops[-R:])
                remember(self._nodes, o.hex_id(nid), tuple(entries[-size:]))
                tops[-R:] = [(size, "n", nid)]
        # The root names a prefix tree holding the complete blocks (shared by the R roots
        # until the next block completes) and the fewer than R elements after them.
        blocks = [t for t in tops if t[0] > 1]
        m = sum(t[0] for t in blocks)
        parts: dict[str, dict[str, Any]] = {"values": {"n": len(value), "f": 2}, "refs": {}, "sub": {}}
        prefix = None
        if blocks:
            if state is not None and state.prefix is not None and state.prefix[0] == m and m <= pos:
                prefix = state.prefix
            else:
                prefix = (m, self._blocks_tree(pending, blocks, m))
            parts["sub"]["p"] = prefix[1]
        for j, (_, kind, ref) in enumerate(tops[len(blocks):]):
            self._place(parts, f"t{j}", kind, ref)
        root = self.put_obj(pending, Tree(**parts))
        shareable = (state is None or state.shareable) and all(_shareable(x) for x in value[start:])
        remember(self._lists, o.hex_id(root), _ListState(list(value), entries, tops, prefix, shareable))
        return root

    def _blocks_tree(self, pending: dict[str, bytes], tops: list[Top], n: int) -> bytes:
        parts: dict[str, dict[str, Any]] = {"values": {"n": n}, "refs": {}, "sub": {}}
        for j, (_, kind, ref) in enumerate(tops):
            self._place(parts, str(j), kind, ref)
        return self.put_obj(pending, Tree(**parts))

    def store_value(self, pending: dict[str, bytes], parts: dict[str, dict[str, Any]], key: str,
                     value: Any, base: bytes | None) -> None:
        """Store one channel value under ``key`` of a state tree being built: a non-empty list as
        a persistent list (extending ``base``, the list root it had, when given), anything else
        whole."""
        if type(value) is list and value:
            parts["sub"][key] = self.store_list(pending, value, o.hex_id(base) if base else None)
            return
        self._store_whole(pending, parts, key, value)

    def _store_whole(self, pending: dict[str, bytes], parts: dict[str, dict[str, Any]], key: str,
                     value: Any) -> None:
        """Store ``value`` serialized in one piece: inline when small, else as a Value."""
        typ, data = self.serde.dumps_typed(value)
        if len(data) <= INLINE_MAX * 2:
            parts["values"][key] = [typ, data]
        else:
            raw = self.put_obj(pending, Value([typ, data]))
            if _shareable(value):
                remember(self._decoded, o.hex_id(raw), value)
            parts["refs"][key] = raw

    # -- decoding values -------------------------------------------------------------------
    def _expand(self, nid: bytes) -> tuple[Entry, ...]:
        key = o.hex_id(nid)
        got = self._nodes.get(key)
        if got is not None:
            return got
        tree = self.tree(nid)
        out: list[Entry] = []
        for i in range(R):
            k = str(i)
            if k in tree.sub:
                out.extend(self._expand(tree.sub[k]))
            elif k in tree.refs:
                out.append(tree.refs[k])
            elif k in tree.values:
                out.append(tuple(tree.values[k]))
        res = tuple(out)
        remember(self._nodes, key, res)
        return res

    def tree(self, raw: bytes) -> Tree:
        """The tree with raw id ``raw``.

        Raises:
            ObjectNotFound, IntegrityError: it is missing or not a tree.
        """
        obj = self.store.objects.get(o.hex_id(raw))
        if not isinstance(obj, Tree):
            raise o.IntegrityError(o.hex_id(raw), "expected a tree")
        return obj

    def _tops(self, root: Tree) -> list[Top]:
        """The blocks of a list root, oldest first.

        Raises:
            IntegrityError: a part of the list is missing or not a tree.
        """
        if root.values.get("f") == 2:
            tops: list[Top] = []
            m = 0
            if "p" in root.sub:
                prefix = self.tree(root.sub["p"])
                tops, m = self._tops(prefix), int(prefix.values.get("n", 0))
            try:
                for j in range(int(root.values["n"]) - m):
                    k = f"t{j}"
                    tops.append((1, "e", root.refs[k] if k in root.refs else tuple(root.values[k])))
            except (KeyError, TypeError, ValueError) as e:
                raise o.IntegrityError(self.store.objects.codec.encode(root)[0], f"list root lacks element {e}") from e
            return tops
        sizes = _block_sizes(int(root.values.get("n", 0)))
        tops = []
        for j, size in enumerate(sizes):
            k = str(j)
            if k in root.sub:
                tops.append((size, "n", root.sub[k]))
            elif k in root.refs:
                tops.append((size, "e", root.refs[k]))
            else:
                tops.append((size, "e", tuple(root.values[k])))
        return tops

    def _element(self, e: Entry) -> Any:
        return self.value(e) if isinstance(e, bytes) else self.loads(e)

    def _block_objs(self, top: Top) -> tuple[Any, ...] | list[Any]:
        size, kind, ref = top
        if kind == "e":
            return [self._element(ref)]
        key = o.hex_id(ref)
        got = self._node_objs.get(key)
        if got is not None:
            return got
        objs = [self._element(e) for e in self._expand(ref)]
        if all(_shareable(x) for x in objs):
            res = tuple(objs)
            remember(self._node_objs, key, res)
            return res
        return objs

    def read_list(self, root_raw: bytes) -> list[Any]:
        """The elements of the list whose root has raw id ``root_raw``.

        Raises:
            ObjectNotFound, IntegrityError.
        """
        known = self._lists.get(o.hex_id(root_raw))
        if known is not None and known.shareable:
            return list(known.items)
        out: list[Any] = []
        for top in self._tops(self.tree(root_raw)):
            out.extend(self._block_objs(top))
        return out

    def list_state(self, root_hex: str) -> _ListState:
        """The elements, entries and blocks of a stored list (cached by root id).

        Raises:
            ObjectNotFound, IntegrityError.
        """
        got = self._lists.get(root_hex)
        if got is not None:
            return got
        tops = self._tops(self.tree(o.raw_id(root_hex)))
        entries: list[Entry] = []
        items: list[Any] = []
        for top in tops:
            entries.extend([top[2]] if top[1] == "e" else self._expand(top[2]))
            items.extend(self._block_objs(top))
        root = self.tree(o.raw_id(root_hex))
        prefix = None
        if root.values.get("f") == 2 and "p" in root.sub:
            prefix = (int(self.tree(root.sub["p"]).values.get("n", 0)), root.sub["p"])
        state = _ListState(items, entries, tops, prefix, all(_shareable(x) for x in items))
        remember(self._lists, root_hex, state)
        return state

    def read_record(self, tree_raw: bytes | None) -> dict[str, Any]:
        """Decode a tree of channel values (or of one task's writes)."""
        if tree_raw is None:
            return {}
        tree = self.tree(tree_raw)
        out: dict[str, Any] = {}
        for k, v in tree.values.items():
            out[k] = self.loads(v)
        for k, raw in tree.refs.items():
            out[k] = self.value(raw)
        for k, raw in tree.sub.items():
            out[k] = self.read_list(raw)
        return out

    def store_write(self, pending: dict[str, bytes], parts: dict[str, dict[str, Any]], key: str,
                     value: Any) -> int | None:
        """Store one written value under ``key``: a non-empty list element by element (keys
        ``key/j``, sharing element objects with the channel it is written to; returns its
        length), anything else whole (returns None)."""
        if type(value) is list and value:
            for j, x in enumerate(value):
                self._place(parts, f"{key}/{j}", "e", self._entry(pending, x))
            return len(value)
        self._store_whole(pending, parts, key, value)
        return None

    def write_values(self, c: Commit) -> list[Any]:
        """The values of a writes commit, in the order of its ``w`` list."""
        flat = {k: self.loads(v) for k, v in c.meta.get("v", {}).items()}
        if c.state is not None:
            tree = self.tree(c.state)
            flat.update((k, self.loads(v)) for k, v in tree.values.items())
            flat.update((k, self.value(raw)) for k, raw in tree.refs.items())
            flat.update((k, self.read_list(raw)) for k, raw in tree.sub.items())
        out = []
        for i, w in enumerate(c.meta.get("w", [])):
            out.append([flat[f"{i}/{j}"] for j in range(w[2])] if len(w) > 2 else flat.get(str(i)))
        return out


class _Missing:
    pass


_MISSING = _Missing()
