"""Where castore keeps what it derives from a store, outside the store: a folder per kind of
derived data under ``$XDG_CACHE_HOME/castore/`` (else ``~/.cache/castore/``), and in it a file
or folder per store, named by a digest of the store's URL (a local path made absolute first):
the search index (:mod:`castore.grep.index`, kind ``grep``) and usage's rows
(:mod:`castore.usage.cache`, kind ``usage``). Derived data: deleting it loses nothing.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store import Store


def kind_folder(kind: str) -> str:
    """The folder of derived data of ``kind`` (``grep``, ``usage``) of every store. Raises nothing."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "castore", kind)


def store_url(store: Store) -> str:
    """``store``'s URL as derived data records it: a local path made absolute (the same store
    reached from another working folder is the same store). Raises nothing."""
    url = str(getattr(store.storage, "url", "") or repr(store))
    return url if "://" in url else os.path.abspath(url)


def store_digest(store: Store) -> str:
    """The name of ``store``'s derived data in a kind's folder: 32 hex digits of the SHA-256 of
    :func:`store_url`. Raises nothing."""
    return _sha256(store_url(store).encode()).hexdigest()[:32]


def _sha256(data: bytes) -> Any:
    """SHA-256 of ``data``: CPython's own module where it has one (``hashlib`` loads OpenSSL
    first, ~20 ms of a search's start), else hashlib's."""
    try:
        from _sha256 import sha256  # CPython 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # CPython 3.12+
        except ImportError:
            from hashlib import sha256
    return sha256(data)
