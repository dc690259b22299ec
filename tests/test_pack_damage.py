"""Bytes flipped inside a sealed pack's record (a compressed block): its objects are damaged,
not missing. ``get`` raises :class:`castore.DamagedPack` naming the pack file and the record,
fsck lists them as corrupt and the record as damaged, and ``log``/``export`` of a session that
needs them stop with that one ``Error:`` line (exit 1) while the other sessions read on."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore import maintenance
from castore.cli import main
from castore.objectstore.packs import Slot
from tests import s3server


def _store(root: Path, repacked: bool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Three sessions of four messages each, in a sealed (indexed) pack: the writer's log
    sealed at close, or one repacked pack of large blocks. Returns each session's head."""
    w = castore.open(str(root), format=2)
    heads = []
    for k in range(3):
        s = w.session("app", "u", f"s{k}")
        for j in range(4):
            s.append(castore.Message(role="user", content=f"session {k} message {j} " + "words " * 30))
        heads.append(s.head)
    w.close()
    if repacked:
        monkeypatch.setattr(maintenance, "LOG_IDLE", 0)
        with castore.open(str(root)) as w:
            assert maintenance.repack(w, all_packs=True).new_pack is not None
    return heads


def _flip(root: Path, oid: str) -> tuple[str, int, int]:
    """Flip the compressed bytes of the record holding ``oid`` (its frame's header left whole:
    a reader of one object of a block decompresses only as far as that object); returns the
    pack's name and the record's offset and size (header included), as fsck names them."""
    with castore.open(str(root)) as r:
        r.objects.refresh()
        hit = r.objects.packmap.locate(oid)
    assert hit is not None and isinstance(hit[1], Slot)
    name, loc = hit
    path = root / "packs" / f"{name}.pack"
    assert (root / "packs" / f"{name}.idx").exists()  # sealed: read through its index
    data = bytearray(path.read_bytes())
    for i in range(loc.offset + 16, loc.offset + loc.size):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    return name, loc.offset - 20, loc.size + 20


@pytest.mark.parametrize("repacked", [False, True], ids=["sealed-log", "repacked"])
def test_a_damaged_record_is_damage_not_a_missing_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         repacked: bool) -> None:
    root = tmp_path / "st"
    heads = _store(root, repacked, monkeypatch)
    name, offset, size = _flip(root, heads[1])

    r = castore.open(str(root))
    with pytest.raises(castore.DamagedPack) as e:
        r.objects.get(heads[1])
    err = e.value
    assert isinstance(err, castore.IntegrityError) and not isinstance(err, castore.ObjectNotFound)
    assert (err.object_id, err.pack, err.offset, err.size) == (heads[1], f"packs/{name}.pack", offset, size)
    assert f"packs/{name}.pack" in str(err) and f"offset {offset}" in str(err) and "damaged" in str(err)
    with pytest.raises(castore.DamagedPack):
        r.session("app", "u", "s1").log()
    if not repacked:  # one record per append: the other sessions read on
        for k in (0, 2):
            assert len(r.session("app", "u", f"s{k}").log()) == 4

    report = maintenance.fsck(r)
    assert not report.ok and report.missing == []
    assert heads[1] in {oid for oid, _ in report.corrupt}
    why = dict(report.corrupt)[heads[1]]
    assert f"packs/{name}.pack" in why and f"offset {offset}" in why
    assert (name, offset, size) in report.damaged_records
    with pytest.raises(castore.CastoreError, match="gc refused"):
        maintenance.gc(r, grace=0)  # nothing is dropped while a reachable object is damaged
    r.close()

    runner = CliRunner()
    res = runner.invoke(main, ["--store", str(root), "fsck"])
    assert res.exit_code == 1
    assert any(line.startswith(f"corrupt: {heads[1]}") and f"packs/{name}.pack" in line
               for line in res.output.splitlines())
    assert f"damaged record: packs/{name}.pack at offset {offset} ({size} bytes)" in res.output
    assert "missing:" not in res.output
    for args in (["log", "-s", "app/u/s1"], ["export", "html", "-s", "app/u/s1", "-o", str(tmp_path / "s1.html")]):
        res = runner.invoke(main, ["--store", str(root), *args])
        assert res.exit_code == 1, res.output
        errors = [line for line in res.output.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "cannot be read" in errors[0] and f"packs/{name}.pack" in errors[0], res.output
        assert "not found" not in res.output and "Traceback" not in res.output


def test_log_shows_the_commits_newer_than_a_damaged_one_then_the_error(tmp_path: Path) -> None:
    """As git's log stops at an object it cannot read: what is readable, newest first, then
    one ``Error:`` line (exit 1); a log that does not reach the damage is whole (exit 0)."""
    root = tmp_path / "st"
    with castore.open(str(root), format=2) as w:
        s = w.session("app", "u", "s1")
        ids = [s.append(castore.Message(role="user", content=f"message {j}")) for j in range(6)]
    name, _, _ = _flip(root, ids[2])
    runner = CliRunner()

    res = runner.invoke(main, ["--store", str(root), "log", "-s", "app/u/s1", "--oneline"])
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert [line.split()[0] for line in lines[:-1]] == [c[:8] for c in ids[:2:-1]]
    assert lines[-1].startswith(f"Error: object {ids[2]} cannot be read") and f"packs/{name}.pack" in lines[-1]

    res = runner.invoke(main, ["--store", str(root), "log", "-s", "app/u/s1", "--oneline", "-n", "2"])
    assert res.exit_code == 0, res.output
    assert [line.split()[0] for line in res.output.splitlines()[:2]] == [c[:8] for c in ids[:3:-1]]
    assert "Error" not in res.output


@pytest.mark.parametrize("verb", ["push", "sync"])
def test_push_and_sync_name_a_damaged_segment_record_not_a_wrong_kind(tmp_path: Path, verb: str) -> None:
    """A session past 64 entries is read through its segments: when the record holding one
    is damaged, push and sync say that record cannot be read (pack, offset), as log and
    export do, not that the object "is corrupt: expected the segment of commits 0..63"
    (the object was never read); the destination gets nothing of that session."""
    root, dst = tmp_path / "st", tmp_path / "dst"
    with castore.open(str(root), format=2) as w:
        s = w.session("app", "u", "long")
        for j in range(130):
            s.append(castore.Message(role="user", content=f"message {j} " + "words " * 20))
    with castore.open(str(root)) as r:
        seg = next(x for x in r.objects.iter_ids()
                   if isinstance(obj := r.objects.get(x), castore.objects.Segment) and obj.start == 0)
    name, _, _ = _flip(root, seg)
    args = ["push", "--all", str(dst)] if verb == "push" else ["sync", str(dst)]
    res = CliRunner().invoke(main, ["--store", str(root), *args])
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    assert f"Error: object {seg} cannot be read" in errors[0] and f"packs/{name}.pack" in errors[0], errors
    with castore.open(str(dst)) as d:
        assert not d.refs.list("sessions/app/u/long/")  # nothing half-sent


def test_pull_clone_and_sync_name_the_remote_whose_record_is_damaged(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Pulling from (cloning, syncing with) a remote whose pack record is damaged said
    "... is damaged: ...; run `castore fsck`" without saying which store, and this store's
    fsck says ok: the error now names the remote. A sync whose own store is damaged keeps
    the message as it was (it is this store's)."""
    remote = tmp_path / "remote"
    heads = _store(remote, False, monkeypatch)
    _flip(remote, heads[1])
    runner = CliRunner()
    local = tmp_path / "local"
    for args in (["--store", str(local), "pull", "--all", str(remote)],
                 ["--store", str(local), "sync", str(remote)],
                 ["clone", str(remote), str(tmp_path / "copy")]):
        res = runner.invoke(main, args)
        assert res.exit_code == 1, (args, res.output)
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and errors[0].startswith(f"Error: object {heads[1]} cannot be read"), res.output
        assert errors[0].endswith(f"run `castore fsck` in {remote}"), errors
    res = runner.invoke(main, ["--store", str(local), "fsck"])
    assert res.exit_code == 0 and "ok" in res.output, res.output

    res = runner.invoke(main, ["--store", str(remote), "sync", str(tmp_path / "elsewhere")])
    assert res.exit_code == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and errors[0].endswith("run `castore fsck`"), res.output


@pytest.mark.parametrize("cut", ["header", "empty"])
@pytest.mark.parametrize("repacked", [False, True], ids=["sealed-log", "repacked"])
def test_repack_keeps_a_sealed_pack_cut_short_at_a_record_boundary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    repacked: bool, cut: str) -> None:
    """A sealed pack truncated to its header (or to 0 bytes) scans clean: no record is cut.
    ``repack --all`` took it for an empty pack and deleted it and its index, after which fsck
    said "missing" instead of naming the damaged pack. Its index says how long it is: repack
    now leaves it (and its index) for fsck, as it leaves a pack whose record is damaged."""
    root = tmp_path / "st"
    heads = _store(root, repacked, monkeypatch)
    with castore.open(str(root)) as w:  # another writer's sealed log: a repack has two packs to merge
        w.session("app", "u", "later").append(castore.Message(role="user", content="later"))
    with castore.open(str(root)) as r:
        r.objects.refresh()
        hit = r.objects.packmap.locate(heads[1])
    assert hit is not None
    path = root / "packs" / f"{hit[0]}.pack"
    assert len(list(path.parent.glob("*.pack"))) == 2
    path.write_bytes(path.read_bytes()[:8] if cut == "header" else b"")
    with castore.open(str(root)) as r:
        before = maintenance.fsck(r)
    assert not before.ok and before.missing == [] and before.damaged_records

    monkeypatch.setattr(maintenance, "LOG_IDLE", 0)
    res = CliRunner().invoke(main, ["--store", str(root), "repack", "--all"])
    assert "Traceback" not in res.output, res.output
    assert path.exists() and path.with_suffix(".idx").exists()  # kept, as fsck found them
    with castore.open(str(root)) as r:
        after = maintenance.fsck(r)
    assert after.missing == [] and after.damaged_records == before.damaged_records
    assert {oid for oid, _ in after.corrupt} == {oid for oid, _ in before.corrupt}


@pytest.mark.parametrize("cut", ["header", "nothing"])
def test_a_batch_pack_cut_short_at_a_record_end_on_s3_is_damage_not_a_missing_object(
        moto_server: s3server.Server, cut: str) -> None:
    """On S3 every append is a whole batch pack without an index (``b-``, named by the hash of
    its bytes). One cut short to a record's end (to its header, or to nothing) scanned clean:
    a reader of its objects got "object X not found" and fsck listed them as missing, naming
    no pack and no damage (local disk's sealed packs have an index saying how long they were).
    A pack written whole whose bytes no longer hash to its name is damage: the reader's error
    and fsck name the pack and say it was cut short."""
    bucket = f"t-{uuid.uuid4().hex[:20]}"
    s3server.make_bucket(moto_server.endpoint_url, bucket)
    url, opts = f"s3://{bucket}/store", moto_server.storage_options
    with castore.open(url, **opts) as w:
        heads = []
        for k in range(2):
            s = w.session("app", "u", f"s{k}")
            for j in range(3):
                s.append(castore.Message(role="user", content=f"session {k} message {j}"))
            heads.append(s.head)
    with castore.open(url, **opts) as r:
        r.objects.refresh()
        hit = r.objects.packmap.locate(heads[1])
        assert hit is not None and hit[0].startswith("b-")
        name = hit[0]
        key = f"packs/{name}.pack"
        data = r.storage.read(key)
        short = data[:8] if cut == "header" else b""
        r.storage.write(key, short)
    where = f"packs/{name}.pack"
    with castore.open(url, **opts) as r:
        with pytest.raises(castore.ObjectNotFound) as e:
            r.objects.get(heads[1])
        assert where in str(e.value) and "cut short" in str(e.value) and "castore fsck" in str(e.value), e.value
        assert len(r.session("app", "u", "s0").log()) == 3  # the other session reads on
        report = maintenance.fsck(r)
        assert (name, len(short), 0) in report.damaged_records and not report.ok
        with pytest.raises(castore.CastoreError, match=f"gc refused.*{where}.*cut short"):
            maintenance.gc(r, grace=0)
        assert r.storage.read(key) == short  # nothing was rewritten or deleted
    flat = {f"{k}.{k2}" if isinstance(v, dict) else k: v2 if isinstance(v, dict) else v
            for k, v in opts.items() for k2, v2 in (v.items() if isinstance(v, dict) else [(k, v)])}
    res = CliRunner().invoke(main, ["--store", url, *[a for k, v in flat.items() for a in ("-o", f"{k}={v}")], "fsck"])
    assert res.exit_code == 1 and f"damaged record: {where} is cut short at offset {len(short)}" in res.output, \
        res.output
