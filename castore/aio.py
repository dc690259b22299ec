"""Async twins run blocking calls in a worker thread, so they never block the event loop.

asyncio is imported on first use, not when castore is imported: a cold, synchronous read
(a CLI call, a script) should not pay for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def to_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn(*args, **kwargs)`` in a worker thread and await its result."""
    import asyncio

    return await asyncio.to_thread(fn, *args, **kwargs)
