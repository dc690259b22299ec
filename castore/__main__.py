"""``python -m castore``: the ``castore`` command."""

from __future__ import annotations

from .cli.main import cli

if __name__ == "__main__":
    cli(prog_name="castore")
