"""CastoreSaver's group commit: ``put`` and ``put_writes`` calls in flight together (LangGraph
saves from background threads) share one object write and one compare-and-swap per ref."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("langgraph")

from helpers.held import Held, run_queued
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

import castore
import castore.groupcommit as groupcommit
from castore.adapters.langgraph import CastoreSaver
from castore.errors import StorageError
from castore.storage import refchanges as swaplog


def cfg(thread: str, cpid: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if cpid is not None:
        conf["checkpoint_id"] = cpid
    return {"configurable": conf}


def checkpoint(step: int) -> Any:
    cp = empty_checkpoint()
    cp["channel_values"] = {"turns": step}
    cp["channel_versions"] = {"turns": step + 1}
    return create_checkpoint(cp, None, step)


def run_all(calls: list[Callable[[], Any]], saver: CastoreSaver, held: Held) -> list[BaseException | None]:
    """Run ``calls[0]`` (it leads and is held in its write), then the others, queued in order
    behind it; return what each raised."""
    return run_queued(calls, lambda: saver._group_commit._queue, held)[1]


@pytest.fixture
def threads(local_store: castore.Store) -> Iterator[tuple[CastoreSaver, dict[str, str]]]:
    """A saver with threads a, b, c holding one checkpoint each (their ids by thread)."""
    saver = CastoreSaver(local_store)
    first = {t: saver.put(cfg(t), checkpoint(0), {"source": "input", "step": 0}, {"turns": 1})
             ["configurable"]["checkpoint_id"] for t in "abc"}
    yield saver, first


def test_calls_in_flight_together_share_one_write_and_one_swap_per_ref(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    saver, first = threads
    held = Held(local_store, monkeypatch)
    second = {t: checkpoint(1) for t in "bc"}
    calls: list[Callable[[], Any]] = [
        lambda: saver.put_writes(cfg("a", first["a"]), [("turns", 5)], "task-a0"),
        lambda: saver.put_writes(cfg("a", first["a"]), [("turns", 6)], "task-a1"),
        lambda: saver.put_writes(cfg("b", first["b"]), [("turns", 7)], "task-b"),
        lambda: saver.put(cfg("b", first["b"]), second["b"], {"source": "loop", "step": 1}, {"turns": 2}),
        lambda: saver.put_writes(cfg("c", first["c"]), [("turns", 8)], "task-c"),
        lambda: saver.put(cfg("c", first["c"]), second["c"], {"source": "loop", "step": 1}, {"turns": 2}),
    ]
    assert run_all(calls, saver, held) == [None] * len(calls)
    # the leader's write, then one write for the five calls queued behind it
    assert len(held.writes) == 2
    later = held.swaps[1:]
    assert len(later) == len(set(later)) == 5  # a's writes, b's and c's writes and main: once each
    fresh = CastoreSaver(castore.open(local_store.url))  # reads what is stored, not this saver's caches
    try:
        got = fresh.get_tuple(cfg("a", first["a"]))
        assert got is not None and sorted(w[2] for w in got.pending_writes) == [5, 6]
        for t in "bc":
            tup = fresh.get_tuple(cfg(t))
            assert tup is not None and tup.checkpoint["id"] == second[t]["id"]
            assert tup.parent_config is not None and tup.parent_config["configurable"]["checkpoint_id"] == first[t]
            old = fresh.get_tuple(cfg(t, first[t]))
            assert old is not None and [w[2] for w in old.pending_writes] == [7 if t == "b" else 8]
    finally:
        fresh.store.close()


def test_a_call_whose_ref_moved_under_its_group_retries_and_the_others_land(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    saver, first = threads
    # another process moves b's branch: this saver's kept value of it is now stale
    other_store = castore.open(local_store.url)
    rival = CastoreSaver(other_store)
    theirs = checkpoint(1)
    rival.put(cfg("b", first["b"]), theirs, {"source": "loop", "step": 1}, {"turns": 2})
    other_store.close()
    held = Held(local_store, monkeypatch)
    mine = checkpoint(1)
    calls: list[Callable[[], Any]] = [
        lambda: saver.put_writes(cfg("c", first["c"]), [("turns", 1)], "task-c0"),
        lambda: saver.put(cfg("b", first["b"]), mine, {"source": "loop", "step": 1}, {"turns": 2}),
        lambda: saver.put_writes(cfg("a", first["a"]), [("turns", 9)], "task-a"),
    ]
    assert run_all(calls, saver, held) == [None, None, None]
    got_a = saver.get_tuple(cfg("a", first["a"]))
    assert got_a is not None and [w[2] for w in got_a.pending_writes] == [9]
    # both children of b's first checkpoint are kept: the rival's on main, this one on a fork
    for cp in (theirs, mine):
        tup = saver.get_tuple(cfg("b", cp["id"]))
        assert tup is not None and tup.parent_config is not None
        assert tup.parent_config["configurable"]["checkpoint_id"] == first["b"]
    branches = set(local_store.session("langgraph", "default", "b").branches())
    assert "main" in branches and f"main@{mine['id']}" in branches


def test_a_failed_group_write_fails_every_call_in_it_and_moves_no_ref(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    saver, first = threads
    held = Held(local_store, monkeypatch,
                fail=lambda n: StorageError("disk full (test)", local_store.url) if n == 2 else None)
    nxt = checkpoint(1)
    calls: list[Callable[[], Any]] = [
        lambda: saver.put_writes(cfg("a", first["a"]), [("turns", 1)], "task-a"),
        lambda: saver.put_writes(cfg("b", first["b"]), [("turns", 2)], "task-b"),
        lambda: saver.put(cfg("b", first["b"]), nxt, {"source": "loop", "step": 1}, {"turns": 2}),
    ]
    errors = run_all(calls, saver, held)
    assert errors[0] is None
    assert all(isinstance(e, StorageError) and "disk full" in str(e) for e in errors[1:]), errors
    tup = saver.get_tuple(cfg("b"))
    assert tup is not None and tup.checkpoint["id"] == first["b"] and tup.pending_writes == []
    # nothing was lost for good: the same calls succeed once the disk is back
    saver.put_writes(cfg("b", first["b"]), [("turns", 2)], "task-b")
    saver.put(cfg("b", first["b"]), nxt, {"source": "loop", "step": 1}, {"turns": 2})
    tup = saver.get_tuple(cfg("b"))
    assert tup is not None and tup.checkpoint["id"] == nxt["id"]
    old = saver.get_tuple(cfg("b", first["b"]))
    assert old is not None and [w[2] for w in old.pending_writes] == [2]



class Stop(BaseException):
    """An interruption of the thread writing a group (as KeyboardInterrupt would be)."""


def test_calls_in_a_group_whose_writer_was_interrupted_fail_instead_of_looking_stored(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    saver, first = threads
    held = Held(local_store, monkeypatch, fail=lambda n: Stop() if n == 2 else None)
    calls: list[Callable[[], Any]] = [
        lambda: saver.put_writes(cfg("a", first["a"]), [("turns", 1)], "task-a"),
        lambda: saver.put_writes(cfg("b", first["b"]), [("turns", 2)], "task-b"),
        lambda: saver.put_writes(cfg("c", first["c"]), [("turns", 3)], "task-c"),
    ]
    errors = run_all(calls, saver, held)
    assert errors[0] is None
    assert all(isinstance(e, Stop) for e in errors[1:]), errors  # the writer's and the one it wrote for
    for t in "bc":
        tup = saver.get_tuple(cfg(t, first[t]))
        assert tup is not None and tup.pending_writes == []


def test_a_checkpoint_whose_parent_is_unknown_lands_beside_the_calls_staged_before_it(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    saver, first = threads
    held = Held(local_store, monkeypatch)
    orphan = checkpoint(1)
    calls: list[Callable[[], Any]] = [
        lambda: saver.put_writes(cfg("c", first["c"]), [("turns", 1)], "task-c"),
        lambda: saver.put_writes(cfg("a", first["a"]), [("turns", 4)], "task-a"),
        # its parent was never stored here (pruned, or from another store): the saver re-reads
        # the thread, keeping what the group staged for it, and stores it as a root naming it
        lambda: saver.put(cfg("a", "1ef00000-0000-6000-8000-000000000000"), orphan,
                          {"source": "loop", "step": 1}, {"turns": 2}),
    ]
    assert run_all(calls, saver, held) == [None, None, None]
    assert len(held.writes) == 2
    tup = saver.get_tuple(cfg("a", orphan["id"]))
    assert tup is not None and tup.parent_config is not None
    assert tup.parent_config["configurable"]["checkpoint_id"] == "1ef00000-0000-6000-8000-000000000000"
    old = saver.get_tuple(cfg("a", first["a"]))
    assert old is not None and [w[2] for w in old.pending_writes] == [4]


def test_task_writes_queued_for_a_checkpoint_not_stored_yet_wait_for_its_put_and_share_its_write(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # LangGraph's order in a turn: the put of checkpoint 2 is submitted before the task
    # writing for it runs, but reaches the saver only once the put of checkpoint 1 returned
    monkeypatch.setattr(groupcommit, "LINGER", 600.0)  # so long that only the put can end the wait
    saver, first = threads
    held = Held(local_store, monkeypatch)
    one, two = checkpoint(1), checkpoint(2)
    errors: list[BaseException] = []

    def go(call: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
            try:
                call()
            except BaseException as e:  # checked by the test
                errors.append(e)
        t = threading.Thread(target=run)
        t.start()
        return t

    lead = go(lambda: saver.put(cfg("a", first["a"]), one, {"source": "loop", "step": 1}, {"turns": 2}))
    while not held.writes:
        time.sleep(0.005)
    task = go(lambda: saver.put_writes(cfg("a", two["id"]), [("turns", 7)], "task-2"))
    while len(saver._group_commit._queue) < 1:
        time.sleep(0.005)
    held.release.set()
    lead.join()
    while not (saver._group_commit._leading or len(held.writes) > 1):  # the task's call leads, or wrote alone
        time.sleep(0.005)
    put = go(lambda: saver.put(cfg("a", one["id"]), two, {"source": "loop", "step": 2}, {"turns": 3}))
    task.join()
    put.join()
    assert errors == []
    assert len(held.writes) == 2  # the first put's write, then the task's writes with the second put
    tup = saver.get_tuple(cfg("a"))
    assert tup is not None and tup.checkpoint["id"] == two["id"]
    assert [w[2] for w in tup.pending_writes] == [7]


def test_task_writes_whose_checkpoint_is_never_put_land_all_the_same(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groupcommit, "LINGER", 0.01)
    saver, first = threads
    held = Held(local_store, monkeypatch)
    one, later = checkpoint(1), checkpoint(2)
    calls: list[Callable[[], Any]] = [
        lambda: saver.put(cfg("a", first["a"]), one, {"source": "loop", "step": 1}, {"turns": 2}),
        lambda: saver.put_writes(cfg("a", later["id"]), [("turns", 3)], "task-x"),  # its put never comes
    ]
    assert run_all(calls, saver, held) == [None, None]
    fresh = CastoreSaver(castore.open(local_store.url))  # what is on disk
    try:
        fresh.put(cfg("a", one["id"]), later, {"source": "loop", "step": 2}, {"turns": 3})
        tup = fresh.get_tuple(cfg("a"))
        assert tup is not None and tup.checkpoint["id"] == later["id"]
        assert [w[2] for w in tup.pending_writes] == [3]
    finally:
        fresh.store.close()


def test_a_caller_alone_never_waits_for_a_put(threads: tuple[CastoreSaver, dict[str, str]]) -> None:
    # one thread calling put_writes before the put of the same checkpoint (as LangGraph's
    # threads may): with no call in flight there is no put to wait for
    saver, first = threads
    waits: list[float | None] = []
    real_wait = saver._group_commit._cond.wait

    def wait(timeout: float | None = None) -> bool:
        waits.append(timeout)
        return real_wait(timeout)

    saver._group_commit._cond.wait = wait  # type: ignore[method-assign]
    nxt = checkpoint(1)
    saver.put_writes(cfg("a", nxt["id"]), [("turns", 4)], "task-1")
    saver.put(cfg("a", first["a"]), nxt, {"source": "loop", "step": 1}, {"turns": 2})
    assert waits == []
    tup = saver.get_tuple(cfg("a"))
    assert tup is not None and [w[2] for w in tup.pending_writes] == [4]


def test_a_saver_reads_no_ref_while_only_its_own_swaps_moved_them(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    saver, first = threads
    assert local_store.storage.swaps_since(None) is not None  # local disk keeps a swap log
    listed: list[str] = []
    real_list = local_store.refs.list

    def count_list(prefix: str) -> list[str]:
        listed.append(prefix)
        return real_list(prefix)

    saver.get_tuple(cfg("a"))  # the refs as they are now (the store's swap log was started after a's view)
    monkeypatch.setattr(local_store.refs, "list", count_list)
    nxt = checkpoint(1)
    saver.put_writes(cfg("a", first["a"]), [("turns", 4)], "task-1")
    saver.put(cfg("a", first["a"]), nxt, {"source": "loop", "step": 1}, {"turns": 2})
    tup = saver.get_tuple(cfg("a"))
    assert tup is not None and tup.checkpoint["id"] == nxt["id"]
    assert listed == []


def test_a_saver_sees_what_another_handle_changed_in_a_thread_it_holds(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store) -> None:
    saver, first = threads
    assert saver.get_tuple(cfg("a")) is not None  # a's view is held
    other_store = castore.open(local_store.url)  # as another process would
    try:
        rival = CastoreSaver(other_store)
        theirs = checkpoint(1)
        rival.put_writes(cfg("a", first["a"]), [("turns", 6)], "task-r")
        rival.put(cfg("a", first["a"]), theirs, {"source": "loop", "step": 1}, {"turns": 2})
        tup = saver.get_tuple(cfg("a"))
        assert tup is not None and tup.checkpoint["id"] == theirs["id"]
        old = saver.get_tuple(cfg("a", first["a"]))
        assert old is not None and [w[2] for w in old.pending_writes] == [6]
        rival.delete_thread("a")
        assert saver.get_tuple(cfg("a")) is None
    finally:
        other_store.close()


def test_a_swap_under_way_while_a_saver_reads_a_thread_is_seen_once_it_lands(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the rival's swap logs its key, then stops before its change lands: a reader that took
    # the log's mark after that line and read the old ref must not trust its mark
    saver, first = threads
    other_store = castore.open(local_store.url)
    rival = CastoreSaver(other_store)
    logged, go = threading.Event(), threading.Event()
    real_log = swaplog.log_swap

    def log_swap(root: str, key: str, url: str) -> None:
        real_log(root, key, url)
        if threading.current_thread().name == "rival" and key.endswith("/heads/main"):
            logged.set()
            go.wait()

    monkeypatch.setattr(swaplog, "log_swap", log_swap)
    theirs = checkpoint(1)
    put = threading.Thread(name="rival", target=lambda: rival.put(
        cfg("a", first["a"]), theirs, {"source": "loop", "step": 1}, {"turns": 2}))
    try:
        put.start()
        logged.wait()
        fresh = CastoreSaver(local_store)  # reads the thread for the first time, mid-swap
        tup = fresh.get_tuple(cfg("a"))
        assert tup is not None and tup.checkpoint["id"] == first["a"]
        go.set()
        put.join()
        tup = fresh.get_tuple(cfg("a"))
        assert tup is not None and tup.checkpoint["id"] == theirs["id"]
    finally:
        go.set()
        put.join()
        other_store.close()


def test_a_call_interrupted_while_waiting_for_a_put_leaves_the_saver_working(
        threads: tuple[CastoreSaver, dict[str, str]], local_store: castore.Store,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groupcommit, "LINGER", 600.0)
    saver, first = threads
    held = Held(local_store, monkeypatch)
    real_wait = saver._group_commit._cond.wait

    def wait(timeout: float | None = None) -> bool:
        if timeout is not None:  # the wait for a put only
            raise Stop()
        return real_wait(timeout)

    saver._group_commit._cond.wait = wait  # type: ignore[method-assign]
    one, two = checkpoint(1), checkpoint(2)
    calls: list[Callable[[], Any]] = [
        lambda: saver.put(cfg("a", first["a"]), one, {"source": "loop", "step": 1}, {"turns": 2}),
        lambda: saver.put_writes(cfg("a", two["id"]), [("turns", 7)], "task-2"),
    ]
    errors = run_all(calls, saver, held)
    assert errors[0] is None and isinstance(errors[1], Stop)
    assert not saver._group_commit._leading and saver._group_commit._queue == []
    saver.put(cfg("a", one["id"]), two, {"source": "loop", "step": 2}, {"turns": 3})
    tup = saver.get_tuple(cfg("a"))
    assert tup is not None and tup.checkpoint["id"] == two["id"] and tup.pending_writes == []
