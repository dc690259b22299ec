"""Following an agent's files while it writes: import what is new, wait, import again.

Every archive importer (Claude Code, Codex, ...) brings a store up to date incrementally;
:func:`follow` turns one such import into a loop, and says after each round what changed,
so that a caller can act on it (the CLI's ``import ... --follow --sync REMOTE`` syncs the
remote then).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar


class _Imported(Protocol):
    """What an import reports per file: at least the number of lines it took."""

    @property
    def lines(self) -> int: ...


R = TypeVar("R", bound=_Imported)


def follow(import_once: Callable[[], Iterable[R]], *, interval: float = 1.0, stop: Callable[[], bool] | None = None,
           on_result: Callable[[R], Any] | None = None, on_round: Callable[[list[R]], Any] | None = None) -> int:
    """Run ``import_once`` every ``interval`` seconds until ``stop()`` is true (or interrupted).

    Args:
        import_once: one incremental import (``lambda: import_claude(store, path)``),
            returning one result per file, each with ``lines`` (how many it imported).
        interval: seconds between rounds.
        stop: polled after each round; None follows until interrupted.
        on_result: called with each result that imported lines, as it comes.
        on_round: called after each round that imported lines, with those results
            (after ``on_result`` saw them).

    Returns:
        The number of lines imported.

    Raises:
        Whatever ``import_once``, ``on_result`` or ``on_round`` raise (the loop stops);
        KeyboardInterrupt on Ctrl-C.
    """
    total = 0
    while True:
        changed = []
        for r in import_once():
            if r.lines:
                total += r.lines
                changed.append(r)
                if on_result is not None:
                    on_result(r)
        if changed and on_round is not None:
            on_round(changed)
        if stop is not None and stop():
            return total
        time.sleep(interval)


__all__ = ["follow"]
