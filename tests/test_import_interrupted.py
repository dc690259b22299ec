"""Coding-agent imports stopped at any moment (Ctrl-C, kill -9) are finished by the next
import, byte for byte: in process at every ref move the import makes, and a real
``castore import claude`` process killed part-way through a large file (SIGKILL) or
interrupted while following it (SIGINT)."""

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


def _cli(store: Path, *args: str) -> subprocess.Popen[bytes]:
    # the import's write batch lands often (not every 0.25 s): a kill finds it part-way
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "CASTORE_LAND_EVERY": "0.01"}
    # SIGINT as a terminal's Ctrl-C finds it: a suite started in the background by a shell
    # without job control inherits SIGINT ignored, and Python then installs no handler
    return subprocess.Popen([sys.executable, "-m", "castore", "--store", str(store), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _branches(store: Path) -> int:
    """How many branches the session has so far (0 before it exists): how far an import got."""
    return len(_tips(store))


def _tips(store: Path) -> dict[str, str]:
    """The session's branches and their tips so far (none before it exists)."""
    try:
        return dict(castore.open(str(store), durable=False).session("claude", "proj", "s").branches())
    except castore.CastoreError:
        return {}


def _recorded_lines(store: Path) -> int:
    s = castore.open(str(store), durable=False).session("claude", "proj", "s")
    return int(s.info.get("claude", {}).get("lines", 0)) if s.exists() else 0


def _wait(cond: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    while not cond():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)


def _frozen_once(cond: Callable[[], bool], proc: subprocess.Popen[bytes]) -> None:
    """Let ``proc`` run in steps of about 10 ms, frozen (SIGSTOP) while ``cond`` is checked;
    return with it frozen once ``cond`` holds. The check opens the store, which on a loaded
    machine took longer than the rest of the import: a process that ran on meanwhile finished
    before the signal meant to stop it part-way (the store is only read here: no lock the
    frozen writer holds is waited for)."""
    while True:
        time.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        while _state(proc.pid) not in "TtZX":
            time.sleep(0.001)
        assert proc.poll() is None, proc.communicate()
        if cond():
            return
        proc.send_signal(signal.SIGCONT)


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped, Z: exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except FileNotFoundError:
        return "X"


def test_import_killed_at_several_points_is_finished_by_the_next(tmp_path: Path) -> None:
    body = _large(tmp_path / "proj", 24)
    lines = body.count(b"\n")
    ref = castore.open(str(tmp_path / "ref"), durable=False)
    import_claude(ref, tmp_path / "proj")
    want = archive(ref)
    total = len(ref.session("claude", "proj", "s").branches())
    # no later than a quarter of the way (the process is frozen while the store is polled)
    for point in (1, total // 8, total // 4):
        store = tmp_path / f"s{point}"
        proc = _cli(store, "import", "claude", str(tmp_path / "proj"))
        _frozen_once(lambda store=store, point=point: _branches(store) >= point, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _recorded_lines(store) < lines  # killed part-way
        st = castore.open(str(store), durable=False)
        r = import_claude(st, tmp_path / "proj")[0]
        assert r.total == lines and not r.notes
        export_claude(st, tmp_path / f"out{point}")
        assert (tmp_path / f"out{point}" / "proj" / "s.jsonl").read_bytes() == body
        assert archive(st) == want


def test_ctrl_c_while_following_is_finished_by_the_next_import(tmp_path: Path) -> None:
    body = _large(tmp_path / "big", 12)
    proj = tmp_path / "proj"
    proj.mkdir()
    half = body.index(b"\n", len(body) // 8) + 1
    (proj / "s.jsonl").write_bytes(body[:half])
    store = tmp_path / "store"
    proc = _cli(store, "import", "claude", "--follow", "--interval", "0.05", str(proj))
    _wait(lambda: _recorded_lines(store) == body[:half].count(b"\n"), proc)
    seen = _tips(store)
    with open(proj / "s.jsonl", "ab") as f:  # the agent writes a lot at once
        f.write(body[half:])
    # its first landing (a branch moved); the file's new branches are named at its end
    _frozen_once(lambda: _tips(store) != seen, proc)
    proc.send_signal(signal.SIGINT)  # taken when it runs again
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate()
    assert proc.returncode == 0 and b"stopped" in err
    assert _recorded_lines(store) < body.count(b"\n")  # stopped part-way
    st = castore.open(str(store), durable=False)
    r = import_claude(st, proj)[0]
    assert r.total == body.count(b"\n") and not r.notes
    export_claude(st, tmp_path / "out")
    assert (tmp_path / "out" / "proj" / "s.jsonl").read_bytes() == body
