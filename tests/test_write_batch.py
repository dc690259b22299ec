"""Write batches (``Store.batch``): a thread's ref moves are staged, read back by that thread
only, and land together by compare-and-swap; a batched import stopped while it lands is
finished by the next import, byte for byte."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
from conftest import Backend
from helpers.interrupt import Stopped, archive, same_tree

import castore
from castore import groupcommit
from castore.adapters import jsonl_tree
from castore.adapters.claude_code import export_claude, import_claude
from castore.maintenance import fsck

DATA = Path(__file__).resolve().parent / "data" / "claude-code"


def _elsewhere(fn: object) -> object:
    """What ``fn()`` returns when called in another thread (which sees the store as landed)."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()))  # type: ignore[operator]
    t.start()
    t.join()
    return out[0]


def test_a_batch_reads_its_own_moves_and_others_see_them_once_landed(store: castore.Store) -> None:
    s = store.session("app", "u", "s1")
    with store.batch() as b:
        first = s.append(castore.Message(role="user", content="hi"))
        s.set_info({"k": 1})
        assert s.head == first and s.info == {"k": 1} and s.branches() == {"main": first}
        assert _elsewhere(lambda: store.session("app", "u", "s1").exists()) is False
        assert len(b) >= 2
        b.land()
        assert _elsewhere(lambda: store.session("app", "u", "s1").head) == first
        second = s.append(castore.Message(role="assistant", content="hello"))
        assert _elsewhere(lambda: store.session("app", "u", "s1").head) == first
    assert s.head == second and s.info == {"k": 1}
    assert [m.content for m in s.messages()] == ["hi", "hello"]


def test_a_batch_reads_a_stored_ref_once_and_each_read_is_the_callers_own(
        store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s = store.session("app", "u", "s1")
    s.append(castore.Message(role="user", content="hi"))
    s.set_info({"k": {"n": 1}})
    storage = store.refs.storage
    real = storage.read_versioned
    reads: list[str] = []

    def counted(key: str) -> object:
        reads.append(key)
        return real(key)

    monkeypatch.setattr(storage, "read_versioned", counted)
    head = f"refs/{s.refs.head}"
    with store.batch():
        for _ in range(5):
            assert s.exists()
            info = s.info
            assert info == {"k": {"n": 1}}
            info["k"]["n"] = 2  # a caller's change to what it read stays its own
        assert reads.count(head) == 1
        # another writer moves HEAD: the batch reads HEAD as it first did until it moves it,
        # and a move built on that first read is staged on a fresh one (not refused forever)
        _elsewhere(lambda: store.session("app", "u", "s1").set_info({"k": 3}))
        assert s.info == {"k": {"n": 1}}
        s.set_info({"m": 4})
        assert s.info == {"m": 4}
    assert s.info == {"m": 4} and reads.count(head) >= 2


def test_a_batch_reads_a_new_sessions_refs_once_and_a_rival_that_made_them_fails_the_landing(
        store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = store.refs.storage
    calls: list[tuple[str, str]] = []
    for name in ("read_versioned", "list", "list_dir"):
        def counted(key: str, _real: object = getattr(storage, name), _name: str = name) -> object:
            calls.append((_name, key))
            return _real(key)  # type: ignore[operator]
        monkeypatch.setattr(storage, name, counted)
    s = store.session("app", "u", "new")
    prefix = f"refs/{s.refs.prefix}"
    with store.batch() as b:
        assert not s.exists() and s.branches() == {}
        first = s.append(castore.Message(role="user", content="hi"))
        s.set_info({"k": 1})
        s.branch("side")
        s.append(castore.Message(role="user", content="more"))
        assert s.branches() == {"main": s.head, "side": first} and s.info == {"k": 1}
        mine = [c for c in calls if c[1].startswith(prefix)]
        # each of the session's refs and folders is asked of storage at most once: a ref read
        # absent is staged without a second read, and the folder listed empty answers for
        # the refs below it
        assert len(mine) == len(set(mine)) and len(mine) <= 3, mine
        b.land()
    assert s.branches() == {"main": s.head, "side": first} and s.info == {"k": 1}
    calls.clear()
    rival = store.session("app", "u", "raced")
    with pytest.raises(castore.RefConflict), store.batch():
        assert not rival.exists()
        rival.append(castore.Message(role="user", content="batched"))
        rival.set_info({"k": 2})
        # another writer makes the session meanwhile: not seen until the landing, whose
        # compare (the branch expected absent) refuses the batch's and leaves the rival's
        _elsewhere(lambda: store.session("app", "u", "raced").append(castore.Message(role="user", content="rival")))
    assert [m.content for m in rival.messages()] == ["rival"] and rival.info == {}
    assert fsck(store).ok


def test_an_interrupted_batch_lands_nothing_and_an_ordinary_error_keeps_what_was_done(
        store: castore.Store) -> None:
    s = store.session("app", "u", "s1")
    with pytest.raises(KeyboardInterrupt), store.batch():
        s.append(castore.Message(role="user", content="lost"))
        raise KeyboardInterrupt
    assert not s.exists() and store.sessions("app") == []
    with pytest.raises(ValueError, match="boom"), store.batch():
        s.append(castore.Message(role="user", content="kept"))
        raise ValueError("boom")
    assert [m.content for m in s.messages()] == ["kept"]
    with store.batch():  # a new batch does not build on the dropped one's values
        s.append(castore.Message(role="user", content="more"))
    assert [m.content for m in s.messages()] == ["kept", "more"]


def test_a_ref_moved_under_a_batch_fails_its_landing_and_leaves_that_sessions_head(store: castore.Store) -> None:
    s = store.session("app", "u", "s1")
    s.append(castore.Message(role="user", content="one"))
    s.set_info({"at": 1})
    other = store.session("app", "u", "s2")
    with pytest.raises(castore.RefConflict), store.batch():
        s.append(castore.Message(role="user", content="batched"))
        s.set_info({"at": 2})
        other.append(castore.Message(role="user", content="elsewhere"))
        _elsewhere(lambda: store.session("app", "u", "s1").append(castore.Message(role="user", content="rival")))
    assert [m.content for m in s.messages()] == ["one", "rival"]
    assert s.info == {"at": 1}  # HEAD (and the info on it) did not move: its branch lost
    assert [m.content for m in other.messages()] == ["elsewhere"]  # the rest landed


def test_a_batch_holds_its_objects_until_it_lands_and_writes_them_before_its_refs(
        backend: Backend, store: castore.Store) -> None:
    s = store.session("app", "u", "s1")
    s.append(castore.Message(role="user", content="stored"))
    with store.batch() as b:
        cid = s.append(castore.Message(role="assistant", content="held"))
        assert store.objects.knows(cid) and [m.content for m in s.messages()] == ["stored", "held"]
        other = backend.open()  # another handle reads storage: nothing of the batch is there yet
        try:
            assert not other.objects.contains(cid)
            b.land()
            assert other.objects.contains(cid)
        finally:
            other.close()
    with pytest.raises(KeyboardInterrupt), store.batch():
        lost = s.append(castore.Message(role="assistant", content="lost"))
        raise KeyboardInterrupt
    again = backend.open()
    try:  # dropped with the refs that would have named it: never written
        assert not again.objects.contains(lost)
        assert [m.content for m in again.session("app", "u", "s1").messages()] == ["stored", "held"]
    finally:
        again.close()


def test_a_batch_inside_a_batch_joins_it(store: castore.Store) -> None:
    s = store.session("app", "u", "s1")
    with store.batch():
        with store.batch() as inner:
            s.append(castore.Message(role="user", content="hi"))
            inner.land()  # the outer batch lands
        assert _elsewhere(lambda: store.session("app", "u", "s1").exists()) is False
    assert s.exists()


def test_batched_import_stopped_while_landing_is_finished_by_the_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    projects = tmp_path / "projects"
    shutil.copytree(DATA / "session-share", projects / "p", ignore=shutil.ignore_patterns("LICENSE", "*.md"))
    monkeypatch.setattr(jsonl_tree, "BATCH_FILES", 2)  # several landings, each its own groups
    monkeypatch.setattr(groupcommit, "LAND_EVERY", 1e9)
    ref = castore.open(str(tmp_path / "ref"))  # durable, local: objects and intents share the landing's sync
    landings = [0]
    real = ref.plumbing.swap_many

    def counted(*a: object, **k: object) -> object:
        landings[0] += 1
        return real(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(ref.plumbing, "swap_many", counted)
    import_claude(ref, projects)
    want = archive(ref)
    assert landings[0] > 4
    for k in range(1, landings[0]):
        path = tmp_path / f"s{k}"
        st = castore.open(str(path))
        calls = [0]
        real_k = st.plumbing.swap_many

        def stop(*a: object, calls: list[int] = calls, real_k: object = real_k, k: int = k, **kw: object) -> object:
            out = real_k(*a, **kw)  # type: ignore[operator]
            calls[0] += 1
            if calls[0] == k:
                raise Stopped  # as Ctrl-C, or kill -9, right after this group landed
            return out

        monkeypatch.setattr(st.plumbing, "swap_many", stop)
        with pytest.raises(Stopped):
            import_claude(st, projects)
        st.close()
        again = castore.open(str(path))  # as the next process would
        report = fsck(again)  # no ref names a missing object, no lock is left
        assert report.ok and not report.missing, k
        import_claude(again, projects)
        assert archive(again) == want, k
        export_claude(again, tmp_path / f"out{k}")
        same_tree(projects, tmp_path / f"out{k}", skip=())
        assert all(r.lines == 0 for r in import_claude(again, projects))
        again.close()


def test_a_batch_writes_its_log_records_fast_and_the_repack_after_it_compresses_them_once(
        local_store: castore.Store) -> None:
    from castore.objectstore import packs

    def headers() -> set[bytes]:
        out: set[bytes] = set()
        for name in local_store.objects.pack_names():
            if name.startswith("w-"):
                data = local_store.storage.read(packs.pack_key(name))
                out |= {bytes(p[:1]) for _, _, p in packs.payloads(data)}
        return out

    s = local_store.session("app", "u", "s1")
    big = "some text that repeats, " * 120  # packed (under 4 kB), and compressed either way
    s.append(castore.Message(role="user", content=big))
    assert headers() == {b"\x02"}  # outside a batch: the dictionary codec
    with local_store.batch() as b:
        s.append(castore.Message(role="assistant", content=big + "!"))
        b.land()  # (the batch holds its objects until it lands)
        assert b"\x01" in headers()  # inside: plain zstd at a low level, for the repack to redo
    local_store.objects.close()  # the repack after the batch merges the logs
    assert {n[:2] for n in local_store.objects.pack_names()} == {"r-"}
    assert [m.content for m in s.messages()] == [big, big + "!"]


def test_the_repack_after_a_batch_copies_its_landings_blocks_as_they_are(local_store: castore.Store) -> None:
    from castore.objectstore import packs

    def payloads(prefix: str) -> set[bytes]:
        out: set[bytes] = set()
        for name in local_store.objects.pack_names():
            if name.startswith(prefix):
                out |= {bytes(p) for _, _, p in packs.payloads(local_store.storage.read(packs.pack_key(name)))}
        return out

    s = local_store.session("app", "u", "s1")
    texts = [f"line {i}: " + "some text that repeats, " * 40 for i in range(30)]
    with local_store.batch() as b:
        for t in texts:
            s.append(castore.Message(role="user", content=t))
        b.land()
        landed = {p for p in payloads("w-") if p[:1] == b"\x01"}  # the landing's blocks
    local_store.objects.close()  # the log is merged into a pack of blocks
    assert landed and landed <= payloads("r-")  # byte for byte, not decoded and compressed again
    assert [m.content for m in s.messages()] == texts
    assert fsck(local_store).ok


def test_a_batch_lists_its_staged_refs_by_folder_and_no_neighbour(store: castore.Store) -> None:
    # a folder's staged refs are found by a search of the sorted names: "s0" and "s-a" sort
    # beside "s/..." and are not below "s"
    names = ["s", "s0", "s-a", "r"]
    prefixes = [store.session("app", "u", n).refs.prefix for n in names]
    with store.batch():
        for n in names:
            s = store.session("app", "u", n)
            s.append(castore.Message(role="user", content=n))
            s.branch("side")
        staged = {p: (store.refs.list(p), sorted(store.refs.list_dir(p))) for p in prefixes}
        whole = store.refs.list("sessions")
    landed = {p: (store.refs.list(p), sorted(store.refs.list_dir(p))) for p in prefixes}
    assert staged == landed and all(lst and all(n.startswith(p + "/") for n in lst) for p, (lst, _) in landed.items())
    assert sorted(whole) == sorted(store.refs.list("sessions"))


def test_landing_due_says_whether_land_due_would_land(store: castore.Store,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    s = store.session("app", "u", "s1")
    assert groupcommit.landing_due() is False  # no batch open in this thread
    monkeypatch.setenv("CASTORE_LAND_EVERY", "0")
    with store.batch():
        s.append(castore.Message(role="user", content="hi"))
        assert groupcommit.landing_due() is True
        assert _elsewhere(groupcommit.landing_due) is False  # another thread has no batch
        groupcommit.land_due()
        assert _elsewhere(lambda: store.session("app", "u", "s1").exists()) is True
    monkeypatch.setenv("CASTORE_LAND_EVERY", "3600")
    with store.batch():
        s.append(castore.Message(role="assistant", content="hello"))
        assert groupcommit.landing_due() is False
