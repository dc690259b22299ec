"""Divergence has a way out (issue 19): remote-tracking refs are revisions, branches move to
any revision (``branch -f``, ``reset``), and every overwritten tip stays in the reflog."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore import sync
from castore.cli import cli
from castore.maintenance import fsck, gc


def _msg(text: str) -> castore.Message:
    return castore.Message(role="user", content=text)


@pytest.fixture
def diverged(tmp_path: Path) -> dict[str, Any]:
    """A clone whose main moved on both sides, then pulled: the remote tip kept as remotes/origin/main."""
    a = castore.open(str(tmp_path / "a"))
    a.session("app", "u", "s").append(_msg("one"))
    sync.clone(a.url, str(tmp_path / "b"))
    b = castore.open(str(tmp_path / "b"))
    b.session("app", "u", "s").append(_msg("b side"))
    theirs = a.session("app", "u", "s").append(_msg("a side"))
    report = sync.pull(a, b, remote_name="origin")
    assert report.refs_kept_as_remote == ["sessions/app/u/s/remotes/origin/main"]
    return {"a": a, "b": b, "theirs": theirs, "mine": b.session("app", "u", "s").head}


def test_a_remote_tracking_ref_is_a_revision(diverged: dict[str, Any]) -> None:
    s = diverged["b"].session("app", "u", "s")
    assert s.remote_branches() == {"origin/main": diverged["theirs"]}
    assert s.resolve("remotes/origin/main") == diverged["theirs"]
    assert s.resolve("remotes/origin/main~1") == s.resolve("main~1")
    assert s.show("remotes/origin/main").entry.content == "a side"
    assert {e.id for e in s.log(all_branches=True)} >= {diverged["theirs"], diverged["mine"]}
    with pytest.raises(castore.RevisionNotFound):
        s.resolve("remotes/nope/main")


def test_forced_pull_keeps_the_overwritten_tip_in_the_reflog_and_gc_keeps_it(diverged: dict[str, Any]) -> None:
    a, b, mine = diverged["a"], diverged["b"], diverged["mine"]
    report = sync.pull(a, b, force=True, remote_name="origin")
    assert report.refs_forced == [("sessions/app/u/s/heads/main", mine, diverged["theirs"])]
    s = b.session("app", "u", "s")
    assert s.head == diverged["theirs"]
    log = s.reflog()
    assert [(e["old"], e["new"], e["why"]) for e in log] == [(mine, diverged["theirs"], "pull --force")]
    gc(b, grace=0)
    assert s.show(mine[:10]).entry.content == "b side"  # reachable, and a revision by short id
    assert fsck(b).ok
    s.reset(mine[:10])
    assert [m.content for m in s.messages()] == ["one", "b side"]


def test_branch_force_and_reset_move_branches_and_record_the_old_tip(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "s"))
    s = st.session("app", "u", "s")
    first = s.append(_msg("one"))
    second = s.append(_msg("two"))
    s.branch("side", at=first)
    with pytest.raises(castore.BranchError):
        s.branch("side", at=second)
    s.branch("side", at=second, force=True)
    assert s.branches()["side"] == second
    with pytest.raises(castore.BranchError, match="checked out"):
        s.branch("main", at=first, force=True)
    s.reset(first)
    assert s.head == first and s.current_branch == "main"
    assert [(e["ref"].rsplit("/", 1)[1], e["old"], e["new"]) for e in s.reflog()] == [
        ("main", second, first), ("side", first, second)]
    gc(st, grace=0)
    assert s.show(second).entry.content == "two" and fsck(st).ok
    s.checkout(first)
    s.reset(second)  # a detached HEAD moves too
    assert s.current_branch is None and s.head == second


@pytest.mark.parametrize("fmt", [2, 3])
def test_a_normal_append_never_touches_the_reflog(tmp_path: Path, fmt: int) -> None:
    st = castore.open(str(tmp_path / "s"), format=fmt)
    s = st.session("app", "u", "s")
    s.append(_msg("one"))
    seen: list[str] = []
    real_read, real_versioned, real_swap = st.storage.read_many, st.storage.read_versioned, st.storage.swap

    def read_many(keys: Any) -> Any:
        seen.extend(keys)
        return real_read(keys)

    def read_versioned(key: str) -> Any:
        seen.append(key)
        return real_versioned(key)

    def swap(key: str, *args: Any, **kw: Any) -> Any:  # format 3 reads the ref it swaps in the swap
        seen.append(key)
        return real_swap(key, *args, **kw)

    st.storage.read_many = read_many  # type: ignore[method-assign]
    st.storage.read_versioned = read_versioned  # type: ignore[method-assign]
    st.storage.swap = swap  # type: ignore[method-assign]
    s.append(_msg("two"))
    assert seen and not any("reflog" in k for k in seen)
    assert st.refs.read(s.refs.reflog) is None


def test_sync_does_not_send_the_reflog(diverged: dict[str, Any], tmp_path: Path) -> None:
    b = diverged["b"]
    b.session("app", "u", "s").branch("x", at="main~1")
    b.session("app", "u", "s").branch("x", at="main", force=True)
    report = sync.push(b, castore.open(str(tmp_path / "c")))
    assert not any(r.endswith("/reflog") for r in report.refs_updated)
    assert castore.open(str(tmp_path / "c")).refs.read(b.session("app", "u", "s").refs.reflog) is None


def _cli(store: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", store, "-s", "app/u/s", *args])


def test_cli_branch_remotes_reset_and_reflog(diverged: dict[str, Any]) -> None:
    b = diverged["b"].url
    r = _cli(b, "branch", "-r")
    assert r.exit_code == 0 and "remotes/origin/main" in r.stdout and "  main " not in r.stdout
    r = _cli(b, "branch", "-a", "--json")
    names = {x["name"] for x in json.loads(r.stdout)["branches"]}
    assert names == {"main", "remotes/origin/main"}
    r = _cli(b, "show", "remotes/origin/main")
    assert r.exit_code == 0 and "a side" in r.stdout
    r = _cli(b, "log", "--all")
    assert r.exit_code == 0 and "remotes/origin/main" in r.stdout
    r = _cli(b, "reset", "remotes/origin/main")
    assert r.exit_code == 0 and diverged["mine"][:8] in r.stderr
    r = _cli(b, "reflog")
    assert r.exit_code == 0 and diverged["mine"][:8] in r.stdout and "reset remotes/origin/main" in r.stdout
    r = _cli(b, "branch", "-f", "rescued", diverged["mine"][:10])
    assert r.exit_code == 0
    r = _cli(b, "branch", "-f", "rescued", "main")
    assert r.exit_code == 0 and "Moved branch 'rescued'" in r.stderr
    r = _cli(b, "reflog", "--json")
    assert [e["why"] for e in json.loads(r.stdout)["reflog"]] == ["branch -f rescued", "reset remotes/origin/main"]


def test_cli_forced_pull_prints_old_and_new_ids(diverged: dict[str, Any]) -> None:
    r = CliRunner().invoke(cli, ["--store", diverged["b"].url, "pull", "origin", "--all", "--force"])
    assert r.exit_code == 0, r.output
    assert f"{diverged['mine'][:12]} -> {diverged['theirs'][:12]}" in r.stdout
    assert "castore reflog" in r.stderr
