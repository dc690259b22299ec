"""LangGraph's savers through LangGraph's own API: a compiled graph, one checkpoint per step.

The graph has a ``messages`` channel (``add_messages``, or ``DeltaChannel(snapshot_frequency=50)``)
and two state keys (``turn``, ``topic``). Each step is one ``graph.update_state(config,
{"messages": [msg], "turn": i, "topic": t}, as_node="agent")``: exactly one checkpoint per
message, written by LangGraph itself with its reducers and serializer. Time travel is
``get_state`` at a past checkpoint, the full log ``get_state_history``, a fork
``update_state`` at the middle checkpoint (LangGraph's way to branch a thread).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from . import cold, fsize
from .systems import System
from .workload import Step

THREAD = {"configurable": {"thread_id": "bench"}}


def has_delta_channel() -> bool:
    """Whether this LangGraph has ``langgraph.channels.delta.DeltaChannel``."""
    try:
        from langgraph.channels.delta import DeltaChannel  # noqa: F401
    except ImportError:
        return False
    return True


class LangGraph(System):
    delta = False
    max_n = 1000
    max_n_reason = ("a full snapshot of the messages at every step: O(N²) bytes, about 100× the N = 1,000 "
                    "figure at 10,000 (tens of GB)")

    def __init__(self, workdir: str) -> None:
        super().__init__(workdir)
        self.g = cold.graph_module()
        from langchain_core.messages import AIMessage, HumanMessage

        self._cls = {"user": HumanMessage, "assistant": AIMessage}

    def _saver(self, fresh: bool) -> Any:
        raise NotImplementedError

    def start(self, n: int) -> None:
        super().start(n)
        self.saver = self._saver(fresh=True)
        self.graph = self.g["build_graph"](self.delta, self.saver)
        self.configs: list[dict[str, Any]] = []
        self._tip: dict[str, Any] | None = None

    def append(self, s: Step) -> None:
        msg = self._cls[s.role](content=s.content, id=f"m{s.i}")
        self.configs.append(self.graph.update_state(THREAD, {"messages": [msg], **s.delta}, as_node="agent"))

    def probe(self, s: Step, at_tip: bool) -> None:
        # after a fork the thread's latest checkpoint is the fork: extend the N-step one explicitly
        msg = self._cls[s.role](content=s.content, id=f"m{s.i}")
        if at_tip:
            tip = getattr(self, "_tip", None) or self.configs[-1]
            self._tip = self.graph.update_state(tip, {"messages": [msg], **s.delta}, as_node="agent")
        else:
            self.graph.update_state({"configurable": {"thread_id": "probe"}}, {"messages": [msg], **s.delta},
                                    as_node="agent")

    def _reader(self) -> Any:
        return self.g["build_graph"](self.delta, self._saver(fresh=False))

    def time_travel(self, mid: int) -> tuple[dict[str, Any], int]:
        st = self._reader().get_state(self.configs[mid])
        return dict(st.values), len(st.values["messages"])

    def full_log(self) -> int:
        return len(list(self._reader().get_state_history(THREAD)))

    def logical_bytes(self) -> int:
        """Bytes of the serialized checkpoints, metadata and writes the saver holds."""
        return self.sizes()[0] or 0

    def fork(self, mid: int, k: int) -> int:
        before = self.logical_bytes()
        self._reader().update_state(self.configs[mid], None)
        return self.logical_bytes() - before


class InMemory(LangGraph):
    """``InMemorySaver``: nothing on disk, nothing survives the process."""

    name = "LangGraph InMemorySaver"

    def _saver(self, fresh: bool) -> Any:
        if fresh:
            from langgraph.checkpoint.memory import InMemorySaver

            return InMemorySaver()
        return self.saver

    def sizes(self) -> tuple[int, None]:
        n = 0
        for nss in self.saver.storage.values():
            for cps in nss.values():
                for cp, md, _ in cps.values():
                    n += len(cp[1]) + len(md[1])
        for ws in self.saver.writes.values():
            n += sum(len(w[2][1]) for w in ws.values())
        return n + sum(len(b[1]) for b in self.saver.blobs.values()), None


class Sqlite(LangGraph):
    """``SqliteSaver`` on a file with its defaults (WAL, synchronous=FULL: durable)."""

    name = "LangGraph SqliteSaver"

    def start(self, n: int) -> None:
        self.db = os.path.join(self.workdir, f"{type(self).__name__.lower()}-{n}.sqlite")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.db + suffix):
                os.remove(self.db + suffix)
        self._conns: list[sqlite3.Connection] = []
        super().start(n)

    def _saver(self, fresh: bool) -> Any:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(self.db, check_same_thread=False)
        self._conns.append(conn)
        return SqliteSaver(conn)

    def sizes(self) -> tuple[int, int]:
        return fsize.files([self.db, self.db + "-wal"])

    def logical_bytes(self) -> int:
        # The file sizes do not move when SQLite reuses free pages or the WAL: count the rows' bytes.
        conn = sqlite3.connect(self.db)
        try:
            a = conn.execute(
                "SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM checkpoints").fetchone()
            b = conn.execute("SELECT coalesce(sum(length(value)), 0) FROM writes").fetchone()
        finally:
            conn.close()
        return int(a[0]) + int(b[0])

    def cold_args(self) -> tuple[str, list[str]]:
        return cold.LANGGRAPH, [self.db, "1" if self.delta else "0"]

    def cleanup(self) -> None:
        for c in self._conns:
            c.close()
        self._conns.clear()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(self.db + suffix):
                os.remove(self.db + suffix)


class Delta(Sqlite):
    """``DeltaChannel(snapshot_frequency=50)`` for ``messages``, on ``SqliteSaver`` (durable)."""

    name = "LangGraph DeltaChannel(50)"
    delta = True
    max_n_reason = ("a full snapshot of the messages every 50 steps: O(N²/50) bytes, about 100× the "
                    "N = 1,000 figure at 10,000 (over a GB), and hours of appends at this cost per step")
