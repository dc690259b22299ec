"""What ``castore encrypt`` costs: a plain local store with one long session converted into
an encrypted one (every object rewritten under keyed ids and sealed), then checked.

Usage: .venv/bin/python scripts/bench_convert.py [--commits N] [--no-check]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import castore
from castore.convert import compare, convert
from castore.crypto.keys import MasterKey
from castore.entries import Message


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--commits", type=int, default=20_000)
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the source")
    args = ap.parse_args()
    key = MasterKey.new()
    with tempfile.TemporaryDirectory() as d:
        src_url, dst_url = str(Path(d) / "plain"), str(Path(d) / "enc")
        t0 = time.perf_counter()
        with castore.open(src_url, durable=False) as src:
            s = src.session("app", "user", "long")
            for i in range(0, args.commits, 1000):
                s.append_many([Message(role="user" if j % 2 == 0 else "assistant", content=f"message {j} " * 8)
                               for j in range(i, min(args.commits, i + 1000))])
        built = time.perf_counter() - t0
        with castore.open(src_url) as src, castore.open(dst_url, encrypted=True, master_key=key) as dst:
            t0 = time.perf_counter()
            report = convert(src, dst, check=False)
            took = time.perf_counter() - t0
            checked = None
            if not args.no_check:
                t0 = time.perf_counter()
                diffs = compare(src, dst)
                checked = time.perf_counter() - t0
                assert diffs == [], diffs
        print(f"commits {args.commits}: built in {built:.1f} s; converted {report.objects} objects "
              f"({report.bytes / 1e6:.1f} MB stored) in {took:.1f} s = {report.objects / took:,.0f} objects/s"
              + (f"; compared in {checked:.1f} s" if checked is not None else ""))


if __name__ == "__main__":
    main()
