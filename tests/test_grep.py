"""castore grep: the library function and the command, over sessions castore wrote itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main
from castore.entries import Compaction, Event, Message
from castore.grep import GrepError, grep

T0 = 1_760_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    st = castore.open(str(tmp_path / "store"), durable=False)
    s = st.session("bot", "ann", "s1")
    s.append_many([
        {"role": "user", "content": "Please fix the Parser bug"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "the parser drops tokens", "signature": "c2lnbmF0dXJlcGFyc2Vy"},
            {"type": "text", "text": "Looking at parser.py"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "grep -n parse src/parser.py"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "12: def parse(x):"}]},
    ], time=T0)
    s.append({"role": "assistant", "content": "fixed the parser",
              "tool_calls": [{"id": "c9", "type": "function",
                              "function": {"name": "mcp__git__commit", "arguments": "{\"msg\": \"parser fix\"}"}}]},
             time=T0 + 100)
    s.append({"role": "tool", "tool_call_id": "c9", "content": "committed parser fix"}, time=T0 + 200)
    s.checkout("HEAD~2", create="retry")  # a rewind: a second answer after the tool result
    s.append({"role": "assistant", "content": [
        {"type": "text", "text": "another parser idea"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "cGFyc2VycGFyc2Vy"}},
        {"type": "reasoning", "encrypted_content": "parserparserparser"},
    ]}, time=T0 + 300)
    s.append(Compaction("summary: the parser was discussed"), time=T0 + 400)
    s.fork("s2", at="main~2")  # shares the first three commits
    st.session("bot", "ann", "s2").append(Event(author="user", message=Message("user", "a parser question in s2")),
                                          time=T0 + 500)
    st.session("other", "bob", "x").append({"role": "user", "content": "nothing to see"}, time=T0)
    return st


def test_plain_search_reports_each_commit_once_with_every_branch(store: castore.Store) -> None:
    ms = list(grep(store, "parser"))
    assert len({(m.commit, m.kind) for m in ms}) == len(ms)
    first = [m for m in ms if m.role == "user" and m.kind == "text" and "Parser" in m.lines[0].text]
    assert len(first) == 1  # in s1 (main, retry) and s2 (main): reported once
    m = first[0]
    assert m.session == ("bot", "ann", "s1") and set(m.branches) == {"main", "retry"}
    assert m.also == ((("bot", "ann", "s2"), ("main",)),)
    assert m.lines[0].spans == ((15, 21),)
    assert any(x.session == ("bot", "ann", "s2") and "s2" in x.lines[0].text for x in ms)
    # tool results are left out by default; thinking, text, tool calls and summaries are in
    assert {x.kind for x in ms} == {"text", "thinking", "tool_call"}
    assert any(x.role == "system" and "summary" in x.lines[0].text for x in ms)


def test_signatures_images_and_encrypted_reasoning_are_never_searched(store: castore.Store) -> None:
    for secret in ("c2lnbmF0dXJl", "cGFyc2Vy", "parserparserparser"):
        assert list(grep(store, secret, kinds=["text", "thinking", "tool_call", "tool_result"])) == []


def test_smart_case_ignore_case_fixed_and_word(store: castore.Store) -> None:
    assert {m.lines[0].text for m in grep(store, "Parser")} == {"Please fix the Parser bug"}
    assert len(list(grep(store, "Parser", ignore_case=True))) > 1
    assert list(grep(store, "parser", ignore_case=False, roles=["user"])) != []
    assert list(grep(store, "parser.py", fixed=True))[0].lines[0].spans == ((11, 20),)
    assert list(grep(store, "pars", word=True)) == []
    assert len(list(grep(store, "parser", word=True))) >= 1


def test_role_kind_and_tool_filters(store: castore.Store) -> None:
    assert {m.role for m in grep(store, "parser", roles=["assistant"])} == {"assistant"}
    assert {m.kind for m in grep(store, "parser", kinds=["thinking"])} == {"thinking"}
    res = list(grep(store, "parse", kinds=["tool_result"]))
    assert {(m.tool, m.lines[0].text) for m in res} == {("Bash", "12: def parse(x):"),
                                                        ("mcp__git__commit", "committed parser fix")}
    assert {m.kind for m in grep(store, "parser", tools=["mcp__*"])} == {"tool_call", "tool_result"}
    assert [m.tool for m in grep(store, "grep", tools=["Bash"], kinds=["tool_call"])] == ["Bash"]
    assert list(grep(store, "parser", roles=["tool"], kinds=["tool_result"]))[0].role == "tool"


def test_session_app_and_time_filters(store: castore.Store) -> None:
    assert {m.session[2] for m in grep(store, "parser", sessions=["s2"])} == {"s2"}
    assert list(grep(store, "nothing", apps=["bot"])) == []
    assert len(list(grep(store, "nothing", sessions=["other/*/*"]))) == 1
    late = list(grep(store, "parser", since=T0 + 250))
    assert late and all(m.time is not None and m.time >= T0 + 250 for m in late)
    early = list(grep(store, "parser", until=T0 + 1))
    assert early and all(m.time is not None and m.time < T0 + 1 for m in early)


def test_limit_and_context(store: castore.Store) -> None:
    assert len(list(grep(store, "parser", limit=2))) == 2
    m = next(iter(grep(store, "another", context=1)))
    assert len(m.before) == 1 and len(m.after) == 1
    assert m.before[0][1] == "user" and "summary" in m.after[0][2]


def test_bad_input_is_a_grep_error(store: castore.Store) -> None:
    with pytest.raises(GrepError):
        list(grep(store, "("))
    with pytest.raises(GrepError):
        list(grep(store, "x", kinds=["nope"]))
    with pytest.raises(GrepError):
        list(grep(store, ""))


def test_json_schema_is_stable(store: castore.Store) -> None:
    m = next(iter(grep(store, "Parser")))
    d = m.to_json()
    assert list(d) == ["commit", "session", "branches", "also", "role", "kind", "tool", "time", "lines"]
    assert d["session"] == "bot/ann/s1" and d["time"] == "2025-10-09T08:53:20.000Z"
    assert d["lines"] == [{"line": 1, "text": "Please fix the Parser bug", "spans": [[15, 21]]}]
    assert d["also"] == [{"session": "bot/ann/s2", "branches": ["main"]}]
    c = next(iter(grep(store, "another", context=1))).to_json()
    assert set(c["context"]) == {"before", "after"} and set(c["context"]["before"][0]) == {"commit", "role", "text"}


@pytest.fixture
def cli(store: castore.Store, tmp_path: Path):
    def run(*args: str):
        return CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "grep", *args])
    return run


def test_cli_exit_codes_and_outputs(cli) -> None:
    r = cli("parser")
    assert r.exit_code == 0 and "bot/ann/s1@main,retry" in r.stdout
    r = cli("zzz-not-there")
    assert r.exit_code == 1 and r.stdout == ""
    r = cli("(")
    assert r.exit_code == 2 and r.stderr.startswith("Error: bad regular expression")
    r = cli("parser", "--since", "yesterday-ish")
    assert r.exit_code == 2
    # patterns the regex compiler refuses with another exception than re.error: one line too
    for pattern in ("a{99999999999}", "(" * 2000 + ")" * 2000):
        r = cli(pattern)
        assert r.exit_code == 2 and r.stderr.startswith("Error: bad regular expression"), r.output
    r = cli("parser", "-l")
    assert r.stdout.splitlines() == ["bot/ann/s1", "bot/ann/s2"]
    r = cli("parser", "-c")
    assert r.stdout.splitlines()[0].startswith("bot/ann/s1:")
    r = cli("parser", "--jsonl", "--limit", "3")
    docs = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(docs) == 3 and all(d["session"].startswith("bot/ann/") for d in docs)
    r = cli("parse", "--json", "-a", "--tool", "Bash")
    assert [d["tool"] for d in json.loads(r.stdout)["matches"]] == ["Bash", "Bash"]
    r = cli("another", "-C", "1")
    assert r.exit_code == 0 and r.stdout.rstrip().endswith("--")


QUERIES: list[dict] = [
    {"pattern": "parser"}, {"pattern": "Parser"}, {"pattern": "parse", "kinds": ["tool_result"]},
    {"pattern": "parser", "tools": ["mcp__*"]}, {"pattern": "parser", "roles": ["assistant"]},
    {"pattern": "parser", "since": T0 + 250}, {"pattern": "parser", "sessions": ["s2"]},
    {"pattern": "another", "context": 1}, {"pattern": "parser", "limit": 2}, {"pattern": "nothing", "apps": ["other"]},
    {"pattern": "c2lnbmF0dXJl", "kinds": ["text", "thinking", "tool_call", "tool_result"]},
]


@pytest.mark.parametrize("query", QUERIES, ids=[str(i) for i in range(len(QUERIES))])
def test_index_gives_the_same_matches_as_a_scan(store: castore.Store, query: dict) -> None:
    q = dict(query)
    pattern = q.pop("pattern")
    assert list(grep(store, pattern, index=True, **q)) == list(grep(store, pattern, index=False, **q))


def test_index_follows_the_store_and_rebuilds_only_what_moved(store: castore.Store, tmp_path: Path) -> None:
    from castore.grep.index import open_index

    ix = open_index(store)
    assert len(ix.rebuilt) == 3
    assert open_index(store).rebuilt == []
    store.session("bot", "ann", "s2").append({"role": "user", "content": "late zebra"})
    ix = open_index(store)
    assert ix.rebuilt == [("bot", "ann", "s2")]
    assert [m.lines[0].text for m in grep(store, "zebra")] == ["late zebra"]
    store.delete_session("bot", "ann", "s2")
    assert list(grep(store, "zebra")) == []
    for f in (tmp_path / "index").rglob("*"):
        if f.is_file():
            f.write_bytes(b"garbage")  # a damaged index is rebuilt, never trusted
    assert len(list(grep(store, "parser"))) == len(list(grep(store, "parser", index=False)))


def test_cached_index_is_trusted_until_an_import_updates_it(store: castore.Store, tmp_path: Path) -> None:
    assert list(grep(store, "walrus")) == []  # builds the index
    store.session("bot", "ann", "s1").append({"role": "user", "content": "a walrus"})
    assert list(grep(store, "walrus", check_index=False)) == []  # trusted as it was
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "import", "codex",
                                  str(Path(__file__).parent / "test_grep.py")])  # not a rollout: still updates
    assert r.exit_code == 0 and "search index updated" in r.stderr
    assert [m.lines[0].text for m in grep(store, "walrus", check_index=False)] == ["a walrus"]


def test_case_insensitive_search_over_text_whose_lower_case_is_longer(store: castore.Store) -> None:
    store.session("bot", "ann", "s3").append({"role": "user", "content": "İstanbul and PARSER"})
    for index in (True, False):
        assert [m.lines[0].spans for m in grep(store, "parser", sessions=["s3"], index=index)] == [((13, 19),)]
