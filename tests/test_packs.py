"""Format 2 (packs, docs/FORMAT.md): pack bytes, writing a batch as one unit, reading packed
and loose objects alike, format-1 stores, gc and repack over packs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import castore
from castore import maintenance
from castore import objects as o
from castore.errors import FormatError, IntegrityError, ObjectNotFound
from castore.objectstore import LOOSE_MIN, ObjectStore, object_key, packindex, packs
from castore.objectstore.repack import geometric
from castore.storage import open_storage

GOLDEN = Path(__file__).parent / "golden"
sys.path.insert(0, str(GOLDEN))

import make_golden_packs  # noqa: E402


def _msgs(n: int, tag: str = "m") -> list[castore.Message]:
    return [castore.Message(role="user", content=f"{tag} {i}") for i in range(n)]


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


# -- pack bytes --------------------------------------------------------------------------------
def test_golden_packs_keep_their_bytes_and_read_back():
    want = json.loads((GOLDEN / "format2.json").read_text())
    assert make_golden_packs.golden() == want
    log = bytes.fromhex(want["log"])
    where, end = packs.scan(log)
    assert end == len(log) and packindex.decode_index(bytes.fromhex(want["log_index"])) == (len(log), where)
    for oid, (off, size) in want["locations"].items():
        o.decode(oid, o.from_stored(oid, log[off:off + size]))


def test_a_record_round_trips_and_a_torn_tail_is_ignored():
    frames = [(o.digest(b"x%d" % i), o.to_stored(b"x%d" % i)) for i in range(5)]
    rec1, where1 = packs.encode_record(frames[:3], packs.HEADER_SIZE)
    rec2, where2 = packs.encode_record(frames[3:], packs.HEADER_SIZE + len(rec1))
    data = packs.PACK_MAGIC + rec1 + rec2
    found, end = packs.scan(data)
    assert found == {**where1, **where2} and end == len(data)
    for oid, frame in frames:
        loc = found[oid]
        assert data[loc.offset:loc.offset + loc.size] == frame
    for cut in range(len(packs.PACK_MAGIC) + len(rec1), len(data)):
        torn, end = packs.scan(data[:cut])
        assert torn == where1 and end == len(packs.PACK_MAGIC) + len(rec1)
    # a resumed scan of a growing log sees only the new record
    assert packs.scan(memoryview(data)[end:], end)[0] == where2


def test_a_flipped_byte_in_a_record_stops_the_scan_there():
    frames = [(o.digest(b"a"), o.to_stored(b"a"))]
    rec, _ = packs.encode_record(frames, packs.HEADER_SIZE)
    data = bytearray(packs.PACK_MAGIC + rec)
    data[-1] ^= 1
    assert packs.scan(bytes(data)) == ({}, packs.HEADER_SIZE)
    with pytest.raises(IntegrityError):
        packs.scan(b"NOTAPACK" + rec)


def test_an_index_round_trips_and_refuses_damage():
    frames = [(o.digest(b"i%d" % i), o.to_stored(b"i%d" % i)) for i in range(4)]
    data, where = packs.encode_pack(frames)
    idx = packindex.encode_index(len(data), where)
    assert packindex.decode_index(idx) == (len(data), where)
    for bad in (idx[:-1], idx[:10], b"x" + idx[1:], idx[:20] + bytes([idx[20] ^ 1]) + idx[21:]):
        with pytest.raises(IntegrityError):
            packindex.decode_index(bad)


# -- the object store ----------------------------------------------------------------------------
def test_format2_batch_is_one_record_and_large_objects_stay_loose(tmp_path):
    objs = ObjectStore(open_storage(str(tmp_path)), format=2)
    big = o.Value("y" * (LOOSE_MIN + 100))
    small = [o.Value({"i": i}) for i in range(5)]
    ids = objs.put_many([big, *small])
    assert (tmp_path / object_key(ids[0])).exists()
    assert not any((tmp_path / object_key(x)).exists() for x in ids[1:])
    logs = list((tmp_path / "packs").iterdir())
    assert len(logs) == 1 and logs[0].suffix == ".pack"
    fresh = ObjectStore(open_storage(str(tmp_path)))
    assert fresh.get_many(ids) == dict(zip(ids, [big, *small], strict=True))
    assert sorted(fresh.iter_ids()) == sorted(ids)
    assert fresh.resolve_prefix(ids[3][:8]) == ids[3]
    assert fresh.contains(ids[4]) and not fresh.contains("ab" * 32)
    with pytest.raises(ObjectNotFound):
        fresh.get("ab" * 32)


def test_every_backend_reads_back_a_format2_store(backend):
    st = castore.open(backend.url, format=2, **backend.options)
    s = st.session("app", "u", "s")
    s.append_many(_msgs(70))
    fork = s.fork("s2", at="HEAD~30")
    fork.append(castore.Message(role="user", content="after fork"))
    st.close()
    again = backend.open()
    assert again.config["format"] == 2
    assert [m.content for m in again.session("app", "u", "s").messages()] == [f"m {i}" for i in range(70)]
    assert again.session("app", "u", "s2").messages()[-1].content == "after fork"
    assert maintenance.fsck(again).ok
    if backend.name != "local":
        # no append on object stores: one pack per batch, one PUT
        assert all(n.startswith("b-") for n in again.objects.pack_names())


def test_a_local_log_is_sealed_with_an_index_and_files_stay_few(tmp_path, monkeypatch):
    monkeypatch.setattr("castore.objectstore.packlog.SEAL_BYTES", 64 * 1024)
    st = castore.open(str(tmp_path / "st"), format=2, auto_repack=False)  # logs as written, not merged
    s = st.session("app", "u", "s")
    for i in range(300):
        s.append(castore.Message(role="user", content=f"{i} " + os.urandom(1200).hex()))
    root = tmp_path / "st"
    pack_files = list((root / "packs").iterdir())
    assert any(p.suffix == ".idx" for p in pack_files)  # past SEAL_BYTES a log gets its index
    assert all(p.stat().st_size < 2 * 64 * 1024 for p in pack_files if p.suffix == ".pack")
    # loose: only the segments (64 commits and their bodies each: above LOOSE_MIN)
    assert len(_files(root / "objects")) <= 300 // 64
    assert 4 <= len(pack_files) + len(_files(root / "objects")) <= 300 / 8
    fresh = castore.open(str(root))
    assert len(fresh.session("app", "u", "s").messages()) == 300


def test_a_reader_sees_records_a_live_writer_appends_later(tmp_path):
    url = str(tmp_path / "st")
    w = castore.open(url, format=2)
    r = castore.open(url)
    s = w.session("app", "u", "s")
    s.append(castore.Message(role="user", content="one"))
    assert [m.content for m in r.session("app", "u", "s").messages()] == ["one"]
    s.append(castore.Message(role="user", content="two"))
    assert [m.content for m in r.session("app", "u", "s").messages()] == ["one", "two"]


# -- formats ---------------------------------------------------------------------------------------
def test_a_format1_store_reads_takes_appends_and_forks_and_repack_converts_it(tmp_path):
    url = str(tmp_path / "st")
    old = castore.open(url, format=1)  # format 1, as the main of before format 2 writes
    s = old.session("app", "u", "s")
    s.append_many(_msgs(40))
    assert old.config["format"] == 1 and not (tmp_path / "st" / "packs").exists()
    old.close()
    st = castore.open(url)
    st.session("app", "u", "s").append(castore.Message(role="user", content="more"))
    st.session("app", "u", "s").fork("f", at="HEAD~5")
    assert st.config["format"] == 1 and not (tmp_path / "st" / "packs").exists()  # opened: stays format 1
    assert maintenance.fsck(st).ok
    before = [m.content for m in st.session("app", "u", "s").messages()]
    rep = maintenance.repack(st)
    assert rep.loose_packed > 0 and rep.new_pack
    assert json.loads((tmp_path / "st" / "castore.json").read_text())["format"] == 2
    fresh = castore.open(url)
    assert [m.content for m in fresh.session("app", "u", "s").messages()] == before
    assert fresh.session("app", "u", "f").messages()[-1].content == "m 35"
    report = maintenance.fsck(fresh)
    assert report.ok and report.unreachable == []
    # the handle opened before the repack still finds what moved into the pack
    assert [m.content for m in castore.open(url).session("app", "u", "s").messages()] == before


@pytest.mark.parametrize("fmt", [4, 0, "2", True])
def test_a_store_of_an_unknown_format_is_refused_clearly(tmp_path, fmt):
    root = tmp_path / "st"
    root.mkdir()
    (root / "castore.json").write_text(json.dumps({"format": fmt, "created": 0, "remotes": {}}))
    with pytest.raises(FormatError, match="Upgrade castore|format"):
        castore.open(str(root))


def test_opening_with_an_unknown_format_is_refused(tmp_path):
    with pytest.raises(FormatError):
        castore.open(str(tmp_path / "st"), format=7)


# -- gc and repack over packs ------------------------------------------------------------------
def test_gc_rewrites_a_pack_without_the_unreachable_objects(tmp_path):
    url = str(tmp_path / "st")
    st = castore.open(url, format=2)
    st.session("app", "u", "keep").append_many(_msgs(10, "keep"))
    st.session("app", "u", "drop").append_many(_msgs(10, "drop"))
    st.close()
    st = castore.open(url)
    st.delete_session("app", "u", "drop")
    dry = maintenance.gc(st, grace=0, dry_run=True)
    assert dry.deleted and all(p.name.startswith("w-") for p in (tmp_path / "st" / "packs").iterdir())
    r = maintenance.gc(st, grace=0)
    assert len(r.deleted) == len(dry.deleted)
    fresh = castore.open(url)
    assert [m.content for m in fresh.session("app", "u", "keep").messages()] == [f"keep {i}" for i in range(10)]
    report = maintenance.fsck(fresh)
    assert report.ok and report.unreachable == []


def test_gc_keeps_a_pack_inside_the_grace_period_and_one_a_writer_holds(tmp_path):
    url = str(tmp_path / "st")
    st = castore.open(url, format=2)
    st.session("app", "u", "drop").append_many(_msgs(5))
    st.delete_session("app", "u", "drop")
    other = castore.open(url)
    assert maintenance.gc(other, grace=3600).deleted == []
    assert maintenance.gc(other, grace=0).deleted == []  # st still holds its log
    st.close()
    assert len(maintenance.gc(other, grace=0).deleted) > 0


def test_geometric_repack_merges_the_small_packs_only():
    assert geometric([("a", 100), ("b", 1), ("c", 1), ("d", 3)]) == ["b", "c", "d"]
    assert geometric([("a", 100), ("b", 10), ("c", 1)]) == []


def test_cli_init_format_2_and_repack(tmp_path):
    from click.testing import CliRunner

    from castore.cli import main

    url = str(tmp_path / "st")
    runner = CliRunner(env={"CASTORE_STORE": None, "CASTORE_SESSION": None})
    assert runner.invoke(main, ["init", url, "--format", "2"]).exit_code == 0
    assert json.loads((tmp_path / "st" / "castore.json").read_text())["format"] == 2
    st = castore.open(url)
    for i in range(3):
        w = castore.open(url)
        w.session("app", "u", f"s{i}").append_many(_msgs(4))
        w.close()
    # close() sealed each writer's log (its index is written), so repack merges them at once
    # (a log nobody holds and nobody sealed, a dead writer's, waits until idle: LOG_IDLE)
    res = runner.invoke(main, ["--store", url, "repack", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["new_pack"] is not None and len(json.loads(res.stdout)["packs_merged"]) == 3
    bad = runner.invoke(main, ["init", url, "--format", "4"])
    assert bad.exit_code == 2
    assert [m.content for m in st.session("app", "u", "s2").messages()] == [f"m {i}" for i in range(4)]


def test_repack_merges_idle_logs_and_readers_follow(tmp_path, monkeypatch):
    monkeypatch.setattr(maintenance, "LOG_IDLE", 0.0)
    url = str(tmp_path / "st")
    for i in range(4):
        w = castore.open(url, format=2)
        w.session("app", "u", f"s{i}").append_many(_msgs(3, f"s{i}"))
        w.close()
    reader = castore.open(url)
    assert reader.session("app", "u", "s0").messages()[0].content == "s0 0"  # pack map loaded
    rep = maintenance.repack(reader)
    assert len(rep.packs_merged) == 4 and rep.new_pack
    assert {p.name for p in (tmp_path / "st" / "packs").iterdir()} == {f"{rep.new_pack}.pack", f"{rep.new_pack}.idx",
                                                                    f"{rep.new_pack}.age"}
    other = castore.open(url)
    for i in range(4):
        assert [m.content for m in other.session("app", "u", f"s{i}").messages()] == [f"s{i} {j}" for j in range(3)]
    assert maintenance.fsck(other).ok


# -- kill -9 ------------------------------------------------------------------------------------
_REPACK_LOOP = """
import sys, castore
from castore import maintenance
maintenance.LOG_IDLE = 0.5
store = castore.open(sys.argv[1])
print("ready", flush=True)
while True:
    r = maintenance.repack(store, all_packs=True)
    print("repacked", len(r.packs_merged), flush=True)
"""


@pytest.mark.parametrize("kills", [6, pytest.param(30, marks=pytest.mark.slow)])
def test_kill_9_during_appends_and_during_repack_loses_no_acknowledged_append(tmp_path, kills):
    import random
    import signal
    import subprocess
    import time

    from test_reliability import KEY, run_crashes  # the writer-kill loop of the reliability tests

    url = str(tmp_path / "store")
    castore.open(url, format=2).init()
    rng = random.Random(kills)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    acked: dict[str, str] = {}
    merged = 0
    for k in range(kills):
        packer = subprocess.Popen([sys.executable, "-c", _REPACK_LOOP, url], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert packer.stdout is not None and packer.stdout.readline() == "ready\n"
        got, _ = run_crashes(url, 1, seed=kills * 100 + k)
        acked.update({f"{c}#{k}": cid for c, cid in got.items()})
        time.sleep(rng.uniform(0.0, 0.2))
        packer.send_signal(signal.SIGKILL)
        out, err = packer.communicate()
        assert "Traceback" not in err, err
        # the kill may cut the last line short: count complete "repacked N" lines only
        merged += sum(int(w[1]) for w in (ln.split() for ln in out.split("\n")[:-1])
                      if len(w) == 2 and w[0] == "repacked" and w[1].isdigit())
    store = castore.open(url)
    report = maintenance.fsck(store)
    assert not report.damaged, report.to_dict()
    ids = {e.id for e in store.session(*KEY).entries()}
    assert [c for c, cid in acked.items() if cid not in ids] == []
    assert store.objects.pack_names() and merged > 0  # writers wrote packs, the packer merged some


# -- the storage calls format 2 uses, on every backend ------------------------------------------
def test_storage_read_range_delete_if_older_and_appenders(backend):
    import time

    st = open_storage(backend.url, **backend.options)
    st.write("packs/x.pack", b"0123456789")
    assert st.read_range("packs/x.pack", 2, 3) == b"234"
    assert st.read_range("packs/x.pack", 8, 10) == b"89"
    assert st.read_range("packs/x.pack", 10, 4) == b"" and st.read_range("packs/x.pack", 30, 4) == b""
    with pytest.raises(FileNotFoundError):
        st.read_range("packs/missing.pack", 0, 1)
    assert st.delete_if_older("packs/x.pack", time.time() - 3600) is False  # young: kept
    assert st.read("packs/x.pack") == b"0123456789"
    assert st.delete_if_older("packs/missing.pack", time.time() + 3600) is False
    if st.mtime("packs/x.pack") is not None:
        assert st.delete_if_older("packs/x.pack", time.time() + 3600) is True
        assert not st.exists("packs/x.pack")
    log = st.open_appender("packs/w-log.pack")
    if backend.name == "local":
        assert log is not None and st.is_held("packs/w-log.pack")
        assert log.append(b"ab") == 0 and log.append(b"cd") == 2
        assert st.read("packs/w-log.pack") == b"abcd"
        log.close()
        assert not st.is_held("packs/w-log.pack")
    else:
        assert log is None and not st.is_held("packs/w-log.pack")


def test_delete_pack_with_a_cutoff_spares_a_pack_written_since(tmp_path):
    import time

    objs = ObjectStore(open_storage(str(tmp_path)), format=2)
    name = objs.write_pack([(o.digest(b"p"), o.to_stored(b"p"))])
    assert objs.delete_pack(name, time.time() - 3600) is False  # young: kept, index too
    assert {p.name for p in (tmp_path / "packs").iterdir()} == {f"{name}.pack", f"{name}.idx", f"{name}.age"}
    assert objs.delete_pack(name, time.time() + 3600) is True
    assert not (tmp_path / "packs").exists() or list((tmp_path / "packs").iterdir()) == []


def test_an_append_to_a_log_removed_meanwhile_fails_clearly_and_the_next_one_works(tmp_path):
    from castore.errors import StorageError

    url = str(tmp_path / "st")
    st = castore.open(url, format=2)
    s = st.session("app", "u", "s")
    s.append(castore.Message(role="user", content="one"))
    for p in (tmp_path / "st" / "packs").iterdir():
        p.unlink()  # what a gc with --grace 0 does to a log it should not have taken
    with pytest.raises(StorageError, match="removed meanwhile"):
        s.append(castore.Message(role="user", content="two"))
    assert s.head is not None
    s.append(castore.Message(role="user", content="three"))  # a new log
    # "one" was lost with its log (grace 0 on a store in use); "three" is stored and readable
    fresh = castore.open(url)
    with pytest.raises(ObjectNotFound):
        fresh.session("app", "u", "s").messages()
    assert fresh.objects.contains(fresh.session("app", "u", "s").head)
