"""The search index's freshness (the local swap log) and its files (rebuildable, checked)."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

import castore
from castore.grep import grep, grep_counts
from castore.grep.files import stat_of
from castore.grep.index import index_dir, open_index
from castore.storage import open_storage
from castore.storage import refchanges as swaplog
from castore.storage.local import LocalStorage
from castore.storage.refchanges import SWAP_LOG

T0 = 1_760_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    st = castore.open(str(tmp_path / "store"), durable=False)
    for n in range(3):
        st.session("bot", "ann", f"s{n}").append_many([
            {"role": "user", "content": f"question {n} about the parser"},
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {n}"},
                                              {"type": "tool_use", "id": f"t{n}", "name": "Bash",
                                               "input": {"command": "ls parser"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": "parser.py"}]},
        ], time=T0 + n)
    return st


def _texts(store: castore.Store, pattern: str, **kw: object) -> list[str]:
    return [m.lines[0].text for m in grep(store, pattern, **kw)]  # type: ignore[arg-type]


# -- the swap log of local storage -------------------------------------------------------------
def test_swap_log_names_every_swapped_and_deleted_key_since_a_mark(tmp_path: Path) -> None:
    st = open_storage(str(tmp_path / "s"))
    assert isinstance(st, LocalStorage)
    absent, keys = st.swaps_since(None) or ("", [])
    assert keys is None  # no mark: the caller reads everything
    assert st.swaps_since(absent) == (absent, [])  # still no log: nothing moved
    t = st.swap("refs/a/HEAD", b"1", None)
    mark, keys = st.swaps_since(absent) or ("", [])
    assert keys is None  # the log appeared: read everything once
    t = st.swap("refs/a/HEAD", b"2", t)
    st.swap("refs/a/HEAD", b"3", t)
    st.swap("refs/b/x", b"1", None)
    mark2, keys = st.swaps_since(mark) or ("", [])
    assert keys == ["refs/a/HEAD", "refs/a/HEAD", "refs/b/x"]
    assert st.swaps_since(mark2) == (mark2, [])  # nothing since: one stat and one short read
    st.delete("refs/b/x")  # a plain delete of a ref is logged too (under its lock)
    st.delete("refs/b/never")  # nothing there: nothing logged
    mark3, keys = st.swaps_since(mark2) or ("", [])
    assert keys == ["refs/b/x"]
    st.write("objects/ab/cd", b"x")
    st.delete("objects/ab/cd")  # objects are not refs: not logged
    assert st.swaps_since(mark3) == (mark3, [])


def test_swap_log_cannot_be_trusted_after_a_reboot_a_replaced_log_or_a_torn_line(tmp_path: Path) -> None:
    st = open_storage(str(tmp_path / "s"))
    assert isinstance(st, LocalStorage)
    st.swap("refs/a/HEAD", b"1", None)
    mark, _ = st.swaps_since(None) or ("", [])
    boot, ino, off = mark.split(":")
    assert st.swaps_since(f"other-boot:{ino}:{off}")[1] is None  # type: ignore[index]
    assert st.swaps_since(f"{boot}:{ino}:{int(off) + 99}")[1] is None  # type: ignore[index]
    log = tmp_path / "s" / SWAP_LOG
    with open(log, "ab") as f:
        f.write(b"12 refs/sess")  # a write that failed halfway, then a whole line after it
    mark2, keys = st.swaps_since(mark) or ("", [])
    assert keys == []  # the torn tail alone waits: it may still be being written
    st.swap("refs/b/HEAD", b"1", None)
    assert st.swaps_since(mark)[1] is None  # type: ignore[index]  # garbled: read everything
    log.unlink()
    log.write_bytes(b"")  # replaced (a new inode): the old mark means nothing
    assert st.swaps_since(mark2)[1] is None  # type: ignore[index]


def test_pending_swaps_are_the_keys_whose_lock_is_held(tmp_path: Path) -> None:
    st = open_storage(str(tmp_path / "s"))
    assert isinstance(st, LocalStorage)
    st.swap("refs/sessions/a/u/s/HEAD", b"1", None)
    assert st.pending_swaps("refs/sessions") == []
    (tmp_path / "s" / "refs" / "sessions" / "a" / "u" / "s" / "HEAD.lock").write_bytes(b"")
    assert st.pending_swaps("refs/sessions") == ["refs/sessions/a/u/s/HEAD"]


# -- freshness of the index ----------------------------------------------------------------------
def test_unchanged_store_is_searched_without_reading_any_ref(store: castore.Store,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _age_ref_folders(Path(store.storage.root))  # changed long ago: their stamps are kept (a tick ago: read once more)
    assert len(_texts(store, "parser")) == 6  # builds the index
    reads: list[object] = []
    real = castore.Store.session_refs_and_heads

    def counting(st: castore.Store, folders: object = None, lost: object = None) -> dict:
        reads.append(sorted(folders) if folders is not None else "all")  # type: ignore[call-overload]
        return real(st, folders, lost)  # type: ignore[arg-type]

    monkeypatch.setattr(castore.Store, "session_refs_and_heads", counting)
    assert len(_texts(store, "parser")) == 6
    assert reads == []  # nothing moved: no ref read at all
    store.session("bot", "ann", "s1").append({"role": "user", "content": "a parser walrus"})
    assert _texts(store, "walrus") == ["a parser walrus"]
    assert reads == [["sessions/bot/ann/s1"]]  # only the moved session's refs
    assert open_index(store).rebuilt == []


def test_every_kind_of_change_after_indexing_is_seen(store: castore.Store) -> None:
    assert _texts(store, "walrus") == []
    s0 = store.session("bot", "ann", "s0")
    s0.append({"role": "user", "content": "walrus one"})
    assert _texts(store, "walrus") == ["walrus one"]
    assert open_index(store).rebuilt == []
    s0.checkout("HEAD~1", create="alt")  # a new branch: the old tip stays on main
    s0.append({"role": "user", "content": "walrus two"})
    assert sorted(_texts(store, "walrus")) == ["walrus one", "walrus two"]
    s0.fork("s9")  # a new session sharing s0's commits: reported once, the other under "also"
    ms = list(grep(store, "walrus two"))
    assert len(ms) == 1 and ms[0].also and ms[0].also[0][0] == ("bot", "ann", "s9")
    store.delete_session("bot", "ann", "s0")
    assert _texts(store, "walrus") == ["walrus two"]  # still held by the fork
    store.delete_session("bot", "ann", "s9")
    assert _texts(store, "walrus") == []
    store.session("bot", "ann", "s05").append({"role": "user", "content": "walrus again"})  # a new s0
    store.session("bot", "ann", "a0").append({"role": "user", "content": "walrus first"})  # sorts first
    assert _texts(store, "walrus") == ["walrus first", "walrus again"]
    assert open_index(store).rebuilt == []
    assert list(grep(store, "parser", index=True)) == list(grep(store, "parser", index=False))


def test_refs_removed_by_hand_are_seen_by_the_next_search(store: castore.Store,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's folder or a branch file removed by hand is not in the swap log, which only
    castore's own writers append to: a search through the index kept reporting the gone
    session's lines and the gone branch's (matches, counts and the CLI alike). The index now
    keeps a stamp of each session's ref folder (the times of the folder and its ``heads/``) and
    compares those of the sessions a search found: a changed one is read again before the
    search answers. An unchanged store still reads no ref."""
    from click.testing import CliRunner

    from castore.cli import main

    s1 = store.session("bot", "ann", "s1")
    s1.branch("side")
    s1.checkout("side")
    s1.append({"role": "user", "content": "a parser only side has"})
    s1.checkout("main")
    assert len(_texts(store, "parser")) == 7
    root = Path(store.storage.root)
    (root / "refs" / "sessions" / "bot" / "ann" / "s1" / "heads" / "side").unlink()
    assert "a parser only side has" not in _texts(store, "parser")
    assert _texts(store, "parser") == _texts(store, "parser", index=False)
    for p in sorted((root / "refs" / "sessions" / "bot" / "ann" / "s2").rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    (root / "refs" / "sessions" / "bot" / "ann" / "s2").rmdir()
    keys = {m.session for m in grep(store, "parser")}
    assert keys == {("bot", "ann", "s0"), ("bot", "ann", "s1")}
    assert list(grep_counts(store, "parser")) == [("bot", "ann", "s0"), ("bot", "ann", "s1")]
    res = CliRunner().invoke(main, ["--store", str(root), "grep", "-l", "parser"])
    assert res.exit_code == 0 and "s2" not in res.stdout and "s1" in res.stdout, res.output

    reads: list[object] = []
    real = castore.Store.session_refs_and_heads

    def counting(st: castore.Store, folders: object = None, lost: object = None) -> dict:
        reads.append(folders)
        return real(st, folders, lost)  # type: ignore[arg-type]

    _age_ref_folders(root)  # stamps taken within a tick of a change are not kept: read once more
    assert len(_texts(store, "parser")) == 4
    monkeypatch.setattr(castore.Store, "session_refs_and_heads", counting)
    assert len(_texts(store, "parser")) == 4
    assert reads == []  # nothing moved since: no ref read


def _age_ref_folders(root: Path, seconds: int = 3600) -> None:
    """Set the time of every session's ``heads/`` ``seconds`` back, as if changed long ago."""
    for heads in (root / "refs" / "sessions").rglob("heads"):
        t = heads.stat().st_mtime_ns - seconds * 10**9
        os.utime(heads, ns=(t, t))


def test_a_branch_removed_in_the_tick_of_the_stamp_is_seen(store: castore.Store,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A session's stamp is its ``heads/`` folder's time, and a file system's times tick coarsely
    (a few ms on Linux, 2 s on FAT): a branch file removed by hand in the tick of the folder's
    last change, the one the stamp was read in, left the time as it was, and the search kept
    reporting the gone branch's lines. A stamp read within :data:`SETTLE_NS` of the folder's
    change (here the folder's time is the read's own tick, or after) is now kept as unsettled,
    which no later stamp equals: the next search reads that session's refs again."""
    from castore.storage.base import UNSETTLED
    from castore.storage.local import SETTLE_NS

    s1 = store.session("bot", "ann", "s1")
    s1.branch("side")
    s1.checkout("side")
    s1.append({"role": "user", "content": "a parser only side has"})
    s1.checkout("main")
    root = Path(store.storage.root)
    _age_ref_folders(root)
    heads = root / "refs" / "sessions" / "bot" / "ann" / "s1" / "heads"
    tick = time.time_ns() + 60 * 10**9  # the folder's time: the tick the stamp is read in (or later)
    os.utime(heads, ns=(tick, tick))
    assert "a parser only side has" in _texts(store, "parser")
    stamps = {tuple(r[:3]): r[9] for r in open_index(store).rows}
    assert stamps[("bot", "ann", "s1")] == UNSETTLED
    assert stamps[("bot", "ann", "s0")] == (root / "refs" / "sessions" / "bot" / "ann" / "s0" / "heads").stat().st_mtime_ns
    (heads / "side").unlink()
    os.utime(heads, ns=(tick, tick))  # removed in the same tick: the folder's time as it was
    assert "a parser only side has" not in _texts(store, "parser")
    assert _texts(store, "parser") == _texts(store, "parser", index=False)

    # a folder whose change is older than a tick is stamped with its time, and not read again
    old = time.time_ns() - 2 * SETTLE_NS
    os.utime(heads, ns=(old, old))
    assert len(_texts(store, "parser")) == 6  # its stamp changed: read again (the index unchanged)
    assert {tuple(r[:3]): r[9] for r in open_index(store).rows}[("bot", "ann", "s1")] == old
    reads: list[object] = []
    real = castore.Store.session_refs_and_heads

    def counting(st: castore.Store, folders: object = None, lost: object = None) -> dict:
        reads.append(folders)
        return real(st, folders, lost)  # type: ignore[arg-type]

    monkeypatch.setattr(castore.Store, "session_refs_and_heads", counting)
    assert len(_texts(store, "parser")) == 6
    assert reads == []


def test_a_change_under_way_while_indexing_is_seen_next_time(store: castore.Store, tmp_path: Path) -> None:
    st = store.storage
    assert isinstance(st, LocalStorage)
    store.session("bot", "ann", "s1").fork("s1x")
    store.session("bot", "ann", "s1x").append({"role": "user", "content": "walrus"})
    assert _texts(store, "walrus", sessions=["s1"]) == []
    refs = tmp_path / "store" / "refs" / "sessions" / "bot" / "ann"
    ref, lock = refs / "s1" / "heads" / "main", refs / "s1" / "heads" / "main.lock"
    # A writer of s1 between logging its change and landing it: its line is in the log and
    # its lock is held, but the ref still names the old tip while the index reads it.
    swaplog.log_swap(st.root, "refs/sessions/bot/ann/s1/heads/main", st.url)
    lock.write_bytes(ref.read_bytes())
    assert _texts(store, "walrus", sessions=["s1"]) == []
    # It lands (the rename that ends a swap): s1's main now names s1x's tip.
    lock.write_bytes((refs / "s1x" / "heads" / "main").read_bytes())
    os.replace(lock, ref)
    assert _texts(store, "walrus", sessions=["s1"]) == ["walrus"]  # the mark did not pass it


def test_index_is_rebuildable_from_scratch_and_damaged_files_are_rebuilt(store: castore.Store) -> None:
    want = list(grep(store, "parser", kinds=["text", "tool_call", "tool_result"], index=False))
    assert list(grep(store, "parser", kinds=["text", "tool_call", "tool_result"])) == want
    folder = Path(index_dir(store))
    for name in ("main.z", "main.rec", "res.flt", "res.off", "commits", "state.json"):
        f = folder / name if name == "state.json" else next(folder.glob(f"g*.{name}"))  # the segment's
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x55  # one flipped bit pattern in the middle
        f.write_bytes(bytes(data))
        assert list(grep(store, "parser", kinds=["text", "tool_call", "tool_result"])) == want, name
    for f in folder.iterdir():
        f.unlink()
    folder.rmdir()
    assert list(grep(store, "parser", kinds=["text", "tool_call", "tool_result"])) == want
    assert (folder / "state.json").exists()


def test_fast_match_equals_a_built_match() -> None:
    """The index path's Match builder gives what Match(...) gives: same fields, equal, frozen."""
    import dataclasses

    from castore.grep.match import LineMatch, Match, make_match

    lines = (LineMatch(1, "a parser here", ((2, 8),)),)
    fast = make_match("ab" * 32, ("app", "u", "s"), ("main",), "user", "text", None, 1.5, lines, 2)
    built = Match("ab" * 32, ("app", "u", "s"), ("main",), "user", "text", None, 1.5, lines, context=2)
    assert fast == built and hash(fast) == hash(built) and repr(fast) == repr(built)
    assert set(vars(fast)) == {f.name for f in dataclasses.fields(Match)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.role = "assistant"  # type: ignore[misc]
    from castore.grep.match import make_line_match

    line = make_line_match(3, "x parser", ((2, 8),))
    assert line == LineMatch(3, "x parser", ((2, 8),)) and hash(line) == hash(LineMatch(3, "x parser", ((2, 8),)))
    assert repr(line) == repr(LineMatch(3, "x parser", ((2, 8),)))


def test_index_order_holds_when_sessions_are_numbered_out_of_session_order(store: castore.Store) -> None:
    """A session added after the index was built gets the next number but may sort first; a
    fork shares commits: the index gives the scan's matches, in its order, over both parts."""
    open_index(store)
    store.session("aaa", "zed", "first").append({"role": "user", "content": "an early parser"}, time=T0 - 5)
    store.session("bot", "ann", "s1").fork("s05", at="HEAD~1")
    store.session("bot", "ann", "s05").append({"role": "user", "content": "the fork's parser"}, time=T0 + 9)
    for kinds in (None, ["text", "thinking", "tool_call", "tool_result"], ["tool_result"]):
        got = list(grep(store, "parser", kinds=kinds, index=True))
        assert got == list(grep(store, "parser", kinds=kinds, index=False))
        assert got and (got[0].session == ("aaa", "zed", "first")) == (kinds != ["tool_result"])


def test_plain_string_found_in_the_bytes_of_non_ascii_text(store: castore.Store) -> None:
    """Blocks whose bytes outnumber their characters: the plain-string search runs over the
    bytes and maps them to the right blocks and spans, case-sensitively or not."""
    s = store.session("bot", "ann", "s9")
    s.append_many([{"role": "user", "content": "ééé ПАРСЕР parser"}, {"role": "user", "content": "plain parser"},
                   {"role": "user", "content": "日本語\nthen Parser, ſparser"}], time=T0)
    for pattern in ("parser", "Parser", "парсер", "ПАРСЕР", "語"):
        got = list(grep(store, pattern, sessions=["s9"], index=True))
        assert got == list(grep(store, pattern, sessions=["s9"], index=False)), pattern
        assert got and all(lm.text[a:b].lower() == pattern.lower() for m in got for lm in m.lines for a, b in lm.spans)


def test_iso_time_by_arithmetic_is_what_datetime_writes() -> None:
    """The match time as text: the arithmetic of iso_time gives datetime's own text, around
    second, minute, day and year ends and where microseconds round up into the next second."""
    import random

    from castore.grep.filters import _iso_by_datetime, iso_time

    rng = random.Random(5)
    times = [0.0, 5e-324, 0.4999999e-6, 0.5e-6, 1.5e-6, 0.9999994, 0.9999995, 0.99999949, 59.9999996, 86399.9999995,
             T0, T0 + 0.123, T0 + 0.9995, 951782399.9999996, 253370764799.9999]
    times += [rng.uniform(0, 253370764800.0) for _ in range(20000)]
    times += [rng.randrange(0, 2 ** 34) + 0.9999994 + rng.random() * 2e-7 for _ in range(20000)]
    assert [iso_time(t) for t in times] == [_iso_by_datetime(t) for t in times]
    assert iso_time(-1.5) == "1969-12-31T23:59:58.500Z" and iso_time(None) is None


def test_case_insensitive_ascii_pattern_finds_long_s_and_dotless_i(store: castore.Store) -> None:
    """Python's case-insensitive s matches ſ and i matches ı, whose lower case is themselves:
    the index finds them as the scan does."""
    store.session("bot", "ann", "s8").append_many([{"role": "user", "content": "a parſer"},
                                                   {"role": "user", "content": "the ınput"}], time=T0)
    for pattern in ("parser", "input", "in.ut", "ſ"):
        got = list(grep(store, pattern, sessions=["s8"], index=True))
        assert got == list(grep(store, pattern, sessions=["s8"], index=False)) and got, pattern


# -- segments: an update writes the sessions that moved, not the whole index ---------------------
def _segments(store: castore.Store) -> list[str]:
    return [g["name"] for g in open_index(store).segments]


def _same_as_scan(store: castore.Store) -> None:
    for kinds in (None, ["text", "thinking", "tool_call", "tool_result"], ["tool_result"]):
        for pattern in ("parser", "walrus", "PARSER", "answer [0-9]", "^question"):
            got = list(grep(store, pattern, kinds=kinds, index=True))
            assert got == list(grep(store, pattern, kinds=kinds, index=False)), (pattern, kinds)


def test_each_session_is_searched_under_its_key_whatever_its_head_records(store: castore.Store) -> None:
    """The index named each session by the names its HEAD recorded (any writer's: an older
    castore's HEAD has none, a damaged one anything): a HEAD without them left its session out of
    every indexed search, one naming another session hid that one, one not an object failed the
    search; the scan names every session by its key."""
    for sid, said in (("s0", ["not", "an", "object"]), ("s1", {"app": "bot", "user": "ann", "session": "s2"}),
                      ("s2", None)):
        h = store.refs.read(f"sessions/bot/ann/{sid}/HEAD")
        assert h is not None
        meta = {k: v for k, v in h.meta.items() if k not in ("w", "names")}
        store.plumbing.swap(h.name, h.target, h, meta if said is None else {**meta, "names": said})
    _same_as_scan(store)
    assert len(_texts(store, "question")) == 3


def test_updates_go_to_a_delta_and_stay_correct_through_every_kind_of_change(
        store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import castore.grep.index as gi

    monkeypatch.setattr(gi, "COMPACT", 100.0)  # never a new base: every update is a delta
    for n in range(3, 8):
        store.session("bot", "ann", f"s{n}").append({"role": "user", "content": f"parser {n}"}, time=T0 + n)
    base = _segments(store)
    assert len(base) == 1
    s1 = store.session("bot", "ann", "s1")
    s1.append({"role": "user", "content": "a walrus parser"})
    ix = open_index(store)
    assert ix.rebuilt == [("bot", "ann", "s1")] and [g["name"] for g in ix.segments][0] == base[0]
    assert len(ix.segments) == 2  # the base kept, s1 in a delta
    _same_as_scan(store)
    steps = [
        lambda: s1.append({"role": "assistant", "content": "walrus two"}),  # the delta's own session moves
        lambda: store.session("bot", "ann", "s4").append({"role": "user", "content": "walrus four"}),
        lambda: s1.checkout("HEAD~2", create="alt"),
        lambda: s1.append({"role": "user", "content": "walrus on alt"}),
        lambda: s1.fork("s15"),  # a new session sharing s1's commits (reported once, with "also")
        lambda: store.delete_session("bot", "ann", "s4"),  # the index built again, without it
        lambda: store.session("aaa", "bob", "first").append({"role": "user", "content": "walrus first parser"}),
        lambda: store.delete_session("bot", "ann", "s1"),
        lambda: store.session("bot", "ann", "s4").append({"role": "user", "content": "walrus again"}),  # back
    ]
    for n, step in enumerate(steps):
        step()
        _same_as_scan(store)
        if n == 4:
            assert any(m.also for m in grep(store, "walrus on alt"))
        names = _segments(store)
        if n in (5, 7):  # a delete: nothing of the session may stay, so one new base
            assert len(names) == 1 and names[0] != base[0]
            base = names
            continue
        assert len(names) == 2 and names[0] == base[0]
    folder = Path(index_dir(store))
    live = {f.name.split(".", 1)[0] for f in folder.iterdir() if f.name.startswith("g")}
    assert live == set(_segments(store))  # the replaced deltas' files are gone
    assert open_index(store).rebuilt == []


def test_a_new_base_when_the_dead_blocks_and_the_delta_pass_compact(
        store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import castore.grep.index as gi

    for n in range(3, 12):
        store.session("bot", "ann", f"s{n}").append_many([{"role": "user", "content": f"parser {n}.{k}"}
                                                          for k in range(4)], time=T0 + n)
    first = _segments(store)  # 48 blocks
    monkeypatch.setattr(gi, "COMPACT", 0.25)
    store.session("bot", "ann", "s0").append({"role": "user", "content": "walrus"})
    after_one = _segments(store)
    # s0's 4 blocks dead in the base and 5 in the delta: under a quarter of the base, a delta
    assert len(after_one) == 2 and after_one[0] == first[0]
    for n in (1, 2, 3):
        store.session("bot", "ann", f"s{n}").append({"role": "user", "content": "walrus"})
    names = _segments(store)
    assert len(names) == 1 and names != first  # past a quarter: everything in one new base
    _same_as_scan(store)
    assert [m.lines[0].text for m in grep(store, "walrus")] == ["walrus"] * 4


def test_a_search_reading_an_index_that_an_update_replaces_meanwhile(store: castore.Store) -> None:
    """A reader opens the files state.json names when it loads; an update that removes them
    afterwards does not disturb it (mapped files stay readable), and one that removes them
    before the reader opens them sends it back to state.json."""
    import castore.grep.index as gi

    open_index(store)
    reader = gi.Index(store)
    assert reader._load()
    store.session("bot", "ann", "s0").append({"role": "user", "content": "walrus"})
    ix = open_index(store)  # three sessions: s0 is a third: a new base, the old files removed
    assert len(ix.segments) == 1 and ix.segments[0]["name"] != reader.segments[0]["name"]
    assert [i for _, idx in reader.find_blocks(re.compile("parser")) for i in idx]  # still reads its own
    late = gi.Index(store)
    real = late._load_once
    calls = []

    def racing() -> bool:
        if not calls:  # the first try finds a state whose files are gone
            calls.append(1)
            raise FileNotFoundError("g0.main.txt")
        calls.append(2)
        return real()

    late._load_once = racing  # type: ignore[method-assign]
    assert late._load() and calls == [1, 2]


def test_the_index_is_checked_by_crc_only_when_a_file_was_written_since(store: castore.Store,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import zlib

    _age_ref_folders(Path(store.storage.root))  # settled stamps: no session's refs read again
    want = _texts(store, "parser")
    crcs: list[int] = []
    crc32 = zlib.crc32
    monkeypatch.setattr(zlib, "crc32", lambda d: crcs.append(len(d)) or crc32(d))  # files.py imports zlib when it checks
    assert _texts(store, "parser") == want and crcs == []  # as written: size and fstat only
    f = next(Path(index_dir(store)).glob("g*.main.rec"))
    os.utime(f, ns=(0, 0))  # touched, same bytes: its CRC is read, and it passes
    assert _texts(store, "parser") == want and crcs == [f.stat().st_size]


def test_a_writer_that_finds_the_index_updated_by_another_looks_again(store: castore.Store) -> None:
    """Two searches after an append: the one that takes the writers' lock second finds the state
    written meanwhile, loads it, and saves only its newer mark (taking the lock it holds again)."""
    import castore.grep.index as gi

    open_index(store)
    store.session("bot", "ann", "s0").append({"role": "user", "content": "walrus"})
    late = gi.Index(store)
    assert late._load() and late._plan(True) is not None  # it sees s0 moved, and waits for the lock
    first = open_index(store)  # another search updates the index meanwhile
    assert first.rebuilt == [("bot", "ann", "s0")]
    store.storage.swap("refs/other", b"1", None)  # an unrelated ref moves: the swap log's mark moves on
    with late._locked():
        assert late._stat != stat_of(os.path.join(late.folder, "state.json"))
        assert late._load() and late._plan(True) is None  # nothing to extract: only the mark saved
    assert late.rebuilt == [] and late.mark == open_index(store).mark
    assert _texts(store, "walrus") == ["walrus"]


def test_files_of_an_older_index_are_removed_when_it_is_rebuilt(store: castore.Store) -> None:
    folder = Path(index_dir(store))
    folder.mkdir(parents=True)
    (folder / "state.json").write_text('{"version": 5}')
    (folder / "main.txt").write_bytes(b"an index of an older castore")
    want = list(grep(store, "parser", index=False))
    assert list(grep(store, "parser")) == want
    state = json.loads((folder / "state.json").read_text())
    named = {f"{g['name']}.{k}" for g in state["segments"] for k in g["files"]} | {state["refs"][0]}
    assert {f.name for f in folder.iterdir()} == named | {"state.json", "lock"}


def test_chunks_filters_and_folding_characters_find_what_the_scan_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small chunks (many per part, most of them left by their trigram filter): every kind of
    pattern finds through the index what it finds by reading the store, a case-insensitive
    one in text whose only match is a character that folds to ASCII (the Kelvin sign, long s)."""
    import castore.grep.files as gf

    monkeypatch.setattr(gf, "CHUNK", 64)
    monkeypatch.setattr(gf, "CACHE_BYTES", 200)  # a few chunks kept at once: the others read again
    st = castore.open(str(tmp_path / "store"), durable=False)
    words = ["alpha beta", "gamma delta parser", "epsilon zeta", "eta theta iota"]
    for n in range(4):
        st.session("bot", "ann", f"s{n}").append_many(
            [{"role": "user", "content": f"{words[k % 4]} {n}.{k}"} for k in range(12)]
            + [{"role": "assistant", "content": "a \u212aelvin walrus, a cla\u017fs"},
               {"role": "user", "content": "the walrus rare-word zanzibar"}], time=T0 + n)
    folder = Path(index_dir(st))
    for pattern in ("zanzibar", "ZANZIBAR", "kelvin", "class", "walrus rare", "parser 2", "et", "^gamma",
                    "delta$", "z[ae]ta", "(?<!a )walrus", "parser", "x"):
        want = list(grep(st, pattern, index=False))
        assert list(grep(st, pattern)) == want, pattern
        assert sum(grep_counts(st, pattern).values()) == len(want), pattern
    assert len(list(folder.glob("g*.main.z"))) == 1
    ix = open_index(st)
    assert ix.segs[0].parts["main"].chunks > 8  # one chunk per block or two
    assert [m.lines[0].text for m in grep(st, "kelvin")] == ["a \u212aelvin walrus, a cla\u017fs"] * 4


def test_chunks_kept_by_the_process_are_known_by_their_file_not_their_name(store: castore.Store) -> None:
    """The process keeps decompressed chunks across searches; an index built again from scratch
    reuses the segment names, and a search still reads the new files' text, not the kept one."""
    import shutil

    assert _texts(store, "parser", index=True) == _texts(store, "parser", index=False)
    shutil.rmtree(index_dir(store))
    store.session("bot", "ann", "s0").append({"role": "user", "content": "a walrus parser"})
    assert _texts(store, "walrus") == ["a walrus parser"]
    assert _texts(store, "parser", index=True) == _texts(store, "parser", index=False)


def test_a_chunk_framed_with_a_longer_shortest_match_reads_back_as_written() -> None:
    """frame_block's ``min_match`` (the index's chunks: 6) is applied, and unframe reads the frame
    back: text whose repeats are 4 or 5 bytes long frames otherwise than at the level's own (4)."""
    import random

    from castore.frames import frame_block, unframe

    rnd = random.Random(7)
    words = ["".join(rnd.choice("abcdefghij") for _ in range(5)) for _ in range(40)]
    data = "".join(rnd.choice(words) + rnd.choice("0123456789") for _ in range(6000)).encode()
    longer, own = frame_block(data, 9, min_match=6), frame_block(data, 9)
    assert longer != own and longer[:1] == own[:1] == b"\x01"
    assert unframe(longer) == unframe(own) == data


def test_chunks_framed_with_a_shortest_match_share_a_compressor_per_parameters() -> None:
    """frame_block with ``min_match`` reuses one compressor for every frame zstd picks the same
    parameters for (not one per frame), and a reused compressor frames each block as a new one
    would: the same bytes, whatever it framed before (a smaller block, of other parameters,
    between)."""
    import random

    import zstandard

    from castore import frames
    from castore.frames import frame_block

    rnd = random.Random(11)
    words = [bytes(rnd.choice(b"abcdefghij") for _ in range(7)) for _ in range(60)]
    blocks = [b" ".join(rnd.choice(words) for _ in range(n)) for n in (5000, 4000, 300, 5200, 20000, 4500)]

    def fresh(data: bytes) -> bytes:
        params = zstandard.ZstdCompressionParameters.from_level(9, source_size=len(data), min_match=6)
        return b"\x01" + zstandard.ZstdCompressor(compression_params=params).compress(data)

    frames._match_compressors.clear()
    assert [frame_block(b, 9, min_match=6) for b in blocks] == [fresh(b) for b in blocks]
    pools = len(frames._match_compressors)
    assert 1 < pools < len(blocks)  # blocks of 36-42 KB share one; a 2 KB and a 160 KB block their own
    assert [frame_block(b, 9, min_match=6) for b in reversed(blocks)] == [fresh(b) for b in reversed(blocks)]
    assert len(frames._match_compressors) == pools
