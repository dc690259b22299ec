"""``castore context --json`` names the model in force at the end of an imported session's path,
for every agent, from the real files (an imported Codex session said ``"model": null``: its
model is named only in ``turn_context`` lines, which are bookkeeping, not entries)."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
from click.testing import CliRunner

from castore.cli.main import main

DATA = Path(__file__).resolve().parent / "data"


def _cli(store: Path, *args: str) -> str:
    r = CliRunner().invoke(main, ["--store", str(store), *args])
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.parametrize(("vendor", "path", "session", "model"), [
    ("codex", "codex/sample_codex_session.jsonl", "019b64e5", "gpt-5.2-codex"),
    ("claude", "claude-code/session-share", "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68", "claude-opus-4-5-20251101"),
    ("claude", "claude-code/session-share",
     "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.subagents.agent-afbbf75", "claude-haiku-4-5-20251001"),
    ("gemini", "gemini/tmp", "7f3c2a9e-4b1d-4e8a-9c55-2d6b8e0f1a47", "gemini-2.5-pro"),
    ("gemini", "gemini/tmp", "a1b2c3d4-0000-4000-8000-000000000001.json", "gemini-2.5-pro"),  # the older JSON
    ("pi", "pi/before-compaction.jsonl.xz", "ffae836b", "claude-opus-4-5"),
])
def test_context_json_names_the_model_an_imported_session_used(tmp_path: Path, vendor: str, path: str,
                                                               session: str, model: str) -> None:
    src = DATA / path
    if src.suffix == ".xz":
        (tmp_path / "in").mkdir()
        src = tmp_path / "in" / src.stem
        src.write_bytes(lzma.decompress((DATA / path).read_bytes()))
    _cli(tmp_path / "store", "import", vendor, str(src))
    got = json.loads(_cli(tmp_path / "store", "-s", session, "context", "--json"))
    assert got["model"] == model and got["messages"]


def test_the_model_is_the_last_one_named_on_the_path_to_rev(tmp_path: Path) -> None:
    # the real rollout, then a turn on another model, as `/model` in Codex writes it
    lines = (DATA / "codex" / "sample_codex_session.jsonl").read_text().splitlines()
    turn = json.loads(lines[-1])
    assert turn["type"] == "turn_context"
    turn["payload"]["model"] = "gpt-5.1-codex-mini"
    src = tmp_path / "rollout.jsonl"
    src.write_text("\n".join([*lines, json.dumps(turn)]) + "\n")
    _cli(tmp_path / "store", "import", "codex", str(src))
    assert json.loads(_cli(tmp_path / "store", "-s", "019b64e5", "context", "--json"))["model"] == "gpt-5.1-codex-mini"
    assert json.loads(_cli(tmp_path / "store", "-s", "019b64e5", "context", "HEAD~1", "--json"))["model"] == "gpt-5.2-codex"
    assert json.loads(_cli(tmp_path / "store", "-s", "019b64e5", "context", "HEAD~10", "--json"))["model"] is None


def test_a_session_of_no_model_says_null(tmp_path: Path) -> None:
    _cli(tmp_path / "store", "append", "-s", "app/u/s1", "--role", "user", "hello")
    assert json.loads(_cli(tmp_path / "store", "-s", "app/u/s1", "context", "--json"))["model"] is None
