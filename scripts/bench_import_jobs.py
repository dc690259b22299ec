#!/usr/bin/env python
"""Benchmark: where the time of ``castore import claude FOLDER`` over worker processes goes,
process by process, against ``--jobs 1``.

Runs each command as its own process into a fresh store, alternating (the order reversed
every other round), and samples every process of its tree every 20 ms from /proc (Linux):
when it was first and last seen, its CPU time and its time waiting for a CPU in the run
queue (``/proc/PID/task/*/schedstat``, every thread summed), and the rest of its life
(sleeping: the disk, a pipe, a lock); and the user and system CPU of the whole tree, exact,
from the kernel's accounting of the command and the workers it waited for (``wait4``). On a
machine shared with other work the run-queue wait is the other work's share of the cores,
so besides the wall time it prints the wall time less the run-queue waits of the process
that ended last and of the parent (what the import would take with the cores to itself,
roughly) and the ratio of the one-process import to the default's.

``--tree DIR`` (repeatable) runs the commands of another checkout's castore too (its folder
first on ``PYTHONPATH``), alternated with this one's, for a before/after. ``--again`` also
times, after each default import, the same command again on its store (a re-import with
nothing new).

    .venv/bin/python scripts/bench_import_jobs.py FOLDER [--rounds 3] [--jobs N] [--tree DIR]... [--again]
    .venv/bin/python scripts/bench_import_jobs.py --size-mb 20 --workdir DIR [...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants now."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat.rpartition(")")[2].split()[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _sched(pid: int) -> tuple[float, float] | None:
    """(CPU seconds, run-queue seconds) of ``pid``'s threads, or None once it is gone."""
    run = wait = 0
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            fields = Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()
            run += int(fields[0])
            wait += int(fields[1])
    except OSError:
        return None
    return run / 1e9, wait / 1e9


def traced(cmd: list[str], env: dict[str, str], cwd: Path) -> dict[str, float]:
    """Run ``cmd``; its wall time, the CPU of its process tree, the start, CPU, run-queue wait
    and sleep of the process that ended last (the parent excluded when it has workers), and
    between the workers, how far apart they started (``lag``) and ended (``spread``)."""
    seen: dict[int, list[float]] = {}  # pid -> [first, last, cpu, runq]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    while True:
        # wait4: the user and system time of the command and of every process it waited for
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        now = time.perf_counter() - t0
        for pid in _tree(p.pid):
            s = _sched(pid)
            if s is not None:
                e = seen.setdefault(pid, [now, now, 0.0, 0.0])
                e[1], e[2], e[3] = now, *s
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.read().decode()[-800:] if p.stderr else ''}")
    seen.setdefault(p.pid, [wall, wall, usage.ru_utime + usage.ru_stime, 0.0])
    busy = {pid: e for pid, e in seen.items() if e[2] >= 0.05 and pid != p.pid} or {p.pid: seen[p.pid]}
    first, last, cpu, runq = max(busy.values(), key=lambda e: e[1])
    parent = seen[p.pid][3] if p.pid not in busy else 0.0  # its wait is before and after the workers
    return {"wall": wall, "cpu": sum(e[2] for e in seen.values()), "user": usage.ru_utime, "sys": usage.ru_stime,
            "start": first, "w_cpu": cpu,
            "w_runq": runq, "w_sleep": last - first - cpu - runq, "alone": wall - runq - parent,
            "lag": max(e[0] for e in busy.values()) - min(e[0] for e in busy.values()),
            "spread": max(e[1] for e in busy.values()) - min(e[1] for e in busy.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", help="a Claude Code projects folder (else --size-mb makes one)")
    ap.add_argument("--size-mb", type=float, default=20.0)
    ap.add_argument("--workdir", help="where the generated folder and the stores go (default: a temporary folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, help="the import's --jobs beside --jobs 1 (default: castore's default)")
    ap.add_argument("--tree", action="append", default=[], help="another checkout to run alternated with this one")
    ap.add_argument("--again", action="store_true", help="also time the default import again on its store")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-import-jobs-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if a.folder:
            folder = Path(a.folder)
        else:
            sys.path.insert(0, str(ROOT / "scripts"))
            from bench_import import generate

            folder = work / "projects"
            if not folder.exists():
                generate(folder, a.size_mb)
        trees = [ROOT, *(Path(t).resolve() for t in a.tree)]
        for t in trees:
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(t / "castore")], check=True)
        jobs = [] if a.jobs is None else ["--jobs", str(a.jobs)]
        runs = [(t, j) for t in trees for j in (jobs, ["--jobs", "1"])]
        got: dict[tuple[Path, str], list[dict[str, float]]] = {}
        load = [os.getloadavg()[0]]
        store = work / "store-jobs"
        for r in range(a.rounds):
            for t, j in runs if r % 2 == 0 else runs[::-1]:
                shutil.rmtree(store, ignore_errors=True)
                env = {**os.environ, "PYTHONPATH": str(t)}
                cmd = [sys.executable, "-m", "castore", "--store", str(store), "import", "claude", str(folder), *j]
                # run from the work folder: -m puts the cwd first on the path
                got.setdefault((t, " ".join(j) or "default"), []).append(traced(cmd, env, work))
                if a.again and j is jobs:  # nothing new: the re-import
                    got.setdefault((t, "again"), []).append(traced(cmd, env, work))
                load.append(os.getloadavg()[0])
        shutil.rmtree(store, ignore_errors=True)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{folder}: {a.rounds} rounds, alternated; load {min(load):.1f}-{max(load):.1f}; medians (each run)")
    cols = ("wall", "alone", "cpu", "user", "sys", "start", "lag", "w_cpu", "w_runq", "w_sleep", "spread")
    print("| tree | jobs | " + " | ".join(cols) + " |\n|---|---|" + "---:|" * len(cols))
    for (t, j), v in got.items():
        cells = [f"{statistics.median(x[c] for x in v):.2f} ({', '.join(f'{x[c]:.2f}' for x in v)})"
                 for c in cols]
        print(f"| {t.name} | {j} | " + " | ".join(cells) + " |")
    for t in trees:
        d, one = got[(t, " ".join(jobs) or "default")], got[(t, "--jobs 1")]
        ratio = [b["alone"] / x["alone"] for x, b in zip(d, one, strict=True)]
        wall = [b["wall"] / x["wall"] for x, b in zip(d, one, strict=True)]
        print(f"{t.name}: --jobs 1 / default, per round: wall {', '.join(f'{x:.2f}' for x in wall)}; "
              f"wall less run-queue wait {', '.join(f'{x:.2f}' for x in ratio)}")


if __name__ == "__main__":
    main()
