"""Codex rollouts: the real sample round-trips byte for byte; fixtures built from the record
types of openai/codex ``codex-rs/protocol/src/protocol.rs`` (RolloutLine = timestamp + a
``type``/``payload`` RolloutItem: session_meta, response_item, event_msg, turn_context,
compacted) give forks, rollbacks, compaction and function calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers.interrupt import interrupted_everywhere

import castore
from castore.adapters.codex import export_codex, find_rollouts, import_codex
from castore.adapters.jsonl_tree import ArchiveError
from castore.grep import grep

DATA = Path(__file__).resolve().parent / "data" / "codex"
SAMPLE = DATA / "sample_codex_session.jsonl"


def _ts(i: int) -> str:
    return f"2026-01-02T10:{i // 60:02d}:{i % 60:02d}.{i % 1000:03d}Z"


def _line(i: int, type_: str, payload: dict[str, Any]) -> bytes:
    # Codex writes serde_json's compact form, timestamp first
    return json.dumps({"timestamp": _ts(i), "type": type_, "payload": payload}, separators=(",", ":")).encode() + b"\n"


def _meta(tid: str, **extra: Any) -> dict[str, Any]:
    return {"id": tid, "timestamp": _ts(0), "cwd": "/home/me/demo", "originator": "codex_cli_rs", "cli_version": "0.90.0",
            "source": "cli", "model_provider": "openai", "base_instructions": {"text": "You are Codex."}, **extra}


def _turn(i: int, k: int, text: str, model: str = "gpt-5-codex") -> list[bytes]:
    """One user turn: the prompt (response item and its event copy), reasoning, a shell call and its output, an answer."""
    call = f"call_{k}"
    return [
        _line(i, "turn_context", {"cwd": "/home/me/demo", "approval_policy": "on-request", "model": model,
                                  "summary": "auto"}),
        _line(i + 1, "response_item", {"type": "message", "role": "user",
                                       "content": [{"type": "input_text", "text": text}]}),
        _line(i + 2, "event_msg", {"type": "user_message", "message": text, "images": []}),
        _line(i + 3, "response_item", {"type": "reasoning", "summary": [{"type": "summary_text",
                                                                          "text": f"**Planning** step {k}"}],
                                       "content": None, "encrypted_content": "gAAAAB" + "Q" * 40 + str(k)}),
        _line(i + 4, "response_item", {"type": "function_call", "name": "shell",
                                       "arguments": json.dumps({"command": ["rg", "-n", f"needle{k}"]}),
                                       "call_id": call}),
        _line(i + 5, "event_msg", {"type": "exec_command_end", "call_id": call, "stdout": f"src/a.rs:{k}: needle{k}",
                                   "exit_code": 0}),
        _line(i + 6, "response_item", {"type": "function_call_output", "call_id": call,
                                       "output": json.dumps({"output": f"src/a.rs:{k}: needle{k}",
                                                             "metadata": {"exit_code": 0}})}),
        _line(i + 7, "response_item", {"type": "message", "role": "assistant",
                                       "content": [{"type": "output_text", "text": f"answer {k}"}]}),
        _line(i + 8, "event_msg", {"type": "agent_message", "message": f"answer {k}"}),
        _line(i + 9, "event_msg", {"type": "token_count", "info": {"total_token_usage": {"input_tokens": 100 * k}}}),
    ]


def _env(i: int) -> bytes:
    return _line(i, "response_item", {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "<environment_context>\n  <cwd>/home/me/demo</cwd>\n</environment_context>"}]})


PARENT = "0199aaaa-0000-7000-8000-000000000001"
FORK = "0199aaaa-0000-7000-8000-000000000002"
CHILD = "0199aaaa-0000-7000-8000-000000000003"


def _parent_lines() -> list[bytes]:
    lines = [_line(0, "session_meta", _meta(PARENT)), _env(1)]
    lines += _turn(10, 1, "find needle one") + _turn(30, 2, "find needle two") + _turn(50, 3, "find needle three")
    lines.append(_line(70, "event_msg", {"type": "thread_rolled_back", "num_turns": 2}))
    lines += _turn(80, 4, "find needle four instead")
    lines.append(_line(100, "compacted", {"message": "Summary: needles one and four found.",
                                         "replacement_history": []}))
    lines.append(_line(101, "event_msg", {"type": "context_compacted"}))
    lines += _turn(110, 5, "and needle five")
    lines.append(_line(130, "unknown_future_record", {"type": "world_state", "x": [1, 2, 3]}))
    return lines


def _fork_lines(parent: list[bytes], upto: int) -> list[bytes]:
    """A fork: its own meta, then the parent's items (new timestamps), then its own turns."""
    out = [_line(200, "session_meta", _meta(FORK, forked_from_id=PARENT))]
    for k, raw in enumerate(parent[1:upto]):
        d = json.loads(raw)
        d["timestamp"] = _ts(300 + k)
        out.append(json.dumps(d, separators=(",", ":")).encode() + b"\n")
    return out + _turn(400, 9, "fork asks about needle nine", model="gpt-5.1-codex")


@pytest.fixture
def sessions_dir(tmp_path: Path) -> tuple[Path, list[bytes], list[bytes], list[bytes]]:
    day = tmp_path / "sessions" / "2026" / "01" / "02"
    day.mkdir(parents=True)
    parent = _parent_lines()
    fork = _fork_lines(parent, 22)  # copies the meta-less prefix up to the second turn
    child = [_line(500, "session_meta", _meta(CHILD, source={"subagent": {"thread_spawn": {
        "parent_thread_id": PARENT, "depth": 1, "agent_nickname": "scout", "agent_role": "explorer"}}}))]
    child += _turn(510, 7, "subagent looks for needle seven")
    (day / f"rollout-2026-01-02T10-00-00-{PARENT}.jsonl").write_bytes(b"".join(parent))
    (day / f"rollout-2026-01-02T10-03-20-{FORK}.jsonl").write_bytes(b"".join(fork))
    (day / f"rollout-2026-01-02T10-08-20-{CHILD}.jsonl").write_bytes(b"".join(child))
    return tmp_path / "sessions", parent, fork, child


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    return castore.open(str(tmp_path / "store"), durable=False)


def test_real_sample_round_trips(store: castore.Store, tmp_path: Path) -> None:
    r = import_codex(store, SAMPLE)[0]
    assert r.total == len(SAMPLE.read_bytes().splitlines())
    export_codex(store, tmp_path / "out")
    assert (tmp_path / "out" / SAMPLE.name).read_bytes() == SAMPLE.read_bytes()
    s = store.session(*r.session)
    assert s.info["codex"]["path"] == SAMPLE.name and r.session[2] == "019b64e5-57fa-7463-b644-fba7e456f905"


def test_fixture_tree_round_trips_byte_for_byte(store: castore.Store, sessions_dir: Any, tmp_path: Path) -> None:
    root, *_ = sessions_dir
    import_codex(store, root)
    out = tmp_path / "out"
    written = export_codex(store, out)
    assert len(written) == 3
    for f in root.rglob("*.jsonl"):
        assert (out / f.relative_to(root)).read_bytes() == f.read_bytes()


def test_rollback_keeps_dropped_turns_on_a_branch(store: castore.Store, sessions_dir: Any) -> None:
    root, parent, *_ = sessions_dir
    import_codex(store, root)
    s = store.session("codex", "local", PARENT)
    rb = next(i for i, ln in enumerate(parent) if b"thread_rolled_back" in ln)
    assert s.current_branch == "main"
    path = [le.meta["codex"]["o"] for le in s.entries("HEAD")]
    # the rollback hangs before the prompt of turn two (the turn_context before it stays):
    # turns two and three are not on HEAD's path
    first_turn_end = 2 + 10 + 1
    assert path[: first_turn_end] == list(range(first_turn_end)) and path[first_turn_end] == rb
    # the dropped turns keep a branch named for the rollback, from their first line
    assert sorted(s.branches()) == ["main", f"rollback-{first_turn_end}"]
    dropped = [le.meta["codex"]["o"] for le in s.entries(f"rollback-{first_turn_end}")]
    assert dropped == list(range(rb))  # turns one to three
    texts = [m.text for m in s.messages("HEAD")]
    assert "find needle four instead" in texts and "find needle two" not in texts
    assert "compact-" + str(next(i for i, ln in enumerate(parent) if b'"compacted"' in ln)) in s.labels()


def test_fork_shares_the_parent_history(store: castore.Store, sessions_dir: Any) -> None:
    root, *_ = sessions_dir
    import_codex(store, root)
    p = store.session("codex", "local", PARENT)
    f = store.session("codex", "local", FORK)
    assert f.info["forked_from"]["session"] == PARENT
    prefix = f.info["codex"]["prefix"]
    assert len(prefix) == 22 and all("from" in x for x in prefix[1:])  # copied lines: references only
    f_path = [le.id for le in f.entries("HEAD")]
    p_ids = {le.id for le in p.log(all_branches=True)}
    shared = [c for c in f_path if c in p_ids]
    assert len(shared) == 22 and f_path[:22] == shared  # the copy is the parent's own commits
    assert len(f_path) == 22 + 10


def test_subagent_names_its_parent_and_grep_finds_calls_not_secrets(store: castore.Store, sessions_dir: Any) -> None:
    root, *_ = sessions_dir
    import_codex(store, root)
    c = store.session("codex", "local", CHILD)
    assert c.info["spawned_by"]["session"] == PARENT
    calls = list(grep(store, "needle7", tools=["shell"]))
    assert {m.kind for m in calls} == {"tool_call", "tool_result"}
    assert list(grep(store, "gAAAAB", kinds=["text", "thinking", "tool_call", "tool_result"])) == []
    thinking = list(grep(store, "Planning", kinds=["thinking"]))
    assert thinking and all(m.role == "assistant" for m in thinking)
    # the event copy of a prompt is not indexed twice
    assert len(list(grep(store, "find needle two", sessions=[PARENT]))) == 1


def test_incremental_import_and_torn_line(store: castore.Store, sessions_dir: Any, tmp_path: Path) -> None:
    _, parent, *_ = sessions_dir
    f = tmp_path / "r.jsonl"
    f.write_bytes(b"".join(parent[:15]) + parent[15][:7])
    r = import_codex(store, f)[0]
    assert (r.total, r.torn) == (15, 7)
    f.write_bytes(b"".join(parent))
    r = import_codex(store, f)[0]
    assert (r.lines, r.total) == (len(parent) - 15, len(parent))
    assert import_codex(store, f)[0].lines == 0
    export_codex(store, tmp_path / "out")
    assert (tmp_path / "out" / "r.jsonl").read_bytes() == b"".join(parent)
    f.write_bytes(b"".join(parent).replace(b"find needle one", b"find needle ONE"))
    head = store.session("codex", "local", PARENT).head
    r = import_codex(store, f)[0]
    assert r.lines == 0 and "changed" in r.notes[0]
    assert store.session("codex", "local", PARENT).head == head


def test_a_folder_above_or_below_sessions_names_each_rollout_as_sessions_does(store: castore.Store,
                                                                              sessions_dir: Any) -> None:
    root, parent, *_ = sessions_dir
    first = import_codex(store, root)
    # ~/.codex, then one year of ~/.codex/sessions: the same files, so nothing new and no second session
    for again in (root.parent, root / "2026"):
        assert sum(r.lines for r in import_codex(store, again)) == 0
    assert sorted(s.session for s in store.sessions("codex")) == sorted(r.session[2] for r in first)
    assert {src.rel for src in find_rollouts(root.parent)} == {src.rel for src in find_rollouts(root)}


def test_find_rollouts_errors(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError):
        find_rollouts(tmp_path / "missing")
    with pytest.raises(ArchiveError):
        find_rollouts(tmp_path)


def test_scaffolding_is_flagged_and_grep_typed_finds_only_the_prompt(store: castore.Store, sessions_dir: Any) -> None:
    import_codex(store, SAMPLE)
    s = store.session("codex", "local", "019b64e5-57fa-7463-b644-fba7e456f905")
    flags = [le.meta.get("injected") for le in s.entries() if le.entry.message is not None]
    assert flags[:3] == ["agents_md", "environment_context", None]  # the third is the human's prompt
    assert {le.meta.get("injected") for le in s.entries() if le.meta["codex"].get("type") == "turn_context"} == {
        "turn_context"}
    assert list(grep(store, "AGENTS", typed=True)) == [] and list(grep(store, "AGENTS"))
    assert [m.lines[0].text[:12] for m in grep(store, "analyse", typed=True)] == ["can you anal"]
    root, *_ = sessions_dir
    import_codex(store, root)
    # a subagent's prompt is written by its parent agent; its answer is the agent's
    child = store.session("codex", "local", CHILD)
    assert [le.meta.get("injected") for le in child.entries() if le.entry.message is not None
            and le.entry.message.role == "user"] == ["subagent"]
    assert list(grep(store, "subagent looks", typed=True)) == []
    assert len(list(grep(store, "answer 7", typed=True))) == 1
    # the compaction summary is Codex's, the answers around it the model's
    assert list(grep(store, "needles one and four", typed=True)) == [] and list(grep(store, "needles one and four"))


def test_entries_appended_with_castore_are_exported_as_records_and_come_back(store: castore.Store,
                                                                            tmp_path: Path) -> None:
    from castore import Compaction, Message

    f = tmp_path / "in" / SAMPLE.name
    f.parent.mkdir()
    f.write_bytes(SAMPLE.read_bytes())
    r = import_codex(store, f)[0]
    s = store.session(*r.session)
    ids = s.append_many([
        Message("user", [{"type": "input_text", "text": "castore asks: is the plan clear?"}]),
        Message("assistant", [{"type": "reasoning", "text": "check the MD files"},
                              {"type": "output_text", "text": "Mostly; two gaps."}],
                tool_calls=[{"id": "call_9", "function": {"name": "shell", "arguments": '{"command": ["ls"]}'}}]),
        Message("tool", "PLAN.md", tool_call_id="call_9"),
        Compaction(summary="The plan has two gaps."),
    ], times=[1.8e9, 1.8e9 + 1, 1.8e9 + 2, 1.8e9 + 3])
    out = tmp_path / "out"
    export_codex(store, out)
    got = (out / SAMPLE.name).read_bytes()
    orig = SAMPLE.read_bytes()
    assert got.startswith(orig)
    recs = [json.loads(ln) for ln in got[len(orig):].splitlines()]
    assert [(d["type"], d["payload"].get("type")) for d in recs] == [
        ("response_item", "message"), ("response_item", "reasoning"), ("response_item", "message"),
        ("response_item", "function_call"), ("response_item", "function_call_output"), ("compacted", None)]
    assert [d["castore_commit"] for d in recs] == [ids[0], ids[1], ids[1], ids[1], ids[2], ids[3]]
    assert recs[0]["timestamp"] == "2027-01-15T08:00:00.000Z" and list(recs[0])[:3] == ["timestamp", "type", "payload"]
    # another store reads them as Codex records
    other = castore.open(str(tmp_path / "other"), durable=False)
    import_codex(other, out)
    msgs = [le.entry.message for le in other.session(*r.session).entries("HEAD")[-6:]]
    assert msgs[0].content[0]["text"] == "castore asks: is the plan clear?"
    assert msgs[1].content[0]["text"] == "check the MD files" and msgs[2].content[0]["text"] == "Mostly; two gaps."
    assert msgs[3].content[0]["name"] == "shell" and msgs[4].content[0]["output"] == "PLAN.md"
    assert msgs[5].content[0]["text"] == "The plan has two gaps."
    assert len(list(grep(other, "two gaps", typed=True))) == 1  # the answer, not the compaction
    # the same store, with the exported file upstream: the records are those commits, nothing is added
    n_before = len(s.log(all_branches=True))
    f.write_bytes(got)
    r2 = import_codex(store, f)[0]
    assert r2.lines == 6 and len(s.log(all_branches=True)) == n_before and s.head == ids[-1]
    export_codex(store, tmp_path / "out2")
    assert (tmp_path / "out2" / SAMPLE.name).read_bytes() == got


def test_import_stopped_at_any_ref_move_is_finished_by_the_next(sessions_dir: Any, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root, *_ = sessions_dir
    for store in interrupted_everywhere(tmp_path, monkeypatch, lambda s: import_codex(s, root), app="codex"):
        out = tmp_path / f"out-{Path(str(store.url)).name}"
        assert len(export_codex(store, out)) == 3
        for f in root.rglob("*.jsonl"):
            assert (out / f.relative_to(root)).read_bytes() == f.read_bytes()
        assert all(r.lines == 0 and not r.notes for r in import_codex(store, root))


def test_deeply_nested_lines_are_kept_as_they_are(store: castore.Store, tmp_path: Path) -> None:
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    deep = [b"[" * 5000 + b"]" * 5000 + b"\n", b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n",
            json.dumps({"timestamp": "2026-01-01T00:00:00Z", "type": "response_item", "payload": {
                "type": "message", "role": "user", "content": json.loads("[" * 500 + "]" * 500)}}).encode() + b"\n"]
    body = b"".join(lines[:3] + deep + lines[3:])
    f = tmp_path / "r.jsonl"
    f.write_bytes(body)
    r = import_codex(store, f)[0]
    assert r.total == len(lines) + 3 and sum("not JSON" in n for n in r.notes) == 2
    export_codex(store, tmp_path / "out")
    assert (tmp_path / "out" / "r.jsonl").read_bytes() == body


def test_a_reasoning_record_whose_summary_is_no_list_is_kept_without_a_message(store: castore.Store,
                                                                              tmp_path: Path) -> None:
    # (a string summary stopped the whole import with a TypeError)
    body = b"".join([_line(0, "session_meta", _meta("t-odd")),
                     _line(1, "response_item", {"type": "reasoning", "summary": "a string"}),
                     _line(2, "response_item", {"type": "reasoning", "summary": [{"text": "kept"}],
                                                "content": {"text": "a dict"}})])
    f = tmp_path / "r.jsonl"
    f.write_bytes(body)
    r = import_codex(store, f)[0]
    said = {le.meta["codex"]["o"]: le.entry.message for le in store.session(*r.session).log()}
    assert said[1] is None and said[2] is not None and said[2].content == [{"type": "reasoning", "text": "kept"}]
    export_codex(store, tmp_path / "out")
    assert (tmp_path / "out" / "r.jsonl").read_bytes() == body


def test_a_file_without_a_final_newline_stays_jsonl_when_castore_appended(store: castore.Store,
                                                                          tmp_path: Path) -> None:
    from castore import Message

    cut = SAMPLE.read_bytes()[:-1]  # the real rollout, its last newline removed
    f = tmp_path / "in" / SAMPLE.name
    f.parent.mkdir()
    f.write_bytes(cut)
    s = store.session(*import_codex(store, f)[0].session)
    ids = s.append_many([Message("user", [{"type": "input_text", "text": "castore asks: still there?"}])],
                        times=[1.8e9])
    export_codex(store, tmp_path / "out")
    got = (tmp_path / "out" / SAMPLE.name).read_bytes()
    assert got.startswith(cut + b"\n") and all(isinstance(json.loads(ln), dict) for ln in got.splitlines())
    assert json.loads(got.splitlines()[-1])["castore_commit"] == ids[0]
    f.write_bytes(got)
    r = import_codex(store, f)[0]
    assert r.lines == 1 and not r.notes and s.head == ids[0]
    export_codex(store, tmp_path / "out2")
    assert (tmp_path / "out2" / SAMPLE.name).read_bytes() == got


def test_a_spawned_subagent_links_both_ways(store: castore.Store, tmp_path: Path) -> None:
    """A parent's ``spawn_agent`` call and its output (``{"agent_id": THREAD}``, codex-rs
    ``tools/handlers/collab.rs``) and the subagent's thread (``source.subagent.thread_spawn``):
    ``log`` shows ``subagent: THREAD`` on the call and its output, and ``spawned by: PARENT
    <call>`` on the subagent's first message; the parent archived first or last, the file
    imported whole or line by line."""
    from castore import views

    spawn_args = json.dumps({"message": "look for needle seven"})
    parent = [_line(0, "session_meta", _meta(PARENT)), *_turn(10, 1, "find needle one"),
              _line(20, "response_item", {"type": "function_call", "name": "spawn_agent",
                                          "arguments": spawn_args, "call_id": "call_spawn"}),
              _line(21, "response_item", {"type": "function_call_output", "call_id": "call_spawn",
                                          "output": json.dumps({"agent_id": CHILD})}),
              *_turn(30, 2, "and needle two")]
    child = [_line(25, "session_meta", _meta(CHILD, source={"subagent": {"thread_spawn": {
        "parent_thread_id": PARENT, "depth": 1}}})), *_turn(26, 7, "subagent looks for needle seven")]
    day = tmp_path / "sessions" / "2026" / "01" / "02"
    day.mkdir(parents=True)
    pf, cf = day / f"rollout-2026-01-02T10-00-00-{PARENT}.jsonl", day / f"rollout-2026-01-02T10-00-25-{CHILD}.jsonl"
    pf.write_bytes(b"")
    for raw in parent[:22]:  # line by line, as --follow does, the call and its output apart
        with pf.open("ab") as f:
            f.write(raw)
        import_codex(store, pf)
    cf.write_bytes(b"".join(child))
    import_codex(store, cf)
    with pf.open("ab") as f:
        f.write(b"".join(parent[22:]))
    import_codex(store, pf)
    p, c = store.session("codex", "local", PARENT), store.session("codex", "local", CHILD)
    by_line = {le.meta["codex"]["o"]: le.id for le in p.entries()}
    call, output = by_line[len(_turn(10, 1, "x")) + 1], by_line[len(_turn(10, 1, "x")) + 2]
    links = views.links(p)
    assert links[call] == [f"subagent: {CHILD}"] and links[output] == [f"subagent: {CHILD}"]
    first = next(le.id for le in c.entries() if le.entry.message is not None)
    assert views.links(c) == {first: [f"spawned by: {PARENT} {call[:8]}"]}
    assert views.spawned_by(c.info) == {"key": f"codex/local/{PARENT}", "session": PARENT, "commit": call}
    # the same files in a store that archives the child first: the child's link names the parent only
    other = castore.open(str(tmp_path / "other"), durable=False)
    import_codex(other, cf)
    import_codex(other, pf)
    c2 = other.session("codex", "local", CHILD)
    assert views.links(other.session("codex", "local", PARENT))[call] == [f"subagent: {CHILD}"]
    assert views.links(c2) == {first: [f"spawned by: {PARENT}"]}
    export_codex(store, tmp_path / "out")
    for f in (pf, cf):
        assert (tmp_path / "out" / f.relative_to(tmp_path / "sessions")).read_bytes() == f.read_bytes()
