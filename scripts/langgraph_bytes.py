"""Where a LangGraph thread's writes and bytes go in castore: per turn, by call and by object kind.

Runs ``scripts/bench_langgraph.py``'s graph (one ~500-byte message per turn; ``--noisy``:
messages that do not compress well) through CastoreSaver into a fresh local store, counting
per turn (after a warm-up of 20 turns): the saver's calls, its group commits' object writes
(one log append each in format 2; the objects in them), its ref swap calls (the refs moved
by them: one compare-and-swap each), the fsyncs and fdatasyncs, and the
objects and canonical bytes written. Then it reads every stored object back and sums its
canonical size by kind (checkpoint and writes commits apart), with the size of each
compressed alone; format 2 packs compress neighbours together, so the store's bytes at rest
(after the background repack) are printed too.

    python scripts/langgraph_bytes.py            # 200 turns, durable, format 2
    python scripts/langgraph_bytes.py 100 --format 3   # the default format on local disk
    python scripts/langgraph_bytes.py 400 --no-durable --noisy
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_langgraph as bench

import castore
from castore import objects as o
from castore.adapters.langgraph import CastoreSaver

WARM = 20


def counting(counts: Counter[str], sizes: Counter[str], obj: Any, name: str, key: str,
             size: Callable[..., int] | None = None) -> Callable[[], None]:
    """Wrap ``obj.name`` to count its calls (and sum ``size(args)``); return the undo."""
    real = getattr(obj, name)

    def wrapped(*a: Any, **k: Any) -> Any:
        counts[key] += 1
        if size is not None:
            sizes[key] += size(*a, **k)
        return real(*a, **k)

    setattr(obj, name, wrapped)
    return lambda: setattr(obj, name, real)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("turns", nargs="?", type=int, default=200)
    ap.add_argument("--no-durable", dest="durable", action="store_false", help="no fsync (castore.open(durable=False))")
    ap.add_argument("--noisy", action="store_true", help="messages that do not compress well")
    ap.add_argument("--format", type=int, default=2, choices=(1, 2, 3))
    args = ap.parse_args()
    if args.noisy:
        bench.use_text("noisy")
    root = tempfile.mkdtemp(prefix="langgraph-bytes-")
    store = castore.open(root, durable=args.durable, format=args.format)
    saver = CastoreSaver(store)
    graph = bench.build(False).compile(checkpointer=saver)
    for i in range(1, WARM + 1):
        graph.invoke({"turn": i}, bench.THREAD)
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    undo = [counting(counts, sizes, os, "fsync", "fsync"), counting(counts, sizes, os, "fdatasync", "fdatasync"),
            counting(counts, sizes, saver, "put", "put calls"), counting(counts, sizes, saver, "put_writes",
                                                                         "put_writes calls"),
            counting(counts, sizes, store.plumbing, "write_many", "object writes (appends)",
                     lambda batches: sum(len(b.pending) for b in batches)),  # one group commit's objects
            counting(counts, sizes, store.plumbing, "swap_many", "ref swap calls", len),  # and the refs moved
            counting(counts, sizes, store.objects, "put_encoded", "canonical bytes written",
                     lambda enc, **_: sum(len(b) for _, b in enc))]
    turns = max(args.turns - WARM, 1)
    t = time.perf_counter()
    for i in range(WARM + 1, WARM + turns + 1):
        graph.invoke({"turn": i}, bench.THREAD)
    took = time.perf_counter() - t
    for u in undo:
        u()
    print(f"{turns} turns after {WARM}, durable={args.durable}, format {args.format}"
          f"{', noisy messages' if args.noisy else ''}: {took / turns * 1e3:.2f} ms per turn\n")
    print("| per turn | count | objects or bytes |\n|---|---:|---:|")
    for key in ("put calls", "put_writes calls", "object writes (appends)", "ref swap calls", "fsync",
                "fdatasync", "canonical bytes written"):
        extra = f"{sizes[key] / turns:,.1f}" if key in sizes else ""
        print(f"| {key} | {counts[key] / turns:.2f} | {extra} |")

    count: Counter[str] = Counter()
    canon: Counter[str] = Counter()
    alone: Counter[str] = Counter()
    ids = list(store.objects.iter_ids())
    for oid, data in store.objects.get_canonical_many(ids).items():
        obj = store.objects.get(oid)
        kind = type(obj).__name__ + (f" ({obj.kind})" if isinstance(obj, o.Commit) else "")
        count[kind] += 1
        canon[kind] += len(data)
        alone[kind] += len(o.to_stored(data, True))
    n = args.turns
    store.objects.wait_repack()
    at_rest = sum(os.path.getsize(os.path.join(d, f)) for sub in ("objects", "packs")
                  for d, _, fs in os.walk(os.path.join(root, sub)) for f in fs)
    print(f"\n{n} turns: {sum(canon.values()):,} canonical bytes ({sum(canon.values()) / n:,.0f} per turn); "
          f"{at_rest:,} bytes at rest ({at_rest / n:,.0f} per turn)\n")
    print("| kind | objects per turn | canonical bytes per turn | compressed alone per turn |\n|---|---:|---:|---:|")
    for kind, b in canon.most_common():
        print(f"| {kind} | {count[kind] / n:.2f} | {b / n:,.0f} | {alone[kind] / n:,.0f} |")
    store.close()


if __name__ == "__main__":
    main()
