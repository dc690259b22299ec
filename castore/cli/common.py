"""What every command module shares: the store and session options, ``--json``, errors.

A command module (see :mod:`castore.cli.main`) uses these instead of re-parsing anything::

    from castore.cli.common import json_option, open_store, pass_session, print_json

    @click.command("thing")
    @json_option("one object: {\"x\": ...}")
    @pass_session()
    def thing(session, as_json):
        \"\"\"Say what the command does (the first line is the summary in `castore --help`).\"\"\"
        result = session.something()          # one library call
        print_json(result) if as_json else click.echo(render(result))

Conventions: data goes to stdout, messages to stderr (:func:`note`); a
:class:`~castore.errors.CastoreError` raised anywhere inside a command becomes one line
``Error: ...`` on stderr and exit status 1 (the group does that, see
:class:`CastoreGroup`); a usage mistake is a :class:`click.UsageError` (exit 2).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from .. import objects as o
from ..errors import CastoreError, SessionNotFound
from ..session import Session
from ..store import Store, default_url

F = TypeVar("F", bound=Callable[..., Any])

#: the environment variables behind ``--store`` and ``--session``
STORE_ENV = "CASTORE_STORE"
SESSION_ENV = "CASTORE_SESSION"


@dataclass
class CliState:
    """The global options of one invocation, and the store once it is opened."""

    store_url: str | None = None
    session_spec: str | None = None
    _store: Store | None = field(default=None, repr=False)


def _state(ctx: click.Context) -> CliState:
    st = ctx.find_object(CliState)
    if st is None:  # a command invoked on its own, outside the `castore` group
        st = ctx.ensure_object(CliState)
    return st


# -- errors ----------------------------------------------------------------------------
def error_line(exc: BaseException) -> str:
    """The one-line message for a library error (newlines folded, controls escaped: an
    error may quote a name or a ref read from a remote)."""
    from .render import safe  # render imports this module

    return safe(" ".join(str(exc).split())) or type(exc).__name__


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a :class:`CastoreError` into ``Error: ...`` and exit status 1.

    The ``castore`` group already applies this around every command (nested groups
    included); use it directly only for code that runs outside a command.
    """
    try:
        yield
    except CastoreError as e:
        raise click.ClickException(error_line(e)) from e


class CastoreGroup(click.Group):
    """A click group that reports library errors as one line, never as a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand, mapping :class:`CastoreError` to exit status 1."""
        with cli_errors():
            return super().invoke(ctx)


# -- the store -------------------------------------------------------------------------
def store_url(ctx: click.Context) -> str:
    """The store URL this invocation uses: ``--store``, ``$CASTORE_STORE``, or ``./.castore``."""
    return _state(ctx).store_url or default_url()


def open_store(ctx: click.Context | None = None, *, must_exist: bool = True) -> Store:
    """The store named by ``--store`` (opened once per invocation, closed at its end).

    Args:
        ctx: the click context (default: the current one).
        must_exist: raise :class:`~castore.errors.StoreNotFound` when no store is there.

    Raises:
        StoreNotFound, FormatError, StorageError.
    """
    ctx = ctx or click.get_current_context()
    st = _state(ctx)
    if st._store is None:  # noqa: SLF001
        store = Store.open(store_url(ctx))
        st._store = store  # noqa: SLF001
        ctx.find_root().call_on_close(store.close)
    if must_exist:
        st._store.require()  # noqa: SLF001
    return st._store  # noqa: SLF001


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


def split_key(spec: str, min_parts: int, max_parts: int, param_hint: str) -> list[str]:
    """Split ``APP/USER/SESSION`` (or a prefix of it) into decoded parts.

    Raises:
        click.BadParameter: the wrong number of parts (a usage mistake, exit 2).
    """
    parts = spec.split("/")
    if not min_parts <= len(parts) <= max_parts:
        want = "APP/USER/SESSION" if min_parts == 3 else "APP[/USER]"
        raise click.BadParameter(
            f"{spec!r} is not {want} (write a '/' inside a name as %2F)", param_hint=param_hint
        )
    return [unescape(p) for p in parts]


def get_session(ctx: click.Context | None = None, *, must_exist: bool = True, spec: str | None = None) -> Session:
    """The session named by ``-s/--session`` (or ``$CASTORE_SESSION``) in the store.

    Args:
        ctx: the click context (default: the current one).
        spec: ``APP/USER/SESSION`` given to the command itself; it wins over the group's.
        must_exist: raise :class:`~castore.errors.SessionNotFound` for a session with
            no entries (commands that write, like ``append``, pass False).

    Raises:
        click.UsageError: no session was given (exit 2).
        InvalidName, StoreNotFound, SessionNotFound, StorageError.
    """
    ctx = ctx or click.get_current_context()
    spec = spec or _state(ctx).session_spec
    if not spec:
        raise click.UsageError(
            f"this command needs a session: pass -s APP/USER/SESSION or set {SESSION_ENV}", ctx=ctx
        )
    app, user, sid = split_key(spec, 3, 3, "'-s' / '--session'")
    store = open_store(ctx, must_exist=must_exist)
    session = store.session(app, user, sid)
    if must_exist and not session.exists():
        raise SessionNotFound(session.key)
    return session


def pass_session(must_exist: bool = True) -> Callable[[F], F]:
    """Decorator: call the command with ``session`` (see :func:`get_session`) as first argument."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return f(get_session(must_exist=must_exist), *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


def pass_store(must_exist: bool = True) -> Callable[[F], F]:
    """Decorator: call the command with the open ``store`` as first argument."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return f(open_store(must_exist=must_exist), *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return deco


# -- output ----------------------------------------------------------------------------
def json_option(schema: str) -> Callable[[F], F]:
    """Decorator: add ``--json`` (passed as ``as_json``), documenting the document's shape.

    Args:
        schema: the shape of the JSON document, shown in ``--help`` (and so in the README).
    """
    return click.option(
        "--json", "as_json", is_flag=True,
        help=f"Print one JSON document instead of text: {schema}",
    )


def to_jsonable(value: Any) -> Any:
    """Stored values as JSON-compatible builtins (bytes become base64 strings)."""
    return o.to_builtins(value)


def print_json(doc: Any) -> None:
    """Print one JSON document on stdout (indented, UTF-8, stable key order as given)."""
    click.echo(json.dumps(to_jsonable(doc), indent=2, ensure_ascii=False))


def note(message: str) -> None:
    """A message for the person at the terminal: stderr, never stdout."""
    click.echo(message, err=True)


__all__ = [
    "CliState",
    "CastoreGroup",
    "cli_errors",
    "error_line",
    "store_url",
    "open_store",
    "get_session",
    "pass_session",
    "pass_store",
    "split_key",
    "format_key",
    "escape",
    "unescape",
    "json_option",
    "print_json",
    "to_jsonable",
    "note",
    "STORE_ENV",
    "SESSION_ENV",
]
