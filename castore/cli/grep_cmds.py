"""``castore grep``: search every session and branch of the store (:mod:`castore.grep`).

A module of its own, so that ``castore grep`` loads no other command's module. The command is
built from :mod:`.grep_spec` (its argument and options, declared there once, as data) and runs
:func:`castore.cli.grep_search.run` (the search and its output, shared with the fast path of a
fresh process, :mod:`castore.cli.fast`, which parses the same table without click).
"""

from __future__ import annotations

import functools
from typing import Any

import click

from .common import click_option, open_store
from .grep_search import run
from .grep_spec import GREP_ARGUMENT, GREP_OPTIONS


@click.command("grep", params=[click.Argument([GREP_ARGUMENT]), *map(click_option, GREP_OPTIONS)])
@click.pass_context
def grep_cmd(ctx: click.Context, **params: Any) -> None:
    """Search every session and branch of the store for PATTERN (a Python regex).

    Each matching entry is reported once, naming the branches that hold it. Tool results
    are left out unless asked for (--kind tool_result, -a, or --tool). Encrypted reasoning,
    signatures and images are never searched. Exit status: 0 when something matched, 1
    when nothing did, 2 on an error (grep's).

    For grep users: PATTERN is Python's regex, which grep -E's extended syntax mostly is
    (| ( ) + ? {n,m} unescaped); Python adds \\d \\w \\s \\b, lazy quantifiers and
    lookarounds, and lacks POSIX classes ([[:alpha:]]) and \\< \\> (refused, -E or
    not: they would match something else). -q, -c, -l, -i, -w, -F, -C, --color and
    --no-messages are grep's; -s is --session in every castore command (grep's -s is
    --no-messages here), -n is --limit (each line printed says its line within its
    block), -o is --store-option, and every session is searched (no -r).
    """
    # click.echo strips colour from what is not a terminal: --color=always keeps it
    echo = functools.partial(click.echo, color=True) if params["color"] == "always" else click.echo
    ctx.exit(run(params, lambda: open_store(ctx), echo))


def register(group: click.Group) -> None:
    """Add ``grep`` to the ``castore`` group."""
    group.add_command(grep_cmd)
