"""Deferred ref swaps write the ref file in place (format 3, docs/FORMAT.md 12): a header that
checks the value lets readers tell a torn file (a read that met the write, a power loss) from
a whole one; plain ref files (format 2, durable swaps) read and swap as before."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

import castore
from castore import objects as o
from castore.errors import CorruptRef
from castore.maintenance import fsck
from castore.storage import bootmarkers as journal_mod
from castore.storage import local as local_mod
from castore.storage import locks as locks_mod
from castore.storage.bootmarkers import INPLACE_MAGIC, frame
from castore.storage.local import LocalStorage
from castore.storage.reffiles import INPLACE_MAX

BRANCH = "refs/sessions/app/u/s/heads/main"


def _reboot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_mod, "_boot_id", lambda: "00000000-0000-0000-0000-0000000b0071")


def _append(st: castore.Store, text: str, sid: str = "s") -> None:
    st.session("app", "u", sid).append(castore.Message(role="user", content=text))


def _deferred_swap(st: castore.Store, key: str, data: bytes, expect: str | None) -> str:
    """A swap as the write path makes it: objects into the writer's log (unsynced), then the
    swap journaled in that log."""
    st.objects.put_encoded([o.encode(o.Blob(data=os.urandom(16)))], sync=False)
    try:
        return st.storage.swap(key, data, expect, journal=st.objects.journal)
    finally:
        st.objects.settle()


def test_a_deferred_swap_writes_the_ref_in_place_and_format_2_does_not(tmp_path: Path) -> None:
    for fmt in (3, 2):
        root = tmp_path / f"f{fmt}"
        st = castore.open(str(root), format=fmt)
        _append(st, "one")
        ref = root / BRANCH
        first = ref.stat().st_ino
        _append(st, "two")
        same = ref.stat().st_ino == first
        assert same == (fmt == 3), fmt
        assert ref.read_bytes().startswith(INPLACE_MAGIC) == (fmt == 3)
        assert [m.content for m in st.session("app", "u", "s").messages()] == ["one", "two"]
        assert not list((root / "refs").rglob("*.lock"))
        st.close()
        assert fsck(castore.open(str(root))).ok


def test_a_shorter_value_in_place_reads_back_without_the_old_tail(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "st"), format=3)
    key = "refs/x/long"
    t = _deferred_swap(st, key, b"a" * 5000 + b"\n", None)
    ino = (tmp_path / "st" / key).stat().st_ino
    t = _deferred_swap(st, key, b"short\n", t)
    assert (tmp_path / "st" / key).stat().st_ino == ino
    assert (tmp_path / "st" / key).stat().st_size == len(frame(b"short\n"))  # cut by ftruncate
    got = st.storage.read_versioned(key)
    assert got is not None and got.data == b"short\n" and got.token == t


def test_a_writer_killed_between_pwrite_and_ftruncate_leaves_a_ref_that_reads_whole(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "st"), format=3)
    _append(st, "one")
    _append(st, "two")
    ref = tmp_path / "st" / BRANCH
    value = st.storage.read(BRANCH)
    ref.write_bytes(frame(value) + b"\n" + b"7" * 64 + b"\n{\"stale\": 1}\n")  # an old, longer tail
    assert st.storage.read(BRANCH) == value
    assert [m.content for m in st.session("app", "u", "s").messages()] == ["one", "two"]
    _append(st, "three")  # and it swaps on from there
    assert [m.content for m in st.session("app", "u", "s").messages()] == ["one", "two", "three"]


def _flip(path: Path) -> None:
    """Damage one byte of the value of a ref file written in place (its header kept)."""
    raw = bytearray(path.read_bytes())
    assert raw.startswith(INPLACE_MAGIC)
    raw[-10] ^= 0x01
    path.write_bytes(bytes(raw))


def test_a_torn_ref_raises_a_clear_error_naming_it(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "st"), format=3)
    _append(st, "one")
    _append(st, "two")
    _flip(tmp_path / "st" / BRANCH)
    with pytest.raises(CorruptRef, match="sessions/app/u/s/heads/main.*torn") as e:
        st.storage.read_versioned(BRANCH)
    assert e.value.ref == "sessions/app/u/s/heads/main"
    with pytest.raises(CorruptRef):
        st.refs.read("sessions/app/u/s/heads/main")


def test_a_ref_torn_by_a_power_loss_takes_its_last_value_at_recovery(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "st"
    st = castore.open(str(root), format=3)
    assert isinstance(st.storage, LocalStorage)
    st.storage.unsynced = []
    want = {}
    for sid in ("s1", "s2"):
        for i in range(4):
            _append(st, f"{sid} {i}", sid)
        want[sid] = [m.content for m in st.session("app", "u", sid).messages()]
    before = {}  # each ref's value before its last write
    for p, old in st.storage.unsynced:
        before[Path(p)] = old
    torn = [p for p, old in before.items() if old is not None and p.read_bytes().startswith(INPLACE_MAGIC)]
    assert len(torn) == 2  # both branches were written in place, unsynced
    for p in torn:
        # the power loss kept the last write in place but the old value's first block
        # (where its tip is): the header and the rest are new
        raw, old = p.read_bytes(), before[p]
        assert old is not None and len(old) > 64
        p.write_bytes(raw[:24] + old[:64] + raw[24 + 64:])
    _reboot(monkeypatch)
    again = castore.open(str(root))
    for sid, msgs in want.items():
        assert [m.content for m in again.session("app", "u", sid).messages()] == msgs
    assert fsck(again).ok
    assert not os.listdir(root / journal_mod.JOURNAL)  # the other boot's marker is replayed and gone


def test_a_value_longer_than_a_page_is_renamed_not_written_in_place(tmp_path: Path) -> None:
    # a SIGKILL between the pages of a write leaves the first written and not the second (a
    # torn ref in the same boot): only what fits one page is written in place
    st = castore.open(str(tmp_path / "st"), format=3)
    key = "refs/x/grows"
    path = tmp_path / "st" / key
    fits = INPLACE_MAX - len(frame(b""))
    t = _deferred_swap(st, key, b"a" * 100 + b"\n", None)  # new: renamed, framed
    ino = path.stat().st_ino
    t = _deferred_swap(st, key, b"b" * (fits - 1) + b"\n", t)  # the frame fills the page exactly
    assert path.stat().st_ino == ino and path.stat().st_size == INPLACE_MAX
    t = _deferred_swap(st, key, b"c" * fits + b"\n", t)  # one byte more: renamed
    assert path.stat().st_ino != ino and path.read_bytes().startswith(INPLACE_MAGIC)
    ino = path.stat().st_ino
    t = _deferred_swap(st, key, b"d" * 10 + b"\n", t)  # short again: in place, cut
    assert path.stat().st_ino == ino and path.stat().st_size == len(frame(b"d" * 10 + b"\n"))
    got = st.storage.read_versioned(key)
    assert got is not None and got.data == b"d" * 10 + b"\n" and got.token == t
    st.close()


def test_a_long_value_over_a_long_one_is_exchanged_and_leaves_no_temporary(tmp_path: Path) -> None:
    # a value longer than a page goes into a new file that takes the ref's name in one step
    # (renameat2 RENAME_EXCHANGE where there is one, else a rename): a reader holding the
    # old file reads the old value whole, nothing else is left in the folder
    st = castore.open(str(tmp_path / "st"), format=3)
    key = "refs/x/long"
    path = tmp_path / "st" / key
    before = b"a" * 100 + b"\n"
    t = _deferred_swap(st, key, before, None)
    for i in range(6):
        old = path.open("rb")
        value = f"{i}".encode() * (2 * INPLACE_MAX) + b"\n"
        t = _deferred_swap(st, key, value, t)
        assert path.stat().st_ino != os.fstat(old.fileno()).st_ino  # another file took the name
        assert old.read() == frame(before)  # the file a reader had open still holds the old value
        old.close()
        before = value
        got = st.storage.read_versioned(key)
        assert got is not None and got.data == value and got.token == t
        assert sorted(p.name for p in path.parent.iterdir()) == ["long"]
    fresh = LocalStorage(str(tmp_path / "st"))
    got = fresh.read_versioned(key)
    assert got is not None and got.token == t
    st.close()


def test_where_names_cannot_be_exchanged_a_long_value_is_renamed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a file system without RENAME_EXCHANGE (exchange says False): renamed, and not tried again
    calls: list[str] = []

    def no_exchange(src: str, dst: str) -> bool:
        calls.append(dst)
        return False

    monkeypatch.setattr(local_mod, "exchange", no_exchange)
    st = castore.open(str(tmp_path / "st"), format=3)
    key = "refs/x/long"
    path = tmp_path / "st" / key
    t = _deferred_swap(st, key, b"a" * 100 + b"\n", None)
    for i in range(3):
        value = f"{i}".encode() * (2 * INPLACE_MAX) + b"\n"
        t = _deferred_swap(st, key, value, t)
        got = st.storage.read_versioned(key)
        assert got is not None and got.data == value and got.token == t
        assert sorted(p.name for p in path.parent.iterdir()) == ["long"]
    assert len(calls) == 1
    st.close()


def test_a_reader_never_sees_a_write_in_place_half_done(tmp_path: Path) -> None:
    # on tmpfs an fdatasync costs nothing, so the writes in place follow each other fast
    # enough for the reader to meet many of them mid-copy (without the check it then reads
    # mixed bytes); on disk the test holds too, it just meets fewer
    where = Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else tmp_path
    try:
        _reader_meets_writes_in_place(where / "st")
    finally:
        if where != tmp_path:
            shutil.rmtree(where)


def _reader_meets_writes_in_place(root: Path) -> None:
    st = castore.open(str(root), format=3)
    key = "refs/x/busy"
    # values that differ in every byte: any mix of two is none of them; written in place
    # only up to a page (INPLACE_MAX)
    values = [f"{i:07d}\n".encode() * ((INPLACE_MAX - 64) // 8 - 61 * (i % 7)) for i in range(400)]
    token = _deferred_swap(st, key, values[0], None)
    written = {values[0]}
    done = threading.Event()
    bad: list[bytes] = []
    reads = [0]

    def reader() -> None:
        r = LocalStorage(str(root))
        while not done.is_set() or reads[0] < 200:
            got = r.read(key)
            reads[0] += 1
            if got not in written:
                bad.append(got[:40])

    t = threading.Thread(target=reader)
    t.start()
    renamed = 0
    ino = (root / key).stat().st_ino
    try:
        for v in values[1:]:
            written.add(v)
            token = _deferred_swap(st, key, v, token)
            renamed += (root / key).stat().st_ino != ino
            ino = (root / key).stat().st_ino
    finally:
        done.set()
        t.join()
        st.close()
    # a swap right after the log was sealed has no log to journal in (durable, renamed)
    assert renamed <= 5
    assert not bad, f"{len(bad)} of {reads[0]} reads were not a written value: {bad[:3]}"


def test_plain_refs_read_as_before_and_are_not_overwritten_in_place(tmp_path: Path) -> None:
    root = tmp_path / "st"
    st = castore.open(str(root), format=2)
    _append(st, "one")
    st.close()
    ref = root / BRANCH
    plain = ref.read_bytes()
    assert not plain.startswith(INPLACE_MAGIC)
    up = castore.open(str(root), format=3)
    assert up.storage.read(BRANCH) == plain
    ino = ref.stat().st_ino
    _append(up, "two")  # a reader mid-overwrite of a plain file could not tell: renamed, framed
    assert ref.stat().st_ino != ino and ref.read_bytes().startswith(INPLACE_MAGIC)
    ino = ref.stat().st_ino
    _append(up, "three")
    assert ref.stat().st_ino == ino
    assert [m.content for m in up.session("app", "u", "s").messages()] == ["one", "two", "three"]


def test_a_value_that_starts_with_the_header_magic_reads_back_as_itself(tmp_path: Path) -> None:
    s = LocalStorage(str(tmp_path / "st"))
    odd = INPLACE_MAGIC + b"not a header"
    t = s.swap("refs/odd", odd, None)
    got = s.read_versioned("refs/odd")
    assert got is not None and got.data == odd and got.token == t
    s.write("refs/odd2", odd)
    assert s.read("refs/odd2") == odd


def test_an_empty_value_written_in_place_swaps_on(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "st"), format=3)
    t = _deferred_swap(st, "refs/x/e", b"first\n", None)
    t = _deferred_swap(st, "refs/x/e", b"", t)
    assert st.storage.read("refs/x/e") == b""
    t = _deferred_swap(st, "refs/x/e", b"again\n", t)  # compared against the empty value's token
    assert st.storage.read("refs/x/e") == b"again\n"


def test_the_header_of_a_ref_written_in_place_keeps_its_bytes() -> None:
    # the on-disk layout (docs/FORMAT.md 12): magic, length (big endian), blake2b-128, value
    value = b"ref: heads/main\n{}\n"
    assert frame(value).hex() == ("ff00726566" + "00000013" + hashlib.blake2b(value, digest_size=16).hexdigest()
                                  + value.hex())
    assert journal_mod.unframe(frame(value) + b"old tail") == value


def _calls_on(monkeypatch: pytest.MonkeyPatch, path: Path, *names: str) -> dict[str, int]:
    """Count the calls of ``os.<name>`` (open: those naming ``path``; the others: on a file
    descriptor of ``path``) made from castore.storage.local."""
    counts = dict.fromkeys(names, 0)
    fds: set[int] = set()
    real_open, real_close = os.open, os.close

    def opened(p: str, *a: object, **kw: object) -> int:
        fd = real_open(p, *a, **kw)  # type: ignore[arg-type]
        if os.fspath(p) == str(path):
            counts["open"] = counts.get("open", 0) + 1
            fds.add(fd)
        return fd

    def closed(fd: int) -> None:
        fds.discard(fd)
        real_close(fd)

    monkeypatch.setattr(local_mod.os, "open", opened)
    monkeypatch.setattr(local_mod.os, "close", closed)
    for name in names:
        if name == "open":
            continue
        real = getattr(os, name)

        def counted(fd: int, *a: object, _real: object = real, _name: str = name) -> object:
            if fd in fds:
                counts[_name] += 1
            return _real(fd, *a)  # type: ignore[operator]

        monkeypatch.setattr(local_mod.os, name, counted)
    return counts


def test_a_deferred_swap_opens_the_ref_once_and_cuts_it_only_when_it_shrinks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = castore.open(str(tmp_path / "st"), format=3)
    key = "refs/x/grows"
    ref = tmp_path / "st" / key
    t = _deferred_swap(st, key, b"a" * 100 + b"\n", None)  # renamed into place (a new ref)
    calls = _calls_on(monkeypatch, ref, "open", "ftruncate", "pread")
    t = _deferred_swap(st, key, b"b" * 300 + b"\n", t)  # grows: the write sets the size
    assert calls == {"open": 1, "ftruncate": 0, "pread": 0}
    assert ref.stat().st_size == len(frame(b"b" * 300 + b"\n"))
    t = _deferred_swap(st, key, b"c" * 10 + b"\n", t)  # shrinks: cut
    assert calls == {"open": 2, "ftruncate": 1, "pread": 0}
    monkeypatch.undo()
    assert ref.read_bytes() == frame(b"c" * 10 + b"\n")
    got = st.storage.read_versioned(key)
    assert got is not None and got.data == b"c" * 10 + b"\n" and got.token == t
    st.close()


def test_a_swap_over_a_torn_ref_compares_it_at_once_without_waiting_out_its_own_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st = castore.open(str(tmp_path / "st"), format=3)
    _append(st, "one")
    _append(st, "two")
    ref = tmp_path / "st" / BRANCH
    _flip(ref)
    torn = ref.read_bytes()
    slept: list[float] = []
    monkeypatch.setattr(local_mod.time, "sleep", slept.append)
    token = hashlib.blake2b(torn, digest_size=16).hexdigest()  # the file as it lies
    with pytest.raises(local_mod.PreconditionFailed):
        _deferred_swap(st, BRANCH, b"x\n", "0" * 32)
    new = _deferred_swap(st, BRANCH, b"y\n", token)
    assert slept == []  # under its own lock no write in place is under way: nothing to wait for
    got = st.storage.read_versioned(BRANCH)
    assert got is not None and got.data == b"y\n" and got.token == new
    st.close()


def test_a_deferred_swap_locks_the_ref_with_a_link_of_its_handles_lock_file_once_it_exists(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "st"), format=3)
    assert isinstance(st.storage, LocalStorage)
    key = "refs/x/linked"
    lock = tmp_path / "st" / (key + ".lock")
    seen: list[tuple[int, int, bytes]] = []

    def journal(intent: object) -> bool:
        s = lock.stat()
        seen.append((s.st_ino, s.st_nlink, lock.read_bytes()))
        return st.objects.journal(intent)  # type: ignore[arg-type]

    t = None
    made = None
    for value in (b"one\n", b"two\n", b"three\n"):
        st.objects.put_encoded([o.encode(o.Blob(data=os.urandom(16)))], sync=False)
        try:
            t = st.storage.swap(key, value, t, journal=journal)
        finally:
            st.objects.settle()
        made = made or (tmp_path / "st" / key).stat().st_ino
    (own,) = os.listdir(tmp_path / "st" / locks_mod.LOCKS)
    ino = (tmp_path / "st" / locks_mod.LOCKS / own).stat().st_ino
    owner = f"{os.getpid()} {os.uname().nodename}\n".encode()
    # a new ref needs a file anyway: its lock is a new file, naming its owner, which became the ref
    assert seen[0] == (made, 1, owner)
    # then the same file each time, linked (no lock file made per swap), naming its owner
    assert seen[1:] == [(ino, 2, owner)] * 2
    assert not lock.exists()
    assert st.storage.read(key) == b"three\n"
    st.close()
    assert os.listdir(tmp_path / "st" / locks_mod.LOCKS) == []  # removed on close


_DIES_HOLDING_A_LINKED_LOCK = """
import os, sys, time
import castore
st = castore.open(sys.argv[1], format=3)
path = st.storage._path("refs/x/held")
st.storage._lock(path, link=True)  # held, never released
child = os.fork()
if child == 0:  # a child that outlives its parent must not keep the lock alive
    os.closerange(0, 3)
    time.sleep(60)
    os._exit(0)
print("locked", child, flush=True)
os._exit(0)
"""


def test_a_linked_lock_of_a_dead_writer_is_cleared_though_its_forked_child_lives(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = tmp_path / "st"
    castore.open(str(root), format=3).close()
    out = subprocess.run([sys.executable, "-c", _DIES_HOLDING_A_LINKED_LOCK, str(root)], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    word, child = out.stdout.split()
    assert word == "locked"
    lock = root / "refs" / "x" / "held.lock"
    try:
        assert lock.exists() and lock.stat().st_nlink == 2
        assert locks_mod.check_stale(str(lock), remove=False) is True
        st = castore.open(str(root), format=3)
        t = _deferred_swap(st, "refs/x/held", b"mine\n", None)  # clears the dead writer's lock
        assert st.storage.read_versioned("refs/x/held") == (b"mine\n", t)
        # making its own lock file removed the dead writer's
        assert len(os.listdir(root / locks_mod.LOCKS)) == 1
        st.close()
    finally:
        os.kill(int(child), signal.SIGKILL)


def test_a_swap_lands_when_a_repack_merged_its_sealed_log_before_it(tmp_path: Path) -> None:
    """The objects record that fills the log seals it (synced) and starts a background
    repack; when that repack has merged the log away before the swap journals its intent,
    the swap still lands (its objects are durable, in the merged pack), made durable on its
    own. It used to fail with "not made durable (the log failed)"."""
    st = castore.open(str(tmp_path / "st"), format=3)
    key = "refs/x/r"
    token = _deferred_swap(st, key, b"one\n", None)
    big = [o.encode(o.Blob(data=os.urandom(3000))) for _ in range(400)]  # one record past SEAL_BYTES
    st.objects.put_encoded(big, sync=False)
    st.objects.wait_repack()
    pending = st.objects.writer_log._tls.pending
    assert pending and pending not in st.objects.packmap  # sealed, then merged away
    try:
        token = st.storage.swap(key, b"two\n", token, journal=st.objects.journal)
    finally:
        st.objects.settle()
    assert st.storage.read(key) == b"two\n"
    assert {oid for oid, _ in big} <= set(st.objects.get_many([oid for oid, _ in big]))
    st.close()
