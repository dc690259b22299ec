"""Claude Code sessions: byte-for-byte round trips of the real files, the tree, incremental
import, following a live file, and hostile input."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from helpers.interrupt import same_tree

import castore
from castore.adapters.claude_code import (
    export_claude,
    find_sessions,
    follow_claude,
    import_claude,
)
from castore.adapters.jsonl_tree import ArchiveError, parse_time, safe_join
from castore.grep import grep

DATA = Path(__file__).resolve().parent / "data" / "claude-code"
SHARE = DATA / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    return castore.open(str(tmp_path / "store"), durable=False)


def _shape(s: castore.Session) -> set[tuple[int, int | None, str | None]]:
    """The tree as (line, parent line, body) triples: what must not depend on how it was imported."""
    les = s.log(all_branches=True)
    o_of = {le.id: le.meta["claude"]["o"] for le in les}
    return {(le.meta["claude"]["o"], o_of.get(le.parents[0]) if le.parents else None,
             json.dumps(le.entry.message.to_dict(), sort_keys=True) if le.entry.message else None) for le in les}


def test_real_files_round_trip_byte_for_byte(store: castore.Store, tmp_path: Path) -> None:
    import_claude(store, DATA)  # the whole tree: two project folders
    out = tmp_path / "out"
    written = export_claude(store, out)
    assert f"session-share/{SID}/subagents/agent-a5bdbc1.jsonl" in written
    same_tree(DATA, out)


def test_session_tree_rewind_is_a_branch_parallel_calls_are_one_path_head_is_last_turn(store: castore.Store) -> None:
    import_claude(store, SHARE / f"{SID}.jsonl")
    s = store.session("claude", "session-share", SID)
    lines = (SHARE / f"{SID}.jsonl").read_bytes().splitlines()
    assert len(s.log(all_branches=True)) == len(lines)
    # HEAD: main, the path to the last assistant line (line 84, parented to line 83),
    # followed by the summary line written after it
    assert s.show("HEAD").meta["claude"]["o"] == 85
    assert s.show("HEAD~1").meta["claude"]["uuid"] == json.loads(lines[84])["uuid"]
    assert s.current_branch == "main"
    # line 81 is a second prompt after the turn_duration line 32 (written by another Claude
    # Code process, 2.1.15, that had seen the session up to there): a rewind, one branch;
    # the parallel Task calls (lines 4-6, their results 7-9 each under its own call; 50-53)
    # and the lagging result 78 make none
    assert sorted(s.branches()) == ["main", "rewind-81"]
    b = s.entries("rewind-81")
    assert b[-1].meta["claude"]["o"] == 82 and b[-3].meta["claude"]["o"] == 32
    assert [le.meta["claude"]["o"] for le in b] == list(range(33)) + [81, 82]
    # main holds every other line in file order
    assert [le.meta["claude"]["o"] for le in s.entries("main")] == [n for n in range(86) if n not in (81, 82)]
    assert b[-2].meta["claude"]["fork"] == "rewind"
    # snapshots and queue operations do not make branches: they sit on the path
    on_path = {le.meta["claude"]["o"] for le in s.entries("HEAD")}
    assert {0, 12, 20, 58} <= on_path
    # the title of the session comes from its summary line
    assert s.info["name"] == json.loads(lines[85])["summary"]
    # messages are readable as messages; signatures are not in the body
    msgs = [le.entry.message for le in s.entries("HEAD") if le.kind == "event" and le.entry.message]
    assert msgs[0].role == "user"
    assert all("signature" not in json.dumps(m.to_dict()) for m in msgs)


def test_subagents_are_sessions_linked_to_the_spawning_turn(store: castore.Store) -> None:
    import_claude(store, SHARE)
    sub = store.session("claude", "session-share", f"{SID}.subagents.agent-a5bdbc1")
    link = sub.info["spawned_by"]
    assert link["session"] == SID
    main = store.session("claude", "session-share", SID)
    spawned = main.show(link["commit"])
    raw = json.loads([ln for ln in (SHARE / f"{SID}.jsonl").read_bytes().splitlines()
                      if spawned.meta["claude"]["uuid"].encode() in ln][0])
    assert raw["toolUseResult"]["agentId"] == "a5bdbc1"
    assert link["tool_use_id"] == raw["message"]["content"][0]["tool_use_id"]


def test_reimport_is_idempotent_and_incremental(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    src = (SHARE / f"{SID}.jsonl").read_bytes()
    lines = src.splitlines(keepends=True)
    f = proj / "s1.jsonl"
    f.write_bytes(b"".join(lines[:40]))
    r1 = import_claude(store, proj)[0]
    assert (r1.lines, r1.total) == (40, 40)
    s = store.session("claude", "proj", "s1")
    head1, ids1 = s.head, {le.id for le in s.log(all_branches=True)}
    r2 = import_claude(store, proj)[0]
    assert r2.lines == 0 and s.head == head1
    f.write_bytes(b"".join(lines))
    r3 = import_claude(store, proj)[0]
    assert (r3.lines, r3.total, r3.offset) == (len(lines) - 40, len(lines), len(src))
    ids3 = {le.id for le in s.log(all_branches=True)}
    assert ids1 <= ids3 and len(ids3) == len(lines)
    # the same tree as importing the whole file at once
    other = castore.open(str(tmp_path / "other"), durable=False)
    import_claude(other, proj)
    o = other.session("claude", "proj", "s1")
    assert _shape(o) == _shape(s)
    assert o.show("HEAD").meta["claude"] == s.show("HEAD").meta["claude"]
    assert sorted(o.branches()) == sorted(s.branches())
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s1.jsonl").read_bytes() == src


def test_torn_last_line_is_left_for_next_time(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    lines = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    f = proj / "s.jsonl"
    torn = lines[10][: len(lines[10]) // 2]
    f.write_bytes(b"".join(lines[:10]) + torn)
    r = import_claude(store, proj)[0]
    assert (r.lines, r.torn) == (10, len(torn))
    f.write_bytes(b"".join(lines[:12]))
    r = import_claude(store, proj)[0]
    assert (r.lines, r.total, r.torn) == (2, 12, 0)
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s.jsonl").read_bytes() == b"".join(lines[:12])


def test_file_deleted_upstream_stays_in_the_archive(store: castore.Store, tmp_path: Path) -> None:
    projects = tmp_path / "projects"
    shutil.copytree(SHARE, projects / "p")
    import_claude(store, projects)
    (projects / "p" / f"{SID}.jsonl").unlink()
    shutil.rmtree(projects / "p" / SID)
    (projects / "q").mkdir()
    (projects / "q" / "new.jsonl").write_bytes((DATA / "claude-code-log" / "session_b.jsonl").read_bytes())
    import_claude(store, projects)
    assert store.session("claude", "p", SID).exists()
    out = tmp_path / "out"
    export_claude(store, out)
    same_tree(SHARE, out / "p")


def test_changed_prefix_is_reported_and_kept_beside(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    lines = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    f = proj / "s.jsonl"
    f.write_bytes(b"".join(lines[:20]))
    import_claude(store, proj)
    old = store.session("claude", "proj", "s")
    old_head = old.head
    f.write_bytes(b"".join(lines[1:30]))  # the first line went away: a rewritten file
    r = import_claude(store, proj)[0]
    assert "changed" in r.notes[0] and r.session == ("claude", "proj", "s.v2")
    assert old.head == old_head and len(old.log(all_branches=True)) == 20
    out = tmp_path / "out"
    export_claude(store, out)  # the newest version of the file is written
    assert (out / "proj" / "s.jsonl").read_bytes() == b"".join(lines[1:30])
    for _ in range(3):  # the unchanged file again: one new version, once (no .v3, .v4, ...)
        r = import_claude(store, proj)[0]
        assert (r.session, r.lines, r.notes) == (("claude", "proj", "s.v2"), 0, [])
    f.write_bytes(b"".join(lines[1:40]))  # the agent goes on: the new version grows
    r = import_claude(store, proj)[0]
    assert (r.session, r.lines, r.total) == (("claude", "proj", "s.v2"), 10, 39)
    f.write_bytes(b"".join(lines[2:40]))  # rewritten again: a third version, once
    assert import_claude(store, proj)[0].session == ("claude", "proj", "s.v3")
    assert import_claude(store, proj)[0].session == ("claude", "proj", "s.v3")
    assert sorted(si.session for si in store.sessions("claude")) == ["s", "s.v2", "s.v3"]
    v3 = store.session("claude", "proj", "s.v3").info["claude"]
    assert (v3["version"], v3["supersedes"]) == (3, "s.v2")
    with pytest.raises(ArchiveError, match="1 file holds what the archive's copy lacks"):
        export_claude(store, out)  # the earlier export's s.jsonl is not a prefix of the new version
    export_claude(store, tmp_path / "out2")
    assert (tmp_path / "out2" / "proj" / "s.jsonl").read_bytes() == b"".join(lines[2:40])


def test_hostile_lines_are_kept_byte_for_byte(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    huge = json.dumps({"type": "user", "uuid": "h1", "parentUuid": None, "timestamp": "2026-01-01T00:00:00Z",
                       "message": {"role": "user", "content": "x" * (3 << 20)}}).encode() + b"\n"
    body = (b"not json at all\n" + b"\xff\xfe binary\n" + b"[1, 2]\n" + b"\n" + huge
            + b'{"type":"assistant","uuid":"h2","parentUuid":"h1","message":{"role":"assistant","content":"ok"}}\n')
    (proj / "s.jsonl").write_bytes(body)
    r = import_claude(store, proj)[0]
    assert r.total == 6 and any("not JSON" in n for n in r.notes)
    s = store.session("claude", "proj", "s")
    assert s.show("HEAD").entry.message.content == "ok"
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s.jsonl").read_bytes() == body


def test_dotdot_project_names_stay_inside_the_store_and_the_destination(store: castore.Store, tmp_path: Path) -> None:
    projects = tmp_path / "projects"
    projects.mkdir()
    for name in ("-home-..-x", "..x", "a..b"):
        (projects / name).mkdir()
        (projects / name / "s.jsonl").write_bytes((DATA / "claude-code-log" / "session_b.jsonl").read_bytes())
    import_claude(store, projects)
    users = {si.user for si in store.sessions("claude")}
    assert users == {"-home-..-x", "..x", "a..b"}
    for p in (tmp_path / "store").rglob("*"):
        assert p.resolve().is_relative_to((tmp_path / "store").resolve())
    out = tmp_path / "out"
    export_claude(store, out)
    assert sorted(p.name for p in out.iterdir()) == ["-home-..-x", "..x", "a..b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "projects", "store"]


def test_export_refuses_a_path_that_leaves_the_destination(store: castore.Store, tmp_path: Path) -> None:
    for bad in ("../x.jsonl", "/etc/x.jsonl", "a/../../x.jsonl", "a/./b.jsonl", ""):
        with pytest.raises(ArchiveError):
            safe_join(str(tmp_path), bad)
    import_claude(store, DATA / "claude-code-log" / "session_b.jsonl")
    s = store.session("claude", "claude-code-log", "session_b")
    s.set_info({**s.info, "claude": {**s.info["claude"], "path": "../../escape.jsonl"}})
    with pytest.raises(ArchiveError):
        export_claude(store, tmp_path / "out")
    assert not (tmp_path / "escape.jsonl").exists()


def test_missing_path_is_a_clear_error(store: castore.Store, tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="no such file"):
        find_sessions(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArchiveError, match="no Claude Code session"):
        import_claude(store, tmp_path / "empty")


def test_follow_imports_lines_as_they_are_written(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    lines = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    f = proj / "live.jsonl"
    f.write_bytes(b"".join(lines[:5]))
    seen: list[int] = []
    done = threading.Event()
    wrote_all = threading.Event()

    def writer() -> None:
        with open(f, "ab") as fh:
            for ln in lines[5:30]:
                fh.write(ln[:10])  # a torn line first, then the rest
                fh.flush()
                fh.write(ln[10:])
                fh.flush()
        wrote_all.set()

    def on_result(r: object) -> None:
        seen.append(r.total)  # type: ignore[attr-defined]
        if wrote_all.is_set() and r.total == 30:  # type: ignore[attr-defined]
            done.set()

    t = threading.Thread(target=writer)
    t.start()
    n = follow_claude(store, proj, interval=0.01, stop=lambda: done.is_set() or (wrote_all.is_set() and seen and seen[-1] == 30),
                      on_result=on_result)
    t.join()
    assert n == 30 and seen[-1] == 30
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "live.jsonl").read_bytes() == b"".join(lines[:30])
    assert filecmp.cmp(f, out / "proj" / "live.jsonl", shallow=False)
    assert os.path.getsize(f) == sum(len(ln) for ln in lines[:30])


def test_lines_claude_code_wrote_are_flagged_and_grep_typed_leaves_them_out(store: castore.Store) -> None:
    import_claude(store, SHARE)
    s = store.session("claude", "session-share", SID)
    flags = {le.meta["claude"]["o"]: le.meta.get("injected") for le in s.log(all_branches=True)
             if le.meta["claude"].get("type") == "user" and le.meta.get("injected") != "tool_result"}
    # the three prompts a human typed, and what the CLI wrote into user turns around them
    assert [o for o, why in sorted(flags.items()) if why is None] == [1, 73, 81]
    assert {flags[o] for o in (35, 39, 44, 70)} == {"meta"}
    assert flags[21] == flags[59] == "task-notification" and flags[37] == "local-command-stdout"
    assert flags[36] == "command-name" and flags[43] == "command-message" and flags[82] == "interrupt"
    sub = store.session("claude", "session-share", f"{SID}.subagents.agent-a5bdbc1")
    said = [le for le in sub.entries() if le.entry.message is not None and le.entry.message.role == "assistant"]
    assert said and all(le.meta.get("injected") is None for le in said)  # the subagent's answers
    assert sub.entries()[0].meta["injected"] == "sidechain"  # its prompt, written by the main agent
    for index in (False, None):
        every = list(grep(store, "curry", roles=["user"], index=index))
        assert len(every) == 9  # the prompt, three task notifications, five subagent prompts
        typed = list(grep(store, "curry", roles=["user"], typed=True, index=index))
        assert [(m.session[2], s.show(m.commit).meta["claude"]["o"]) for m in typed] == [(SID, 1)]
        answers = list(grep(store, "curry", typed=True, index=index))
        assert {m.role for m in answers} == {"user", "assistant"} and len(answers) < len(list(grep(store, "curry")))
        assert len(list(grep(store, "curry", typed=True, index=index, limit=2))) == 2


# -- the old layout: subagents' lines inside the main file ------------------------------------
def _cc(uuid: str, parent: str | None, type_: str, content: object, i: int, side: bool = False,
        **extra: object) -> bytes:
    """A Claude Code 2.0.x line: its envelope as that version wrote it (claude-code-log's
    sidechain_integrated.jsonl has the shape), ``isSidechain`` true for a subagent's lines."""
    d = {"parentUuid": parent, "isSidechain": side, "userType": "external", "cwd": "/home/me/app",
         "sessionId": "old-1", "version": "2.0.46", "uuid": uuid, "timestamp": f"2025-11-19T22:{i // 60:02d}:{i % 60:02d}.000Z",
         "type": type_, "message": {"role": type_, "content": content}, **extra}
    if type_ == "assistant":
        d["message"] = {"id": f"msg_{uuid}", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                        "content": content, "stop_reason": None}
    return json.dumps(d).encode() + b"\n"


def _task(tid: str, prompt: str) -> dict:
    return {"type": "tool_use", "id": tid, "name": "Task",
            "input": {"subagent_type": "general-purpose", "description": prompt[:20], "prompt": prompt}}


def _old_layout() -> list[bytes]:
    """A main file where two subagents ran in parallel, their lines interleaved with each
    other's and written before the trunk's tool results: agent A's lines name it (agentId),
    agent B's do not (2.0.x wrote some without)."""
    pa, pb = "Find where borders are coloured.", "List the CSS classes."
    res = lambda tid, text: [{"type": "tool_result", "tool_use_id": tid, "content": [{"type": "text", "text": text}]}]  # noqa: E731
    return [
        _cc("u1", None, "user", "research the borders please", 0),
        _cc("a1", "u1", "assistant", [_task("toolu_A", pa)], 1),
        _cc("a2", "a1", "assistant", [_task("toolu_B", pb)], 2),
        _cc("sa1", None, "user", pa, 3, True, agentId="agA"),
        _cc("sb1", None, "user", pb, 4, True),
        _cc("sa2", "sa1", "assistant", [{"type": "tool_use", "id": "toolu_g", "name": "Grep",
                                         "input": {"pattern": "data-border-color"}}], 5, True, agentId="agA"),
        _cc("sb2", "sb1", "assistant", [{"type": "text", "text": "classes: .card .hint"}], 6, True),
        _cc("sa3", "sa2", "user", res("toolu_g", "src/a.css:3 data-border-color"), 7, True, agentId="agA"),
        b'{"type":"file-history-snapshot","messageId":"a2","snapshot":{}}\n',
        _cc("sa4", "sa3", "assistant", [{"type": "text", "text": "borders come from data-border-color"}], 8, True,
            agentId="agA"),
        _cc("r1", "a2", "user", res("toolu_A", "borders come from data-border-color"), 9, agentId="agA",
            toolUseResult={"status": "completed"}),
        _cc("r2", "r1", "user", res("toolu_B", "classes: .card .hint"), 10, toolUseResult={"status": "completed"}),
        _cc("a3", "r2", "assistant", [{"type": "text", "text": "Both subagents are done."}], 11),
        # late lines whose parents are not in the file (a truncated file): by agent, else the last chain
        _cc("sa5", "gone-1", "assistant", [{"type": "text", "text": "one more thing"}], 12, True, agentId="agA"),
        _cc("sx1", "gone-2", "assistant", [{"type": "text", "text": "and another"}], 13, True),
    ]


def test_old_layout_sidechains_are_sessions_linked_to_their_spawner(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "projects" / "app"
    proj.mkdir(parents=True)
    lines = _old_layout()
    (proj / "old-1.jsonl").write_bytes(b"".join(lines))
    r = import_claude(store, proj)[0]
    assert r.total == len(lines) and sorted(r.sidechains) == ["old-1.sidechains.agent-agA",
                                                              "old-1.sidechains.line-4"]
    main = store.session("claude", "app", "old-1")
    o = lambda s, rev="HEAD": [le.meta["claude"]["o"] for le in s.entries(rev)]  # noqa: E731
    assert o(main) == [0, 1, 2, 8, 10, 11, 12] and main.branches() == {"main": main.head}
    a = store.session("claude", "app", "old-1.sidechains.agent-agA")
    b = store.session("claude", "app", "old-1.sidechains.line-4")
    assert o(a) == [3, 5, 7, 9, 13, 14] and o(b) == [4, 6]
    assert a.info["claude"] == {"sidechain_of": "old-1", "line": 3, "agent": "agA"}
    # A names its agent, so it links as a subagent file does: to the trunk's result line;
    # B names none: it links to the Task call whose prompt it got
    la, lb = a.info["spawned_by"], b.info["spawned_by"]
    assert (la["session"], main.show(la["commit"]).meta["claude"]["o"], la["tool_use_id"]) == ("old-1", 10, "toolu_A")
    assert (lb["session"], main.show(lb["commit"]).meta["claude"]["o"], lb["tool_use_id"]) == ("old-1", 2, "toolu_B")
    # a subagent's prompt was written by the main agent
    assert a.entries()[0].meta["injected"] == "sidechain" and a.entries()[-1].meta.get("injected") is None
    # the main file comes back with every line where it was, from the main session or a chain
    out = tmp_path / "out"
    assert export_claude(store, out) == ["app/old-1.jsonl"]
    assert (out / "app" / "old-1.jsonl").read_bytes() == b"".join(lines)
    out2 = tmp_path / "out2"
    assert export_claude(store, out2, sessions=[b]) == ["app/old-1.jsonl"]  # a chain names its main file
    assert (out2 / "app" / "old-1.jsonl").read_bytes() == b"".join(lines)


@pytest.mark.parametrize("cuts", [(4,), (6, 9), (3, 5, 8, 11, 14)])
def test_old_layout_sidechains_import_incrementally_as_at_once(store: castore.Store, tmp_path: Path,
                                                               cuts: tuple[int, ...]) -> None:
    lines = _old_layout()
    whole = castore.open(str(tmp_path / "whole"), durable=False)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "old-1.jsonl").write_bytes(b"".join(lines))
    import_claude(whole, tmp_path / "w")
    proj = tmp_path / "p" / "w"
    proj.mkdir(parents=True)
    for cut in (*cuts, len(lines)):
        (proj / "old-1.jsonl").write_bytes(b"".join(lines[:cut]))
        import_claude(store, proj)
    for sid in ("old-1", "old-1.sidechains.agent-agA", "old-1.sidechains.line-4"):
        got, want = store.session("claude", "w", sid), whole.session("claude", "w", sid)
        assert _shape(got) == _shape(want), sid
        assert {k: v for k, v in got.info.items() if k != "claude"} == \
            {k: v for k, v in want.info.items() if k != "claude"} or sid == "old-1"
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "w" / "old-1.jsonl").read_bytes() == b"".join(lines)


# -- castore's own commits on an imported session ----------------------------------------------
def _append_turn(s: castore.Session) -> list[str]:
    from castore import Compaction, Message

    return s.append_many([
        Message("user", "castore asks: one more curry?"),
        Message("assistant", [{"type": "text", "text": "Yes: massaman."}],
                tool_calls=[{"id": "call_1", "type": "function", "function": {"name": "Bash",
                                                                           "arguments": '{"command": "ls"}'}}]),
        Message("tool", "poems.md", tool_call_id="call_1"),
        Compaction(summary="Four curries so far."),
    ], times=[1.8e9, 1.8e9 + 1, 1.8e9 + 2, 1.8e9 + 3])


def test_entries_appended_with_castore_are_exported_as_lines_and_come_back(store: castore.Store,
                                                                          tmp_path: Path) -> None:
    projects = tmp_path / "projects"
    shutil.copytree(SHARE, projects / "p")
    import_claude(store, projects)
    s = store.session("claude", "p", SID)
    leaf, was, old_81 = s.show("HEAD"), s.current_branch, s.branches()["rewind-81"]
    ids = _append_turn(s)
    out = tmp_path / "out"
    export_claude(store, out)
    orig = (SHARE / f"{SID}.jsonl").read_bytes()
    got = (out / "p" / f"{SID}.jsonl").read_bytes()
    assert got.startswith(orig)  # the imported part: byte for byte
    lines = [json.loads(ln) for ln in got[len(orig):].splitlines()]
    assert [d["castoreCommit"] for d in lines] == ids and [d["type"] for d in lines] == [
        "user", "assistant", "user", "user"]
    assert lines[3]["isCompactSummary"] is True
    # chained to the leaf the commits were made on (the summary line has no uuid: its parent's)
    last_turn = json.loads(orig.splitlines()[84])
    assert lines[0]["parentUuid"] == last_turn["uuid"] and leaf.meta["claude"]["o"] == 85
    assert [d["parentUuid"] for d in lines[1:]] == [d["uuid"] for d in lines[:-1]]
    assert lines[0]["sessionId"] == SID and lines[0]["cwd"] == last_turn["cwd"]
    assert lines[1]["message"]["content"][1] == {"type": "tool_use", "id": "call_1", "name": "Bash",
                                                 "input": {"command": "ls"}}
    # into another store: the appended entries come back as lines of the file
    other = castore.open(str(tmp_path / "other"), durable=False)
    import_claude(other, out / "p")
    back = other.session("claude", "p", SID).entries("HEAD")[-4:]
    msgs = [le.entry.message for le in back]
    assert [m.role for m in msgs] == ["user", "assistant", "user", "user"]
    assert msgs[0].content == "castore asks: one more curry?"
    assert msgs[1].content[0]["text"] == "Yes: massaman." and msgs[1].content[1]["name"] == "Bash"
    assert msgs[2].content[0]["tool_use_id"] == "call_1"
    assert msgs[3].content == "Four curries so far." and back[3].meta["injected"] == "compact_summary"
    assert [le.time for le in back] == [1.8e9, 1.8e9 + 1, 1.8e9 + 2, 1.8e9 + 3]
    # into the same store, once the file upstream is the exported one: the lines are taken as
    # the commits they were written from (nothing added), and the agent continues after them
    n_before = len(s.log(all_branches=True))
    more = json.dumps({"parentUuid": lines[2]["uuid"], "type": "user", "uuid": "after-1",
                       "timestamp": "2027-01-01T00:00:00.000Z",
                       "message": {"role": "user", "content": "and then?"}}).encode() + b"\n"
    (projects / "p" / f"{SID}.jsonl").write_bytes(got + more)
    r = import_claude(store, projects / "p")[0]
    assert r.lines == 5 and len(s.log(all_branches=True)) == n_before + 1
    assert s.show("HEAD").entry.message.content == "and then?" and s.show("HEAD").parents == (ids[2],)
    # it follows the tool result, not the compaction: a rewind, where the agent is now (main);
    # the compaction it left (line 89) is the other side of that rewind, named for it
    assert r.branches == ["rewind-89"] and s.current_branch == was == "main"
    assert s.branches() == {"main": s.head, "rewind-89": ids[-1], "rewind-81": old_81}
    export_claude(store, tmp_path / "out2")
    assert (tmp_path / "out2" / "p" / f"{SID}.jsonl").read_bytes() == got + more


def test_hostile_sidechain_and_mark_fields_are_kept_and_named_safely(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    lines = [json.dumps({"type": "user", "uuid": "u1", "parentUuid": None,
                         "message": {"role": "user", "content": "hi"}}).encode() + b"\n"]
    for i, agent in enumerate(["../../x", "a\x00b", "z" * 3000, "", 5, None, "ok-1", "ok-1"]):
        lines.append(json.dumps({"type": "user", "uuid": f"s{i}", "parentUuid": None, "isSidechain": True,
                                 "agentId": agent, "message": {"role": "user", "content": f"p{i}"}}).encode() + b"\n")
    # marks that name no commit of this session are ordinary lines
    lines.append(json.dumps({"type": "assistant", "uuid": "a1", "parentUuid": "u1", "castoreCommit": "ab" * 32,
                             "message": {"role": "assistant", "content": "ok"}}).encode() + b"\n")
    lines.append(json.dumps({"type": "assistant", "uuid": "a2", "parentUuid": "a1", "castoreCommit": ["x"],
                             "message": {"role": "assistant", "content": "ok"}}).encode() + b"\n")
    (proj / "s.jsonl").write_bytes(b"".join(lines))
    r = import_claude(store, proj)[0]
    assert r.sidechains == [f"s.sidechains.line-{n}" for n in range(1, 7)] + ["s.sidechains.agent-ok-1",
                                                                             "s.sidechains.line-8"]
    assert [le.meta["claude"]["o"] for le in store.session("claude", "proj", "s").entries()] == [0, 9, 10]
    export_claude(store, tmp_path / "out")
    assert (tmp_path / "out" / "proj" / "s.jsonl").read_bytes() == b"".join(lines)


def test_the_same_files_give_the_same_commits_in_every_store(tmp_path: Path) -> None:
    """Two machines archiving the same sessions get the same ids (so a push of one archive
    into a bucket the other filled is a fast-forward, not a second history): no commit time
    may come from the clock of the import, also for a leading line without a timestamp (the
    session-share file opens with a ``file-history-snapshot`` line whose only time is inside
    its ``snapshot``)."""
    heads = []
    for name in ("one", "two"):
        st = castore.open(str(tmp_path / name), durable=False)
        import_claude(st, DATA)
        heads.append({(i.user, i.session): (i.head, st.session(i.app, i.user, i.session).branches())
                      for i in st.sessions("claude")})
    assert heads[0] == heads[1]
    s = castore.open(str(tmp_path / "one"), durable=False).session("claude", "session-share", SID)
    first = next(le for le in s.log(all_branches=True) if le.meta["claude"]["o"] == 0)
    assert first.meta["claude"]["type"] == "file-history-snapshot"
    assert first.time == parse_time("2026-01-22T19:38:12.042Z")


def test_a_leading_line_without_any_time_takes_the_epoch_not_the_clock(tmp_path: Path) -> None:
    """A line before any line with a time (a ``summary`` line opening a resumed session) gets
    0.0, the same in every import; the lines after it keep their own times."""
    proj = tmp_path / "projects" / "p"
    proj.mkdir(parents=True)
    lines = [{"type": "summary", "summary": "earlier work", "leafUuid": "u0"},
             {"type": "user", "uuid": "u1", "parentUuid": None, "timestamp": "2026-01-22T19:38:13.000Z",
              "message": {"role": "user", "content": "hello"}}]
    (proj / "s1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    heads, times = [], []
    for name in ("one", "two"):
        st = castore.open(str(tmp_path / name), durable=False)
        import_claude(st, proj / "s1.jsonl")
        s = st.session("claude", "p", "s1")
        heads.append(s.head)
        times.append(sorted(le.time for le in s.log(all_branches=True)))
    assert heads[0] == heads[1]
    assert times[0] == times[1] == [0.0, parse_time("2026-01-22T19:38:13.000Z")]


def test_deeply_nested_lines_are_kept_as_they_are(store: castore.Store, tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    proj.mkdir()
    lines = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    deep = [b"[" * 5000 + b"]" * 5000 + b"\n", b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n",
            # JSON Python reads, but deeper than a castore entry may nest: the line keeps it
            json.dumps({**first, "uuid": "deep-1", "message": {"role": "user",
                                                               "content": json.loads("[" * 500 + "]" * 500)}}
                       ).encode() + b"\n"]
    body = b"".join(lines[:5] + deep + lines[5:])
    (proj / "s.jsonl").write_bytes(body)
    r = import_claude(store, proj)[0]
    assert r.total == len(lines) + 3 and sum("not JSON" in n for n in r.notes) == 2
    # a torn last line nested too deep waits, as any torn line
    (proj / "s.jsonl").write_bytes(body + b"[" * 5000)
    assert import_claude(store, proj)[0].lines == 0
    (proj / "s.jsonl").write_bytes(body + b"[" * 5000 + b"]" * 5000 + b"\n")
    assert import_claude(store, proj)[0].lines == 1
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s.jsonl").read_bytes() == body + b"[" * 5000 + b"]" * 5000 + b"\n"


def test_a_line_msgpack_cannot_hold_is_committed_without_its_message(store: castore.Store, tmp_path: Path) -> None:
    """A new session's line whose message holds a number beyond 64 bits (JSON the parse vouches
    for, which msgpack refuses when its commit is built) is committed without its message, the
    line's bytes keeping it; the lines around it keep theirs, and the export is byte for byte."""
    proj = tmp_path / "proj"
    proj.mkdir()
    lines = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    first = json.loads(lines[0])
    big = (json.dumps({**first, "type": "user", "uuid": "big-1",
                       "message": {"role": "user", "content": [{"type": "text", "text": "n"}]}})
           .replace('"text": "n"', '"text": "n", "n": 18446744073709551616').encode() + b"\n")
    body = b"".join(lines[:5] + [big] + lines[5:])
    (proj / "s.jsonl").write_bytes(body)
    r = import_claude(store, proj)[0]
    assert r.total == len(lines) + 1 and not r.notes
    log = store.session("claude", "proj", "s").log(all_branches=True)
    by_o = {le.meta["claude"]["o"]: le for le in log}
    assert by_o[5].meta["claude"]["uuid"] == "big-1" and by_o[5].entry.message is None
    assert sum(le.entry.message is not None for le in log) > len(lines) // 2
    out = tmp_path / "out"
    export_claude(store, out)
    assert (out / "proj" / "s.jsonl").read_bytes() == body


def test_follow_counts_no_negative_bytes_when_the_file_grows_while_read(
        store: castore.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import castore.adapters.claude_code as cc

    proj = tmp_path / "proj"
    proj.mkdir()
    lines = (SHARE / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    f = proj / "s.jsonl"
    f.write_bytes(b"".join(lines[:10]))
    real = cc.read_lines

    def grows(fh: object, offset: int, *rest: object) -> object:  # the agent writes after the size was taken
        with open(f, "ab") as g:
            g.write(b"".join(lines[10:12]))
        return real(fh, offset, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(cc, "read_lines", grows)
    r = import_claude(store, proj)[0]
    assert (r.lines, r.torn) == (12, 0)


def test_a_file_without_a_final_newline_stays_jsonl_when_castore_appended(store: castore.Store,
                                                                          tmp_path: Path) -> None:
    orig = (SHARE / f"{SID}.jsonl").read_bytes()
    assert orig.endswith(b"\n")
    cut = orig[:-1]  # the real session, its last newline removed
    projects = tmp_path / "projects"
    (projects / "p").mkdir(parents=True)
    f = projects / "p" / f"{SID}.jsonl"
    f.write_bytes(cut)
    import_claude(store, projects / "p")
    s = store.session("claude", "p", SID)
    export_claude(store, tmp_path / "plain")
    assert (tmp_path / "plain" / "p" / f"{SID}.jsonl").read_bytes() == cut  # nothing appended: as it was
    ids = _append_turn(s)
    export_claude(store, tmp_path / "out")
    got = (tmp_path / "out" / "p" / f"{SID}.jsonl").read_bytes()
    assert got.startswith(cut + b"\n")  # the last line ends where it ended; the new lines follow it
    lines = got.splitlines()
    assert all(isinstance(json.loads(ln), dict) for ln in lines)  # every line is JSON on its own
    assert [json.loads(ln).get("castoreCommit") for ln in lines[-4:]] == ids
    # imported again once upstream: the newline is the last line's, the lines are those commits
    n_before = len(s.log(all_branches=True))
    f.write_bytes(got)
    r = import_claude(store, projects / "p")[0]
    assert r.lines == 4 and not r.notes and len(s.log(all_branches=True)) == n_before
    export_claude(store, tmp_path / "out2")
    assert (tmp_path / "out2" / "p" / f"{SID}.jsonl").read_bytes() == got
