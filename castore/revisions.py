"""Revisions as git users type them, resolved against one session's refs and the store.

A revision is a full or short commit id (4+ hex characters), a branch, a label, ``HEAD``,
optionally followed by navigation steps: ``~n`` (n first parents back) and ``^n`` (the
n-th parent). Branches win over labels, and both over short ids; a full 64-character id
is taken as an id first (as git does with full hashes), which saves two ref reads.
"""

from __future__ import annotations

import re
from typing import Protocol

from . import names
from . import objects as o
from .errors import AmbiguousRevision, ObjectNotFound, RevisionNotFound, SessionNotFound
from .history import BlockPath, Hint
from .objects import Commit, ObjectId
from .plumbing import Plumbing
from .refnames import SessionRefs

#: the navigation steps at the end of a revision (``~2^``)
_REV_SUFFIX = re.compile(r"(~\d*|\^\d*)+$")


def split_revision(rev: str) -> tuple[str, list[tuple[str, int]]]:
    """Split ``main~2^`` into the base name and its navigation steps.

    Returns:
        ``(base, steps)`` where each step is ``("~", n)`` (n first parents back) or
        ``("^", n)`` (the n-th parent).

    Raises:
        RevisionNotFound: the revision is empty or malformed.
    """
    if not isinstance(rev, str) or not rev.strip():
        raise RevisionNotFound(str(rev), "empty revision")
    m = _REV_SUFFIX.search(rev)
    if not m or m.start() == 0:
        return rev, []
    base, suffix = rev[: m.start()], rev[m.start() :]
    steps: list[tuple[str, int]] = []
    for part in re.findall(r"[~^]\d*", suffix):
        op, num = part[0], part[1:]
        if len(num) > 18:  # more steps than any history has (and int() refuses 4,300+ digits)
            shown = rev if len(rev) <= 60 else rev[:40] + "..." + rev[-8:]
            raise RevisionNotFound(shown, "no history is that deep")
        steps.append((op, int(num) if num else 1))
    return base, steps


class Session(Protocol):
    """What resolving a revision needs of a session (:class:`castore.Session` is one)."""

    refs: SessionRefs
    plumbing: Plumbing

    @property
    def key(self) -> tuple[str, str, str]: ...

    @property
    def head(self) -> ObjectId | None: ...

    def exists(self) -> bool: ...
    def tips(self) -> list[tuple[str, Hint | None]]: ...
    def reflog_tips(self) -> list[str]: ...

#: ``~n`` steps up to this many are walked parent by parent; longer ones read the path
_WALK_MAX = 16


def resolve(session: Session, rev: str) -> ObjectId:
    """The full commit id that ``rev`` names in ``session``.

    Raises:
        RevisionNotFound: nothing by that name, or it walks past the root.
        AmbiguousRevision: a short id matches several commits (``candidates``).
        SessionNotFound: ``HEAD`` of a session that does not exist.
    """
    if not isinstance(rev, str) or not rev:
        raise RevisionNotFound(str(rev), "empty revision")
    direct = resolve_name(session, rev)
    if direct is not None:
        return direct
    base, steps = split_revision(rev)
    cid = resolve_name(session, base) if steps else None
    if cid is None:
        raise RevisionNotFound(rev, "not a branch, label, HEAD or commit id of this session")
    history = session.plumbing.history
    for op, n in steps:
        c = history.commit(cid)
        if op == "~":
            if n > c.depth:
                raise RevisionNotFound(rev, f"only {c.depth} commits before {cid[:8]}")
            if n > _WALK_MAX:  # the commit's block and the one segment that holds depth - n
                cid = ObjectId(BlockPath(history.objs, cid).id_at(c.depth - n))
            else:
                for _ in range(n):
                    cid = ObjectId(o.hex_id(history.commit(cid).parents[0]))
        elif n:
            if n > len(c.parents):
                raise RevisionNotFound(rev, f"{cid[:8]} has {len(c.parents)} parent(s)")
            cid = ObjectId(o.hex_id(c.parents[n - 1]))
    return cid


def resolve_name(session: Session, name: str) -> ObjectId | None:
    """The commit a bare name (no ``~``/``^`` steps) names, or None when nothing matches.

    Raises:
        AmbiguousRevision: a short id matches several commits.
        RevisionNotFound: HEAD has no entries.
        SessionNotFound: ``HEAD`` of a session that does not exist.
    """
    if name == "HEAD":
        head = session.head
        if head is None:
            if not session.exists():
                raise SessionNotFound(session.key)
            raise RevisionNotFound("HEAD", "no entries yet")
        return head
    lowered = name.lower()
    if o.is_hex_id(lowered) and is_commit(session, lowered):
        # A full id is unguessable (256 bits): holding it is the capability, as in git.
        # Adapters rely on this to put refs on commits they have just built.
        return ObjectId(lowered)
    refs = session.plumbing.refs
    try:
        v = refs.read(session.refs.branch(name))
        if v is None:
            v = refs.read(session.refs.label(name))
        if v is None and name.startswith("remotes/") and name.count("/") >= 2:
            _, remote, branch = name.split("/", 2)  # remotes/<remote>/<branch>
            v = refs.read(session.refs.remote(remote, names.encode(branch, "branch name")))
    except names.InvalidName:
        v = None
    if v is not None:
        return ObjectId(v.target)
    if 4 <= len(name) <= 64 and all(c in "0123456789abcdef" for c in lowered):
        try:
            cid = session.plumbing.objects.resolve_prefix(lowered)
        except AmbiguousRevision as e:
            commits = [c for c in e.candidates if is_commit(session, c) and owns(session, c)]
            if len(commits) == 1:
                return ObjectId(commits[0])
            if not commits:
                return None
            raise AmbiguousRevision(name, commits) from None
        except RevisionNotFound:
            return None
        # An object that is not a commit of this session answers exactly as an unknown id:
        # body ids are hashes of guessable text, and saying "not a commit" (or "not yours")
        # would tell anyone whether some tenant stored that text.
        if not is_commit(session, cid) or not owns(session, cid):
            return None
        return cid
    return None


def is_commit(session: Session, oid: str) -> bool:
    """Whether ``oid`` names a stored commit (False when missing).

    Raises:
        IntegrityError: the object is corrupt (reported, not hidden as "not a commit").
        StorageError: the backend failed.
    """
    try:
        return isinstance(session.plumbing.objects.get(oid), Commit)
    except ObjectNotFound:
        return False


def owns(session: Session, cid: str) -> bool:
    """Whether commit ``cid`` is on the history of one of ``session``'s refs.

    Objects are shared across the store, so a short id prefix (guessable) must not open
    another tenant's history: it counts only if a branch, label or HEAD of this session
    reaches the commit.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    history = session.plumbing.history
    for tip, hint in session.tips():
        if history.is_ancestor(cid, tip, hint):
            return True
    # an overwritten tip the reflog keeps is still this session's
    return any(history.is_ancestor(cid, tip) for tip in session.reflog_tips())

