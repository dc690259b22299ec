"""Branches of imported coding-agent sessions mean something: the parts of one turn are one
path, main is the path to the newest leaf, a rewind or rollback is a branch named for it;
the same tree however the file is imported; sessions imported before keep their names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import castore
from castore.adapters import claude_code, claude_tree
from castore.adapters.claude_code import export_claude, import_claude
from castore.adapters.tree_writer import branch_layout

DATA = Path(__file__).resolve().parent / "data" / "claude-code"
SHARE = DATA / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"
REWIND = DATA / "claude-code-log" / "dag_compact_after_rewind.jsonl"


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    return castore.open(str(tmp_path / "store"), durable=False)


def _lines(s: castore.Session, rev: str) -> list[int]:
    return [le.meta["claude"]["o"] for le in s.entries(rev)]


def _layout(s: castore.Session) -> dict[str, list[int]]:
    """Each branch as the lines on its path: what must not depend on how the file was imported."""
    return {name: _lines(s, name) for name in s.branches()}


def test_parallel_tool_calls_and_their_results_are_one_path_in_file_order(store: castore.Store) -> None:
    import_claude(store, SHARE / f"{SID}.jsonl")
    s = store.session("claude", "session-share", SID)
    raw = [json.loads(ln) for ln in (SHARE / f"{SID}.jsonl").read_bytes().splitlines()]
    # the file's shape: three Task calls chained (4, 5, 6), each result under its own call
    # (7 under 4, 8 under 5, 9 under 6): siblings, not forks
    assert [raw[n]["parentUuid"] for n in (7, 8, 9)] == [raw[n]["uuid"] for n in (4, 5, 6)]
    assert raw[5]["parentUuid"] == raw[4]["uuid"]
    assert not any(name.startswith("line-") for name in s.branches())
    assert s.current_branch == "main" and s.head == s.branches()["main"]
    assert _lines(s, "main")[:12] == list(range(12))
    # the newest leaf (the last answer, line 84, then the summary) is main's tip
    assert s.show("main").meta["claude"]["o"] == 85
    assert sorted(s.branches()) == ["main", "rewind-81"]


def test_a_rewound_prompt_is_one_branch_and_main_goes_on_from_the_rewind(store: castore.Store) -> None:
    import_claude(store, REWIND)
    s = store.session("claude", "claude-code-log", "dag_compact_after_rewind")
    # "Second attempt" (line 4) is a second prompt after the answer "Ready" (line 1): the
    # first attempt (2, 3) is the branch; main goes on from the rewind, through the compaction
    assert s.branches().keys() == {"main", "rewind-2"} and s.current_branch == "main"
    assert _lines(s, "rewind-2") == [0, 1, 2, 3]
    assert _lines(s, "main") == [0, 1, 4, 5, 6, 7, 8, 9, 10, 11]
    assert s.show("main").entry.message.content[0]["text"] == "Final answer"
    assert s.show("rewind-2").entry.message.content[0]["text"] == "First answer"
    assert "compact-8" in s.labels()


@pytest.mark.parametrize("src", [SHARE / f"{SID}.jsonl", REWIND], ids=["session-share", "rewind"])
def test_line_by_line_imports_give_the_tree_one_import_gives(src: Path, tmp_path: Path) -> None:
    whole = castore.open(str(tmp_path / "whole"), durable=False)
    import_claude(whole, src)
    want = whole.session("claude", src.parent.name, src.stem)
    lines = src.read_bytes().splitlines(keepends=True)
    proj = tmp_path / src.parent.name
    proj.mkdir()
    f = proj / src.name
    st = castore.open(str(tmp_path / "step"), durable=False)
    for i in range(1, len(lines) + 1):  # as --follow sees a file grow
        f.write_bytes(b"".join(lines[:i]))
        import_claude(st, f)
    got = st.session("claude", src.parent.name, src.stem)
    assert _layout(got) == _layout(want) and got.current_branch == want.current_branch == "main"
    assert got.branches() == want.branches()  # the same commits, too
    out = tmp_path / "out"
    export_claude(st, out)
    assert (out / src.parent.name / src.name).read_bytes() == src.read_bytes()


def test_a_resumed_session_with_another_process_writing_keeps_both_leaves(store: castore.Store,
                                                                           tmp_path: Path) -> None:
    """Two Claude Code processes on one session: each writes from where it last saw the
    session. main follows whichever wrote the newest turn; the other keeps its branch."""
    proj = tmp_path / "proj"
    proj.mkdir()
    src = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    raw = [json.loads(ln) for ln in src]
    f = proj / "s.jsonl"

    def line(uuid: str, parent: str, text: str, t: str, kind: str = "user") -> bytes:
        msg = {"role": kind, "content": text if kind == "user" else [{"type": "text", "text": text}]}
        return json.dumps({"parentUuid": parent, "type": kind, "uuid": uuid, "sessionId": SID,
                           "timestamp": t, "message": msg}).encode() + b"\n"

    f.write_bytes(b"".join(src))
    import_claude(store, proj)
    s = store.session("claude", "proj", "s")
    # the other process (the one that wrote line 82) goes on: its branch becomes main
    more = [line("b-1", raw[82]["uuid"], "go on there", "2026-01-22T21:30:00.000Z"),
            line("b-2", "b-1", "went on", "2026-01-22T21:30:01.000Z", "assistant")]
    f.write_bytes(b"".join(src + more))
    import_claude(store, proj)
    assert s.current_branch == "main" and _lines(s, "main")[-4:] == [81, 82, 86, 87]
    # what main was (from line 33 on, after the shared line 32) is the other side of that rewind
    assert sorted(s.branches()) == ["main", "rewind-33"]
    assert _lines(s, "rewind-33")[-3:] == [83, 84, 85]
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s.jsonl").read_bytes() == b"".join(src + more)


def test_branch_layout_names_nested_branches_by_their_own_part(store: castore.Store) -> None:
    s = store.session("a", "u", "s")
    ids = s.append_many([castore.Message("user", str(i)) for i in range(3)])
    s.branch("x", at=ids[0])
    # lines as an import writes them: o is the line, fork the kind of alternative
    s.append_many([castore.Event(author="user", meta={"k": {"o": 10, "fork": "rewind"}})], branch="x")
    s.branch("y", at=s.branches()["x"])
    y = s.append_many([castore.Event(author="user", meta={"k": {"o": 11}})], branch="y")
    s.append_many([castore.Event(author="user", meta={"k": {"o": 12, "fork": "rewind"}})], branch="x")
    got = branch_layout(s.log(all_branches=True), y[0], "k")
    # y holds the newest line the agent was on: main; x's own part starts at line 12
    assert got == {"main": y[0], "rewind-12": s.branches()["x"], "rewind-c" + ids[1][:8]: ids[2]}


def _old_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Import as castore did before branches had meanings: a line whose parent is not what
    the last line's turn continues forks a branch ``line-<n>``, HEAD follows the agent."""

    def find(self: claude_tree.Paths, p: str, role: str, cursor: int | None) -> int | None:
        leaf = self.leaves.get(cursor) if cursor is not None else None
        return cursor if leaf is not None and p in leaf.reach else None

    monkeypatch.setattr(claude_tree.Paths, "find", find)
    monkeypatch.setattr(claude_code, "LAYOUT", 1)


def test_a_session_imported_by_the_old_rules_keeps_its_branch_names(store: castore.Store, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    src = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    f = proj / "s.jsonl"
    f.write_bytes(b"".join(src[:60]))
    with monkeypatch.context() as m:
        _old_rules(m)
        import_claude(store, proj)
    s = store.session("claude", "proj", "s")
    # what the old importer left: the parallel calls as branches, its state without a layout
    info = s.info
    c = info["claude"]
    leaf = c.pop("paths")[str(c["cursor"])]
    del c["layout"]
    c["reach"] = leaf["reach"]
    c["tips"] = None  # (the old digest covered the same tips; None: read what is stored again)
    s.set_info(info)
    old = s.branches()
    assert sorted(old) == ["line-52", "line-7", "line-8", "main"]
    # a new import of the grown file: the old names stay where they were, nothing is renamed
    f.write_bytes(b"".join(src))
    r = import_claude(store, proj)[0]
    now = s.branches()
    assert {k: now[k] for k in old if k != "main"} == {k: v for k, v in old.items() if k != "main"}
    assert r.branches == ["line-81"] and sorted(now) == ["line-52", "line-7", "line-8", "line-81", "main"]
    assert s.info["claude"]["layout"] == 1 and s.current_branch == "main"
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s.jsonl").read_bytes() == b"".join(src)
    # while a new import of the same file lays it out by the new rules
    other = castore.open(str(tmp_path / "other"), durable=False)
    shutil.copy(f, tmp_path / "s.jsonl")
    import_claude(other, tmp_path / "s.jsonl")
    assert sorted(other.session("claude", tmp_path.name, "s").branches()) == ["main", "rewind-81"]


def test_subagents_link_both_ways_in_log_show_and_sessions(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from castore.cli.main import main

    def cli(*args: str) -> str:
        r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "--no-pager", *args])
        assert r.exit_code == 0, r.output
        return r.output

    cli("import", "claude", str(SHARE))
    st = castore.open(str(tmp_path / "store"))
    main_s = st.session("claude", "session-share", SID)
    sub_id = f"{SID}.subagents.agent-a5bdbc1"
    sub = st.session("claude", "session-share", sub_id)
    by = sub.info["spawned_by"]
    call = main_s.info["claude"]["agents"]["a5bdbc1"]["call"]
    # the parent's Task call (and its result) names the subagent's session
    assert any(b.get("type") == "tool_use" and b.get("name") == "Task" and b["id"] == by["tool_use_id"]
               for b in main_s.show(call).entry.message.content)
    log = cli("log", "--oneline", "-n", "0", "-s", f"claude/session-share/{SID}")
    assert {ln.split()[0] for ln in log.splitlines() if f"subagent: {sub_id}" in ln} == {call[:8], by["commit"][:8]}
    shown = cli("show", call, "-s", f"claude/session-share/{SID}")
    assert f"subagent: {sub_id}" in shown.splitlines()[0] and "→ Task(Poem about Thai yellow curry)" in shown
    # the subagent's first entry names the parent session and the commit that spawned it
    first = sub.entries("HEAD")[0]
    assert by["first"] == first.id and first.meta["claude"]["o"] == 0
    sub_log = cli("log", "--oneline", "-n", "0", "-s", f"claude/session-share/{sub_id}")
    assert sub_log.splitlines()[-1].startswith(f"{first.id[:8]} (spawned by: {SID} {by['commit'][:8]})")
    assert f"spawned by: {SID} {by['commit'][:8]}" in cli("show", first.id, "-s", f"claude/session-share/{sub_id}")
    # sessions: each subagent says whose it is
    listed = [ln for ln in cli("sessions", "claude").splitlines() if ".subagents." in ln]
    assert len(listed) == 5 and all(ln.rstrip().endswith(f"subagent of {SID}") for ln in listed)
    # and so does --json, as status --json does ("subagent_of"; null for the parent)
    of = {d["session"]: d["subagent_of"] for d in json.loads(cli("sessions", "claude", "--json"))["sessions"]}
    assert of[SID] is None and of[sub_id] == {"key": f"claude/session-share/{SID}", "session": SID,
                                              "commit": by["commit"]}
    assert sum(v is not None for v in of.values()) == 5
    assert json.loads(cli("log", "--json", "-n", "0", "-s", f"claude/session-share/{sub_id}"))["commits"][-1][
        "refs"]["links"] == [f"spawned by: {SID} {by['commit'][:8]}"]


def test_branch_lists_what_made_each_branch(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from castore.cli.main import main

    r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "--no-pager", "import", "claude", str(REWIND)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "--no-pager", "branch", "-s",
                                  "claude/claude-code-log/dag_compact_after_rewind"])
    assert r.exit_code == 0, r.output
    rows = [ln.split(None, 3) if ln.startswith("*") else ln.split(None, 2) for ln in r.output.splitlines()]
    assert rows[0][:2] == ["*", "main"] and len(rows[0]) == 3  # main: where the agent goes on, no note
    assert rows[1][0] == "rewind-2" and rows[1][2] == "rewind from line 2: user: First attempt"
    # --json says it too ("made_by"; null where the table shows nothing)
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "--no-pager", "branch", "--json", "-s",
                                  "claude/claude-code-log/dag_compact_after_rewind"])
    assert r.exit_code == 0, r.output
    made = {b["name"]: b["made_by"] for b in json.loads(r.output)["branches"]}
    assert made == {"main": None, "rewind-2": "rewind from line 2: user: First attempt"}


def test_head_comes_back_to_main_when_the_agent_writes_and_names_stay_whole(store: castore.Store,
                                                                             tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    src = REWIND.read_bytes().splitlines(keepends=True)
    f = proj / "s.jsonl"
    f.write_bytes(b"".join(src[:5]))  # up to the rewound prompt: main is on it, rewind-2 the first attempt
    import_claude(store, proj)
    s = store.session("claude", "proj", "s")
    assert s.branches().keys() == {"main", "rewind-2"}
    s.checkout("rewind-2")  # someone looks at the first attempt
    f.write_bytes(b"".join(src))
    import_claude(store, proj)
    assert s.current_branch == "main" and _lines(s, "main")[-1] == 11 and _lines(s, "rewind-2") == [0, 1, 2, 3]
    # HEAD on a branch the next layout renames: every name still ends on its leaf
    s.checkout("rewind-2")
    more = json.dumps({"parentUuid": "b1a", "type": "user", "uuid": "x1", "timestamp": "2025-07-01T11:00:00.000Z",
                       "message": {"role": "user", "content": "back to the first"}}).encode() + b"\n"
    f.write_bytes(b"".join(src) + more)
    import_claude(store, proj)
    assert s.current_branch == "main" and _lines(s, "main") == [0, 1, 2, 3, 12]
    assert s.branches().keys() == {"main", "rewind-4"} and _lines(s, "rewind-4")[-1] == 11
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s.jsonl").read_bytes() == b"".join(src) + more


def test_export_takes_the_global_s_typed_before_the_command(tmp_path: Path) -> None:
    # `castore -s edge_cases export claude OUT` wrote every archived session: the -s typed before
    # the command was taken and ignored, where `export claude OUT -s edge_cases` writes one
    from click.testing import CliRunner

    from castore.cli.main import main

    def cli(*args: str) -> list[str]:
        r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), *args])
        assert r.exit_code == 0, r.output
        return r.stdout.splitlines()

    cli("import", "claude", str(DATA / "claude-code-log"))
    assert len(cli("export", "claude", str(tmp_path / "all"))) == 5
    assert cli("-s", "edge_cases", "export", "claude", str(tmp_path / "one")) == ["claude-code-log/edge_cases.jsonl"]
    assert cli("export", "claude", str(tmp_path / "two"), "-s", "edge_cases") == ["claude-code-log/edge_cases.jsonl"]
    # a default session chosen with `castore use` is no choice typed for this command
    cli("use", "edge_cases")
    assert len(cli("export", "claude", str(tmp_path / "again"))) == 5


def test_a_new_sessions_branches_are_laid_out_without_reading_its_log_back(store: castore.Store,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # the files whose last line is off main: finish lays their branches out; a session new
    # with the import holds what its writer wrote, and the names are those of the read-back
    reads: list[str] = []
    real_log = castore.Session.log

    def log(self: castore.Session, *a: object, **k: object) -> object:
        reads.append(self.id)
        return real_log(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(castore.Session, "log", log)
    import_claude(store, SHARE / f"{SID}.jsonl")
    import_claude(store, REWIND)
    assert reads == []
    monkeypatch.setattr(castore.Session, "log", real_log)
    for s in (store.session("claude", "session-share", SID),
              store.session("claude", "claude-code-log", "dag_compact_after_rewind")):
        assert len(s.branches()) > 1
        assert branch_layout(s.log(all_branches=True), s.branches()["main"], "claude") == s.branches()
