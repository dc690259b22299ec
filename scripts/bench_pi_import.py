#!/usr/bin/env python
"""Benchmark: import a generated ~200 MB Pi session with large inline images.

Generates a Pi v3 JSONL file (coding turns: user, assistant tool call, tool result, and a
screenshot every few turns, a third of them repeats), imports it into a fresh local store
in a child process, and reports the time, the child's peak memory (``ru_maxrss``), the
bytes stored, and the round trip (export equals the file, as JSON values).

    .venv/bin/python scripts/bench_pi_import.py [--mb 200] [--store DIR] [--keep]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, resource, sys, time
import castore
from castore.adapters import pi
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store = castore.open(sys.argv[1], durable=False)
t = time.perf_counter()
r = pi.import_session(store, sys.argv[2])
took = time.perf_counter() - t
print(json.dumps({"seconds": took, "entries": r.entries, "blobs": r.blobs, "bytes_written": r.bytes_written,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "baseline_kb": base,
                  "key": list(r.key)}))
"""

EXPORT_CHILD = r"""
import json, resource, sys, time
import castore
from castore.adapters import pi
store = castore.open(sys.argv[1], durable=False)
t = time.perf_counter()
n = pi.export_session(store.session(*sys.argv[3:6]), out=sys.argv[2])
print(json.dumps({"seconds": time.perf_counter() - t, "lines": n,
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def generate(path: str, target_mb: int, seed: int = 1) -> dict[str, int]:
    """Write a Pi v3 session of about ``target_mb`` MB; return counts."""
    rnd = random.Random(seed)
    pool: list[str] = []
    size = images = repeats = lines = 0
    t0 = 1_773_000_000_000
    with open(path, "w", encoding="utf-8") as f:
        def put(e: dict) -> None:
            nonlocal size, lines
            s = json.dumps(e, separators=(",", ":")) + "\n"
            f.write(s)
            size += len(s)
            lines += 1

        put({"type": "session", "version": 3, "id": "bench-0001", "timestamp": "2026-03-10T09:00:00.000Z",
             "cwd": "/bench"})
        parent, n = None, 0

        def entry(kind: str, **fields: object) -> None:
            nonlocal parent, n
            n += 1
            eid = f"{n:08x}"
            put({"type": kind, "id": eid, "parentId": parent, "timestamp": f"2026-03-10T09:{n // 60 % 60:02d}:"
                 f"{n % 60:02d}.000Z", **fields})
            parent = eid

        entry("model_change", provider="anthropic", modelId="claude-sonnet-4-5")
        turn = 0
        while size < target_mb * 1_000_000:
            turn += 1
            ms = t0 + turn * 1000
            content: list[dict] = [{"type": "text", "text": f"turn {turn}: " + "please fix the bug " * 20}]
            if turn % 3 == 0:
                if pool and rnd.random() < 0.33:
                    data = rnd.choice(pool)
                    repeats += 1
                else:
                    data = base64.b64encode(rnd.randbytes(rnd.randint(200_000, 600_000))).decode()
                    pool.append(data)
                    if len(pool) > 20:
                        pool.pop(0)
                images += 1
                content.append({"type": "image", "data": data, "mimeType": "image/png"})
            entry("message", message={"role": "user", "content": content, "timestamp": ms})
            entry("message", message={
                "role": "assistant", "content": [{"type": "toolCall", "id": f"call_{turn}", "name": "read",
                                                  "arguments": {"path": f"src/f{turn % 50}.ts"}}],
                "api": "anthropic-messages", "provider": "anthropic", "model": "claude-sonnet-4-5",
                "usage": {"input": 100, "output": 20, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 120,
                          "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}},
                "stopReason": "toolUse", "timestamp": ms + 1})
            entry("message", message={
                "role": "toolResult", "toolCallId": f"call_{turn}", "toolName": "read",
                "content": [{"type": "text", "text": f"// file {turn % 50}\n" + "const x = 1;\n" * 200}],
                "isError": False, "timestamp": ms + 2})
    return {"bytes": size, "lines": lines, "images": images, "repeated_images": repeats}


def dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200, help="size of the generated file in MB")
    ap.add_argument("--store", help="store directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the generated file and store")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="bench-pi-")
    src = os.path.join(work, "session.jsonl")
    store = args.store or os.path.join(work, "store")
    try:
        t = time.perf_counter()
        gen = generate(src, args.mb)
        print(f"generated {gen['bytes'] / 1e6:.1f} MB, {gen['lines']} lines, {gen['images']} images "
              f"({gen['repeated_images']} repeats) in {time.perf_counter() - t:.1f} s")
        out = subprocess.run([sys.executable, "-c", CHILD, store, src], check=True, capture_output=True, text=True)
        r = json.loads(out.stdout)
        stored = dir_bytes(os.path.join(store, "objects"))
        print(f"import: {r['seconds']:.1f} s, {r['entries']} entries, {r['blobs']} image references")
        print(f"peak memory (ru_maxrss of the importing process): {r['maxrss_kb'] / 1024:.0f} MB "
              f"(after `import castore`: {r['baseline_kb'] / 1024:.0f} MB); file: {gen['bytes'] / 1e6:.0f} MB")
        print(f"stored: {stored / 1e6:.1f} MB of objects ({stored / gen['bytes']:.2f} x the file)")
        exp = os.path.join(work, "exported.jsonl")
        out = subprocess.run([sys.executable, "-c", EXPORT_CHILD, store, exp, *r["key"]], check=True,
                             capture_output=True, text=True)
        e = json.loads(out.stdout)
        with open(src, encoding="utf-8") as a, open(exp, encoding="utf-8") as b:
            same = all(json.loads(x) == json.loads(y) for x, y in zip(a, b, strict=True))
        print(f"export: {e['seconds']:.1f} s, peak memory {e['maxrss_kb'] / 1024:.0f} MB, "
              f"round trip {'identical' if same else 'DIFFERENT'}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")


if __name__ == "__main__":
    main()
