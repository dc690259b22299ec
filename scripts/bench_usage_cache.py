#!/usr/bin/env python3
"""How long ``castore usage`` takes to read its cache file: the reader that checks the file's
shape as it parses it (``castore.usage.cache._load_cache``, msgspec with a TypedDict, adversary54)
against the reader before it (untyped ``json_loads`` and a few isinstance checks), on a cache of
SESSIONS x ROWS rows written by ``json_dumps_sorted`` as the cache is, alternated in one process
with the collector paused (as ``usage`` runs), ROUNDS rounds; medians and their ratio. With
``--one new|old``: read it once and leave (for callgrind's instruction counts:
``valgrind --tool=callgrind --callgrind-out-file=/dev/null python scripts/bench_usage_cache.py --one new``,
less the same with ``--one none``, which only builds and writes the file).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from castore.objects import json_dumps_sorted, json_loads
from castore.usage.cache import CACHE_VERSION, _load_cache


def _write(path: str, sessions: int, rows: int) -> None:
    doc = {f"sessions/claude/p/s{i}": {
        "key": ["claude", "p", f"s{i}"], "refs": {"HEAD": "ref: heads/main", "heads/main": "ab" * 32}, "head": "main",
        "rows": [["cd" * 32, f"claude:msg_{i}_{j}:claude-sonnet-4-5", "claude-sonnet-4-5", 1.7e9 + j, 10, 200, 3000,
                  40, "main"] for j in range(rows)]} for i in range(sessions)}
    with open(path, "wb") as f:
        f.write(json_dumps_sorted({"version": CACHE_VERSION, "url": "/x", "mark": "m", "sessions": doc}))


def _old(path: str) -> dict[str, Any]:
    with open(path, "rb") as f:
        doc = json_loads(f.read())
    ok = isinstance(doc, dict) and doc.get("version") == CACHE_VERSION and doc.get("url") == "/x" \
        and isinstance(doc.get("sessions"), dict)
    assert ok
    return doc


def _new(path: str) -> dict[str, Any]:
    doc = _load_cache(path, "/x")
    assert doc
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--one", choices=("old", "new", "none"))
    a = ap.parse_args()
    path = os.path.join(tempfile.mkdtemp(prefix="bench-usage-cache-"), "cache.json")
    _write(path, a.sessions, a.rows)
    gc.disable()
    if a.one:
        {"old": _old, "new": _new, "none": lambda p: {}}[a.one](path)
        return 0
    times: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(a.rounds):
        for name, read in (("old", _old), ("new", _new)):
            t = time.perf_counter()
            read(path)
            times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"cache of {a.sessions} sessions x {a.rows} rows, {os.path.getsize(path):,} bytes, {a.rounds} rounds "
          f"alternated: old {med['old'] * 1000:.1f} ms, new {med['new'] * 1000:.1f} ms, "
          f"new/old {med['new'] / med['old']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
