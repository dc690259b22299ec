"""castore as an OpenAI Agents SDK session.

The protocol's behaviour is checked against the SDK's own ``SQLiteSession`` on the same
sequences of calls (fixed ones and Hypothesis-generated ones), then a real ``Runner`` with a
scripted model (no network) runs on castore and on SQLite and must produce the same history.
"""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.memory import SQLiteSession
from agents.memory.session import Session as SessionProtocol
from agents.memory.session_settings import SessionSettings
from agents.models.interface import Model
from agents.usage import Usage
from conftest import backend_on
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import castore
from castore.adapters.openai_agents import CLEARED, CastoreSession

set_tracing_disabled(True)


backend = backend_on("local", "s3")  # each test's store: on local disk, then on the loopback S3 server


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# Items of every shape the SDK stores: chat messages, output messages, tool calls and outputs.
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "system", "content": "Be brief."},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}",
     "id": "fc_1", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "22C"},
    {"role": "user", "content": [{"type": "input_text", "text": "and tomorrow?"},
                                 {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
    {"role": "user", "content": None, "name": "odd"},
]


async def apply(session: Any, op: tuple[Any, ...]) -> Any:
    """Run one protocol call and return what the caller sees."""
    name, arg = op
    if name == "add":
        await session.add_items(copy.deepcopy(arg))
        return await session.get_items()
    if name == "get":
        return await session.get_items(arg) if arg != "default" else await session.get_items()
    if name == "pop":
        return await session.pop_item(), await session.get_items()
    if name == "clear":
        await session.clear_session()
        return await session.get_items()
    raise AssertionError(name)


async def compare(store: castore.Store, ops: list[tuple[Any, ...]]) -> CastoreSession:
    sid = f"conv-{uuid.uuid4().hex[:8]}"
    ref = SQLiteSession(sid)
    mine = CastoreSession(sid, store)
    try:
        for i, op in enumerate(ops):
            want, got = await apply(ref, op), await apply(mine, op)
            assert got == want, f"step {i} {op}: castore {got!r} != sqlite {want!r}"
    finally:
        ref.close()
    return mine


# -- the protocol against SQLiteSession ----------------------------------------------------------------
def test_castore_session_satisfies_the_sdk_protocol(store: castore.Store) -> None:
    assert isinstance(CastoreSession("x", store), SessionProtocol)


def test_scripted_sequence_matches_sqlite_session(store: castore.Store) -> None:
    ops: list[tuple[Any, ...]] = [
        ("get", "default"), ("pop", None), ("clear", None),
        ("add", ITEMS[:3]), ("add", ITEMS[3:5]), ("add", []),
        *[("get", n) for n in (None, 0, 1, 2, 4, 50, -1)],
        ("pop", None), ("pop", None), ("get", 2),
        ("add", ITEMS[5:]), ("get", 3),
        ("clear", None), ("get", 1), ("pop", None),
        ("add", ITEMS[:1]), ("pop", None), ("pop", None),
        ("add", ITEMS[1:4]), ("pop", None), ("pop", None), ("pop", None), ("pop", None), ("get", None),
        ("add", ITEMS[4:6]), ("get", None),
    ]
    run(compare(store, ops))


op_strategy = st.one_of(
    st.tuples(st.just("add"), st.lists(st.sampled_from(ITEMS), max_size=3)),
    st.tuples(st.just("get"), st.sampled_from([None, "default", 0, 1, 2, 3, -1])),
    st.tuples(st.just("pop"), st.none()),
    st.tuples(st.just("clear"), st.none()),
)


# Local only: the backends are covered by the scripted sequence; this one explores call orders.
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op_strategy, max_size=14))
def test_random_call_sequences_match_sqlite_session(local_store: castore.Store, ops: list[tuple[Any, ...]]) -> None:
    run(compare(local_store, ops))


def test_session_settings_limit_is_the_default_limit(store: castore.Store) -> None:
    async def go() -> None:
        s = CastoreSession("lim", store, session_settings=SessionSettings(limit=2))
        await s.add_items(ITEMS[:5])
        assert await s.get_items() == ITEMS[3:5]
        assert await s.get_items(limit=4) == ITEMS[1:5]
        assert await CastoreSession("lim", store, session_settings={"limit": 1}).get_items() == ITEMS[4:5]

    run(go())


def test_reading_a_store_that_does_not_exist_yet_sees_an_empty_session(tmp_path: Any) -> None:
    s = CastoreSession("new", str(tmp_path / "none"))
    assert run(s.get_items()) == [] and run(s.pop_item()) is None
    run(s.clear_session())
    assert not castore.open(str(tmp_path / "none")).exists
    s.close()


def test_bad_item_writes_nothing(store: castore.Store) -> None:
    s = CastoreSession("bad", store)
    run(s.add_items(ITEMS[:1]))
    with pytest.raises(TypeError):
        run(s.add_items([ITEMS[1], {"role": "user", "content": object()}]))
    assert run(s.get_items()) == ITEMS[:1]


# -- what castore adds: nothing is lost, branches ----------------------------------------------------------
def test_pop_keeps_the_popped_item_on_the_branch_it_left(store: castore.Store) -> None:
    async def go() -> None:
        s = CastoreSession("pop", store)
        await s.add_items(ITEMS[:3])
        assert await s.pop_item() == ITEMS[2]
        assert await s.pop_item() == ITEMS[1]
        assert await s.get_items() == ITEMS[:1]
        cs = s.castore
        assert cs.current_branch is None  # the leaf moved back: HEAD is detached
        assert [m.to_dict() for m in cs.messages("main")] == ITEMS[:3]
        assert cs.labels() == {}  # main holds the popped items: no label needed
        await s.add_items([ITEMS[4]])  # editing the conversation starts a branch
        assert await s.get_items() == [ITEMS[0], ITEMS[4]]
        assert len(cs.branches()) == 2 and cs.current_branch != "main"
        assert [m.to_dict() for m in cs.messages("main")] == ITEMS[:3]

    run(go())


def test_pop_on_a_detached_leaf_labels_an_item_no_branch_holds(store: castore.Store) -> None:
    async def go() -> None:
        s = CastoreSession("orphan", store)
        await s.add_items(ITEMS[:2])
        cs = s.castore
        cs.checkout("HEAD~1")  # detach on the first item ...
        tip = cs.append(castore.Message(role="user", content="only HEAD holds me"))
        cs.checkout(tip)  # appending from a detached HEAD started a branch; detach on its tip
        cs.delete_branch(next(b for b in cs.branches() if b != "main"), force=True)
        assert await s.pop_item() == {"role": "user", "content": "only HEAD holds me"}
        assert cs.labels() == {f"popped-{tip[:12]}": tip}

    run(go())


def test_pop_of_a_root_item_hides_it_behind_a_marker(store: castore.Store) -> None:
    async def go() -> None:
        s = CastoreSession("foreign", store)
        root = s.castore.append(castore.Message(role="user", content="written by another tool"))
        assert await s.pop_item() == {"role": "user", "content": "written by another tool"}
        assert await s.get_items() == [] and await s.pop_item() is None
        assert s.castore.log()[-1].id == root

    run(go())


def test_clear_starts_an_empty_branch_and_keeps_the_history(store: castore.Store) -> None:
    async def go() -> None:
        s = CastoreSession("clear", store)
        await s.add_items(ITEMS[:4])
        before = s.castore.head
        await s.clear_session()
        assert await s.get_items() == [] and await s.get_items(2) == []
        cs = s.castore
        branch = cs.current_branch
        assert branch is not None and branch.startswith("cleared-") and cs.branches()["main"] == before
        assert cs.show("HEAD").entry == castore.Custom(CLEARED) and cs.show("HEAD~1").id == before
        await s.add_items(ITEMS[4:5])
        assert await s.get_items() == ITEMS[4:5]
        cs.checkout("main")  # the old conversation is still there
        assert await s.get_items() == ITEMS[:4]
        assert cs.verify()["commits"] == 5  # the start marker and four items

    run(go())


def test_one_add_items_call_lands_as_one_turn(store: castore.Store) -> None:
    async def go() -> None:
        a = CastoreSession("turns", store)
        b = CastoreSession("turns", store)  # a second writer on the same conversation
        await asyncio.gather(*(x.add_items(ITEMS[i:i + 3]) for i, x in enumerate([a, b, a, b])))
        got = await a.get_items()
        assert len(got) == 12
        turns = [json.dumps(got[i:i + 3], sort_keys=True) for i in range(0, 12, 3)]
        assert sorted(turns) == sorted(json.dumps(ITEMS[i:i + 3], sort_keys=True) for i in range(4))

    run(go())


# -- a real Runner with a scripted model -----------------------------------------------------------------------
class ScriptedModel(Model):
    """Returns its outputs in order; records the input it was given each time."""

    def __init__(self, outputs: list[Any]) -> None:
        self.outputs = list(outputs)
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,  # noqa: A002
                           output_schema: Any, handoffs: Any, tracing: Any, **kw: Any) -> ModelResponse:
        self.inputs.append(copy.deepcopy(input))
        return ModelResponse(output=[self.outputs.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError


def _text(n: int, text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{n}", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


def make_agent() -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel([
        ResponseFunctionToolCall(id="fc_1", call_id="call_1", type="function_call", name="get_weather",
                                 arguments="{\"city\": \"Paris\"}", status="completed"),
        _text(1, "It is sunny in Paris."),
        _text(2, "You asked about Paris."),
    ])
    return Agent(name="assistant", instructions="Be brief.", model=model, tools=[get_weather]), model


async def converse(session: Any) -> tuple[list[str], ScriptedModel]:
    agent, model = make_agent()
    first = await Runner.run(agent, "Weather in Paris?", session=session)
    second = await Runner.run(agent, "What did I ask?", session=session)
    return [first.final_output, second.final_output], model


def test_runner_on_castore_keeps_the_same_history_as_on_sqlite(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy-no-network")
    ref = SQLiteSession("conv")
    want_out, want_model = run(converse(ref))
    mine = CastoreSession("conv", store)
    got_out, got_model = run(converse(mine))
    assert got_out == want_out == ["It is sunny in Paris.", "You asked about Paris."]
    assert got_model.inputs == want_model.inputs  # the model saw the same history
    assert "Weather in Paris?" in str(got_model.inputs[-1])
    items = run(mine.get_items())
    assert items == run(ref.get_items()) and len(items) == 6
    ref.close()
    # Undo the last exchange the castore way and ask again on a new branch.
    assert run(mine.pop_item())["content"][0]["text"] == "You asked about Paris."
    assert run(mine.pop_item()) == {"role": "user", "content": "What did I ask?"}
    agent, model = make_agent()
    model.outputs = [_text(3, "Try Rome.")]
    assert run(Runner.run(agent, "Somewhere else?", session=mine)).final_output == "Try Rome."
    assert "What did I ask?" not in str(model.inputs[0])
    cs = mine.castore
    assert len(cs.branches()) == 2 and len(cs.messages("main")) == 4  # main still has the old turn


# -- session settings given as a dict, as the SDK's SQLiteSession takes them ------------------------------------
def test_dict_settings_become_sdk_settings_like_sqlite_session(store: castore.Store) -> None:
    mine = CastoreSession("dict", store, session_settings={"limit": 2})
    ref = SQLiteSession("dict", session_settings={"limit": 2})
    assert type(mine.session_settings) is type(ref.session_settings) is SessionSettings
    assert mine.session_settings == ref.session_settings == SessionSettings(limit=2)
    ref.close()
    ref = SQLiteSession("none")
    assert CastoreSession("none", store).session_settings == ref.session_settings == SessionSettings()
    ref.close()


def test_unknown_or_wrong_settings_raise_type_error_like_the_sdk(store: castore.Store) -> None:
    for bad in ({"limit": 2, "lmit": 3}, ["limit", 2], 2):
        with pytest.raises(TypeError) as want:
            SQLiteSession("bad", session_settings=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError) as got:
            CastoreSession("bad", store, session_settings=bad)
        assert str(got.value) == str(want.value)


def test_runner_with_dict_settings_sees_the_same_history_as_on_sqlite(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy-no-network")
    ref = SQLiteSession("limited", session_settings={"limit": 2})
    want_out, want_model = run(converse(ref))
    ref.close()
    got_out, got_model = run(converse(CastoreSession("limited", store, session_settings={"limit": 2})))
    assert got_out == want_out
    assert got_model.inputs == want_model.inputs  # the limit of 2 items applied the same way
    assert len(got_model.inputs[-1]) < 6


def test_settings_without_the_sdk_keep_its_rules() -> None:
    from castore.adapters.openai_agents import _Settings

    assert _Settings.coerce({"limit": 3}).limit == 3
    assert _Settings.coerce({}).limit is None
    with pytest.raises(TypeError, match="Unknown session settings: lmit"):
        _Settings.coerce({"lmit": 3})
    with pytest.raises(TypeError, match="got list"):
        _Settings.coerce(["limit"])


# -- usage: the SDK's per-response usage, recorded by hooks, counted by `castore usage` -------------------------
class MeteredModel(ScriptedModel):
    """A scripted model whose responses carry usage and a response id, as the Responses API gives them."""

    model = "gpt-4.1"

    async def get_response(self, *args: Any, **kw: Any) -> ModelResponse:
        out = await super().get_response(*args, **kw)
        k = len(self.inputs)
        from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

        usage = Usage(requests=1, input_tokens=1000 * k, output_tokens=10 * k, total_tokens=1010 * k,
                      input_tokens_details=InputTokensDetails(cached_tokens=400 * k, cache_write_tokens=0),
                      output_tokens_details=OutputTokensDetails(reasoning_tokens=0))
        return ModelResponse(output=out.output, usage=usage, response_id=f"resp_{k}_{uuid.uuid4().hex[:6]}")


def test_usage_hooks_record_each_response_and_castore_usage_counts_them_once(
    store: castore.Store, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from castore.usage import Tokens, usage

    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy-no-network")
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(tmp_path / "usage-cache.json"))
    agent, scripted = make_agent()
    model = MeteredModel(scripted.outputs)
    agent = agent.clone(model=model)
    mine = CastoreSession("metered", store)
    ref = SQLiteSession("metered")
    results = []
    for s in (mine, ref):
        model.outputs, model.inputs = list(scripted.outputs), []
        hooks = s.usage_hooks() if s is mine else None
        results.append([run(Runner.run(agent, q, session=s, hooks=hooks))
                        for q in ("Weather in Paris?", "What did I ask?")])
    assert run(mine.get_items()) == run(ref.get_items())  # the usage commits are no items
    ref.close()
    responses = [r for res in results[0] for r in res.raw_responses]
    assert len(responses) == 3  # the tool call, the answer, the second answer
    want = Tokens()
    for r in responses:
        cached = r.usage.input_tokens_details.cached_tokens
        want.add(Tokens(r.usage.input_tokens - cached, r.usage.output_tokens, cached, 0))
    rep = usage(store, by="model", cache=False)
    assert (rep.total.responses, rep.total.tokens) == (3, want)
    assert [g.name for g in rep.groups] == ["gpt-4.1"] and rep.total.cost > 0
    # the same responses recorded again (from the finished runs), and a fork: each still counts once
    for res in results[0]:
        run(mine.record_usage(res))
    mine.castore.fork("metered-fork")
    assert (lambda r: (r.total.responses, r.total.tokens))(usage(store, cache=False)) == (3, want)
