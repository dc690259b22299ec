#!/usr/bin/env python
"""The CPU and wall time of a durable append (the per-turn write) on local disk, per append.

Opens a fresh local store under WORKDIR (the default format) and appends N messages to one
session, one durable ``Session.append`` each, ROUNDS times (a new store each); prints per
append the main thread's user and system CPU (``getrusage(RUSAGE_THREAD)``) and the wall
time, the median and the minimum over the rounds, and the load average before and after.

    .venv/bin/python scripts/bench_append_cpu.py WORKDIR [N] [ROUNDS]
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import sys
import time


def main() -> None:
    if len(sys.argv) not in (2, 3, 4):
        raise SystemExit(__doc__)
    work = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    import castore

    load = os.getloadavg()[0]
    got: list[tuple[float, float, float]] = []
    for r in range(rounds):
        root = os.path.join(work, f"append-{r}")
        shutil.rmtree(root, ignore_errors=True)
        with castore.open(root) as st:
            s = st.session("bench", "u", "s")
            s.append(castore.Message(role="user", content="first"))  # the log and the ref made
            r0, w0 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
            for i in range(n):
                s.append(castore.Message(role="user", content=f"turn {i}: " + "words " * 20))
            r1, w1 = resource.getrusage(resource.RUSAGE_THREAD), time.perf_counter()
            got.append(((r1.ru_utime - r0.ru_utime) / n, (r1.ru_stime - r0.ru_stime) / n, (w1 - w0) / n))
        shutil.rmtree(root, ignore_errors=True)
    print(f"{n} durable appends, {rounds} rounds; load {load:.1f} before, {os.getloadavg()[0]:.1f} after; per append:")
    for i, what in enumerate(("user CPU", "system CPU", "wall")):
        per = [g[i] * 1e6 for g in got]
        print(f"  {what}: median {statistics.median(per):.0f} us, min {min(per):.0f} us "
              f"({', '.join(f'{p:.0f}' for p in per)})")


if __name__ == "__main__":
    main()
