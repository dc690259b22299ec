#!/usr/bin/env python
"""The turn an agent makes, this checkout against an anchor checkout (e.g. main before a
change), alternated child by child in one run (not a test).

A turn is the per-turn read, ``Session.context(max_tokens=8,000)``, and a durable append
(``castore.open``'s default: made durable before it returns), as the rows of
BENCHMARKS.md's "The turn" section (``scripts/benchlib/turn.py``) read it, at N = 100,
10,000 and 100,000 entries:

- fresh: the store opened, the call made, the store closed (what a new process or request
  pays, the open and the close included: the close seals the writer's log);
- warm: one handle kept; ``context`` after that handle appended one message (the append not
  timed), and the turn (``context`` then ``append``) timed whole, its append also alone.

Each child imports castore from one checkout and works on its own copy of the N-entry store
(pack files hard-linked: they are never written again; the rest copied), so the appends of
one child never reach another's store; the children of the two checkouts alternate, round
by round, so load changes hit both. Wall time and the thread's CPU time (steadier on a
loaded machine) are reported as medians, with the ratio of this checkout to the anchor and
of each N to N = 100. With ``--instructions``, the instructions of one fresh ``context``
read under callgrind (load-independent: a child making K reads less one making none,
``PYTHONHASHSEED=0``), per checkout and N.

Each child also times a plain loop first (``--loop`` fresh reads: open, ``context``, close,
one after the other, no other handle open; "context loop").

The stores are built once by this checkout (``benchlib.turn.build``) into ``--stores``
(kept: the 100,000-entry one takes a few minutes) and read by both; with ``--own-stores``
each checkout builds its own (a change to how packs are laid out shows only in the stores
its own code wrote), into ``--stores``/anchor and ``--stores``/this. ``--batch`` is how
many entries each ``append_many`` of the build writes (500 by default; 1: turn by turn,
as an agent appends; a store built so is kept under its own name).

Usage: .venv/bin/python scripts/bench_turn.py --anchor /work/wt/BEFORE [--sizes 100,10000,100000]
       [--rounds 4] [--reps 15] [--loop 40] [--stores DIR] [--own-stores] [--batch 500]
       [--instructions] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from benchlib.turn import APP, BUDGET, BUILD_BATCH, USER  # noqa: E402

_CHILD = r"""
import json, sys, time
import castore, castore.context
url, reps, app, user, budget, loop = (sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]),
                                      int(sys.argv[6]))
out = {k: [] for k in ("context loop", "context fresh", "context warm", "turn fresh", "turn warm", "append warm")}
cpu = {k: [] for k in out}
def timed(key, f):
    t, c = time.perf_counter(), time.thread_time()
    got = f()
    out[key].append((time.perf_counter() - t) * 1e3)
    cpu[key].append((time.thread_time() - c) * 1e3)
    return got
def fresh_context():
    with castore.open(url) as st:
        return len(st.session(app, user, "turn").context(max_tokens=budget))
for _ in range(loop):  # the plain loop: fresh reads one after the other, no other handle open
    assert timed("context loop", fresh_context) > 0
def fresh_turn():
    with castore.open(url) as st:
        s = st.session(app, user, "turn")
        n = len(s.context(max_tokens=budget))
        s.append(castore.Message(role="user", content="one more turn"))
        return n
warm = castore.open(url)
ws = warm.session(app, user, "turn")
ws.context(max_tokens=budget)  # the warm handle's first read (not timed)
def warm_turn():
    n = len(ws.context(max_tokens=budget))
    timed("append warm", lambda: ws.append(castore.Message(role="user", content="one more turn")))
    return n
for r in range(reps):
    assert timed("context fresh", fresh_context) > 0
    ws.append(castore.Message(role="user", content="one more turn"))
    assert timed("context warm", lambda: len(ws.context(max_tokens=budget))) > 0
    assert timed("turn fresh", fresh_turn) > 0
    assert timed("turn warm", warm_turn) > 0
warm.close()
print(json.dumps({"ms": out, "cpu": cpu}))
"""

_COUNT = r"""
import sys
import castore, castore.context
url, k, app, user, budget = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def one():
    with castore.open(url) as st:
        return len(st.session(app, user, "turn").context(max_tokens=budget))
one()  # imports and first-time costs, in both counts
for _ in range(k):
    one()
"""

KEYS = ["context loop", "context fresh", "context warm", "turn fresh", "turn warm", "append warm"]

_BUILD = r"""
import sys
sys.path.insert(0, sys.argv[1])
from benchlib.turn import build
build(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
"""


def copy_store(src: str, dst: str) -> None:
    """A copy of the store ``src`` at ``dst`` whose pack files are hard links (packs and their
    indexes are written once, then only deleted) and whose other files are copies."""
    def link_or_copy(a: str, b: str) -> object:
        if os.path.basename(os.path.dirname(a)) == "packs" and a.endswith((".pack", ".idx")):
            os.link(a, b)
            return b
        return shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def python_of(checkout: str) -> str:
    return os.path.join(checkout, ".venv", "bin", "python")


def build_with(checkout: str, path: str, n: int, batch: int) -> None:
    """The N-entry store at ``path``, written by ``checkout``'s castore (this checkout's
    ``benchlib.turn.build``), ``batch`` entries per ``append_many``."""
    print(f"building the {n:,}-entry store in {path} with {checkout}", file=sys.stderr)
    subprocess.run([python_of(checkout), "-c", _BUILD, HERE, path + ".tmp", str(n), str(batch)], cwd=checkout,
                   check=True, env={**os.environ, "PYTHONPATH": checkout})
    os.replace(path + ".tmp", path)


def child(checkout: str, url: str, reps: int, loop: int) -> dict[str, dict[str, list[float]]]:
    out = subprocess.run([python_of(checkout), "-c", _CHILD, url, str(reps), APP, USER, str(BUDGET), str(loop)],
                         cwd=checkout, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": checkout})
    return json.loads(out.stdout.strip().splitlines()[-1])


def instructions(checkout: str, url: str, k: int) -> int:
    """Instructions of one fresh context read: a child making ``k`` less one making none."""
    def run(n: int) -> int:
        got = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                              python_of(checkout), "-c", _COUNT, url, str(n), APP, USER, str(BUDGET)],
                             cwd=checkout, check=True, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": checkout, "PYTHONHASHSEED": "0"})
        line = next(x for x in got.stderr.splitlines() if "Collected" in x)
        return int(line.split()[-1])
    return (run(k) - run(0)) // k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchor", required=True, help="the other checkout (with its own .venv)")
    ap.add_argument("--sizes", default="100,10000,100000")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=15, help="turns of each kind per child")
    ap.add_argument("--loop", type=int, default=40, help="fresh reads of the plain loop per child")
    ap.add_argument("--own-stores", action="store_true", help="each checkout reads stores its own code built")
    ap.add_argument("--batch", type=int, default=BUILD_BATCH, help="entries per append_many in the build")
    ap.add_argument("--stores", default=os.path.join(tempfile.gettempdir(), "castore-bench-turn"),
                    help="where the N-entry stores are built once and kept")
    ap.add_argument("--instructions", action="store_true", help="also count instructions (valgrind)")
    ap.add_argument("--markdown", help="append the tables to this file")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    sides = {"anchor": os.path.abspath(args.anchor), "this": ROOT}
    for path in sides.values():
        subprocess.run([python_of(path), "-m", "compileall", "-q", "castore"], cwd=path, check=True)
    os.makedirs(args.stores, exist_ok=True)
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res: dict[tuple[str, int, str, str], list[float]] = {}
    counts: dict[tuple[str, int], int] = {}
    work = tempfile.mkdtemp(prefix="bench-turn-")
    try:
        for n in sizes:
            stem = f"turn-{n}" if args.batch == BUILD_BATCH else f"turn-{n}-by-{args.batch}"
            srcs = {side: os.path.join(args.stores, side if args.own_stores else "", stem) for side in sides}
            for side, src in srcs.items():
                if not os.path.exists(src):
                    os.makedirs(os.path.dirname(src), exist_ok=True)
                    build_with(sides[side] if args.own_stores else ROOT, src, n, args.batch)
            for r in range(args.rounds):
                order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
                for side, path in order:
                    url = os.path.join(work, f"{side}-{n}-{r}")
                    copy_store(srcs[side], url)
                    got = child(path, url, args.reps, args.loop)
                    shutil.rmtree(url)
                    for unit in ("ms", "cpu"):
                        for key in KEYS:
                            res.setdefault((side, n, key, unit), []).extend(got[unit][key])
                print(f"N={n:,} round {r + 1}/{args.rounds} done", file=sys.stderr)
            if args.instructions:
                for side, path in sides.items():
                    url = os.path.join(work, f"count-{side}-{n}")
                    copy_store(srcs[side], url)
                    counts[(side, n)] = instructions(path, url, 8)
                    shutil.rmtree(url)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()
    lines = table(res, counts, sizes)
    head = (f"`{' '.join([os.path.relpath(sys.executable, ROOT), 'scripts/bench_turn.py', *sys.argv[1:]])}`, "
            f"{started}, load {load0[0]:.1f} before and {load1[0]:.1f} after; medians of "
            f"{args.rounds} x {args.reps} turns per checkout and N.")
    text = "\n".join([head, "", *lines])
    print(text)
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write(text + "\n")


def table(res: dict[tuple[str, int, str, str], list[float]], counts: dict[tuple[str, int], int],
          sizes: list[int]) -> list[str]:
    """The tables: wall and CPU medians per kind and N, anchor and this, their ratio, and
    each N over N = the smallest (this checkout)."""
    med = {k: statistics.median(v) for k, v in res.items() if v}
    out = []
    for unit, title in (("ms", "wall time, ms"), ("cpu", "the thread's CPU time, ms")):
        out += [f"Median {title} (anchor / this checkout, this / anchor; × N={sizes[0]:,}: this checkout's figure "
                f"over its own at N = {sizes[0]:,}):", "",
                "| what | " + " | ".join(f"N = {n:,}" for n in sizes) + " | "
                + " | ".join(f"× N={sizes[0]:,} at {n:,}" for n in sizes[1:]) + " |",
                "|---|" + "---:|" * (2 * len(sizes) - 1)]
        for key in KEYS:
            cells = []
            for n in sizes:
                a, b = med.get(("anchor", n, key, unit)), med.get(("this", n, key, unit))
                cells.append(f"{a:.2f} / {b:.2f} (×{b / a:.2f})" if a and b else "—")
            base = med.get(("this", sizes[0], key, unit))
            grow = [f"×{med[('this', n, key, unit)] / base:.2f}" if base and ("this", n, key, unit) in med else "—"
                    for n in sizes[1:]]
            out.append(f"| {key} | " + " | ".join(cells) + " | " + " | ".join(grow) + " |")
        out.append("")
    if counts:
        out += ["Instructions of one fresh `context(max_tokens=8,000)` (callgrind; anchor / this, this / anchor):", "",
                "| | " + " | ".join(f"N = {n:,}" for n in sizes) + " |", "|---|" + "---:|" * len(sizes)]
        cells = []
        for n in sizes:
            a, b = counts.get(("anchor", n)), counts.get(("this", n))
            cells.append(f"{a / 1e6:.1f} M / {b / 1e6:.1f} M (×{b / a:.2f})" if a and b else "—")
        out += ["| fresh context | " + " | ".join(cells) + " |", ""]
    return out


if __name__ == "__main__":
    main()
