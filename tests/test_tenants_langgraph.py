"""tests/test_langgraph.py again, on tenant-layout stores (docs/tenants.md)."""

from typing import Any

import pytest
from conftest import backend_on
from test_langgraph import *  # noqa: F403 - the same tests

backend = backend_on("local-tenants", "memory-tenants")


@pytest.fixture
def local_store(backend: Any) -> Any:
    """The saver's store: a tenant-layout one."""
    st = backend.open()
    try:
        yield st
    finally:
        st.close()
