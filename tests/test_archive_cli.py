"""The archive commands: import/export claude and codex through the CLI, errors as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore import porcelain
from castore.cli.main import main

DATA = Path(__file__).resolve().parent / "data"


def _cli(tmp_path: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(tmp_path / "store"), *args])


def test_import_claude_json_then_again_adds_nothing(tmp_path: Path) -> None:
    src = str(DATA / "claude-code" / "claude-code-log")
    r = _cli(tmp_path, "import", "claude", src, "--json")
    assert r.exit_code == 0, r.output
    docs = json.loads(r.stdout)
    assert {d["session"] for d in docs} >= {"claude/claude-code-log/session_b"}
    assert all(d["lines"] == d["total"] > 0 for d in docs)
    r = _cli(tmp_path, "import", "claude", src, "--json")
    assert all(d["lines"] == 0 for d in json.loads(r.stdout))
    r = _cli(tmp_path, "export", "claude", str(tmp_path / "out"), "-s", "claude/claude-code-log/session_b")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["claude-code-log/session_b.jsonl"]
    assert (tmp_path / "out" / "claude-code-log" / "session_b.jsonl").read_bytes() == \
        (DATA / "claude-code" / "claude-code-log" / "session_b.jsonl").read_bytes()


def test_import_codex_and_export_codex(tmp_path: Path) -> None:
    r = _cli(tmp_path, "import", "codex", str(DATA / "codex" / "sample_codex_session.jsonl"))
    assert r.exit_code == 0 and r.stdout.startswith("codex/local/019b64e5")
    r = _cli(tmp_path, "export", "codex", str(tmp_path / "out"))
    assert r.exit_code == 0
    assert (tmp_path / "out" / "sample_codex_session.jsonl").read_bytes() == \
        (DATA / "codex" / "sample_codex_session.jsonl").read_bytes()


def test_errors_are_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = _cli(tmp_path, "import", "claude", str(tmp_path / "empty"))
    assert r.exit_code == 1 and r.stderr.startswith("Error: ") and "no Claude Code session" in r.stderr
    r = _cli(tmp_path, "import", "codex", str(tmp_path / "empty"))
    assert r.exit_code == 1 and "no Codex rollout" in r.stderr
    r = _cli(tmp_path, "export", "claude", str(tmp_path / "out"))
    assert r.exit_code == 1 and r.stderr.startswith("Error: ")  # no store yet


def test_grep_typed_leaves_out_what_the_cli_wrote(tmp_path: Path) -> None:
    assert _cli(tmp_path, "import", "claude", str(DATA / "claude-code" / "session-share")).exit_code == 0
    r = _cli(tmp_path, "grep", "curry", "--role", "user", "-c")
    assert r.exit_code == 0 and sum(int(ln.rsplit(":", 1)[1]) for ln in r.stdout.splitlines()) == 9
    r = _cli(tmp_path, "grep", "curry", "--role", "user", "--typed", "--json")
    docs = json.loads(r.stdout)["matches"]
    assert r.exit_code == 0 and [d["lines"][0]["text"][:12] for d in docs] == ["Spaw sub-age"]
    assert _cli(tmp_path, "grep", "task-notification", "--typed").exit_code == 1  # found only untyped


def test_grep_json_writer_is_json_dumps_indent_2() -> None:
    """grep --json's writer gives json.dumps(indent=2, ensure_ascii=False)'s text exactly,
    and leaves what it does not know to json itself."""
    import json

    from castore.cli.grep_search import _indented_json

    docs: list[object] = [
        {}, [], {"matches": []}, "s", 3, None, (1, (2,)), {1: "int key"}, [None, True, "a", 1],
        {"a": [1, 2.5, -0.0, 1e300, float("nan"), float("inf"), True, False, None,
               'q"\\\n\x01é\u2028😀', [], {}, [[1, 2], [3]], {"k": {"z": ()}, "n": None, "i": 5}]},
    ]
    for doc in docs:
        assert _indented_json(doc) == json.dumps(doc, indent=2, ensure_ascii=False)
    with pytest.raises(TypeError):
        _indented_json({"a": object()})


@pytest.mark.parametrize("vendor", ["claude", "codex", "gemini"])
def test_export_refuses_a_session_whose_branch_is_lost_and_writes_nothing(tmp_path: Path, vendor: str) -> None:
    # HEAD named a branch whose ref was gone: `export` wrote the file empty (0 bytes), over the
    # agent's own when restoring in place; now one Error line, no file written, the original kept
    import shutil

    data = Path(__file__).resolve().parent / "data"
    src = {"claude": data / "claude-code" / "session-share",
           "codex": data / "codex" / "sample_codex_session.jsonl",
           "gemini": data / "gemini" / "tmp"}[vendor]
    url = str(tmp_path / "store")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", url, "import", vendor, str(src)]).exit_code == 0
    with castore.open(url) as st:
        s = st.session(*next(k for k in porcelain.session_keys(st) if "." not in k[2]))
        st.refs.delete(s.refs.branch("main"), st.refs.read(s.refs.branch("main")))
        assert s.head is None
    out = tmp_path / "restore"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = runner.invoke(main, ["--store", url, "export", vendor, str(out)])
    assert res.exit_code == 1 and res.stdout == "" and res.stderr.count("\n") == 1, res.output
    assert res.stderr.startswith("Error: ") and "archived lines but no commit on HEAD's path" in res.stderr
    assert sorted(p.name for p in out.rglob("*")) == ["keep.txt"]
    shutil.rmtree(out)
