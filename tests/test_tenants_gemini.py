"""tests/test_gemini.py again, on a tenant-layout store (docs/tenants.md)."""

from pathlib import Path

import pytest
from test_gemini import *  # noqa: F403 - the same tests

import castore


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    """As in test_gemini, in the tenant layout."""
    return castore.open(str(tmp_path / "store"), durable=False, layout="tenants")
