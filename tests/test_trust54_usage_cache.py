"""A deleted session leaves no copy in castore usage's cache (``$XDG_CACHE_HOME/castore/usage``):
after ``delete-session``, ``expire`` or a ``gc`` that applies the store's retention, the cache
file no longer names the session nor its model (before, it kept both until the next
``castore usage``, while the store and the search index had forgotten them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main
from castore.entries import Message
from castore.usage import cache_path

#: the deleted session's name and model, in no other session
NAMES = (b"doomedsess", b"qqmodel7")


def _run(url: str, *args: str) -> str:
    r = CliRunner().invoke(main, ["--store", url, *args])
    assert r.exit_code == 0, r.output
    return r.output


@pytest.fixture
def cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A store of two sessions whose usage cache names both: (store URL, cache file)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    url = str(tmp_path / "store")
    with castore.open(url) as st:
        for sid, model in (("keeper", "claude-sonnet-4-5"), ("doomedsess", "qqmodel7")):
            meta = {"model": model, "usage": {"input_tokens": 10, "output_tokens": 1}}
            st.session("app", "alice", sid).append(Message(role="assistant", content="words"), meta=meta)
        path = cache_path(st)
    assert "qqmodel7" in _run(url, "usage")
    assert all(w in Path(path).read_bytes() for w in NAMES)  # the test sees them while they are there
    return url, path


def _left(path: str) -> list[bytes]:
    data = Path(path).read_bytes() if os.path.exists(path) else b""
    return [w for w in NAMES if w in data]


def test_delete_session_drops_it_from_the_usage_cache(cached: tuple[str, str]) -> None:
    url, path = cached
    _run(url, "delete-session", "app/alice/doomedsess")
    assert _left(path) == []
    assert "qqmodel7" not in _run(url, "usage")  # and the cache still serves
    assert "claude-sonnet-4-5" in _run(url, "usage")


def test_expire_drops_the_expired_sessions_from_the_usage_cache(cached: tuple[str, str]) -> None:
    url, path = cached
    _run(url, "expire", "--older-than", "0")
    assert _left(path) == []


def test_gc_applying_retention_drops_them_from_the_usage_cache(cached: tuple[str, str]) -> None:
    url, path = cached
    cfg = Path(url, "castore.json")
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "retention": "0s"}))
    _run(url, "gc", "--grace", "0")
    assert _left(path) == []


#: ``castore usage`` killed (SIGKILL, as the OOM killer does) after writing its new cache file and
#: before renaming it into place
_KILLED_USAGE = """
import os, signal, sys
from castore.usage import cache
cache.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)
from castore.cli.main import main
main(["--store", sys.argv[1], "usage"])
"""


def test_a_usage_run_killed_while_saving_leaves_no_copy_once_the_session_is_deleted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(tmp_path / "cache" / "usage.json"))  # a folder of its own
    url = str(tmp_path / "store")
    with castore.open(url) as st:
        meta = {"model": "qqmodel7", "usage": {"input_tokens": 10, "output_tokens": 1}}
        st.session("app", "alice", "doomedsess").append(Message(role="assistant", content="words"), meta=meta)
        folder = Path(cache_path(st)).parent
    folder.mkdir()
    r = subprocess.run([sys.executable, "-c", _KILLED_USAGE, url], capture_output=True)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert any(all(w in p.read_bytes() for w in NAMES) for p in folder.iterdir())  # its new cache, not renamed
    _run(url, "delete-session", "app/alice/doomedsess")
    assert [p.name for p in folder.iterdir() if any(w in p.read_bytes() for w in NAMES)] == []
