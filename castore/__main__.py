"""``python -m castore`` and the ``castore`` console script: the ``castore`` command (:func:`main`)."""

from __future__ import annotations

import gc
import sys


def main(fast: bool = True) -> None:
    """Run the ``castore`` command in this process (:func:`castore.cli.main.run`, which ends it).

    A plain ``castore grep`` (every argument one :mod:`castore.cli.fast` reads) runs first,
    without importing click: click and the standard modules it loads cost a fresh search more
    than the search itself. Any other command line, or one it does not fully understand, goes
    to click, which stays the authority on it (``fast=False``: always to click; the tests
    compare the two ways).

    The cyclic garbage collector is off while the command line's modules (click, the group and
    its helpers) are imported, and what they made is then frozen (:func:`gc.freeze`): it lives
    as long as the process, and every burst of it would otherwise have the collector walk all
    that is alive again, for nothing (a few percent of a short command's time). Raises nothing
    of its own; the command exits the process.
    """
    if fast and "grep" in sys.argv:  # no other command pays for importing the fast path
        from .cli.fast import grep_main

        status = grep_main(sys.argv[1:])
        if status is not None:
            from .cli.plain import end_process

            end_process(SystemExit(status))
    gc.disable()
    try:
        from .cli.main import run

        gc.freeze()
    finally:
        gc.enable()
    run()


if __name__ == "__main__":
    main()
