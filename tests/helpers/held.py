"""A group commit held open: the first object write waits until the test lets it go, so
that the calls started meanwhile queue behind it and land together as the next group
(castore.groupcommit; used by test_groupcommit and test_langgraph_group)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import castore


class Held:
    """Holds a store's first object write until ``release``, counting writes and swaps."""

    def __init__(self, store: castore.Store, monkeypatch: pytest.MonkeyPatch,
                 fail: Callable[[int], BaseException | None] = lambda n: None) -> None:
        self.release = threading.Event()
        self.writes: list[int] = []  # objects per write
        self.batches: list[int] = []  # batches (refs' commits) per write
        self.swaps: list[str] = []  # refs moved, in order
        self.swap_calls: list[list[str]] = []  # refs per swap call
        plumbing = store.plumbing
        real_write, real_swap, real_swap_many = plumbing.write_many, plumbing.swap, plumbing.swap_many

        def write(batches: Any) -> int:
            self.writes.append(sum(len(b.pending) for b in batches))
            self.batches.append(len(batches))
            if len(self.writes) == 1:
                self.release.wait()
            err = fail(len(self.writes))
            if err is not None:
                raise err
            return real_write(batches)

        def swap(ref: str, *a: Any, **k: Any) -> Any:
            self.swaps.append(ref)
            self.swap_calls.append([ref])
            return real_swap(ref, *a, **k)

        def swap_many(moves: Any) -> Any:  # a group's refs, at once
            self.swaps.extend(m[0] for m in moves)
            self.swap_calls.append([m[0] for m in moves])
            return real_swap_many(moves)

        monkeypatch.setattr(plumbing, "write_many", write)
        monkeypatch.setattr(plumbing, "swap", swap)
        monkeypatch.setattr(plumbing, "swap_many", swap_many)


def run_queued(calls: list[Callable[[], Any]], queue: Callable[[], list[Any]],
               held: Held) -> tuple[list[Any], list[BaseException | None]]:
    """Run ``calls[0]`` (it leads and is held in its write), then the others one by one, each
    in its own thread and queued (``queue()``: the group commit's queue) in order behind it;
    let the leader go once they all wait. Returns each call's result and what each raised."""
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def go(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as e:  # checked by the test
            errors[i] = e

    threads = [threading.Thread(target=go, args=(0,))]
    threads[0].start()
    while not held.writes:
        time.sleep(0.005)
    for i in range(1, len(calls)):
        threads.append(threading.Thread(target=go, args=(i,)))
        threads[-1].start()
        while len(queue()) < i:
            time.sleep(0.005)
    held.release.set()
    for t in threads:
        t.join()
    return results, errors
