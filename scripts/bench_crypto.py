#!/usr/bin/env python
"""Encrypted against plain store, side by side in one run (not a test): prints a table, exits 0.

1. Durable append on local disk: an agent turn (``context()`` then ``append`` of a ~400-byte
   message), the plain and the sealed store turn by turn, alternated; median per turn.
2. Cold read of N entries (default 10,000; messages and state): a fresh process opens the
   store (its codec given the keys) and reads every message and the state; the time inside
   the child after its imports (the sealed child's include cryptography's, made by its
   cipher), the imports, and the whole process, plain and sealed alternated.
3. Bytes stored: every file of each store folder after the appends and the build (logs
   sealed at close), and after ``repack``.

The sealed store's codec: ``Codec(id_key, AeadCipher(key), tenant=b"bench/user")``, random keys.
Targets (issue 36): append <= 1.15x, cold read <= 1.2x, bytes <= 1.05x.

Usage: .venv/bin/python -m compileall -q castore
       .venv/bin/python scripts/bench_crypto.py [--turns 400] [--entries 10000] [--reps 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from castore import Message
from castore.crypto.aead import AeadCipher
from castore.objects import PLAIN, Codec
from castore.storage import open_storage
from castore.store import Store

_WORDS = ("the weather in beijing is sunny with a light breeze and temperatures around twenty degrees "
          "tomorrow expect rain later in the week please bring an umbrella when you go out").split()

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
from castore.crypto.aead import AeadCipher
from castore.objects import PLAIN, Codec
from castore.storage import open_storage
from castore.store import Store
url, keys = sys.argv[1], json.loads(sys.argv[2])
# the cipher imports cryptography: an import, counted with the others
codec = PLAIN if not keys else Codec(bytes.fromhex(keys[0]), AeadCipher(bytes.fromhex(keys[1])), b"bench/user")
t1 = time.perf_counter()
with Store(open_storage(url), codec=codec) as st:
    s = st.session("bench", "user", "s")
    n = len(s.messages())
    state = s.state()
t2 = time.perf_counter()
print(json.dumps({"n": n, "keys": len(state), "read_ms": (t2 - t1) * 1e3, "import_ms": (t1 - t0) * 1e3}))
"""


def text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < size:
        out.append(rng.choice(_WORDS))
    return " ".join(out)[:size]


def folder_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def open_store(path: str, codec: Codec, durable: bool = True) -> Store:
    return Store(open_storage(path, durable=durable), codec=codec)


def bench_append(work: str, codecs: dict[str, Codec], turns: int) -> dict[str, list[float]]:
    """Per-turn seconds of context() + append, the stores alternated turn by turn."""
    stores = {k: open_store(os.path.join(work, f"append-{k}"), c) for k, c in codecs.items()}
    sessions = {k: st.session("bench", "user", "s") for k, st in stores.items()}
    for s in sessions.values():
        s.append(Message(role="system", content="you are a weather bot"))
    rng = random.Random(1)
    times: dict[str, list[float]] = {k: [] for k in codecs}
    for i in range(turns):
        msg = text(rng, 400)
        role = "user" if i % 2 == 0 else "assistant"
        order = list(codecs) if i % 2 == 0 else list(reversed(codecs))
        for k in order:
            s = sessions[k]
            t = time.perf_counter()
            s.context()
            s.append(Message(role=role, content=msg), state_delta={"turn": i} if i % 10 == 0 else None)
            times[k].append(time.perf_counter() - t)
    for st in stores.values():
        st.close()
    return times


def build(path: str, codec: Codec, n: int) -> None:
    """A session of ``n`` entries appended in turns of two (as an agent writes), state every 10."""
    rng = random.Random(2)
    with open_store(path, codec, durable=False) as st:
        s = st.session("bench", "user", "s")
        for i in range(0, n, 2):
            s.append_many([Message(role="user", content=text(rng, 300)),
                           Message(role="assistant", content=text(rng, 500))],
                          state_delta={f"k{i % 50}": i} if i % 10 == 0 else None)


def cold_read(path: str, keys: list[str]) -> dict[str, float]:
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _CHILD, path, json.dumps(keys)], check=True,
                         capture_output=True, text=True).stdout
    got = json.loads(out)
    got["wall_ms"] = (time.perf_counter() - t) * 1e3
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=400)
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-crypto-", dir=args.dir)
    id_key, key = os.urandom(32), os.urandom(32)
    codecs = {"plain": PLAIN, "sealed": Codec(id_key, AeadCipher(key), b"bench/user")}
    keys = {"plain": [], "sealed": [id_key.hex(), key.hex()]}
    try:
        print(f"castore encrypted vs plain store, local disk ({work}), one run")
        times = bench_append(work, codecs, args.turns)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"\n1. durable append (context() + append), {args.turns} turns, median ms per turn")
        for k in codecs:
            print(f"   {k:7s} {med[k]:7.3f} ms")
        append_ratio = med["sealed"] / med["plain"]
        print(f"   ratio   {append_ratio:7.3f}x  (target <= 1.15)")

        for k, c in codecs.items():
            build(os.path.join(work, f"read-{k}"), c, args.entries)
        reads: dict[str, list[dict[str, float]]] = {k: [] for k in codecs}
        for r in range(args.reps):
            for k in (codecs if r % 2 == 0 else list(reversed(codecs))):
                reads[k].append(cold_read(os.path.join(work, f"read-{k}"), keys[k]))
        print(f"\n2. cold read of {args.entries:,} entries + state in a fresh process, median of {args.reps}")
        rmed = {k: statistics.median(x["read_ms"] for x in v) for k, v in reads.items()}
        wmed = {k: statistics.median(x["wall_ms"] for x in v) for k, v in reads.items()}
        imed = {k: statistics.median(x["import_ms"] for x in v) for k, v in reads.items()}
        for k in codecs:
            assert reads[k][0]["n"] == args.entries, reads[k][0]
            print(f"   {k:7s} read {rmed[k]:8.1f} ms   imports {imed[k]:7.1f} ms   whole process {wmed[k]:8.1f} ms")
        read_ratio = rmed["sealed"] / rmed["plain"]
        print(f"   ratio   read {read_ratio:.3f}x   whole process {wmed['sealed'] / wmed['plain']:.3f}x"
              "  (target <= 1.2)")

        print("\n3. bytes stored (every file of the store folder)")
        sizes = {}
        for phase in ("as written", "after repack"):
            if phase == "after repack":
                for k, c in codecs.items():
                    for what in ("append", "read"):
                        with open_store(os.path.join(work, f"{what}-{k}"), c) as st:
                            st.objects.repack(all_packs=True)
            for what in ("append", "read"):
                b = {k: folder_bytes(os.path.join(work, f"{what}-{k}")) for k in codecs}
                sizes[(phase, what)] = b["sealed"] / b["plain"]
                print(f"   {phase:12s} {what:6s} plain {b['plain']:>11,}  sealed {b['sealed']:>11,}  "
                      f"ratio {b['sealed'] / b['plain']:.3f}x  (target <= 1.05)")
        print(f"\nsummary: append {append_ratio:.3f}x, cold read {read_ratio:.3f}x, bytes "
              + ", ".join(f"{p} {w} {v:.3f}x" for (p, w), v in sizes.items()))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
