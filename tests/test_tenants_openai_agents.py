"""tests/test_openai_agents.py again, on tenant-layout stores (docs/tenants.md)."""

from conftest import backend_on
from test_openai_agents import *  # noqa: F403 - the same tests

backend = backend_on("local-tenants", "memory-tenants")
