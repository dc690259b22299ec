"""grep_rows and grep_counts: the matches of grep() as tuples and as counts per session, built
straight from the search index (no Match objects), and the CLI that prints them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main
from castore.cli.text import safe_block
from castore.grep import Match, grep, grep_columns, grep_counts, grep_rows, iso_time

T0 = 1_760_000_000.0


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    """Sessions in two apps, a fork sharing commits with its parent, a second branch, multi-line
    and non-ASCII blocks (ſ, ı, K, İ, Cyrillic), tool calls and results, times an hour apart."""
    st = castore.open(str(tmp_path / "store"), durable=False)
    for n in range(3):
        st.session("bot", "ann", f"s{n}").append_many([
            {"role": "user", "content": f"question {n} about the parser\nand the Parser again, parser"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "a parſer? the ınput parser"},
                                              {"type": "text", "text": f"answer {n}: PARSER done"},
                                              {"type": "tool_use", "id": f"t{n}", "name": "Bash",
                                               "input": {"command": "ls parser"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": "parser.py"}]},
            {"role": "user", "content": "İnput КЕЛЬВИН parser, ПАРСЕР\nno match here\nparser at the end"},
        ], time=T0 + 3600 * n)
    st.session("aaa", "zed", "z").append({"role": "user", "content": "an early parser"}, time=T0 - 5)
    st.session("bot", "ann", "s1").fork("s05", at="HEAD~1")
    st.session("bot", "ann", "s05").append({"role": "user", "content": "the fork's parser"}, time=T0 + 9)
    s2 = st.session("bot", "ann", "s2")
    s2.branch("side", at="HEAD~2")
    s2.checkout("side")
    s2.append({"role": "assistant", "content": "on the side: parser"}, time=T0 + 99)
    return st


def _row(m: Match) -> tuple[Any, ...]:
    return (m.commit, m.session, m.branches, m.role, m.kind, m.tool, m.time,
            tuple((lm.line, lm.text, lm.spans) for lm in m.lines), m.also, m.before, m.after, m.context)


def _counts(matches: list[Match]) -> dict[tuple[str, str, str], int]:
    """The matches each session holds (under ``session`` or ``also``), in session order."""
    out: dict[tuple[str, str, str], int] = {}
    for m in matches:
        for key in [m.session, *(k for k, _ in m.also)]:
            out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


OPTIONS: list[dict[str, Any]] = [
    {}, {"ignore_case": False}, {"ignore_case": True}, {"fixed": True}, {"word": True}, {"roles": ["user"]},
    {"roles": ["tool"], "kinds": ["tool_result"]}, {"kinds": ["thinking"]}, {"tools": ["Ba*"]},
    {"sessions": ["s0*"]}, {"apps": ["aaa"]}, {"since": T0 + 3600}, {"until": T0 + 3600}, {"limit": 3},
    {"limit": 1}, {"kinds": ["text", "thinking", "tool_call", "tool_result"]}, {"typed": True}, {"context": 1},
]
PATTERNS = ["parser", "Parser", "PARSER", "par.er", "^parser", "parser$", "input", "ſ", "кельвин", "ПАРСЕР",
            "parser, p", "nothing-like-it", "(?i:PARSER)", "parser\nand"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_rows_and_counts_are_what_grep_gives(store: castore.Store, pattern: str) -> None:
    """Through the index, with no index, and for every filter: the rows are grep's matches
    field by field in the same order, and the counts are its matches per session."""
    for options in OPTIONS:
        for index in (True, False):
            matches = list(grep(store, pattern, index=index, **options))
            rows = list(grep_rows(store, pattern, index=index, **options))
            assert rows == [_row(m) for m in matches], (pattern, options, index)
            counts = grep_counts(store, pattern, index=index, **options)
            assert counts == _counts(matches) and list(counts) == list(_counts(matches)), (pattern, options, index)


def _spanless(lines: Any) -> tuple[tuple[int, str], ...]:
    """A match's lines less their spans (a line given alone, as its block's text: line 1)."""
    if isinstance(lines, str):
        return ((1, lines),)
    return tuple((n, text) for n, text, _ in lines)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_columns_are_the_rows_of_each_session(store: castore.Store, pattern: str) -> None:
    """Through the index and without, for every filter: each MatchColumns holds one session's
    matches, every column as long, and read across they are grep_rows' rows in order (without
    spans, a line given as its block's text is the row's one line)."""
    for options in OPTIONS:
        if options.get("context"):
            continue
        for index in (True, False):
            rows = list(grep_rows(store, pattern, index=index, **options))
            for spans in (True, False):
                got = []
                for c in grep_columns(store, pattern, index=index, spans=spans, **options):
                    assert c.lines and len({len(col) for col in c[1:-1]}) == 1, (pattern, options)
                    texts = [t for x in c.lines for t in ([x] if isinstance(x, str) else [t for _, t, _ in x])]
                    assert not c.printable or all(t.replace("\t", " ").isascii() and t.replace("\t", " ").isprintable()
                                                  for t in texts)
                    got += [(cm, c.session, *rest) for cm, *rest in zip(*c[1:-1], strict=True)]
                want = [r[:9] for r in rows]
                if not spans:
                    assert all(isinstance(g[7], tuple) or "\n" not in g[7] for g in got)
                    got = [(*g[:7], _spanless(g[7]), g[8]) for g in got]
                    want = [(*r[:7], _spanless(r[7]), r[8]) for r in want]
                assert got == want, (pattern, options, index, spans)


def test_columns_take_no_context(store: castore.Store) -> None:
    with pytest.raises(TypeError):
        list(grep_columns(store, "parser", context=1))


def test_rows_name_every_session_holding_a_shared_commit(store: castore.Store) -> None:
    """A commit a fork shares with its parent: one row, under the session that sorts first (the
    fork s05), the parent s1 under ``also``; each of the two counts it."""
    rows = list(grep_rows(store, "question 1"))
    assert len(rows) == 1 and rows[0][1] == ("bot", "ann", "s05") and rows[0][8] == ((("bot", "ann", "s1"), ("main",)),)
    assert grep_counts(store, "question 1") == {("bot", "ann", "s05"): 1, ("bot", "ann", "s1"): 1}


@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_counts_of_sessions_extracted_in_any_order_and_of_a_later_fork(tmp_path: Path, order: str) -> None:
    """Sessions written in key order and in reverse, and a fork that sorts after its parent (its
    shared blocks counted in both), count what grep gives, with and without a limit."""
    st = castore.open(str(tmp_path / "store"), durable=False)
    names = [f"s{n}" for n in range(4)]
    for n in (names if order == "in order" else names[::-1]):
        st.session("a", "u", n).append_many([{"role": "user", "content": f"parser {n}"},
                                              {"role": "assistant", "content": "the parser, again"}], time=T0)
    st.session("a", "u", "s1").fork("s1z")
    st.session("a", "u", "s1z").append({"role": "user", "content": "the fork's parser"}, time=T0 + 1)
    for options in ({}, {"kinds": ["text", "thinking", "tool_call", "tool_result"]}, {"limit": 5}):
        counts = grep_counts(st, "parser", **options)
        expected = _counts(list(grep(st, "parser", **options)))
        assert counts == expected and list(counts) == list(expected), options
    assert grep_counts(st, "parser")[("a", "u", "s1z")] == 3  # s1's two blocks and its own
    assert grep_counts(st, "parser", limit=3) == {("a", "u", "s0"): 2, ("a", "u", "s1"): 1, ("a", "u", "s1z"): 1}


def test_rows_and_counts_take_only_grep_options(store: castore.Store) -> None:
    with pytest.raises(TypeError):
        list(grep_rows(store, "parser", colour=True))
    with pytest.raises(TypeError):
        grep_counts(store, "parser", colour=True)


def _cli(store: castore.Store, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--store", store.url, "grep", *args])
    return r.exit_code, r.stdout


@pytest.mark.parametrize("args", [[], ["-c"], ["-l"], ["-l", "-c"], ["-c", "--json"], ["-a"], ["--limit", "2", "-c"],
                                  ["--json", "--jsonl"], ["-C", "1"], ["--no-index", "-c"], ["-i", "-l"]])
def test_cli_prints_from_rows_and_counts_what_it_printed_from_matches(store: castore.Store, args: list[str]) -> None:
    """The lines the command prints from rows and counts are the ones made from grep's matches
    (the format of the text output, -c and -l, as before)."""
    code, out = _cli(store, *args, "parser")
    kinds = ["text", "thinking", "tool_call", "tool_result"] if "-a" in args else None
    limit = int(args[args.index("--limit") + 1]) if "--limit" in args else None
    matches = list(grep(store, "parser", kinds=kinds, limit=limit, context=1 if "-C" in args else 0,
                        ignore_case=True if "-i" in args else None))
    assert code == 0 and matches
    keys = list(dict.fromkeys("/".join(m.session) for m in matches))
    if "-l" in args or "-c" in args:
        want = keys if "-l" in args else []
        if "-c" in args:
            counts = _counts(matches)
            want += [f"{k}:{1 if '-l' in args else counts[tuple(k.split('/'))]}" for k in keys]  # type: ignore[index]
        assert out.splitlines()[:len(want)] == want
        assert out.splitlines()[len(want):] == (['{', '  "matches": []', '}'] if "--json" in args else [])
        return
    if "--jsonl" in args:
        assert len(out.splitlines()) == len(matches) + 3  # the documents, then {"matches": []} over 3 lines
        return
    assert out.splitlines() == _printed(matches)


def _printed(matches: list[Match]) -> list[str]:
    """The lines ``castore grep`` prints for ``matches`` (no colour), made from each Match."""
    want = []
    for m in matches:
        where = f"{'/'.join(m.session)}@{','.join(m.branches)}"
        if m.also:
            where += " (+" + ", ".join("/".join(k) for k, _ in m.also) + ")"
        want += [f"{where} {c[:8]} - {r}: {t}" for c, r, t in m.before]
        what = f"{m.role}/{m.kind}[{m.tool}]:" if m.tool else f"{m.role}/{m.kind}:"
        want += [f"{where} {m.commit[:8]} {(iso_time(m.time) or '-')[:19]} {what}{lm.line}: {lm.text}" for lm in m.lines]
        want += [f"{where} {c[:8]} - {r}: {t}" for c, r, t in m.after]
        if m.context:
            want.append("--")
    return want


@pytest.mark.parametrize("pattern", [p for p in PATTERNS if p != "nothing-like-it"])
@pytest.mark.parametrize("args", [[], ["-a"], ["-w"], ["-i"], ["--limit", "3"], ["-a", "--limit", "5"], ["--no-index"],
                                  ["--role", "user"], ["--typed"]])
def test_cli_prints_each_pattern_as_made_from_matches(store: castore.Store, pattern: str, args: list[str]) -> None:
    """Whatever the pattern (a plain word found on one line or several, in any case, ASCII or
    not, a regex) and the options, the lines printed are those made from grep's matches."""
    options: dict[str, Any] = {"kinds": ["text", "thinking", "tool_call", "tool_result"] if "-a" in args else None,
                               "limit": int(args[-1]) if "--limit" in args else None, "word": "-w" in args,
                               "ignore_case": True if "-i" in args else None, "typed": "--typed" in args,
                               "roles": ["user"] if "--role" in args else None, "index": "--no-index" not in args}
    matches = list(grep(store, pattern, **options))
    code, out = _cli(store, *args, "--", pattern)
    assert (code, out.splitlines()) == (0 if matches else 1, _printed(matches)), (pattern, args)


def test_cli_exit_status_without_a_match(store: castore.Store) -> None:
    for args in ([], ["-c"], ["-l"]):
        assert _cli(store, *args, "nothing-like-it") == (1, "")


def test_the_castore_process_prints_what_the_command_prints(store: castore.Store, tmp_path: Path) -> None:
    """``castore grep`` ends its process without the interpreter's teardown (after a match or
    none): its output is all there, with grep's exit statuses, and an error still fails."""
    import os
    import subprocess
    import sys

    store.close()  # sealed: the other process sees every session
    env = {**os.environ, "CASTORE_GREP_INDEX": str(tmp_path / "index")}
    for args, status in ((["parser"], 0), (["-c", "parser"], 0), (["--json", "parser"], 0),
                         (["-c", "nothing-like-it"], 1), (["-c", "a("], 2)):
        got = subprocess.run([sys.executable, "-m", "castore", "--store", store.url, "grep", *args], env=env,
                             capture_output=True, text=True, check=False)
        want = CliRunner().invoke(main, ["--store", store.url, "grep", *args], env=env)
        assert (got.returncode, got.stdout, got.stderr) == (status, want.stdout, want.stderr), args


def test_columns_say_which_sessions_print_as_they_are_and_the_others_are_escaped(tmp_path: Path) -> None:
    """A session whose text holds a control character (ESC, CR) or a C1 or bidi control is not
    printable (its chunk is not flagged): the command escapes it, in the batch it shares with
    printable sessions; the others' columns are printable."""
    st = castore.open(str(tmp_path / "store"), durable=False)
    texts = {"a": "a plain parser line", "b": "the parser\x1b[31m is red\rover", "c": "a parser \u202e bidi",
             "d": "the parser\twith a tab\nand a second line", "e": "a parser in C1 \x9b"}
    for sid, text in texts.items():
        st.session("app", "u", sid).append({"role": "user", "content": text}, time=T0)
    # each session in a chunk of its own: a chunk is flagged for all its blocks
    import castore.grep.files as gf

    was = gf.CHUNK
    gf.CHUNK = 1
    try:
        cols = {c.session[2]: c for c in grep_columns(st, "parser", spans=False)}
    finally:
        gf.CHUNK = was
    assert {k: c.printable for k, c in cols.items()} == {"a": True, "b": False, "c": False, "d": True, "e": False}
    code, out = _cli(st, "parser")
    assert code == 0 and "\\x1b[31m is red\\rover" in out and "\\u202e" in out and "\\x9b" in out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out
    assert out.splitlines() == [safe_block(line) for line in _printed(list(grep(st, "parser")))]
    # the same search through the rows' path (no index): nothing said printable, the same lines
    assert not any(c.printable for c in grep_columns(st, "parser", spans=False, index=False))
