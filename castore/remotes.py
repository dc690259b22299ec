"""Remotes: the other stores a store names, kept in its ``castore.json`` as
``{"remotes": {name: {"url", "options"}}}``, and opened by name or URL for ``castore push``,
``pull`` and ``fetch`` (:mod:`castore.sync`, which names these functions too).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import names
from .crypto.args import storage_options
from .errors import CastoreError, InvalidName
from .store import Store


def check_remote_name(name: str) -> str:
    """``name`` when it is a valid remote name (a name's rules, no '/', no surrounding spaces).

    Raises:
        InvalidName: it is not.
    """
    names.validate(name, "remote name")
    if "/" in name or name.strip() != name:
        raise InvalidName(name, "must not contain '/' or surrounding spaces", "remote name")
    return name


def add_remote(store: Store, name: str, url: str, options: Mapping[str, Any] | None = None,
               replace: bool = False) -> dict[str, Any]:
    """Record remote ``name`` at ``url`` (with storage options) in the store's config.

    Options are stored as given, in plain text in ``castore.json``: prefer the
    environment or a credentials file for secrets. A master key is never one of them.

    Raises:
        CastoreError: a remote of that name exists (unless ``replace``).
        EncryptionError: ``options`` hold an encryption argument (``master_key``...:
            :func:`~castore.crypto.args.check_storage_options`).
        InvalidName: a bad remote name. StorageError.
    """
    check_remote_name(name)
    if not isinstance(url, str) or not url.strip():
        raise CastoreError("a remote needs a URL")
    entry = {"url": url, "options": storage_options(options, f"in the options of remote {name!r}")}

    def change(cfg: dict[str, Any]) -> dict[str, Any]:
        remotes = dict(cfg.get("remotes") or {})
        if name in remotes and not replace and remotes[name] != entry:
            raise CastoreError(f"remote {name!r} already exists (at {remotes[name].get('url')})")
        remotes[name] = entry
        return {**cfg, "remotes": remotes}

    store.update_config(change)
    return entry


def remove_remote(store: Store, name: str) -> None:
    """Forget remote ``name`` (its ``remotes/<name>/...`` refs stay).

    Raises:
        CastoreError: no such remote. StorageError.
    """

    def change(cfg: dict[str, Any]) -> dict[str, Any]:
        remotes = dict(cfg.get("remotes") or {})
        if name not in remotes:
            raise CastoreError(f"no remote {name!r}")
        del remotes[name]
        return {**cfg, "remotes": remotes}

    store.update_config(change)


def list_remotes(store: Store) -> dict[str, dict[str, Any]]:
    """The store's remotes: ``{name: {"url": ..., "options": {...}}}``."""
    return {k: dict(v) for k, v in (store.config.get("remotes") or {}).items()}


def open_remote(store: Store, remote: str, **options: Any) -> tuple[str, Store]:
    """Open a remote by name (from the config) or by URL; return (name, store).

    A URL given directly is named by itself in ``remotes/<name>/...`` refs, after
    making it a safe single name.

    Raises:
        CastoreError: ``remote`` is neither a configured remote nor a URL.
        StorageError, FormatError.
    """
    remotes = list_remotes(store)
    if remote in remotes:
        entry = remotes[remote]
        return remote, Store.open(entry["url"], **{**entry.get("options", {}), **options})
    if "://" in remote or remote.startswith((".", "/", "~")):
        return remote, Store.open(remote, **options)
    known = ", ".join(sorted(remotes)) or "none configured"
    raise CastoreError(f"no remote {remote!r} (known: {known}); add it with `castore remote add {remote} URL`")


__all__ = ["add_remote", "check_remote_name", "list_remotes", "open_remote", "remove_remote"]
