"""A pytest plugin: the OpenAI Agents SDK's own session tests, with castore as ``SQLiteSession``.

Loaded into the SDK's test suite (``-p openai_agents_on_castore``, with this folder on
``PYTHONPATH``), it replaces ``SQLiteSession`` wherever the SDK exports it by
:class:`CastoreAsSQLite`, a :class:`~castore.adapters.openai_agents.CastoreSession` built from
``SQLiteSession``'s arguments; nothing else in the suite changes. docs/frameworks.md says how to
run it and what passes.

Where the SQLite database would be, castore puts a store:

* under ``$CASTORE_PEER_STORE`` when it is set (for instance an ``s3://bucket/prefix`` URL,
  with the endpoint and credentials in the usual ``AWS_*`` variables), else on local disk
  beside the database file, or in a ``memory://`` store for ``":memory:"``;
* ``":memory:"`` (the default) gets a fresh store per session object, private to it, as an
  in-memory SQLite database is; sessions naming one file share one store, as they share the
  database. The messages table's name is the castore app, so sessions on different tables
  stay apart, as they do in SQLite.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import agents
import agents.memory
import agents.memory.sqlite_session

from castore.adapters.openai_agents import CastoreSession


class CastoreAsSQLite(CastoreSession):
    """A castore session taking ``SQLiteSession``'s arguments (see the module docstring)."""

    def __init__(self, session_id: str, db_path: str | Path = ":memory:", sessions_table: str = "agent_sessions",
                 messages_table: str = "agent_messages", session_settings: Any = None) -> None:
        del sessions_table  # castore keeps a conversation's metadata with its refs
        base = os.environ.get("CASTORE_PEER_STORE", "").rstrip("/")
        if str(db_path) == ":memory:":
            place = f"memory-{uuid.uuid4().hex}"
            url = f"{base}/{place}" if base else f"memory://sqlite-{place}"
        else:
            resolved = Path(db_path).expanduser().resolve()
            url = f"{base}/{uuid.uuid5(uuid.NAMESPACE_URL, str(resolved)).hex}" if base else f"{resolved}.castore"
        super().__init__(session_id, url, app=messages_table, session_settings=session_settings)


for module in (agents, agents.memory, agents.memory.sqlite_session):
    module.SQLiteSession = CastoreAsSQLite  # type: ignore[attr-defined, misc]
