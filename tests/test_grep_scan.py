"""The store-wide scan of castore grep (format 2): the same matches as the walk of every branch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import castore
from castore.entries import Compaction
from castore.grep import grep
from castore.grep.scan import needle

T0 = 1_760_000_000.0


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> castore.Store:
    """Forks sharing commits, a rewind, a detached HEAD, tool calls whose results come in a
    later append, a large (loose) body, JSON arguments, non-ASCII case folds."""
    st = castore.open(str(tmp_path_factory.mktemp("scan") / "store"), durable=False)
    s = st.session("bot", "ann", "s1")
    s.append_many([
        {"role": "user", "content": "Please fix the Parser bug"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "the parser drops tokens", "signature": "c2lnbmF0dXJlcGFyc2Vy"},
            {"type": "text", "text": "Looking at parser.py"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "grep -n parse src/parser.py",
                                                                       "count": 42, "dry": True}},
        ]},
    ], time=T0)
    s.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                           "content": "12: def parse(x):\n\ttoken tab"}]}, time=T0 + 50)
    s.append({"role": "assistant", "content": "fixed the parser",
              "tool_calls": [{"id": "c9", "type": "function",
                              "function": {"name": "mcp__git__commit", "arguments": "{\"msg\": \"parser fix\"}"}}]},
             time=T0 + 100)
    s.append({"role": "tool", "tool_call_id": "c9", "content": "committed parser fix " + "x" * 6000}, time=T0 + 200)
    s.checkout("HEAD~2", create="retry")
    s.append({"role": "assistant", "content": [
        {"type": "text", "text": "another parser idea"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "cGFyc2VycGFyc2Vy"}},
        {"type": "reasoning", "encrypted_content": "parserparserparser"},
    ]}, time=T0 + 300)
    s.append(Compaction("summary: the parser was discussed"), time=T0 + 400)
    s.fork("s2", at="main~2")
    s2 = st.session("bot", "ann", "s2")
    s2.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "parse again"}]},
              time=T0 + 500)
    s2.append_many([{"role": "user", "content": f"line {i} of a long parser talk"} for i in range(150)], time=T0 + 600)
    s.fork("s3", at="main")
    st.session("bot", "ann", "s3").checkout("HEAD~1")  # detached
    for i in range(5):
        st.session("other", "bob", f"x{i}").append({"role": "user", "content": f"nothing {i} to see, Kelvin"},
                                                   time=T0 + i)
    st.session("other", "eve", "u1").append({"role": "user", "content": "Ünïcode: die Straße, a naïve CAFÉ, ǅ"},
                                            time=T0 + 9)
    st.close()
    return castore.open(str(st.url), durable=False)


QUERIES: list[dict] = [
    {"pattern": "parser"}, {"pattern": "Parser"}, {"pattern": "parse", "kinds": ["tool_result"]},
    {"pattern": "parse", "tools": ["Bash"]}, {"pattern": "parser", "tools": ["mcp__*"]},
    {"pattern": "parser", "roles": ["assistant"]}, {"pattern": "parser", "roles": ["tool"], "kinds": ["tool_result"]},
    {"pattern": "parser", "since": T0 + 250}, {"pattern": "parser", "until": T0 + 250},
    {"pattern": "parser", "sessions": ["s2"]}, {"pattern": "parser", "apps": ["bot"]},
    {"pattern": "another", "context": 1}, {"pattern": "talk", "context": 2, "limit": 3},
    {"pattern": "parser", "limit": 2}, {"pattern": "nothing", "apps": ["other"]},
    {"pattern": "c2lnbmF0dXJl", "kinds": ["text", "thinking", "tool_call", "tool_result"]},
    {"pattern": "42"}, {"pattern": "true"}, {"pattern": "oken"}, {"pattern": "token", "kinds": ["tool_result"]},
    {"pattern": '"count": 42'}, {"pattern": "PARSER", "ignore_case": True}, {"pattern": "kelvin"},
    {"pattern": r"pars\w+ (idea|bug)"}, {"pattern": r"^line 1\d\b"}, {"pattern": r"talk$"}, {"pattern": "x{50}", "kinds": ["tool_result"]},
    {"pattern": "parser", "word": True}, {"pattern": "parser.py", "fixed": True}, {"pattern": "zzz-none"},
    # what only the stored bytes hold (keys, a type, a signature, encrypted reasoning, two
    # fields side by side) is a candidate at most, never a match
    {"pattern": "role.user"}, {"pattern": "content.Please"}, {"pattern": "tool_use"}, {"pattern": "thinking.the"},
    {"pattern": "signature"}, {"pattern": "encrypted"}, {"pattern": "bugassistant"}, {"pattern": "image/png"},
    # non-ASCII, folded or not
    {"pattern": "straße"}, {"pattern": "Straße"}, {"pattern": "café", "ignore_case": True}, {"pattern": "CAFÉ"},
    {"pattern": "ÜNÏ", "ignore_case": True}, {"pattern": "naïve", "word": True}, {"pattern": "ǆ", "ignore_case": True},
]


@pytest.mark.parametrize("query", QUERIES, ids=[str(i) for i in range(len(QUERIES))])
def test_scan_finds_exactly_what_the_walk_finds(store: castore.Store, query: dict) -> None:
    q = dict(query)
    pattern = q.pop("pattern")
    walk = [m.to_json() for m in grep(store, pattern, index=False, scan=False, **q)]
    scan = [m.to_json() for m in grep(store, pattern, index=False, scan=True, **q)]
    assert scan == walk
    assert [m.to_json() for m in grep(store, pattern, index=True, **q)] == walk


def test_scan_matches_case_folds_the_walk_matches(tmp_path: Path) -> None:
    st = castore.open(str(tmp_path / "folds"), durable=False)
    st.session("a", "u", "s").append_many([{"role": "user", "content": "the parſer and the Kelvin"},
                                          {"role": "user", "content": "plain"}])
    for pattern in ("parser", "kelvin"):
        walk = [m.to_json() for m in grep(st, pattern, index=False, scan=False)]
        assert walk and [m.to_json() for m in grep(st, pattern, index=False, scan=True)] == walk


def test_scan_reports_a_shared_commit_once_naming_every_branch_and_session(store: castore.Store) -> None:
    got = [m for m in grep(store, "Looking at", index=False, scan=True)]
    assert len(got) == 1
    m = got[0]
    assert m.session == ("bot", "ann", "s1") and m.branches == ("main", "retry")
    assert {k[2] for k, _ in m.also} == {"s2", "s3"}
    assert dict((k[2], b) for k, b in m.also)["s3"] == ("main", "HEAD")


def test_scan_names_the_tool_of_a_result_whose_call_came_earlier(store: castore.Store) -> None:
    got = [m for m in grep(store, "def parse", kinds=["tool_result"], index=False, scan=True)]
    assert [m.tool for m in got] == ["Bash"]


def test_scan_reads_a_large_loose_body(store: castore.Store) -> None:
    got = [m for m in grep(store, "committed parser", kinds=["tool_result"], index=False, scan=True)]
    assert len(got) == 1 and got[0].tool == "mcp__git__commit"


@pytest.mark.parametrize(("pattern", "flags", "want"), [
    ("parser", re.I, (b"parser", True)), ("Parser", 0, (b"Parser", False)),
    ("token", 0, (b"oken", False)),  # t may end an escape (\t): the needle starts after it
    ("42", 0, None), ("true", 0, None), ("a b", 0, None), ('"x"', 0, None), ("beef", 0, None),
    (r"foo\d+barbaz", 0, (b"z", False)), (r"foo\d+barzoo", 0, (b"zoo", False)), ("(?:ab|cd)", 0, None), ("é", re.I, None), ("é", 0, ("é".encode(), False)),
])
def test_needle_is_only_what_every_matching_body_holds(pattern: str, flags: int, want: object) -> None:
    assert needle(re.compile(pattern, flags)) == want


def test_iter_contents_gives_every_stored_object_once(store: castore.Store) -> None:
    from castore import objects as o
    from castore.objectstore import packs

    seen: list[str] = []
    for content, is_record in store.objects.iter_contents():
        spans = packs.content_spans(content) if is_record else [(0, len(content))]
        assert spans is not None
        seen.extend(o.digest(content[s:s + n]) for s, n in spans)
    assert len(seen) == len(set(seen))
    assert set(seen) == set(store.objects.iter_ids())
    assert any(not is_record for _, is_record in store.objects.iter_contents())  # the large body is loose


@pytest.mark.parametrize("part", [(0, 0), (0, 0, 0), (0, 1, 0), (1, 1, 2), (2, 1, 3), (0, 3, 2), (-1, 1, 2),
                                  (0, 1.0, 2), (0, True, 2), [0, 1, 2]])
def test_iter_contents_refuses_a_part_not_start_stop_n(store: castore.Store, part: object) -> None:
    with pytest.raises(ValueError, match=r"\(start, stop, n\) with 0 <= start < stop <= n"):
        next(store.objects.iter_contents(part=part))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(start, stop, n\)"):
        next(store.objects.packmap.iter_pack_contents(part=part))  # type: ignore[arg-type]
    assert next(store.objects.iter_contents(part=(0, 1, 1)), None) is not None  # a valid part still reads



@pytest.mark.parametrize("n", [1, 2, 9])
def test_records_decompressed_ahead_come_in_order_a_damaged_one_as_none(n: int) -> None:
    from castore import objects as o
    from castore.objectstore.packmap import _unframed

    datas: list[bytes | None] = [(b"record %d " % i) * 50 for i in range(n)]
    records = [(2, 100 * i, memoryview(o.frame_block(d, 3))) for i, d in enumerate(datas) if d is not None]
    records.insert(1, (1, 7, memoryview(b"a version-1 record: not decompressed here")))
    if n > 2:
        records[3] = (2, 200, memoryview(b"\x01 not zstd"))
        datas[2] = None
    assert list(_unframed(records, "p")) == datas

@pytest.mark.parametrize(("pattern", "flags"), [("parser", re.I), ("Parser", 0), ("aa", re.I), ("ab", re.I), ("é", re.I),
                                                ("a.b", 0), ("k", re.I), ("s", re.I)])
def test_line_spans_by_find_are_the_regex_spans(pattern: str, flags: int) -> None:
    from castore.grep.filters import spans_finder

    rx = re.compile(pattern, flags)
    for line in ("The PARSER parser, ParSer", "aaaaa", "ſab AB \u212a", "a.b axb", "Écrire é É", ""):
        assert spans_finder(rx)(line) == [m.span() for m in rx.finditer(line)]


#: the scan's other ways, each forced: commits found by every body reference and a set (many
#: bodies), every commit, index and segment read from the store (none kept from the scan: the
#: records read a second time for the commits naming a body), the commits naming a body looked
#: for in the records (some commit too large to keep), every block below the top one walked
#: by parent links (no segment taken)
OTHER_WAYS: dict[str, tuple[tuple[str, int], ...]] = {
    "many-bodies": (("_FEW_BODIES", 0),),
    "paths-from-the-store": (("_KEEP_PATHS", 0),),
    "commits-in-the-records": (("_PATH_OBJECT_MAX", 0),),
    "many-bodies-in-the-records": (("_PATH_OBJECT_MAX", 0), ("_FEW_BODIES", 0)),
}


@pytest.mark.parametrize("way", [*OTHER_WAYS, "blocks-walked"])
def test_every_way_of_the_scan_finds_what_the_walk_finds(store: castore.Store, way: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from castore.grep import scan as grepscan

    if way == "blocks-walked":
        monkeypatch.setattr(grepscan._Paths, "_segment", lambda self, sid, blk: None)
    else:
        for name, value in OTHER_WAYS[way]:
            monkeypatch.setattr(grepscan, name, value)
    for query in QUERIES:
        q = dict(query)
        pattern = q.pop("pattern")
        walk = [m.to_json() for m in grep(store, pattern, index=False, scan=False, **q)]
        assert [m.to_json() for m in grep(store, pattern, index=False, scan=True, **q)] == walk, query
