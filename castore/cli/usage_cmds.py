"""``castore usage``: tokens and cost of the stored sessions, each model response once
(the library is :mod:`castore.usage`)."""

from __future__ import annotations

from typing import Any

import click

from .common import json_option, note, pass_store, print_json, skip_teardown

_JSON = ('{"by": GROUP, "rows": [ROW, ...], "total": ROW, "copies_merged": n, "prices": {"date", "source"}, '
         '"unreadable": [{"session", "error"}, ...]} where ROW is {"name", "responses", "input", "output", '
         '"cache_read", "cache_write", "total", "cost", "unpriced_responses", "models": [MODEL, ...]}; a session '
         'whose objects cannot be read (or whose HEAD names a lost branch) is left out, named in "unreadable", and the '
         'exit status is 1')


def _n(v: int) -> str:
    return f"{v:,}"


def _cost(g: Any) -> str:
    if g.responses and g.unpriced == g.responses:
        return "-"
    return f"${g.cost:,.2f}" + ("*" if g.unpriced else "")


@click.command("usage")
@click.option("--by", "by", type=click.Choice(["session", "branch", "model", "project", "day"]), default="model",
              show_default=True, help="Group the responses by session, branch, model, project or day (UTC).")
@click.option("--app", metavar="APP", help="Only sessions of this app (claude, codex, gemini, pi, ...).")
@click.option("--since", metavar="YYYY-MM-DD", help="Only responses of this day (UTC) or later.")
@click.option("--until", metavar="YYYY-MM-DD", help="Only responses of this day (UTC) or earlier.")
@click.option("--prices", "prices_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="A price table to use instead of the one castore ships (same JSON shape: "
                   '{"models": {MODEL: {"input", "output", "cache_read", "cache_write"}}}, USD per million tokens).')
@click.option("--no-cache", is_flag=True, help="Read every session again instead of through the usage cache.")
@json_option(_JSON)
@pass_store()
def usage_cmd(store: Any, by: str, app: str | None, since: str | None, until: str | None, prices_file: str | None,
              no_cache: bool, as_json: bool) -> None:
    """Tokens (input, output, cache read, cache write) and cost of every model response stored.

    Reads the usage each response recorded (Claude Code, Codex, Gemini CLI, Pi, and any entry appended with
    usage in its metadata), on every branch of every session, and counts each response once
    however often it was stored: in a fork, a resumed session, a subagent's file, a rewind or a
    compaction replay (see docs/archive.md for how copies are recognised). A cost marked * leaves
    out responses of models the price table does not know ("-": all of them).
    """
    from ..gcpause import gc_paused

    # the collector would walk the commits the first run decodes (half a million objects,
    # a tenth of the run), to find nothing: they hold no cycles and stay alive until the
    # process ends (skip_teardown); paused for the command only, so a caller of the CLI in
    # its own process gets its collector back
    with gc_paused():
        _usage_report(store, by, app, since, until, prices_file, no_cache, as_json)


def _usage_report(store: Any, by: str, app: str | None, since: str | None, until: str | None,
                  prices_file: str | None, no_cache: bool, as_json: bool) -> None:
    """Count and print ``castore usage``'s report (the command's body, run with the collector paused)."""
    from ..usage import load_prices, usage

    report = usage(store, by=by, prices=load_prices(prices_file), app=app, since=since, until=until,
                   cache=not no_cache)
    skip_teardown()  # the cache is saved; what is left is every decoded commit, for the OS to free
    if as_json:
        print_json(report.to_json())
        _unreadable(report.unreadable)
        return
    head = (by.upper(), "RESPONSES", "INPUT", "OUTPUT", "CACHE READ", "CACHE WRITE", "TOTAL", "COST")
    rows = [(g.name, _n(g.responses), _n(g.tokens.input), _n(g.tokens.output), _n(g.tokens.cache_read),
             _n(g.tokens.cache_write), _n(g.tokens.total), _cost(g)) for g in (*report.groups, report.total)]
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]

    def line(r: tuple[str, ...]) -> str:
        return "  ".join(str(c).ljust(widths[0]) if i == 0 else str(c).rjust(widths[i]) for i, c in enumerate(r))

    click.echo(line(head))
    for r in rows[:-1]:
        click.echo(line(r))
    click.echo(line(rows[-1]))
    if report.copies:
        note(f"{_n(report.copies)} stored copies of responses counted once")
    if report.total.unpriced:
        unknown = sorted({m for g in report.groups for m in g.models if report.prices.of(m) is None})
        note(f"no price for {', '.join(unknown)}: * costs leave them out "
             "(--prices FILE: a table that has them, replacing the shipped one)")
    _unreadable(report.unreadable)


def _unreadable(unreadable: dict[str, str]) -> None:
    """Name the sessions left out (their objects or HEAD's branch cannot be read) in one ``Error:`` line, exit 1."""
    if unreadable:
        first, why = next(iter(sorted(unreadable.items())))
        more = f" and {len(unreadable) - 1} more" if len(unreadable) > 1 else ""
        raise click.ClickException(f"{first}{more} cannot be read and {'is' if not more else 'are'} left out of the "
                           f"counts ({why}); `castore fsck` says more")


def register(group: click.Group) -> None:
    """Add ``usage`` to the ``castore`` group."""
    group.add_command(usage_cmd)
