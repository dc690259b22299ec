"""How commits read for people: a registry that adapters fill, so generic readers need not know them.

An adapter that writes commit kinds of its own (the LangGraph saver's ``checkpoint`` and
``writes``) says how they read by subclassing :class:`View` and passing an instance to
:func:`register` when its view module is imported. Generic readers (the CLI's ``log``,
``show``, ``state``, ``diff``, ``branch``) ask the module functions below, which dispatch
on a commit's kind and never name an adapter.

Which module registers the view of a kind is listed in :data:`VIEW_MODULES` (a lazy table,
as entry points would be, without their cost at start-up): a view module is imported the
first time a commit of one of its kinds is read, or when a question about a whole session
(its bookkeeping branches, what its branches are) has to ask every view. An adapter outside
castore adds its kinds with :func:`register` (or to the table) before reading.

Nothing here writes, and a kind with no view reads as castore's own entries do.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .entries import LogEntry, Message
    from .session import Session

#: commit kind -> the module whose import registers its view
VIEW_MODULES: dict[str, str] = {
    "checkpoint": "castore.adapters.langgraph_view",
    "writes": "castore.adapters.langgraph_view",
    "event": "castore.adapters.transcript_view",
    "message": "castore.adapters.transcript_view",
}

_views: dict[str, View] = {}
_loaded: set[str] = set()


class View:
    """How one adapter's commits read. Override what applies; every default says nothing.

    ``kinds`` are the commit kinds it reads. A method given a commit of another kind, or
    one of its kinds written by someone else, returns its "nothing" (None, empty).
    """

    kinds: frozenset[str] = frozenset()

    def describe(self, e: LogEntry) -> str | None:
        """One line saying what the commit is (``checkpoint step 3 · loop``), or None."""
        return None

    def body(self, e: LogEntry, verbose: bool = False) -> list[str] | None:
        """The lines ``show`` prints for the commit's entry (unescaped text), or None.

        ``verbose``: all of it (a tool's whole output), where the short form leaves some out.
        """
        return None

    def message(self, m: Message, verbose: bool = False) -> list[str] | None:
        """The lines showing a message that comes with no commit (``context``), or None."""
        return None

    def hidden(self, e: LogEntry) -> bool:
        """Whether a listing of every branch leaves the commit out (bookkeeping)."""
        return False

    def bookkeeping(self, e: LogEntry) -> bool:
        """Whether ``log`` leaves the commit out unless asked for every entry (a client's
        bookkeeping line in an imported session: Claude Code's ``progress``, ...)."""
        return False

    def said(self, session: Session, entries: Iterable[LogEntry]) -> dict[str, str]:
        """For the commits of ``entries`` whose entry alone says nothing (an imported line
        with no message), what they say, read from the store: commit -> one line."""
        return {}

    def settings(self, session: Session, entries: Iterable[LogEntry]) -> dict[str, str]:
        """For the bookkeeping lines of ``entries`` that set what a reader sees outside the
        state (the session's title, the model of the turns after it), what each set, read
        from the store: commit -> one line (``title: ...``). ``entries`` are the whole
        session's, so that a setting is said only where it changes."""
        return {}

    def model(self, session: Session, entries: Sequence[LogEntry]) -> str | None:
        """The model in force at the end of a path whose entries (``entries``, oldest first: the
        path's newest ones) name none themselves, as the adapter reads it from what it keeps
        (an imported line naming the model the agent used), or None."""
        return None

    def internal_branches(self, session: Session, branches: Mapping[str, str]) -> set[str]:
        """The branches (of ``branches``) that are the adapter's bookkeeping."""
        return set()

    def branch_notes(self, session: Session, branches: Mapping[str, str]) -> dict[str, str]:
        """For the branches the adapter knows, one line saying what each is."""
        return {}

    def links(self, session: Session) -> dict[str, list[str]]:
        """Commit -> what it links to outside the session (``subagent: <session>``), shown
        beside its names in ``log`` and ``show``."""
        return {}

    def state_at(self, session: Session, rev: str) -> dict[str, Any] | None:
        """The state at ``rev`` as the adapter reads it (decoded), or None to use the stored state."""
        return None

    def details(self, session: Session, e: LogEntry, verbose: bool = False) -> list[tuple[str, list[tuple[str, Any]]]]:
        """Extra ``(title, [(key, value)])`` sections ``show`` prints after the commit.

        ``verbose``: all of each value, where the short form cuts long ones.
        """
        return []

    def diff_states(self, session: Session, rev1: str, rev2: str) -> dict[str, Any] | None:
        """``{"added", "removed", "changed"}`` between two states as the adapter reads them, or None."""
        return None


def register(view: View) -> None:
    """Make ``view`` the view of each of its kinds (a later registration of a kind wins)."""
    for kind in view.kinds:
        _views[kind] = view


def unregister(view: View) -> None:
    """Forget ``view`` for each kind it is registered for (a kind then reads as castore's own)."""
    for kind in [k for k, v in _views.items() if v is view]:
        del _views[kind]


def _load(module: str) -> None:
    if module not in _loaded:
        _loaded.add(module)
        importlib.import_module(module)


def view_for(kind: str) -> View | None:
    """The view registered for commit kind ``kind`` (importing its module first), or None.

    Raises:
        ImportError: the module listed for the kind fails to import.
    """
    if kind not in _views and kind in VIEW_MODULES:
        _load(VIEW_MODULES[kind])
    return _views.get(kind)


def all_views() -> list[View]:
    """Every view, each once (every module in :data:`VIEW_MODULES` imported first)."""
    for module in dict.fromkeys(VIEW_MODULES.values()):
        _load(module)
    return list({id(v): v for v in _views.values()}.values())


# -- what generic readers ask ----------------------------------------------------------------
def describe(e: LogEntry) -> str | None:
    """One line saying what an adapter's commit is, or None (see :meth:`View.describe`)."""
    view = view_for(e.kind)
    return view.describe(e) if view is not None else None


def body(e: LogEntry, verbose: bool = False) -> list[str] | None:
    """The lines showing an adapter's commit, unescaped, or None (see :meth:`View.body`)."""
    view = view_for(e.kind)
    if view is None:
        return None
    return view.body(e, verbose) if verbose else view.body(e)  # a view written before ``verbose`` still reads


def message(m: Message, verbose: bool = False) -> list[str] | None:
    """The lines showing a message with no commit (``context``), unescaped, or None: as the
    view of the ``message`` kind reads it (see :meth:`View.message`)."""
    view = view_for(m.kind)
    return view.message(m, verbose) if view is not None else None


def bookkeeping(e: LogEntry) -> bool:
    """Whether ``log`` leaves the commit out unless asked for every entry (see :meth:`View.bookkeeping`)."""
    view = view_for(e.kind)
    return view is not None and view.bookkeeping(e)


def _by_view(entries: Iterable[LogEntry]) -> list[tuple[View, list[LogEntry]]]:
    """``entries`` grouped by the view that reads them (a commit of no view left out)."""
    by_view: dict[int, tuple[View, list[LogEntry]]] = {}
    for e in entries:
        view = view_for(e.kind)
        if view is not None:
            by_view.setdefault(id(view), (view, []))[1].append(e)
    return list(by_view.values())


def said(session: Session, entries: Iterable[LogEntry]) -> dict[str, str]:
    """Commit -> one line, for the commits of ``entries`` that say nothing by their entry
    alone but do as their view reads them from the store (see :meth:`View.said`).

    Raises:
        ObjectNotFound, IntegrityError, StorageError: reading what a view needs failed.
    """
    return _ask("said", session, entries)


def settings(session: Session, entries: Iterable[LogEntry]) -> dict[str, str]:
    """Commit -> one line, for the bookkeeping lines of ``entries`` (a whole session's) that
    set what a reader sees outside the state: a title, a model (see :meth:`View.settings`).
    A reader that leaves such a line out shows this in its place.

    Raises:
        ObjectNotFound, IntegrityError, StorageError: reading what a view needs failed.
    """
    return _ask("settings", session, entries)


def model(session: Session, entries: Sequence[LogEntry]) -> str | None:
    """The model in force at the end of the path ``entries`` (oldest first) as the view of its
    newest commit reads it (see :meth:`View.model`), or None: what ``context`` reports when the
    entries name no model themselves (an imported Codex session names it in bookkeeping lines).

    Raises:
        ObjectNotFound, IntegrityError, StorageError: reading what the view needs failed.
    """
    view = view_for(entries[-1].kind) if entries else None
    return view.model(session, entries) if view is not None else None


def _ask(method: str, session: Session, entries: Iterable[LogEntry]) -> dict[str, str]:
    """Commit -> line: each view's ``method`` (``said``, ``settings``) asked about the entries it reads."""
    out: dict[str, str] = {}
    for view, some in _by_view(entries):
        out.update(getattr(view, method)(session, some))
    return out


def visible(entries: Iterable[LogEntry]) -> list[LogEntry]:
    """``entries`` without the commits an adapter keeps as bookkeeping (see :meth:`View.hidden`)."""
    out = []
    for e in entries:
        view = view_for(e.kind)
        if view is None or not view.hidden(e):
            out.append(e)
    return out


def internal_branches(session: Session, branches: Mapping[str, str] | None = None) -> set[str]:
    """The branches of ``session`` that are an adapter's bookkeeping (a LangGraph thread's ``writes``).

    Raises:
        StorageError, IntegrityError: reading a commit failed.
    """
    branches = session.branches() if branches is None else branches
    out: set[str] = set()
    for view in all_views():
        out |= view.internal_branches(session, branches)
    return out


def branch_notes(session: Session, branches: Mapping[str, str] | None = None) -> dict[str, str]:
    """What each branch is, where an adapter says (a LangGraph fork: the checkpoint it came from).

    Raises:
        StorageError, IntegrityError: reading a commit failed.
    """
    branches = session.branches() if branches is None else branches
    if session.head is not None:
        view_for(_kind_at(session, "HEAD"))  # the view of the session's own commits, loaded
    out: dict[str, str] = {}
    for view in all_views():
        out.update(view.branch_notes(session, branches))
    return out


#: the key of a session's info (``Session.info``) that holds its title
TITLE_KEY = "name"


#: the longest title an importer keeps from a first prompt (characters)
TITLE_CHARS = 200


def prompt_title(text: str) -> str | None:
    """The title a session without a name gets from its first prompt: the prompt's first
    non-blank line, stripped, cut to :data:`TITLE_CHARS` characters; None for a blank prompt.
    The one rule every importer applies (Codex's first typed prompt, Pi's first user message)."""
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return line[:TITLE_CHARS] or None


def session_title(info: Mapping[str, Any]) -> str | None:
    """A session's title, kept by its importer in the session's info: Claude Code's summary
    or custom title, Codex's first prompt, Pi's session name (else its first user message);
    None when it has none.
    Whitespace runs (newlines too) read as one space."""
    name = info.get(TITLE_KEY)
    return " ".join(name.split()) or None if isinstance(name, str) else None


def spawned_by(info: Mapping[str, Any]) -> dict[str, str] | None:
    """The session that spawned this one (an imported subagent), as its importer recorded it
    in the session's info: ``{"key": "APP/USER/SESSION", "session": SESSION}`` and, where the
    importer knows it, ``"commit"`` (the turn that ran it); None for any other session."""
    by = info.get("spawned_by")
    if not isinstance(by, Mapping) or not isinstance(by.get("session"), str):
        return None
    parts = [by.get("app"), by.get("user"), by["session"]]
    out = {"key": "/".join(parts) if all(isinstance(p, str) for p in parts) else by["session"],
           "session": by["session"]}
    if isinstance(by.get("commit"), str):
        out["commit"] = by["commit"]
    return out


def links(session: Session) -> dict[str, list[str]]:
    """Commit -> the sessions it links to (a subagent it spawned, the turn that spawned it),
    as the view of the session's HEAD commit says.

    Raises:
        StorageError, IntegrityError: reading a commit failed.
    """
    if session.head is None:
        return {}
    view = view_for(_kind_at(session, "HEAD"))
    return view.links(session) if view is not None else {}


def _kind_at(session: Session, rev: str) -> str:
    return session.store.history.commit(session.resolve(rev)).kind


def state_at(session: Session, rev: str = "HEAD") -> dict[str, Any]:
    """The state at ``rev``: as the adapter of its commit reads it (a LangGraph checkpoint's
    channel values), else :meth:`castore.Session.state`.

    Raises:
        RevisionNotFound, AmbiguousRevision, ObjectNotFound, IntegrityError, StorageError.
    """
    view = view_for(_kind_at(session, rev))
    got = view.state_at(session, rev) if view is not None else None
    return session.state(rev) if got is None else got


def details(session: Session, e: LogEntry, verbose: bool = False) -> list[tuple[str, list[tuple[str, Any]]]]:
    """The extra sections an adapter shows for a commit (see :meth:`View.details`)."""
    view = view_for(e.kind)
    if view is None:
        return []
    # a view written before ``verbose`` still reads
    return view.details(session, e, verbose) if verbose else view.details(session, e)


def diff_states(session: Session, rev1: str, rev2: str) -> dict[str, Any] | None:
    """The state change from ``rev1`` to ``rev2`` as their adapter reads it, or None when the
    two commits are not both read by one view (then :meth:`castore.Session.diff` says it).

    Raises:
        RevisionNotFound, AmbiguousRevision, ObjectNotFound, IntegrityError, StorageError.
    """
    view = view_for(_kind_at(session, rev1))
    if view is None or view_for(_kind_at(session, rev2)) is not view:
        return None
    return view.diff_states(session, rev1, rev2)


__all__ = [
    "VIEW_MODULES",
    "View",
    "register",
    "unregister",
    "view_for",
    "all_views",
    "describe",
    "body",
    "message",
    "bookkeeping",
    "said",
    "settings",
    "model",
    "spawned_by",
    "visible",
    "internal_branches",
    "branch_notes",
    "state_at",
    "details",
    "diff_states",
]
