"""Benchmark: one LangGraph thread, one ~500-byte message per turn, on several checkpointers.

Savers, in one run: InMemorySaver, SqliteSaver (file on disk), InMemorySaver with the
``messages`` channel as ``DeltaChannel(snapshot_frequency=50)``, and CastoreSaver on local
disk (durable, and with ``durable=False``). One thread grows to each N in turn; at each N
we record the stored bytes (InMemorySaver: the serialized bytes it holds; SqliteSaver: the
database files; castore: the object files), the median wall time of the turns since the
previous N, ``get_state``, the full ``get_state_history``, and the saver's own ``list()``
over the whole thread. Prints a markdown table with ratios to castore, then the targets.

A second workload has messages that do not compress well (500 characters of base64 of
random bytes): DeltaChannel(50) and castore (durable) only, bytes and per-turn time (no
history or list, which the first workload measures). castore's bytes are measured once its
background repack is done (the bytes at rest).

    python scripts/bench_langgraph.py            # N = 100, 200, 400, 800, 1600, every workload
    python scripts/bench_langgraph.py --quick    # N = 100, 200, 400
    python scripts/bench_langgraph.py --reads-max 800 --markdown docs/benchmarks/BENCHMARKS-langgraph.md   # the page
    python scripts/bench_langgraph.py --workload noisy   # only the second workload
    python scripts/bench_langgraph.py --workload race    # per-turn time only, turns alternated

The default workloads run one saver after another, so a change of machine load between them
shows up as a difference between savers. ``--workload race`` measures only the per-turn time
of SqliteSaver and castore (durable, format 2 and format 3) with their turns interleaved: turn
i of every saver before turn i + 1 of any, the order rotated each turn, so all three see the
same load. It reports the median per window of N and the ratio to SqliteSaver. ``all`` (the
default) runs the three workloads one after another; ``--markdown FILE`` also writes their
tables, with the command, the commit, the time, the machine and its load, as a Markdown page.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypedDict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from langchain_core.messages import AIMessage, AnyMessage  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

import castore  # noqa: E402
from castore.adapters.langgraph import CastoreSaver  # noqa: E402

try:
    from langgraph.channels.delta import DeltaChannel
except ImportError:  # older LangGraph
    DeltaChannel = None  # type: ignore[assignment,misc]

WORDS = ("the agent called the weather tool for Beijing and got a forecast of light rain with "
         "temperatures between twelve and eighteen degrees so it suggested an umbrella").split()
THREAD = {"configurable": {"thread_id": "bench"}}


def message_text(i: int) -> str:
    rng = random.Random(i)
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < 500:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:500]


def noisy_text(i: int) -> str:
    """500 characters that do not compress well: base64 of random bytes (6 bits per character)."""
    return base64.b64encode(random.Random(i).randbytes(375)).decode()


TEXTS: dict[str, Callable[[int], str]] = {"text": message_text, "noisy": noisy_text}
_text = message_text  # the workload being run


def use_text(kind: str) -> None:
    """Make the graph's agent write the messages of workload ``kind`` (a key of :data:`TEXTS`)."""
    global _text
    _text = TEXTS[kind]


def agent(state: dict[str, Any]) -> dict[str, Any]:
    i = state["turn"]
    return {"messages": [AIMessage(content=_text(i), id=f"ai-{i}")]}


def delta_reducer(state: list[Any], writes: Sequence[Any]) -> list[Any]:
    """add_messages over a batch of writes (DeltaChannel's reducer shape)."""
    out = list(state)
    for w in writes:
        out = add_messages(out, w)
    return out


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    turn: int


if DeltaChannel is not None:
    class DeltaState(TypedDict, total=False):
        messages: Annotated[list[AnyMessage], DeltaChannel(delta_reducer, snapshot_frequency=50)]
        turn: int


def build(delta: bool) -> StateGraph:
    b = StateGraph(DeltaState if delta else State)
    b.add_node("agent", agent)
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    return b


def memory_bytes(saver: InMemorySaver) -> int:
    n = 0
    for nss in saver.storage.values():
        for cps in nss.values():
            for cp, md, _ in cps.values():
                n += len(cp[1]) + len(md[1])
    for ws in saver.writes.values():
        n += sum(len(w[2][1]) for w in ws.values())
    return n + sum(len(b[1]) for b in saver.blobs.values())


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def sqlite_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def castore_bytes(store: castore.Store, path: str) -> int:
    """Bytes of a local store's objects and packs, once its background repack is done."""
    store.objects.wait_repack()
    packs = os.path.join(path, "packs")
    return dir_bytes(os.path.join(path, "objects")) + (dir_bytes(packs) if os.path.isdir(packs) else 0)


def run(name: str, saver: Any, size: Callable[[], int], delta: bool, marks: list[int],
        reads: bool | int = True) -> dict[int, dict[str, float]]:
    """Grow one thread through ``marks`` and measure at each (``reads``: also get_state,
    get_state_history and list(); a number: only up to that N)."""
    g = build(delta).compile(checkpointer=saver)
    out: dict[int, dict[str, float]] = {}
    turn_times: list[float] = []
    done = 0
    for n in marks:
        for i in range(done + 1, n + 1):
            t = time.perf_counter()
            g.invoke({"turn": i}, THREAD)
            turn_times.append(time.perf_counter() - t)
        done = n
        since = turn_times[-(n - (marks[marks.index(n) - 1] if marks.index(n) else 0)):]
        if reads is False or (reads is not True and n > reads):
            out[n] = {"bytes": size(), "turn": statistics.median(since)}
            print(f"  {name:<22} N={n:<5} {out[n]['bytes'] / 1e6:9.2f} MB  turn {out[n]['turn'] * 1e3:7.2f} ms",
                  file=sys.stderr, flush=True)
            continue
        t = time.perf_counter()
        state = g.get_state(THREAD)
        t_state = time.perf_counter() - t
        assert len(state.values["messages"]) == n, (name, len(state.values["messages"]))
        t = time.perf_counter()
        hist = list(g.get_state_history(THREAD))
        t_hist = time.perf_counter() - t
        t = time.perf_counter()
        listed = list(saver.list(THREAD))
        t_list = time.perf_counter() - t
        assert len(listed) == len(hist)
        out[n] = {"bytes": size(), "turn": statistics.median(since), "get_state": t_state,
                  "history": t_hist, "list": t_list, "checkpoints": len(hist)}
        print(f"  {name:<22} N={n:<5} {out[n]['bytes'] / 1e6:9.2f} MB  turn {out[n]['turn'] * 1e3:7.2f} ms  "
              f"history {t_hist:7.3f} s  list {t_list:7.3f} s", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 100, 200, 400 only")
    ap.add_argument("--dir", help="where to put the on-disk stores (default: a temporary folder)")
    ap.add_argument("--format", type=int, default=3, choices=(1, 2, 3),
                    help="castore's storage format in the text and noisy workloads (default 3, the default of "
                         "new stores on local disk: one fsync per append; 2: packs, three)")
    ap.add_argument("--reads-max", type=int, default=None, metavar="N",
                    help="measure the other savers' get_state, get_state_history and list() only up to N "
                         "(they grow with N squared: InMemorySaver's and SqliteSaver's take minutes at 1,600 on "
                         "a loaded machine); castore's are always measured")
    ap.add_argument("--workload", choices=("all", "text", "noisy", "race"), default="all",
                    help="text: every saver on compressible messages; noisy: DeltaChannel(50) and castore "
                         "on messages that do not compress well; race: per-turn time of SqliteSaver and castore "
                         "(formats 2 and 3) with turns interleaved; all (the default): the three")
    ap.add_argument("--markdown", metavar="FILE", help="also write the tables to FILE as a Markdown page")
    args = ap.parse_args()
    marks = [100, 200, 400] if args.quick else [100, 200, 400, 800, 1600]
    root = args.dir or tempfile.mkdtemp(prefix="bench-langgraph-")
    os.makedirs(root, exist_ok=True)
    if not args.markdown:
        workloads(args, root, marks)
        return
    started, load0 = time.strftime("%Y-%m-%d %H:%M", time.gmtime()), os.getloadavg()
    t0 = time.perf_counter()
    tables = io.StringIO()
    with contextlib.redirect_stdout(Tee(sys.stdout, tables)):
        workloads(args, root, marks)
    page(args.markdown, " ".join(["scripts/bench_langgraph.py", *sys.argv[1:]]), started,
         time.perf_counter() - t0, (load0, os.getloadavg()), args.format, tables.getvalue())


class Tee(io.TextIOBase):
    """A text stream writing to each of its streams."""

    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, s: str) -> int:
        for stream in self.streams:
            stream.write(s)
        return len(s)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def page(path: str, command: str, started: str, seconds: float, loads: tuple[tuple[float, ...], ...],
         fmt: int, tables: str) -> None:
    """Write docs/benchmarks/BENCHMARKS-langgraph.md's page of one run to ``path``: what was run, on what, then
    the tables and targets the run printed."""
    sys.path.insert(0, HERE)
    from benchlib.machine import cpu_model, versions

    def git(*a: str) -> str:
        p = subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else "unknown"

    commit = git("rev-parse", "--short", "HEAD") + (" plus uncommitted changes" if git("status", "--porcelain",
                                                                                        "--", "castore") else "")
    vers = ", ".join(f"{k} {v}" for k, v in versions().items())
    out = ["# LangGraph saver benchmark", "",
           f"Written by `{command}` at commit {commit}, {started} UTC, {seconds / 60:.1f} min; castore's "
           f"stores in format {fmt} in the first two tables (the race has formats 2 and 3 side by side). "
           f"Machine: {os.cpu_count()} CPUs ({cpu_model()}); load average (1, 5, 15 min) "
           + " before, ".join(", ".join(f"{v:.2f}" for v in x) for x in loads) + " after. " + vers + ".", "",
           "The first table runs one saver after another (a change of load between them shows up as a "
           "difference between savers); the race interleaves the turns of SqliteSaver and castore, so "
           "that all see the same load: it is the figure for \"per turn at or below SqliteSaver's\". "
           "Bytes: InMemorySaver's serialized bytes, SqliteSaver's database files, castore's files at rest "
           "(after its background repack).", "", tables.strip(), ""]
    with open(path, "w") as f:
        f.write("\n".join(out))


def workloads(args: argparse.Namespace, root: str, marks: list[int]) -> None:
    """Run the workloads ``args.workload`` names, printing their tables."""
    global _text
    if args.workload in ("all", "text"):
        text_workload(root, marks, args.format, True if args.reads_max is None else args.reads_max)
    if args.workload in ("all", "noisy"):
        if DeltaChannel is None:
            print("DeltaChannel is not in this LangGraph version: no noisy workload", file=sys.stderr)
        else:
            _text = noisy_text
            noisy_workload(os.path.join(root, "noisy"), marks, args.format)
    if args.workload in ("all", "race"):
        _text = message_text
        race_workload(os.path.join(root, "race"), marks)


def text_workload(root: str, marks: list[int], fmt: int, reads: bool | int = True) -> None:
    """Every saver, compressible ~500-byte messages: the table and the targets (``reads``: up
    to which N the other savers' reads are measured)."""
    results: dict[str, dict[int, dict[str, float]]] = {}
    mem = InMemorySaver()
    results["InMemorySaver"] = run("InMemorySaver", mem, lambda: memory_bytes(mem), False, marks, reads)
    db = os.path.join(root, "checkpoints.sqlite")
    lite = SqliteSaver(sqlite3.connect(db, check_same_thread=False))
    results["SqliteSaver"] = run("SqliteSaver", lite, lambda: sqlite_bytes(db), False, marks, reads)
    if DeltaChannel is not None:
        dmem = InMemorySaver()
        results["DeltaChannel(50)"] = run("DeltaChannel(50)", dmem, lambda: memory_bytes(dmem), True, marks, reads)
    else:
        print("DeltaChannel is not in this LangGraph version: row left out", file=sys.stderr)
    for label, durable in (("castore", True), ("castore durable=False", False)):
        path = os.path.join(root, label.replace(" ", "-").replace("=", ""))
        store = castore.open(path, durable=durable, format=fmt)
        results[label] = run(label, CastoreSaver(store), lambda s=store, p=path: castore_bytes(s, p), False, marks)
        store.close()

    base = results["castore"]
    print(f"\nOne thread, one ~500-byte message per turn; ratios are saver / castore (durable). "
          f"Raw payload: {marks[-1] * 500 / 1e6:.2f} MB at N={marks[-1]}.\n")
    print("| saver | N | stored MB | x | median ms/turn | x | get_state ms | x | get_state_history s | x "
          "| list() s | x |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        for n, r in rows.items():
            b = base[n]
            if "history" in r:
                got = (f"{r['get_state'] * 1e3:.2f} | {r['get_state'] / b['get_state']:.2f} | "
                       f"{r['history']:.3f} | {r['history'] / b['history']:.2f} | {r['list']:.3f} | "
                       f"{r['list'] / b['list']:.2f}")
            else:
                got = "- | - | - | - | - | -"
            print(f"| {name} | {n} | {r['bytes'] / 1e6:.2f} | {r['bytes'] / b['bytes']:.1f} | {r['turn'] * 1e3:.2f} | "
                  f"{r['turn'] / b['turn']:.2f} | {got} |")
    targets(results, marks)


def race_workload(root: str, marks: list[int]) -> None:
    """Per-turn time of SqliteSaver and castore (durable; formats 2 and 3), turns interleaved
    so that every saver sees the same machine load: the fair test of "per turn at or below
    SqliteSaver's"."""
    os.makedirs(root, exist_ok=True)
    db = os.path.join(root, "race.sqlite")
    conn = sqlite3.connect(db, check_same_thread=False)
    stores = {f: castore.open(os.path.join(root, f"race-format{f}"), durable=True, format=f) for f in (2, 3)}
    graphs: dict[str, Any] = {"SqliteSaver": build(False).compile(checkpointer=SqliteSaver(conn))}
    for f, store in stores.items():
        graphs[f"castore format {f}"] = build(False).compile(checkpointer=CastoreSaver(store))
    names = list(graphs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(1, marks[-1] + 1):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            t = time.perf_counter()
            graphs[name].invoke({"turn": i}, THREAD)
            times[name].append(time.perf_counter() - t)
        if i in marks:
            lo = marks[marks.index(i) - 1] if marks.index(i) else 0
            print(f"  N={i:<5} " + "  ".join(f"{name} {statistics.median(ts[lo:i]) * 1e3:7.2f} ms"
                                            for name, ts in times.items()), file=sys.stderr, flush=True)
    for name, g in graphs.items():
        assert len(g.get_state(THREAD).values["messages"]) == marks[-1], name
    for store in stores.values():
        store.close()
    conn.close()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print("\nOne thread, one ~500-byte message per turn, durable savers, turns interleaved "
          f"(load average {load:.2f} at the end). Median ms per turn over the turns since the previous N; "
          "x = saver / SqliteSaver.\n")
    print("| N | " + " | ".join(f"{name} ms | x" for name in names) + " |")
    print("|---|" + "---|---|" * len(names))
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for n in marks:
        lo = marks[marks.index(n) - 1] if marks.index(n) else 0
        med = {name: statistics.median(ts[lo:n]) for name, ts in times.items()}
        cells = []
        for name in names:
            ratios[name].append(med[name] / med["SqliteSaver"])
            cells.append(f"{med[name] * 1e3:.2f} | {med[name] / med['SqliteSaver']:.2f}")
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\nTargets:")
    for name in names[1:]:
        slow = [n for n, r in zip(marks, ratios[name], strict=True) if r > 1]
        print(f"- {name} per turn at or below SqliteSaver's: {', '.join(f'{r:.2f}' for r in ratios[name])} -> "
              f"{'met' if not slow else f'NOT met at N={slow}'}")


def noisy_workload(root: str, marks: list[int], fmt: int) -> None:
    """DeltaChannel(50) and castore (durable) on messages that do not compress well."""
    os.makedirs(root, exist_ok=True)
    results: dict[str, dict[int, dict[str, float]]] = {}
    dmem = InMemorySaver()
    results["DeltaChannel(50)"] = run("DeltaChannel(50) noisy", dmem, lambda: memory_bytes(dmem), True, marks,
                                      reads=False)
    path = os.path.join(root, "castore")
    store = castore.open(path, durable=True, format=fmt)
    results["castore"] = run("castore noisy", CastoreSaver(store), lambda: castore_bytes(store, path), False,
                             marks, reads=False)
    store.close()
    c, delta = results["castore"], results["DeltaChannel(50)"]
    print("\nMessages that do not compress well (500 characters of base64 of random bytes); "
          "castore durable, bytes after its background repack.\n")
    print("| N | DeltaChannel(50) MB | castore MB | castore / delta | DeltaChannel(50) ms/turn | castore ms/turn |")
    print("|---|---|---|---|---|---|")
    for n in marks:
        print(f"| {n} | {delta[n]['bytes'] / 1e6:.2f} | {c[n]['bytes'] / 1e6:.2f} | "
              f"{c[n]['bytes'] / delta[n]['bytes']:.2f} | {delta[n]['turn'] * 1e3:.2f} | {c[n]['turn'] * 1e3:.2f} |")
    big = [n for n in marks if n >= 800] or [marks[-1]]
    ratios = [c[n]["bytes"] / delta[n]["bytes"] for n in big]
    print(f"\nTargets:\n- noisy messages: bytes below 1/3 of DeltaChannel's from N=800 (castore/delta at N={big}): "
          f"{', '.join(f'{r:.2f}' for r in ratios)} -> {'met' if max(ratios) < 1 / 3 else 'NOT met'}")


def targets(results: dict[str, dict[int, dict[str, float]]], marks: list[int]) -> None:
    c, mem, lite = results["castore"], results["InMemorySaver"], results["SqliteSaver"]
    delta = results.get("DeltaChannel(50)")
    growth = [c[b]["bytes"] / c[a]["bytes"] for a, b in zip(marks, marks[1:], strict=False)]
    print("\nTargets:")
    print(f"- bytes grow linearly (x per doubling of N <= ~2): {', '.join(f'{g:.2f}' for g in growth)} -> "
          f"{'met' if max(growth) <= 2.1 else 'NOT met'}")
    if delta is not None:
        big = [n for n in marks if n >= 800] or [marks[-1]]
        ratios = [c[n]["bytes"] / delta[n]["bytes"] for n in big]
        print(f"- bytes below 1/3 of DeltaChannel's from N=800 (castore/delta at N={big}): "
              f"{', '.join(f'{r:.2f}' for r in ratios)} -> {'met' if max(ratios) < 1 / 3 else 'NOT met'}")
    turn = [c[n]["turn"] * 1e3 for n in marks]
    print(f"- per-turn ms does not grow with N: {', '.join(f'{t:.1f}' for t in turn)} -> "
          f"{'met' if turn[-1] <= 1.5 * turn[0] else 'NOT met'}")
    slow = [n for n in marks if c[n]["turn"] >= lite[n]["turn"]]
    vs_lite = ", ".join(f"{c[n]['turn'] / lite[n]['turn']:.2f}" for n in marks)
    print(f"- per-turn below SqliteSaver's: castore/sqlite = {vs_lite} -> "
          f"{'met' if not slow else f'NOT met at N={slow}'}")
    nd = results["castore durable=False"]
    nd_lite = ", ".join(f"{nd[n]['turn'] / lite[n]['turn']:.2f}" for n in marks)
    print(f"  (castore durable=False / sqlite = {nd_lite})")
    n800 = 800 if 800 in marks else marks[-1]
    if "list" not in mem[n800]:
        print(f"- list() at N={n800}: not measured (--reads-max)")
        return
    speed = mem[n800]["list"] / c[n800]["list"]
    print(f"- list() at N={n800} at least 5x faster than InMemorySaver's: {speed:.1f}x -> "
          f"{'met' if speed >= 5 else 'NOT met'}")
    have = [n for n in marks if "history" in mem[n]]
    worse = [n for n in have if c[n]["history"] > mem[n]["history"]]
    hist = ", ".join(f"{mem[n]['history'] / c[n]['history']:.1f}" for n in have)
    print(f"- get_state_history never slower than InMemorySaver's: InMemory/castore at N={have} = {hist} -> "
          f"{'met' if not worse else f'NOT met at N={worse}'}")


if __name__ == "__main__":
    main()
