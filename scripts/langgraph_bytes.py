"""Where a LangGraph thread's bytes go in castore: stored bytes per turn by object kind.

Runs ``scripts/bench_langgraph.py``'s graph (one ~500-byte message per turn) through
CastoreSaver into a fresh local store, then reads every stored object back and sums its
file size by kind (checkpoint and writes commits apart).

    python scripts/langgraph_bytes.py            # 200 turns, durable
    python scripts/langgraph_bytes.py 400 --no-durable
    strace -f -c -e trace=fsync python scripts/langgraph_bytes.py 60   # fsyncs per turn
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_langgraph as bench  # noqa: E402

import castore  # noqa: E402
from castore.adapters.langgraph import CastoreSaver  # noqa: E402
from castore.objects import Commit  # noqa: E402
from castore.objectstore import object_key  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("turns", nargs="?", type=int, default=200)
    ap.add_argument("--no-durable", dest="durable", action="store_false", help="no fsync (castore.open(durable=False))")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="langgraph-bytes-")
    store = castore.open(root, durable=args.durable)
    graph = bench.build(False).compile(checkpointer=CastoreSaver(store))
    for i in range(1, args.turns + 1):
        graph.invoke({"turn": i}, bench.THREAD)
    count: Counter[str] = Counter()
    size: Counter[str] = Counter()
    for oid in store.objects.iter_ids():
        obj = store.objects.get(oid)
        kind = type(obj).__name__ + (f" ({obj.kind})" if isinstance(obj, Commit) else "")
        count[kind] += 1
        size[kind] += os.path.getsize(os.path.join(root, *object_key(oid).split("/")))
    total = sum(size.values())
    print(f"{args.turns} turns, {total:,} stored bytes, {total / args.turns:,.0f} per turn\n")
    print("| kind | objects | bytes | per turn |\n|---|---:|---:|---:|")
    for kind, n in size.most_common():
        print(f"| {kind} | {count[kind]:,} | {n:,} | {n / args.turns:,.0f} |")
    store.close()


if __name__ == "__main__":
    main()
