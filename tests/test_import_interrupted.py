"""Coding-agent imports stopped at any moment (Ctrl-C, kill -9) are finished by the next
import, byte for byte: in process at every ref move the import makes, and a real
``castore import claude`` process killed part-way through a large file (SIGKILL) or
interrupted while following it (SIGINT, or SIGTERM taken as it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.interrupt import archive, interrupted_everywhere, same_tree

import castore
from castore.adapters.claude_code import export_claude, import_claude

DATA = Path(__file__).resolve().parent / "data" / "claude-code"
SHARE = DATA / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"
_UUID = re.compile(rb"[0-9a-f]{8}(-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


def _old_layout_file(dest: Path) -> None:
    """An old-layout main file (subagents' isSidechain lines inside it), from the real files'
    lines: the subagent's lines written into the main file where they happened."""
    main = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    sub = next((SHARE / SID / "subagents").glob("*.jsonl")).read_bytes().splitlines(keepends=True)
    side = [json.dumps({**json.loads(x), "isSidechain": True}).encode() + b"\n" for x in sub]
    dest.mkdir(parents=True)
    (dest / "old.jsonl").write_bytes(b"".join(main[:30] + side[:6] + main[30:50] + side[6:] + main[50:]))


@pytest.mark.parametrize("incremental", [False, True])
def test_claude_import_stopped_at_any_ref_move_is_finished_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, incremental: bool) -> None:
    projects = tmp_path / "projects"
    shutil.copytree(SHARE, projects / "p", ignore=shutil.ignore_patterns("LICENSE"))
    _old_layout_file(projects / "old")
    full = {f: f.read_bytes() for f in projects.rglob("*.jsonl")}

    def before(store: castore.Store) -> None:
        if incremental:  # an earlier import took the first part of every file
            for f, data in full.items():
                f.write_bytes(data[: data.index(b"\n", len(data) // 3) + 1])
            import_claude(store, projects)
            for f, data in full.items():
                f.write_bytes(data)

    for store in interrupted_everywhere(tmp_path, monkeypatch, lambda s: import_claude(s, projects), before):
        out = Path(str(store.url).removeprefix("file://")) / ".." / (Path(str(store.url)).name + "-out")
        shutil.rmtree(out, ignore_errors=True)
        export_claude(store, out)
        same_tree(projects, out)
        assert all(r.lines == 0 for r in import_claude(store, projects))  # and nothing is left to do


# -- a real process, killed -------------------------------------------------------------------
def _large(dest: Path, copies: int) -> bytes:
    """A long session file: the real session's lines ``copies`` times over, each copy with
    uuids of its own (so that its rewinds are branches of their own)."""
    src = (SHARE / f"{SID}.jsonl").read_bytes()
    body = b"".join(_UUID.sub(lambda m, r=r: b"%08x" % r + m.group(1), src) for r in range(copies))
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "s.jsonl").write_bytes(body)
    return body


#: a real ``castore`` process that signals itself at a chosen point of its landings: right
#: after the ``at``-th landing that moved refs between runs of lines (``land``; with ``arm``,
#: counted once that file exists), or right after the ``at``-th write of held objects, before
#: the refs that name them move (``held``). The moment a kill -9 or a Ctrl-C from outside
#: could find, chosen instead of raced: an import that outran a poll of the store made
#: "killed part-way" fail under load
_CHILD = r"""
import os, signal, sys
from castore import groupcommit
from castore.__main__ import main
from castore.objectstore import ObjectStore
sig, where, at, arm = getattr(signal, sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
land, write_held, seen = groupcommit.WriteBatch.land, ObjectStore.write_held, [0]
def counted(happened):
    if happened and (not arm or os.path.exists(arm)):
        seen[0] += 1
        if seen[0] == at:
            os.kill(os.getpid(), sig)
def landing(batch):
    moving = len(batch) > 0
    land(batch)
    counted(where == "land" and moving)
def writing(objects):
    n = write_held(objects)
    counted(where == "held" and n > 0)
    return n
groupcommit.WriteBatch.land, ObjectStore.write_held = landing, writing
sys.argv = ["castore", *sys.argv[5:]]
main()
"""


def _cli(store: Path, sig: str, point: tuple[str, int], *args: str, arm: Path | None = None) -> subprocess.Popen[bytes]:
    # every batch lands when due (not every 0.25 s): many landings in one file
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "CASTORE_LAND_EVERY": "0"}
    # SIGINT as a terminal's Ctrl-C finds it: a suite started in the background by a shell
    # without job control inherits SIGINT ignored, and Python then installs no handler
    return subprocess.Popen([sys.executable, "-c", _CHILD, sig, point[0], str(point[1]), str(arm or ""),
                             "--store", str(store), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _recorded_lines(store: Path) -> int:
    s = castore.open(str(store), durable=False).session("claude", "proj", "s")
    return int(s.info.get("claude", {}).get("lines", 0)) if s.exists() else 0


def _wait(cond: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    while not cond():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)


def test_import_killed_at_several_points_is_finished_by_the_next(tmp_path: Path) -> None:
    body = _large(tmp_path / "proj", 24)
    lines = body.count(b"\n")
    ref = castore.open(str(tmp_path / "ref"), durable=False)
    import_claude(ref, tmp_path / "proj")
    want = archive(ref)
    # killed (SIGKILL) with the first landing's objects written and its refs not moved, right
    # after it, and with the next landing's objects written (the last, if the first was)
    for k, point in enumerate((("held", 1), ("land", 1), ("held", 2))):
        store = tmp_path / f"s{k}"
        proc = _cli(store, "SIGKILL", point, "import", "claude", str(tmp_path / "proj"))
        out, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, (out, err)
        assert _recorded_lines(store) < lines  # killed part-way
        st = castore.open(str(store), durable=False)
        r = import_claude(st, tmp_path / "proj")[0]
        assert r.total == lines and not r.notes
        export_claude(st, tmp_path / f"out{k}")
        assert (tmp_path / f"out{k}" / "proj" / "s.jsonl").read_bytes() == body
        assert archive(st) == want


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_while_following_is_finished_by_the_next_import(tmp_path: Path, sig: str) -> None:
    body = _large(tmp_path / "big", 12)
    proj = tmp_path / "proj"
    proj.mkdir()
    half = body.index(b"\n", len(body) // 8) + 1
    (proj / "s.jsonl").write_bytes(body[:half])
    store, arm = tmp_path / "store", tmp_path / "arm"
    # Ctrl-C (SIGINT), or a service manager's stop (SIGTERM: taken as Ctrl-C), right after the
    # first landing of the round that imports what the agent adds
    proc = _cli(store, sig, ("land", 1), "import", "claude", "--follow", "--interval", "0.05", str(proj), arm=arm)
    _wait(lambda: _recorded_lines(store) == body[:half].count(b"\n"), proc)
    arm.touch()
    with open(proj / "s.jsonl", "ab") as f:  # the agent writes a lot at once
        f.write(body[half:])
    _, err = proc.communicate()
    assert proc.returncode == 0 and b"stopped" in err, err
    assert _recorded_lines(store) < body.count(b"\n")  # stopped part-way
    st = castore.open(str(store), durable=False)
    r = import_claude(st, proj)[0]
    assert r.total == body.count(b"\n") and not r.notes
    export_claude(st, tmp_path / "out")
    assert (tmp_path / "out" / "proj" / "s.jsonl").read_bytes() == body
