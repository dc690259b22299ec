"""The order of the events castore's ADK session service returns: the order they were appended.

ADK's own services disagree on events whose timestamps tie (or run backwards):
``InMemorySessionService`` returns them as appended, its SQL services sort by timestamp and
break ties by row or event id. castore returns them as appended, like the in-memory service
(see the adapter's docstring for why); these tests hold castore to the in-memory service on the
same calls, on every backend of tests/conftest.py (local disk, memory, S3).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.events.event import Event
from google.adk.sessions import InMemorySessionService
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from castore.adapters.adk import CastoreSessionService

APP, USER = "app", "user"


def both_services(store: Any) -> list[Any]:
    return [InMemorySessionService(), CastoreSessionService(store)]


async def append_all(svc: Any, events: list[Event]) -> str:
    s = await svc.create_session(app_name=APP, user_id=USER)
    for e in events:
        await svc.append_event(s, e.model_copy(deep=True))
    return s.id


async def read(svc: Any, sid: str, **config: Any) -> list[str]:
    got = await svc.get_session(app_name=APP, user_id=USER, session_id=sid,
                                config=GetSessionConfig(**config) if config else None)
    return [e.id for e in got.events]


@pytest.mark.parametrize("ids", [["event_a", "event_m", "event_z"], ["event_z", "event_m", "event_a"]])
def test_tied_timestamps_come_back_in_append_order_as_from_the_in_memory_service(store: Any, ids: list[str]) -> None:
    events = [Event(author="user", id=i, timestamp=100.0) for i in ids]

    async def scenario(svc: Any) -> list[list[str]]:
        sid = await append_all(svc, events)
        return [await read(svc, sid), await read(svc, sid), await read(svc, sid, num_recent_events=2)]

    for svc in both_services(store):
        full, again, recent = asyncio.run(scenario(svc))
        assert full == again == ids  # append order, the same on every read
        assert recent == ids[1:]  # the newest two, cut inside the tie where the appends put it


def test_a_call_and_its_response_keep_their_order_when_the_clock_ties(store: Any) -> None:
    # A coarse clock gives a tool call and its response one timestamp; ordering the tie by the
    # events' random ids could put the response before its call.
    call = types.Part(function_call=types.FunctionCall(id="c1", name="lookup", args={}))
    result = types.Part(function_response=types.FunctionResponse(id="c1", name="lookup", response={"r": 1}))
    events = [Event(author="agent", id="zz-call", timestamp=7.0, content=types.Content(role="model", parts=[call])),
              Event(author="agent", id="aa-response", timestamp=7.0,
                    content=types.Content(role="user", parts=[result]))]
    for svc in both_services(store):
        sid = asyncio.run(append_all(svc, events))
        assert asyncio.run(read(svc, sid)) == ["zz-call", "aa-response"]


def test_a_timestamp_that_runs_backwards_stays_where_it_was_appended(store: Any) -> None:
    events = [Event(author="user", id="first", timestamp=100.0), Event(author="user", id="late-clock", timestamp=50.0),
              Event(author="user", id="third", timestamp=120.0)]
    for svc in both_services(store):
        sid = asyncio.run(append_all(svc, events))
        assert asyncio.run(read(svc, sid)) == ["first", "late-clock", "third"]
