"""castore on S3: a moto server on 127.0.0.1 with ~20 ms added to every request.

Appending N steps one by one over 20 ms round trips would take minutes, so the N-step
session is written on local disk (no fsync) and pushed to the S3 store with
:func:`castore.sync.push` (that push is measured too). The append figure is measured on S3
itself, after every read: appends to the N-step session alternated with appends to a new
session (:meth:`CastoreS3.probe`). Every operation goes through a :class:`CountingStorage`
on a fresh handle, so requests and sequential round trips are counted.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from typing import Any

from . import cold
from .count import CountingStorage, Meter
from .systems import APP, MASTER_KEY, SESSION, USER, System
from .workload import Step

_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tests")
LATENCY_MS = 20
BUCKET, OTHER = "bench-a", "bench-b"


def start_server() -> Any:
    """Start moto (``tests/s3server.py``) with LATENCY_MS per request and make the buckets."""
    if _TESTS not in sys.path:
        sys.path.insert(0, _TESTS)
    import s3server

    server = s3server.start_moto_server(latency_ms=LATENCY_MS)
    for b in (BUCKET, OTHER):
        s3server.make_bucket(server.endpoint_url, b)
    return server


class CastoreS3(System):
    """castore with ``s3://bucket/prefix`` on the moto server (every request +20 ms)."""

    name = f"castore S3 (+{LATENCY_MS} ms/request)"
    seeded = True

    def __init__(self, workdir: str, server: Any) -> None:
        super().__init__(workdir)
        self.server = server
        self.opts = server.storage_options
        self.last_counts: tuple[int, int] | None = None
        self.figures: dict[str, Any] = {}
        self._pushes = 0

    def _open(self, url: str, meter: Meter | None = None) -> Any:
        import castore
        from castore.storage import open_storage

        return castore.Store(CountingStorage(open_storage(url, **self.opts), meter))

    def start(self, n: int) -> None:
        """Write the N-step session locally, push it to S3 (measured), and keep the commit ids."""
        import castore
        from castore import sync

        super().start(n)
        self.url = f"s3://{BUCKET}/n{n}-{time.monotonic_ns()}"
        self.seed_dir = os.path.join(self.workdir, f"s3seed-{n}")
        shutil.rmtree(self.seed_dir, ignore_errors=True)
        from .workload import step

        with castore.open(self.seed_dir, durable=False) as local:
            s = local.session(APP, USER, SESSION)
            self.ids = [s.append(castore.Message(role=st.role, content=st.content), state_delta=st.delta)
                        for st in (step(i) for i in range(n))]
            with self._open(self.url) as dst:
                t = time.perf_counter()
                report = sync.push(local, dst, (APP, USER, SESSION))
                dt = time.perf_counter() - t
                req, rts, _ = dst.storage.meter.snapshot()
        self.figures["push_local"] = {"ms": dt * 1e3, "requests": req, "rts": rts,
                                      "objects": getattr(report, "objects_sent", None)}
        shutil.rmtree(self.seed_dir, ignore_errors=True)

    def append(self, s: Step) -> None:
        raise NotImplementedError("seeded by push; see probe")

    def sizes(self) -> tuple[int, None]:
        """(sum of the sizes of the objects under the prefix, None: S3 has no block size)."""
        import boto3

        if _TESTS not in sys.path:
            sys.path.insert(0, _TESTS)
        import s3server

        c = boto3.client("s3", endpoint_url=self.server.endpoint_url, aws_access_key_id=s3server.KEY,
                         aws_secret_access_key=s3server.SECRET, region_name=s3server.REGION)
        prefix = self.url.split("/", 3)[3] + "/"
        total = 0
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            total += sum(o["Size"] for o in page.get("Contents", []))
        return total, None

    def _counted(self, fn: Any) -> Any:
        with self._open(self.url) as st:
            out = fn(st)
            req, rts, _ = st.storage.meter.snapshot()
        self.last_counts = (req, rts)
        return out

    def time_travel(self, mid: int) -> tuple[dict[str, Any], int]:
        def go(st: Any) -> tuple[dict[str, Any], int]:
            s = st.session(APP, USER, SESSION)
            return s.state(self.ids[mid]), len(s.messages(self.ids[mid]))
        return self._counted(go)

    def full_log(self) -> int:
        return self._counted(lambda st: len(st.session(APP, USER, SESSION).log()))

    def fork(self, mid: int, k: int) -> int:
        before = self.sizes()[0]
        self._counted(lambda st: st.session(APP, USER, SESSION).fork(f"fork-{k}", at=self.ids[mid]))
        return self.sizes()[0] - before

    def cold_args(self) -> tuple[str, list[str]]:
        import json

        return cold.CASTORE, [self.url, json.dumps(self.opts), APP, USER, SESSION]

    def push_other(self) -> dict[str, Any]:
        """Push the session from this S3 store to an empty prefix of another bucket."""
        from castore import sync

        meter = Meter()
        self._pushes += 1
        with self._open(self.url, meter) as src, \
                self._open(f"s3://{OTHER}/n{self.n}-{time.monotonic_ns()}", meter) as dst:
            t = time.perf_counter()
            sync.push(src, dst, (APP, USER, SESSION))
            dt = time.perf_counter() - t
            req, rts, _ = meter.snapshot()
            n = len(dst.session(APP, USER, SESSION).entries())
        assert n == self.n, (n, self.n)
        return {"ms": dt * 1e3, "requests": req, "rts": rts}

    def probe(self, s: Step, at_tip: bool) -> None:
        """Append on S3 itself, to the N-step session or a new one; counts in ``last_counts``."""
        import castore

        if getattr(self, "_live", None) is None:
            st = self._open(self.url)
            self._live = (st, st.session(APP, USER, SESSION), st.session(APP, USER, f"{SESSION}-new"))
        st = self._live[0]
        r0, t0, _ = st.storage.meter.snapshot()
        self._live[1 if at_tip else 2].append(castore.Message(role=s.role, content=s.content), state_delta=s.delta)
        r1, t1, _ = st.storage.meter.snapshot()
        self.last_counts = (r1 - r0, t1 - t0)

    def cleanup(self) -> None:
        if getattr(self, "_live", None) is not None:
            self._live[0].close()
        self._live = None


def requests_per_append(server: Any, appends: int) -> dict[str, list[tuple[int, int]]]:
    """(requests, round trips) of each of ``appends`` appends on S3, plain and encrypted stores alternated.

    Each store is new, and its session gets one append first (uncounted: it creates the
    session and, encrypted, the tenant's keys); then the stores take turns, one append each,
    at the same session sizes. Keys: ``"plain"``, ``"encrypted"``.
    """
    import castore
    from castore.storage import open_storage

    from .workload import step

    stores, sessions = {}, {}
    for kind, opts in (("plain", {}), ("encrypted", {"encrypted": True, "master_key": MASTER_KEY})):
        url = f"s3://{BUCKET}/append-{kind}-{time.monotonic_ns()}"
        stores[kind] = castore.Store(CountingStorage(open_storage(url, **server.storage_options)), **opts)
        sessions[kind] = stores[kind].session(APP, USER, SESSION)
    out: dict[str, list[tuple[int, int]]] = {k: [] for k in stores}
    try:
        for i in range(appends + 1):
            st = step(i)
            for kind in (("plain", "encrypted") if i % 2 == 0 else ("encrypted", "plain")):
                r0, t0, _ = stores[kind].storage.meter.snapshot()
                sessions[kind].append(castore.Message(role=st.role, content=st.content), state_delta=st.delta)
                r1, t1, _ = stores[kind].storage.meter.snapshot()
                if i:
                    out[kind].append((r1 - r0, t1 - t0))
    finally:
        for store in stores.values():
            store.close()
    return out
