"""Ref names and ref metadata keys: where each ref of a store lives and what its metadata says.

* **Names.** :class:`SessionRefs` names a session's refs (``HEAD``, ``heads/<branch>``,
  ``tags/<label>``, ``remotes/<remote>/<branch>``, ``reflog``) and :func:`scope_ref` the app
  and user state refs; :func:`parse_ref_name` checks a name read from a listing (or from a
  remote) against that layout and is the only way back from a name to its parts. A name
  segment longer than :data:`castore.names.MAX_SEGMENT` is a digest; the real name is kept in
  the ref's metadata and :func:`real_name` reads it back.
* **Metadata keys**, one constant per fact (``META_*`` below). The real name behind a
  hashed segment is written as ``name`` on branch and label refs and as ``branch`` on
  ``HEAD`` (stores already written hold both, and their refs must read and fsck the
  same); :func:`real_name` accepts both keys on every ref.
* **What a HEAD says** of its session: the branch it names (:func:`head_segment`), a
  deletion under way (:func:`deleting_since`), a branch lost (:func:`head_problem`,
  :func:`lost_branch_problem`).

Pure: nothing here reads or writes storage. The write path that moves these refs is
:mod:`castore.plumbing`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import names
from .entries import Record
from .errors import CorruptRef, InvalidName
from .refs import PREFIX as REFS_PREFIX
from .refs import SYMBOLIC, WRITE_ID, RefValue

# -- ref metadata keys: one constant per fact (the read hint's are history.HINT_*) ---------------
#: the write id :class:`~castore.refs.RefStore` stamps on every write (its key is the store's)
META_WRITE_ID = WRITE_ID
#: when the tip was written (seconds since the epoch)
META_TIME = "t"
#: the number of commits on the path root -> tip
META_LENGTH = "n"
#: the real name behind a hashed branch or label segment (on branch and label refs)
META_NAME = "name"
#: the real name of the branch HEAD names, when its segment is hashed (on HEAD)
META_HEAD_BRANCH = "branch"
#: HEAD: the session's names as created (never trusted for display: names come from keys)
META_NAMES = "names"
#: HEAD: the session's metadata (:attr:`castore.Session.info`)
META_INFO = "info"
#: HEAD: when the session was created
META_CREATED = "created"
#: HEAD: the session has had a commit (written with HEAD by the write that made its first
#: branch, or the first write of HEAD once it had one; absent on HEADs written before it
#: existed): what tells a session whose only branch was lost from a never-born one
META_BORN = "born"
#: HEAD: a deletion of the session started at this time (seconds since the epoch) and has
#: not finished (:mod:`castore.deletion`; docs/FORMAT.md, "Deleting a session"): what tells
#: an interrupted deletion, its branch gone and HEAD left, from a lost branch. Not in
#: :data:`HEAD_KEEPS`: nothing rewrites a marked HEAD but the deletion itself
META_DELETING = "deleting"
#: HEAD, beside :data:`META_DELETING`: what each of the session's other refs named when the
#: deletion began (``{name below the session's folder: target}``), what tells a write since
#: the mark (:func:`castore.deletion.written_since`; an entry's time is its writer's to choose)
META_DELETING_REFS = "deleting_refs"
#: the deleting mark's keys: what is taken off HEAD when the mark is (a copy never has them)
DELETING_KEYS = (META_DELETING, META_DELETING_REFS)
#: HEAD keys that travel with it when it is rewritten (checkout, set_info)
HEAD_KEEPS = (META_NAMES, META_INFO, META_CREATED, META_BORN)
#: the keys that may hold the real name behind a hashed segment, in the order they are read
REAL_NAME_KEYS = (META_NAME, META_HEAD_BRANCH)

# -- ref names ---------------------------------------------------------------------------------
SESSIONS = "sessions"
STATE = "state"
HEAD = "HEAD"
HEADS = "heads"
TAGS = "tags"
REMOTES = "remotes"
#: a session's log of overwritten ref tips (see :meth:`Plumbing.record_move`)
REFLOG = "reflog"
#: commit kind of a reflog entry
REFLOG_KIND = "reflog"
_HEX = frozenset("0123456789abcdef")


def session_prefix(app: str, user: str, session: str) -> str:
    """The ref folder of a session: ``sessions/<app>/<user>/<session>``.

    Raises:
        InvalidName: a part is not a valid name.
    """
    return f"{SESSIONS}/{names.encode_key(app, user, session)}"


def scope_ref(app: str, user: str | None) -> str:
    """The ref of an app's state (``user=None``) or of one user's state in it.

    Raises:
        InvalidName: a bad app or user name.
    """
    base = f"{STATE}/{names.encode(app, 'app name')}"
    return f"{base}/app" if user is None else f"{base}/users/{names.encode(user, 'user name')}"


def symbolic_to(branch: str) -> str:
    """The target of a HEAD on ``branch``: ``ref: heads/<segment>``.

    Raises:
        InvalidName: a bad branch name.
    """
    return f"{SYMBOLIC}{HEADS}/{names.encode(branch, 'branch name')}"


@dataclass(frozen=True, repr=False, eq=False)
class SessionRefs(Record):
    """The ref names of one session (relative to ``refs/``)."""

    prefix: str

    @classmethod
    def of(cls, app: str, user: str, session: str) -> SessionRefs:
        """The refs of session ``(app, user, session)``.

        Raises:
            InvalidName: a part is not a valid name.
        """
        return cls(session_prefix(app, user, session))

    @property
    def head(self) -> str:
        """``.../HEAD``, the leaf pointer."""
        return f"{self.prefix}/{HEAD}"

    def branch(self, name: str) -> str:
        """``.../heads/<name>``.

        Raises:
            InvalidName: a bad branch name.
        """
        return f"{self.prefix}/{HEADS}/{names.encode(name, 'branch name')}"

    def label(self, name: str) -> str:
        """``.../tags/<name>``.

        Raises:
            InvalidName: a bad label name.
        """
        return f"{self.prefix}/{TAGS}/{names.encode(name, 'label')}"

    def remote(self, remote: str, branch_segment: str) -> str:
        """``.../remotes/<remote>/<branch segment>``: where a pull keeps a diverged remote tip.

        Raises:
            InvalidName: a bad remote name or branch segment.
        """
        if not valid_segment(branch_segment):
            raise InvalidName(branch_segment, "is not an encoded name segment", "branch segment")
        return f"{self.prefix}/{REMOTES}/{names.encode(remote, 'remote name')}/{branch_segment}"

    @property
    def reflog(self) -> str:
        """``.../reflog``: the chain of this session's recorded ref moves."""
        return f"{self.prefix}/{REFLOG}"

    def branch_of(self, head: RefValue | None, branch_meta: Mapping[str, Any] | None = None) -> str | None:
        """The branch a HEAD value names: ``main`` for a session without HEAD, None when detached.

        A hashed branch segment is named by HEAD's metadata, else by the branch ref's own
        (``branch_meta``; HEADs rewritten by older castores could lose the name).

        Raises:
            CorruptRef: HEAD is symbolic but names no ``heads/<branch>`` (``ref: HEAD``, a loop).
        """
        if head is None:
            return "main"
        if head.symbolic is None:
            return None
        seg = head_segment(head)
        name = real_name(seg, head.meta)
        if name == seg and branch_meta is not None:
            name = real_name(seg, branch_meta)
        return name

    def branch_ref_of(self, head: RefValue) -> str:
        """The branch ref a symbolic HEAD value names.

        Raises:
            CorruptRef: HEAD does not name a ``heads/<branch>`` ref.
        """
        return f"{self.prefix}/{HEADS}/{head_segment(head)}"


def head_segment(head: RefValue) -> str:
    """The branch segment a symbolic HEAD names (``ref: heads/<segment>``).

    Raises:
        CorruptRef: the target is not ``heads/`` and one valid segment (a self-reference,
            a loop through another ref, a path).
    """
    sym = head.symbolic or ""
    kind, _, seg = sym.partition("/")
    if kind != HEADS or not valid_segment(seg):
        raise CorruptRef(head.name, f"HEAD must name a branch ('ref: heads/<branch>'), not {sym[:80]!r}")
    return seg


def carried_meta(value: RefValue | None, *drop: str) -> dict[str, Any]:
    """The metadata of ``value`` (a ref as read; None reads as no metadata) as a rewrite of
    that ref carries it over: all but the write id :class:`~castore.refs.RefStore` stamped on
    the old write (the new write gets its own) and the keys named in ``drop``. Raises nothing."""
    if value is None:
        return {}
    return {k: v for k, v in value.meta.items() if k != META_WRITE_ID and k not in drop}


def deleting_since(head: RefValue | None) -> float | None:
    """When the deletion of the session whose HEAD is ``head`` started, if one did and has
    not finished (HEAD carries :data:`META_DELETING`: :mod:`castore.deletion`); else None."""
    return meta_number(head.meta.get(META_DELETING)) if head is not None else None


def meta_number(value: Any) -> float | None:
    """``value``, read from a ref's metadata, as a finite float if it is a real number, else
    None: a boolean, infinity, NaN, or an integer beyond any float (a damaged or hand-written
    ref: JSON bounds neither) is no time nor count. Raises nothing."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def branches_made_since(values: Mapping[str, RefValue | None], listed: Container[str]) -> list[str]:
    """The branches that the session HEADs among ``values`` (ref name -> value as read) name and
    ``listed`` lacks, in the names' namespace. A reader that lists refs, then reads them, reads
    these again before it judges a HEAD (:func:`lost_branch_problem`): each is absent (never born,
    or lost), or was made after the listing and HEAD put on it before HEAD was read (``checkout
    -b``, a first append), and then a read now finds it (a branch is made before HEAD names it).
    Raises nothing (a HEAD that names no branch is left to the caller)."""
    out = []
    for name, v in values.items():
        if v is None or v.symbolic is None or not name.endswith("/HEAD"):
            continue
        try:
            branch = f"{name[:-len('HEAD')]}{HEADS}/{head_segment(v)}"
        except CorruptRef:
            continue
        if branch not in listed:
            out.append(branch)
    return out


def valid_segment(seg: str) -> bool:
    """Whether ``seg`` is a segment castore writes: a canonical encoded name or a digest."""
    if names.is_hashed(seg):
        return len(seg) == 65 and all(c in _HEX for c in seg[1:])
    return _decoded(seg) is not None


@functools.lru_cache(maxsize=1 << 16)
def _decoded(seg: str) -> str | None:
    """``names.decode(seg)``, or None when ``seg`` is not a canonical encoded name; cached:
    every append decodes its HEAD's branch segment several times, and an import of thousands
    of sessions lists each session's branches several times (as large as ``names.encode``'s)."""
    try:
        return names.decode(seg)
    except InvalidName:
        return None


def real_name(segment: str, meta: Mapping[str, Any] | None) -> str:
    """The name behind a segment: decoded, or read from the metadata when hashed.

    A hashed segment whose metadata lacks the name (a damaged ref) reads as the segment.
    Both keys ever written for it (:data:`REAL_NAME_KEYS`) are accepted.
    """
    if names.is_hashed(segment):
        for key in REAL_NAME_KEYS:
            value = (meta or {}).get(key)
            try:
                if isinstance(value, str) and names.encode(value) == segment:
                    return value
            except InvalidName:
                continue
        return segment
    decoded = _decoded(segment)
    return segment if decoded is None else decoded


def session_key(segments: Sequence[str], head_meta: Mapping[str, Any]) -> tuple[str, str, str]:
    """The ``(app, user, session)`` of the session whose folder's segments are ``segments``
    (app, user, session) and whose HEAD's metadata is ``head_meta``: names come from the
    segments; the names HEAD recorded (:data:`META_NAMES`, any writer's) only say what a hashed
    segment stands for, where they match it (:func:`real_name`). Raises nothing."""
    said = head_meta.get(META_NAMES)
    said = said if isinstance(said, dict) else {}
    app, user, session = (real_name(seg, {META_NAME: said.get(k)})
                          for k, seg in zip(("app", "user", "session"), segments, strict=True))
    return app, user, session


def name_meta(ref: str, name: str, key: str = META_NAME) -> dict[str, Any]:
    """The metadata that keeps ``name`` beside a ref whose last segment is hashed ({} otherwise)."""
    return {key: name} if names.is_hashed(ref.rsplit("/", 1)[-1]) else {}


def head_problem(session: str, head: RefValue | None, refs: Collection[str]) -> str | None:
    """What is wrong with the symbolic ``head`` of the session whose ref folder is
    ``session`` (``refs``: the session's ref names, as listed): it names no branch of the
    session, or a branch that was lost (:func:`lost_branch_problem`); None when it is sound,
    detached, absent or never born. Raises nothing."""
    if head is None or head.symbolic is None:
        return None
    try:
        branch = SessionRefs(session).branch_ref_of(head)
    except CorruptRef as e:
        return e.reason
    if branch in refs:
        return None
    return lost_branch_problem(session, branch.rsplit("/", 1)[1], head, {f"{REFS_PREFIX}/{r}" for r in refs})


def lost_branch_problem(session: str, seg: str, head: RefValue, keys: set[str]) -> str | None:
    """The problem of a session's HEAD that names branch ``seg`` (its folder ``session``,
    ``keys`` every ref key below ``refs/`` there or in the whole store), None when the branch
    exists or was never born.

    HEAD naming a branch that does not exist is normal before a session's first commit
    (``set_info`` first, a brand-new session). It is damage when the session shows it had
    history: HEAD's :data:`META_BORN` mark, another branch, a label, a remote-tracking branch
    (a pull's diverged remote tip) or a reflog (no write makes one of these without a commit,
    and no write deletes the branch HEAD is on: a lost race, a backend failure or a
    hand-deleted ref file did). A HEAD written before the mark existed, in a session whose
    only ref is HEAD, cannot be told from a never-born one (no commit names its session):
    its lost commits are dangling ones.
    ``castore fsck`` reports it as a bad ref; reading the session raises it (:class:`CorruptRef`).
    A HEAD with the deleting mark (:data:`META_DELETING`) has none: its branch went by intent."""
    base = f"{REFS_PREFIX}/{session}/"
    if f"{base}{HEADS}/{seg}" in keys or deleting_since(head) is not None:
        return None  # on its branch, or a deletion interrupted (not damage: castore.deletion)
    kinds = {HEADS: "a branch", TAGS: "a label", REMOTES: "a remote-tracking branch"}
    had = sorted({kinds[k[len(base):].split("/", 1)[0]] for k in keys
                  if k.startswith(base) and k[len(base):].split("/", 1)[0] in kinds})
    if f"{base}{REFLOG}" in keys:
        had.append("a reflog")
    if not had and head.meta.get(META_BORN):
        had.append("a commit on record (HEAD's born mark)")
    if not had:
        return None  # never born (as far as anything stored can tell)
    branch = real_name(seg, head.meta)
    return (f"HEAD names branch {branch!r}, which does not exist though the session has "
            f"{' and '.join(had)}: the branch was deleted or lost (recreate it with `castore branch "
            f"{branch} REV` from `castore reflog` or a dangling commit, or check out another branch)")


@dataclass(frozen=True, repr=False, eq=False)
class RefName(Record):
    """A ref name parsed against castore's layout (segments still encoded).

    ``kind`` is ``head``, ``branch``, ``label`` or ``remote`` for a session's refs (then
    ``app``, ``user`` and ``session`` are set, ``name`` is the branch or label segment, and
    ``remote`` the remote's for a remote-tracking ref), or ``app-state`` / ``user-state``
    for scope refs (``remote`` set for their remote-tracking copies).
    """

    ref: str
    kind: str
    app: str
    user: str | None = None
    session: str | None = None
    name: str | None = None
    remote: str | None = None

    @property
    def session_prefix(self) -> str | None:
        """``sessions/<app>/<user>/<session>`` for a session's ref, else None."""
        if self.session is None:
            return None
        return f"{SESSIONS}/{self.app}/{self.user}/{self.session}"

    @property
    def tenant(self) -> tuple[str, str]:
        """The ``(app, user)`` segments of the tenant whose store holds this ref in the tenant
        layout: a user's refs are that user's, the app state's the app's own
        (:data:`castore.names.APP_SCOPE`)."""
        return self.app, self.user if self.user is not None else names.APP_SCOPE


def parse_ref_name(ref: str) -> RefName | None:
    """Parse a ref name (relative to ``refs/``) as castore writes them; None when it is not one.

    Accepted: ``sessions/<app>/<user>/<session>/HEAD``, ``.../heads/<b>``, ``.../tags/<l>``,
    ``.../remotes/<r>/<b>``, ``state/<app>/app``, ``state/<app>/users/<u>`` and their
    ``state/<app>/remotes/<r>/...`` copies, where every ``<...>`` is one valid segment.
    Anything else (``..``, empty parts, foreign characters, extra levels) is refused: such a
    name must never be joined into a path.
    """
    if not isinstance(ref, str) or not ref or "\\" in ref or "\0" in ref:
        return None
    parts = ref.split("/")
    if parts[0] == SESSIONS and len(parts) >= 5:
        app, user, sess = parts[1:4]
        if not (valid_segment(app) and valid_segment(user) and valid_segment(sess)):
            return None
        rest = parts[4:]
        if rest == [HEAD]:
            return RefName(ref, "head", app, user, sess)
        if rest == [REFLOG]:
            return RefName(ref, "reflog", app, user, sess)
        if len(rest) == 2 and rest[0] in (HEADS, TAGS) and valid_segment(rest[1]):
            return RefName(ref, "branch" if rest[0] == HEADS else "label", app, user, sess, rest[1])
        if len(rest) == 3 and rest[0] == REMOTES and valid_segment(rest[1]) and valid_segment(rest[2]):
            return RefName(ref, "remote", app, user, sess, rest[2], rest[1])
        return None
    if parts[0] == STATE and len(parts) >= 3 and valid_segment(parts[1]):
        app, rest = parts[1], parts[2:]
        remote = None
        if len(rest) >= 3 and rest[0] == REMOTES and valid_segment(rest[1]):
            remote, rest = rest[1], rest[2:]
        if rest == ["app"]:
            return RefName(ref, "app-state", app, remote=remote)
        if len(rest) == 2 and rest[0] == "users" and valid_segment(rest[1]):
            return RefName(ref, "user-state", app, rest[1], remote=remote)
    return None


__all__ = [
    "branches_made_since",
    "carried_meta",
    "DELETING_KEYS",
    "deleting_since",
    "HEAD",
    "HEAD_KEEPS",
    "head_problem",
    "head_segment",
    "HEADS",
    "lost_branch_problem",
    "META_BORN",
    "META_CREATED",
    "META_DELETING",
    "META_DELETING_REFS",
    "META_HEAD_BRANCH",
    "META_INFO",
    "META_LENGTH",
    "META_NAME",
    "META_NAMES",
    "META_TIME",
    "META_WRITE_ID",
    "meta_number",
    "name_meta",
    "parse_ref_name",
    "real_name",
    "REAL_NAME_KEYS",
    "REFLOG",
    "REFLOG_KIND",
    "RefName",
    "REMOTES",
    "scope_ref",
    "session_key",
    "session_prefix",
    "SessionRefs",
    "SESSIONS",
    "STATE",
    "symbolic_to",
    "TAGS",
    "valid_segment",
]
