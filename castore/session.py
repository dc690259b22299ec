"""Session: what an agent calls. Append, read, branch, check out, fork, label, time-travel, audit.

One session is the commit DAG reachable from its refs under
``refs/sessions/<app>/<user>/<session>/``: ``HEAD`` (the leaf pointer, usually symbolic:
``ref: heads/main``), ``heads/<branch>`` and ``tags/<label>``. Every append builds its
commits in one batch, writes its objects first and then moves one branch ref by
compare-and-swap, all through :mod:`castore.plumbing` (the one write path).

The store builds sessions; this module never imports it: a session gets what it needs
through :class:`SessionHost`, which :class:`castore.Store` satisfies.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import deletion, handles, names, plumbing, revisions
from . import objects as o
from .aio import to_thread
from .entries import (
    DELETE,
    BranchSummary,
    Compaction,
    Event,
    LogEntry,
    Message,
    ModelChange,
    Prepared,
    info_value,
    messages_from_bodies,
    prepare,
)
from .errors import (
    AuditError,
    BranchError,
    CorruptRef,
    InvalidEntry,
    RefConflict,
    RevisionNotFound,
    SessionDeleting,
    SessionExists,
)
from .gcpause import gc_paused
from .groupcommit import Group, GroupCommit, Job
from .history import BlockPath, Hint, History
from .objects import Commit, ObjectId, Value
from .objectstore import ObjectStore
from .pathview import PathView, log_entries, log_entry, value_of
from .plumbing import Batch, NoSuchRef, Plumbing
from .redact import REDACTED_INFO
from .refnames import (
    HEAD_KEEPS,
    HEADS,
    META_BORN,
    META_CREATED,
    META_HEAD_BRANCH,
    META_INFO,
    META_LENGTH,
    META_NAMES,
    META_TIME,
    REMOTES,
    TAGS,
    SessionRefs,
    carried_meta,
    deleting_since,
    head_segment,
    lost_branch_problem,
    name_meta,
    parse_ref_name,
    real_name,
    symbolic_to,
    valid_segment,
)
from .refs import PREFIX as REFS_PREFIX
from .refs import RefStore, RefValue
from .scopes import ScopePlan
from .state import read_state, read_states

if TYPE_CHECKING:
    from .context import Context

T = TypeVar("T")
_VERIFY_BATCH = 512
#: ``expect=`` of :meth:`Session.append_many` that makes a branch: the branch must not exist
#: yet (two imports of one new file at once: the second to append raises RefConflict, instead
#: of appending the same lines again on top of the first's)
NEW_BRANCH = ""
_MESSAGE_KINDS = ("message", "event")


class SessionHost(Protocol):
    """What a session needs from the store that made it (:class:`castore.Store` is one)."""

    objects: ObjectStore
    refs: RefStore
    history: History
    plumbing: Plumbing
    group_commit: GroupCommit

    @property
    def exists(self) -> bool: ...

    def init(self) -> bool: ...
    def require(self) -> None: ...
    def session(self, app: str, user: str, session_id: str) -> Session: ...
    def prepare_scope_changes(self, app: str, user: str | None,
                              changes: Sequence[tuple[Mapping[str, Any], tuple[str, ...]]],
                              author: str = "") -> ScopePlan: ...
    def publish_scope_changes(self, plan: ScopePlan) -> list[str]: ...
    def scope_heads(self, app: str, user: str) -> tuple[str | None, str | None]: ...
    def tenant(self, app: str, user: str | None) -> SessionHost: ...
    def scope_pair_states(self, app: str, user: str, app_commit: str | None,
                          user_commit: str | None) -> tuple[dict[str, Any], dict[str, Any]]: ...


def _twin(method: Callable[..., T]) -> Callable[..., Any]:
    """Make the async twin of a blocking method: it runs in a worker thread."""

    @functools.wraps(method)
    async def twin(self: Any, *args: Any, **kwargs: Any) -> T:
        return await to_thread(method, self, *args, **kwargs)

    twin.__doc__ = f"Async twin of :meth:`{method.__name__}` (runs off the event loop)."
    return twin


class Session(handles.Handle):
    """One session of one user of one app; see the module docstring.

    Create it with :meth:`Store.session`. Nothing is written before the first append.
    """

    def __init__(self, store: SessionHost, app: str, user: str, session_id: str) -> None:
        self.store = store
        self.app = names.validate(app, "app name")
        self.user = names.validate(user, "user name")
        self.id = names.validate(session_id, "session id")
        #: the names of this session's refs
        self.refs = SessionRefs.of(app, user, session_id)
        self.prefix = self.refs.prefix
        #: the write path (and the object store, refs and history under it)
        self.plumbing = store.plumbing
        self._history = store.history
        self._objs = store.objects
        self._refs = store.refs
        self.temp: dict[str, Any] = {}
        self._view: PathView | None = None  # the path this handle read last (castore.pathview)

    @property
    def key(self) -> tuple[str, str, str]:
        """``(app, user, session)``."""
        return (self.app, self.user, self.id)

    def __repr__(self) -> str:
        return f"<castore.Session {self.app}/{self.user}/{self.id}>"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.temp.clear()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.temp.clear()

    # -- HEAD ---------------------------------------------------------------------------
    def _head_meta(self, head: RefValue | None, born: bool = True, **extra: Any) -> dict[str, Any]:
        """HEAD's metadata: what ``head`` keeps, the session's names and creation time, the
        born mark (:data:`~castore.plumbing.META_BORN`: every writer of HEAD but ``set_info``
        writes it once the session has a commit), then ``extra``.

        Raises:
            SessionDeleting: ``head`` carries the deleting mark (:meth:`_refuse_deleting`).
        """
        self._refuse_deleting(head)
        meta = {k: v for k, v in (head.meta if head else {}).items() if k in HEAD_KEEPS}
        meta.setdefault(META_NAMES, {"app": self.app, "user": self.user, "session": self.id})
        meta.setdefault(META_CREATED, time.time())
        if born:
            meta[META_BORN] = True
        meta.update(extra)
        return meta

    def _head_on(self, branch: str) -> tuple[str, dict[str, Any]]:
        """HEAD's target and extra metadata for being on ``branch``."""
        target = symbolic_to(branch)
        return target, name_meta(target, branch, META_HEAD_BRANCH)

    # -- the leaf ----------------------------------------------------------------------
    def _read_tip(self) -> tuple[RefValue | None, str | None, RefValue | None]:
        """(HEAD value, branch name or None if detached, value of the ref HEAD resolves to).

        Raises:
            CorruptRef: HEAD names something that is not a branch. IntegrityError, StorageError.
        """
        head = self._refs.read(self.refs.head)
        if head is None:
            return None, "main", self._refs.read(self.refs.branch("main"))
        if head.symbolic is None:
            return head, None, head
        tipref = self._refs.read(self.refs.branch_ref_of(head))
        return head, self.refs.branch_of(head, tipref.meta if tipref is not None else None), tipref

    def _tip_for_write(self, fresh: bool) -> tuple[RefValue | None, str | None, RefValue | None]:
        """:meth:`_read_tip` for a writer: HEAD and its branch as this handle last wrote or
        read them (no request in steady state; see :meth:`Plumbing.read_for_write`), read
        afresh when ``fresh`` (a retry after a lost race).

        A kept HEAD is safe to build on because the branch swap checks the branch, and a
        checkout that moves HEAD off a branch rewrites that branch (:meth:`Plumbing.touch`):
        a writer holding the old HEAD loses its swap and reads HEAD again. A detached HEAD
        is always read afresh (its appends are not a steady state).

        Raises:
            CorruptRef: HEAD names something that is not a branch. IntegrityError, StorageError.
        """
        rw = self.plumbing.read_for_write
        head = rw(self.refs.head, fresh)
        if head is not None and head.symbolic is None and not fresh:
            head = rw(self.refs.head, True)
        if head is None:
            return None, "main", rw(self.refs.branch("main"), fresh)
        if head.symbolic is None:
            return head, None, head
        tipref = rw(self.refs.branch_ref_of(head), fresh)
        return head, self.refs.branch_of(head, tipref.meta if tipref is not None else None), tipref

    @property
    def head(self) -> ObjectId | None:
        """The commit id of the leaf (HEAD), or None for a session with no entries.

        Raises:
            IntegrityError, StorageError.
        """
        _, _, tip = self._read_tip()
        return ObjectId(tip.target) if tip is not None else None

    @property
    def current_branch(self) -> str | None:
        """The branch HEAD is on, or None when HEAD is detached.

        Raises:
            CorruptRef: HEAD names something that is not a branch. StorageError.
        """
        head = self._refs.read(self.refs.head)
        branch = self.refs.branch_of(head)
        if head is not None and branch is not None and names.is_hashed(branch):
            tipref = self._refs.read(self.refs.branch_ref_of(head))  # only for a lost long name
            branch = self.refs.branch_of(head, tipref.meta if tipref is not None else None)
        return branch

    def head_state(self) -> tuple[bool, str | None, ObjectId | None]:
        """``(exists, current branch, head)``: what :meth:`exists`, :attr:`current_branch` and
        :attr:`head` say, from one read of HEAD (and of the branch it is on), for a caller that
        needs them together (an importer, per file).

        Raises:
            CorruptRef: (an IntegrityError) HEAD is garbage or names something that is not a
                branch. IntegrityError, StorageError.
        """
        head, branch, tip = self._read_tip()
        return head is not None, branch, ObjectId(tip.target) if tip is not None else None

    def exists(self) -> bool:
        """Whether the session exists: its HEAD ref is stored (as :attr:`info` and
        :attr:`head` read it; a damaged branch behind it shows when they read on).

        Raises:
            IntegrityError: HEAD is garbage (a :class:`~castore.errors.CorruptRef` naming it),
                as every reader of the session says, rather than a session that exists.
            StorageError: the backend failed.
        """
        return self._refs.exists(self.refs.head)

    @property
    def info(self) -> dict[str, Any]:
        """Session metadata (for example an imported file's header), kept on HEAD."""
        return self._info_of(self._refs.read(self.refs.head))

    def _info_of(self, head: RefValue | None) -> dict[str, Any]:
        # sealed when encrypted
        info = self._objs.codec.open_meta(head.meta.get(META_INFO, {}), META_INFO) if head is not None else {}
        return dict(info) if isinstance(info, dict) else {}

    def set_info(self, info: Mapping[str, Any], *, expect: Mapping[str, Any] | None = None) -> None:
        """Replace the session metadata (creates HEAD if the session is new).

        When the store redacts writes (:attr:`castore.Store.redactor`), the metadata is
        redacted too and marked ``"redacted": true``; the mark stays once set (what the
        session holds is not the original, whatever writes follow).

        Args:
            info: the new metadata.
            expect: the metadata as the caller read it (:attr:`info`; ``{}`` for a session
                without any; compared as stored: a tuple is the list read back): the write
                is a compare-and-swap of it. A writer that records its position in a source
                there (an importer) learns that a rival recorded one meanwhile, instead of
                writing over it. None: written over whatever is there (HEAD moving meanwhile
                is retried).

        Raises:
            RefConflict: ``expect`` was given and the metadata stored is another (nothing is
                written; not retried).
            SessionDeleting: HEAD carries the deleting mark (:mod:`castore.deletion`).
            InvalidEntry: ``info`` (or ``expect``) is not a mapping or holds something that cannot
                be stored (nothing is written).
            RefContended: HEAD kept changing (see :class:`~castore.retry.RetryPolicy`).
            StorageError.
        """
        new = info_value(info, "session info")
        want = None if expect is None else info_value(expect, "the session info expected", as_read=True)
        changed: list[RefConflict] = []
        self.store.init()
        redactor = self.plumbing.redactor
        if redactor is not None:
            new = {**redactor.value(new), REDACTED_INFO: True}
        elif self.info.get(REDACTED_INFO):
            new[REDACTED_INFO] = True
        sealed = self._objs.codec.seal_meta(new, META_INFO)  # sealed when encrypted

        def attempt(_: int) -> None:
            head = self._refs.read(self.refs.head)
            if want is not None and self._info_of(head) != want:
                changed.append(RefConflict(self.refs.head, None, None, f"the info of session {'/'.join(self.key)} "
                                           "changed since it was read (another writer recorded its own)"))
                raise changed[-1]
            target, extra = (head.target, {}) if head else self._head_on("main")
            # born: HEAD made after its branch (Pi's import), as this handle last wrote or read it
            born = head is None and self.plumbing.read_for_write(self.refs.branch("main")) is not None
            meta = self._head_meta(head, born=born, **extra)  # (a born mark stays: HEAD_KEEPS)
            if head is not None and META_HEAD_BRANCH in head.meta:  # same target: same branch name
                meta[META_HEAD_BRANCH] = head.meta[META_HEAD_BRANCH]
            meta[META_INFO] = sealed
            self.plumbing.swap(self.refs.head, target, head, meta)

        self.plumbing.land(self.refs.head, attempt, final=lambda e: e in changed)

    # -- appending ---------------------------------------------------------------------
    def append(self, entry: Any, *, expect: str | None = None, author: str | None = None,
               meta: Mapping[str, Any] | None = None, state_delta: Mapping[str, Any] | None = None,
               time: float | None = None, branch: str | None = None) -> ObjectId:
        """Append one entry on the current branch (or on ``branch``) and return its commit id.

        Args:
            entry: a :class:`Message`, :class:`Event`, :class:`Compaction`, ... or a
                message dict.
            expect: the commit the caller expects to extend; if the branch moved, raise
                :class:`RefConflict` instead of appending after the new tip.
            author, meta, state_delta: override or extend the entry's provenance.
            time: the entry's timestamp (default: now).
            branch: append to this branch without checking it out (see :meth:`append_many`).

        Raises:
            InvalidEntry: the entry cannot be stored (nothing is written).
            RefConflict: ``expect`` was given and the branch is elsewhere.
            NoSuchRef: ``branch`` names no branch of an existing session.
            StorageError: the backend failed.
        """
        return self.append_many([entry], expect=expect, author=author, meta=meta,
                                state_delta=state_delta, time=time, branch=branch)[0]

    def append_many(self, entries: Sequence[Any], *, expect: str | None = None, author: str | None = None,
                    meta: Mapping[str, Any] | None = None, state_delta: Mapping[str, Any] | None = None,
                    time: float | None = None, times: Sequence[float | None] | None = None,
                    metas: Sequence[Mapping[str, Any] | None] | None = None,
                    branch: str | None = None) -> list[ObjectId]:
        """Append a whole turn: one commit per entry, landed together or not at all.

        The objects of every entry are written in one batch and the branch ref moves once;
        the appends other threads of this store handle have in flight at the same time are
        written with it (one object write, one swap per branch: :mod:`castore.groupcommit`).
        ``author``/``meta``/``time`` apply to every entry; ``times``/``metas`` give each entry
        its own (one item per entry; a None item falls back to ``time``/``meta``; an entry's
        ``metas`` item extends ``meta`` and wins on a shared key); ``state_delta`` applies to
        the last entry. A lost race with another writer re-reads the tip and retries (unless
        ``expect``). Appending while HEAD is detached starts a new branch there (named
        ``branch-<id>``).

        Args:
            entries: the entries, as for :meth:`append`.
            expect: the commit the caller expects the branch to be at (see :meth:`append`);
                :data:`NEW_BRANCH`: the branch must not exist yet (the first append of a
                session's import: a rival that made it first wins, this one raises).
            author, meta, state_delta, time: as for :meth:`append`, for every entry.
            times: per-entry timestamps, as many as ``entries``.
            metas: per-entry provenance, as many as ``entries``.
            branch: append to this branch, whether or not HEAD is on it; HEAD does not move
                (nor does a detached HEAD start a branch). In a session with no entries yet,
                the first append makes the branch and puts HEAD on it.

        Returns:
            The new commit ids, in order.

        Raises:
            InvalidEntry: an entry cannot be stored, or ``times``/``metas`` do not give one
                item per entry (nothing is written).
            RefConflict: ``expect`` was given and the branch is elsewhere.
            NoSuchRef: ``branch`` names no branch of a session that has entries (a
                :class:`BranchError`; create it with :meth:`branch` first).
            InvalidName: ``branch`` is not a valid branch name.
            SessionDeleting: HEAD carries the deleting mark (:mod:`castore.deletion`).
            StorageError: the backend failed. (Failing while moving app/user state after the
                entries landed, it leaves the entries and loses that state change.)
        """
        if isinstance(entries, (str, bytes, dict)) or not isinstance(entries, Iterable):
            raise InvalidEntry("append_many takes a list of entries")
        entries = list(entries)
        if not entries:
            return []
        times_ = _per_entry(times, len(entries), "times")
        metas_ = _per_entry(metas, len(entries), "metas")
        prepared = [
            prepare(e, author, _merged(meta, metas_[i]), state_delta if i == len(entries) - 1 else None,
                    times_[i] if times_[i] is not None else time)
            for i, e in enumerate(entries)
        ]
        on = self.refs.branch(branch) if branch is not None else None
        want = None if expect == NEW_BRANCH else expect
        if expect is not None or on is not None:
            # Fail before the app/user state is touched: a refused append writes nothing.
            tipref = self._branch_tip(on, branch, fresh=expect is not None)[2] \
                if on is not None and branch is not None else self._read_tip()[2]
            if expect is not None and (tipref.target if tipref is not None else None) != want:
                raise RefConflict(on or self._write_ref(), want, tipref.target if tipref is not None else None)
        self.store.init()
        # App and user changes are written first (the commits name them) but published only
        # after the session's ref moved: a writer that loses the race changes no scope.
        plans, scopes = self._prepare_scopes(prepared)

        def stage(group: Group, job: Job) -> None:
            # the first attempt builds on what this handle last wrote; a retry reads afresh
            fresh = job.tries > 0 or expect is not None
            name: str | None
            if on is not None and branch is not None:
                head, name, tipref = self._branch_tip(on, branch, fresh)
            else:
                head, name, tipref = self._tip_for_write(fresh)
                self._refuse_lost(head, tipref)  # not a new root on a lost branch's name
            self._refuse_deleting(head)
            ref = None if name is None else \
                on or (self.refs.branch_ref_of(head) if head is not None else self.refs.branch(name))
            # appends of other threads to this branch, staged in this group, come first
            move = group.moves.get(ref) if ref is not None else None
            tip = move.batch.tip if move is not None else tipref.target if tipref is not None else None
            if expect is not None and tip != want:
                raise RefConflict(on or (self.refs.branch(name) if name else self.refs.head), want, tip)
            batch = move.join(job) if move is not None else self.plumbing.batch(tip, tipref)
            start = len(batch.ids)
            self._build(batch, prepared, scopes)
            job.result = batch.ids[start:]
            if move is not None:
                return
            if ref is None or name is None:  # detached: a new branch there, and HEAD on it once it landed
                new = f"branch-{batch.ids[0][:8]}"
                move = group.start(job, self.refs.branch(new), None, batch)
                move.then.append(lambda _: self._head_to_new_branch(head, new))
                return
            move = group.start(job, ref, tipref, batch, name_meta(ref, name))
            if head is None or tipref is None and not head.meta.get(META_BORN):  # its first commit
                move.then.append(self._first_commit(head, name))

        ids: list[ObjectId] = self.store.group_commit.land(Job(self.refs.prefix, stage, final=expect is not None))
        for plan in plans:
            self.store.publish_scope_changes(plan)
        for p in prepared:
            for k, v in p.temp.items():
                if v is DELETE:
                    self.temp.pop(k, None)
                else:
                    self.temp[k] = v
        return ids

    def tree(self) -> plumbing.Tree:
        """A :class:`~castore.plumbing.Tree`: commits built in memory and this session's
        branches moved at once (an importer's session new with the import), HEAD made as
        the first append makes it. Raises nothing (writing raises as :meth:`append_many`)."""
        self.store.init()
        return plumbing.Tree(self.plumbing, self.refs, lambda branch: self._first_commit(None, branch))

    def _write_ref(self) -> str:
        """The ref an append without ``branch`` moves (as last read): HEAD's branch, or HEAD."""
        _, name, _ = self._read_tip()
        return self.refs.branch(name) if name else self.refs.head

    def _branch_tip(self, ref: str, name: str, fresh: bool) -> tuple[RefValue | None, str, RefValue | None]:
        """(HEAD, ``name``, the branch's value) for an append to a named branch.

        HEAD is read only to tell a new session (no HEAD: the branch may start here) from a
        missing branch of an existing one.

        Raises:
            NoSuchRef: the session has entries and no such branch.
            StorageError.
        """
        rw = self.plumbing.read_for_write
        tipref = rw(ref, fresh)
        # read afresh: a kept "no HEAD" that went stale would start a second root on the branch
        head = rw(self.refs.head, True) if tipref is None else None
        if tipref is None and head is not None:
            raise NoSuchRef(ref, f"no branch {name!r} in session {'/'.join(self.key)} "
                                 "(create it with branch() first)")
        return head, name, tipref

    def _prepare_scopes(self, prepared: list[Prepared]) -> tuple[list[ScopePlan], list[dict[str, bytes]]]:
        """Write the entries' app and user changes as commits; return the plans to publish
        and, per entry, the scope commits after it."""
        out: list[dict[str, bytes]] = [{} for _ in prepared]
        plans: list[ScopePlan] = []
        for scope, user in (("app", None), ("user", self.user)):
            changes, owners = [], []
            for i, p in enumerate(prepared):
                delta, unset = (p.app_delta, p.app_unset) if user is None else (p.user_delta, p.user_unset)
                if delta or unset:
                    changes.append((delta, unset))
                    owners.append(i)
            if changes:
                plan = self.store.prepare_scope_changes(self.app, user, changes)
                plans.append(plan)
                for i, cid in zip(owners, plan.ids, strict=True):
                    out[i][scope] = o.raw_id(cid)
        return plans, out

    @staticmethod
    def _build(batch: Batch, prepared: list[Prepared], scopes: list[dict[str, bytes]]) -> None:
        now = time.time()
        for p, p_scopes in zip(prepared, scopes, strict=True):
            batch.entry(p.kind, p.body, delta=p.delta, unset=p.unset, author=p.author,
                        when=p.time if p.time is not None else now, meta=p.meta, scopes=p_scopes, typed=p.entry)

    def _first_commit(self, head: RefValue | None, branch: str, **extra: Any) -> Callable[[RefValue], RefValue | None]:
        """What settles HEAD (``head`` as read before; ``extra``: more of its metadata) once the
        session's first commit landed on ``branch``, given the branch as landed: the one rule
        of every writer that makes a session's first branch (:func:`castore.deletion.first_commit_head`:
        a deletion racing it leaves neither a branch behind nor a lost branch; it raises
        SessionDeleting then)."""
        target, on = self._head_on(branch)
        return functools.partial(deletion.first_commit_head, self.plumbing, self.key, target=target,
                                 meta=self._head_meta(None, **on, **extra), had_head=head is not None)

    def _head_to_new_branch(self, head: RefValue | None, name: str) -> None:
        """Put the detached ``head`` on the branch ``name`` just started where it was."""
        assert head is not None
        target, extra = self._head_on(name)
        try:
            self.plumbing.swap(self.refs.head, target, head, self._head_meta(head, **extra))
        except RefConflict:
            pass  # HEAD moved meanwhile; the new branch keeps the entries reachable

    # -- revisions (see castore.revisions) ------------------------------------------------
    def resolve(self, rev: str = "HEAD") -> ObjectId:
        """The full commit id named by ``rev``.

        Accepts a full or short id (4+ hex characters), a branch, a label, ``HEAD``,
        ``HEAD~3``, ``main~2``, ``<rev>^`` and ``<rev>^2``.

        Raises:
            RevisionNotFound: nothing by that name, or it walks past the root.
            AmbiguousRevision: a short id matches several objects (``candidates``).
            SessionNotFound: ``HEAD`` of a session with no entries.
            CorruptRef: ``HEAD`` names a branch that was lost (:meth:`lost_branch`).
        """
        try:
            return revisions.resolve(self, rev)
        except RevisionNotFound as e:
            problem = self.lost_branch() if e.rev == "HEAD" else None
            if problem is not None:  # not "no entries yet": the session had some
                raise CorruptRef(self.refs.head, problem) from e
            raise

    # -- reading -----------------------------------------------------------------------
    def _head_view(self) -> PathView | None:
        """The view of the path at HEAD, carried over from the last one this handle read
        (see :mod:`castore.pathview`); None for a session with no entries.

        Raises:
            StoreNotFound, CorruptRef, ObjectNotFound, IntegrityError, StorageError.
            SessionDeleting: a deletion of the session stopped after its branch went.
        """
        head, _, tipref = self._read_tip()
        if tipref is None:
            self.store.require()
            self._refuse_deleting(head)  # its branch went by a deletion that stopped: not empty
            self._refuse_lost(head, tipref)
            return None
        view = self._view
        view = view.moved(tipref.target, tipref.meta) if view is not None \
            else PathView(self._objs, tipref.target, tipref.meta)
        self._view = view
        return view

    def _refuse_deleting(self, head: RefValue | None) -> None:
        """Raise SessionDeleting when ``head`` carries the deleting mark
        (:mod:`castore.deletion`): a write must not start a new branch in, or move the HEAD
        of, a session whose deletion is under way or was interrupted; finishing the deletion
        (``delete-session``) frees the name. A handle holding HEAD from before the mark
        appends on until its branch swap fails (the deletion deletes the branch first), then
        reads HEAD and stops here."""
        if deleting_since(head) is not None:
            raise SessionDeleting(self.key)

    def _refuse_lost(self, head: RefValue | None, tipref: RefValue | None) -> None:
        """Raise CorruptRef (fsck's line) when HEAD names a branch that is absent (``tipref``
        None) because it was lost (:meth:`lost_branch`): readers must not show the session
        as empty, and writers (append, reset) must not start that name again, which would
        hide the loss from fsck and leave the lost commits to gc. A never-born session passes.
        """
        if tipref is None and head is not None and (problem := self.lost_branch()) is not None:
            raise CorruptRef(self.refs.head, problem)

    def lost_branch(self) -> str | None:
        """Why this session's HEAD names a branch that was lost (:func:`lost_branch_problem`:
        the branch is absent though the session has another branch, a label, a remote-tracking
        branch or a reflog),
        None when HEAD is on a branch, detached, or the session never had a commit. Readers
        that would show such a session as empty, never born, raise it instead.

        Raises:
            CorruptRef: HEAD names something that is not a branch. StorageError.
        """
        head = self._refs.read(self.refs.head)
        if head is None or head.symbolic is None or self._refs.read(self.refs.branch_ref_of(head)) is not None:
            return None
        folder = self.refs.head.rsplit("/", 1)[0]
        keys = {f"{REFS_PREFIX}/{n}" for n in self._refs.list(folder)}
        return lost_branch_problem(folder, head_segment(head), head, keys)

    def _path(self, rev: str) -> list[tuple[str, Commit]]:
        if rev == "HEAD":
            view = self._head_view()
            return view.path() if view is not None else []
        return self._history.path_via(self.resolve(rev), self.tips())

    def _to_entries(self, path: list[tuple[str, Commit]]) -> list[LogEntry]:
        return log_entries(self._objs, path)

    def _entry(self, cid: str, c: Commit, body: Any) -> LogEntry:
        return log_entry(cid, c, body)

    def entries(self, rev: str = "HEAD") -> list[LogEntry]:
        """Every entry on the path from the root to ``rev``, oldest first.

        Raises:
            RevisionNotFound, AmbiguousRevision, StoreNotFound, ObjectNotFound,
            IntegrityError, StorageError.
        """
        with gc_paused():
            return self._to_entries(self._path(rev))

    def messages(self, rev: str = "HEAD") -> list[Message]:
        """The linear view: the messages on the path root -> ``rev`` (events' messages too).

        Raises:
            see :meth:`entries`.
        """
        # Only message and event commits carry messages: read just their bodies, and build
        # Message objects directly (no LogEntry per commit on this hot path). The collector
        # is paused for the whole read: every object it allocates stays alive.
        with gc_paused():
            kinds = _MESSAGE_KINDS
            bodies = [c.body.hex() for _, c in self._path(rev) if c.body is not None and c.kind in kinds]
            got = self._objs.get_many(bodies)
            values = [v.value if type(v) is Value else None for v in map(got.__getitem__, bodies)]
            return messages_from_bodies([v for v in values if v])

    def show(self, rev: str = "HEAD") -> LogEntry:
        """The one commit named by ``rev``.

        Raises:
            see :meth:`resolve`; ObjectNotFound, IntegrityError, StorageError.
        """
        cid = self.resolve(rev)
        c = self._history.commit(cid)
        body = value_of(self._objs.get(o.hex_id(c.body))) if c.body is not None else None
        return self._entry(cid, c, body)

    def state(self, rev: str = "HEAD", *, scopes: bool = True) -> dict[str, Any]:
        """The state at ``rev``: session keys, plus ``app:`` and ``user:`` keys merged in.

        At the default ``HEAD`` the app and user state are the current ones and this
        object's ``temp:`` keys are included; at any other revision they are as they were
        when that commit was made (time travel is exact).

        Raises:
            see :meth:`resolve`; ObjectNotFound, IntegrityError, StorageError.
        """
        head = self.head if rev == "HEAD" else None
        c: Commit | None = None
        base: dict[str, Any] = {}
        if rev == "HEAD" and head is None:
            if not self.exists():
                self.store.require()
        else:
            c = self._history.commit(head or self.resolve(rev))
            base = read_state(self._objs, c.state)
        if not scopes:
            return base
        out = dict(base)
        if rev == "HEAD":
            app_c, user_c = self.store.scope_heads(self.app, self.user)
            out.update(self.temp)
        else:
            assert c is not None
            app_c = o.hex_id(c.scopes["app"]) if "app" in c.scopes else None
            user_c = o.hex_id(c.scopes["user"]) if "user" in c.scopes else None
        app_s, user_s = self.store.scope_pair_states(self.app, self.user, app_c, user_c)
        out.update({f"app:{k}": v for k, v in app_s.items()})
        out.update({f"user:{k}": v for k, v in user_s.items()})
        return out

    def log(self, rev: str = "HEAD", limit: int | None = None, all_branches: bool = False) -> list[LogEntry]:
        """Commits newest first: the path to ``rev``, or every commit of every ref.

        Raises:
            InvalidEntry: ``limit`` is not a whole number >= 0.
            and what :meth:`entries` raises.
        """
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
            raise InvalidEntry(f"limit must be a whole number >= 0, not {limit!r}")
        if not all_branches:
            if limit and rev == "HEAD":  # the newest entries only: reads what it returns
                view = self._head_view()
                return list(reversed(view.entries(view.depth + 1 - limit, view.depth))) if view else []
            if limit:  # through a tip whose path reaches it: the blocks of those entries only
                at = self.resolve(rev)
                top = self._history.commit(at)
                blocks = self._history.block_path_via(at, top, self.tips()) or BlockPath(self._objs, at)
                with gc_paused():
                    return list(reversed(log_entries(self._objs, blocks.range(max(0, top.depth + 1 - limit),
                                                                                top.depth))))
            return list(reversed(self._to_entries(self._path(rev))))
        seen: dict[str, Commit] = {}
        for tip, hint in self.tips():
            for cid, c in self._history.path(tip, hint):
                seen[cid] = c
        order = sorted(seen.items(), key=lambda kv: (kv[1].time, kv[1].depth), reverse=True)
        if limit:
            order = order[:limit]
        return self._to_entries(order)

    def tips(self) -> list[tuple[str, Hint | None]]:
        """Every commit a ref of this session names directly (branches, labels, a detached
        HEAD, remote-tracking refs), each with the read hint of one ref naming it.

        Raises:
            StoreNotFound: there is no store at all.
            IntegrityError, StorageError.
        """
        out: dict[str, Hint | None] = {}
        names_ = self._refs.list(self.prefix)
        if not names_ and not self.store.exists:
            self.store.require()
        # only names castore writes, and not the reflog (its commits are not the session's)
        names_ = [n for n in names_ if (p := parse_ref_name(n)) is not None and p.kind != "reflog"]
        vals = self._refs.read_many(names_)
        for v in vals.values():
            if v is not None and v.symbolic is None:
                if v.target not in out or out[v.target] is None:
                    out[v.target] = Hint.from_meta(v.meta)
        return list(out.items())

    # -- branches, labels, checkout, fork --------------------------------------------------
    def branches(self) -> dict[str, ObjectId]:
        """Branch names and their tip commits.

        Raises:
            StorageError, IntegrityError.
        """
        return self._named(HEADS)

    def labels(self) -> dict[str, ObjectId]:
        """Label names and the commits they name.

        Raises:
            StorageError, IntegrityError.
        """
        return self._named(TAGS)

    def _named(self, kind: str) -> dict[str, ObjectId]:
        # the refs below this session's (valid) prefix that parse_ref_name takes: one valid segment more
        base = f"{self.prefix}/{kind}/"
        refs = [n for n in self._refs.list(base) if n.startswith(base) and valid_segment(n[len(base):])]
        vals = self._refs.read_many(refs)
        out = {}
        for name, v in vals.items():
            if v is None:
                continue
            out[real_name(name.rsplit("/", 1)[1], v.meta)] = ObjectId(v.target)
        return dict(sorted(out.items()))

    def remote_branches(self) -> dict[str, ObjectId]:
        """Remote-tracking branches (``<remote>/<branch>``: where a pull kept a diverged
        remote tip) and their commits. Each is a revision as ``remotes/<remote>/<branch>``.

        Raises:
            StorageError, IntegrityError.
        """
        refs = self._refs.list(f"{self.prefix}/{REMOTES}")
        out = {}
        for name, v in self._refs.read_many(refs).items():
            p = parse_ref_name(name)
            if v is None or p is None or p.kind != "remote" or p.remote is None or p.name is None:
                continue
            out[f"{real_name(p.remote, None)}/{real_name(p.name, v.meta)}"] = ObjectId(v.target)
        return dict(sorted(out.items()))

    def reflog(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Recorded moves that overwrote a ref's tip, newest first: forced branch moves,
        resets, forced pulls and pushes. Each overwritten tip stays reachable (``gc`` keeps
        it) and is a revision by its id.

        Returns:
            ``[{"id", "time", "ref", "old", "new", "why"}]`` (``ref`` as stored, ``new``
            None for a deletion).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        return [{"id": cid, "time": c.time, **{k: c.meta.get(k) for k in ("ref", "old", "new", "why")}}
                for cid, c in self.plumbing.reflog(self.refs, limit)]

    def reflog_tips(self) -> list[str]:
        """The tips the reflog keeps (overwritten branch tips), newest first.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        return [o.hex_id(c.parents[1]) for _, c in self.plumbing.reflog(self.refs)]

    def _detached_at(self, cid: str) -> dict[str, Any]:
        """The time and length a HEAD detached at ``cid`` carries (``store.sessions()`` reads
        them from HEAD itself): the commit's own time, as every ref gets
        (:meth:`~castore.plumbing.Plumbing.ref_meta_at`), never the time HEAD moved."""
        c = self._history.commit(cid)
        return {META_TIME: c.time, META_LENGTH: c.depth + 1}

    def _ref_meta_at(self, cid: str, **extra: Any) -> dict[str, Any]:
        """Metadata for a new ref at ``cid`` (the current tip's hint when it is there: no reads)."""
        _, _, tipref = self._read_tip()
        if tipref is not None and tipref.target == cid:
            return self.plumbing.ref_meta_at(cid, tipref=tipref, **extra)
        return self.plumbing.ref_meta_at(cid, self.tips(), **extra)

    def branch(self, name: str, at: str = "HEAD", *, force: bool = False) -> ObjectId:
        """Create branch ``name`` at revision ``at`` (O(1)); return its commit.

        With ``force``, an existing branch is moved to ``at`` instead (as ``git branch -f``);
        its old tip is recorded in the :meth:`reflog`, so nothing becomes unreachable.

        Raises:
            BranchError: the branch exists (unless ``force``), or it is checked out (use
                :meth:`reset` for that one).
            InvalidName, RevisionNotFound, AmbiguousRevision, StorageError.
        """
        ref = self.refs.branch(name)
        cid = self.resolve(at)
        meta = self._ref_meta_at(cid, **name_meta(ref, name))
        if force:
            if self.current_branch == name:
                raise BranchError(f"cannot force branch {name!r}: it is checked out (use reset)")
            self._move(ref, cid, meta, f"branch -f {name}")
            return cid
        try:
            self.plumbing.swap(ref, cid, None, meta)
        except RefConflict:
            raise BranchError(f"branch {name!r} already exists") from None
        return cid

    def reset(self, rev: str) -> ObjectId:
        """Move the current branch (or a detached HEAD) to ``rev``, as ``git reset --soft``.

        The old tip is recorded in the :meth:`reflog` and stays reachable.

        Raises:
            RevisionNotFound, AmbiguousRevision, SessionNotFound, StorageError.
            CorruptRef: HEAD names a branch that was lost (:meth:`lost_branch`); recreating
            it would hide the loss from fsck.
            SessionDeleting: HEAD carries the deleting mark (:mod:`castore.deletion`), or a
                deletion raced the session's first commit (``finished``: nothing of it is kept).
        """
        cid = self.resolve(rev)
        head, branch, tipref = self._read_tip()
        self._refuse_lost(head, tipref)
        self._refuse_deleting(head)  # not a branch made again in a session being deleted
        if branch is None:
            assert head is not None
            self._move(self.refs.head, cid, self._head_meta(head, **self._detached_at(cid)), f"reset {rev}")
            return cid
        ref = self.refs.branch_ref_of(head) if head is not None else self.refs.branch(branch)
        landed = self._move(ref, cid, self._ref_meta_at(cid, **name_meta(ref, branch)), f"reset {rev}")
        if head is None or tipref is None and not head.meta.get(META_BORN):  # the session's first commit
            self._first_commit(head, branch)(landed)
        return cid

    def _move(self, ref: str, cid: str, meta: Mapping[str, Any], why: str) -> RefValue:
        """Set ``ref`` to ``cid`` whatever it holds, recording an overwritten tip first; return it as landed."""

        def attempt(_n: int) -> RefValue:
            cur = self._refs.read(ref)
            if cur is not None and cur.symbolic is None and cur.target != cid:
                self.plumbing.record_move(self.refs, ref, cur.target, cid, why)
            return self.plumbing.swap(ref, cid, cur, meta)

        return self.plumbing.land(ref, attempt)

    def delete_branch(self, name: str, force: bool = False) -> None:
        """Delete a branch. Refuses the checked-out branch, and unmerged work unless forced.

        A branch is merged when its tip is on the path of another branch, label or HEAD.
        A :meth:`checkout` of the branch racing this call never leaves HEAD naming a
        missing branch: HEAD is read again after the delete and the branch is put back
        (and this call fails) when HEAD names it by then.

        Raises:
            NoSuchRef: (a BranchError and a RefNotFound) no such branch.
            BranchError: it is checked out, or it holds unmerged work.
            StorageError.
        """
        ref = self.refs.branch(name)
        v = self._refs.read(ref)
        if v is None:
            raise NoSuchRef(ref, f"no branch {name!r}")
        if self.current_branch == name:
            raise BranchError(f"cannot delete branch {name!r}: it is checked out")
        if not force:
            tip = v.target
            others = [(t, h) for t, h in self._all_tips_except(ref)]
            if not any(self._history.is_ancestor(tip, t, h) for t, h in others):
                raise BranchError(f"branch {name!r} is not merged: its tip {tip[:8]} is on no other branch, label "
                                  "or HEAD (force=True, or `castore branch -D`, deletes it anyway)")
        self.plumbing.delete(ref, v)
        if self.current_branch == name:  # a checkout landed meanwhile: put the branch back
            try:
                self.plumbing.swap(ref, v.target, None, carried_meta(v))
            except RefConflict:
                pass  # someone made it again: HEAD names an existing branch either way
            raise BranchError(f"cannot delete branch {name!r}: it was checked out meanwhile")

    def _all_tips_except(self, ref: str) -> list[tuple[str, Hint | None]]:
        refs = [r for r in self._refs.list(self.prefix)
                if r != ref and (p := parse_ref_name(r)) is not None and p.kind != "reflog"]
        vals = self._refs.read_many(refs)
        return [(v.target, Hint.from_meta(v.meta)) for v in vals.values() if v is not None and not v.symbolic]

    def checkout(self, rev: str, create: str | None = None) -> str | None:
        """Move HEAD (the leaf pointer) to a branch, or detach it at a commit.

        Leaving a branch that was lost (:meth:`lost_branch`, fsck's bad ref) gives it up: fsck
        then reports its commits as dangling, and gc deletes them after its grace period (ask
        :meth:`lost_branch` first to say so, as ``castore checkout`` does).

        Args:
            rev: a branch name (HEAD follows it) or any revision (HEAD is detached there).
            create: make a new branch of this name at ``rev`` and check it out.

        Returns:
            The branch now checked out, or None when HEAD is detached.

        Raises:
            RevisionNotFound, AmbiguousRevision, InvalidName, StorageError.
            BranchError: the branch was deleted while HEAD moved to it (HEAD is put back).
            RefContended: HEAD kept changing (see :class:`~castore.retry.RetryPolicy`).
            SessionDeleting: HEAD carries the deleting mark (:mod:`castore.deletion`), or a
                deletion raced a session's first HEAD, on a branch (``finished``).
        """
        if create is not None:
            self.branch(create, rev)
            rev = create
        on = None
        try:
            on = self._refs.read(self.refs.branch(rev))
        except names.InvalidName:
            pass
        extra: dict[str, Any]
        if on is not None:
            (target, extra), branch = self._head_on(rev), rev
        else:
            target, branch = self.resolve(rev), None
            extra = self._detached_at(target)

        def attempt(_: int) -> tuple[RefValue | None, RefValue]:
            head = self._refs.read(self.refs.head)
            if head is None and on is not None:  # the session's first HEAD, on a branch: the first commit's rule
                made = self._first_commit(None, rev)(on)
                if made is None:  # another writer's HEAD came first: move it
                    raise RefConflict(self.refs.head, None, None)
                return None, made
            return head, self.plumbing.swap(self.refs.head, target, head, self._head_meta(head, **extra))

        old, new = self.plumbing.land(self.refs.head, attempt)
        if old is not None and old.symbolic is not None and old.target != new.target:
            # handles that kept the old HEAD append to the branch it named until its ref
            # changes under them: rewrite it so that their next swap fails and reads HEAD
            try:
                left = self.refs.branch_ref_of(old)
            except CorruptRef:
                left = None  # HEAD named no branch: no writer appended through it
            if left is not None:
                self.plumbing.touch(left)
        if branch is not None and self._refs.read(self.refs.branch(branch)) is None:
            # delete_branch won a race: never leave HEAD naming a missing branch
            if old is not None:
                try:
                    self.plumbing.swap(self.refs.head, old.target, new,
                                       carried_meta(old))
                except RefConflict:
                    pass  # HEAD moved on again: whoever moved it owns it now
            raise BranchError(f"branch {branch!r} was deleted while HEAD moved to it; HEAD is left where it was")
        return branch

    def label(self, name: str, *old_order: Any, at: str = "HEAD", force: bool = False,
              rev: str | None = None) -> ObjectId:
        """Put label ``name`` on the commit ``at`` names (default HEAD); return the commit.

        As ``git tag NAME [REV]`` and like :meth:`branch`. The old order
        ``label(rev, name[, force])`` (and ``rev=`` as a keyword) still works, with a
        :class:`DeprecationWarning`.

        Raises:
            BranchError: the label exists (unless ``force``).
            InvalidName, RevisionNotFound, AmbiguousRevision, StorageError.
        """
        if old_order or rev is not None:
            if len(old_order) > 2 or at != "HEAD" or (rev is not None and old_order):
                raise TypeError("label(name, at='HEAD', force=False): give the revision once, as at=")
            import warnings

            warnings.warn("Session.label(rev, name) is deprecated: call label(name, at=rev), as branch(name, at=rev)",
                          DeprecationWarning, stacklevel=2)
            if rev is not None:
                at = rev
            else:
                name, at = old_order[0], name
                if len(old_order) == 2:
                    force = bool(old_order[1])
        cid = self.resolve(at)
        ref = self.refs.label(name)
        cur = self._refs.read(ref)
        if cur is not None and not force:
            raise BranchError(f"label {name!r} already exists (on {cur.target[:8]})")
        self.plumbing.swap(ref, cid, cur, name_meta(ref, name))
        return cid

    def delete_label(self, name: str) -> None:
        """Remove a label.

        Raises:
            NoSuchRef: (a BranchError and a RefNotFound) no such label. StorageError.
        """
        v = self._refs.read(self.refs.label(name))
        if v is None:
            raise NoSuchRef(self.refs.label(name), f"no label {name!r}")
        self.plumbing.delete(self.refs.label(name), v)

    def fork(self, new_session_id: str, at: str = "HEAD", *, user: str | None = None) -> Session:
        """Start a new session whose history is this one's up to ``at`` (O(1), shared objects).

        Raises:
            SessionExists: the new session already exists (nothing is written).
            SessionDeleting: the new session is being deleted, or a deletion of it ran whole
                while the fork landed (``finished``); nothing of the fork is kept.
            BranchError: ``user`` is another user of a tenant-layout store, whose sessions are
                kept in a store of their own, sharing no object with this one's (the fork's refs
                were written into this user's store, where nothing lists them).
            InvalidName, RevisionNotFound, AmbiguousRevision, StorageError.
        """
        if user not in (None, self.user) and self.store.tenant(self.app, user) is not self.store:
            raise BranchError(f"cannot fork into user {user!r}: the users of a tenant store share no object")
        cid = self.resolve(at)
        new = Session(self.store, self.app, user or self.user, new_session_id)
        if new.exists():
            raise SessionExists(new.key)
        meta = self._ref_meta_at(cid)
        try:
            landed = self.plumbing.swap(new.refs.branch("main"), cid, None, meta)
        except RefConflict:
            raise SessionExists(new.key) from None
        new._first_commit(None, "main", info={"forked_from": {
            "app": self.app, "user": self.user, "session": self.id, "commit": cid}})(landed)
        return new

    # -- audit -----------------------------------------------------------------------------
    def replay(self, rev: str = "HEAD") -> dict[str, Any]:
        """Rebuild the session state at ``rev`` from the events' deltas alone.

        Raises:
            see :meth:`entries`.
        """
        state: dict[str, Any] = {}
        for _, c in self._path(rev):
            state.update(c.delta)
            for k in c.unset:
                state.pop(k, None)
        return state

    def verify(self, rev: str = "HEAD") -> dict[str, Any]:
        """Audit the path to ``rev``: every object re-hashed, replay equal to each snapshot.

        Returns:
            ``{"commits": n, "head": id}`` when all is well.

        Raises:
            AuditError: naming the first commit (and key) where replay and snapshot differ.
            IntegrityError: a stored object is corrupt.
        """
        path = self._path(rev)
        state: dict[str, Any] = {}
        for start in range(0, len(path), _VERIFY_BATCH):
            chunk = path[start:start + _VERIFY_BATCH]
            # Re-read and re-hash every commit and body (bypassing the cache), one batch each.
            self._objs.get_stored_many([cid for cid, _ in chunk] +
                                       [o.hex_id(c.body) for _, c in chunk if c.body is not None])
            for (cid, c), stored in zip(chunk, read_states(self._objs, [c.state for _, c in chunk]), strict=True):
                state.update(c.delta)
                for k in c.unset:
                    state.pop(k, None)
                if stored != state:
                    diff = sorted(set(stored) ^ set(state)) or sorted(k for k in state if stored.get(k) != state[k])
                    raise AuditError(cid, f"replayed state differs from the snapshot (key {diff[0]!r})", diff[0])
        return {"commits": len(path), "head": path[-1][0] if path else None}

    def diff(self, rev1: str, rev2: str) -> dict[str, Any]:
        """State changes from ``rev1`` to ``rev2`` and the entries since their common ancestor.

        Returns:
            ``{"base": id, "added": {...}, "removed": {...}, "changed": {k: [old, new]},
            "entries1": [...], "entries2": [...]}``.

        Raises:
            see :meth:`resolve`.
        """
        a, b = self.resolve(rev1), self.resolve(rev2)
        sa, sb = self.state(a), self.state(b)
        base = self._history.merge_base(a, b)
        pa, pb = self._history.path(a), self._history.path(b)
        depth = self._history.commit(base).depth + 1 if base else 0
        return {
            "base": base,
            "added": {k: v for k, v in sb.items() if k not in sa},
            "removed": {k: v for k, v in sa.items() if k not in sb},
            "changed": {k: [sa[k], sb[k]] for k in sa if k in sb and sa[k] != sb[k]},
            "entries1": self._to_entries(pa[depth:]),
            "entries2": self._to_entries(pb[depth:]),
        }

    # -- context and compaction (see castore.context) ------------------------------------
    def context(self, rev: str = "HEAD", max_tokens: int | None = None, max_messages: int | None = None,
                tool_output_limit: int | None = None,
                token_counter: Callable[[Message], int] | None = None) -> Context:
        """The messages to send to a model for the path ending at ``rev``; pure (reads only).

        See :func:`castore.context.project` for the rules.

        Raises:
            ValueError: a negative budget. See also :meth:`entries`.
        """
        from .context import project, project_from_tip

        opts: dict[str, Any] = {"max_tokens": max_tokens, "max_messages": max_messages,
                "tool_output_limit": tool_output_limit, "token_counter": token_counter}
        project([], **opts)  # a bad budget fails before anything is read
        if rev == "HEAD" and (max_tokens is not None or max_messages is not None):
            view = self._head_view()
            if view is None:
                return project([], **opts)
            if view.facts is None and not view.whole:
                # no facts kept by the writer: a compaction can still spare reading it all
                quick = self._context_after_compaction(opts, view)
                if quick is not None:
                    return quick
            out = project_from_tip(view.path_facts(), view.entries, **opts)
            assert out is not None  # a budget is given
            return out
        if rev == "HEAD":
            quick = self._context_after_compaction(opts)
            if quick is not None:
                return quick
        path = self._path(rev)
        last = max((i for i, (_, c) in enumerate(path) if c.kind == "compaction"), default=-1)
        if last < 0:
            return project(self._to_entries(path), **opts)
        # Read bodies only from the first kept entry on, plus what sets the model before it.
        comp = self._to_entries([path[last]])[0].entry
        first = getattr(comp, "first_kept", None)
        start = next((i for i in range(last) if path[i][0] == first), last)
        wanted = [i for i in range(start) if path[i][1].kind == "model_change"]
        asst = next((i for i in range(start - 1, -1, -1)
                     if path[i][1].kind == "message" and path[i][1].author == "assistant"), None)
        if asst is not None:
            wanted = sorted({*wanted, asst})
        return project(self._to_entries([path[i] for i in [*wanted, *range(start, len(path))]]), **opts)

    def _context_after_compaction(self, opts: dict[str, Any], view: PathView | None = None) -> Any:
        """The context at HEAD read from the end of the path only, or None to read it all.

        Works when the latest compaction recorded the model settings in force when it was
        made (``compact`` does): then nothing before its first kept entry is needed, and
        the path is read backwards a few segments at a time until that entry. The path of
        ``view`` (HEAD's, read already) is read; a whole path read for nothing goes to it.
        """
        from .context import project

        if view is not None:
            tip, meta = view.tip, view.meta
        else:
            tipref = self._read_tip()[2]
            if tipref is None:
                return None
            tip, meta = tipref.target, tipref.meta
        comp: tuple[str, Commit] | None = None  # the latest compaction, once met
        first: str | None = None  # its first kept entry
        settings: Any = None
        scanned = -1  # the suffix's entries from this depth on were looked at (-1: none yet)
        suffix: list[tuple[str, Commit]] = []
        for suffix in self._history.path_backwards(tip, Hint.from_meta(meta) if meta else None):
            # each suffix adds older entries: look at those only (a long path is not scanned again)
            base = suffix[0][1].depth if suffix else 0
            new = len(suffix) if scanned < 0 else scanned - base
            scanned = base
            start: int | None = None
            if comp is None:
                last = max((i for i in range(new) if suffix[i][1].kind == "compaction"), default=-1)
                if last < 0:
                    continue
                comp = suffix[last]
                settings = comp[1].meta.get("context")
                if not isinstance(settings, dict):
                    return None
                entry = self._to_entries([comp])[0].entry
                first = entry.first_kept if isinstance(entry, Compaction) else None
                if first is None:
                    start = last
                new = last
            if start is None:
                start = next((i for i in range(new - 1, -1, -1) if suffix[i][0] == first), None)
            if start is None:
                if base > 0:
                    continue
                start = comp[1].depth  # the first kept entry is not on the path: keep nothing before
            assert comp is not None and isinstance(settings, dict)
            baseline = LogEntry(id=ObjectId(comp[0]), kind="model_change", parents=(),
                                entry=ModelChange(settings.get("model"), settings.get("provider"),
                                                  settings.get("thinking_level")))
            return project([baseline, *self._to_entries(suffix[start:])], **opts)
        if view is not None and suffix and suffix[0][1].depth == 0:
            view.adopt(suffix)  # read whole and no compaction in it: kept for what comes next
        return None

    def compact(self, summary: str, keep_from: str, details: Any = None) -> ObjectId:
        """Append a compaction: ``summary`` replaces everything before ``keep_from`` in the context.

        Nothing is deleted; the full history stays readable. When the first message kept
        would be a tool result, the kept part starts instead at the assistant message that
        called the tool (model APIs reject a result whose call is gone): the compaction's
        ``first_kept`` is that message's commit.

        Raises:
            RevisionNotFound: ``keep_from`` is not on the current path (nothing is written).
            InvalidEntry, StorageError.
        """
        from .context import estimate_tokens, keep_start, project

        if not isinstance(summary, str):
            raise InvalidEntry("a compaction summary must be a string")
        kept = self.resolve(keep_from)
        path = self.entries("HEAD")
        ids = [e.id for e in path]
        if kept not in ids:
            raise RevisionNotFound(keep_from, "not on the current branch's path")
        start = keep_start(path, ids.index(kept))
        kept = ids[start]
        before = sum(estimate_tokens(m) for m in _messages_of(path[:start]))
        now = project(path)
        # The settings in force now let a later context() skip everything before keep_from.
        settings = {"model": now.model, "provider": now.provider, "thinking_level": now.thinking_level}
        return self.append(Compaction(summary=summary, first_kept=kept, tokens_before=before, details=details),
                           expect=path[-1].id, meta={"context": settings})

    def summarize_branch(self, from_rev: str, summary: str, details: Any = None) -> ObjectId:
        """Record, on the current branch, a summary of the branch the agent left at ``from_rev``.

        Raises:
            RevisionNotFound, AmbiguousRevision, InvalidEntry, StorageError.
        """
        cid = self.resolve(from_rev)
        return self.append(BranchSummary(summary=summary, from_id=cid, details=details))

    # -- async twins -------------------------------------------------------------------------
    aappend = _twin(append)
    aappend_many = _twin(append_many)
    amessages = _twin(messages)
    aentries = _twin(entries)
    astate = _twin(state)
    alog = _twin(log)
    abranch = _twin(branch)
    abranches = _twin(branches)
    adelete_branch = _twin(delete_branch)
    acheckout = _twin(checkout)
    afork = _twin(fork)
    alabel = _twin(label)
    alabels = _twin(labels)
    aresolve = _twin(resolve)
    areplay = _twin(replay)
    averify = _twin(verify)
    ashow = _twin(show)
    acontext = _twin(context)
    acompact = _twin(compact)
    adiff = _twin(diff)
    adelete_label = _twin(delete_label)
    asummarize_branch = _twin(summarize_branch)
    aset_info = _twin(set_info)
    aexists = _twin(exists)

    async def ahead(self) -> ObjectId | None:
        """Async twin of :attr:`head`."""
        return await to_thread(lambda: self.head)


def _per_entry(items: Sequence[Any] | None, n: int, what: str) -> list[Any]:
    """``items`` as a list of ``n`` (None items when not given).

    Raises:
        InvalidEntry: not a sequence of ``n`` items.
    """
    if items is None:
        return [None] * n
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence) or len(items) != n:
        raise InvalidEntry(f"{what} must be a list with one item per entry ({n}), not {items!r:.80}")
    return list(items)


def _merged(meta: Mapping[str, Any] | None, own: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The batch's ``meta`` extended by an entry's own (the entry's wins on a shared key).

    Raises:
        InvalidEntry: ``own`` is not a mapping.
    """
    if own is None:
        return meta
    if not isinstance(own, Mapping):
        raise InvalidEntry(f"metas items must be mappings or None, not {type(own).__name__}")
    return {**(meta or {}), **own}


def _messages_of(entries: list[LogEntry]) -> list[Message]:
    out = []
    for e in entries:
        if isinstance(e.entry, Message):
            out.append(e.entry)
        elif isinstance(e.entry, Event) and e.entry.message is not None:
            out.append(e.entry.message)
    return out
