"""``Session.append_many`` with per-entry times and metadata, and appends to a branch that
is not checked out (``branch=``), on every backend."""

from __future__ import annotations

import pytest

import castore
from castore import BranchError, InvalidEntry, Message, RefConflict

APP = "app"


def _msg(i: int) -> Message:
    return Message(role="user", content=f"m{i}")


def test_each_entry_keeps_its_own_time_and_meta(store: castore.Store) -> None:
    s = store.session(APP, "u", "s")
    ids = s.append_many([_msg(0), _msg(1), _msg(2)], meta={"src": "batch", "k": 0}, time=50.0,
                        times=[100.0, None, 300.0], metas=[{"k": 1}, None, {"src": "own", "x": [1]}])
    les = {le.id: le for le in s.log()}
    got = [(les[i].time, les[i].meta) for i in ids]
    assert got == [(100.0, {"src": "batch", "k": 1}),
                   (50.0, {"src": "batch", "k": 0}),  # a None item falls back to the batch's
                   (300.0, {"src": "own", "k": 0, "x": [1]})]


def test_bad_per_entry_items_are_refused_and_write_nothing(store: castore.Store) -> None:
    s = store.session(APP, "u", "s")
    base = s.append(_msg(9))
    for kw in ({"times": [1.0]}, {"metas": [{}, {}, {}]}, {"times": "ab"}, {"metas": [{}, 3]},
               {"times": [1.0, float("nan")]}, {"metas": [{}, {"k": object()}]}):
        with pytest.raises(InvalidEntry):
            s.append_many([_msg(0), _msg(1)], **kw)
    assert s.head == base and len(s.log()) == 1


def test_append_to_a_branch_that_is_not_checked_out(store: castore.Store) -> None:
    s = store.session(APP, "u", "s")
    a = s.append_many([_msg(0), _msg(1)])
    s.branch("side", at=a[0])
    ids = s.append_many([_msg(2), _msg(3)], branch="side", expect=a[0], times=[1.0, 2.0])
    assert s.current_branch == "main" and s.head == a[1]  # HEAD did not move
    assert s.branches()["side"] == ids[-1]
    assert [le.entry.content for le in s.entries("side")] == ["m0", "m2", "m3"]
    assert [le.entry.content for le in s.entries("main")] == ["m0", "m1"]
    # a second handle appends to it too, and a stale expect is refused
    other = store.session(APP, "u", "s")
    c = other.append(_msg(4), branch="side")
    with pytest.raises(RefConflict):
        s.append(_msg(5), branch="side", expect=ids[-1])
    assert s.branches()["side"] == c
    # the branch HEAD is on, named: the same as appending without it
    d = s.append(_msg(6), branch="main")
    assert s.head == d and s.current_branch == "main"


def test_append_to_a_missing_branch_is_refused_and_writes_nothing(store: castore.Store) -> None:
    s = store.session(APP, "u", "s")
    a = s.append(_msg(0))
    with pytest.raises(BranchError, match="no branch 'nope'"):
        s.append(_msg(1), branch="nope")
    with pytest.raises(castore.InvalidName):
        s.append(_msg(1), branch="")
    assert s.branches() == {"main": a} and len(s.log(all_branches=True)) == 1


def test_a_new_session_starts_on_the_named_branch(store: castore.Store) -> None:
    s = store.session(APP, "u", "fresh")
    cid = s.append(_msg(0), branch="trunk")
    assert s.current_branch == "trunk" and s.head == cid and s.branches() == {"trunk": cid}


def test_a_detached_head_stays_detached_when_appending_to_a_branch(store: castore.Store) -> None:
    s = store.session(APP, "u", "s")
    a = s.append_many([_msg(0), _msg(1)])
    s.checkout(a[0])
    c = s.append(_msg(2), branch="main")
    assert s.current_branch is None and s.head == a[0]
    assert s.branches() == {"main": c}
