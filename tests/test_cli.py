"""The castore command line, through click's runner (and once as a real subprocess)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import layout
import pytest
from click.testing import CliRunner, Result

import castore
from castore import objects as o
from castore.cli import main, reference
from castore.cli.render import Refs, graph_rows, topo_order
from castore.session import LogEntry

ROOT = Path(__file__).resolve().parents[1]
KEY = "app/alice/s1"
CLEAN_ENV = {"CASTORE_STORE": None, "CASTORE_SESSION": None, "COLUMNS": "200"}


@dataclass
class Seeded:
    url: str
    store: castore.Store
    q1: str
    a1: str
    q2: str
    a2: str
    retry: str


@pytest.fixture
def url(tmp_path: Path) -> str:
    return str(tmp_path / "store")


def run(url: str | None, *args: str, session: str | None = KEY, input: str | None = None,  # noqa: A002
        color: bool = False, env: dict[str, Any] | None = None) -> Result:
    argv: list[str] = []
    if url is not None:
        argv += ["--store", url]
    if session is not None:
        argv += ["-s", session]
    runner = CliRunner(env={**CLEAN_ENV, **(env or {})})
    return runner.invoke(main, [*argv, *args], input=input, color=color, prog_name="castore")


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def fails(result: Result, code: int = 1) -> str:
    """Assert a clean failure and return its stderr."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.stderr
    if code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return result.stderr


@pytest.fixture
def seeded(url: str) -> Seeded:
    """main: q1 -> a1 (label good, last_city=Beijing) -> q2 -> a2 (last_city=Shanghai); retry: q1 -> r."""
    return seed(url)


def seed(url: str) -> Seeded:
    """Write the ``seeded`` fixture's session into the store at ``url`` (other test modules use it too)."""
    store = castore.open(url)
    s = store.session("app", "alice", "s1")
    q1 = s.append(castore.Message(role="user", content="Weather in Beijing?"))
    a1 = s.append(castore.Event(author="agent", message=castore.Message(role="assistant", content="Sunny, 25C"),
                                state_delta={"last_city": "Beijing"}, meta={"model": "m-1"}))
    q2 = s.append(castore.Message(role="user", content="And Shanghai?"))
    a2 = s.append(castore.Event(author="agent", message=castore.Message(role="assistant", content="Cloudy"),
                                state_delta={"last_city": "Shanghai", "n": 2}))
    s.label("good", at=a1)
    s.checkout(q1, create="retry")
    retry = s.append(castore.Event(author="agent", message=castore.Message(role="assistant", content="Rainy"),
                                   state_delta={"last_city": "Beijing", "retried": True}))
    s.checkout("main")
    return Seeded(url, store, q1, a1, q2, a2, retry)


# -- help and the CLI reference page --------------------------------------------------------
def test_every_command_and_option_has_help() -> None:
    assert reference.missing_help() == []
    names = set(main.list_commands(None))  # type: ignore[arg-type]
    assert {"init", "sessions", "log", "show", "checkout", "branch", "label", "labels", "fork", "state",
            "diff", "context", "append", "replay", "verify", "cat-object", "demo"} <= names


def test_the_command_table_names_what_each_module_registers() -> None:
    # importing every listed module here is also what keeps a broken command module from going unnoticed
    cli_main = importlib.import_module("castore.cli.main")
    tables = {**cli_main.COMMAND_MODULES, **cli_main.OPTIONAL_COMMAND_MODULES}
    assert len(tables) == len(cli_main.COMMAND_MODULES) + len(cli_main.OPTIONAL_COMMAND_MODULES)
    for module, names in tables.items():
        scratch = click.Group()
        importlib.import_module(module).register(scratch)
        assert sorted(scratch.commands) == sorted(names), module
    assert main.list_commands(None) == sorted(cli_main.command_modules())  # type: ignore[arg-type]


_LAZY_PROBE = """
import sys
from click.testing import CliRunner
from castore.cli import main
mods = lambda: sorted(m for m in sys.modules if m.startswith("castore.cli.") and m.endswith(("_cmds", "demo")))
print(mods())
r = CliRunner().invoke(main, ["--store", sys.argv[1], "-s", "app/alice/s1", "log", "-n", "1"])
assert r.exit_code == 0, r.output
print(mods())
r = CliRunner().invoke(main, ["--store", sys.argv[1], "grep", "-c", "Beijing"])
assert r.exit_code == 0, r.output
print(mods())
print(sorted(main.get_command(None, "export").list_commands(None)))
print(mods())
r = CliRunner().invoke(main, ["--help"])
assert r.exit_code == 0 and "  grep  " in r.stdout and "  usage  " in r.stdout, r.output
print(mods())
"""


def test_a_command_imports_only_the_modules_it_comes_from(seeded: Seeded) -> None:
    seeded.store.close()  # sealed, so the other process sees the session
    out = subprocess.run([sys.executable, "-c", _LAZY_PROBE, seeded.url], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout.splitlines()
    loaded = ("['castore.cli.archive_cmds', 'castore.cli.grep_cmds', 'castore.cli.html_cmds', "
              "'castore.cli.inspect_cmds', 'castore.cli.io_cmds', 'castore.cli.session_cmds']")
    assert out == [
        "[]",
        "['castore.cli.inspect_cmds', 'castore.cli.session_cmds']",  # inspect_cmds imports refs_of from it
        "['castore.cli.grep_cmds', 'castore.cli.inspect_cmds', 'castore.cli.session_cmds']",
        # grep was loaded first; export still gets the subcommands of all three modules that add to it
        "['claude', 'codex', 'gemini', 'html', 'pi']",
        loaded,
        loaded,  # --help lists every command from the summaries, importing no other module
    ]


@pytest.mark.parametrize("limit", [12, 45, 60, 80, 10**6])
def test_the_summaries_are_what_the_commands_say(limit: int) -> None:
    cli_main = importlib.import_module("castore.cli.main")
    assert sorted(cli_main.SUMMARIES) == sorted(cli_main.command_modules())
    for name, summary in cli_main.SUMMARIES.items():
        cmd = cli_main.load_command(name)
        assert not cmd.hidden, name  # the listing from the table would show it
        # click shortens the table's line exactly as it shortens the command's own help
        assert click.Command(name, help=summary).get_short_help_str(limit) == cmd.get_short_help_str(limit), name


def test_help_and_completion_list_every_command_with_its_summary_without_loading_it() -> None:
    probe = """
import sys
from click.shell_completion import ShellComplete
from castore.cli import main
comp = ShellComplete(main, {}, "castore", "_CASTORE_COMPLETE")
items = [(c.value, c.help) for c in comp.get_completions([], "ex")]
assert not [m for m in sys.modules if m.endswith(("_cmds", ".demo"))], sorted(sys.modules)
print(items)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout.strip()
    assert out == str([(name, main.get_command(None, name).get_short_help_str())  # type: ignore[union-attr]
                       for name in ("expire", "export")])


def test_a_mistyped_command_gets_a_suggestion_before_any_module_is_loaded() -> None:
    # in a fresh process: the suggestion must not depend on which commands happen to be loaded already
    out = subprocess.run([sys.executable, "-c", "from castore.cli import main; main(['expor'], prog_name='castore')"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2
    # `export` and `expire` are defined in two command modules, neither loaded yet: both are offered
    assert out.stderr.endswith("Error: No such command 'expor'. (Did you mean one of: 'expire', 'export'?)\n"), \
        out.stderr


def test_a_listed_module_that_fails_to_import_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "castore_broken_cmds.py").write_text("import castore_no_such_dependency\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    optional = importlib.import_module("castore.cli.main").OPTIONAL_COMMAND_MODULES
    monkeypatch.setitem(optional, "castore_broken_cmds", ("broken",))
    monkeypatch.setitem(optional, "castore_unwritten_cmds", ("unwritten",))
    names = main.list_commands(None)  # type: ignore[arg-type]
    assert "broken" in names and "unwritten" not in names
    assert main.get_command(None, "unwritten") is None  # type: ignore[arg-type]
    result = CliRunner().invoke(main, ["broken"])
    assert isinstance(result.exception, ModuleNotFoundError)
    assert result.exception.name == "castore_no_such_dependency"
    with pytest.raises(ModuleNotFoundError):
        main.get_command(None, "broken")  # type: ignore[arg-type]


def test_cli_reference_page_is_current() -> None:
    page = reference.default_page()
    assert page == ROOT / "docs" / "cli.md"
    assert page.read_text(encoding="utf-8") == reference.reference_markdown(), (
        "docs/cli.md is out of date: run scripts/gen_cli_reference"
    )
    assert reference.run(["--check", str(page)]) == 0


def test_cli_reference_check_fails_on_a_stale_page_and_the_rewrite_fixes_it(tmp_path: Path) -> None:
    page = tmp_path / "cli.md"
    page.write_text(reference.reference_markdown().replace("## `castore log`", "## `castore lg`"))
    assert reference.run(["--check", str(page)]) == 1
    assert reference.run([str(page)]) == 0
    assert reference.run(["--check", str(page)]) == 0 and page.read_text() == reference.reference_markdown()


def test_missing_help_is_detected() -> None:
    import click

    @click.group()
    def grp() -> None:
        """A group."""

    @grp.command("bare")
    @click.option("--x")
    def bare(x: str) -> None:
        pass

    assert reference.missing_help(grp) == ["castore bare", "castore bare --x"]


def test_reference_is_what_help_prints_on_an_88_column_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not through CliRunner: it forces an 80-column width.
    monkeypatch.setenv("COLUMNS", "88")
    block = reference.reference_markdown()
    for path, _, _ in reference.iter_commands():
        with pytest.raises(SystemExit) as exit_:
            main.main([*path.split()[1:], "--help"], prog_name="castore")
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        assert f"## `{path}`\n\n```text\n{out.rstrip()}\n```" in block


# -- init and sessions ----------------------------------------------------------------------
def test_init_creates_a_store_and_is_idempotent(tmp_path: Path) -> None:
    target = tmp_path / "new"
    r = ok(run(None, "init", str(target), session=None))
    assert (target / "castore.json").exists()
    assert "Initialized empty castore store" in r.stderr and r.stdout == ""
    r = ok(run(None, "init", str(target), session=None))
    assert "Found existing" in r.stderr


def test_init_without_url_uses_the_store_option(url: str) -> None:
    ok(run(url, "init", session=None))
    assert castore.open(url).exists


def test_sessions_lists_newest_first_with_entries_branch_and_time(seeded: Seeded) -> None:
    other = seeded.store.session("app", "bob", "later")
    other.append(castore.Message(role="user", content="hi"))
    lines = ok(run(seeded.url, "sessions", session=None)).stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["app/bob/later", "app/alice/s1"]
    assert "4 entries" in lines[1] and "main" in lines[1]
    doc = json.loads(ok(run(seeded.url, "sessions", "app/alice", "--json", session=None)).stdout)
    assert [s["key"] for s in doc["sessions"]] == ["app/alice/s1"]
    s = doc["sessions"][0]
    assert s["entries"] == 4 and s["branch"] == "main" and s["head"] == seeded.a2
    assert set(s) == {"key", "app", "user", "session", "head", "branch", "entries", "updated", "title", "subagent_of",
                      "info", "problem", "deleting"}
    assert s["problem"] is None and s["deleting"] is None


def test_session_names_with_a_slash_are_written_with_percent_2f(url: str) -> None:
    castore.open(url).session("my/app", "a@b.c", "x/y").append(castore.Message(role="user", content="hi"))
    doc = json.loads(ok(run(url, "sessions", "my%2Fapp", "--json", session=None)).stdout)
    key = doc["sessions"][0]["key"]
    assert key == "my%2Fapp/a@b.c/x%2Fy"
    assert "user: hi" in ok(run(url, "log", "--oneline", session=key)).stdout


# -- log --------------------------------------------------------------------------------------
def test_log_shows_the_last_ten_newest_first_and_n0_shows_all(url: str) -> None:
    s = castore.open(url).session("app", "alice", "s1")
    for i in range(12):
        s.append(castore.Message(role="user", content=f"message {i}"))
    r = ok(run(url, "log"))
    assert r.stdout.count("\ncommit ") + r.stdout.startswith("commit ") == 10
    assert r.stdout.index("message 11") < r.stdout.index("message 10")
    assert "message 1\n" not in r.stdout and "-n 0" in r.stderr
    assert len(ok(run(url, "log", "--oneline", "-n", "0")).stdout.splitlines()) == 12
    assert len(ok(run(url, "log", "--oneline", "-n", "3")).stdout.splitlines()) == 3


def test_log_oneline_shows_short_ids_and_refs(seeded: Seeded) -> None:
    lines = ok(run(seeded.url, "log", "--oneline")).stdout.splitlines()
    assert lines[0] == f"{seeded.a2[:8]} (HEAD -> main) agent: Cloudy {{last_city=\"Shanghai\", n=2}}"
    assert lines[2].startswith(f"{seeded.a1[:8]} (tag: good) agent: Sunny")
    assert lines[3] == f"{seeded.q1[:8]} user: Weather in Beijing?"


def test_log_of_a_revision_follows_its_path(seeded: Seeded) -> None:
    lines = ok(run(seeded.url, "log", "--oneline", "retry")).stdout.splitlines()
    assert [line[:8] for line in lines] == [seeded.retry[:8], seeded.q1[:8]]
    lines = ok(run(seeded.url, "log", "--oneline", "main~2")).stdout.splitlines()
    assert [line[:8] for line in lines] == [seeded.a1[:8], seeded.q1[:8]]


def test_log_graph_all_draws_the_branches_like_git(seeded: Seeded) -> None:
    lines = ok(run(seeded.url, "log", "--graph", "--all")).stdout.splitlines()
    assert lines == [
        f"* {seeded.retry[:8]} (retry) agent: Rainy {{last_city=\"Beijing\", retried=true}}",
        f"| @ {seeded.a2[:8]} (HEAD -> main) agent: Cloudy {{last_city=\"Shanghai\", n=2}}",
        f"| * {seeded.q2[:8]} user: And Shanghai?",
        f"| * {seeded.a1[:8]} (tag: good) agent: Sunny, 25C {{last_city=\"Beijing\"}}",
        "|/",
        f"* {seeded.q1[:8]} user: Weather in Beijing?",
    ]


def test_log_json_is_one_document_with_commits_and_refs(seeded: Seeded) -> None:
    doc = json.loads(ok(run(seeded.url, "log", "--json")).stdout)
    assert doc["session"] == {"key": KEY, "app": "app", "user": "alice", "session": "s1"}
    assert doc["head"] == seeded.a2 and doc["branch"] == "main"
    assert [c["id"] for c in doc["commits"]] == [seeded.a2, seeded.q2, seeded.a1, seeded.q1]
    top = doc["commits"][0]
    assert top["refs"] == {"head": True, "branches": ["main"], "labels": []}
    assert top["parents"] == [seeded.q2] and top["short"] == seeded.a2[:8] and top["kind"] == "event"
    assert top["entry"]["message"] == {"role": "assistant", "content": "Cloudy"}
    assert top["delta"] == {"last_city": "Shanghai", "n": 2}
    assert doc["commits"][2]["refs"]["labels"] == ["good"]
    assert "graph" not in doc


def test_log_all_with_a_revision_is_a_usage_error(seeded: Seeded) -> None:
    assert "--all" in fails(run(seeded.url, "log", "--all", "retry"), 2)


# -- show, state, diff, replay, verify ------------------------------------------------------------
def test_show_prints_entry_metadata_delta_and_parents(seeded: Seeded) -> None:
    out = ok(run(seeded.url, "show", "good")).stdout
    assert f"commit {seeded.a1} (tag: good)" in out
    assert f"Parents: {seeded.q1}" in out
    assert 'Meta:    {"model": "m-1"}' in out
    assert '+ last_city = "Beijing"' in out and "Sunny, 25C" in out
    doc = json.loads(ok(run(seeded.url, "show", seeded.a1[:10], "--json")).stdout)
    assert doc["id"] == seeded.a1 and doc["meta"] == {"model": "m-1"} and doc["parents"] == [seeded.q1]


def test_state_travels_in_time_and_reads_one_key(seeded: Seeded) -> None:
    assert json.loads(ok(run(seeded.url, "state")).stdout) == {"last_city": "Shanghai", "n": 2}
    assert json.loads(ok(run(seeded.url, "state", "good")).stdout) == {"last_city": "Beijing"}
    assert json.loads(ok(run(seeded.url, "state", "HEAD~3")).stdout) == {}
    assert json.loads(ok(run(seeded.url, "state", "retry", "retried", "--json")).stdout) is True
    assert "no key 'nope'" in fails(run(seeded.url, "state", "HEAD", "nope"))


def test_diff_lists_state_changes_and_entries_since_the_fork_point(seeded: Seeded) -> None:
    out = ok(run(seeded.url, "diff", "retry", "main")).stdout
    assert f"common ancestor: {seeded.q1[:8]}" in out
    assert "+ n = 2" in out and "- retried = true" in out and '~ last_city: "Beijing" -> "Shanghai"' in out
    assert "only on retry (1)" in out and "only on main (3)" in out
    doc = json.loads(ok(run(seeded.url, "diff", "retry", "main", "--json")).stdout)
    assert doc["base"] == seeded.q1
    assert doc["added"] == {"n": 2} and doc["removed"] == {"retried": True}
    assert doc["changed"] == {"last_city": ["Beijing", "Shanghai"]}
    assert [c["id"] for c in doc["entries1"]] == [seeded.retry]
    assert [c["id"] for c in doc["entries2"]] == [seeded.a1, seeded.q2, seeded.a2]


def test_replay_rebuilds_the_state_from_deltas(seeded: Seeded) -> None:
    assert json.loads(ok(run(seeded.url, "replay")).stdout) == {"last_city": "Shanghai", "n": 2}
    assert json.loads(ok(run(seeded.url, "replay", "retry")).stdout) == {"last_city": "Beijing", "retried": True}


def test_verify_reports_the_audited_path(seeded: Seeded) -> None:
    out = ok(run(seeded.url, "verify")).stdout
    assert out.startswith(f"OK: 4 commits up to {seeded.a2[:8]} verified")
    assert json.loads(ok(run(seeded.url, "verify", "retry", "--json")).stdout) == {
        "ok": True, "commits": 2, "head": seeded.retry}


@pytest.mark.skipif(importlib.util.find_spec("castore.context") is None, reason="castore.context not written yet")
def test_context_prints_the_projection_and_honours_budgets(seeded: Seeded) -> None:
    out = ok(run(seeded.url, "context")).stdout.splitlines()
    assert out == ["[user] Weather in Beijing?", "[assistant] Sunny, 25C", "[user] And Shanghai?",
                   "[assistant] Cloudy"]
    doc = json.loads(ok(run(seeded.url, "context", "retry", "--json")).stdout)
    assert [m["content"] for m in doc["messages"]] == ["Weather in Beijing?", "Rainy"]
    assert doc["commits"] == [seeded.q1, seeded.retry] and doc["rev"] == "retry"
    doc = json.loads(ok(run(seeded.url, "context", "--max-messages", "2", "--json")).stdout)
    assert [m["content"] for m in doc["messages"]] == ["And Shanghai?", "Cloudy"] and doc["dropped"] == 2
    fails(run(seeded.url, "context", "--max-tokens", "-1"), 2)


# -- branches, checkout, labels, fork ---------------------------------------------------------
def test_checkout_of_a_commit_detaches_head_and_says_so(seeded: Seeded) -> None:
    r = ok(run(seeded.url, "checkout", "HEAD~1"))
    assert r.stdout == "" and "detached" in r.stderr and seeded.q2[:8] in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    s = seeded.store.session("app", "alice", "s1")
    assert s.current_branch is None and s.head == seeded.q2
    assert ok(run(seeded.url, "branch")).stdout.splitlines()[0] == f"* (HEAD detached at {seeded.q2[:8]})"
    assert "detached" not in ok(run(seeded.url, "log", "--oneline")).stderr  # explained once, at checkout


def test_checkout_branch_and_new_branch(seeded: Seeded) -> None:
    r = ok(run(seeded.url, "checkout", "retry"))
    assert "Switched to branch 'retry'" in r.stderr
    assert seeded.store.session("app", "alice", "s1").current_branch == "retry"
    r = ok(run(seeded.url, "checkout", "good", "-b", "from-good"))
    assert "Switched to a new branch 'from-good'" in r.stderr
    s = seeded.store.session("app", "alice", "s1")
    assert s.current_branch == "from-good" and s.head == seeded.a1
    assert "already exists" in fails(run(seeded.url, "checkout", "HEAD", "-b", "retry"))


def test_append_on_a_detached_head_starts_a_branch_and_says_so(seeded: Seeded) -> None:
    ok(run(seeded.url, "checkout", "good"))
    r = ok(run(seeded.url, "append", "--role", "user", "try again"))
    s = seeded.store.session("app", "alice", "s1")
    assert s.current_branch is not None and s.current_branch in r.stderr
    assert r.stdout.strip() == s.head and s.show().parents == (seeded.a1,)


def test_branch_lists_creates_and_reports_json(seeded: Seeded) -> None:
    assert ok(run(seeded.url, "branch")).stdout.splitlines() == [
        f"* main   {seeded.a2[:8]}", f"  retry  {seeded.retry[:8]}"]
    r = ok(run(seeded.url, "branch", "old", "good"))
    assert "Created branch 'old'" in r.stderr and r.stdout == ""
    doc = json.loads(ok(run(seeded.url, "branch", "--json")).stdout)
    assert doc == {"head": seeded.a2, "current": "main", "branches": [
        {"name": "main", "commit": seeded.a2, "current": True, "made_by": None},
        {"name": "old", "commit": seeded.a1, "current": False, "made_by": None},
        {"name": "retry", "commit": seeded.retry, "current": False, "made_by": None},
    ], "lost": None}
    assert "already exists" in fails(run(seeded.url, "branch", "old"))


def test_branch_d_refuses_unmerged_work_and_capital_d_forces(seeded: Seeded) -> None:
    err = fails(run(seeded.url, "branch", "-d", "retry"))
    assert "not merged" in err and "castore branch -D" in err  # the option the CLI has
    assert "retry" in seeded.store.session("app", "alice", "s1").branches()
    r = ok(run(seeded.url, "branch", "-D", "retry"))
    assert f"Deleted branch 'retry' (was {seeded.retry[:8]})" in r.stderr
    assert "retry" not in seeded.store.session("app", "alice", "s1").branches()


def test_branch_d_deletes_merged_branch_and_refuses_the_current_one(seeded: Seeded) -> None:
    ok(run(seeded.url, "branch", "merged", "good"))
    ok(run(seeded.url, "branch", "-d", "merged"))
    assert "merged" not in seeded.store.session("app", "alice", "s1").branches()
    assert "checked out" in fails(run(seeded.url, "branch", "-D", "main"))
    assert "no branch 'ghost'" in fails(run(seeded.url, "branch", "-d", "ghost"))
    fails(run(seeded.url, "branch", "-d", "a", "b"), 2)
    fails(run(seeded.url, "branch", "-d"), 2)


def test_label_and_labels(seeded: Seeded) -> None:
    r = ok(run(seeded.url, "label", "final"))  # as git tag NAME: at HEAD
    assert "Labelled" in r.stderr and r.stdout == ""
    assert ok(run(seeded.url, "labels")).stdout.splitlines() == [
        f"final  {seeded.a2[:8]}", f"good   {seeded.a1[:8]}"]
    assert json.loads(ok(run(seeded.url, "labels", "--json")).stdout) == {"labels": [
        {"name": "final", "commit": seeded.a2}, {"name": "good", "commit": seeded.a1}]}
    assert "already exists" in fails(run(seeded.url, "label", "good", "HEAD"))
    r = ok(run(seeded.url, "label", "-f", "HEAD", "good"))  # the old order REV NAME still works, with a note
    assert "old order" in r.stderr
    assert seeded.store.session("app", "alice", "s1").labels()["good"] == seeded.a2


def test_fork_starts_a_session_sharing_the_history(seeded: Seeded) -> None:
    r = ok(run(seeded.url, "fork", "s2", "good"))
    assert r.stdout.strip() == "app/alice/s2" and "Forked app/alice/s1" in r.stderr
    lines = ok(run(seeded.url, "log", "--oneline", session="app/alice/s2")).stdout.splitlines()
    assert [line[:8] for line in lines] == [seeded.a1[:8], seeded.q1[:8]]
    assert "already exists" in fails(run(seeded.url, "fork", "s2"))
    assert ok(run(seeded.url, "fork", "s3", "--user", "bob")).stdout.strip() == "app/bob/s3"


# -- append ----------------------------------------------------------------------------------
def test_append_message_text_and_stdin_print_the_commit_id(url: str) -> None:
    r = ok(run(url, "append", "--role", "user", "hello"))
    s = castore.open(url).session("app", "alice", "s1")
    assert r.stdout.strip() == s.head and r.stderr == ""
    ok(run(url, "append", "--role", "assistant", "-", input="from\nstdin"))
    assert [m.content for m in s.messages()] == ["hello", "from\nstdin"]


def test_append_event_with_state_delta_and_unset(url: str) -> None:
    ev = {"author": "agent", "message": {"role": "assistant", "content": "done"},
          "state_delta": {"city": "Paris", "tmp": 1}, "meta": {"model": "m"}}
    ok(run(url, "append", "--event", json.dumps(ev)))
    ok(run(url, "append", "--event", "-", input=json.dumps({"author": "agent", "unset": ["tmp"]})))
    s = castore.open(url).session("app", "alice", "s1")
    assert s.state() == {"city": "Paris"}
    first = s.log()[1]
    assert first.meta == {"model": "m"} and first.entry.message.content == "done"  # type: ignore[union-attr]


def test_append_usage_mistakes_exit_2(url: str) -> None:
    fails(run(url, "append", "hello"), 2)
    fails(run(url, "append", "--role", "user"), 2)
    fails(run(url, "append", "--role", "user", "--event", "{}", "x"), 2)
    fails(run(url, "append", "--event", "{}", "extra"), 2)


def test_append_bad_event_is_an_error_and_writes_nothing(url: str) -> None:
    assert "not valid JSON" in fails(run(url, "append", "--event", "{nope"))
    assert "JSON object" in fails(run(url, "append", "--event", "[1]"))
    assert "unknown event field" in fails(run(url, "append", "--event", '{"autor": "x"}'))
    assert not castore.open(url).session("app", "alice", "s1").exists()


# -- cat-object ------------------------------------------------------------------------------------
def test_cat_object_prints_any_object_by_prefix(seeded: Seeded) -> None:
    doc = json.loads(ok(run(seeded.url, "cat-object", seeded.a1[:6], session=None)).stdout)
    assert doc["id"] == seeded.a1 and doc["type"] == "commit" and doc["parents"] == [seeded.q1]
    body = json.loads(ok(run(seeded.url, "cat-object", doc["body"], session=None)).stdout)
    assert body == {"id": doc["body"], "type": "value", "value": {"role": "assistant", "content": "Sunny, 25C"}}
    tree = json.loads(ok(run(seeded.url, "cat-object", doc["state"], "--json", session=None)).stdout)
    assert tree["type"] == "tree" and tree["values"] == {"last_city": "Beijing"}


# -- errors: one line, exit 1; usage: exit 2 ---------------------------------------------------------
def _ambiguous_prefix(store: castore.Store) -> tuple[str, list[str]]:
    """Store two values whose ids share their first 4 hex characters."""
    seen: dict[str, str] = {}
    for i in range(100_000):
        oid, _ = o.encode(o.Value(value=f"v{i}"))
        if oid[:4] in seen:
            store.init()
            store.objects.put(o.Value(value=seen[oid[:4]]))
            store.objects.put(o.Value(value=f"v{i}"))
            return oid[:4], sorted([oid, o.encode(o.Value(value=seen[oid[:4]]))[0]])
        seen[oid[:4]] = f"v{i}"
    raise AssertionError("no collision")


def _corrupt(store: castore.Store, oid: str) -> None:
    data = layout.stored(store, oid)
    assert data is not None
    layout.replace(store, oid, data[:-1] + bytes([data[-1] ^ 0xFF]))


def test_bad_revision_is_one_error_line(seeded: Seeded) -> None:
    assert "unknown revision 'nope'" in fails(run(seeded.url, "show", "nope"))
    assert "unknown revision 'HEAD~9'" in fails(run(seeded.url, "log", "HEAD~9"))
    assert "unknown revision" in fails(run(seeded.url, "checkout", "zzzz"))


def test_ambiguous_prefix_lists_the_candidates(seeded: Seeded) -> None:
    prefix, ids = _ambiguous_prefix(seeded.store)
    # Two values (not commits of the session) share the prefix: as a revision it names nothing...
    err = fails(run(seeded.url, "show", prefix))
    assert f"unknown revision '{prefix}'" in err
    # ...and as an object id it is ambiguous, with both candidates listed.
    err = fails(run(seeded.url, "cat-object", prefix, session=None))
    assert ids[0][:12] in err and ids[1][:12] in err


def test_missing_store_is_an_error(tmp_path: Path) -> None:
    for args in (["log"], ["sessions"], ["show", "HEAD"], ["cat-object", "abcd"], ["branch"]):
        # -s only for the commands that work on a session (elsewhere it is a usage error)
        session = None if args[0] in ("sessions", "cat-object") else KEY
        assert "no castore store at" in fails(run(str(tmp_path / "none"), *args, session=session))
    assert not (tmp_path / "none").exists()
    assert "unknown or unavailable protocol 'nope'" in fails(run("nope://x", "log"))


def test_a_store_path_that_is_a_file_is_named_as_such(tmp_path: Path) -> None:
    # "no castore store (create one with `castore init`)" sent people to an init that failed there
    (tmp_path / "notes.txt").write_text("mine\n")
    for url in (tmp_path / "notes.txt", tmp_path / "notes.txt" / "store"):
        for args, session in ((["init"], None), (["sessions"], None), (["status"], None), (["log"], KEY)):
            err = fails(run(str(url), *args, session=session))
            assert f"{tmp_path / 'notes.txt'} is a file, not a folder: a castore store is a folder" in err, err
    with pytest.raises(castore.StorageError, match="is a file, not a folder"):
        castore.open(str(tmp_path / "notes.txt"))
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_missing_session_is_an_error(seeded: Seeded) -> None:
    for args in (["log"], ["state"], ["checkout", "main"], ["branch"], ["labels"], ["verify"]):
        assert "session app/alice/nope not found" in fails(run(seeded.url, *args, session="app/alice/nope"))


def test_invalid_names_are_errors(seeded: Seeded) -> None:
    assert "invalid user name ''" in fails(run(seeded.url, "log", session="app//s1"))
    assert "invalid branch name ''" in fails(run(seeded.url, "branch", ""))
    assert "invalid session id ''" in fails(run(seeded.url, "fork", ""))
    assert "invalid app name ''" in fails(run(seeded.url, "append", "--role", "user", "x", session="/u/s"))


def test_corrupt_object_is_an_error(seeded: Seeded) -> None:
    _corrupt(seeded.store, seeded.a1)
    for args in (["log"], ["verify"], ["cat-object", seeded.a1]):
        err = fails(run(seeded.url, *args, session=None if args[0] == "cat-object" else KEY))
        assert f"object {seeded.a1} is corrupt" in err


def test_audit_failure_is_an_error(seeded: Seeded) -> None:
    # A state tree that disagrees with the deltas: swap a1's snapshot object for a2's content.
    st = seeded.store
    a1 = st.history.commit(seeded.a1)
    a2 = st.history.commit(seeded.a2)
    content = layout.stored(st, o.hex_id(a2.state))
    assert content is not None
    layout.replace(st, o.hex_id(a1.state), content)
    err = fails(run(seeded.url, "verify"))
    assert "corrupt" in err or "audit failed" in err


@pytest.mark.parametrize("args", [
    ["frobnicate"],
    ["log", "--no-such-option"],
    ["log", "-n", "-1"],
    ["log", "-n", "many"],
    ["show", "a", "b"],
    ["diff", "a", "b", "c"],
    ["label", "HEAD"],
    ["label", "-d"],
])
def test_usage_mistakes_exit_2(seeded: Seeded, args: list[str]) -> None:
    assert "Usage:" in fails(run(seeded.url, *args), 2)


def test_a_session_is_required_and_must_be_app_user_session(seeded: Seeded) -> None:
    assert "needs a session" in fails(run(seeded.url, "log", session=None), 2)
    assert "APP/USER/SESSION" in fails(run(seeded.url, "log", session="app/alice"), 2)
    assert "APP/USER/SESSION" in fails(run(seeded.url, "log", session="a/b/c/d"), 2)
    assert "APP[/USER]" in fails(run(seeded.url, "sessions", "a/b/c", session=None), 2)


def test_store_and_session_come_from_the_environment(seeded: Seeded) -> None:
    r = ok(run(None, "log", "--oneline", "-n", "1", session=None,
               env={"CASTORE_STORE": seeded.url, "CASTORE_SESSION": KEY}))
    assert r.stdout.startswith(seeded.a2[:8])


def test_colour_only_on_a_terminal(seeded: Seeded) -> None:
    assert "\x1b[" not in ok(run(seeded.url, "log", "--graph", "--all")).stdout
    assert "\x1b[" in ok(run(seeded.url, "log", "--graph", "--all", color=True)).stdout
    assert "\x1b[" not in ok(run(seeded.url, "log", "--json", "--graph", color=True)).stdout


# -- the graph drawing -------------------------------------------------------------------------------
def _e(cid: str, *parents: str, t: float = 0.0) -> LogEntry:
    return LogEntry(id=cid, kind="message", entry=castore.Message(role="user", content=cid),  # type: ignore[arg-type]
                    parents=parents, time=t)  # type: ignore[arg-type]


def _draw(entries: list[LogEntry], head: str | None = None) -> list[str]:
    return [g + (f" {e.id}" if e else "") for g, e in graph_rows(topo_order(entries), head)]


def test_graph_joins_three_branches_at_one_fork_point() -> None:
    entries = [_e("c", "r"), _e("b", "r"), _e("a", "r"), _e("r")]
    assert _draw(entries, head="b") == ["* c", "| @ b", "|/", "| * a", "|/", "* r"]


def test_graph_keeps_a_line_of_history_together_and_closes_nested_forks() -> None:
    # r - x - y (main), x - z (side, newest), r - w (old)
    entries = [_e("z", "x", t=5), _e("w", "r", t=4), _e("y", "x", t=3), _e("x", "r", t=2), _e("r", t=1)]
    assert _draw(entries) == ["* z", "| * w", "| | * y", "|_|/", "* | x", "|/", "* r"]


def test_graph_draws_a_merge_and_a_second_root() -> None:
    entries = [_e("m", "a", "b"), _e("a", "r1"), _e("b", "r2"), _e("r1"), _e("r2")]
    assert _draw(entries) == ["* m", "|\\", "* | a", "* | r1", " /", "* b", "* r2"]


def test_refs_decoration_marks_head_branch_and_labels() -> None:
    refs = Refs(head="x", branch="main", branches={"main": "x", "b": "x"}, labels={"l": "x"})
    assert refs.decoration("x", style=lambda s, **_: s) == "(HEAD -> main, b, tag: l)"
    assert Refs(head="x").decoration("x", style=lambda s, **_: s) == "(HEAD)"
    assert refs.decoration("y") == ""


# -- demo ----------------------------------------------------------------------------------------------
def test_demo_records_a_new_session_each_run(url: str) -> None:
    first = ok(run(url, "demo", session=None))
    assert "weather-app/alice/demo-1" in first.stderr
    assert "|/" in first.stdout and "(HEAD -> main)" in first.stdout and "(retry)" in first.stdout
    assert '"last_city": "Beijing"' in first.stdout and '"last_city": "Shanghai"' in first.stdout
    second = ok(run(url, "demo", session=None))
    assert "weather-app/alice/demo-2" in second.stderr
    keys = {s["key"] for s in json.loads(ok(run(url, "sessions", "--json", session=None)).stdout)["sessions"]}
    assert keys == {f"weather-app/alice/demo-{n}{f}" for n in (1, 2) for f in ("", "-fork")}
    ok(run(url, "verify", session="weather-app/alice/demo-2"))
    ok(run(url, "verify", session="weather-app/alice/demo-2-fork"))


def _castore_exe() -> list[str]:
    exe = Path(sys.executable).with_name("castore")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from castore.cli import main; main()"]


def test_demo_then_log_graph_all_json_as_real_processes(tmp_path: Path) -> None:
    env = {**os.environ, "CASTORE_STORE": str(tmp_path / "demo-store")}
    env.pop("CASTORE_SESSION", None)
    demo = subprocess.run([*_castore_exe(), "demo"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert "Traceback" not in demo.stderr and "\x1b[" not in demo.stdout
    assert "$ castore -s weather-app/alice/demo-1 log --graph --all" in demo.stdout
    log = subprocess.run([*_castore_exe(), "-s", "weather-app/alice/demo-1", "log", "--graph", "--all", "--json"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert log.returncode == 0, log.stderr
    doc = json.loads(log.stdout)
    commits = doc["commits"]
    assert len(commits) == 9 and doc["branch"] == "main"
    by_id = {c["id"]: c for c in commits}
    head = by_id[doc["head"]]
    assert head["refs"] == {"head": True, "branches": ["main"], "labels": []}
    assert head["entry"]["state_delta"] == {"last_city": "Shanghai"}
    retry = next(c for c in commits if c["refs"]["branches"] == ["retry"])
    labelled = next(c for c in commits if c["refs"]["labels"] == ["first-answer"])
    assert retry["parents"] == labelled["parents"]  # the retry answers the same tool result again
    assert [c["kind"] for c in commits].count("event") == 3
    graph = doc["graph"]
    assert len([g for g in graph if g.lstrip("|/ ").strip()]) == 9
    assert "|/" in graph and any(g.startswith("| @ ") and "(HEAD -> main)" in g for g in graph)
    # every commit is drawn, children before parents
    pos = {c["id"]: i for i, c in enumerate(commits)}
    assert all(pos[p] > pos[c["id"]] for c in commits for p in c["parents"] if p in pos)
    state = subprocess.run([*_castore_exe(), "-s", "weather-app/alice/demo-1", "state", "first-answer"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert json.loads(state.stdout) == {"last_city": "Beijing"}
