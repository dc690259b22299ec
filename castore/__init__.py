"""castore: agent session history stored the way git stores code.

Start here::

    import castore

    store = castore.open()                      # ./.castore, or $CASTORE_STORE, or a URL
    s = store.session("weather-app", "alice", "s1")
    s.append(castore.Message(role="user", content="Weather in Beijing?"))
    s.messages()                                # the linear view
    s.branch("retry", at="HEAD~1"); s.checkout("retry")

Layers, bottom first: a module imports only its own layer and the ones below
(``tests/test_layers.py`` enforces exactly this list)::

    errors, names, aio, redact, gcpause, listing, forked, handles  errors, names, async, redaction, gc, forks, pickle
    storage                             bytes by URL (local disk, memory, S3, other fsspec URLs)
    objects, frames, zdict, crypto, objectstore, refs, formats  object codec and frames, keys, object store, refs
    history, state, entries, pathfacts  paths, state trees, entry types, what a context needs of a whole path
    plumbing, refnames, retry, groupcommit, revisions, pathview, deletion  write path, ref names, retries, deletion
    context                             the model's view of a path (pure)
    session, store, sessionlist, scopes  what an agent calls, the listing of sessions, app and user state
    sync, remotes, maintenance, scrub, grep, views, porcelain, convert, cachedir  push/pull, fsck/gc, search, caches
    adapters, html, usage               LangGraph, Pi, ADK, OpenAI Agents; the viewer; token usage
    cli, __main__                       the ``castore`` command
"""

from __future__ import annotations

import importlib

from .errors import (
    AccessDenied,
    AmbiguousRevision,
    AmbiguousSession,
    AuditError,
    BranchError,
    CastoreError,
    CorruptRef,
    DamagedPack,
    EncryptionError,
    FormatError,
    IntegrityError,
    InvalidEntry,
    InvalidName,
    KeyMissing,
    NotPicklable,
    ObjectNotFound,
    RefConflict,
    RefLocked,
    RefNotFound,
    RevisionNotFound,
    SealedFrameError,
    SessionDeleting,
    SessionExists,
    SessionNotFound,
    StorageError,
    StoreNotFound,
    TenantErased,
    WrongKey,
)

#: ``typing.TYPE_CHECKING`` without importing typing (mypy reads this name the same way)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .context import Context
    from .entries import DELETE, BranchSummary, Compaction, Custom, Event, LogEntry, Message, ModelChange
    from .listing import SessionInfo
    from .objects import ObjectId
    from .retry import RefContended, RetryPolicy
    from .session import Session
    from .store import Store, open  # noqa: A004 - castore.open() is the entry point, as io.open
    from .sync import SyncReport, clone, pull, push

__version__ = "0.1.0"

#: public names imported on first use, by module: ``import castore`` costs only the errors,
#: and the object format (msgspec, blake3, zstandard), the write path and the entry
#: types load when a program first touches ``castore.open``, ``castore.Message``...;
#: sync (a thread pool) only when it pushes or pulls
_LAZY = {
    "RefContended": "retry", "RetryPolicy": "retry",
    "Context": "context",
    "DELETE": "entries", "BranchSummary": "entries", "Compaction": "entries", "Custom": "entries",
    "Event": "entries", "LogEntry": "entries", "Message": "entries", "ModelChange": "entries",
    "ObjectId": "objects",
    "Session": "session",
    "SessionInfo": "listing", "Store": "store", "open": "store",
    "push": "sync", "pull": "sync", "clone": "sync", "SyncReport": "sync",
}

#: submodules reachable as attributes (``castore.history.K``) without importing them first,
#: as when ``import castore`` loaded them all
_SUBMODULES = frozenset({
    "adapters", "aio", "cli", "context", "convert", "entries", "grep", "history", "html", "listing", "usage",
    "maintenance", "names", "objects", "objectstore", "plumbing", "redact", "refs", "revisions", "scrub", "session",
    "state",
    "storage", "store", "sync", "zdict",
})


def __getattr__(name: str) -> Any:
    """Import a public name (see ``_LAZY``) or a submodule on first use.

    Raises:
        AttributeError: castore has no such name.
    """
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'castore' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazy ones included."""
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "open",
    "Store",
    "Session",
    "SessionInfo",
    "LogEntry",
    "Context",
    "ObjectId",
    "Message",
    "Event",
    "Compaction",
    "BranchSummary",
    "ModelChange",
    "Custom",
    "DELETE",
    "CastoreError",
    "StorageError",
    "AccessDenied",
    "StoreNotFound",
    "FormatError",
    "ObjectNotFound",
    "IntegrityError",
    "SealedFrameError",
    "DamagedPack",
    "CorruptRef",
    "InvalidName",
    "InvalidEntry",
    "RefNotFound",
    "RefConflict",
    "RefLocked",
    "RefContended",
    "RetryPolicy",
    "RevisionNotFound",
    "AmbiguousRevision",
    "AmbiguousSession",
    "SessionNotFound",
    "SessionDeleting",
    "SessionExists",
    "BranchError",
    "AuditError",
    "EncryptionError",
    "KeyMissing",
    "NotPicklable",
    "WrongKey",
    "TenantErased",
    "push",
    "pull",
    "clone",
    "SyncReport",
    "__version__",
]
