"""A pass-through storage wrapper: a test subclasses it and overrides the calls it changes
(holds a swap, loses a response, counts requests)."""

from __future__ import annotations

from castore.storage import Storage, Token, Versioned


class PassThrough(Storage):
    """Hands the seven calls every backend must have (``read``, ``write``, ``read_versioned``,
    ``swap``, ``delete``, ``list``, ``list_dir``) to ``inner``, as a backend written against
    the bare contract does: every other call keeps :class:`~castore.storage.Storage`'s own
    version built on these (a batch write is one ``write`` per key, a group of swaps one
    ``swap`` each, no appender, so no journal), so an override of ``write`` or ``swap`` sees
    every write or swap. A subclass passes more on where its test needs the backend's own.
    """

    def __init__(self, inner: Storage) -> None:
        self.inner, self.url, self.durable = inner, inner.url, inner.durable

    def read(self, key: str) -> bytes:
        """See :meth:`Storage.read`."""
        return self.inner.read(key)

    def write(self, key: str, data: bytes) -> None:
        """See :meth:`Storage.write`."""
        self.inner.write(key, data)

    def read_versioned(self, key: str) -> Versioned | None:
        """See :meth:`Storage.read_versioned`."""
        return self.inner.read_versioned(key)

    def swap(self, key: str, data: bytes, expect: Token | None) -> Token:
        """See :meth:`Storage.swap` (no ``journal``: this backend never gets one)."""
        return self.inner.swap(key, data, expect)

    def delete(self, key: str, expect: Token | None = None) -> None:
        """See :meth:`Storage.delete`."""
        self.inner.delete(key, expect)

    def list(self, prefix: str) -> list[str]:
        """See :meth:`Storage.list`."""
        return self.inner.list(prefix)

    def list_dir(self, prefix: str) -> list[str]:
        """See :meth:`Storage.list_dir`."""
        return self.inner.list_dir(prefix)
