"""castore usage's cache file damaged, edited or written by another version: it is derived data,
so the run reads the store again and gives what a run without the cache gives, one report and
exit 0, never a traceback (a mark that was no string, a session that was no object, a row of
another shape: AttributeError, TypeError, IndexError from deep in the report before)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main
from castore.entries import Message


def _store(tmp_path: Path) -> str:
    url = str(tmp_path / "store")
    with castore.open(url) as st:
        for i in range(3):
            meta = {"model": "claude-sonnet-4-5", "usage": {"input_tokens": 10 + i, "output_tokens": 1}}
            st.session("agents", "u", f"s{i}").append(Message(role="assistant", content=f"a{i}"), meta=meta)
    return url


def _usage(url: str, *more: str) -> Any:
    r = CliRunner().invoke(main, ["--store", url, "usage", "--json", "--by", "session", *more])
    assert r.exit_code == 0, (r.output, r.exception)
    return json.loads(r.stdout)


def _first(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["sessions"][sorted(doc["sessions"])[0]]


DAMAGE: dict[str, Callable[[dict[str, Any]], None]] = {
    "mark-a-list": lambda d: d.update(mark=[1, 2]),
    "mark-an-object": lambda d: d.update(mark={"a": 1}),
    "session-a-number": lambda d: d["sessions"].update({sorted(d["sessions"])[0]: 5}),
    "key-too-short": lambda d: _first(d).update(key=["agents"]),
    "rows-a-number": lambda d: _first(d).update(rows=7),
    "row-too-short": lambda d: _first(d).update(rows=[[1]]),
    "row-count-a-string": lambda d: _first(d)["rows"][0].__setitem__(4, "10"),
    "row-model-a-number": lambda d: _first(d)["rows"][0].__setitem__(2, 5),
    "refs-a-list": lambda d: _first(d).update(refs=[]),
    "not-an-object": lambda d: d.clear(),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_cache_is_read_as_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    cache = tmp_path / "usage-cache.json"
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(cache))
    url = _store(tmp_path)
    want = _usage(url, "--no-cache")
    assert _usage(url) == want and cache.exists()
    doc = json.loads(cache.read_text())
    DAMAGE[damage](doc)
    cache.write_text(json.dumps(doc if doc else [1]))
    assert _usage(url) == want
    remade = json.loads(cache.read_text())  # made again whole, every session in it
    assert len(remade["sessions"]) == 3 and isinstance(remade["mark"], str)
    assert _usage(url) == want


def test_a_newer_versions_cache_is_passed_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "usage-cache.json"
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(cache))
    url = _store(tmp_path)
    want = _usage(url, "--no-cache")
    _usage(url)
    doc = json.loads(cache.read_text())
    doc["version"] += 1
    _first(doc)["rows"] = {"another": "shape"}
    cache.write_text(json.dumps(doc))
    assert _usage(url) == want


def test_a_named_pipe_at_the_cache_path_is_no_cache(tmp_path: Path) -> None:
    """A named pipe where the cache file goes: the run read it and waited forever for a writer;
    now it is no cache, and the cache is written in its place. A real process (no wall clock:
    before, communicate() never returned)."""
    import os
    import subprocess
    import sys

    cache = tmp_path / "usage-cache.json"
    os.mkfifo(cache)
    url = _store(tmp_path)
    env = {**os.environ, "CASTORE_USAGE_CACHE": str(cache)}
    r = subprocess.run([sys.executable, "-m", "castore", "--store", url, "usage", "--json", "--by", "session"],
                       capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == _usage(url, "--no-cache") and cache.is_file()
