"""Gemini CLI: `castore context` of an imported session is what gemini-cli itself loads from the file.

gemini-cli rebuilds a session from its JSONL by replaying it (``loadConversationRecord`` in
google-gemini/gemini-cli ``packages/core/src/services/chatRecordingService.ts``, commit 5411f11,
Apache-2.0): a message record sets the message of its ``id`` (a copy written again replaces the
earlier one in its place), ``$rewindTo`` drops that message and every one after it (all of them
when the id is unknown), ``$set`` with ``messages`` clears the conversation and sets that list,
the metadata line may carry ``messages`` too. :func:`gemini_cli_load` replays by those rules.

castore keeps every line as a commit: the last message written again adds what it adds (its
calls, their results) as a part after the message; one written again that says something else,
or an earlier one written again after later ones, is set in its place, as a checkpoint is (the
line hangs after the message before it, the later messages follow as copies); a checkpoint
copies the messages it sets that the path does not hold. So each message gemini-cli loads is, in
castore's context, its first part and the parts its copies added, in order: joined back, the
context is gemini-cli's conversation, message for message (castore's reading of each record:
:func:`castore.adapters.gemini._message`). The files are imported line by line (as ``--follow``
does) and whole, and compared after every line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import castore
from castore.adapters.gemini import _message, import_gemini
from castore.entries import Message

DATA = Path(__file__).resolve().parent / "data" / "gemini" / "tmp" / "my-app" / "chats"


def gemini_cli_load(lines: list[bytes]) -> list[dict[str, Any]]:
    """The messages gemini-cli's ``loadConversationRecord`` loads from these lines, in order."""
    messages: dict[str, dict[str, Any]] = {}  # a JS Map: setting a known key keeps its place

    def is_message(r: Any) -> bool:
        return isinstance(r, dict) and isinstance(r.get("id"), str)

    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("$rewindTo"), str):
            ids = list(messages)
            if record["$rewindTo"] in messages:
                for i in ids[ids.index(record["$rewindTo"]):]:
                    del messages[i]
            else:
                messages.clear()
        elif is_message(record):
            messages[record["id"]] = record
        elif isinstance(record, dict) and isinstance(record.get("$set"), (dict, list)):
            if isinstance(record["$set"], dict) and isinstance(record["$set"].get("messages"), list):
                messages.clear()
                messages.update((m["id"], m) for m in record["$set"]["messages"] if is_message(m))
        elif isinstance(record, dict) and isinstance(record.get("sessionId"), str) \
                and isinstance(record.get("projectHash"), str) and isinstance(record.get("messages"), list):
            messages.update((m["id"], m) for m in record["messages"] if is_message(m))
    return list(messages.values())


def gemini_cli_history(lines: list[bytes]) -> list[Message]:
    """The turns gemini-cli sends the model for these lines (``convertSessionToClientHistory`` in
    ``packages/core/src/utils/sessionUtils.ts``, over what :func:`gemini_cli_load` loads): no
    ``info``, ``error``, ``warning``, nor a prompt starting with ``/`` or ``?``; a ``gemini``
    message is one model turn (its parts, then its calls), then one turn of its calls' results.
    Each record's blocks are castore's reading of it (:func:`castore.adapters.gemini._message`)."""
    out: list[Message] = []
    for r in gemini_cli_load(lines):
        m = _message(r)
        if m is None or r["type"] in ("info", "error", "warning"):
            continue
        said = [b for b in m.content if b.get("type") != "tool_result"]
        results = [b for b in m.content if b.get("type") == "tool_result"]
        if r["type"] == "user":
            if "".join(b.get("text", "") for b in said).strip().startswith(("/", "?")):
                continue
            out.append(m)
            continue
        if said or not results:
            out.append(Message("assistant", said))
        if results:
            out.append(Message("tool", results))
    return out


def _parts(s: castore.Session) -> int:
    """How many commits on the session's path add to a message recorded before them (its parts)."""
    path = s.entries("HEAD")
    ids = [le.meta.get("gemini", {}).get("id") if le.entry.message is not None else None for le in path]
    said = [i for i in ids if i is not None]
    return sum(1 for a, b in zip(said, said[1:], strict=False) if a == b)


# -- a session as gemini-cli writes it, with checkpoints -------------------------------------------
def _ts(i: int) -> str:
    return f"2026-03-11T10:{i // 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"


def _rec(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def checkpointed_session() -> list[bytes]:
    """The lines gemini-cli's ChatRecordingService writes for two turns with tool calls, then a
    ``$set`` of ``messages`` as ``updateMessagesFromHistory`` writes it after masking a tool's
    output, a turn more, a compression (``setHistory``: a summary and the last turn kept), a
    rewind into the checkpoint's messages, and a turn after it (the record shapes of
    ``recordMessage``, ``recordToolCalls``, ``recordMessageTokens``, ``rewindTo``)."""
    out: list[bytes] = [_rec({"sessionId": "9b2f0c11-7d3e-4a5b-8c6d-1e2f3a4b5c6d", "projectHash": "ab" * 32,
                              "startTime": _ts(0), "lastUpdated": _ts(0)})]
    t = 0

    def user(mid: str, text: str) -> dict[str, Any]:
        nonlocal t
        t += 3
        return {"id": mid, "timestamp": _ts(t), "type": "user", "content": [{"text": text}]}

    def model(mid: str, text: str, **extra: Any) -> dict[str, Any]:
        nonlocal t
        t += 3
        return {"id": mid, "timestamp": _ts(t), "type": "gemini", "content": text, "thoughts": [],
                "tokens": None, "model": "gemini-2.5-pro", **extra}

    def call(cid: str, name: str, args: dict[str, Any], output: str | None) -> dict[str, Any]:
        tc: dict[str, Any] = {"id": cid, "name": name, "args": args, "status": "executing", "timestamp": _ts(t)}
        if output is not None:
            tc.update(status="success", result=[{"functionResponse": {"id": cid, "name": name,
                                                                      "response": {"output": output}}}])
        return tc

    def tokens(k: int) -> dict[str, int]:
        return {"input": 1000 * k, "output": 20 * k, "cached": 500 * k, "thoughts": 0, "tool": 0, "total": 1020 * k}

    def turn(k: int, prompt: str, tool: str, output: str, answer: str) -> list[dict[str, Any]]:
        u = user(f"u{k}", prompt)
        m = model(f"m{k}", f"Looking at {tool}.")
        c = f"read_file-{k}"
        a = model(f"a{k}", answer)
        return [u, {"$set": {"lastUpdated": u["timestamp"]}}, m, {"$set": {"lastUpdated": m["timestamp"]}},
                {**m, "toolCalls": [call(c, "read_file", {"path": tool}, None)]},  # recordToolCalls: executing
                {**m, "toolCalls": [call(c, "read_file", {"path": tool}, output)]},  # ...and its result
                {**m, "toolCalls": [call(c, "read_file", {"path": tool}, output)], "tokens": tokens(k)},
                a, {**a, "tokens": tokens(k + 1)}, {"$set": {"lastUpdated": a["timestamp"]}}]

    recs = turn(1, "What does main.py do?", "main.py", "def main(): serve()", "It starts the server.")
    recs += turn(2, "And util.py?", "util.py", "def helper(): ...", "It holds one helper.")
    history = {}
    for r in recs:
        if "id" in r:
            history[r["id"]] = r
    # updateMessagesFromHistory after masking the first tool's output: every message again, the
    # model's turn with its calls in its content, the masked result in its tool call
    masked = [{**m, "content": m["content"]} for m in history.values()]
    m1 = next(m for m in masked if m["id"] == "m1")
    m1["toolCalls"] = [call("read_file-1", "read_file", {"path": "main.py"}, "[output masked: 20 bytes]")]
    recs.append({"$set": {"messages": masked, "lastUpdated": _ts(t + 1)}})
    recs += turn(3, "Add a --port flag", "cli.py", "parser = argparse.ArgumentParser()", "Added --port.")
    # setHistory after a compression: a summary, the model's acknowledgement, the last turn kept
    kept = [r for r in recs if "id" in r]
    last = {r["id"]: r for r in kept if r["id"] in ("u3", "m3", "a3")}
    summary = [{"id": "s1", "timestamp": _ts(t + 2), "type": "user",
                "content": [{"text": "<state_snapshot>main.py serves; util.py helps</state_snapshot>"}]},
               {"id": "s2", "timestamp": _ts(t + 2), "type": "gemini",
                "content": [{"text": "Got it. Thanks for the additional context!"}]}]
    recs.append({"$set": {"messages": [*summary, *last.values()], "lastUpdated": _ts(t + 2)}})
    recs += turn(4, "Also a --host flag", "cli.py", "parser.add_argument('--port')", "Added --host.")
    recs.append({"$rewindTo": "u4"})  # /rewind to the prompt after the checkpoint's messages
    recs += turn(5, "Only --host, no default", "cli.py", "parser.add_argument('--port')", "Added --host.")
    recs.append({"$rewindTo": "m3"})  # /rewind into the checkpoint's messages
    recs += turn(6, "Start again from the flag", "cli.py", "parser = argparse.ArgumentParser()", "Done.")
    recs.append({"$set": {"summary": "Flags for the server"}})
    return out + [_rec(r) for r in recs]


def updated_session() -> list[bytes]:
    """Messages written again as gemini-cli's recordMessage (pushMessage) may write them: the
    last one (its calls added to its text, their results, its tokens), and earlier ones, after
    later messages (a message recorded again under its id; its tokens only): gemini-cli's replay
    sets each in its place (a JS Map keeps a key's first place), so the conversation keeps its
    order; a rewind and a turn after it."""
    out = [_rec({"sessionId": "5d1e0a77-2b3c-4d5e-8f90-a1b2c3d4e5f6", "projectHash": "cd" * 32,
                 "startTime": _ts(0), "lastUpdated": _ts(0)})]
    u1 = {"id": "u1", "timestamp": _ts(1), "type": "user", "content": [{"text": "What is in src?"}]}
    m1 = {"id": "m1", "timestamp": _ts(2), "type": "gemini", "content": "Let me look.", "thoughts": [],
          "tokens": None, "model": "gemini-2.5-pro"}
    call = {"id": "ls-1", "name": "list_directory", "args": {"path": "src"}, "status": "executing",
            "timestamp": _ts(2)}
    done = {**call, "status": "success", "result": [{"functionResponse": {
        "id": "ls-1", "name": "list_directory", "response": {"output": "main.py util.py"}}}]}
    m1c = {**m1, "toolCalls": [call]}  # recordToolCalls: calls added to a message that held text
    m1r = {**m1, "toolCalls": [done]}
    u2 = {"id": "u2", "timestamp": _ts(3), "type": "user", "content": [{"text": "And main.py?"}]}
    m2 = {"id": "m2", "timestamp": _ts(4), "type": "gemini", "content": "It serves.", "thoughts": [],
          "tokens": None, "model": "gemini-2.5-pro"}
    u3 = {"id": "u3", "timestamp": _ts(5), "type": "user", "content": [{"text": "Thanks"}]}
    recs: list[dict[str, Any]] = [
        u1, m1, m1c, m1r, u2, m2,
        {**m1r, "tokens": {"input": 10, "output": 2, "cached": 0, "thoughts": 0, "tool": 0, "total": 12}},
        {**m1r, "content": "Let me look in src."},  # an earlier message recorded again: its place kept
        {**u1, "content": [{"text": "What is in the src folder?"}]},  # the first one too
        {**m2, "content": "It starts the server."},  # the last one changed
        u3, {**m1r, "content": "Let me look in ./src."},  # again, with two messages after it
        {"$rewindTo": "u2"},
        {**u2, "timestamp": _ts(6), "content": [{"text": "And util.py?"}]},
        {**m2, "id": "m3", "timestamp": _ts(7), "content": "Helpers."},
        {**m1r, "content": "Looked in src."}]
    return out + [_rec(r) for r in recs]


def _cases(tmp_path: Path) -> list[tuple[str, list[bytes]]]:
    main = next(DATA.glob("session-*.jsonl"))
    sub = next(DATA.glob("*/*.jsonl"))
    return [(p.name, p.read_bytes().splitlines(keepends=True)) for p in (main, sub)] + \
        [("session-2026-03-11T10-00-9b2f0c11.jsonl", checkpointed_session()),
         ("session-2026-03-12T10-00-5d1e0a77.jsonl", updated_session())]


@pytest.mark.parametrize("case", [0, 1, 2, 3], ids=["fixture", "subagent", "checkpoints", "updates"])
def test_context_is_what_gemini_cli_loads_after_every_line(tmp_path: Path, case: int) -> None:
    name, lines = _cases(tmp_path)[case]
    f = tmp_path / "line" / "chats" / name
    f.parent.mkdir(parents=True)
    f.write_bytes(b"")
    store = castore.open(str(tmp_path / "store"), durable=False)
    sid = json.loads(lines[0])["sessionId"]
    checkpoints = parts = 0
    for i, line in enumerate(lines, 1):
        with f.open("ab") as out:
            out.write(line)
        import_gemini(store, f)  # as --follow does: one line more each time
        s = store.session("gemini", "line", sid)
        got = s.context().messages
        assert got == gemini_cli_history(lines[:i]), f"after line {i}"
        assert s.context(max_messages=len(got) + 99).messages == got  # read from the tip: the same
        parts = max(parts, _parts(s))
        if b'"$set":{"messages"' in line:
            checkpoints += 1
            assert _parts(s) == 0  # right after a checkpoint: its messages, each whole, as gemini-cli loads them
    assert checkpoints == (2 if case == 2 else 0)
    # calls added to a message that held text: one model turn, as gemini-cli sends it
    assert parts > 0 if case in (2, 3) else True
    if case == 3:  # each message gemini-cli updated in place, after later ones, kept its place
        assert [m.role for m in got] == ["user", "assistant", "tool", "user", "assistant"]
    # the same file imported whole gives the same commits and branches
    whole = castore.open(str(tmp_path / "whole"), durable=False)
    import_gemini(whole, f)
    w = whole.session("gemini", "line", sid)
    assert w.branches() == s.branches() and w.head == s.head
    # each call shows once, with its result after it
    calls = [b["id"] for m in s.context() for b in m.content if b.get("type") == "tool_use"]
    results = [b["tool_use_id"] for m in s.context() for b in m.content if b.get("type") == "tool_result"]
    assert len(calls) == len(set(calls)) and sorted(calls) == sorted(results)


@pytest.mark.parametrize("case", [2, 3], ids=["checkpoints", "updates"])
def test_export_is_byte_exact_and_each_replaced_conversation_keeps_a_branch(tmp_path: Path, case: int) -> None:
    from castore.adapters.gemini import export_gemini

    name, lines = _cases(tmp_path)[case]
    f = tmp_path / "tmp" / "p" / "chats" / name
    f.parent.mkdir(parents=True)
    f.write_bytes(b"".join(lines))
    store = castore.open(str(tmp_path / "store"), durable=False)
    import_gemini(store, f)
    s = store.session("gemini", "p", json.loads(lines[0])["sessionId"])
    # a checkpoint's, or an update's in its place (the path is gemini-cli's conversation, the
    # copies are no lines of the file)
    assert {n.split("-")[0] for n in s.branches()} == {"main", "checkpoint", "rewind"}
    export_gemini(store, tmp_path / "out")
    assert (tmp_path / "out" / "p" / "chats" / f.name).read_bytes() == f.read_bytes()
    assert all(r.lines == 0 for r in import_gemini(store, f))
    if case == 3:
        return
    # usage: each response once, though the checkpoints copy them (the copies are no lines)
    from castore.usage import usage

    seen = {(d["id"], d["model"]): d["tokens"] for d in map(json.loads, lines)
            if d.get("type") == "gemini" and isinstance(d.get("tokens"), dict)}
    r = usage(store, cache=False)
    assert r.total.responses == len(seen) == 12
    assert r.total.tokens.output == sum(t["output"] for t in seen.values())


def test_calls_added_to_a_text_read_as_one_turn(tmp_path: Path) -> None:
    """The text and the calls gemini-cli added to it are two commits: ``log`` says the second
    continues the first, and ``context`` sends them as one model turn, then the results."""
    from castore import views

    f = tmp_path / "p" / "chats" / "session-2026-03-12T10-00-5d1e0a77.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"".join(updated_session()[:5]))  # the metadata, u1, m1, m1 with its call, its result
    store = castore.open(str(tmp_path / "store"), durable=False)
    import_gemini(store, f)
    s = store.session("gemini", "p", "5d1e0a77-2b3c-4d5e-8f90-a1b2c3d4e5f6")
    said = [views.describe(le) for le in s.entries() if le.entry.message is not None]
    assert said == [None, None, "assistant, continued: → list_directory(src)", "tool: ← 1 line: main.py util.py"]
    ctx = s.context()
    assert [m.role for m in ctx] == ["user", "assistant", "tool"]
    assert [b["type"] for b in ctx[1].content] == ["text", "tool_use"]
