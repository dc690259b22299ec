"""A search whose index cannot be written (its folder read-only, on a read-only mount, or a full
disk) runs without saving it: the index is built or updated in memory, the matches are the same,
and ``castore grep`` says so in one line on stderr (none with ``--no-messages``). Real
permissions: as a user other than root the folder's mode; as root (who ignores modes) a
read-only bind mount in a mount namespace of its own (``unshare -m``), skipped where it cannot be
made; the full disk a file-size limit in a forked child, as tests/test_full_disk.py."""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import castore
from castore.grep import grep
from castore.grep.index import IndexError_, index_dir, open_index

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="needs fork and Linux")

T0 = 1_760_000_000.0


def _fill(root: str, sessions: range) -> None:
    with castore.open(root, durable=False) as st:
        for n in sessions:
            st.session("bot", "ann", f"s{n}").append_many([
                {"role": "user", "content": f"question {n} about the parser"},
                {"role": "assistant", "content": [{"type": "text", "text": f"answer {n}: the parser\nreads it"},
                                                  {"type": "tool_use", "id": f"t{n}", "name": "Bash",
                                                   "input": {"command": "ls parser"}}]},
            ], time=T0 + n)


def _json(store: castore.Store, **kw: object) -> list[dict[str, object]]:
    return [m.to_json() for m in grep(store, "parser", **kw)]  # type: ignore[arg-type]


def _in_child(work: Callable[[], object], limit: int | None = None) -> object:
    """``work()``'s JSON value from a forked child (whose files cannot grow past ``limit`` bytes)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            out = json.dumps({"ok": work()})
        except BaseException as e:
            out = json.dumps({"raised": f"{type(e).__name__}: {e}"})
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = json.loads(f.read())
    os.waitpid(pid, 0)
    return got


@pytest.mark.parametrize("stale", [False, True], ids=["none", "stale"])
def test_a_full_disk_searches_without_saving_the_index(tmp_path: Path, stale: bool) -> None:
    root = str(tmp_path / "store")
    _fill(root, range(3))
    st = castore.open(root)
    folder = index_dir(st)
    if stale:  # an index there, then a session more: the update is what cannot be written
        open_index(st)
        _fill(root, range(3, 4))
    saved = sorted(os.listdir(folder)) if stale else []

    def search() -> object:
        notes: list[str] = []
        got = _json(castore.open(root), unsaved=notes)
        return [got, notes, _json(castore.open(root))]  # the second without a list to note in

    out = _in_child(search, limit=100)
    assert "ok" in out, out  # type: ignore[operator]
    got, notes, again = out["ok"]  # type: ignore[index]
    assert len(notes) == 1 and notes[0].startswith(f"cannot write the search index in {folder}")
    assert got == again == _json(castore.open(root, durable=False), index=False)  # as a search of the store
    assert len(got) == 3 * (4 if stale else 3)  # each session's question, answer and tool call
    if stale:  # what the update wrote before the disk was full is gone
        assert sorted(os.listdir(folder)) == saved


def test_open_index_without_a_list_raises_when_the_folder_cannot_be_written(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    _fill(root, range(2))
    out = _in_child(lambda: open_index(castore.open(root)) and None, limit=100)
    assert out["raised"].startswith(IndexError_.__name__)  # type: ignore[index]


def _read_only_run(paths: list[Path], argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """``argv`` run with ``paths`` read-only: by their modes for a user other than root, else on
    read-only bind mounts in a mount namespace of the child's own (skipped when one cannot be made)."""
    if os.geteuid() != 0:
        modes = {}
        for p in paths:
            for d, _, files in os.walk(p):
                for f in [d, *(os.path.join(d, x) for x in files)]:
                    modes[f] = os.stat(f).st_mode
                    os.chmod(f, stat.S_IMODE(modes[f]) & ~0o222)
        try:
            return subprocess.run(argv, env=env, capture_output=True)
        finally:
            for f, m in modes.items():
                os.chmod(f, stat.S_IMODE(m))
    if shutil.which("unshare") is None:
        pytest.skip("no unshare to make a read-only mount")
    mount = 'for d in "$@"; do [ "$d" = -- ] && break; mount --bind "$d" "$d" && mount -o remount,ro,bind "$d" ' \
            '|| exit 97; done; while [ "$1" != -- ]; do shift; done; shift; exec "$@"'
    done = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", *map(str, paths), "--", *argv],
                          env=env, capture_output=True)
    if done.returncode == 97 or b"unshare:" in done.stderr[:200]:
        pytest.skip(f"cannot make a read-only mount here: {done.stderr.decode()[-200:]}")
    return done


@pytest.mark.parametrize("read_only", ["index", "store", "both", "stale index"])
def test_castore_grep_with_a_read_only_index_or_store_prints_the_same_matches(tmp_path: Path,
                                                                              read_only: str) -> None:
    root = tmp_path / "store"
    _fill(str(root), range(3))
    base = tmp_path / "index"
    env = dict(os.environ, CASTORE_GREP_INDEX=str(base))
    argv = [sys.executable, "-m", "castore", "--store", str(root), "grep", "parser"]
    base.mkdir(exist_ok=True)
    if read_only == "stale index":
        subprocess.run(argv, env=env, capture_output=True, check=True)  # an index, then a session more
        _fill(str(root), range(3, 4))
    paths = {"index": [base], "store": [root], "both": [base, root], "stale index": [base]}[read_only]
    got = _read_only_run(paths, argv, env)
    quiet = _read_only_run(paths, [*argv, "--no-messages", "-c"], env)
    expect = subprocess.run(argv, env=dict(env, CASTORE_GREP_INDEX=str(tmp_path / "writable")), capture_output=True)
    assert got.returncode == expect.returncode == quiet.returncode == 0, got.stderr
    sessions = 4 if read_only == "stale index" else 3
    assert got.stdout == expect.stdout and got.stdout.count(b"\n") == 3 * sessions  # question, answer, tool call
    if read_only == "store":  # the index is written where it is kept, outside the store
        assert got.stderr == b""
    else:
        lines = got.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Note: cannot write the search index in ")
        assert lines[0].endswith("; searched without saving it")
    assert quiet.stderr == b"" and quiet.stdout.decode().splitlines() == [f"bot/ann/s{n}:3" for n in range(sessions)]
