"""A :class:`~castore.storage.base.Storage` wrapper that retries what is safe to retry.

Reads, listings and object writes are idempotent (objects are write-once: writing the
same bytes again is harmless), so :class:`RetryingStorage` retries them on
:class:`~castore.errors.StorageError` with exponential backoff and jitter. Two calls are
never retried blindly, because a lost response makes them ambiguous:

* :meth:`~RetryingStorage.swap` (a compare-and-swap that landed would then fail its own
  precondition): :class:`castore.refs.RefStore` re-reads the ref and recognises its own
  landing by the write id it stamped;
* a conditional :meth:`~RetryingStorage.delete` (with ``expect``), for the same reason.

Errors that no retry can fix (access denied, a missing bucket, a full or read-only disk)
are raised at once.
"""

from __future__ import annotations

import builtins
import errno
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ..errors import StorageError
from .base import DeleteIncomplete, Journal, RefIntent, Storage, Token, Versioned

_T = TypeVar("_T")

#: OS errors that a retry cannot fix
_PERMANENT_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                     errno.ENAMETOOLONG, errno.EISDIR, errno.ENOTDIR, errno.EINVAL}
#: words in the messages of S3 errors that a retry cannot fix (see castore.storage.s3)
_PERMANENT_WORDS = ("access denied", "does not exist", "credentials", "an s3 url needs a bucket")


def is_transient(error: StorageError) -> bool:
    """Whether retrying the call that raised ``error`` may succeed."""
    for e in (error, error.__cause__):
        if isinstance(e, PermissionError):
            return False
        if isinstance(e, OSError) and e.errno in _PERMANENT_ERRNOS:
            return False
    text = str(error).lower()
    return not any(w in text for w in _PERMANENT_WORDS)


class RetryingStorage(Storage):
    """Wrap ``inner``; retry idempotent calls on transient StorageErrors.

    Args:
        inner: the storage to wrap.
        attempts: tries per call, the first included.
        base_delay: the wait before the first retry, in seconds; doubled each time.
        max_delay: the longest wait between tries.
        sleep: the function that waits (tests may pass a fake).

    Attributes:
        retries: the number of retries made so far (a figure for benchmarks).
    """

    def __init__(self, inner: Storage, attempts: int = 6, base_delay: float = 0.02, max_delay: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if attempts < 1:
            raise ValueError("attempts must be at least 1")
        self.inner = inner
        self.url = inner.url
        self.durable = inner.durable
        self.attempts = attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._sleep = sleep
        self.retries = 0

    def __getattr__(self, name: str) -> Any:
        # only called for names this class lacks: the wrapped backend's extras
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _retry(self, call: Callable[[], _T]) -> _T:
        for attempt in range(self.attempts):
            try:
                return call()
            except StorageError as e:
                if attempt + 1 == self.attempts or not is_transient(e):
                    raise
                self.retries += 1
                delay = min(self.base_delay * 2**attempt, self.max_delay)
                self._sleep(delay * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    # -- retried: reads, listings, object writes ------------------------------------------
    def read(self, key: str) -> bytes:
        """See :meth:`Storage.read` (retried)."""
        return self._retry(lambda: self.inner.read(key))

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """See :meth:`Storage.read_many` (retried)."""
        keys = list(keys)
        return self._retry(lambda: self.inner.read_many(keys))

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """See :meth:`Storage.read_range` (retried; the inner backend's ranged read, not a
        whole read sliced)."""
        return self._retry(lambda: self.inner.read_range(key, offset, size))

    def read_heads(self, keys: Iterable[str], size: int) -> dict[str, bytes | None]:
        """See :meth:`Storage.read_heads` (retried)."""
        keys = list(keys)
        return self._retry(lambda: self.inner.read_heads(keys, size))

    def read_versioned(self, key: str) -> Versioned | None:
        """See :meth:`Storage.read_versioned` (retried)."""
        return self._retry(lambda: self.inner.read_versioned(key))

    def write(self, key: str, data: bytes) -> None:
        """See :meth:`Storage.write` (retried: used for write-once objects)."""
        self._retry(lambda: self.inner.write(key, data))

    def write_many(self, items: Mapping[str, bytes]) -> None:
        """See :meth:`Storage.write_many` (retried whole: rewriting an object is harmless)."""
        items = dict(items)
        self._retry(lambda: self.inner.write_many(items))

    def list(self, prefix: str) -> list[str]:
        """See :meth:`Storage.list` (retried)."""
        return self._retry(lambda: self.inner.list(prefix))

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """See :meth:`Storage.list_dir` (retried)."""
        return self._retry(lambda: self.inner.list_dir(prefix))

    def exists(self, key: str) -> bool:
        """See :meth:`Storage.exists` (retried)."""
        return self._retry(lambda: self.inner.exists(key))

    def mtime(self, key: str) -> float | None:
        """See :meth:`Storage.mtime` (retried)."""
        return self._retry(lambda: self.inner.mtime(key))

    # -- not retried: ambiguous after a lost response ----------------------------------------
    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        """See :meth:`Storage.swap`. Never retried here: the caller decides (see the module doc)."""
        return self.inner.swap(key, data, expect, *([journal] if journal else []))

    def recover_refs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> int:
        """See :meth:`Storage.recover_refs` (not retried: it is kept for the next open)."""
        return self.inner.recover_refs(intents_of)

    def compact_ref_logs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> None:
        """See :meth:`Storage.compact_ref_logs` (not retried: the next gc does it again)."""
        self.inner.compact_ref_logs(intents_of)

    def sync_keys(self, keys: Iterable[str]) -> None:
        """See :meth:`Storage.sync_keys` (retried: syncing again is harmless)."""
        keys = list(keys)
        self._retry(lambda: self.inner.sync_keys(keys))

    def delete(self, key: str, expect: Token | None = None) -> None:
        """See :meth:`Storage.delete`; retried only without ``expect`` (then idempotent)."""
        if expect is not None:
            return self.inner.delete(key, expect)
        return self._retry(lambda: self.inner.delete(key))

    def delete_many(self, keys: Iterable[str]) -> None:
        """See :meth:`Storage.delete_many` (retried on the keys that remain: deleting is
        idempotent without a condition)."""
        todo = list(dict.fromkeys(keys))
        for attempt in range(self.attempts):
            try:
                return self.inner.delete_many(todo)
            except DeleteIncomplete as e:
                if attempt + 1 == self.attempts or not is_transient(e):
                    raise
                todo = e.remaining
                self.retries += 1
                delay = min(self.base_delay * 2**attempt, self.max_delay)
                self._sleep(delay * (0.5 + random.random() / 2))

    def child(self, prefix: str) -> Storage:
        """The wrapped storage's :meth:`~castore.storage.base.Storage.child`, retried alike."""
        return RetryingStorage(self.inner.child(prefix), self.attempts, self.base_delay, self.max_delay, self._sleep)

    def close(self) -> None:
        """Close the wrapped storage."""
        self.inner.close()

    def __repr__(self) -> str:
        return f"<RetryingStorage attempts={self.attempts} {self.inner!r}>"


__all__ = ["RetryingStorage", "is_transient"]
