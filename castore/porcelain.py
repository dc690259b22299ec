"""What the everyday commands compute, as data: ``status``, the branch listing, the names on commits.

Each function here assembles several library calls into one small result that a front end
(the ``castore`` CLI, a notebook, another tool) only has to print; none prints. The name
is git's: the plumbing moves refs, the porcelain is what people call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from . import names, sync, views
from .errors import AmbiguousSession, CorruptRef, SessionNotFound
from .objects import ObjectId
from .refnames import SESSIONS, deleting_since, real_name, valid_segment

if TYPE_CHECKING:
    from .entries import LogEntry
    from .session import Session
    from .store import Store


@dataclass(frozen=True)
class Status:
    """Where a store and a session stand (see :func:`status`)."""

    #: the store's URL, and whether a store is there yet
    store: str
    store_exists: bool
    #: ``(app, user, session)``, or None when no session was named
    session: tuple[str, str, str] | None = None
    #: whether the session has entries
    exists: bool = False
    #: the session's title (see :func:`castore.views.session_title`)
    title: str | None = None
    #: an imported subagent: the session that spawned it (see :func:`castore.views.spawned_by`)
    subagent_of: dict[str, str] | None = None
    head: str | None = None
    #: the branch HEAD is on; None when detached (or no entries)
    branch: str | None = None
    #: entries on the path to HEAD
    entries: int = 0
    branches: int = 0
    labels: int = 0
    #: remote name -> URL
    remotes: dict[str, str | None] = field(default_factory=dict)
    #: ``remotes/REMOTE/BRANCH`` -> commit: remote tips a pull kept because both sides moved
    kept_from_remotes: dict[str, str] = field(default_factory=dict)
    #: when a deletion of the session began that did not finish (HEAD's deleting mark,
    #: :func:`castore.refnames.deleting_since`: interrupted, or under way)
    deleting: float | None = None


def status(store: Store, session: Session | None = None) -> Status:
    """The store, the session's HEAD, its branch and counts, the remotes and what pulls kept,
    and whether a deletion of the session was interrupted.

    Nothing is sent over the network: the remote state is what the last pull left.

    Raises:
        CorruptRef: HEAD names a branch that was lost (:meth:`Session.lost_branch`).
        StorageError, IntegrityError, FormatError.
    """
    exists = store.exists
    remotes = {n: e.get("url") for n, e in sorted(sync.list_remotes(store).items())} if exists else {}
    if session is None:
        return Status(store.url, exists, remotes=remotes)
    deleting = deleting_since(session.plumbing.refs.read(session.refs.head)) if exists else None
    head = session.head
    if head is None:
        problem = session.lost_branch()
        if problem is not None:  # not "no entries yet, append starts it": that would bury the loss
            raise CorruptRef(session.refs.head, problem)
        return Status(store.url, exists, session.key, remotes=remotes, deleting=deleting)
    info = session.info
    return Status(store.url, exists, session.key, exists=True, title=views.session_title(info),
                  subagent_of=views.spawned_by(info), head=head, branch=session.current_branch,
                  entries=session.show("HEAD").depth + 1, branches=len(session.branches()),
                  labels=len(session.labels()), remotes=remotes,
                  kept_from_remotes={f"remotes/{n}": c for n, c in session.remote_branches().items()},
                  deleting=deleting)


@dataclass(frozen=True)
class RefNames:
    """Which names point where in one session: HEAD, its branch, branches, labels."""

    head: str | None
    #: the branch HEAD is on (None: detached)
    branch: str | None
    #: branch name -> tip; remote-tracking ones as ``remotes/REMOTE/BRANCH``
    branches: dict[str, str]
    labels: dict[str, str]
    #: commit -> what it links to in other sessions (an imported subagent, see :func:`castore.views.links`)
    links: dict[str, list[str]] = field(default_factory=dict)


def ref_names(session: Session, internal: bool = False) -> RefNames:
    """Where HEAD, the branches (remote-tracking ones as ``remotes/R/B``) and the labels point,
    without an adapter's bookkeeping branches (a LangGraph thread's ``writes``) unless ``internal``.

    Raises:
        StorageError, IntegrityError.
    """
    return _ref_names(session, internal)[0]


def _ref_names(session: Session, internal: bool) -> tuple[RefNames, set[str]]:
    """:func:`ref_names`, and the bookkeeping branches it left out."""
    branches: dict[str, str] = {**session.branches()}
    branches.update({f"remotes/{n}": c for n, c in session.remote_branches().items()})
    hidden = set() if internal else views.internal_branches(session, branches)
    for name in hidden:
        branches.pop(name, None)
    return RefNames(session.head, session.current_branch, branches, {**session.labels()},
                    views.links(session)), hidden


def past_bookkeeping(entries: Sequence[LogEntry]) -> tuple[list[LogEntry], Callable[[str], str]]:
    """``entries`` without the bookkeeping lines views mark (see :func:`castore.views.bookkeeping`),
    each kept commit's parents moved past the ones left out (so a graph stays connected), and
    where a name on a commit shows: on the commit itself, or for one left out on its newest
    kept ancestor (on itself still when it has none)."""
    left_out: dict[str, tuple[str, ...]] = {e.id: e.parents for e in entries if views.bookkeeping(e)}
    seen: dict[str, tuple[str, ...]] = {}

    def past(p: str) -> tuple[str, ...]:
        if p not in left_out:
            return (p,)
        if p not in seen:
            todo, out = [p], list[str]()
            while todo:
                q = todo.pop()
                if q in seen:
                    out += seen[q]
                elif q in left_out:
                    todo += reversed(left_out[q])
                else:
                    out.append(q)
            seen[p] = tuple(dict.fromkeys(out))
        return seen[p]

    kept = [e if not any(p in left_out for p in e.parents)
            else replace(e, parents=tuple(dict.fromkeys(ObjectId(q) for p in e.parents for q in past(p))))
            for e in entries if e.id not in left_out]

    def at(cid: str) -> str:
        landed = past(cid)
        return landed[0] if landed else cid

    return kept, at


def readable(entries: Sequence[LogEntry]) -> list[LogEntry]:
    """``entries`` without the bookkeeping lines views mark (see :func:`castore.views.bookkeeping`),
    each kept commit's parents moved past the ones left out (so a graph stays connected)."""
    return past_bookkeeping(entries)[0]


def _moved(names: RefNames, at: Callable[[str], str]) -> RefNames:
    """``names`` with each name on a left-out commit moved to the commit shown in its place."""
    links: dict[str, list[str]] = {}
    for c, said in names.links.items():
        links.setdefault(at(c), []).extend(said)
    return RefNames(at(names.head) if names.head else None, names.branch,
                    {b: at(c) for b, c in names.branches.items()}, {n: at(c) for n, c in names.labels.items()},
                    links)


def log(session: Session, rev: str = "HEAD", *, limit: int | None = None, all_branches: bool = False,
        internal: bool = False, all_entries: bool = True) -> tuple[RefNames, list[LogEntry]]:
    """The commits ``castore log`` shows, newest first, and the names on them.

    Args:
        rev: the path from the root to this revision (not with ``all_branches``).
        limit: at most this many commits (None: all).
        all_branches: every commit of every branch and label.
        internal: keep an adapter's bookkeeping (a LangGraph thread's task writes): its
            branches in the names, its commits in ``all_branches``.
        all_entries: keep the bookkeeping lines of imported sessions (Claude Code's
            ``progress``...); False leaves them out (see :func:`readable`) before the limit applies.

    Raises:
        RevisionNotFound, AmbiguousRevision, StorageError, IntegrityError.
    """
    names, hidden = _ref_names(session, internal)
    if all_entries and not (all_branches and hidden):
        return names, session.log(rev, limit=limit, all_branches=all_branches)
    if all_branches:  # left out before the limit applies
        entries = session.log(all_branches=True)
        entries = views.visible(entries) if hidden else entries
        if all_entries:
            return names, entries[:limit]
        kept, past = past_bookkeeping(entries)
        return _moved(names, past), kept[:limit]
    want = limit or None
    while True:  # read more of the path until enough entries are left
        kept, past = past_bookkeeping(got := session.log(rev, limit=want))
        if want is None or limit is None or len(kept) >= limit or len(got) < want:
            return _moved(names, past), kept[:want and limit]
        want *= 4


@dataclass(frozen=True)
class BranchList:
    """A session's branches as ``castore branch`` lists them (see :func:`branch_list`)."""

    head: str | None
    #: the branch HEAD is on (None: detached)
    current: str | None
    #: name -> tip, local ones first, then ``remotes/REMOTE/BRANCH``
    branches: dict[str, str]
    #: name -> what an adapter says the branch is (only when asked for)
    notes: dict[str, str] = field(default_factory=dict)
    #: why HEAD's branch is missing when it was lost (fsck's line,
    #: :meth:`~castore.session.Session.lost_branch`); None when HEAD is sound or never born
    lost: str | None = None


def branch_list(session: Session, *, local: bool = True, remotes: bool = False, internal: bool = False,
                notes: bool = False) -> BranchList:
    """The session's branches: the local ones (without an adapter's bookkeeping branches
    unless ``internal``) and/or the remote-tracking ones a pull kept, and, when HEAD names a
    branch that was lost, fsck's line for it (``lost``: the listing is then not the whole story).

    Args:
        local: list the local branches.
        remotes: list the remote-tracking branches, as ``remotes/REMOTE/BRANCH``.
        internal: keep an adapter's bookkeeping branches (a LangGraph thread's ``writes``).
        notes: say what each branch is where an adapter knows (reads commits).

    Raises:
        StorageError, IntegrityError.
    """
    branches: dict[str, str] = dict(session.branches())
    if not internal:
        for hidden in views.internal_branches(session, branches):
            branches.pop(hidden)
    if not local:
        branches = {}
    if remotes:
        branches.update({f"remotes/{n}": c for n, c in session.remote_branches().items()})
    said = views.branch_notes(session, branches) if notes else {}
    head, current = session.head, session.current_branch
    lost = session.lost_branch() if head is None and current is not None else None
    return BranchList(head, current, branches, said, lost)


# -- finding sessions --------------------------------------------------------------------------------
Key = tuple[str, str, str]


def session_keys(store: Store, app: str | None = None, user: str | None = None) -> list[Key]:
    """Every session's ``(app, user, session)`` (of one app, or one user of it), sorted.

    Lists the ref folders and reads no ref, except the HEADs of a user's sessions when one
    of the names is too long to be kept in its key (the names are on HEAD then).

    Raises:
        InvalidName: a bad app or user name. StorageError.
    """
    want_app = names.encode(app, "app name") if app is not None else None
    want_user = names.encode(user, "user name") if user is not None else None
    # a tenant-layout store keeps each (app, user) in a store of its own: list each
    homes = [store.tenant(app, user)] if app is not None and user is not None else list(store.stores())
    out: list[Key] = []
    for home in homes:
        for aseg in home.refs.list_dir(SESSIONS):
            if not valid_segment(aseg) or want_app not in (None, aseg):
                continue
            for useg in home.refs.list_dir(f"{SESSIONS}/{aseg}"):
                if not valid_segment(useg) or want_user not in (None, useg):
                    continue
                segs = [x for x in home.refs.list_dir(f"{SESSIONS}/{aseg}/{useg}") if valid_segment(x)]
                if any(map(names.is_hashed, (aseg, useg, *segs))):  # a long name: read the names from HEAD
                    out += [(i.app, i.user, i.session) for i in home.sessions_of(aseg, [useg])]
                else:
                    out += [(real_name(aseg, None), real_name(useg, None), real_name(x, None)) for x in segs]
    return sorted(set(out))


def find_session(store: Store, session: str, app: str | None = None, user: str | None = None) -> Key:
    """The session that ``session`` names, found the way a short commit id is.

    With ``app`` and ``user``: that session if it exists, else the one of theirs whose id starts
    with ``session``. Without them (an id typed alone, as ``castore use 0ccf1a04``): the session
    of any app and user with exactly that id, else the one whose id starts with it, else a
    subagent's by its own id (:func:`own_id`: ``c2d9e1f0`` for Gemini CLI's
    ``PARENT.c2d9e1f0-...``, ``a9cad17`` or ``agent-a9cad17`` for Claude Code's
    ``PARENT.subagents.agent-a9cad17``), whole, then a prefix. Sessions named after another one
    (:func:`named_after`: its subagents, ``ID.subagents.agent-X``) do not make that one
    ambiguous: when every match but one is named after that one, that one is meant (as git takes
    a short id that only one object has); otherwise the error lists each session it could mean,
    with a count of the matches named after it. A session whose file the agent rewrote
    (``ID.v2``: Pi rewrites a v1 or v2 file as v3 when it opens it) means its newest version:
    the file the agent now has under that id (:func:`file_version`); the full key names each
    version.

    Raises:
        SessionNotFound: none matches.
        AmbiguousSession: several match (``candidates`` lists them).
        InvalidName: ``session`` is empty, or a bad app or user name.
        StorageError.
    """
    if not session:  # a prefix of every session: never what was meant
        raise names.InvalidName(session, "it is empty: give a session id or a unique prefix of it", "session id")
    if app is not None and user is not None and store.session(app, user, session).head is not None:
        return (app, user, session)
    keys = session_keys(store, app, user)
    for pick in (lambda k: k[2] == session, lambda k: k[2].startswith(session),
                 lambda k: session in own_id(k[2]), lambda k: any(x.startswith(session) for x in own_id(k[2]))):
        found = [k for k in keys if pick(k)]
        under: dict[Key, list[Key]] = {}
        for k in found:  # each session under the first (shortest) one it is named after
            base = next((b for b in sorted(found, key=lambda b: len(b[2])) if named_after(k, b)), None)
            under.setdefault(base or k, []).extend([k] if base else [])
        if len(under) == 1:
            return newest_version(next(iter(under)), keys)
        if found:
            raise AmbiguousSession(session, sorted(under), named_after=under)
    raise SessionNotFound((app or "*", user or "*", session))


#: the shortest tail of a session id read as a subagent's own id (a Gemini CLI uuid, Claude
#: Code's ``agent-`` and 7 hex characters)
OWN_ID_MIN = 8


def own_id(session_id: str) -> tuple[str, ...]:
    """The ids a session named after its parent (a subagent's: ``PARENT.ID``,
    ``PARENT.subagents.agent-ID``) has of its own: ``ID``, and ``agent-ID`` for Claude Code's;
    () for any other session (a tail that is no id, such as ``.json`` or ``.v2``, shorter
    than :data:`OWN_ID_MIN` characters). Raises nothing."""
    base, dot, tail = session_id.rpartition(".")
    if not dot or not base or len(tail) < OWN_ID_MIN:
        return ()
    return (tail, tail[len("agent-"):]) if tail.startswith("agent-") and len(tail) > len("agent-") else (tail,)


def named_after(key: Key, base: Key) -> bool:
    """Whether session ``key`` is named after session ``base``: in the same app and user, its id
    is ``base``'s id, a dot and more (a subagent's session, ``ID.subagents.agent-X``; a file the
    agent rewrote, ``ID.v2``). A short id that matches a session and sessions named after it
    means it (or its newest version, :func:`newest_version`)."""
    return key[:2] == base[:2] and key[2].startswith(base[2] + ".")


def file_version(session_id: str) -> tuple[str, int]:
    """The session id of an archived file and which version of it ``session_id`` is: an
    importer that finds the part of a file it archived changed (the agent rewrote it) imports
    the file again as ``ID.v2`` (then ``ID.v3``), leaving ``ID`` as it was; ``("ID", 2)``
    for ``ID.v2``, ``(session_id, 1)`` for any other id. Raises nothing."""
    base, dot_v, n = session_id.rpartition(".v")
    if dot_v and base and n.isdigit() and n[0] != "0" and int(n) >= 2:
        return base, int(n)
    return session_id, 1


def newest_version(key: Key, keys: Sequence[Key]) -> Key:
    """``key``, or its newest version among ``keys`` (``ID.v3`` over ``ID.v2`` over ``ID``:
    the file the agent has now) when ``key`` names a first version. Raises nothing."""
    if file_version(key[2])[1] > 1:
        return key
    best, top = key, 1
    for k in keys:
        if k[:2] == key[:2]:
            base, n = file_version(k[2])
            if base == key[2] and n > top:
                best, top = k, n
    return best


__all__ = ["Status", "status", "session_keys", "find_session", "own_id", "named_after", "file_version",
           "newest_version",
           "RefNames", "ref_names", "readable", "past_bookkeeping",
           "log", "BranchList", "branch_list"]
