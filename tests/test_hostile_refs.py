"""A hostile remote: ref names that climb out of the store, forged session names (issue 18.1).

Run end to end against the real moto S3 server: the attacker writes keys into the bucket
directly, the victim clones and pulls, with the library and with the CLI.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import s3fs
from click.testing import CliRunner

import castore
from castore import sync
from castore.cli import cli
from castore.maintenance import fsck

APP = "app"


def _files(root: Path, skip: Path) -> set[str]:
    return {str(p) for p in root.rglob("*") if skip not in p.parents and p != skip}


@pytest.fixture
def hostile(moto_server: Any, tmp_path: Path) -> dict[str, Any]:
    """A remote store with one honest session and evil keys under its refs."""
    opts = moto_server.storage_options
    url = f"s3://castore-tests/{uuid.uuid4().hex}"
    with castore.open(url, **opts) as remote:
        s = remote.session(APP, "mallory", "s")
        s.append(castore.Message(role="user", content="hello"))
        head = remote.refs.read(s.refs.head)
        main = remote.refs.read(s.refs.branch("main"))
        # HEAD claims to be alice's private session
        remote.refs.swap(s.refs.head, head.target, head, {**{k: v for k, v in head.meta.items() if k != "w"},
                                                           "names": {"app": APP, "user": "alice",
                                                                     "session": "private"}})
    fs = s3fs.S3FileSystem(key=opts["key"], secret=opts["secret"], client_kwargs=opts["client_kwargs"],
                           endpoint_url=opts["endpoint_url"], skip_instance_cache=True)
    bucket_path = url[len("s3://"):]
    payload = (main.target + "\n" + json.dumps({"x": "$(touch /tmp/pwned)"}) + "\n").encode()
    evil = [
        f"refs/sessions/{APP}/mallory/s/heads/" + "../" * 7 + "escaped-evil",
        f"refs/sessions/{APP}/mallory/s/heads/../../../../{str(tmp_path).lstrip('/')}/evil",
        f"refs/sessions/{APP}/mallory/s/tags/../../../../../../../../escaped-tag",
        f"refs/state/{APP}/users/../../../../escaped-state",
    ]
    for key in evil:
        fs.pipe_file(f"{bucket_path}/{key}", payload)
    return {"url": url, "opts": opts, "evil": evil}


def _check_nothing_escaped(tmp_path: Path, store_dir: Path, before: set[str]) -> None:
    after = _files(tmp_path, store_dir)
    assert after == before, sorted(after - before)
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "escaped-evil").exists()
    for p in store_dir.rglob("*"):
        assert store_dir in p.resolve().parents or p.resolve() == store_dir


def test_clone_and_pull_skip_names_that_climb_out(hostile: dict[str, Any], tmp_path: Path) -> None:
    dest = tmp_path / "clone"
    before = _files(tmp_path, dest)
    report = sync.clone(hostile["url"], str(dest), **hostile["opts"])
    skipped = [name for name, _ in report.refs_skipped]
    assert any("escaped-evil" in n for n in skipped) and any("escaped-state" in n for n in skipped)
    _check_nothing_escaped(tmp_path, dest, before)
    with castore.open(str(dest)) as local, castore.open(hostile["url"], **hostile["opts"]) as remote:
        assert [m.content for m in local.session(APP, "mallory", "s").messages()] == ["hello"]
        # the names shown come from the keys, not from the remote HEAD's claims
        listed = local.sessions(APP)
        assert [(x.user, x.session) for x in listed] == [("mallory", "s")]
        report = sync.pull(remote, local)
        assert report.refs_skipped and report.ok
        assert fsck(local).ok
    _check_nothing_escaped(tmp_path, dest, before)


def test_cli_clone_and_pull_skip_names_that_climb_out(hostile: dict[str, Any], tmp_path: Path) -> None:
    dest = tmp_path / "cli-clone"
    before = _files(tmp_path, dest)
    o = hostile["opts"]
    opts = ["-o", f"endpoint_url={o['endpoint_url']}", "-o", f"key={o['key']}", "-o", f"secret={o['secret']}",
            "-o", f"client_kwargs.region_name={o['client_kwargs']['region_name']}"]
    r = CliRunner().invoke(cli, ["--store", str(dest), "clone", hostile["url"], str(dest), *opts])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["--store", str(dest), "pull", "origin", "--all"])
    assert r.exit_code == 0, r.output
    _check_nothing_escaped(tmp_path, dest, before)
    r = CliRunner().invoke(cli, ["--store", str(dest), "sessions", APP, "--json"])
    assert r.exit_code == 0, r.output
    assert "alice" not in r.stdout and "mallory" in r.stdout
