"""The write path's group commit as sessions use it: appends of several threads in flight
together share one object write and one compare-and-swap per ref (castore.groupcommit;
the LangGraph saver's use of it is in test_langgraph_group.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from helpers.held import Held, run_queued

import castore
from castore.errors import RefConflict


def run(store: castore.Store, held: Held, calls: list[Callable[[], Any]]) -> list[Any]:
    """Each call's result, or what it raised (see :func:`held.run_queued`)."""
    results, errors = run_queued(calls, lambda: store.group_commit._queue, held)
    return [e if e is not None else r for r, e in zip(results, errors, strict=True)]


def msg(text: str) -> castore.Message:
    return castore.Message(role="user", content=text)


def test_appends_in_flight_together_share_one_write_and_one_swap_per_branch(
        local_store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = local_store.session("app", "u", "a"), local_store.session("app", "u", "b")
    a.append(msg("a0"))
    b.append(msg("b0"))
    held = Held(local_store, monkeypatch)
    lead = local_store.session("app", "u", "lead")
    got = run(local_store, held, [
        lambda: lead.append(msg("lead")),
        lambda: a.append_many([msg("a1"), msg("a2")]),
        lambda: b.append(msg("b1")),
        lambda: a.append(msg("a3")),
    ])
    assert not [g for g in got if isinstance(g, BaseException)], got
    assert held.batches == [1, 2]  # the leader's write, then one for the three calls behind it
    assert held.swap_calls[-1] == [a.refs.branch("main"), b.refs.branch("main")]  # each branch once
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
    got = run(local_store, held, [
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
    got = run(local_store, held, [
        lambda: lead.append(msg("lead")),
        lambda: new.append(msg("n0")),
        lambda: new.append(msg("n1")),
    ])
    assert not [g for g in got if isinstance(g, BaseException)], got
    head = local_store.refs.read(new.refs.head)
    assert head is not None and head.symbolic is not None and new.current_branch == "main"
    assert [m.content for m in new.messages()] == ["n0", "n1"]
