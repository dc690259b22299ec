"""CastoreSaver under a real compiled LangGraph graph, compared with LangGraph's InMemorySaver."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

import layout
from helpers.viewer import replayed_state
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

import castore
from castore.adapters.langgraph import CastoreSaver

THREAD = {"configurable": {"thread_id": "t1"}}


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: int
    verdict: str


def agent(state: State) -> dict[str, Any]:
    """A scripted model: replies to the last message (ids fixed, so runs compare)."""
    last = state["messages"][-1]
    n = state.get("turns", 0) + 1
    return {"messages": [AIMessage(content=f"reply {n} to {last.content}", id=f"ai-{n}-{last.id}")], "turns": n}


def review(state: State) -> dict[str, Any]:
    return {"verdict": interrupt({"question": "ok?", "turn": state["turns"]})}


def build() -> StateGraph:
    b = StateGraph(State)
    b.add_node(agent)
    b.add_node(review)
    b.add_edge(START, "agent")
    b.add_edge("agent", "review")
    b.add_edge("review", END)
    return b


def scenario(saver: Any) -> tuple[Any, dict[str, str]]:
    """Two turns with an interrupt each, a replay from the past and an update_state fork."""
    g = build().compile(checkpointer=saver)
    g.invoke({"messages": [HumanMessage("hello", id="h1")]}, THREAD)
    g.invoke(Command(resume="yes"), THREAD)
    g.invoke({"messages": [HumanMessage("again", id="h2")]}, THREAD)
    g.invoke(Command(resume="no"), THREAD)
    hist = list(g.get_state_history(THREAD))
    # replay from the checkpoint where the second turn's agent was about to run
    replay_from = next(h for h in hist if h.next == ("agent",) and h.metadata["step"] == 4)
    g.invoke(None, replay_from.config)
    g.invoke(Command(resume="maybe"), THREAD)
    # edit the state as it was while the first interrupt waited, and go on from there
    hist = list(g.get_state_history(THREAD))
    edit_at = next(h for h in hist if h.next == ("review",) and h.metadata["step"] == 1)
    forked = g.update_state(edit_at.config, {"messages": [HumanMessage("edited", id="h3")]})
    g.invoke(None, forked)
    g.invoke(Command(resume="late"), THREAD)
    ids = {"replayed": replay_from.config["configurable"]["checkpoint_id"],
           "edited": edit_at.config["configurable"]["checkpoint_id"]}
    return g, ids


def comparable(g: Any) -> list[tuple[Any, ...]]:
    """The thread's history without run-specific ids and times; parents as positions."""
    hist = list(g.get_state_history(THREAD))
    pos = {h.config["configurable"]["checkpoint_id"]: i for i, h in enumerate(hist)}
    out = []
    for h in hist:
        values = dict(h.values)
        values["messages"] = [(type(m).__name__, m.content, m.id) for m in values.get("messages", [])]
        meta = {k: v for k, v in h.metadata.items() if k != "run_id"}
        parent = h.parent_config["configurable"]["checkpoint_id"] if h.parent_config else None
        interrupts = [i.value for t in h.tasks for i in t.interrupts]
        out.append((values, h.next, meta, pos.get(parent), interrupts, [t.name for t in h.tasks]))
    return out


@pytest.fixture
def saver(local_store: castore.Store) -> CastoreSaver:
    return CastoreSaver(local_store)


def test_graph_history_matches_in_memory_saver_through_interrupts_replay_and_update(saver: CastoreSaver) -> None:
    g_mem, _ = scenario(InMemorySaver())
    g_cas, _ = scenario(saver)
    expected, got = comparable(g_mem), comparable(g_cas)
    assert len(got) == len(expected) >= 13
    assert got == expected
    assert g_cas.get_state(THREAD).values["verdict"] == "late"


def test_replay_and_update_state_forks_are_castore_branches(saver: CastoreSaver, local_store: castore.Store) -> None:
    _, ids = scenario(saver)
    session = local_store.session("langgraph", "default", "t1")
    branches = session.branches()
    forks = {name: tip for name, tip in branches.items() if name.startswith("main@")}
    assert "main" in branches and "writes" in branches and len(forks) == 2
    for cpid in ids.values():
        # each fork's first commit has the checkpoint it started from as its parent
        on_fork = [e for name in forks for e in session.log(name, limit=0)]
        fork_parents = {p for e in on_fork for p in e.parents}
        start = next(e for e in session.log(all_branches=True)
                     if e.kind == "checkpoint" and e.meta.get("checkpoint_id") == cpid)
        assert start.id in fork_parents
    main_path = {e.id for e in session.log("main", limit=0)}
    for tip in forks.values():
        assert tip not in main_path


def test_fork_shows_in_castore_log_graph(saver: CastoreSaver, local_store: castore.Store) -> None:
    from click.testing import CliRunner

    from castore.cli import main as cli

    scenario(saver)
    result = CliRunner().invoke(cli, ["--store", local_store.url, "-s", "langgraph/default/t1",
                                      "log", "--graph", "--all", "-n", "0", "--oneline"])
    assert result.exit_code == 0, result.output
    assert "/" in result.stdout and "main@" in result.stdout
    assert "checkpoint step -1 · input" in result.stdout
    assert "checkpoint step 1 · loop · agent → messages, turns" in result.stdout
    assert "checkpoint step 2 · update → messages" in result.stdout
    # the task writes are bookkeeping: on their own branch, shown only when asked
    assert "writes" not in result.stdout
    result = CliRunner().invoke(cli, ["--store", local_store.url, "-s", "langgraph/default/t1",
                                      "log", "--graph", "--all", "--internal", "-n", "0", "--oneline"])
    assert result.exit_code == 0, result.output
    assert "(writes) writes of review: resume, verdict" in result.stdout
    assert "writes of agent: messages, turns" in result.stdout


def test_async_graph_runs_on_the_async_methods(saver: CastoreSaver) -> None:
    async def run() -> tuple[Any, Any]:
        g = build().compile(checkpointer=saver)
        await g.ainvoke({"messages": [HumanMessage("hello", id="h1")]}, THREAD)
        await g.ainvoke(Command(resume="yes"), THREAD)
        return await g.aget_state(THREAD), [s async for s in g.aget_state_history(THREAD)]

    state, hist = asyncio.run(run())
    assert state.values["verdict"] == "yes" and len(hist) == 4
    assert [m.content for m in state.values["messages"]] == ["hello", "reply 1 to hello"]


def test_copy_thread_is_a_fork_that_writes_no_object(saver: CastoreSaver, local_store: castore.Store) -> None:
    g, _ = scenario(saver)
    before = sum(1 for _ in local_store.objects.iter_ids())
    saver.copy_thread("t1", "t2")
    assert sum(1 for _ in local_store.objects.iter_ids()) == before
    other = {"configurable": {"thread_id": "t2"}}
    assert [h.values for h in g.get_state_history(other)] == [h.values for h in g.get_state_history(THREAD)]
    g.invoke({"messages": [HumanMessage("only in t2", id="h9")]}, other)
    g.invoke(Command(resume="ok"), other)
    assert len(g.get_state(other).values["messages"]) == len(g.get_state(THREAD).values["messages"]) + 2


def test_prune_keep_latest_leaves_a_thread_that_runs_on(saver: CastoreSaver) -> None:
    g, _ = scenario(saver)
    latest = g.get_state(THREAD)
    saver.prune(["t1"], strategy="keep_latest")
    hist = list(g.get_state_history(THREAD))
    assert len(hist) == 1 and hist[0].values == latest.values
    g.invoke({"messages": [HumanMessage("after prune", id="h5")]}, THREAD)
    g.invoke(Command(resume="fine"), THREAD)
    state = g.get_state(THREAD).values
    assert state["messages"][-1].content == f"reply {latest.values['turns'] + 1} to after prune"
    assert state["messages"][:-2] == latest.values["messages"] and state["verdict"] == "fine"


def test_prune_rejects_an_unknown_strategy(saver: CastoreSaver) -> None:
    with pytest.raises(ValueError, match="unknown prune strategy"):
        saver.prune(["t1"], strategy="shrink")


def test_a_message_a_task_wrote_is_serialized_once_for_its_write_and_its_channel(local_store: castore.Store) -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    class Counting(JsonPlusSerializer):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[Any] = []

        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            self.seen.append(obj)
            return super().dumps_typed(obj)

    serde = Counting()
    saver = CastoreSaver(local_store, serde=serde)
    b = StateGraph(State)
    b.add_node(agent)
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    g = b.compile(checkpointer=saver)
    g.invoke({"messages": [HumanMessage("hello", id="h1")]}, THREAD)
    reply = g.get_state(THREAD).values["messages"][-1]
    assert reply.content == "reply 1 to hello"
    assert sum(1 for x in serde.seen if isinstance(x, AIMessage)) == 1
    cold = CastoreSaver(castore.open(local_store.url)).get_tuple(THREAD)
    assert cold is not None and cold.checkpoint["channel_values"]["messages"][-1] == reply
    assert cold.pending_writes == []


def test_a_second_saver_on_the_same_store_sees_the_thread(saver: CastoreSaver, local_store: castore.Store) -> None:
    g, _ = scenario(saver)
    other = castore.open(local_store.url)
    try:
        g2 = build().compile(checkpointer=CastoreSaver(other))
        assert comparable(g2) == comparable(g)
        g2.invoke({"messages": [HumanMessage("from another process", id="h7")]}, THREAD)
        g2.invoke(Command(resume="there"), THREAD)
        assert g.get_state(THREAD).values["verdict"] == "there"
    finally:
        other.close()


def test_messages_channel_costs_constant_bytes_per_step() -> None:
    # what a step writes, without the background repack (which shrinks the store meanwhile)
    store = castore.open(f"memory://lg-bytes-{os.getpid()}-{id(object())}", auto_repack=False)
    saver = CastoreSaver(store)
    b = StateGraph(State)
    b.add_node(agent)
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    g = b.compile(checkpointer=saver)
    text = "lorem ipsum dolor sit amet " * 18  # ~500 bytes per message

    def stored() -> int:
        return layout.stored_bytes(store)

    per_turn = {}
    for i in range(1, 201):
        before = stored() if i in (20, 200) else 0
        g.invoke({"messages": [HumanMessage(f"{i} {text}", id=f"h{i}")]}, THREAD)
        if i in (20, 200):
            per_turn[i] = stored() - before
    assert len(g.get_state(THREAD).values["messages"]) == 400
    assert 0 < per_turn[200] < 2 * per_turn[20], per_turn
    store.close()


def test_importing_castore_does_not_need_langgraph() -> None:
    code = ("import sys\n"
            "for m in ('langgraph', 'langchain_core'): sys.modules[m] = None\n"
            "import castore, castore.adapters\n"
            "try:\n    import castore.adapters.langgraph\nexcept ImportError:\n    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


# -- thin headers and writes -------------------------------------------------------------------
from castore.adapters.langgraph_header import (  # noqa: E402
    NotPlain,
    copy_header,
    decode_header,
    encode_header,
    is_plain,
    plain_copy,
)

BASE = {"v": 4, "id": "a", "ts": "2026-11-30T04:54:04.079819+00:00",
        "channel_versions": {"__start__": 2, "messages": 3, "old": 1},
        "versions_seen": {"__input__": {}, "agent": {"messages": 2}, "gone": {"x": 1}},
        "updated_channels": ["messages"]}


@pytest.mark.parametrize("header", [
    {**BASE, "id": "b", "ts": "2026-11-30T04:54:05.000001+00:00",
     "channel_versions": {"__start__": 2, "messages": 4, "new": 1},
     "versions_seen": {"__input__": {}, "agent": {"messages": 3}}, "updated_channels": None},
    {**BASE, "id": "b", "ts": "2026-11-30T04:54:05+00:00", "v": 5, "extra": {"k": [1, 2]}},
    {**BASE, "id": "b", "ts": "2026-11-30T04:54:05.123456+02:00"},
    {**BASE, "id": "b", "ts": "not a time"},
    {k: v for k, v in BASE.items() if k not in ("versions_seen", "updated_channels")} | {"id": "b"},
])
def test_a_header_rebuilds_exactly_from_its_difference_with_the_parent(header: dict[str, Any]) -> None:
    assert is_plain(header)
    stored = encode_header(header, BASE)
    assert decode_header(stored, BASE, "b") == header
    assert decode_header(encode_header(header, None), None, "b") == header


def test_a_header_difference_holds_only_what_changed() -> None:
    child = copy_header(BASE) | {"id": "b"}
    child["channel_versions"]["messages"] = 4
    stored = encode_header(child, BASE)
    assert stored == {"tsu": 1796014444079819, "cv": {"messages": 4}, "uc": ["messages"]}


def test_tuples_and_odd_keys_are_not_plain() -> None:
    assert not is_plain({"a": (1, 2)}) and not is_plain({1: "a"}) and not is_plain({"a": 1 << 70})
    assert is_plain({"a": [1, {"b": None, "c": 1.5, "d": True}]})


class _Name(str):
    """A str subclass: plain (msgpack stores it as a str)."""


@pytest.mark.parametrize("value", [
    BASE, {"a": [1, {"b": None, "c": 1.5, "d": True}]}, {"a": (1, 2)}, {1: "a"}, {"a": 1 << 70}, [[1 << 70]],
    {"a": [{"b": (1,)}]}, {"a": _Name("x"), "b": [_Name("y"), True, -(1 << 63)]}, "s", 3, None, (1,), {"a": object()},
])
def test_a_plain_copy_is_equal_new_and_refused_exactly_where_is_plain_fails(value: Any) -> None:
    if not is_plain(value):
        with pytest.raises(NotPlain):
            plain_copy(value)
        return
    got = plain_copy(value)
    assert got == value
    if isinstance(value, dict):
        assert got is not value and all(got[k] is not v for k, v in value.items() if isinstance(v, (dict, list)))


def test_the_writing_saver_returns_the_headers_a_cold_one_reads_even_when_the_caller_changes_its_own(
        local_store: castore.Store) -> None:
    saver = CastoreSaver(local_store)
    put = _put_chain(saver, 70)
    for cp, _ in put:  # the caller's dicts change after put: what was stored must not
        cp["channel_versions"]["messages"] = -1
        cp["versions_seen"]["agent"]["messages"] = -1
    cold = CastoreSaver(castore.open(local_store.url))
    config = {"configurable": {"thread_id": "chain"}}
    mine = [{k: v for k, v in t.checkpoint.items() if k != "channel_values"} for t in saver.list(config)]
    theirs = [{k: v for k, v in t.checkpoint.items() if k != "channel_values"} for t in cold.list(config)]
    assert mine == theirs and len(mine) == 70
    assert all(h["channel_versions"]["messages"] > 0 for h in mine)


def _put_chain(saver: CastoreSaver, n: int, thread: str = "chain") -> list[tuple[dict, dict]]:
    """Put ``n`` checkpoints straight through the saver API; return (checkpoint, metadata) pairs."""
    from langgraph.checkpoint.base import empty_checkpoint

    out, config = [], {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    for i in range(n):
        cp = empty_checkpoint()
        cp["channel_versions"] = {"messages": i + 1, "turn": (i // 3) + 1}
        cp["versions_seen"] = {"agent": {"messages": i}} if i % 2 else {"agent": {"messages": i}, "x": {"y": 1}}
        cp["channel_values"] = {"turn": i // 3, "messages": [f"m{j}" for j in range(i + 1)]}
        cp["updated_channels"] = ["messages"]
        md = {"source": "loop", "step": i, "parents": {}, "note": ("tuple", i) if i == 70 else f"n{i}"}
        config = saver.put(config, cp, md, {"messages": i + 1} | ({"turn": (i // 3) + 1} if i % 3 == 0 else {}))
        out.append((cp, md))
    return out


def test_checkpoint_headers_read_back_exactly_past_many_full_headers(local_store: castore.Store) -> None:
    saver = CastoreSaver(local_store)
    put = _put_chain(saver, 140)
    cold = CastoreSaver(castore.open(local_store.url))
    listed = list(cold.list({"configurable": {"thread_id": "chain"}}))
    assert len(listed) == 140
    for tup, (cp, md) in zip(reversed(listed), put, strict=True):
        want = {k: v for k, v in cp.items() if k != "channel_values"}
        got = {k: v for k, v in tup.checkpoint.items() if k != "channel_values"}
        assert got == want
        assert tup.checkpoint["channel_values"] == cp["channel_values"]
        assert tup.metadata == saver.serde.loads_typed(saver.serde.dumps_typed(md))  # as InMemorySaver does


def test_a_header_that_is_not_plain_data_goes_through_the_serializer(local_store: castore.Store) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    saver = CastoreSaver(local_store)
    cp = empty_checkpoint()
    cp["channel_versions"] = {"a": "00000000000000000000000000000001.0.5"}
    cp["versions_seen"] = {"n": {"a": "00000000000000000000000000000001.0.5"}}
    cp["extra"] = {"a", "b"}  # type: ignore[typeddict-unknown-key]
    cfg = saver.put({"configurable": {"thread_id": "odd", "checkpoint_ns": ""}}, cp, {"step": 1}, {"a": "x"})
    got = CastoreSaver(castore.open(local_store.url)).get_tuple(cfg)
    assert got is not None and got.checkpoint["extra"] == {"a", "b"} and got.metadata == {"step": 1}


def test_returned_headers_are_copies_callers_may_change(saver: CastoreSaver) -> None:
    _put_chain(saver, 3, "copies")
    cfg = {"configurable": {"thread_id": "copies"}}
    first = saver.get_tuple(cfg)
    assert first is not None
    first.checkpoint["versions_seen"]["agent"]["messages"] = -1
    first.checkpoint["channel_versions"]["messages"] = -1
    first.metadata["step"] = -1
    again = saver.get_tuple(cfg)
    assert again is not None and again.checkpoint["versions_seen"]["agent"]["messages"] == 2
    assert again.checkpoint["channel_versions"]["messages"] == 3 and again.metadata["step"] == 2


def test_small_writes_live_in_the_commit_and_written_lists_share_the_channel_objects(
        saver: CastoreSaver, local_store: castore.Store) -> None:
    cfg = {"configurable": {"thread_id": "w", "checkpoint_ns": "", "checkpoint_id": "cp-1"}}
    msg = AIMessage("a long enough message " * 20, id="m1")
    saver.put_writes(cfg, [("turn", 3), ("flag", None)], "task-a")
    objs = saver.store.objects  # the threads' store (their tenant's, in the tenant layout)
    before = set(objs.iter_ids())
    saver.put_writes(cfg, [("messages", [msg, "short"])], "task-b", "path-b")
    added = set(objs.iter_ids()) - before
    kinds = sorted(type(objs.get(i)).__name__ for i in added)
    # one commit, one tree naming the elements, one value for the long message (no list root)
    assert kinds[:3] == ["Commit", "Tree", "Value"], kinds
    view = CastoreSaver(castore.open(local_store.url))._refresh("w")
    writes = saver._writes_of(view, "", "cp-1")
    assert [(t, c, v) for t, _, c, v, _ in writes] == [
        ("task-a", "turn", 3), ("task-a", "flag", None), ("task-b", "messages", [msg, "short"])]
    assert [p for *_, p in writes] == ["", "", "path-b"]


def _values(store: castore.Store) -> Any:
    from castore.adapters.langgraph_values import ChannelValues

    return ChannelValues(store, CastoreSaver(store).serde)


def _put(store: castore.Store, pending: dict[str, bytes]) -> None:
    store.objects.put_encoded(pending.items())
    pending.clear()


def test_persistent_lists_read_back_through_appends_edits_and_truncations(local_store: castore.Store) -> None:
    import random

    vals, rng = _values(local_store), random.Random(7)
    pending: dict[str, bytes] = {}
    items: list[Any] = []
    root = None
    for step in range(300):
        op = rng.random()
        if op < 0.8 or not items:
            items = items + [f"m{step} " + "x" * rng.choice((3, 200))]
        elif op < 0.9:
            items = items[:rng.randrange(len(items))]
        else:
            j = rng.randrange(len(items))
            items = items[:j] + [f"edit {step}"] + items[j + 1:]
        if not items:
            continue
        root = vals.store_list(pending, items, root.hex() if root else None)
        _put(local_store, pending)
        assert _values(castore.open(local_store.url)).read_list(root) == items, step


def test_a_stored_list_reads_back_from_its_writer_equal_and_with_its_mutable_elements_fresh(
        local_store: castore.Store) -> None:
    vals = _values(local_store)
    pending: dict[str, bytes] = {}
    texts = [f"m{i} " + "x" * 200 for i in range(20)]
    root = vals.store_list(pending, texts, None)
    mixed = texts + [{"tool": "weather", "args": {"city": "Beijing"}}]
    grown = vals.store_list(pending, mixed, root.hex())
    _put(local_store, pending)
    assert vals.read_list(root) == texts
    got = vals.read_list(grown)
    assert got == mixed and got is not mixed
    mixed[-1]["args"]["city"] = "Paris"  # the caller's dict: what was stored does not follow it
    assert vals.read_list(grown)[-1] == {"tool": "weather", "args": {"city": "Beijing"}}


def test_lists_stored_in_the_first_layout_still_read_and_grow(local_store: castore.Store) -> None:
    vals = _values(local_store)
    pending: dict[str, bytes] = {}
    items = [f"message {i} " + "y" * 120 for i in range(75)]
    state = vals.list_state(vals.store_list(pending, items, None).hex())
    old_root = vals._blocks_tree(pending, state.tops, len(items))
    _put(local_store, pending)
    fresh = _values(castore.open(local_store.url))
    assert fresh.read_list(old_root) == items
    grown = fresh.store_list(pending, items + ["one more"], old_root.hex())
    _put(local_store, pending)
    assert _values(castore.open(local_store.url)).read_list(grown) == items + ["one more"]


# -- reading a thread in the CLI and the viewer ------------------------------------------------------
def _cli(store: castore.Store, *args: str) -> Any:
    from click.testing import CliRunner

    from castore.cli import main as cli

    result = CliRunner().invoke(cli, ["--store", store.url, "-s", "langgraph/default/t1", *args])
    assert result.exit_code == 0, result.output
    return result


def test_state_shows_decoded_channel_values(saver: CastoreSaver, local_store: castore.Store) -> None:
    import json

    g, _ = scenario(saver)
    doc = json.loads(_cli(local_store, "state").stdout)
    assert doc == {"messages": [{"type": "human", "content": "hello", "id": "h1"},
                                {"type": "ai", "content": "reply 1 to hello", "id": "ai-1-h1"},
                                {"type": "human", "content": "edited", "id": "h3"}],
                   "turns": 1, "verdict": "late"}
    assert [m["content"] for m in doc["messages"]] == [m.content for m in g.get_state(THREAD).values["messages"]]
    assert json.loads(_cli(local_store, "state", "HEAD", "verdict").stdout) == "late"
    # time travel: the input checkpoint of the first turn holds only the input, on __start__
    root = local_store.session("langgraph", "default", "t1").log("HEAD", limit=0)[-1]
    assert json.loads(_cli(local_store, "state", root.id).stdout) == {
        "__start__": {"messages": [{"type": "human", "content": "hello", "id": "h1"}]}}


def test_state_without_langgraph_says_what_the_values_are(saver: CastoreSaver, local_store: castore.Store,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    scenario(saver)
    monkeypatch.setitem(sys.modules, "langgraph.checkpoint.serde.jsonplus", None)  # import fails
    doc = json.loads(_cli(local_store, "state").stdout)
    assert doc == {"messages": "<list of 3 serialized values: install langgraph to decode>",
                   "turns": "<msgpack value, 1 byte: install langgraph to decode>",
                   "verdict": "<msgpack value, 5 bytes: install langgraph to decode>"}


def test_show_and_log_name_the_step_node_and_updated_values(saver: CastoreSaver, local_store: castore.Store) -> None:
    scenario(saver)
    out = _cli(local_store, "show", "HEAD").stdout
    assert "[LangGraph checkpoint step 3 · loop · review → verdict]" in out
    assert 'Values:  verdict = "late"' in out
    out = _cli(local_store, "log", "-n", "0", "--oneline").stdout
    assert "checkpoint step 0 · loop · __start__ → messages" in out and "by loop" not in out


def test_branch_and_log_hide_the_writes_branch_unless_asked(saver: CastoreSaver, local_store: castore.Store) -> None:
    import json

    scenario(saver)
    listed = json.loads(_cli(local_store, "branch", "--json").stdout)["branches"]
    assert "writes" not in {b["name"] for b in listed} and len(listed) == 3
    listed = json.loads(_cli(local_store, "branch", "--json", "--internal").stdout)["branches"]
    assert "writes" in {b["name"] for b in listed}
    # each fork says where it came from: the replay from step 4 and the update at step 1
    s = local_store.session("langgraph", "default", "t1")
    at = {e.meta["lg"]["mp"]["step"]: e.id[:8] for e in s.log("main", limit=0) if e.meta["lg"]["mp"]["step"] in (1, 4)}
    lines = _cli(local_store, "branch").stdout.splitlines()
    assert len(lines) == 3 and not any("writes" in line for line in lines)
    assert lines[0].split()[0] == "main" and lines[0].endswith("step 6 · loop · review → verdict")
    assert lines[1].endswith(f"step 7 · loop · review → verdict; forked from {at[4]} at step 4")
    assert lines[2].startswith("* main@") and lines[2].endswith(f"; forked from {at[1]} at step 1")
    commits = json.loads(_cli(local_store, "log", "--all", "-n", "0", "--json").stdout)["commits"]
    assert commits and {c["kind"] for c in commits} == {"checkpoint"}
    assert all("writes" not in c["refs"]["branches"] for c in commits)
    assert len(json.loads(_cli(local_store, "log", "--all", "-n", "5", "--json").stdout)["commits"]) == 5
    every = json.loads(_cli(local_store, "log", "--all", "--internal", "-n", "0", "--json").stdout)["commits"]
    assert {c["kind"] for c in every} == {"checkpoint", "writes"}


def test_a_branch_named_writes_in_another_session_is_not_hidden(local_store: castore.Store) -> None:
    from castore.adapters.langgraph_view import internal_branches

    s = local_store.session("app", "u", "plain")
    s.append(castore.Message(role="user", content="hi"))
    s.branch("writes")
    assert internal_branches(s) == set()


def test_viewer_model_shows_decoded_checkpoints_without_the_writes(saver: CastoreSaver,
                                                                    local_store: castore.Store) -> None:
    import json

    from castore.adapters.langgraph_view import state_at
    from castore.html import build_model

    scenario(saver)
    s = local_store.session("langgraph", "default", "t1")
    model = build_model(s)
    nodes = model["nodes"]
    assert {n["k"] for n in nodes} == {"checkpoint"} and "writes" not in model["refs"]["branches"]
    assert len(nodes) == len(list(saver.list(THREAD)))
    for i, n in enumerate(nodes):
        assert replayed_state(nodes, i) == state_at(s, n["id"]), n["e"]["summary"]
    head = nodes[model["refs"]["head"]]
    assert head["e"]["summary"] == "step 3 · loop · review → verdict" and head["d"] == {"verdict": "late"}
    # each message is embedded once, however many checkpoints hold it
    assert json.dumps(model).count('"reply 1 to hello"') == 1
    every = build_model(s, internal=True)
    assert {n["k"] for n in every["nodes"]} == {"checkpoint", "writes"} and "writes" in every["refs"]["branches"]


def test_viewer_script_rebuilds_each_checkpoints_decoded_state(saver: CastoreSaver, local_store: castore.Store,
                                                               tmp_path: Any) -> None:
    """The page's own stateAt and summary functions, run by Node on the embedded data."""
    import json
    import re
    import shutil

    from castore.adapters.langgraph_view import state_at
    from castore.html import build_model
    from castore.html.assets import JS

    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    scenario(saver)
    s = local_store.session("langgraph", "default", "t1")
    model = build_model(s)
    wanted = ["contentText", "callName", "callArgs", "messageSummary", "summary", "pathTo", "stateAt"]
    funcs = [re.search(rf"^function {f}\(.*?^}}$", JS, re.M | re.S).group(0) for f in wanted]
    consts = re.findall(r"^const (?:CALLS|TOOLROLES) = .*$", JS, re.M)
    script = tmp_path / "run.js"
    script.write_text("\n".join([f"const N = {json.dumps(model['nodes'])};", *consts, *funcs,
                                 "console.log(JSON.stringify(N.map((x, i) => [stateAt(i), summary(x)])));"]))
    out = json.loads(subprocess.run([node, str(script)], capture_output=True, text=True, check=True).stdout)
    for (state, text), n in zip(out, model["nodes"], strict=True):
        assert state == state_at(s, n["id"])
        assert text == "checkpoint " + n["e"]["summary"]


def test_diff_compares_decoded_channel_values(saver: CastoreSaver, local_store: castore.Store) -> None:
    import json

    scenario(saver)
    d = json.loads(_cli(local_store, "diff", "main", "HEAD", "--json").stdout)
    assert d["changed"]["verdict"] == ["no", "late"] and d["changed"]["turns"] == [2, 1]
    old, new = d["changed"]["messages"]
    assert [m["content"] for m in old][-1] == "reply 2 to again" and new[-1]["content"] == "edited"
    assert d["added"] == {} and d["removed"] == {}
    assert all(c["kind"] == "checkpoint" for c in d["entries1"] + d["entries2"])


def test_export_html_leaves_the_writes_out_unless_internal(saver: CastoreSaver, local_store: castore.Store,
                                                           tmp_path: Any) -> None:
    scenario(saver)
    plain, full = tmp_path / "t.html", tmp_path / "t-internal.html"
    _cli(local_store, "export", "html", "-o", str(plain))
    _cli(local_store, "export", "html", "--internal", "-o", str(full))
    assert '"k":"writes"' not in plain.read_text() and '"k":"checkpoint"' in plain.read_text()
    assert '"k":"writes"' in full.read_text()


def test_show_of_a_task_writes_commit_decodes_what_it_wrote(saver: CastoreSaver, local_store: castore.Store) -> None:
    from castore.adapters.langgraph_view import writes_at

    scenario(saver)
    s = local_store.session("langgraph", "default", "t1")
    writes = [e for e in s.log("writes", limit=0) if e.kind == "writes"]
    agent_write = next(e for e in writes if e.author.endswith(", agent"))
    got = dict(writes_at(s, agent_write.id))
    assert got["messages"][0]["type"] == "ai" and got["messages"][0]["content"].startswith("reply ")
    interrupt = next(e for e in writes if [w[1] for w in e.meta["w"]] == ["__interrupt__"])
    (channel, value), = writes_at(s, interrupt.id)
    assert channel == "__interrupt__" and value[0]["value"]["question"] == "ok?"
    assert writes_at(s, "HEAD") is None  # a checkpoint is not a writes commit
    out = _cli(local_store, "show", agent_write.id).stdout
    assert "[LangGraph writes of agent: messages, turns]" in out and "Writes:  messages = [" in out


def test_viewer_model_of_a_rewritten_message_list_carries_the_whole_list(saver: CastoreSaver,
                                                                         local_store: castore.Store) -> None:
    from castore.adapters.langgraph_view import state_at
    from castore.html import build_model

    g = build().compile(checkpointer=saver)
    g.invoke({"messages": [HumanMessage("hello", id="h1")]}, THREAD)
    # add_messages replaces a message with the same id: the list is rewritten, not grown
    g.update_state(THREAD, {"messages": [AIMessage(content="rewritten", id="ai-1-h1")]})
    s = local_store.session("langgraph", "default", "t1")
    nodes = build_model(s)["nodes"]
    last = nodes[-1]
    assert "x" not in last and [m["content"] for m in last["d"]["messages"]] == ["hello", "rewritten"]
    grown = [n for n in nodes if "messages" in n.get("x", {})]
    assert grown and all(len(n["x"]["messages"]) == 1 for n in grown)  # each turn adds one message
    for i, n in enumerate(nodes):
        assert replayed_state(nodes, i) == state_at(s, n["id"])
