#!/usr/bin/env python
"""The CPU of landing an import's new refs on local disk (format 3), per ref.

Reads every ref of SOURCE (a store an import made: ``castore --store SOURCE import claude
FOLDER``) and lands them all, new, into a fresh local store, as a write batch's landing does
(:func:`castore.groupcommit.land_staged`: every ref but the HEADs, then the HEADs, in
``swap_many`` calls of at most 512 refs, each compared against "absent", their intents
journaled in the writer's log), ROUNDS times, each into a new store under WORKDIR. Prints the
main thread's user and system CPU (``getrusage(RUSAGE_THREAD)``) of each landing per ref, the median
and the minimum, and the load average before and after. The objects the refs name are not
written (the landing does not read them); one small blob opens the writer's log, as a
landing's objects do.

    .venv/bin/python scripts/bench_land_refs.py SOURCE WORKDIR [ROUNDS]
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys


def main() -> None:
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    source, work = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) == 4 else 7
    import castore
    from castore import objects as o
    from castore.groupcommit import land_staged
    from castore.refs import Staged

    with castore.open(source) as src:
        names = src.plumbing.refs.list("")
        values = [src.plumbing.refs.read(n) for n in names]
    changes = [Staged(v.name, None, v) for v in values if v is not None]
    load = os.getloadavg()[0]
    spent = []
    for r in range(rounds):
        dest = os.path.join(work, f"land-{r}")
        shutil.rmtree(dest, ignore_errors=True)
        with castore.open(dest, format=3) as st:
            st.objects.put_encoded([o.encode(o.Blob(data=os.urandom(16)))], sync=False)
            u0, s0 = _thread_times()
            failed = land_staged(st.plumbing, changes)
            u1, s1 = _thread_times()
            spent.append((u1 - u0, s1 - s0))
            assert not failed, failed
        shutil.rmtree(dest, ignore_errors=True)
    print(f"{len(changes):,} refs landed new, {rounds} rounds; load {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; main thread CPU per ref:")
    for i, what in enumerate(("user", "system")):
        per = [s[i] / len(changes) * 1e6 for s in spent]
        print(f"  {what}: median {statistics.median(per):.1f} us, min {min(per):.1f} us "
              f"({', '.join(f'{p:.0f}' for p in per)})")


def _thread_times() -> tuple[float, float]:
    """The calling thread's user and system CPU seconds (Linux: RUSAGE_THREAD)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime, r.ru_stime


if __name__ == "__main__":
    main()
