"""The cost of moving a ref (issue 17): a writer keeps the value of the ref it last wrote and
moves it with one conditional write and no read; a lost race re-reads. Read hints name
the packs of the tail (``pk``), so a cold reader on S3 lists no folder.

Requests are counted against the real moto server (its request log, filtered by the
test's own bucket) and by the S3 client (``S3Storage.request_count``).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from typing import Any

import pytest
from conftest import Backend, make_backend
from helpers.threads import race

import castore
from castore import maintenance
from castore.history import Hint, K
from castore.storage.s3 import S3Storage


def _s3(store: castore.Store) -> S3Storage:
    st: Any = store.storage
    while not isinstance(st, S3Storage):
        st = st.inner
    return st


def _msg(i: int, tag: str = "m") -> castore.Message:
    return castore.Message(role="user" if i % 2 else "assistant", content=f"{tag} {i} " + "words " * 40)


class MotoLog:
    """The requests moto logged for one bucket from now on (read up to a sentinel request,
    so that every request sent before it is in the log)."""

    def __init__(self, server: Any, store: castore.Store) -> None:
        self.path = server.log
        self.bucket = _s3(store).bucket
        self.store = store
        self.start = os.path.getsize(self.path)

    def lines(self) -> list[str]:
        sentinel = f"sentinel-{uuid.uuid4().hex}"
        _s3(self.store).exists(sentinel)  # one HEAD, logged after everything sent before it
        while True:
            with open(self.path, errors="replace") as fh:
                fh.seek(self.start)
                got = [ln for ln in fh if "HTTP/1." in ln and f"/{self.bucket}" in ln]
            if any(sentinel in ln for ln in got):
                return [ln for ln in got if sentinel not in ln]
            time.sleep(0.05)

    def methods(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ln in self.lines():
            ln = re.sub(r"\x1b\[[0-9;]*m", "", ln)  # werkzeug colours some lines
            m = re.search(r'"([A-Z]+) (\S+)', ln)
            assert m is not None, ln
            kind = "LIST" if m.group(1) == "GET" and ("list-type" in m.group(2) or "prefix=" in m.group(2)) \
                else m.group(1)
            out[kind] = out.get(kind, 0) + 1
        return out


@pytest.fixture
def s3b(request: pytest.FixtureRequest, tmp_path: Any) -> Backend:
    return make_backend("s3", request, tmp_path)


# -- S3: 2 requests per steady-state append, no GET or HEAD -----------------------------------
def test_s3_steady_state_appends_send_no_get_or_head_and_two_requests_each(s3b: Backend,
                                                                             moto_server: Any) -> None:
    n = K + 6  # crosses one block boundary
    # the append path alone: the background repack (every 16 batch packs, docs/FORMAT.md 8)
    # is maintenance with its own LIST, GETs and DELETEs, measured by scripts/bench_packs.py
    with s3b.open(format=2, auto_repack=False) as st:
        s = st.session("app", "u", "s")
        for i in range(3):  # the first append creates the refs (reads, creates): not steady state
            s.append(_msg(i, "warm"))
        client = _s3(st)
        log = MotoLog(moto_server, st)
        per_append: list[int] = []
        closes: list[bool] = []
        for i in range(n):
            before = client.request_count
            cid = s.append(_msg(i), state_delta={"turn": i})
            per_append.append(client.request_count - before)
            closes.append((st.history.commit(cid).depth + 1) % K == 0)
        methods = log.methods()
    # not one read: the writer builds on the ref value it wrote last
    assert methods.get("GET", 0) == 0 and methods.get("HEAD", 0) == 0 and methods.get("LIST", 0) == 0, methods
    assert methods.get("PUT", 0) == sum(per_append)
    # one pack PUT + one conditional ref PUT, also for the append that closes a block of K
    # commits: its segment goes into the pack record (docs/FORMAT.md, 3)
    assert sum(closes) == 1
    assert per_append == [2] * n
    with s3b.open() as fresh:
        got = fresh.session("app", "u", "s").messages()
        assert [m.content for m in got[3:]] == [_msg(i).content for i in range(n)]


# -- a stale kept value: the CAS still catches it --------------------------------------------
@pytest.mark.parametrize("kind", ["local", "memory", "s3"])
def test_two_handles_alternating_lose_no_append(kind: str, request: pytest.FixtureRequest, tmp_path: Any) -> None:
    b = make_backend(kind, request, tmp_path)
    with b.open(format=2) as one, b.open(format=2) as two:
        s1, s2 = one.session("app", "u", "s"), two.session("app", "u", "s")
        want = []
        for i in range(12):
            # each handle's kept value is stale after the other's append: its swap loses,
            # it re-reads and lands on the new tip
            who, s = (("one", s1), ("two", s2))[i % 3 == 2]
            s.append(_msg(i, who))
            want.append(_msg(i, who).content)
        assert [m.content for m in s1.messages()] == want
        assert [m.content for m in s2.messages()] == want
    with b.open() as fresh:
        assert [m.content for m in fresh.session("app", "u", "s").messages()] == want
        if kind != "memory":
            assert maintenance.fsck(fresh).ok


def test_s3_stale_etag_rereads_once_and_then_needs_no_read_again(s3b: Backend, moto_server: Any) -> None:
    with s3b.open(format=2) as one, s3b.open(format=2) as two:
        s1, s2 = one.session("app", "u", "s"), two.session("app", "u", "s")
        s1.append(_msg(0))
        s1.append(_msg(1))
        s2.append(_msg(2, "two"))  # moves the branch under one's kept ETag
        log = MotoLog(moto_server, one)
        s1.append(_msg(3))  # 412 on the kept ETag, re-read, land
        lost = log.methods()
        assert lost.get("PUT", 0) >= 3 and lost.get("GET", 0) >= 1  # the lost swap, a pack, the re-read, the win
        log = MotoLog(moto_server, one)
        s1.append(_msg(4))
        assert log.methods() == {"PUT": 2}  # kept again: steady state
        assert [m.content for m in s2.messages()][-3:] == [_msg(i, t).content for i, t in ((2, "two"), (3, "m"), (4, "m"))]


def _race(b: Backend, writers: int, each: int) -> None:
    stores = [b.open(format=2) for _ in range(writers)]

    def run(w: int) -> None:
        s = stores[w].session("app", "u", "race")
        for i in range(each):
            s.append(castore.Message(role="user", content=f"{w}:{i}"))

    s0 = stores[0].session("app", "u", "race")
    s0.append(castore.Message(role="user", content="root"))
    errors = race(run, writers)
    assert not errors, errors
    for st in stores:
        st.close()
    with b.open() as fresh:
        got = [m.content for m in fresh.session("app", "u", "race").messages()]
    assert got[0] == "root" and sorted(got[1:]) == sorted(f"{w}:{i}" for w in range(writers) for i in range(each))
    for w in range(writers):  # each writer's appends in its own order
        mine = [c for c in got if c.startswith(f"{w}:")]
        assert mine == [f"{w}:{i}" for i in range(each)]


def test_concurrent_handles_on_local_disk_lose_nothing(tmp_path: Any, request: pytest.FixtureRequest) -> None:
    _race(make_backend("local", request, tmp_path), 4, 25)


def test_concurrent_handles_on_seaweedfs_lose_nothing(tmp_path: Any, request: pytest.FixtureRequest) -> None:
    _race(make_backend("seaweedfs", request, tmp_path), 4, 15)


# -- HEAD moved by another handle ------------------------------------------------------------
def test_checkout_by_another_handle_redirects_a_writer_that_kept_head(backend: Backend) -> None:
    with backend.open() as one, backend.open() as two:
        s1 = one.session("app", "u", "s")
        s1.append(_msg(0))
        s1.append(_msg(1))  # one keeps HEAD -> main and main's value
        s2 = two.session("app", "u", "s")
        s2.checkout("main", create="side")
        s1.append(_msg(2))  # must land on side, where HEAD is now
        assert s2.current_branch == "side"
        assert [m.content for m in s2.messages("side")][-1] == _msg(2).content
        assert [m.content for m in s2.messages("main")] == [_msg(0).content, _msg(1).content]


# -- read hints name packs -------------------------------------------------------------------
def test_s3_cold_reader_of_a_hinted_path_lists_nothing(s3b: Backend, moto_server: Any) -> None:
    # no background repack: one finishing after the last append would leave the last hint
    # naming merged packs (the next test covers hints after a repack)
    with s3b.open(format=2, auto_repack=False) as st:
        s = st.session("app", "u", "s")
        for i in range(K + 10):
            s.append(_msg(i), state_delta={"turn": i})
        ref = st.refs.read(s.refs.branch("main"))
        assert ref is not None
        hint = Hint.from_meta(ref.meta)
        assert hint is not None and len(hint.tail) == 10 and 1 <= len(hint.packs) <= 11
    with s3b.open() as cold:
        log = MotoLog(moto_server, cold)
        got = cold.session("app", "u", "s").messages()
        methods = log.methods()
    assert [m.content for m in got] == [_msg(i).content for i in range(K + 10)]
    assert methods.get("LIST", 0) == 0, methods


def test_s3_cold_reader_falls_back_when_hinted_packs_were_repacked(s3b: Backend, moto_server: Any) -> None:
    with s3b.open(format=2) as st:
        s = st.session("app", "u", "s")
        for i in range(20):
            s.append(_msg(i))
        maintenance.repack(st, all_packs=True)
        assert all(n.startswith("r-") for n in st.objects.pack_names())
    with s3b.open() as cold:
        log = MotoLog(moto_server, cold)
        got = cold.session("app", "u", "s").messages()
        methods = log.methods()
    assert [m.content for m in got] == [_msg(i).content for i in range(20)]
    assert methods.get("LIST", 0) >= 1  # the hinted packs are gone: found by listing


def test_local_hint_names_the_log_and_a_cold_reader_reads_through_it(tmp_path: Any) -> None:
    root = str(tmp_path / "store")
    with castore.open(root, format=2) as st:
        s = st.session("app", "u", "s")
        for i in range(5):
            s.append(_msg(i))
        ref = st.refs.read(s.refs.branch("main"))
        assert ref is not None
        hint = Hint.from_meta(ref.meta)
        assert hint is not None and [n[:2] for n in hint.packs] == ["w-"]
        assert os.path.exists(os.path.join(root, "packs", hint.packs[0] + ".pack"))
    with castore.open(root) as cold:
        assert [m.content for m in cold.session("app", "u", "s").messages()] == [_msg(i).content for i in range(5)]


def test_a_bad_pack_list_in_a_hint_is_ignored_not_trusted() -> None:
    tail = ["a" * 64]
    assert Hint.from_meta({"tl": tail, "pk": ["../../etc/passwd"]}) == Hint(None, tail, [])
    assert Hint.from_meta({"tl": tail, "pk": "b-" + "0" * 32}) == Hint(None, tail, [])
    ok = "b-" + "0" * 32
    assert Hint.from_meta({"tl": tail, "pk": [ok]}) == Hint(None, tail, [ok])


def test_kept_values_are_bounded_and_an_evicted_ref_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from castore import plumbing as branches

    monkeypatch.setattr(branches, "KEPT_REFS", 4)
    with castore.open(f"memory://refcost-{uuid.uuid4().hex}") as st:
        sessions = [st.session("app", "u", f"s{i}") for i in range(6)]
        for rnd in range(3):
            for i, s in enumerate(sessions):
                s.append(_msg(rnd, f"s{i}"))
        assert len(st.plumbing._kept) <= 4
        for i, s in enumerate(sessions):
            assert [m.content for m in s.messages()] == [_msg(r, f"s{i}").content for r in range(3)]


def test_s3_hints_follow_the_writers_background_repack(s3b: Backend, moto_server: Any) -> None:
    with s3b.open(format=2) as st:
        s = st.session("app", "u", "s")
        for i in range(40):  # more than one background repack's worth of batch packs
            s.append(_msg(i))
        st.objects.wait_repack()
        assert any(n.startswith("r-") for n in st.objects.pack_names())
        s.append(_msg(40))  # its hint names the repacked pack, not the merged ones
    with s3b.open() as cold:
        log = MotoLog(moto_server, cold)
        got = cold.session("app", "u", "s").messages()
        methods = log.methods()
    assert [m.content for m in got] == [_msg(i).content for i in range(41)]
    assert methods.get("LIST", 0) == 0, methods


def test_s3_repack_of_16_batch_packs_deletes_them_with_one_request(s3b: Backend, moto_server: Any) -> None:
    with s3b.open(format=2, auto_repack=False) as st:
        s = st.session("app", "u", "s")
        for i in range(16):
            s.append(_msg(i))
        batch = [n for n in st.objects.pack_names() if n.startswith("b-")]
        assert len(batch) == 16
        log = MotoLog(moto_server, st)
        new = st.objects.auto_repack_once()  # what the writer's background thread runs
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in log.lines()]
        assert new is not None and new.startswith("r-")
        st.objects.refresh()
        assert st.objects.pack_names() == [new]
    deletes = [ln for ln in lines if '"DELETE ' in ln or re.search(r'"POST \S*\?delete', ln)]
    assert len(deletes) == 1 and '"POST ' in deletes[0], deletes  # one DeleteObjects, not 16 DELETEs
    with s3b.open() as cold:
        assert [m.content for m in cold.session("app", "u", "s").messages()] == [_msg(i).content for i in range(16)]
