"""A pack index read by range (issue 17: the state at the middle of a long session stays flat
in N): a lookup reads the index's first bytes and a window of rows, not the whole index, and
the whole-index check still guards every miss, every listing and every object that fails
its id (docs/FORMAT.md, 7)."""

from __future__ import annotations

import math
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

import castore
from castore import maintenance
from castore.objectstore import packindex, packmap, packs
from castore.storage.local import LocalStorage
from castore.storage.retrying import RetryingStorage

ROWS = 30_000  # about the index of a 10,000-entry session (1.3 MB)


class _Counting:
    """``read(offset, size)`` over an index's bytes, counting the reads and bytes (a file's
    ``pread``: fewer bytes at its end)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads = 0
        self.bytes = 0

    def __call__(self, offset: int, size: int) -> bytes:
        got = self.data[offset:offset + size]
        self.reads += 1
        self.bytes += len(got)
        return got


def _index(version: int, rows: int = ROWS, seed: int = 1) -> tuple[bytes, dict[str, packs.Place]]:
    rng = random.Random(seed)
    where: dict[str, packs.Place] = {}
    for i in range(rows):
        oid = rng.randbytes(32).hex()
        rec = i // 190  # a repacked block holds ~190 objects
        where[oid] = (packs.Slot(8 + rec * 70_000, 60_000, (i % 190) * 300, 290) if version == 2
                      else packs.Location(8 + i * 300, 290))
    size = 8 + (rows // 190 + 1) * 70_000 if version == 2 else 8 + rows * 300
    return packindex.encode_index(size, where), where


@pytest.mark.parametrize("version", [1, 2])
def test_a_lookup_reads_a_window_of_the_index_not_all_of_it(version: int) -> None:
    data, where = _index(version)
    whole = packindex.IndexView(data)
    rng = random.Random(7)
    present = rng.sample(sorted(where), 20)
    absent = [rng.randbytes(32) for _ in range(20)]
    # the smallest id and the largest: the ends of the search
    ends = [min(where), max(where)]
    for oid in present + ends:
        read = _Counting(data)
        view = packindex.IndexView(data[:packindex.INDEX_HEAD], check=False, read=read)
        assert view.find(bytes.fromhex(oid)) == where[oid] == whole.find(bytes.fromhex(oid))
        # one window of ~2 sqrt(n) rows, at most a few when the first one misses:
        # O(log n) reads, a few percent of the index's bytes
        assert read.reads <= 2 * math.log2(ROWS), read.reads
        assert read.bytes <= 4 * (2 * (math.isqrt(ROWS) + 16) + 1) * 48, read.bytes
        assert read.bytes < len(data) / 20
    for raw in absent:
        read = _Counting(data)
        view = packindex.IndexView(data[:packindex.INDEX_HEAD], check=False, read=read)
        assert view.find(raw) is None
        assert read.bytes < len(data) / 20
    assert not view.checked


def test_a_reader_of_many_objects_reads_its_index_whole_once() -> None:
    data, where = _index(2)
    read = _Counting(data)
    view = packindex.IndexView(data[:packindex.INDEX_HEAD], check=False, read=read)
    for oid in sorted(where)[::50]:
        assert view.find(bytes.fromhex(oid)) == where[oid]
    # windows until they fetched as many bytes as the index holds (or INDEX_RANGE_READS
    # reads), then the whole: never more than about twice one whole read
    window = 2 * (math.isqrt(ROWS) + 16) * 48
    assert len(data) < read.bytes <= 2 * len(data) + window + packindex.INDEX_HEAD
    assert view.data == data
    view.verify()
    assert view.rows() == where


def test_a_small_index_is_read_whole_in_its_first_bytes() -> None:
    data, where = _index(2, rows=200)
    assert len(data) < packindex.INDEX_HEAD
    read = _Counting(data)
    view = packindex.IndexView(data, check=False, read=read)
    assert all(view.find(bytes.fromhex(x)) == where[x] for x in where)
    assert read.reads == 0


def test_a_ranged_view_checks_the_whole_index_before_a_verdict_on_it() -> None:
    data, where = _index(2)
    victim = sorted(where)[ROWS // 2]
    at = data.find(bytes.fromhex(victim))
    damaged = bytearray(data)
    damaged[at + 31] ^= 1  # the row's id: a lookup misses it
    view = packindex.IndexView(bytes(damaged[:packindex.INDEX_HEAD]), check=False, read=_Counting(bytes(damaged)))
    assert view.find(bytes.fromhex(victim)) is None
    with pytest.raises(castore.IntegrityError, match="check does not match"):
        view.verify()  # what a reader does before it trusts the miss
    # cut short: a window past the end is damage, not a miss
    cut = data[:len(data) // 2]
    view = packindex.IndexView(cut[:packindex.INDEX_HEAD], check=False, read=_Counting(cut))
    with pytest.raises(castore.IntegrityError, match="cut short"):
        for oid in sorted(where)[ROWS // 2 + 100:]:
            view.find(bytes.fromhex(oid))
    # longer than its header declares: its windows read fine, its check does not
    longer = data + b"\0" * 44
    view = packindex.IndexView(longer[:packindex.INDEX_HEAD], check=False, read=_Counting(longer))
    assert view.find(bytes.fromhex(victim)) == where[victim]
    with pytest.raises(castore.IntegrityError, match="declares"):
        view.verify()


class CountingStorage(LocalStorage):
    """Local disk, counting the bytes read from pack indexes (whole reads and ranges) and
    the ranged reads of each."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.index_bytes = 0
        self.whole: list[str] = []
        self.ranges: Counter[str] = Counter()  # index key -> ranged reads (its head's included)
        self.range_bytes: Counter[str] = Counter()  # index key -> the bytes they read

    def read(self, key: str) -> bytes:
        got = super().read(key)
        self.whole.append(key)
        if key.endswith(packs.INDEX_SUFFIX):
            self.index_bytes += len(got)
        return got

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        got = super().read_range(key, offset, size)
        if key.endswith(packs.INDEX_SUFFIX):
            self.index_bytes += len(got)
            self.ranges[key] += 1
            self.range_bytes[key] += len(got)
        return got


N = 120


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    url = str(tmp_path_factory.mktemp("ranges") / "st")
    with castore.open(url, format=2, durable=False) as st:
        s = st.session("app", "u", "s")
        ids = [s.append(castore.Message(role="user", content=f"{i} " + os.urandom(300).hex()),
                        state_delta={"turn": i}) for i in range(N)]
    with castore.open(url) as st:  # the writer's log sealed, now merged: one pack of blocks
        maintenance.repack(st, all_packs=True)
    assert [p.name[:2] for p in Path(url, "packs").glob("*.idx")] == ["r-"]
    return url, ids


def _sizes(url: str) -> int:
    return sum(p.stat().st_size for p in Path(url, "packs").glob("*.idx"))


def test_a_fresh_reader_at_the_middle_reads_a_few_windows_of_each_index(
        store: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, ids = store
    # this store's indexes are small: read them by range (a read of one costs as much as a
    # window's: here, as if only the bytes counted)
    monkeypatch.setattr(packindex, "INDEX_HEAD", 256, raising=False)
    monkeypatch.setattr(packindex, "INDEX_READ_COST", 0)
    storage = CountingStorage(url)
    with castore.Store(storage) as st:
        assert st.session("app", "u", "s").state(ids[N // 2], scopes=False)["turn"] == N // 2
    total = _sizes(url)
    assert 0 < storage.index_bytes < total / 2, (storage.index_bytes, total)
    storage = CountingStorage(url)
    with castore.Store(storage) as st:  # a miss reads every index whole (its check first)
        assert not st.objects.contains("0" * 64)
    assert storage.index_bytes >= total


def _four_packs(url: str) -> None:
    """Four sessions, each written by a handle of its own into a log of its own, each log then
    repacked alone: four packs of blocks, and hints naming the logs (gone), so a reader
    lists the packs and searches all four indexes for what it reads."""
    for k in range(4):
        with castore.open(url, format=2, durable=False, auto_repack=False) as st:
            st.session("app", "u", f"s{k}").append_many(
                [castore.Message(role="user", content=f"{k} {i} " + os.urandom(100).hex()) for i in range(300)])
    for log in sorted(p.stem for p in Path(url, "packs").glob("w-*.pack")):
        with castore.open(url, auto_repack=False) as st:
            st.objects.packmap.refresh()
            assert st.objects.repacker.merge_packs([log])
    assert sorted(p.name[:2] for p in Path(url, "packs").glob("*.idx")) == ["r-"] * 4


def test_a_fresh_reader_of_a_session_searches_the_index_that_holds_it_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "st")
    _four_packs(url)
    monkeypatch.setattr(packindex, "INDEX_HEAD", 256)  # small indexes: read them by range
    for k in range(4):
        storage = CountingStorage(url)
        with castore.Store(storage) as st:
            log = st.session("app", "u", f"s{k}").log(limit=20)
            assert [e.entry.content.split()[:2] for e in log] == [[str(k), str(i)] for i in range(299, 279, -1)]
        # the others: their head, and at most the window of the first lookup's miss (searched
        # by name, the order listed, every lookup missed in each index before the right one:
        # a window each, then each index whole)
        right = max(storage.ranges, key=storage.ranges.__getitem__)
        for key, reads in storage.ranges.items():
            if key != right:
                assert reads <= 2, storage.ranges
                assert storage.range_bytes[key] < Path(url, key).stat().st_size / 2, storage.range_bytes


def test_the_small_packs_of_a_process_per_turn_cost_the_large_indexes_no_search(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # beside the four packs, five turns of s0, each by a process of its own (a handle opened,
    # one append, closed): five small packs holding the session's newest entries
    url = str(tmp_path / "st")
    _four_packs(url)
    for i in range(300, 305):
        # (a durable handle's close repacks its log; auto_repack off: the close would merge
        # these nine packs, more than AUTO_PACK_LIMIT that the geometric rule picks)
        with castore.open(url, format=3, auto_repack=False) as st:
            st.session("app", "u", "s0").append(castore.Message(role="user", content=f"0 {i} turn"))
    assert len(list(Path(url, "packs").glob("*.idx"))) == 9
    # the four large ones read by range, and kept so (as if a read cost only its bytes), as
    # the indexes of a long session are
    monkeypatch.setattr(packindex, "INDEX_HEAD", 256)
    monkeypatch.setattr(packindex, "INDEX_READ_COST", 0)
    missed: list[int] = []  # rows of each index read by range that a lookup missed in
    small: list[int] = []  # rows of each small index searched
    real = packindex.IndexView.find

    def find(self: packindex.IndexView, raw: bytes) -> packs.Place | None:
        got = real(self, raw)
        if got is None and not self.held:
            missed.append(self.count)
        if self.count <= packmap.SMALL_INDEX_ROWS:
            small.append(self.count)
        return got

    monkeypatch.setattr(packindex.IndexView, "find", find)
    with castore.open(url) as st:
        log = st.session("app", "u", "s0").log(limit=20)
    assert [e.entry.content.split()[1] for e in log] == [str(i) for i in range(304, 284, -1)]
    # the small packs' rows are mapped when loaded, and the indexes held whole are searched
    # before those read by range: a ranged index misses at most once each (the first lookup)
    assert len(missed) <= 3, missed
    assert small == []


def _damage(url: str, edit: str) -> str:
    idx = max(Path(url, "packs").glob("*.idx"), key=lambda p: p.stat().st_size)
    data = bytearray(idx.read_bytes())
    view = packindex.IndexView(bytes(data))
    victim = sorted(view.rows())[view.count // 2]
    at = data.find(bytes.fromhex(victim))
    if edit == "id":
        data[at + 31] ^= 0x01  # a lookup misses it
    elif edit == "span":
        start = int.from_bytes(data[at + 36:at + 40], "big")
        data[at + 36:at + 40] = (start + 1).to_bytes(4, "big")  # a lookup finds other bytes
    else:  # "cut": the index cut short past the victim's row
        del data[at + 44:]
    idx.write_bytes(bytes(data))
    return victim


@pytest.mark.parametrize("edit", ["id", "span", "cut"])
def test_a_damaged_index_read_by_range_is_dropped_and_its_pack_scanned(
        store: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    url = str(tmp_path / "copy")
    shutil.copytree(store[0], url)
    victim = _damage(url, edit)
    monkeypatch.setattr(packindex, "INDEX_HEAD", 256)
    with castore.open(url) as st:
        obj = st.objects.get(victim)
        assert castore.objects.encode(obj)[0] == victim
    with castore.open(url) as st:
        s = st.session("app", "u", "s")
        assert [m.content.split()[0] for m in s.messages()] == [str(i) for i in range(N)]
        assert s.state(store[1][N // 2], scopes=False)["turn"] == N // 2
        assert maintenance.fsck(st).ok


def test_the_retrying_wrapper_reads_a_range_not_the_whole_file(tmp_path: Path) -> None:
    inner = CountingStorage(str(tmp_path))
    inner.write("packs/x.pack", bytes(range(256)) * 64)
    st = RetryingStorage(inner)  # what open_storage wraps an S3 store in
    assert st.read_range("packs/x.pack", 300, 10) == (bytes(range(256)) * 64)[300:310]
    assert st.read_heads(["packs/x.pack"], 5) == {"packs/x.pack": bytes(range(5))}
    assert inner.whole == []  # the inner backend's ranged read (a ranged GET on S3), not a whole GET


def test_one_object_of_a_repacked_block_is_decompressed_only_up_to_it(
        store: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, ids = store
    with castore.open(url) as st:
        st.objects.get(ids[3])
        hit = st.objects.packmap.locate(ids[3])
        assert hit is not None
        block = f"record at {hit[1].offset} of pack {hit[0]}"  # the one block of entries
    whole: list[int] = []
    real = castore.objects.unframe

    def counting(stored: bytes | memoryview, what: str = "frame", *limit: int) -> bytes:
        out = real(stored, what, *limit)
        if what == block:  # decompressed whole (the path's index is in a block of its own)
            whole.append(len(out))
        return out

    monkeypatch.setattr(castore.objects, "unframe", counting)
    with castore.open(url) as st:
        c = st.objects.get(ids[3])  # near the start of the one block: its prefix only
        assert castore.objects.encode(c)[0] == ids[3]
        assert whole == []
        assert st.session("app", "u", "s").state(ids[4], scopes=False)["turn"] == 4
        assert whole == []
        # the rest of the block, read on from where the first reader stopped
        assert [m.content.split()[0] for m in st.session("app", "u", "s").messages()] == [str(i) for i in range(N)]
        assert whole == []
    with castore.open(url) as st:  # the last commit: with the commits, at the start of the block
        last = st.objects.get(ids[-1])
        assert castore.objects.encode(last)[0] == ids[-1]
        assert whole == []
    with castore.open(url) as st:  # an object in the block's second half (a body): the block in one call
        body = castore.objects.hex_id(last.body)
        assert castore.objects.encode(st.objects.get(body))[0] == body
        assert whole


def test_the_state_at_the_middle_decodes_only_the_commits_and_trees_of_its_block(
        store: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    url, ids = store
    asked: list[tuple[int, int]] = []
    real = castore.objects.BlockPrefix.upto

    def upto(self: castore.objects.BlockPrefix, n: int) -> bytes:
        asked.append((n, self.size))
        return real(self, n)

    monkeypatch.setattr(castore.objects.BlockPrefix, "upto", upto)
    with castore.open(url) as st:
        assert st.session("app", "u", "s").state(ids[N // 2], scopes=False)["turn"] == N // 2
    # a repacked block starts with its commits and trees (docs/FORMAT.md, 4): the rest of it,
    # the bodies and the segment that copies them, is not decoded
    assert asked and all(n * 4 < size for n, size in asked), asked


def test_a_block_prefix_is_the_start_of_the_frame_and_damage_is_caught() -> None:
    content = b"".join(f"{i:08d} ".encode() * 40 for i in range(2000))  # ~720 KB, several zstd blocks
    frame = castore.objects.frame_block(content, 9)
    p = castore.objects.BlockPrefix(frame, "block")
    first = p.upto(100)
    assert content.startswith(first) and 100 <= len(first) < len(content)
    assert p.upto(300_000) == content[:len(p.upto(300_000))] and len(p.data) >= 300_000
    assert p.upto(10 << 20) == content
    assert p.upto(10 << 20) == content  # read whole: its context went back, its content stays
    closed = castore.objects.BlockPrefix(frame, "block")
    head = closed.upto(100)
    closed.close()
    closed.close()
    assert closed.upto(len(head)) == head
    more = closed.upto(200_000)  # closed before (another reader evicted it): from the start again
    assert len(more) >= 200_000 and content.startswith(more)
    assert closed.upto(10 << 20) == content
    bad = bytearray(frame)
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(castore.IntegrityError):
        castore.objects.BlockPrefix(bytes(bad), "block").upto(10 << 20)
    with pytest.raises(castore.IntegrityError, match="ends at"):
        castore.objects.BlockPrefix(frame[:len(frame) // 2], "block").upto(10 << 20)
    with pytest.raises(castore.IntegrityError, match="not a plain zstd frame"):
        castore.objects.BlockPrefix(b"\x00" + content, "block")


def test_a_header_declaring_a_huge_index_reads_only_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    data, where = _index(2)
    lying = bytearray(data)
    lying[20:24] = (0xFFFFFFFF).to_bytes(4, "big")  # count: ~190 GB of rows
    read = _Counting(bytes(lying))
    monkeypatch.setattr(packindex, "INDEX_CHUNK", 1 << 20)
    view = packindex.IndexView(bytes(lying[:packindex.INDEX_HEAD]), check=False, read=read)
    with pytest.raises(castore.IntegrityError, match="declares"):
        view.verify()
    assert read.bytes == len(data)  # read in chunks up to the file's end, nothing allocated past it
