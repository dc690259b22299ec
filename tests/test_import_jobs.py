"""``import ... --jobs N``: an archive import spread over worker processes gives what one process
gives (sessions, commit ids, exported bytes, the CLI's output and error line); a worker failing
leaves the others' files imported; two imports of one folder at once both finish, every line
stored once (castore.adapters.import_jobs). Real spawned workers, no mocks."""

from __future__ import annotations

import json
import lzma
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import castore
from castore.adapters.codex import export_codex, import_codex
from castore.adapters.import_jobs import ImportJobError, session_groups, split
from castore.errors import RefConflict
from castore.maintenance import fsck
from castore.session import NEW_BRANCH

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(GOLDEN))

from make_import_ids import _files, _sessions, scenarios  # noqa: E402

WANT = json.loads((GOLDEN / "import-ids.json").read_text())


def _cli(store: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "castore", "--store", str(store), *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "COLUMNS": "200"})


def test_jobs_2_gives_the_checked_in_commits_of_every_vendor(tmp_path: Path) -> None:
    got = json.loads(json.dumps(scenarios(tmp_path, jobs=2, vendors_only=True), sort_keys=True)
                     .replace(str(tmp_path), "WORK"))
    assert sorted(got) == ["claude", "codex", "gemini", "pi"]
    for name, scenario in got.items():
        assert scenario == WANT[name], name


def test_codex_forks_stay_with_their_parent_and_give_what_one_process_gives(tmp_path: Path) -> None:
    src = (DATA / "codex" / "sample_codex_session.jsonl").read_text()
    meta = json.loads(src.splitlines()[0])
    tid = meta["payload"]["id"]
    folder = tmp_path / "sessions"
    folder.mkdir()
    (folder / "rollout-a.jsonl").write_text(src)
    (folder / "rollout-b.jsonl").write_text(src.replace(tid, "11111111-2222-3333-4444-555555555555"))
    results = {}
    for jobs in (1, 2):
        store = castore.open(str(tmp_path / f"store{jobs}"), durable=False)
        results[jobs] = [(r.session, r.lines, r.head) for r in import_codex(store, folder, jobs=jobs)]
        export_codex(store, tmp_path / f"out{jobs}")
        results[jobs].append(_sessions(store))
    assert results[1] == results[2]
    assert _files(tmp_path / "out1") == _files(tmp_path / "out2")


def test_sessions_sharing_a_name_go_to_one_share() -> None:
    groups = session_groups(["a", ("b", "a"), "c", ("d", "b"), "e"])
    assert groups == [[0, 1, 3], [2], [4]]
    assert sorted(split(groups, [5, 1, 9, 1, 2], 2)) == [[0, 1, 3, 4], [2]]  # 9 bytes against 9
    with pytest.raises(ImportJobError):
        import_codex(castore.open("memory://import-jobs-bad"), DATA / "codex", jobs=0)


def test_cli_output_with_jobs_2_is_what_jobs_1_prints(tmp_path: Path) -> None:
    outs = []
    for jobs in ("1", "2"):
        text = _cli(tmp_path / f"s{jobs}", "import", "claude", str(DATA / "claude-code"), "--jobs", jobs)
        js = _cli(tmp_path / f"g{jobs}", "import", "gemini", str(DATA / "gemini" / "tmp"), "--jobs", jobs, "--json")
        assert text.returncode == js.returncode == 0, text.stderr + js.stderr
        outs.append((text.stdout, text.stderr, js.stdout.replace(f"g{jobs}", "G"), js.stderr))
    assert outs[0] == outs[1]
    assert outs[0][0].count("\n") == 11  # a line per file imported


@pytest.fixture
def pi_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "pi"
    folder.mkdir()
    for xz in sorted((DATA / "pi").glob("*.xz")):
        (folder / xz.name.removesuffix(".xz")).write_bytes(lzma.decompress(xz.read_bytes()))
    return folder


def test_a_worker_failing_on_a_corrupt_file_says_what_one_process_says(tmp_path: Path, pi_folder: Path) -> None:
    (pi_folder / "a-corrupt.jsonl").write_text('{"type": "message", "id": "x"}\n')
    got = {jobs: _cli(tmp_path / f"s{jobs}", "import", "pi", str(pi_folder), "--jobs", jobs) for jobs in ("1", "2")}
    assert got["1"].returncode == got["2"].returncode == 1
    assert got["1"].stderr == got["2"].stderr
    assert got["1"].stderr.startswith("Error: ") and got["1"].stderr.count("\n") == 1
    assert got["1"].stdout == got["2"].stdout == ""
    # one process stopped at the corrupt file, the first; with two, the largest file went to
    # the other worker, which imported it
    one, two = (castore.open(str(tmp_path / f"s{j}")) for j in ("1", "2"))
    assert (len(one.sessions("pi")), len(two.sessions("pi"))) == (0, 1)
    (pi_folder / "a-corrupt.jsonl").unlink()
    again = _cli(tmp_path / "s2", "import", "pi", str(pi_folder), "--jobs", "2")
    assert again.returncode == 0, again.stderr
    store = castore.open(str(tmp_path / "s2"))
    assert len(store.sessions("pi")) == 2
    assert fsck(store).ok


def _folder_of_copies(root: Path, copies: int) -> Path:
    """A projects folder: the Claude Code fixtures copied into ``copies`` project folders."""
    out = root / "projects"
    for k in range(copies):
        for proj in ("session-share", "claude-code-log"):
            shutil.copytree(DATA / "claude-code" / proj, out / f"{proj}-{k}",
                            ignore=shutil.ignore_patterns("LICENSE", "README.md"))
    return out


def _two_imports_at_once(tmp_path: Path, vendor: str, folder: Path, jobs: str) -> tuple[castore.Store, castore.Store]:
    """Two real processes importing ``folder`` into one store at once, both finishing; returns
    that store and one an import alone made."""
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "castore", "--store", str(store), "import", vendor, str(folder), "--jobs", jobs]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    outs = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    alone = _cli(tmp_path / "alone", "import", vendor, str(folder), "--jobs", "1")
    assert alone.returncode == 0, alone.stderr
    return castore.open(str(store)), castore.open(str(tmp_path / "alone"))


def test_two_imports_of_one_folder_at_once_both_finish_with_every_line_once(tmp_path: Path) -> None:
    both, one = _two_imports_at_once(tmp_path, "claude", _folder_of_copies(tmp_path, 6), "2")
    # the same commits as one import alone: every line stored once
    assert _sessions(both) == _sessions(one)
    assert fsck(both).ok


@pytest.mark.slow  # three whole imports of the Pi fixtures: ~20 s on a shared machine
def test_two_imports_of_one_pi_folder_at_once_both_finish_with_every_line_once(tmp_path: Path,
                                                                              pi_folder: Path) -> None:
    """Pi's importer writes commits with their parents from the file (the same lines give the
    same commits in both) and makes its branches itself: a branch the rival made first is
    taken when it is at the same commit, and a lost race otherwise (retried, IMPORT_RETRY)."""
    both, one = _two_imports_at_once(tmp_path, "pi", pi_folder, "1")
    assert _sessions(both) == _sessions(one)
    for si in both.sessions("pi"):  # every line once: as many commits as the import alone made
        assert len(both.session(si.app, si.user, si.session).log(limit=None, all_branches=True)) \
            == len(one.session(si.app, si.user, si.session).log(limit=None, all_branches=True))
    assert fsck(both).ok


def test_an_append_that_makes_a_branch_loses_to_a_rival_that_made_it_first() -> None:
    store = castore.open("memory://import-jobs-new-branch")
    s = store.session("a", "u", "s")
    first = s.append_many([{"role": "user", "content": "hi"}], expect=NEW_BRANCH, branch="main")
    with pytest.raises(RefConflict):
        s.append_many([{"role": "user", "content": "hi"}], expect=NEW_BRANCH, branch="main")
    assert s.branches() == {"main": first[0]}


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_the_next_import_finishes(tmp_path: Path) -> None:
    folder = _folder_of_copies(tmp_path, 30)
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "castore", "--store", str(store), "import", "claude", str(folder), "--jobs", "2"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         start_new_session=True)

    def group() -> list[str]:
        got = subprocess.run(["pgrep", "-g", str(p.pid)], capture_output=True, text=True).stdout.split()
        return [x for x in got if os.path.exists(f"/proc/{x}/cmdline") and open(f"/proc/{x}/cmdline").read()]

    while p.poll() is None and len(group()) < 3:  # the parent and its two workers (and multiprocessing's tracker)
        pass
    assert p.poll() is None, "the import ended before its workers were seen"
    os.killpg(p.pid, signal.SIGINT)  # as Ctrl-C at a terminal: the whole foreground group
    _, err = p.communicate()
    assert p.returncode == 1 and err.strip().endswith("Aborted!"), err
    assert "Traceback" not in err
    while group():  # every worker gone (the test runner's timeout catches one that never goes)
        pass
    again = _cli(store, "import", "claude", str(folder), "--jobs", "2")
    assert again.returncode == 0, again.stderr
    assert _cli(tmp_path / "alone", "import", "claude", str(folder), "--jobs", "1").returncode == 0
    assert _sessions(castore.open(str(store))) == _sessions(castore.open(str(tmp_path / "alone")))
    assert fsck(castore.open(str(store))).ok


def test_a_handle_that_repacks_its_own_merges_only_the_packs_it_wrote(tmp_path: Path) -> None:
    """Import workers each merge only the packs they wrote (Store.repack_own), so their repacks
    run side by side over disjoint packs: on local disk, where a repack otherwise merges every
    sealed pack, the other writer's packs are left to it, and every object stays readable."""
    url = str(tmp_path / "s")
    a, b = castore.Store.open(url, auto_repack=False), castore.Store.open(url, auto_repack=False)
    a.repack_own = True
    assert a.repack_own and not b.repack_own
    mine: dict[str, set[str]] = {}
    for st, name in ((a, "a"), (b, "b")):
        before = set(castore.Store.open(url).objects.packmap.pack_names())
        s = st.session("app", "u", name)
        for i in range(4):
            s.append(castore.Message(role="user", content=f"{name} {i}"))
            if i % 2:
                st.close()  # seals its log (the next append opens another): a repack may merge them
        mine[name] = set(castore.Store.open(url).objects.packmap.pack_names()) - before
    assert len(mine["a"]) == len(mine["b"]) == 2 and not mine["a"] & mine["b"]
    assert a.objects.repack_own and a.objects.auto_repack_once() is not None
    left = set(castore.Store.open(url).objects.packmap.pack_names())
    assert mine["b"] <= left and not mine["a"] & left  # b's log untouched, a's merged
    for name in ("a", "b"):
        got = [le.entry.content for le in reversed(castore.Store.open(url).session("app", "u", name).log())]
        assert got == [f"{name} {i}" for i in range(4)]
