"""Bytes by URL: the only layer that talks to file systems and object stores.

:func:`open_storage` picks a backend from the URL's scheme: a plain path or ``file://``
for local disk (:mod:`.local`), ``memory://`` for a per-process dict (:mod:`.memory`),
``s3://bucket/prefix`` for S3 through s3fs (:mod:`.s3`, imported lazily), and any other
fsspec protocol through :mod:`.fsspec_generic` (no atomic compare-and-swap there).
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import StorageError
from .base import (
    Appender,
    DeleteIncomplete,
    Journal,
    JournalMany,
    PreconditionFailed,
    RefIntent,
    Storage,
    Token,
    Versioned,
)

__all__ = ["open_storage", "Storage", "Appender", "DeleteIncomplete", "Journal", "JournalMany", "PreconditionFailed",
           "RefIntent", "Token", "Versioned",
           "split_url"]


def split_url(url: str) -> tuple[str, str]:
    """Split a store URL into (protocol, path); plain paths are ``file``."""
    if "://" in url:
        proto, _, rest = url.partition("://")
        return proto.lower(), rest
    return "file", url


def open_storage(url: str, *, durable: bool = True, **storage_options: Any) -> Storage:
    """Open the storage backend for ``url``.

    Args:
        url: a local path, ``file://``, ``memory://``, ``s3://bucket/prefix`` or another
            fsspec URL.
        durable: make writes durable (fsync on local disk) before returning.
        **storage_options: passed to the backend (for S3: ``endpoint_url``, ``key``,
            ``secret``, ``client_kwargs``, ...).

    Raises:
        StorageError: the scheme is unknown or its backend cannot be loaded; an option given
            to local disk or ``memory://``, which take none (a typo would pass unseen);
            ``durable`` that is not a bool; a local path that is a file or lies below one
            (:func:`~castore.storage.local.refuse_file`).
    """
    proto, path = split_url(url)
    if not isinstance(durable, bool):  # (-o durable=maybe would be durable, unsaid)
        raise StorageError(f"the option durable must be true or false, not {durable!r}", url)
    if proto in ("file", "memory") and storage_options:
        name = sorted(storage_options)[0]
        raise StorageError(f"unknown storage option {name!r}: a store on "
                           f"{'local disk' if proto == 'file' else 'memory://'} takes no options", url)
    if proto == "file":
        from .local import LocalStorage, refuse_file

        root = os.path.abspath(os.path.expanduser(path))
        refuse_file(root, url)
        return LocalStorage(root, durable=durable)
    if proto == "memory":
        from .memory import MemoryStorage

        return MemoryStorage(path)
    if proto in ("s3", "s3a"):
        try:
            from .s3 import S3Storage
        except ImportError as e:
            raise StorageError(f"S3 support needs s3fs: pip install 'castore[s3]' ({e})", url) from e
        from .retrying import RetryingStorage

        # Network calls fail transiently; idempotent ones are retried (never a ref swap).
        return RetryingStorage(S3Storage(path, **storage_options))
    try:
        from .fsspec_generic import FsspecStorage

        return FsspecStorage(url, **storage_options)
    except (ImportError, ValueError) as e:
        raise StorageError(f"cannot open {url!r}: unknown or unavailable protocol {proto!r} ({e})", url) from e
