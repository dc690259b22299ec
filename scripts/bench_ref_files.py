#!/usr/bin/env python
"""The kernel's share of making a new ref file on local disk, by the system calls used.

Makes N new ref files, each in a new session folder (made first, untimed), with each of the
sequences below, alternating ROUNDS times, under WORKDIR; prints the user and system CPU per
ref (``getrusage``), the median over the rounds, and the load average before and after.
Each name operation (create, link, rename, unlink, mkdir) is a transaction of the file
system's journal, which the other writers of the same disk contend for: the system time per
operation grows with the machine's disk load.

- ``linked``: the lock before (docs/FORMAT.md 12): the handle's lock file linked as
  ``<ref>.lock``, the compare's ``open``, a temporary file written and renamed over the ref,
  the lock unlinked;
- ``new-file``: a new ref's lock now: ``<ref>.lock`` created and ``flock``ed, its owner
  written, the compare's ``open``, the value written into it at 0 and the file renamed over
  the ref;
- ``floor``: the ref created and written, no lock, no compare.

    python scripts/bench_ref_files.py WORKDIR [ROUNDS] [N]
"""

from __future__ import annotations

import fcntl
import os
import resource
import shutil
import statistics
import sys

DATA = b"\xff\0ref" + b"x" * 600


def _linked(lock_file: str, path: str) -> None:
    os.link(lock_file, path + ".lock")
    try:
        os.close(os.open(path, os.O_RDWR))
    except FileNotFoundError:
        pass
    tmp = f"{path}.tmp-{os.urandom(16).hex()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    os.write(fd, DATA)
    os.close(fd)
    os.replace(tmp, path)
    os.unlink(path + ".lock")


def _new_file(lock_file: str, path: str) -> None:
    fd = os.open(path + ".lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, b"12345 host\n")
    try:
        os.close(os.open(path, os.O_RDWR))
    except FileNotFoundError:
        pass
    os.pwrite(fd, DATA, 0)
    os.replace(path + ".lock", path)
    os.close(fd)


def _floor(lock_file: str, path: str) -> None:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    os.write(fd, DATA)
    os.close(fd)


def main() -> None:
    if len(sys.argv) not in (2, 3, 4):
        raise SystemExit(__doc__)
    root = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 3000
    ways = {"linked": _linked, "new-file": _new_file, "floor": _floor}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in ways}
    load = os.getloadavg()[0]
    for r in range(rounds):
        for name, way in ways.items() if r % 2 == 0 else reversed(ways.items()):
            d = os.path.join(root, name)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(os.path.join(d, "locks"))
            lock_file = os.path.join(d, "locks", "handle")
            held = os.open(lock_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            fcntl.flock(held, fcntl.LOCK_EX)
            paths = []
            for i in range(n):
                folder = os.path.join(d, "refs", "sessions", "claude", f"-home-user-proj{i // 50}", f"s-{i:06d}")
                os.makedirs(os.path.join(folder, "heads"))
                paths.append(os.path.join(folder, "heads", "main"))
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            for p in paths:
                way(lock_file, p)
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            got[name].append(((r1.ru_utime - r0.ru_utime) / n * 1e6, (r1.ru_stime - r0.ru_stime) / n * 1e6))
            os.close(held)
            shutil.rmtree(d)
    print(f"{n} new ref files a round, {rounds} rounds alternated; load {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after; per ref, median:")
    for name, v in got.items():
        print(f"  {name}: user {statistics.median(x[0] for x in v):.1f} us, system "
              f"{statistics.median(x[1] for x in v):.1f} us ({', '.join(f'{x[1]:.0f}' for x in v)})")


if __name__ == "__main__":
    main()
