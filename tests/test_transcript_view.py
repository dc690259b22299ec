"""Imported coding-agent sessions read well in the terminal (issue 38, part 1): tool calls,
results, thinking and images in ``log``/``show``/``context``/``log --graph``, bookkeeping
lines left out unless ``--all-entries``, ``--json`` as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from castore.adapters import transcript_view as tv
from castore.cli.main import main
from castore.entries import Message

DATA = Path(__file__).resolve().parent / "data"
SHARE = DATA / "claude-code" / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"
KEY = f"claude/session-share/{SID}"
CODEX = DATA / "codex" / "sample_codex_session.jsonl"
CODEX_KEY = "codex/local/019b64e5-57fa-7463-b644-fba7e456f905"
GEMINI = DATA / "gemini" / "tmp"
GEMINI_SID = "7f3c2a9e-4b1d-4e8a-9c55-2d6b8e0f1a47"
GEMINI_KEY = f"gemini/my-app/{GEMINI_SID}"


def _cli(store: Path, *args: str):
    r = CliRunner().invoke(main, ["--store", str(store), *args])
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = tmp_path_factory.mktemp("transcripts") / "store"
    _cli(s, "import", "claude", str(SHARE))
    _cli(s, "import", "codex", str(CODEX))
    _cli(s, "import", "gemini", str(GEMINI))
    return s


def _lines(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _commits(store: Path, key: str) -> list[dict]:
    return json.loads(_cli(store, "-s", key, "log", "--all", "-n", "0", "--json"))["commits"]


def _by_uuid(store: Path, uuid: str) -> str:
    return next(c["id"] for c in _commits(store, KEY) if c["meta"]["claude"].get("uuid") == uuid)


def _bash_calls() -> list[tuple[str, str]]:
    """(line uuid, command) of every Bash call in the main file."""
    out = []
    for d in _lines(SHARE / f"{SID}.jsonl"):
        for b in (d.get("message") or {}).get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_use" and b.get("name") == "Bash":
                out.append((d["uuid"], b["input"]["command"]))
    return out


def test_log_shows_every_bash_call_with_its_command(store: Path) -> None:
    calls = _bash_calls()
    assert calls
    out = _cli(store, "-s", KEY, "log", "--all", "-n", "0")
    for _, command in calls:
        assert "→ Bash(" + tv.fold(command, tv.ARG_CHARS)[:40] in out
    graph = _cli(store, "-s", KEY, "log", "--graph", "--all", "-n", "0")
    assert "assistant: → Bash(" + tv.fold(calls[0][1], 200)[:20] in graph


def test_show_of_a_tool_call_and_of_its_result(store: Path) -> None:
    uuid, command = _bash_calls()[0]
    cid = _by_uuid(store, uuid)
    out = _cli(store, "-s", KEY, "show", cid)
    assert "[assistant]" in out and "→ Bash(" in out and command not in out  # cut to one line
    assert command in _cli(store, "-s", KEY, "show", "-v", cid)
    # the result answering it: every line of its text with -v, a count without
    def text_of(content: str | list) -> str:
        return content if isinstance(content, str) else "\n".join(b["text"] for b in content if "text" in b)

    results = [(d["uuid"], text_of(b["content"]).splitlines()) for d in _lines(SHARE / f"{SID}.jsonl")
               for b in (d.get("message") or {}).get("content") or []
               if isinstance(b, dict) and b.get("type") == "tool_result"]
    uuid, text = max(results, key=lambda r: len(r[1]))
    assert len(text) > 2
    short = _cli(store, "-s", KEY, "show", _by_uuid(store, uuid))
    assert f"← {len(text)} lines" in short and text[-1].strip() not in short
    full = _cli(store, "-s", KEY, "show", "-v", _by_uuid(store, uuid))
    assert all(ln in full for ln in text)


def test_bookkeeping_lines_hidden_unless_all_entries(store: Path) -> None:
    raw = _lines(SHARE / f"{SID}.jsonl")
    kept = [d for d in raw if d.get("type") not in tv.BOOKKEEPING]
    assert any(d.get("type") == "progress" for d in raw) and len(kept) < len(raw)
    out = _cli(store, "-s", KEY, "log", "--all", "-n", "0", "--oneline")
    assert "[event by progress]" not in out and "progress:" not in out and "file-history-snapshot" not in out
    assert len(out.splitlines()) == len(kept)
    every = _cli(store, "-s", KEY, "log", "--all", "-n", "0", "--oneline", "--all-entries")
    assert "progress: (event)" in every and len(every.splitlines()) == len(raw)
    assert "[event by progress]" in _cli(store, "-s", KEY, "log", "-n", "0", "--all-entries")
    # the limit counts what is shown; HEAD's name moves to the newest entry shown
    ten = _cli(store, "-s", KEY, "log", "--oneline")
    assert len(ten.splitlines()) == 10 and "progress" not in ten
    assert "(HEAD -> " in ten.splitlines()[0]


def test_the_graph_stays_connected_without_the_bookkeeping(store: Path) -> None:
    def widest(*flags: str) -> int:
        out = _cli(store, "-s", KEY, "log", "--graph", "--all", "-n", "0", *flags)
        return max(len(ln.split(" ", 1)[0]) for ln in out.splitlines() if ln.lstrip("|/_ \\*@"))

    assert widest() <= widest("--all-entries")


def test_codex_bookkeeping_hidden(store: Path) -> None:
    out = _cli(store, "-s", CODEX_KEY, "log", "-n", "0", "--oneline")
    raw = _lines(CODEX)
    assert sum(d.get("type") == "turn_context" for d in raw) > 0
    assert "turn_context" not in out and "user: can you analyse the MD files" in out
    assert "turn_context" in _cli(store, "-s", CODEX_KEY, "log", "-n", "0", "--oneline", "--all-entries")


def test_context_shows_calls(store: Path) -> None:
    out = _cli(store, "-s", KEY, "context")
    assert "[assistant] → Task(" in out and "← " in out and "[assistant] ∴ " in out


def test_json_is_unchanged(store: Path) -> None:
    plain = _cli(store, "-s", KEY, "log", "-n", "0", "--json")
    assert plain == _cli(store, "-s", KEY, "log", "-n", "0", "--json", "--all-entries")
    commits = json.loads(plain)["commits"]
    assert any(c["author"] == "progress" for c in commits)
    uuid, _ = _bash_calls()[0]
    cid = _by_uuid(store, uuid)
    assert json.loads(_cli(store, "-s", KEY, "show", cid, "--json"))["summary"] == "assistant:"


def test_codex_and_pi_blocks_read_as_calls() -> None:
    call = Message("assistant", [{"type": "function_call", "name": "shell",
                                  "arguments": json.dumps({"command": ["bash", "-lc", "ls -la"]}), "call_id": "c1"}])
    assert tv.message_lines(call) == ["→ shell(ls -la)"]
    out = Message("tool", [{"type": "function_call_output", "call_id": "c1", "output": "a\nb\nc"}])
    assert tv.message_lines(out) == ["← 3 lines: a b c"]
    assert tv.message_lines(out, verbose=True) == ["← 3 lines", "  a", "  b", "  c"]
    pi = Message("assistant", [{"type": "thinking", "thinking": "first\n\nthen"},
                               {"type": "toolCall", "name": "read", "arguments": {"path": "x.py"}},
                               {"type": "image", "data": "AAAA", "mimeType": "image/png"}])
    assert tv.message_lines(pi) == ["∴ first then", "→ read(x.py)", "[image image/png]"]
    assert tv.message_lines(Message("user", "plain text")) is None  # castore's own reading


def test_a_hostile_tool_call_is_escaped(tmp_path: Path) -> None:
    line = {"type": "assistant", "uuid": "u1", "parentUuid": None, "sessionId": "s1",
            "timestamp": "2026-01-01T00:00:00.000Z",
            "message": {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "Bash\x1b]52;c;eA==\x07",
                 "input": {"command": "echo \x1b[2Jgone\u202e"}}]}}
    src = tmp_path / "proj" / "s1.jsonl"
    src.parent.mkdir()
    src.write_text(json.dumps(line) + "\n")
    store = tmp_path / "store"
    _cli(store, "import", "claude", str(tmp_path / "proj"))
    for args in (("log", "--oneline"), ("log",), ("show", "-v"), ("log", "--graph"), ("context", "-v")):
        out = _cli(store, "-s", "claude/proj/s1", *args)
        assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
        assert "\\x1b" in out


def test_a_real_pi_session_reads_its_calls_results_and_commands(tmp_path: Path) -> None:
    import lzma

    src = tmp_path / "before-compaction.jsonl"
    src.write_bytes(lzma.decompress((DATA / "pi" / "before-compaction.jsonl.xz").read_bytes()))
    raw = _lines(src)
    bash = next(d["message"] for d in raw if (d.get("message") or {}).get("role") == "bashExecution")
    store = tmp_path / "store"
    _cli(store, "import", "pi", str(src))
    key = next(ln.split()[0] for ln in _cli(store, "sessions").splitlines())
    out = _cli(store, "-s", key, "log", "-n", "0", "--oneline")
    assert f"bashExecution: $ {bash['command']} · ← {len(bash['output'].splitlines())} lines" in out
    assert "assistant: → bash(" in out and "tool: ← " in out
    assert "thinking level -> " in out


def test_codex_copies_of_messages_and_its_header_are_bookkeeping(store: Path) -> None:
    # Codex writes each prompt twice (a response_item the model saw, an event_msg its UI
    # replays) and starts with a session_meta header: neither is a turn of its own
    raw = _lines(CODEX)
    assert any(d["type"] == "event_msg" and d["payload"]["type"] == "user_message" for d in raw)
    out = _cli(store, "-s", CODEX_KEY, "log", "-n", "0", "--oneline")
    assert "(event)" not in out and "user_message" not in out and "session_meta" not in out
    assert out.count("can you analyse the MD files") == 1
    every = _cli(store, "-s", CODEX_KEY, "log", "-n", "0", "--oneline", "--all-entries")
    assert "user_message" in every and "session_meta" in every and len(every.splitlines()) == len(raw)


def test_show_of_a_line_with_no_message_prints_the_line(store: Path) -> None:
    # a Claude Code system line (how long the turn took) has no message: show prints its fields
    raw = _lines(SHARE / f"{SID}.jsonl")
    line = next(d for d in raw if d.get("type") == "system" and d.get("subtype") == "turn_duration")
    out = _cli(store, "-s", KEY, "show", _by_uuid(store, line["uuid"]))
    assert 'subtype = "turn_duration"' in out and f"durationMs = {line['durationMs']}" in out
    # a Codex header: an object's fields one a row, a long one cut unless -v
    head = json.loads(_cli(store, "-s", CODEX_KEY, "log", "--all-entries", "-n", "0", "--json"))["commits"][-1]
    instructions = _lines(CODEX)[0]["payload"]["instructions"]
    assert len(instructions) > tv.FIELD_CHARS
    short = _cli(store, "-s", CODEX_KEY, "show", head["id"])
    assert 'payload.cwd = "/Users/macmini/Code/homelab-migration"' in short and "payload.instructions" in short
    assert instructions.splitlines()[-1] not in short
    assert json.dumps(instructions, ensure_ascii=False) in _cli(store, "-s", CODEX_KEY, "show", "-v", head["id"])
    # a Gemini CLI rewind
    rewind = next(c for c in json.loads(_cli(store, "-s", GEMINI_KEY, "log", "-n", "0", "--json"))["commits"]
                  if c["author"] == "rewindTo")
    assert '$rewindTo = "1c2d3e4f-5a6b-4c7d-8e9f-a0b1c2d3e4f5"' in _cli(store, "-s", GEMINI_KEY, "show", rewind["id"])


def test_gemini_subagent_links_both_ways_in_log_and_show(store: Path) -> None:
    sub = f"{GEMINI_SID}.c2d9e1f0-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
    call = next(ln for ln in _cli(store, "-s", GEMINI_KEY, "log", "-n", "0", "--oneline").splitlines()
                if "→ codebase_investigator(" in ln)
    assert f"(subagent: {sub})" in call
    assert f"subagent: {sub}" in _cli(store, "-s", GEMINI_KEY, "show", call.split()[0])
    first = _cli(store, "-s", f"gemini/my-app/{sub}", "log", "-n", "0", "--oneline").splitlines()[-1]
    assert f"(spawned by: {GEMINI_SID} {call.split()[0]}) user: Find where the server binds its address" in first
    assert "subagent of " + GEMINI_SID in _cli(store, "sessions", "gemini")


def test_a_rewind_branch_says_its_first_turn_not_a_bookkeeping_line(store: Path) -> None:
    # the turns a Gemini CLI rewind dropped start with a $set record after the message before them
    out = _cli(store, "-s", GEMINI_KEY, "branch")
    assert "rewind from line 9: user: Now add a --port flag" in out
    assert "rewind from line 81: user: are they still being written?" in _cli(store, "-s", KEY, "branch")


def test_a_line_with_no_message_says_what_it_is_in_log(store: Path) -> None:
    # Claude Code's system lines (an API error retried, how long a turn took) and a Gemini CLI
    # rewind have no message: log reads their stored line instead of printing "(event)"
    raw = _lines(SHARE / f"{SID}.jsonl")
    errors = [d for d in raw if d.get("type") == "system" and d.get("subtype") == "api_error"]
    assert errors
    out = _cli(store, "-s", KEY, "log", "-n", "0", "--oneline")
    assert "(event)" not in out
    assert out.count("system: api_error level=error cause.code=") == len(errors)
    assert "system: turn_duration durationMs=" in out
    long = _cli(store, "-s", KEY, "log", "-n", "0")
    assert "[event by system]" in long and "    turn_duration durationMs=" in long
    graph = _cli(store, "-s", GEMINI_KEY, "log", "--graph", "--all", "-n", "0")
    assert "rewindTo: $rewindTo=1c2d3e4f-5a6b-4c7d-8e9f-a0b1c2d3e4f5" in graph
    # bookkeeping keeps its short form with --all-entries, and --json its own reading
    assert "progress: (event)" in _cli(store, "-s", KEY, "log", "-n", "0", "--oneline", "--all-entries")
    assert all(c["summary"] == "system: (event)" for c in json.loads(_cli(store, "-s", KEY, "log", "-n", "0",
                                                                            "--json"))["commits"]
               if c["author"] == "system" and c["entry"].get("message") is None)


def test_the_note_after_a_cut_log_counts_what_log_shows(store: Path) -> None:
    def note(*args: str) -> str:
        r = CliRunner().invoke(main, ["--store", str(store), *args])
        assert r.exit_code == 0, r.output
        return r.stderr

    # the Codex session shows 3 prompts and hides 8 bookkeeping lines: nothing is left to show
    assert "shows all" not in note("-s", CODEX_KEY, "log", "-n", "3")
    assert note("-s", CODEX_KEY, "log", "-n", "2").strip() == "(the last 2 entries; -n 0 shows all)"
    # with every line shown the total is the path's length
    assert note("-s", CODEX_KEY, "log", "-n", "2", "--all-entries").strip() == \
        f"(the last 2 of {len(_lines(CODEX))} entries; -n 0 shows all)"
    assert "shows all" not in note("-s", CODEX_KEY, "log", "-n", str(len(_lines(CODEX))), "--all-entries")


def test_status_of_a_subagent_names_the_session_and_turn_that_spawned_it(store: Path) -> None:
    sub = f"{KEY}.subagents.agent-a5bdbc1"
    by = json.loads(_cli(store, "-s", sub, "status", "--json"))["subagent_of"]
    assert by["key"] == KEY and by["session"] == SID
    assert by["commit"] in {c["id"] for c in _commits(store, KEY)}  # the Task's result in the parent
    assert f"subagent: of {KEY} (spawned at {by['commit'][:8]})" in _cli(store, "-s", sub, "status")
    gem = json.loads(_cli(store, "-s", f"{GEMINI_KEY}.c2d9e1f0-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "status", "--json"))
    assert gem["subagent_of"]["key"] == GEMINI_KEY
    assert json.loads(_cli(store, "-s", KEY, "status", "--json"))["subagent_of"] is None
    assert "subagent:" not in _cli(store, "-s", KEY, "status")


def test_diff_lists_entries_as_log_does(store: Path) -> None:
    # `castore diff main rewind-81` of the real session listed Claude Code's bookkeeping lines
    # (progress, file-history-snapshot, queue-operation, summary) that log hides, and its system
    # lines as "system: (event)" where log reads them; --all-entries lists every line, as log's
    out = _cli(store, "-s", KEY, "diff", "main", "rewind-81")
    listed = [ln.split()[0] for ln in out.splitlines() if ln.startswith("  ")]
    on_main, on_rewind = ({ln.split()[0] for ln in _cli(store, "-s", KEY, "log", rev, "-n", "0", "--oneline").splitlines()}
                          for rev in ("main", "rewind-81"))
    assert listed and "(event)" not in out and "file-history-snapshot" not in out
    assert sorted(listed) == sorted(on_main ^ on_rewind)
    assert f"only on main ({len(on_main - on_rewind)}):" in out.splitlines()
    every = _cli(store, "-s", KEY, "diff", "main", "rewind-81", "--all-entries")
    assert "file-history-snapshot: (event)" in every and len(every.splitlines()) > len(out.splitlines())
    doc = json.loads(_cli(store, "-s", KEY, "diff", "main", "rewind-81", "--json"))
    assert len(doc["entries1"]) + len(doc["entries2"]) == len([ln for ln in every.splitlines()
                                                               if ln.startswith("  ")])
