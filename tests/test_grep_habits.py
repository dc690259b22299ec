"""``castore grep`` with grep's habits: -q, --no-messages (grep's -s: -s is --session in every
castore command), -E and --color, on a real store, by the click command and by the fast path of
a fresh process alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A store of two sessions, one of whose HEAD is then garbage (it cannot be searched whole)."""
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "index"))
    path = tmp_path / "st"
    with castore.open(str(path)) as store:
        store.session("app", "u", "fine").append_many([{"role": "user", "content": "the parser and the lexer"},
                                                      {"role": "assistant", "content": "parsers, and a Parser"}])
        store.session("app", "u", "bad").append({"role": "user", "content": "a parser too"})
    return path


def _damage(root: Path) -> None:
    (root / "refs" / "sessions" / "app" / "u" / "bad" / "HEAD").write_bytes(b"\x00not a ref")


def _both(args: list[str], capsysbinary: pytest.CaptureFixture[bytes]) -> tuple[int, str, str]:
    """``castore ARGS`` by click and by the fast path: the same status, output and errors, given once."""
    from castore.cli import fast

    res = CliRunner().invoke(main, args)
    status = fast.grep_main(list(args), {})
    got = capsysbinary.readouterr()
    assert (status, got.out.decode(), got.err.decode()) == (res.exit_code, res.stdout, res.stderr), args
    return res.exit_code, res.stdout, res.stderr


def test_quiet_prints_nothing_and_says_by_its_status(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """-q (--quiet): no output; 0 at a match, 1 with none; with a session that cannot
    be searched whole, a match elsewhere is still 0 (grep -q's rule) and no match is 2."""
    for flag in ("-q", "--quiet"):
        assert _both(["--store", str(root), "grep", flag, "parser"], capsysbinary) == (0, "", "")
        assert _both(["--store", str(root), "grep", flag, "walrus"], capsysbinary) == (1, "", "")
    _damage(root)  # (a HEAD rewritten in place by hand: seen by an index built after it)
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "index-after"))
    assert _both(["--store", str(root), "grep", "-q", "lexer"], capsysbinary) == (0, "", "")
    status, out, err = _both(["--store", str(root), "grep", "-q", "walrus"], capsysbinary)
    assert (status, out) == (2, "") and err.startswith("Error: app/u/bad cannot be searched whole")


def test_no_messages_keeps_quiet_about_what_cannot_be_read(root: Path, tmp_path: Path,
                                                          capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """--no-messages (grep's -s): no line about a session that cannot be searched whole, nor about a
    store that is not there; the status still says it (2), the other matches are printed, and
    a bad pattern is still an error said."""
    _damage(root)
    status, out, err = _both(["--store", str(root), "grep", "-c", "parser"], capsysbinary)
    assert (status, out) == (2, "app/u/fine:2\n") and "cannot be searched whole" in err
    assert _both(["--store", str(root), "grep", "--no-messages", "-c", "parser"], capsysbinary) == (2, "app/u/fine:2\n", "")
    missing = str(tmp_path / "nowhere")
    status, _, err = _both(["--store", missing, "grep", "parser"], capsysbinary)
    assert status == 2 and err.startswith("Error: ")
    assert _both(["--store", missing, "grep", "--no-messages", "parser"], capsysbinary) == (2, "", "")
    status, _, err = _both(["--store", str(root), "grep", "--no-messages", "a("], capsysbinary)
    assert status == 2 and err.startswith("Error: bad regular expression")


def test_extended_regexp_is_python_syntax_and_refuses_what_it_would_misread(
        root: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """-E changes nothing Python's syntax already reads as grep -E does (alternation, groups,
    counts unescaped); a POSIX class or GNU's word edges, which Python would read as other
    characters, with no error, are refused (exit 2), and with -F they are plain text."""
    base = ["--store", str(root), "grep"]
    plain = _both([*base, "pars(er|ing)s?|lex{1}er"], capsysbinary)
    assert plain[0] == 0 and plain[1]
    assert _both([*base, "-E", "pars(er|ing)s?|lex{1}er"], capsysbinary) == plain
    for pattern, said in (("[[:alpha:]]+er", "[:alpha:] (a POSIX class)"), ("\\<parser\\>", "GNU's word edges")):
        status, out, err = _both([*base, "-E", pattern], capsysbinary)
        assert (status, out) == (2, "") and err.startswith("Error: ") and said in err, err
        assert _both([*base, "-E", "-F", pattern], capsysbinary)[0] == 1  # a plain string, found nowhere


def test_color_always_colours_a_pipe_and_never_does_not(root: Path, capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    """--color (--colour) WHEN: always colours the matched text through a pipe (bold red, as on a
    terminal), never and auto (not a terminal) print the plain lines."""
    base = ["--store", str(root), "grep", "lexer"]
    plain = _both(base, capsysbinary)
    assert plain[0] == 0 and "\x1b" not in plain[1]
    assert _both([*base, "--color", "never"], capsysbinary) == plain
    assert _both([*base, "--colour=auto"], capsysbinary) == plain
    status, out, _ = _both([*base, "--color=always"], capsysbinary)
    assert status == 0 and out == plain[1].replace("lexer", "\x1b[31m\x1b[1mlexer\x1b[0m")
    res = CliRunner().invoke(main, [*base, "--color", "sometimes"])
    assert res.exit_code == 2 and "sometimes" in res.stderr
