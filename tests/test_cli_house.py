"""The CLI as a thin layer: its modules' imports, adapters' views, options that mean one thing,
clone as git clone, hints that run as printed, terminal-safe output (issues 37 and 39)."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
from test_cli import KEY, Seeded, fails, ok, run, seed
from test_cli_habits import castore_proc

import castore
from castore import porcelain, views
from castore.cli.main import main
from castore.entries import Custom, LogEntry

CLI = Path(__file__).resolve().parents[1] / "castore" / "cli"


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    return seed(str(tmp_path / "store"))


# -- 1. no import cycle inside the CLI; 2. generic commands do not import an adapter's view ---------------------
def _cli_imports() -> dict[str, set[str]]:
    """Module -> the castore.cli modules it imports (at any depth of its code)."""
    out: dict[str, set[str]] = {}
    for path in CLI.glob("*.py"):
        got: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    got.add(node.module.split(".")[0])
                else:
                    got |= {a.name for a in node.names}
        out[path.stem] = got
    return out


def test_the_cli_modules_import_each_other_without_a_cycle() -> None:
    graph = _cli_imports()
    assert "render" not in graph["common"] and "common" not in graph["text"]
    seen: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        if seen.get(m) == 1:
            raise AssertionError(f"import cycle: {' -> '.join([*path, m])}")
        if seen.get(m) == 2:
            return
        seen[m] = 1
        for n in graph.get(m, ()):
            visit(n, [*path, m])
        seen[m] = 2

    for m in graph:
        visit(m, [])


def test_no_cli_module_names_an_adapter_view() -> None:
    for path in CLI.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "langgraph_view" not in text and "langgraph" not in re.sub(r"#.*|\"\"\"[\s\S]*?\"\"\"", "", text), path


class _TicketView(views.View):
    """An adapter of a test's own: commits of kind ``ticket`` read as ``ticket #N``."""

    kinds = frozenset({"ticket"})

    def describe(self, e: LogEntry) -> str | None:
        return f"ticket #{e.meta.get('n')}"

    def body(self, e: LogEntry) -> list[str] | None:
        return [f"[ticket #{e.meta.get('n')}]", "opened\x1b[2J"]

    def details(self, session: Any, e: LogEntry) -> list[tuple[str, list[tuple[str, Any]]]]:
        return [("Fields", [("n", e.meta.get("n")), ("who", "bob")])]


def test_an_adapter_registers_how_its_commits_read() -> None:
    from castore.cli import render

    e = LogEntry(id=castore.ObjectId("ab" * 32), kind="ticket", entry=Custom(type="ticket"), parents=(),
                 author="bot", meta={"n": 7})
    assert render.summary(e) == "ticket by bot" and render.body_lines(e) == ["[custom ticket]", "null"]
    view = _TicketView()
    views.register(view)
    try:
        assert views.view_for("ticket") is view and render.summary(e) == "ticket #7"
        assert render.body_lines(e) == ["[ticket #7]", "opened\\x1b[2J"]  # the adapter's text, escaped
        assert views.details(None, e) == [("Fields", [("n", 7), ("who", "bob")])]  # type: ignore[arg-type]
        assert views.visible([e]) == [e]
    finally:
        views.unregister(view)
    assert views.view_for("ticket") is None and render.summary(e) == "ticket by bot"


def test_the_registry_finds_a_kind_s_view_through_the_lazy_table() -> None:
    view = views.view_for("checkpoint")
    assert view is not None and "writes" in view.kinds and views.view_for("writes") is view
    assert views.view_for("no-such-kind") is None
    assert view in views.all_views()


# -- 3. status and branch are library functions -----------------------------------------------------------------
def test_status_and_branch_list_are_data_the_cli_prints(seeded: Seeded) -> None:
    s = seeded.store.session("app", "alice", "s1")
    st = porcelain.status(seeded.store, s)
    assert (st.session, st.exists, st.head, st.branch) == (("app", "alice", "s1"), True, seeded.a2, "main")
    assert (st.entries, st.branches, st.labels, st.remotes) == (4, 2, 1, {})
    doc = json.loads(ok(run(seeded.url, "status", "--json")).stdout)
    assert {k: doc[k] for k in ("head", "branch", "entries", "branches", "labels")} == \
        {"head": st.head, "branch": st.branch, "entries": 4, "branches": 2, "labels": 1}
    assert porcelain.status(seeded.store).session is None
    listing = porcelain.branch_list(s)
    assert listing.current == "main" and listing.branches == {"main": seeded.a2, "retry": seeded.retry}
    assert porcelain.branch_list(s, local=False, remotes=True).branches == {}
    doc = json.loads(ok(run(seeded.url, "branch", "--json")).stdout)
    assert [b["name"] for b in doc["branches"]] == list(listing.branches)


# -- 4. options mean one thing everywhere ------------------------------------------------------------------------
def _leaves(group: click.Group, ctx: click.Context, path: str = "castore") -> list[tuple[str, click.Command]]:
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        if isinstance(cmd, click.Group):
            out += _leaves(cmd, ctx, f"{path} {name}")
        else:
            out.append((f"{path} {name}", cmd))
    return out


def test_short_options_mean_one_thing_in_every_command() -> None:
    ctx = click.Context(main)
    meaning = {"-s": "--session", "-a": "--all", "-n": "--limit", "-f": "--force", "-q": "--quiet", "-d": "--delete"}
    for path, cmd in _leaves(main, ctx):
        for p in cmd.params:
            if not isinstance(p, click.Option):
                continue
            for short, long in meaning.items():
                if short in p.opts:
                    assert long in p.opts, f"{path}: {short} is {p.opts}, not {long}"


#: options that several commands take, each declared once (castore/cli/common.py, or as data in
#: grep_spec.py): the same spelling, help and parameter everywhere
SHARED_OPTIONS = {"--json", "-n", "--limit", "--store", "--all-entries", "--internal", "-q", "--quiet", "--dry-run"}
SHARED_HOMES = {"common.py", "grep_spec.py"}


def shared_option_declarations(path: Path) -> list[str]:
    """``file:line option`` for each ``click.option(...)`` / ``click.Option([...])`` in ``path``
    that declares one of :data:`SHARED_OPTIONS` itself."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("option", "Option")):
            continue
        args = [a for arg in node.args for a in (arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg])]
        spelt = {a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
        out += [f"{path.name}:{node.lineno} {opt}" for opt in sorted(spelt & SHARED_OPTIONS)]
    return out


def test_an_option_several_commands_take_is_declared_once() -> None:
    found = [d for p in sorted(CLI.glob("*.py")) if p.name not in SHARED_HOMES for d in shared_option_declarations(p)]
    assert found == [], f"declare these with the decorators of castore/cli/common.py: {found}"


def test_the_declaration_check_finds_an_option_declared_again(tmp_path: Path) -> None:
    mod = tmp_path / "cmds.py"
    mod.write_text('import click\n@click.option("--dry-run", is_flag=True, help="x")\ndef f(dry_run): ...\n'
                   'opt = click.Option(["-q", "--quiet"], is_flag=True)\n')
    assert shared_option_declarations(mod) == ["cmds.py:2 --dry-run", "cmds.py:4 --quiet", "cmds.py:4 -q"]


def test_shared_options_read_the_same_in_every_command() -> None:
    ctx = click.Context(main)
    helps: dict[str, set[str]] = {}
    for _path, cmd in _leaves(main, ctx):
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and "--all-entries" in p.opts:
                helps.setdefault("--all-entries", set()).add(p.help or "")
            if isinstance(p, click.Option) and not p.hidden and "--quiet" in p.opts:
                assert p.opts == ["-q", "--quiet"], p.opts
    assert len(helps["--all-entries"]) == 1, helps


def test_every_option_that_takes_a_value_names_it_not_clicks_type() -> None:
    """`--app APP`, `--interval SECONDS`, not `--app TEXT`, `--interval FLOAT RANGE` (a choice
    lists its values, a file option says FILE)."""
    ctx = click.Context(main)
    for path, cmd in [("castore", main), *_leaves(main, ctx)]:
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.is_flag and not p.count and not p.hidden:
                assert p.metavar is not None or isinstance(p.type, click.Choice | click.Path), f"{path} {p.opts}"


def test_every_listing_command_takes_n_and_json(seeded: Seeded) -> None:
    ok(run(seeded.url, "fork", "s2"))
    for args, count in ((["sessions", "--json"], lambda d: len(d["sessions"])),
                        (["log", "--json"], lambda d: len(d["commits"])),
                        (["branch", "--json"], lambda d: len(d["branches"])),
                        (["labels", "--json"], lambda d: len(d["labels"])),
                        (["label", "--json"], lambda d: len(d["labels"])),
                        (["reflog", "--json"], lambda d: len(d["reflog"]))):
        session = None if args[0] == "sessions" else KEY
        everything = count(json.loads(ok(run(seeded.url, *args, "-n", "0", session=session)).stdout))
        one = count(json.loads(ok(run(seeded.url, *args, "-n", "1", session=session)).stdout))
        assert one == min(1, everything), args
        assert count(json.loads(ok(run(seeded.url, *args, "--limit", "1", session=session)).stdout)) == one
    assert len(json.loads(ok(run(seeded.url, "sessions", "--json", session=None)).stdout)["sessions"]) == 2


def test_s_is_refused_where_no_session_is_worked_on(seeded: Seeded) -> None:
    assert "No such option" in fails(run(seeded.url, "grep", "Sunny", "-s", KEY, session=None), code=2)
    err = fails(run(seeded.url, "grep", "Sunny"), code=2)  # `castore -s KEY grep`
    assert "`castore grep` works on no one session" in err
    assert "works on no one session" in fails(run(seeded.url, "remote", "list"), code=2)
    assert "works on no one session" in fails(run(seeded.url, "sessions"), code=2)
    ok(run(seeded.url, "grep", "Sunny", session=None, env={"CASTORE_SESSION": KEY}))  # the environment: ambient
    ok(run(seeded.url, "status"))
    ok(run(seeded.url, "status", "-s", KEY, session=None))


def test_grep_filters_sessions_with_sessions_and_a_is_all(seeded: Seeded) -> None:
    ok(run(seeded.url, "fork", "other"))
    for glob, key in (("other", "app/alice/other"), ("app/*/s1", "app/alice/s1")):
        only = ok(run(seeded.url, "grep", "Sunny", "-l", "--sessions", glob, session=None)).stdout.splitlines()
        assert only == [key]
    err = fails(run(seeded.url, "grep", "x", "--session", "o", session=None), code=2)
    assert "No such option '--session'" in err and "--sessions" in err
    for flag in ("-a", "--all", "--all-kinds"):
        ok(run(seeded.url, "grep", "Sunny", flag, session=None))
    assert len(ok(run(seeded.url, "grep", "Sunny", "-n", "1", session=None)).stdout.splitlines()) == 1


def test_branch_refuses_listing_options_with_a_name(seeded: Seeded) -> None:
    for extra in (["-r"], ["-a"], ["--internal"], ["-n", "1"], ["--json"]):
        assert "take no NAME" in fails(run(seeded.url, "branch", "new", *extra), code=2)
    assert "give its NAME" in fails(run(seeded.url, "branch", "-f"), code=2)
    assert "take no NAME" in fails(run(seeded.url, "label", "x", "--json"), code=2)


# -- 5. clone URL DIR; cd DIR ------------------------------------------------------------------------------------
def test_clone_into_a_folder_then_commands_inside_it_find_the_store(seeded: Seeded, tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    r = castore_proc("clone", seeded.url, str(dest), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (dest / ".castore" / "castore.json").is_file() and not (dest / "castore.json").exists()
    (dest / "sub").mkdir()
    for where in (dest, dest / "sub"):
        r = castore_proc("-s", KEY, "log", "--oneline", "-n", "1", cwd=where)
        assert r.returncode == 0 and r.stdout.startswith(seeded.a2[:8]), (where, r.stderr)
    r = castore_proc("status", cwd=dest, env={"CASTORE_SESSION": KEY})
    assert r.returncode == 0 and f"store:    ./.castore ({'./.castore'})" not in r.stdout and "main" in r.stdout
    r = castore_proc("remote", "list", cwd=dest)
    assert r.returncode == 0 and r.stdout.startswith("origin\t")


def test_inside_a_store_folder_the_store_is_that_folder(seeded: Seeded, tmp_path: Path) -> None:
    old_style = tmp_path / "old"  # what clone DIR made before: the store itself
    ok(run(f"{old_style}", "clone", seeded.url, session=None))
    assert (old_style / "castore.json").is_file()
    r = castore_proc("-s", KEY, "log", "--oneline", "-n", "1", cwd=old_style)
    assert r.returncode == 0 and r.stdout.startswith(seeded.a2[:8]), r.stderr
    r = castore_proc("-s", KEY, "log", "--oneline", "-n", "1", cwd=old_style / "refs")
    assert r.returncode == 0 and r.stdout.startswith(seeded.a2[:8]), r.stderr


def test_clone_to_a_url_or_a_castore_folder_is_the_store_itself(seeded: Seeded, tmp_path: Path) -> None:
    ok(run(None, "clone", seeded.url, str(tmp_path / "p" / ".castore"), session=None))
    assert (tmp_path / "p" / ".castore" / "castore.json").is_file()
    url = f"memory://clone-{tmp_path.name}"
    ok(run(None, "clone", seeded.url, url, session=None))
    with castore.open(url) as store:
        assert store.exists and store.apps() == ["app"]


# -- 6. hints run as printed ---------------------------------------------------------------------------------------
PLACEHOLDERS = {"NAME": "named", "BRANCH": "main", "TEXT": "hi", "APP/USER/SESSION": KEY}


def _hints(text: str) -> list[str]:
    return re.findall(r"`(castore [^`]*)`", text)


def _run_hint(hint: str, **fill: str) -> Any:
    words = [{**PLACEHOLDERS, **fill}.get(w, w) for w in shlex.split(hint)[1:]]
    return run(None, *words, session=None)


def test_every_hint_runs_as_printed(seeded: Seeded, tmp_path: Path) -> None:
    url = seeded.url
    # a detached checkout: name the place, or go back
    hints = _hints(ok(run(url, "checkout", "HEAD~1")).stderr)
    assert hints == [f"castore checkout -b NAME --store {url} -s {KEY}", f"castore checkout BRANCH --store {url} -s {KEY}"]
    ok(_run_hint(hints[0]))
    ok(run(url, "checkout", "HEAD~1"))
    ok(_run_hint(hints[1]))
    assert seeded.store.session("app", "alice", "s1").current_branch == "main"
    # the old order of label
    hints = _hints(ok(run(url, "label", "HEAD~1", "old-order")).stderr)
    assert shlex.split(hints[-1]) == ["castore", "label", "old-order", "HEAD~1", "--store", url, "-s", KEY]
    ok(run(url, "label", "-d", "old-order"))
    ok(_run_hint(hints[-1]))
    # state: a revision that is also a key
    seeded.store.session("app", "alice", "s1").append(castore.Event(author="a", state_delta={"retry": 5}))
    hints = _hints(ok(run(url, "state", "retry")).stderr)
    assert json.loads(ok(_run_hint(hints[0])).stdout) == 5
    # status of a session with no entries, with no remote
    out = ok(run(url, "status", session="app/alice/new")).stdout
    hints = _hints(out)
    assert len(hints) == 2
    ok(_run_hint(hints[0]))
    ok(_run_hint(hints[1], URL=str(tmp_path / "remote")))
    # no session at all
    err = fails(run(url, "log", session=None, env={"CASTORE_SESSION": None}), code=2)
    ok(_run_hint(_hints(err)[0]))
    # cat-object with a bad id; delete-session; push with no remote
    ok(_run_hint(_hints(fails(run(url, "cat-object", "zz", session=None)))[0]))
    ok(_run_hint(_hints(ok(run(url, "delete-session", "app/alice/new", session=None)).stderr)[0]))
    ok(run(url, "remote", "remove", "named", session=None))
    ok(_run_hint(_hints(fails(run(url, "push", "--all", session=None)))[0], URL=str(tmp_path / "remote")))
    # a cut body in log
    s = seeded.store.session("app", "alice", "s1")
    s.append(castore.Message(role="user", content="\n".join(f"line {i}" for i in range(30))))
    hints = [h for h in _hints(ok(run(url, "log", "-n", "1")).stdout) if " show " in h]
    assert "line 29" in ok(_run_hint(hints[0])).stdout


# -- 7. terminal controls are escaped in every human output --------------------------------------------------------
EVIL = "red \x1b[31mX\x1b[0m osc \x1b]52;c;aGk=\x07 back\x08 cr\rover csi\x9b2J bidi\u202egnp.exe"


def _no_controls(text: str) -> None:
    for c in ("\x1b", "\x07", "\x08", "\r", "\x9b", "\u202e"):
        assert c not in text, (c, text)


def _claude_project(root: Path, project: str) -> Path:
    folder = root / "projects" / project
    folder.mkdir(parents=True)
    line = {"type": "user", "timestamp": "2025-06-14T12:00:00Z", "parentUuid": None, "isSidechain": False,
            "userType": "human", "cwd": "/tmp", "sessionId": "s1", "version": "1.0.0", "uuid": "u1",
            "message": {"role": "user", "content": [{"type": "text", "text": f"needle {EVIL}"}]}}
    (folder / "s1.jsonl").write_text(json.dumps(line) + "\n")
    return root / "projects"


def test_grep_import_and_state_escape_terminal_controls(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    projects = _claude_project(tmp_path, "-home-\u202eevil\x1b]0;t\x07")
    r = ok(run(url, "import", "claude", str(projects), session=None))
    _no_controls(r.stdout + r.stderr)
    assert "\\u202eevil\\x1b]0;t\\a" in r.stdout
    for args in ([], ["-C", "1"], ["-l"], ["-c"], ["-l", "-c"]):
        r = run(url, "grep", "needle", *args, session=None)
        assert r.exit_code == 0, r.stderr
        _no_controls(r.stdout)
        assert "\\u202eevil" in r.stdout
    assert "\\x1b[31mX" in ok(run(url, "grep", "needle", session=None)).stdout
    r = ok(run(url, "grep", "needle", "--json", session=None))
    _no_controls(r.stdout)
    assert json.loads(r.stdout)["matches"][0]["lines"][0]["text"] == f"needle {EVIL}"
    r = ok(run(url, "grep", "needle", "--jsonl", session=None))
    _no_controls(r.stdout)
    assert json.loads(r.stdout)["lines"][0]["text"] == f"needle {EVIL}"
    with castore.open(url) as store:
        store.session("app", "alice", "s1").append(castore.Event(author="a", state_delta={f"k{EVIL}": EVIL}))
    for args in (["state"], ["state", "--json"], ["replay"], ["status", "--json"], ["log", "--json"]):
        r = ok(run(url, *args))
        _no_controls(r.stdout)
    assert json.loads(ok(run(url, "state")).stdout) == {f"k{EVIL}": EVIL}
