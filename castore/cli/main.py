"""The ``castore`` command group: global options, and where every command comes from.

Commands live in modules, each exposing ``register(group)`` which adds its commands with
``group.add_command(...)``. The modules in :data:`COMMAND_MODULES` ship with the CLI; the
ones in :data:`OPTIONAL_COMMAND_MODULES` are plugged in when they exist, so a module for a
new area (sync, maintenance, import/export, html) only has to be created::

    # castore/cli/sync_cmds.py
    import click
    from castore.cli.common import json_option, open_store, pass_session, print_json, note

    @click.command("push")
    ...
    def push(...):
        \"\"\"Push a session to a remote store.\"\"\"

    def register(group: click.Group) -> None:
        group.add_command(push)

Rules for command modules (see :mod:`castore.cli.common` for the helpers):

* parse, call one library function, render; never print from the library;
* data on stdout, messages on stderr (``note``); ``--json`` through ``json_option``;
* let :class:`~castore.errors.CastoreError` propagate: the group prints ``Error: ...``
  and exits 1 (also inside nested groups); raise :class:`click.UsageError` for usage
  mistakes (exit 2);
* every command (and option) has help text: the CLI reference, docs/cli.md, is generated from it
  by ``scripts/gen_cli_reference`` and a test fails when it is missing or out of date.

Each module is listed with the names of the commands its ``register`` adds (the table below
is the only place that says which module a command comes from; a test checks it against what
the modules register). A module is imported only when one of its commands is run or its
help is shown, so ``castore log`` does not pay for importing ``serve`` or ``grep``; a command
name that several modules extend (``import``, ``export``) loads all of them, in the order
listed. ``castore --help`` and the shell's completion of a command name list every command
with its summary from :data:`SUMMARIES`, importing none of them (a test checks that table
against the commands too). This module and :mod:`.common` load no store either: ``castore
--version`` costs the interpreter, click and the errors; the store, its object format and the
library load with the first command that opens a store.

A module listed here that does not exist is skipped; one that exists but fails to import
is an error (a broken command module must not go unnoticed).

The global options (and their hidden copies that may follow a command, as git's do) are not
written here: they are data in :mod:`.grep_spec`, from which this module builds them with
:func:`~castore.cli.common.click_option`, as :mod:`.grep_cmds` builds ``grep``'s options. The
reason is the fast path of ``castore grep``: importing click (with inspect, uuid, gettext,
difflib and the rest it loads) cost a fresh ``castore grep -c WORD`` more than its search, and
issue 38 asks for a fresh search within 2x of GNU grep's. So the console script
(:func:`castore.__main__.main`) first hands the command line to :mod:`.fast`, which reads
``castore [GLOBAL OPTIONS] grep [OPTIONS] PATTERN`` from those same tables, without click, and
runs :func:`castore.cli.grep_search.run`, the body click's ``grep`` runs too. It takes a command
line only when it understands all of it; ``--help``, ``--version``, completion, an unknown or
malformed option, a bad value, a missing argument and every other command come here, and click
answers them as always: click stays the authority on the command line, the fast path a copy of
one of its answers that a test holds equal (tests/test_cli_fast.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import click

from .. import __version__
from .common import (
    CastoreGroup,
    CliState,
    check_session_taken,
    click_option,
    no_color,
    parse_options,
    takes_session,
)
from .complete import complete_session
from .grep_spec import GLOBAL_OPTIONS, SESSION_ENV, Opt, late_globals
from .plain import end_process

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

#: command modules that ship with the CLI, each with the commands its ``register`` adds
COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "castore.cli.session_cmds": ("init", "append", "checkout", "branch", "label", "labels", "fork", "reset",
                                 "reflog"),
    "castore.cli.inspect_cmds": ("sessions", "log", "show", "state", "diff", "context", "replay", "verify",
                                 "cat-object"),
    "castore.cli.status_cmds": ("use", "status", "compact", "delete-session"),
    "castore.cli.demo": ("demo",),
}

#: command modules added by other areas, with the commands each adds; each is used if it
#: exists and must expose ``register(group)``
OPTIONAL_COMMAND_MODULES: dict[str, tuple[str, ...]] = {
    "castore.cli.sync_cmds": ("remote", "push", "pull", "sync", "clone"),
    "castore.cli.maintenance_cmds": ("fsck", "gc", "repack", "expire"),
    "castore.cli.io_cmds": ("import", "export"),
    "castore.cli.html_cmds": ("export", "serve"),
    "castore.cli.archive_cmds": ("import", "export"),
    "castore.cli.grep_cmds": ("grep",),
    "castore.cli.key_cmds": ("key", "encrypt", "erase", "erasures"),
    "castore.cli.usage_cmds": ("usage",),
    "castore.cli.redact_cmds": ("redact",),
}

#: each command's summary, as click makes it from the command's help (its first sentence, not
#: shortened): `castore --help` and the completion of a command name show these without
#: importing a command module (a test checks the table against the commands themselves)
SUMMARIES: dict[str, str] = {
    "append": "Append a message (--role ROLE TEXT) or an event (--event JSON).",
    "branch": "List, create (NAME [REV]), move (-f NAME REV) or delete (-d/-D NAME) branches.",
    "cat-object": "Print a stored object by id or unique prefix (4+ hex characters).",
    "checkout": "Move HEAD (the leaf) to a branch, or detach it at a commit (REV).",
    "clone": "Copy the store at URL (all of it, or APP[/USER[/SESSION]]) into folder DEST, as git clone does.",
    "compact": "Append a compaction: SUMMARY replaces the entries before --keep-from in the context.",
    "context": "Print the messages a model would be sent for the path ending at REV.",
    "delete-session": "Delete session APP/USER/SESSION: its branches, labels and HEAD.",
    "demo": "Record a scripted weather-agent session, then show its tree and state.",
    "diff": "State changes from REV1 to REV2 (default HEAD), and the entries since they forked.",
    "encrypt": "Write an encrypted copy of the --store store at DEST_URL (a new, empty store).",
    "erase": "Destroy the data keys of APP/USER (or of APP and all its users), for good.",
    "erasures": "List the erasures recorded in the store's key store, oldest first.",
    "expire": "Delete the sessions no branch, label or HEAD of which moved for AGE (retention).",
    "export": ("Export sessions: to Pi JSONL, Claude Code, Codex CLI or Gemini CLI files, or to "
               "a self-contained HTML view."),
    "fork": "Start session NEW_SESSION from this one's history up to REV (O(1)).",
    "fsck": "Check the whole store: every object re-hashed, every ref and link followed.",
    "gc": "Delete objects no ref reaches that are older than the grace period.",
    "grep": "Search every session and branch of the store for PATTERN (a Python regex).",
    "import": "Import sessions from other agents' files (Claude Code, Codex CLI, Pi, Gemini CLI).",
    "init": "Create a store at URL (default: the --store option).",
    "key": "Master keys of encrypted stores: make one, rotate a store to a new one.",
    "label": "Put label NAME on REV (default HEAD), as `git tag NAME [REV]`; -d deletes it.",
    "labels": "List the session's labels and the commits they name.",
    "log": "Show history, newest first; --all: every branch, --graph: the tree.",
    "pull": "Bring sessions from REMOTE (a remote's name or a URL; default origin).",
    "push": "Send sessions to REMOTE (a remote's name or a URL; default origin).",
    "redact": ("Redact secrets in sessions already stored (a session, default the current one, "
               "or --all), and in the app and user state they see."),
    "reflog": "List the moves that overwrote a ref's tip (branch -f, reset, forced pull/push), newest first.",
    "remote": "Manage the remotes (other stores to push to and pull from) of this store.",
    "repack": "Merge small packs and small loose objects into one pack (storage format 2).",
    "replay": "Rebuild the state at REV from the entries' deltas alone, and print it.",
    "reset": "Move the current branch (or a detached HEAD) to REV, as `git reset --soft`.",
    "serve": "Browse a store's sessions in a web browser (read-only, local).",
    "sessions": "List sessions, newest first: entries on the path to HEAD, branch, last activity, title.",
    "show": "Show one commit: its entry, metadata, state delta and parents.",
    "state": "Print the state at REV (default HEAD) as JSON, or the value of KEY.",
    "status": "Show the store, the session, HEAD, its branch, the entries and the remotes' state.",
    "sync": "Pull then push every session: this store and REMOTE end up holding the same history.",
    "usage": "Tokens (input, output, cache read, cache write) and cost of every model response stored.",
    "use": "Make APP/USER/SESSION this store's default session (no -s needed after it).",
    "verify": "Audit REV's path: re-hash objects, replay deltas against snapshots.",
}


#: words git and llm users type for what castore spells otherwise: an unknown command named here
#: says the command to type
HABITS: dict[str, str] = {
    "view": "the HTML view is `castore export html -o FILE` (one file) or `castore serve`",
    "tag": "a label is `castore label NAME [REV]`, as git tag; `castore labels` lists them",
    "logs": "history is `castore log`",
    "ls": "`castore sessions` lists the sessions",
    "list": "`castore sessions` lists the sessions",
    "rm": "`castore delete-session APP/USER/SESSION` deletes a session",
    "search": "`castore grep PATTERN` searches every session",
}


def command_modules() -> dict[str, tuple[str, ...]]:
    """Every command name of the ``castore`` group with the modules that add to it, in load order."""
    out: dict[str, tuple[str, ...]] = {}
    for module, names in (*COMMAND_MODULES.items(), *OPTIONAL_COMMAND_MODULES.items()):
        for name in names:
            out[name] = (*out.get(name, ()), module)
    return out


def _module_exists(module: str) -> bool:
    if module in COMMAND_MODULES:
        return True  # a required module that is missing fails loudly when imported
    import importlib.util  # here: only listing the commands asks (a command runs without it)

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _import_command_module(module: str) -> Any:
    """The module, or None for an optional one that does not exist; other import errors propagate."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module and module not in COMMAND_MODULES:  # not written (yet): nothing to plug in
            return None
        raise


def load_command(name: str) -> click.Command | None:
    """Import the modules that add command ``name`` and return it (None: no such module exists).

    The modules register into a fresh group, in the order listed, so the command comes out
    the same whichever command was loaded before it.

    Raises:
        ImportError: a listed module exists but fails to import.
        LookupError: the modules listed for ``name`` do not register it (the table is wrong).
    """
    modules = command_modules().get(name, ())
    scratch = click.Group()
    loaded = []
    for module in modules:
        mod = _import_command_module(module)
        if mod is not None:
            mod.register(scratch)
            loaded.append(module)
    if not loaded:
        return None
    cmd = scratch.commands.get(name)
    if cmd is None:
        raise LookupError(f"{', '.join(loaded)} register no command {name!r}: fix the table in {__name__}")
    _add_late_globals(cmd)
    return cmd


class LazyGroup(CastoreGroup):
    """The ``castore`` group: it knows its command names and imports a command's modules on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, sorted: those added directly and those of the modules that exist."""
        lazy = {name for name, modules in command_modules().items() if any(map(_module_exists, modules))}
        return sorted(set(self.commands) | lazy)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, importing its modules the first time (None: no such command).

        Raises:
            ImportError, LookupError: as :func:`load_command`.
        """
        if cmd_name not in self.commands:
            cmd = load_command(cmd_name)
            if cmd is not None:
                self.add_command(cmd, cmd_name)
        return self.commands.get(cmd_name)

    def _listed(self, ctx: click.Context, name: str) -> click.Command | None:
        """What a listing shows for ``name``: the command once loaded, else a stand-in made from
        :data:`SUMMARIES` (a name the table lacks is loaded)."""
        if name in self.commands or name not in SUMMARIES:
            return self.get_command(ctx, name)
        return click.Command(name, help=SUMMARIES[name])

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The "Commands" section of ``--help``, as click writes it, from :data:`SUMMARIES`
        (no command module is imported to list the commands)."""
        commands = [(name, cmd) for name in self.list_commands(ctx)
                    if (cmd := self._listed(ctx, name)) is not None and not cmd.hidden]
        if commands:
            limit = formatter.width - 6 - max(len(name) for name, _ in commands)
            with formatter.section("Commands"):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in commands])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """Completions of a command name (with its summary, from :data:`SUMMARIES`) or an option."""
        from click.shell_completion import CompletionItem

        out = [CompletionItem(name, help=cmd.get_short_help_str()) for name in self.list_commands(ctx)
               if name.startswith(incomplete) and (cmd := self._listed(ctx, name)) is not None and not cmd.hidden]
        return out + click.Command.shell_complete(self, ctx, incomplete)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        """As click's, but an unknown name is matched against every command, loaded or not ("Did you mean"),
        and a word of git's or llm's that castore spells otherwise names its command (:data:`HABITS`)."""
        try:
            return super().resolve_command(ctx, args)
        except click.exceptions.NoSuchCommand as e:
            if e.command_name in HABITS:
                raise click.exceptions.NoSuchCommand(e.command_name, ctx=ctx, message=(
                    f"No such command {e.command_name!r}: {HABITS[e.command_name]}.")) from None
            raise click.exceptions.NoSuchCommand(e.command_name, possibilities=self.list_commands(ctx),
                                                 ctx=ctx) from None


def _global_option(spec: Opt, **extra: Any) -> click.Option:
    """The click option of global option ``spec`` (:data:`~castore.cli.grep_spec.GLOBAL_OPTIONS`)."""
    if spec.complete == "session":
        extra["shell_complete"] = complete_session
    return click_option(spec, **extra)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 88},
             params=[_global_option(spec) for spec in GLOBAL_OPTIONS])
@click.version_option(__version__, "--version", prog_name="castore")
@click.pass_context
def main(ctx: click.Context, **given: Any) -> None:
    """castore: agent session history stored the way git stores code.

    Browse sessions, branch, time-travel and audit them. Revisions are what git takes:
    a full or short commit id (4+ hex characters), a branch, a label, HEAD, HEAD~2,
    main~1, REV^.

    The store is --store, else $CASTORE_STORE, else the nearest .castore folder in the
    current directory or above it (as git finds .git), else ./.castore. The global
    options may also follow the command (`castore log -s APP/USER/SESSION`).

    Data goes to stdout and messages to stderr. Errors print one line, `Error: ...`,
    and exit with status 1; usage mistakes exit with status 2. Long output goes through
    a pager on a terminal ($CASTORE_PAGER, $PAGER, less); colors honour NO_COLOR.
    """
    if no_color():
        ctx.color = False
    typed = ctx.get_parameter_source("store_url") is click.core.ParameterSource.COMMANDLINE
    ctx.obj = CliState(store_url=given["store_url"], session_spec=given["session_spec"],
                       store_options=parse_options(given["store_options"], "'-o' / '--store-option'"),
                       pager=not given["no_pager"], store_given=typed, master_key_file=given["master_key_file"])
    source = ctx.get_parameter_source("session_spec")
    if source is click.core.ParameterSource.ENVIRONMENT:
        ctx.obj.session_from = f"${SESSION_ENV}"
    ctx.obj.session_typed = source is click.core.ParameterSource.COMMANDLINE
    sub = ctx.invoked_subcommand
    cmd = ctx.command.get_command(ctx, sub) if sub and isinstance(ctx.command, click.Group) else None
    if cmd is not None:  # a nested group checks its own commands (the state exists by then)
        check_session_taken(ctx, f"{ctx.command_path} {sub}", cmd)


def _set_global(name: str) -> Any:
    """A callback storing a global option given after the subcommand into the invocation's state."""

    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value is None or value is False or value == ():
            return
        st = ctx.find_object(CliState)
        if st is None:
            st = ctx.ensure_object(CliState)
        if name == "store_options":
            st.store_options = {**st.store_options, **parse_options(value, "'-o' / '--store-option'")}
        elif name == "no_pager":
            st.pager = False
        elif name == "store_url":
            st.store_url, st.store_given = value, True
        elif name == "session_spec":
            st.session_spec, st.session_from = value, "-s"
        else:
            setattr(st, name, value)

    return callback


def _late_globals(cmd: click.Command) -> list[click.Option]:
    """Hidden copies of the global options for ``cmd``, except the names it already uses itself,
    and ``-s/--session`` only for a command that works on a session (elsewhere it is an error)."""
    taken = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    return [_global_option(spec, named=False, hidden=True, expose_value=False, callback=_set_global(spec.name),
                           is_eager=True) for spec in late_globals(taken, takes_session(cmd))]


def _add_late_globals(cmd: click.Command) -> None:
    """Let the global options follow ``cmd`` (or any command under it) too (``castore log -s A/U/S``), as git does.

    Running it twice on a command adds nothing more: the options it added are taken names then.
    """
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            _add_late_globals(sub)
    else:
        cmd.params.extend(_late_globals(cmd))


#: the same group under a second name
cli = main


def run() -> None:
    """The ``castore`` process (the console script and ``python -m castore`` call it through
    :func:`castore.__main__.main`): :data:`cli`, then
    exit with its code; after a command that asked for it (:func:`~castore.cli.common.skip_teardown`)
    and ended with a status it named, the process ends with that status once its output is flushed,
    without the interpreter's teardown.
    """
    try:
        cli(prog_name="castore")
    except SystemExit as e:
        end_process(e)


__all__ = ["main", "cli", "run", "COMMAND_MODULES", "OPTIONAL_COMMAND_MODULES", "SUMMARIES", "command_modules",
           "load_command", "LazyGroup"]
