"""What :meth:`castore.store.Store.open`'s encryption arguments may be given with, and the
checks that refuse them elsewhere: no cipher here (importing this loads no ``cryptography``).

``master_key``, ``key_store`` and ``encrypted`` are arguments of their own, never storage
options: stored with a remote's options they would keep a master key in clear in
castore.json, and typed after ``-o`` they show it in the process list (docs/encryption.md).
A ``key_store`` names a new encrypted store's key store; given for an existing store whose
keys are elsewhere, or for a plain one, it would be dropped, unsaid.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import EncryptionError

#: :meth:`Store.open`'s encryption arguments, which are never storage options: a master key
#: is not written into castore.json with a remote's options, nor typed after ``-o``
ENCRYPTION_ARGS = ("master_key", "key_store", "encrypted")


def check_storage_options(options: Mapping[str, Any], where: str) -> None:
    """Refuse storage ``options`` (``-o``, a remote's) holding one of :data:`ENCRYPTION_ARGS`:
    stored with a remote they would keep a master key in clear, and on a command line show it
    in the process list; ``where`` names where they came from.

    Raises:
        EncryptionError: naming the option and what to use instead.
    """
    for name in ENCRYPTION_ARGS:
        if name in options:
            raise EncryptionError(
                f"{name} ({where}) is not a storage option: give the master key with --master-key-file, "
                "$CASTORE_MASTER_KEY_FILE or $CASTORE_MASTER_KEY (master_key= in Python), and make an "
                "encrypted store with `castore init --encrypted [--key-store URL]`")


def refuse_plain_creation(url: str, master_key_given: bool, key_store: str | None) -> None:
    """Refuse a master key or a ``key_store`` given for a new store at ``url`` that is not
    created encrypted: only ``encrypted=True`` makes an encrypted store, and the store would
    be created plain, the key unused, unsaid.

    Raises:
        EncryptionError: always (the caller knows the store is new and not encrypted), naming
            what was given and what to do.
    """
    given = "master_key=" if master_key_given else "key_store="
    raise EncryptionError(f"{given} was given for a new store at {url}, which would not be encrypted: "
                          f"create it with encrypted=True (`castore init --encrypted`), or leave {given} out")


def storage_options(options: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """A copy of storage ``options`` (None: none), checked by :func:`check_storage_options`.

    Raises:
        EncryptionError: as :func:`check_storage_options`.
    """
    check_storage_options(options or {}, where)
    return dict(options or {})


def check_encryption_args(url: str, config: Mapping[str, Any], key_store: str | None) -> None:
    """Refuse ``key_store`` (the URL of a new encrypted store's key store) given for the
    existing store at ``url`` (its castore.json ``config``) when that store is not encrypted,
    or keeps its keys elsewhere: it would be dropped, unsaid.

    Raises:
        EncryptionError: naming the store and where its keys are.
    """
    if key_store is None:
        return
    settings = config.get("encryption")
    if not isinstance(settings, dict):
        raise EncryptionError(f"key_store= was given for the store at {url}, which is not encrypted: "
                              "`castore encrypt DEST --key-store URL` writes an encrypted copy of it")
    if settings.get("key_store") != key_store:
        raise EncryptionError(f"key_store= names {key_store}, but the key store of {url} is at "
                              f"{settings.get('key_store') or 'its own keys/'} (castore.json): key_store= "
                              "chooses a new store's key store only; leave it out")


__all__ = ["ENCRYPTION_ARGS", "check_storage_options", "storage_options", "refuse_plain_creation",
           "check_encryption_args"]
