"""Gemini CLI sessions: fixtures built from the record format of google-gemini/gemini-cli's
chat recording (see tests/data/gemini/README.md) round-trip byte for byte; a $rewindTo is a
branch; import is incremental and follows a live file; entries castore appended come back."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.interrupt import same_tree

import castore
from castore.adapters.follow import follow
from castore.adapters.gemini import export_gemini, find_sessions, import_gemini
from castore.adapters.jsonl_tree import ArchiveError
from castore.cli.main import main
from castore.grep import grep

DATA = Path(__file__).resolve().parent / "data" / "gemini" / "tmp"
CHATS = DATA / "my-app" / "chats"
SID = "7f3c2a9e-4b1d-4e8a-9c55-2d6b8e0f1a47"
SUB = "c2d9e1f0-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
MAIN = CHATS / f"session-2026-03-10T09-00-{SID[:8]}.jsonl"
LEGACY = CHATS / "session-2025-09-01T08-00-a1b2c3d4.json"


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    return castore.open(str(tmp_path / "store"), durable=False)


def _shape(s: castore.Session) -> tuple[dict[str, str], str | None, list[str]]:
    return s.branches(), s.current_branch, sorted(le.id for le in s.log(all_branches=True))


def test_the_tree_round_trips_byte_for_byte(store: castore.Store, tmp_path: Path) -> None:
    rs = import_gemini(store, DATA)
    assert [r.session[2] for r in rs] == ["a1b2c3d4-0000-4000-8000-000000000001.json", SID, f"{SID}.{SUB}"]
    out = tmp_path / "out"
    assert len(export_gemini(store, out)) == 3
    same_tree(DATA, out)
    assert all(r.lines == 0 for r in import_gemini(store, DATA))  # again: nothing new


def test_the_tree_round_trips_byte_for_byte_on_an_encrypted_store(tmp_path: Path) -> None:
    """A line's commit names its blob by the id the store gives it (keyed, on an encrypted
    store): export found no line's blob there (ObjectNotFound) while the importer named each
    by its plain id."""
    from castore.crypto.keys import MasterKey

    with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=MasterKey.new(), durable=False) as enc:
        import_gemini(enc, DATA)
        out = tmp_path / "out"
        assert len(export_gemini(enc, out)) == 3
        same_tree(DATA, out)
        assert all(r.lines == 0 for r in import_gemini(enc, DATA))


def test_a_rewind_is_a_branch_and_head_follows_the_agent(store: castore.Store) -> None:
    import_gemini(store, MAIN)
    s = store.session("gemini", "my-app", SID)
    lines = [json.loads(ln) for ln in MAIN.read_bytes().splitlines()]
    rw = next(i for i, d in enumerate(lines) if "$rewindTo" in d)
    o_of = {le.id: le.meta["gemini"]["o"] for le in s.log(all_branches=True)}
    rewind = next(le for le in s.log(all_branches=True) if le.meta["gemini"]["o"] == rw)
    # after the latest copy of the answer before the rewound prompt, not after the dropped turns
    before = max(i for i, d in enumerate(lines[:rw]) if d.get("id") == "9a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d")
    assert o_of[rewind.parents[0]] == before
    # main goes on from the rewind (HEAD); the dropped turns keep a branch named for the rewind
    assert set(s.branches()) == {"main", f"rewind-{before + 1}"} and s.current_branch == "main"
    assert o_of[s.branches()["main"]] == len(lines) - 1
    said = [le.entry.message.content[0].get("text") for le in s.entries("HEAD") if le.entry.message]
    assert "Now add a --port flag" not in said and "Now add a --host flag" in said
    assert "Now add a --port flag" in [le.entry.message.content[0].get("text")
                                       for le in s.entries(f"rewind-{before + 1}") if le.entry.message]
    assert s.info["name"] == "Explain main.py and add a --host flag"
    # a message written again: once with what it adds (its tool's result), then bookkeeping (tokens)
    kinds = [le.meta["gemini"]["type"] for le in s.entries("HEAD")]
    assert kinds[:7] == ["metadata", "user", "$set", "gemini", "gemini", "update", "$set"]
    call, result = (s.entries("HEAD")[i].entry.message for i in (3, 4))
    assert [b["type"] for b in call.content] == ["thinking", "tool_use"] and call.role == "assistant"
    assert [b["type"] for b in result.content] == ["tool_result"] and result.role == "tool"
    assert result.content[0]["content"] == "Directory listing for src:\nmain.py\nutil.py"


def test_a_subagent_names_the_call_that_ran_it_and_grep_finds_it(store: castore.Store) -> None:
    import_gemini(store, DATA)
    sub = store.session("gemini", "my-app", f"{SID}.{SUB}")
    link = sub.info["spawned_by"]
    assert link["session"] == SID
    spawner = store.session("gemini", "my-app", SID).show(link["commit"])
    assert spawner.entry.message.content[0]["name"] == "codebase_investigator"
    assert {m.session for m in grep(store, "binds its address")} >= {("gemini", "my-app", f"{SID}.{SUB}")}


def test_import_is_incremental_and_follows_a_live_file(store: castore.Store, tmp_path: Path) -> None:
    raw = MAIN.read_bytes()
    cuts = [0, 200, raw.index(b'{"$rewindTo"'), raw.index(b'{"$rewindTo"') + 30, len(raw) - 10, len(raw)]
    chats = tmp_path / "p" / "chats"
    chats.mkdir(parents=True)
    f = chats / MAIN.name
    for a in cuts[1:]:
        f.write_bytes(raw[:a])  # torn lines wait for the next import
        import_gemini(store, f)
    once = castore.open(str(tmp_path / "once"), durable=False)
    import_gemini(once, MAIN)
    assert _shape(store.session("gemini", "p", SID)) == _shape(once.session("gemini", "my-app", SID))
    # following: an agent appends line by line while the loop imports
    g = chats / "live.jsonl"
    g.write_bytes(b"")
    followed = castore.open(str(tmp_path / "followed"), durable=False)
    done = threading.Event()

    def agent() -> None:
        for ln in raw.splitlines(keepends=True):
            with g.open("ab") as out:
                out.write(ln)
        done.set()

    t = threading.Thread(target=agent)
    t.start()
    n = follow(lambda: import_gemini(followed, g), interval=0.01,
               stop=lambda: done.is_set() and followed.session("gemini", "p", SID).exists()
               and followed.session("gemini", "p", SID).info["gemini"]["offset"] == len(raw))
    t.join()
    assert n == raw.count(b"\n")
    assert _shape(followed.session("gemini", "p", SID)) == _shape(once.session("gemini", "my-app", SID))


@pytest.mark.parametrize("cut", [0, 30])  # empty, or the metadata line torn, when the import opens it
def test_a_file_growing_while_its_first_line_is_read_is_archived_once(
        store: castore.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int) -> None:
    import castore.adapters.gemini as gemini_mod
    from castore.adapters.jsonl_tree import parse_line

    raw = MAIN.read_bytes()
    chats = tmp_path / "p" / "chats"
    chats.mkdir(parents=True)
    g = chats / "live.jsonl"
    g.write_bytes(raw[:cut])
    seen: list[bytes] = []

    def agent_writes_then_parse(line: bytes) -> object:
        if not seen:  # the agent writes the rest right after the import read the first line
            seen.append(line)
            with g.open("ab") as out:
                out.write(raw[cut:])
        return parse_line(line)

    monkeypatch.setattr(gemini_mod, "parse_line", agent_writes_then_parse)
    n = sum(r.lines for r in import_gemini(store, g))
    monkeypatch.undo()
    n += sum(r.lines for r in import_gemini(store, g))
    assert seen == [raw[:cut]]  # the race happened: the first line was read torn
    assert n == raw.count(b"\n")
    assert [i.session for i in store.sessions("gemini")] == [SID]  # not also a session named "live"
    once = castore.open(str(tmp_path / "once"), durable=False)
    import_gemini(once, MAIN)
    assert _shape(store.session("gemini", "p", SID)) == _shape(once.session("gemini", "my-app", SID))


def test_entries_appended_with_castore_come_back_as_those_commits(store: castore.Store, tmp_path: Path) -> None:
    chats = tmp_path / "tmp" / "p" / "chats"
    chats.mkdir(parents=True)
    f = chats / MAIN.name
    f.write_bytes(MAIN.read_bytes()[:-1])  # and without its last newline
    import_gemini(store, f)
    s = store.session("gemini", "p", SID)
    ids = s.append_many([castore.Message("user", "castore asks: which port?"),
                         castore.Message("assistant", "8080, unless --port says otherwise.")], times=[1.8e9, 1.8e9 + 1])
    export_gemini(store, tmp_path / "out")
    got = (tmp_path / "out" / "p" / "chats" / MAIN.name).read_bytes()
    assert got.startswith(MAIN.read_bytes())
    recs = [json.loads(ln) for ln in got.splitlines()[-2:]]
    assert [(r["type"], r["castoreCommit"]) for r in recs] == [("user", ids[0]), ("gemini", ids[1])]
    # Gemini CLI resumes the exported file and goes on
    more = json.dumps({"id": "z1", "timestamp": "2027-01-01T00:00:00.000Z", "type": "user",
                       "content": [{"text": "thanks"}]}, separators=(",", ":")).encode() + b"\n"
    f.write_bytes(got + more)
    n = len(s.log(all_branches=True))
    r = import_gemini(store, f)[0]
    assert r.lines == 3 and len(s.log(all_branches=True)) == n + 1 and s.show("HEAD").parents == (ids[1],)
    export_gemini(store, tmp_path / "out2")
    assert (tmp_path / "out2" / "p" / "chats" / MAIN.name).read_bytes() == got + more


def test_the_older_whole_file_json_grows_or_becomes_a_new_version(store: castore.Store, tmp_path: Path) -> None:
    chats = tmp_path / "p" / "chats"
    chats.mkdir(parents=True)
    f = chats / LEGACY.name
    doc = json.loads(LEGACY.read_text())
    f.write_text(json.dumps(doc, indent=2))
    r = import_gemini(store, f)[0]
    assert (r.session[2], r.lines) == ("a1b2c3d4-0000-4000-8000-000000000001.json", 2)
    doc["messages"].append({"id": "e3", "timestamp": "2025-09-01T08:02:00.000Z", "type": "user", "content": "more"})
    f.write_text(json.dumps(doc, indent=2))  # Gemini CLI rewrote it whole, one message longer
    assert import_gemini(store, f)[0].lines == 1
    s = store.session(*r.session)
    assert [le.entry.message.content[0]["text"] for le in s.entries("HEAD")][-1] == "more"
    doc["messages"][0]["content"] = "changed"
    f.write_text(json.dumps(doc, indent=2))
    r3 = import_gemini(store, f)[0]
    assert r3.session[2].endswith(".json.v2") and r3.lines == 3 and r3.notes
    export_gemini(store, tmp_path / "out")
    assert (tmp_path / "out" / "p" / "chats" / LEGACY.name).read_bytes() == f.read_bytes()  # the newest version


def test_errors_and_the_wrong_agent(store: castore.Store, tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="no such file"):
        find_sessions(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArchiveError, match="no Gemini CLI session file"):
        import_gemini(store, tmp_path / "empty")
    claude = Path(__file__).resolve().parent / "data" / "claude-code" / "session-share"
    with pytest.raises(ArchiveError, match="looks like Claude Code sessions, not Gemini CLI"):
        import_gemini(store, claude)
    from castore.adapters.claude_code import import_claude

    with pytest.raises(ArchiveError, match="looks like Gemini CLI sessions, not Claude Code"):
        import_claude(store, CHATS)


def test_cli_import_log_and_export(tmp_path: Path) -> None:
    home = tmp_path / "gemini-tmp"
    shutil.copytree(DATA, home)

    def cli(*args: str):
        return CliRunner().invoke(main, ["--store", str(tmp_path / "store"), *args])

    r = cli("import", str(home))  # told by the content
    assert r.exit_code == 0 and "Gemini CLI sessions" in r.stderr and f"gemini/my-app/{SID}:" in r.stdout, r.output
    r = cli("-s", f"gemini/my-app/{SID}", "log", "-n", "0")
    assert r.exit_code == 0 and "→ codebase_investigator(Find where the server binds its address)" in r.stdout
    assert "$set" not in r.stdout and "lastUpdated" not in r.stdout  # bookkeeping left out
    r = cli("sessions", "gemini")
    assert "Explain main.py and add a --host flag" in r.stdout
    r = cli("export", "gemini", str(tmp_path / "out"))
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 3
    same_tree(DATA, tmp_path / "out")


def test_a_checkpoint_replaces_the_conversation_and_a_rewind_into_it_hangs_after_it(store: castore.Store,
                                                                                  tmp_path: Path) -> None:
    def rec(d: dict) -> bytes:
        return json.dumps(d, separators=(",", ":")).encode() + b"\n"

    def msg(i: str, type_: str, text: str) -> dict:
        return {"id": i, "timestamp": "2026-03-10T09:00:00.000Z", "type": type_, "content": [{"text": text}]}

    head = {"sessionId": "s1", "projectHash": "h", "startTime": "2026-03-10T09:00:00.000Z",
            "lastUpdated": "2026-03-10T09:00:00.000Z"}
    a, b, c = msg("a", "user", "one"), msg("b", "gemini", "two"), msg("c", "user", "three")
    lines = [head, a, b, c,
             {"$set": {"messages": [a, {**b, "content": [{"text": "two (masked)"}]}, c],
                       "lastUpdated": "2026-03-10T09:01:00.000Z"}},  # updateMessagesFromHistory
             {"$rewindTo": "c"}, msg("d", "user", "three again")]
    f = tmp_path / "p" / "chats" / "session-x.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"".join(map(rec, lines)))
    import_gemini(store, f)
    s = store.session("gemini", "p", "s1")
    every = {le.id: le for le in s.log(all_branches=True)}
    by_o = {le.meta["gemini"]["o"]: le for le in every.values() if "raw" in le.meta["gemini"]}
    # the messages before c are the checkpoint's: it hangs after a (which it keeps as it was),
    # its copy of b (masked) follows it, and the rewind to c hangs after that copy
    copy_b = every[by_o[5].parents[0]]
    assert copy_b.meta["gemini"] == {"o": 4, "f": "s1", "type": "gemini", "id": "b", "from": "$set"}
    assert copy_b.parents == (by_o[4].id,) and by_o[4].parents == (by_o[1].id,)
    assert s.current_branch == "main" and s.show("HEAD").meta["gemini"]["o"] == 6
    assert by_o[4].meta["gemini"]["type"] == "$set" and by_o[4].entry.message is None
    assert [m.content[0]["text"] for m in s.context()] == ["one", "two (masked)", "three again"]
    # the conversation before the checkpoint, and its copy of c the rewind dropped
    assert set(s.branches()) == {"main", "checkpoint-2", "rewind-4"}
    export_gemini(store, tmp_path / "out")
    assert (tmp_path / "out" / "p" / "chats" / "session-x.jsonl").read_bytes() == f.read_bytes()


def test_entries_appended_to_an_older_whole_file_json_are_named_by_export(tmp_path: Path) -> None:
    # export gemini writes a whole-file JSON back as it was imported; an entry castore appended
    # to that session was left out without a word, where the help says appended entries follow
    def cli(*args: str) -> Any:
        r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), *args])
        assert r.exit_code == 0, r.output
        return r

    cli("import", "gemini", str(DATA))
    key = "gemini/my-app/a1b2c3d4-0000-4000-8000-000000000001.json"
    cli("-s", key, "append", "--role", "user", "asked in castore")
    r = cli("export", "gemini", str(tmp_path / "out"))
    assert (tmp_path / "out" / "my-app" / "chats" / LEGACY.name).read_bytes() == LEGACY.read_bytes()
    assert f"{key}: 1 entry appended with castore is not written (an older whole-file JSON is written " \
           "back as imported)" in r.stderr.splitlines()
    r = cli("export", "gemini", str(tmp_path / "out2"), "-s", f"gemini/my-app/{SID}")
    assert "not written" not in r.stderr  # a JSONL session's appended entries are written
