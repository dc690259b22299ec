"""``grep(typed=True)`` / ``--typed`` on sessions castore wrote itself: user text and the
assistant's blocks are kept; tool results, system messages and entries flagged ``injected``
are left out, on the index and without it, and ``limit`` counts only what is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

import castore
from castore import Event, Message
from castore.entries import INJECTED
from castore.grep import grep, typed_block


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    st = castore.open(str(tmp_path / "store"), durable=False)
    s = st.session("app", "u", "s")
    s.append_many([
        Message("system", "you look for the kiwi"),
        Message("user", "<env>kiwi context</env>"),
        Message("user", "where is the kiwi?"),
        Message("assistant", [{"type": "thinking", "thinking": "the kiwi is near"},
                              {"type": "text", "text": "The kiwi is here."}],
                tool_calls=[{"id": "c1", "function": {"name": "find", "arguments": '{"q": "kiwi"}'}}]),
        Message("tool", "kiwi found", tool_call_id="c1"),
        Event(author="user", message=Message("user", "kiwi reminder"), meta={INJECTED: "reminder"}),
    ], metas=[None, {INJECTED: "env"}, None, None, None, None])
    return st


@pytest.mark.parametrize("index", [False, None])
def test_typed_keeps_what_was_typed_and_answered(store: castore.Store, index: bool | None) -> None:
    every = list(grep(store, "kiwi", index=index, kinds=["text", "thinking", "tool_call", "tool_result"]))
    assert len(every) == 8
    typed = list(grep(store, "kiwi", index=index, typed=True, kinds=["text", "thinking", "tool_call", "tool_result"]))
    assert [(m.role, m.kind, m.lines[0].text) for m in typed] == [
        ("user", "text", "where is the kiwi?"), ("assistant", "thinking", "the kiwi is near"),
        ("assistant", "text", "The kiwi is here."), ("assistant", "tool_call", 'find {"q": "kiwi"}')]
    limited = list(grep(store, "kiwi", index=index, typed=True, limit=2))
    assert [m.lines[0].text for m in limited] == ["where is the kiwi?", "the kiwi is near"]


def test_typed_block_predicate() -> None:
    assert typed_block("user", "text", {}) and typed_block("assistant", "tool_call", None)
    assert not typed_block("user", "tool_result", {}) and not typed_block("system", "text", {})
    assert not typed_block("user", "text", {INJECTED: "meta"}) and typed_block("user", "text", {INJECTED: ""})
