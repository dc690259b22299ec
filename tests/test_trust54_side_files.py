"""An imported Claude Code session's side files (the files beside its JSONL, ``<session>/tool-results/...``:
blobs its info names) are reachable: ``gc`` keeps them, ``fsck`` checks them and a push or clone
carries them, in a plain store and in an encrypted one (whose info is sealed). Before, nothing
followed the info's ``files``: ``castore gc --grace 0`` right after the import deleted them
(and any gc once the grace period had passed), ``fsck`` said ok, and ``export claude`` then
failed with "object ... not found"; a pushed copy had none. Real processes, a real S3 server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Backend, backend_on

import castore
from castore.adapters.jsonl_tree import read_blobs
from castore.crypto.keys import MasterKey
from castore.maintenance import fsck
from castore.sync import push

backend = backend_on("local", "s3")

SRC = Path(__file__).parent / "data" / "claude-code" / "claude-code-log" / "representative_messages.jsonl"
SIDE = b"a tool's output Claude Code kept beside the session\n"


def _castore(store: str, *args: str, key: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASTORE_MASTER_KEY")}
    if key is not None:
        env["CASTORE_MASTER_KEY"] = key
    r = subprocess.run([sys.executable, "-m", "castore", "--store", store, *args], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _projects(tmp_path: Path) -> Path:
    """A Claude Code projects folder: one session and a side file of it."""
    proj = tmp_path / "projects" / "proj"
    (proj / "s1" / "tool-results").mkdir(parents=True)
    (proj / "s1.jsonl").write_bytes(SRC.read_bytes())
    (proj / "s1" / "tool-results" / "out.txt").write_bytes(SIDE)
    return proj.parent


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_gc_keeps_the_side_files_and_the_export_writes_them(tmp_path: Path, encrypted: bool) -> None:
    key = MasterKey.new() if encrypted else None
    store = str(tmp_path / "store")
    if encrypted:
        _castore(store, "init", "--encrypted", key=key)
    _castore(store, "import", "claude", str(_projects(tmp_path)), key=key)
    _castore(store, "gc", "--grace", "0", key=key)
    assert "ok" in _castore(store, "fsck", key=key)
    _castore(store, "export", "claude", str(tmp_path / "out"), key=key)
    assert (tmp_path / "out" / "proj" / "s1" / "tool-results" / "out.txt").read_bytes() == SIDE
    assert (tmp_path / "out" / "proj" / "s1.jsonl").read_bytes() == SRC.read_bytes()


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_push_carries_the_side_files(backend: Backend, tmp_path: Path, encrypted: bool) -> None:
    key = MasterKey.new() if encrypted else None
    store = str(tmp_path / "store")
    if encrypted:
        _castore(store, "init", "--encrypted", key=key)
    _castore(store, "import", "claude", str(_projects(tmp_path)), key=key)
    kw = {"master_key": key} if encrypted else {}
    with castore.open(store, **kw) as src, backend.open(**kw) as dst:
        assert push(src, dst).ok
    with backend.open(**kw) as dst:
        report = fsck(dst)
        assert not report.missing and not report.corrupt
        s = dst.session("claude", "proj", "s1")
        oid = s.info["claude"]["files"]["proj/s1/tool-results/out.txt"]
        assert read_blobs(s.store, [oid])[oid] == SIDE
