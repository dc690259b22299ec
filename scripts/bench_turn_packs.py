#!/usr/bin/env python
"""A process per turn, this checkout against an anchor checkout (not a test): each of
``--turns`` turns is one process that opens the store, reads the context
(``context(max_tokens=8,000)``), appends one message and closes, as the CLI or a serverless
handler does. Each checkout works on its own copy of ``--store`` (a store scripts/bench_turn.py
built; pack files hard-linked), the two checkouts' turns alternated, so load hits both.

Reported per checkout: the packs left after the turns, the instructions of one fresh context
read then (callgrind, as scripts/bench_turn.py counts them), and the close's thread CPU per
turn (median, mean: the mean is the amortised cost, with the turns whose close merged the
small packs) and wall time of the whole turn (median, mean).

Usage: .venv/bin/python scripts/bench_turn_packs.py --anchor /work/wt/BEFORE --store DIR [--turns 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_turn import copy_store, instructions, python_of  # noqa: E402
from benchlib.turn import APP, BUDGET, USER  # noqa: E402

_TURN = r"""
import json, sys, time
import castore, castore.context
url, app, user, budget = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
t = time.perf_counter()
st = castore.open(url)
s = st.session(app, user, "turn")
s.context(max_tokens=budget)
s.append(castore.Message(role="user", content="one more turn"))
c = time.thread_time()
st.close()
close = (time.thread_time() - c) * 1e3
print(json.dumps({"close": close, "turn": (time.perf_counter() - t) * 1e3}))
"""


def turn(checkout: str, url: str) -> dict[str, float]:
    out = subprocess.run([python_of(checkout), "-c", _TURN, url, APP, USER, str(BUDGET)], cwd=checkout, check=True,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": checkout})
    got: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchor", required=True, help="the other checkout (with its own .venv)")
    ap.add_argument("--store", required=True, help="a store scripts/bench_turn.py built (copied, not changed)")
    ap.add_argument("--turns", type=int, default=200)
    args = ap.parse_args()
    sides = {"anchor": os.path.abspath(args.anchor), "this": ROOT}
    with tempfile.TemporaryDirectory(prefix="bench-turn-packs-") as work:
        urls = {side: os.path.join(work, side) for side in sides}
        for side in sides:
            copy_store(args.store, urls[side])
        packs0 = {side: len([n for n in os.listdir(os.path.join(urls[side], "packs")) if n.endswith(".pack")])
                  for side in sides}
        got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for _ in range(args.turns):
            for side, checkout in sides.items():
                got[side].append(turn(checkout, urls[side]))
        rows = []
        for side, checkout in sides.items():
            left = len([n for n in os.listdir(os.path.join(urls[side], "packs")) if n.endswith(".pack")])
            close = [g["close"] for g in got[side]]
            whole = [g["turn"] for g in got[side]]
            rows.append({"side": side, "packs before": packs0[side], "packs after": left,
                         "fresh context instructions": instructions(checkout, urls[side], 8),
                         "close cpu ms median": statistics.median(close), "close cpu ms mean": statistics.fmean(close),
                         "close cpu ms max": max(close),
                         "turn wall ms median": statistics.median(whole), "turn wall ms mean": statistics.fmean(whole)})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
