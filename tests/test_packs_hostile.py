"""Hostile packs (issue 37, items 5 and 7): what a record may declare is bounded by what
castore writes, a scan holds one record's content at a time, and resynchronising past
damaged records costs work linear in the pack's size (counted, never timed)."""

from __future__ import annotations

import functools
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import Backend, backend_on

import castore
from castore import objects as o
from castore import sync
from castore.maintenance import fsck
from castore.objectstore import packs
from castore.objectstore.packs import pack_key

backend = backend_on("local", "s3")

MiB = 1 << 20
#: what the tests take a record to hold at most (written, and read), and the work a scan
#: may do per byte of a pack; literals so that the tests run (and fail) on a castore that
#: has no such bounds; the first test checks them against the module's
WRITE_MAX, READ_MAX, WORK = 16 * MiB, 64 * MiB, 6


def test_the_bounds_are_the_ones_these_tests_assume() -> None:
    assert (packs.RECORD_CONTENT_MAX, packs.RECORD_CONTENT_READ_MAX) == (WRITE_MAX, READ_MAX)
    assert packs.RESYNC_WORK + 2 <= WORK


def _declared(payload: bytes) -> int:
    return int(zstandard.frame_content_size(payload[1:]))


@functools.lru_cache(maxsize=4)
def _bomb_payload(declared: int) -> bytes:
    """A version-2 record payload (plain zstd, header 0x01) whose content is one object of
    zeros, ``declared`` bytes in all: a few KB that decompress to ``declared`` bytes."""
    c = zstandard.ZstdCompressor(level=3, write_content_size=True)
    out = [b"\x01"]
    obj = c.compressobj(size=declared)
    out.append(obj.compress(struct.pack(">I", declared - 4)))
    zero = bytes(MiB)
    left = declared - 4
    while left:
        n = min(left, MiB)
        out.append(obj.compress(zero[:n]))
        left -= n
    out.append(obj.flush())
    return b"".join(out)


def _record(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + o.checksum(payload) + payload


def _honest(at: int, tag: str) -> tuple[bytes, list[str]]:
    objs = [(o.digest(c), c) for c in (f"{tag} {k} ".encode() * 20 for k in range(3))]
    rec, where = packs.encode_record_v2(objs, at)
    return rec, list(where)


def _pack(payloads: list[bytes]) -> tuple[bytes, list[str], list[str]]:
    """An honest record, the given records, an honest record: (pack, first ids, last ids)."""
    data = bytearray(packs.PACK_MAGIC_V2)
    rec, first = _honest(len(data), "first")
    data += rec
    for p in payloads:
        data += _record(p)
    rec, last = _honest(len(data), "last")
    data += rec
    return bytes(data), first, last


def _peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_record_declaring_more_than_castore_writes_is_refused_undecompressed() -> None:
    bomb = _bomb_payload(READ_MAX + MiB)
    assert len(bomb) < 64 << 10 and _declared(bomb) == READ_MAX + MiB
    data, first, last = _pack([bomb, bomb, bomb])
    damaged: list[tuple[int, int]] = []
    (where, end), peak = _peak(lambda: packs.scan(data, damaged=damaged))
    assert set(where) == set(first) | set(last) and end == len(data)  # the good records stay readable
    assert len(damaged) == 3  # each bomb is a damaged record, named by fsck
    assert peak < 8 * MiB, peak
    with pytest.raises(castore.IntegrityError, match="declares"):
        packs.record_content(bomb, "bomb")


def test_a_scan_holds_one_record_at_a_time(tmp_path: Path) -> None:
    """Records within the bound, each decompressing to 40 MiB: the store's scan of the pack
    hands each to the content cache, which keeps none that large (it used to hold them all
    at once, 4 x 40 MiB)."""
    size = 40 * MiB
    assert WRITE_MAX < size <= READ_MAX
    data, first, last = _pack([_bomb_payload(size) for _ in range(4)])
    with castore.Store.open(str(tmp_path / "s"), format=2) as st:
        st.init()
        st.storage.write(pack_key(packs.content_name("b", data)), data)
        _, peak = _peak(st.objects.refresh)
        assert all(st.objects.knows(i) for i in first + last)
    assert peak < 2 * size + 8 * MiB, peak


def test_writers_split_a_batch_into_records_within_the_bound(tmp_path: Path) -> None:
    with castore.Store.open(str(tmp_path / "s"), format=2) as st:
        st.init()
        objs = [o.Blob(bytes([k % 251]) * 3000 + k.to_bytes(4, "big")) for k in range(7000)]  # ~21 MB
        ids = st.objects.put_many(objs)
        name = st.objects.pack_names()[-1]
        data = st.storage.read(pack_key(name))
        declared = [_declared(bytes(p)) for _, _, p in packs.payloads(data)]
        assert len(declared) >= 2 and max(declared) <= WRITE_MAX, declared
    with castore.Store.open(str(tmp_path / "s")) as st:
        assert [st.objects.get(i) for i in ids] == objs


@pytest.fixture
def bombed(backend: Backend) -> Iterator[Backend]:
    """A store with an honest session and a 49 KB pack whose records declare 512 MiB each."""
    with backend.open() as st:
        st.session("app", "u", "s").append(castore.Message(role="user", content="hello"))
        data, _, _ = _pack([_bomb_payload(512 * MiB) for _ in range(3)])
        st.storage.write(pack_key(packs.content_name("b", data)), data)
    yield backend


def test_pull_and_fsck_of_a_store_with_a_bomb_pack_stay_small(bombed: Backend, tmp_path: Path) -> None:
    with bombed.open() as remote:
        report, peak = _peak(lambda: fsck(remote))
        assert not report.ok and len(report.damaged_records) == 3
        assert peak < 64 * MiB, peak
    dest = str(tmp_path / "clone")
    report, peak = _peak(lambda: sync.clone(bombed.url, dest, **bombed.options))
    assert report.ok and peak < 64 * MiB, peak
    with castore.open(dest) as local:
        assert [m.content for m in local.session("app", "u", "s").messages()] == ["hello"]
        assert fsck(local).ok


def _crafted(region: int) -> bytes:
    """A pack whose middle is ``region`` bytes of which every fourth offset looks like a
    record header (a length that fits, a frame header byte) that fails only its checksum,
    each over ``region // 2`` bytes: a quadratic resync hashed all of them."""
    half = region // 2
    pattern = struct.pack(">I", half)  # 00 00 80 00: at every 4th offset a length of `half`
    data = bytearray(packs.PACK_MAGIC_V2)
    rec, _ = _honest(len(data), "first")
    data += rec
    data += pattern * (region // 4)
    rec, _ = _honest(len(data), "last")
    data += rec
    return bytes(data)


def _hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the bytes the record checks hash (the real checksum still runs)."""
    count = [0]
    real = o.checksum

    def counting(b: Any) -> bytes:
        count[0] += len(b)
        return real(b)

    monkeypatch.setattr(o, "checksum", counting)
    return count


@pytest.mark.parametrize("region", [64 << 10, 256 << 10])
def test_resync_past_a_crafted_region_is_linear(monkeypatch: pytest.MonkeyPatch, region: int) -> None:
    data = _crafted(region)
    count = _hashed(monkeypatch)
    damaged: list[tuple[int, int]] = []
    where, end = packs.scan(data, damaged=damaged)
    assert len(where) >= 3  # the first record's objects
    assert count[0] <= WORK * len(data), (count[0], len(data))
    count[0] = 0
    assert len(list(packs.payloads(data))) >= 1
    assert count[0] <= WORK * len(data), (count[0], len(data))


def test_resync_still_finds_the_record_after_honest_damage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Damage without crafted candidates (a record's length overwritten): the next record is
    found, and the work stays linear."""
    data = bytearray(packs.PACK_MAGIC_V2)
    starts, ids = [], []
    for k in range(6):
        starts.append(len(data))
        rec, w = _honest(len(data), f"r{k}")
        data += rec
        ids.append(w)
    data[starts[2]:starts[2] + 4] = b"\xff\xff\xff\x7f"  # record 2's length: past the end
    count = _hashed(monkeypatch)
    damaged: list[tuple[int, int]] = []
    where, end = packs.scan(bytes(data), damaged=damaged)
    assert damaged == [(starts[2], starts[3] - starts[2])] and end == len(data)
    assert set(where) == {i for k, w in enumerate(ids) if k != 2 for i in w}
    assert count[0] <= WORK * len(data)
