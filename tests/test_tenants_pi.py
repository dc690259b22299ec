"""tests/test_pi.py again, on tenant-layout stores (docs/tenants.md)."""

from conftest import backend_on
from test_pi import *  # noqa: F403 - the same tests

backend = backend_on("local-tenants", "memory-tenants")
