"""Session titles (Claude Code's summary or custom title, Codex's first typed prompt, Pi's session
name) in `castore sessions` (table and --json), `status`, and the HTML viewer's session list
and page, from the real session files under tests/data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.viewer import served_index

import castore
from castore.adapters.claude_code import import_claude
from castore.adapters.codex import import_codex
from castore.adapters.pi import import_session
from castore.cli import main as cli
from castore.html import render_session

DATA = Path(__file__).resolve().parent / "data"
CODEX = "019b64e5-57fa-7463-b644-fba7e456f905"
CODEX_PROMPT = "can you analyse the MD files in this directory and determine"  # its first line begins so
CLAUDE = ("claude", "claude-code-log", "todowrite_examples")


@pytest.fixture
def url(tmp_path: Path) -> str:
    u = str(tmp_path / "store")
    pi_file = tmp_path / "pi.jsonl"
    pi_file.write_text("\n".join(json.dumps(x) for x in (
        {"type": "session", "version": 3, "id": "pi-1", "timestamp": "2026-01-01T00:00:00.000Z", "cwd": "/w"},
        {"type": "message", "id": "a1", "parentId": None, "timestamp": "2026-01-01T00:00:01.000Z",
         "message": {"role": "user", "content": "hi", "timestamp": 1}},
        {"type": "session_info", "id": "a2", "parentId": "a1", "timestamp": "2026-01-01T00:00:02.000Z",
         "name": "Refactor the\nparser"},
    )) + "\n")
    with castore.open(u) as st:
        import_codex(st, DATA / "codex")
        import_claude(st, DATA / "claude-code" / "claude-code-log")
        import_session(st, pi_file, session_id="pi-1")
    return u


def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", url, *args], catch_exceptions=False)


def test_titles_in_sessions_and_status(url: str) -> None:
    doc = json.loads(_run(url, "sessions", "--json").stdout)
    titles = {s["key"]: s["title"] for s in doc["sessions"]}
    assert titles[f"codex/local/{CODEX}"].startswith(CODEX_PROMPT)
    assert titles["/".join(CLAUDE)] == "Feature Implementation with Task Management"  # its summary line
    assert titles["pi/local/pi-1"] == "Refactor the parser"  # whitespace folded
    assert titles["claude/claude-code-log/session_b"] is None  # no summary: no title
    table = _run(url, "sessions").stdout.splitlines()
    line = next(x for x in table if x.startswith(f"codex/local/{CODEX}"))
    assert CODEX_PROMPT[:40] in line and line.endswith("…")  # cut to the listing's width
    assert any(x.startswith("/".join(CLAUDE)) and x.endswith("Feature Implementation with Task Management")
               for x in table)
    r = _run(url, "-s", "pi-1", "status")
    assert "title:    Refactor the parser" in r.stdout
    assert json.loads(_run(url, "-s", "pi-1", "status", "--json").stdout)["title"] == "Refactor the parser"
    assert json.loads(_run(url, "-s", "session_b", "status", "--json").stdout)["title"] is None
    assert "title:" not in _run(url, "-s", "session_b", "status").stdout


def test_codex_title_is_the_first_typed_prompt_and_stays(url: str, tmp_path: Path) -> None:
    """Codex's scaffolding (environment context, AGENTS.md) is no title; a re-import keeps the first one."""
    with castore.open(url) as st:
        info = st.session("codex", "local", CODEX).info
        assert not info["name"].startswith("<") and "\n" not in info["name"]
        src = tmp_path / "codex"
        shutil.copytree(DATA / "codex", src)
        f = next(src.glob("*.jsonl"))
        with f.open("a") as out:
            out.write(json.dumps({"timestamp": "2025-12-28T13:00:00.000Z", "type": "response_item", "payload": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "another prompt"}]}})
                + "\n")
        import_codex(st, src)
        assert st.session("codex", "local", CODEX).info["name"] == info["name"]


def test_titles_in_the_viewer(url: str) -> None:
    with castore.open(url) as st:
        page = render_session(st.session(*CLAUDE))
        assert "<title>Feature Implementation with Task Management - claude/claude-code-log/todowrite_examples" in page
        body = served_index(st)
    assert "<th>title</th>" in body and "<td>Feature Implementation with Task Management</td>" in body
    assert "<td>Refactor the parser</td>" in body
