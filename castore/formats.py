"""The storage formats (``castore.json``'s ``format``, docs/FORMAT.md 1): which this castore
reads and writes, which a new store gets, the checks of a format number, and those of the
settings a store reads from ``castore.json`` when it opens.

The one place that knows them: the store checks ``castore.json`` against them when it opens,
the object store writes in the format they allow; neither needs the other to ask (a search
through a fresh index opens a store without building its object store).
"""

from __future__ import annotations

from typing import Any

from .errors import FormatError
from .storage import Storage

#: the storage formats this castore reads and writes (castore.json's "format"); 3 is 2 with
#: deferred ref swaps on local disk (ref intents in the writers' logs, docs/FORMAT.md 12)
FORMATS = (1, 2, 3)
STORE_FORMAT = max(FORMATS)
#: the format a new store gets unless told otherwise (an existing store keeps its own), on
#: storage that can append (local disk: ref swaps journaled in the writer's log)
DEFAULT_FORMAT = 3
#: ... and on storage that cannot (object stores, memory), where format 3 would write format
#: 2's bytes: such a store stays readable by a castore that knows format 2 only
DEFAULT_FORMAT_NO_APPEND = 2
#: the castore.json settings that are JSON booleans: whether writes repack in the background
#: (:attr:`Store.auto_repack <castore.store.Store.auto_repack>`) and redact (``Store.set_redact``)
SWITCHES = ("auto_repack", "redact")


def can_append(storage: Storage) -> bool:
    """Whether ``storage`` can append to a file (it overrides
    :meth:`~castore.storage.Storage.open_appender`: local disk), known before any write."""
    return type(storage).open_appender is not Storage.open_appender


def default_format(storage: Storage) -> int:
    """The format a new store on ``storage`` gets unless told otherwise: :data:`DEFAULT_FORMAT`
    where the storage can append, else :data:`DEFAULT_FORMAT_NO_APPEND`."""
    return DEFAULT_FORMAT if can_append(storage) else DEFAULT_FORMAT_NO_APPEND


def check_format(fmt: int) -> int:
    """``fmt`` when this castore writes it (a format asked for: ``castore init --format``).

    Raises:
        FormatError: not a format this castore knows.
    """
    if fmt not in FORMATS:
        raise FormatError(f"unknown storage format {fmt!r} (this castore has {FORMATS})", found=fmt,
                          supported=STORE_FORMAT)
    return fmt


def check_stored(config: dict[str, Any], url: str) -> int:
    """The format that ``config``, the ``castore.json`` of the store at ``url``, holds, when this
    castore reads it and its :data:`SWITCHES` are true or false.

    Raises:
        FormatError: not a format number, or one of a newer castore; or a switch of another
            type (the string ``"false"`` would turn it on), named with the file.
    """
    fmt = config["format"]
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt > STORE_FORMAT or fmt < 1:
        raise FormatError(f"store {url} has format {fmt!r}; this castore reads format {STORE_FORMAT} and older. "
                          "Upgrade castore.", found=fmt, supported=STORE_FORMAT)
    for key in SWITCHES:
        if not isinstance(config.get(key, False), bool):
            raise FormatError(f"{url}/castore.json: {key} must be true or false, not {config[key]!r}")
    return fmt


__all__ = ["FORMATS", "STORE_FORMAT", "DEFAULT_FORMAT", "DEFAULT_FORMAT_NO_APPEND", "can_append", "default_format",
           "check_format", "check_stored", "SWITCHES"]
