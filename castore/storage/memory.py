"""In-memory storage: a dict per process, shared by every store opened on the same URL.

``memory://name`` opened twice in one process gives the same data (as fsspec's memory file
system does); tests isolate themselves by using a fresh name. Nothing survives the process.
"""

from __future__ import annotations

import builtins
import itertools
import threading
import time
from collections.abc import Mapping

from .base import Journal, PreconditionFailed, Storage, Token, Versioned, check_key

_ROOTS: dict[str, dict[str, tuple[bytes, int, float]]] = {}
_ROOTS_LOCK = threading.Lock()
_LOCKS: dict[str, threading.Lock] = {}
_VERSIONS = itertools.count(1)  # global, so a deleted and re-created key never reuses a token


class MemoryStorage(Storage):
    """A dict of ``key -> (bytes, version, mtime)`` under a lock."""

    def __init__(self, name: str) -> None:
        name = name.strip("/")
        self.url = f"memory://{name}"
        self._pre = ""  # a child's folder in the dict, with its trailing "/"
        with _ROOTS_LOCK:
            self._data = _ROOTS.setdefault(name, {})
            self._lock = _LOCKS.setdefault(name, threading.Lock())

    def child(self, prefix: str) -> MemoryStorage:
        """A view of the folder ``prefix`` of the same dict (under the same lock).

        Raises:
            InvalidName: ``prefix`` is not a valid key.
        """
        sub = check_key(prefix)
        out = object.__new__(MemoryStorage)
        out.url, out._pre, out._data, out._lock = f"{self.url}/{sub}", f"{self._pre}{sub}/", self._data, self._lock
        return out

    def read(self, key: str) -> bytes:
        """Return the bytes at ``key``; see :meth:`Storage.read`."""
        try:
            return self._data[self._pre + key][0]
        except KeyError:
            raise FileNotFoundError(key) from None

    def write(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key``."""
        with self._lock:
            self._put(key, data)

    def write_many(self, items: Mapping[str, bytes]) -> None:
        """Store several keys under one lock (none if one key is invalid)."""
        for k in items:
            check_key(k)
        with self._lock:
            for k, v in items.items():
                self._put(k, v)

    def _put(self, key: str, data: bytes) -> int:
        check_key(key)  # the same keys as on disk, so that a test here holds there
        version = next(_VERSIONS)
        self._data[self._pre + key] = (bytes(data), version, time.time())
        return version

    def read_versioned(self, key: str) -> Versioned | None:
        """Read ``key`` with its version counter as token."""
        item = self._data.get(self._pre + key)
        if item is None:
            return None
        return Versioned(item[0], str(item[1]))

    def _token(self, key: str) -> Token | None:
        item = self._data.get(self._pre + key)
        return None if item is None else str(item[1])

    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        """Replace ``key`` if its token is ``expect``; see :meth:`Storage.swap` (``journal`` is
        ignored: nothing here is durable).

        Raises:
            PreconditionFailed: ``key``'s token is not ``expect``. InvalidName: a bad key.
        """
        check_key(key)
        with self._lock:
            if self._token(key) != expect:
                raise PreconditionFailed(key, expect)
            self._put(key, data)
            token = self._token(key)
            assert token is not None
            return token

    def delete(self, key: str, expect: Token | None = None) -> None:
        """Delete ``key``; with ``expect``, only if its token matches.

        Raises:
            PreconditionFailed: ``key``'s token is not ``expect``. InvalidName: a bad key.
        """
        check_key(key)
        with self._lock:
            if expect is not None and self._token(key) != expect:
                raise PreconditionFailed(key, expect)
            self._data.pop(self._pre + key, None)

    def list(self, prefix: str) -> list[str]:
        """Every key below ``prefix``."""
        p = self._pre + (prefix.rstrip("/") + "/" if prefix else "")
        n = len(self._pre)
        with self._lock:
            return sorted(k[n:] for k in self._data if k.startswith(p))

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """Immediate children of ``prefix``."""
        p = self._pre + (prefix.rstrip("/") + "/" if prefix else "")
        with self._lock:
            return sorted({k[len(p) :].split("/", 1)[0] for k in self._data if k.startswith(p)})

    def exists(self, key: str) -> bool:
        """Whether ``key`` is stored."""
        return self._pre + key in self._data

    def mtime(self, key: str) -> float | None:
        """When ``key`` was last written."""
        item = self._data.get(self._pre + key)
        return None if item is None else item[2]
