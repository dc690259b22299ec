"""``python -m castore`` and the ``castore`` console script: the ``castore`` command (:func:`main`)."""

from __future__ import annotations

import gc


def main() -> None:
    """Run the ``castore`` command in this process (:func:`castore.cli.main.run`, which ends it).

    The cyclic garbage collector is off while the command line's modules (click, the group and
    its helpers) are imported, and what they made is then frozen (:func:`gc.freeze`): it lives
    as long as the process, and every burst of it would otherwise have the collector walk all
    that is alive again, for nothing (a few percent of a short command's time). Raises nothing
    of its own; the command exits the process.
    """
    gc.disable()
    try:
        from .cli.main import run

        gc.freeze()
    finally:
        gc.enable()
    run()


if __name__ == "__main__":
    main()
