"""``python -m castore``: the ``castore`` command."""

from __future__ import annotations

from .cli.main import run

if __name__ == "__main__":
    run()
