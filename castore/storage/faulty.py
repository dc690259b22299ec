"""A fault-injecting :class:`~castore.storage.base.Storage` wrapper, for tests and benchmarks.

:class:`FaultyStorage` wraps any storage and, with a seeded random generator, makes a
fraction of calls go wrong the ways a network object store does:

* ``fail``: the call raises :class:`~castore.errors.StorageError` before acting (a batch
  write first writes a random part of its keys, as concurrent PUTs do);
* ``timeout``: the call waits, then raises without acting;
* ``lost``: the call acts, then raises as if its response was lost: a write or a
  conditional swap that landed although the caller sees an error (the case object
  stores' clients must recognise by reading back their own write id).

Every fault is counted in :attr:`FaultyStorage.injected` by kind and in
:attr:`FaultyStorage.by_method`. Attributes of the wrapped storage (``root``,
``list_locks``, ``request_count``...) are reachable through the wrapper.
"""

from __future__ import annotations

import builtins
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ..errors import StorageError
from .base import DeleteIncomplete, Journal, RefIntent, Storage, Token, Versioned

_T = TypeVar("_T")

KINDS = ("fail", "timeout", "lost")
#: every method faults can be injected into
METHODS = ("read", "read_many", "read_versioned", "write", "write_many", "swap", "delete",
           "delete_many", "list", "list_dir", "exists", "mtime")


class InjectedFault(StorageError):
    """A failure made up by :class:`FaultyStorage` (a StorageError like a real one).

    Attributes:
        kind: ``fail``, ``timeout`` or ``lost``.
        method: the storage method it was injected into.
        acted: whether the call did its work before failing.
    """

    def __init__(self, kind: str, method: str, key: str, acted: bool, url: str) -> None:
        what = {"fail": "failed", "timeout": "timed out", "lost": "lost its response"}[kind]
        super().__init__(f"injected fault: {method} {key} {what}", url)
        self.kind = kind
        self.method = method
        self.acted = acted


class FaultyStorage(Storage):
    """Wrap ``inner``; make a fraction ``rate`` of calls fail (see the module docstring).

    Args:
        inner: the storage to wrap.
        rate: the probability that a call is faulted, 0 to 1.
        seed: the seed of the random generator (same seed and calls, same faults).
        kinds: fault kinds to draw from, with weights (default: equal weights of
            ``fail``, ``timeout`` and ``lost``).
        methods: the methods that may fault (default: all of :data:`METHODS`).
        timeout: how long a ``timeout`` fault waits, in seconds.
    """

    def __init__(self, inner: Storage, rate: float = 0.05, seed: int | None = 0,
                 kinds: Mapping[str, float] | None = None, methods: Iterable[str] | None = None,
                 timeout: float = 0.002) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, not {rate}")
        weights = dict(kinds) if kinds is not None else {k: 1.0 for k in KINDS}
        unknown = set(weights) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; use {KINDS}")
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.rate = rate
        self.timeout = timeout
        self.methods = frozenset(methods) if methods is not None else frozenset(METHODS)
        self._kinds = list(weights)
        self._weights = [weights[k] for k in self._kinds]
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.enabled = True
        self.calls: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.by_method: Counter[str] = Counter()

    @property
    def faults(self) -> int:
        """The number of faults injected so far."""
        return sum(self.injected.values())

    def __getattr__(self, name: str) -> Any:
        # only called for names this class lacks: the wrapped backend's extras
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- drawing -----------------------------------------------------------------------
    def _draw(self, method: str) -> tuple[str | None, float]:
        with self._lock:
            self.calls[method] += 1
            if not self.enabled or method not in self.methods or self._rng.random() >= self.rate:
                return None, 0.0
            kind = self._rng.choices(self._kinds, self._weights)[0]
            self.injected[kind] += 1
            self.by_method[method] += 1
            return kind, self._rng.random()

    def _call(self, method: str, key: str, act: Callable[[], _T], partial: Callable[[float], None] | None = None) -> _T:
        kind, u = self._draw(method)
        if kind is None:
            return act()
        if kind == "fail":
            if partial is not None:
                partial(u)
            raise InjectedFault(kind, method, key, False, self.url)
        if kind == "timeout":
            time.sleep(self.timeout)
            raise InjectedFault(kind, method, key, False, self.url)
        act()
        raise InjectedFault(kind, method, key, True, self.url)

    # -- the Storage contract, each call through _call ---------------------------------
    def read(self, key: str) -> bytes:
        """See :meth:`Storage.read`; may raise an injected StorageError."""
        return self._call("read", key, lambda: self.inner.read(key))

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """See :meth:`Storage.read_many`; may raise an injected StorageError."""
        keys = list(keys)
        return self._call("read_many", f"({len(keys)} keys)", lambda: self.inner.read_many(keys))

    def read_versioned(self, key: str) -> Versioned | None:
        """See :meth:`Storage.read_versioned`; may raise an injected StorageError."""
        return self._call("read_versioned", key, lambda: self.inner.read_versioned(key))

    def write(self, key: str, data: bytes) -> None:
        """See :meth:`Storage.write`; may raise an injected StorageError (written or not)."""
        self._call("write", key, lambda: self.inner.write(key, data))

    def write_many(self, items: Mapping[str, bytes]) -> None:
        """See :meth:`Storage.write_many`; a ``fail`` writes a random part of the keys first."""
        items = dict(items)

        def partial(u: float) -> None:
            part = dict(list(items.items())[: int(u * len(items))])
            if part:
                self.inner.write_many(part)

        self._call("write_many", f"({len(items)} keys)", lambda: self.inner.write_many(items), partial)

    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        """See :meth:`Storage.swap`; a ``lost`` fault lands the swap and still raises."""
        return self._call("swap", key, lambda: self.inner.swap(key, data, expect, *([journal] if journal else [])))

    def recover_refs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> int:
        """See :meth:`Storage.recover_refs` (no faults injected: it runs once, at open)."""
        return self.inner.recover_refs(intents_of)

    def compact_ref_logs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> None:
        """See :meth:`Storage.compact_ref_logs` (no faults injected)."""
        self.inner.compact_ref_logs(intents_of)

    def sync_keys(self, keys: Iterable[str]) -> None:
        """See :meth:`Storage.sync_keys`."""
        self.inner.sync_keys(keys)

    def delete(self, key: str, expect: Token | None = None) -> None:
        """See :meth:`Storage.delete`; may raise an injected StorageError (deleted or not)."""
        self._call("delete", key, lambda: self.inner.delete(key, expect))

    def delete_many(self, keys: Iterable[str]) -> None:
        """See :meth:`Storage.delete_many`; a ``fail`` deletes a random first part of the keys
        and raises DeleteIncomplete naming the rest, as a real backend failing part-way does."""
        todo = list(dict.fromkeys(keys))
        kind, u = self._draw("delete_many")
        if kind is None:
            return self.inner.delete_many(todo)
        done = int(u * len(todo)) if kind == "fail" else 0
        if kind == "fail" and done:
            self.inner.delete_many(todo[:done])
        elif kind == "timeout":
            time.sleep(self.timeout)
        elif kind == "lost":
            self.inner.delete_many(todo)
        fault = InjectedFault(kind, "delete_many", f"({len(todo)} keys)", kind == "lost", self.url)
        raise DeleteIncomplete(self.url, todo[done:], str(fault)) from fault

    def list(self, prefix: str) -> list[str]:
        """See :meth:`Storage.list`; may raise an injected StorageError."""
        return self._call("list", prefix, lambda: self.inner.list(prefix))

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """See :meth:`Storage.list_dir`; may raise an injected StorageError."""
        return self._call("list_dir", prefix, lambda: self.inner.list_dir(prefix))

    def exists(self, key: str) -> bool:
        """See :meth:`Storage.exists`; may raise an injected StorageError."""
        return self._call("exists", key, lambda: self.inner.exists(key))

    def mtime(self, key: str) -> float | None:
        """See :meth:`Storage.mtime`; may raise an injected StorageError."""
        return self._call("mtime", key, lambda: self.inner.mtime(key))

    def close(self) -> None:
        """Close the wrapped storage."""
        self.inner.close()

    def __repr__(self) -> str:
        return f"<FaultyStorage rate={self.rate} {self.inner!r}>"


__all__ = ["FaultyStorage", "InjectedFault", "KINDS", "METHODS"]
