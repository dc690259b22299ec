"""castore usage's first run shared with a forked worker (usage._read_shared): the same report
as one process reads, on the real files with their forks, whatever the share each process
decodes; a worker that raises or dies (killed) leaves its share to the process: the same report,
the cache saved.

The runs are real ``castore`` processes of their own: a worker is forked only from a process
that runs one thread (castore.forked.can_fork), which a test process under pytest-xdist is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_usage import _cases

import castore
from castore.adapters.claude_code import import_claude
from castore.adapters.codex import import_codex
from castore.entries import Message
from castore.forked import cores

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or cores() < 2, reason="a worker is forked on 2 cores or more")

#: one run in a process of its own: every grouping's report, read without the cache (each a
#: first run), then one through the cache; argv: store, SHARE_RUN, what the worker does
_RUN = r"""
import json, os, sys
import castore, castore.forked as forked, castore.usage as u, castore.usage.cache as uc
from castore.objectstore import packmap

url, run, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
uc.SCAN_MIN_SESSIONS = 0  # the real files are a few sessions: shared all the same
packmap.SHARE_RUN = run
started = []
plain = forked.Forked.__init__

def init(self, work):
    started.append(forked.can_fork())
    def worker(receive):
        if mode == "die":
            os.kill(os.getpid(), 9)
        if mode == "raise":
            raise OSError("the worker's disk")
        return work(receive)
    plain(self, worker)

forked.Forked.__init__ = init
if mode == "alone":  # no worker: the run of one process
    forked.can_fork = lambda: False
if mode == "unneeded":  # a worker started (enough session folders) whose pass is not wanted
    uc._has_sessions = lambda store, n: True
    uc.SCAN_MIN_SESSIONS = 1 << 30
shares = []  # per run: the sessions both shares read whole, of those read
share = uc._read_shared

def counted(store, todo, lost, worker):
    done, commits = share(store, todo, lost, worker)
    shares.append([len(done), len(todo)])
    return done, commits

uc._read_shared = counted
try:
    reports = {by: u.usage(castore.open(url), by=by, cache=False).to_json() for by in u.GROUPS}
    cached = u.usage(castore.open(url), by="branch").to_json()
    # a cache that holds half the sessions, its mark lost: the other half is read, its pass
    # shared with a worker started once the refs are read
    path = os.environ["CASTORE_USAGE_CACHE"]
    with open(path) as f:
        doc = json.load(f)
    doc["mark"] = None
    doc["sessions"] = dict(sorted(doc["sessions"].items())[::2])
    with open(path, "w") as f:
        json.dump(doc, f)
    late = u.usage(castore.open(url), by="branch").to_json()
except forked.WorkerDied as e:
    print(json.dumps({"died": str(e), "forks": started}))
else:
    print(json.dumps({"reports": reports, "cached": cached, "late": late, "forks": started, "shares": shares}))
"""


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """A store of the real files with their forks (rewinds, subagents, a forked session, a
    Codex fork), and each grouping's report read in one process without a worker."""
    import castore.forked as forked_mod
    import castore.usage as usage_mod

    tmp = tmp_path_factory.mktemp("shared")
    cases = _cases()
    url = str(tmp / "store")
    with castore.open(url, durable=False) as st:
        import_claude(st, cases.claude_case(tmp / "home", "fork") / "projects")
        import_codex(st, cases.codex_case(tmp / "cx", "fork") / "sessions")
        # a session written a response at a time (a record each) with a branch: its path
        # straddles the shares when the records are dealt in small runs
        s = st.session("agents", "u", "long")
        for i in range(12):
            s.append(Message(role="assistant", content=f"answer {i}"), meta={
                "model": "gpt-4.1", "usage": {"input_tokens": 10 + i, "output_tokens": 2}, "response_id": f"r{i}"})
        s.branch("side", at="HEAD~4")
        s.checkout("side")
        s.append(Message(role="assistant", content="aside"), meta={"model": "gpt-4.1", "usage": {"output_tokens": 5}})
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(forked_mod, "can_fork", lambda: False)
        want = {}
        for scan in (0, 1 << 30):  # the store-wide pass in one process, and path by path
            mp.setattr(usage_mod.cache, "SCAN_MIN_SESSIONS", scan)
            got = {by: usage_mod.usage(castore.open(url), by=by, cache=False).to_json() for by in usage_mod.GROUPS}
            assert not want or got == want
            want = got
    finally:
        mp.undo()
    return url, want


def _run(url: str, run: int, mode: str, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "CASTORE_USAGE_CACHE": str(cache)}
    got = subprocess.run([sys.executable, "-c", _RUN, url, str(run), mode], env=env, capture_output=True,
                         text=True, check=False)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("run", [1 << 20, 4096, 512], ids=["one-share", "runs-4k", "runs-512"])
def test_a_first_run_shared_with_a_worker_reports_what_one_process_reads(
        real: tuple[str, dict[str, Any]], tmp_path: Path, run: int) -> None:
    # with runs of 4 KiB or 512 bytes the records are dealt to both shares: sessions straddle
    # them, forks share commits across them; 1 MiB: the worker's share is empty
    url, want = real
    got = _run(url, run, "answer", tmp_path / "cache.json")
    # each run without the cache, the first through it, and the one through half a cache
    assert got["forks"] == [True] * (len(want) + 2)
    assert got["reports"] == want
    assert got["cached"] == want["branch"] and got["late"] == want["branch"] and (tmp_path / "cache.json").exists()
    if run == 512:  # some sessions straddle the shares: read after the worker's answer
        assert all(done < todo for done, todo in got["shares"][:-1]), got["shares"]  # every session, each time


def test_a_worker_that_raises_leaves_its_share_to_the_process(real: tuple[str, dict[str, Any]],
                                                              tmp_path: Path) -> None:
    url, want = real
    got = _run(url, 4096, "raise", tmp_path / "cache.json")
    assert got["reports"] == want and got["cached"] == want["branch"] and got["late"] == want["branch"]


def test_a_worker_not_needed_is_stopped_and_the_process_reads_alone(real: tuple[str, dict[str, Any]],
                                                                   tmp_path: Path) -> None:
    url, want = real
    got = _run(url, 4096, "unneeded", tmp_path / "cache.json")
    assert got["reports"] == want and got["cached"] == want["branch"] and got["late"] == want["branch"]
    assert got["forks"] == [True] * (len(want) + 1) and got["shares"] == []  # none through half a cache


def test_a_worker_killed_leaves_its_share_to_the_process(real: tuple[str, dict[str, Any]],
                                                          tmp_path: Path) -> None:
    url, want = real
    got = _run(url, 4096, "die", tmp_path / "cache.json")  # each worker kills itself (SIGKILL)
    assert got["forks"] == [True] * (len(want) + 2)
    assert got["reports"] == want and got["cached"] == want["branch"] and got["late"] == want["branch"]
    # and through the command: the output of a run without a worker, byte for byte, the cache saved
    script = _RUN.split("try:")[0] + "import runpy\nsys.argv = ['castore', '--store', url, 'usage']\n" \
        "runpy.run_module('castore', run_name='__main__')\n"
    runs = {}
    for mode in ("die", "alone"):
        env = {**os.environ, "CASTORE_USAGE_CACHE": str(tmp_path / f"{mode}.json")}
        runs[mode] = subprocess.run([sys.executable, "-c", script, url, "4096", mode], env=env, capture_output=True,
                                    check=False)
        assert runs[mode].returncode == 0, runs[mode].stderr
    assert runs["die"].stdout == runs["alone"].stdout and b"total" in runs["die"].stdout
    assert runs["die"].stderr == runs["alone"].stderr  # not a word of the worker
    assert json.loads((tmp_path / "die.json").read_text())["sessions"] == \
        json.loads((tmp_path / "alone.json").read_text())["sessions"]


def test_on_s3_the_first_run_reads_alone_what_it_reads_with_a_worker(moto_server: Any, tmp_path: Path) -> None:
    # on S3 s3fs's I/O thread runs by the time the refs are read: no worker is forked (its
    # copy of the thread would not be there), the report is the one the local copy gives
    import uuid

    local, url = str(tmp_path / "local"), f"s3://castore-tests/{uuid.uuid4().hex}"
    projects = _cases().claude_case(tmp_path / "home", "fork") / "projects"
    for where, opts in ((local, {}), (url, moto_server.storage_options)):
        with castore.open(where, durable=False, **opts) as st:
            import_claude(st, projects)
    script = _RUN.replace("castore.open(url)", "castore.open(url, **json.loads(os.environ['OPTS']))")
    env = {**os.environ, "CASTORE_USAGE_CACHE": str(tmp_path / "cache.json"),
           "OPTS": json.dumps(moto_server.storage_options)}
    got = subprocess.run([sys.executable, "-c", script, url, "4096", "answer"], env=env, capture_output=True, text=True,
                         check=False)
    assert got.returncode == 0, got.stderr
    doc = json.loads(got.stdout)
    assert doc["forks"] == [] and doc["reports"]["model"]["total"]["responses"] > 0
    env["OPTS"] = "{}"
    alone = subprocess.run([sys.executable, "-c", script, local, "4096", "answer"], env=env, capture_output=True,
                           text=True, check=True)
    assert doc["reports"] == json.loads(alone.stdout)["reports"]
