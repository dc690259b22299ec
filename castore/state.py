"""State snapshots as trees of content-addressed objects.

A state is a mapping of string keys to msgpack-able values. It is stored as a
:class:`~castore.objects.Tree`: small values inline, values over :data:`INLINE_MAX` bytes
as separate :class:`~castore.objects.Value` objects (shared by every snapshot that holds
them). A state with more than :data:`FANOUT_AT` keys is split by the hash of its keys into
16 sub-trees, recursively, so that changing one key rewrites O(log n) small nodes instead
of the whole mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import objects as o
from .objects import AnyObject, ObjectId, Tree, Value
from .objectstore import ObjectStore

INLINE_MAX = 256
FANOUT_AT = 128
_HEX = "0123456789abcdef"


def _bucket(key: str, level: int) -> str:
    # the layout of a tree, not an id: plain blake3 in every store (an encrypted store's trees
    # are sealed, and the same key must fall in the same bucket whatever the codec)
    return o.digest(key.encode("utf-8"))[level]


class StateWriter:
    """Builds new trees from a base tree and a delta, collecting the objects to write."""

    def __init__(self, objs: ObjectStore) -> None:
        self.objs = objs
        self.pending: dict[ObjectId, bytes] = {}

    def _add(self, obj: AnyObject) -> bytes:
        oid, canonical = self.objs.codec.encode(obj)
        self.pending[oid] = canonical
        self.objs.cache(oid, obj)
        return o.raw_id(oid)

    def apply(self, base: bytes | None, delta: Mapping[str, Any], unset: tuple[str, ...] = ()) -> bytes | None:
        """Return the raw id of the tree for ``base`` with ``delta`` set and ``unset`` removed.

        Raises:
            InvalidEntry: a value cannot be encoded.
            ObjectNotFound, IntegrityError, StorageError: reading the base tree failed.
        """
        if not delta and not unset:
            return base
        changes: dict[str, Any] = {}
        for k, v in delta.items():
            packed = o.pack(v)
            if len(packed) > INLINE_MAX:
                changes[k] = ("ref", self._add(Value(v)))
            else:
                changes[k] = ("val", v)
        for k in unset:
            changes[k] = ("del", None)
        tree = self._read(base) if base is not None else Tree()
        return self._add(self._update(tree, changes, 0))

    def _read(self, raw: bytes) -> Tree:
        obj = self.objs.get(o.hex_id(raw))
        if not isinstance(obj, Tree):
            raise o.IntegrityError(o.hex_id(raw), "expected a state tree")
        return obj

    def _update(self, tree: Tree, changes: dict[str, Any], level: int) -> Tree:
        if tree.sub:
            groups: dict[str, dict[str, Any]] = {}
            for k, change in changes.items():
                groups.setdefault(_bucket(k, level), {})[k] = change
            new_sub = dict(tree.sub)
            for b, group in groups.items():
                child = self._read(tree.sub[b]) if b in tree.sub else Tree()
                new_sub[b] = self._add(self._update(child, group, level + 1))
            return Tree(sub=new_sub)
        values = dict(tree.values)
        refs = dict(tree.refs)
        for k, (what, v) in changes.items():
            values.pop(k, None)
            refs.pop(k, None)
            if what == "val":
                values[k] = v
            elif what == "ref":
                refs[k] = v
        if len(values) + len(refs) > FANOUT_AT and level < 8:
            return self._split(values, refs, level)
        return Tree(values=values, refs=refs)

    def _split(self, values: dict[str, Any], refs: dict[str, bytes], level: int) -> Tree:
        groups: dict[str, dict[str, Any]] = {}
        for k, v in values.items():
            groups.setdefault(_bucket(k, level), {})[k] = ("val", v)
        for k, r in refs.items():
            groups.setdefault(_bucket(k, level), {})[k] = ("ref", r)
        return Tree(sub={b: self._add(self._update(Tree(), g, level + 1)) for b, g in groups.items()})


def read_state(objs: ObjectStore, tree_id: bytes | None) -> dict[str, Any]:
    """The full mapping held by a tree (empty for None).

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    return read_states(objs, [tree_id])[0]


def read_states(objs: ObjectStore, tree_ids: Sequence[bytes | None]) -> list[dict[str, Any]]:
    """The mappings held by several trees, read level by level in shared batches.

    Reading N snapshots costs as many round trips as the deepest tree has levels (plus
    one for large values), not N: unchanged sub-trees and values are read once.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    outs: list[dict[str, Any]] = [{} for _ in tree_ids]
    # (tree id, index of the snapshot it belongs to) still to read
    todo: list[tuple[str, int]] = [(o.hex_id(t), i) for i, t in enumerate(tree_ids) if t is not None]
    while todo:
        got = objs.get_many({tid for tid, _ in todo})
        value_refs: list[tuple[int, str, str]] = []
        nxt: list[tuple[str, int]] = []
        for tid, i in todo:
            tree = got[tid]
            if not isinstance(tree, Tree):
                raise o.IntegrityError(tid, "expected a state tree")
            outs[i].update(tree.values)
            nxt.extend((o.hex_id(r), i) for r in tree.sub.values())
            value_refs.extend((i, k, o.hex_id(r)) for k, r in tree.refs.items())
        if value_refs:
            vals = objs.get_many({vid for _, _, vid in value_refs})
            for i, k, vid in value_refs:
                v = vals[vid]
                if not isinstance(v, Value):
                    raise o.IntegrityError(vid, "expected a state value")
                outs[i][k] = v.value
        todo = nxt
    return outs
