"""The turn: what an agent reads every turn, at 100, 10,000 and 100,000 entries.

Per N, one castore store holds the session (the workload's steps as messages), the same
conversation as an OpenAI Agents session and as an ADK session, and (up to 10,000) a
LangGraph thread of N checkpoints; beside it, Pi's JSONL of the same messages. Each read
is timed

- on a fresh handle: the store opened, the call made (the open is part of it: it is what a
  new process or request pays), the store closed;
- on a warm handle that appended one message since its last call (the append not timed);

first with no other process, then beside a live writer: another process that appended to
another session of the same store and holds its writer log open (unsealed). Last, the turn
itself: the budgeted context and a durable append, on a fresh handle (opened, read,
appended, closed: the close seals its writer's log) and on a warm one (so after those
reads: the fresh turns leave a small pack each, as a process per turn does).

Stores are built once per N and copied for each run; the 100,000-entry one is kept in a
cache folder between runs (``$CASTORE_BENCH_CACHE``, default ``~/.cache/castore-bench``),
keyed by the castore source, so only its first run pays the build (a few minutes).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import cold
from .units import ms, times
from .workload import pi_line, step

APP, USER = "bench", "u"
BUDGET = 8000  # context(max_tokens=...)
LOG_N = 20  # log -n
NEWEST_K = 100  # the newest k entries
ADAPTER_N = 20  # get_items(limit), num_recent_events
LANGGRAPH_MAX = 10_000  # N checkpoints through the saver take too long to build beyond
BUILD_BATCH = 500
REPO = Path(__file__).resolve().parents[2]

READS = [
    ("context", f"`context(max_tokens={BUDGET:,})`"),
    ("log", f"`log(limit={LOG_N})`"),
    ("newest", f"newest {NEWEST_K} entries (`log(limit={NEWEST_K})`)"),
    ("openai", f"OpenAI Agents `get_items(limit={ADAPTER_N})`"),
    ("adk", f"ADK `get_session(num_recent_events={ADAPTER_N})`"),
    ("langgraph", "LangGraph saver `get_tuple`"),
]
ADAPTER_READS = ("openai", "adk", "langgraph")
#: the turn: the per-turn read and a durable append (timed together)
TURN = ("turn", f"the turn: `context(max_tokens={BUDGET:,})` + durable `append`")

LIVE_WRITER = r"""
import sys, castore
st = castore.open(sys.argv[1])
s = st.session("bench", "u", "live-writer")
for i in range(int(sys.argv[2])):
    s.append(castore.Message(role="user", content="live writer entry %d " % i * 8))
print("ready", flush=True)
sys.stdin.readline()  # held open until the parent is done: its writer log stays unsealed
"""


def source_key() -> str:
    """A digest of castore's source: a cached store is rebuilt when the code that wrote it changed."""
    h = hashlib.sha256()
    for p in sorted((REPO / "castore").rglob("*.py")):
        h.update(p.relative_to(REPO).as_posix().encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(path: str, n: int, batch: int = BUILD_BATCH) -> None:
    """A store at ``path`` holding the N-entry sessions every read below reads, each session
    written ``batch`` entries per ``append_many`` (1: turn by turn, as an agent appends)."""
    import castore
    from castore.adapters.openai_agents import item_to_entry

    with castore.open(path, durable=batch >= BUILD_BATCH) as st:
        s = st.session(APP, USER, "turn")
        oa = st.session("openai-agents", "default", "turn")
        for lo in range(0, n, batch):
            steps = [step(i) for i in range(lo, min(n, lo + batch))]
            s.append_many([castore.Message(role=x.role, content=x.content) for x in steps])
            oa.append_many([item_to_entry({"role": x.role, "content": x.content}) for x in steps])
        _build_adk(st, n, batch)
        if n <= LANGGRAPH_MAX:
            _build_langgraph(st, n)


def _build_adk(st: Any, n: int, batch: int = BUILD_BATCH) -> None:
    from google.adk.events import Event as AdkEvent
    from google.genai import types

    from castore.adapters.adk import event_to_entry

    s = st.session(APP, USER, "adk-turn")
    s.append(castore_custom_creation())
    for lo in range(0, n, batch):
        evs = [AdkEvent(author="user" if i % 2 == 0 else "model", invocation_id=f"i{i}",
                        content=types.Content(role="user" if i % 2 == 0 else "model",
                                              parts=[types.Part(text=step(i).content)]))
               for i in range(lo, min(n, lo + batch))]
        s.append_many([event_to_entry(e) for e in evs])


def castore_custom_creation() -> Any:
    """The entry ADK's create_session writes first (the session's creation)."""
    import castore

    return castore.Custom("adk.session", {})


def _build_langgraph(st: Any, n: int) -> None:
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    from castore.adapters.langgraph import CastoreSaver

    saver = CastoreSaver(st)
    cfg: dict[str, Any] = {"configurable": {"thread_id": "turn", "checkpoint_ns": ""}}
    ck = empty_checkpoint()
    for i in range(n):
        ck = create_checkpoint(ck, None, i)
        ck["channel_values"] = {"turn": i, "last": step(i).content}
        ck["channel_versions"] = {"turn": i + 1, "last": i + 1}
        cfg = saver.put(cfg, ck, {"step": i, "source": "loop", "parents": {}}, {"turn": i + 1, "last": i + 1})


def write_pi(path: str, n: int) -> None:
    """Pi's JSONL of the same N messages."""
    with open(path, "w") as f:
        f.write('{"type":"session","version":3,"id":"turn","timestamp":"2026-03-10T09:00:00.000Z","cwd":"/b"}\n')
        parent = None
        for i in range(n):
            eid = f"{i:08x}"
            f.write(pi_line(step(i), eid, parent))
            parent = eid


def store_for(n: int, workdir: str, cache: bool, log: Callable[[str], None]) -> str:
    """A copy of the N-entry store in ``workdir`` (built, or copied from the cache)."""
    dst = os.path.join(workdir, f"turn-{n}")
    if not cache:
        build(dst, n)
        return dst
    root = Path(os.environ.get("CASTORE_BENCH_CACHE", Path.home() / ".cache" / "castore-bench"))
    cached = root / f"turn-{n}-{source_key()}"
    if not cached.exists():
        log(f"turn: building the {n:,}-entry store once into {cached} (kept for later runs)")
        tmp = str(cached) + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        build(tmp, n)
        os.replace(tmp, cached)
    shutil.copytree(cached, dst)
    return dst


class Reader:
    """The reads, on one open store (fresh: a new one per call; warm: kept)."""

    def __init__(self, url: str) -> None:
        import castore

        self.store = castore.open(url)
        self.s = self.store.session(APP, USER, "turn")
        self._oa: Any = None
        self._adk: Any = None
        self._lg: Any = None

    def close(self) -> None:
        self.store.close()

    def read(self, what: str) -> int:
        """Do read ``what``; return how many things it returned (checked by the caller)."""
        if what == "context":
            return len(self.s.context(max_tokens=BUDGET))
        if what == "turn":
            got = len(self.s.context(max_tokens=BUDGET))
            self.append()
            return got
        if what == "log":
            return len(self.s.log(limit=LOG_N))
        if what == "newest":
            return len(self.s.log(limit=NEWEST_K))
        if what == "openai":
            if self._oa is None:
                from castore.adapters.openai_agents import CastoreSession

                self._oa = CastoreSession("turn", self.store)
            return len(asyncio.run(self._oa.get_items(limit=ADAPTER_N)))
        if what == "adk":
            from google.adk.sessions.base_session_service import GetSessionConfig

            if self._adk is None:
                from castore.adapters.adk import CastoreSessionService

                self._adk = CastoreSessionService(self.store)
            got = asyncio.run(self._adk.get_session(app_name=APP, user_id=USER, session_id="adk-turn",
                                                    config=GetSessionConfig(num_recent_events=ADAPTER_N)))
            return len(got.events)
        if what == "langgraph":
            if self._lg is None:
                from castore.adapters.langgraph import CastoreSaver

                self._lg = CastoreSaver(self.store)
            tup = self._lg.get_tuple({"configurable": {"thread_id": "turn", "checkpoint_ns": ""}})
            return 1 if tup is not None else 0
        raise ValueError(what)

    def append(self) -> None:
        import castore

        self.s.append(castore.Message(role="user", content="one more turn"))


def expected(what: str, n: int) -> int | None:
    return {"log": min(n, LOG_N), "newest": min(n, NEWEST_K), "openai": min(n, ADAPTER_N),
            "adk": min(n, ADAPTER_N), "langgraph": 1}.get(what)


def measure(url: str, n: int, reads: list[str], reps: int, res: dict[tuple[str, str, str, int], list[float]],
            writer: str) -> None:
    """Fresh and warm timings of ``reads``, ``reps`` each, alternated."""
    warm = Reader(url)
    try:
        for what in reads:
            warm.read(what)  # the warm handle's first read (not timed)
        for r in range(reps):
            for what in reads[r % len(reads):] + reads[:r % len(reads)]:
                t = time.perf_counter()
                fresh = Reader(url)
                got = fresh.read(what)
                res[(what, "fresh", writer, n)].append((time.perf_counter() - t) * 1e3)
                fresh.close()
                # freed here, not when the next read's ``fresh = Reader(url)`` rebinds the name:
                # inside that read's timing, the LangGraph saver's handle (10,000 checkpoints
                # decoded) took ~7 ms to free, which the context read after it was charged
                del fresh
                want = expected(what, n)
                assert want is None or got == want, (what, n, got, want)
                if what not in ADAPTER_READS:
                    if what != "turn":  # (a turn appends itself)
                        warm.append()
                    t = time.perf_counter()
                    warm.read(what)
                    res[(what, "warm", writer, n)].append((time.perf_counter() - t) * 1e3)
    finally:
        warm.close()


def pi_parse(path: str, reps: int, res: dict[tuple[str, str, str, int], list[float]], n: int) -> None:
    for _ in range(reps):
        t = time.perf_counter()
        got = cold.pi_path(path)
        res[("pi", "fresh", "none", n)].append((time.perf_counter() - t) * 1e3)
        assert len(got) == n


def run(sizes: list[int], workdir: str, reps: int, cache_from: int,
        log: Callable[[str], None]) -> dict[tuple[str, str, str, int], list[float]]:
    """Every turn figure at every N; stores at N >= ``cache_from`` come from the cache."""
    import castore.context  # noqa: F401  # imported before timing, as in an agent that reads contexts

    res: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    for n in sizes:
        log(f"turn: N={n:,}: store")
        url = store_for(n, workdir, n >= cache_from, log)
        pi = os.path.join(workdir, f"turn-pi-{n}.jsonl")
        write_pi(pi, n)
        reads = [w for w, _ in READS if w != "langgraph" or n <= LANGGRAPH_MAX]
        log(f"turn: N={n:,}: reads ({reps} each, fresh and warm)")
        measure(url, n, reads, reps, res, "none")
        pi_parse(pi, reps, res, n)
        log(f"turn: N={n:,}: reads beside a live writer")
        child = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, url, "1000"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, cwd=str(REPO),
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            measure(url, n, reads, reps, res, "live")
        finally:
            assert child.stdin is not None
            child.stdin.write("\n")
            child.stdin.flush()
            child.wait(timeout=60)
        log(f"turn: N={n:,}: the turn, read and durable append ({reps}, fresh and warm)")
        measure(url, n, [TURN[0]], reps, res, "none")
        shutil.rmtree(url, ignore_errors=True)
    return res


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def section(turn: dict[tuple[str, str, str, int], list[float]] | None, sizes: list[int]) -> list[str]:
    """The "turn" section of BENCHMARKS.md."""
    if not turn:
        return []

    sizes = [n for n in sizes if any(k[3] == n for k in turn)]
    base, top = sizes[0], sizes[-1]
    out = ["## The turn: what an agent reads every turn", "",
           "Each read on a fresh handle (store opened, call, closed: the open included) and on a warm "
           "handle that appended one message since its last call (the append not timed). Median of "
           f"the runs. *× N={top:,}*: the figure at N={top:,} over the one at N={base:,} (target: within 2×; "
           "warm after an append: under 2 ms at any N). *× Pi*: castore's fresh read over parsing "
           "Pi's JSONL of the same session (what Pi does to read it in a new process). Beside a live "
           "writer: another process appended 1,000 entries to another session of the store and holds "
           "its writer log open (target: fresh reads within 1.5× of the same read without it). *The "
           "turn*: the context and a durable append timed together, measured after the reads (fresh: "
           "opened, read, appended, closed, the close sealing the writer's log; warm: the one handle, "
           "its previous turn's append the entry it reads).", ""]
    head = "| read | handle | " + " | ".join(f"N = {n:,}" for n in sizes) + f" | × N={top:,} | × Pi at {top:,} |"
    out += [head, "|---|---|" + "---:|" * (len(sizes) + 2)]
    pi_top = _med(turn.get(("pi", "fresh", "none", top), []))
    for what, label in [*READS, TURN]:
        for mode in ("fresh", "warm"):
            vals = [_med(turn.get((what, mode, "none", n), [])) for n in sizes]
            if all(v is None for v in vals):
                continue
            cells = [ms(v) if v is not None else "not run" for v in vals]
            grow = times(vals[-1], vals[0])
            vs_pi = times(vals[-1], pi_top) if mode == "fresh" and what != "turn" else ""
            out.append(f"| {label} | {mode} | " + " | ".join(cells) + f" | {grow} | {vs_pi} |")
    pis = [_med(turn.get(("pi", "fresh", "none", n), [])) for n in sizes]
    out.append("| Pi JSONL: parse the session (anchor) | fresh | " + " | ".join(ms(v) for v in pis) +
               f" | {times(pis[-1], pis[0])} |  |")
    out += ["", "Beside a live writer (same reads; × alone: over the same read with no writer):", "",
            "| read | handle | " + " | ".join(f"N = {n:,}" for n in sizes) + f" | × alone at {top:,} |",
            "|---|---|" + "---:|" * (len(sizes) + 1)]
    for what, label in READS:
        for mode in ("fresh", "warm"):
            vals = [_med(turn.get((what, mode, "live", n), [])) for n in sizes]
            if all(v is None for v in vals):
                continue
            alone = _med(turn.get((what, mode, "none", top), []))
            cells = [ms(v) if v is not None else "not run" for v in vals]
            vs = times(vals[-1], alone)
            out.append(f"| {label} | {mode} | " + " | ".join(cells) + f" | {vs} |")
    out.append("")
    return out
