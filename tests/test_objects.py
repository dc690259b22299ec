"""The object format (format 1): golden ids, determinism, compatibility, framing, dedup."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import msgspec
import pytest
import zstandard
from helpers.threads import race
from hypothesis import given, settings
from hypothesis import strategies as st

from castore import frames
from castore import objects as o
from castore.errors import IntegrityError, InvalidEntry, ObjectNotFound
from castore.objectstore import ObjectStore, object_key
from castore.storage import open_storage

GOLDEN_DIR = Path(__file__).parent / "golden"
sys.path.insert(0, str(GOLDEN_DIR))

import make_golden  # noqa: E402

GOLDEN = json.loads((GOLDEN_DIR / "format1.json").read_text())
BY_NAME = {g["name"]: g for g in GOLDEN["objects"]}


# -- golden fixtures -------------------------------------------------------------------------


def test_golden_file_covers_every_object_kind():
    kinds = {g["type"] for g in GOLDEN["objects"]}
    assert kinds == {"Blob", "Value", "Tree", "Commit", "Segment", "Index"}
    assert GOLDEN["format"] == o.FORMAT == 1


def test_golden_file_lists_every_fixture_of_the_generator():
    assert set(BY_NAME) == set(make_golden.golden_objects())


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_golden_object_keeps_its_id_and_canonical_bytes(name):
    want = BY_NAME[name]
    oid, canonical = o.encode(make_golden.golden_objects()[name])
    assert canonical.hex() == want["canonical"], (
        f"{name}: canonical bytes changed; ids of stored objects would change (a new format version)"
    )
    assert oid == want["id"], f"{name}: id changed from {want['id']} to {oid}"


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_golden_bytes_hash_to_their_id_and_decode_to_the_object(name):
    want = BY_NAME[name]
    canonical = bytes.fromhex(want["canonical"])
    assert o.digest(canonical) == want["id"]
    obj = o.decode(want["id"], canonical)
    assert type(obj).__name__ == want["type"]
    assert obj == make_golden.golden_objects()[name]


def test_golden_stored_frames_of_both_kinds_verify():
    for g in GOLDEN["objects"]:
        canonical = bytes.fromhex(g["canonical"])
        for stored in (o.to_stored(canonical, compress=False), frames.ZSTD + zstandard.ZstdCompressor(level=3).compress(canonical)):
            assert o.from_stored(g["id"], stored) == canonical


def test_ids_are_64_lowercase_hex():
    for g in GOLDEN["objects"]:
        assert o.is_hex_id(g["id"])


# -- determinism and compatibility ------------------------------------------------------------


def test_dict_insertion_order_does_not_change_ids():
    a = {"b": 1, "a": {"y": 2, "x": [3, {"q": 1, "p": 2}]}, "c": None}
    b = {"c": None, "a": {"x": [3, {"p": 2, "q": 1}], "y": 2}, "b": 1}
    assert list(a) != list(b)
    assert o.encode(o.Value(a)) == o.encode(o.Value(b))
    assert o.encode(o.Tree(values=a)) == o.encode(o.Tree(values=b))
    assert o.encode(o.Commit(kind="m", delta=a, meta=b)) == o.encode(o.Commit(kind="m", delta=b, meta=a))
    assert o.pack(a) == o.pack(b)


def test_equal_values_give_equal_ids_across_processes():
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {str(GOLDEN_DIR)!r}); import make_golden; "
        "print(make_golden.golden()[5]['id'])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == make_golden.golden()[5]["id"]


def _with_extra_field(cls: type, tag: str) -> type:
    """``cls`` as a future version might define it: the same fields plus an optional one."""
    fields = [
        (f.encode_name, f.type, f.default if f.default is not msgspec.NODEFAULT else msgspec.NODEFAULT)
        if f.default_factory is msgspec.NODEFAULT
        else (f.encode_name, f.type, msgspec.field(default_factory=f.default_factory))
        for f in msgspec.structs.fields(cls)
    ]
    fields = [(n, t) if d is msgspec.NODEFAULT else (n, t, d) for n, t, d in fields]
    fields.append(("future", str, ""))
    return msgspec.defstruct(f"Future{cls.__name__}", fields, bases=(o._Object,), tag=tag, frozen=True)


@pytest.mark.parametrize("name", ["commit-full", "commit-root", "tree-state", "index-two", "segment", "value-message"])
def test_a_new_optional_field_at_its_default_keeps_every_id(name):
    obj = make_golden.golden_objects()[name]
    cls = type(obj)
    future_cls = _with_extra_field(cls, cls.__struct_config__.tag)
    future = future_cls(**{f: getattr(obj, f) for f in cls.__struct_fields__})
    assert o.encode(future) == o.encode(obj)
    assert o.encode(future)[0] == BY_NAME[name]["id"]


def test_todays_reader_ignores_a_field_added_by_a_future_writer():
    future_cls = _with_extra_field(o.Commit, "c")
    oid, canonical = o.encode(future_cls(kind="message", future="set"))
    assert oid != o.encode(o.Commit(kind="message"))[0]
    decoded = o.decode(oid, o.from_stored(oid, o.to_stored(canonical)))
    assert decoded == o.Commit(kind="message")


def test_the_kind_tag_is_short_and_not_the_class_name():
    for cls in (o.Blob, o.Value, o.Tree, o.Commit, o.Segment, o.Index):
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str) and len(tag) == 1


def test_an_unencodable_value_is_an_invalid_entry():
    with pytest.raises(InvalidEntry):
        o.encode(o.Value(object()))
    with pytest.raises(InvalidEntry):
        o.encode(o.Value(2**64))
    with pytest.raises(InvalidEntry):
        o.pack({1: {2, 3}})


def test_raw_id_refuses_what_is_not_an_id():
    assert o.raw_id("ab" * 32) == b"\xab" * 32
    for bad in ["", "ab" * 31, "zz" * 32, "ab" * 33]:
        with pytest.raises(InvalidEntry):
            o.raw_id(bad)


# -- framing ----------------------------------------------------------------------------------


def test_large_compressible_objects_are_stored_zstd_framed_and_round_trip():
    oid, canonical = o.encode(o.Blob(b"all work and no play " * 1000))
    assert len(canonical) > o.DICT_MAX  # smaller objects use the dictionary codec (test_zdict.py)
    stored = o.to_stored(canonical)
    assert stored[:1] == b"\x01"
    assert len(stored) < len(canonical) // 5
    assert o.from_stored(oid, stored) == canonical


def test_small_objects_are_stored_raw():
    oid, canonical = o.encode(o.Blob(b"hi"))
    stored = o.to_stored(canonical)
    assert stored == b"\x00" + canonical
    assert o.from_stored(oid, stored) == canonical


def test_incompressible_objects_are_stored_raw():
    oid, canonical = o.encode(o.Blob(os.urandom(4096)))
    assert o.to_stored(canonical)[:1] == b"\x00"


def test_the_id_does_not_depend_on_compression():
    oid, canonical = o.encode(o.Blob(b"x" * 10000))
    assert o.from_stored(oid, o.to_stored(canonical, compress=True)) == canonical
    assert o.from_stored(oid, o.to_stored(canonical, compress=False)) == canonical


@pytest.mark.parametrize(
    "mangle, reason",
    [
        (lambda s: s[: len(s) // 2] + bytes([s[len(s) // 2] ^ 1]) + s[len(s) // 2 + 1 :], ""),
        (lambda s: s[: len(s) // 2], ""),
        (lambda s: b"\x07" + s[1:], "unknown header byte 0x07"),
        (lambda s: b"", "empty"),
    ],
    ids=["flipped", "truncated", "unknown-header", "empty"],
)
@pytest.mark.parametrize("compress", [True, False], ids=["zstd", "raw"])
def test_damaged_stored_bytes_raise_integrity_error_naming_the_id(mangle, reason, compress):
    oid, canonical = o.encode(o.Blob(b"some content that compresses well " * 20))
    stored = o.to_stored(canonical, compress=compress)
    with pytest.raises(IntegrityError) as ei:
        o.from_stored(oid, mangle(stored))
    assert ei.value.object_id == oid
    assert oid in str(ei.value)
    assert reason in str(ei.value)


def test_canonical_bytes_that_are_not_an_object_raise_integrity_error():
    data = o.pack({"k": "zz"})
    with pytest.raises(IntegrityError):
        o.decode(o.digest(data), data)


# -- the object store ---------------------------------------------------------------------


def _object_files(root: Path) -> list[Path]:
    return [p for p in (root / "objects").rglob("*") if p.is_file()]


def test_the_same_content_written_twice_is_one_object(tmp_path):
    storage = open_storage(str(tmp_path))
    first = ObjectStore(storage).put(o.Value({"role": "system", "content": "be brief"}))
    files = _object_files(tmp_path)
    mtime = files[0].stat().st_mtime_ns
    # another process-like writer (fresh cache) and a different dict order
    second = ObjectStore(open_storage(str(tmp_path))).put(o.Value({"content": "be brief", "role": "system"}))
    third = ObjectStore(storage).put_many([o.Value({"role": "system", "content": "be brief"})] * 3)
    assert first == second == third[0] == third[2]
    assert _object_files(tmp_path) == files and len(files) == 1
    assert files[0].relative_to(tmp_path).as_posix() == object_key(first)
    assert files[0].stat().st_mtime_ns >= mtime


def test_a_known_object_is_written_again_so_a_gc_in_between_cannot_lose_it(tmp_path):
    # Issue 18.2: skipping objects this process wrote recently let gc delete one between
    # two appends; every batch writes (freshens) all of its objects instead.
    objs = ObjectStore(open_storage(str(tmp_path)))
    oid = objs.put(o.Blob(b"once"))
    (tmp_path / object_key(oid)).unlink()
    objs.put(o.Blob(b"once"))
    assert (tmp_path / object_key(oid)).exists()


def test_object_store_round_trips_every_kind(backend):
    objs = ObjectStore(open_storage(backend.url, **backend.options))
    golden = make_golden.golden_objects()
    ids = objs.put_many(list(golden.values()))
    assert ids == [BY_NAME[n]["id"] for n in golden]
    fresh = ObjectStore(open_storage(backend.url, **backend.options))
    assert fresh.get_many(ids) == dict(zip(ids, golden.values(), strict=True))
    for oid, obj in zip(ids, golden.values(), strict=True):
        assert ObjectStore(open_storage(backend.url, **backend.options)).get(oid) == obj
    assert sorted(fresh.iter_ids()) == sorted(set(ids))


def test_get_of_a_missing_object_raises_object_not_found(backend):
    objs = ObjectStore(open_storage(backend.url, **backend.options))
    with pytest.raises(ObjectNotFound) as ei:
        objs.get("ab" * 32)
    assert ei.value.object_id == "ab" * 32
    assert isinstance(ei.value, KeyError)
    with pytest.raises(ObjectNotFound):
        objs.get_many(["ab" * 32])
    assert objs.get_many(["ab" * 32], missing_ok=True) == {}


# -- hypothesis round trips ------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
)
_values = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_value_objects_round_trip_through_the_codec(value):
    oid, canonical = o.encode(o.Value(value))
    back = o.decode(oid, o.from_stored(oid, o.to_stored(canonical)))
    assert _same(back.value, value)
    assert o.encode(back) == (oid, canonical)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=6), _values, max_size=8), st.randoms(use_true_random=False))
def test_value_id_ignores_key_order(value, rnd):
    items = list(value.items())
    rnd.shuffle(items)
    assert o.encode(o.Value(dict(items)))[0] == o.encode(o.Value(value))[0]


def _same(a, b) -> bool:
    """Equality where -0.0 and 0.0 differ (they encode differently) and NaN is excluded."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def test_a_damaged_frame_size_is_refused_before_decompressing():
    oid, canonical = o.encode(o.Blob(b"abc" * 10000))
    good = o.to_stored(canonical)
    assert good[:1] == b"\x01"  # above DICT_MAX: plain zstd (the dictionary frame: test_zdict.py)
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(canonical)
    with pytest.raises(IntegrityError, match="declares"):
        o.from_stored(oid, b"\x01" + frame)  # no size: not a frame this writer makes
    # a frame whose 8-byte size field says 2**62 bytes
    big = zstandard.ZstdCompressor().compress(canonical)
    header = big[:4] + bytes([0xC0 | (big[4] & 0x3F)])
    assert zstandard.frame_content_size(header + (1 << 62).to_bytes(8, "little") + b"\x00" * 8) == 1 << 62
    with pytest.raises(IntegrityError, match="declares"):
        o.from_stored(oid, b"\x01" + header + (1 << 62).to_bytes(8, "little") + big[9:])


def _claiming(data: bytes, claim: int, dict_frame: bool = False) -> bytes:
    """A stored frame of ``data`` (``0x01``, or the dictionary's magicless ``0x02``) whose
    4-byte content size field says ``claim``."""
    if dict_frame:
        z = bytearray(frames._dict_compressor(frames._shared_zdict()).compress(data))
        fhd_at = 0
    else:
        z = bytearray(zstandard.ZstdCompressor().compress(data))
        fhd_at = 4
    fhd = z[fhd_at]
    assert fhd >> 6 == 2  # a 4-byte size field
    at = fhd_at + 1 + (0 if (fhd >> 5) & 1 else 1) + (0, 1, 2, 4)[fhd & 3]
    z[at:at + 4] = claim.to_bytes(4, "little")
    return (frames.ZSTD_DICT if dict_frame else frames.ZSTD) + bytes(z)


@pytest.mark.parametrize("dict_frame", [False, True], ids=["zstd", "dictionary"])
def test_a_frame_claiming_more_or_less_than_it_holds_is_a_corrupt_object(dict_frame: bool) -> None:
    """A zstd "bomb": a few bytes whose header claims up to MAX_OBJECT_SIZE (4 GiB). Every
    reader (a loose object, a pack record, a repacked block read in part, the search index's
    chunks: frames.unframe and BlockPrefix) refuses it as corrupt before it allocates the size
    claimed, since no frame makes more than MAX_RATIO bytes of each of its own; before,
    python-zstandard allocated the claim (a MemoryError where memory is capped: see the
    subprocess below). A claim its data does not make, more or less, is corrupt too."""
    data = b"\0" * 100_000
    for claim in (frames.MAX_OBJECT_SIZE - 1, 100_001, 99_999, 1):
        stored = _claiming(data, claim, dict_frame)
        assert len(stored) < 100  # (a bomb: tiny)
        with pytest.raises(IntegrityError, match="declares|bad compressed data"):
            frames.unframe(stored, "obj")
        if not dict_frame:
            with pytest.raises(IntegrityError, match="declares|bad compressed data|ends at"):
                frames.BlockPrefix(stored, "block").upto(claim)
    with pytest.raises(IntegrityError, match=r"more than its \d+ bytes can hold"):
        frames.unframe(_claiming(data, frames.MAX_OBJECT_SIZE - 1, dict_frame), "obj")
    assert frames.unframe(_claiming(data, len(data), dict_frame)) == data  # the true size reads
    # a whole run of zeros, the best zstd does, stays under the bound
    assert len(frames.unframe(frames.to_stored(b"\0" * (1 << 24)))) == 1 << 24


def test_a_bomb_is_refused_where_memory_is_capped(tmp_path) -> None:
    """The claim is never allocated: under a 1.5 GB address-space cap a frame claiming 4 GiB
    is one IntegrityError (before: MemoryError)."""
    import subprocess

    stored = _claiming(b"\0" * 100_000, frames.MAX_OBJECT_SIZE - 1)
    (tmp_path / "bomb").write_bytes(stored)
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000)); "
            "from castore import frames; from castore.errors import IntegrityError\n"
            "try:\n    frames.unframe(open(sys.argv[1], 'rb').read(), 'obj')\n"
            "except IntegrityError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bomb")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("refused:"), (out.stdout, out.stderr[-500:])


def test_zstd_contexts_outlive_the_threads_that_used_them():
    """A short-lived thread (LangGraph runs each checkpoint write in a new one) takes a zstd
    context another thread made and gives it back, instead of building its own: building
    one costs several times a small compress."""
    import threading

    oid, canonical = o.encode(o.Blob(data=b"the agent called the weather tool " * 20))
    assert o.to_stored(canonical)[:1] == frames.ZSTD_DICT
    o.from_stored(oid, o.to_stored(canonical))  # one context of each kind exists now
    made: list[object] = []
    pools = (frames._dict_compressors, frames._dict_decompressors)
    reals = [pool._make for pool in pools]
    for pool, real in zip(pools, reals, strict=True):
        pool._make = lambda real=real: made.append(real) or real()
    try:
        out: list[bytes] = []
        for _ in range(5):
            t = threading.Thread(target=lambda: out.append(o.from_stored(oid, o.to_stored(canonical))))
            t.start()
            t.join()
    finally:
        for pool, real in zip(pools, reals, strict=True):
            pool._make = real
    assert out == [canonical] * 5
    assert made == []


def test_zstd_contexts_are_never_shared_by_two_threads_at_once():
    """Eight threads compressing and decompressing at once (zstd contexts are not
    thread-safe): every object comes back whole."""
    blobs = [o.encode(o.Blob(data=(f"{i} parser token buffer " * (5 + i % 300)).encode()))[1] for i in range(400)]

    def work(k: int) -> None:
        for c in blobs[k::8] * 5:
            assert o.from_stored(o.digest(c), o.to_stored(c)) == c

    errors = race(work, 8)
    assert errors == []


def test_ids_hashed_by_threads_at_once_are_each_their_bytes_digest():
    """A codec hashes with one blake3 hasher per thread, reset before each object: eight threads
    hashing objects of every size at once (large ones too, which blake3 may hash without the
    GIL), under plain and keyed codecs, each get the digest of their own bytes."""
    from blake3 import blake3

    key = bytes(range(32))
    keyed = o.Codec(id_key=key)
    datas = [os.urandom(n) for n in (0, 1, 700, 4096, 1 << 16, 1 << 20)]
    want = {d: (blake3(d).digest(), blake3(d, key=key).digest()) for d in datas}

    def work(k: int) -> None:
        for d in (datas[k % 6:] + datas[:k % 6]) * 4:
            plain, keyed_ = want[d]
            assert o.PLAIN.digest(d) == plain.hex() == o.digest(d)
            assert keyed.digest(memoryview(d)) == keyed_.hex()
            assert keyed.encode_raw(o.Blob(data=d))[1:] == (blake3(o.encode(o.Blob(data=d))[1], key=key).digest(),
                                                            o.encode(o.Blob(data=d))[1])

    assert race(work, 8, together=True) == []


@pytest.mark.parametrize("call", ["digest", "encode_raw"])
def test_an_exception_at_any_line_of_a_hash_leaves_the_next_id_right(call):
    """A KeyboardInterrupt (or any exception a signal handler raises) can arrive between any
    two lines of a codec's hash, its cleanup included: the thread's hasher must not keep the
    interrupted object's bytes, or the next id it gives is a wrong one (an object written under
    it reads back corrupt). The exception is raised by a trace function at each line in turn."""
    from blake3 import blake3

    key = bytes(range(32))
    for codec, fresh in ((o.PLAIN, blake3), (o.Codec(id_key=key), lambda d: blake3(d, key=key))):
        fn = getattr(codec, call)
        code = fn.__code__
        arg = b"interrupted" if call == "digest" else o.Blob(data=b"interrupted")
        lines = sorted({n for _, _, n in code.co_lines() if n is not None and n > code.co_firstlineno})

        for target in lines:
            def local(frame, event, _arg, target=target):
                if event == "line" and frame.f_lineno == target:
                    raise KeyboardInterrupt
                return local

            def tracer(frame, event, _arg, code=code, local=local):
                return local if frame.f_code is code else None

            sys.settrace(tracer)
            try:
                fn(arg)
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)
            assert codec.digest(b"next") == fresh(b"next").hexdigest(), f"{codec} {call}: line {target}"
            assert codec.encode_raw(o.Blob(data=b"x"))[0] == fresh(o.encode(o.Blob(data=b"x"))[1]).hexdigest()


# -- probes of canonical bytes (what a scan relies on without decoding) -------------------------
def test_kind_tag_bytes_lie_where_the_codec_writes_the_tag() -> None:
    samples = [o.Blob(data=b"x"), o.Value(value={"a": 1}), o.Tree(values={"k": 1}), o.Commit(kind="message"),
               o.Segment(start=0, objects=()), o.Index()]
    tags = {o.kind_tag_bytes(type(x)) for x in samples}
    assert len(tags) == len(samples)
    for x in samples:
        canonical = o.encode(x)[1]
        assert canonical[o.TAG_START:o.TAG_END] == o.kind_tag_bytes(type(x))
        assert o.kind_tag_bytes(type(x))[-1:].decode() == o.kind_tag(canonical)


def test_body_marker_is_in_front_of_every_commits_body_id() -> None:
    for body in (bytes(32), b"\xff" * 32, bytes(range(32))):
        for c in (o.Commit(kind="message", body=body), o.Commit(kind="event", body=body, parents=(body,), depth=3)):
            canonical = o.encode(c)[1]
            assert canonical.count(o.body_marker() + body) == 1
    assert o.body_marker() not in o.encode(o.Commit(kind="message"))[1]


@given(st.text(min_size=1, max_size=12), st.text(max_size=5), st.text(max_size=5))
@settings(max_examples=200, deadline=None)
def test_string_probe_finds_every_stored_string_holding_the_text(text: str, before: str, after: str) -> None:
    canonical = o.encode(o.Value(value={"k": [1, before + text + after]}))[1]
    assert o.string_probe(text.encode()).search(canonical)
    if text.isascii():
        folded = text.lower().encode()
        assert o.string_probe(folded, fold_case=True).search(canonical.lower())


def test_a_case_folded_probe_matches_the_letters_python_equates_with_i_s_and_k() -> None:
    text = "\u212a\u0130SS \u0131\u017f"  # Kelvin sign, dotted capital I, dotless i, long s
    assert re.search("kiss", text, re.IGNORECASE) and re.search("is", text, re.IGNORECASE)
    canonical = o.encode(o.Value(value=text))[1].lower()
    assert o.string_probe(b"kiss", fold_case=True).search(canonical)
    assert o.string_probe(b"is", fold_case=True).search(canonical)
    assert not o.string_probe(b"kiss").search(canonical)
    with pytest.raises(ValueError, match="lower-case ASCII"):
        o.string_probe("é".encode(), fold_case=True)
