"""``castore grep`` without click (:mod:`castore.cli.fast`) is click's ``castore grep``: the same
parameters, output, errors and exit status for every command line it takes, and every other
command line left to click; both parsers read one table (:mod:`castore.cli.grep_spec`)."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import castore
import castore.cli.grep_cmds as grep_cmds
from castore.cli import fast, grep_search
from castore.cli.common import CliState, takes_session
from castore.cli.main import cli
from castore.entries import Compaction, Event, Message

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_760_000_000.0  # 2025-10-09


@pytest.fixture(scope="module")
def where(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A store of three sessions (branches, a fork, tool calls and results, thinking, other apps)
    and its search index folder."""
    tmp = tmp_path_factory.mktemp("fast")
    st = castore.open(str(tmp / "store"), durable=False)
    s = st.session("bot", "ann", "s1")
    s.append_many([
        {"role": "user", "content": "Please fix the Parser bug in a.b"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "the parser drops tokens", "signature": "c2ln"},
            {"type": "text", "text": "Looking at parser.py\nline two of the parser\x1b[31m"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "grep -n parse src/parser.py"}},
        ]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "12: def parse(x):"}]},
    ], time=T0)
    s.append({"role": "assistant", "content": "fixed the parser -parser --count",
              "tool_calls": [{"id": "c9", "type": "function",
                              "function": {"name": "mcp__git__commit", "arguments": "{\"msg\": \"parser fix\"}"}}]},
             time=T0 + 86_400)
    s.append({"role": "tool", "tool_call_id": "c9", "content": "committed parser fix"}, time=T0 + 2 * 86_400)
    s.checkout("HEAD~2", create="retry")
    s.append({"role": "assistant", "content": "another parser idea, axb"}, time=T0 + 3 * 86_400)
    s.append(Compaction("summary: the parser was discussed"), time=T0 + 4 * 86_400)
    s.fork("s2", at="main~2")
    st.session("bot", "ann", "s2").append(Event(author="user", message=Message("user", "a parser question")),
                                          time=T0 + 5 * 86_400)
    st.session("other", "bob", "x").append({"role": "user", "content": "nothing to see, Parser"}, time=T0)
    st.close()
    return {"store": str(tmp / "store"), "index": str(tmp / "index"), "nowhere": str(tmp / "nowhere")}


def _click_run(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
               ) -> tuple[bytes, bytes, int, Any]:
    """``castore ARGV`` through click (stdout, stderr, exit status), and what its grep command
    passed to the search: its parameters and the store the global options named."""
    seen: list[Any] = []
    real = grep_search.run

    def spy(params: dict[str, Any], open_store: Any, echo: Any) -> int:
        st = click.get_current_context().find_object(CliState)
        assert st is not None
        seen.append((dict(params), st.store_url, dict(st.store_options), st.master_key_file))
        return real(params, open_store, echo)

    monkeypatch.setattr(grep_cmds, "run", spy)
    r = CliRunner().invoke(cli, argv, env=env, prog_name="castore")
    monkeypatch.undo()
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.stdout_bytes, r.stderr_bytes, r.exit_code, seen[0] if seen else None


def _fast_run(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
              ) -> tuple[bytes, bytes, int | None]:
    """``castore ARGV`` through the fast path (stdout, stderr, exit status or None: left to click)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    try:
        status = fast.grep_main(argv, {**os.environ, **env})
    finally:
        out.flush()
        err.flush()
        monkeypatch.undo()
    return out.buffer.getvalue(), err.buffer.getvalue(), status  # type: ignore[attr-defined]


S = "{store}"
N = "{nowhere}"
#: command lines the fast path runs, each with the environment it runs in ({store}: the store)
TAKEN: list[tuple[list[str], dict[str, str]]] = [(argv, {"CASTORE_STORE": S}) for argv in [
    ["grep", "parser"], ["grep", "-c", "parser"], ["grep", "-l", "parser"], ["grep", "-lc", "parser"],
    ["grep", "--count", "--files-with-matches", "parser"], ["grep", "parser", "-c"], ["grep", "-c", "-c", "parser"],
    ["grep", "-ic", "PARSER"], ["grep", "PARSER", "-i"], ["grep", "Parser"], ["grep", "--ignore-case", "Parser"],
    ["grep", "--ignore-case", "--case-sensitive", "parser"], ["grep", "--case-sensitive", "-i", "PARSER"],
    ["grep", "-F", "a.b"], ["grep", "--fixed-strings", "a.b"], ["grep", "a.b"], ["grep", "-w", "pars"],
    ["grep", "--word-regexp", "parser"], ["grep", "-wic", "PARSER"],
    ["grep", "--role", "user", "--role=assistant", "parser"], ["grep", "--role=", "parser"],
    ["grep", "--kind", "tool_result", "parse"], ["grep", "--kind=thinking", "--kind", "text", "parser"],
    ["grep", "-a", "parse"], ["grep", "--all", "parse"], ["grep", "--all-kinds", "-c", "parse"],
    ["grep", "--tool", "Bash", "parse"], ["grep", "--tool=mcp__*", "parser"], ["grep", "--tool", "-h", "parser"],
    ["grep", "--sessions", "s1", "parser"], ["grep", "--sessions", "bot/ann/*", "--sessions", "x", "parser"],
    ["grep", "--app", "other", "-i", "parser"], ["grep", "--typed", "parser"],
    ["grep", "--since", "2025-10-10", "parser"], ["grep", "--until=2025-10-11T00:00Z", "parser"],
    ["grep", "--since", "bad", "parser"], ["grep", "--until", "", "parser"],
    ["grep", "-C", "1", "parser"], ["grep", "-C1", "parser"], ["grep", "--context=2", "parser"],
    ["grep", "-C", " 2", "parser"], ["grep", "-cC0", "parser"],
    ["grep", "-n", "1", "parser"], ["grep", "-n0", "parser"], ["grep", "--limit", "2", "parser"],
    ["grep", "-cn1", "parser"], ["grep", "--no-index", "parser"], ["grep", "--cached", "-c", "parser"],
    ["grep", "--json", "parser"], ["grep", "--jsonl", "parser"], ["grep", "--json", "--jsonl", "parser"],
    ["grep", "--json", "-l", "parser"], ["grep", "--json", "-c", "nowhere-at-all"],
    ["grep", "--", "-parser"], ["grep", "-c", "--", "--count"], ["grep", "--", "-c"], ["grep", ""],
    ["grep", "nowhere-at-all"], ["grep", "("], ["grep", "-"], ["--", "grep", "parser"], ["--no-pager", "--", "grep", "-c", "x"],
    ["--store", S, "grep", "-c", "parser"], [f"--store={S}", "grep", "parser"],
    ["grep", "-c", "parser", "--store", S], ["--store", N, "grep", "-c", "parser"],
    ["--store", N, "grep", "-c", "parser", f"--store={S}"], ["--store", "", "grep", "-c", "parser"],
    ["--no-pager", "grep", "-c", "parser"], ["grep", "-c", "parser", "--no-pager"],
    ["-o", "durable=false", "grep", "-c", "parser"], ["-odurable=false", "grep", "-c", "parser"],
    ["grep", "-c", "parser", "--store-option", "durable=false", "-o", "durable=true"],
    ["--master-key-file", N, "grep", "parser"], ["grep", "parser", "--master-key-file", N],
    ["--master-key-file", N, "grep", "parser", "--master-key-file", ""],
]] + [
    (["grep", "-c", "parser"], {"CASTORE_STORE": N}),
    (["--store", S, "grep", "-c", "parser"], {"CASTORE_STORE": N}),
    (["grep", "-c", "parser"], {"CASTORE_STORE": S, "CASTORE_SESSION": "bot/ann/s1"}),
    (["grep", "-c", "parser"], {"CASTORE_STORE": S, "CASTORE_MASTER_KEY_FILE": N}),
    (["grep", "-c", "parser"], {"CASTORE_STORE": S, "CASTORE_MASTER_KEY_FILE": ""}),
    (["grep", "parser"], {"CASTORE_STORE": S, "NO_COLOR": "1"}),
]
#: command lines left to click
LEFT: list[tuple[list[str], dict[str, str]]] = [(argv, {"CASTORE_STORE": S}) for argv in [
    ["grep"], ["grep", "a", "b"], ["grep", "-c"], ["grep", "--help"], ["grep", "-h", "x"], ["grep", "x", "--help"],
    ["--help"], ["-h"], ["--version"], ["grep", "--version"], [], ["log"], ["grepp", "x"],
    ["grep", "--nope", "x"], ["grep", "-cz", "x"], ["grep", "--count=1", "x"], ["grep", "-c=1", "x"],
    ["grep", "--kind", "nope", "x"], ["grep", "--kind", "Text", "x"], ["grep", "-C", "-1", "x"],
    ["grep", "-C", "x", "x"], ["grep", "-C=1", "x"], ["grep", "-n", "-3", "x"], ["grep", "--limit", "1.5", "x"],
    ["grep", "x", "--since"], ["grep", "x", "-n"], ["grep", "-s", "bot/ann/s1", "x"],
    ["grep", "--session", "bot/ann/s1", "x"], ["-s", "bot/ann/s1", "grep", "x"], ["--session=a/b/c", "grep", "x"],
    ["-o", "novalue", "grep", "x"], ["grep", "x", "-o", "=v"], ["-o", "a=1", "-o", "a.b=2", "grep", "x"],
    ["--store"], ["--store", S], ["--no-pager=1", "grep", "x"], ["-1", "grep", "x"], ["grep", "-1"],
]] + [(["grep", "-c", "parser"], {"CASTORE_STORE": S, "_CASTORE_COMPLETE": "bash_complete"})]


def _fill(items: list[str] | dict[str, str], w: dict[str, str]) -> Any:
    if isinstance(items, dict):
        return {k: v.format(**w) for k, v in items.items()}
    return [a.format(**w) for a in items]


@pytest.mark.parametrize(("argv", "env"), TAKEN, ids=[" ".join(a) + (" " + ",".join(e) if len(e) > 1 else "")
                                                    for a, e in TAKEN])
def test_the_fast_path_reads_and_runs_a_command_line_as_click(
        where: dict[str, str], argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    argv, env = _fill(argv, where), {**_fill(env, where), "CASTORE_GREP_INDEX": where["index"]}
    call = fast.parse(list(argv), env)
    assert call is not None
    out, err, status, seen = _click_run(list(argv), env, monkeypatch)
    assert seen is not None, (out, err)
    params, url, options, key = seen
    assert call.params == params
    # an empty --store or key file is none: the same store and key
    assert (call.store_url or None, call.store_options, call.master_key_file or None) == (url or None, options,
                                                                                          key or None)
    assert _fast_run(list(argv), env, monkeypatch) == (out, err, status)


@pytest.mark.parametrize(("argv", "env"), LEFT, ids=[" ".join(a) + (" " + ",".join(e) if len(e) > 1 else "")
                                                   for a, e in LEFT])
def test_what_the_fast_path_does_not_read_is_left_to_click_before_anything_is_printed(
        where: dict[str, str], argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    argv, env = _fill(argv, where), {**_fill(env, where), "CASTORE_GREP_INDEX": where["index"]}
    assert fast.parse(list(argv), env) is None
    assert _fast_run(list(argv), env, monkeypatch) == (b"", b"", None)
    if "_CASTORE_COMPLETE" not in env:
        _, err, status, _ = _click_run(list(argv), env, monkeypatch)
        # click's own: help, version, another command, or a usage error it reports
        assert status == 2 or {"--help", "-h", "--version"} & set(argv) or argv == ["log"], err


def test_an_ascii_output_is_left_to_click(where: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", out)
    assert fast.grep_main(["--store", where["store"], "grep", "-c", "parser"], {}) is None


def test_the_highlight_is_clicks_bold_red() -> None:
    assert click.style("x", fg="red", bold=True) == grep_search._HIGHLIGHT[0] + "x" + grep_search._HIGHLIGHT[1]


def test_grep_takes_the_global_options_the_fast_path_reads_after_its_name() -> None:
    grep = cli.get_command(click.Context(cli), "grep")
    assert grep is not None and not takes_session(grep)  # fast._GREP_LATE leaves -s out for that
    hidden = {d for p in grep.params if getattr(p, "hidden", False) for d in p.opts}
    assert hidden == {d for o in fast._GREP_LATE for d in o.decls}


def test_no_option_of_the_spec_is_declared_a_second_time_in_the_cli() -> None:
    """Neither a click option of one of the spec's spellings setting the spec's parameter, nor a
    table holding an option's spellings (as the hidden copies of the global options once had)."""
    from castore.cli.grep_spec import GLOBAL_OPTIONS, GREP_OPTIONS

    specs = (*GLOBAL_OPTIONS, *GREP_OPTIONS)
    found = []
    for path in (ROOT / "castore" / "cli").glob("*.py"):
        if path.name == "grep_spec.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List)):
                words = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                found += [(path.name, node.lineno) for o in specs if len(o.decls) > 1 and words >= set(o.decls)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("option", "Option", "argument", "Argument"):
                words = {e.value for e in node.args if isinstance(e, ast.Constant)}
                found += [(path.name, node.lineno) for o in specs if o.name in words and words & set(o.decls)]
    assert found == []


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    e = {**os.environ, **(env or {})}
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, *(["-c", code] if code else []), *args], capture_output=True, env=e,
                          cwd=str(ROOT), check=False)


def test_an_option_added_to_the_spec_reaches_both_parsers() -> None:
    code = """
import json
import castore.cli.grep_spec as spec
spec.GREP_OPTIONS = (*spec.GREP_OPTIONS, spec.Opt(("--frob",), "frob", "Frob.", flag=True),
                     spec.Opt(("-Z", "--zed"), "zed", "Zed.", metavar="Z", multiple=True))
from castore.cli import fast, grep_cmds
argv = ["--frob", "-cZq", "x", "--zed=r"]
call = fast.parse(["grep", *argv], {})
ctx = grep_cmds.grep_cmd.make_context("grep", list(argv))
assert call.params == ctx.params, (call.params, ctx.params)
print(json.dumps([call.params["frob"], call.params["zed"], "--frob" in grep_cmds.grep_cmd.get_help(ctx)]))
"""
    p = _python(code)
    assert p.returncode == 0, p.stderr.decode()
    assert json.loads(p.stdout) == [True, ["q", "r"], True]


def test_the_console_script_searches_without_click_and_prints_as_click_does(where: dict[str, str]) -> None:
    env = {"CASTORE_STORE": where["store"], "CASTORE_GREP_INDEX": where["index"]}
    slow = "import sys; from castore.__main__ import main; sys.argv[0] = 'castore'; main(fast=False)"
    # (the in-process tests above cover the corpus; these cover the process: its entry point, its end)
    for argv in (["grep", "-c", "parser"], ["--store", where["nowhere"], "grep", "x"], ["grep", "--kind", "nope", "x"]):
        fresh = _python("", "-X", "importtime", "-m", "castore", *argv, env=env)
        clicked = _python(slow, *argv, env=env)
        imported = [line.split("|")[-1].strip() for line in fresh.stderr.decode().splitlines()
                    if line.startswith("import time:")]
        errors = "\n".join(line for line in fresh.stderr.decode().splitlines() if not line.startswith("import time:"))
        assert (fresh.stdout, errors, fresh.returncode) == (clicked.stdout, clicked.stderr.decode().rstrip("\n"),
                                                            clicked.returncode)
        taken = "--kind" not in argv
        assert ("click" in imported) is not taken, argv


@pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal")
@pytest.mark.parametrize("no_color", ["", "1"])
def test_on_a_terminal_the_fast_path_highlights_as_click_does(where: dict[str, str], no_color: str) -> None:
    """A terminal gets the matches in bold red from both ways, and neither with $NO_COLOR."""
    import pty

    env = {**os.environ, "CASTORE_STORE": where["store"], "CASTORE_GREP_INDEX": where["index"], "NO_COLOR": no_color,
           "PYTHONPATH": str(ROOT)}
    got = []
    for fast_path in (True, False):
        master, slave = pty.openpty()
        code = f"import sys; sys.argv[0] = 'castore'; from castore.__main__ import main; main(fast={fast_path})"
        p = subprocess.Popen([sys.executable, "-c", code, "grep", "parser"], stdout=slave, stderr=subprocess.PIPE,
                             env=env, cwd=str(ROOT))
        os.close(slave)
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side closed (EIO)
                break
            if not chunk:
                break
            out += chunk
        os.close(master)
        assert p.wait() == 0, p.stderr.read() if p.stderr else None
        got.append(out)
    assert got[0] == got[1]
    assert (b"\x1b[31m\x1b[1mparser\x1b[0m" in got[0]) is not bool(no_color)


@pytest.mark.skipif(sys.platform == "win32", reason="a shell closes the descriptor")
@pytest.mark.parametrize("argv", [["grep", "-c", "parser"], ["grep", "parser"], ["log", "-s", "bot/ann/s1"],
                                  ["status", "-s", "bot/ann/s1"]])
def test_a_closed_stdout_ends_both_ways_without_a_traceback(where: dict[str, str], argv: list[str]) -> None:
    """Started with stdout closed (``castore grep x >&-``: Python's sys.stdout is None), a command
    writes its output nowhere and ends as it would have (as git does), not with a traceback from
    asking a stream that is not there whether it is a terminal (``grep`` through click, ``log``'s
    pager) or flushing it."""
    env = {**os.environ, "CASTORE_STORE": where["store"], "CASTORE_GREP_INDEX": where["index"],
           "PYTHONPATH": str(ROOT)}
    for fast_path in (True, False):
        code = f"import sys; sys.argv[0] = 'castore'; from castore.__main__ import main; main(fast={fast_path})"
        p = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-c", code, *argv],
                           capture_output=True, env=env, cwd=str(ROOT), check=False)
        assert (p.returncode, p.stderr) == (0, b""), (fast_path, p.stderr.decode())


@pytest.mark.skipif(sys.platform == "win32", reason="a shell closes the descriptors")
def test_a_store_file_never_takes_a_closed_standard_descriptor(tmp_path: Path) -> None:
    """Started with stdin, stdout and stderr closed (``castore ... <&- >&- 2>&-``, a daemon's
    habit), the first files the command opens would get descriptors 0 to 2, and anything writing
    to stdout or stderr there (a worker process it starts, an interpreter's fatal error) would
    write into a store file: they are opened on the null device first, as git does."""
    code = ("import os, sys; sys.argv[0] = 'castore'; from castore.__main__ import main\n"
            "try:\n    main(fast=False)\nexcept SystemExit:\n    pass\n"
            "fd = os.open(os.devnull, os.O_RDONLY)\n"  # the next file the process opens
            "os.write(os.open(os.environ['OUT'], os.O_WRONLY), str(fd).encode())")
    out = tmp_path / "fd"
    out.write_bytes(b"")
    p = subprocess.run(["sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh", sys.executable, "-c", code, "--version"],
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(out)}, cwd=str(ROOT), check=False)
    assert p.returncode == 0
    assert int(out.read_bytes()) > 2


@pytest.mark.parametrize("encoding", ["latin-1", "cp1252"])
def test_an_output_encoding_without_the_texts_characters_escapes_them_both_ways(tmp_path: Path,
                                                                                 encoding: str) -> None:
    """Where stdout's encoding cannot hold a character of what is printed (``LANG=de_DE.ISO-8859-1``,
    a Windows pipe's cp1252), both ways print it escaped (``\\u2192``), as every command does, not
    a UnicodeEncodeError traceback half-way through the output."""
    st = castore.open(str(tmp_path / "store"), durable=False)
    st.session("bot", "ann", "uni").append({"role": "user", "content": "parser \u2192 \u03a3\u03bf\u03c6\u03af\u03b1"},
                                           time=T0)
    st.close()
    env = {**os.environ, "CASTORE_STORE": str(tmp_path / "store"), "CASTORE_GREP_INDEX": str(tmp_path / "index"),
           "PYTHONIOENCODING": encoding, "PYTHONPATH": str(ROOT)}
    got = []
    for argv in (["grep", "parser"], ["log", "-s", "bot/ann/uni"]):
        for fast_path in (True, False):
            code = f"import sys; sys.argv[0] = 'castore'; from castore.__main__ import main; main(fast={fast_path})"
            p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, env=env, cwd=str(ROOT),
                               check=False)
            assert (p.returncode, p.stderr) == (0, b""), (argv, fast_path, p.stderr.decode())
            assert b"parser \\u2192 \\u03a3\\u03bf\\u03c6\\u03af\\u03b1" in p.stdout, p.stdout
            got.append(p.stdout)
    assert got[0] == got[1]


def test_a_search_the_fast_path_runs_keeps_the_collector_off_and_one_left_to_click_turns_it_on(
        where: dict[str, str]) -> None:
    """The console script's fast path searches with the cyclic collector off (from before its
    imports to the process's end); a command line it leaves to click runs with it on."""
    env = {"CASTORE_STORE": where["store"], "CASTORE_GREP_INDEX": where["index"]}
    code = """
import gc, sys
import castore.cli.grep_search as gs
run = gs.run
def seen(*a, **k):
    print("collector", gc.isenabled())
    return run(*a, **k)
gs.run = seen
import castore.cli.main
cm = sys.modules["castore.cli.main"]  # (the package's attribute main is the click group)
run_click = cm.run
def clicked():
    print("collector", gc.isenabled())
    return run_click()
cm.run = clicked
from castore.__main__ import main
sys.argv[0] = "castore"
main()
"""
    fast = _python(code, "grep", "-c", "parser", env=env)
    assert fast.returncode == 0, fast.stderr.decode()
    assert fast.stdout.decode().splitlines()[0] == "collector False"
    slow = _python(code, "grep", "--kind", "nope", "x", env=env)
    assert slow.stdout.decode().splitlines()[0] == "collector True", slow.stderr.decode()
