"""A hostile remote forges commit depths (issue 37, items 1 and 6).

Each commit carries its depth on the first-parent path, and sync, fsck and every reader
of a path go by it. A remote whose tip claims a depth that does not count its path must
be refused with a clear error: no ref moves to a commit the store lacks, nothing is sized
by the claimed depth, and fsck and verify say what is wrong. On local disk and on the S3
test server, through the library and the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner
from conftest import Backend, backend_on

import castore
from castore import sync
from castore.cli import cli
from castore.errors import IntegrityError
from castore.history import BlockPath, K
from castore.maintenance import fsck
from castore.objects import Commit

backend = backend_on("local", "s3")

APP, USER, SID = "app", "mallory", "s"


def _remote_with(backend: Backend, n: int, forged_depth: Any) -> tuple[str, str]:
    """A remote whose session has ``n`` honest entries and, on ``main``, one more commit
    whose depth is ``forged_depth(parent_depth)``; returns (honest tip, forged tip)."""
    with backend.open() as remote:
        s = remote.session(APP, USER, SID)
        for i in range(n):
            s.append(castore.Message(role="user", content=f"m{i}"))
        main = s.refs.branch("main")
        cur = remote.refs.read(main)
        assert cur is not None
        parent = remote.objects.get(cur.target)
        assert isinstance(parent, Commit)
        forged = msgspec.structs.replace(parent, parents=(bytes.fromhex(cur.target),),
                                         depth=forged_depth(parent.depth), time=parent.time + 1)
        fid = remote.objects.put(forged)
        # the meta keeps the honest ref's read hint, which names the parent: it does not fit
        meta = {k: v for k, v in cur.meta.items() if k != "w"}
        remote.refs.swap(main, fid, cur, meta)
        return cur.target, fid


FORGERIES = {
    "lower": lambda d: d,  # the plan used to skip it: the ref moved to a commit never copied
    "much-lower": lambda d: max(d - 3, 0),
    "gap": lambda d: d + 6,  # used to raise KeyError
    "huge": lambda d: 10**10,  # used to build a 10**10-element list (MemoryError)
    "huge-block-start": lambda d: K * 10**8,  # a multiple of K: walked to, then an index
}


def _local_main(dest: str) -> str | None:
    with castore.open(dest) as local:
        v = local.refs.read(f"sessions/{APP}/{USER}/{SID}/heads/main")
        return v.target if v is not None else None


@pytest.mark.parametrize("n", [3, K + 5])
@pytest.mark.parametrize("kind", sorted(FORGERIES))
def test_pull_and_clone_refuse_a_forged_depth(backend: Backend, tmp_path: Path, kind: str, n: int) -> None:
    honest_tip, forged = _remote_with(backend, n, FORGERIES[kind])
    # a store that pulled the honest history before the forgery
    dest = str(tmp_path / "local")
    with castore.open(dest) as local, backend.open() as remote:
        local.init()
        sync.add_remote(local, "origin", backend.url, backend.options)
        # pull once what the remote had before (a fresh copy of the honest tip's session)
        with pytest.raises(IntegrityError) as e:
            sync.pull(remote, local)
        assert forged[:12] in str(e.value) or "depth" in str(e.value)
        assert "depth" in str(e.value)
    assert _local_main(dest) is None  # nothing moved
    with castore.open(dest) as local:
        assert fsck(local).ok
    # clone: the same refusal, and no ref to a commit that is not there
    cdest = str(tmp_path / "clone")
    with pytest.raises(IntegrityError, match="depth"):
        sync.clone(backend.url, cdest, **backend.options)
    assert _local_main(cdest) is None
    with castore.open(cdest) as local:
        assert fsck(local).ok
    # the remote itself: fsck and verify name the forged commit
    with backend.open() as remote:
        report = fsck(remote)
        assert not report.ok
        assert any(oid == forged and "depth" in why for oid, why in report.corrupt), report.corrupt
        with pytest.raises(IntegrityError, match="depth"):
            remote.session(APP, USER, SID).verify()
        # the path reader refuses it without sizing anything by the claimed depth
        with pytest.raises(IntegrityError, match="depth"):
            BlockPath(remote.objects, forged)
        assert honest_tip != forged


def test_pull_into_a_store_that_has_the_honest_history(backend: Backend, tmp_path: Path) -> None:
    """The forged tip extends what the local store already holds: the plan compares the
    two paths by depth, the case that used to skip the tip and move heads/main to it."""
    with backend.open() as remote:
        s = remote.session(APP, USER, SID)
        for i in range(3):
            s.append(castore.Message(role="user", content=f"m{i}"))
    dest = str(tmp_path / "local")
    sync.clone(backend.url, dest, **backend.options)
    before = _local_main(dest)
    assert before is not None
    with backend.open() as remote:
        main = f"sessions/{APP}/{USER}/{SID}/heads/main"
        cur = remote.refs.read(main)
        assert cur is not None and cur.target == before
        parent = remote.objects.get(cur.target)
        assert isinstance(parent, Commit)
        fid = remote.objects.put(msgspec.structs.replace(parent, parents=(bytes.fromhex(cur.target),),
                                                         depth=parent.depth, time=parent.time + 1))
        remote.refs.swap(main, fid, cur, {k: v for k, v in cur.meta.items() if k != "w"})
    r = CliRunner().invoke(cli, ["--store", dest, "pull", "origin", "--all"])
    assert r.exit_code == 1, r.output
    assert "Error:" in r.output and "depth" in r.output and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    assert _local_main(dest) == before
    with castore.open(dest) as local:
        assert fsck(local).ok
        assert [m.content for m in local.session(APP, USER, SID).messages()] == ["m0", "m1", "m2"]
    r = CliRunner().invoke(cli, ["clone", backend.url, str(tmp_path / "c2"),
                                 *_cli_options(backend)])
    assert r.exit_code == 1 and "depth" in r.output and "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    # fsck and verify on the remote, by the CLI
    store_args = ["--store", backend.url, *_cli_options(backend)]
    r = CliRunner().invoke(cli, [*store_args, "fsck"])
    assert r.exit_code != 0 and fid[:12] in r.output and "depth" in r.output, r.output
    r = CliRunner().invoke(cli, [*store_args, "-s", f"{APP}/{USER}/{SID}", "verify"])
    assert r.exit_code == 1 and "depth" in r.output and "Traceback" not in r.output, r.output


def _cli_options(backend: Backend) -> list[str]:
    o = backend.options
    if not o:
        return []
    return ["-o", f"endpoint_url={o['endpoint_url']}", "-o", f"key={o['key']}", "-o", f"secret={o['secret']}",
            "-o", f"client_kwargs.region_name={o['client_kwargs']['region_name']}"]


def test_a_ref_never_moves_to_a_commit_the_destination_lacks(tmp_path: Path) -> None:
    """The plan takes a commit another local ref names to be there already; when it is not
    (a damaged local store), the ref is refused, never moved to it."""
    src_url, dst_url = str(tmp_path / "src"), str(tmp_path / "dst")
    with castore.open(src_url) as src:
        s = src.session(APP, USER, SID)
        s.append(castore.Message(role="user", content="one"))
        tip = src.refs.read(s.refs.branch("main"))
        assert tip is not None
    with castore.Store.open(dst_url, format=1) as dst:
        dst.init()
        # the local store has a branch at that commit, but lost the commit itself
        dst.refs.swap(f"sessions/{APP}/{USER}/{SID}/heads/other", tip.target, None, {})
        assert not dst.objects.contains(tip.target)
        with castore.open(src_url) as src:
            report = sync.pull(src, dst)
        assert any(r.ref.endswith("/heads/main") and "not in the destination" in r.reason
                   for r in report.refs_refused), report
        assert dst.refs.read(f"sessions/{APP}/{USER}/{SID}/heads/main") is None

