"""``castore demo``: record a scripted weather-agent session with a retry branch, a fork and a label, then show it."""

from __future__ import annotations

import json
import shlex
from typing import Any

import click

from ..entries import Event, Message
from ..objects import ObjectId
from ..session import Session
from ..store import Store, default_url
from . import render as r
from .common import format_key, note, open_store, print_json, store_url
from .session_cmds import refs_of

APP = "weather-app"
USER = "alice"


def _call(call_id: str, city: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}


def _turn(s: Session, call_id: str, city: str, weather: dict[str, Any], answer: str, model: str,
          **state: Any) -> list[ObjectId]:
    """One agent turn, appended whole: the tool call, its result, the answer (an Event)."""
    return s.append_many([
        Message(role="assistant", tool_calls=[_call(call_id, city)]),
        Message(role="tool", content=json.dumps(weather), tool_call_id=call_id, name="get_weather"),
        Event(author="weather-agent", message=Message(role="assistant", content=answer),
              state_delta={"last_city": city, **state}, meta={"model": model, "usage": {"output_tokens": 12}}),
    ])


def next_demo_id(store: Store) -> str:
    """``demo-N`` for the first N not used yet by this store's demo sessions."""
    taken = {s.session for s in store.sessions(APP, USER)} if store.exists else set()
    n = 1
    while f"demo-{n}" in taken or f"demo-{n}-fork" in taken:
        n += 1
    return f"demo-{n}"


def record(store: Store, sid: str) -> tuple[Session, Session]:
    """Record the demo session ``sid`` (and its fork ``sid-fork``); return both.

    Raises:
        CastoreError: the store cannot be written.
    """
    s = store.session(APP, USER, sid)
    s.append(Message(role="user", content="What's the weather in Beijing?"))
    _, result1, a1 = _turn(s, "call_1", "Beijing", {"city": "Beijing", "temp_c": 25, "sky": "sunny"},
                           "It's sunny in Beijing, 25°C.", "model-a")
    s.label("first-answer", at=a1)
    s.append(Message(role="user", content="And in Shanghai?"))
    _turn(s, "call_2", "Shanghai", {"city": "Shanghai", "temp_c": 22, "sky": "cloudy"},
          "Shanghai is cloudy, 22°C.", "model-a")
    # A retry from an earlier point: another model answers the first question again, on a branch.
    s.checkout(result1, create="retry")
    s.append(Event(author="weather-agent",
                   message=Message(role="assistant", content="Beijing: clear skies, 25°C (77°F)."),
                   state_delta={"last_city": "Beijing", "units": "both"}, meta={"model": "model-b"}))
    s.checkout("main")
    fork = s.fork(f"{sid}-fork", a1)
    fork.append(Message(role="user", content="Will it rain in Beijing tomorrow?"))
    return s, fork


@click.command("demo")
@click.pass_context
def demo_cmd(ctx: click.Context) -> None:
    """Record a scripted weather-agent session, then show its tree and state.

    The session (weather-app/alice/demo-N, a new N each run) holds a user question, a
    tool call, its result and the answer (setting last_city), a second question, a retry
    of the first answer on branch `retry`, and the label `first-answer`; it is forked
    into demo-N-fork. Prints `log --graph --all` and the state at two points in time,
    with the commands that show them.
    """
    store = open_store(ctx, must_exist=False)
    store.init()
    sid = next_demo_id(store)
    s, fork = record(store, sid)
    key = format_key(*s.key)
    note(f"Recorded session {key} (and its fork {format_key(*fork.key)}) in {store.url}")
    base = "castore"
    if store_url(ctx) != default_url():
        base += f" --store {shlex.quote(store_url(ctx))}"

    def show(session: Session, cmd: str) -> None:
        click.echo(click.style(f"$ {base} -s {shlex.quote(format_key(*session.key))} {cmd}", dim=True))

    show(s, "log --graph --all")
    for line in r.graph_lines(s.log(all_branches=True), refs_of(s)):
        click.echo(line)
    for rev in ("first-answer", "HEAD"):
        click.echo()
        show(s, f"state {rev}")
        print_json(s.state(rev))
    click.echo()
    show(fork, "log --oneline")
    fork_refs = refs_of(fork)
    for e in fork.log():
        click.echo(r.oneline(e, fork_refs))


def register(group: click.Group) -> None:
    """Add ``demo`` to ``group``."""
    group.add_command(demo_cmd)


__all__ = ["register", "record", "next_demo_id", "APP", "USER"]
