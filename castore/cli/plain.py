"""What the command line does without click: the part ``castore grep``'s fast path shares with it.

A fresh ``castore grep -c WORD`` spends more in importing click (and the standard modules click
loads: inspect, uuid, gettext, difflib, ...) than in searching, so :mod:`castore.__main__` runs
a plain ``castore grep`` through :mod:`.fast`, which imports no click. What both ways need lives
here, once, and :mod:`.common` re-exports it for the click commands: how a storage option
``KEY=VALUE`` is read, how a session key is typed, the one-line error, ``NO_COLOR``, how the
store named by the global options is opened, and how the process ends without the
interpreter's teardown. This module imports no click, and nothing of castore at import time.
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from .text import safe

if TYPE_CHECKING:
    from ..store import Store


class OptionValueError(ValueError):
    """A storage option that is not ``KEY=VALUE`` (the click commands report it as a bad parameter)."""


def storage_options(pairs: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as storage options; ``a.b=x`` nests, JSON values are parsed.

    Raises:
        OptionValueError: a pair without ``=``, a key nesting under a plain value, or one of
            :meth:`~castore.store.Store.open`'s encryption arguments
            (:func:`~castore.crypto.args.check_storage_options`) (its message is the one a user sees
            after ``Invalid value for ...:``).
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key:
            raise OptionValueError(f"{pair!r} is not KEY=VALUE")
        try:
            value: Any = json.loads(raw)
            if not isinstance(value, (bool, int, float)) and value is not None:
                value = raw
        except ValueError:
            value = raw
        where = out
        *path, last = key.split(".")
        for p in path:
            where = where.setdefault(p, {})
            if not isinstance(where, dict):
                raise OptionValueError(f"{key!r} nests under a plain value")
        where[last] = value
    if out:
        from ..crypto.args import check_storage_options
        from ..errors import EncryptionError

        try:
            check_storage_options(out, "after -o")
        except EncryptionError as e:
            raise OptionValueError(str(e)) from None
    return out


def open_store_at(url: str | None, options: dict[str, Any], master_key_file: str | None) -> Store:
    """The store the global options name: ``url`` (``--store``; None or empty: ``$CASTORE_STORE``,
    else the nearest ``.castore``), opened with the storage ``options`` (``-o``) and the master key
    in ``master_key_file`` when given (else an encrypted store reads the environment's itself:
    :func:`castore.crypto.keys.environment_key`).

    Raises:
        KeyMissing, EncryptionError: the key file is missing or holds no master key.
        StoreNotFound, FormatError, StorageError: as :meth:`castore.store.Store.open`.
    """
    from ..store import Store, default_url

    return Store.open(url or default_url(), **options, **key_options(master_key_file))


def key_options(master_key_file: str | None) -> dict[str, Any]:
    """``master_key=`` for opening a store: the key in ``master_key_file`` (``--master-key-file``)
    when given, else nothing (an encrypted store reads ``$CASTORE_MASTER_KEY_FILE`` or
    ``$CASTORE_MASTER_KEY`` itself, and a plain one never does).

    Raises:
        KeyMissing: the file is not there.
        EncryptionError: it does not hold a master key.
    """
    if not master_key_file:
        return {}
    from ..crypto.keys import MasterKey  # only for an encrypted store: a plain one never loads it

    return {"master_key": MasterKey.from_file(master_key_file)}


# -- session keys ----------------------------------------------------------------------
def unescape(part: str) -> str:
    """Decode one part of a session key as typed: ``%2F`` is a literal ``/``, ``%25`` a ``%``."""
    out, i = [], 0
    while i < len(part):
        chunk = part[i : i + 3]
        if chunk.upper() == "%2F":
            out.append("/")
            i += 3
        elif chunk == "%25":
            out.append("%")
            i += 3
        else:
            out.append(part[i])
            i += 1
    return "".join(out)


def escape(part: str) -> str:
    """The inverse of :func:`unescape`: how to type one part of a key on the command line."""
    return part.replace("%", "%25").replace("/", "%2F")


def format_key(app: str, user: str, session: str | None = None) -> str:
    """``APP/USER[/SESSION]`` as typed on the command line (``/`` inside a name as ``%2F``)."""
    parts = [app, user] + ([session] if session is not None else [])
    return "/".join(escape(p) for p in parts)


# -- messages --------------------------------------------------------------------------
def error_line(exc: BaseException) -> str:
    """The one-line message for a library error (newlines folded, controls escaped: an
    error may quote a name or a ref read from a remote)."""
    return safe(" ".join(str(exc).split())) or type(exc).__name__


def os_error_line(e: OSError) -> str:
    """``cannot write /x/y: No such file or directory`` for an error on a file the user named."""
    what = e.strerror or error_line(e)
    return f"{e.filename}: {what}" if e.filename else what


def no_color() -> bool:
    """Whether ``$NO_COLOR`` asks for no colors (any non-empty value, see no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


# -- the end of the process ------------------------------------------------------------
#: the exit statuses after which the process may end without the interpreter's teardown (see skip_teardown)
_SKIP_TEARDOWN: set[int] = set()


def skip_teardown(*also: int) -> None:
    """Let the ``castore`` process end without the interpreter's teardown once this command
    has returned with success, exit status 0 or one of ``also`` (grep's 1: nothing matched;
    only :func:`end_process`, called by the process's entry point, heeds it; a caller of
    :data:`castore.cli.main.cli` in its own process is unaffected).

    For a command that leaves nothing to write, close or join (the store is closed with the
    command's context, before the exit) but holds many objects: ``usage`` ends holding every
    commit of the store decoded, and freeing them one by one, after a last garbage collection
    over all of them, costs a fifth of its time; the OS frees them at once. ``grep`` ends a
    short process whose teardown (every module and the search index's maps) is a tenth of it.
    """
    _SKIP_TEARDOWN.update((0, *also))


def teardown_skipped(status: object = 0) -> bool:
    """Whether a command of this process called :func:`skip_teardown` for exit status ``status``
    (``None``, as ``sys.exit()`` gives it, is 0)."""
    return (0 if status is None else status) in _SKIP_TEARDOWN


def end_process(end: SystemExit) -> NoReturn:
    """End the ``castore`` process with ``end``'s status: at once, once stdout and stderr are
    flushed, when its command asked for it (:func:`skip_teardown`) for that status; else (or
    when the output cannot be written) by raising ``end``, through the interpreter's teardown.

    Raises:
        SystemExit: ``end`` itself, in the second case.
    """
    if teardown_skipped(end.code):
        try:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:  # None: started with the descriptor closed (click writes nothing there)
                    stream.flush()
        except (OSError, ValueError):
            raise end from None  # the output could not be written: the ordinary exit reports it
        os._exit(int(end.code or 0))  # the status teardown_skipped took: an int
    raise end


__all__ = ["OptionValueError", "storage_options", "open_store_at", "key_options", "unescape", "escape", "format_key",
           "error_line", "os_error_line", "no_color", "skip_teardown", "teardown_skipped", "end_process"]
