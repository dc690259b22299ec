"""Refs: read, compare-and-swap, delete, list, symbolic refs, races, stale locks, lost responses."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import signal
import threading
from collections.abc import Iterator

import pytest
from helpers.storage import PassThrough
from helpers.threads import race

from castore.errors import IntegrityError, InvalidEntry, RefConflict, RefLocked, StorageError
from castore.refs import RefStore, RefValue, ref_key
from castore.storage import Storage, Token, Versioned, open_storage
from castore.storage import locks as locks_mod

C1 = "1" * 64
C2 = "2" * 64
C3 = "3" * 64
CX = "ab" * 32


def cid(i: int) -> str:
    return f"{i:064x}"


@pytest.fixture
def storage(backend) -> Iterator[Storage]:
    st = open_storage(backend.url, **backend.options)
    try:
        yield st
    finally:
        st.close()


@pytest.fixture
def refs(storage) -> RefStore:
    return RefStore(storage)


# S3 races run on SeaweedFS: moto checks a condition and then writes without a lock, and was
# seen giving two winners in one round. SeaweedFS serves racing conditional PUTs slowly
# (~8 requests/s with 32 racers on this 2-core machine), so its full 32 x 50 run is `slow`
# and the default suite runs 32 threads x 2 rounds on it.
RACE_BACKENDS = ["local", "memory", pytest.param("seaweedfs", marks=pytest.mark.slow)]


@pytest.fixture(params=RACE_BACKENDS)
def race_backend(request, tmp_path):
    """Backends with atomic compare-and-swap."""
    from conftest import make_backend

    return make_backend(request.param, request, tmp_path)


@pytest.fixture
def seaweed_backend(request, tmp_path):
    from conftest import make_backend

    return make_backend("seaweedfs", request, tmp_path)


# -- read, swap, delete, list --------------------------------------------------------------


def test_read_of_a_missing_ref_is_none(refs):
    assert refs.read("sessions/a/u/s/heads/main") is None


def test_create_then_read_gives_target_meta_and_token(refs):
    made = refs.swap("sessions/a/u/s/heads/main", C1, None, meta={"n": 1})
    got = refs.read("sessions/a/u/s/heads/main")
    assert got is not None
    assert got.target == C1
    assert got.meta["n"] == 1
    assert got.token == made.token
    assert got.write_id == made.write_id and got.write_id
    assert got.symbolic is None


_TRICKY_METAS = [
    {"n": 1, "t": 1796234599.3713665, "tl": [CX, C1], "pk": ["w-ab"], "names": {"app": "a", "user": "u"}},
    {"b": [1, 2.5, None, True, False], "a": {"z": "x", "y": [{}, ()]}, "B": -0.0, "_": 0.0},
    {"f": 1e16}, {"f": 9999999999999998.0}, {"f": 1e-5}, {"f": 0.0001}, {"f": 9.999999999999999e-05},
    {"f": -123456789.123}, {"n": 10**30}, {"n": -2**63}, {"tuple": (1, "x")},
    {"s": "é"}, {"s": "\x7f"}, {"s": 'q"uote'}, {"s": "back\\slash"}, {"s": "line\nbreak"}, {"s": "\u2028"},
    {"s": "</script>&'"}, {"k": {1: 2, 10: 3, 9: 4}}, {"é": 1, "e": 2}, {"bytes-like": "\x00"},
]


@pytest.mark.parametrize("meta", _TRICKY_METAS, ids=range(len(_TRICKY_METAS)))
def test_ref_metadata_is_stored_as_json_dumps_writes_it(storage, meta):
    # the bytes of a ref are format: the metadata line is json.dumps(sort_keys, compact,
    # ASCII) of it, whichever encoder made it
    refs = RefStore(storage)
    made = refs.swap("sessions/a/u/s/heads/main", C1, None, meta=meta)
    expected = {**meta, "w": made.write_id}
    line = json.dumps(expected, sort_keys=True, separators=(",", ":"), allow_nan=False)
    assert storage.read(ref_key("sessions/a/u/s/heads/main")) == f"{C1}\n{line}\n".encode()


@pytest.mark.parametrize("bad", [{"f": float("nan")}, {"f": float("inf")}, {"s": {1, 2}}, {"b": b"x"}])
def test_ref_metadata_that_json_refuses_is_refused(refs, bad):
    with pytest.raises(InvalidEntry):
        refs.swap("r", C1, None, meta=bad)


def test_create_fails_when_the_ref_exists(refs):
    refs.swap("r", C1, None)
    with pytest.raises(RefConflict) as ei:
        refs.swap("r", C2, None)
    assert ei.value.ref == "r"
    assert ei.value.expected is None
    assert ei.value.actual == C1


def test_swap_with_the_value_read_moves_the_ref(refs):
    refs.swap("r", C1, None)
    v = refs.read("r")
    refs.swap("r", C2, v)
    assert refs.read("r").target == C2


def test_swap_with_a_stale_value_raises_conflict_with_both_values(refs):
    refs.swap("r", C1, None)
    old = refs.read("r")
    refs.swap("r", C2, old)
    with pytest.raises(RefConflict) as ei:
        refs.swap("r", C3, old)
    assert (ei.value.expected, ei.value.actual) == (C1, C2)
    assert refs.read("r").target == C2


def test_every_write_gets_a_fresh_write_id(refs):
    a = refs.swap("r", C1, None)
    b = refs.swap("r", C1, refs.read("r"))
    assert a.write_id != b.write_id
    # same target, yet the old token no longer matches: no ABA on refs
    with pytest.raises(RefConflict):
        refs.swap("r", C2, a)


def test_a_swap_of_many_refs_draws_their_write_ids_at_once_each_its_own(refs, monkeypatch):
    import types

    import castore.refs as refs_mod

    draws: list[int] = []

    def urandom(n: int) -> bytes:
        draws.append(n)
        return os.urandom(n)

    # the refs module's own draws (a backend draws for its own ends: S3 per request)
    monkeypatch.setattr(refs_mod, "os", types.SimpleNamespace(**{**vars(os), "urandom": urandom}))
    out = refs.swap_many([(f"many/{i}", cid(i), None, {}) for i in range(5)])
    monkeypatch.undo()
    assert draws == [16 * 5]  # one draw for the five moves, not a system call per ref
    ids = [v.write_id for v in out]  # type: ignore[union-attr]
    assert len(set(ids)) == 5 and all(len(w) == 32 and int(w, 16) >= 0 for w in ids)
    assert [refs.read(f"many/{i}").write_id for i in range(5)] == ids  # type: ignore[union-attr]


def test_swap_needs_a_value_read_with_its_token(refs):
    refs.swap("r", C1, None)
    with pytest.raises(Exception, match="token"):
        refs.swap("r", C2, RefValue("r", C1))


def test_delete_with_expect_removes_the_ref(refs):
    refs.swap("r", C1, None)
    refs.delete("r", refs.read("r"))
    assert refs.read("r") is None


def test_delete_with_stale_expect_raises_conflict(refs):
    refs.swap("r", C1, None)
    old = refs.read("r")
    refs.swap("r", C2, old)
    with pytest.raises(RefConflict) as ei:
        refs.delete("r", old)
    assert ei.value.actual == C2
    assert refs.read("r").target == C2


def test_delete_without_expect_removes_and_tolerates_absence(refs):
    refs.swap("r", C1, None)
    refs.delete("r")
    refs.delete("r")
    assert refs.read("r") is None


def test_list_and_list_dir_by_prefix(refs):
    for name in ["sessions/a/u/s1/HEAD", "sessions/a/u/s1/heads/main", "sessions/a/u/s2/HEAD",
                 "sessions/ab/u/s/HEAD", "state/a/app"]:
        refs.swap(name, C1, None)
    assert refs.list("sessions/a") == [
        "sessions/a/u/s1/HEAD", "sessions/a/u/s1/heads/main", "sessions/a/u/s2/HEAD"]
    assert refs.list("sessions/a/") == refs.list("sessions/a")
    assert refs.list_dir("sessions") == ["a", "ab"]
    assert refs.list_dir("sessions/a/u") == ["s1", "s2"]
    assert refs.list("nothing") == [] and refs.list_dir("nothing") == []


def test_changes_since_names_what_moved_below_a_prefix_or_says_it_cannot_tell(refs, backend):
    refs.swap("sessions/a/u/s1/heads/main", C1, None)
    mark, names = refs.changes_since("sessions", None)
    assert names is None  # no mark: every ref is to be read
    refs.swap("sessions/a/u/s1/heads/main", C2, refs.read("sessions/a/u/s1/heads/main"))
    refs.swap("sessions/a/u/s10/HEAD", C1, None)
    refs.swap("state/a/app", C1, None)
    refs.delete("sessions/a/u/s10/HEAD")
    new, names = refs.changes_since("sessions", mark)
    if backend.name == "local":  # local disk logs every ref change
        assert names == ["sessions/a/u/s1/heads/main", "sessions/a/u/s10/HEAD", "sessions/a/u/s10/HEAD"]
        assert new is not None and new != mark
        assert refs.changes_since("sessions", new) == (new, [])  # nothing since
        assert refs.changes_since("sessions/a/u/s1", mark) == (new, ["sessions/a/u/s1/heads/main"])  # a folder
        assert refs.changes_since("state/", mark) == (new, ["state/a/app"])
        assert refs.changes_since("sessions", "another-boot:x:1") == (new, None)  # a foreign mark
    else:  # memory and object storage keep no log of ref changes: cannot tell, ever
        assert mark is None and (new, names) == (None, None)
        assert refs.changes_since("sessions", "any-mark") == (None, None)


def test_changes_since_tells_no_mark_past_a_change_still_under_way(local_refs, tmp_path):
    mark, _ = local_refs.changes_since("s", None)
    local_refs.swap("s/heads/main", C2, local_refs.read("s/heads/main"))
    after, names = local_refs.changes_since("s", mark)
    assert after is not None and names == ["s/heads/main"]
    # A writer between logging its change of s/heads/main and landing it holds the ref's lock:
    # a read now may miss its change, so no mark may pass it (the next call reads everything).
    local_refs.swap("s/heads/main", C3, local_refs.read("s/heads/main"))
    lock = tmp_path / "store" / "refs" / "s" / "heads" / "main.lock"
    lock.write_bytes(b"")
    assert local_refs.changes_since("s", after) == (None, ["s/heads/main"])
    assert local_refs.changes_since("s", None)[0] is None
    assert local_refs.changes_since("t", after)[0] is not None  # a lock elsewhere does not matter
    lock.unlink()
    landed, names = local_refs.changes_since("s", after)
    assert landed is not None and names == ["s/heads/main"]


def test_read_many_reads_present_and_absent_refs(refs):
    refs.swap("x/one", C1, None)
    got = refs.read_many(["x/one", "x/two"])
    assert got["x/one"].target == C1
    assert got["x/two"] is None


# -- symbolic refs ---------------------------------------------------------------------------


def test_head_points_to_a_branch_and_resolves_to_its_commit(refs):
    refs.swap("sessions/a/u/s/heads/main", C1, None)
    refs.swap("sessions/a/u/s/HEAD", "ref: heads/main", None)
    head = refs.read("sessions/a/u/s/HEAD")
    assert head.symbolic == "heads/main"
    name, value = refs.resolve("sessions/a/u/s/HEAD")
    assert name == "sessions/a/u/s/heads/main"
    assert value.target == C1


def test_head_on_an_unborn_branch_resolves_to_none(refs):
    refs.swap("sessions/a/u/s/HEAD", "ref: heads/main", None)
    assert refs.resolve("sessions/a/u/s/HEAD") == ("sessions/a/u/s/heads/main", None)


def test_moving_head_to_another_branch(refs):
    refs.swap("s/heads/main", C1, None)
    refs.swap("s/heads/dev", C2, None)
    refs.swap("s/HEAD", "ref: heads/main", None)
    refs.swap("s/HEAD", "ref: heads/dev", refs.read("s/HEAD"))
    assert refs.resolve("s/HEAD")[1].target == C2


def test_a_symbolic_loop_is_an_integrity_error(refs):
    refs.swap("s/A", "ref: B", None)
    refs.swap("s/B", "ref: A", None)
    with pytest.raises(IntegrityError, match="s/A"):
        refs.resolve("s/A")


def test_a_detached_head_resolves_to_itself(refs):
    refs.swap("s/HEAD", C3, None)
    assert refs.resolve("s/HEAD")[1].target == C3


# -- garbage -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [b"garbage", b"\xff\xfe\x00", b"", b"1234\n", b"ref:heads/main\n", (C1 + "\n{not json\n").encode(),
     (C1 + "\n[1, 2]\n").encode(), CX.upper().encode()],
    ids=["text", "binary", "empty", "short-hex", "symbolic-no-space", "bad-json", "meta-not-object", "upper-hex"],
)
def test_garbage_ref_content_is_an_integrity_error_naming_the_ref(garbage):
    storage = open_storage(f"memory://garbage-{os.urandom(8).hex()}")  # parsing is backend-free
    refs = RefStore(storage)
    storage.write(ref_key("sessions/a/u/s/heads/main"), garbage)
    with pytest.raises(IntegrityError) as ei:
        refs.read("sessions/a/u/s/heads/main")
    assert "sessions/a/u/s/heads/main" in str(ei.value)
    assert getattr(ei.value, "ref", None) == "sessions/a/u/s/heads/main"
    for _ in range(2):  # exists says so too, each time (the memo keeps only bytes that parsed)
        with pytest.raises(IntegrityError, match="sessions/a/u/s/heads/main"):
            refs.exists("sessions/a/u/s/heads/main")
    storage.write(ref_key("sessions/a/u/s/heads/main"), (C1 + "\n").encode())
    assert refs.exists("sessions/a/u/s/heads/main") and refs.exists("sessions/a/u/s/heads/main")


def test_garbage_behind_a_symbolic_ref_names_the_broken_ref(refs, storage):
    # on every backend: the error comes through each backend's read path
    refs.swap("s/HEAD", "ref: heads/main", None)
    storage.write(ref_key("s/heads/main"), b"\x00junk")
    with pytest.raises(IntegrityError) as ei:
        refs.resolve("s/HEAD")
    assert ei.value.ref == "s/heads/main"


def test_a_garbage_ref_can_be_replaced_by_delete_then_create(refs, storage):
    storage.write(ref_key("r"), b"junk")
    refs.delete("r")
    refs.swap("r", C1, None)
    assert refs.read("r").target == C1


# -- compare-and-swap races ----------------------------------------------------------------


def _race_rounds(refs_per_thread: list[RefStore], name: str, rounds: int) -> list[list[int]]:
    """Each round every thread reads the ref, waits for all, then swaps. Returns winners per round."""
    n = len(refs_per_thread)
    barrier = threading.Barrier(n)
    winners: list[list[int]] = [[] for _ in range(rounds)]
    conflicts: list[list[RefConflict]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def worker(t: int) -> None:
        refs = refs_per_thread[t]
        try:
            for r in range(rounds):
                seen = refs.read(name)
                barrier.wait()
                try:
                    refs.swap(name, cid(r * 1000 + t + 1), seen)
                except RefConflict as e:
                    with lock:
                        conflicts[r].append(e)
                else:
                    with lock:
                        winners[r].append(t)
                barrier.wait()
        except BaseException:
            barrier.abort()  # the others stop waiting for this one
            raise

    errors = race(worker, n)
    if errors:
        raise errors[0]
    for r in range(rounds):
        assert len(conflicts[r]) + len(winners[r]) == n
        if len(winners[r]) == 1:
            target = cid(r * 1000 + winners[r][0] + 1)
            assert all(c.actual == target for c in conflicts[r] if c.actual is not None)
    return winners


def test_cas_race_32_threads_50_rounds_has_exactly_one_winner_per_round(race_backend):
    backend = race_backend
    handles = [open_storage(backend.url, **backend.options) for _ in range(4)]
    try:
        # threads share a few handles (as threads of one app share a store)
        refs = [RefStore(handles[t % len(handles)]) for t in range(32)]
        refs[0].swap("race/heads/main", cid(0), None)
        winners = _race_rounds(refs, "race/heads/main", 50)
        bad = {r: w for r, w in enumerate(winners) if len(w) != 1}
        assert not bad, f"rounds without exactly one winner on {backend.name}: {bad}"
        last = winners[-1][0]
        assert refs[0].read("race/heads/main").target == cid(49 * 1000 + last + 1)
    finally:
        for h in handles:
            h.close()


def test_cas_race_32_threads_on_s3_has_exactly_one_winner_per_round(seaweed_backend):
    st = open_storage(seaweed_backend.url, **seaweed_backend.options)
    try:
        refs = [RefStore(st) for _ in range(32)]
        refs[0].swap("race/heads/main", cid(0), None)
        winners = _race_rounds(refs, "race/heads/main", 2)
        assert [len(w) for w in winners] == [1, 1], winners
    finally:
        st.close()


@pytest.mark.parametrize("kind", ["local", "memory", "seaweedfs"])
def test_cas_race_on_create_has_exactly_one_winner(kind, request, tmp_path):
    from conftest import make_backend

    backend = make_backend(kind, request, tmp_path)
    st = open_storage(backend.url, **backend.options)
    try:
        refs = [RefStore(st) for _ in range(16)]
        winners = []

        def go(t: int) -> None:
            try:
                refs[t].swap("new/heads/main", cid(t + 1), None)
                winners.append(t)
            except RefConflict:
                pass

        errors = race(go, 16, together=True)
        assert not errors, errors
        assert len(winners) == 1
        assert refs[0].read("new/heads/main").target == cid(winners[0] + 1)
    finally:
        st.close()


def _process_racer(root: str, index: int, rounds: int, barrier, results) -> None:
    refs = RefStore(open_storage(root))
    wins = []
    for r in range(rounds):
        seen = refs.read("race/heads/main")
        barrier.wait()
        try:
            refs.swap("race/heads/main", cid(r * 1000 + index + 1), seen)
            wins.append(r)
        except RefConflict:
            pass
        barrier.wait()
    results.put((index, wins))


def test_cas_race_4_processes_50_rounds_on_local_disk(tmp_path):
    root = str(tmp_path / "store")
    RefStore(open_storage(root)).swap("race/heads/main", cid(0), None)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    results = ctx.Queue()
    procs = [ctx.Process(target=_process_racer, args=(root, i, 50, barrier, results)) for i in range(4)]
    for p in procs:
        p.start()
    got: dict[int, list[int]] = {}
    while len(got) < len(procs):
        try:
            index, wins = results.get(timeout=0.2)  # polling, so a crashed racer fails the test
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a racing process failed: exit codes {dead}"
            continue
        got[index] = wins
    for p in procs:
        p.join()
        assert p.exitcode == 0
    per_round = [[i for i, wins in got.items() if r in wins] for r in range(50)]
    bad = {r: w for r, w in enumerate(per_round) if len(w) != 1}
    assert not bad, f"rounds without exactly one winner: {bad}"
    final = RefStore(open_storage(root)).read("race/heads/main").target
    assert final == cid(49 * 1000 + per_round[-1][0] + 1)
    assert not [f for f in os.listdir(tmp_path / "store" / "refs" / "race" / "heads") if f != "main"]


# -- local locks: stale and live holders ------------------------------------------------------


def _hold_lock(lock_path: str, ready, release, write_owner: bool = True) -> None:
    """Take a ref lock the way LocalStorage does, then hold it until told (or killed)."""
    import fcntl

    fd = os.open(lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    if write_owner:
        os.write(fd, f"{os.getpid()} {locks_mod.HOST}\n".encode())
    ready.set()
    release.wait()
    os.unlink(lock_path)
    os.close(fd)


@pytest.fixture
def local_refs(tmp_path) -> RefStore:
    refs = RefStore(open_storage(str(tmp_path / "store")))
    refs.swap("s/heads/main", C1, None)
    return refs


def _lock_path(refs: RefStore, name: str) -> str:
    return refs.storage._path(ref_key(name)) + ".lock"


def _start_holder(refs: RefStore, name: str, write_owner: bool = True):
    ctx = mp.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold_lock, args=(_lock_path(refs, name), ready, release, write_owner))
    p.start()
    while not ready.wait(0.1):
        assert p.is_alive(), "the lock holder died before taking the lock"
    return p, release


def test_a_lock_left_by_a_killed_process_is_recovered(local_refs):
    p, _release = _start_holder(local_refs, "s/heads/main")
    v = local_refs.read("s/heads/main")
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert os.path.exists(_lock_path(local_refs, "s/heads/main"))
    local_refs.swap("s/heads/main", C2, v)
    assert local_refs.read("s/heads/main").target == C2
    assert not os.path.exists(_lock_path(local_refs, "s/heads/main"))


def test_an_empty_lock_left_by_a_process_killed_before_writing_its_pid_is_recovered(local_refs):
    p, _release = _start_holder(local_refs, "s/heads/main", write_owner=False)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    lock = _lock_path(local_refs, "s/heads/main")
    old = os.stat(lock).st_mtime - locks_mod.EMPTY_LOCK_GRACE - 1
    os.utime(lock, (old, old))  # older than the grace period for a creator to write its pid
    local_refs.swap("s/heads/main", C2, local_refs.read("s/heads/main"))
    assert local_refs.read("s/heads/main").target == C2


def test_an_empty_lock_dated_ahead_of_the_clock_is_recovered(local_refs):
    """A power loss keeps a lock file's name but not its owner's line (empty on disk); after a
    reboot on a machine whose clock went back, its time lies ahead of the clock, and it looked
    young (its creator about to lock it) until the clock caught up: every writer of the ref,
    and the recovery at open that replays it, failed with RefLocked meanwhile."""
    v = local_refs.read("s/heads/main")
    lock = _lock_path(local_refs, "s/heads/main")
    with open(lock, "wb"):
        pass
    ahead = os.stat(lock).st_mtime + 3600
    os.utime(lock, (ahead, ahead))
    local_refs.swap("s/heads/main", C2, v)
    assert local_refs.read("s/heads/main").target == C2
    assert not os.path.exists(lock)


def test_a_lock_cleared_before_its_creator_locked_it_is_not_held_by_two(tmp_path, monkeypatch):
    """A writer that created its lock file but has not ``flock``ed it yet meets a rival that
    takes the file for stale and clears it (its time ahead of the clock: a file server's clock
    ahead of this host's, or a clock stepped back between the two calls) and takes the lock:
    the first writer must notice that the file it locks is no longer the lock, not go on
    holding it beside the rival (two writers in one compare-and-swap: a lost update)."""
    path = str(tmp_path / "ref")
    lock = path + ".lock"

    def take() -> int:
        return locks_mod.take_lock(path, None, lambda d: os.makedirs(d, exist_ok=True),
                                   lambda d: os.makedirs(d, exist_ok=True), lambda _p: None, "test")

    real_flock = locks_mod.fcntl.flock
    rival: list[int] = []
    calls: list[int] = []

    def flock(fd: int, op: int) -> None:
        calls.append(op)
        if op == locks_mod.fcntl.LOCK_EX and len(calls) == 1:  # the first writer, between create and flock
            ahead = os.stat(lock).st_mtime + 3600
            os.utime(lock, (ahead, ahead))
            rival.append(take())  # clears the "stale" file, takes the lock, and holds it
        real_flock(fd, op)

    monkeypatch.setattr(locks_mod.fcntl, "flock", flock)
    monkeypatch.setattr(locks_mod, "LOCK_TIMEOUT", 0.0)  # the rival holds it: no need to wait
    try:
        with pytest.raises(RefLocked):
            fd = take()
            os.close(fd)  # (before the fix: both hold it)
        assert os.fstat(rival[0]).st_ino == os.stat(lock).st_ino  # the rival's file is the lock
    finally:
        if rival:
            locks_mod.unlock(path, rival[0])


def test_a_live_lock_holder_makes_writers_wait_not_steal(local_refs):
    p, release = _start_holder(local_refs, "s/heads/main")
    lock = _lock_path(local_refs, "s/heads/main")
    owner = open(lock, "rb").read()
    v = local_refs.read("s/heads/main")
    done = threading.Event()
    outcome: list[object] = []

    def writer() -> None:
        try:
            outcome.append(local_refs.swap("s/heads/main", C2, v))
        except BaseException as e:
            outcome.append(e)
        done.set()

    th = threading.Thread(target=writer)
    th.start()
    assert not done.wait(0.5), f"writer did not wait for the live holder: {outcome}"
    assert open(lock, "rb").read() == owner  # not stolen
    assert local_refs.read("s/heads/main").target == C1
    release.set()
    p.join()
    th.join()
    assert isinstance(outcome[0], RefValue)
    assert local_refs.read("s/heads/main").target == C2


def test_a_writer_gives_up_on_a_live_lock_with_ref_locked(local_refs, monkeypatch):
    monkeypatch.setattr(locks_mod, "LOCK_TIMEOUT", 0.3)
    p, release = _start_holder(local_refs, "s/heads/main")
    try:
        with pytest.raises(RefLocked):
            local_refs.swap("s/heads/main", C2, local_refs.read("s/heads/main"))
        assert os.path.exists(_lock_path(local_refs, "s/heads/main"))
    finally:
        release.set()
        p.join()
    assert local_refs.read("s/heads/main").target == C1


# -- lost responses ----------------------------------------------------------------------------


class LossyStorage(PassThrough):
    """Wraps a storage; chosen calls do their work and then 'lose' the response."""

    def __init__(self, inner: Storage, lose_swaps: int = 0, drop_swaps: int = 0, lose_reads: int = 0) -> None:
        super().__init__(inner)
        self.lose_swaps = lose_swaps  # write lands, then StorageError
        self.drop_swaps = drop_swaps  # StorageError before anything is written
        self.lose_reads = lose_reads
        self.swap_calls = 0

    def read_versioned(self, key: str) -> Versioned | None:
        if self.lose_reads:
            self.lose_reads -= 1
            raise StorageError("read timed out", self.url)
        return self.inner.read_versioned(key)

    def swap(self, key: str, data: bytes, expect: Token | None) -> Token:
        self.swap_calls += 1
        if self.drop_swaps:
            self.drop_swaps -= 1
            raise StorageError("connection reset before the request was sent", self.url)
        token = self.inner.swap(key, data, expect)
        if self.lose_swaps:
            self.lose_swaps -= 1
            raise StorageError("connection reset; response lost", self.url)
        return token


def test_a_swap_whose_response_is_lost_counts_as_success(storage):
    lossy = LossyStorage(storage, lose_swaps=1)
    refs = RefStore(lossy)
    refs.swap("r", C1, None)  # not lossy: lose_swaps is consumed below
    lossy.lose_swaps = 1
    v = refs.read("r")
    got = refs.swap("r", C2, v)
    assert got.target == C2
    assert lossy.swap_calls == 2  # no second write was needed
    assert RefStore(storage).read("r").write_id == got.write_id


def test_a_lost_create_response_counts_as_success(storage):
    lossy = LossyStorage(storage, lose_swaps=1)
    got = RefStore(lossy).swap("r", C1, None)
    assert got.target == C1
    assert RefStore(storage).read("r").write_id == got.write_id


def test_a_lost_response_then_a_failed_check_is_resolved_by_the_retry(storage):
    # the write lands, its answer is lost, the check read fails too; the retry then
    # meets our own write (precondition fails) and recognises it by the write id
    lossy = LossyStorage(storage)
    refs = RefStore(lossy)
    refs.swap("r", C1, None)
    v = refs.read("r")
    lossy.lose_swaps, lossy.lose_reads = 1, 1
    got = refs.swap("r", C2, v)
    assert got.target == C2
    assert RefStore(storage).read("r").target == C2


def test_a_swap_dropped_before_sending_is_retried(storage):
    lossy = LossyStorage(storage, drop_swaps=1)
    refs = RefStore(lossy)
    got = refs.swap("r", C1, None)
    assert got.target == C1
    assert lossy.swap_calls == 2


def test_a_lost_response_when_a_rival_then_wins_is_not_mistaken_for_success(storage):
    # our request never landed; a rival moved the ref meanwhile: that is a conflict
    lossy = LossyStorage(storage)
    refs = RefStore(lossy)
    refs.swap("r", C1, None)
    v = refs.read("r")
    RefStore(storage).swap("r", C3, v)  # the rival
    lossy.drop_swaps = 1
    with pytest.raises(RefConflict) as ei:
        refs.swap("r", C2, v)
    assert ei.value.actual == C3


def test_a_storage_that_keeps_failing_raises_storage_error(storage, monkeypatch):
    import castore.refs as refs_mod

    monkeypatch.setattr(refs_mod.time, "sleep", lambda s: None)
    lossy = LossyStorage(storage, drop_swaps=100)
    with pytest.raises(StorageError):
        RefStore(lossy).swap("r", C1, None)
    assert RefStore(storage).read("r") is None


@pytest.mark.parametrize("target", ["", "garbage", C1[:-1], CX.upper(), "ref: ", "ref: a\nb", C1 + "\n"])
def test_a_bad_target_is_refused_before_anything_is_written(target):
    from castore.errors import InvalidEntry

    refs = RefStore(open_storage(f"memory://bad-target-{os.urandom(8).hex()}"))

    with pytest.raises(InvalidEntry):
        refs.swap("r", target, None)
    assert refs.read("r") is None


def test_metadata_that_is_not_json_is_refused_before_writing(refs):
    from castore.errors import InvalidEntry

    with pytest.raises(InvalidEntry):
        refs.swap("r", C1, None, meta={"x": object()})
    assert refs.read("r") is None


def test_local_durable_writes_sync_the_parents_of_new_folders(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from castore.storage.local import LocalStorage

    synced: list[str] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    storage = LocalStorage(str(tmp_path / "store"))
    monkeypatch.setattr(os, "fsync", spy)
    storage.swap("refs/sessions/a/u/s/heads/main", b"x", None)
    root = str(tmp_path / "store")
    for parent in ("refs", "refs/sessions", "refs/sessions/a", "refs/sessions/a/u", "refs/sessions/a/u/s"):
        assert os.path.join(root, parent) in synced, (parent, synced)
    synced.clear()
    storage.swap("refs/sessions/a/u/s/heads/other", b"y", None)
    assert os.path.join(root, "refs/sessions/a/u/s") not in synced  # nothing new: no parent sync


@pytest.mark.parametrize("meta", ['{"a":1,"tl":["x"],"n":{"b":null,"c":-0.5}}', '{"a":NaN}', '{"a":1e400}',
                                  '{"a":"\\ud800"}', '{"a":123456789012345678901234567890,"a":2}'])
def test_ref_metadata_reads_as_json_reads_it(meta: str) -> None:
    """A ref's metadata is read by msgspec where it can, by json where msgspec refuses: the same
    values either way (what json refuses is a corrupt ref)."""
    from castore.refs import parse

    got = parse("sessions/a/u/s/heads/main", f"{C1}\n{meta}\n".encode()).meta
    assert json.dumps(got, sort_keys=True) == json.dumps(json.loads(meta), sort_keys=True)
    with pytest.raises(IntegrityError):
        parse("sessions/a/u/s/heads/main", f"{C1}\n{meta[:-1]}\n".encode())
