"""The README's library example runs as written (against a fresh local store)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_library_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text()
    block = re.search(r"## Use it as a library\n\n```python\n(.*?)```", text, re.S)
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
