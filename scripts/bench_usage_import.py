#!/usr/bin/env python
"""Benchmark: what the usage cache costs the first ``castore import claude`` into a store,
checkouts of castore side by side (each with its own ``.venv``, else run by this interpreter: e.g. main and a change).

Generates the Claude Code files of scripts/bench_usage.py (SESSIONS sessions, ENTRIES lines),
then, ROUNDS times, imports them with each checkout in turn into a new store with no usage cache
(each run a fresh process, bytecode compiled), and prints the median wall and CPU time of each
(CPU: user + system of every thread and worker process), its ratio to the first checkout's, and
whether the import left a usage cache; then ``castore usage --json`` right after the import.

    .venv/bin/python scripts/bench_usage_import.py --checkout DIR [--checkout DIR ...]
        [--sessions 200] [--entries 20000] [--rounds 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_usage import CPU, generate, timed


def _timed_in(cwd: str, cmd: list[str], env: dict[str, str]) -> float:
    """:func:`timed` from ``cwd`` (``python -m castore`` imports the castore of its working folder)."""
    here = os.getcwd()
    os.chdir(cwd)
    try:
        return timed(cmd, env)[0]
    finally:
        os.chdir(here)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkout", action="append", required=True, help="a castore checkout with its .venv")
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--entries", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workdir", help="keep the generated files here (default: a temporary folder)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-usage-import-"))
    home = work / "claude"
    try:
        if not (home / "projects").exists():
            size = generate(home, a.sessions, a.entries // a.sessions)
        else:
            size = sum(f.stat().st_size for f in home.rglob("*.jsonl"))
        # a checkout's own .venv, else this interpreter, run from the checkout (its castore first)
        py = {c: f"{c}/.venv/bin/python" if Path(c, ".venv").exists() else sys.executable for c in a.checkout}
        for c in a.checkout:
            subprocess.run([py[c], "-m", "compileall", "-q", f"{c}/castore"], check=True)
        took: dict[str, list[float]] = {c: [] for c in a.checkout}
        cpu: dict[str, list[float]] = {c: [] for c in a.checkout}
        after: dict[str, list[float]] = {c: [] for c in a.checkout}
        cached: dict[str, bool] = {}
        for r in range(a.rounds):
            for i, c in enumerate(a.checkout):
                store, cache = work / f"store-{r}-{i}", work / f"cache-{r}-{i}.json"
                env = {**os.environ, "TZ": "UTC", "CASTORE_USAGE_CACHE": str(cache)}
                castore = [py[c], "-m", "castore", "--store", str(store)]
                t = _timed_in(c, [*castore, "import", "claude", str(home / "projects")], env)
                took[c].append(t)
                cpu[c].append(CPU[-1])
                cached[c] = cache.exists()
                t = _timed_in(c, [*castore, "usage", "--by", "day", "--json"], env)
                after[c].append(t)
                shutil.rmtree(store)
                cache.unlink(missing_ok=True)
        base, base_cpu = statistics.median(took[a.checkout[0]]), statistics.median(cpu[a.checkout[0]])
        print(f"{a.sessions:,} sessions, {a.entries:,} lines ({size / 2**20:.0f} MiB), medians of {a.rounds}; "
              f"load {os.getloadavg()[0]:.1f} at the end\n")
        print("| checkout | import | runs | CPU | ratio (wall, CPU) | usage cache left | usage right after |")
        print("|---|---:|---|---:|---|---|---:|")
        for c in a.checkout:
            m, mc = statistics.median(took[c]), statistics.median(cpu[c])
            print(f"| {c} | {m:.2f} s | {', '.join(f'{x:.2f}' for x in took[c])} | {mc:.2f} s | "
                  f"{m / base:.2f}x, {mc / base_cpu:.2f}x | {'yes' if cached[c] else 'no'} | "
                  f"{statistics.median(after[c]):.2f} s |")
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
