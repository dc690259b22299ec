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
    that is alive again, for nothing (a few percent of a short command's time). A search run by
    the fast path keeps it off throughout, its imports and its search (it makes no garbage
    cycles; 3% of a fresh ``castore grep -c`` of a rare word's instructions). Raises nothing
    of its own; the command exits the process.
    """
    _standard_descriptors()
    _escape_what_cannot_be_encoded()
    if fast and "grep" in sys.argv:  # no other command pays for importing the fast path
        gc.disable()  # and on again for click's (below) when the fast path leaves the command to it
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


def _standard_descriptors() -> None:
    """Open the null device on each of descriptors 0 to 2 that the process started without
    (``castore ... >&-``), as git does: else the first files the command opens (a store's log,
    a lock) would take them, and whatever writes to stdout or stderr there (a worker process it
    starts, an interpreter's fatal error) would write into them. A stream Python left as None
    for a closed descriptor writes to the null device: the command's output goes nowhere, and
    it ends as it would have, not with a traceback from asking it whether it is a terminal."""
    import os

    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: fd itself
    # the process's streams, open for its life
    if sys.stdin is None:
        sys.stdin = open(os.devnull)
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")


def _escape_what_cannot_be_encoded() -> None:
    """Have stdout and stderr write a character their encoding cannot hold as an escape
    (``\\u2192``) instead of raising UnicodeEncodeError half-way through a command's output: an
    8-bit locale (``LANG=de_DE.ISO-8859-1``, a Windows pipe's cp1252) and a stored text in
    another script. (An ASCII stream click re-encodes itself; the fast path leaves it to click.)"""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


if __name__ == "__main__":
    main()
