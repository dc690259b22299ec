"""``scripts/bench``: run every comparison in one process run and write docs/benchmarks/BENCHMARKS.md.

Schedule, for each N: every local system starts an empty session; then step by step,
every system appends the same step, in an order that rotates at every step (drift on a
busy machine hits all systems alike); then, in R rounds with the order rotated at every
round, each system does time travel, the full log and a cold read in a new process; then
R rounds of forks; then push to another bucket (S3); then the append probe: appends to the
N-step session alternated with appends to a new session, systems alternated too, so that
the growth of the append cost with N is measured free of the machine's drift.

    scripts/bench            # N = 100, 1,000, 10,000 (about 10 minutes on a 2-core machine)
    scripts/bench --quick    # N = 100, 1,000; fewer S3 figures
    scripts/bench --smoke    # N = 100, local systems, 1 round, written to a temporary file
    scripts/bench --sizes 10000 --systems 'castore local,castore encrypted' --no-fleet --turn-sizes 0 --out F
                             # the encrypted store against plain castore alone (and S3 requests per append)
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from . import cold, fleet, lg, machine, report, turn
from .systems import CastoreEncrypted, CastoreLocal, Floor, PiJsonl, System
from .workload import step

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Results:
    """Samples by (figure, system, N), plus notes on what was skipped."""

    def __init__(self) -> None:
        self.samples: dict[tuple[str, str, int], list[Any]] = defaultdict(list)
        self.skipped: dict[tuple[str, int], str] = {}
        self.loads: list[tuple[str, str]] = []
        self.fleet: dict[str, Any] | str | None = None  # the fleet's figures, or why it did not run
        self.turn: dict[tuple[str, str, str, int], list[float]] = {}  # the turn's figures (benchlib.turn)
        self.turn_sizes: list[int] = []
        #: requests and round trips of each append on S3, plain and encrypted (benchlib.s3.requests_per_append)
        self.s3_appends: dict[str, list[tuple[int, int]]] = {}

    def add(self, fig: str, system: str, n: int, value: Any) -> None:
        self.samples[(fig, system, n)].append(value)

    def get(self, fig: str, system: str, n: int) -> list[Any]:
        return self.samples.get((fig, system, n), [])

    def median(self, fig: str, system: str, n: int) -> float | None:
        xs = [x for x in self.get(fig, system, n) if x is not None]
        return statistics.median(xs) if xs else None


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rotate(xs: list[Any], k: int) -> list[Any]:
    if not xs:
        return xs
    k %= len(xs)
    return xs[k:] + xs[:k]


def _timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - t) * 1e3


def _once(cfg: argparse.Namespace, s: System, what: str) -> bool:
    """--quick runs the slowest reads once: S3 time travel, log and fork; LangGraph's cold reads."""
    if not cfg.quick:
        return False
    if what == "reads":
        return bool(getattr(s, "seeded", False))
    return isinstance(s, lg.LangGraph)


def run_n(n: int, systems: list[System], cfg: argparse.Namespace, res: Results) -> None:
    """Every figure at N for the systems that run at N."""
    local = [s for s in systems if not getattr(s, "seeded", False)]
    seeded = [s for s in systems if getattr(s, "seeded", False)]
    log(f"N={n}: starting {', '.join(s.name for s in systems)}")
    res.loads.append((f"N = {n:,}", machine.uptime()))
    for s in local:
        s.start(n)
    times: dict[str, list[float]] = {s.name: [] for s in local}
    for i in range(n):
        st = step(i)
        for s in rotate(local, i):
            t = time.perf_counter()
            s.append(st)
            times[s.name].append(time.perf_counter() - t)
        if n >= 1000 and (i + 1) % (n // 4) == 0:
            log(f"N={n}: {i + 1} steps appended")
    for s in local:
        s.finish_build()
        res.add("append_steps", s.name, n, times[s.name])
    for s in seeded:
        log(f"N={n}: seeding {s.name} (local build, push)")
        s.start(n)
        res.add("push_local", s.name, n, s.figures["push_local"])
    for s in systems:
        size, disk = s.sizes()
        res.add("bytes", s.name, n, size)
        res.add("disk", s.name, n, disk)
    mid = n // 2
    for r in range(cfg.reps):
        log(f"N={n}: read round {r + 1}/{cfg.reps}")
        order = rotate(systems, r)
        for s in order:
            if isinstance(s, Floor) or (r > 0 and _once(cfg, s, "reads")):
                continue
            (state, nmsg), ms = _timed(s.time_travel, mid)
            assert state["turn"] == mid and nmsg == mid + 1, (s.name, state.get("turn"), nmsg)
            res.add("tt_ms", s.name, n, ms)
            if getattr(s, "last_counts", None):
                res.add("tt_counts", s.name, n, s.last_counts)
        for s in order:
            if isinstance(s, Floor) or (isinstance(s, lg.LangGraph) and n >= 1000 and r > 0) \
                    or (r > 0 and _once(cfg, s, "reads")):
                continue  # LangGraph's history is O(N^2) to read: one run at N >= 1,000
            count, ms = _timed(s.full_log)
            assert count == n, (s.name, count, n)
            res.add("log_ms", s.name, n, ms)
            if getattr(s, "last_counts", None):
                res.add("log_counts", s.name, n, s.last_counts)
        for s in order:
            if s.cold_args() is None or (r > 0 and _once(cfg, s, "cold")):
                continue
            cold_read(s, n, res)
    # the cold-read target compares castore with Pi's JSONL (and the floor): a few ms apart
    # on a noisy machine, so they get more rounds of cold reads, alternated, than the rest
    near = [s for s in systems if isinstance(s, (CastoreLocal, PiJsonl, Floor))]
    for r in range(cfg.reps, cfg.cold_reps):
        for s in rotate(near, r):
            cold_read(s, n, res)
    for r in range(cfg.reps):
        for s in rotate(systems, r):
            if isinstance(s, Floor) or (r > 0 and _once(cfg, s, "reads")):
                continue
            written, ms = _timed(s.fork, mid, r)
            res.add("fork_ms", s.name, n, ms)
            res.add("fork_bytes", s.name, n, written)
            if getattr(s, "last_counts", None):
                res.add("fork_counts", s.name, n, s.last_counts)
    for s in seeded:
        if n <= cfg.s3_push_max:
            log(f"N={n}: push {s.name} to another bucket")
            res.add("push_other", s.name, n, s.push_other())
    probe(n, systems, cfg, res)
    for s in systems:
        s.cleanup()


def cold_read(s: System, n: int, res: Results) -> None:
    """One cold read of ``s`` in a new process, its figures added to ``res``."""
    args = s.cold_args()
    assert args is not None, s.name
    out = cold.run(*args)
    assert out["n"] == n and out.get("turn", n - 1) == n - 1, (s.name, out)
    res.add("cold_ms", s.name, n, out["ms"])
    res.add("cold_wall_ms", s.name, n, out["wall_ms"])
    if "import_ms" in out:
        res.add("cold_import_ms", s.name, n, out["import_ms"])
    if "requests" in out:
        res.add("cold_counts", s.name, n, out)


def probe(n: int, systems: list[System], cfg: argparse.Namespace, res: Results) -> None:
    """Growth of the append cost, free of drift: appends at N alternated with appends to a new session."""
    w = min(50, max(10, n // 10))
    log(f"N={n}: append probe ({w} appends at N and {w} on a new session per system; S3: {cfg.window})")
    for i in range(w):
        for s in rotate(systems, i):
            if getattr(s, "seeded", False) and i >= cfg.window:
                continue
            for at_tip in ((False, True) if i % 2 == 0 else (True, False)):
                t = time.perf_counter()
                s.probe(step(n + i if at_tip else i), at_tip)
                ms = (time.perf_counter() - t) * 1e3
                res.add("probe_tip" if at_tip else "probe_new", s.name, n, ms)
                if getattr(s, "last_counts", None):
                    res.add("probe_counts_tip" if at_tip else "probe_counts_new", s.name, n, s.last_counts)


def run_cold_only(n: int, s: System, cfg: argparse.Namespace, res: Results) -> None:
    """castore on S3 at a large N: seed, then cold reads only."""
    log(f"N={n}: seeding {s.name} for cold reads only")
    s.start(n)
    res.add("push_local", s.name, n, s.figures["push_local"])
    res.add("bytes", s.name, n, s.sizes()[0])
    for _ in range(cfg.reps):
        out = cold.run(*s.cold_args())
        assert out["n"] == n, out
        res.add("cold_ms", s.name, n, out["ms"])
        res.add("cold_wall_ms", s.name, n, out["wall_ms"])
        res.add("cold_counts", s.name, n, out)


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="N = 100 and 1,000 (under two minutes on an idle machine)")
    mode.add_argument("--smoke", action="store_true", help="N = 100, local systems, one round, to a temporary file")
    ap.add_argument("--out", help="where to write the report (default: docs/benchmarks/BENCHMARKS.md; "
                    "--smoke: a temporary file)")
    ap.add_argument("--sizes", help="comma-separated N values (overrides the mode's)")
    ap.add_argument("--reps", type=int, help="read rounds per N (default: 3; smoke 1)")
    ap.add_argument("--cold-reps", type=int,
                    help="cold reads per N of castore local, Pi JSONL and the floor, alternated (default: 9; smoke 1)")
    ap.add_argument("--systems", help="comma-separated names of the systems to run, as the tables name them "
                    "(default: all), e.g. 'castore local,castore encrypted' (S3 requests per append run with S3)")
    ap.add_argument("--no-s3", action="store_true", help="leave out castore on S3 (no moto server)")
    ap.add_argument("--window", type=int, help="S3 appends in the append probe, at N and on a new session (default 10)")
    ap.add_argument("--workdir", help="where the stores go (default: a temporary folder, removed)")
    ap.add_argument("--turn-sizes", help="comma-separated N values of the turn section (default: 100,10000,100000; "
                    "--quick 100,10000; --smoke 100); 0 leaves it out")
    ap.add_argument("--turn-reps", type=int, help="timed calls per read, handle and N in the turn section (default 9)")
    ap.add_argument("--no-fleet", action="store_true",
                    help="leave out the writer fleet on SeaweedFS (scripts/bench_fleet.py; full: 16 x 100 sessions)")
    cfg = ap.parse_args(argv)
    cfg.mode = "smoke" if cfg.smoke else "quick" if cfg.quick else "full"
    sizes = {"smoke": [100], "quick": [100, 1000], "full": [100, 1000, 10000]}[cfg.mode]
    cfg.sizes = [int(x) for x in cfg.sizes.split(",")] if cfg.sizes else sizes
    cfg.reps = cfg.reps or (1 if cfg.smoke else 3)
    cfg.cold_reps = max(cfg.reps, cfg.cold_reps or (1 if cfg.smoke else 9))
    cfg.window = cfg.window or 10
    cfg.s3 = not (cfg.no_s3 or cfg.smoke)
    cfg.s3_max = 1000  # full figures on S3 up to here; beyond, cold reads only (full mode)
    cfg.s3_push_max = 0 if cfg.quick else 1000
    # the fleet: 16 writer processes; --quick gives each 10 sessions instead of 100
    cfg.fleet = None if (cfg.no_fleet or cfg.smoke) else (16, 10 if cfg.quick else 100, 3)
    turn_sizes = {"smoke": "100", "quick": "100,10000", "full": "100,10000,100000"}[cfg.mode]
    cfg.turn_sizes = [int(x) for x in (cfg.turn_sizes or turn_sizes).split(",") if int(x) > 0]
    cfg.turn_reps = cfg.turn_reps or (3 if cfg.smoke else 9)
    cfg.argv = argv
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse(sys.argv[1:] if argv is None else argv)
    out = cfg.out or (os.path.join(tempfile.mkdtemp(prefix="castore-bench-smoke-"), "BENCHMARKS.md") if cfg.smoke
                      else os.path.join(REPO, "docs", "benchmarks", "BENCHMARKS.md"))
    workdir = cfg.workdir or tempfile.mkdtemp(prefix="castore-bench-")
    os.makedirs(workdir, exist_ok=True)
    started, load_before = time.time(), machine.uptime()
    res = Results()
    server = None
    systems: list[System] = [CastoreLocal(workdir), CastoreEncrypted(workdir), lg.InMemory(workdir), lg.Sqlite(workdir)]
    if lg.has_delta_channel():
        systems.append(lg.Delta(workdir))
    systems += [PiJsonl(workdir), Floor(workdir)]
    only = {x.strip() for x in cfg.systems.split(",")} if cfg.systems else None
    if only is not None:
        systems = [s for s in systems if s.name in only]
    def write(note: str = "") -> None:
        text = report.render(res, cfg, machine.describe(cfg.workdir or tempfile.gettempdir()), machine.versions(),
                             load_before, machine.uptime(), time.time() - started, lg.has_delta_channel())
        with open(out, "w") as f:
            f.write(text + (f"\n{note}\n" if note else ""))

    try:
        s3sys = None
        if cfg.s3:
            from . import s3

            log("starting moto")
            server = s3.start_server()
            s3sys = s3.CastoreS3(workdir, server)
            if only is not None and s3sys.name not in only:
                s3sys = None
        if cfg.quick:
            for s in systems:
                if isinstance(s, lg.LangGraph):
                    s.max_n, s.max_n_reason = 100, "--quick runs LangGraph at N=100 only (run scripts/bench for 1,000)"
        for n in cfg.sizes:
            active = [s for s in systems if s.max_n is None or n <= s.max_n]
            for s in systems:
                if s not in active:
                    res.skipped[(s.name, n)] = s.max_n_reason
            if s3sys is not None and n <= cfg.s3_max:
                active.append(s3sys)
            run_n(n, active, cfg, res)
            if s3sys is not None and n > cfg.s3_max:
                run_cold_only(n, s3sys, cfg, res)
            if n != cfg.sizes[-1] or cfg.fleet:
                write(f"**Partial: written after N = {n:,}; the run goes on.**")
        if server is not None:
            log("S3: requests per append, plain and encrypted stores alternated")
            res.s3_appends = s3.requests_per_append(server, cfg.window * 2)
        if cfg.turn_sizes:
            res.turn_sizes = cfg.turn_sizes
            # the 100,000-entry store takes minutes to build: built once, kept in a cache folder
            res.turn = turn.run(cfg.turn_sizes, workdir, cfg.turn_reps, 100_000, log)
            if cfg.fleet:
                write("**Partial: written after the turn section; the run goes on.**")
        if cfg.fleet:
            log("fleet: {} writer processes x {} sessions x {} turns on SeaweedFS".format(*cfg.fleet))
            res.fleet = fleet.run(REPO, *cfg.fleet)
    except BaseException as e:
        write(f"**Interrupted: {type(e).__name__}: {e}** (the tables hold what was measured before).")
        raise
    finally:
        if server is not None:
            server.stop()
        for s in systems:
            s.close()
        if not cfg.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    write()
    log(f"wrote {out} in {time.time() - started:.0f} s")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
