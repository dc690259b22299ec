#!/usr/bin/env python
"""The per-line stages of ``castore import claude``, alone, over every line of a folder.

Reads every ``.jsonl`` line of FOLDER and runs each stage over all of them, with Python's
cyclic collector paused (as the import runs): ``parse_vouched`` (msgspec parse), ``encode_blob``
(the raw line's blob, hashed), the Claude ``_entry`` (message, usage, time), ``Paths.place``
with the loop's field reads, ``prepare`` (what an append checks of an entry; a new session's
lines are not prepared since 2026-12-07) and ``Tree.extend`` (a session per file built in
memory from its entries, in a write batch that is never landed). Prints each stage's main-thread CPU per line,
the minimum of ROUNDS rounds. With STAGE names, runs only those (once each under
``valgrind --tool=callgrind``, the difference from a run with the stage ``none`` is its
instruction count).

    .venv/bin/python scripts/bench_import_lines.py FOLDER [ROUNDS] [STAGE ...]
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

import castore
from castore import objects as o
from castore.adapters import claude_code as cc
from castore.adapters import jsonl_tree as jt
from castore.adapters.claude_tree import Paths, role_of
from castore.entries import INJECTED, prepare

# the private stages this script times (the adapter's own: no public name)
ENTRY = cc._entry  # noqa: SLF001
TYPE_UUID = cc._type_uuid  # noqa: SLF001


class _Dropped(Exception):
    """Raised inside the write batch so that it lands nothing."""


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    folder = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    only = set(sys.argv[3:])
    files: list[list[bytes]] = []
    for root, _dirs, names in sorted(os.walk(folder)):
        for name in sorted(names):
            if name.endswith(".jsonl"):
                with open(os.path.join(root, name), "rb") as f:
                    files.append([line for line in f if line.strip()])
    lines = [line for f in files for line in f]
    codec = o.PLAIN
    parsed = [jt.parse_vouched(r) for r in lines]
    dicts = [d if isinstance(d, dict) else {} for d, _ in parsed]
    blobs = [jt.encode_blob(r, codec) for r in lines]
    entries = [ENTRY(i, b[0], d, v) for i, (d, (_, v), b) in enumerate(zip(dicts, parsed, blobs, strict=True))]
    times = [float(e.meta.get("time", 0.0)) for e in entries]
    tmp = tempfile.mkdtemp()
    store = castore.open(os.path.join(tmp, "store"))
    made = [0]

    def parse() -> None:
        for raw in lines:
            jt.parse_vouched(raw)

    def blob() -> None:
        for raw in lines:
            jt.encode_blob(raw, codec)

    def entry() -> None:
        for i, (d, (_, v), b) in enumerate(zip(dicts, parsed, blobs, strict=True)):
            ENTRY(i, b[0], d, v)

    def place() -> None:
        i = 0
        for f in files:
            paths, uuids, cursor = Paths({}), {}, None
            for n in range(len(f)):
                d = dicts[i]
                t, u = TYPE_UUID(d)
                p = d.get("parentUuid")
                paths.place(n, u, p if isinstance(p, str) else None,
                            role_of(t, u is not None, entries[i].meta.get(INJECTED)), cursor, uuids)
                if u is not None:
                    uuids.setdefault(u, n)
                cursor, i = n, i + 1

    def prep() -> None:
        for e in entries:
            prepare(e, at=1.0)

    def extend() -> None:
        made[0] += 1
        try:
            with store.batch():
                i = 0
                for k, f in enumerate(files):
                    store.session("claude", f"p{made[0]}", f"s{k}").tree().extend(None, entries[i:i + len(f)],
                                                                                times[i:i + len(f)])
                    i += len(f)
                raise _Dropped
        except _Dropped:
            pass

    stages: list[tuple[str, Callable[[], None]]] = [
        ("parse_vouched", parse), ("encode_blob", blob), ("_entry", entry), ("place", place),
        ("prepare", prep), ("Tree.extend", extend)]
    gc.collect()
    gc.freeze()
    gc.disable()
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, run in stages:
            if only and name not in only:
                continue
            t = time.thread_time()
            run()
            best[name] = min(best.get(name, float("inf")), time.thread_time() - t)
    for name, _ in stages:
        if name in best:
            print(f"{name:14s} {best[name] / len(lines) * 1e6:7.2f} us a line")
    print(f"{len(lines):,} lines in {len(files):,} files")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
