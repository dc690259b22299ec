"""castore: agent session history stored the way git stores code.

Start here::

    import castore

    store = castore.open()                      # ./.castore, or $CASTORE_STORE, or a URL
    s = store.session("weather-app", "alice", "s1")
    s.append(castore.Message(role="user", content="Weather in Beijing?"))
    s.messages()                                # the linear view
    s.branch("retry", at="HEAD~1"); s.checkout("retry")

Where things are (each layer imports only the ones below it):

* :mod:`castore.storage` - bytes by URL (local disk, memory, S3, other fsspec URLs)
* :mod:`castore.objects`, :mod:`castore.objectstore` - the object format and its store
* :mod:`castore.refs` - refs and compare-and-swap; :mod:`castore.names` - safe names
* :mod:`castore.history`, :mod:`castore.state` - paths, revisions, state trees
* :mod:`castore.store`, :mod:`castore.session` - what an agent calls
* :mod:`castore.context` - the model's view of a path (pure)
* :mod:`castore.sync`, :mod:`castore.maintenance` - push/pull, fsck/gc
* :mod:`castore.adapters` - LangGraph, Pi, ADK, OpenAI Agents (optional extras)
* :mod:`castore.cli` - the ``castore`` command
"""

from __future__ import annotations

from .entries import (
    DELETE,
    BranchSummary,
    Compaction,
    Custom,
    Event,
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
from .session import LogEntry, Session
from .store import SessionInfo, Store, open

__version__ = "0.1.0"

__all__ = [
    "open",
    "Store",
    "Session",
    "SessionInfo",
    "LogEntry",
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
    "RevisionNotFound",
    "AmbiguousRevision",
    "SessionNotFound",
    "SessionExists",
    "BranchError",
    "AuditError",
    "__version__",
]
