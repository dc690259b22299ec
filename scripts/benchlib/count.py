"""Count what a castore Storage does: calls, S3 requests, and sequential round trips.

A round trip is one call into the Storage (``read_many``/``write_many`` included: one
batch of concurrent requests is one round trip). Calls that start while another call of
the same :class:`Meter` is still in flight overlap it and do not add a sequential round
trip (push runs some of its reads and ref swaps on a thread pool). Kept free of heavy
imports: cold-read child processes import it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from castore.storage.base import Journal, Storage, Token, Versioned


class Meter:
    """Counters shared by one or more :class:`CountingStorage` wrappers."""

    def __init__(self) -> None:
        self.calls = 0
        self.round_trips = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self.storages: list[CountingStorage] = []

    def enter(self) -> None:
        with self._lock:
            self.calls += 1
            if self._in_flight == 0:
                self.round_trips += 1
            self._in_flight += 1

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    @property
    def requests(self) -> int:
        """HTTP requests sent by the wrapped S3 storages (``S3Storage.request_count``).

        A tenant's storage (``child``) shares its parent's S3 client, and every storage on a
        client counts each request the client sends after its own first one: per client, the
        largest count is the client's total.
        """
        by_client: dict[int, int] = {}
        for s in self.storages:
            client = id(getattr(s.inner, "_fs", s.inner))
            by_client[client] = max(by_client.get(client, 0), int(getattr(s.inner, "request_count", 0)))
        return sum(by_client.values())

    def snapshot(self) -> tuple[int, int, int]:
        """(requests, sequential round trips, storage calls) so far."""
        return self.requests, self.round_trips, self.calls


class CountingStorage(Storage):
    """Delegates every call to ``inner`` and records it on ``meter``."""

    def __init__(self, inner: Storage, meter: Meter | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.meter = meter or Meter()
        self.meter.storages.append(self)

    def _call(self, name: str, *args: Any) -> Any:
        self.meter.enter()
        try:
            return getattr(self.inner, name)(*args)
        finally:
            self.meter.leave()

    def read(self, key: str) -> bytes:
        return self._call("read", key)

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        return self._call("read_many", list(keys))

    def write(self, key: str, data: bytes) -> None:
        self._call("write", key, data)

    def write_many(self, items: Mapping[str, bytes]) -> None:
        self._call("write_many", items)

    def read_versioned(self, key: str) -> Versioned | None:
        return self._call("read_versioned", key)

    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        if journal is None:
            return self._call("swap", key, data, expect)
        return self._call("swap", key, data, expect, journal)

    def delete_many(self, keys: Iterable[str]) -> None:
        self._call("delete_many", list(keys))

    def delete(self, key: str, expect: Token | None = None) -> None:
        self._call("delete", key, expect)

    def list(self, prefix: str) -> list[str]:
        return self._call("list", prefix)

    def list_dir(self, prefix: str) -> list[str]:
        return self._call("list_dir", prefix)

    def exists(self, key: str) -> bool:
        return self._call("exists", key)

    def mtime(self, key: str) -> float | None:
        return self._call("mtime", key)

    def child(self, prefix: str) -> CountingStorage:
        """The inner storage's child (a tenant's store), counted on the same meter."""
        return CountingStorage(self.inner.child(prefix), self.meter)

    def close(self) -> None:
        self.inner.close()
