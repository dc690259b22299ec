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
* the SDK's ``OpenAIResponsesCompactionSession`` replaces the newest items it compacted (a
  suffix) with the model's compacted output, as over the SDK's ``SQLiteSession``: castore
  appends an ``openai.replaced`` marker naming the first replaced item, then the output, in one
  append that lands only if the leaf has not moved since the items were read; ``get_items``
  skips the replaced items, which stay readable in ``castore log``;
* branches of the conversation are castore branches: see :attr:`CastoreSession.castore`;
* the Session protocol is given items, never the model's usage: pass
  :meth:`CastoreSession.usage_hooks` as the run's ``hooks`` (or give a finished run to
  :meth:`CastoreSession.record_usage`) and each model response's usage is appended as an
  ``openai.usage`` commit whose metadata holds ``usage``, ``model`` and ``response_id`` (what
  ``castore usage`` reads of any commit; ``get_items`` skips it).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from ..entries import Custom, Message
from ..errors import InvalidEntry, RefConflict
from ..handles import Handle
from ..session import LogEntry, Session
from ..store import Store

#: Custom entry type of an input item that is not a chat message (function call, output, ...)
ITEM = "openai.item"
#: Custom entry type of the marker ``clear_session`` writes: items before it are not read
CLEARED = "openai.cleared"
#: Custom entry type of the first commit of a conversation (the point a full pop returns to)
STARTED = "openai.session"
#: Custom entry type of the marker a compaction writes: the items from the commit it names
#: (``{"from": id}``) up to the marker are replaced by the items after it
REPLACED = "openai.replaced"
#: Custom entry type of a model response's usage (``{"response_id": ...}``; counts in the metadata)
USAGE = "openai.usage"

_BOUNDARY = object()
#: the ``Session`` protocol's methods: a subclass overriding one gets no compaction snapshot
_PROTOCOL = ("get_items", "add_items", "pop_item", "clear_session")


@dataclass(frozen=True)
class _Replaced:
    """What :func:`entry_to_item` gives for a ``REPLACED`` marker: where the replaced items start."""

    start: str


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
    """The input item a commit holds; ``None`` for other commits; a private marker object for
    a ``CLEARED`` or ``REPLACED`` marker (see :meth:`CastoreSession.get_items`)."""
    e = entry.entry
    if isinstance(e, Message):
        return e.to_dict()
    if isinstance(e, Custom):
        if e.type == ITEM:
            return e.data
        if e.type == CLEARED:
            return _BOUNDARY
        if e.type == REPLACED and isinstance(e.data, dict) and isinstance(e.data.get("from"), str):
            return _Replaced(e.data["from"])
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


class CastoreSession(Handle):
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
            self._opened, self._owns_store = store, False
        else:
            self._opened, self._owns_store = Store.open(store, **storage_options), True
        #: the store holding this session: its tenant's, in the tenant layout (docs/tenants.md)
        self.store = self._opened.tenant(app, user)
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
        return [item for _, item in self._newest(None if limit is None or limit < 0 else limit)]

    def _newest(self, n: int | None, rev: str = "HEAD") -> list[tuple[LogEntry, Any]]:
        """Up to ``n`` newest items (None: all) on the path to ``rev``, oldest first, with their
        commits: the items since the last clear, less those a compaction replaced.

        Reads the bodies of the newest commits only, widening the window when other commits
        (labels, markers, replaced items) sit between the items.
        """
        window = None if n is None else n + 1
        while True:
            log = list(reversed(self.castore.entries(rev))) if window is None \
                else self.castore.log(rev, limit=window)
            found: list[tuple[LogEntry, Any]] = []
            skip_to: str | None = None  # inside a replaced run: skip back through this commit
            done = False
            for e in log:
                item = entry_to_item(e)
                if item is _BOUNDARY:
                    done = True
                    break
                if skip_to is not None:
                    skip_to = None if e.id == skip_to else skip_to
                elif isinstance(item, _Replaced):
                    skip_to = item.start
                elif item is not None:
                    found.append((e, item))
                    if len(found) == n:
                        done = True
                        break
            if not done and window is not None and len(log) == window:
                window *= 4
                continue
            return list(reversed(found))

    # -- compaction (the SDK's OpenAIResponsesCompactionSession) ----------------------------
    async def _get_compaction_snapshot(self, limit: int, *,
                                       prune_prefix: Callable[[Any], bool] | None = None) -> Any:
        """The newest ``limit`` items with an atomic replacement of a suffix of them: the hook
        the SDK's ``OpenAIResponsesCompactionSession`` uses on stores that keep older history
        while it compacts the newest items (as it does over ``SQLiteSession``).

        Reads past ``session_settings.limit`` (as ``SQLiteSession`` does): the compaction session
        decides what to compact from the stored history, not from one retrieval's default.
        ``prune_prefix`` (expired encrypted items, from the SDK's ``EncryptedSession``) is
        accepted and not acted on: castore keeps history, and those items stay unreadable
        envelopes that ``EncryptedSession`` skips on reading.

        Returns:
            The SDK's ``_CompactionSnapshot``, or None (the compaction session then needs the
            whole history to match) for a subclass that overrides a method of the ``Session``
            protocol (it may transform items on their way in and out, which the snapshot would
            bypass: ``SQLiteSession`` refuses every subclass for this), or an SDK without the hook.

        Raises:
            IntegrityError, StorageError.
        """
        del prune_prefix
        try:
            from agents.memory.session import _await_mutation, _CompactionSnapshot
        except ImportError:  # an SDK before suffix compaction: it never calls this
            return None
        if any(getattr(type(self), m) is not getattr(CastoreSession, m) for m in _PROTOCOL):
            return None
        rows, complete, tip = await asyncio.to_thread(self._snapshot, limit)

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            if not rows[start:] or tip is None:
                return False
            entries = [item_to_entry(i) for i in output]
            return await _await_mutation(asyncio.to_thread(self._replace, rows[start][0].id, tip, entries))

        return _CompactionSnapshot([item for _, item in rows], complete, replace_suffix)

    def _snapshot(self, limit: int) -> tuple[list[tuple[LogEntry, Any]], bool, str | None]:
        """The newest ``limit`` items at the leaf, whether they are all the items, and the leaf."""
        tip = self.castore.head if self.store.exists else None
        if tip is None or limit <= 0:
            return [], tip is None, tip
        rows = self._newest(limit + 1, tip)
        return rows[-limit:], len(rows) <= limit, tip

    def _replace(self, start: str, tip: str, entries: list[Message | Custom]) -> bool:
        """Replace the items from commit ``start`` to the leaf by ``entries``, if the leaf is
        still ``tip``: one append of a ``REPLACED`` marker and the entries."""
        try:
            self.castore.append_many([Custom(REPLACED, {"from": start}), *entries], expect=tip)
        except RefConflict:
            return False
        return True

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

    # -- usage ------------------------------------------------------------------------------
    async def record_usage(self, responses: Any, model: Any = None) -> None:
        """Append the usage of model responses, one ``openai.usage`` commit each (together).

        Args:
            responses: a run's result (its ``raw_responses``), or the SDK's ``ModelResponse``
                objects.
            model: the model that gave them: a name, or the SDK's ``Model`` (its ``model``
                name), or an ``Agent`` (its model); None: the result's last agent's, if any.

        Raises:
            StorageError.
        """
        if model is None:
            model = getattr(getattr(responses, "last_agent", None), "model", None)
        raws = getattr(responses, "raw_responses", responses)
        rows = [(u, getattr(r, "response_id", None)) for r in raws or ()
                if (u := _usage_dict(getattr(r, "usage", None))) is not None]
        if rows:
            await asyncio.to_thread(self._add_usage, rows, _model_name(model))

    def _add_usage(self, rows: list[tuple[dict[str, Any], Any]], model: str | None) -> None:
        entries: list[Any] = [Custom(USAGE, {"response_id": rid} if isinstance(rid, str) else {}) for _, rid in rows]
        metas = [{"usage": u, **({"model": model} if model else {}),
                  **({"response_id": rid} if isinstance(rid, str) else {})} for u, rid in rows]
        if self.castore.head is None:
            entries, metas = [Custom(STARTED), *entries], [{}, *metas]
        self.castore.append_many(entries, metas=metas)

    def usage_hooks(self) -> Any:
        """The SDK's ``RunHooks`` that record each model response's usage as it arrives
        (:meth:`record_usage`): ``Runner.run(agent, input, session=s, hooks=s.usage_hooks())``.

        Raises:
            ImportError: the Agents SDK is not installed.
        """
        from agents import RunHooks

        session = self

        class _UsageHooks(RunHooks):
            async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
                await session.record_usage([response], getattr(agent, "model", None))

        return _UsageHooks()

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
            self._opened.close()


def _usage_dict(u: Any) -> dict[str, Any] | None:
    """The SDK's ``Usage`` as the OpenAI Responses shape ``castore usage`` reads, or None when
    it counts nothing."""
    if u is None:
        return None
    details = getattr(u, "input_tokens_details", None)
    out_details = getattr(u, "output_tokens_details", None)
    d: dict[str, Any] = {"input_tokens": int(getattr(u, "input_tokens", 0) or 0),
                         "output_tokens": int(getattr(u, "output_tokens", 0) or 0)}
    cached = int(getattr(details, "cached_tokens", 0) or 0)
    if cached:
        d["input_tokens_details"] = {"cached_tokens": cached}
    reasoning = int(getattr(out_details, "reasoning_tokens", 0) or 0)
    if reasoning:
        d["output_tokens_details"] = {"reasoning_tokens": reasoning}
    return d if d["input_tokens"] or d["output_tokens"] else None


def _model_name(model: Any) -> str | None:
    """A model's name: a name as given, else the ``model`` name of the SDK's ``Model`` or of an
    ``Agent``'s model."""
    for _ in range(2):
        if isinstance(model, str):
            return model or None
        model = getattr(model, "model", None)
    return None


__all__ = ["CastoreSession", "coerce_settings", "item_to_entry", "entry_to_item", "ITEM", "CLEARED", "STARTED",
           "REPLACED", "USAGE"]
