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

import click

from .. import __version__
from .common import SESSION_ENV, STORE_ENV, CastoreGroup, CliState

#: command modules that ship with the CLI
COMMAND_MODULES = [
    "castore.cli.session_cmds",
    "castore.cli.inspect_cmds",
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
    help=f"The store: a path, memory://NAME or s3://BUCKET/PREFIX [env {STORE_ENV}; default ./.castore].",
)
@click.option(
    "-s", "--session", "session_spec", envvar=SESSION_ENV, metavar="APP/USER/SESSION",
    help=f"The session to work on; write a '/' inside a name as %2F [env {SESSION_ENV}].",
)
@click.version_option(__version__, "--version", prog_name="castore")
@click.pass_context
def main(ctx: click.Context, store_url: str | None, session_spec: str | None) -> None:
    """castore: agent session history stored the way git stores code.

    Browse sessions, branch, time-travel and audit them. Revisions are what git takes:
    a full or short commit id (4+ hex characters), a branch, a label, HEAD, HEAD~2,
    main~1, REV^.

    Data goes to stdout and messages to stderr. Errors print one line, `Error: ...`,
    and exit with status 1; usage mistakes exit with status 2.
    """
    ctx.obj = CliState(store_url=store_url, session_spec=session_spec)


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

#: the same group under a second name
cli = main

__all__ = ["main", "cli", "COMMAND_MODULES", "OPTIONAL_COMMAND_MODULES"]
