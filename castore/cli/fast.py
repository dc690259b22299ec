"""``castore grep`` in a fresh process without click: the fast path of the console script.

A fresh ``castore grep -c WORD`` paid more for importing click (and what click loads: inspect,
uuid and platform, gettext and locale, difflib) than for its search: 122 M of a rare word's 265 M
instructions (issue 38 asks for a fresh search within 2x of GNU grep's). So :func:`castore.__main__.main`
first hands the command line to :func:`grep_main`, which parses ``castore [GLOBAL OPTIONS] grep
[OPTIONS] PATTERN [OPTIONS]`` from the same tables click's commands are built from
(:mod:`.grep_spec`), the way click's parser reads them (long options with ``=VALUE`` or the next
argument, short ones combined with ``-ic`` and valued with ``-C3``, ``--`` ending the options,
options after the pattern, the last of a repeated option, every value of a repeatable one,
``$CASTORE_STORE``, the global options after ``grep`` as well), and
runs the search (:func:`castore.cli.grep_search.run`, the one the click command runs).

It does so only when it understands every argument and every value. Anything else returns None
before anything is printed, and click runs the command as it always has, with its output and
exit status: ``--help``, ``--version``, an unknown or malformed option, a missing or extra
argument, a bad value (``--kind nope``, ``-C -1``, ``-o novalue``), ``-s`` before ``grep`` (which
works on no one session), shell completion (``_CASTORE_COMPLETE``), another command, an output
stream click would re-encode (ASCII), Windows. click stays the authority on the command line; a
test runs a corpus of command lines both ways and compares the parameters, output, errors and
status.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import TYPE_CHECKING, Any

from .grep_spec import GLOBAL_OPTIONS, GREP_ARGUMENT, GREP_OPTIONS, STORE_ENV, Opt, late_globals

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..store import Store

#: the variable that asks click for shell completions (``_{PROG}_COMPLETE``)
COMPLETE_ENV = "_CASTORE_COMPLETE"


class _Refused(Exception):
    """A command line the fast path leaves to click."""


def _table(opts: tuple[Opt, ...] | list[Opt]) -> tuple[dict[str, Opt], dict[str, Opt]]:
    """The long spellings (``--store``) and the short ones (``-o``) of ``opts``, as click splits them."""
    long: dict[str, Opt] = {}
    short: dict[str, Opt] = {}
    for o in opts:
        for d in o.decls:
            (short if len(d) == 2 and d[1] != "-" else long)[d] = o
    return long, short


def _parse(args: list[str], opts: tuple[Opt, ...] | list[Opt],
           interspersed: bool) -> tuple[dict[str, list[tuple[Opt, Any]]], list[str]]:
    """What click's option parser makes of ``args`` for ``opts``: each parameter name with the
    (option, raw value) pairs given for it, in order, and the other arguments (up to the first of
    them, when not ``interspersed``: a group stops there, at its command).

    Raises:
        _Refused: an unknown option, a value given to a flag, a value missing.
    """
    long, short = _table(opts)
    got: dict[str, list[tuple[Opt, Any]]] = {}
    rest: list[str] = []
    rargs = list(args)

    def value_of(o: Opt) -> Any:
        if not o.takes_value:
            return o.flag
        if not rargs:
            raise _Refused  # "requires an argument"
        return rargs.pop(0)

    while rargs:
        arg = rargs.pop(0)
        if arg == "--":
            break
        if arg[:1] != "-" or len(arg) == 1:
            if not interspersed:
                rargs.insert(0, arg)
                break
            rest.append(arg)
            continue
        name, eq, explicit = arg.partition("=")
        o = long.get(name)
        if o is not None:
            if eq:
                if not o.takes_value:
                    raise _Refused  # "does not take a value"
                rargs.insert(0, explicit)
            got.setdefault(o.name, []).append((o, value_of(o)))
            continue
        if arg[:2] == "--":
            raise _Refused  # no such option
        for i in range(1, len(arg)):  # -ic, -C3, -n5
            o = short.get("-" + arg[i])
            if o is None:
                raise _Refused
            if o.takes_value and i + 1 < len(arg):
                rargs.insert(0, arg[i + 1:])
                got.setdefault(o.name, []).append((o, value_of(o)))
                break
            got.setdefault(o.name, []).append((o, value_of(o)))
    return got, rest + rargs


def _value(o: Opt, raw: Any) -> Any:
    """``raw`` converted as click's type for ``o`` converts it.

    Raises:
        _Refused: not one of the choices, not an integer, below the minimum.
    """
    if not o.takes_value:
        return raw
    if o.choices is not None:
        if raw not in o.choices:
            raise _Refused
        return raw
    if o.min is not None:
        try:
            n = int(raw)
        except ValueError:
            raise _Refused from None
        if n < o.min:
            raise _Refused
        return n
    return raw


def _params(got: dict[str, list[tuple[Opt, Any]]], opts: tuple[Opt, ...] | list[Opt]) -> dict[str, Any]:
    """Every parameter of ``opts`` with its value: the last given (every one, for a repeatable
    option), else what it is when absent.

    Raises:
        _Refused: a value :func:`_value` refuses.
    """
    out: dict[str, Any] = {}
    for o in opts:
        if o.name in out:
            continue  # two options setting one parameter (-i, --case-sensitive): the last given
        given = got.get(o.name)
        if not given:
            out[o.name] = o.absent()
        elif o.multiple:
            out[o.name] = tuple(_value(g, v) for g, v in given)
        else:
            out[o.name] = _value(*given[-1])
    return out


class GrepCall:
    """A ``castore grep`` command line as the fast path read it: the command's parameters
    (:func:`castore.cli.grep_search.run`'s) and the store to open."""

    __slots__ = ("params", "store_url", "store_options", "master_key_file")

    def __init__(self, params: dict[str, Any], store_url: str | None, store_options: dict[str, Any],
                 master_key_file: str | None) -> None:
        self.params, self.store_url = params, store_url
        self.store_options, self.master_key_file = store_options, master_key_file

    def __repr__(self) -> str:
        return (f"GrepCall({self.params!r}, store_url={self.store_url!r}, store_options={self.store_options!r}, "
                f"master_key_file={self.master_key_file!r})")


#: the global options ``grep`` accepts after its name: every one but -s/--session, since grep
#: works on no one session (click's command is not marked as one; a test holds the two alike)
_GREP_LATE = late_globals({d for o in GREP_OPTIONS for d in o.decls}, session=False)


def parse(argv: list[str], environ: Mapping[str, str] | None = None) -> GrepCall | None:
    """``castore ARGV`` as a search the fast path runs, or None to leave it to click (see the module).

    ``environ``: the environment (default ``os.environ``). Raises nothing.
    """
    from .plain import OptionValueError, storage_options

    env = os.environ if environ is None else environ
    if COMPLETE_ENV in env:
        return None
    try:
        top, rest = _parse(argv, GLOBAL_OPTIONS, interspersed=False)
        if not rest or rest[0] != "grep" or "session_spec" in top:
            return None  # another command (or none); -s before grep is click's usage error
        got, args = _parse(rest[1:], [*GREP_OPTIONS, *_GREP_LATE], interspersed=True)
        if len(args) != 1:
            return None  # the pattern missing, or extra arguments
        g = _params(top, GLOBAL_OPTIONS)
        late = _params(got, _GREP_LATE)
        params = {GREP_ARGUMENT: args[0], **_params(got, GREP_OPTIONS)}
    except _Refused:
        return None
    # as click's group (a variable set but empty counts as not set), then the options after grep
    url = g["store_url"] if "store_url" in top else (env.get(STORE_ENV) or None)
    key = g["master_key_file"] if "master_key_file" in top else None
    try:
        options = storage_options(g["store_options"])
        if "store_options" in got:
            options = {**options, **storage_options(late["store_options"])}
    except OptionValueError:
        return None
    if "store_url" in got:
        url = late["store_url"]
    if "master_key_file" in got:
        key = late["master_key_file"]
    return GrepCall(params, url, options, key)


def _plain_text(stream: Any) -> bool:
    """Whether click would write to ``stream`` as it is (it re-encodes one that claims ASCII)."""
    import codecs

    enc = getattr(stream, "encoding", None)
    if stream is None or not enc or getattr(stream, "errors", None) is None:
        return False
    try:
        return codecs.lookup(enc).name != "ascii"
    except LookupError:
        return True


class _Pacified:
    """A stream whose flush ignores a closed pipe (click's wrapper after a broken pipe, so that
    the interpreter's last flush reports nothing)."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except OSError as e:
            if e.errno != errno.EPIPE:
                raise

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.wrapped, attr)


def grep_main(argv: list[str], environ: Mapping[str, str] | None = None) -> int | None:
    """Run ``castore ARGV`` here when it is a search the fast path reads (:func:`parse`) and
    return its exit status, with what it printed and the errors it reported as click's command
    prints and reports them; None, having printed nothing, to leave the command line to click.

    Raises:
        Whatever the search raises that the ``castore`` group would not report either (a bug).
    """
    if sys.platform == "win32" or not (_plain_text(sys.stdout) and _plain_text(sys.stderr)):
        return None
    call = parse(argv, environ)
    if call is None:
        return None
    from .grep_search import echo, run
    from .plain import open_store_at, os_error_line

    opened: list[Store] = []

    def open_store() -> Store:
        if not opened:
            opened.append(open_store_at(call.store_url, call.store_options, call.master_key_file))
        opened[0].require()
        return opened[0]

    try:
        try:
            return run(call.params, open_store, echo)
        finally:
            for store in opened:
                store.close()
    # as the castore group and click's main report what escapes a command
    except (EOFError, KeyboardInterrupt):
        echo("", err=True)
        echo("Aborted!", err=True)
        return 1
    except OSError as e:
        if isinstance(e, BrokenPipeError) or e.errno == errno.EPIPE:
            sys.stdout = _Pacified(sys.stdout)
            sys.stderr = _Pacified(sys.stderr)
            return 1
        echo(f"Error: {os_error_line(e)}", err=True)
        return 1


__all__ = ["COMPLETE_ENV", "GrepCall", "parse", "grep_main"]
