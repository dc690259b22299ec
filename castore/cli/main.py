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
* every command (and option) has help text: the README reference is generated from it
  by ``scripts/gen_cli_reference`` and a test fails when it is missing or out of date.

A module listed here that does not exist is skipped; one that exists but fails to import
is an error (a broken command module must not go unnoticed).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from .. import __version__
from .common import SESSION_ENV, STORE_ENV, CastoreGroup, CliState, no_color, parse_options

#: command modules that ship with the CLI
COMMAND_MODULES = [
    "castore.cli.session_cmds",
    "castore.cli.inspect_cmds",
    "castore.cli.status_cmds",
    "castore.cli.demo",
]

#: command modules added by other areas; each is imported if it exists and must expose
#: ``register(group)``
OPTIONAL_COMMAND_MODULES = [
    "castore.cli.sync_cmds",
    "castore.cli.maintenance_cmds",
    "castore.cli.io_cmds",
    "castore.cli.html_cmds",
    "castore.cli.archive_cmds",
]


@click.group(cls=CastoreGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 88})
@click.option(
    "--store", "store_url", envvar=STORE_ENV, metavar="URL",
    help=f"The store: a path, memory://NAME or s3://BUCKET/PREFIX [env {STORE_ENV}; default: the nearest "
         ".castore here or above, else ./.castore].",
)
@click.option(
    "-o", "--store-option", "store_options", multiple=True, metavar="KEY=VALUE",
    help="A storage option for --store, e.g. endpoint_url=http://127.0.0.1:9000 (repeatable; as `remote add -o`).",
)
@click.option(
    "-s", "--session", "session_spec", envvar=SESSION_ENV, metavar="APP/USER/SESSION",
    help=f"The session to work on; write a '/' inside a name as %2F [env {SESSION_ENV}; "
         "default: the one chosen with `castore use`].",
)
@click.option("--no-pager", is_flag=True, help="Never page long output (it is paged only on a terminal).")
@click.version_option(__version__, "--version", prog_name="castore")
@click.pass_context
def main(ctx: click.Context, store_url: str | None, store_options: tuple[str, ...], session_spec: str | None,
         no_pager: bool) -> None:
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
    given = ctx.get_parameter_source("store_url") is click.core.ParameterSource.COMMANDLINE
    ctx.obj = CliState(store_url=store_url, session_spec=session_spec,
                       store_options=parse_options(store_options, "'-o' / '--store-option'"),
                       pager=not no_pager, store_given=given)
    if ctx.get_parameter_source("session_spec") is click.core.ParameterSource.ENVIRONMENT:
        ctx.obj.session_from = f"${SESSION_ENV}"


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
    """Hidden copies of the global options for ``cmd``, except the names it already uses itself."""
    taken = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
    out = []
    for decls, name, kw in (
        (("--store",), "store_url", {"metavar": "URL"}),
        (("-s", "--session"), "session_spec", {"metavar": "APP/USER/SESSION"}),
        (("-o", "--store-option"), "store_options", {"multiple": True, "metavar": "KEY=VALUE"}),
        (("--no-pager",), "no_pager", {"is_flag": True}),
    ):
        free = [d for d in decls if d not in taken]
        if not free or (name == "store_options" and "-o" in taken):
            continue  # the command's own -o (clone, remote add) means its own thing
        out.append(click.Option(free, hidden=True, expose_value=False, callback=_set_global(name),
                                is_eager=True, help=f"As `castore {decls[-1]}` (global option).", **kw))
    return out


def _add_late_globals(group: click.Group) -> None:
    """Let the global options follow any subcommand too (``castore log -s A/U/S``), as git does."""
    for cmd in group.commands.values():
        if isinstance(cmd, click.Group):
            _add_late_globals(cmd)
        else:
            cmd.params.extend(_late_globals(cmd))


def _register_all(group: click.Group) -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(group)
    for name in OPTIONAL_COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # not written (yet): nothing to plug in
                continue
            raise
        module.register(group)


_register_all(main)
_add_late_globals(main)

#: the same group under a second name
cli = main

__all__ = ["main", "cli", "COMMAND_MODULES", "OPTIONAL_COMMAND_MODULES"]
