"""What a process that searches once keeps (:func:`castore.grep.files.keep_chunks`): the same
matches, and only the text of the chunks a match was found in, as written (no lower-cased copy),
or of the blocks found alone where they are a few of their chunk's, so that one chunk's memory
is used again for the next (``castore grep`` in a fresh process)."""

from __future__ import annotations

from pathlib import Path

import pytest

import castore
import castore.grep.files as gf
from castore.grep import grep, grep_counts, grep_rows
from castore.grep.index import open_index

T0 = 1_760_000_000.0


@pytest.fixture(params=[64, 512])
def small_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> castore.Store:
    """A store whose index holds a chunk per block or two (most of them left by the filters), or
    one per 20 blocks or so."""
    monkeypatch.setattr(gf, "CHUNK", request.param)
    monkeypatch.setattr(gf, "_cache", {})
    monkeypatch.setattr(gf, "_cache_size", [0])
    st = castore.open(str(tmp_path / "store"), durable=False)
    words = ["alpha beta", "gamma delta parser", "epsilon zeta", "eta theta iota"]
    for n in range(4):
        st.session("bot", "ann", f"s{n}").append_many(
            [{"role": "user", "content": f"{words[k % 4]} {n}.{k}"} for k in range(12)]
            + [{"role": "user", "content": "the walrus Rare-Word zanzibar"}], time=T0 + n)
    assert open_index(st).segs[0].parts["main"].chunks > (8 if request.param == 64 else 1)
    return st


def _cached() -> tuple[set[int], int]:
    """The chunks kept as written, and how many lower-cased copies are kept."""
    keys = list(gf._cache)
    return {k[1] for k in keys if len(k) == 2}, sum(1 for k in keys if len(k) == 3)


@pytest.mark.parametrize("pattern", ["zanzibar", "ZANZIBAR", "rare-word", "iota", "z[ae]ta", "^gamma", "parser"])
def test_a_search_once_finds_the_same_and_keeps_only_the_chunks_it_found_in(
        small_chunks: castore.Store, pattern: str) -> None:
    st = small_chunks
    want = list(grep(st, pattern, index=False))
    gf._cache.clear()
    with gf.keep_chunks(False):
        rows = list(grep_rows(st, pattern))
        kept, lowered = _cached()
        counts = grep_counts(st, pattern)
        assert list(grep(st, pattern)) == want
    assert lowered == 0  # no lower-cased copy kept
    # a chunk kept holds a match: as many as the matches at most (none for none), of all the chunks
    assert len(kept) <= len(want)
    assert len(kept) < open_index(st).segs[0].parts["main"].chunks or pattern == "parser" or gf.CHUNK > 64
    assert len(rows) == len(want) and sum(counts.values()) == len(want)
    assert [r[0] for r in rows] == [m.commit for m in want]


def test_a_search_once_keeps_nothing_of_a_word_nowhere_and_the_default_is_back_after(
        small_chunks: castore.Store) -> None:
    st = small_chunks
    gf._cache.clear()
    with gf.keep_chunks(False):
        assert grep_counts(st, "walrus zanzibar") == {}  # chunks read (their filters let them through)
        assert _cached() == (set(), 0)
    assert grep_counts(st, "walrus rare") != {}
    kept, lowered = _cached()
    assert kept and lowered  # a library user's process keeps what it read, lowered too


def test_a_search_once_keeps_the_blocks_of_a_rare_word_alone_and_the_chunk_of_a_common_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gf, "CHUNK", 1 << 15)
    monkeypatch.setattr(gf, "_cache", {})
    monkeypatch.setattr(gf, "_cache_size", [0])
    st = castore.open(str(tmp_path / "store"), durable=False)
    st.session("bot", "ann", "s").append_many(
        [{"role": "user", "content": f"entry {k} parser {'zanzibar' if k == 7 else 'x'}"} for k in range(100)],
        time=T0)
    p = open_index(st).segs[0].parts["main"]
    assert p.chunks == 1
    with gf.keep_chunks(False):
        found = p.find_plain(b"zanzibar", True)
        assert _cached() == (set(), 0)  # one block of 100 found: its text alone is kept, in the part
        assert [p.block(i) for i in found] == ["entry 7 parser zanzibar"] and _cached() == (set(), 0)
        many = p.find_plain(b"parser", False)
        assert len(many) == 100 and _cached() == ({0}, 0)  # most of the chunk: the chunk is kept
    assert p.block(many[3]) == "entry 3 parser x"


@pytest.mark.parametrize("keep", [True, False])
def test_find_plain_gives_each_block_holding_the_needle_once_as_a_block_by_block_search_does(
        monkeypatch: pytest.MonkeyPatch, keep: bool) -> None:
    """A part of several chunks whose blocks hold the needle at their start, at their end, several
    times, overlapping itself, in the last block of a chunk, or not at all; in its lower case only:
    the blocks found are exactly those a search of each block's text alone finds."""
    monkeypatch.setattr(gf, "CHUNK", 80)
    monkeypatch.setattr(gf, "_cache", {})
    monkeypatch.setattr(gf, "_cache_size", [0])
    texts = ["aaaa", "xaa", "aax", "", "a", "b aa b aa", "AA", "aA", "none", "a a", "aa",
             "zz aaa zz " * 5, "x", "aa", "bash", "xBashx", "zzZ", "ZZZ zzz", "zzz"] * 3
    p = gf.Part().begin()
    for n, text in enumerate(texts):
        p.add((0, 0, n, 0, 0, -1, 0, n), 0.0, text)
    p.files()
    assert p.chunks > 3
    for needle, lowered in ((b"aa", False), (b"aa", True), (b"aaa", False), (b"a a", False), (b"zz", True),
                            (b"bash", True), (b"bash", False), (b"zzz", True), (b"aaa", True), (b"a a", True)):
        want = [n for n, t in enumerate(texts) if needle in (t.lower() if lowered else t).encode()]
        with gf.keep_chunks(keep):
            assert p.find_plain(needle, lowered) == want, (needle, lowered)


def test_a_chunk_that_does_not_decompress_fails_the_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged chunk among many fails the search with a ValueError, whether the search keeps
    its chunks or not (the caller rebuilds the index)."""
    monkeypatch.setattr(gf, "CHUNK", 80)
    monkeypatch.setattr(gf, "_cache", {})
    monkeypatch.setattr(gf, "_cache_size", [0])
    p = gf.Part().begin()
    for n in range(40):
        p.add((0, 0, n, 0, 0, -1, 0, n), 0.0, f"block {n} of a part, parser and more words")
    p.files()
    assert p.chunks > 5
    assert len(p.find_plain(b"parser", True)) == 40
    gf._cache.clear()
    z = bytearray(p.z)
    z[p.cstarts[5]] = 0x7F  # an unknown frame header
    p.z = bytes(z)
    for keep in (True, False):
        with gf.keep_chunks(keep), pytest.raises(ValueError, match="unknown header"):
            p.find_plain(b"parser", True)


def test_a_count_once_keeps_only_the_blocks_it_reads_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A count in a process that searches once keeps nothing of the blocks it counts unread (all of
    a case-sensitive word's, the ASCII ones of a lowered word's) and the text alone of the others
    (a lowered word's blocks that are not ASCII, matched again), and counts what a search keeping
    everything counts."""
    monkeypatch.setattr(gf, "CHUNK", 1 << 15)
    monkeypatch.setattr(gf, "_cache", {})
    monkeypatch.setattr(gf, "_cache_size", [0])
    st = castore.open(str(tmp_path / "store"), durable=False)
    texts = [f"entry {k} Parser caf\u00e9" if k % 10 == 0 else f"entry {k} parser x" for k in range(100)]
    st.session("bot", "ann", "s").append_many([{"role": "user", "content": t} for t in texts], time=T0)
    p = open_index(st).segs[0].parts["main"]
    assert p.chunks == 1
    with gf.keep_chunks(False):
        found = p.find_plain(b"parser", True, counting=True)
        assert len(found) == 100 and _cached() == (set(), 0)
        assert {i: p.block(i) for i in p._found} == {i: texts[i] for i in range(0, 100, 10)}
        p._found.clear()
        assert p.find_plain(b"parser", False, counting=True) == [i for i in range(100) if i % 10]
        assert _cached() == (set(), 0) and not p._found
        assert p.find_plain(b"parser", True) == found and _cached() == ({0}, 0)  # not a count: the chunk
        gf._cache.clear()
        p._found.clear()
        once = (grep_counts(st, "parser"), grep_counts(st, "Parser"), grep_counts(st, "caf\u00e9"))
    assert once == ({("bot", "ann", "s"): 100}, {("bot", "ann", "s"): 10}, {("bot", "ann", "s"): 10})
    assert once == (grep_counts(st, "parser"), grep_counts(st, "Parser"), grep_counts(st, "caf\u00e9"))


def test_a_case_insensitive_word_lowers_only_the_chunks_whose_cased_words_may_hold_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lower-case word is sought in the text as it is in a chunk none of whose cased words
    (those bytes.lower() changes) has one of its trigrams, and in the lowered text of the others:
    the blocks found are the same as in a lowered search of every chunk."""
    monkeypatch.setattr(gf, "CHUNK", 64)
    monkeypatch.setattr(gf, "_cache", {})
    monkeypatch.setattr(gf, "_cache_size", [0])
    st = castore.open(str(tmp_path / "store"), durable=False)
    st.session("bot", "ann", "s").append_many(
        [{"role": "user", "content": f"the parser {k} and more words to fill a chunk"} for k in range(20)]
        + [{"role": "user", "content": "a Parser here, a PARSER there"}]
        + [{"role": "user", "content": f"a Bash call {k}, still the parser's words of a chunk"} for k in range(3)],
        time=T0)
    p = open_index(st).segs[0].parts["main"]
    assert p.chunks > 10
    cased = p.cased(gf.filter_bits(b"parser"))
    assert sum(1 for x in cased if x) == 1  # the chunk of "Parser" and "PARSER" alone
    assert grep_counts(st, "parser") == {("bot", "ann", "s"): 24}
    assert _cached()[1] == 1  # one lower-cased chunk kept: the one whose cased words may hold it
    assert grep_counts(st, "PARSER") == {("bot", "ann", "s"): 1}


def test_ascii_blocks_says_whether_every_block_of_a_range_is_ascii() -> None:
    """Part.ascii_blocks(first, end): True when each of blocks first to end - 1 is ASCII text,
    False as soon as one is not (a count checks a run's range with it before each block)."""
    p = gf.Part().begin()
    for n, text in enumerate(["plain", "caf\u00e9", "plain", "plain", "\u212a", "x"]):
        p.add((0, 0, n, 0, 0, -1, 0, n), 0.0, text)
    p.files()
    got = {(a, b): p.ascii_blocks(a, b) for a in range(6) for b in range(a + 1, 7)}
    assert got == {(a, b): not ({1, 4} & set(range(a, b))) for a in range(6) for b in range(a + 1, 7)}
