"""A LangGraph checkpointer backed by castore: ``graph.compile(checkpointer=CastoreSaver(store))``.

The mapping:

* a thread is a castore session ``(app, user, thread_id)``;
* each checkpoint is a commit (kind ``checkpoint``) whose parent is the commit of its parent
  checkpoint. A checkpoint namespace is a family of branches (``main`` for the root
  namespace, ``ns:<namespace>`` for subgraphs); a checkpoint whose parent is not the tip of
  a branch (a replay or an ``update_state`` from the past) starts a new branch
  ``<family>@<checkpoint id>``, so LangGraph forks show in ``castore log --graph``;
* channel values live in the commit's state tree, serialized with the saver's ``serde``
  (see :mod:`castore.adapters.langgraph_values`: a list channel such as ``messages`` is a
  persistent list, so appending one message costs O(1) new bytes, not a copy of the list);
* LangGraph's checkpoint header is kept in the commit's metadata as a difference from the
  parent checkpoint's (see :mod:`castore.adapters.langgraph_header`);
* pending writes are commits too (kind ``writes``, on the thread's ``writes`` branch), each
  naming the checkpoint it belongs to: a task's writes may land before or after the next
  checkpoint, and everything stays reachable for ``gc`` and ``sync``. Small writes live in
  the commit itself; the elements of a written list share their objects with the channel;
* ``put`` and ``put_writes`` return once what they stored is durable (on a durable store),
  and the calls in flight together are written as one group: LangGraph saves checkpoints
  and task writes from background threads, so while one group is being written the next
  calls queue, and the next group stores all their objects with one write (one pack record,
  one ``fdatasync``) and moves each ref once (the ``writes`` branch once for all the task
  writes queued): :mod:`castore.groupcommit`. Task writes queued for a checkpoint not stored
  yet wait (at most 2 ms) for its ``put``, which LangGraph has in flight, and share its write. A LangGraph
  turn of three checkpoints and two task writes so costs about 3.0-3.2 object writes (3.5-3.7
  on a loaded machine) instead of 5 (``scripts/langgraph_bytes.py``);
* a thread's refs are read again only when the store's swap log shows a change that is not
  this saver's own swap (local disk keeps such a log), so ``get_tuple`` lists and reads no ref.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import hashlib
import threading
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .. import names
from .. import objects as o
from ..deletion import first_commit_head
from ..errors import RefConflict, SessionDeleting, SessionNotFound
from ..groupcommit import Group, GroupCommit, Job, Move
from ..handles import Handle
from ..history import Hint, K
from ..objects import Commit, Tree
from ..refnames import (
    META_BORN,
    META_CREATED,
    META_HEAD_BRANCH,
    META_NAMES,
    REAL_NAME_KEYS,
    SessionRefs,
    carried_meta,
    deleting_since,
    name_meta,
    parse_ref_name,
    real_name,
    session_prefix,
    symbolic_to,
)
from ..refs import PREFIX as REFS_PREFIX
from ..refs import RefValue, ref_key
from ..store import Store
from .langgraph_header import NotPlain, copy_header, decode_header, encode_header, is_plain, plain_copy
from .langgraph_values import ChannelValues, remember

WRITES_BRANCH = "writes"
#: names tried for a copied branch whose name is taken in the target thread (``x.copy``, ...)
_COPY_NAMES = 50


@dataclass
class _View:
    """What is known of one thread: its refs and every commit they reach."""

    targets: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    cps: dict[tuple[str, str], str] = field(default_factory=dict)
    latest: dict[str, str] = field(default_factory=dict)
    writes: dict[tuple[str, str], list[str]] = field(default_factory=lambda: defaultdict(list))
    mark: str | None = None  # the store's swap log when the refs were last read (None: read them next time)
    ours: Counter[str] = field(default_factory=Counter)  # keys of this saver's swaps of branches since ``mark``

    def writes_refs(self, main: str) -> list[str]:
        """Names of refs whose tip is a writes commit (``main`` and any copies)."""
        return [n for n, t in self.targets.items() if t in self.commits and self.commits[t].kind == "writes"]

    def add(self, cid: str, c: Commit) -> None:
        if cid in self.commits:
            return
        self.commits[cid] = c
        ns, cp = c.meta.get("ns", ""), c.meta.get("checkpoint_id")
        if not isinstance(cp, str):
            return
        if c.kind == "checkpoint":
            old = self.cps.get((ns, cp))
            if old is None or self.commits[old].time <= c.time:
                self.cps[(ns, cp)] = cid
            if cp > self.latest.get(ns, ""):
                self.latest[ns] = cp
        elif c.kind == "writes":
            self.writes[(ns, cp)].append(cid)


class CastoreSaver(Handle, BaseCheckpointSaver[int]):
    """A LangGraph checkpoint saver storing threads as castore sessions.

    Args:
        store: an open :class:`castore.Store` (local, S3, ...).
        app: the castore app the threads belong to.
        user: the castore user the threads belong to.
        serde: LangGraph serializer (default: LangGraph's ``JsonPlusSerializer``).

    Raises:
        InvalidName: ``app`` or ``user`` is not a valid name.
    """

    def __init__(self, store: Store, app: str = "langgraph", user: str = "default", *,
                 serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self.app = names.validate(app, "app name")
        self.user = names.validate(user, "user name")
        #: the store holding the threads: their tenant's, in the tenant layout (docs/tenants.md)
        self.store = store.tenant(self.app, self.user)
        self._lock = threading.RLock()
        # the calls in flight together land as one group, staged under the saver's lock
        self._group_commit = GroupCommit(self.store.plumbing, self._lock)
        self._views: dict[str, _View] = {}
        self._tokens: dict[str, RefValue] = {}  # ref values (with tokens) from our own swaps
        # ref name -> (the value our swap gave it, the read hint of its tip: the batch's)
        self._hints: dict[str, tuple[RefValue, Hint]] = {}
        self._prefixes: OrderedDict[str, str] = OrderedDict()  # thread id -> ref prefix
        self._ref_names: OrderedDict[tuple[str, str], str] = OrderedDict()  # (prefix, branch) -> ref name
        self._heads: dict[str, str] = {}  # thread -> the branch its HEAD is known to name
        self._vals = ChannelValues(self.store, self.serde)
        self._headers: OrderedDict[str, dict[str, Any]] = OrderedDict()  # commit id -> checkpoint header

    # -- names ---------------------------------------------------------------------------
    def _prefix(self, thread_id: str) -> str:
        got = self._prefixes.get(thread_id)
        if got is None:
            got = session_prefix(self.app, self.user, thread_id)
            remember(self._prefixes, thread_id, got)
        return got

    @staticmethod
    def _family(ns: str) -> str:
        name = "main" if not ns else f"ns:{ns}"
        if len(name) > 200:
            name = "ns~" + hashlib.sha256(ns.encode()).hexdigest()[:32]
        return name

    @staticmethod
    def _branch_name(family: str, cpid: str | None) -> str:
        return family if cpid is None else f"{family}@{cpid}"

    def _ref_name(self, prefix: str, branch: str) -> str:
        got = self._ref_names.get((prefix, branch))
        if got is None:
            got = SessionRefs(prefix).branch(branch)
            remember(self._ref_names, (prefix, branch), got)
        return got

    # -- the view of a thread ----------------------------------------------------------------
    def _refresh(self, thread_id: str) -> _View:
        """The view of a thread, brought up to date with its refs.

        Where the store keeps a swap log (local disk), a view whose refs moved only by this
        saver's own swaps since it was read is current as it is: reading the log's tail
        replaces listing and reading the thread's refs.

        Raises:
            InvalidName, StorageError, IntegrityError.
        """
        prefix = self._prefix(thread_id)
        refs = self.store.refs
        view = self._views.get(thread_id)
        mark, names = refs.changes_since(prefix, view.mark if view is not None else None)
        if view is not None and view.mark is not None and names is not None:
            moved = Counter(map(ref_key, names))
            if moved == view.ours or Counter(k for k in moved.elements() if _is_branch_key(k, prefix)) == view.ours:
                view.mark = mark
                view.ours.clear()
                return view
        # branches, labels and remote-tracking refs (not HEAD, the reflog, or foreign names)
        listed = [n for n in refs.list(prefix)
                  if (p := parse_ref_name(n)) is not None and p.kind not in ("head", "reflog")]
        got = refs.read_many(listed)
        targets = {n: v.target for n, v in got.items() if v is not None and v.symbolic is None}
        if view is not None:
            if targets == view.targets:
                view.mark = mark
                view.ours.clear()
                return view
            gone = view.targets.keys() - targets.keys()
            moved_back = any(n in view.targets and view.targets[n] != t and t in view.commits
                             for n, t in targets.items())
            if gone or moved_back:
                view = None
        if view is None:
            view = _View()
            for name, tip in targets.items():
                if tip not in view.commits:
                    hint = Hint.from_meta(v.meta) if (v := got[name]) is not None else None
                    for cid, c in self.store.history.path(tip, hint):
                        view.add(cid, c)
        else:
            for name, tip in targets.items():
                self._walk_new(view, tip, got[name])
        view.targets = targets
        view.mark = mark
        view.ours.clear()
        self._views[thread_id] = view
        return view

    def _walk_new(self, view: _View, tip: str, ref: RefValue | None) -> None:
        found: list[tuple[str, Commit]] = []
        cur: str | None = tip
        while cur is not None and cur not in view.commits:
            if len(found) > K:
                hint = Hint.from_meta(ref.meta) if ref is not None else None
                for cid, c in self.store.history.path(tip, hint):
                    view.add(cid, c)
                return
            c = self.store.history.commit(cur)
            found.append((cur, c))
            cur = o.hex_id(c.parents[0]) if c.parents else None
        for cid, c in reversed(found):
            view.add(cid, c)

    @staticmethod
    def _real(name: str, meta: Any) -> str:
        """The branch name behind a ref name (hashed segments keep it in the ref's metadata)."""
        return real_name(name.rsplit("/", 1)[1], meta)

    def _ref_for_swap(self, name: str) -> RefValue | None:
        cached = self._tokens.get(name)
        current = self.store.refs.read(name) if cached is None else None
        return cached if cached is not None else current

    def _known_hint(self, name: str, expect: RefValue | None) -> Hint | None:
        """The read hint of ``expect``'s tip when ``expect`` is what this saver's own swap of
        ``name`` gave it (the batch that made the tip had it: no need to parse the ref's)."""
        got = self._hints.get(name)
        return got[1] if got is not None and expect is not None and got[0] is expect else None

    def _ensure_head(self, prefix: str, branch: str, thread_id: str, landed: RefValue | None = None) -> None:
        """Put the thread's HEAD on ``branch`` (``landed``: its value as this write landed it,
        else read), which a write just moved. A thread without HEAD gets it by the rule of every
        writer of a session's first branch (:func:`castore.deletion.first_commit_head`: a
        deletion racing it leaves neither a branch behind nor a lost branch).

        Raises:
            SessionDeleting: a deletion of the thread is under way or was interrupted (HEAD is
                not moved), or raced its first checkpoint. StorageError.
        """
        if self._heads.get(thread_id) == branch:
            return
        head_name = SessionRefs(prefix).head
        target = symbolic_to(branch)
        key = (self.app, self.user, thread_id)

        def attempt(_n: int) -> None:
            head = self.store.refs.read(head_name)
            if deleting_since(head) is not None:
                raise SessionDeleting(key)
            if head is not None and head.target == target:
                return
            meta = carried_meta(head)
            meta.setdefault(META_NAMES, {"app": self.app, "user": self.user, "session": thread_id})
            meta.setdefault(META_CREATED, time.time())
            meta[META_BORN] = True  # HEAD is put on a branch that landed
            meta.update(name_meta(target, branch, META_HEAD_BRANCH))
            if head is not None:
                self.store.plumbing.swap(head_name, target, head, meta)
            elif (on := landed or self.store.refs.read(self._ref_name(prefix, branch))) is not None:
                first_commit_head(self.store.plumbing, key, on, target, meta, False)
            else:  # the branch went since it was written: a deletion ran whole
                raise SessionDeleting(key, True)

        self.store.plumbing.land(head_name, attempt)
        self._heads[thread_id] = branch

    # -- BaseCheckpointSaver: writing ------------------------------------------------------------
    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store a checkpoint as a commit; see the module docstring. It is durable (on a
        durable store) when this returns; calls in flight together share one write.

        Raises:
            InvalidName: the thread id is not a valid castore session name.
            StorageError: the store failed.
        """
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        parent_cp = conf.get("checkpoint_id")
        header: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = header.pop("channel_values")
        md = get_checkpoint_metadata(config, metadata)
        prefix = self._prefix(thread_id)
        family = self._family(ns)

        def stage(group: Group, job: Job) -> None:
            # A writer trusts its cached view: a stale one only makes a compare-and-swap fail.
            view = self._views.get(thread_id) or self._refresh(thread_id)
            parent = view.cps.get((ns, parent_cp)) if parent_cp else None
            if parent_cp and parent is None:
                view = self._refresh(thread_id)
                self._overlay(group, view, prefix)  # what this group staged stays in view
                parent = view.cps.get((ns, parent_cp))
            pending: dict[str, bytes] = {}
            tree = self._state_tree(pending, view, ns, parent, checkpoint, values, new_versions)
            try:
                plain: dict[str, Any] | None = plain_copy(header)
            except NotPlain:
                plain = None
            meta: dict[str, Any] = {"checkpoint_id": checkpoint["id"],
                                    "lg": {**self._store_header(view, parent, header, plain is not None),
                                           **self._store_md(md)}}
            if ns:
                meta["ns"] = ns
            if parent_cp and parent is None:
                meta["lg"]["p"] = parent_cp
            name = self._branch_for(view, prefix, family, parent)
            if name is not None:
                move = group.moves.get(name)
                if move is None:
                    expect = self._ref_for_swap(name)
                    if expect is None or expect.target != parent:
                        expect = self.store.refs.read(name)
                    if expect is None or expect.target != parent:
                        raise RefConflict(name, parent, expect.target if expect is not None else None)
                    move = self._start(group, job, thread_id, name, self._real(name, expect.meta), expect,
                                       self._known_hint(name, expect))
            else:
                real = self._free_branch(view, prefix, family, checkpoint["id"])
                name = self._ref_name(prefix, real)
                move = self._start(group, job, thread_id, name, real, None, parent=parent)
            cid = self._stage(move, job, view, pending, {"lg": {"ns": ns, "cp": checkpoint["id"]}},
                              "checkpoint", tree, str(md.get("source") or ""), meta)
            if plain is not None:  # the next checkpoint's difference needs no decoding
                remember(self._headers, cid, plain)
            if not ns:  # HEAD names the root namespace's branch once it moved
                real = self._real(move.name, move.meta)
                move.then.append(lambda landed: self._ensure_head(prefix, real, thread_id, landed))

        self._land(Job(prefix, stage, awaited=True, forget=self._forgets(thread_id)))
        return {"configurable": {"thread_id": conf["thread_id"], "checkpoint_ns": ns,
                                 "checkpoint_id": checkpoint["id"]}}

    # -- group commit (castore.groupcommit) -------------------------------------------------------
    def _land(self, job: Job) -> None:
        """Store ``job`` with the calls in flight and return once it is durable (one object
        write and one compare-and-swap per ref moved for the group; see
        :class:`~castore.groupcommit.GroupCommit`).

        Raises:
            what staging or writing the job raised.
        """
        self.store.init()
        self._group_commit.land(job)

    def _forgets(self, thread_id: str) -> Callable[[str | None], None]:
        """What a dropped call of ``thread_id`` makes the saver forget: the thread's view (it
        may show commits staged but not landed) and the value kept of the ref that lost."""
        def forget(ref: str | None) -> None:
            self._views.pop(thread_id, None)
            if ref is not None:
                self._tokens.pop(ref, None)

        return forget

    def _start(self, group: Group, job: Job, thread_id: str, name: str, real: str, expect: RefValue | None,
               hint: Hint | None = None, parent: str | None = None) -> Move:
        """A new move of ``name`` (branch ``real`` of ``job``'s thread) from ``expect`` (or a new
        ref on ``parent``); ``hint``: the read hint of ``expect``'s target when known (the batch
        that made it). Once it lands the saver keeps its new value and read hint.

        Raises:
            ObjectNotFound, IntegrityError, StorageError: reading the parent failed.
        """
        tip = expect.target if expect is not None else parent
        batch = self.store.plumbing.batch(tip, expect, hint)
        move = group.start(job, name, expect, batch, name_meta(name, real))

        def landed(new: RefValue) -> None:
            self._tokens[name] = new
            self._hints[name] = (new, batch.hint)
            if (view := self._views.get(thread_id)) is not None:
                view.ours[ref_key(name)] += 1  # in the swap log: not a change from elsewhere

        move.then.append(landed)
        return move

    @staticmethod
    def _stage(move: Move, job: Job, view: _View, pending: dict[str, bytes], extra: dict[str, Any],
               kind: str, tree: bytes | None, author: str, meta: dict[str, Any]) -> str:
        """Chain ``job``'s commit (of ``kind``) on ``move``, with the objects it needs; return its
        id. The view shows it at once (a later call of the group builds on it), and is dropped
        if the move does not land. ``extra``: the ref metadata the saver keeps besides the hint.

        Raises:
            InvalidEntry, ObjectNotFound, IntegrityError, StorageError: as ``Batch.record``.
        """
        batch = move.join(job)
        batch.include(pending)
        cid = batch.record(kind, state=tree, author=author, when=time.time(), meta=meta)
        assert batch.last is not None
        view.add(cid, batch.last)
        view.targets[move.name] = cid
        move.meta.update(extra)
        return cid

    def _overlay(self, group: Group, view: _View, prefix: str) -> None:
        """Show in a freshly read ``view`` of a thread the commits ``group`` staged for it.

        Raises:
            ObjectNotFound, IntegrityError, StorageError: a staged commit could not be read back
                (they are cached by the batch: no read in practice).
        """
        for name, move in group.moves.items():
            if name.startswith(prefix + "/") and move.batch.tip is not None:
                for cid in move.batch.ids:
                    view.add(cid, self.store.history.commit(cid))
                view.targets[name] = move.batch.tip

    def _branch_for(self, view: _View, prefix: str, family: str, parent: str | None) -> str | None:
        """The branch of ``family`` whose tip is ``parent`` (the family's first branch for a root)."""
        if parent is None:
            return None
        found = sorted(n for n, t in view.targets.items() if t == parent)
        if len(found) == 1:
            return found[0]
        fam = self._ref_name(prefix, family)
        for n in found:
            if n == fam or n.startswith(f"{prefix}/heads/{names.encode(family + '@')}"):
                return n
        return found[0] if found else None

    def _free_branch(self, view: _View, prefix: str, family: str, cpid: str) -> str:
        """A branch name of ``family`` not taken yet: the family itself, else ``family@cpid``."""
        if self._ref_name(prefix, family) not in view.targets:
            return family
        base = real = self._branch_name(family, cpid)
        i = 1
        while self._ref_name(prefix, real) in view.targets:
            i += 1
            real = f"{base}.{i}"
        return real

    def _state_tree(self, pending: dict[str, bytes], view: _View, ns: str, parent: str | None,
                    checkpoint: Checkpoint, values: dict[str, Any], new_versions: ChannelVersions) -> bytes | None:
        versions = checkpoint["channel_versions"]
        base_id = view.commits[parent].state if parent else None
        base = self._vals.tree(base_id) if base_id else None
        base_versions = self._versions(view, parent) if parent else {}
        parts: dict[str, dict[str, Any]] = {"values": {}, "refs": {}, "sub": {}}
        for k, ver in versions.items():
            if k in new_versions:
                if k in values:
                    old = base.sub.get(k) if base is not None else None
                    self._vals.store_value(pending, parts, k, values[k], old)
                continue
            src = base if base is not None and base_versions.get(k) == ver else self._find_version(view, ns, k, ver)
            if src is not None and self._copy_key(parts, src, k):
                continue
            if k in values:
                self._vals.store_value(pending, parts, k, values[k], None)
        if not any(parts.values()):
            return None
        return self._vals.put_obj(pending, Tree(**parts))

    @staticmethod
    def _copy_key(parts: dict[str, dict[str, Any]], src: Tree, k: str) -> bool:
        for part in ("values", "refs", "sub"):
            d = getattr(src, part)
            if k in d:
                parts[part][k] = d[k]
                return True
        return False

    # -- checkpoint headers and metadata ---------------------------------------------------------
    def _store_header(self, view: _View, parent: str | None, header: dict[str, Any], plain: bool) -> dict[str, Any]:
        """The ``lg`` entries holding ``header`` (``plain``: it :func:`is_plain`): a difference
        from the parent's (``h``), whole (``H``, at a root and every K commits), or through the
        serializer (``c``)."""
        if not plain:
            return {"c": list(self.serde.dumps_typed(header))}
        if parent is None or (view.commits[parent].depth + 1) % K == 0:
            return {"H": encode_header(header, None)}
        return {"h": encode_header(header, self._header(view, parent))}

    def _store_md(self, md: Mapping[str, Any]) -> dict[str, Any]:
        return {"mp": md} if is_plain(md) else {"m": list(self.serde.dumps_typed(md))}

    def _md(self, c: Commit) -> dict[str, Any]:
        """A checkpoint commit's LangGraph metadata (a fresh copy)."""
        lg = c.meta["lg"]
        return _copy_plain(lg["mp"]) if "mp" in lg else self._vals.loads(lg["m"])

    def _header(self, view: _View, cid: str) -> dict[str, Any]:
        """A checkpoint commit's header (shared: callers must not change it).

        Raises:
            IntegrityError: a stored header is malformed.
        """
        chain: list[tuple[str, Commit]] = []
        cur, base = cid, None
        while True:
            got = self._headers.get(cur)
            if got is not None:
                base = got
                break
            c = view.commits.get(cur) or self.store.history.commit(cur)
            chain.append((cur, c))
            if "h" not in c.meta["lg"] or not c.parents:
                break
            cur = o.hex_id(c.parents[0])
        for cur, c in reversed(chain):
            lg, cpid = c.meta["lg"], c.meta["checkpoint_id"]
            try:
                if "c" in lg:
                    hdr = self._vals.loads(lg["c"])
                else:
                    hdr = decode_header(lg["H"], None, cpid) if "H" in lg else decode_header(lg["h"], base, cpid)
            except (KeyError, TypeError, AttributeError, ValueError) as e:
                raise o.IntegrityError(cur, f"malformed checkpoint header ({e})") from e
            remember(self._headers, cur, hdr)
            base = hdr
        assert base is not None
        return base

    def _versions(self, view: _View, cid: str) -> dict[str, Any]:
        return self._header(view, cid).get("channel_versions", {})

    def _find_version(self, view: _View, ns: str, channel: str, version: Any) -> Tree | None:
        """The state tree of a checkpoint of ``ns`` holding ``channel`` at ``version``, newest first."""
        for (cns, _), cid in sorted(view.cps.items(), key=lambda kv: kv[0][1], reverse=True):
            c = view.commits[cid]
            if cns != ns or c.state is None or self._versions(view, cid).get(channel) != version:
                continue
            tree = self._vals.tree(c.state)
            if channel in tree.values or channel in tree.refs or channel in tree.sub:
                return tree
        return None

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Store a task's writes for a checkpoint, as one commit on the ``writes`` branch. It is
        durable (on a durable store) when this returns; calls in flight together share one write.

        A write already stored for the same task and index is not stored again; special
        writes (errors, interrupts, resumes) replace the earlier one.

        Raises:
            InvalidName, StorageError.
        """
        conf = config["configurable"]
        thread_id, ns, cpid = str(conf["thread_id"]), conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
        prefix = self._prefix(thread_id)
        name = self._ref_name(prefix, WRITES_BRANCH)

        def stage(group: Group, job: Job) -> None:
            view = self._views.get(thread_id) or self._refresh(thread_id)
            have = {(t, i) for t, i, _, _, _ in self._writes_of(view, ns, cpid, decode=False)}
            todo = []
            for idx, (channel, value) in enumerate(writes):
                widx = WRITES_IDX_MAP.get(channel, idx)
                if widx >= 0 and (task_id, widx) in have:
                    continue
                todo.append((widx, channel, value))
            if not todo:
                return
            pending: dict[str, bytes] = {}
            parts: dict[str, dict[str, Any]] = {"values": {}, "refs": {}, "sub": {}}
            meta: dict[str, Any] = {"checkpoint_id": cpid, "task_id": task_id, "w": []}
            for i, (widx, channel, value) in enumerate(todo):
                n = self._vals.store_write(pending, parts, str(i), value)
                meta["w"].append([widx, channel] if n is None else [widx, channel, n])
            tree = None
            if parts["refs"] or parts["sub"]:
                tree = self._vals.put_obj(pending, Tree(**parts))
            elif parts["values"]:
                meta["v"] = parts["values"]
            if ns:
                meta["ns"] = ns
            move = group.moves.get(name)
            if move is None:
                expect = self._ref_for_swap(name) if name in view.targets else None
                if expect is not None and expect.target != view.targets.get(name):
                    expect = self.store.refs.read(name)
                move = self._start(group, job, thread_id, name, WRITES_BRANCH, expect, self._known_hint(name, expect))
            self._stage(move, job, view, pending, {"lg": {"writes": True}}, "writes", tree, task_path, meta)

        def awaiting() -> bool:  # the checkpoint's put is not stored yet: LangGraph has it in flight
            view = self._views.get(thread_id)
            return view is not None and (ns, cpid) not in view.cps

        self._land(Job(prefix, stage, awaiting=awaiting, forget=self._forgets(thread_id)))

    # -- reading ---------------------------------------------------------------------------------
    def _writes_of(self, view: _View, ns: str, cpid: str, decode: bool = True) -> list[tuple[str, int, str, Any, str]]:
        """(task id, index, channel, value, task path) of a checkpoint's writes, in LangGraph's order."""
        wids = sorted(view.writes.get((ns, cpid), ()), key=lambda w: (view.commits[w].time, view.commits[w].depth))
        stored: dict[tuple[str, int], tuple[str, int, str, Any, str]] = {}
        for wid in wids:
            c = view.commits[wid]
            task, path = c.meta.get("task_id", ""), c.meta.get("task_path", c.author)
            vals = self._vals.write_values(c) if decode else []
            for i, w in enumerate(c.meta.get("w", [])):
                widx, channel = w[0], w[1]
                key = (task, widx)
                if widx >= 0 and key in stored:
                    continue
                stored[key] = (task, widx, channel, vals[i] if decode else None, path)
        return [stored[k] for k in sorted(stored, key=lambda k: writes_sort_key(stored[k][4], *k))]

    def _tuple(self, thread_id: Any, view: _View, ns: str, cid: str) -> CheckpointTuple:
        c = view.commits[cid]
        lg = c.meta["lg"]
        header = copy_header(self._header(view, cid))
        cpid = c.meta["checkpoint_id"]
        parent_cp = lg.get("p")
        if parent_cp is None and c.parents:
            parent_cp = view.commits[o.hex_id(c.parents[0])].meta.get("checkpoint_id") \
                if o.hex_id(c.parents[0]) in view.commits \
                else self.store.history.commit(o.hex_id(c.parents[0])).meta.get("checkpoint_id")
        conf = {"thread_id": thread_id, "checkpoint_ns": ns}
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": cpid}},
            checkpoint=cast(Checkpoint, {**header, "channel_values": self._vals.read_record(c.state)}),
            metadata=cast(CheckpointMetadata, self._md(c)),
            parent_config={"configurable": {**conf, "checkpoint_id": parent_cp}} if parent_cp else None,
            pending_writes=[(t, ch, v) for t, _, ch, v, _ in self._writes_of(view, ns, cpid)],
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (the thread's latest in its namespace if no id).

        Raises:
            InvalidName, StorageError, IntegrityError.
        """
        conf = config["configurable"]
        thread_id, ns = str(conf["thread_id"]), conf.get("checkpoint_ns", "")
        with self._lock:
            view = self._refresh(thread_id)
            cpid = get_checkpoint_id(config) or view.latest.get(ns)
            cid = view.cps.get((ns, cpid)) if cpid else None
            if cid is None:
                return None
            return self._tuple(conf["thread_id"], view, ns, cid)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,  # noqa: A002 - LangGraph's signature
             before: RunnableConfig | None = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, by thread, namespace, metadata ``filter``, ``before``, ``limit``.
        Without ``config``, every thread's but one whose deletion began and did not finish
        (:attr:`castore.SessionInfo.deleting`), as once its deletion is finished.

        Raises:
            InvalidName, StorageError, IntegrityError.
        """
        if config is not None:
            threads = [config["configurable"]["thread_id"]]
            want_ns = config["configurable"].get("checkpoint_ns")
            want_id = get_checkpoint_id(config)
        else:
            threads = [s.session for s in self.store.sessions(self.app, self.user)
                       if s.deleting is None] if self.store.exists else []  # (not a thread being deleted)
            want_ns, want_id = None, None
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for thread in threads:
            with self._lock:
                view = self._refresh(str(thread))
                keys = sorted((k for k in view.cps if (want_ns is None or k[0] == want_ns)
                               and (want_id is None or k[1] == want_id)
                               and (before_id is None or k[1] < before_id)), key=lambda k: k[1], reverse=True)
                chosen = []
                for key in keys:
                    if left is not None and left <= 0:
                        break
                    cid = view.cps[key]
                    if filter:
                        md = self._md(view.commits[cid])
                        if not all(md.get(fk) == fv for fk, fv in filter.items()):
                            continue
                    chosen.append((key[0], cid))
                    if left is not None:
                        left -= 1
            for ns, cid in chosen:
                with self._lock:
                    tup = self._tuple(thread, view, ns, cid)
                yield tup

    # -- whole threads ---------------------------------------------------------------------------
    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread's refs (its objects go at the next ``castore gc``).

        Raises:
            InvalidName, StorageError.
        """
        with self._lock:
            try:
                self.store.delete_session(self.app, self.user, str(thread_id))
            except SessionNotFound:
                pass
            self._forget(str(thread_id))

    def _forget(self, thread_id: str) -> None:
        self._views.pop(thread_id, None)
        self._heads.pop(thread_id, None)
        prefix = self._prefix(thread_id) + "/"
        for name in [n for n in self._tokens if n.startswith(prefix)]:
            del self._tokens[name]
        for name in [n for n in self._hints if n.startswith(prefix)]:
            del self._hints[name]

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Make ``target`` a fork of ``source`` in O(1): its refs name the same commits.

        Branches that already exist in the target keep their place; the copy of a branch
        whose name is taken gets a ``.copy`` suffix.

        Raises:
            InvalidName, StorageError.
        """
        src, dst = str(source_thread_id), str(target_thread_id)
        with self._lock:
            sp, dp = self._prefix(src), self._prefix(dst)
            listed = [n for n in self.store.refs.list(sp) if not n.endswith(".lock")]
            got = self.store.refs.read_many(listed)
            head_branch = None
            for name, v in sorted(got.items()):
                if v is None:
                    continue
                if name.endswith("/HEAD"):
                    head_branch = v.symbolic
                    continue
                rel = name[len(sp) + 1:]
                meta = carried_meta(v)
                if not rel.startswith("heads/"):
                    target = f"{dp}/{rel}"
                    if self.store.refs.read(target) is None:
                        self.store.plumbing.swap(target, v.target, None, meta)
                    continue
                real = self._real(name, v.meta)
                for _ in range(_COPY_NAMES):
                    target = self._ref_name(dp, real)
                    meta.update(name_meta(target, real))
                    try:
                        self.store.plumbing.swap(target, v.target, None, meta)
                        break
                    except RefConflict as e:
                        if e.actual == v.target:
                            break
                        real += ".copy"
            if head_branch is not None and self.store.refs.read(f"{dp}/HEAD") is None:
                ref = got.get(f"{sp}/{head_branch}")
                self._ensure_head(dp, self._real(f"{sp}/{head_branch}", ref.meta if ref else None), dst)
            self._forget(dst)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune threads: ``keep_latest`` keeps each namespace's latest checkpoint (and its
        writes) as a new root; ``delete`` deletes the threads. Pruned commits become garbage
        for ``castore gc``.

        Raises:
            ValueError: an unknown strategy.
            SessionDeleting: ``keep_latest`` of a thread whose deletion is under way or was
                interrupted (``delete`` finishes it).
            InvalidName, StorageError.
        """
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r} (use 'keep_latest' or 'delete')")
        for tid in thread_ids:
            if strategy == "delete":
                self.delete_thread(tid)
                continue
            with self._lock:
                view = self._refresh(str(tid))
                keep = {view.cps[(ns, cp)] for ns, cp in view.latest.items() if (ns, cp) in view.cps}
                self._rewrite(str(tid), view, keep)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is in ``run_ids``,
        in every thread of this saver's app and user (but one whose deletion began and did not
        finish); later checkpoints are re-parented onto their nearest kept ancestor.

        Raises:
            StorageError.
        """
        runs = set(run_ids)
        if not runs or not self.store.exists:
            return
        for info in self.store.sessions(self.app, self.user):
            if info.deleting is not None:
                continue  # a rewrite would bring its refs back under the deletion's mark
            with self._lock:
                view = self._refresh(info.session)
                drop = set()
                for cid in view.cps.values():
                    md = self._md(view.commits[cid])
                    if md.get("run_id") in runs:
                        drop.add(cid)
                if drop:
                    self._rewrite(info.session, view, set(view.cps.values()) - drop)

    def _rewrite(self, thread_id: str, view: _View, keep: set[str]) -> None:
        """Rebuild a thread keeping only the checkpoint commits in ``keep`` (and their writes).

        A kept checkpoint whose parent is dropped is written again onto its nearest kept
        ancestor (or as a root); branches move to the new commits; objects are shared.

        Raises:
            SessionDeleting: a deletion of the thread is under way or was interrupted (its
                refs are left as they are: rewritten, they would read as a write after the
                deletion began, which keeps the thread, :func:`castore.deletion.written_since`).
        """
        prefix = self._prefix(thread_id)
        if deleting_since(self.store.refs.read(SessionRefs(prefix).head)) is not None:
            raise SessionDeleting((self.app, self.user, thread_id))
        history, plumbing = self.store.history, self.store.plumbing
        order = sorted((cid for cid, c in view.commits.items() if c.kind == "checkpoint"),
                       key=lambda cid: view.commits[cid].depth)
        new_of: dict[str, str | None] = {}  # old commit -> itself rewritten, or its nearest kept ancestor
        for cid in order:
            c = view.commits[cid]
            old_parent = o.hex_id(c.parents[0]) if c.parents else None
            new_parent = new_of.get(old_parent) if old_parent else None
            if cid not in keep:
                new_of[cid] = new_parent
                continue
            if new_parent == old_parent:
                new_of[cid] = cid
                continue
            lg = {k: v for k, v in c.meta["lg"].items() if k not in ("c", "h", "H")}
            header = self._header(view, cid)
            lg.update({"H": encode_header(header, None)} if is_plain(header)
                      else {"c": list(self.serde.dumps_typed(header))})
            if old_parent is not None and "p" not in lg:
                lg["p"] = view.commits[old_parent].meta.get("checkpoint_id")
            batch = plumbing.batch(new_parent)
            nid = batch.again(c, {**c.meta, "lg": lg})
            plumbing.write(batch)
            view.commits[nid] = history.commit(nid)
            new_of[cid] = nid
        kept_cps = {(view.commits[c].meta.get("ns", ""), view.commits[c].meta["checkpoint_id"]) for c in keep}
        wanted: dict[str, str] = {}
        for name, tip in sorted(view.targets.items()):
            new_tip = new_of.get(tip) if view.commits[tip].kind == "checkpoint" else None
            if new_tip is not None and new_tip not in wanted.values():
                wanted[name] = new_tip
        old_writes = sorted((w for ws in view.writes.values() for w in ws),
                            key=lambda w: (view.commits[w].time, view.commits[w].depth))
        kept_writes = [w for w in old_writes
                       if (view.commits[w].meta.get("ns", ""), view.commits[w].meta.get("checkpoint_id")) in kept_cps]
        writes_name = self._ref_name(prefix, WRITES_BRANCH)
        if kept_writes == old_writes and set(view.writes_refs(writes_name)) <= {writes_name}:
            writes_tip = view.targets.get(writes_name)
        else:
            writes_tip = self._rechain(kept_writes, view) if kept_writes else None
        for name, tip in wanted.items():
            if view.targets.get(name) != tip:
                self._set_ref(name, tip)
        if writes_tip is not None and view.targets.get(writes_name) != writes_tip:
            self._set_ref(writes_name, writes_tip)
        for name in view.targets:
            if name not in wanted and not (name == writes_name and writes_tip is not None):
                plumbing.delete(name)
                self._tokens.pop(name, None)
        root = [(view.commits[t].meta["checkpoint_id"], n) for n, t in wanted.items()
                if not view.commits[t].meta.get("ns")]
        if root:
            name = max(root)[1]
            cur = self.store.refs.read(name)
            self._ensure_head(prefix, self._real(name, cur.meta if cur is not None else None), thread_id)
        elif not wanted and writes_tip is None:
            try:
                plumbing.delete(SessionRefs(prefix).head)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self._forget(thread_id)

    def _rechain(self, wids: builtins.list[str], view: _View) -> str:
        """Write the writes commits ``wids`` again as one chain; return its tip."""
        batch = self.store.plumbing.batch(None)
        for wid in wids:
            c = view.commits[wid]
            batch.again(c, c.meta)
        self.store.plumbing.write(batch)
        assert batch.tip is not None
        return batch.tip

    def _set_ref(self, name: str, target: str) -> None:
        c = self.store.history.commit(target)
        extra: dict[str, Any] = {}
        if c.kind == "checkpoint":
            extra["lg"] = {"ns": c.meta.get("ns", ""), "cp": c.meta["checkpoint_id"]}
        meta = self.store.plumbing.ref_meta_at(target, **extra)
        self._tokens[name] = self.store.plumbing.set(name, target, lambda _: meta, keep=REAL_NAME_KEYS)

    # -- context manager (``with saver:`` / ``async with saver:``, as LangGraph's savers) -------
    def __enter__(self) -> CastoreSaver:
        """Use the saver in a ``with`` block; returns the saver itself."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Leave the block: the saver opened nothing to close (the store is the caller's, and
        stays open), so the saver remains usable, as ``InMemorySaver`` does. Raises nothing."""

    async def __aenter__(self) -> CastoreSaver:
        """Use the saver in an ``async with`` block; returns the saver itself."""
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Leave the block, as :meth:`__exit__`. Raises nothing."""

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> CastoreSaver:
        """A saver on the same store whose serializer also admits ``extra_allowlist``'s types.

        As LangGraph's savers: ``self`` when the serializer's allowlist does not change,
        otherwise a saver of its own (its own caches of decoded values and views), so that
        what the proxy decodes with the wider allowlist never reaches this saver's readers.
        Both see every checkpoint either writes (the store is shared). Raises nothing.
        """
        proxy = super().with_allowlist(extra_allowlist)
        if proxy is self:
            return self
        clone = copy.copy(self)  # a subclass's own attributes come along
        CastoreSaver.__init__(clone, self.store, self.app, self.user, serde=proxy.serde)  # caches of its own
        return clone

    # -- async twins -----------------------------------------------------------------------------
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async twin of :meth:`get_tuple` (runs in a worker thread)."""
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,  # noqa: A002 - LangGraph's signature
                    before: RunnableConfig | None = None, limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        """Async twin of :meth:`list` (the listing runs in a worker thread)."""
        items = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> RunnableConfig:
        """Async twin of :meth:`put` (runs in a worker thread)."""
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        """Async twin of :meth:`put_writes` (runs in a worker thread)."""
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """Async twin of :meth:`delete_thread` (runs in a worker thread)."""
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async twin of :meth:`copy_thread` (runs in a worker thread)."""
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async twin of :meth:`prune` (runs in a worker thread)."""
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async twin of :meth:`delete_for_runs` (runs in a worker thread)."""
        await asyncio.to_thread(self.delete_for_runs, run_ids)


def _is_branch_key(key: str, prefix: str) -> bool:
    """Whether the storage key ``key`` is a ref of the thread ``prefix`` a view holds (not HEAD or the reflog)."""
    name = key[len(REFS_PREFIX) + 1:]
    return key.startswith(REFS_PREFIX + "/") and name.startswith(prefix + "/") \
        and (p := parse_ref_name(name)) is not None and p.kind not in ("head", "reflog")


def _copy_plain(x: Any) -> Any:
    if type(x) is dict:
        return {k: _copy_plain(v) for k, v in x.items()}
    if type(x) is list:
        return [_copy_plain(v) for v in x]
    return x


__all__ = ["CastoreSaver"]
