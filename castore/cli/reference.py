"""The README's CLI reference, generated from every command's ``--help``.

``scripts/gen_cli_reference`` rewrites the block between :data:`START` and :data:`END` in
README.md with :func:`reference_markdown`; a test fails when the block is out of date or a
command (or option) has no help text. Run as ``python -m castore.cli.reference [--check] [README]``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import click

from .main import main

START = "<!-- CLI-REFERENCE:START -->"
END = "<!-- CLI-REFERENCE:END -->"
#: help is rendered as on a terminal of 88 columns or more (the group caps help at 88 columns,
#: and click keeps 2 of them free), so the README does not depend on the terminal it is made on
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
    """The CLI reference block, markers included."""
    parts = [
        START,
        "## CLI reference",
        "",
        "Generated from `--help` by `scripts/gen_cli_reference`; do not edit by hand.",
        "",
    ]
    for path, cmd, ctx in iter_commands(group):
        parts += [f"### `{path}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""]
    parts.append(END)
    return "\n".join(parts)


def splice(readme: str, block: str) -> str:
    """``readme`` with the text between the markers (inclusive) replaced by ``block``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    a, b = readme.find(START), readme.find(END)
    if a < 0 or b < a:
        raise ValueError(f"README has no {START} ... {END} block")
    return readme[:a] + block + readme[b + len(END):]


def run(argv: list[str]) -> int:
    """Rewrite (or with ``--check``, only compare) the README block; return the exit status."""
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    readme = Path(paths[0] if paths else Path(__file__).resolve().parents[2] / "README.md")
    text = readme.read_text(encoding="utf-8")
    lacking = missing_help()
    if lacking:
        print("commands or options without help: " + ", ".join(lacking), file=sys.stderr)
        return 1
    new = splice(text, reference_markdown())
    if check:
        if new != text:
            print(f"{readme}: the CLI reference is out of date; run scripts/gen_cli_reference", file=sys.stderr)
            return 1
        return 0
    if new != text:
        readme.write_text(new, encoding="utf-8")
        print(f"{readme}: CLI reference updated", file=sys.stderr)
    else:
        print(f"{readme}: CLI reference already current", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
