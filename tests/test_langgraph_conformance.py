"""LangGraph's own checkpointer conformance suite, run against CastoreSaver on local disk and S3."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

import s3server
from conftest import Backend, make_backend
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from castore.adapters.langgraph import CastoreSaver


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_castore_saver_passes_every_base_and_extended_capability(kind: str, request: Any, tmp_path: Any) -> None:
    server = request.getfixturevalue("moto_server") if kind == "s3" else None
    stores = []

    def fresh_backend() -> Backend:
        if server is None:
            return make_backend(kind, request, tmp_path / uuid.uuid4().hex)
        # A bucket of its own: moto lists a prefix by scanning the whole bucket, so a
        # shared, growing bucket would make every LIST slower (real S3 does not).
        bucket = f"lg-conformance-{uuid.uuid4().hex[:12]}"
        s3server.make_bucket(server.endpoint_url, bucket)
        return Backend("s3", f"s3://{bucket}/store", server.storage_options)

    @checkpointer_test(name=f"CastoreSaver-{kind}")
    async def factory():
        # a fresh store per capability suite: nothing is shared through caches
        store = fresh_backend().open()
        stores.append(store)
        yield CastoreSaver(store)

    report = asyncio.run(validate(factory))
    for store in stores:
        store.close()
    failures = {cap: res.failures for cap, res in report.results.items() if res.passed is not True}
    assert not failures, failures
    assert {c.value for c in ALL_CAPABILITIES} == {cap for cap, res in report.results.items() if res.detected}
    assert sum(res.tests_passed for res in report.results.values()) >= 80
