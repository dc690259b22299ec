"""Where a repack puts what a fresh read of a session's last entries needs (docs/FORMAT.md,
4 and 8): blocks of about BLOCK_BYTES even when one append wrote many entries, the paths'
indexes in blocks of their own, and each object at its first copy."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import castore
from castore import maintenance
from castore import objects as o
from castore.objectstore import packs
from castore.objectstore.repack import BLOCK_BYTES, INDEX_BLOCK_BYTES


def _messages(lo: int, hi: int) -> list[castore.Message]:
    rng = random.Random(lo)
    words = [f"w{i}" for i in range(2000)]  # ~500 bytes of prose-like text each
    return [castore.Message(role="user", content=f"{i}: " + " ".join(
        words[min(int(rng.paretovariate(1.1)) - 1, 1999)] for _ in range(80))) for i in range(lo, hi)]


def _repacked(root: Path, n: int, batch: int) -> castore.Store:
    """A store of one session of ``n`` entries written ``batch`` per append, merged into one pack."""
    st = castore.open(str(root), auto_repack=False, durable=False)
    s = st.session("app", "u", "s")
    for lo in range(0, n, batch):
        s.append_many(_messages(lo, min(n, lo + batch)))
    st.close()
    st = castore.open(str(root), auto_repack=False)
    assert st.objects.merge_packs(st.objects.pack_names()) is not None
    return st


def _blocks(root: Path) -> Iterator[tuple[int, list[str]]]:
    """(content bytes, kinds of its objects) of every record of every pack under ``root``."""
    for p in sorted((root / "packs").glob("*.pack")):
        for _, _, payload in packs.payloads(p.read_bytes()):
            content = packs.record_content(payload, "test")
            yield len(content), [o.kind_tag(content[a:a + 5]) for a, _ in packs.content_spans(content)]


def test_one_append_of_many_entries_is_cut_into_blocks_after_its_segments(tmp_path: Path) -> None:
    st = _repacked(tmp_path, 1200, 1200)
    blocks = [(size, kinds) for size, kinds in _blocks(tmp_path) if "c" in kinds]
    # before: the append was one group, so one block of all 1,200 entries (1.9 MB of content)
    assert len(blocks) >= 4, [size for size, _ in blocks]
    assert all(size < 4 * BLOCK_BYTES for size, _ in blocks[:-1]), [size for size, _ in blocks]
    assert all("s" in kinds for _, kinds in blocks[:-1])  # a block ends after a segment
    assert [m.content for m in st.session("app", "u", "s").messages()] == [m.content for m in _messages(0, 1200)]
    assert maintenance.fsck(st).ok
    st.close()


def test_a_repack_writes_the_indexes_in_blocks_of_their_own(tmp_path: Path) -> None:
    st = _repacked(tmp_path, 1200, 300)
    blocks = list(_blocks(tmp_path))
    index_blocks = [(size, kinds) for size, kinds in blocks if "i" in kinds]
    assert index_blocks and all(set(kinds) == {"i"} for _, kinds in index_blocks), blocks
    assert all(size <= INDEX_BLOCK_BYTES for size, kinds in index_blocks if len(kinds) > 1)
    assert len(st.session("app", "u", "s").log(limit=5)) == 5
    st.close()


def test_a_fresh_read_of_the_last_entries_decompresses_about_one_block(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _repacked(tmp_path, 2000, 500).close()
    got: list[int] = []
    real = packs.record_content

    def counted(payload: bytes | memoryview, what: str, codec: o.Codec = o.PLAIN) -> bytes:
        content = real(payload, what, codec)
        got.append(len(content))
        return content

    monkeypatch.setattr(packs, "record_content", counted)
    with castore.open(str(tmp_path)) as st:
        assert len(st.session("app", "u", "s").context(max_tokens=2000)) > 0
    # before: the last append's 500 entries were one block of 478 KB, decompressed whole;
    # now the block of its last segment and the entries after it, and a block of indexes
    assert sum(got) < 3 * BLOCK_BYTES // 2, got


def test_a_scan_places_an_object_written_twice_at_its_first_copy() -> None:
    shared = o.encode(o.Value({"text": "the same body in two sessions"}))
    a, b = o.encode(o.Value({"n": 1})), o.encode(o.Value({"n": 2}))
    first, w1 = packs.encode_record_v2([a, shared], packs.HEADER_SIZE)
    second, _ = packs.encode_record_v2([b, shared], packs.HEADER_SIZE + len(first))
    where, _ = packs.scan(packs.PACK_MAGIC_V2 + first + second)
    # before: the second copy, so a repack put the body in the block of the append that
    # repeated it, apart from the commits of the one that wrote it first
    assert where[shared[0]] == w1[shared[0]]


def test_a_merge_takes_a_repacked_pack_before_a_log_written_after_its_objects(tmp_path: Path) -> None:
    import os
    import time

    url = str(tmp_path)
    with castore.open(url, format=2, auto_repack=False) as st:
        first = st.session("app", "u", "s").append_many(_messages(0, 100))
    with castore.open(url, format=2, auto_repack=False) as st:
        older = st.objects.merge_packs(st.objects.pack_names())
        assert older is not None
    with castore.open(url, format=2, auto_repack=False) as st:
        second = st.session("app", "u", "s").append_many(_messages(100, 200))
    log = next(p for p in (tmp_path / "packs").glob("w-*.pack"))
    now = time.time()
    os.utime(log, (now + 50, now + 50))  # the log was sealed while a repack ran ...
    os.utime(tmp_path / "packs" / f"{older}.pack", (now + 100, now + 100))  # ... which wrote its pack after it
    with castore.open(url, format=2, auto_repack=False) as st:
        new = st.objects.merge_packs(st.objects.pack_names())
    where, _ = packs.scan((tmp_path / "packs" / f"{new}.pack").read_bytes())
    # before: by mtime alone, the log's newer entries went first, apart from the ones they follow
    assert where[first[-1]][::2] < where[second[0]][::2]  # (record, place in it)
