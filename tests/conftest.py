"""Shared fixtures: a store on every backend (local disk, memory, S3 on a loopback moto server).

The moto server is started once per test session on a free 127.0.0.1 port and stopped at
the end; each test gets a fresh prefix (S3), folder (local) or name (memory).
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import s3server

import castore
from castore.storage import memory as memory_storage

BACKENDS = ["local", "memory", "s3"]


@dataclass
class Backend:
    """Where a test's store lives: a URL plus storage options."""

    name: str
    url: str
    options: dict[str, Any] = field(default_factory=dict)

    def open(self, **kw: Any) -> castore.Store:
        """Open (another handle on) the test's store."""
        return castore.open(self.url, **{**self.options, **kw})


@pytest.fixture(scope="session")
def moto_server() -> Iterator[s3server.Server]:
    """A moto S3 server on 127.0.0.1 for the whole test session."""
    server = s3server.start_moto_server()
    try:
        s3server.make_bucket(server.endpoint_url, "castore-tests")
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[s3server.Server]:
    """SeaweedFS (real atomic conditional writes) on 127.0.0.1; skips if it cannot start."""
    server = s3server.start_seaweedfs()
    if server is None:
        pytest.skip(f"SeaweedFS could not start here: {s3server.SEAWEED_SKIP_REASON}")
    try:
        s3server.make_bucket(server.endpoint_url, "castore-tests")
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _grep_index_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test keeps the search index of its stores (``castore grep``, and the importers,
    which update it) under its own ``tmp_path / "index"``, never in the user's
    ``~/.cache/castore/grep``, and the usage cache in ``tmp_path / "usage-cache.json"``."""
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "index"))
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(tmp_path / "usage-cache.json"))


@pytest.fixture(autouse=True)
def _drop_memory_stores() -> Iterator[None]:
    """Forget the ``memory://`` stores a test made once it ends.

    castore's memory backend (and fsspec's) keep every store in a module-level dict for the
    life of the process, and tests use a fresh name each: without this the whole suite's
    data stays on the heap (GBs), and every full garbage collection, pytest's at exit
    included, walks it. Stores that existed before the test (a module-scoped fixture's) stay.
    """
    from fsspec.implementations.memory import MemoryFileSystem

    roots = set(memory_storage._ROOTS)
    fs_keys = set(MemoryFileSystem.store)
    fs_dirs = set(MemoryFileSystem.pseudo_dirs)
    yield
    with memory_storage._ROOTS_LOCK:
        for name in set(memory_storage._ROOTS) - roots:
            memory_storage._ROOTS.pop(name, None)
            memory_storage._LOCKS.pop(name, None)
    for key in set(MemoryFileSystem.store) - fs_keys:
        MemoryFileSystem.store.pop(key, None)
    MemoryFileSystem.pseudo_dirs[:] = [d for d in MemoryFileSystem.pseudo_dirs if d in fs_dirs]


#: the same backends with stores in the tenant layout (docs/FORMAT.md 2); the S3 run of the
#: whole session suite again is under ``-m slow`` (about 50 s): the tenant layout on S3 is
#: covered in CI by the child storage's conformance, the encrypted store's and the policy tests
TENANT_BACKENDS: list[Any] = ["local-tenants", "memory-tenants", pytest.param("s3-tenants", marks=pytest.mark.slow)]


def make_backend(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    """A fresh, empty place for a store on backend ``kind`` (``<kind>-tenants``: opened in
    the tenant layout)."""
    if kind.endswith("-tenants"):
        b = make_backend(kind.removesuffix("-tenants"), request, tmp_path)
        return Backend(kind, b.url, {**b.options, "layout": "tenants"})
    if kind == "local":
        return Backend("local", str(tmp_path / "store"))
    if kind == "memory":
        return Backend("memory", f"memory://test-{uuid.uuid4().hex}")
    if kind in ("s3", "seaweedfs"):
        server = request.getfixturevalue("moto_server" if kind == "s3" else "seaweedfs")
        # A bucket per test: moto's LIST scans the whole bucket, so a shared one slows down
        # every listing as the suite fills it.
        bucket = f"t-{uuid.uuid4().hex[:20]}"
        s3server.make_bucket(server.endpoint_url, bucket)
        return Backend(kind, f"s3://{bucket}/store", server.storage_options)
    raise ValueError(kind)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    """A fresh store location on each backend in turn."""
    return make_backend(request.param, request, tmp_path)


def backend_on(*kinds: Any) -> Any:
    """A ``backend`` fixture over ``kinds`` only, for a module to take in place of the one
    above (``backend = backend_on("local", "s3")``): its tests' :func:`store` is then opened
    on each of those in turn (a kind may be a ``pytest.param`` with marks)."""

    @pytest.fixture(params=list(kinds), name="backend")
    def _backend(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
        return make_backend(request.param, request, tmp_path)

    return _backend


@pytest.fixture
def store(backend: Backend) -> Iterator[castore.Store]:
    """An open, empty store on each backend in turn."""
    st = backend.open()
    try:
        yield st
    finally:
        st.close()


@pytest.fixture
def local_store(tmp_path: Any) -> Iterator[castore.Store]:
    """An open, empty store on local disk."""
    st = castore.open(str(tmp_path / "store"))
    try:
        yield st
    finally:
        st.close()


#: S3 variants of tests whose local and memory variants stay in the default run: each takes
#: 20-30 s against the loopback S3 server, so they run with `scripts/test -m slow`
SLOW_ON_S3 = (
    "tests/test_session.py::test_time_travel_to_every_commit_of_a_200_commit_history[s3]",
    "tests/test_session.py::test_replay_equals_snapshot_at_every_commit[s3]",
    "tests/test_refs.py::test_cas_race_32_threads_on_s3_has_exactly_one_winner_per_round",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark :data:`SLOW_ON_S3` slow before ``-m 'not slow'`` deselects by marker."""
    for item in items:
        if item.nodeid in SLOW_ON_S3:
            item.add_marker(pytest.mark.slow)
