"""A pytest plugin: LangGraph's own saver tests, with castore as ``InMemorySaver``.

Loaded into langgraph-checkpoint's test suite (``-p langgraph_on_castore``, with this folder on
``PYTHONPATH``), it replaces ``langgraph.checkpoint.memory.InMemorySaver`` (and its older name
``MemorySaver``) by :class:`CastoreAsInMemory`, a
:class:`~castore.adapters.langgraph.CastoreSaver` built from ``InMemorySaver``'s arguments;
nothing else in the suite changes. docs/frameworks.md says how to run it and what passes.

Each saver gets a store of its own, as each ``InMemorySaver`` has its own dicts: under
``$CASTORE_PEER_STORE`` when it is set (for instance an ``s3://bucket/prefix`` URL, with the
endpoint and credentials in the usual ``AWS_*`` variables), else in a ``memory://`` store.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import langgraph.checkpoint.memory

import castore
from castore.adapters.langgraph import CastoreSaver


class CastoreAsInMemory(CastoreSaver):
    """A castore saver taking ``InMemorySaver``'s arguments (see the module docstring)."""

    def __init__(self, *, serde: Any = None, factory: Any = None) -> None:
        del factory  # InMemorySaver's choice of dict; castore keeps threads in the store
        base = os.environ.get("CASTORE_PEER_STORE", "").rstrip("/")
        place = f"saver-{uuid.uuid4().hex}"
        super().__init__(castore.open(f"{base}/{place}" if base else f"memory://{place}"), serde=serde)


langgraph.checkpoint.memory.InMemorySaver = CastoreAsInMemory  # type: ignore[misc]
langgraph.checkpoint.memory.MemorySaver = CastoreAsInMemory  # type: ignore[misc]
