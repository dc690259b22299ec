"""Trying hard to break the store: many writers, crashes, storage faults, bad input, tenants.

The long variants are marked slow; run them with their figures printed::

    scripts/test -m slow -k reliability -s
"""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import layout
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import castore
from castore import maintenance, names
from castore import objects as o
from castore.errors import CorruptRef
from castore.objectstore import refintents
from castore.refs import RefStore
from castore.storage import open_storage
from castore.storage.faulty import FaultyStorage, InjectedFault
from castore.storage.memory import MemoryStorage
from castore.storage.retrying import RetryingStorage
from castore.sync import push

HERE = Path(__file__).resolve().parent
CHILD = str(HERE / "crash_writer.py")
KEY = ("app", "alice", "s1")


def figures(title: str, **numbers: Any) -> None:
    """Print a test's figures (shown with pytest -s)."""
    print(f"\n[reliability] {title}: " + ", ".join(f"{k}={v}" for k, v in numbers.items()), flush=True)


def check_linear(session: castore.Session, expected_contents: set[str]) -> list[castore.LogEntry]:
    """The session is one linear chain holding exactly ``expected_contents``, each once."""
    entries = session.entries()
    for depth, e in enumerate(entries):
        assert e.depth == depth
        assert e.parents == ((entries[depth - 1].id,) if depth else ())
    contents = Counter(e.entry.content for e in entries)
    assert set(contents) == expected_contents
    assert max(contents.values()) == 1
    assert [e.id for e in session.log(all_branches=True)] == [e.id for e in reversed(entries)]
    return entries


# -- many writers ---------------------------------------------------------------------------
@dataclass
class WriterRun:
    """What the writer processes acknowledged, and what it took."""

    acked: dict[str, str]  # content -> acknowledged commit id
    lost_races: int  # compare-and-swaps lost and retried, all writers together
    seconds: float


def run_writers(url: str, options: dict[str, Any], procs: int, count: int) -> WriterRun:
    """``procs`` processes append ``count`` entries each to one session."""
    began = time.monotonic()
    children = [
        subprocess.Popen([sys.executable, CHILD, "append", url, "/".join(KEY), f"w{p}", "0", str(count),
                          json.dumps(options)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for p in range(procs)
    ]
    acked: dict[str, str] = {}
    races = 0
    for p, child in enumerate(children):
        out, err = child.communicate(timeout=3600)
        assert child.returncode == 0, err[-3000:]
        lines = out.split("\n")
        assert lines[0] == "ready" and lines[-2] == "done"
        for line in lines[1:-2]:
            i, cid = line.split()
            acked[f"w{p}-{i}"] = cid
        races += sum(int(line.split()[1]) for line in err.splitlines() if line.startswith("lost_races "))
    return WriterRun(acked, races, time.monotonic() - began)


def check_writers(store: castore.Store, procs: int, count: int, run: WriterRun) -> None:
    want = {f"w{p}-{i}" for p in range(procs) for i in range(count)}
    assert set(run.acked) == want
    entries = check_linear(store.session(*KEY), want)
    assert {e.entry.content: e.id for e in entries} == run.acked
    report = maintenance.fsck(store)
    assert report.ok, report.to_dict()
    where = store.url.split("://")[0] if "://" in store.url else "local disk"
    figures(f"{procs} writers x {count} appends on {where}, format {store.config['format']}",
            entries_written=len(entries), lost=len(want) - len(entries), objects_reachable=report.reachable,
            lost_races_retried=run.lost_races, seconds=round(run.seconds, 1))


@pytest.mark.parametrize("fmt", [1, 2, 3])  # 3: ref swaps journaled in the writer's log (FORMAT.md 12)
@pytest.mark.parametrize(("procs", "count"), [
    (4, 25),
    pytest.param(8, 200, marks=pytest.mark.slow),
])
def test_concurrent_processes_append_to_one_session_on_local_disk(tmp_path: Path, procs: int, count: int,
                                                                  fmt: int) -> None:
    url = str(tmp_path / "store")
    run = run_writers(url, {"format": fmt}, procs, count)
    store = castore.open(url)
    assert store.config["format"] == fmt
    check_writers(store, procs, count, run)


@pytest.mark.parametrize("fmt", [1, 2])
@pytest.mark.parametrize(("procs", "count"), [
    (4, 10),
    pytest.param(8, 200, marks=pytest.mark.slow),
])
def test_concurrent_processes_append_to_one_session_on_seaweedfs(seaweedfs: Any, procs: int, count: int,
                                                                 fmt: int) -> None:
    url = f"s3://castore-tests/{uuid.uuid4().hex}"
    # Every writer appends to the one same session: a deliberately contended ref, so each
    # waits as long as the whole run may take instead of the default minute (RetryPolicy).
    retry = {"max_attempts": 100_000, "max_seconds": 1800.0, "max_delay": 0.5}
    run = run_writers(url, {**seaweedfs.storage_options, "format": fmt, "retry": retry}, procs, count)
    with castore.open(url, **seaweedfs.storage_options) as store:
        assert store.config["format"] == fmt
        check_writers(store, procs, count, run)


# -- crashes --------------------------------------------------------------------------------
def run_crashes(url: str, kills: int, seed: int) -> tuple[dict[str, str], int]:
    """Start a writer and SIGKILL it at a random moment, ``kills`` times; return acked, lines seen."""
    rng = random.Random(seed)
    acked: dict[str, str] = {}
    for k in range(kills):
        child = subprocess.Popen([sys.executable, CHILD, "append", url, "/".join(KEY), f"run{k}", "0", "100000"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
        child.wait()
        # The text after the last newline is a line cut by the kill (or nothing): not acknowledged.
        for line in child.stdout.read().split("\n")[:-1]:
            if line == "done":
                continue
            i, cid = line.split()
            acked[f"run{k}-{i}"] = cid
        child.stdout.close()
    return acked, len(acked)


@pytest.mark.parametrize("fmt", [1, 2, 3])
@pytest.mark.parametrize("kills", [10, pytest.param(50, marks=pytest.mark.slow)])
def test_writer_killed_at_random_moments_loses_no_returned_append(tmp_path: Path, kills: int, fmt: int) -> None:
    url = str(tmp_path / "store")
    castore.open(url, format=fmt).init()  # the writers keep the store's format
    acked, _ = run_crashes(url, kills, seed=kills)
    store = castore.open(url)
    report = maintenance.fsck(store)
    assert not report.damaged, report.to_dict()  # at most unreachable objects and stale locks
    session = store.session(*KEY)
    entries = session.entries()
    by_content = {e.entry.content: e.id for e in entries}
    lost = [c for c, cid in acked.items() if by_content.get(c) != cid]
    assert lost == []
    # one chain; entries whose append was cut before returning may be there too
    assert all(e.parents == ((entries[d - 1].id,) if d else ()) for d, e in enumerate(entries))
    assert len(by_content) == len(entries)
    stale = report.stale_locks
    session.append(castore.Message(role="user", content="after the last crash"))
    final = maintenance.fsck(store)
    assert final.ok, final.to_dict()
    assert store.config["format"] == fmt
    figures(f"{kills} SIGKILLs of a writer on local disk, format {fmt}", crashes_survived=kills, entries_acked=len(acked),
            entries_stored=len(entries), lost=len(lost), unreachable_after=len(report.unreachable),
            stale_locks_after_last_kill=len(stale))


#: the steps of a format-3 close (docs/FORMAT.md 12, "Dropping the intents at close"): the
#: LocalStorage method a writer is killed at, whether before or after it runs, and which key
#: it must be called with (a prefix and a suffix)
CLOSE_STEPS = {
    "before the refs are synced": ("sync_keys", "before", "", ""),
    "after the refs, before the pack": ("write", "before", "packs/r-", ".pack"),
    "after the pack, before its index": ("write", "before", "packs/r-", ".idx"),
    "after the index, before the log goes": ("delete_many", "before", "", ""),
    "after the log is gone": ("delete", "after", "packs/w-", ".pack"),
}


def _killed_in_close(url: str, step: str, acked_path: str) -> None:
    """Child: appends to two sessions (each acknowledged append written to ``acked_path``
    at once), then closes the store and is killed with SIGKILL at ``step`` of the close."""
    from castore.storage.local import LocalStorage

    st = castore.open(url, format=3)
    fd = os.open(acked_path, os.O_WRONLY | os.O_APPEND)
    for i in range(12):
        sid = f"s{i % 2}"
        cid = st.session("app", "alice", sid).append(castore.Message(role="user", content=f"{sid}-{i}"))
        os.write(fd, f"{sid} {sid}-{i} {cid}\n".encode())
    method, when, prefix, suffix = CLOSE_STEPS[step]
    real = getattr(LocalStorage, method)

    def hooked(self: LocalStorage, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else None
        hit = not prefix or (isinstance(first, str) and first.startswith(prefix) and first.endswith(suffix))
        if hit and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(self, *args, **kwargs)
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(LocalStorage, method, hooked)
    st.close()
    os._exit(3)  # the close never reached the step: the test would prove nothing


@pytest.mark.parametrize("step", list(CLOSE_STEPS))
def test_writer_killed_during_close_loses_no_returned_append(tmp_path: Path, step: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Format 3: close merges the writer's log into a pack without its ref intents. A
    SIGKILL at any step of it leaves every acknowledged append readable and fsck clean,
    in the same boot and after a reboot (whose recovery replays what logs are left), and
    a later repack merges whatever the kill left behind."""
    import multiprocessing

    from castore.storage import local as local_mod

    url, acked_path = str(tmp_path / "store"), str(tmp_path / "acked")
    open(acked_path, "w").close()
    child = multiprocessing.get_context("fork").Process(target=_killed_in_close, args=(url, step, acked_path))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL
    acked: dict[str, list[str]] = {}
    for line in Path(acked_path).read_text().splitlines():
        sid, content, _cid = line.split()
        acked.setdefault(sid, []).append(content)
    assert sum(len(v) for v in acked.values()) == 12

    def check() -> castore.Store:
        store = castore.open(url)
        for sid, contents in acked.items():
            assert [m.content for m in store.session("app", "alice", sid).messages()] == contents, (step, sid)
        report = maintenance.fsck(store)
        assert report.ok, report.to_dict()
        return store

    check().close()
    monkeypatch.setattr(local_mod, "_boot_id", lambda: "00000000-0000-0000-0000-00000000b007")
    store = check()  # a new boot: the recovery reads the intents of any log the kill left
    monkeypatch.setattr(maintenance, "LOG_IDLE", -1.0)
    maintenance.repack(store)
    store.close()
    store = check()
    assert all(n.startswith("r-") for n in os.listdir(os.path.join(url, "packs")))
    assert all(refintents.intents(Path(url, "packs", n).read_bytes()) == []
               for n in os.listdir(os.path.join(url, "packs")))
    store.close()


# -- storage faults -------------------------------------------------------------------------
def test_faulty_storage_is_deterministic_for_a_seed() -> None:
    def run(seed: int) -> list[str]:
        fs = FaultyStorage(MemoryStorage(f"faulty-{uuid.uuid4().hex}"), rate=0.3, seed=seed)
        out = []
        for i in range(200):
            try:
                fs.write(f"k{i}", b"x")
                out.append("ok")
            except InjectedFault as e:
                out.append(e.kind)
        return out

    assert run(1) == run(1) != run(2)
    assert set(run(1)) == {"ok", "fail", "timeout", "lost"}


def test_faulty_lost_swap_lands_although_caller_sees_error() -> None:
    inner = MemoryStorage(f"faulty-{uuid.uuid4().hex}")
    fs = FaultyStorage(inner, rate=1.0, kinds={"lost": 1})
    with pytest.raises(castore.StorageError) as info:
        fs.swap("refs/x", b"v1", None)
    assert info.value.acted and inner.read("refs/x") == b"v1"


def test_faulty_failed_batch_write_leaves_a_part_written() -> None:
    inner = MemoryStorage(f"faulty-{uuid.uuid4().hex}")
    fs = FaultyStorage(inner, rate=1.0, kinds={"fail": 1}, seed=3)
    sizes = set()
    for n in range(20):
        with pytest.raises(InjectedFault):
            fs.write_many({f"b{n}/{i}": b"x" for i in range(10)})
        sizes.add(len(inner.list(f"b{n}")))
    assert min(sizes) < 10 and max(sizes) > 0 and max(sizes) < 10


def test_ref_swap_recognises_its_own_landing_after_lost_response() -> None:
    inner = MemoryStorage(f"faulty-{uuid.uuid4().hex}")
    refs = RefStore(FaultyStorage(inner, rate=1.0, kinds={"lost": 1}, methods={"swap"}))
    v = refs.swap("sessions/a/u/s/heads/main", "ab" * 32, None)
    assert v.target == "ab" * 32
    v2 = refs.swap("sessions/a/u/s/heads/main", "cd" * 32, v)
    assert RefStore(inner).read("sessions/a/u/s/heads/main").target == "cd" * 32 == v2.target


def test_retrying_storage_retries_reads_and_writes_but_never_swaps() -> None:
    inner = MemoryStorage(f"retry-{uuid.uuid4().hex}")
    faulty = FaultyStorage(inner, rate=1.0, kinds={"fail": 1})
    sleeps: list[float] = []
    rs = RetryingStorage(faulty, attempts=4, sleep=sleeps.append)
    with pytest.raises(castore.StorageError):
        rs.read("k")
    assert faulty.calls["read"] == 4 and len(sleeps) == 3 and sleeps[0] < sleeps[-1]
    with pytest.raises(castore.StorageError):
        rs.swap("refs/x", b"v", None)
    assert faulty.calls["swap"] == 1
    with pytest.raises(castore.StorageError):
        rs.delete("refs/x", "1")
    assert faulty.calls["delete"] == 1
    faulty.rate = 0.3
    rs = RetryingStorage(faulty, attempts=10, sleep=sleeps.append)
    for i in range(50):
        rs.write(f"o{i}", b"x")
    assert all(inner.read(f"o{i}") == b"x" for i in range(50)) and rs.retries > 3


class Broken(MemoryStorage):
    """A backend whose writes fail with one given error (a full disk, a denied bucket)."""

    def __init__(self, error: castore.StorageError) -> None:
        super().__init__(f"broken-{uuid.uuid4().hex}")
        self.error, self.writes = error, 0

    def write(self, key: str, data: bytes) -> None:
        self.writes += 1
        raise self.error


def _storage_error(message: str, cause: BaseException | None = None) -> castore.StorageError:
    try:
        raise castore.StorageError(message) from cause
    except castore.StorageError as e:
        return e


@pytest.mark.parametrize(("error", "transient"), [
    (_storage_error("cannot write x: No space left on device", OSError(errno.ENOSPC, "No space left")), False),
    (_storage_error("cannot write x: Permission denied", PermissionError(errno.EACCES, "denied")), False),
    (_storage_error("access denied by S3 (write s3://b/x): check the credentials and permissions"), False),
    (_storage_error("bucket 'b' does not exist at http://127.0.0.1:1 (write s3://b/x)"), False),
    (_storage_error("cannot reach S3 endpoint http://127.0.0.1:1 (write s3://b/x)", ConnectionResetError()), True),
    (_storage_error("S3 write s3://b/x failed: InternalError: try again"), True),
])
def test_retrying_storage_retries_only_transient_errors(error: castore.StorageError, transient: bool) -> None:
    inner = Broken(error)
    sleeps: list[float] = []
    with pytest.raises(castore.StorageError):
        RetryingStorage(inner, attempts=3, sleep=sleeps.append).write("objects/ab/cd", b"x")
    assert inner.writes == (3 if transient else 1)


@dataclass
class FaultRun:
    acked: dict[str, str] = field(default_factory=dict)
    failed_appends: int = 0
    failed_pushes: int = 0
    pushes: int = 0


def faulty_store(url: str, seed: int, retry: bool, fmt: int | None = None,
                 **options: Any) -> tuple[castore.Store, FaultyStorage]:
    faulty = FaultyStorage(open_storage(url, durable=False, **options), rate=0.05, seed=seed)
    storage = RetryingStorage(faulty, base_delay=0.001) if retry else faulty
    return castore.Store(storage, format=fmt), faulty


def run_faulty_append_and_push(src: castore.Store, dst: castore.Store, n: int, push_every: int) -> FaultRun:
    run = FaultRun()
    session = src.session(*KEY)
    for i in range(n):
        for _attempt in range(50):
            try:
                run.acked[f"e{i}"] = session.append(castore.Message(role="user", content=f"e{i}"))
                break
            except castore.StorageError:
                run.failed_appends += 1  # not acknowledged: the caller tries again
        else:
            raise AssertionError("an append failed 50 times in a row")
        if i % push_every == push_every - 1 or i == n - 1:
            for _attempt in range(50):
                try:
                    report = push(src, dst, KEY)
                    assert report.refs_refused == []
                    run.pushes += 1
                    break
                except castore.StorageError:
                    run.failed_pushes += 1  # resumable: push again
            else:
                raise AssertionError("a push failed 50 times in a row")
    return run


def check_fault_run(run: FaultRun, src_url: str, dst_url: str, n: int, faults: int, dst_options: dict[str, Any],
                    label: str) -> None:
    for url, opts in ((src_url, {}), (dst_url, dst_options)):
        with castore.open(url, **opts) as clean:
            entries = clean.session(*KEY).entries()
            ids = {e.id for e in entries}
            lost = [c for c, cid in run.acked.items() if cid not in ids]
            assert lost == []
            contents = Counter(e.entry.content for e in entries)
            assert set(contents) == {f"e{i}" for i in range(n)}
            assert all(e.parents == ((entries[d - 1].id,) if d else ()) for d, e in enumerate(entries))
            report = maintenance.fsck(clean)
            assert report.ok, report.to_dict()
    figures(label, entries_acked=len(run.acked), lost=len(lost), faults_injected=faults,
            appends_failed_then_retried=run.failed_appends, duplicates_from_ambiguous_appends=len(entries) - n,
            pushes=run.pushes, pushes_failed_then_resumed=run.failed_pushes)


@pytest.mark.parametrize("retry", [True, False], ids=["retrying", "raw"])
@pytest.mark.parametrize("n", [150, pytest.param(3000, marks=pytest.mark.slow)])
def test_append_and_push_with_5_percent_faults_keep_every_acknowledged_entry(tmp_path: Path, n: int,
                                                                            retry: bool) -> None:
    src_url, dst_url = str(tmp_path / "src"), str(tmp_path / "dst")
    # Without retries, format 1: a push from a format-2 store reads each packed object with
    # its own storage call today, so at 5% faults per call a 40-append push never completes
    # (reported; the retrying variant runs format 2).
    fmt = 2 if retry else 1
    src, f1 = faulty_store(src_url, 1, retry, fmt)
    dst, f2 = faulty_store(dst_url, 2, retry, fmt)
    run = run_faulty_append_and_push(src, dst, n, push_every=40)
    check_fault_run(run, src_url, dst_url, n, f1.faults + f2.faults, {},
                    f"append+push, 5% faults, {'with' if retry else 'without'} retries, local->local, n={n}")
    assert f1.injected["lost"] > 0 and f2.faults > 0


@pytest.mark.slow
def test_append_and_push_to_seaweedfs_with_5_percent_faults(tmp_path: Path, seaweedfs: Any) -> None:
    n = 1000
    src_url, dst_url = str(tmp_path / "src"), f"s3://castore-tests/{uuid.uuid4().hex}"
    src, f1 = faulty_store(src_url, 3, True)
    dst, f2 = faulty_store(dst_url, 4, True, **seaweedfs.storage_options)
    run = run_faulty_append_and_push(src, dst, n, push_every=100)
    check_fault_run(run, src_url, dst_url, n, f1.faults + f2.faults, seaweedfs.storage_options,
                    f"append+push, 5% faults, local->SeaweedFS, n={n}")


# -- bad input ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference() -> Iterator[tuple[str, list[castore.Message]]]:
    """A session on another tenant that bad input must never touch."""
    url = f"memory://reliability-{uuid.uuid4().hex}"
    with castore.open(url) as store:
        s = store.session("other-app", "carol", "keep")
        for i in range(5):
            s.append(castore.Message(role="user", content=f"keep {i}"), state_delta={"n": i})
        yield url, s.messages()


def victim(url: str) -> castore.Session:
    store = castore.open(url)
    s = store.session(*KEY)
    if not s.exists():
        s.append(castore.Message(role="user", content="victim 0"))
        s.append(castore.Message(role="assistant", content="victim 1"))
    return s


def intact(reference: tuple[str, list[castore.Message]]) -> None:
    url, messages = reference
    with castore.open(url) as fresh:
        assert fresh.session("other-app", "carol", "keep").messages() == messages


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(data=st.binary(max_size=300), where=st.sampled_from(["tip", "body", "fresh"]))
def test_random_bytes_as_objects_give_clear_errors(reference: tuple[str, list[castore.Message]],
                                                   data: bytes, where: str) -> None:
    url = reference[0]
    s = victim(url)
    store = s.store
    tip = s.head
    oid = {"tip": tip, "body": o.hex_id(store.history.commit(tip).body), "fresh": o.digest(data)}[where]
    saved = layout.stored(store, oid)
    layout.replace(store, oid, data)
    try:
        fresh = castore.open(url)
        try:
            fresh.session(*KEY).messages()
        except castore.IntegrityError as e:
            assert e.object_id == oid
        report = maintenance.fsck(fresh)
        assert (oid in {x for x, _ in report.corrupt}) or data == saved or where == "fresh"
        intact(reference)
    finally:
        if saved is None:
            layout.delete(store, oid)
        else:
            layout.replace(store, oid, saved)
    assert maintenance.fsck(castore.open(url)).ok


@SETTINGS
@given(data=st.binary(max_size=300), which=st.sampled_from(["HEAD", "heads/main", "tags/x"]))
def test_random_bytes_as_refs_give_clear_errors(reference: tuple[str, list[castore.Message]], data: bytes,
                                                which: str) -> None:
    url = reference[0]
    s = victim(url)
    key = f"refs/{s.prefix}/{which}"
    storage = s.store.storage
    saved = storage.read(key) if storage.exists(key) else None
    storage.write(key, data)
    try:
        fresh = castore.open(url)
        try:
            fresh.session(*KEY).messages()
        except (castore.IntegrityError, castore.CastoreError) as e:
            assert str(e)
        report = maintenance.fsck(fresh)
        assert report.bad_refs or report.missing or report.ok
        intact(reference)
    finally:
        if saved is None:
            storage.delete(key)
        else:
            storage.write(key, saved)


@pytest.mark.parametrize("data", [b"\xff\xfe\xfd", b"ab" * 32 + b"\n\xc3\x28\n", b"ref: heads/\xe2\x82\n{}",
                                  b"\x00" * 64, b""])
def test_invalid_utf8_in_ref_file_is_a_clear_error(local_store: castore.Store, data: bytes) -> None:
    s = local_store.session(*KEY)
    s.append(castore.Message(role="user", content="hi"))
    local_store.storage.write(f"refs/{s.prefix}/heads/main", data)
    with pytest.raises(CorruptRef) as info:
        castore.open(local_store.url).session(*KEY).messages()
    assert info.value.ref == f"{s.prefix}/heads/main"
    report = maintenance.fsck(local_store)
    assert [r for r, _ in report.bad_refs] == [f"{s.prefix}/heads/main"]
    from click.testing import CliRunner

    from castore.cli import main

    result = CliRunner(env={"CASTORE_STORE": None, "CASTORE_SESSION": None}).invoke(
        main, ["--store", local_store.url, "-s", "/".join(KEY), "log"])
    assert result.exit_code == 1 and result.stderr.startswith("Error: ") and "corrupt" in result.stderr


NAME = st.one_of(
    st.text(min_size=1, max_size=40),
    st.sampled_from(["..", ".", "../alice", "a/b", "%2F", "%2e%2e", "Alice", "ALICE", "alice.lock", "HEAD",
                     "~abc", "\\", "con", "x" * 255, "é" * 100, "\x00", "\n"]),
)


@SETTINGS
@given(app=NAME, user=NAME, sid=NAME, branch=NAME)
def test_random_names_work_or_are_refused_clearly(reference: tuple[str, list[castore.Message]], app: str,
                                                  user: str, sid: str, branch: str) -> None:
    url = reference[0]
    store = castore.open(url)
    try:
        s = store.session(app, user, sid)
    except castore.InvalidName as e:
        assert e.reason
        return
    before = set(store.refs.list("sessions"))
    s.append(castore.Message(role="user", content="named"))
    try:
        s.branch(branch)
        s.label(branch, at="HEAD", force=True)
    except castore.InvalidName:
        pass
    except castore.BranchError:
        pass  # the same names already used by an earlier example
    written = set(store.refs.list("sessions")) - before
    assert all(r.startswith(s.prefix + "/") for r in written)
    assert store.session(app, user, sid).messages()[-1].content == "named"
    assert sid in {x.session for x in store.sessions(app, user)}
    intact(reference)


@SETTINGS
@given(value=st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
))
def test_random_entry_content_round_trips_or_is_refused(reference: tuple[str, list[castore.Message]],
                                                        value: Any) -> None:
    store = castore.open(reference[0])
    s = store.session("app", "values", "s")
    head = s.head
    try:
        cid = s.append(castore.Message(role="tool", content=value), state_delta={"v": value})
    except castore.InvalidEntry:
        assert s.head == head  # nothing was written
        return
    assert castore.open(reference[0]).session("app", "values", "s").show(cid).entry.content == value
    assert castore.open(reference[0]).session("app", "values", "s").state()["v"] == value


@pytest.mark.slow
def test_100_mb_tool_output_round_trips(tmp_path: Path) -> None:
    store = castore.open(str(tmp_path / "store"))
    other = store.session("app", "bob", "other")
    other.append(castore.Message(role="user", content="small"))
    big = os.urandom(50 * 1024 * 1024).hex()  # 100 MB of text that does not compress much
    s = store.session(*KEY)
    t0 = time.perf_counter()
    s.append(castore.Message(role="user", content="run the tool"))
    cid = s.append(castore.Message(role="tool", content=big, tool_call_id="call-1"))
    t_append = time.perf_counter() - t0
    fresh = castore.open(store.url)
    t0 = time.perf_counter()
    assert fresh.session(*KEY).messages()[-1].content == big
    t_read = time.perf_counter() - t0
    assert fresh.session("app", "bob", "other").messages()[0].content == "small"
    ctx = fresh.session(*KEY).context(tool_output_limit=1000)
    assert len(str(ctx[-1].content)) < 10_000
    report = maintenance.fsck(fresh)
    assert report.ok
    figures("100 MB tool output", bytes=len(big), append_s=round(t_append, 2), read_s=round(t_read, 2),
            commit=cid[:12])


@pytest.mark.slow
def test_100_000_commit_history(tmp_path: Path) -> None:
    n, batch = 100_000, 500
    store = castore.open(str(tmp_path / "store"), durable=False)
    s = store.session(*KEY)
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        s.append_many([castore.Message(role="user", content=f"m{i}") for i in range(start, start + batch)])
    t_write = time.perf_counter() - t0
    fresh = castore.open(store.url)
    t0 = time.perf_counter()
    msgs = fresh.session(*KEY).messages()
    t_read = time.perf_counter() - t0
    assert len(msgs) == n and msgs[-1].content == f"m{n - 1}" and msgs[0].content == "m0"
    assert fresh.session(*KEY).resolve("HEAD~99999") == fresh.session(*KEY).entries()[0].id
    t0 = time.perf_counter()
    report = maintenance.fsck(fresh)
    t_fsck = time.perf_counter() - t0
    assert report.ok and report.unreachable == []
    t0 = time.perf_counter()
    assert maintenance.gc(fresh, grace=0).deleted == []
    t_gc = time.perf_counter() - t0
    figures("100,000-commit history", commits=n, objects=report.objects, write_s=round(t_write, 1),
            read_all_s=round(t_read, 2), fsck_s=round(t_fsck, 1), gc_s=round(t_gc, 1))


# -- tenancy --------------------------------------------------------------------------------
ATTACKS = [
    ("app", "../alice"), ("app", "..%2Falice"), ("app", "Alice"), ("app", "ALICE"), ("app", "alice/"),
    ("app", "alice%2F"), ("app", "alice/.."), ("App", "alice"), ("APP", "alice"), ("../app", "alice"),
    ("app%2Falice", "x"), ("app/alice", "s1"), ("app", "alice\x00"), ("app", "alice "), ("app", "%61lice"),
    ("app", "mallory/../alice"), ("app", "mallory%2F..%2Falice"), ("app", "."), ("app", ".."),
]
SIDS = ["s1", "../s1", "..%2Fs1", "S1", "../../alice/s1", "..%2F..%2Falice%2Fs1", "s1/..", "s1/../s1",
        "../alice/s1", "%73%31", "s1\x00"]


@pytest.fixture(params=["local", "memory"])
def tenants(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[castore.Store]:
    from conftest import make_backend

    store = make_backend(request.param, request, tmp_path).open()
    s = store.session("app", "alice", "s1")
    s.append(castore.Message(role="user", content="alice's secret"), state_delta={"user:card": "4111"})
    s.label("v1", at="HEAD")
    store.session("app", "alice", "s2").append(castore.Message(role="user", content="alice two"))
    yield store
    store.close()


def _empty_or_not_found(read: Any) -> bool:
    try:
        return not read()
    except castore.SessionNotFound:
        return True


def _snapshot(store: castore.Store) -> dict[str, bytes | None]:
    keys = store.storage.list("refs/sessions/app/alice") + store.storage.list("refs/state/app/users/alice")
    assert len(keys) >= 4
    return store.storage.read_many(keys)


def test_no_other_key_can_read_list_or_change_a_tenants_sessions(tenants: castore.Store) -> None:
    store = tenants
    before = _snapshot(store)
    alice_ids = {x.session for x in store.sessions("app", "alice")}
    for app, user in ATTACKS:
        try:
            listed = store.sessions(app, user)
        except castore.InvalidName:
            continue
        assert all(x.user == user and x.app == app for x in listed)
        for sid in SIDS:
            try:
                s = store.session(app, user, sid)
            except castore.InvalidName:
                continue
            assert not s.exists()
            assert _empty_or_not_found(s.messages) and _empty_or_not_found(s.labels)
            try:
                assert "user:card" not in s.state()
            except castore.SessionNotFound:
                pass
            with pytest.raises(castore.SessionNotFound):
                store.delete_session(app, user, sid)
            with pytest.raises((castore.RevisionNotFound, castore.SessionNotFound)):
                s.resolve("v1")
        assert _snapshot(store) == before
    # writing under a look-alike key lands in the look-alike's own folder only
    for app, user in ATTACKS[:6]:
        s = store.session(app, user, "../s1")
        s.append(castore.Message(role="user", content="mallory"), state_delta={"user:card": "0000"})
        s.checkout("HEAD")
        try:
            s.fork("s1", user="mallory")
        except castore.SessionExists:
            pass
        assert all(r.startswith(f"sessions/{names.encode(app)}/") for r in store.refs.list("sessions")
                   if r not in {k[5:] for k in before})
    assert _snapshot(store) == before
    assert {x.session for x in store.sessions("app", "alice")} == alice_ids
    assert store.session("app", "alice", "s1").messages()[0].content == "alice's secret"
    assert store.user_state("app", "alice") == {"card": "4111"}


def test_fork_cannot_overwrite_another_users_session(tenants: castore.Store) -> None:
    store = tenants
    before = _snapshot(store)
    mallory = store.session("app", "mallory", "m1")
    mallory.append(castore.Message(role="user", content="mallory"))
    with pytest.raises(castore.SessionExists):
        mallory.fork("s1", user="alice")
    assert _snapshot(store) == before


def test_cli_key_with_escaped_slash_cannot_reach_another_user(local_store: castore.Store) -> None:
    from click.testing import CliRunner

    from castore.cli import main

    local_store.session("app", "alice", "s1").append(castore.Message(role="user", content="alice's secret"))
    tenants = local_store
    runner = CliRunner(env={"CASTORE_STORE": None, "CASTORE_SESSION": None})
    for spec in ["app/..%2Falice/s1", "app/mallory%2F..%2Falice/s1", "app/Alice/s1", "app/alice/..%2Fs1",
                 "app/alice%2Fs1/x"]:
        result = runner.invoke(main, ["--store", tenants.url, "-s", spec, "log"])
        assert result.exit_code == 1, (spec, result.output)
        assert "not found" in result.stderr and "secret" not in result.stdout
