"""``castore export html`` and ``castore serve``: see sessions in a browser."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from .common import CastoreGroup, all_entries_option, internal_option, note, open_store, pass_session, quiet_option

if TYPE_CHECKING:
    from ..session import Session

DEFAULT_PORT = 8765


@click.command("html")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, writable=True), metavar="FILE",
              help="Write to FILE instead of stdout.")
@internal_option("commits")
@all_entries_option
@pass_session()
def export_html(session: Session, output: str | None, internal: bool, all_entries: bool) -> None:
    """Write a session as one self-contained HTML file (its tree, entries and states).

    The file needs no network: scripts, styles and data are inline. It draws every
    commit (branches, labels and HEAD named; compactions and forks marked; long linear
    runs folded) but an imported session's bookkeeping lines, as log leaves them out,
    and opens on HEAD, or on the newest line shown when HEAD is one of those; clicking a
    commit shows its entry, metadata, full state, the change from its parent and, with
    the toggle, the context a model would receive there.
    """
    from ..html import render_session

    page = render_session(session, internal=internal, all_entries=all_entries)
    if output:
        try:
            with open(output, "w", encoding="utf-8") as f:
                f.write(page)
        except OSError as e:
            raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from e
        note(f"wrote {len(page.encode('utf-8'))} bytes to {output}")
    else:
        sys.stdout.write(page)


@click.command("serve")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True, metavar="PORT",
              help="The TCP port (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="The address to bind; anything but loopback shows your sessions to the network.")
@quiet_option(says="Do not log requests on stderr.")
@click.pass_context
def serve(ctx: click.Context, port: int, host: str, quiet: bool) -> None:
    """Browse a store's sessions in a web browser (read-only, local).

    GET / lists the sessions by app and user; each links to the same view as
    `export html`, where a link shows or hides an imported session's bookkeeping
    lines. Nothing can be written through it. Stop it with Ctrl-C. The store is the
    one the global options name (`castore serve --store URL` too).
    """
    from ..html.server import make_server

    store = open_store(ctx, must_exist=False)
    store.require()
    try:
        server = make_server(store, host, port, log=None if quiet else note)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    note(f"Serving {store.url} at {server.url} (read-only; Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        note("stopped")
    finally:
        server.server_close()


def register(group: click.Group) -> None:
    """Add ``export html`` (to the ``export`` group, created if missing) and ``serve``."""
    export = group.commands.get("export")
    if not isinstance(export, click.Group):
        export = CastoreGroup("export", help="Export sessions to files (HTML, other agents' formats).")
        group.add_command(export)
    export.add_command(export_html)
    group.add_command(serve)
