"""Profile: where CastoreSaver's CPU goes per LangGraph turn (one thread, one ~500-byte message
per turn, durable local store, as ``bench_langgraph.py --workload race``).

Runs ``--warm`` turns, then ``--turns`` measured turns, and prints per turn: the process CPU
and wall time; the saver's own CPU (thread CPU time inside ``put``, ``put_writes``,
``get_tuple``); the split of the group commit (staging, the objects record, the ref swaps and,
inside them, the journal append, and the kernel CPU of its ``fdatasync``); and syncs per turn.
Thread CPU time, not wall time: a thread waiting for the GIL or a lock is not counted.

    PYTHONPATH=$PWD .venv/bin/python scripts/profile_langgraph_saver.py
    PYTHONPATH=$PWD .venv/bin/python scripts/profile_langgraph_saver.py --cprofile tottime

``--cprofile KEY`` also profiles every saver call (one cProfile per thread, merged) and prints
the top functions sorted by KEY; cProfile's overhead inflates the figures above.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_langgraph import message_text as text  # the bench's own turns (scripts/ is on sys.path)
from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import castore
from castore.adapters import langgraph as lg
from castore.groupcommit import GroupCommit
from castore.objectstore.packlog import WriterLog
from castore.plumbing import Plumbing
from castore.refs import RefStore

THREAD = {"configurable": {"thread_id": "profile"}}
cpu: dict[str, float] = {}
syncs = [0]
profiles: list[cProfile.Profile] = []
_local = threading.local()


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    turn: int


def agent(state: dict[str, Any]) -> dict[str, Any]:
    i = state["turn"]
    return {"messages": [AIMessage(content=text(i), id=f"ai-{i}")]}


def timed(f: Callable[..., Any], key: str, profile: bool = False) -> Callable[..., Any]:
    """``f`` adding its thread CPU time to ``cpu[key]`` (and profiled per thread if asked)."""
    def w(*a: Any, **k: Any) -> Any:
        p = None
        if profile:
            p = getattr(_local, "p", None)
            if p is None:
                p = _local.p = cProfile.Profile()
                profiles.append(p)
            p.enable()
        t = time.thread_time()
        try:
            return f(*a, **k)
        finally:
            cpu[key] = cpu.get(key, 0.0) + time.thread_time() - t
            if p is not None:
                p.disable()
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--warm", type=int, default=20)
    ap.add_argument("--format", type=int, default=3)
    ap.add_argument("--cprofile", metavar="KEY", help="also cProfile the saver's calls, sorted by KEY")
    args = ap.parse_args()

    fdatasync = os.fdatasync

    def counted(fd: int) -> None:
        syncs[0] += 1
        t = time.thread_time()
        try:
            fdatasync(fd)
        finally:
            cpu["fdatasync"] = cpu.get("fdatasync", 0.0) + time.thread_time() - t

    os.fdatasync = counted
    for cls, name, key in ((GroupCommit, "_commit_group", "group commit"),
                           (Plumbing, "write_many", "  objects record"),
                           (RefStore, "swap_many", "  ref swaps"),
                           (RefStore, "swap", "  ref swaps"),  # a group of one ref
                           (WriterLog, "journal_many", "    journal append")):
        setattr(cls, name, timed(getattr(cls, name), key))

    with tempfile.TemporaryDirectory() as root:
        store = castore.open(os.path.join(root, "store"), durable=True, format=args.format)
        saver = lg.CastoreSaver(store)
        b = StateGraph(State)
        b.add_node("agent", agent)
        b.add_edge(START, "agent")
        b.add_edge("agent", END)
        graph = b.compile(checkpointer=saver)
        for i in range(1, args.warm + 1):
            graph.invoke({"turn": i}, THREAD)
        for m in ("put", "put_writes", "get_tuple"):
            setattr(saver, m, timed(getattr(saver, m), m, bool(args.cprofile)))
        cpu.clear()
        syncs[0] = 0
        n = args.turns
        c0, w0 = time.process_time(), time.perf_counter()
        for i in range(args.warm + 1, args.warm + n + 1):
            graph.invoke({"turn": i}, THREAD)
        c1, w1 = time.process_time(), time.perf_counter()
        store.close()

    print(f"{n} turns after {args.warm}, format {args.format}, load average {os.getloadavg()[0]:.2f}")
    print(f"process CPU {(c1 - c0) / n * 1e3:.3f} ms/turn, wall {(w1 - w0) / n * 1e3:.3f} ms/turn, "
          f"{syncs[0] / n:.2f} fdatasync/turn")
    saver_cpu = sum(cpu.get(m, 0.0) for m in ("put", "put_writes", "get_tuple"))
    print(f"saver CPU {saver_cpu / n * 1e3:.3f} ms/turn:")
    for key in ("put", "put_writes", "get_tuple", "group commit", "  objects record", "  ref swaps",
                "    journal append", "fdatasync"):
        print(f"  {key:<20} {cpu.get(key, 0.0) / n * 1e3:7.3f} ms")
    staging = cpu.get("group commit", 0.0) - cpu.get("  objects record", 0.0) - cpu.get("  ref swaps", 0.0)
    print(f"  {'  staging and rest':<20} {staging / n * 1e3:7.3f} ms")
    if args.cprofile:
        st = pstats.Stats(*profiles)
        st.sort_stats(args.cprofile).print_stats(40)


if __name__ == "__main__":
    main()
