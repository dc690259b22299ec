"""The write path's group commit as sessions use it: appends of several threads in flight
together share one object write and one compare-and-swap per ref (castore.groupcommit;
the LangGraph saver's use of it is in test_langgraph_group.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import castore
from castore.errors import RefConflict


class Held:
    """Holds the store's first object write until ``release``, counting writes and swaps."""

    def __init__(self, store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.writes: list[int] = []  # batches per write
        self.swaps: list[list[str]] = []  # refs per swap call
        plumbing = store.plumbing
        real_write, real_swap, real_swap_many = plumbing.write_many, plumbing.swap, plumbing.swap_many

        def write(batches: Any) -> int:
            self.writes.append(len(batches))
            if len(self.writes) == 1:
                self.release.wait()
            return real_write(batches)

        def swap(ref: str, *a: Any, **k: Any) -> Any:
            self.swaps.append([ref])
            return real_swap(ref, *a, **k)

        def swap_many(moves: Any) -> Any:
            self.swaps.append([m[0] for m in moves])
            return real_swap_many(moves)

        monkeypatch.setattr(plumbing, "write_many", write)
        monkeypatch.setattr(plumbing, "swap", swap)
        monkeypatch.setattr(plumbing, "swap_many", swap_many)


def run_queued(store: castore.Store, held: Held, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls[0]`` (it leads and is held in its write), then the others one by one, each
    in its own thread and queued in order behind it; let the leader go; return each call's
    result or what it raised."""
    out: list[Any] = [None] * len(calls)

    def go(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as e:  # checked by the test
            out[i] = e

    threads = [threading.Thread(target=go, args=(0,))]
    threads[0].start()
    while not held.writes:
        time.sleep(0.005)
    for i in range(1, len(calls)):
        threads.append(threading.Thread(target=go, args=(i,)))
        threads[-1].start()
        while len(store.group_commit._queue) < i:
            time.sleep(0.005)
    held.release.set()
    for t in threads:
        t.join()
    return out


def msg(text: str) -> castore.Message:
    return castore.Message(role="user", content=text)


def test_appends_in_flight_together_share_one_write_and_one_swap_per_branch(
        local_store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = local_store.session("app", "u", "a"), local_store.session("app", "u", "b")
    a.append(msg("a0"))
    b.append(msg("b0"))
    held = Held(local_store, monkeypatch)
    lead = local_store.session("app", "u", "lead")
    got = run_queued(local_store, held, [
        lambda: lead.append(msg("lead")),
        lambda: a.append_many([msg("a1"), msg("a2")]),
        lambda: b.append(msg("b1")),
        lambda: a.append(msg("a3")),
    ])
    assert not [g for g in got if isinstance(g, BaseException)], got
    assert held.writes == [1, 2]  # the leader's write, then one for the three calls behind it
    assert held.swaps[-1] == [a.refs.branch("main"), b.refs.branch("main")]  # each branch once
    fresh = castore.open(local_store.url)  # what is stored, not this handle's caches
    try:
        assert [m.content for m in fresh.session("app", "u", "a").messages()] == ["a0", "a1", "a2", "a3"]
        assert [m.content for m in fresh.session("app", "u", "b").messages()] == ["b0", "b1"]
        assert [m.content for m in fresh.session("app", "u", "lead").messages()] == ["lead"]
    finally:
        fresh.close()
    # each call returns the ids of its own entries, chained in the order they queued
    a_ids = [e.id for e in a.entries()]
    assert got[1] == a_ids[1:3] and got[3] == a_ids[3]


def test_an_append_expecting_a_tip_another_append_of_its_group_moves_fails_alone(
        local_store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    a = local_store.session("app", "u", "a")
    tip = a.append(msg("a0"))
    held = Held(local_store, monkeypatch)
    lead = local_store.session("app", "u", "lead")
    got = run_queued(local_store, held, [
        lambda: lead.append(msg("lead")),
        lambda: a.append(msg("a1")),
        lambda: a.append(msg("mine"), expect=tip),  # the branch will be past ``tip`` when it lands
    ])
    assert isinstance(got[2], RefConflict) and got[2].expected == tip
    assert not isinstance(got[1], BaseException)
    assert [m.content for m in a.messages()] == ["a0", "a1"]


def test_an_append_to_a_new_session_in_a_group_creates_its_head_once_it_landed(
        local_store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    held = Held(local_store, monkeypatch)
    lead, new = local_store.session("app", "u", "lead"), local_store.session("app", "u", "new")
    got = run_queued(local_store, held, [
        lambda: lead.append(msg("lead")),
        lambda: new.append(msg("n0")),
        lambda: new.append(msg("n1")),
    ])
    assert not [g for g in got if isinstance(g, BaseException)], got
    head = local_store.refs.read(new.refs.head)
    assert head is not None and head.symbolic is not None and new.current_branch == "main"
    assert [m.content for m in new.messages()] == ["n0", "n1"]
