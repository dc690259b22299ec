"""A fresh reader of a format-2 store binary-searches pack indexes instead of decoding them
(issue 17: reads at the middle of a long session stay flat in N)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import castore
from castore import maintenance
from castore.objectstore import packindex, packs

N = 100


@pytest.fixture(scope="module")
def sealed_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    url = str(tmp_path_factory.mktemp("lookup") / "st")
    ids: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        # repacked packs (how many the geometric rule leaves depends on their sizes), then
        # sealed logs that no repack merges: several indexes whatever the sizes
        for seal, repack, n in ((12, True, 80), (4, False, N - 80)):
            mp.setattr("castore.objectstore.packlog.SEAL_BYTES", seal * 1024)
            with castore.open(url, format=2, durable=False, auto_repack=repack) as st:
                s = st.session("app", "u", "s")
                ids += [s.append(castore.Message(role="user", content=f"{i} " + os.urandom(300).hex()),
                                 state_delta={"turn": i}) for i in range(len(ids), len(ids) + n)]
    assert len(list(Path(url, "packs").glob("r-*.idx"))) >= 1
    assert len(list(Path(url, "packs").glob("*.idx"))) >= 3
    return url, ids


def _count_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = packindex.IndexView.rows

    def counting(self: packindex.IndexView) -> dict[str, packs.Location]:
        calls.append(self.count)
        return real(self)

    monkeypatch.setattr(packindex.IndexView, "rows", counting)
    return calls


def test_reading_a_few_objects_decodes_no_index(sealed_store: tuple[str, list[str]],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    url, ids = sealed_store
    calls = _count_rows(monkeypatch)
    with castore.open(url) as st:
        s = st.session("app", "u", "s")
        assert s.state(ids[N // 2], scopes=False)["turn"] == N // 2
        assert st.objects.contains(ids[3])
        assert not st.objects.contains("0" * 64)
        s.fork("f", at=ids[N // 2])
        assert [m.content.split()[0] for m in s.messages()] == [str(i) for i in range(N)]
    assert calls == []


def test_listing_every_object_decodes_the_indexes(sealed_store: tuple[str, list[str]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    url, ids = sealed_store
    with castore.open(url) as st:
        st.objects.get(ids[0])
        everything = set(st.objects.iter_ids())
        assert st.objects.resolve_prefix(ids[42][:12]) == ids[42]
    calls = _count_rows(monkeypatch)
    with castore.open(url) as st:
        st.objects.get(ids[0])  # one lookup first: rows found by search, then all of them
        assert set(st.objects.iter_ids()) == everything
        assert set(ids) <= everything
        assert st.objects.resolve_prefix(ids[42][:12]) == ids[42]
        assert maintenance.fsck(st).ok
    assert calls


def test_a_damaged_index_row_makes_the_reader_scan_the_pack(sealed_store: tuple[str, list[str]],
                                                            tmp_path: Path) -> None:
    url = str(tmp_path / "copy")
    shutil.copytree(sealed_store[0], url)
    idx = sorted(Path(url, "packs").glob("*.idx"))[0]
    view = packindex.IndexView(idx.read_bytes())
    victim = next(iter(view.rows()))
    # make the victim's row lie (version 1: an offset past the pack's end; version 2: a
    # record number the index does not have) and recompute the check: a well-formed index
    # that lies (the pack is the truth)
    data = bytearray(idx.read_bytes())
    raw = bytes.fromhex(victim)
    row_at = data.find(raw)
    if view.version == 2:
        data[row_at + 32:row_at + 36] = (0xFFFFFFFF).to_bytes(4, "big")
    else:
        data[row_at + 32:row_at + 40] = (view.pack_size + 10).to_bytes(8, "big")
    body = bytes(data[:-16])
    idx.write_bytes(body + castore.objects.checksum(body))
    with pytest.raises(castore.IntegrityError):
        packindex.IndexView(idx.read_bytes()).find(raw)
    with castore.open(url) as st:
        assert st.objects.contains(victim)
        st.objects.get(victim)  # found by scanning the pack, verified against its id
        assert [m.content.split()[0] for m in st.session("app", "u", "s").messages()] == [str(i) for i in range(N)]


def _damage_row(url: str, edit: str) -> tuple[str, Path]:
    """Change one row of the first index without recomputing its check (damage on disk):
    ``edit`` "id" flips a bit of the row's id (a lookup misses it), "span" moves where the
    row says its object starts (a lookup finds other bytes). Returns the victim's id."""
    idx = sorted(Path(url, "packs").glob("*.idx"))[0]
    view = packindex.IndexView(idx.read_bytes())
    assert view.version == 2
    rows = view.rows()
    victim = sorted(rows)[len(rows) // 2]
    data = bytearray(idx.read_bytes())
    at = data.find(bytes.fromhex(victim))
    if edit == "id":
        data[at + 31] ^= 0x01
    else:
        start = int.from_bytes(data[at + 36:at + 40], "big")
        data[at + 36:at + 40] = (start + 1).to_bytes(4, "big")
    idx.write_bytes(bytes(data))
    with pytest.raises(castore.IntegrityError, match="check does not match"):
        packindex.IndexView(idx.read_bytes())
    return victim, idx


def test_a_fresh_reader_of_a_few_objects_checks_no_whole_index(sealed_store: tuple[str, list[str]],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url, ids = sealed_store
    checked: list[int] = []
    real = packindex.IndexView.verify

    def counting(self: packindex.IndexView) -> None:
        if not self.checked:
            checked.append(self.count)
        real(self)

    monkeypatch.setattr(packindex.IndexView, "verify", counting)
    with castore.open(url) as st:
        assert st.session("app", "u", "s").state(ids[N // 2], scopes=False)["turn"] == N // 2
        assert checked == []  # O(log n) per index: the check over every row waits for a miss
        assert not st.objects.contains("0" * 64)  # a miss is trusted only after every check
        assert len(checked) >= 3


@pytest.mark.parametrize("edit", ["id", "span"])
def test_a_damaged_index_found_by_a_lookup_is_checked_and_its_pack_scanned(
        sealed_store: tuple[str, list[str]], tmp_path: Path, edit: str) -> None:
    url = str(tmp_path / "copy")
    shutil.copytree(sealed_store[0], url)
    victim, _ = _damage_row(url, edit)
    with castore.open(url) as st:
        obj = st.objects.get(victim)  # a miss ("id") or other bytes ("span"): the index is checked
        assert castore.objects.encode(obj)[0] == victim
        assert st.objects.get_stored(victim)
    with castore.open(url) as st:
        assert st.objects.contains(victim)
        s = st.session("app", "u", "s")
        assert [m.content.split()[0] for m in s.messages()] == [str(i) for i in range(N)]
        assert maintenance.fsck(st).ok


def test_a_reader_at_the_middle_does_not_scan_a_live_writers_log(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "st")
    monkeypatch.setattr("castore.objectstore.packlog.SEAL_BYTES", 12 * 1024)
    writer = castore.open(url, format=2, durable=False, auto_repack=False)
    s = writer.session("app", "u", "s")
    ids = [s.append(castore.Message(role="user", content=f"{i} " + os.urandom(300).hex()),
                    state_delta={"turn": i}) for i in range(N)]
    live = writer.objects.writer_log.name  # the writer keeps appending to it: no index yet
    assert live and not Path(url, "packs", live + ".idx").exists()
    with castore.open(url) as st:
        assert st.session("app", "u", "s").state(ids[5], scopes=False)["turn"] == 5
        assert st.objects.pack_bytes(live) == 0  # its objects were all in sealed packs
        assert st.objects.get(ids[-1])  # only in the live log: found by scanning it
        assert st.objects.pack_bytes(live) > 0
    with castore.open(url) as st:
        assert [m.content.split()[0] for m in st.session("app", "u", "s").messages()] == [str(i) for i in range(N)]
    writer.close()
