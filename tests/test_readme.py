"""The README's library example runs as written (against a fresh local store)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_library_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text()
    block = re.search(r"## Use it as a library\n\n```python\n(.*?)```", text, re.DOTALL)
    assert block, "the README lost its library example"
    monkeypatch.setenv("CASTORE_STORE", str(tmp_path / "store"))
    scope: dict[str, Any] = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)  # noqa: S102 - our own README
    s = scope["s"]
    assert s.current_branch == "retry"
    assert s.state(scope["q"]) == {}
    assert [m.role for m in s.messages("main")] == ["user", "assistant", "tool", "assistant"]
    assert s.state("main")["last_city"] == "Beijing"
    assert s.store.session("weather-app", "alice", "s2").exists()


def test_readme_opens_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    block = lines[lines.index("```") + 1 : lines.index("```", lines.index("```") + 1)]
    assert [ln.split()[0] for ln in block] == ["scripts/demo", "scripts/test"]


def test_readme_archive_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_server: Any) -> None:
    """Every command of the coding-agent archive section runs, on copies of the real files."""
    import shlex
    import shutil
    import uuid

    import s3server
    from click.testing import CliRunner

    from castore.cli.main import main

    data = Path("/work/shared/data")
    if not data.exists():
        data = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not data.exists():
        pytest.skip("shared Claude Code / Codex data not available")
    text = README.read_text()
    block = re.search(r"## Archive your coding-agent sessions\n.*?```\n(.*?)```", text, re.DOTALL)
    assert block, "the README lost its archive example"
    projects = tmp_path / "claude" / "projects"
    shutil.copytree(data / "claude-code" / "session-share", projects / "-home-me-app",
                    ignore=shutil.ignore_patterns("LICENSE"))
    codex = tmp_path / "codex" / "sessions" / "2025" / "12" / "28"
    codex.mkdir(parents=True)
    shutil.copy(data / "codex" / "sample_codex_session.jsonl", codex / "rollout-2025-12-28T12-18-30-x.jsonl")
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    s3server.make_bucket(moto_server.endpoint_url, bucket)
    for k, v in s3server._env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CASTORE_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "index"))
    monkeypatch.chdir(tmp_path)
    subst = {"~/.claude/projects": str(projects), "~/.codex/sessions": str(tmp_path / "codex" / "sessions"),
             "s3://bucket/agents": f"s3://{bucket}/agents",
             "endpoint_url=http://127.0.0.1:9000": f"endpoint_url={moto_server.endpoint_url}"}
    ran = 0
    for line in block.group(1).splitlines():
        cmd = line.split("  #")[0].strip()
        for a, b in subst.items():
            cmd = cmd.replace(a, b)
        args = shlex.split(cmd)
        assert args[0] == "castore"
        r = CliRunner().invoke(main, args[1:])
        assert r.exit_code == 0, (line, r.output, r.exception)
        ran += 1
    assert ran >= 8
    assert (tmp_path / "session.html").stat().st_size > 1000
    assert (tmp_path / "restored" / "-home-me-app" / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl").read_bytes() == \
        (projects / "-home-me-app" / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl").read_bytes()
