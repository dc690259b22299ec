"""Context projection and non-destructive compaction (castore.context, Session.context/compact)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import castore
from castore import BranchSummary, Compaction, Custom, Event, Message, ModelChange
from castore.context import (
    BRANCH_PREFIX,
    COMPACTION_PREFIX,
    COMPACTION_SUFFIX,
    MESSAGE_OVERHEAD,
    Context,
    estimate_tokens,
    project,
)
from castore.session import LogEntry


def summary_text(s: str) -> str:
    return COMPACTION_PREFIX + s + COMPACTION_SUFFIX


def view(ctx: Context) -> list[tuple[str, Any]]:
    return [(m.role, m.content) for m in ctx]


def call(cid: str, text: str = "") -> Message:
    return Message(role="assistant", content=text, tool_calls=[{"id": cid, "type": "function",
                                                               "function": {"name": "f", "arguments": "{}"}}])


def result(cid: str, text: str) -> Message:
    return Message(role="tool", content=text, tool_call_id=cid)


def le(entry: Any, i: int) -> LogEntry:
    return LogEntry(id=f"{i:064x}", kind=entry.kind, entry=entry, parents=())  # type: ignore[arg-type]


# -- a long session with two compactions and a branch summary -----------------------------
@pytest.fixture(params=["local", "memory"])
def long_session(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    from conftest import make_backend

    store = make_backend(request.param, request, tmp_path).open()
    yield _build_long(store)
    store.close()


def _build_long(store: castore.Store) -> tuple[castore.Session, dict[str, str]]:
    s = store.session("app", "alice", "long")
    ids: dict[str, str] = {}
    ids["sys"] = s.append(Message(role="system", content="You are terse."))
    ids["mc"] = s.append(ModelChange(model="m1", provider="p1", thinking_level="low"))
    ids["u1"] = s.append(Message(role="user", content="q1"))
    ids["a1"] = s.append(Message(role="assistant", content="r1"))
    ids["u2"] = s.append(Message(role="user", content="q2"))
    ids["call"] = s.append(call("c1"))
    ids["res"] = s.append(result("c1", "out1"))
    ids["a2"] = s.append(Message(role="assistant", content="r2"))
    ids["custom"] = s.append(Custom("ui", {"x": 1}))
    ids["before_c1"] = ids["custom"]
    ids["c1"] = s.compact("S1", keep_from=ids["u2"])
    ids["u3"] = s.append(Message(role="user", content="q3"))
    ids["a3"] = s.append(Message(role="assistant", content="r3"))
    # a side branch, left and summarised
    s.branch("side")
    s.checkout("side")
    ids["side1"] = s.append(Message(role="user", content="side q"))
    s.checkout("main")
    ids["bs"] = s.summarize_branch(ids["side1"], "tried the side path")
    ids["u4"] = s.append(Event(author="user", message=Message(role="user", content="q4")))
    ids["mc2"] = s.append(ModelChange(model="m2"))
    ids["a4"] = s.append(Message(role="assistant", content="r4"))
    ids["c2"] = s.compact("S2", keep_from=ids["u4"])
    ids["u5"] = s.append(Message(role="user", content="q5"))
    return s, ids


def test_long_session_context_on_s3(store):
    s, ids = _build_long(store)
    assert [m.content for m in s.context()][1:] == ["q4", "r4", "q5"]
    assert s.context(ids["before_c1"]).commits[0] == ids["sys"]


def test_context_before_first_compaction_is_the_full_message_list(long_session):
    s, ids = long_session
    ctx = s.context(ids["before_c1"])
    assert view(ctx) == [("system", "You are terse."), ("user", "q1"), ("assistant", "r1"), ("user", "q2"),
                         ("assistant", ""), ("tool", "out1"), ("assistant", "r2")]
    assert ctx.commits == [ids[k] for k in ("sys", "u1", "a1", "u2", "call", "res", "a2")]
    assert (ctx.model, ctx.provider, ctx.thinking_level) == ("m1", "p1", "low")


def test_context_after_first_compaction_starts_with_its_summary(long_session):
    s, ids = long_session
    ctx = s.context(ids["a3"])
    assert view(ctx) == [("user", summary_text("S1")), ("user", "q2"), ("assistant", ""), ("tool", "out1"),
                         ("assistant", "r2"), ("user", "q3"), ("assistant", "r3")]
    assert ctx.commits[0] == ids["c1"]


def test_branch_summary_appears_where_it_stands(long_session):
    s, ids = long_session
    ctx = s.context(ids["u4"])
    assert view(ctx)[-2:] == [("user", BRANCH_PREFIX + "tried the side path</summary>"), ("user", "q4")]
    assert ctx.commits[-2] == ids["bs"]
    assert s.show(ids["bs"]).entry == BranchSummary("tried the side path", from_id=ids["side1"])


def test_latest_compaction_supersedes_earlier_ones(long_session):
    s, ids = long_session
    ctx = s.context()
    assert view(ctx) == [("user", summary_text("S2")), ("user", "q4"), ("assistant", "r4"), ("user", "q5")]
    assert ctx.commits == [ids["c2"], ids["u4"], ids["a4"], ids["u5"]]
    assert (ctx.model, ctx.provider, ctx.thinking_level) == ("m2", None, "low")
    assert ctx.tokens == sum(estimate_tokens(m) for m in ctx)


def test_compaction_keeps_full_history_readable(long_session):
    s, ids = long_session
    texts = [m.content for m in s.messages()]
    assert texts[:4] == ["You are terse.", "q1", "r1", "q2"] and texts[-1] == "q5"
    c2 = s.show(ids["c2"]).entry
    assert isinstance(c2, Compaction) and c2.first_kept == ids["u4"]
    before = [m for m in s.messages(ids["a4"])]
    assert c2.tokens_before == sum(estimate_tokens(m) for m in before[: [e.id for e in s.entries(ids["a4"])
                                                                          if e.kind in ("message", "event")
                                                                          ].index(ids["u4"])])


def test_time_travel_gives_the_old_context_back(long_session):
    s, ids = long_session
    old = view(s.context(ids["a2"]))
    s.append(Message(role="user", content="later"))
    s.compact("S3", keep_from="HEAD")
    assert view(s.context(ids["a2"])) == old
    assert view(s.context())[0] == ("user", summary_text("S3"))


def test_context_writes_nothing(long_session):
    s, _ = long_session
    s.store.objects.wait_repack()  # a background repack of the fixture's appends is not context's write
    before = sorted(s.store.storage.list(""))
    s.context(max_tokens=5, tool_output_limit=0)
    assert sorted(s.store.storage.list("")) == before


# -- bad input ---------------------------------------------------------------------------
def test_compact_keep_from_off_the_path_is_refused_and_writes_nothing(store):
    s = store.session("app", "bob", "bad")
    root = s.append(Message(role="user", content="a"))
    s.branch("other")
    s.checkout("other")
    off = s.append(Message(role="user", content="off path"))
    s.checkout("main")
    s.append(Message(role="user", content="b"))
    head, before = s.head, sorted(store.storage.list(""))
    with pytest.raises(castore.RevisionNotFound):
        s.compact("x", keep_from=off)
    with pytest.raises(castore.RevisionNotFound):
        s.compact("x", keep_from="no-such-rev")
    assert s.head == head and sorted(store.storage.list("")) == before
    assert s.compact("ok", keep_from=root)


@pytest.mark.parametrize("kw", [{"max_tokens": -1}, {"max_messages": -3}, {"tool_output_limit": -1},
                                {"max_tokens": 1.5}, {"max_messages": True}])
def test_bad_budget_is_a_value_error(local_store, kw):
    s = local_store.session("app", "bob", "b")
    s.append(Message(role="user", content="a"))
    with pytest.raises(ValueError) as ei:
        s.context(**kw)
    assert isinstance(ei.value, castore.CastoreError)
    with pytest.raises(castore.InvalidEntry):
        project([], **kw)


# -- budgets -----------------------------------------------------------------------------
def _turns() -> list[LogEntry]:
    msgs = [Message(role="system", content="sys"), Message(role="user", content="u1" * 40),
            call("a"), result("a", "x" * 400), call("b"), result("b", "y" * 40), result("b", "z" * 40),
            Message(role="assistant", content="done"), Message(role="user", content="last question"),
            call("c"), result("c", "w" * 40)]
    return [le(m, i) for i, m in enumerate(msgs)]


def test_budget_drops_whole_tool_units_from_the_oldest_side():
    entries = _turns()
    full = project(entries)
    ctx = project(entries, max_tokens=full.tokens - 1)
    assert [m.role for m in ctx] == ["system", "assistant", "tool", "assistant", "tool", "tool", "assistant",
                                     "user", "assistant", "tool"]
    assert ctx.dropped == 1
    u1 = estimate_tokens(entries[1].entry)
    ctx = project(entries, max_tokens=full.tokens - u1 - 1)
    # then the call "a" goes together with its result
    assert [m.role for m in ctx] == ["system", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool"]
    assert ctx[1].tool_calls[0]["id"] == "b" and ctx.dropped == 3
    assert ctx.tokens <= full.tokens - u1 - 1


def test_budget_never_splits_a_call_from_its_results():
    entries = _turns()
    for budget in range(0, project(entries).tokens + 1, 7):
        ctx = project(entries, max_tokens=budget)
        for i, m in enumerate(ctx.messages):
            if m.role == "tool":
                j = i
                while ctx[j].role == "tool":
                    j -= 1
                assert ctx[j].tool_calls and ctx[j].tool_calls[0]["id"] == m.tool_call_id


def test_budget_keeps_system_and_latest_user_even_when_over():
    ctx = project(_turns(), max_tokens=0)
    assert [m.content for m in ctx] == ["sys", "last question"]
    assert ctx.tokens > 0 and ctx.dropped == 9
    ctx = project(_turns(), max_messages=4)
    assert [m.role for m in ctx] == ["system", "user", "assistant", "tool"]


def test_message_budget_counts_messages():
    ctx = project(_turns(), max_messages=6)
    assert len(ctx) <= 6 and ctx[0].role == "system" and ctx[-1].tool_call_id == "c"


def test_custom_token_counter_is_used():
    entries = _turns()
    ctx = project(entries, max_tokens=5, token_counter=lambda m: 1)
    assert ctx.tokens == 5 and len(ctx) == 5


# -- placeholders --------------------------------------------------------------------------
def test_large_tool_output_becomes_a_placeholder_naming_its_commit(local_store):
    s = local_store.session("app", "carol", "p")
    s.append(Message(role="user", content="go"))
    s.append(call("k"))
    big = s.append(result("k", "L" * 4000))
    s.append(Message(role="toolResult", content=[{"type": "text", "text": "small"}], extra={"toolCallId": "k2"}))
    pi_big = s.append(Message(role="toolResult", content=[{"type": "text", "text": "P" * 4000}],
                              extra={"toolCallId": "k3", "toolName": "read"}))
    ctx = s.context(tool_output_limit=100)
    assert ctx[2].tool_call_id == "k" and big in ctx[2].content and "L" not in ctx[2].content
    assert ctx[3].content == [{"type": "text", "text": "small"}]
    assert ctx[4].content[0]["type"] == "text" and pi_big in ctx[4].content[0]["text"]
    assert ctx[4].extra == {"toolCallId": "k3", "toolName": "read"}
    assert ctx.tokens < 200
    assert "L" * 4000 in [m.content for m in s.messages()]  # storage keeps the full text


def test_estimate_tokens_is_chars_over_four_plus_overhead():
    assert estimate_tokens(Message(role="user", content="abcd" * 10)) == 10 + MESSAGE_OVERHEAD
    assert estimate_tokens(Message(role="user", content="abcde")) == 2 + MESSAGE_OVERHEAD
    img = Message(role="user", content=[{"type": "image", "data": "x" * 100000, "mimeType": "image/png"}])
    assert estimate_tokens(img) < 2000


def test_model_follows_assistant_messages_like_pi():
    entries = [le(ModelChange(model="a", provider="pa", thinking_level="high"), 0),
               le(Message(role="assistant", content="x", extra={"model": "b", "provider": "pb"}), 1),
               le(Custom("c", 1), 2)]
    ctx = project(entries)
    assert (ctx.model, ctx.provider, ctx.thinking_level) == ("b", "pb", "high")
    assert [m.content for m in ctx] == ["x"]


def test_compaction_whose_first_kept_is_off_the_path_keeps_nothing_before_it():
    entries = [le(Message(role="user", content="old"), 0), le(Compaction("S", first_kept="f" * 64), 1),
               le(Message(role="user", content="new"), 2)]
    assert view(project(entries)) == [("user", summary_text("S")), ("user", "new")]


def test_empty_branch_summary_is_skipped():
    entries = [le(BranchSummary(""), 0), le(Message(role="user", content="a"), 1)]
    assert view(project(entries)) == [("user", "a")]


# -- reading cost ----------------------------------------------------------------------------
def test_context_after_compaction_reads_only_the_kept_part(tmp_path):
    url = f"memory://ctx-{uuid.uuid4().hex}"
    n, kept = 10_000, 20
    with castore.open(url) as st:
        s = st.session("app", "u", "big")
        batch: list[Message] = []
        for i in range(n - kept - 1):
            batch.append(Message(role="user" if i % 2 == 0 else "assistant", content=f"message {i} " + "x" * 200))
            if len(batch) == 500:
                s.append_many(batch)
                batch = []
        s.append_many(batch)
        keep = s.append(Message(role="user", content="kept"))
        s.append_many([Message(role="assistant", content=f"k{i}") for i in range(kept - 2)])  # < 64
        s.compact("summary", keep_from=keep)
    reads: list[str] = []
    with castore.open(url) as st:
        storage = st.objects.storage
        orig_read, orig_many = storage.read, storage.read_many

        def read(key: str) -> bytes:
            reads.append(key)
            return orig_read(key)

        def read_many(keys: Any) -> Any:
            keys = list(keys)
            reads.extend(keys)
            return orig_many(keys)

        storage.read, storage.read_many = read, read_many  # type: ignore[method-assign]
        s = st.session("app", "u", "big")
        ctx = s.context()
        objects = {k for k in reads if k.startswith("objects/")}  # read_many may call read: count keys once
        assert ctx == project(s.entries())
    assert len(ctx) == kept and ctx[0].content == summary_text("summary") and ctx[1].content == "kept"
    # compact() recorded the model settings, so the path is read backwards from the tip
    # (History.path_backwards) only until the first kept entry: the returned commits and
    # their bodies, the index, and at most one batch of segments - whatever the length.
    assert len(objects) <= 2 * kept + 8
    print(f"\ncontext of a {n}-entry session after a compaction: {len(objects)} objects read, "
          f"{len(ctx)} messages returned")


@pytest.mark.parametrize("back", [0, 63, 64, 65, 300, 998])
def test_context_read_backwards_equals_the_projection_of_the_whole_path(back: int) -> None:
    with castore.open(f"memory://ctx-{uuid.uuid4().hex}") as st:
        s = st.session("app", "u", "s")
        s.append(ModelChange(model="m1", provider="p", thinking_level="high"))
        s.append_many([Message(role="user" if i % 2 else "assistant", content=f"m{i}") for i in range(1000)])
        s.append(ModelChange(model="m2"))
        s.compact("older turns", keep_from=f"HEAD~{back}")
        s.append(Message(role="user", content="after"))
        whole = project(s.entries())
        ctx = st.session("app", "u", "s").context()
        assert ctx == whole
        assert (ctx.model, ctx.provider, ctx.thinking_level) == ("m2", None, "high")


# -- no orphan tool result at the start of a context ---------------------------------------------
def _readme_session(store: castore.Store) -> castore.Session:
    """The README's library example up to its compaction."""
    s = store.session("weather-app", "alice", "orphan")
    s.append(Message(role="user", content="Weather in Beijing?"))
    s.append_many([Message(role="assistant", tool_calls=[{"id": "c1", "name": "get_weather",
                                                          "arguments": {"city": "Beijing"}}]),
                   Message(role="tool", tool_call_id="c1", content='{"temp_c": 25}')])
    s.append(Event(author="assistant", message=Message(role="assistant", content="Sunny, 25°C")))
    return s


def test_readme_compaction_at_a_tool_result_keeps_its_call(local_store):
    s = _readme_session(local_store)
    call_id = s.resolve("HEAD~2")
    cid = s.compact("The user asked about Beijing.", keep_from="HEAD~1")
    comp = s.show(cid).entry
    assert comp.first_kept == call_id  # moved back from the tool result to its call
    assert comp.tokens_before == estimate_tokens(Message(role="user", content="Weather in Beijing?"))
    ctx = s.context()
    assert [m.role for m in ctx] == ["user", "assistant", "tool", "assistant"]
    assert ctx[1].tool_calls[0]["id"] == ctx[2].tool_call_id == "c1"
    assert ctx.commits[1] == call_id
    # the path read from the start gives the same context as the quick read from the tip
    assert s.context("main").messages == ctx.messages


def test_compaction_keep_from_a_label_before_a_result_snaps_to_the_call(local_store):
    s = local_store.session("app", "u", "label-between")
    s.append(Message(role="user", content="q"))
    c = s.append(call("k"))
    s.append(Custom("note", {"x": 1}))  # contributes no message
    s.append(result("k", "r"))
    s.append(Message(role="assistant", content="a"))
    s.compact("S", keep_from="HEAD~2")
    assert s.show("HEAD").entry.first_kept == c
    assert [m.role for m in s.context()] == ["user", "assistant", "tool", "assistant"]


def test_compaction_keep_from_a_plain_message_is_unchanged(local_store):
    s = _readme_session(local_store)
    last = s.head
    s.compact("S", keep_from="HEAD")
    assert s.show("HEAD").entry.first_kept == last


def test_a_stored_compaction_is_read_as_written_like_pi_reads_it():
    # only compactions castore makes are moved to the call; one stored at a result (by Pi's
    # file format, say) gives what Pi would send (see tests/test_pi.py)
    entries = [le(Message(role="user", content="q"), 0), le(call("k"), 1), le(result("k", "r"), 2),
               le(Message(role="assistant", content="a"), 3), le(Compaction("S", first_kept=f"{2:064x}"), 4)]
    assert view(project(entries)) == [("user", summary_text("S")), ("tool", "r"), ("assistant", "a")]


def test_keep_start_walks_back_over_results_to_the_call():
    from castore.context import keep_start

    entries = [le(Message(role="user", content="q"), 0), le(call("k"), 1), le(result("k", "r1"), 2),
               le(result("k", "r2"), 3), le(Message(role="user", content="u"), 4), le(result("z", "o"), 5)]
    assert [keep_start(entries, i) for i in range(6)] == [0, 1, 1, 1, 4, 5]
    with pytest.raises(IndexError):
        keep_start(entries, 6)


def test_budget_never_starts_the_context_with_an_orphan_tool_result():
    # an orphan result after a user message (no call before it) goes with that message
    msgs = [Message(role="system", content="sys"), Message(role="user", content="u1"), result("x", "o" * 80),
            call("b"), result("b", "r"), Message(role="user", content="last")]
    entries = [le(m, i) for i, m in enumerate(msgs)]
    for budget in range(0, project(entries).tokens + 1):
        ctx = project(entries, max_tokens=budget)
        rest = [m for m in ctx if m.role != "system"]
        assert not is_orphan_start(rest), (budget, view(ctx))
    for n in range(len(msgs) + 1):
        rest = [m for m in project(entries, max_messages=n) if m.role != "system"]
        assert not is_orphan_start(rest), n


def is_orphan_start(msgs: list[Message]) -> bool:
    return bool(msgs) and msgs[0].role == "tool"

