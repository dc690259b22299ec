"""Bad input and hostile data (issue 18): what goes into an object is checked before anything
is written, reading survives one damaged session, storage keys stay inside the store, locks
are owned by their ``flock``, and human output cannot drive the reader's terminal."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

import castore
from castore import maintenance
from castore.entries import (
    MAX_DEPTH,
    BranchSummary,
    Compaction,
    Custom,
    Event,
    Message,
    ModelChange,
)
from castore.errors import InvalidEntry

MSG = {"role": "user", "content": "hi"}


def _nested(depth: int) -> Any:
    v: Any = "leaf"
    for _ in range(depth):
        v = [v]
    return v


def _stored_files(store: castore.Store) -> list[str]:
    return store.storage.list("")


# -- 18.3: everything that goes into an object is validated first ----------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"time": "yesterday"}, "time"),
        ({"time": True}, "time"),
        ({"time": math.nan}, "time"),
        ({"time": math.inf}, "time"),
        ({"author": 5}, "author"),
        ({"author": b"x"}, "author"),
        ({"meta": {1: "x"}}, "meta key"),
        ({"meta": {"usage": math.nan}}, "meta['usage']"),
        ({"meta": 5}, "meta"),
        ({"state_delta": {3: "x"}}, "state key"),
        ({"state_delta": {"score": math.inf}}, "state key 'score'"),
        ({"state_delta": {"app:deep": _nested(5000)}}, "state key 'app:deep'"),
        ({"state_delta": {"user:bad": {"k": {2: 3}}}}, "state key 'user:bad'"),
    ],
)
def test_append_refuses_bad_provenance_and_state_naming_the_field_and_writes_nothing(
    local_store: castore.Store, kwargs: dict[str, Any], field: str
) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    before = _stored_files(local_store)
    with pytest.raises(InvalidEntry, match=re.escape(field)):
        s.append(MSG, **kwargs)
    assert _stored_files(local_store) == before
    assert len(s.log()) == 1
    assert local_store.sessions("app")[0].entries == 1
    assert maintenance.fsck(local_store).ok


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Compaction(summary=5), "Compaction.summary"),  # type: ignore[arg-type]
        (lambda: Compaction("s", first_kept=7), "Compaction.first_kept"),  # type: ignore[arg-type]
        (lambda: Compaction("s", tokens_before="many"), "Compaction.tokens_before"),  # type: ignore[arg-type]
        (lambda: Compaction("s", tokens_before=True), "Compaction.tokens_before"),
        (lambda: BranchSummary(summary=b"x"), "BranchSummary.summary"),  # type: ignore[arg-type]
        (lambda: BranchSummary("s", from_id=1), "BranchSummary.from_id"),  # type: ignore[arg-type]
        (lambda: ModelChange(model=3), "ModelChange.model"),  # type: ignore[arg-type]
        (lambda: ModelChange(thinking_level=["hi"]), "ModelChange.thinking_level"),  # type: ignore[arg-type]
        (lambda: Custom(type=None), "Custom.type"),  # type: ignore[arg-type]
        (lambda: Event(author=5), "author"),  # type: ignore[arg-type]
        (lambda: Event(author="a", message={"role": "user"}), "message"),  # type: ignore[arg-type]
        (lambda: Event(author="a", meta={1: 2}), "meta"),  # type: ignore[dict-item]
    ],
)
def test_entry_types_refuse_wrong_field_types_when_made(make: Any, field: str) -> None:
    with pytest.raises(InvalidEntry, match=field):
        make()


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        (Compaction("s", details=_nested(5000)), "compaction field 'details'"),
        (Compaction("s", details={"x": math.nan}), "compaction field 'details'"),
        (BranchSummary("s", details=_nested(MAX_DEPTH + 1)), "branch_summary field 'details'"),
        (Custom("t", data=_nested(5000)), "custom field 'data'"),
        (Custom("t", data=[1.0, -math.inf]), "custom field 'data'"),
        (Message("user", content=_nested(5000)), "message field 'content'"),
        (Message("user", content="x", tool_calls=5), "tool_calls"),  # type: ignore[arg-type]
        (Message("user", content="x", tool_calls=["call"]), "tool_calls"),  # type: ignore[list-item]
        (Message("user", content="x", tool_call_id=5), "tool_call_id"),  # type: ignore[arg-type]
        (Message("user", content="x", name=b"n"), "name"),  # type: ignore[arg-type]
        (Event("bot", message=Message("assistant", content=_nested(5000))), "event field 'content'"),
        (Event("bot", state_delta={"s": _nested(5000)}), "state key 's'"),
        (Event("bot", meta={"usage": {"tokens": math.nan}}), "meta['usage']"),
        ({"role": "user", "content": "x", "extra": _nested(5000)}, "message field 'extra'"),
    ],
)
def test_append_refuses_deep_or_non_finite_values_with_invalid_entry_not_recursion_error(
    local_store: castore.Store, entry: Any, field: str
) -> None:
    s = local_store.session("app", "alice", "s1")
    with pytest.raises(InvalidEntry, match=re.escape(field)):
        s.append(entry)
    assert _stored_files(local_store) == []


def test_values_up_to_the_depth_limit_are_stored_and_read_back(local_store: castore.Store) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(Custom("t", data=_nested(MAX_DEPTH - 1)), state_delta={"k": _nested(MAX_DEPTH - 1)}, time=1_700_000_000)
    fresh = castore.open(local_store.storage.root).session("app", "alice", "s1")
    e = fresh.log()[0]
    assert e.entry == Custom("t", data=_nested(MAX_DEPTH - 1)) and e.time == 1_700_000_000.0
    assert fresh.state()["k"] == _nested(MAX_DEPTH - 1)


def test_self_containing_value_is_refused(local_store: castore.Store) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidEntry, match="contains itself"):
        local_store.session("app", "alice", "s1").append(Custom("t", data=loop))


def test_scope_state_and_session_info_are_checked_before_writing(local_store: castore.Store) -> None:
    with pytest.raises(InvalidEntry, match="state key 'x'"):
        local_store.update_scope("app", None, {"x": math.nan})
    with pytest.raises(InvalidEntry, match="author"):
        local_store.update_scope("app", "alice", {"x": 1}, author=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidEntry, match="session info"):
        local_store.session("app", "alice", "s1").set_info({"deep": _nested(5000)})
    assert _stored_files(local_store) == []


def test_listing_survives_a_session_whose_ref_metadata_has_wrong_types(local_store: castore.Store) -> None:
    # Written by an older castore (which accepted time="yesterday") or by another client.
    good = local_store.session("app", "alice", "good")
    good.append(MSG)
    bad = local_store.session("app", "alice", "bad")
    bad.append(MSG)
    ref = "sessions/app/alice/bad/heads/main"
    cur = local_store.refs.read(ref)
    local_store.refs.swap(ref, cur.target, cur, {"t": "yesterday", "n": [1], "name": 5})
    head = local_store.refs.read("sessions/app/alice/bad/HEAD")
    local_store.refs.swap("sessions/app/alice/bad/HEAD", head.target, head, {"names": "x", "info": 3})
    infos = {i.session: i for i in local_store.sessions("app")}
    assert set(infos) == {"good", "bad"}
    assert infos["bad"].updated == 0.0 and infos["bad"].entries == 0 and infos["bad"].info == {}
    from click.testing import CliRunner

    from castore.cli import main

    r = CliRunner().invoke(main, ["--store", local_store.storage.root, "sessions", "app"])
    assert r.exit_code == 0, r.output
    assert "app/alice/bad" in r.stdout and "app/alice/good" in r.stdout


def test_stored_entry_with_wrong_field_types_reads_as_a_custom_record(local_store: castore.Store) -> None:
    # A compaction body written before its fields were checked: reading keeps it verbatim.
    from castore.entries import entry_from

    e = entry_from("compaction", {"summary": 5}, "", {}, {})
    assert e == Custom("compaction", {"summary": 5})
