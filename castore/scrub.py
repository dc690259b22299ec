"""``castore redact``: sessions already stored, rewritten with their secrets redacted.

A store that starts redacting (castore.json ``"redact": true``, ``import --redact``) keeps
what it stored before as it was. :func:`redact_sessions` rewrites it: every commit reachable
from a session's branches, labels and detached HEAD is read, its entry body, state change,
state snapshot, metadata and the blobs its metadata names (an imported line's raw bytes) are
redacted with the store's :class:`~castore.redact.Redactor`, and the commit is written again
on its rewritten parent (a commit with nothing to redact whose parent did not change keeps
its id, so a clean session is left untouched). The app and user state the sessions see
(``state/<app>/...`` chains, which their commits name) is rewritten first, the same way. The
session's info (:attr:`Session.info`) is
redacted and marked ``"redacted": true``; object ids it names (an import's cursor commit,
side-file blobs) are mapped to the rewritten ones. Refs move by compare-and-swap (a session
written meanwhile is reported, not overwritten) and without a reflog entry: the reflog would
keep the secrets reachable.

The old objects stay in storage until nothing reaches them: ``castore gc`` removes them once
its grace period has passed (``castore gc --grace 0`` at once, with no other writer), after
``castore reflog expire`` for moves recorded before, since a reflog keeps overwritten tips
reachable. Remote-tracking refs (what a pull kept of a diverged remote) are left as they are
and named in the report; the remote's own copy is the remote's business.

The report (:class:`RedactReport`) names what was found where (the session, the commit, the
part of it, the kind and tag), never the secret.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import objects as o
from .deletion import rewritten
from .entries import Record
from .errors import CastoreError, CorruptRef, ObjectNotFound, RefConflict, SessionNotFound
from .objects import Blob, Commit, Tree, Value
from .plumbing import Batch
from .redact import REDACTED_INFO, Finding, Redactor, new_key
from .refnames import (
    DELETING_KEYS,
    HEAD_KEEPS,
    META_INFO,
    META_TIME,
    REAL_NAME_KEYS,
    SessionRefs,
    carried_meta,
    deleting_since,
    parse_ref_name,
    scope_ref,
)

if TYPE_CHECKING:
    from .session import Session, SessionHost
    from .store import Store

_ID = re.compile(r"[0-9a-f]{64}")


class RedactConflict(CastoreError, RuntimeError):
    """A session changed while it was being redacted (its refs were left as they were)."""


@dataclass(frozen=True, repr=False, eq=False)
class Found(Record):
    """One secret found in a stored session (never the secret itself).

    Attributes:
        session: the session's ``(app, user, session)``.
        commit: the commit it was found in (as stored before), None for the session's info.
        where: ``body``, ``state`` (the entry's state change), ``meta``, ``blob`` (a blob
            the commit names: an imported line's raw bytes) or ``info``.
        kind: the kind of secret (:data:`castore.redact.KINDS`).
        tag: its replacement, ``[REDACTED:<kind>:<8 hex>]``.
    """

    session: tuple[str, str, str]
    commit: str | None
    where: str
    kind: str
    tag: str


@dataclass
class RedactReport:
    """What redacting one session found and did.

    Attributes:
        session: the session's ``(app, user, session)``.
        found: each secret found, in history order.
        rewritten: how many commits were written again (0 with ``dry_run`` or nothing found).
        moved: ref name -> ``[old target, new target]`` of each ref moved.
        skipped: refs left as they were (remote-tracking refs), with why.
        dry_run: nothing was written.
    """

    session: tuple[str, str, str]
    found: list[Found] = field(default_factory=list)
    rewritten: int = 0
    moved: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    dry_run: bool = False


class _Rewrite:
    """The rewrite of a store's sessions and state (see the module docstring); the maps of
    what was rewritten are shared, so a commit two sessions share (a fork) or a state commit
    sessions name is rewritten once."""

    def __init__(self, store: Store, redactor: Redactor, dry_run: bool) -> None:
        self.root = store
        self.store: SessionHost = store  # the store of what is being rewritten (a tenant's, in that layout)
        self.r = redactor
        self.dry_run = dry_run
        self.report = RedactReport(("", "", ""), dry_run=dry_run)
        self.commits: dict[str, str] = {}  # old commit -> new (itself when unchanged)
        self.objects: dict[str, str] = {}  # old value, blob or tree -> new (itself when unchanged)
        self.not_blob: set[str] = set()
        self.objs = self.store.plumbing.batch(None)  # values, blobs and trees (never a commit)
        self.batch: Batch | None = None  # commits, on the rewritten parent

    # -- finding -----------------------------------------------------------------------------
    def _value(self, v: Any, commit: str | None, where: str) -> Any:
        found: list[Finding] = []
        out = self.r.value(v, found)
        for f in found:
            self.report.found.append(Found(self.report.session, commit, where, f.kind, f.tag))
        return out

    def _ids(self, v: Any, commit: str | None) -> Any:
        """``v`` with every object id it names mapped to its rewrite (a blob it names is
        redacted here: the raw line of an imported commit)."""
        if isinstance(v, str):
            if len(v) != 64 or not _ID.fullmatch(v):
                return v
            got = self.commits[v] if v in self.commits else self._blob(v, commit)
            # an id kept is ``v`` itself, not an equal string: callers tell "unchanged" by identity
            return v if got == v else got
        if isinstance(v, dict):
            new = {k: self._ids(x, commit) for k, x in v.items()}
            return v if all(new[k] is v[k] for k in v) else new
        if isinstance(v, list):
            items = [self._ids(x, commit) for x in v]
            return v if all(a is b for a, b in zip(items, v, strict=True)) else items
        return v

    def _blob(self, oid: str, commit: str | None) -> str:
        if oid in self.objects:
            return self.objects[oid]
        if oid in self.not_blob:
            return oid
        try:
            obj = self.store.objects.get(oid)
        except ObjectNotFound:
            obj = None
        if not isinstance(obj, Blob):
            self.not_blob.add(oid)
            return oid
        found: list[Finding] = []
        data = self.r.data(obj.data, found)
        for f in found:
            self.report.found.append(Found(self.report.session, commit, "blob", f.kind, f.tag))
        new = oid if data is obj.data else self._add(Blob(data=data))
        self.objects[oid] = new
        return new

    def _tree(self, raw: bytes | None) -> bytes | None:
        """The state snapshot ``raw`` with its values redacted (findings are reported where
        the value was set, in the entry's state change, not in each snapshot)."""
        if raw is None:
            return None
        oid = o.hex_id(raw)
        if oid not in self.objects:
            t = self.store.objects.get(oid)
            if not isinstance(t, Tree):
                raise o.IntegrityError(oid, "expected a state tree")
            values = self.r.value(t.values)
            refs = {k: o.raw_id(self._value_obj(o.hex_id(v))) for k, v in t.refs.items()}
            sub = {k: self._tree(v) or v for k, v in t.sub.items()}
            same = values is t.values and refs == dict(t.refs) and sub == dict(t.sub)
            self.objects[oid] = oid if same else self._add(Tree(values=values, refs=refs, sub=sub))
        return o.raw_id(self.objects[oid])

    def _value_obj(self, oid: str, commit: str | None = None, where: str | None = None) -> str:
        """The rewrite of the Value ``oid`` (reported as ``where`` of ``commit`` when given)."""
        if oid in self.objects and where is None:
            return self.objects[oid]
        v = self.store.objects.get(oid)
        if not isinstance(v, Value):
            raise o.IntegrityError(oid, "expected a value")
        new = self._value(v.value, commit, where) if where is not None else self.r.value(v.value)
        out = oid if new is v.value else self._add(Value(new))
        self.objects[oid] = out
        return out

    def _add(self, obj: Any) -> str:
        return self.objs.add(obj)  # (with dry_run never written)

    # -- rewriting -----------------------------------------------------------------------------
    def commit(self, cid: str, c: Commit, new_parent: str | None) -> str:
        """The rewrite of commit ``cid`` on ``new_parent`` (the rewrite of its first parent)."""
        old_parent = o.hex_id(c.parents[0]) if c.parents else None
        body = o.raw_id(self._value_obj(o.hex_id(c.body), cid, "body")) if c.body is not None else None
        delta = self._value(c.delta, cid, "state")
        meta = self._ids(self._value(c.meta, cid, "meta"), cid)
        state = self._tree(c.state)
        extra = tuple(self._mapped(p) for p in c.parents[1:])
        scopes = {k: self._mapped(v) for k, v in c.scopes.items()}
        if (new_parent == old_parent and body == c.body and delta is c.delta and meta is c.meta
                and state == c.state and extra == c.parents[1:] and scopes == c.scopes):
            return cid
        if self.dry_run:
            return cid
        if self.batch is None or self.batch.tip != new_parent:
            self._flush()
            self.batch = self.store.plumbing.batch(new_parent)

        def make(parents: tuple[bytes, ...], depth: int, index: bytes | None) -> Commit:
            return Commit(kind=c.kind, parents=(*parents, *extra), body=body, state=state, delta=dict(delta),
                          unset=c.unset, scopes=scopes, author=c.author, time=c.time, meta=dict(meta),
                          depth=depth, index=index)

        assert self.batch is not None
        self.report.rewritten += 1
        return self.batch.commit(make)

    def _mapped(self, raw: bytes) -> bytes:
        """The raw id of the rewrite of commit ``raw`` (itself when not rewritten)."""
        return o.raw_id(self.commits.get(o.hex_id(raw), o.hex_id(raw)))

    def _chain(self, tip: str) -> str:
        """Rewrite the path root -> ``tip``; return the new tip."""
        new_parent: str | None = None
        for cid, c in self.store.history.path(tip):
            if cid not in self.commits:
                self.commits[cid] = self.commit(cid, c, new_parent)
            new_parent = self.commits[cid]
        assert new_parent is not None
        return new_parent

    def _use(self, store: SessionHost) -> None:
        """Rewrite in ``store`` from now on (in the tenant layout, each tenant has its own;
        commits map across them: a session's commits name its app's state commits)."""
        if store is not self.store:
            self._flush()
            self.store = store
            self.objects, self.not_blob = {}, set()
            self.objs = store.plumbing.batch(None)
            self.batch = None

    def scope(self, app: str, user: str | None) -> RedactReport:
        """Rewrite an app's state (``user=None``) or a user's; move its ref."""
        self._use(self.root.tenant(app, user))
        self.report = RedactReport((app, user or "", ""), dry_run=self.dry_run)
        ref = scope_ref(app, user)
        cur = self.store.refs.read(ref)
        if cur is None:
            return self.report
        new = self._chain(cur.target)
        self._flush()
        if new != cur.target and not self.dry_run:
            try:
                self.store.plumbing.swap(ref, new, cur, {META_TIME: time.time()})
            except RefConflict as e:
                raise RedactConflict(f"{ref} changed while it was being redacted; run castore redact again") from e
            self.report.moved[ref] = [cur.target, new]
        return self.report

    def _flush(self) -> None:
        if self.dry_run:
            return
        self.store.plumbing.write_many([self.objs] + ([self.batch] if self.batch is not None else []))
        self.batch = None

    def session(self, s: Session) -> RedactReport:
        """Rewrite (or with ``dry_run`` only scan) a session; move its refs."""
        self._use(s.store)
        self.report = RedactReport(s.key, dry_run=self.dry_run)
        refs = SessionRefs.of(*s.key)
        names = [n for n in self.store.refs.list(refs.prefix)
                 if (p := parse_ref_name(n)) is not None and p.kind != "reflog"]
        values = self.store.refs.read_many(names)
        head = values.get(refs.head)
        tips: list[tuple[str, str]] = []
        for name, v in sorted(values.items()):
            if v is None or v.symbolic is not None:
                continue
            kind = parse_ref_name(name)
            if kind is not None and kind.kind == "remote":
                self.report.skipped.append(f"{name}: a remote-tracking ref, left as it is")
                continue
            tips.append((name, v.target))
        for _, tip in tips:
            self._chain(tip)
        self._flush()
        codec = self.store.objects.codec
        opened = codec.open_meta(head.meta.get(META_INFO, {}), META_INFO) if head is not None else {}
        info = dict(opened) if isinstance(opened, dict) else {}
        new_info = self._ids(self._value(info, None, "info"), None)
        if self.dry_run:
            return self.report
        self._flush()  # blobs the info names
        changed = any(self.commits[t] != t for _, t in tips)
        if not changed and new_info is info:
            return self.report
        self._move(refs, tips, {**new_info, REDACTED_INFO: True})
        return self.report

    def _move(self, refs: SessionRefs, tips: Iterable[tuple[str, str]], info: dict[str, Any]) -> None:
        plumbing = self.store.plumbing
        head_name = refs.head
        for name, old in tips:
            new = self.commits[old]
            if new == old:
                continue
            cur = plumbing.refs.read(name)  # (with the token a swap needs)
            if cur is None or cur.target != old:
                raise RedactConflict(f"{name} changed while the session was being redacted; run castore redact "
                                     "again")
            keep = {k: v for k, v in cur.meta.items() if k in REAL_NAME_KEYS or k in HEAD_KEEPS or k in DELETING_KEYS}
            if name == head_name:  # a detached HEAD
                keep[META_INFO] = self.store.objects.codec.seal_meta(info, META_INFO)
            meta = plumbing.ref_meta_at(new, **keep)
            try:
                plumbing.swap(name, new, cur, meta)
            except RefConflict as e:
                raise RedactConflict(f"{name} changed while the session was being redacted; run castore redact "
                                     "again") from e
            self.report.moved[name] = [old, new]
        head = plumbing.refs.read(head_name)
        if head is not None and (head.symbolic is not None or deleting_since(head) is not None):
            meta = carried_meta(head)
            if head.symbolic is not None:  # (a detached HEAD got its info as it moved)
                meta[META_INFO] = self.store.objects.codec.seal_meta(info, META_INFO)
            meta.update(rewritten(head, self.report.moved))  # a deletion interrupted: still finishable
            try:
                plumbing.swap(head_name, head.target, head, meta)
            except RefConflict as e:
                raise RedactConflict(f"{head_name} changed while the session was being redacted; run castore "
                                     "redact again") from e


def redact_sessions(store: Store, sessions: Iterable[Session] | None = None, dry_run: bool = False
                    ) -> list[RedactReport]:
    """Redact ``sessions`` (default: every session of the store, those of an erased tenant
    excepted) with the store's key, and the app and user state they see (first: their
    commits name the state's).

    The key is created when the store has none, except with ``dry_run``, which writes
    nothing: its tags are then made with a key of the moment, and differ from the ones a
    real run will write (the kinds and places found are the same).

    Returns:
        One report per app or user state with something found (``session`` is
        ``(app, user or "", "")``), then one per session.

    Raises:
        SessionNotFound: a session given does not exist.
        TenantErased: a session given belongs to an erased tenant.
        CorruptRef: a session's HEAD names no branch, or a lost one (:meth:`Session.lost_branch`):
            nothing is written.
        RedactConflict: a ref moved meanwhile (run again; what was moved stays redacted).
        ObjectNotFound, IntegrityError, StorageError; FormatError, ConfigContended: the
        store's redaction key (created when it has none).
    """
    store.require()
    key = store.stored_redaction_key() if dry_run else store.redaction_key()
    rw = _Rewrite(store, Redactor(key or new_key()), dry_run)
    if sessions is None:  # every session, an erased tenant's excepted (store-wide work skips them)
        sessions = [store.session(i.app, i.user, i.session) for app in store.apps() for i in store.sessions(app)
                    if store.tenant(i.app, i.user).erased is None]
    sessions = list(sessions)
    for s in sessions:
        if not s.exists():
            raise SessionNotFound(s.key)
        if (problem := s.lost_branch()) is not None:  # its commits would keep their secrets, unsaid
            raise CorruptRef(s.refs.head, problem)
    scopes = dict.fromkeys(sc for s in sessions for sc in ((s.app, None), (s.app, s.user)))
    out = [r for app, user in scopes if (r := rw.scope(app, user)).found]
    return out + [rw.session(s) for s in sessions]


__all__ = ["Found", "RedactConflict", "RedactReport", "redact_sessions"]
