"""A full disk, simulated by a file-size limit (``RLIMIT_FSIZE``, in a forked child: a write past
it writes what fits, then fails with EFBIG, as one past the end of a full file system does):
every write castore makes either lands whole or raises a clear error, and nothing stored
before is lost."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import castore
from castore.errors import CastoreError
from castore.storage.local import LocalStorage

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _limited(limit: int, work: Callable[[], None]) -> str:
    """Run ``work`` in a forked child whose files cannot grow past ``limit`` bytes: 'ok', or
    the name of the CastoreError it raised (anything else fails the test)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        code = 0
        try:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            work()
            out = "ok"
        except CastoreError as e:
            out = type(e).__name__
        except BaseException as e:  # reported to the parent, which fails
            out, code = f"not a CastoreError: {type(e).__name__}: {e}", 1
        os.write(w, out.encode())
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    os.waitpid(pid, 0)
    return out


@pytest.mark.parametrize("old", [None, b"old value\n"], ids=["new", "over"])
def test_a_ref_that_does_not_fit_is_not_written_cut_short(tmp_path: Path, old: bytes | None) -> None:
    st = LocalStorage(str(tmp_path / "s"))
    key = "refs/sessions/app/u/s/heads/main"
    expect = st.swap(key, old, None) if old is not None else None
    value = b"v" * 3000 + b"\n"
    out = _limited(1000, lambda: st.swap(key, value, expect) and None)
    assert out == "StorageError"
    data = st.read_versioned(key)
    assert (data.data if data else None) == old  # as it was, not its first 1000 bytes


def test_appends_at_a_full_disk_fail_clearly_and_lose_nothing(tmp_path: Path) -> None:
    """Appends in a child whose files stop growing a little further on each time (past the
    swap log's end, where the refs and the packs' records land), every other child to a new
    session (its branch a new file), the others to one session (its branch written over):
    each child fails with a StorageError or lands; each session keeps every message it had,
    and fsck finds the store sound."""
    root = str(tmp_path / "store")
    subprocess.run([sys.executable, "-m", "castore", "--store", root, "init"], check=True, capture_output=True)
    had: dict[str, int] = {}

    def appends(sid: str) -> Callable[[], None]:
        def work() -> None:
            with castore.open(root) as st:
                for i in range(20):
                    st.session("app", "u", sid).append(castore.Message(role="user", content=f"{i} " + "x" * 30))
        return work

    outs = set()
    for k in range(0, 2400, 97):
        sid = "s" if k % 2 else f"n{k}"
        size = os.path.getsize(os.path.join(root, "swaps.log"))
        outs.add(_limited(size + k, appends(sid)))
        had.setdefault(sid, 0)
        with castore.open(root) as st:
            for sid, n in had.items():
                had[sid] = len(st.session("app", "u", sid).messages())
                assert had[sid] >= n, sid
    assert outs <= {"ok", "StorageError"} and "StorageError" in outs, outs
    r = subprocess.run([sys.executable, "-m", "castore", "--store", root, "fsck"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "ok", r.stdout + r.stderr
