"""The dictionary codec (header byte 0x02): choice, round trips, old codecs, the pinned dictionary, damage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import layout
import pytest
import zstandard
from blake3 import blake3
from helpers.threads import run_threads
from hypothesis import given, settings
from hypothesis import strategies as st

import castore
from castore import frames, zdict
from castore import objects as o
from castore.errors import IntegrityError

GOLDEN_DIR = Path(__file__).parent / "golden"
sys.path.insert(0, str(GOLDEN_DIR))

import make_golden  # noqa: E402 - found through the path set just above

#: the format-1 dictionary's digest, pinned here as well as in objects.py: editing the
#: dictionary and objects.py together still fails this file
FORMAT1_ZDICT_BLAKE3 = "fd841db6a0db4799db66e718d7b3dc02406ca0df73e6b2bf81516e2c1a6d1461"

#: stored frames written by the first writer of the 0x02 codec (zstd 1.5.7, level 5): every
#: later reader must decode them to the golden canonical bytes, whatever its zstd makes today
FORMAT1_DICT_FRAMES = {
    "commit-full": "02604d0025030064038d030405a463697479a74265696a696e67a16e01a5756e73657491a48106d954fc4010"
                   "0000a56770742d78a2696e0aa36f757414070711fcf82464e4c610d7a148a9df2685b5fb3f6822be66496103"
                   "ef57f47b9ea257bfc0aace196fe48e8a153801",
    "commit-merge": "02208b050100808592c42008c420090aa564657074684605fcf8643d5a8cd4c3656e6618711b",
    "tree-state": "02207a950100e8a463697479a74265696a696e6703a7686973746f7279c4200161c42002063c78a964575a809f2"
                  "7d2323b2be9d51ca94a10",
    "value-message": "022032ed000080b357656120696e204265696a696e673f033c3250e9888d4072147180",
    "index-two": "022053d500006069a873656792c4200bc4200c04fc001be14cb3d6464e783ce0",
}


def typical_commit() -> o.Commit:
    """A commit as a session writes it: random ids, an author, a time, a model and its usage."""
    return o.Commit(kind="event", parents=(os.urandom(32),), body=os.urandom(32), state=os.urandom(32),
                    delta={"status": "ok", "step": 3}, author="agent", time=1764478000.123456,
                    meta={"model": "model-a", "usage": {"input_tokens": 1234, "output_tokens": 56}}, depth=41)


def plain_zstd_frame(canonical: bytes) -> bytes:
    """A 0x01 object exactly as the writer before the dictionary made it (zstd level 3)."""
    return b"\x01" + zstandard.ZstdCompressor(level=3).compress(canonical)


# -- the dictionary is the format -------------------------------------------------------------


def test_the_dictionary_bytes_match_the_digest_objects_py_pins():
    assert blake3(zdict.ZDICT).hexdigest() == o.ZDICT_BLAKE3
    assert o.ZDICT_BLAKE3 == FORMAT1_ZDICT_BLAKE3, "the format-1 dictionary changed: 0x02 objects would not read"
    assert 4096 <= len(zdict.ZDICT) <= 16384


def test_importing_castore_with_another_dictionary_fails_with_a_clear_message():
    code = (
        "import sys, types\n"
        "fake = types.ModuleType('castore.zdict'); fake.ZDICT = b'not the dictionary'\n"
        "sys.modules['castore.zdict'] = fake\n"
        "import castore.objects\n"  # the codec is loaded on first use, not by import castore
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode != 0
    assert "FormatError" in out.stderr
    assert "castore/zdict.py does not hold the format-1 zstd dictionary" in out.stderr
    assert o.ZDICT_BLAKE3 in out.stderr


@pytest.mark.parametrize("name", sorted(FORMAT1_DICT_FRAMES))
def test_dictionary_frames_written_by_the_first_writer_still_read(name):
    oid, canonical = o.encode(make_golden.golden_objects()[name])
    assert o.from_stored(oid, bytes.fromhex(FORMAT1_DICT_FRAMES[name])) == canonical


# -- which codec the writer picks -------------------------------------------------------------


def test_a_typical_commit_is_stored_with_the_dictionary_and_much_smaller():
    oid, canonical = o.encode(typical_commit())
    stored = o.to_stored(canonical)
    assert stored[:1] == b"\x02"
    assert len(stored) < 0.7 * len(plain_zstd_frame(canonical))
    assert len(stored) < 0.7 * len(canonical)
    assert o.from_stored(oid, stored) == canonical


def test_a_small_state_tree_shrinks_with_the_dictionary():
    oid, canonical = o.encode(o.Tree(values={"step": ["msgpack", b"\x02"]}, sub={"messages": os.urandom(32)}))
    assert len(canonical) < 128  # the old codec never tried objects this small
    stored = o.to_stored(canonical)
    assert stored[:1] == b"\x02" and len(stored) < len(canonical)
    assert o.from_stored(oid, stored) == canonical


def test_objects_below_compress_min_are_not_compressed():
    _, canonical = o.encode(o.Value("x" * (o.COMPRESS_MIN - 13)))
    assert len(canonical) < o.COMPRESS_MIN
    assert o.to_stored(canonical) == b"\x00" + canonical


def test_objects_above_dict_max_use_plain_zstd_and_up_to_it_the_dictionary():
    for n, head in ((o.DICT_MAX, b"\x02"), (o.DICT_MAX + 1, b"\x01")):
        canonical = (b"lorem ipsum dolor " * (n // 18 + 1))[:n]  # framing takes any bytes
        stored = o.to_stored(canonical)
        assert stored[:1] == head, n
        assert o.from_stored(o.digest(canonical), stored) == canonical


def test_compress_false_stores_raw():
    _, canonical = o.encode(typical_commit())
    assert o.to_stored(canonical, compress=False) == b"\x00" + canonical


@pytest.mark.parametrize("name", sorted(make_golden.golden_objects()))
def test_every_golden_object_round_trips_through_the_writer(name):
    oid, canonical = o.encode(make_golden.golden_objects()[name])
    back = o.from_stored(oid, o.to_stored(canonical))
    assert back == canonical
    assert o.decode(oid, back) == make_golden.golden_objects()[name]


def test_every_object_kind_round_trips_and_small_ones_take_the_dictionary():
    def rid() -> bytes:
        return os.urandom(32)

    objs = [
        o.Blob(b"hello " * 40),
        o.Value({"role": "assistant", "content": "ok", "tool_calls": [{"id": "call_1", "type": "function"}]}),
        o.Tree(values={"status": "ok", "step": 3, "mode": "x"}, refs={"notes": rid()}, sub={"a": rid()}),
        typical_commit(),
        o.Segment(start=64, objects=tuple(o.encode(typical_commit())[1] for _ in range(4))),
        o.Index(segments=(rid(), rid(), rid())),
    ]
    for obj in objs:
        oid, canonical = o.encode(obj)
        stored = o.to_stored(canonical)
        assert o.decode(oid, o.from_stored(oid, stored)) == obj
        if not isinstance(obj, o.Index):  # three random ids do not compress
            assert stored[:1] == b"\x02", type(obj).__name__


# -- every codec reads, forever ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["commit-full", "value-nested", "blob-binary", "segment", "tree-empty"])
def test_the_three_codecs_all_decode(name):
    oid, canonical = o.encode(make_golden.golden_objects()[name])
    raw = b"\x00" + canonical
    plain = plain_zstd_frame(canonical)
    d = zstandard.ZstdCompressionDict(zdict.ZDICT, dict_type=zstandard.DICT_TYPE_FULLDICT)
    by_hand = zstandard.ZstdCompressor(dict_data=d, compression_params=zstandard.ZstdCompressionParameters.from_level(
        3, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=1, write_checksum=0, write_dict_id=0))
    dict_frame = b"\x02" + by_hand.compress(canonical)
    for stored in (raw, plain, dict_frame, o.to_stored(canonical)):
        assert o.from_stored(oid, stored) == canonical


def test_a_store_writes_commits_with_the_dictionary_and_reads_them_back(tmp_path):
    # format 1: each object its own frame (format 2 compresses a whole pack record as one
    # frame with the same dictionary: tests/test_packs_v2.py)
    st = castore.open(str(tmp_path), format=1)
    s = st.session("app", "u", "s1")
    cid = s.append(castore.Message(role="user", content="hello"))
    assert (layout.stored(st, cid) or b"")[:1] == b"\x02"
    assert castore.open(str(tmp_path)).session("app", "u", "s1").messages()[0].content == "hello"


@settings(max_examples=100, deadline=None)  # 300 took ~13 s; 100 still covers all three shapes
@given(st.one_of(st.binary(max_size=300), st.binary(min_size=o.DICT_MAX - 50, max_size=o.DICT_MAX + 50),
                 st.text(max_size=2000).map(str.encode)))
def test_stored_is_never_more_than_one_byte_longer_than_raw(data):
    oid, canonical = o.encode(o.Blob(data))
    stored = o.to_stored(canonical)
    assert len(stored) <= len(canonical) + 1
    assert o.from_stored(oid, stored) == canonical


def test_incompressible_small_objects_are_stored_raw():
    _, canonical = o.encode(o.Blob(os.urandom(1000)))
    assert o.to_stored(canonical) == b"\x00" + canonical


def test_threads_compress_and_decompress_at_once():
    objs = [o.encode(o.Value({"n": i, "text": f"message {i} " * (i % 50)}))[1] for i in range(200)]

    def work() -> None:
        for _ in range(5):
            for c in objs:
                assert o.from_stored(o.digest(c), o.to_stored(c)) == c

    errors = run_threads(*[work] * 8, together=True)
    assert not errors, errors


# -- damage -----------------------------------------------------------------------------------


def _dict_stored() -> tuple[str, bytes, bytes]:
    oid, canonical = o.encode(typical_commit())
    stored = o.to_stored(canonical)
    assert stored[:1] == b"\x02"
    return oid, canonical, stored


@pytest.mark.parametrize(
    "mangle",
    [
        lambda s: s[: len(s) // 2] + bytes([s[len(s) // 2] ^ 0x40]) + s[len(s) // 2 + 1 :],
        lambda s: s[: len(s) // 2],
        lambda s: s[:3],
        lambda s: s[:1],
        lambda s: s[:-1],
        lambda s: s + b"\x00",
    ],
    ids=["flipped", "half", "header-only", "no-frame", "last-byte-cut", "trailing-byte"],
)
def test_a_damaged_dictionary_frame_raises_integrity_error_naming_the_id(mangle):
    oid, _, stored = _dict_stored()
    with pytest.raises(IntegrityError) as ei:
        o.from_stored(oid, mangle(stored))
    assert ei.value.object_id == oid
    assert oid in str(ei.value)


@pytest.mark.parametrize("head", [b"\x01", b"\x02"])
def test_bytes_after_the_frame_are_refused(head):
    oid, canonical, stored = _dict_stored()
    frame = plain_zstd_frame(canonical)[1:] if head == b"\x01" else stored[1:]
    assert o.from_stored(oid, head + frame) == canonical
    with pytest.raises(IntegrityError, match="unused data") as ei:
        o.from_stored(oid, head + frame + b"\x00")
    assert ei.value.object_id == oid


def test_a_plain_zstd_frame_under_the_dictionary_header_is_refused():
    oid, canonical, _ = _dict_stored()
    with pytest.raises(IntegrityError) as ei:
        o.from_stored(oid, b"\x02" + plain_zstd_frame(canonical)[1:])
    assert ei.value.object_id == oid


def test_a_dictionary_frame_declaring_a_huge_or_no_size_is_refused_before_decompressing():
    oid, canonical, stored = _dict_stored()
    body = stored[1:]
    fhd = body[0]
    # magicless frame: frame header descriptor, then (single segment) the content size field
    assert fhd & 0x20, "single-segment frame expected"
    fcs_len = {0: 1, 1: 2, 2: 4, 3: 8}[fhd >> 6]
    huge = bytes([0xC0 | (fhd & 0x3F)]) + (1 << 62).to_bytes(8, "little") + body[1 + fcs_len :]
    assert zstandard.frame_content_size(frames._ZSTD_MAGIC + huge) == 1 << 62
    with pytest.raises(IntegrityError, match="declares") as ei:
        o.from_stored(oid, b"\x02" + huge)
    assert ei.value.object_id == oid and oid in str(ei.value)
    d = zstandard.ZstdCompressionDict(zdict.ZDICT, dict_type=zstandard.DICT_TYPE_FULLDICT)
    no_size = zstandard.ZstdCompressor(dict_data=d, compression_params=zstandard.ZstdCompressionParameters.from_level(
        3, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=0, write_dict_id=0)).compress(canonical)
    with pytest.raises(IntegrityError, match="declares -1 bytes"):
        o.from_stored(oid, b"\x02" + no_size)
