"""CastoreSaver as a context manager, sync and async, as LangGraph's own savers.

LangGraph's ``InMemorySaver`` enters as itself in ``with`` and ``async with`` blocks and stays
usable after the block (its own test enters one saver both ways in turn); a graph compiled
with a saver from ``async with`` runs on it. The castore saver opens nothing of its own: the
store stays the caller's, open after the block. ``store`` (tests/conftest.py) is each backend
in turn: local disk, memory, S3.
"""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from castore.adapters.langgraph import CastoreSaver


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


def graph(saver: Any) -> Any:
    g = StateGraph(State)
    g.add_node("work", lambda s: {"steps": [f"step {len(s['steps'])}"]})
    g.add_edge(START, "work")
    return g.compile(checkpointer=saver)


CONFIG = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}


def put_one(saver: Any, n: int) -> Any:
    cp = create_checkpoint(empty_checkpoint(), None, n)
    return saver.put(CONFIG, cp, {"source": "input", "step": n}, {})


@pytest.mark.parametrize("kind", ["memory", "castore"])
def test_sync_then_async_block_enter_as_the_saver_and_leave_it_usable(store: Any, kind: str) -> None:
    saver: Any = InMemorySaver() if kind == "memory" else CastoreSaver(store)

    async def enter_async() -> Any:
        async with saver as entered:
            assert entered is saver
            await entered.aput(CONFIG, create_checkpoint(empty_checkpoint(), None, 2),
                               {"source": "loop", "step": 2}, {})
        return await saver.aget_tuple(CONFIG)

    with saver as entered:
        assert entered is saver
        put_one(entered, 1)
    assert saver.get_tuple(CONFIG).metadata["step"] == 1  # usable after the block
    assert asyncio.run(enter_async()).metadata["step"] == 2
    with saver:
        assert [t.metadata["step"] for t in saver.list(CONFIG)] == [2, 1]
    if kind == "castore":
        assert store.session("langgraph", "default", "t1").exists()  # the store stayed open


def test_a_block_does_not_swallow_an_error(store: Any) -> None:
    saver = CastoreSaver(store)
    with pytest.raises(KeyError), saver:
        raise KeyError("from the block")

    async def failing() -> None:
        async with saver:
            raise KeyError("from the async block")

    with pytest.raises(KeyError):
        asyncio.run(failing())
    put_one(saver, 1)  # and the saver still writes


def test_a_graph_runs_on_a_saver_from_async_with_and_its_thread_outlives_the_block(store: Any) -> None:
    config = {"configurable": {"thread_id": "g1"}}

    async def run() -> Any:
        async with CastoreSaver(store) as saver:
            g = graph(saver)
            await g.ainvoke({"steps": []}, config)
            return await g.ainvoke({"steps": []}, config)

    assert asyncio.run(run())["steps"] == ["step 0", "step 1"]
    with CastoreSaver(store) as saver:
        assert graph(saver).get_state(config).values["steps"] == ["step 0", "step 1"]
