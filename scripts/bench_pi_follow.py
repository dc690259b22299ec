"""Benchmark: what following a Pi session costs per round (castore import pi, incremental).

Takes the real Pi files of tests/data/pi (v1; written as v3, the form Pi keeps them in once it
has opened them), then times: the first import of the file, an import with nothing new (what
``--follow`` does most rounds), an import of one new entry that goes on from the last one, and
``import_session`` of the whole file into a new store. Local disk, ``durable=False``.

    .venv/bin/python -m compileall -q castore && .venv/bin/python scripts/bench_pi_follow.py
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import castore  # noqa: E402
from castore.adapters import pi  # noqa: E402


def _ms(fn: object) -> tuple[float, object]:
    t = time.perf_counter()
    got = fn()  # type: ignore[operator]
    return (time.perf_counter() - t) * 1000, got


def bench(name: str, d: str) -> None:
    src = os.path.join(d, name)
    Path(src).write_bytes(lzma.decompress((ROOT / "tests" / "data" / "pi" / f"{name}.xz").read_bytes()))
    tmp = castore.open(os.path.join(d, "tmp"), durable=False)
    f = os.path.join(d, "s.jsonl")
    with open(f, "w", encoding="utf-8") as out:
        pi.export_session(tmp.session(*pi.import_session(tmp, src).key), out=out)
    v3 = Path(f).read_bytes()
    st = castore.open(os.path.join(d, "store"), durable=False)
    first, _ = _ms(lambda: pi.import_pi(st, f))
    idle, _ = _ms(lambda: pi.import_pi(st, f))
    last = json.loads(v3.splitlines()[-1])["id"]
    with open(f, "ab") as out:
        out.write(json.dumps({"type": "message", "id": "bench1", "parentId": last,
                              "timestamp": "2026-01-01T00:00:00.000Z",
                              "message": {"role": "user", "content": "x", "timestamp": 1}}).encode() + b"\n")
    one, _ = _ms(lambda: pi.import_pi(st, f))
    whole, _ = _ms(lambda: pi.import_session(castore.open(os.path.join(d, "store2"), durable=False), f))
    nl = v3.count(b"\n")
    print(f"{name}: {len(v3):,} bytes, {nl} lines | first import {first:.0f} ms | nothing new "
          f"{idle:.1f} ms | one new entry {one:.1f} ms | import_session of the whole file {whole:.0f} ms")


if __name__ == "__main__":
    for name in ("large-session.jsonl", "before-compaction.jsonl"):
        d = tempfile.mkdtemp()
        try:
            bench(name, d)
        finally:
            shutil.rmtree(d)
