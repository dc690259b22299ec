#!/usr/bin/env python
"""Session cost benchmark (not a test): prints tables and exits 0.

1. Append: time and bytes per append, first vs last 10% of N appends (durable, local disk).
2. Storage: T turns of ~500-byte messages, each with a state delta: stored object bytes and
   disk usage against the raw payload (the messages' content bytes), every step's state
   reachable (verified).
3. Fork, branch, checkout, label: time and bytes at a short and a long session.

Usage: .venv/bin/python scripts/bench_session.py [--appends 5000] [--turns 1600] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import castore  # noqa: E402
from castore import Event, Message  # noqa: E402

_WORDS = (
    "the weather in beijing is sunny with a light breeze and temperatures around twenty degrees "
    "tomorrow expect rain later in the week please bring an umbrella when you go out the forecast "
    "model says humidity will rise pressure falls wind from the north east clouds gather evening"
).split()


def text(rng: random.Random, size: int) -> str:
    """About ``size`` bytes of word salad (compresses like prose, not like random bytes)."""
    out: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


def tree_size(root: str, sub: str = "objects") -> tuple[int, int, int]:
    """(sum of file sizes, disk usage in bytes from st_blocks, file count) under root/sub."""
    total = blocks = files = 0
    for dirpath, _dirs, names in os.walk(os.path.join(root, sub)):
        for name in names:
            st = os.stat(os.path.join(dirpath, name))
            total += st.st_size
            blocks += st.st_blocks * 512
            files += 1
    return total, blocks, files


def bench_append(workdir: str, n: int) -> tuple[castore.Session, str]:
    url = os.path.join(workdir, "append")
    rng = random.Random(1)
    st = castore.open(url)
    s = st.session("bench", "u", "s")
    tenth = max(1, n // 10)
    times: list[float] = []
    sizes: dict[int, int] = {0: 0}
    for i in range(n):
        e = Event(author="agent", message=Message(role="user" if i % 2 else "assistant", content=text(rng, 500)),
                  state_delta={"turn": i, "topic": rng.choice(_WORDS)})
        t0 = time.perf_counter()
        s.append(e)
        times.append(time.perf_counter() - t0)
        if i + 1 in (tenth, n - tenth, n):
            sizes[i + 1] = tree_size(url)[0]
    first, last = times[:tenth], times[-tenth:]
    print(f"\n## Append ({n} appends, durable, local disk)")
    print("| window | median ms/append | mean ms/append | bytes written/append |")
    print("|---|---|---|---|")
    print(f"| first 10% | {statistics.median(first) * 1e3:.2f} | {statistics.mean(first) * 1e3:.2f} | "
          f"{sizes[tenth] / tenth:.0f} |")
    print(f"| last 10% | {statistics.median(last) * 1e3:.2f} | {statistics.mean(last) * 1e3:.2f} | "
          f"{(sizes[n] - sizes[n - tenth]) / tenth:.0f} |")
    return s, url


def bench_storage(workdir: str, turns: int, wide: bool = False) -> None:
    """``wide``: the state also keeps 20 rotating 40-byte notes (a 22-key state rewritten each step)."""
    url = os.path.join(workdir, "storage-wide" if wide else "storage")
    rng = random.Random(2)
    st = castore.open(url, durable=False)
    s = st.session("bench", "u", "s")
    raw = 0
    for i in range(turns):
        content = text(rng, 500)
        raw += len(content.encode())
        s.append(Event(author="user" if i % 2 else "agent",
                       message=Message(role="user" if i % 2 else "assistant", content=content),
                       state_delta={"turn": i, "last_city": rng.choice(_WORDS),
                                    **({f"note{i % 20}": content[:40]} if wide else {})}))
    report = s.verify()  # every step's snapshot is stored and equals the replay
    assert report["commits"] == turns
    ids = [e.id for e in s.entries()]
    for i in (0, turns // 2, turns - 1):
        assert s.state(ids[i], scopes=False)["turn"] == i
    size, blocks, files = tree_size(url)
    refs, ref_blocks, _ = tree_size(url, "refs")
    kinds: dict[str, list[int]] = {}
    for oid in st.objects.iter_ids():
        obj = st.objects.get(oid)
        kinds.setdefault(type(obj).__name__, []).append(os.path.getsize(os.path.join(url, "objects", oid[:2], oid[2:])))
    shape = "a 22-key state: turn, last_city, 20 rotating notes" if wide else "delta {turn, last_city}"
    print(f"\n## Storage ({turns} turns of ~500-byte messages, {shape})")
    print("| measure | bytes | / raw payload |")
    print("|---|---|---|")
    print(f"| raw payload (message content) | {raw:,} | 1.00 |")
    print(f"| stored objects (sum of sizes, {files} files) | {size:,} | {size / raw:.2f} |")
    print(f"| disk usage of objects (st_blocks) | {blocks:,} | {blocks / raw:.2f} |")
    print(f"| refs (sum of sizes / disk usage) | {refs:,} / {ref_blocks:,} | |")
    print("\n| object kind | count | bytes | / raw payload |")
    print("|---|---|---|---|")
    for kind, sz in sorted(kinds.items()):
        print(f"| {kind} | {len(sz)} | {sum(sz):,} | {sum(sz) / raw:.2f} |")


def bench_ops(s: castore.Session, url: str, label: str) -> list[str]:
    rows = []
    root = url

    def measure(name: str, fn, reps: int = 10) -> None:  # noqa: ANN001
        before = sum(tree_size(root, sub)[0] for sub in ("objects", "refs"))
        t0 = time.perf_counter()
        for r in range(reps):
            fn(r)
        dt = (time.perf_counter() - t0) / reps
        after = sum(tree_size(root, sub)[0] for sub in ("objects", "refs"))
        rows.append(f"| {label} | {name} | {dt * 1e3:.2f} | {(after - before) / reps:.0f} |")

    tag = str(int(time.time() * 1000))
    measure("branch at HEAD~10", lambda r: s.branch(f"b{tag}{r}", at="HEAD~10"))
    measure("label at HEAD~5", lambda r: s.label("HEAD~5", f"l{tag}{r}"))
    measure("fork at HEAD", lambda r: s.fork(f"f{tag}{r}"))
    measure("checkout branch / main", lambda r: s.checkout(f"b{tag}{r}" if r % 2 == 0 else "main"))
    s.checkout("main")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--appends", type=int, default=5000)
    ap.add_argument("--turns", type=int, default=1600)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed)")
    args = ap.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="castore-bench-")
    try:
        print(f"# castore session benchmark (K={castore.history.K}, python {sys.version.split()[0]})")
        long_s, long_url = bench_append(workdir, args.appends)
        bench_storage(workdir, args.turns)
        bench_storage(workdir, args.turns, wide=True)
        short_url = os.path.join(workdir, "short")
        short = castore.open(short_url).session("bench", "u", "s")
        rng = random.Random(3)
        for i in range(100):
            short.append(Message(role="user", content=text(rng, 500)), state_delta={"turn": i})
        print("\n## Fork, branch, checkout, label (durable, local disk; mean of 10)")
        print("| session length | operation | ms | bytes written |")
        print("|---|---|---|---|")
        for row in bench_ops(short, short_url, "N=100") + bench_ops(long_s, long_url, f"N={args.appends}"):
            print(row)
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
