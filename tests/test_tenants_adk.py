"""tests/test_adk.py again, on tenant-layout stores (docs/tenants.md)."""

from typing import Any

import pytest
from conftest import backend_on
from google.adk.sessions import InMemorySessionService
from test_adk import *  # noqa: F403 - the same tests

from castore.adapters.adk import CastoreSessionService

backend = backend_on("local-tenants", "memory-tenants")


@pytest.fixture(params=["in-memory", "castore"])
def either(request: pytest.FixtureRequest, backend: Any) -> Any:
    """As in test_adk, the castore service on a tenant-layout store."""
    if request.param == "in-memory":
        yield InMemorySessionService()
        return
    st = backend.open()
    try:
        yield CastoreSessionService(st)
    finally:
        st.close()
