"""Reading a LangGraph thread stored by :class:`~castore.adapters.langgraph.CastoreSaver`, for people.

The saver writes for LangGraph: channel values serialized by LangGraph's serializer, the
checkpoint's step and source in commit metadata, task writes on an internal ``writes``
branch, forks on branches named ``<family>@<checkpoint id>`` (see
:mod:`castore.adapters.langgraph`). The CLI and the HTML viewer call these functions to show
such a thread readably:

* :func:`describe_entry` and :func:`entry_doc`: a checkpoint as ``step 3 · loop · review →
  verdict`` (the node that ran, from the versions it saw, and the channels it updated), a
  task's writes as ``writes of agent: messages, turns``;
* :func:`decode_state`: the channel values of a checkpoint as JSON-ready data, decoded with
  LangGraph's ``JsonPlusSerializer`` when ``langgraph`` is installed (imported only then), else
  described (``<msgpack value, 5 bytes: install langgraph to decode>``);
* :func:`internal_branches`: the branches that are bookkeeping (``writes``), which listings
  leave out unless asked.

Nothing here imports LangGraph at module level, and nothing writes.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import enum
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .. import objects as o
from .. import views
from ..errors import CastoreError
from ..objects import Commit, Tree

if TYPE_CHECKING:
    from ..session import LogEntry, Session, SessionHost

#: the branch the saver keeps task writes on (``castore.adapters.langgraph.WRITES_BRANCH``)
WRITES_BRANCH = "writes"
#: commit kinds the saver writes
KINDS = frozenset({"checkpoint", "writes"})
#: how many commits :func:`branch_notes` reads back from a fork's tip to find where it began
FORK_WALK = 512
#: how an undecodable value is described; ``{what}`` is e.g. "msgpack value, 5 bytes"
UNDECODED = "<{what}: {why}>"


def is_checkpoint(kind: str, meta: Mapping[str, Any]) -> bool:
    """Whether a commit is a LangGraph checkpoint written by the saver."""
    return kind == "checkpoint" and isinstance(meta.get("lg"), Mapping) and "checkpoint_id" in meta


def is_writes(kind: str, meta: Mapping[str, Any]) -> bool:
    """Whether a commit holds one LangGraph task's pending writes, written by the saver."""
    return kind == "writes" and isinstance(meta.get("w"), list) and "checkpoint_id" in meta


def is_langgraph(e: LogEntry) -> bool:
    """Whether a commit is one the LangGraph saver writes (a checkpoint or a task's writes)."""
    return e.kind in KINDS and (is_checkpoint(e.kind, e.meta) or is_writes(e.kind, e.meta))


# -- what a commit is --------------------------------------------------------------------------
def _internal(name: str) -> bool:
    return (name.startswith("__") and name.endswith("__")) or name.startswith(("branch:", "~"))


def _node_of(task_path: str) -> str:
    """The node in a task path such as ``~__pregel_pull, agent``."""
    return task_path.rsplit(", ", 1)[-1].strip() if task_path else ""


def checkpoint_doc(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a checkpoint commit says of itself, from its metadata.

    Returns:
        ``{"checkpoint_id", "step", "source", "ns", "nodes": [node], "updated": [channel]}``:
        ``nodes`` are the nodes that ran to produce it (known when its header is stored as
        a difference from its parent's; else empty), ``updated`` the state channels it
        updated (LangGraph's own trigger channels left out). Every field comes from the
        commit's metadata: nothing is decoded.
    """
    lg = _mapping(meta.get("lg"))
    md = _mapping(lg.get("mp"))
    header = _mapping(lg.get("h")) or _mapping(lg.get("H"))
    seen = _mapping(header.get("vs")) if "h" in lg else {}
    updated = header.get("uc")
    if not isinstance(updated, list):  # an update_state: the channels whose version moved
        versions = header.get("cv") if "h" in lg else None
        updated = list(versions) if isinstance(versions, Mapping) else []
    return {
        "checkpoint_id": meta.get("checkpoint_id"),
        "step": md.get("step"),
        "source": md.get("source"),
        "ns": meta.get("ns", ""),
        "nodes": sorted(str(n) for n in seen if n != "__interrupt__" and n != "__input__"),
        "updated": [str(c) for c in updated if not _internal(str(c))],
    }


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def writes_doc(author: str, meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a writes commit says of itself: ``{"checkpoint_id", "task_id", "node", "channels"}``
    (the channels written, in order; LangGraph's special ones as ``interrupt``, ``resume``...)."""
    channels = []
    for w in meta.get("w", []):
        name = str(w[1]) if isinstance(w, list) and len(w) > 1 else "?"
        if name.startswith("__") and name.endswith("__"):
            name = name.strip("_")
        elif _internal(name):
            continue
        channels.append(name)
    return {"checkpoint_id": meta.get("checkpoint_id"), "task_id": meta.get("task_id"),
            "node": _node_of(str(meta.get("task_path", author))), "channels": channels}


def entry_doc(e: LogEntry) -> dict[str, Any] | None:
    """A LangGraph commit as JSON-ready data (:func:`checkpoint_doc` or :func:`writes_doc`,
    with ``"kind"`` and a one-line ``"summary"``), or None for any other commit."""
    if is_checkpoint(e.kind, e.meta):
        doc = {"kind": "checkpoint", **checkpoint_doc(e.meta)}
    elif is_writes(e.kind, e.meta):
        doc = {"kind": "writes", **writes_doc(e.author, e.meta)}
    else:
        return None
    doc["summary"] = _summary(doc)
    return doc


def _summary(doc: Mapping[str, Any]) -> str:
    if doc["kind"] == "writes":
        who = f"writes of {doc['node']}" if doc["node"] else "writes"
        return who + (": " + ", ".join(doc["channels"]) if doc["channels"] else "")
    parts = [f"step {doc['step']}" if doc["step"] is not None else "checkpoint"]
    if doc["source"]:
        parts.append(str(doc["source"]))
    text = " · ".join(parts)
    if doc["nodes"]:
        text += " · " + ", ".join(doc["nodes"])
    if doc["updated"]:
        text += " → " + ", ".join(doc["updated"])
    if doc["ns"]:
        text += f" [{doc['ns']}]"
    return text


def describe_entry(e: LogEntry) -> str | None:
    """One line saying what a LangGraph commit is (``checkpoint step 3 · loop · review →
    verdict``), or None for any other commit."""
    doc = entry_doc(e)
    if doc is None:
        return None
    return doc["summary"] if doc["kind"] == "writes" else "checkpoint " + doc["summary"]


def internal_branches(session: Session, branches: Mapping[str, str] | None = None) -> set[str]:
    """The branches of ``session`` that are the saver's bookkeeping: ``writes``, when its
    tip is a writes commit (a branch of that name in another session is left alone).

    Raises:
        StorageError, IntegrityError: reading the tip failed.
    """
    branches = session.branches() if branches is None else branches
    tip = branches.get(WRITES_BRANCH)
    if tip is None:
        return set()
    e = session.show(tip)
    return {WRITES_BRANCH} if is_writes(e.kind, e.meta) else set()


def branch_notes(session: Session, branches: Mapping[str, str] | None = None) -> dict[str, str]:
    """For each branch whose tip is a LangGraph checkpoint, what it is: its tip's summary and,
    for a fork (a branch ``<family>@<checkpoint id>``, named by the saver after its first
    checkpoint), the checkpoint it forked from (``step 5 · update; forked from 83d53535 at step 1``).

    Raises:
        StorageError, IntegrityError: reading a commit failed.
    """
    history = session.store.history
    head = session.head
    if head is None or not is_checkpoint(history.commit(head).kind, history.commit(head).meta):
        return {}  # not a LangGraph thread: no commit read per branch
    branches = session.branches() if branches is None else branches
    out: dict[str, str] = {}
    for name, tip in branches.items():
        c = history.commit(tip)
        if not is_checkpoint(c.kind, c.meta):
            continue
        note = _summary({"kind": "checkpoint", **checkpoint_doc(c.meta)})
        first = name.split("@", 1)[1] if "@" in name else None
        cur: Commit | None = c
        walked = 0
        while first is not None and cur is not None and cur.meta.get("checkpoint_id") != first:
            # the saver names a fork after its first checkpoint, with ".2", ".3"... when taken
            if "." in first and cur.meta.get("checkpoint_id") == first.rsplit(".", 1)[0]:
                break
            walked += 1
            if walked > FORK_WALK:
                cur = None  # a long fork: its origin is left unsaid rather than read commit by commit
                break
            cur = history.commit(o.hex_id(cur.parents[0])) if cur.parents else None
        if first is not None and cur is not None and cur.parents:
            pid = o.hex_id(cur.parents[0])
            step = checkpoint_doc(history.commit(pid).meta)["step"]
            note += f"; forked from {pid[:8]}" + (f" at step {step}" if step is not None else "")
        out[name] = note
    return out


def visible(entries: Iterable[LogEntry]) -> list[LogEntry]:
    """``entries`` without the saver's writes commits (they live on the internal branch only)."""
    return [e for e in entries if not is_writes(e.kind, e.meta)]


# -- channel values ------------------------------------------------------------------------------
def _decoder(store: SessionHost) -> Any:
    """LangGraph's value reader with its default serializer, or None without langgraph."""
    try:
        from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

        from .langgraph_values import ChannelValues
    except ImportError:
        return None
    return ChannelValues(store, JsonPlusSerializer())


def _size(typed: Any) -> str:
    try:
        n = len(typed[1])
        return f"{typed[0]} value, {n} byte{'' if n == 1 else 's'}"
    except (TypeError, IndexError, KeyError):
        return "value"


class StateReader:
    """Decodes the channel values of checkpoints of one store, sharing decoded objects.

    Args:
        store: the store the thread is in.
        decode: use LangGraph's serializer when it is installed (False: only describe).
    """

    def __init__(self, store: SessionHost, decode: bool = True) -> None:
        self.store = store
        self._vals: Any = _decoder(store) if decode else None
        self._why = "install langgraph to decode" if decode else "not decoded"
        self._plain: dict[int, tuple[Any, Any]] = {}  # id(shared object) -> (object, plain form)

    @property
    def decodes(self) -> bool:
        """Whether values are decoded (LangGraph is installed), not only described."""
        return self._vals is not None

    def state(self, tree_id: bytes | str | None) -> dict[str, Any]:
        """The channel values in a checkpoint's state tree, as JSON-ready data, by channel.

        A value the serializer cannot read (another serializer, an encrypted one) is
        described instead, with the reason.

        Raises:
            ObjectNotFound, IntegrityError: the tree is missing or not a tree.
        """
        return {k: self._decode(part, ref) for k, (part, ref) in sorted(self._stored(tree_id).items())}

    def changes(self, before: bytes | str | None, after: bytes | str | None
                ) -> tuple[dict[str, Any], list[str], dict[str, list[Any]]]:
        """What changed from one checkpoint's state tree to another's (its child's), decoded:
        ``(changed, removed, appended)``. ``changed`` maps a channel to its new value,
        ``removed`` lists the channels gone, ``appended`` maps a list channel whose old items
        are still its first ones to the items added after them.

        Only the channels whose stored form changed are decoded, and of a list that grew
        only the new items, so reading a thread checkpoint by checkpoint stays linear.

        Raises:
            ObjectNotFound, IntegrityError: a tree is missing or not a tree.
        """
        old, new = self._stored(before), self._stored(after)
        changed: dict[str, Any] = {}
        appended: dict[str, list[Any]] = {}
        for k, (part, ref) in sorted(new.items()):
            if old.get(k) == (part, ref):
                continue
            grown = self._appended(old[k][1], ref) if part == "sub" and old.get(k, ("",))[0] == "sub" else None
            if grown is None:
                changed[k] = self._decode(part, ref)
            elif grown:
                appended[k] = grown
        return changed, [k for k in old if k not in new], appended

    def _appended(self, old_root: bytes, new_root: bytes) -> list[Any] | None:
        """The items the list ``new_root`` adds to the list ``old_root``, or None when the
        old items are not its first ones (or cannot be decoded)."""
        if self._vals is None:
            return None
        try:
            a, b = self._vals.list_state(o.hex_id(old_root)), self._vals.list_state(o.hex_id(new_root))
        except CastoreError:
            raise
        except Exception:  # noqa: BLE001 - decoded whole by _decode, which says why it fails
            return None
        m = len(a.entries)
        if len(b.entries) < m or b.entries[:m] != a.entries:
            return None
        return self.plain(b.items[m:])

    def _stored(self, tree_id: bytes | str | None) -> dict[str, tuple[str, Any]]:
        """``{channel: (part, stored form)}`` of a state tree: inline, a value id, a list root id."""
        if tree_id is None:
            return {}
        raw = o.raw_id(tree_id) if isinstance(tree_id, str) else tree_id
        tree = self.store.objects.get(o.hex_id(raw))
        if not isinstance(tree, Tree):
            raise o.IntegrityError(o.hex_id(raw), "expected the state tree of a checkpoint")
        out: dict[str, tuple[str, Any]] = {k: ("values", v) for k, v in tree.values.items()}
        out.update((k, ("refs", ref)) for k, ref in tree.refs.items())
        out.update((k, ("sub", ref)) for k, ref in tree.sub.items())
        return out

    def _decode(self, part: str, ref: Any) -> Any:
        if part == "values":
            return self._one(lambda: self._vals.loads(ref), _size(ref))
        if part == "refs":
            return self._one(lambda: self._vals.value(ref), f"stored value {o.hex_id(ref)[:12]}")
        return self._one(lambda: self._vals.read_list(ref), self._list_what(ref))

    def writes(self, commit: Commit) -> list[tuple[str, Any]]:
        """``(channel, value)`` for each write of a task's writes commit, values as JSON-ready
        data (described instead of decoded without langgraph, or when unreadable).

        Raises:
            ObjectNotFound, IntegrityError: an object of the commit is missing or malformed.
        """
        channels = [str(w[1]) if isinstance(w, list) and len(w) > 1 else "?" for w in commit.meta.get("w", [])]
        what = "written value"
        values = self._one(lambda: self._vals.write_values(commit), what)
        if not isinstance(values, list) or len(values) != len(channels):
            values = [values] * len(channels)
        return list(zip(channels, values, strict=True))

    def _list_what(self, ref: bytes) -> str:
        try:
            root = self.store.objects.get(o.hex_id(ref))
            n = int(root.values.get("n", 0)) if isinstance(root, Tree) else "?"
        except (CastoreError, ValueError, TypeError):
            n = "?"
        return f"list of {n} serialized values"

    def _one(self, decode: Any, what: str) -> Any:
        if self._vals is None:
            return UNDECODED.format(what=what, why=self._why)
        try:
            value = decode()
        except CastoreError:
            raise
        except Exception as e:  # noqa: BLE001 - any serializer failure is shown, not raised
            return UNDECODED.format(what=what, why=f"not readable by LangGraph's default serializer ({e})")
        return self.plain(value)

    def plain(self, value: Any) -> Any:
        """``value`` as JSON-ready data: a LangChain message as ``{"type", "content", ...}``
        (fields at their defaults left out), dataclasses and models as dicts, bytes as
        base64, anything else unknown as its ``repr``. Shared objects are converted once."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        key = id(value)
        got = self._plain.get(key)
        if got is not None and got[0] is value:
            return got[1]
        out = self._convert(value)
        if not isinstance(value, (list, dict)):  # containers may change; shared leaves do not
            self._plain[key] = (value, out)
        return out

    def _convert(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): self.plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            # a list channel holds the same decoded messages snapshot after snapshot: look
            # each up by identity before anything else (this loop is the viewer's hot path)
            cache, out = self._plain, []
            for v in value:
                got = cache.get(id(v))
                out.append(got[1] if got is not None and got[0] is v else self.plain(v))
            return out
        if isinstance(value, (set, frozenset)):
            return [self.plain(v) for v in sorted(value, key=repr)]
        if isinstance(value, (bytes, bytearray)):
            return base64.b64encode(bytes(value)).decode()
        if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
            return value.isoformat()
        if isinstance(value, enum.Enum):
            return self.plain(value.value)
        dump = getattr(value, "model_dump", None)
        if callable(dump):  # a pydantic model: LangChain messages, documents
            try:
                fields = dump(mode="json", exclude_defaults=True)
            except Exception:  # noqa: BLE001 - fall back to repr below
                return repr(value)
            kind = getattr(value, "type", None)
            return {"type": kind, **fields} if isinstance(kind, str) else fields
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: self.plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return repr(value)


def decode_state(store: SessionHost, tree_id: bytes | str | None, decode: bool = True) -> dict[str, Any]:
    """The channel values of a checkpoint's state tree as JSON-ready data (see :class:`StateReader`).

    Raises:
        ObjectNotFound, IntegrityError: the tree is missing or not a tree.
    """
    return StateReader(store, decode).state(tree_id)


def state_at(session: Session, rev: str = "HEAD", decode: bool = True) -> dict[str, Any] | None:
    """The decoded channel values of the LangGraph checkpoint at ``rev``, or None when the
    commit there is not one (then :meth:`castore.Session.state` is its state).

    Raises:
        RevisionNotFound, AmbiguousRevision, ObjectNotFound, IntegrityError, StorageError.
    """
    cid = session.resolve(rev)
    commit = session.store.history.commit(cid)
    if not is_checkpoint(commit.kind, commit.meta):
        return None
    return decode_state(session.store, commit.state, decode)


def writes_at(session: Session, rev: str, decode: bool = True) -> list[tuple[str, Any]] | None:
    """``(channel, value)`` of each write in the task's writes commit at ``rev`` (see
    :meth:`StateReader.writes`), or None when the commit there is not one.

    Raises:
        RevisionNotFound, AmbiguousRevision, ObjectNotFound, IntegrityError, StorageError.
    """
    commit = session.store.history.commit(session.resolve(rev))
    if not is_writes(commit.kind, commit.meta):
        return None
    return StateReader(session.store, decode).writes(commit)


def diff_states(session: Session, rev1: str, rev2: str, decode: bool = True) -> dict[str, Any] | None:
    """``{"added", "removed", "changed": {channel: [old, new]}}`` between the decoded channel
    values of two LangGraph checkpoints, or None when either commit is not one.

    Raises:
        RevisionNotFound, AmbiguousRevision, ObjectNotFound, IntegrityError, StorageError.
    """
    reader = StateReader(session.store, decode)
    states = []
    for rev in (rev1, rev2):
        commit = session.store.history.commit(session.resolve(rev))
        if not is_checkpoint(commit.kind, commit.meta):
            return None
        states.append(reader.state(commit.state))
    a, b = states
    return {"added": {k: v for k, v in b.items() if k not in a},
            "removed": {k: v for k, v in a.items() if k not in b},
            "changed": {k: [a[k], b[k]] for k in a if k in b and a[k] != b[k]}}


class LangGraphView(views.View):
    """How the saver's commits read in generic listings (registered in :mod:`castore.views`)."""

    kinds = KINDS

    def describe(self, e: LogEntry) -> str | None:
        """See :func:`describe_entry`."""
        return describe_entry(e)

    def body(self, e: LogEntry, verbose: bool = False) -> list[str] | None:
        """``[LangGraph checkpoint step 3 · ...]`` and the checkpoint's and task's ids."""
        doc = entry_doc(e)
        if doc is None:
            return None
        ids = [f"{k.replace('_', ' ')}: {doc[k]}" for k in ("checkpoint_id", "task_id") if doc.get(k)]
        return [f"[LangGraph {describe_entry(e)}]", *ids]

    def hidden(self, e: LogEntry) -> bool:
        """A task's writes: they live on the internal branch only."""
        return is_writes(e.kind, e.meta)

    def internal_branches(self, session: Session, branches: Mapping[str, str]) -> set[str]:
        """See :func:`internal_branches`."""
        return internal_branches(session, branches)

    def branch_notes(self, session: Session, branches: Mapping[str, str]) -> dict[str, str]:
        """See :func:`branch_notes`."""
        return branch_notes(session, branches)

    def state_at(self, session: Session, rev: str) -> dict[str, Any] | None:
        """See :func:`state_at`."""
        return state_at(session, rev)

    def details(self, session: Session, e: LogEntry, verbose: bool = False) -> list[tuple[str, list[tuple[str, Any]]]]:
        """A checkpoint's updated channels with their values (``Values``), a task's writes
        (``Writes``); ``verbose`` changes nothing (every value is shown whole)."""
        out: list[tuple[str, list[tuple[str, Any]]]] = []
        if is_checkpoint(e.kind, e.meta):
            values = state_at(session, e.id) or {}
            updated = [k for k in checkpoint_doc(e.meta)["updated"] if k in values]
            if updated:
                out.append(("Values", [(k, values[k]) for k in updated]))
        writes = writes_at(session, e.id) or []
        if writes:
            out.append(("Writes", list(writes)))
        return out

    def diff_states(self, session: Session, rev1: str, rev2: str) -> dict[str, Any] | None:
        """See :func:`diff_states`."""
        return diff_states(session, rev1, rev2)


views.register(LangGraphView())


__all__ = [
    "LangGraphView",
    "WRITES_BRANCH",
    "KINDS",
    "StateReader",
    "is_checkpoint",
    "is_writes",
    "is_langgraph",
    "checkpoint_doc",
    "writes_doc",
    "entry_doc",
    "describe_entry",
    "internal_branches",
    "visible",
    "branch_notes",
    "decode_state",
    "state_at",
    "diff_states",
    "writes_at",
]
