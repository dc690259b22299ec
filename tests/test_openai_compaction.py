"""The SDK's ``OpenAIResponsesCompactionSession`` over castore, as over the SDK's ``SQLiteSession``.

The compaction session keeps older history and replaces only the newest items the model saw
(a suffix) when the store offers an atomic suffix replacement, as ``SQLiteSession`` does; a
``session_settings`` read limit or a ``max_rollback_items`` budget then does not stop automatic
compaction. Each scenario runs the SDK's real classes (``Runner``, the compaction session, a
scripted model) over ``SQLiteSession`` and over castore on local disk and S3, and the two must
agree; only the ``responses.compact`` network call is faked.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

pytest.importorskip("agents.testing")

import agents.memory.session
from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.memory import OpenAIResponsesCompactionSession, SQLiteSession
from agents.testing import ScriptedModel
from conftest import make_backend
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import castore
from castore.adapters.openai_agents import REPLACED, CastoreSession

set_tracing_disabled(True)
pytestmark = pytest.mark.skipif(not hasattr(agents.memory.session, "_CompactionSnapshot"),
                                reason="this openai-agents has no suffix compaction")

HIDDEN = "older item the limited read hides"


@pytest.fixture(params=["sqlite", "local", "s3"])
def make_session(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """A factory of underlying sessions: the SDK's SQLiteSession, then castore on disk and S3.

    Every session it makes shares one store (castore) or one database file (SQLite), so a
    second handle sees what the first wrote.
    """
    opened: list[Any] = []
    store = None if request.param == "sqlite" else make_backend(request.param, request, tmp_path).open()
    name = f"conv-{uuid.uuid4().hex[:8]}"

    def make(**settings: Any) -> Any:
        if store is None:
            s: Any = SQLiteSession(name, str(tmp_path / "sessions.db"), **settings)
        else:
            s = CastoreSession(name, store, **settings)
        opened.append(s)
        return s

    make.kind = request.param  # type: ignore[attr-defined]
    yield make
    for s in opened:
        s.close()
    if store is not None:
        store.close()


def text(t: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(text=t, type="output_text", annotations=[],
                                                             logprobs=[])])


def user(t: str) -> dict[str, Any]:
    return {"role": "user", "content": t}


def fake_client(output: list[Any]) -> MagicMock:
    """An OpenAI client whose ``responses.compact`` returns ``output`` (the network part)."""
    client = MagicMock()
    client.responses.compact = AsyncMock(return_value=SimpleNamespace(output=output))
    return client


def compact_inputs(client: MagicMock) -> list[Any]:
    return [json.loads(json.dumps(c.kwargs.get("input"))) for c in client.responses.compact.await_args_list]


async def run(agent: Agent[Any], prompt: str, session: Any, streamed: bool, config: RunConfig | None = None) -> None:
    if not streamed:
        await Runner.run(agent, prompt, session=session, run_config=config)
        return
    result = Runner.run_streamed(agent, prompt, session=session, run_config=config)
    async for _ in result.stream_events():
        pass


@pytest.mark.parametrize("streamed", [False, True])
def test_read_limit_does_not_stop_automatic_compaction(make_session: Any, streamed: bool) -> None:
    async def scenario() -> dict[str, Any]:
        client = fake_client([])
        backend = make_session(session_settings={"limit": 1})
        session = OpenAIResponsesCompactionSession("c", backend, client=client, compaction_mode="input",
                                                   should_trigger_compaction=lambda _: True)
        await session.add_items([user(HIDDEN), user("visible tail")])
        model = ScriptedModel(steps=[[text("ok")], [text("done")]])
        agent = Agent(name="worker", model=model)

        await run(agent, "limited read", session, streamed)
        assert HIDDEN not in str(model.calls[0].input)  # the read limit held for the model
        # ... and the compaction replaced what the model saw, keeping the older item
        assert client.responses.compact.await_count == 1
        assert HIDDEN not in str(compact_inputs(client)[0])
        after_first = await session.get_items(limit=100)
        assert after_first == [user(HIDDEN)]

        await run(agent, "full read", session, streamed, RunConfig(session_settings={"limit": 100}))
        assert HIDDEN in str(model.calls[1].input)
        assert client.responses.compact.await_count == 2
        assert HIDDEN in str(compact_inputs(client)[1])
        assert await session.get_items(limit=100) == []
        return {"inputs": compact_inputs(client), "after_first": after_first}

    got = asyncio.run(scenario())
    assert got["inputs"][0] == [user("visible tail"), user("limited read"),
                                json.loads(json.dumps(text("ok").model_dump(exclude_unset=True)))]


def test_read_limit_does_not_stop_compaction_through_encrypted_session(make_session: Any) -> None:
    pytest.importorskip("cryptography")
    from agents.extensions.memory.encrypt_session import EncryptedSession

    async def scenario() -> None:
        client = fake_client([])
        backend = make_session(session_settings={"limit": 1})
        inner = OpenAIResponsesCompactionSession("c", backend, client=client, compaction_mode="input",
                                                 should_trigger_compaction=lambda _: True)
        session = EncryptedSession("c", inner, encryption_key="a test key, not a secret")
        await session.add_items([user(HIDDEN), user("visible tail")])
        agent = Agent(name="worker", model=ScriptedModel(steps=[[text("ok")], [text("done")]]))
        await Runner.run(agent, "limited read", session=session)
        assert client.responses.compact.await_count == 1
        assert await session.get_items(limit=100) == [user(HIDDEN)]
        await Runner.run(agent, "full read", session=session, run_config=RunConfig(session_settings={"limit": 100}))
        assert client.responses.compact.await_count == 2
        assert HIDDEN in str(compact_inputs(client)[1])
        assert await session.get_items(limit=100) == []

    asyncio.run(scenario())


def test_rollback_budget_does_not_stop_automatic_suffix_compaction(make_session: Any) -> None:
    summary = {"type": "compaction", "id": "cmp_1", "encrypted_content": "summary"}

    async def scenario() -> list[Any]:
        client = fake_client([summary])
        backend = make_session()
        session = OpenAIResponsesCompactionSession("c", backend, client=client, compaction_mode="input",
                                                   should_trigger_compaction=lambda _: True,
                                                   max_rollback_items=2)
        older = [user(f"older {i}") for i in range(5)]
        await backend.add_items(older)
        # the model sees only the new turn: the older items are retained, not compacted
        agent = Agent(name="worker", model=ScriptedModel(steps=[[text("ok")]]))
        await Runner.run(agent, "new turn", session=session,
                         run_config=RunConfig(session_input_callback=lambda _history, new: new))
        assert client.responses.compact.await_count == 1
        items = await session.get_items()
        assert items == [*older, summary]
        # a manual compaction replaces the whole history: over budget, it refuses and keeps it
        with pytest.raises(ValueError, match="max_rollback_items"):
            await session.run_compaction({"force": True})
        assert await session.get_items() == items
        assert client.responses.compact.await_count == 1
        return items

    asyncio.run(scenario())


def test_replacement_refused_when_history_moved_since_the_snapshot(make_session: Any) -> None:
    async def scenario() -> None:
        first, other = make_session(), make_session()
        await first.add_items([user("a"), user("b"), user("c")])
        snap = await first._get_compaction_snapshot(2)
        assert snap.items == [user("b"), user("c")] and snap.complete is False
        await other.add_items([user("d")])  # another writer, after the snapshot
        assert await snap.replace_suffix(0, [user("summary")]) is False
        assert await first.get_items() == [user("a"), user("b"), user("c"), user("d")]
        snap = await first._get_compaction_snapshot(10)
        assert snap.complete is True
        assert await snap.replace_suffix(len(snap.items), []) is False  # an empty suffix
        assert await snap.replace_suffix(1, [user("summary")]) is True
        assert await other.get_items() == [user("a"), user("summary")]

    asyncio.run(scenario())


def test_pop_and_clear_after_a_suffix_replacement(make_session: Any) -> None:
    async def scenario() -> None:
        s = make_session(session_settings={"limit": 1})
        await s.add_items([user("a"), user("b"), user("c")])
        snap = await s._get_compaction_snapshot(2)
        assert await snap.replace_suffix(0, []) is True  # b and c compacted to nothing
        assert await s.get_items() == [user("a")]  # the settings' limit still applies
        assert await s.get_items(limit=-1) == [user("a")]
        await s.add_items([user("d")])
        assert await s.get_items(limit=10) == [user("a"), user("d")]
        assert await s.pop_item() == user("d")
        assert await s.pop_item() == user("a")
        assert await s.pop_item() is None
        await s.add_items([user("e"), user("f")])
        snap = await s._get_compaction_snapshot(5)
        assert snap.items == [user("e"), user("f")] and snap.complete is True
        assert await snap.replace_suffix(1, [user("g")]) is True
        assert await s.get_items(limit=10) == [user("e"), user("g")]
        await s.clear_session()
        assert await s.get_items(limit=10) == []
        assert await make_session().get_items() == []

    asyncio.run(scenario())


def test_replaced_items_stay_in_castore_history(make_session: Any) -> None:
    if make_session.kind == "sqlite":
        pytest.skip("castore keeps what SQLite deletes")

    async def scenario() -> None:
        s = make_session()
        await s.add_items([user("a"), user("b"), user("c")])
        snap = await s._get_compaction_snapshot(2)
        assert await snap.replace_suffix(0, [user("summary")]) is True
        log = [e.entry for e in s.castore.log()]
        first_replaced = s.castore.log()[3].id  # newest first: summary, marker, c, b
        assert log[:2] == [castore.Message.from_dict(user("summary")), castore.Custom(REPLACED, {"from": first_replaced})]
        assert [m.to_dict() for m in s.castore.messages()] == [user("a"), user("b"), user("c"), user("summary")]
        assert await s.get_items() == [user("a"), user("summary")]

    asyncio.run(scenario())


def test_a_subclass_that_transforms_items_gets_no_snapshot(tmp_path: Any) -> None:
    class Transforming(CastoreSession):
        async def add_items(self, items: list[Any]) -> None:
            await super().add_items([{**i, "tag": 1} for i in items])

    class Configured(CastoreSession):  # only builds the session its own way
        def __init__(self, session_id: str, url: str) -> None:
            super().__init__(session_id, url, app="configured")

    with castore.open(str(tmp_path / "store")) as st:
        assert asyncio.run(Transforming("c", st)._get_compaction_snapshot(3)) is None
    s = Configured("c", str(tmp_path / "store"))
    asyncio.run(s.add_items([user("a")]))
    assert asyncio.run(s._get_compaction_snapshot(3)).items == [user("a")]
    s.close()
