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

    errors, names, aio                  errors, safe names, async helpers
    storage                             bytes by URL (local disk, memory, S3, other fsspec URLs)
    objects, zdict, packs, objectstore, refs  the object format, packs, their store, refs and CAS
    history, state, entries             paths, state trees, entry types
    branches, revisions                 the one write path (plumbing); revisions as typed
    context                             the model's view of a path (pure)
    session, store                      what an agent calls
    sync, maintenance, grep, grepindex  push/pull, fsck/gc, search across sessions
    adapters, html                      LangGraph, Pi, ADK, OpenAI Agents; the viewer
    cli, __main__                       the ``castore`` command
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .branches import RefContended, RetryPolicy
from .context import Context
from .entries import (
    DELETE,
    BranchSummary,
    Compaction,
    Custom,
    Event,
    LogEntry,
    Message,
    ModelChange,
)
from .errors import (
    AmbiguousRevision,
    AuditError,
    BranchError,
    CastoreError,
    CorruptRef,
    FormatError,
    IntegrityError,
    InvalidEntry,
    InvalidName,
    ObjectNotFound,
    RefConflict,
    RefLocked,
    RefNotFound,
    RevisionNotFound,
    SessionExists,
    SessionNotFound,
    StorageError,
    StoreNotFound,
)
from .objects import ObjectId
from .session import Session
from .store import SessionInfo, Store, open  # noqa: A004 - castore.open() is the entry point, as io.open

if TYPE_CHECKING:
    from .sync import SyncReport, clone, pull, push

__version__ = "0.1.0"

#: names imported on first use (``castore.push``...): sync pulls in a thread pool, and
#: ``import castore`` stays fast for an agent that only appends
_LAZY = {"push": "sync", "pull": "sync", "clone": "sync", "SyncReport": "sync"}


def __getattr__(name: str) -> Any:
    """Import the sync entry points on first use (see ``_LAZY``)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'castore' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


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
    "StoreNotFound",
    "FormatError",
    "ObjectNotFound",
    "IntegrityError",
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
    "SessionNotFound",
    "SessionExists",
    "BranchError",
    "AuditError",
    "push",
    "pull",
    "clone",
    "SyncReport",
    "__version__",
]
