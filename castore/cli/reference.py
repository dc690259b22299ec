"""The CLI reference, docs/cli.md, generated from every command's ``--help``.

``scripts/gen_cli_reference`` writes :func:`reference_markdown` to docs/cli.md; a test fails
when the page is out of date or a command (or option) has no help text. Run as
``python -m castore.cli.reference [--check] [PAGE]``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

from .main import main

#: help is rendered as on a terminal of 88 columns or more (the group caps help at 88 columns,
#: and click keeps 2 of them free), so the page does not depend on the terminal it is made on
WIDTH = 86


def iter_commands(
    cmd: click.Command = main, name: str = "castore", parent: click.Context | None = None
) -> Iterator[tuple[str, click.Command, click.Context]]:
    """Every command under ``cmd`` (itself first, then subcommands by name), with a help context."""
    settings = {**cmd.context_settings, "terminal_width": WIDTH}
    ctx = click.Context(cmd, info_name=name, parent=parent, **settings)
    yield ctx.command_path, cmd, ctx
    if isinstance(cmd, click.Group):
        for sub in sorted(cmd.list_commands(ctx)):
            child = cmd.get_command(ctx, sub)
            if child is not None and not child.hidden:
                yield from iter_commands(child, sub, ctx)


def missing_help(group: click.Command = main) -> list[str]:
    """Commands and options that have no help text (``castore log --oneline``, ...)."""
    out = []
    for path, cmd, _ in iter_commands(group):
        if not (cmd.help or "").strip():
            out.append(path)
        for p in cmd.params:
            if isinstance(p, click.Option) and not (p.help or "").strip() and "--help" not in p.opts:
                out.append(f"{path} {p.opts[-1]}")
    return out


def reference_markdown(group: click.Command = main) -> str:
    """The whole CLI reference page: a list of the commands, then each command's help."""
    commands = list(iter_commands(group))
    parts = [
        "# CLI reference",
        "",
        "Generated from `--help` by `scripts/gen_cli_reference`; do not edit by hand "
        "(a test fails when this page is out of date).",
        "",
    ]
    parts += [f"- [`{path}`](#{_anchor(path)})" for path, _, _ in commands[1:]]
    parts.append("")
    for path, cmd, ctx in commands:
        parts += [f"## `{path}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    return "\n".join(parts)


def _anchor(path: str) -> str:
    """The anchor GitHub gives a heading of ``path`` in backquotes."""
    return "".join(c for c in path.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def default_page() -> Path:
    """Where the reference lives in a checkout: docs/cli.md."""
    return Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def run(argv: list[str]) -> int:
    """Rewrite (or with ``--check``, only compare) the reference page; return the exit status."""
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    page = Path(paths[0]) if paths else default_page()
    lacking = missing_help()
    if lacking:
        print("commands or options without help: " + ", ".join(lacking), file=sys.stderr)
        return 1
    new = reference_markdown()
    old = page.read_text(encoding="utf-8") if page.exists() else None
    if check:
        if new != old:
            print(f"{page}: the CLI reference is out of date; run scripts/gen_cli_reference", file=sys.stderr)
            return 1
        return 0
    if new != old:
        page.write_text(new, encoding="utf-8")
        print(f"{page}: CLI reference updated", file=sys.stderr)
    else:
        print(f"{page}: CLI reference already current", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
