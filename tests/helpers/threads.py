"""Races on threads: run several calls at once and collect what they raise.

A test builds its race from plain functions and asserts on the returned exceptions (an
exception raised on a thread would otherwise only be printed, and the test pass)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable


def run_threads(*calls: Callable[[], object], together: bool = False) -> list[BaseException]:
    """Run each of ``calls`` on a thread of its own, every thread started before any is joined,
    and wait for them all.

    Args:
        calls: what each thread runs.
        together: each thread first waits at one barrier, so that the calls begin at once.

    Returns:
        What the calls raised, in the order of ``calls`` (empty when every call returned).
    """
    barrier = threading.Barrier(len(calls))
    raised: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            if together:
                barrier.wait()
            calls[i]()
        except BaseException as e:  # handed to the test
            raised[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [e for e in raised if e is not None]


def race(work: Callable[[int], object], n: int, *, together: bool = False) -> list[BaseException]:
    """Run ``work(0)``, ..., ``work(n - 1)`` on ``n`` threads at once (see :func:`run_threads`).

    Returns:
        What the calls raised, in the order of their argument (empty when every call returned).
    """
    return run_threads(*(functools.partial(work, i) for i in range(n)), together=together)
