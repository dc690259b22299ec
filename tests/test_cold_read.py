"""The cold read's fast paths (issue 17) give exactly what the plain paths give."""

from __future__ import annotations

import dataclasses
import gc
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import castore
from castore import objects as o
from castore.entries import Message, message_from_body, messages_from_bodies
from castore.objectstore import ObjectStore, gc_paused
from castore.storage import open_storage

BODIES = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": [{"type": "text", "text": "x"}], "tool_calls": [{"id": "c1"}]},
    {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "calc"},
    {"role": "user", "content": None, "vendor": {"a": 1}},  # an unknown field goes to extra
    {"role": "user"},
]


@pytest.mark.parametrize("body", BODIES)
def test_a_message_read_back_fast_equals_the_one_from_dict(body: dict[str, object]) -> None:
    fast, plain = message_from_body(body), Message.from_dict(body)
    assert fast == plain and repr(fast) == repr(plain)
    assert dataclasses.asdict(fast) == dataclasses.asdict(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.role = "system"  # type: ignore[misc]
    assert dataclasses.replace(fast, content="new").content == "new"


def test_messages_read_back_in_bulk_equal_the_ones_from_dict() -> None:
    fast, plain = messages_from_bodies(BODIES), [Message.from_dict(b) for b in BODIES]
    assert fast == plain and [repr(m) for m in fast] == [repr(m) for m in plain]
    assert [dataclasses.asdict(m) for m in fast] == [dataclasses.asdict(m) for m in plain]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast[0].role = "system"  # type: ignore[misc]
    assert dataclasses.replace(fast[1], content="new").content == "new"


@pytest.mark.parametrize("body", [{"role": ""}, {"content": "no role"}, {"role": 3}, ["role", "user"], None])
def test_a_body_without_a_usable_role_is_refused_as_before(body: object) -> None:
    with pytest.raises(castore.InvalidEntry):
        Message.from_dict(body)  # type: ignore[arg-type]
    with pytest.raises(castore.InvalidEntry):
        message_from_body(body)
    with pytest.raises(castore.InvalidEntry):
        messages_from_bodies([{"role": "user"}, body])


def test_gc_paused_leaves_the_collector_as_it_found_it() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_gc_paused_in_two_threads_keeps_the_collector_off_until_the_last_ends() -> None:
    # an import's pause ends while the repack it started still runs in its own pause (and the
    # other way round): the collector stays off until the last one ends
    inside, leave = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait()
            seen.append(gc.isenabled())

    for first_out in ("main", "other"):
        seen.clear()
        inside.clear()
        leave.clear()
        t = threading.Thread(target=other, daemon=True)
        try:
            with gc_paused():
                t.start()
                inside.wait()
                if first_out == "other":
                    leave.set()
                    t.join()
                    assert seen == [False]
                    assert not gc.isenabled()  # the other's end did not switch it on under this pause
            if first_out == "main":
                assert not gc.isenabled()  # the other still pauses it
                leave.set()
                t.join()
                assert seen == [False]
            assert gc.isenabled()
        finally:
            leave.set()
            t.join()
            gc.enable()


def test_a_pause_ended_by_another_thread_than_began_it_switches_the_collector_back() -> None:
    """A generator holding a pause, advanced by one thread and finished by another (an async
    caller running each step in a worker thread of its pool): the pause ends where it ends."""

    def steps() -> Iterator[None]:
        with gc_paused():
            yield

    it = steps()
    errors: list[BaseException] = []

    def step() -> None:
        try:
            next(it, None)
        except BaseException as e:
            errors.append(e)

    for _ in range(2):
        t = threading.Thread(target=step)
        t.start()
        t.join()
    assert errors == []
    assert gc.isenabled()


def test_a_child_forked_during_another_threads_pause_has_its_collector_back() -> None:
    """A process forked while another thread pauses the collector (the background repack
    merging): the child has no such thread, so nothing would ever end that pause, and the
    collector stayed off in the child for good. The forking thread's own pause goes on in the
    child, and its end switches the collector back on."""
    import os

    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait()

    def exit_status(pid: int) -> int:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    t = threading.Thread(target=other, daemon=True)
    t.start()
    try:
        inside.wait()
        pid = os.fork()
        if pid == 0:  # the child: no pause of its own going
            ok = False
            try:
                ok = gc.isenabled()
                with gc_paused():
                    ok = ok and not gc.isenabled()
                ok = ok and gc.isenabled()
            finally:
                os._exit(0 if ok else 1)
        assert exit_status(pid) == 0

        ok = False
        with gc_paused():
            pid = os.fork()
            if pid == 0:
                ok = not gc.isenabled()  # this thread's pause goes on in the child
        if pid == 0:
            os._exit(0 if ok and gc.isenabled() else 1)
        assert exit_status(pid) == 0
    finally:
        leave.set()
        t.join()
    assert gc.isenabled()


def test_bulk_adoption_hashes_decodes_and_caches_each_object(tmp_path: Path) -> None:
    objs = ObjectStore(open_storage(str(tmp_path / "st")))
    items = [o.Value(value={"role": "user", "content": str(i)}) for i in range(5)] + [o.Commit(kind="message")]
    canon = [o.encode(x) for x in items]
    got = objs.adopt_canonical_many([c for _, c in canon])
    assert [oid for oid, _ in got] == [oid for oid, _ in canon]
    assert [obj for _, obj in got] == items
    assert all(objs.knows(oid) for oid, _ in canon)
    assert not any(gc.is_tracked(obj) for _, obj in got)  # gc=False structs: no cycles, not walked


def test_bulk_adoption_names_the_object_that_is_not_castore_bytes(tmp_path: Path) -> None:
    objs = ObjectStore(open_storage(str(tmp_path / "st")))
    good = o.encode(o.Value(value=1))[1]
    bad = o.pack({"k": "zz"})  # msgpack, but no castore kind
    with pytest.raises(castore.IntegrityError) as e:
        objs.adopt_canonical_many([good, bad])
    assert e.value.args and o.digest(bad) in str(e.value)


def test_reading_a_long_session_does_not_run_the_cyclic_collector(tmp_path: Path) -> None:
    # every object a read allocates stays alive: each collection during it walks them all for
    # nothing (1,500 entries: 3 collections in messages(), 14 in entries() before the pause)
    url = str(tmp_path / "st")
    with castore.open(url, durable=False) as st:
        s = st.session("a", "u", "s")
        for j in range(0, 1500, 100):
            s.append_many([Message(role="user", content=f"m{i}") for i in range(j, j + 100)],
                          state_delta={"turn": j})
    runs: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            runs.append(phase)

    with castore.open(url) as st:
        s = st.session("a", "u", "s")
        gc.collect()
        gc.callbacks.append(seen)
        try:
            msgs = s.messages()
            during_messages = len(runs)
            entries = s.entries()
            during_entries = len(runs) - during_messages
        finally:
            gc.callbacks.remove(seen)
    assert len(msgs) == len(entries) == 1500 and msgs[-1].content == "m1499"
    # at most the one collection of the young objects when the collector resumes
    assert during_messages <= 1 and during_entries <= 1


_ID = "0123456789abcdef" * 4


@pytest.mark.parametrize("tail", [
    [], [_ID], [_ID, _ID[::-1]], [_ID[:63]], [_ID + "0"], [_ID[:32], _ID + _ID[:32]], [_ID.upper()],
    [_ID[:62] + "A1"], [_ID[:62] + " 1"], [_ID[:62] + "\n1"], [_ID[:63] + "g"], [_ID[:63] + "\u0661"],
    [_ID, 7], [None], [_ID, [_ID]], ["", _ID + _ID],
])
def test_a_hint_tail_is_read_only_when_every_id_is_full_lowercase_hex(tail: list[object]) -> None:
    from castore.history import Hint

    got = Hint.from_meta({"tl": tail})
    ok = all(isinstance(t, str) and o.is_hex_id(t) for t in tail)
    assert (got is not None) == ok
    assert got is None or got.tail == tail


def _samples() -> list[object]:
    from castore.entries import BranchSummary, Compaction, Custom, Event, LogEntry, ModelChange, prepare
    from castore.history import Hint
    from castore.refnames import SessionRefs, parse_ref_name
    from castore.retry import RetryPolicy

    m = Message(role="user", content=[{"type": "text", "text": "hi"}], extra={"vendor": 1})
    return [
        m, Message("tool", "42", None, "c1", "calc"), Event("agent", m, {"x": 1}, {"model": "m"}),
        Compaction("sum", "ab" * 32, 12, {"d": 1}), BranchSummary("left", None), ModelChange("m", "p"),
        Custom("t", [1, 2]), prepare(m, state_delta={"k": 1}),
        LogEntry(o.ObjectId("ab" * 32), "message", m, (), "user", 1.5, {"a": 1}, {"k": 1}, ("u",), 3),
        SessionRefs("sessions/a/u/s"), parse_ref_name("sessions/a/u/s/heads/main"), RetryPolicy(),
        Hint("cd" * 32, ["ab" * 32], ["w-" + "0" * 32]),
    ]


@pytest.mark.parametrize("obj", _samples(), ids=lambda x: type(x).__name__)
def test_value_types_behave_as_the_dataclass_methods_they_no_longer_compile(obj: object) -> None:
    from castore.entries import Record

    cls = type(obj)
    assert isinstance(obj, Record) and "__eq__" not in vars(cls) and "__repr__" not in vars(cls)
    fields = dataclasses.fields(obj)  # type: ignore[arg-type]
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    twin_cls = dataclasses.make_dataclass(cls.__name__, [(f.name, f.type) for f in fields], frozen=params.frozen)
    values = {f.name: getattr(obj, f.name) for f in fields}
    twin = twin_cls(**values)
    assert repr(obj) == repr(twin)
    copy = dataclasses.replace(obj, **values)  # type: ignore[type-var]
    assert copy == obj and copy is not obj and not (copy != obj) and obj != twin
    first = values[fields[0].name]
    other = {**values, fields[0].name: first + (1 if isinstance(first, int) else "x")}
    assert dataclasses.replace(obj, **other) != obj and twin_cls(**other) != twin  # type: ignore[type-var]
    try:
        expect: object = hash(twin)
    except TypeError as e:
        expect = type(e)
    try:
        got: object = hash(obj)
    except TypeError as e:
        got = type(e)
    assert got == expect
    if params.frozen:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, fields[0].name, None)
