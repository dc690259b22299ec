"""castore as a Google ADK session service.

First a conformance run modelled on ADK's own session-service contract tests (create, get with
each ``GetSessionConfig``, list, delete, state scopes, stale writers, the two-writers race),
then a real ADK ``Runner`` with a scripted model (no network) against the castore service,
checked against ADK's ``InMemorySessionService`` running the same script.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

pytest.importorskip("google.adk")

from conftest import backend_on, make_backend
from google.adk.agents import LlmAgent
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.tools.tool_context import ToolContext
from google.genai import types

import castore
from castore.adapters.adk import (
    CREATED,
    CastoreSessionService,
    InvocationNotFoundError,
    StaleSessionError,
)

APP, USER = "my_app", "user"


backend = backend_on("local", "s3")  # each test's store: on local disk, then on the loopback S3 server


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def svc(store: castore.Store) -> CastoreSessionService:
    return CastoreSessionService(store)


def ev(inv: str = "inv", author: str = "user", delta: dict[str, Any] | None = None, **kw: Any) -> Event:
    return Event(invocation_id=inv, author=author, actions=EventActions(state_delta=dict(delta or {})), **kw)


# -- create / get / delete --------------------------------------------------------------------------
def test_get_of_missing_session_returns_none(svc: CastoreSessionService) -> None:
    assert run(svc.get_session(app_name=APP, user_id=USER, session_id="nope")) is None


def test_created_session_reads_back_equal_and_delete_removes_it(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, state={"key": "value"})
        assert s.id and s.app_name == APP and s.user_id == USER
        assert s.state == {"key": "value"} and s.events == [] and s.last_update_time > 0
        got = await svc.get_session(app_name=APP, user_id=USER, session_id=s.id)
        assert got == s  # pydantic equality includes the private commit marker
        await svc.delete_session(app_name=APP, user_id=USER, session_id=s.id)
        assert await svc.get_session(app_name=APP, user_id=USER, session_id=s.id) is None
        await svc.delete_session(app_name=APP, user_id=USER, session_id=s.id)  # absent: no-op

    run(go())


def test_create_with_existing_id_raises_already_exists(svc: CastoreSessionService) -> None:
    async def go() -> None:
        first = await svc.create_session(app_name=APP, user_id=USER, session_id="dup", state={"a": 1})
        with pytest.raises(AlreadyExistsError):
            await svc.create_session(app_name=APP, user_id=USER, session_id="dup", state={"a": 2})
        got = await svc.get_session(app_name=APP, user_id=USER, session_id="dup")
        assert got == first

    run(go())


@pytest.fixture(params=["local", "seaweedfs"])
def atomic_svc(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """The service on a store whose conditional writes are atomic: local disk, and SeaweedFS
    (moto's server checks a condition and then writes, without a lock, so two rival creates
    can both win there under load: docs/testing.md)."""
    st = make_backend(request.param, request, tmp_path).open()
    yield CastoreSessionService(st)
    st.close()


def test_concurrent_creates_of_one_id_have_one_winner(atomic_svc: CastoreSessionService) -> None:
    svc = atomic_svc

    async def go() -> list[Any]:
        return await asyncio.gather(
            *(svc.create_session(app_name=APP, user_id=USER, session_id="one", state={"w": i}) for i in range(4)),
            return_exceptions=True,
        )

    results = run(go())
    wins = [r for r in results if not isinstance(r, BaseException)]
    assert len(wins) == 1
    assert all(isinstance(r, AlreadyExistsError) for r in results if r not in wins)
    got = run(svc.get_session(app_name=APP, user_id=USER, session_id="one"))
    assert got.state == wins[0].state and len(svc.castore_session(APP, USER, "one").log()) == 1


def test_get_session_respects_user_id(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s1 = await svc.create_session(app_name=APP, user_id="u1", session_id="s1")
        await svc.append_event(s1, ev())
        await svc.create_session(app_name=APP, user_id="u2", session_id="s1")
        got = await svc.get_session(app_name=APP, user_id="u2", session_id="s1")
        assert got.user_id == "u2" and got.events == []

    run(go())


# -- list ---------------------------------------------------------------------------------------------
def test_list_sessions_of_one_user_and_of_all_users_oldest_first(svc: CastoreSessionService) -> None:
    async def go() -> None:
        for uid, sid in [("user1", "s1a"), ("user1", "s1b"), ("user2", "s2a")]:
            s = await svc.create_session(app_name=APP, user_id=uid, session_id=sid, state={"key": sid})
            said = types.Content(role="user", parts=[types.Part(text=sid)])
            await svc.append_event(s, ev(delta={"n": sid}, content=said))
        await svc.create_session(app_name="other_app", user_id="user1", session_id="x")
        one = (await svc.list_sessions(app_name=APP, user_id="user1")).sessions
        assert {s.id for s in one} == {"s1a", "s1b"}
        every = (await svc.list_sessions(app_name=APP, user_id=None)).sessions
        assert [(s.user_id, s.id) for s in every] == [("user1", "s1a"), ("user1", "s1b"), ("user2", "s2a")]
        for s in every:
            assert s.events == [] and s.state == {"key": s.id, "n": s.id}
        assert [s.last_update_time for s in every] == sorted(s.last_update_time for s in every)
        assert (await svc.list_sessions(app_name="no_such_app")).sessions == []
        assert (await svc.list_sessions(app_name=APP, user_id="nobody")).sessions == []

    run(go())


# -- state scopes ----------------------------------------------------------------------------------------
def test_app_state_is_shared_by_every_user_of_the_app(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s1 = await svc.create_session(app_name=APP, user_id="u1", session_id="s1", state={"app:k1": "v1"})
        await svc.append_event(s1, ev(delta={"app:k2": "v2"}))
        s2 = await svc.create_session(app_name=APP, user_id="u2", session_id="s2")
        assert s2.state == {"app:k1": "v1", "app:k2": "v2"}
        got = await svc.get_session(app_name=APP, user_id="u1", session_id="s1")
        assert got.state == {"app:k1": "v1", "app:k2": "v2"}
        other = await svc.create_session(app_name="other", user_id="u1", session_id="s1")
        assert other.state == {}

    run(go())


def test_user_state_is_shared_only_by_that_users_sessions(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s1 = await svc.create_session(app_name=APP, user_id="u1", session_id="s1", state={"user:k1": "v1"})
        await svc.append_event(s1, ev(delta={"user:k2": "v2"}))
        s1b = await svc.create_session(app_name=APP, user_id="u1", session_id="s1b")
        assert s1b.state == {"user:k1": "v1", "user:k2": "v2"}
        assert (await svc.create_session(app_name=APP, user_id="u2", session_id="s2")).state == {}
        assert await svc.get_user_state(app_name=APP, user_id="u1") == {"k1": "v1", "k2": "v2"}
        assert await svc.get_user_state(app_name=APP, user_id="u2") == {}

    run(go())


def test_session_state_is_not_shared(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s1 = await svc.create_session(app_name=APP, user_id="u1", session_id="s1", state={"sk1": "v1"})
        await svc.append_event(s1, ev(delta={"sk2": "v2"}))
        got = await svc.get_session(app_name=APP, user_id="u1", session_id="s1")
        assert got.state == {"sk1": "v1", "sk2": "v2"}
        assert (await svc.create_session(app_name=APP, user_id="u1", session_id="s1b")).state == {}

    run(go())


def test_temp_state_reaches_the_session_object_but_is_never_stored(
    svc: CastoreSessionService, store: castore.Store
) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="t", state={"temp:init": 0})
        assert "temp:init" not in s.state
        e = ev(delta={"temp:k1": "v1", "sk": "v2"})
        await svc.append_event(s, e)
        assert s.state["temp:k1"] == "v1" and s.state["sk"] == "v2"
        assert "temp:k1" not in e.actions.state_delta
        got = await svc.get_session(app_name=APP, user_id=USER, session_id="t")
        assert got.state == {"sk": "v2"} and "temp:k1" not in got.events[0].actions.state_delta
        for entry in store.session(APP, USER, "t").log():
            assert not any(k.startswith("temp:") for k in entry.delta)

    run(go())


# -- events ------------------------------------------------------------------------------------------------
def test_get_session_config_limits_events_by_count_and_timestamp(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="cfg")
        cs = svc.castore_session(APP, USER, "cfg")
        for i in range(1, 6):
            await svc.append_event(s, Event(author="user", timestamp=i))

        async def get(**kw: Any) -> list[float]:
            got = await svc.get_session(app_name=APP, user_id=USER, session_id="cfg",
                                        config=GetSessionConfig(**kw) if kw else None)
            assert got.state == {} and got._storage_update_marker == cs.head
            return [e.timestamp for e in got.events]

        assert await get() == [1, 2, 3, 4, 5]
        assert await get(num_recent_events=0) == []
        assert await get(num_recent_events=3) == [3, 4, 5]
        assert await get(num_recent_events=99) == [1, 2, 3, 4, 5]
        assert await get(after_timestamp=4.0) == [4, 5]
        assert await get(after_timestamp=50.0) == []
        assert await get(num_recent_events=3, after_timestamp=4.0) == [4, 5]
        # Commits that are not ADK events (a castore custom entry here) do not count as events.
        cs.append(castore.Custom("note", {"x": 1}))
        assert await get(num_recent_events=2) == [4, 5]

    run(go())


def test_partial_events_are_not_stored(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="p")
        await svc.append_event(s, Event(author="user", partial=True))
        assert s.events == []
        assert (await svc.get_session(app_name=APP, user_id=USER, session_id="p")).events == []
        assert len(svc.castore_session(APP, USER, "p").log()) == 1

    run(go())


def test_complete_event_with_bytes_reads_back_equal(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="full")
        e = Event(
            invocation_id="invocation", author="user",
            content=types.Content(role="user", parts=[
                types.Part(text="look"), types.Part.from_bytes(data=b"\x89PNG\x00", mime_type="image/png"),
                types.Part(function_call=types.FunctionCall(name="f", args={"a": None, "b": [1, 2]})),
            ]),
            turn_complete=True, partial=False,
            actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True,
                                 state_delta={"k": None, "app:a": {"x": [1]}, "user:u": 1.5}),
            long_running_tool_ids={"tool1"}, error_code="error_code", error_message="error_message",
            interrupted=True, grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=1, candidates_token_count=1, total_token_count=2),
            citation_metadata=types.CitationMetadata(), custom_metadata={"custom_key": "custom_value"},
            timestamp=1700000000.123,
            input_transcription=types.Transcription(text="in", finished=True),
        )
        await svc.append_event(s, e)
        got = await svc.get_session(app_name=APP, user_id=USER, session_id="full")
        assert got == s
        assert got.events[0] == e and got.events[0].content.parts[1].inline_data.data == b"\x89PNG\x00"
        assert got.state == {"k": None, "app:a": {"x": [1]}, "user:u": 1.5}
        assert got.last_update_time == 1700000000.123

    run(go())


def test_every_event_is_one_commit_and_replay_matches_the_state(
    svc: CastoreSessionService, store: castore.Store
) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="audit", state={"a": 0})
        for i in range(5):
            await svc.append_event(s, ev(f"inv{i}", delta={"a": i, f"k{i}": i},
                                         content=types.Content(role="model", parts=[types.Part(text=f"t{i}")])))
        cs = store.session(APP, USER, "audit")
        log = cs.log()
        assert len(log) == 6 and log[-1].entry == castore.Custom(CREATED)
        assert log[0].id == s._storage_update_marker
        assert [m.text for m in cs.messages()] == [f"t{i}" for i in range(5)]
        assert cs.verify()["commits"] == 6 and cs.replay() == cs.state(scopes=False) == {
            "a": 4, **{f"k{i}": i for i in range(5)}}

    run(go())


def test_last_update_time_follows_the_event_timestamp(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="time")
        t0 = s.last_update_time
        await svc.append_event(s, Event(invocation_id="i", author="user", timestamp=t0 + 10))
        assert s.last_update_time == t0 + 10
        got = await svc.get_session(app_name=APP, user_id=USER, session_id="time")
        assert got.last_update_time == t0 + 10

    run(go())


# -- stale writers -------------------------------------------------------------------------------------------
def test_append_from_a_stale_session_object_is_refused_and_writes_nothing(svc: CastoreSessionService) -> None:
    async def go() -> None:
        original = await svc.create_session(app_name=APP, user_id=USER, session_id="stale")
        await svc.append_event(original, ev("inv1", delta={"sk1": "v1"}))
        updated = await svc.get_session(app_name=APP, user_id=USER, session_id="stale")
        await svc.append_event(updated, ev("inv2", delta={"sk2": "v2"}))
        with pytest.raises(StaleSessionError, match="modified in storage"):
            await svc.append_event(original, ev("inv3", delta={"sk3": "v3", "user:u": "stale", "app:a": "stale"}))
        assert issubclass(StaleSessionError, ValueError)
        final = await svc.get_session(app_name=APP, user_id=USER, session_id="stale")
        assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
        assert final.state == {"sk1": "v1", "sk2": "v2"}
        assert len(original.events) == 1  # the refused event did not reach the stale object

    run(go())


def test_two_writers_from_one_read_exactly_one_succeeds(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="race")
        rounds = 6
        for i in range(rounds):
            latest = await svc.get_session(app_name=APP, user_id=USER, session_id="race")
            a, b = latest.model_copy(deep=True), latest.model_copy(deep=True)
            base = latest.last_update_time + 10
            results = await asyncio.gather(
                svc.append_event(a, ev(f"inv{i}-1", timestamp=base + 1,
                                       delta={f"sk{i}-1": "v", f"app:ak{i}-1": "v", f"user:uk{i}-1": "v"})),
                svc.append_event(b, ev(f"inv{i}-2", timestamp=base + 2,
                                       delta={f"sk{i}-2": "v", f"app:ak{i}-2": "v", f"user:uk{i}-2": "v"})),
                return_exceptions=True,
            )
            errors = [r for r in results if isinstance(r, BaseException)]
            assert len(errors) == 1 and isinstance(errors[0], StaleSessionError), results
        final = await svc.get_session(app_name=APP, user_id=USER, session_id=s.id)
        assert len(final.events) == rounds
        for i in range(rounds):
            # the loser writes nothing: neither its session state nor its app: and user: state
            won = 1 if f"sk{i}-1" in final.state else 2
            lost = 3 - won
            assert f"sk{i}-{lost}" not in final.state
            assert final.state.get(f"app:ak{i}-{won}") == "v" and f"app:ak{i}-{lost}" not in final.state
            assert final.state.get(f"user:uk{i}-{won}") == "v" and f"user:uk{i}-{lost}" not in final.state
        assert {e.invocation_id.rsplit("-", 1)[0] for e in final.events} == {f"inv{i}" for i in range(rounds)}

    run(go())


def test_session_object_without_marker_appends_only_if_current(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="nomark")
        await svc.append_event(s, ev("inv1"))
        stale = copy.deepcopy(s)
        s._storage_update_marker = None
        await svc.append_event(s, ev("inv2"))  # current: allowed, and marked again
        assert s._storage_update_marker is not None
        stale._storage_update_marker = None
        with pytest.raises(StaleSessionError):
            await svc.append_event(stale, ev("inv3"))
        got = await svc.get_session(app_name=APP, user_id=USER, session_id="nomark")
        assert [e.invocation_id for e in got.events] == ["inv1", "inv2"]

    run(go())


def test_append_to_a_deleted_session_raises_session_not_found(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="gone")
        await svc.delete_session(app_name=APP, user_id=USER, session_id="gone")
        with pytest.raises(SessionNotFoundError):
            await svc.append_event(s, ev())

    run(go())


# -- castore branches ------------------------------------------------------------------------------------------
def test_adk_reads_the_checked_out_castore_branch(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="br")
        await svc.append_event(s, ev("inv1", delta={"step": 1}))
        fork_point = s._storage_update_marker
        await svc.append_event(s, ev("inv2", delta={"step": 2}))
        cs = svc.castore_session(APP, USER, "br")
        cs.checkout(fork_point, create="retry")
        with pytest.raises(StaleSessionError):  # s was read on main
            await svc.append_event(s, ev("inv3"))
        on_retry = await svc.get_session(app_name=APP, user_id=USER, session_id="br")
        assert [e.invocation_id for e in on_retry.events] == ["inv1"] and on_retry.state == {"step": 1}
        await svc.append_event(on_retry, ev("inv2b", delta={"step": 20}))
        cs.checkout("main")
        on_main = await svc.get_session(app_name=APP, user_id=USER, session_id="br")
        assert [e.invocation_id for e in on_main.events] == ["inv1", "inv2"] and on_main.state == {"step": 2}
        assert cs.diff("main", "retry")["changed"] == {"step": [2, 20]}

    run(go())


# -- a real Runner with a scripted model -------------------------------------------------------------------------
class ScriptedLlm(BaseLlm):
    """Answers every request with the next part of its script; records what it was sent."""

    script: list[Any] = []
    calls: int = 0
    seen: list[list[dict[str, Any]]] = []

    async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
        self.seen.append([_norm(c.model_dump(mode="json", exclude_none=True)) for c in llm_request.contents])
        part = self.script[self.calls % len(self.script)]
        self.calls += 1
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def _norm(x: Any) -> Any:
    """Drop ADK's generated function-call ids, which differ from run to run."""
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items() if k != "id"}
    if isinstance(x, list):
        return [_norm(v) for v in x]
    return x


def remember(city: str, tool_context: ToolContext) -> dict[str, Any]:
    """Remember the user's city."""
    tool_context.state["user:city"] = city
    tool_context.state["visits"] = tool_context.state.get("visits", 0) + 1
    return {"ok": True, "city": city}


def make_runner(service: Any) -> tuple[Runner, ScriptedLlm]:
    llm = ScriptedLlm(model="scripted", script=[
        types.Part(function_call=types.FunctionCall(name="remember", args={"city": "Paris"})),
        types.Part(text="Noted."),
    ])
    agent = LlmAgent(name="assistant", model=llm, instruction="Be brief.", tools=[remember], output_key="reply")
    return Runner(agent=agent, app_name=APP, session_service=service), llm


async def ask(runner: Runner, text: str, sid: str = "s1") -> list[Event]:
    msg = types.Content(role="user", parts=[types.Part(text=text)])
    return [e async for e in runner.run_async(user_id=USER, session_id=sid, new_message=msg)]


def _shape(events: list[Event]) -> list[tuple[Any, ...]]:
    return [(e.author, _norm(e.content.model_dump(mode="json", exclude_none=True)) if e.content else None,
             e.actions.state_delta) for e in events]


def test_runner_on_castore_behaves_like_in_memory(svc: CastoreSessionService, store: castore.Store) -> None:
    async def session_of(service: Any) -> tuple[Any, ScriptedLlm, list[Event]]:
        runner, llm = make_runner(service)
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        out = [e for q in ("I live in Paris", "and again") for e in await ask(runner, q)]
        return await service.get_session(app_name=APP, user_id=USER, session_id="s1"), llm, out

    ref, ref_llm, ref_out = run(session_of(InMemorySessionService()))
    got, llm, out = run(session_of(svc))
    assert got.state == ref.state == {"visits": 2, "reply": "Noted.", "user:city": "Paris"}
    assert _shape(got.events) == _shape(ref.events) and len(got.events) == 8
    assert _shape(out) == _shape(ref_out)
    assert llm.seen == ref_llm.seen  # the model saw the same history, read back from castore
    assert got.events[-1].id == out[-1].id
    assert len(store.session(APP, USER, "s1").log()) == 1 + 8


def test_runner_rewind_async_undoes_an_invocation(svc: CastoreSessionService) -> None:
    async def go() -> None:
        runner, llm = make_runner(svc)
        await svc.create_session(app_name=APP, user_id=USER, session_id="s1")
        await ask(runner, "first")
        second = await ask(runner, "second")
        await runner.rewind_async(user_id=USER, session_id="s1", rewind_before_invocation_id=second[0].invocation_id)
        after = await svc.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert after.state["visits"] == 1
        assert after.events[-1].actions.rewind_before_invocation_id == second[0].invocation_id
        llm.seen.clear()
        await ask(runner, "third")
        sent = str(llm.seen[0])
        assert "first" in sent and "third" in sent and "second" not in sent
        with pytest.raises(InvocationNotFoundError):
            await runner.rewind_async(user_id=USER, session_id="s1", rewind_before_invocation_id="no-such")

    run(go())


def test_branch_before_invocation_keeps_the_abandoned_turn_on_the_old_branch(svc: CastoreSessionService) -> None:
    async def go() -> None:
        runner, llm = make_runner(svc)
        await svc.create_session(app_name=APP, user_id=USER, session_id="s1")
        first = await ask(runner, "first")
        second = await ask(runner, "second")
        s = await svc.branch_before_invocation(app_name=APP, user_id=USER, session_id="s1",
                                               invocation_id=second[0].invocation_id, branch="redo")
        assert [e.id for e in s.events][1:] == [e.id for e in first]  # after the user's message
        assert {e.invocation_id for e in s.events} == {first[0].invocation_id} and s.state["visits"] == 1
        llm.seen.clear()
        await ask(runner, "third")
        assert "second" not in str(llm.seen[0]) and "first" in str(llm.seen[0])
        cs = svc.castore_session(APP, USER, "s1")
        assert cs.current_branch == "redo" and set(cs.branches()) == {"main", "redo"}
        old = [e.meta["adk"]["invocation_id"] for e in cs.entries("main") if "adk" in e.meta]
        assert second[0].invocation_id in old
        with pytest.raises(InvocationNotFoundError):
            await svc.branch_before_invocation(app_name=APP, user_id=USER, session_id="s1",
                                               invocation_id="no-such", branch="x")

    run(go())


def test_service_opened_from_a_url_closes_its_store(tmp_path: Any) -> None:
    async def go() -> None:
        async with CastoreSessionService(str(tmp_path / "st")) as service:
            s = await service.create_session(app_name=APP, user_id=USER, session_id="u")
            await service.append_event(s, ev())
        again = CastoreSessionService(str(tmp_path / "st"))
        assert len((await again.get_session(app_name=APP, user_id=USER, session_id="u")).events) == 1

    run(go())


# -- ids and repeated appends, checked against ADK's own in-memory service -----------------------------
@pytest.fixture(params=["in-memory", "castore"])
def either(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """ADK's InMemorySessionService and the castore service, for behaviour both must share."""
    if request.param == "in-memory":
        yield InMemorySessionService()
        return
    st = make_backend("local", request, tmp_path).open()
    try:
        yield CastoreSessionService(st)
    finally:
        st.close()


def test_session_ids_are_stripped(either: Any) -> None:
    async def go() -> None:
        s = await either.create_session(app_name=APP, user_id=USER, session_id="  abc  ")
        assert s.id == "abc"
        with pytest.raises(AlreadyExistsError):
            await either.create_session(app_name=APP, user_id=USER, session_id="abc ")
        got = await either.get_session(app_name=APP, user_id=USER, session_id=" abc")
        assert got is not None and got.id == "abc"
        await either.delete_session(app_name=APP, user_id=USER, session_id="abc\t")
        assert await either.get_session(app_name=APP, user_id=USER, session_id="abc") is None

    run(go())


def test_blank_session_id_gets_a_generated_one(either: Any) -> None:
    async def go() -> None:
        a = await either.create_session(app_name=APP, user_id=USER, session_id="   ")
        b = await either.create_session(app_name=APP, user_id=USER, session_id="")
        assert a.id.strip() and b.id.strip() and a.id != b.id
        assert (await either.get_session(app_name=APP, user_id=USER, session_id=a.id)).id == a.id

    run(go())


def test_the_same_event_appended_twice_is_stored_once(either: Any) -> None:
    async def go() -> None:
        s = await either.create_session(app_name=APP, user_id=USER, session_id="twice", state={"n": 0})
        e = ev(delta={"n": 1})
        assert await either.append_event(s, e) is e
        assert await either.append_event(s, e) is e
        assert await either.append_event(s, copy.deepcopy(e)) is not None
        got = await either.get_session(app_name=APP, user_id=USER, session_id="twice")
        assert [x.id for x in got.events] == [e.id] and got.state["n"] == 1
        assert [x.id for x in s.events] == [e.id]
        # a stale copy retrying the same event changes nothing either
        stale = copy.deepcopy(s)
        await either.append_event(s, ev(delta={"n": 2}))
        await either.append_event(stale, copy.deepcopy(e))
        got = await either.get_session(app_name=APP, user_id=USER, session_id="twice")
        assert len(got.events) == 2 and got.state["n"] == 2
        # an event reusing an id with other fields is a different event, and is kept
        other = ev(delta={"n": 3})
        other.id = e.id
        await either.append_event(s, other)
        got = await either.get_session(app_name=APP, user_id=USER, session_id="twice")
        assert len(got.events) == 3 and got.state["n"] == 3

    run(go())


def test_repeated_event_writes_no_commit(svc: CastoreSessionService) -> None:
    async def go() -> None:
        s = await svc.create_session(app_name=APP, user_id=USER, session_id="once")
        e = ev(delta={"k": "v"})
        await svc.append_event(s, e)
        await svc.append_event(s, e)
        await svc.append_event(copy.deepcopy(s), copy.deepcopy(e))
        assert len(svc.castore_session(APP, USER, "once").log(limit=0)) == 2  # creation + one event

    run(go())
