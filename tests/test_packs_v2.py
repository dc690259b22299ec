"""Pack version 2 (docs/FORMAT.md, 4 and 5): a record's objects compressed as one frame,
repack into compressed blocks in write order, and the background geometric repack of
normal writes (FORMAT.md, 8). Version-1 packs stay readable (tests/test_packs.py)."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import castore
from castore import maintenance
from castore import objects as o
from castore.errors import IntegrityError
from castore.objectstore import ObjectStore, pack_key, packindex, packs
from castore.objectstore.repack import Repacker
from castore.storage import open_storage

GOLDEN = Path(__file__).parent / "golden"
sys.path.insert(0, str(GOLDEN))

import make_golden_packs  # noqa: E402
import make_golden_packs_v2  # noqa: E402


def _objs(n: int, tag: bytes = b"x") -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        canonical = o.pack({"n": i, "t": tag.decode() * (i % 50)})
        out.append((o.digest(canonical), canonical))
    return out


def _pack_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "packs").iterdir() if p.suffix == ".pack") if (root / "packs").exists() else []


def _read_slot(data: bytes, slot: packs.Slot) -> bytes:
    content = o.unframe(data[slot.offset:slot.offset + slot.size])
    return content[slot.start:slot.start + slot.length]


# -- bytes --------------------------------------------------------------------------------------
def test_golden_v2_packs_keep_their_bytes_and_read_back():
    want = json.loads((GOLDEN / "format2-v2.json").read_text())
    assert make_golden_packs_v2.golden() == want
    log = bytes.fromhex(want["log"])
    where, end = packs.scan(log)
    assert end == len(log) and {k: list(v) for k, v in where.items()} == want["slots"]
    assert packindex.decode_index(bytes.fromhex(want["log_index"])) == (len(log), where)
    for oid, slot in where.items():
        assert isinstance(slot, packs.Slot)
        o.decode(oid, o.from_stored(oid, b"\x00" + _read_slot(log, slot)))
    blocks = bytes.fromhex(want["blocks_pack"])
    bwhere, bend = packs.scan(blocks)
    assert bend == len(blocks) and set(bwhere) == set(where)
    assert packindex.decode_index(bytes.fromhex(want["blocks_index"])) == (len(blocks), bwhere)
    assert len({s.offset for s in bwhere.values()}) > 1  # several blocks
    kinds = bytes.fromhex(want["kind_block_pack"])
    kwhere, kend = packs.scan(kinds)
    assert kend == len(kinds) and set(kwhere) == set(where)
    assert packindex.decode_index(bytes.fromhex(want["kind_block_index"])) == (len(kinds), kwhere)
    order = [o.kind_tag(_read_slot(kinds, s)) for s in sorted(kwhere.values(), key=lambda s: s.start)]
    assert order == ["t", "t", "c", "c", "c", "b", "b", "b", "v", "v", "v", "s", "i", "i"]


def _zstd_block_ends(frame: bytes) -> list[int]:
    """How many content bytes a zstd frame has given out after each of its zstd blocks, read
    block by block (a block header is 3 bytes: last flag, type, size; RLE blocks hold 1 byte)."""
    import zstandard

    pos = zstandard.frame_header_size(frame)
    d = zstandard.ZstdDecompressor().decompressobj()
    out, ends, last = 0, [], False
    while not last:
        head = int.from_bytes(frame[pos:pos + 3], "little")
        last, kind, size = bool(head & 1), (head >> 1) & 3, head >> 3
        nxt = pos + 3 + (1 if kind == 1 else size)
        out += len(d.decompress(frame[pos if ends else 0:nxt]))
        ends.append(out)
        pos = nxt
    return ends


def test_a_repacked_block_is_laid_out_by_kind_with_a_zstd_block_at_each_cut():
    rng = random.Random(3)
    groups: list[list[tuple[str, bytes]]] = []
    copied: list[bytes] = []
    for i in range(400):  # appends: a body, a tree, a commit; a segment of the last 64 every 64
        body = o.encode(o.Value({"role": "user", "content": f"{i} " + rng.randbytes(60).hex()}))
        tree = o.encode(o.Tree(values={"turn": i}))
        commit = o.encode(o.Commit(kind="message", body=o.raw_id(body[0]), state=o.raw_id(tree[0]),
                                   time=float(i), depth=i, meta={"x": rng.randbytes(40).hex()}))
        group = [body, tree, commit]
        copied += [commit[1], body[1]]
        if i % 64 == 63:
            group.append(o.encode(o.Segment(start=i - 63, objects=tuple(copied))))
            copied = []
        groups.append(group)
    objs = [x for g in groups for x in g]
    ordered, cuts = packs.block_layout(objs + objs[:5])  # an object given twice is laid out once
    part = {"c": 0, "t": 0, "s": 2, "i": 2}
    ranks = [part.get(o.kind_tag(c), 1) for _, c in ordered]
    assert ranks == sorted(ranks) and sorted(ordered) == sorted(objs)
    for r in (0, 1, 2):  # write order within each part
        assert [x for x in ordered if part.get(o.kind_tag(x[1]), 1) == r] == \
               [x for x in objs if part.get(o.kind_tag(x[1]), 1) == r]
    content, spans = packs.encode_content(ordered)
    starts = [spans[oid][0] - 4 for oid, _ in ordered]
    assert set(cuts) <= set(starts) and cuts == sorted(cuts)
    assert starts[ranks.index(1)] in cuts and starts[ranks.index(2)] in cuts  # each part starts a block
    spine = [0, *(c for c in cuts if c <= starts[ranks.index(1)])]  # the commits and trees: ~95 KB
    assert len(spine) >= 3 and all(b - a <= packs.BLOCK_CUT + 1024 for a, b in itertools.pairwise(spine))
    rec, where = packs.encode_record_v2(objs, packs.HEADER_SIZE, level=9, by_kind=True)
    data = packs.PACK_MAGIC_V2 + rec
    assert packs.scan(data)[0] == where
    for oid, canonical in objs:
        assert _read_slot(data, where[oid]) == canonical
    payload = data[where[objs[0][0]].offset:][:where[objs[0][0]].size]
    assert payload[:1] == b"\x01" and o.unframe(payload) == content
    assert set(cuts) <= set(_zstd_block_ends(payload[1:]))  # a reader of a prefix stops at a cut
    # the same objects in write order, one frame with no cuts: laid out by kind is not larger
    plain, _ = packs.encode_record_v2(objs, packs.HEADER_SIZE, level=9)
    assert len(rec) < len(plain)
    assert packs.block_layout([]) == ([], [])
    assert o.kind_tag(b"") == o.kind_tag(b"\x93abc") == ""


def test_the_version_1_golden_fixtures_are_untouched():
    assert make_golden_packs.golden() == json.loads((GOLDEN / "format2.json").read_text())


def test_a_compressed_record_round_trips_a_torn_tail_is_ignored_and_damage_stops_the_scan():
    objs = _objs(40)
    rec1, where1 = packs.encode_record_v2(objs[:25], packs.HEADER_SIZE)
    rec2, where2 = packs.encode_record_v2(objs[25:], packs.HEADER_SIZE + len(rec1))
    data = packs.PACK_MAGIC_V2 + rec1 + rec2
    assert len(rec1) < sum(len(c) for _, c in objs[:25])  # one frame for the record: it shrank
    contents: dict[int, bytes] = {}
    found, end = packs.scan(data, keep=contents.__setitem__)
    assert found == {**where1, **where2} and end == len(data) and len(contents) == 2
    for oid, canonical in objs:
        assert _read_slot(data, found[oid]) == canonical
    for cut in range(len(packs.PACK_MAGIC_V2) + len(rec1), len(data), 7):
        assert packs.scan(data[:cut]) == (where1, len(packs.PACK_MAGIC_V2) + len(rec1))
    assert packs.scan(memoryview(data)[end - len(rec2):], end - len(rec2), version=2)[0] == where2
    flipped = bytearray(data)
    flipped[-3] ^= 1
    assert packs.scan(bytes(flipped))[0] == where1


def test_a_v2_index_round_trips_and_refuses_damage():
    data, where = packs.encode_pack_v2([[x] for x in _objs(30)], block_bytes=300, level=3)
    idx = packindex.encode_index(len(data), where)
    assert packindex.decode_index(idx) == (len(data), where) == (len(data), packs.scan(data)[0])
    for bad in (idx[:-1], idx[:30], b"x" + idx[1:], idx[:40] + bytes([idx[40] ^ 1]) + idx[41:]):
        with pytest.raises(IntegrityError):
            packindex.decode_index(bad)


def test_blocks_end_after_a_segment_once_big_enough():
    seg = o.encode(o.Segment(start=0, objects=(b"a" * 50,)))
    groups = [[x] for x in _objs(20)] + [[seg]] + [[x] for x in _objs(3, b"y")]
    data, where = packs.encode_pack_v2(groups, block_bytes=100, level=3,
                                       cut_after=lambda g: any(o.is_path_object(c) for _, c in g))
    assert where[seg[0]].offset == where[groups[0][0][0]].offset  # one block up to the segment
    assert where[groups[-1][0][0]].offset != where[seg[0]].offset  # and a new one after it


# -- stores ---------------------------------------------------------------------------------------
def _fill(url: str, n: int, **kw) -> tuple[castore.Store, list[str], int]:
    st = castore.open(url, format=2, durable=False, **kw)
    s = st.session("app", "u", "s")
    rng = random.Random(5)
    words = [f"w{i}" for i in range(2000)]  # the shape of scripts/bench_packs.py's messages (~500 bytes)
    msgs = [f"{i}: " + " ".join(words[min(int(rng.paretovariate(1.1)) - 1, 1999)] for _ in range(150))
            for i in range(n)]
    for i, m in enumerate(msgs):
        s.append(castore.Message(role="user", content=m), state_delta={"turn": i})
    return st, msgs, sum(len(m.encode()) for m in msgs)


def _stored(root: Path) -> int:
    return sum(p.stat().st_size for sub in ("objects", "packs") if (root / sub).exists()
               for p in (root / sub).rglob("*") if p.is_file())


def test_a_version_1_pack_written_by_the_previous_castore_still_reads(tmp_path):
    want = json.loads((GOLDEN / "format2.json").read_text())
    root = tmp_path / "st"
    (root / "packs").mkdir(parents=True)
    (root / "packs" / "w-0123456789abcdef0123456789abcdef.pack").write_bytes(bytes.fromhex(want["log"]))
    (root / "packs" / f"{want['batch_pack_name']}.pack").write_bytes(bytes.fromhex(want["batch_pack"]))
    objs = ObjectStore(open_storage(str(root)), format=2)
    for oid in want["locations"]:
        objs.get(oid)
    # repack turns them into one version-2 pack holding the same objects
    new = objs.merge_packs(objs.pack_names())
    assert new is not None and [p.name for p in _pack_files(root)] == [f"{new}.pack"]
    assert packs.pack_version((root / "packs" / f"{new}.pack").read_bytes()) == 2
    fresh = ObjectStore(open_storage(str(root)), format=2)
    assert set(fresh.get_many(want["locations"])) == set(want["locations"])


def test_segments_are_packed_and_a_repacked_session_stores_less_than_its_raw_text(tmp_path):
    root = tmp_path / "st"
    st, msgs, raw = _fill(str(root), 200, auto_repack=False)
    assert not (root / "objects").exists() or not any((root / "objects").rglob("*"))  # segments packed too
    before = _stored(root)
    st.close()
    rep = maintenance.repack(castore.open(str(root)), all_packs=True)
    assert rep.new_pack is not None and rep.packs_merged
    after = _stored(root)
    assert after < before and after < raw, (before, after, raw)
    fresh = castore.open(str(root))
    assert [m.content for m in fresh.session("app", "u", "s").messages()] == msgs
    assert maintenance.fsck(fresh).ok


def test_background_repack_keeps_the_pack_count_logarithmic(tmp_path, monkeypatch):
    monkeypatch.setattr("castore.objectstore.packlog.SEAL_BYTES", 4 * 1024)
    root = tmp_path / "st"
    st, msgs, _ = _fill(str(root), 200)
    st.objects.wait_repack()
    assert st.objects.repack_error is None
    names = [p.stem for p in _pack_files(root)]
    sealed_logs = [n for n in names if n.startswith("w-") and (root / "packs" / f"{n}.idx").exists()]
    assert len(names) <= 6 and len(sealed_logs) <= 1, names  # ~30 logs were sealed; merged as they came
    assert any(n.startswith("r-") for n in names)
    st.close()
    fresh = castore.open(str(root))
    assert [m.content for m in fresh.session("app", "u", "s").messages()] == msgs
    assert maintenance.fsck(fresh).ok


def test_background_repack_can_be_switched_off_by_open_or_by_castore_json(tmp_path, monkeypatch):
    monkeypatch.setattr("castore.objectstore.packlog.SEAL_BYTES", 2 * 1024)
    st, _, _ = _fill(str(tmp_path / "a"), 40, auto_repack=False)
    st.close()
    assert not any(p.name.startswith("r-") for p in _pack_files(tmp_path / "a"))
    assert len(_pack_files(tmp_path / "a")) > 4
    castore.open(str(tmp_path / "b"), format=2).update_config(lambda c: {**c, "auto_repack": False})
    st, _, _ = _fill(str(tmp_path / "b"), 40)
    st.close()
    assert not any(p.name.startswith("r-") for p in _pack_files(tmp_path / "b"))


def test_an_object_store_writer_repacks_every_k_batch_packs_without_listing_per_append(monkeypatch):
    import uuid

    url = f"memory://bg-{uuid.uuid4().hex}"
    st = castore.open(url, format=2)
    s = st.session("app", "u", "s")
    s.append(castore.Message(role="user", content="warm"))
    lists = {"n": 0}
    real = st.storage.list_dir

    def counting(prefix: str) -> list[str]:
        lists["n"] += 1
        return real(prefix)

    monkeypatch.setattr(st.storage, "list_dir", counting)
    for i in range(64):
        s.append(castore.Message(role="user", content=f"m {i}"))
    st.objects.wait_repack()
    assert st.objects.repack_error is None
    assert lists["n"] <= 64 // 16 + 1, lists  # one listing per background run, none per append
    names = [n for n in real("packs") if n.endswith(".pack")]
    assert len(names) <= 16 + 2, names  # without it: 65 batch packs
    fresh = castore.open(url)
    assert [m.content for m in fresh.session("app", "u", "s").messages()][-1] == "m 63"


def test_a_failing_background_repack_never_fails_an_append(tmp_path, monkeypatch):
    monkeypatch.setattr("castore.objectstore.packlog.SEAL_BYTES", 4 * 1024)

    def broken(self, names, extra=(), by_mtime=True):
        raise IntegrityError("pack", "boom")

    monkeypatch.setattr(Repacker, "merge_packs", broken)
    st, msgs, _ = _fill(str(tmp_path / "st"), 60)
    st.objects.wait_repack()
    assert isinstance(st.objects.repack_error, IntegrityError)
    assert [m.content for m in castore.open(str(tmp_path / "st")).session("app", "u", "s").messages()] == msgs


def test_two_repacks_merging_the_same_packs_at_once_lose_nothing(tmp_path):
    root = tmp_path / "st"
    st, msgs, _ = _fill(str(root), 40, auto_repack=False)
    st.close()
    names = castore.open(str(root)).objects.pack_names()
    a = ObjectStore(open_storage(str(root)), format=2, auto_repack=False)
    b = ObjectStore(open_storage(str(root)), format=2, auto_repack=False)
    real = a.storage.read_many
    raced = {}

    def read_then_race(keys):
        got = real(keys)
        if not raced:  # b merges (and deletes) the same packs after a read them, before a writes
            raced["b"] = b.merge_packs(names)
        return got

    a.storage.read_many = read_then_race  # type: ignore[method-assign]
    got_a = a.merge_packs(names)
    assert raced["b"] is not None and got_a is not None
    fresh = castore.open(str(root))
    assert [m.content for m in fresh.session("app", "u", "s").messages()] == msgs
    assert maintenance.fsck(fresh).ok
    # a pack deleted before a repack reads it is skipped, not an error
    c = ObjectStore(open_storage(str(root)), format=2, auto_repack=False)
    assert c.merge_packs(["r-" + "0" * 32]) is None


_BG_WRITER = """
import sys, castore
import castore.objectstore.packlog as os_
os_.SEAL_BYTES = 3000  # seal every few appends: background repacks run all the time
store = castore.open(sys.argv[1])
s = store.session("app", "u", "s")
print("ready", flush=True)
for i in range(100000):
    cid = s.append(castore.Message(role="user", content=f"{sys.argv[2]}-{i} " + "lorem ipsum " * 20))
    sys.stdout.write(f"{i} {cid}\\n")
    sys.stdout.flush()
"""


@pytest.mark.parametrize("kills", [3, pytest.param(25, marks=pytest.mark.slow)])
def test_kill_9_during_background_repack_loses_no_acknowledged_append(tmp_path, kills):
    url = str(tmp_path / "store")
    castore.open(url, format=2).init()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    rng = random.Random(kills)
    acked: dict[str, str] = {}
    k = 0
    # at least `kills` runs, and more (up to 3x) until the writers' background repacks have run
    while k < kills or (k < 3 * kills and not any(p.name.startswith("r-") for p in _pack_files(Path(url)))):
        child = subprocess.Popen([sys.executable, "-c", _BG_WRITER, url, f"run{k}"], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.3, 1.2))
        child.send_signal(signal.SIGKILL)
        out, err = child.communicate()
        assert "Traceback" not in err, err
        for line in out.split("\n")[:-1]:
            i, cid = line.split()
            acked[f"run{k}-{i}"] = cid
        k += 1
    store = castore.open(url)
    report = maintenance.fsck(store)
    assert not report.damaged, report.to_dict()
    ids = {e.id for e in store.session("app", "u", "s").entries()}
    assert len(acked) > kills and [c for c, cid in acked.items() if cid not in ids] == []
    names = store.objects.pack_names()
    assert any(n.startswith("r-") for n in names)  # the writers' background repacks ran
    # a writer killed between creating its log and writing the log's header leaves an empty
    # log (no record, nothing acknowledged): every pack with bytes is version 2
    versions = {n: packs.pack_version(store.storage.read(pack_key(n))) for n in names}
    assert {n: v for n, v in versions.items() if v or not n.startswith("w-")} == \
        {n: 2 for n, v in versions.items() if v or not n.startswith("w-")}


def test_an_object_store_writer_merges_only_the_packs_it_wrote():
    import uuid

    url = f"memory://own-{uuid.uuid4().hex}"
    other = castore.open(url, format=2, auto_repack=False)
    for i in range(20):
        other.session("app", "u", "other").append(castore.Message(role="user", content=f"o {i}"))
    theirs = set(other.objects.pack_names())
    me = castore.open(url, format=2)
    for i in range(40):  # two background runs
        me.session("app", "u", "me").append(castore.Message(role="user", content=f"m {i}"))
    me.objects.wait_repack()
    assert me.objects.repack_error is None
    left = set(castore.open(url).objects.pack_names())
    assert theirs <= left  # the other writer's packs were not merged (nor GET, nor deleted)
    assert any(n.startswith("r-") for n in left - theirs)  # this writer's own packs were
    fresh = castore.open(url)
    assert [m.content for m in fresh.session("app", "u", "other").messages()] == [f"o {i}" for i in range(20)]
    assert [m.content for m in fresh.session("app", "u", "me").messages()][-1] == "m 39"


def test_a_repacked_packs_ages_name_each_object_written_long_before_its_record(local_store: castore.Store) -> None:
    from castore.objectstore.repack import AGE_SLACK, age_key, parse_ages

    objs = [o.encode(o.Blob(data=bytes([i]) * 10)) for i in range(4)]
    now = time.time()
    born = {objs[2][0]: now - 20 * AGE_SLACK, objs[0][0]: now - 10 * AGE_SLACK}
    name = local_store.objects.repacker.write_groups([objs], born)
    raw = json.loads(local_store.storage.read(age_key(name)))
    assert list(raw["objects"]) == sorted(born)  # only the old ones, by id
    ages = parse_ages(local_store.storage.read(age_key(name)))
    assert ages is not None
    where = local_store.objects.pack_contents(name)
    for oid, _ in objs:
        got = ages.of(oid, where[oid].offset)
        assert got is not None and (got == born[oid] if oid in born else got >= now)


def test_tagged_objects_gives_the_objects_of_one_kind_that_content_spans_finds() -> None:
    """packs.tagged_objects (the store-wide load of one kind, e.g. every commit) gives, in
    order, exactly the objects of a record's content whose kind tag matches, as content_spans
    and a filter do; a content that does not parse gives None, as there."""
    from castore.objects import Blob, Commit

    objs = [o.encode(x) for x in (Blob(data=b"a"), Commit(kind="event"), Blob(data=b"b" * 300),
                                  Commit(kind="event", author="x"), Commit(kind="event", author="y"))]
    content, _where = packs.encode_content(objs)
    for cls in (Commit, Blob):
        tag = o.kind_tag_bytes(cls)
        spans = packs.content_spans(content)
        assert spans is not None
        want = [content[a:a + n] for a, n in spans if content[a + o.TAG_START:a + o.TAG_END] == tag]
        assert want and packs.tagged_objects(content, tag, o.TAG_START, o.TAG_END) == want
    assert packs.tagged_objects(content[:-1], o.kind_tag_bytes(Commit), o.TAG_START, o.TAG_END) is None
    assert packs.tagged_objects(b"", o.kind_tag_bytes(Commit), o.TAG_START, o.TAG_END) == []


@pytest.mark.parametrize("key", ["auto_repack", "redact"])
def test_a_castore_json_switch_of_another_type_than_a_boolean_is_one_error_naming_it(tmp_path, key):
    """``"auto_repack": "false"`` (a string) in castore.json turned repacking on ("false" is
    truthy), and ``"redact": "false"`` redaction: opening the store refuses it now, naming the key and
    the file, and the store's bytes are left as they were."""
    from castore.errors import FormatError

    root = tmp_path / "st"
    castore.open(str(root)).update_config(lambda c: {**c, key: "false"})
    before = (root / "castore.json").read_bytes()
    with pytest.raises(FormatError, match=f"castore.json: {key} must be true or false, not 'false'"):
        castore.open(str(root))
    assert (root / "castore.json").read_bytes() == before
    cfg = json.loads(before)
    (root / "castore.json").write_text(json.dumps({**cfg, key: False}))
    assert castore.open(str(root)).auto_repack is (key != "auto_repack")
