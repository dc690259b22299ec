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
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..errors import CastoreError, SessionNotFound, StoreNotFound
from .grep_spec import SESSION_ENV, STORE_ENV, UNSET, Opt, json_opt, limit_opt
from .plain import (
    OptionValueError,
    error_line,
    escape,
    format_key,
    no_color,
    open_store_at,
    os_error_line,
    skip_teardown,
    storage_options,
    teardown_skipped,
    unescape,
)
from .plain import key_options as plain_key_options
from .text import safe, safe_json

if TYPE_CHECKING:
    # imported where used: `castore --version` and `--help` load no store, and a command that
    # only reads loads no Session class it does not use
    from ..session import Session
    from ..store import Store

F = TypeVar("F", bound=Callable[..., Any])

#: the pager for long output (then ``$PAGER``, then ``less``); empty or ``cat``: no pager
PAGER_ENV = "CASTORE_PAGER"
#: the key in ``castore.json`` holding the default session (``castore use``)
SESSION_CONFIG_KEY = "session"


class CliState:
    """The global options of one invocation, and the store once it is opened.

    A plain class rather than a dataclass: a dataclass is compiled from generated source on
    import, which every ``castore`` command would pay for (about a millisecond).
    """

    __slots__ = ("store_url", "session_spec", "store_options", "pager", "store_given", "session_from",
                 "session_typed", "master_key_file", "_store")

    def __init__(self, store_url: str | None = None, session_spec: str | None = None,
                 store_options: dict[str, Any] | None = None, pager: bool = True, store_given: bool = False,
                 session_from: str = "-s", session_typed: bool = False, master_key_file: str | None = None) -> None:
        self.store_url = store_url
        self.session_spec = session_spec
        self.store_options: dict[str, Any] = {} if store_options is None else store_options
        self.pager = pager
        #: whether --store was typed on the command line (not taken from $CASTORE_STORE)
        self.store_given = store_given
        #: where session_spec came from: "-s" or "$CASTORE_SESSION"
        self.session_from = session_from
        #: whether -s was typed before the command (``castore -s A/U/S CMD``): a command that
        #: works on no one session refuses it rather than ignoring it
        self.session_typed = session_typed
        #: --master-key-file: the master key of an encrypted store (else $CASTORE_MASTER_KEY)
        self.master_key_file = master_key_file
        self._store: Store | None = None


def _state(ctx: click.Context) -> CliState:
    st = ctx.find_object(CliState)
    if st is None:  # a command invoked on its own, outside the `castore` group
        st = ctx.ensure_object(CliState)
    return st


# -- errors ----------------------------------------------------------------------------
@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a :class:`CastoreError` into ``Error: ...`` and exit status 1.

    The ``castore`` group already applies this around every command (nested groups
    included); use it directly only for code that runs outside a command.
    """
    try:
        yield
    except StoreNotFound as e:
        raise click.ClickException(_no_store_line(e)) from e
    except CastoreError as e:
        raise click.ClickException(error_line(e)) from e
    except BrokenPipeError:
        raise
    except OSError as e:
        # a file the user named (export -o, import): one line, not a traceback
        raise click.ClickException(os_error_line(e)) from e


def _no_store_line(e: StoreNotFound) -> str:
    """:func:`error_line` of ``e``; of a folder whose ``.castore`` holds a store (where
    ``castore clone URL DIR`` and ``init`` put it), naming that store instead of how to make one."""
    from ..store import STORE_DIR

    inner = os.path.join(e.url, STORE_DIR) if "://" not in e.url else ""
    if inner and os.path.isdir(inner):
        return safe(f"no castore store at {e.url!r}; {inner} is one: pass --store {inner}, or run castore in {e.url}")
    return error_line(e)


class CastoreGroup(click.Group):
    """A click group that reports library errors as one line, never as a traceback, and
    refuses a typed ``-s`` before a command that works on no one session."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand, mapping :class:`CastoreError` to exit status 1."""
        with cli_errors():
            return super().invoke(ctx)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        """As click's; then :func:`check_session_taken` (a nested group's commands)."""
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None:
            check_session_taken(ctx, f"{ctx.command_path} {name}", cmd)
        return name, cmd, rest


def check_session_taken(ctx: click.Context, path: str, cmd: click.Command) -> None:
    """Refuse ``castore -s A/U/S CMD`` when CMD works on no one session (it would ignore -s).

    Raises:
        click.UsageError: ``-s`` was typed before such a command (exit 2).
    """
    st = ctx.find_object(CliState)
    if st is not None and st.session_typed and not isinstance(cmd, click.Group) and not takes_session(cmd):
        raise click.UsageError(f"`{path}` works on no one session: -s/--session is not taken here", ctx=ctx)


# -- options ----------------------------------------------------------------------------
def parse_options(pairs: tuple[str, ...], param_hint: str = "'--option'") -> dict[str, Any]:
    """``KEY=VALUE`` pairs as storage options; ``a.b=x`` nests, JSON values are parsed
    (:func:`castore.cli.plain.storage_options`).

    Raises:
        click.BadParameter: a pair without ``=``, or a key nesting under a plain value.
    """
    try:
        return storage_options(pairs)
    except OptionValueError as e:
        raise click.BadParameter(str(e), param_hint=param_hint) from None


def click_option(spec: Opt, *, named: bool = True, **extra: Any) -> click.Option:
    """The click option declared by ``spec`` (:mod:`castore.cli.grep_spec`: the global options,
    grep's, ``--json`` and ``-n/--limit``), with ``extra`` keyword arguments of
    :class:`click.Option` (``hidden``, ``callback``, ``shell_complete``, ...); ``named=False``
    leaves click to name the parameter after its spellings (a copy whose value is not passed on)."""
    decls, kw = _option_args(spec, named)
    return click.Option(decls, **kw, **extra)


def _option_args(spec: Opt, named: bool = True) -> tuple[list[str], dict[str, Any]]:
    """The declarations and keyword arguments of ``click.option`` for ``spec``."""
    kw: dict[str, Any] = {"help": spec.help}
    if not spec.takes_value:
        if spec.flag is True and spec.default is UNSET:
            kw["is_flag"] = True
        else:
            kw["flag_value"] = spec.flag
    if spec.default is not UNSET:
        kw["default"] = spec.default
    if spec.multiple:
        kw["multiple"] = True
    if spec.choices is not None:
        kw["type"] = click.Choice(list(spec.choices))
    elif spec.min is not None:
        kw["type"] = click.IntRange(min=spec.min)
    if spec.metavar is not None:
        kw["metavar"] = spec.metavar
    if spec.envvar is not None:
        kw["envvar"] = spec.envvar
    return [*spec.decls, spec.name] if named else list(spec.decls), kw


# -- the store -------------------------------------------------------------------------
def store_url(ctx: click.Context) -> str:
    """The store URL this invocation uses: ``--store``, ``$CASTORE_STORE``, or ``./.castore``."""
    from ..store import default_url

    return _state(ctx).store_url or default_url()


def store_options(ctx: click.Context) -> dict[str, Any]:
    """The storage options given with ``--store`` (``-o KEY=VALUE``)."""
    return dict(_state(ctx).store_options)


def key_options(ctx: click.Context | None = None) -> dict[str, Any]:
    """``master_key=`` for opening a store: the key in --master-key-file when it was given
    (else the store reads $CASTORE_MASTER_KEY itself; :func:`castore.cli.plain.key_options`).

    Raises:
        KeyMissing: the file is not there.
        EncryptionError: it does not hold a master key.
    """
    return plain_key_options(_state(ctx or click.get_current_context()).master_key_file)


def ensure_bucket(url: str, ctx: click.Context | None = None) -> None:
    """On ``s3://BUCKET/...``: create the bucket when it is missing (a store cannot even be
    opened without it), with the global ``-o`` options; other URLs are left alone.

    Raises:
        StorageError: the backend failed.
    """
    from ..storage import open_storage, split_url

    if split_url(url)[0] not in ("s3", "s3a"):
        return
    storage: Any = open_storage(url, **store_options(ctx or click.get_current_context()))  # S3Storage
    try:
        if not storage.bucket_exists():
            storage.create_bucket()
            note(f"Created bucket {storage.bucket!r} at {storage.endpoint}")
    finally:
        storage.close()


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
        store = open_store_at(st.store_url, st.store_options, st.master_key_file)
        st._store = store  # noqa: SLF001
        ctx.find_root().call_on_close(store.close)
    if must_exist:
        st._store.require()  # noqa: SLF001
    return st._store  # noqa: SLF001


# -- session keys ----------------------------------------------------------------------
def split_key(spec: str, min_parts: int, max_parts: int, param_hint: str) -> list[str]:
    """Split ``APP/USER/SESSION`` (or a prefix of it) into decoded parts.

    Raises:
        click.BadParameter: the wrong number of parts (a usage mistake, exit 2).
    """
    parts = spec.split("/")
    if not min_parts <= len(parts) <= max_parts:
        want = ("APP/USER/SESSION" if min_parts == 3 else "APP[/USER[/SESSION]]" if max_parts == 3
                else "APP[/USER]")
        raise click.BadParameter(
            f"{spec!r} is not {want} (write a '/' inside a name as %2F)", param_hint=param_hint
        )
    return [unescape(p) for p in parts]


def get_session(ctx: click.Context | None = None, *, must_exist: bool = True, new_ok: bool = False,
                spec: str | None = None) -> Session:
    """The session named by ``-s/--session`` (or ``$CASTORE_SESSION``) in the store.

    Args:
        ctx: the click context (default: the current one).
        spec: ``APP/USER/SESSION`` given to the command itself; it wins over the group's.
        must_exist: raise :class:`~castore.errors.SessionNotFound` for a session with
            no entries (commands that write, like ``append``, pass False).
        new_ok: look a short form up as :func:`find_session` does, and take the spec as
            typed only when nothing matches (``status`` of a prefix shows that session).

    Raises:
        click.UsageError: no session was given (exit 2).
        InvalidName (an empty name too), StoreNotFound, SessionNotFound, StorageError.
    """
    ctx = ctx or click.get_current_context()
    spec = spec if spec is not None else _state(ctx).session_spec
    store = None
    if spec is None:  # an empty name is no "no session given": find_session refuses it
        store = open_store(ctx, must_exist=False)
        spec = default_session(store)
        if not spec:
            raise click.UsageError(
                f"this command needs a session: pass -s APP/USER/SESSION, set {SESSION_ENV}, "
                f"or choose one with {hint('use APP/USER/SESSION', ctx, session=False)}", ctx=ctx
            )
    return find_session(open_store(ctx, must_exist=must_exist), spec, must_exist=must_exist, new_ok=new_ok)


def find_session(store: Store, spec: str, *, must_exist: bool = True, new_ok: bool = False,
                 param_hint: str = "'-s' / '--session'") -> Session:
    """The session ``spec`` names: ``APP/USER/SESSION``, or found as a short commit id is.

    ``APP/USER/SESSION`` names that session; when it has no entries (and ``must_exist``),
    the one of APP/USER whose id starts with SESSION. A spec without ``/`` is a session
    id alone, of any app and user, whole or a unique prefix (``castore use 0ccf1a04``).
    With ``must_exist`` False, ``APP/USER/SESSION`` is taken as typed (a new session);
    with ``new_ok``, it is looked up as above, and taken as typed when nothing matches.

    Raises:
        click.BadParameter: neither form (exit 2).
        SessionNotFound, AmbiguousSession (its candidates in the message), InvalidName,
        StoreNotFound (a session id alone, and no store), StorageError.
    """
    parts = spec.split("/")
    if len(parts) not in (1, 3):
        raise click.BadParameter(f"{spec!r} is not APP/USER/SESSION or a session id (write a '/' inside a name "
                                 "as %2F)", param_hint=param_hint)
    if len(parts) == 3:
        session = store.session(*split_key(spec, 3, 3, param_hint))
        if (not must_exist and not new_ok) or session.exists():
            return session
    from .. import porcelain  # only for a short form: it loads sync and the views

    if len(parts) == 1:
        store.require()  # no store: say so, not that no session has this id (append -s 0ccf)
        return store.session(*porcelain.find_session(store, unescape(spec)))
    app, user, sid = session.key
    try:
        return store.session(*porcelain.find_session(store, sid, app, user))
    except SessionNotFound:
        if new_ok:
            return session
        raise


def default_session(store: Store) -> str | None:
    """The session chosen with ``castore use`` for this store (``APP/USER/SESSION``), if any."""
    value = store.config.get(SESSION_CONFIG_KEY) if store.exists else None
    return value if isinstance(value, str) and value else None


def session_source(ctx: click.Context) -> str:
    """Where the session of this invocation comes from: ``-s``, ``$CASTORE_SESSION`` or ``castore use``."""
    st = _state(ctx)
    return st.session_from if st.session_spec else "castore use"


_USES_SESSION = "castore_uses_session"


def uses_session(f: F) -> F:
    """Decorator: mark a command that works on the session of ``-s`` (through :func:`get_session`).

    Only such commands accept ``-s/--session`` (before or after their name);
    :func:`pass_session` marks its commands itself.
    """
    setattr(f, _USES_SESSION, True)
    return f


def takes_session(cmd: click.Command) -> bool:
    """Whether ``cmd`` works on the session of ``-s``: marked with :func:`uses_session` (or
    :func:`pass_session`), or with a ``-s`` option of its own."""
    if getattr(cmd.callback, _USES_SESSION, False):
        return True
    return any("-s" in p.opts and not getattr(p, "hidden", False) for p in cmd.params)


def pass_session(must_exist: bool = True) -> Callable[[F], F]:
    """Decorator: call the command with ``session`` (see :func:`get_session`) as first argument."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return f(get_session(must_exist=must_exist), *args, **kwargs)

        return uses_session(wrapper)  # type: ignore[return-value]

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
        schema: the shape of the JSON document, shown in ``--help`` (and so in docs/cli.md).
    """
    decls, kw = _option_args(json_opt(f"Print one JSON document instead of text: {schema}"))
    return click.option(*decls, **kw)


def redact_option(f: F) -> F:
    """Decorator: add ``--redact`` (passed as ``redact``) to an import command; the command
    opens its store with :func:`import_store`."""
    return click.option(
        "--redact", is_flag=True,
        help="Replace secrets (cloud keys, GitHub and model-provider tokens, private keys, JWTs, passwords in "
             "URLs and assignments) with [REDACTED:KIND:HASH] before anything is stored: the archive never holds "
             "them, and exports are redacted. `castore redact --enable` does it for every write to the store.",
    )(f)


def import_store(ctx: click.Context, redact: bool) -> Store:
    """The store an import writes to (created when missing), redacting its writes with ``redact``.

    Raises:
        FormatError, ConfigContended, StorageError.
    """
    store = open_store(ctx, must_exist=False)
    if redact:
        store.redact_writes(True)
    return store


def forget_deleted(store: Store, index: bool = True) -> None:
    """Make the local caches beside ``store`` forget the sessions just deleted (``delete-session``,
    ``expire``, a gc's retention): the search index (unless ``index`` is False: ``maintenance.gc``
    did it) and the usage cache, where there are such, so that no copy of a deleted session's
    text, name or model stays in ``$XDG_CACHE_HOME`` until the next ``grep`` or ``usage``.

    Raises:
        IndexError_: the search index cannot be written.
        ObjectNotFound, IntegrityError: a session the usage cache holds cannot be read.
        StorageError.
    """
    from .. import usage
    from ..grep.index import update_if_present

    if index:
        update_if_present(store)
    usage.update_if_present(store)


def note_redacted(sessions: Iterable[Session]) -> None:
    """Say on stderr which of ``sessions`` were redacted before they were stored (their
    exports are the original files with each secret, if any, replaced by its tag)."""
    from ..redact import REDACTED_INFO

    keys = [format_key(*s.key) for s in sessions if s.exists() and s.info.get(REDACTED_INFO)]
    if keys:
        note(f"{plural(len(keys), 'session')} redacted when stored ({', '.join(keys[:3])}"
             f"{', ...' if len(keys) > 3 else ''}): the files are the originals with each secret replaced by "
             "[REDACTED:KIND:HASH]")


def note_redactions(results: Iterable[Any]) -> None:
    """Say on stderr what an import redacted before storing it: per session (each result's
    ``session`` or ``key``), the kinds and counts of the secrets replaced (``redacted``),
    never a secret, and how many in all; nothing when nothing was found."""
    total = sessions = 0
    for r in results:
        found: dict[str, int] = getattr(r, "redacted", {})
        if not found:
            continue
        key = getattr(r, "session", None) or r.key
        note(f"{safe(format_key(*key))}: redacted " + ", ".join(f"{n} {safe(kind)}" for kind, n in found.items()))
        total += sum(found.values())
        sessions += 1
    if total:
        note(f"{plural(total, 'secret')} redacted in {plural(sessions, 'session')} before they were stored")


def limit_option(default: int | None = None, what: str = "items") -> Callable[[F], F]:
    """Decorator: add ``-n/--limit N`` (passed as ``limit``): list at most N ``what``; 0 lists all.

    Every listing command takes it with this meaning (:func:`castore.cli.grep_spec.limit_opt`);
    the command applies ``limit or None``.
    """
    decls, kw = _option_args(limit_opt(what, default))
    return click.option(*decls, show_default=default is not None, **kw)


def all_entries_option(f: F) -> F:
    """Decorator: add ``--all-entries`` (passed as ``all_entries``): the bookkeeping lines of
    imported sessions too (``log``, ``diff``, ``export html``), which are left out otherwise
    (:func:`castore.views.bookkeeping`)."""
    return click.option(
        "--all-entries", is_flag=True,
        help="Also the bookkeeping lines of imported sessions (Claude Code's progress, file-history-snapshot, "
             "summary; Codex's session_meta, turn_context, token_count and the event_msg copies of its "
             "messages; Gemini CLI's metadata and $set lines), left out otherwise.",
    )(f)


def internal_option(what: str) -> Callable[[F], F]:
    """Decorator: add ``--internal`` (passed as ``internal``): also an adapter's bookkeeping
    ``what`` (a LangGraph thread's task writes), which are left out otherwise."""
    return click.option("--internal", is_flag=True,
                        help=f"Also an adapter's bookkeeping {what} (a LangGraph thread's task writes).")


def quiet_option(still: str = "", *, says: str | None = None) -> Callable[[F], F]:
    """Decorator: add ``-q/--quiet`` (passed as ``quiet``): no progress and no summary on
    stderr; ``still``: what is shown all the same; ``says``: the help of a command whose
    quiet is something else (``serve``: no request log)."""
    text = says or f"No progress and no summary{f' ({still} still shown)' if still else ''}."
    return click.option("-q", "--quiet", is_flag=True, help=text)


def dry_run_option(what: str, by: str = "") -> Callable[[F], F]:
    """Decorator: add ``--dry-run`` (passed as ``dry_run``): report what would be ``what``
    and write nothing; ``by``: the action of the command it applies to (``expire``)."""
    return click.option("--dry-run", is_flag=True,
                        help=f"Only report what would be {what}{f' by {by}' if by else ''}; write nothing.")


def duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """The click callback of an AGE option (``--grace``, ``--older-than``): ``2w``, ``3d``,
    ``12h``, ``30m``, ``45s`` or plain seconds, as seconds (None stays None).

    Raises:
        click.BadParameter: not an AGE (the message of
            :func:`castore.maintenance.parse_duration`).
    """
    if value is None:
        return None
    from ..maintenance import parse_duration

    try:
        return parse_duration(value)
    except CastoreError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None


def to_jsonable(value: Any) -> Any:
    """Stored values as JSON-compatible builtins (bytes become base64 strings)."""
    from .. import objects as o

    return o.to_builtins(value)


def print_json(doc: Any) -> None:
    """Print one JSON document on stdout (indented, UTF-8, stable key order as given; the
    controls a terminal would act on as JSON escapes, see :func:`~castore.cli.text.safe_json`)."""
    click.echo(safe_json(json.dumps(to_jsonable(doc), indent=2, ensure_ascii=False)))


def hint(args: str, ctx: click.Context | None = None, *, session: bool = True) -> str:
    """A command to suggest, in backquotes, written so that it runs as printed
    (``castore ARGS --store URL -s KEY``: the global options may follow the command).

    ``--store`` is added when it was typed, ``-s`` when the session came from a typed ``-s``
    (with ``$CASTORE_SESSION`` or ``castore use`` the suggestion works as is); storage
    options (``-o``) are never repeated (they may hold credentials). ``session=False``
    for a command that works on no one session.
    """
    import shlex

    ctx = ctx or click.get_current_context(silent=True)
    st = _state(ctx) if ctx is not None else None
    words = ["castore", args]
    if st is not None and st.store_given and st.store_url:
        words += ["--store", shlex.quote(st.store_url)]
    if session and st is not None and st.session_spec and st.session_from == "-s":
        words += ["-s", shlex.quote(st.session_spec)]
    return "`" + " ".join(words) + "`"


def note(message: str) -> None:
    """A message for the person at the terminal: stderr, never stdout."""
    click.echo(message, err=True)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``0 objects``: a count with its noun agreeing."""
    if n == 1:
        return f"1 {word}"
    if words is None:
        words = word[:-1] + "ies" if word.endswith("y") and word[-2:-1] not in "aeiou" else word + "s"
    return f"{n} {words}"


# -- terminal: colors and the pager -----------------------------------------------------
def pager_command() -> list[str] | None:
    """The pager to run (``$CASTORE_PAGER``, ``$PAGER``, else ``less``), or None for none."""
    import shlex  # imported here: only a pager needs it (as subprocess, ~6 ms of every command's start)

    for var in (PAGER_ENV, "PAGER"):
        if var in os.environ:
            cmd = os.environ[var].strip()
            return None if cmd in ("", "cat") else shlex.split(cmd)
    return ["less"]


def _should_page(ctx: click.Context) -> bool:
    return _state(ctx).pager and sys.stdout.isatty() and sys.stdin.isatty()


def _run_pager(cmd: list[str], text: str) -> None:
    import shlex
    import subprocess

    env = dict(os.environ)
    env.setdefault("LESS", "FRX")  # as git: quit if one screen, keep colors, leave the text on screen
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env)
    except OSError as e:  # the pager named does not exist: print as if there were none
        note(f"castore: cannot run pager {shlex.join(cmd)!r} ({e.strerror or e}); printing instead")
        sys.stdout.write(text)
        return
    assert proc.stdin is not None
    try:
        proc.stdin.write(text.encode("utf-8", "replace"))
        proc.stdin.close()
    except BrokenPipeError:  # the reader quit early (q in less)
        pass
    proc.wait()


def paged(f: F) -> F:
    """Decorator: send what the command prints to stdout through a pager, on a terminal only.

    Off with ``--no-pager``, ``CASTORE_PAGER=cat`` (or ``PAGER=cat``), and whenever stdout
    or stdin is not a terminal (pipes and scripts see plain output). Colors are kept for
    the pager unless ``NO_COLOR`` is set.
    """

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        cmd = pager_command()
        if cmd is None or not _should_page(ctx):
            return f(*args, **kwargs)
        buf, real = io.StringIO(), sys.stdout
        root = ctx.find_root()
        old_color = root.color
        if root.color is None:
            root.color = True  # the pager shows colors (less -R)
        sys.stdout = buf
        try:
            result = f(*args, **kwargs)
        except BaseException:
            sys.stdout = real
            root.color = old_color
            real.write(buf.getvalue())
            raise
        sys.stdout = real
        root.color = old_color
        text = buf.getvalue()
        if text:
            real.flush()
            _run_pager(cmd, text)
        return result

    return wrapper  # type: ignore[return-value]


__all__ = [
    "parse_options",
    "click_option",
    "CliState",
    "CastoreGroup",
    "cli_errors",
    "error_line",
    "store_url",
    "key_options",
    "open_store",
    "get_session",
    "find_session",
    "pass_session",
    "uses_session",
    "takes_session",
    "limit_option",
    "all_entries_option",
    "internal_option",
    "quiet_option",
    "dry_run_option",
    "duration",
    "pass_store",
    "split_key",
    "format_key",
    "escape",
    "unescape",
    "ensure_bucket",
    "json_option",
    "print_json",
    "forget_deleted",
    "to_jsonable",
    "note",
    "hint",
    "plural",
    "paged",
    "no_color",
    "pager_command",
    "store_options",
    "default_session",
    "session_source",
    "os_error_line",
    "SESSION_CONFIG_KEY",
    "PAGER_ENV",
    "STORE_ENV",
    "SESSION_ENV",
    "skip_teardown",
    "teardown_skipped",
]
