#!/usr/bin/env python
"""Benchmark: castore push/pull against S3 (moto on 127.0.0.1 with added latency per request).

1. Incremental push: one session with N earlier commits already on the remote; push one new
   commit (local -> S3) and pull one new commit (S3 -> local). Reported: requests on the S3
   side (``S3Storage.request_count``), objects sent, wall time.
2. First push of S sessions x E entries (local -> S3), compared with a plain sequential
   upload of the same object and ref files with boto3 (one PUT after another). The
   sequential upload is timed on a sample of the files and scaled to all of them (it is
   one request after another, so its time is linear in the count).

Usage::

    .venv/bin/python scripts/bench_sync.py            # N=10,000; S=1,000 x E=50 (long on moto)
    .venv/bin/python scripts/bench_sync.py --quick    # N=1,000; S=20 x E=50
    .venv/bin/python scripts/bench_sync.py --commits 10000 --sessions 100 --entries 50
    .venv/bin/python scripts/bench_sync.py --packs    # format 1 (objects) vs 2 (packs): 2,000 entries; 1,000 x 50

3. ``--packs``: the same pushes from a format-1 store (every object its own PUT) and a
   format-2 store (a few packs), into a new S3 store that takes the source's format.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

import s3server

import castore
from castore import Message, sync
from castore.store import Store

BUCKET = "castore-bench"
SYSTEM = "You are a helpful weather assistant. Answer briefly and cite the station. " * 4


def build_long(local: Store, n: int) -> castore.Session:
    s = local.session("bench", "alice", "long")
    for lo in range(0, n, 200):
        s.append_many([Message(role="user" if i % 2 else "assistant", content=f"turn {i}: " + "w" * 180)
                       for i in range(lo, min(lo + 200, n))])
    return s


def incremental(server: s3server.Server, n: int, tmp: str) -> dict[str, object]:
    local = castore.open(os.path.join(tmp, "long"), durable=False)
    t = time.perf_counter()
    s = build_long(local, n)
    build_s = time.perf_counter() - t
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    remote = castore.open(url, **server.storage_options)
    t = time.perf_counter()
    first = sync.push(local, remote)
    first_s = time.perf_counter() - t
    out: dict[str, object] = {"commits": n, "build_local_s": round(build_s, 2),
                              "first_push": {"objects": first.objects_sent, "s": round(first_s, 2),
                                             "requests": remote.storage.request_count}}
    # push one new commit
    s.append(Message(role="user", content="one more question"))
    remote = castore.open(url, **server.storage_options)  # a fresh client: nothing cached
    t = time.perf_counter()
    r = sync.push(local, remote, ("bench", "alice", "long"))
    out["push_one_commit"] = {"objects": r.objects_sent, "requests": remote.storage.request_count,
                              "s": round(time.perf_counter() - t, 3), "refs_updated": r.refs_updated}
    # the remote moves by one commit; pull it back
    castore.open(url, **server.storage_options).session("bench", "alice", "long").append(
        Message(role="assistant", content="an answer written elsewhere"))
    remote = castore.open(url, **server.storage_options)
    t = time.perf_counter()
    r = sync.pull(remote, local, ("bench", "alice", "long"))
    out["pull_one_commit"] = {"objects": r.objects_sent, "requests": remote.storage.request_count,
                              "s": round(time.perf_counter() - t, 3), "refs_updated": r.refs_updated}
    # and a push that finds nothing to do
    remote = castore.open(url, **server.storage_options)
    t = time.perf_counter()
    r = sync.push(local, remote, ("bench", "alice", "long"))
    out["push_nothing"] = {"objects": r.objects_sent, "requests": remote.storage.request_count,
                           "s": round(time.perf_counter() - t, 3)}
    return out


def many_sessions(server: s3server.Server, sessions: int, entries: int, tmp: str, sample: int) -> dict[str, object]:
    root = os.path.join(tmp, "many")
    local = castore.open(root, durable=False)
    t = time.perf_counter()
    _build_many(local, sessions, entries)
    build_s = time.perf_counter() - t
    files = []
    for dirpath, _, fnames in os.walk(root):
        for f in fnames:
            rel = os.path.relpath(os.path.join(dirpath, f), root)
            if rel.startswith(("objects", "refs")):
                files.append(rel)
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    remote = castore.open(url, **server.storage_options)
    t = time.perf_counter()
    report = sync.push(local, remote)
    push_s = time.perf_counter() - t
    # the baseline: the same files, one PUT after another
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint_url, aws_access_key_id=s3server.KEY,
                          aws_secret_access_key=s3server.SECRET, region_name=s3server.REGION)
    prefix = uuid.uuid4().hex
    part = files[:sample]
    t = time.perf_counter()
    for rel in part:
        with open(os.path.join(root, rel), "rb") as f:
            client.put_object(Bucket=BUCKET, Key=f"{prefix}/{rel}", Body=f.read())
    seq_sample_s = time.perf_counter() - t
    seq_all_s = seq_sample_s * len(files) / max(len(part), 1)
    return {
        "sessions": sessions, "entries": entries, "build_local_s": round(build_s, 2),
        "files_in_local_store": len(files),
        "castore_push": {"objects": report.objects_sent, "refs": len(report.refs_updated), "s": round(push_s, 2),
                         "requests": remote.storage.request_count,
                         "requests_per_s": round(remote.storage.request_count / push_s, 1)},
        "sequential_put": {"sample_files": len(part), "sample_s": round(seq_sample_s, 2),
                           "per_put_ms": round(1000 * seq_sample_s / max(len(part), 1), 1),
                           "all_files_s_estimated": round(seq_all_s, 1)},
        "speedup_vs_sequential": round(seq_all_s / push_s, 1),
    }


def _build_many(local: Store, sessions: int, entries: int) -> None:
    for k in range(sessions):
        s = local.session("bench", f"user{k % 50}", f"s{k}")
        msgs = [Message(role="system", content=SYSTEM)]
        msgs += [Message(role="user" if i % 2 else "assistant", content=f"session {k} turn {i}: " + "q" * 200)
                 for i in range(entries - 1)]
        s.append_many(msgs[: entries // 2])
        s.append_many(msgs[entries // 2 :])


def packs(server: s3server.Server, n: int, sessions: int, entries: int, tmp: str,
          formats: tuple[int, ...] = (1, 2)) -> dict[str, object]:
    """Push sends packs: the same pushes from a format-1 store (objects, before) and a
    format-2 store (packs, after) into a new S3 store, which takes the source's format."""
    out: dict[str, object] = {"ref_threads": sync.REF_THREADS, "pack_bytes": sync.PACK_BYTES}
    for fmt in formats:
        local = castore.open(os.path.join(tmp, f"long{fmt}"), durable=False, format=fmt)
        build_long(local, n)
        remote = castore.open(f"s3://{BUCKET}/{uuid.uuid4().hex}", **server.storage_options)
        t = time.perf_counter()
        r = sync.push(local, remote)
        out[f"push_{n}_entries_format{fmt}"] = {
            "s": round(time.perf_counter() - t, 2), "requests": remote.storage.request_count,
            "objects": r.objects_sent, "packs": r.packs_sent, "loose": r.loose_sent,
            "requests_per_entry": round(remote.storage.request_count / n, 3)}
    for fmt in formats:
        local = castore.open(os.path.join(tmp, f"many{fmt}"), durable=False, format=fmt)
        _build_many(local, sessions, entries)
        remote = castore.open(f"s3://{BUCKET}/{uuid.uuid4().hex}", **server.storage_options)
        t = time.perf_counter()
        r = sync.push(local, remote)
        push_s = time.perf_counter() - t
        out[f"first_push_{sessions}x{entries}_format{fmt}"] = {
            "s": round(push_s, 2), "requests": remote.storage.request_count, "objects": r.objects_sent,
            "packs": r.packs_sent, "refs": len(r.refs_updated),
            "requests_per_s": round(remote.storage.request_count / push_s, 1)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small numbers (a minute or two)")
    ap.add_argument("--commits", type=int, help="earlier commits of the long session (default 10,000)")
    ap.add_argument("--sessions", type=int, help="sessions of the first push (default 1,000)")
    ap.add_argument("--entries", type=int, default=50, help="entries per session (default 50)")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="delay added to every S3 request")
    ap.add_argument("--sample", type=int, default=400, help="files uploaded sequentially for the baseline")
    ap.add_argument("--packs", action="store_true",
                    help="only the packs section: a 2,000-entry session and the first push of S sessions, "
                         "format 1 (objects) against format 2 (packs)")
    ap.add_argument("--formats", default="1,2", help="with --packs: the source formats to push (default 1,2)")
    args = ap.parse_args()
    commits = args.commits or (1_000 if args.quick else 10_000)
    sessions = args.sessions or (20 if args.quick else 1_000)
    server = s3server.start_moto_server(latency_ms=args.latency_ms)
    try:
        s3server.make_bucket(server.endpoint_url, BUCKET)
        with tempfile.TemporaryDirectory(prefix="castore-bench-sync-") as tmp:
            if args.packs:
                print(json.dumps({"latency_ms": args.latency_ms,
                                  "packs": packs(server, args.commits or 2_000, sessions, args.entries, tmp,
                                                 tuple(int(f) for f in args.formats.split(",")))},
                                 indent=2))
                return
            result = {"latency_ms": args.latency_ms,
                      "incremental": incremental(server, commits, tmp),
                      "first_push": many_sessions(server, sessions, args.entries, tmp, args.sample)}
    finally:
        server.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
