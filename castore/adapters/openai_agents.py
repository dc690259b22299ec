"""OpenAI Agents SDK session backed by castore.

Pass it wherever the SDK takes a ``session``::

    from castore.adapters.openai_agents import CastoreSession
    result = await Runner.run(agent, "Hi", session=CastoreSession("conv-1", "s3://bucket/agents"))

How the SDK's ``Session`` protocol maps onto castore:

* the conversation is the castore session ``(app, user, session_id)``; each input item is one
  commit (a chat item with a ``role`` is a castore ``Message``, any other item such as a
  function call or its output is a ``Custom`` entry of type ``openai.item``), and one
  ``add_items`` call lands whole or not at all;
* ``get_items`` reads the items on the path to ``HEAD`` (the leaf);
* ``pop_item`` moves the leaf back to the parent of the newest item (a castore checkout), so
  the popped item stays on the branch it was popped from; the next ``add_items`` then starts a
  new castore branch there, as editing an earlier message does in a chat UI;
* ``clear_session`` starts a new branch at the leaf whose first commit is an
  ``openai.cleared`` marker: ``get_items`` stops at the newest marker, and the history before it
  stays readable (``castore log``, the old branch);
* branches of the conversation are castore branches: see :attr:`CastoreSession.castore`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..entries import Custom, Message
from ..errors import InvalidEntry
from ..session import LogEntry, Session
from ..store import Store

#: Custom entry type of an input item that is not a chat message (function call, output, ...)
ITEM = "openai.item"
#: Custom entry type of the marker ``clear_session`` writes: items before it are not read
CLEARED = "openai.cleared"
#: Custom entry type of the first commit of a conversation (the point a full pop returns to)
STARTED = "openai.session"

_BOUNDARY = object()


def item_to_entry(item: Any) -> Message | Custom:
    """The castore entry for one input item (as its JSON form, like the SDK's SQLiteSession).

    Raises:
        TypeError, ValueError: the item is not JSON-serialisable.
    """
    data = json.loads(json.dumps(item))
    if isinstance(data, dict) and isinstance(data.get("role"), str) and data["role"]:
        msg = Message.from_dict(data)
        if msg.to_dict() == data:  # only when the item reads back exactly
            return msg
    return Custom(ITEM, data)


def entry_to_item(entry: LogEntry) -> Any:
    """The input item a commit holds; ``None`` for other commits; a boundary for a marker."""
    e = entry.entry
    if isinstance(e, Message):
        return e.to_dict()
    if isinstance(e, Custom):
        if e.type == ITEM:
            return e.data
        if e.type == CLEARED:
            return _BOUNDARY
    return None


def coerce_settings(settings: Any) -> Any:
    """The SDK's ``SessionSettings`` for ``settings``, as ``SQLiteSession`` converts them:
    settings pass as they are, a dict becomes settings, None the default settings.

    Without the SDK installed the result is an object with the same fields (``limit``).

    Raises:
        TypeError: ``settings`` is neither settings nor a dict, or a dict names an unknown
            setting (the SDK's own error).
    """
    try:
        from agents.memory.session_settings import SessionSettings, coerce_session_settings
    except ImportError:  # the SDK is what calls this session; without it keep the same rules
        return _Settings() if settings is None else _Settings.coerce(settings)
    return SessionSettings() if settings is None else coerce_session_settings(settings)


@dataclass(frozen=True)
class _Settings:
    """``SessionSettings``' fields, for when the SDK is not installed."""

    limit: int | None = None

    @classmethod
    def coerce(cls, value: Any) -> _Settings:
        if isinstance(value, cls) or (hasattr(value, "limit") and not isinstance(value, Mapping)):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"session must be a SessionSettings instance or a dict, got {type(value).__name__}")
        unknown = sorted(str(k) for k in value if k not in {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"Unknown session settings: {', '.join(unknown)}")
        return cls(**value)


class CastoreSession:
    """The Agents SDK ``Session`` protocol over one castore session.

    Args:
        session_id: the conversation's id (the castore session name).
        store: an open :class:`~castore.Store`, or a store URL (None: ``$CASTORE_STORE`` or
            ``./.castore``). A store opened from a URL is closed by :meth:`close`.
        app: the castore app the conversation is filed under.
        user: the castore user the conversation is filed under.
        session_settings: the SDK's ``SessionSettings``, or a dict of its fields converted as
            the SDK's ``SQLiteSession`` does (its ``limit`` is the default for :meth:`get_items`).
        **storage_options: for the backend, when ``store`` is a URL.

    Raises:
        InvalidName: a part of the key is not a valid name.
        TypeError: ``session_settings`` is neither settings nor a dict, or names an unknown
            setting.

    Every method runs castore's blocking I/O in a worker thread, off the event loop.
    """

    def __init__(self, session_id: str, store: Store | str | None = None, *, app: str = "openai-agents",
                 user: str = "default", session_settings: Any = None, **storage_options: Any) -> None:
        if isinstance(store, Store):
            self.store, self._owns_store = store, False
        else:
            self.store, self._owns_store = Store.open(store, **storage_options), True
        self.session_id = session_id
        self.session_settings = coerce_settings(session_settings)
        self.castore: Session = self.store.session(app, user, session_id)
        """The castore session: branch, checkout, label, log, fork, verify."""

    def __repr__(self) -> str:
        return f"<CastoreSession {self.session_id!r} in {self.store.url}>"

    # -- reading ----------------------------------------------------------------------------
    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The items on the current branch since the last clear, oldest first.

        Args:
            limit: the newest ``limit`` items only (None: ``session_settings.limit``, else all;
                0: none; negative: all, as in the SDK's ``SQLiteSession``).

        Raises:
            InvalidEntry: ``limit`` (or the settings' limit) is not a whole number or None.
            IntegrityError, StorageError.
        """
        what = "limit"
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
            what = "session_settings.limit"
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
            # checked here: the window widening below would report another number than given
            raise InvalidEntry(f"{what} must be a whole number or None, not {limit!r}")
        return await asyncio.to_thread(self._items, limit)

    def _items(self, limit: int | None) -> list[Any]:
        if limit == 0 or not self.store.exists:
            return []
        if limit is None or limit < 0:
            items: list[Any] = []
            for e in self.castore.entries():
                item = entry_to_item(e)
                if item is _BOUNDARY:
                    items = []
                elif item is not None:
                    items.append(item)
            return items
        return [item for _, item in self._newest(limit)]

    def _newest(self, n: int) -> list[tuple[LogEntry, Any]]:
        """Up to ``n`` newest items since the last clear, oldest first, with their commits.

        Reads the bodies of the newest commits only, widening the window when other commits
        (labels, compactions, markers) sit between the items.
        """
        window = n + 1
        while True:
            log = self.castore.log(limit=window)
            found: list[tuple[LogEntry, Any]] = []
            for e in log:
                item = entry_to_item(e)
                if item is _BOUNDARY:
                    break
                if item is not None:
                    found.append((e, item))
                    if len(found) == n:
                        break
            else:
                if len(log) == window:
                    window *= 4
                    continue
            return list(reversed(found))

    # -- writing ----------------------------------------------------------------------------
    async def add_items(self, items: list[Any]) -> None:
        """Append items after the leaf: one commit each, landed together or not at all.

        Raises:
            TypeError, ValueError: an item is not JSON-serialisable (nothing is written).
            StorageError.
        """
        if not items:
            return
        entries: list[Any] = [item_to_entry(i) for i in items]
        await asyncio.to_thread(self._add, entries)

    def _add(self, entries: list[Any]) -> None:
        if self.castore.head is None:
            # A root that is not an item gives pop_item somewhere to move the leaf back to.
            entries = [Custom(STARTED), *entries]
        self.castore.append_many(entries)

    async def pop_item(self) -> Any:
        """Move the leaf back before the newest item and return that item (None if none).

        The popped item stays on the branch it was popped from (or under a ``popped-<id>``
        label when no branch holds it), so nothing is lost.

        Raises:
            StorageError.
        """
        return await asyncio.to_thread(self._pop)

    def _pop(self) -> Any:
        if not self.store.exists:
            return None
        newest = self._newest(1)
        if not newest:
            return None
        entry, item = newest[0]
        s = self.castore
        if s.current_branch is None and not self._on_a_branch(entry.id):
            s.label(f"popped-{entry.id[:12]}", at=entry.id, force=True)
        if entry.parents:
            s.checkout(entry.parents[0])
        else:  # a root item (a conversation not started here): hide it behind a marker
            s.append(Custom(CLEARED, {"popped": entry.id}))
        return item

    def _on_a_branch(self, cid: str) -> bool:
        history = self.store.history
        return any(history.is_ancestor(cid, tip) for tip in self.castore.branches().values())

    async def clear_session(self) -> None:
        """Start an empty conversation on a new branch; the old items stay in history.

        Raises:
            StorageError.
        """
        await asyncio.to_thread(self._clear)

    def _clear(self) -> None:
        if not self.store.exists or self.castore.head is None:
            return
        self.castore.checkout("HEAD", create=f"cleared-{uuid.uuid4().hex[:8]}")
        self.castore.append(Custom(CLEARED))

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        """Close the store if this session opened it."""
        if self._owns_store:
            self.store.close()


__all__ = ["CastoreSession", "coerce_settings", "item_to_entry", "entry_to_item", "ITEM", "CLEARED", "STARTED"]
