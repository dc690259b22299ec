"""Deleted means gone (issue 37, item 9): after ``delete-session``, ``gc --grace 0`` and
``repack --all`` no byte of the store, nor of its search index, names the deleted session,
its branches or its messages; and an unreachable object's age survives a repack (item 10)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import Backend, backend_on

import castore
from castore import maintenance
from castore.cli import main
from castore.grep import grep
from castore.grep.files import plain_files
from castore.grep.index import index_dir

backend = backend_on("local", "s3")

#: the deleted session's text, name and branch: lower-case, so that local disk stores the
#: names as they are (upper-case letters are escaped in file names)
MARKER = b"qqmarker7"
NAMES = (MARKER, b"doomedsess", b"doomedbranch")


def fill(store: castore.Store) -> None:
    """One session to keep, one to delete (two branches, the marker in both)."""
    store.session("app", "alice", "keeper").append(castore.Message(role="user", content="ordinary words"))
    s = store.session("app", "alice", "doomedsess")
    s.append(castore.Message(role="user", content=f"{MARKER.decode()} secret text"))
    s.branch("doomedbranch")
    s.checkout("doomedbranch")
    s.append(castore.Message(role="user", content=f"{MARKER.decode()} more"), state_delta={"k": "qqmarker7 state"})


def traces(store: castore.Store, index: str) -> list[str]:
    """Every key of the store and file of the index folder holding a byte string of NAMES."""
    found = []
    keys = store.storage.list("")
    for key, data in store.storage.read_many(keys).items():
        if data is not None:
            found += [f"store {key}: {w!r}" for w in NAMES if w in data or w in key.encode()]
    if os.path.isdir(index):
        for f, data in plain_files(index):  # the chunks of text decompressed
            found += [f"index {f}: {w!r}" for w in NAMES if w in data]
    return found


def test_delete_gc_repack_leave_no_trace_in_the_store_nor_its_index(backend: Backend) -> None:
    store = backend.open()
    fill(store)
    assert len(list(grep(store, MARKER.decode()))) == 2  # builds the index
    index = index_dir(store)
    assert traces(store, index)  # the test sees them while they are there
    store.delete_session("app", "alice", "doomedsess")
    maintenance.gc(store, grace=0)
    maintenance.repack(store, all_packs=True)
    assert traces(store, index) == []
    assert [m.session for m in grep(store, "ordinary")] == [("app", "alice", "keeper")]  # the index still serves
    store.close()


def test_the_cli_delete_gc_repack_leave_no_trace_on_local_disk(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = castore.open(url)
    fill(store)
    store.close()

    def run(*args: str) -> str:
        r = CliRunner().invoke(main, ["--store", url, *args])
        assert r.exit_code == 0, r.output
        return r.output

    assert MARKER.decode() in run("grep", MARKER.decode())
    store = castore.open(url)
    index = index_dir(store)
    assert traces(store, index)
    run("delete-session", "app/alice/doomedsess")
    assert not any(t.startswith("index") for t in traces(store, index))  # delete-session reaches the index
    run("gc", "--grace", "0")
    run("repack", "--all")
    assert traces(store, index) == []
    assert "ordinary" in run("grep", "ordinary")
    store.close()


def test_swap_log_rotates_past_its_bound_and_an_old_mark_cannot_tell(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from castore.storage import refchanges

    monkeypatch.setattr(refchanges, "ROTATE_BYTES", 2000)
    store = castore.open(str(tmp_path / "store"))
    s = store.session("app", "alice", "s1")
    s.append(castore.Message(role="user", content="first"))
    mark, names = store.refs.changes_since("sessions", None)
    assert mark is not None and names is None
    log = tmp_path / "store" / refchanges.SWAP_LOG
    for i in range(200):
        s.append(castore.Message(role="user", content=f"m{i}"))
        assert log.stat().st_size <= 2000 + 200
    # the changes went to logs the mark does not name: it cannot tell, never "nothing moved"
    again, names = store.refs.changes_since("sessions", mark)
    assert names is None and again is not None
    s.append(castore.Message(role="user", content="last"))
    _, names = store.refs.changes_since("sessions", again)
    assert names == ["sessions/app/alice/s1/heads/main"]
    store.close()


def test_gc_drops_the_boot_markers_records_of_deletes(tmp_path: Path) -> None:
    store = castore.open(str(tmp_path / "store"))
    for i in range(30):
        store.session("app", "alice", f"gone{i}").append(castore.Message(role="user", content="x"))
        store.delete_session("app", "alice", f"gone{i}")
    markers = list((tmp_path / "store" / "journal").iterdir())
    assert markers and all(b"gone" in m.read_bytes() for m in markers)
    maintenance.gc(store, grace=0)
    assert all(b"gone" not in m.read_bytes() for m in (tmp_path / "store" / "journal").iterdir())
    store.close()


# -- item 10: a repack keeps an object's age --------------------------------------------------
def _doomed(store: castore.Store, sid: str) -> set[str]:
    """Write a session, delete it: the ids it alone held."""
    before = set(store.objects.iter_ids())
    store.session("app", "alice", sid).append(castore.Message(role="user", content=f"{sid} to be erased"))
    store.objects.close()  # sealed: a log of this handle would be spared
    made = set(store.objects.iter_ids()) - before
    store.delete_session("app", "alice", sid)
    return made


def test_repack_does_not_restart_the_grace_period_of_unreachable_objects(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = castore.open(url)
    store.session("app", "alice", "keeper").append(castore.Message(role="user", content="kept"))
    old = _doomed(store, "old")
    week = 7 * 86400.0
    then = time.time() - 30 * 86400
    for f in (tmp_path / "store").rglob("*"):  # as if written a month ago
        if f.is_file() and ("packs" in f.parts or "objects" in f.parts):
            if f.suffix == ".age":
                ages = json.loads(f.read_bytes())
                f.write_text(json.dumps({"born": [[off, then] for off, _ in ages["born"]]}))
            os.utime(f, (then, then))
    young = _doomed(store, "young")  # written now: within any grace period
    for _ in range(3):  # background repacks, as often as they like
        maintenance.repack(store, all_packs=True)
        store.objects.refresh()
    report = maintenance.gc(store, grace=week)
    assert old and old <= set(report.deleted)
    assert young and not young & set(report.deleted) and young <= set(store.objects.iter_ids())
    # the young ones were carried into a new pack by gc: still young there, and not forever
    maintenance.repack(store, all_packs=True)
    assert not young & set(maintenance.gc(store, grace=week).deleted)
    assert young <= set(maintenance.gc(store, grace=0).deleted)
    assert castore.maintenance.fsck(store).ok
    store.close()


@pytest.mark.parametrize("backend", ["s3"], indirect=True)
def test_repack_keeps_the_age_of_unreachable_objects_on_s3(backend: Backend) -> None:
    store = backend.open()
    store.session("app", "alice", "keeper").append(castore.Message(role="user", content="kept"))
    old = _doomed(store, "old")
    time.sleep(3)  # the objects are 3 s old: a grace of 2 s has passed for them
    maintenance.repack(store, all_packs=True)
    store.objects.refresh()
    report = maintenance.gc(store, grace=2)
    assert old and old <= set(report.deleted)
    store.close()
