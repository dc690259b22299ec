#!/usr/bin/env python
"""State and fork at the middle of a session (fresh handle each), this checkout against an
anchor checkout (e.g. the integrator's main), alternated child by child in one run (not a test);
with ``--cold``, also the cold read of each session (a new process each, import included:
benchlib/cold.py's child) against parsing the same entries from a Pi JSONL file: timed
inside the child, in the child's CPU, and as the whole process (spawn to exit, as
docs/benchmarks/BENCHMARKS.md's target reads it), medians and their ratios to Pi's.

Each child imports castore from one checkout, opens the store afresh ``--reps`` times and
times ``Session.state(middle)`` (and, with ``--fork``, a fork at the middle); the children of
the two checkouts alternate, so load changes hit both. Prints best / median per N and
checkout (wall time and the thread's CPU time, steadier on a loaded machine), the N_max / N_min
ratios, the bytes of each store, and the load average before and after. The stores are
written by this checkout and read by both; with ``--own-stores`` each checkout writes its own
(in a child) and reads it, which is how a change of what repack writes is measured.

Usage: .venv/bin/python scripts/bench_middle.py --anchor /work/main [--read-n 100,10000]
       [--rounds 6] [--reps 5] [--fork] [--cold] [--own-stores] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

from benchlib.fsize import stored_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_CHILD = r"""
import json, sys, time
import castore
url, mid, reps, fork = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
states, cpus, forks = [], [], []
for r in range(reps):
    with castore.open(url) as st:
        s = st.session("bench", "u", "s")
        t0, c0 = time.perf_counter(), time.thread_time()
        state = s.state(mid, scopes=False)
        states.append((time.perf_counter() - t0) * 1e3)
        cpus.append((time.thread_time() - c0) * 1e3)
    if fork:
        with castore.open(url) as st:
            s = st.session("bench", "u", "s")
            t0 = time.perf_counter()
            s.fork(f"fork-{time.time_ns()}", at=mid)
            forks.append((time.perf_counter() - t0) * 1e3)
print(json.dumps({"state": states, "cpu": cpus, "fork": forks, "turn": state["turn"]}))
"""


_BUILD = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
from benchlib.workload import pi_line, steps
import castore
url, n = sys.argv[1], int(sys.argv[2])
with castore.open(url, durable=False, format=2) as st:
    s = st.session("bench", "u", "s")
    ids = [s.append(castore.Message(role=w.role, content=w.content), state_delta=w.delta) for w in steps(n)]
with open(url + ".jsonl", "w", encoding="utf-8") as f:  # the same steps as Pi JSONL (bench_session)
    f.write(json.dumps({"type": "session", "version": 3, "id": f"bench-{n}", "cwd": "/bench"}) + "\n")
    parent = None
    for i, w in enumerate(steps(n)):
        eid = f"{i:08x}"
        f.write(pi_line(w, eid, parent))
        parent = eid
with open(url + ".json", "w") as f:
    json.dump({"mid": ids[n // 2]}, f)
"""


def _build(workdir: str, n: int, code_root: str, tag: str = "") -> tuple[str, str]:
    """A format-2 store of ``n`` steps (bench_session's workload) written by the castore of
    ``code_root`` (in a child), built once; (url, middle id)."""
    url = os.path.join(workdir, f"middle-f2-{n}{tag}")
    meta = url + ".json"
    if not os.path.exists(meta):
        env = dict(os.environ, PYTHONPATH=code_root)
        subprocess.run([sys.executable, "-c", _BUILD, url, str(n), HERE], check=True, env=env, cwd=code_root)
    with open(meta) as f:
        return url, json.load(f)["mid"]


def _cold(code_root: str | None, url: str, n: int) -> tuple[float, float, float]:
    """One cold read in a fresh process (castore from ``code_root``, or Pi JSONL when None):
    (wall ms inside the child, the child's CPU ms, the whole process's wall ms)."""
    from benchlib import cold

    os.environ["PYTHONPATH"] = code_root or ""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    where = code_root or os.path.dirname(url)  # python -c finds castore in its working folder first
    got = (cold.run(cold.CASTORE, [url, "{}", "bench", "u", "s"], cwd=where) if code_root
           else cold.run(cold.PI, [url + ".jsonl"], cwd=where))
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert got["n"] == n and got["turn"] == n - 1, got
    return got["ms"], (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1e3, got["wall_ms"]


def _child(code_root: str, url: str, mid: str, reps: int, fork: bool) -> dict[str, list[float]]:
    env = dict(os.environ, PYTHONPATH=code_root)
    out = subprocess.run([sys.executable, "-c", _CHILD, url, mid, str(reps), "1" if fork else "0"],
                         check=True, capture_output=True, text=True, env=env, cwd=code_root)
    got: dict[str, list[float]] = json.loads(out.stdout)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--anchor", required=True, help="the other checkout (its castore is imported)")
    ap.add_argument("--read-n", default="100,10000")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reps", type=int, default=5, help="fresh handles per child")
    ap.add_argument("--fork", action="store_true", help="also time a fork at the middle")
    ap.add_argument("--cold", action="store_true", help="also the cold read of each session against Pi JSONL")
    ap.add_argument("--dir", default=None, help="work folder (kept; stores are reused)")
    ap.add_argument("--own-stores", action="store_true",
                    help="each checkout reads stores its own code wrote (to measure a change of layout "
                         "with the code that writes it); default: both read the stores this checkout wrote")
    args = ap.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="castore-middle-")
    sizes = [int(x) for x in args.read_n.split(",")]
    roots = {"this": ROOT, "anchor": os.path.abspath(args.anchor)}
    stores = {(k, n): _build(workdir, n, root, f"-{k}" if args.own_stores else "")
              for k, root in (roots.items() if args.own_stores else [("this", ROOT)]) for n in sizes}
    if not args.own_stores:
        stores.update({("anchor", n): stores[("this", n)] for n in sizes})
    res: dict[tuple[str, int], dict[str, list[float]]] = {
        (k, n): {"state": [], "cpu": [], "fork": []} for k in roots for n in sizes}
    cold: dict[tuple[str, int], list[tuple[float, float, float]]] = {(k, n): [] for k in [*roots, "pi"] for n in sizes}
    import compileall

    for root in roots.values():  # as installing castore does: no child compiles it from source
        compileall.compile_dir(os.path.join(root, "castore"), quiet=1)
    load0 = os.getloadavg()
    for r in range(args.rounds):
        for n in sizes:
            for k, root in roots.items():
                got = _child(root, stores[(k, n)][0], stores[(k, n)][1], args.reps, args.fork)
                assert got["turn"] == n // 2, got
                for m in ("state", "cpu", "fork"):
                    res[(k, n)][m] += got[m]
            if args.cold:
                order = [*roots.items(), ("pi", None)]
                for k, root in order[r % len(order):] + order[:r % len(order)]:  # who goes first rotates
                    cold[(k, n)].append(_cold(root, stores[(k if root else "this", n)][0], n))
    load1 = os.getloadavg()
    print(f"# state at the middle (fresh handle each; best / median of {args.rounds * args.reps}); "
          f"load average {load0[0]:.2f} before, {load1[0]:.2f} after")
    print(f"this = {roots['this']}, anchor = {roots['anchor']}")
    print("stores: " + ("each checkout's own" if args.own_stores else "this checkout's, read by both") + "; bytes "
          + ", ".join(f"{k} N = {n:,}: {stored_bytes(stores[(k, n)][0]):,}" for k in roots for n in sizes) + "\n")
    print("| N | checkout | state ms (wall) | state ms (thread CPU) | fork ms |")
    print("|---|---|---|---|---|")
    for n in sizes:
        for k in roots:
            r = res[(k, n)]
            fk = f"{min(r['fork']):.2f} / {statistics.median(r['fork']):.2f}" if r["fork"] else "-"
            print(f"| {n:,} | {k} | {min(r['state']):.2f} / {statistics.median(r['state']):.2f} | "
                  f"{min(r['cpu']):.2f} / {statistics.median(r['cpu']):.2f} | {fk} |")
    lo, hi = min(sizes), max(sizes)
    if lo != hi:
        print()
        for k in roots:
            for m in ("state", "cpu"):
                a, b = res[(k, lo)][m], res[(k, hi)][m]
                print(f"{k}: {'wall' if m == 'state' else 'CPU'} N = {hi:,} / N = {lo:,}: best "
                      f"{min(b) / min(a):.2f}x, median {statistics.median(b) / statistics.median(a):.2f}x")
    if args.cold:
        print(f"\n# cold read, import included (a new process each; best / median of {args.rounds})")
        print("| N | checkout | wall ms | CPU ms | whole process ms | wall / Pi | CPU / Pi | whole / Pi |")
        print("|---|---|---|---|---|---|---|---|")
        for n in sizes:
            pi = [statistics.median(x[i] for x in cold[("pi", n)]) for i in range(3)]
            for k in [*roots, "pi"]:
                cols = [[x[i] for x in cold[(k, n)]] for i in range(3)]
                shown = " | ".join(f"{min(c):.1f} / {statistics.median(c):.1f}" for c in cols)
                ratios = " | ".join(f"{statistics.median(c) / p:.2f}x" for c, p in zip(cols, pi, strict=True))
                print(f"| {n:,} | {k} | {shown} | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
