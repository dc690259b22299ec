"""Google ADK session service backed by castore.

Use it wherever ADK takes a ``session_service``::

    from castore.adapters.adk import CastoreSessionService
    runner = Runner(agent=agent, app_name="app", session_service=CastoreSessionService("s3://bucket/agents"))

How ADK maps onto castore:

* an ADK session is the castore session ``(app_name, user_id, session_id)``; its first commit
  is a ``Custom`` entry of type ``adk.session`` holding the initial state;
* every non-partial ADK event is one castore ``Event`` commit: the event's content (role and
  parts) is the shared body, and the rest of the event, as ``model_dump(mode="json")``, is kept
  on the commit, so an event read back equals the one appended;
* ``app:`` and ``user:`` keys of a state delta go to castore's app- and user-scoped state,
  ``temp:`` keys are never stored;
* an ADK ``Session`` object remembers the commit it was read at (ADK's private
  ``_storage_update_marker``); appending from it is a compare-and-swap against that commit, so
  a stale session object gets ADK's ``StaleSessionError`` (a ``ValueError``) instead of
  writing after history it has not seen;
* ``get_session`` returns events in the order they were appended, as ADK's
  ``InMemorySessionService`` does, whatever their timestamps. ADK's SQL services sort by
  timestamp instead and break ties by row or event id (``DatabaseSessionService``: by id, which
  is random for ADK's own events). castore keeps append order because it is what happened: a
  coarse clock can give a tool call and its response one timestamp, and an id order would put
  the response first at random. The SQL services sort to make their reads stable; a castore
  path already reads the same on every read, and its tip (the stale-session check) is the last
  event in that order;
* ADK reads the session's current branch (castore ``HEAD``): check out another castore branch
  and ADK continues from there. ADK's own rewind (``Runner.rewind_async``) appends a rewind
  event like any other; :meth:`CastoreSessionService.branch_before_invocation` is the castore
  alternative, which leaves the abandoned invocation on the old branch.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, overload

from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event as AdkEvent
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session as AdkSession
from pydantic_core import to_jsonable_python

from ..entries import Custom, Event, Message
from ..errors import RefConflict, SessionNotFound
from ..handles import Handle
from ..refnames import META_CREATED, META_NAMES, symbolic_to
from ..session import LogEntry, Session
from ..state import read_state
from ..store import SessionInfo, Store

try:  # google-adk >= 1.2x names the stale-writer error; older releases raised ValueError
    from google.adk.errors._stale_session_error import StaleSessionError
except ImportError:  # pragma: no cover - depends on the installed google-adk

    class StaleSessionError(ValueError):  # type: ignore[no-redef]  # only where ADK lacks it
        """The session was modified in storage since it was loaded."""


try:
    from google.adk.errors._invocation_not_found_error import InvocationNotFoundError
except ImportError:  # pragma: no cover - depends on the installed google-adk

    class InvocationNotFoundError(ValueError):  # type: ignore[no-redef]  # only where ADK lacks it
        """No event of the session has this invocation id."""


#: the ``Custom`` entry type of the first commit of every session this service creates
CREATED = "adk.session"
#: the commit meta key holding the ADK event (everything but its content)
META_KEY = "adk"
_STALE = (
    "The session has been modified in storage since it was loaded (castore commit {seen} is no "
    "longer the tip of its branch, {now} is). Reload it with get_session before appending."
)


# -- event <-> castore entry ------------------------------------------------------------------
def _dump(event: AdkEvent) -> dict[str, Any]:
    # Leaving out None fields keeps commits small; a field whose default is not None but holds
    # None would then come back as its default, so fall back to the full dump in that case.
    d = event.model_dump(mode="json", exclude_none=True)
    if AdkEvent.model_validate(d) != event:
        d = event.model_dump(mode="json")
    return d


def event_to_entry(event: AdkEvent) -> Event:
    """The castore entry for an ADK event: content as the shared body, the rest as meta.

    Raises:
        InvalidEntry: a value cannot be stored.
    """
    d = _dump(event)
    content = d.pop("content", None)
    message = None
    if isinstance(content, dict) and content.get("role") and set(content) <= {"role", "parts"}:
        message = Message(role=content["role"], content=content.get("parts"))
    elif content is not None:
        d["content"] = content
    delta = dict((d.get("actions") or {}).get("state_delta") or {})
    return Event(author=event.author, message=message, state_delta=delta, meta={META_KEY: d})


def entry_to_event(entry: LogEntry) -> AdkEvent | None:
    """The ADK event a commit holds, or None for a commit that is not an ADK event."""
    d = entry.meta.get(META_KEY)
    if entry.kind != "event" or not isinstance(d, Mapping):
        return None
    d = dict(d)
    msg = entry.entry.message if isinstance(entry.entry, Event) else None
    if msg is not None:
        c: dict[str, Any] = {"role": msg.role}
        if msg.content is not None:
            c["parts"] = msg.content
        d["content"] = c
    return AdkEvent.model_validate(d)


@overload
def _strip(session_id: str) -> str: ...


@overload
def _strip(session_id: str | None) -> str | None: ...


def _strip(session_id: str | None) -> str | None:
    """A session id as ADK's in-memory service keys it: without surrounding whitespace."""
    return session_id.strip() if isinstance(session_id, str) else session_id


# -- the service --------------------------------------------------------------------------------
class CastoreSessionService(Handle, BaseSessionService):
    """An ADK ``BaseSessionService`` that keeps sessions in a castore store.

    Args:
        store: an open :class:`~castore.Store`, or a store URL (a path, ``s3://bucket/prefix``,
            ...; None: ``$CASTORE_STORE`` or ``./.castore``). A store opened from a URL is
            closed by :meth:`close`.
        **storage_options: for the backend, when ``store`` is a URL.

    Every method runs castore's blocking I/O in a worker thread, off the event loop.
    """

    def __init__(self, store: Store | str | None = None, **storage_options: Any) -> None:
        if isinstance(store, Store):
            self.store, self._owns_store = store, False
        else:
            self.store, self._owns_store = Store.open(store, **storage_options), True

    # -- castore access ---------------------------------------------------------------------
    def castore_session(self, app_name: str, user_id: str, session_id: str) -> Session:
        """The castore :class:`~castore.Session` behind an ADK session (branches, log, audit).

        Raises:
            InvalidName: a part of the key is not a valid name.
        """
        return self.store.session(app_name, user_id, session_id)

    def _scoped(self, app_name: str, user_id: str) -> dict[str, Any]:
        out = {f"app:{k}": v for k, v in self.store.app_state(app_name).items()}
        out.update({f"user:{k}": v for k, v in self.store.user_state(app_name, user_id).items()})
        return out

    def _state_at(self, s: Session, cid: str | None) -> dict[str, Any]:
        if cid is None:
            return {}
        home = self.store.tenant(s.app, s.user)  # the session's tenant's store (docs/tenants.md)
        return read_state(home.objects, home.history.commit(cid).state)

    def _adk_session(self, s: Session, tip: str | None, updated: float, events: list[AdkEvent],
                     scoped: dict[str, Any] | None = None) -> AdkSession:
        state = self._state_at(s, tip)
        state.update(self._scoped(s.app, s.user) if scoped is None else scoped)
        out = AdkSession(id=s.id, app_name=s.app, user_id=s.user, state=state, events=events,
                         last_update_time=updated)
        out._storage_update_marker = tip  # noqa: SLF001 - ADK's slot for exactly this
        return out

    # -- create -----------------------------------------------------------------------------
    async def create_session(self, *, app_name: str, user_id: str, state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> AdkSession:
        """Create a session; its initial ``state`` may hold ``app:`` and ``user:`` keys.

        As in ADK's in-memory service, ``session_id`` is stripped of surrounding whitespace,
        and a missing or blank one is replaced by a generated id.

        Raises:
            AlreadyExistsError: a session with this id exists (nothing is written).
            InvalidName, StorageError.
        """
        return await asyncio.to_thread(self._create, app_name, user_id, state, session_id)

    def _create(self, app_name: str, user_id: str, state: dict[str, Any] | None,
                session_id: str | None) -> AdkSession:
        s = self.store.session(app_name, user_id, _strip(session_id) or str(uuid.uuid4()))
        self.store.init()
        # Creating HEAD is the atomic "create if absent": of two creators of one id, one wins.
        head = {META_NAMES: {"app": s.app, "user": s.user, "session": s.id}, META_CREATED: time.time()}
        try:
            self.store.tenant(app_name, user_id).plumbing.swap(s.refs.head, symbolic_to("main"), None, head)
        except RefConflict:
            raise AlreadyExistsError(f"Session {s.id} already exists.") from None
        delta = to_jsonable_python(dict(state or {}), inf_nan_mode="null")
        now = time.time()
        cid = s.append(Custom(CREATED), state_delta=delta, time=now)
        return self._adk_session(s, cid, now, [])

    # -- get --------------------------------------------------------------------------------
    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> AdkSession | None:
        """The session on its current branch, or None if there is none.

        ``config.num_recent_events`` keeps the last N events (0: none);
        ``config.after_timestamp`` keeps events with ``timestamp >= after_timestamp``.
        State is always complete: session keys at the tip plus current app and user state.

        Raises:
            InvalidName, IntegrityError, StorageError.
        """
        return await asyncio.to_thread(self._get, app_name, user_id, session_id, config)

    def _get(self, app_name: str, user_id: str, session_id: str,
             config: GetSessionConfig | None) -> AdkSession | None:
        s = self.store.session(app_name, user_id, _strip(session_id))
        if not s.exists():
            return None
        n = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        entries = self._recent(s, n)
        if not entries:
            return self._adk_session(s, None, 0.0, [])
        events = [ev for ev in map(entry_to_event, entries) if ev is not None]
        if n is not None:
            events = events[-n:] if n else []
        if after is not None:
            events = [ev for ev in events if ev.timestamp >= after]
        return self._adk_session(s, entries[-1].id, entries[-1].time, events)

    @staticmethod
    def _recent(s: Session, n: int | None) -> list[LogEntry]:
        """Entries of the current path: all, or enough of the newest to hold ``n`` ADK events.

        The last entry is the tip at the moment of reading, so events and marker agree.
        """
        if n is None:
            return s.entries()
        # The +1 covers the creation commit; other non-event commits (labels, compactions)
        # make the first read short, and then the whole path is read from the same tip.
        newest = list(reversed(s.log(limit=n + 1)))
        if not newest or newest[0].depth == 0:
            return newest
        if sum(1 for e in newest if entry_to_event(e) is not None) >= n:
            return newest
        return s.entries(newest[-1].id)

    # -- list -------------------------------------------------------------------------------
    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        """The sessions of an app (of one user, or of all users when ``user_id`` is None).

        Each session comes with its merged state and no events, oldest update first. A session
        whose deletion began and did not finish (:attr:`castore.SessionInfo.deleting`) is left
        out, as it will be once its deletion is finished (an ADK session has no place for the mark).

        Raises:
            InvalidName, StorageError.
        """
        return await asyncio.to_thread(self._list, app_name, user_id)

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        # a session whose deletion began is left out, as once it is finished (castore sessions flags it)
        infos = [i for i in self.store.sessions(app_name, user_id) if i.deleting is None]
        if not infos:
            return ListSessionsResponse()
        scoped: dict[str, dict[str, Any]] = {}

        def one(info: SessionInfo) -> AdkSession:
            s = self.store.session(info.app, info.user, info.session)
            return self._adk_session(s, info.head, info.updated, [], scoped[info.user])

        with ThreadPoolExecutor(max_workers=min(16, len(infos))) as pool:
            users = sorted({i.user for i in infos})
            scoped.update(zip(users, pool.map(lambda u: self._scoped(app_name, u), users), strict=True))
            out = list(pool.map(one, infos))
        out.sort(key=lambda x: (x.last_update_time, x.user_id, x.id))
        return ListSessionsResponse(sessions=out)

    # -- delete -----------------------------------------------------------------------------
    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session's refs (its objects go at the next ``castore gc``); no-op if absent.

        Raises:
            InvalidName, StorageError.
        """
        await asyncio.to_thread(self._delete, app_name, user_id, session_id)

    def _delete(self, app_name: str, user_id: str, session_id: str) -> None:
        try:
            self.store.delete_session(app_name, user_id, _strip(session_id))
        except SessionNotFound:
            pass

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user-scoped state of ``user_id`` in ``app_name``, keys without ``user:``.

        Raises:
            InvalidName, StorageError.
        """
        return await asyncio.to_thread(self.store.user_state, app_name, user_id)

    # -- append -----------------------------------------------------------------------------
    async def append_event(self, session: AdkSession, event: AdkEvent) -> AdkEvent:
        """Store a non-partial event as one commit after the commit ``session`` was read at.

        ``temp:`` keys of its state delta reach ``session.state`` only; ``app:`` and ``user:``
        keys go to the shared scopes. On success ``session`` is updated in place.

        An event equal to one already stored with the same id (a retried call) is not stored
        again, as in ADK's in-memory service: the call returns it and changes nothing.

        Raises:
            StaleSessionError: the session's branch moved since ``session`` was read (a
                ``ValueError``; nothing is written). Reload it with :meth:`get_session`.
            SessionNotFoundError: the session does not exist (a ``ValueError``).
            InvalidEntry, StorageError.
        """
        if event.partial:
            return event
        if any(e.id == event.id and e == event for e in session.events) and await asyncio.to_thread(
                self._is_stored, session, event):
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        cid = await asyncio.to_thread(self._append, session, event)
        if cid is None:  # stored already, by a call whose session object this is not
            return event
        session._storage_update_marker = cid  # noqa: SLF001
        session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)

    def _append(self, session: AdkSession, event: AdkEvent) -> str | None:
        """The commit of the appended event; None when an equal event is stored already."""
        s = self.store.session(session.app_name, session.user_id, session.id)
        entry = event_to_entry(event)
        seen = session._storage_update_marker  # noqa: SLF001 - ADK's slot for exactly this
        if seen is None:
            if self._is_stored(session, event):
                return None
            seen = self._marker_for_unmarked(s, session)
        try:
            return s.append(entry, expect=seen, time=event.timestamp)
        except RefConflict as e:
            # A retry from another session object (or after a lost reply) finds its event there.
            if self._is_stored(session, event):
                return None
            self._raise_stale(s, seen, e.actual)
        raise AssertionError("unreachable")  # pragma: no cover

    def _is_stored(self, session: AdkSession, event: AdkEvent) -> bool:
        """Whether the session's current branch holds an event equal to ``event`` with its id.

        Reads the path (newest first) only on this rare path: a retried or repeated append.
        """
        s = self.store.session(session.app_name, session.user_id, session.id)
        if not s.exists():
            return False
        for e in reversed(s.entries()):
            got = entry_to_event(e)
            if got is not None and got.id == event.id and got == event:
                return True
        return False

    def _raise_stale(self, s: Session, seen: str | None, now: str | None) -> None:
        if not s.exists():
            raise SessionNotFoundError(f"Session {s.id} not found.")
        raise StaleSessionError(_STALE.format(seen=(seen or "none")[:12], now=(now or "none")[:12]))

    def _marker_for_unmarked(self, s: Session, session: AdkSession) -> str:
        """The tip to expect for a session object built by hand: fine if it saw the last event."""
        if not s.exists():
            raise SessionNotFoundError(f"Session {s.id} not found.")
        entries = s.entries()
        if not entries:
            raise StaleSessionError("The session has no commits yet; it is being created.")
        stored = [ev.id for ev in map(entry_to_event, entries) if ev is not None]
        mine = [ev.id for ev in session.events]
        if (stored[-1] if stored else None) != (mine[-1] if mine else None):
            self._raise_stale(s, None, entries[-1].id)
        return entries[-1].id

    # -- castore-native rewind ----------------------------------------------------------------
    async def branch_before_invocation(self, *, app_name: str, user_id: str, session_id: str,
                                       invocation_id: str, branch: str) -> AdkSession:
        """Start castore branch ``branch`` just before an invocation and check it out.

        Unlike ADK's rewind (which appends an event undoing the state changes), the abandoned
        invocation stays whole on the branch left behind, and the new branch's events and state
        are exactly those before the invocation.

        Returns:
            The session as read on the new branch.

        Raises:
            InvocationNotFoundError: no event on the current branch has this invocation id.
            BranchError: ``branch`` exists. SessionNotFoundError, InvalidName, StorageError.
        """
        return await asyncio.to_thread(self._branch_before, app_name, user_id, session_id,
                                       invocation_id, branch)

    def _branch_before(self, app_name: str, user_id: str, session_id: str, invocation_id: str,
                       branch: str) -> AdkSession:
        s = self.store.session(app_name, user_id, _strip(session_id))
        if not s.exists():
            raise SessionNotFoundError(f"Session {session_id} not found.")
        for e in s.entries():
            ev = entry_to_event(e)
            if ev is not None and ev.invocation_id == invocation_id:
                s.checkout(e.parents[0], create=branch)
                got = self._get(app_name, user_id, session_id, None)
                assert got is not None
                return got
        raise InvocationNotFoundError(f"Invocation ID not found: {invocation_id}")

    # -- lifecycle --------------------------------------------------------------------------
    async def close(self) -> None:
        """Close the store if this service opened it."""
        if self._owns_store:
            await asyncio.to_thread(self.store.close)

    async def __aenter__(self) -> CastoreSessionService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = [
    "CastoreSessionService",
    "StaleSessionError",
    "InvocationNotFoundError",
    "event_to_entry",
    "entry_to_event",
    "CREATED",
    "META_KEY",
]
