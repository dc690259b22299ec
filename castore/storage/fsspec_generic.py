"""Any other fsspec file system (gcs, azure, ssh, ...), without atomic conditional writes.

Plain reads and writes are what fsspec gives. :meth:`FsspecStorage.swap` checks and then
writes, which is not atomic: two writers racing on the same ref can both win. Use local
disk, memory or S3 where several writers share a store.
"""

from __future__ import annotations

import builtins
import hashlib
from typing import Any

from ..errors import StorageError
from .base import Journal, PreconditionFailed, Storage, Token, Versioned, check_key


class FsspecStorage(Storage):
    """A store root on an arbitrary fsspec file system (best-effort compare-and-swap)."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        import fsspec

        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.root = root.rstrip("/")

    def child(self, prefix: str) -> FsspecStorage:
        """The same file system rooted at the folder ``prefix``.

        Raises:
            InvalidName: ``prefix`` is not a valid key.
        """
        sub = check_key(prefix)
        out = object.__new__(FsspecStorage)
        out.url, out.fs, out.root, out.durable = f"{self.url.rstrip('/')}/{sub}", self.fs, self._p(sub), self.durable
        return out

    def _p(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def read(self, key: str) -> bytes:
        """Return the bytes at ``key``.

        Raises:
            FileNotFoundError: no such key. StorageError: the file system failed.
        """
        try:
            return self.fs.cat_file(self._p(key))
        except FileNotFoundError:
            raise FileNotFoundError(key) from None
        except Exception as e:
            raise StorageError(f"cannot read {key} from {self.url}: {e}", self.url) from e

    def write(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key``.

        Raises:
            StorageError: the file system failed.
        """
        try:
            self.fs.makedirs(self._p(key).rsplit("/", 1)[0], exist_ok=True)
            self.fs.pipe_file(self._p(key), data)
        except Exception as e:
            raise StorageError(f"cannot write {key} to {self.url}: {e}", self.url) from e

    def read_versioned(self, key: str) -> Versioned | None:
        """Read ``key`` with a digest of its bytes as token."""
        try:
            data = self.read(key)
        except FileNotFoundError:
            return None
        return Versioned(data, hashlib.blake2b(data, digest_size=16).hexdigest())

    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        """Check then write (not atomic; see the module docstring).

        Raises:
            PreconditionFailed: ``key``'s token is not ``expect``. StorageError.
        """
        cur = self.read_versioned(key)
        if (cur.token if cur else None) != expect:
            raise PreconditionFailed(key, expect)
        self.write(key, data)
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    def delete(self, key: str, expect: Token | None = None) -> None:
        """Delete ``key`` (check then delete when ``expect`` is given).

        Raises:
            PreconditionFailed: ``key``'s token is not ``expect``. StorageError.
        """
        if expect is not None:
            cur = self.read_versioned(key)
            if cur is None or cur.token != expect:
                raise PreconditionFailed(key, expect)
        try:
            self.fs.rm_file(self._p(key))
        except FileNotFoundError:
            return
        except Exception as e:
            raise StorageError(f"cannot delete {key} from {self.url}: {e}", self.url) from e
        self._prune(key)

    def _prune(self, key: str) -> None:
        """Remove folders emptied by a delete, so listings forget them (as on local disk)."""
        parts = key.split("/")[:-1]
        while parts:
            d = self._p("/".join(parts))
            try:
                if self.fs.ls(d, detail=False):
                    return
                self.fs.rmdir(d)
            except Exception:  # noqa: BLE001 - object stores have no folders to remove
                return
            parts.pop()

    def mtime(self, key: str) -> float | None:
        """Modification time of ``key`` where the file system reports one, else None.

        Raises:
            StorageError: the file system failed.
        """
        try:
            return self.fs.modified(self._p(key)).timestamp()
        except FileNotFoundError:
            return None
        except Exception:  # noqa: BLE001 - not every file system implements modified()
            pass
        try:
            info = self.fs.info(self._p(key))
        except FileNotFoundError:
            return None
        except Exception as e:
            raise StorageError(f"cannot stat {key} on {self.url}: {e}", self.url) from e
        for name in ("mtime", "LastModified", "last_modified", "created"):
            v = info.get(name)
            if isinstance(v, (int, float)):
                return float(v)
            if hasattr(v, "timestamp"):
                return float(v.timestamp())
        return None

    def list(self, prefix: str) -> list[str]:
        """Every key below ``prefix``."""
        base = self._p(prefix)
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        n = len(self.root) + 1
        return sorted(p[n:] for p in found)

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """Immediate children of ``prefix``."""
        try:
            found = self.fs.ls(self._p(prefix), detail=False)
        except FileNotFoundError:
            return []
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found)
