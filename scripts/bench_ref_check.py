#!/usr/bin/env python
"""Benchmark: what checking HEAD costs a re-import (``Session.exists`` parses the ref's bytes,
once for the same bytes, so that a garbage HEAD is an error rather than a session that exists).

Builds a Claude Code folder of SIZE MB as ``scripts/bench_import.py`` does, imports it once,
then times the re-import with nothing new (``import_claude`` in this process, CPU time: the
machine is shared, and the check is CPU work), ROUNDS rounds alternating between the check as
it is and the check left out (``RefStore.exists`` answering from the bytes' presence alone, as
before). Prints the medians, each run, the calls of ``Session.exists`` and the load average.

    .venv/bin/python scripts/bench_ref_check.py [--size-mb 20] [--rounds 11] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_import

import castore
from castore import refs
from castore.adapters.claude_code import import_claude
from castore.session import Session


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--workdir", help="keep the folder and store here (default: a temporary folder, removed)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-ref-check-"))
    load0 = os.getloadavg()[0]
    try:
        folder, store_dir = work / "projects", work / "store"
        if not folder.exists():
            bench_import.generate(folder, a.size_mb)
        if not store_dir.exists():
            with castore.open(str(store_dir)) as st:
                import_claude(st, str(folder))
        checked = refs.check_ref
        times: dict[str, list[float]] = {"checked": [], "unchecked": []}
        calls = [0]
        counted = Session.exists

        def exists(self: Session) -> bool:
            calls[0] += 1
            return counted(self)

        Session.exists = exists  # type: ignore[method-assign]
        for r in range(a.rounds):
            order = ["checked", "unchecked"] if r % 2 == 0 else ["unchecked", "checked"]
            for what in order:
                refs.check_ref = checked if what == "checked" else (lambda name, data: None)
                calls[0] = 0
                with castore.open(str(store_dir)) as st:
                    t = time.process_time()
                    results = import_claude(st, str(folder))
                    times[what].append(time.process_time() - t)
                assert sum(x.lines for x in results) == 0, "the re-import found new lines"
        refs.check_ref = checked
        load1 = os.getloadavg()[0]
        print(f"{len(results)} files, {calls[0]} Session.exists calls per re-import; load {load0:.1f} before, "
              f"{load1:.1f} after")
        for what, ts in times.items():
            print(f"re-import, HEAD {what}: median {statistics.median(ts):.3f} s CPU "
                  f"({', '.join(f'{x:.3f}' for x in ts)})")
        d = statistics.median(times["checked"]) - statistics.median(times["unchecked"])
        print(f"the check: {d * 1000:+.1f} ms, {d / len(results) * 1e6:+.1f} us a file, "
              f"x{statistics.median(times['checked']) / statistics.median(times['unchecked']):.3f}")
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
