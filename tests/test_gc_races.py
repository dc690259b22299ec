"""Issue 18.2: gc's grace period is a guarantee for writers (docs/FORMAT.md, 9.1).

Writers always write (freshen) their objects, gc re-checks each object's age right before
deleting it (atomically on local disk), and a writer whose folder gc pruned writes again
instead of failing. Tested with the issue's exact sequence and with real gc processes
racing real writer processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import castore
from castore import maintenance
from castore.storage.local import LocalStorage

HERE = Path(__file__).parent
WRITER = str(HERE / "crash_writer.py")
ROOT = str(HERE.parent)
CLI = [sys.executable, "-c", "from castore.cli import main; main()"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("CASTORE_STORE", None)
    return env


@pytest.mark.parametrize("fmt", [1, 2])
def test_the_same_prompt_appended_after_a_short_grace_gc_still_reads(tmp_path, fmt):
    # The sequence: append a prompt, delete the session, `gc --grace 2s`, append the
    # same prompt in a new session from the same process; a fresh handle must read it.
    url = str(tmp_path / "st")
    st = castore.open(url, format=fmt)
    prompt = castore.Message(role="system", content="You are a careful assistant. " * 300)
    st.session("app", "u", "one").append(prompt)
    st.delete_session("app", "u", "one")
    st.objects.close()  # the writer is idle: gc may take its log too
    time.sleep(2.5)
    done = subprocess.run([*CLI, "--store", url, "gc", "--grace", "2s", "--json"],
                          env=_env(), capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["deleted"] > 0
    st.session("app", "u", "two").append(prompt)
    fresh = castore.open(url)
    assert fresh.session("app", "u", "two").messages()[0].content == prompt.content
    assert maintenance.fsck(fresh).ok


def test_delete_if_older_spares_a_file_freshened_before_the_check(tmp_path):
    st = LocalStorage(str(tmp_path))
    st.write("objects/ab/cd", b"x")
    old = time.time() - 3600
    os.utime(tmp_path / "objects/ab/cd", (old, old))
    assert st.delete_if_older("objects/ab/cd", time.time() - 60) is True
    assert not (tmp_path / "objects").exists()  # empty folders pruned
    st.write("objects/ab/cd", b"x")  # a writer freshened it
    assert st.delete_if_older("objects/ab/cd", time.time() - 60) is False
    assert (tmp_path / "objects/ab/cd").read_bytes() == b"x"
    assert st.list("objects") == ["objects/ab/cd"]  # nothing left aside


class _PrunedMidWrite(LocalStorage):
    """Emulates gc deleting the last file of a folder (and pruning it) right after a writer
    renamed its object into that folder, before the writer synced the folder."""

    pruned = False

    def _write_file(self, path: str, data: bytes) -> None:
        super()._write_file(path, data)
        if not self.pruned:
            self.pruned = True
            os.unlink(path)
            os.rmdir(os.path.dirname(path))


def test_a_writer_whose_folder_gc_pruned_writes_again_instead_of_failing(tmp_path):
    st = _PrunedMidWrite(str(tmp_path))
    st.write_many({"objects/83/aa": b"one", "objects/84/bb": b"two"})
    assert st.read("objects/83/aa") == b"one" and st.read("objects/84/bb") == b"two"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [1, 2])
def test_gc_processes_racing_writer_processes_lose_no_acknowledged_append(tmp_path, fmt):
    url = str(tmp_path / "st")
    castore.open(url, format=fmt).init()
    opts = json.dumps({"format": fmt})
    writers = [subprocess.Popen([sys.executable, WRITER, "append", url, f"app/u/w{i}", f"w{i}", "0", "60", opts],
                                env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for i in range(2)]
    churn = subprocess.Popen([sys.executable, WRITER, "churn", url, "app/junk", "c", "60", opts],
                             env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    gcs = 0
    while any(p.poll() is None for p in [*writers, churn]):
        # a short grace, as `gc --grace 1s` from cron would run
        r = subprocess.run([*CLI, "--store", url, "gc", "--grace", "1s", "--json"],
                           env=_env(), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        gcs += 1
    acked: dict[str, list[str]] = {}
    for i, p in enumerate(writers):
        out, err = p.communicate()
        assert p.returncode == 0, err
        acked[f"w{i}"] = [line.split()[1] for line in out.splitlines() if line[:1].isdigit()]
        assert len(acked[f"w{i}"]) == 60
    _, err = churn.communicate()
    assert churn.returncode == 0, err
    assert gcs >= 2
    fresh = castore.open(url)
    for sid, ids in acked.items():
        s = fresh.session("app", "u", sid)
        assert [m.content for m in s.messages()] == [f"{sid}-{i}" for i in range(60)]
        assert s.head == ids[-1]
    report = maintenance.fsck(fresh)
    assert report.ok, report.to_dict()
    time.sleep(1.1)
    maintenance.gc(fresh, grace=1)
    assert maintenance.fsck(castore.open(url)).ok


@pytest.mark.parametrize("fmt", [1, 2])
def test_gc_puts_back_an_object_a_killed_gc_had_renamed_aside(tmp_path, fmt):
    url = str(tmp_path / "st")
    st = castore.open(url, format=fmt)
    s = st.session("app", "u", "s")
    s.append(castore.Message(role="user", content="kept " * 1000))  # over 4 KB: loose in format 2 too
    root = tmp_path / "st"
    victim = next(p for p in (root / "objects").rglob("*") if p.is_file())
    aside = victim.with_name(victim.name + ".tmp-gc-0123456789abcdef")
    victim.rename(aside)  # what a gc killed between its rename and its check leaves
    assert not maintenance.fsck(castore.open(url)).ok
    maintenance.gc(castore.open(url), grace=3600)
    assert victim.exists() and not aside.exists()
    assert maintenance.fsck(castore.open(url)).ok
