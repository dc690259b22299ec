"""A write to an encrypted store without its master key is one clear error that writes nothing:
before, ``castore import`` or ``append`` without a key left an empty pack log (its 8-byte
header) in the new tenant's folder, and every later write with the right key was refused as
"no data key ..., yet the tenant holds data: its key file was lost" (a tenant made unusable by
a command that failed). Real processes, local disk (where a writer appends to a pack log)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from castore.crypto.keys import MasterKey

SRC = Path(__file__).parent / "data" / "claude-code" / "claude-code-log" / "representative_messages.jsonl"


def _castore(store: Path, *args: str, key: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTORE_MASTER_KEY")}
    if key is not None:
        env["CASTORE_MASTER_KEY"] = key
    return subprocess.run([sys.executable, "-m", "castore", "--store", str(store), *args],
                          capture_output=True, text=True, env=env)


def _written(store: Path) -> list[str]:
    """Every file in the store's tenants' folders."""
    return sorted(str(p.relative_to(store)) for p in (store / "tenants").rglob("*") if p.is_file())


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str]:
    key = MasterKey.new()
    store = tmp_path / "store"
    r = _castore(store, "init", "--encrypted", key=key)
    assert r.returncode == 0, r.stderr
    return store, key


@pytest.mark.parametrize("wrong", [False, True], ids=["no key", "wrong key"])
def test_an_import_without_the_key_writes_nothing_and_the_next_one_with_it_works(
        store: tuple[Path, str], tmp_path: Path, wrong: bool) -> None:
    path, key = store
    src = tmp_path / "claude" / "s1.jsonl"
    src.parent.mkdir()
    src.write_bytes(SRC.read_bytes())
    r = _castore(path, "import", "claude", str(src), key=MasterKey.new() if wrong else None)
    assert r.returncode == 1 and r.stderr.startswith("Error: ") and len(r.stderr.splitlines()) == 1, r.stderr
    assert _written(path) == []
    r = _castore(path, "import", "claude", str(src), key=key)
    assert r.returncode == 0, r.stderr
    r = _castore(path, "grep", "decorators", key=key)
    assert r.returncode == 0 and "decorators" in r.stdout, r.stderr


def test_an_append_without_the_key_writes_nothing(store: tuple[Path, str]) -> None:
    path, key = store
    r = _castore(path, "-s", "app/alice/s1", "append", "--role", "user", "hello", key=None)
    assert r.returncode == 1 and "master key" in r.stderr, r.stderr
    assert _written(path) == []
    r = _castore(path, "-s", "app/alice/s1", "append", "--role", "user", "hello", key=key)
    assert r.returncode == 0, r.stderr
    r = _castore(path, "-s", "app/alice/s1", "context", key=key)
    assert r.returncode == 0 and "hello" in r.stdout, r.stderr
