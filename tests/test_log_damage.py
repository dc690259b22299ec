"""A damaged record in the middle of an unindexed log (docs/FORMAT.md, 4): the scan tells it
from a torn tail, so the records after it stay readable, fsck names it by pack and offset,
and neither repack nor gc drops it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore import maintenance
from castore.cli import cli
from castore.errors import CastoreError
from castore.objectstore import packs


def _text(k: int) -> str:
    return f"message {k}: " + "the log keeps every record it was given " * 3


def _record_offsets(data: bytes) -> list[int]:
    """The offset of every record of a (valid) pack."""
    out, off = [], packs.HEADER_SIZE
    while off < len(data):
        out.append(off)
        off += 20 + int.from_bytes(data[off:off + 4], "big")
    assert off == len(data)
    return out


def _dead_writer_log(root: Path, n: int = 8) -> tuple[str, Path, list[int]]:
    """A local log of ``n`` appends (one session each, one record each) whose writer died
    before sealing it: no index, no lock held."""
    w = castore.open(str(root), format=2, auto_repack=False)
    for k in range(n):
        w.session("app", "u", f"s{k}").append(castore.Message(role="user", content=_text(k)))
    log = w.objects.writer_log
    name = log.name
    log._log.close()  # the writer dies: its log stays as written, without an index
    log._drop_log()
    path = root / "packs" / f"{name}.pack"
    offsets = _record_offsets(path.read_bytes())
    assert len(offsets) == n
    return name, path, offsets


@pytest.mark.parametrize("where", ["payload", "length"])
def test_a_damaged_middle_record_hides_no_later_record_and_fsck_names_it(tmp_path, monkeypatch, where):
    root = tmp_path / "st"
    name, path, offsets = _dead_writer_log(root)
    data = bytearray(path.read_bytes())
    bad = offsets[3]
    if where == "payload":
        data[bad + 30] ^= 0xFF  # the record's length still leads to the next one
    else:
        data[bad:bad + 4] = (len(data)).to_bytes(4, "big")  # the length is wrong too: found by searching
    path.write_bytes(bytes(data))

    r = castore.open(str(root))
    for k in [0, 1, 2, 4, 5, 6, 7]:
        assert [m.content for m in r.session("app", "u", f"s{k}").messages()] == [_text(k)]
    with pytest.raises(CastoreError):
        r.session("app", "u", "s3").messages()  # its commit was in the damaged record

    report = maintenance.fsck(r)
    assert report.damaged_records == [(name, bad, offsets[4] - bad)]
    assert not report.ok and report.damaged
    assert report.to_dict()["damaged_records"] == [{"pack": name, "offset": bad, "bytes": offsets[4] - bad}]

    # nothing stored is lost: repack leaves the damaged log whole, gc refuses to run
    monkeypatch.setattr(maintenance, "LOG_IDLE", 0)
    maintenance.repack(r)
    assert path.read_bytes() == bytes(data)
    with pytest.raises(CastoreError, match="damaged"):
        maintenance.gc(r)
    assert path.read_bytes() == bytes(data)
    fresh = castore.open(str(root))
    assert [m.content for m in fresh.session("app", "u", "s7").messages()] == [_text(7)]


def test_a_torn_tail_is_still_a_tail_not_damage(tmp_path):
    root = tmp_path / "st"
    name, path, offsets = _dead_writer_log(root)
    data = path.read_bytes()
    path.write_bytes(data[:offsets[7] + 25])  # the last append was cut short
    r = castore.open(str(root))
    for k in range(7):
        assert [m.content for m in r.session("app", "u", f"s{k}").messages()] == [_text(k)]
    assert r.objects.damaged_records() == []


def test_scan_reports_a_damaged_record_and_resumes_after_it():
    objs = [[(f"{k:064x}", f"object {k} ".encode() * 20)] for k in range(5)]
    data = bytearray(packs.PACK_MAGIC_V2)
    starts = []
    for group in objs:
        starts.append(len(data))
        rec, _ = packs.encode_record_v2([(oid, c) for oid, c in group], len(data))
        data += rec
    whole, _ = packs.scan(bytes(data))
    data[starts[1] + 4] ^= 0x01  # a bit of record 1's check
    damaged: list[tuple[int, int]] = []
    where, end = packs.scan(bytes(data), damaged=damaged)
    assert damaged == [(starts[1], starts[2] - starts[1])] and end == len(data)
    assert len(where) == len(whole) - 1
    # a resumed scan of a growing log finds it too, at its pack offset
    damaged = []
    where, end = packs.scan(memoryview(bytes(data))[starts[1]:], starts[1], 2, damaged=damaged)
    assert damaged == [(starts[1], starts[2] - starts[1])] and len(where) == 3
    # the same bad record at the end, with nothing valid after it, is a torn tail
    damaged = []
    _, end = packs.scan(bytes(data[:starts[2]]), damaged=damaged)
    assert damaged == [] and end == starts[1]


@pytest.mark.parametrize("where", ["length", "check"])
def test_an_object_of_a_damaged_log_record_reads_as_damaged_not_missing(tmp_path, where):
    """A damaged record of a log without an index whose objects still show (its length or
    its check is what was hit): ``get`` of one of them raises DamagedPack naming the pack and
    the record fsck names, not "not found"."""
    root = tmp_path / "st"
    name, path, offsets = _dead_writer_log(root)
    data = bytearray(path.read_bytes())
    bad = offsets[3]
    if where == "length":
        data[bad:bad + 4] = (len(data)).to_bytes(4, "big")
    else:
        data[bad + 4] ^= 0xFF
    path.write_bytes(bytes(data))

    r = castore.open(str(root))
    tip = r.session("app", "u", "s3").branches()["main"]  # (the refs are whole: only the record is not)
    for read in (r.objects.get, r.objects.get_stored):
        with pytest.raises(castore.DamagedPack) as e:
            read(tip)
        assert (e.value.object_id, e.value.pack, e.value.offset, e.value.size) == (
            tip, f"packs/{name}.pack", bad, offsets[4] - bad)
    with pytest.raises(castore.DamagedPack):
        r.session("app", "u", "s3").messages()
    assert [m.content for m in r.session("app", "u", "s4").messages()] == [_text(4)]
    report = maintenance.fsck(r)
    assert report.damaged_records == [(name, bad, offsets[4] - bad)] and not report.ok
    with pytest.raises(castore.ObjectNotFound):  # a clean miss is still one
        r.objects.get("0" * 64)


def test_a_damaged_block_of_a_batch_shows_the_objects_decoded_before_the_damage(tmp_path):
    """A write batch's landing is one record of compressed blocks: damage near its end leaves
    the objects of the zstd blocks before it decodable, and those read as damaged."""
    root = tmp_path / "st"
    w = castore.open(str(root), auto_repack=False)
    with w.batch():
        for k in range(40):
            w.session("app", "u", f"s{k}").append(castore.Message(role="user", content=_text(k) + f"x{k} " * 400))
    w.session("app", "u", "after").append(castore.Message(role="user", content="a record after the batch"))
    log = w.objects.writer_log
    name = log.name
    first = w.session("app", "u", "s0").head
    log._log.close()  # the writer dies: no index
    log._drop_log()
    path = root / "packs" / f"{name}.pack"
    data = bytearray(path.read_bytes())
    offsets = _record_offsets(bytes(data))
    big = max(range(len(offsets) - 1), key=lambda i: offsets[i + 1] - offsets[i])
    data[offsets[big + 1] - 40] ^= 0xFF  # the end of the batch's largest record
    path.write_bytes(bytes(data))

    r = castore.open(str(root))
    with pytest.raises(castore.DamagedPack) as e:
        r.objects.get(first)
    assert (e.value.pack, e.value.offset) == (f"packs/{name}.pack", offsets[big])
    assert r.session("app", "u", "after").messages()[0].content == "a record after the batch"


def test_gc_keeps_a_log_whose_damaged_record_holds_nothing_reachable(tmp_path):
    """A damaged record whose objects no ref reaches (a killed import's landing, a deleted
    session's append) makes the store damaged all the same (FORMAT.md 4): gc refused only
    when a reachable object was missing, so here it ran, rewrote the log without its
    unreachable objects and deleted it, damaged record and all, while fsck said "damaged".
    It refuses now, naming the damaged record, and the log stays byte for byte."""
    root = tmp_path / "st"
    name, path, offsets = _dead_writer_log(root)
    w = castore.open(str(root))
    w.delete_session("app", "u", "s3")  # the damaged record's append: reachable from nothing
    w.delete_session("app", "u", "s5")  # an unreachable neighbour, which makes gc rewrite the log
    w.close()
    data = bytearray(path.read_bytes())
    data[offsets[3] + 30] ^= 0xFF
    path.write_bytes(bytes(data))

    r = castore.open(str(root))
    report = maintenance.fsck(r)
    assert report.damaged_records == [(name, offsets[3], offsets[4] - offsets[3])] and report.damaged
    assert report.missing == [] and report.corrupt == []
    with pytest.raises(CastoreError, match="gc refused.*1 damaged pack record"):
        maintenance.gc(r, grace=0)
    assert path.read_bytes() == bytes(data)
    for k in (0, 1, 2, 4, 6, 7):
        assert [m.content for m in r.session("app", "u", f"s{k}").messages()] == [_text(k)]


def _intent_log(root: Path) -> tuple[str, Path, list[int]]:
    """A format-3 log of four appends whose writer died before sealing it: each landing's
    objects record, then its ref intents; returns the log's name, path and the offsets of
    its ref-intent records (the last record of the log is one)."""
    w = castore.open(str(root), format=3, auto_repack=False)
    for k in range(4):
        w.session("app", "u", "s").append(castore.Message(role="user", content=_text(k)))
    log = w.objects.writer_log
    name = log.name
    log._log.close()  # the writer dies: its log stays as written, without an index
    log._drop_log()
    path = root / "packs" / f"{name}.pack"
    data = path.read_bytes()
    intents = [off for off in _record_offsets(data) if data[off + 20:off + 21] == packs.INTENT_FRAME]
    assert intents and intents[-1] == _record_offsets(data)[-1]
    return name, path, intents


@pytest.mark.parametrize("which", ["last", "middle"])
def test_fsck_names_a_damaged_ref_intent_of_an_unsealed_log(tmp_path, monkeypatch, which):
    """A ref intent (format 3) is read only by the recovery after a power loss. A flipped byte
    in the last record of a writer's unsealed log, a ref intent, was taken for a torn tail:
    fsck said ok, and the recovery that needed it would have skipped it. A record whole in
    length, framed as an intent, whose check fails is damage: fsck names it (and gc refuses),
    as it names a damaged record in the middle. A tail cut short is still a torn tail."""
    root = tmp_path / "st"
    name, path, intents = _intent_log(root)
    data = bytearray(path.read_bytes())
    bad = intents[-1] if which == "last" else intents[len(intents) // 2]
    size = 20 + int.from_bytes(data[bad:bad + 4], "big")
    data[bad + 30] ^= 0xFF
    path.write_bytes(bytes(data))
    with castore.open(str(root)) as r:
        report = maintenance.fsck(r)
        assert not report.ok and (name, bad, size) in report.damaged_records, report.damaged_records
        out = CliRunner().invoke(cli, ["--store", str(root), "fsck"])
        line = f"packs/{name}.pack at offset {bad} ({size} bytes)"
        assert out.exit_code == 1 and line in out.output and "ref intent" in out.output, out.output
        with pytest.raises(CastoreError, match="gc refused"):
            maintenance.gc(r, grace=0)
        monkeypatch.setattr(maintenance, "LOG_IDLE", 0)
        maintenance.repack(r, all_packs=True)  # leaves the log whole, as any damaged pack
        assert path.exists() and (name, bad, size) in maintenance.fsck(r).damaged_records

    if which == "last":
        path.write_bytes(bytes(data[:bad + size - 1]))  # that record cut short instead: a torn tail
        with castore.open(str(root)) as r:
            assert maintenance.fsck(r).damaged_records == []


def test_a_miss_beside_a_damaged_record_that_shows_no_object_names_it_and_fsck(tmp_path):
    """A damaged record of a log without an index whose payload no longer decompresses, so
    that no object of it shows: a reader of one of its objects (log, push, grep, export) said
    only "object X not found", naming neither the record nor `castore fsck`, while fsck listed
    the record. The miss names the record (pack and offset) and `castore fsck` now."""
    root = tmp_path / "st"
    name, path, offsets = _dead_writer_log(root)
    data = bytearray(path.read_bytes())
    bad = offsets[3]
    data[(bad + 20 + offsets[4]) // 2] ^= 0xFF  # inside the record's compressed payload
    path.write_bytes(bytes(data))

    r = castore.open(str(root))
    tip = r.session("app", "u", "s3").branches()["main"]
    with pytest.raises(castore.ObjectNotFound) as e:  # (no object of the record shows: not DamagedPack)
        r.objects.get(tip)
    assert not isinstance(e.value, castore.DamagedPack)
    assert f"packs/{name}.pack at offset {bad}" in str(e.value) and "castore fsck" in str(e.value)
    assert maintenance.fsck(r).damaged_records == [(name, bad, offsets[4] - bad)]
    r.close()
    res = CliRunner().invoke(cli, ["--store", str(root), "-s", "app/u/s3", "log"])
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1, res.output
    assert f"packs/{name}.pack at offset {bad}" in errors[0] and "castore fsck" in errors[0], res.output
    res = CliRunner().invoke(cli, ["--store", str(root), "push", "--all", str(tmp_path / "dest")])
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1, res.output
    assert f"packs/{name}.pack at offset {bad}" in errors[0] and "castore fsck" in errors[0], res.output


@pytest.mark.parametrize("which", ["intent", "objects"])
def test_gc_refusing_a_damaged_record_names_it_and_what_to_do(tmp_path, which):
    """gc refused a store with a damaged record saying only "1 damaged pack records; run
    `castore fsck`": not which record, not what was wrong with it, not what would let gc run
    again. It now names the record (pack, offset, size), says what it held and that nothing
    is rewritten or deleted while it is there, and what to do (restore the file, fsck), in
    the library's error and the CLI's one line."""
    root = tmp_path / "st"
    if which == "intent":
        name, path, intents = _intent_log(root)
        bad = intents[-1]
    else:
        name, path, offsets = _dead_writer_log(root)
        bad = offsets[3]
    data = bytearray(path.read_bytes())
    size = 20 + int.from_bytes(data[bad:bad + 4], "big")
    data[bad + 30] ^= 0xFF
    path.write_bytes(bytes(data))
    where = f"packs/{name}.pack at offset {bad} ({size} bytes)"
    with castore.open(str(root)) as r:
        with pytest.raises(CastoreError) as e:
            maintenance.gc(r, grace=0)
    msg = str(e.value)
    assert msg.startswith("gc refused") and where in msg, msg
    assert "restore" in msg and "backup" in msg and "castore fsck" in msg, msg
    kind = "a ref intent" if which == "intent" else "objects"
    assert kind in msg, msg
    res = CliRunner().invoke(cli, ["--store", str(root), "gc", "--grace", "0"])
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1 and where in errors[0], res.output
    assert path.read_bytes() == bytes(data)
