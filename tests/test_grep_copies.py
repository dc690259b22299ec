"""``castore grep`` over sessions that hold the same commits (a file imported under two project
folders, a fork, a branch): every way of searching reports each matching entry once (the other
sessions under ``also``), and ``-l``/``-c`` name every session that holds a match, a copy
counted in each session that holds it.

One matrix: each query through the index (format 2/3 and format 1), the store-wide scan
(``--no-index`` on format 2/3) and the walk (``--no-index`` on format 1), in each output
(``-l``, ``-c``, ``--json``, the default lines), checked against each session searched alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main
from castore.grep import grep, grep_counts

DATA = Path(__file__).parent / "data" / "claude-code"
MAIN = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"
SHARE, SS2, FORK = f"claude/session-share/{MAIN}", f"claude/ss2/{MAIN}", "claude/session-share/forked"


def _cli(url: str, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--store", url, *args])
    assert r.exit_code in (0, 1), (args, r.output, r.exception)
    return r.exit_code, r.stdout


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """The same archive in a format-1 and a format-3 store: one real Claude Code session imported
    under two project folders (the same lines: the same commits), a fork of it that shares its
    first matches and adds one of its own, and an unrelated session."""
    tmp = tmp_path_factory.mktemp("copies")
    projects = tmp / "projects"
    for folder in ("session-share", "ss2"):
        (projects / folder).mkdir(parents=True)
        shutil.copy(DATA / "session-share" / f"{MAIN}.jsonl", projects / folder)
    (projects / "other").mkdir()
    shutil.copy(DATA / "claude-code-log" / "session_b.jsonl", projects / "other")
    urls = {}
    for fmt in (1, 3):
        url = str(tmp / f"store{fmt}")
        assert CliRunner().invoke(main, ["init", url, "--format", str(fmt)]).exit_code == 0
        assert CliRunner().invoke(main, ["--store", url, "import", "claude", str(projects)]).exit_code == 0
        with castore.open(url) as st:
            third = [m.commit for m in grep(st, "sushi", word=True, index=False)][2]
            fork = st.session(*SHARE.split("/")).fork("forked", at=third)  # holds the first three
            fork.append({"role": "user", "content": "and one more sushi poem, in the fork"}, time=1_769_200_000.0)
        urls[fmt] = url
    return urls


#: the ways of searching: (store format, extra options, what runs)
WAYS = [(3, (), "index"), (3, ("--no-index",), "scan"), (1, (), "index, format 1"), (1, ("--no-index",), "walk")]
QUERIES = [("-w", "sushi"), ("-w", "sushi", "--typed"), ("sushi", "-n", "4"), ("sushi", "-n", "7"),
           ("poem", "--role", "user"), ("sushi", "--sessions", "claude/ss2/*"), ("sushi", "-C", "1"),
           ("curry", "--since", "2026-01-22T19:38:20Z")]


def _expected(url: str, query: tuple[str, ...]) -> dict[str, int]:
    """Per session, how many of the matches (each entry once, the ``--json`` documents) it holds:
    under ``session`` or under ``also``."""
    _, out = _cli(url, "grep", *query, "--json")
    counts: dict[str, int] = {}
    for m in json.loads(out)["matches"]:
        for s in [m["session"], *(a["session"] for a in m["also"])]:
            counts[s] = counts.get(s, 0) + 1
    return dict(sorted(counts.items()))


@pytest.mark.parametrize("query", QUERIES, ids=[" ".join(q) for q in QUERIES])
def test_every_way_lists_and_counts_every_session_holding_a_match(stores: dict[int, str], query: tuple[str, ...],
                                                                   tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    outputs = {}
    for fmt, how, name in WAYS:
        monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / f"index{fmt}"))
        url = stores[fmt]
        got = {out: _cli(url, "grep", *query, *how, *flag)
               for out, flag in (("-l", ("-l",)), ("-c", ("-c",)), ("json", ("--json",)), ("lines", ()))}
        want = _expected(url, (*query, *how))
        assert want, name
        assert got["-l"] == (0, "".join(f"{s}\n" for s in want)), name
        assert got["-c"] == (0, "".join(f"{s}:{n}\n" for s, n in want.items())), name
        outputs[name] = got
    first = outputs["index"]
    for name, got in outputs.items():
        assert got == first, name


def test_each_session_alone_counts_what_it_holds(stores: dict[int, str]) -> None:
    """The count of a session in a search of every session is its count searched alone (where
    it reports its copies as its own)."""
    with castore.open(stores[3]) as st:
        for index in (True, False):
            counts = grep_counts(st, "sushi", word=True, index=index)
            alone = {k: n for s in (SHARE, SS2, FORK)
                     for k, n in grep_counts(st, "sushi", word=True, index=index, sessions=[s]).items()}
            assert counts == alone == {tuple(SHARE.split("/")): 6, tuple(FORK.split("/")): 4,
                                       tuple(SS2.split("/")): 6}
