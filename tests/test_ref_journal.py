"""Deferred ref swaps on local disk (format 3, docs/FORMAT.md 12): the writer's log is the
redo log of its ref swaps.

A durable append is one objects record and one ref intent in the writer's log, synced by
one ``fdatasync``, and a rename of the ref that is not synced. These tests count the syncs,
simulate a power loss (the renames that were never synced are rolled back, or left torn,
on disk; then a "new boot" opens the store) and check that recovery brings back every
acknowledged append, that deletes are not undone by a replay, and that a writer killed
between its intent and its rename is not rolled forward once another writer took the lock.
"""

from __future__ import annotations

import base64
import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers.storage import PassThrough
from hypothesis import given
from hypothesis import strategies as hs

import castore
from castore.errors import IntegrityError
from castore.maintenance import fsck
from castore.objectstore import packs, refintents
from castore.storage import RefIntent, reffiles
from castore.storage import local as local_mod
from castore.storage.bootmarkers import JOURNAL
from castore.storage.local import LocalStorage

GOLDEN = Path(__file__).parent / "golden" / "format3-intent.json"
GOLDEN_DELTA = Path(__file__).parent / "golden" / "format3-delta-intent.json"


class _Syncs:
    """Counts os.fsync + os.fdatasync calls (monkeypatched)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real_fsync, real_fdatasync = os.fsync, os.fdatasync

        def fsync(fd: int) -> None:
            self.n += 1
            real_fsync(fd)

        def fdatasync(fd: int) -> None:
            self.n += 1
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "fdatasync", fdatasync)


def _syncs_per_append(monkeypatch: pytest.MonkeyPatch, root: Path, **open_args: Any) -> float:
    st = castore.open(str(root), **{"format": 3, **open_args})
    s = st.session("app", "u", "s")
    for i in range(3):  # warm: the log, the marker, the ref folders are made
        s.append(castore.Message(role="user", content=f"warm {i}"))
    count = _Syncs(monkeypatch)
    for i in range(20):
        s.append(castore.Message(role="user", content=f"m {i} " + "x" * 300), state_delta={"turn": i})
    n = count.n
    monkeypatch.undo()
    st.close()
    return n / 20


def test_a_durable_append_makes_one_fsync_in_format_3_and_three_in_format_2(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert _syncs_per_append(monkeypatch, tmp_path / "f3") == 1.0
    assert json.loads((tmp_path / "f3" / "castore.json").read_text())["format"] == 3
    assert _syncs_per_append(monkeypatch, tmp_path / "f2", format=2) == 3.0  # unchanged
    assert not (tmp_path / "f2" / JOURNAL).exists()
    assert _syncs_per_append(monkeypatch, tmp_path / "nd", durable=False) == 0.0


def test_a_new_logs_header_is_made_durable_with_its_first_record(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    castore.open(str(tmp_path)).session("app", "u", "s").append(castore.Message(role="user", content="seed"))
    datasyncs: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (datasyncs.append(fd), real(fd))[1])
    with castore.open(str(tmp_path)) as st:  # a process per turn: a new handle, a new log
        st.session("app", "u", "s").append(castore.Message(role="user", content="one turn"))
        assert len(datasyncs) == 1  # before: 2, the header synced on its own first
    monkeypatch.undo()
    with castore.open(str(tmp_path)) as st:
        assert [m.content for m in st.session("app", "u", "s").messages()] == ["seed", "one turn"]


# -- simulated power loss ----------------------------------------------------------------------
def _power_loss(storage: LocalStorage, torn: bool = False) -> int:
    """Undo, on disk, every rename the storage made without syncing (newest first): the ref
    gets back the bytes it replaced (or goes, if it was new). With ``torn``, the renames
    survive but their data does not: each such ref is left empty. Returns how many."""
    assert storage.unsynced is not None
    undone = list(reversed(storage.unsynced))
    for path, old in undone:
        if torn:
            with open(path, "wb"):
                pass
        elif old is None:
            if os.path.exists(path):
                os.unlink(path)
        else:
            with open(path, "wb") as f:
                f.write(old)
    storage.unsynced.clear()
    return len({p for p, _ in undone})


def _log_fields(data: bytes) -> list[dict[str, Any]]:
    """The JSON of every intent record of a log, each with the key of the intent it is read
    as (``"key"``; a delta has no ``"k"`` of its own)."""
    raw = [json.loads(bytes(p[1:])) for _, p in packs._records(data, 2) if p[:1] == packs.INTENT_FRAME]
    read = refintents.intents(data)
    return [{**r, "key": i.key} for r, i in zip(raw, read, strict=True)]


def _intent_fields(root: Path) -> list[dict[str, Any]]:
    """:func:`_log_fields` of every log of the store, sealed or not (log by log)."""
    out = []
    for n in sorted(os.listdir(root / "packs")):
        if n.startswith("w-") and n.endswith(".pack"):
            out += _log_fields((root / "packs" / n).read_bytes())
    return out


def _reboot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_mod, "_boot_id", lambda: "00000000-0000-0000-0000-00000000b007")


def _write(root: Path) -> tuple[castore.Store, dict[str, list[str]]]:
    """Appends to two sessions and a fork, on a store recording its unsynced renames; the
    store is left open (a power loss does not close it)."""
    st = castore.open(str(root), format=3)
    assert isinstance(st.storage, LocalStorage)
    st.storage.unsynced = []
    want: dict[str, list[str]] = {}
    for sid in ("s1", "s2"):
        s = st.session("app", "u", sid)
        for i in range(7):
            s.append(castore.Message(role="user", content=f"{sid} {i}"), state_delta={"n": i})
        want[sid] = [m.content for m in s.messages()]
    f = st.session("app", "u", "s1").fork("s3", at="HEAD~3")
    f.append(castore.Message(role="user", content="forked"))
    want["s3"] = [m.content for m in f.messages()]
    return st, want


@pytest.mark.parametrize("torn", [False, True], ids=["rolled-back", "torn"])
def test_a_power_loss_loses_no_acknowledged_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     torn: bool) -> None:
    root = tmp_path / "st"
    st, want = _write(root)
    assert isinstance(st.storage, LocalStorage)
    assert _power_loss(st.storage, torn) >= 3  # the refs really were behind on disk
    if not torn:
        # what the disk holds now, read without recovery: the appends are not there
        raw = LocalStorage(str(root)).read_versioned("refs/sessions/app/u/s1/heads/main")
        assert raw is None or json.loads(raw.data.split(b"\n")[1])["len"] < len(want["s1"])
    # the branches' intents after their first are deltas: the replay must rebuild them
    assert sum("z" in r for r in _intent_fields(root)) >= 12
    _reboot(monkeypatch)
    again = castore.open(str(root))
    for sid, msgs in want.items():
        assert [m.content for m in again.session("app", "u", sid).messages()] == msgs, sid
    assert fsck(again).ok
    assert os.listdir(root / JOURNAL) == []  # the marker of the lost boot is gone once replayed
    again.session("app", "u", "s1").append(castore.Message(role="user", content="after"))
    assert again.session("app", "u", "s1").messages()[-1].content == "after"


def test_a_clean_reboot_replays_nothing_that_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "st"
    st, want = _write(root)  # no power loss: the renames are all there
    before = {k: LocalStorage(str(root)).read(k) for k in LocalStorage(str(root)).list("refs")}
    _reboot(monkeypatch)
    again = castore.open(str(root))
    assert {k: again.storage.read(k) for k in again.storage.list("refs")} == before
    assert os.listdir(root / JOURNAL) == []


def test_a_replay_does_not_undo_a_delete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "st"
    st = castore.open(str(root), format=3)
    assert isinstance(st.storage, LocalStorage)
    st.storage.unsynced = []
    st.session("app", "u", "gone").append(castore.Message(role="user", content="x"))  # created by a deferred swap
    st.session("app", "u", "kept").append(castore.Message(role="user", content="y"))
    st.delete_session("app", "u", "gone")  # durable, and recorded in the boot's marker
    _power_loss(st.storage)
    _reboot(monkeypatch)
    again = castore.open(str(root))
    assert [s.session for s in again.sessions("app")] == ["kept"]
    assert fsck(again).ok


def _pack_files(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root / "packs") if n.endswith(".pack"))


@pytest.mark.parametrize("read_back", [False, True], ids=["from-memory", "read-back"])
def test_closing_a_log_makes_its_refs_durable_then_drops_its_intents(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    read_back: bool) -> None:
    """Close merges the handle's log into a pack of blocks without its intent records
    (docs/FORMAT.md 12, "Dropping the intents at close"), after syncing the refs they moved:
    a power loss after it replays nothing and loses nothing. The log's objects come from
    the handle's memory, or, once it no longer holds them all, from the log read back."""
    root = tmp_path / "st"
    st, want = _write(root)
    assert isinstance(st.storage, LocalStorage)
    assert st.storage.unsynced and _intent_fields(root)
    if read_back:
        st.objects._recent.clear()
    st.close()
    assert st.storage.unsynced == []  # every ref its intents moved was synced before they went
    names = _pack_files(root)
    assert names and all(n.startswith("r-") and (root / "packs" / f"{n[:-5]}.idx").exists() for n in names)
    assert all(refintents.intents((root / "packs" / n).read_bytes()) == [] for n in names)
    assert _power_loss(st.storage) == 0
    _reads_back_after_reboot(root, want, monkeypatch)


class _Cut(BaseException):
    """A crash in the middle of a close (no handler of castore catches it)."""


@pytest.mark.parametrize(("method", "when", "key"), [
    ("sync_keys", "before", ""), ("write", "before", ".pack"), ("write", "before", ".idx"),
    ("delete_many", "before", ""), ("delete", "after", ".pack"),
], ids=["before-ref-sync", "before-pack", "before-index", "before-log-delete", "after-log-delete"])
def test_a_power_loss_during_close_loses_no_acknowledged_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                method: str, when: str, key: str) -> None:
    """A close cut at each of its steps, then a power loss (every rename not synced undone):
    the log's intents are there to replay until the refs they moved are durable."""
    root = tmp_path / "st"
    st, want = _write(root)
    assert isinstance(st.storage, LocalStorage)
    real = getattr(st.storage, method)
    hit = []

    def cut(*args: Any, **kwargs: Any) -> Any:
        mine = not key or (args and str(args[0]).startswith("packs/") and str(args[0]).endswith(key))
        if mine and when == "before":
            hit.append(1)
            raise _Cut
        out = real(*args, **kwargs)
        if mine:
            hit.append(1)
            raise _Cut
        return out

    monkeypatch.setattr(st.storage, method, cut)
    with pytest.raises(_Cut):
        st.close()
    monkeypatch.undo()
    assert hit
    _power_loss(st.storage)
    _reboot(monkeypatch)
    again = castore.open(str(root))
    for sid, msgs in want.items():
        assert [m.content for m in again.session("app", "u", sid).messages()] == msgs, sid
    assert fsck(again).ok


def test_repack_of_a_dead_writers_log_makes_its_refs_durable_first(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``castore repack`` merging a log that its writer never sealed (it died: its
    ``flock`` is free) syncs the refs of the log's intents before deleting the log."""
    from castore import maintenance

    root = tmp_path / "st"
    st, want = _write(root)
    assert isinstance(st.storage, LocalStorage)
    log = st.objects.writer_log._log
    assert log is not None and st.storage.unsynced
    log.close()  # the writer dies: its log stays unsealed, its flock is released
    st.objects.writer_log._drop_log()
    monkeypatch.setattr(maintenance, "LOG_IDLE", -1.0)
    assert maintenance.repack(st).new_pack is not None
    assert not [n for n in _pack_files(root) if n.startswith("w-")]
    assert st.storage.unsynced == []
    _power_loss(st.storage)
    _reboot(monkeypatch)
    again = castore.open(str(root))
    for sid, msgs in want.items():
        assert [m.content for m in again.session("app", "u", sid).messages()] == msgs, sid
    assert fsck(again).ok


def test_a_closed_format_3_store_takes_no_more_bytes_than_format_2(tmp_path: Path) -> None:
    """The intents (~200-300 bytes an append) are gone after close: a short session in format 3
    stores no more than in format 2 (whose log keeps its records compressed one by one)."""
    sizes = {}
    for fmt in (2, 3):
        root = tmp_path / f"f{fmt}"
        with castore.open(str(root), format=fmt) as st:
            s = st.session("app", "u", "s")
            for i in range(100):
                s.append(castore.Message(role="user", content=f"message {i} " + "lorem ipsum " * (i % 40)),
                         state_delta={"turn": i})
        sizes[fmt] = sum(os.path.getsize(root / "packs" / n) for n in os.listdir(root / "packs"))
        assert [m.content[:11] for m in castore.open(str(root)).session("app", "u", "s").messages()][-1] == "message 99 "
    assert sizes[3] <= sizes[2], sizes


def _killed_between_intent_and_rename(root: str) -> None:
    """Child: one normal append, then an append that dies after its intent is synced and
    before it writes the ref (in place, or into the lock file to rename; as a kill -9 there
    would)."""
    st = castore.open(root, format=3)
    s = st.session("app", "u", "s")
    s.append(castore.Message(role="user", content="landed"))

    def die(fd: int, data: bytes, offset: int) -> int:
        os._exit(0)  # the ref's new bytes are written only with pwrite, after the intent

    os.pwrite = die  # type: ignore[assignment]
    s.append(castore.Message(role="user", content="never acknowledged"))


def _run_killed_writer(root: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_killed_between_intent_and_rename, args=(str(root),))
    p.start()
    p.join()
    assert p.exitcode == 0
    assert list((root / "refs").rglob("*.lock"))  # it died holding the ref's lock


@pytest.mark.parametrize("who", ["next writer", "gc"])
def test_a_swap_cut_short_is_not_rolled_forward_once_its_dead_lock_was_cleared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, who: str) -> None:
    from castore.maintenance import clear_stale_locks

    root = tmp_path / "st"
    _run_killed_writer(root)
    st = castore.open(str(root), format=3)
    if who == "gc":
        assert clear_stale_locks(st) == ["refs/sessions/app/u/s/heads/main.lock"]
    else:
        st.session("app", "u", "s").append(castore.Message(role="user", content="next writer"))
    st.close()
    _reboot(monkeypatch)
    again = castore.open(str(root))
    want = ["landed"] + (["next writer"] if who != "gc" else [])
    assert [m.content for m in again.session("app", "u", "s").messages()] == want
    assert fsck(again).ok


def test_a_swap_cut_short_and_left_alone_is_rolled_forward_after_a_reboot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one anomaly (docs/FORMAT.md 12): as in SQLite, the synced intent is the commit
    point, so a writer killed between it and its rename, whose ref nobody touched since,
    has its append land at the next reboot, whole (its objects were synced with it)."""
    root = tmp_path / "st"
    _run_killed_writer(root)
    _reboot(monkeypatch)
    again = castore.open(str(root))
    assert [m.content for m in again.session("app", "u", "s").messages()] == ["landed", "never acknowledged"]
    assert fsck(again).ok


def test_a_fresh_castore_grep_replays_the_swaps_cut_short_before_it_reads_a_ref(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``castore grep`` in a fresh process takes the path that builds no object store (the refs,
    then the search index): after a power loss, the swaps it cut short are replayed before any
    ref is read, so an acknowledged append whose rename the power loss undid is found."""
    from castore.grep import grep_counts

    # the writes belong to a boot that the power loss ends: the fresh process is the next boot
    monkeypatch.setattr(local_mod, "_boot_id", lambda: "00000000-0000-0000-0000-0000000b00b5")
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "index"))
    root = tmp_path / "st"
    st, _ = _write(root)
    assert grep_counts(st, "zanzibar") == {}  # the index is built here, before the append
    st.session("app", "u", "s2").append(castore.Message(role="user", content="zanzibar at last"))
    assert _power_loss(st.storage) >= 1
    raw = LocalStorage(str(root)).read_versioned("refs/sessions/app/u/s2/heads/main")
    assert raw is None or json.loads(raw.data.split(b"\n")[1])["len"] < 8  # the append is not on disk
    p = subprocess.run([sys.executable, "-m", "castore", "--store", str(root), "grep", "-c", "zanzibar"],
                       capture_output=True, text=True, cwd=str(tmp_path), check=False)
    assert (p.returncode, p.stdout) == (0, "app/u/s2:1\n"), p.stderr
    assert os.listdir(root / JOURNAL) == []  # the marker of the lost boot is gone once replayed


# -- a swap of several refs (a LangGraph group commit): every intent under one sync ---------------
_PAIR = ["sessions/app/u/x/heads/main", "sessions/app/u/y/heads/main"]


def _target(name: str, i: int) -> str:
    return hashlib.sha256(f"{name} {i}".encode()).hexdigest()


def _swap_pairs(st: castore.Store, turns: range, cur: dict[str, Any]) -> dict[str, Any]:
    """Move both refs of :data:`_PAIR` once per turn with one ``swap_many``; return their values."""
    for i in turns:
        out = st.plumbing.swap_many([(n, _target(n, i), cur.get(n), {"turn": i}) for n in _PAIR])
        assert all(not isinstance(v, Exception) for v in out), out
        cur = dict(zip(_PAIR, out, strict=True))
    return cur


@pytest.mark.parametrize("fmt, syncs", [(3, 1), (2, 4)])
def test_a_swap_of_two_refs_journals_both_intents_under_one_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 fmt: int, syncs: int) -> None:
    st = castore.open(str(tmp_path / "st"), format=fmt)
    st.session("app", "u", "s").append(castore.Message(role="user", content="opens the log"))
    cur = _swap_pairs(st, range(2), {})  # the refs and their folders are made
    count = _Syncs(monkeypatch)
    cur = _swap_pairs(st, range(2, 12), cur)
    assert count.n == 10 * syncs  # format 2: each ref alone, lock file and folder synced
    monkeypatch.undo()
    if fmt == 3:
        # a pair's intents are two records side by side in the log, the second ref's a delta too
        fields = _intent_fields(tmp_path / "st")[-20:]
        assert [f["key"] for f in fields] == ["refs/" + n for n in _PAIR] * 10
        assert all("z" in f for f in fields)
    again = castore.open(str(tmp_path / "st"))
    assert {n: again.refs.read(n).target for n in _PAIR} == {n: _target(n, 11) for n in _PAIR}  # type: ignore[union-attr]


@pytest.mark.parametrize("torn", [False, True], ids=["rolled-back", "torn"])
def test_a_power_loss_after_a_swap_of_two_refs_replays_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           torn: bool) -> None:
    root = tmp_path / "st"
    st = castore.open(str(root), format=3)
    assert isinstance(st.storage, LocalStorage)
    st.storage.unsynced = []
    st.session("app", "u", "s").append(castore.Message(role="user", content="opens the log"))
    _swap_pairs(st, range(5), {})
    assert _power_loss(st.storage, torn) >= 2
    _reboot(monkeypatch)
    again = castore.open(str(root))
    assert {n: again.refs.read(n).target for n in _PAIR} == {n: _target(n, 4) for n in _PAIR}  # type: ignore[union-attr]
    assert os.listdir(root / JOURNAL) == []


@pytest.mark.parametrize("torn", [False, True], ids=["rolled-back", "torn"])
def test_new_refs_of_a_swap_many_are_their_lock_files_renamed_and_a_power_loss_replays_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: bool) -> None:
    """A ref that a swap expects absent needs a new file anyway: its lock is made as a new
    file (not the handle's linked lock file), its value written into it after the intent, and
    it is renamed over the ref: no temporary file, no link. Replayed after a power loss as
    any deferred swap."""
    root = tmp_path / "st"
    st = castore.open(str(root), format=3)
    assert isinstance(st.storage, LocalStorage)
    st.storage.unsynced = []
    st.session("app", "u", "s").append(castore.Message(role="user", content="opens the log"))
    names = [f"sessions/app/u/new{i}/heads/main" for i in range(3)]
    locks: dict[str, tuple[int, int]] = {}
    journal_many = st.objects.journal_many

    def seen(intents: Any) -> bool:
        for intent in intents:
            s = os.stat(root / (intent.key + ".lock"))
            locks[intent.key] = (s.st_ino, s.st_nlink)
        return journal_many(intents)

    monkeypatch.setattr(st.objects, "journal_many", seen)
    out = st.plumbing.swap_many([(n, _target(n, 0), None, {}) for n in names])
    monkeypatch.undo()
    assert all(not isinstance(v, Exception) for v in out), out
    for n in names:
        ino, links = locks["refs/" + n]
        assert links == 1 and (root / "refs" / n).stat().st_ino == ino  # the lock file became the ref
        assert sorted(os.listdir((root / "refs" / n).parent)) == ["main"]  # no lock, no temporary left
    assert _power_loss(st.storage, torn) >= 3
    _reboot(monkeypatch)
    again = castore.open(str(root))
    assert {n: again.refs.read(n).target for n in names} == {n: _target(n, 0) for n in names}  # type: ignore[union-attr]
    assert os.listdir(root / JOURNAL) == []


def test_a_new_ref_that_a_rival_made_first_is_a_lost_compare_and_keeps_the_rivals_value(tmp_path: Path) -> None:
    from castore.errors import RefConflict

    st = castore.open(str(tmp_path / "st"), format=3)
    st.session("app", "u", "s").append(castore.Message(role="user", content="opens the log"))
    x, y = _PAIR
    other = castore.open(str(tmp_path / "st"))
    other.refs.swap(y, _target(y, 99), None)  # y is made under the writer
    out = st.plumbing.swap_many([(x, _target(x, 1), None, {}), (y, _target(y, 1), None, {})])
    assert isinstance(out[1], RefConflict) and not isinstance(out[0], Exception)
    assert st.refs.read(x).target == _target(x, 1)  # type: ignore[union-attr]
    assert st.refs.read(y).target == _target(y, 99)  # type: ignore[union-attr]
    assert not [p for p in (tmp_path / "st" / "refs").rglob("*.lock")]  # every lock let go


def test_a_swap_of_two_refs_lands_the_one_whose_compare_holds(tmp_path: Path) -> None:
    from castore.errors import RefConflict

    st = castore.open(str(tmp_path / "st"), format=3)
    assert isinstance(st.storage, LocalStorage)
    st.session("app", "u", "s").append(castore.Message(role="user", content="opens the log"))
    cur = _swap_pairs(st, range(2), {})
    other = castore.open(str(tmp_path / "st"))
    x, y = _PAIR
    other.refs.swap(y, _target(y, 99), cur[y])  # y moves under the writer
    out = st.plumbing.swap_many([(x, _target(x, 2), cur[x], {}), (y, _target(y, 2), cur[y], {})])
    assert isinstance(out[1], RefConflict) and not isinstance(out[0], Exception)
    assert st.refs.read(x).target == _target(x, 2)  # type: ignore[union-attr]
    assert st.refs.read(y).target == _target(y, 99)  # type: ignore[union-attr]
    assert not [n for n in os.listdir(tmp_path / "st" / "refs" / "sessions" / "app" / "u" / "y" / "heads")
                if n.endswith(".lock")]  # the lost compare let go of its lock


def test_a_swap_of_two_refs_whose_log_fails_lets_go_of_every_lock_and_lands_each_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from castore.errors import StorageError

    root = tmp_path / "st"
    st = castore.open(str(root), format=3)
    st.session("app", "u", "s").append(castore.Message(role="user", content="opens the log"))
    cur = _swap_pairs(st, range(2), {})
    log = st.objects.writer_log._log
    assert log is not None

    def broken(data: bytes, sync: bool = True) -> int:
        raise StorageError("disk full (test)", "test")

    monkeypatch.setattr(log, "append", broken)
    syncs = _Syncs(monkeypatch)
    out = st.plumbing.swap_many([(n, _target(n, 2), cur[n], {}) for n in _PAIR])
    assert all(not isinstance(v, Exception) for v in out), out
    # the intents could not be journaled: the log was dropped and each ref swapped durably
    assert st.objects.writer_log._log is None and syncs.n >= 4
    monkeypatch.undo()
    assert {n: st.refs.read(n).target for n in _PAIR} == {n: _target(n, 2) for n in _PAIR}  # type: ignore[union-attr]
    assert not [p for p in root.rglob("*.lock")]


def test_a_format_2_store_keeps_its_format_and_swaps_as_before(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "st"), format=2)
    st.session("app", "u", "s").append(castore.Message(role="user", content="x"))
    st.close()
    again = castore.open(str(tmp_path / "st"))
    again.session("app", "u", "s").append(castore.Message(role="user", content="y"))
    assert again.config["format"] == 2 and not (tmp_path / "st" / JOURNAL).exists()
    for n in os.listdir(tmp_path / "st" / "packs"):
        if n.endswith(".pack"):
            assert refintents.intents((tmp_path / "st" / "packs" / n).read_bytes()) == []
    upgraded = castore.open(str(tmp_path / "st"), format=3)
    assert upgraded.config["format"] == 3


# -- the record kind -----------------------------------------------------------------------------
def _golden_intents() -> list[RefIntent]:
    return [RefIntent("refs/sessions/a/u/s/heads/main", None, "0" * 32,
                      b"ref: heads/main\n{\"w\":\"\xc3\xa9\"}\n", "b00t", 12345678901),
            RefIntent("refs/sessions/a/u/s/heads/main", "0" * 32, "1" * 32, b"x\n", "b00t", 12345678902)]


def test_golden_intent_records_keep_their_bytes() -> None:
    want = json.loads(GOLDEN.read_text())
    assert [refintents.encode_intent(i).hex() for i in _golden_intents()] == want["records"]
    log = bytes.fromhex(want["log"])
    assert refintents.intents(log) == _golden_intents()


def test_readers_of_objects_skip_intent_records() -> None:
    from castore import objects as o

    objs = [o.encode(o.Blob(data=f"blob {i}".encode())) for i in range(4)]
    rec1, w1 = packs.encode_record_v2(objs[:2], packs.HEADER_SIZE)
    intent = refintents.encode_intent(_golden_intents()[0])
    rec2, w2 = packs.encode_record_v2(objs[2:], packs.HEADER_SIZE + len(rec1) + len(intent))
    log = packs.PACK_MAGIC_V2 + rec1 + intent + rec2
    where, end = packs.scan(log)
    assert end == len(log) and set(where) == {oid for oid, _ in objs}
    assert refintents.intents(log) == [_golden_intents()[0]]
    torn = log[:-3]
    assert refintents.intents(torn) == [_golden_intents()[0]] and set(packs.scan(torn)[0]) == {objs[0][0], objs[1][0]}


# -- the replay rule, change by change ---------------------------------------------------------------
A, B, C, D = (f"{x}\n".encode() for x in "ABCD")


def _replayed(tmp_path: Path, holds: bytes | None, changes: list[tuple[bytes | None, bytes | None]]) -> bytes | None:
    """What ``refs/r`` holds after a recovery of a lost boot whose known changes were
    ``changes`` (old bytes or None, new bytes or None: a delete, recorded in the marker; the
    others are intents in a log), in stamp order, when the disk held ``holds`` at the crash."""
    st = LocalStorage(str(tmp_path / "st"))
    if holds is not None:
        st.write("refs/r", holds)
    tok = reffiles.token
    intents = [RefIntent("refs/r", None if a is None else tok(a), None if b is None else tok(b), b, "lost", t)
               for t, (a, b) in enumerate(changes)]
    os.makedirs(tmp_path / "st" / JOURNAL, exist_ok=True)
    with open(tmp_path / "st" / JOURNAL / "lost", "wb") as f:
        f.write(b"castore ref journal\n")
        for c in intents:
            if c.data is None:
                f.write(json.dumps({"k": c.key, "o": c.old, "n": c.new, "t": c.stamp}).encode() + b"\n")
    st.recover_refs(lambda boot: [c for c in intents if c.data is not None] if boot == "lost" else [])
    assert not (tmp_path / "st" / JOURNAL / "lost").exists()
    got = st.read_versioned("refs/r")
    return None if got is None else got.data


@pytest.mark.parametrize(("holds", "changes", "want"), [
    # every change in the list: the ref is brought to the last value from wherever it stopped
    (None, [(None, A), (A, B), (B, C)], C),
    (B, [(None, A), (A, B), (B, C)], C),
    (C, [(None, A), (A, B), (B, C)], C),
    (b"", [(None, A), (A, B), (B, C)], C),  # torn: the rename outlived its data
    # a change missing in the middle (its log was sealed: the ref was synced at B or later)
    (B, [(None, A), (B, C)], C),
    # create, (sealed) move, delete: the ref is durably absent; the create is not replayed
    (None, [(None, A), (B, None)], None),
    # ... then created again by a change the power loss undid
    (None, [(None, A), (B, None), (None, C)], C),
    # a value this boot's changes do not lead from (a durable swap after them): left alone
    (D, [(None, A), (A, B)], D),
], ids=["from-absent", "from-middle", "at-end", "torn", "gap", "deleted", "recreated", "durable-after"])
def test_a_replay_brings_a_ref_to_its_last_value(tmp_path: Path, holds: bytes | None, changes: Any,
                                                want: bytes | None) -> None:
    assert _replayed(tmp_path, holds, changes) == want


# -- intents stored as deltas ----------------------------------------------------------------------
def _replays_after_power_loss(root: Path, st: castore.Store, want: dict[str, list[str]],
                              monkeypatch: pytest.MonkeyPatch, torn: bool) -> None:
    """Lose the unsynced renames of ``st`` (rolled back or torn), reboot, and check that every
    session in ``want`` reads back whole and the store is sound."""
    assert isinstance(st.storage, LocalStorage)
    assert _power_loss(st.storage, torn) >= 1
    _reads_back_after_reboot(root, want, monkeypatch)


def _reads_back_after_reboot(root: Path, want: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Reboot, then check that every session in ``want`` reads back whole from the store at
    ``root``, that it is sound, and that no boot marker is left."""
    _reboot(monkeypatch)
    again = castore.open(str(root))
    for sid, msgs in want.items():
        assert [m.content for m in again.session("app", "u", sid).messages()] == msgs, sid
    assert fsck(again).ok
    assert os.listdir(root / JOURNAL) == []


@pytest.mark.parametrize("torn", [False, True], ids=["rolled-back", "torn"])
def test_a_ref_moved_by_another_writer_gets_a_whole_value_then_deltas_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: bool) -> None:
    """Two handles take turns on one branch: each one's first intent after the other's
    holds the whole value (its old value is not one its log wrote), the next ones deltas;
    a power loss replays the chain across both logs."""
    root = tmp_path / "st"
    one, two = castore.open(str(root), format=3), castore.open(str(root), format=3)
    assert isinstance(one.storage, LocalStorage) and isinstance(two.storage, LocalStorage)
    one.storage.unsynced = two.storage.unsynced = []  # one list: undone newest first
    for turn, st in enumerate([one, two, one, two]):
        s = st.session("app", "u", "s")
        for i in range(3):
            s.append(castore.Message(role="user", content=f"{turn} {i}"), state_delta={"t": turn})
    want = {"s": [m.content for m in one.session("app", "u", "s").messages()]}
    main = [r for r in _intent_fields(root) if r["key"].endswith("/heads/main")]
    whole_of_moved = [r for r in main if "d" in r and r["o"] is not None]
    assert len(whole_of_moved) >= 3 and sum("z" in r for r in main) >= 8
    _replays_after_power_loss(root, one, want, monkeypatch, torn)


@pytest.mark.parametrize("torn", [False, True], ids=["rolled-back", "torn"])
def test_a_log_sealed_mid_session_leaves_the_next_log_a_whole_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torn: bool) -> None:
    """The first intent of a ref in a new log holds its whole value, though the ref's last
    intent (in the sealed log before) wrote its old value: a recovery no longer reads a
    sealed log's intents."""
    root = tmp_path / "st"
    st = castore.open(str(root), format=3, auto_repack=False)
    assert isinstance(st.storage, LocalStorage)
    st.storage.unsynced = []
    s = st.session("app", "u", "s")
    for i in range(12):
        s.append(castore.Message(role="user", content=f"m {i}"))
        if i in (4, 8):
            st.objects.close()  # seals the log; the next append opens another
    want = {"s": [m.content for m in s.messages()]}
    names = sorted(n[:-5] for n in os.listdir(root / "packs") if n.endswith(".pack"))
    live = [n for n in names if not (root / "packs" / f"{n}.idx").exists()]
    assert len(live) == 1 and len(names) == 3
    data = (root / "packs" / f"{live[0]}.pack").read_bytes()
    main = [r for r in _log_fields(data) if r["key"].endswith("/heads/main")]
    assert "d" in main[0] and main[0]["o"] is not None and all("z" in r for r in main[1:]) and len(main) == 3
    _replays_after_power_loss(root, st, want, monkeypatch, torn)


def test_a_log_of_whole_value_intents_still_replays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Logs written before intents were deltas (every intent a whole value) replay as before."""
    real = refintents.encode_intent
    monkeypatch.setattr(refintents, "encode_intent", lambda intent, base=None: real(intent))
    root = tmp_path / "st"
    st, want = _write(root)
    monkeypatch.undo()
    assert _intent_fields(root) and all("d" in r for r in _intent_fields(root))
    _replays_after_power_loss(root, st, want, monkeypatch, torn=True)


def _golden_delta_intents() -> list[RefIntent]:
    key, tail = "refs/sessions/a/u/s/heads/main", [f"{i:064x}" for i in range(1, 6)]
    first = b"%064x\n" % 7 + json.dumps({"n": 5, "tl": tail, "w": "\u00e9"}).encode() + b"\n"
    second = b"%064x\n" % 8 + json.dumps({"n": 6, "tl": tail + [f"{8:064x}"], "w": "w2"}).encode() + b"\n"
    return [RefIntent(key, None, "2" * 32, first, "b00t", 12345678911),
            RefIntent(key, "2" * 32, "3" * 32, second, "b00t", 12345678912)]


def test_golden_delta_intent_records_keep_their_bytes() -> None:
    want = json.loads(GOLDEN_DELTA.read_text())
    first, second = _golden_delta_intents()
    records = [refintents.encode_intent(first), refintents.encode_intent(second, first)]
    assert [r.hex() for r in records] == want["records"]
    assert b'"z":' in records[1] and len(records[1]) < len(refintents.encode_intent(second)) * 0.6
    assert refintents.intents(bytes.fromhex(want["log"])) == [first, second]


def test_a_delta_whose_base_is_lost_is_skipped_with_the_rest_of_its_chain() -> None:
    first, second = _golden_delta_intents()
    third = RefIntent(first.key, second.new, "4" * 32, second.data.replace(b"w2", b"w3"), "b00t", second.stamp + 1)
    other = RefIntent("refs/other", None, "5" * 32, b"o\n", "b00t", second.stamp + 2)
    records = [refintents.encode_intent(first), refintents.encode_intent(second, first),
               refintents.encode_intent(third, second), refintents.encode_intent(other)]
    assert refintents.intents(packs.PACK_MAGIC_V2 + b"".join(records)) == [first, second, third, other]
    damaged = bytearray(records[0])
    damaged[-5] ^= 1  # fails its check: the whole value the deltas build on is gone
    assert refintents.intents(packs.PACK_MAGIC_V2 + bytes(damaged) + b"".join(records[1:])) == [other]
    # a delta of a value another log wrote (its "o" is not this log's last "n" of the key)
    assert refintents.intents(packs.PACK_MAGIC_V2 + records[2] + records[3]) == [other]
    with pytest.raises(IntegrityError):  # a base that did not write the intent's old value
        refintents.encode_intent(third, first)


def test_a_value_two_refs_hold_is_no_base_for_a_delta() -> None:
    """Two refs whose latest intents wrote the same bytes (one token): a delta of that token
    is neither written (the writer's bases give none) nor, in a log that holds one anyway,
    read as a change of either ref."""
    first, second = _golden_delta_intents()
    twin = RefIntent("refs/sessions/a/u/t/heads/main", None, first.new, first.data, "b00t", first.stamp + 1)
    bases = refintents.DeltaBases()
    bases.add(first)
    assert bases.base(first.new) == first
    bases.add(twin)
    assert bases.base(first.new) is None
    log = packs.PACK_MAGIC_V2 + refintents.encode_intent(first) + refintents.encode_intent(twin) + refintents.encode_intent(second, first)
    assert refintents.intents(log) == [first, twin]
    alone = packs.PACK_MAGIC_V2 + refintents.encode_intent(first) + refintents.encode_intent(second, first)
    assert refintents.intents(alone) == [first, second]


_VALUES = hs.binary(max_size=300) | hs.lists(hs.sampled_from([b'"', b",", b"ab", b"\xff", b"x" * 40, b"\n"]),
                                             max_size=60).map(b"".join)


@given(_VALUES, _VALUES)
def test_a_ref_delta_rebuilds_the_value_it_was_made_of(base: bytes, new: bytes) -> None:
    for value in (new, base + new, new + base):
        delta = refintents.ref_delta(base, value)
        assert delta is None or (len(delta) < len(value) and refintents.apply_ref_delta(base, delta) == value)
    if len(base) > 200:
        assert refintents.ref_delta(base, base + new) is not None  # what it repeats costs little
    delta = refintents.ref_delta(base, base)
    if delta is not None:
        with pytest.raises(ValueError):
            refintents.apply_ref_delta(base, delta[:-1])  # cut short: not a whole delta


class _PlainWrapper(PassThrough):
    """A backend written before journals: its swap takes no journal, and it keeps Storage's
    open_appender (it cannot append), as object stores and users' wrappers do."""


def test_a_backend_that_cannot_append_is_never_handed_a_journal(tmp_path: Path) -> None:
    store = castore.Store(_PlainWrapper(LocalStorage(str(tmp_path / "s"))), format=3)
    assert store.objects.format == 3 and not store.objects.defers_refs
    s = store.session("app", "u", "s")
    ids = [s.append(castore.Message(role="user", content=f"m{i}")) for i in range(3)]
    assert [e.id for e in castore.Store(LocalStorage(str(tmp_path / "s"))).session("app", "u", "s").entries()] == ids


def test_a_new_local_store_is_format_3_and_a_new_memory_store_format_2(tmp_path: Path) -> None:
    """The default format of a new store (docs/FORMAT.md 2): 3 where the storage can append
    (local disk), 2 where it cannot (memory, S3: format 3 would write format 2's bytes);
    an existing store keeps its own."""
    local = castore.open(str(tmp_path / "st"))
    local.session("app", "u", "s").append(castore.Message(role="user", content="x"))
    assert json.loads((tmp_path / "st" / "castore.json").read_text())["format"] == 3
    old = castore.open(str(tmp_path / "old"), format=2)
    old.init()
    assert castore.open(str(tmp_path / "old")).config["format"] == 2
    mem = castore.open(f"memory://default-format-{os.getpid()}")
    mem.init()
    assert mem.config["format"] == 2


def test_a_log_of_intents_alone_is_dropped_at_close_once_its_refs_are_durable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An append whose objects record seals the log (past SEAL_BYTES) journals its intent in a
    new log, which holds nothing else at close: that log is deleted once the refs of its
    intents are synced (it was sealed with an empty index and left on disk), and a power loss
    after the close loses nothing."""
    root = tmp_path / "st"
    st = castore.open(str(root), format=3, auto_repack=False)
    assert isinstance(st.storage, LocalStorage)
    st.storage.unsynced = []
    s = st.session("app", "u", "s")
    s.append(castore.Message(role="user", content="first"))
    big = [castore.Message(role="user", content=base64.b85encode(os.urandom(900)).decode()) for _ in range(1400)]
    s.append_many(big)
    s.set_info({"title": "after the seal"})  # a swap with no objects: into the log of intents too
    want = {"s": [m.content for m in s.messages()]}
    names = {n[:-5] for n in os.listdir(root / "packs") if n.endswith(".pack")}
    sealed = {n for n in names if (root / "packs" / f"{n}.idx").exists()}
    assert len(sealed) == 1 and len(names) == 2  # the objects' log sealed, the intents' log live
    assert refintents.intents((root / "packs" / f"{(names - sealed).pop()}.pack").read_bytes())
    st.close()
    left = sorted(os.listdir(root / "packs"))
    assert [n for n in left if n.endswith((".pack", ".idx"))] == sorted(f"{n}{x}" for n in sealed for x in (".idx", ".pack"))
    assert st.storage.unsynced == []  # the refs of the dropped intents were synced first
    report = fsck(castore.open(str(root)))
    assert report.ok, report
    _reboot(monkeypatch)
    again = castore.open(str(root))
    assert [m.content for m in again.session("app", "u", "s").messages()] == want["s"]
    assert again.session("app", "u", "s").info["title"] == "after the seal"
