"""The options of ``castore`` (the global ones) and of ``castore grep``, as plain data: declared once.

Two parsers read these tables. click builds from them the group's global options (and their
hidden copies that may follow a command), and the ``grep`` command's argument and options, with
the help, types, defaults and completion ``castore --help``, ``castore grep --help`` and
docs/cli.md show (:mod:`castore.cli.main`, :mod:`castore.cli.grep_cmds`). :mod:`castore.cli.fast`
parses ``castore [GLOBAL OPTIONS] grep ...`` from them without importing click, for a fresh
process's search (click and what it loads cost more than a rare word's search). An option added
here reaches both; nothing else lists them.

This module imports nothing (a fresh ``castore grep`` reads it before anything else).
"""

from __future__ import annotations

from typing import Any

#: the environment variables behind ``--store``, ``--session`` and ``--master-key-file``
STORE_ENV = "CASTORE_STORE"
SESSION_ENV = "CASTORE_SESSION"

#: an attribute not given (click's own default applies)
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()


class Opt:
    """One option: its spellings, the parameter it sets and what it takes.

    ``flag``: the option takes no value and sets the parameter to this (``True`` with no
    ``default``: a plain on/off flag, ``False`` when absent); else it takes a value: a string,
    one of ``choices``, or an integer of at least ``min``; ``multiple`` collects every value
    given, in order, as a tuple (``()`` when none). ``envvar``: the variable read when the option
    is not given (an empty value counts as not set). ``complete``: the name of a shell completion
    (``"session"``) for click.
    """

    __slots__ = ("decls", "name", "help", "metavar", "flag", "default", "multiple", "choices", "min", "envvar",
                 "complete")

    def __init__(self, decls: tuple[str, ...], name: str, help: str, *,  # noqa: A002 (click's names)
                 metavar: str | None = None, flag: Any = UNSET, default: Any = UNSET, multiple: bool = False,
                 choices: tuple[str, ...] | None = None, min: int | None = None,  # noqa: A002
                 envvar: str | None = None, complete: str | None = None) -> None:
        self.decls, self.name, self.help, self.metavar = decls, name, help, metavar
        self.flag, self.default, self.multiple, self.choices, self.min = flag, default, multiple, choices, min
        self.envvar, self.complete = envvar, complete

    @property
    def takes_value(self) -> bool:
        """Whether the option is followed by a value (``--since TIME``), rather than a flag."""
        return self.flag is UNSET

    def absent(self) -> Any:
        """The parameter's value when the option is not given (and its variable not set), as click gives it."""
        if self.multiple:
            return ()
        if self.default is not UNSET:
            return self.default
        return False if self.flag is True else None

    def __repr__(self) -> str:
        return f"Opt({'/'.join(self.decls)} -> {self.name})"


#: the global options of the ``castore`` group, in the order ``castore --help`` lists them
#: (``--version`` and ``-h/--help`` are click's own)
GLOBAL_OPTIONS: tuple[Opt, ...] = (
    Opt(("--store",), "store_url", envvar=STORE_ENV, metavar="URL",
        help=f"The store: a path, memory://NAME or s3://BUCKET/PREFIX [env {STORE_ENV}; default: the nearest "
             ".castore here or above, else ./.castore]."),
    Opt(("-o", "--store-option"), "store_options", multiple=True, metavar="KEY=VALUE",
        help="A storage option for --store, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable; as "
             "`remote add -o`)."),
    Opt(("-s", "--session"), "session_spec", envvar=SESSION_ENV, metavar="APP/USER/SESSION", complete="session",
        help=f"The session to work on: APP/USER/SESSION, or its session id alone, whole or a unique prefix "
             f"(0ccf1a04); write a '/' inside a name as %2F [env {SESSION_ENV}; default: the one chosen with "
             "`castore use`]."),
    # no envvar: the store reads $CASTORE_MASTER_KEY_FILE itself, only if it is encrypted
    Opt(("--master-key-file",), "master_key_file", metavar="PATH",
        help="The master key of an encrypted store, in a file as `castore key new` printed it [default: "
             "the file $CASTORE_MASTER_KEY_FILE names, else the key in $CASTORE_MASTER_KEY, read only by "
             "an encrypted store]."),
    Opt(("--no-pager",), "no_pager", flag=True, help="Never page long output (it is paged only on a terminal)."),
)


def late_global(opt: Opt, decls: tuple[str, ...] | None = None) -> Opt:
    """The hidden copy of global option ``opt`` that a command accepts after its name
    (``castore grep WORD --store URL``), spelt ``decls`` (default: as ``opt``; a command leaves
    out the spellings it uses itself): no variable (the group's option read it), help naming
    the global option."""
    return Opt(opt.decls if decls is None else decls, opt.name, f"As `castore {opt.decls[-1]}` (global option).",
               metavar=opt.metavar, flag=opt.flag, multiple=opt.multiple, complete=opt.complete)


def late_globals(taken: set[str], session: bool) -> list[Opt]:
    """The global options a command accepts after its name, as :func:`late_global` copies: those of
    :data:`GLOBAL_OPTIONS` less the spellings in ``taken`` (the command's own), ``-s/--session``
    only for a command that works on a session (``session``; elsewhere it is an error), and no
    ``-o`` at all when the command has its own (``clone``, ``remote add``: it means their own thing)."""
    if not session:
        taken = taken | {"-s", "--session"}
    out = []
    for spec in GLOBAL_OPTIONS:
        free = tuple(d for d in spec.decls if d not in taken)
        if free and not (spec.name == "store_options" and "-o" in taken):
            out.append(late_global(spec, free))
    return out


def limit_opt(what: str, default: int | None = None) -> Opt:
    """``-n/--limit N`` of a listing command: show at most N ``what``; 0 shows all (every listing
    command takes it with this meaning, :func:`castore.cli.common.limit_option`)."""
    return Opt(("-n", "--limit"), "limit", f"Show at most N {what}; 0 shows all.", min=0, metavar="N",
               default=default)


def json_opt(help: str) -> Opt:  # noqa: A002 (click's name)
    """``--json`` (the parameter ``as_json``), its ``help`` saying what it prints."""
    return Opt(("--json",), "as_json", help, flag=True)


#: ``castore grep``'s one argument
GREP_ARGUMENT = "pattern"

_GREP_JSON = ("one document {\"matches\": [MATCH, ...]}; MATCH is {\"commit\": ID, \"session\": "
              "\"APP/USER/SESSION\", \"branches\": [NAME, ...], \"also\": [{\"session\": ..., \"branches\": [...]}], "
              "\"role\": ROLE, \"kind\": \"text|thinking|tool_call|tool_result\", \"tool\": NAME|null, "
              "\"time\": ISO|null, \"lines\": [{\"line\": N, \"text\": LINE, \"spans\": [[START, END], ...]}], "
              "\"context\": {\"before\": [...], \"after\": [...]} (with -C)}")

#: ``castore grep``'s options, in the order ``castore grep --help`` lists them
GREP_OPTIONS: tuple[Opt, ...] = (
    Opt(("-i", "--ignore-case"), "ignore_case", flag=True, default=None,
        help="Ignore case (default: smart case, i.e. ignore case unless PATTERN has an upper-case letter)."),
    Opt(("--case-sensitive",), "ignore_case", flag=False, help="Match case even for a lower-case PATTERN."),
    Opt(("-F", "--fixed-strings"), "fixed", flag=True, help="PATTERN is a plain string, not a regex."),
    Opt(("-E", "--extended-regexp"), "extended", flag=True,
        help="PATTERN is an extended regex: already so (Python's syntax, close to grep -E's; -F wins)."),
    Opt(("-w", "--word-regexp"), "word", flag=True, help="Match whole words only."),
    Opt(("--role",), "roles", multiple=True, metavar="ROLE",
        help="Only messages of this role (user, assistant, system, tool; repeatable)."),
    Opt(("--kind",), "kinds", multiple=True, choices=("text", "thinking", "tool_call", "tool_result"),
        help="Only this kind of block (repeatable; default: text, thinking, tool_call)."),
    Opt(("-a", "--all", "--all-kinds"), "all_kinds", flag=True, help="Every kind of block, tool results included."),
    Opt(("--tool",), "tools", multiple=True, metavar="GLOB",
        help="Only calls and results of tools whose name matches (e.g. Bash, 'mcp__*'; repeatable)."),
    Opt(("--sessions",), "sessions", multiple=True, metavar="GLOB",
        help="Only sessions matching APP/USER/SESSION, or SESSION when the glob has no '/' (repeatable)."),
    Opt(("--app",), "apps", multiple=True, metavar="GLOB", help="Only sessions of these apps (repeatable)."),
    Opt(("--typed",), "typed", flag=True,
        help="Only what a human typed or the agent wrote: user text and assistant blocks, leaving out tool "
             "results, system/developer messages and what the agent's CLI injected (environment context, "
             "AGENTS.md, command wrappers, system reminders; flagged by the importers)."),
    Opt(("--since",), "since", metavar="TIME", help="Only entries at or after TIME (ISO 8601, UTC unless given)."),
    Opt(("--until",), "until", metavar="TIME", help="Only entries before TIME."),
    Opt(("-l", "--files-with-matches"), "list_sessions", flag=True,
        help="Print only the sessions that hold a match (its copies too: a fork, a file imported twice)."),
    Opt(("-c", "--count"), "count", flag=True,
        help="Print per session the number of matches it holds: a match several sessions share (reported "
             "once, the others under also) counts in each, as a search of that session alone counts it."),
    Opt(("-q", "--quiet"), "quiet", flag=True,
        help="Print nothing: exit 0 at the first match (even after an error), else 1 (2 on an error)."),
    Opt(("--no-messages",), "no_messages", flag=True,
        help="No message about what cannot be read (a damaged session, a missing or unreadable store); "
             "the exit status still says so (2)."),
    Opt(("--color", "--colour"), "color", choices=("auto", "always", "never"), default="auto", metavar="WHEN",
        help="Colour the matched text: auto (on a terminal, unless $NO_COLOR is set), always, never."),
    Opt(("-C", "--context"), "context", min=0, default=0, metavar="N",
        help="Show N entries before and after each match, on its branch."),
    limit_opt("matches (then stop)"),
    Opt(("--no-index",), "no_index", flag=True,
        help="Read every stored object once (pack by pack) instead of the local search index "
             "(~/.cache/castore/grep, $CASTORE_GREP_INDEX; derived data, brought up to date before each "
             "search)."),
    Opt(("--cached",), "cached", flag=True,
        help="Trust the index as the last import or search left it (skips the freshness check: one look at "
             "the swap log on local disk, every session's refs elsewhere; changes made since are missed)."),
    json_opt(f"Print {_GREP_JSON}."),
    Opt(("--jsonl",), "as_jsonl", flag=True, help="Print one MATCH document (as in --json) per line, streaming."),
)

__all__ = ["STORE_ENV", "SESSION_ENV", "UNSET", "Opt", "GLOBAL_OPTIONS", "late_global",
           "late_globals", "limit_opt", "json_opt", "GREP_ARGUMENT", "GREP_OPTIONS"]
