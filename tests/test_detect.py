"""Which agent wrote a session file or folder, by content: ``castore import PATH`` picks the
importer, and an importer refuses another agent's sessions with one line (the real files)."""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.adapters.claude_code import import_claude
from castore.adapters.codex import import_codex
from castore.adapters.detect import VENDORS, detect, file_kind
from castore.adapters.jsonl_tree import ArchiveError
from castore.cli.main import main

DATA = Path(__file__).resolve().parent / "data"
CLAUDE = DATA / "claude-code" / "session-share"
CODEX = DATA / "codex" / "sample_codex_session.jsonl"


@pytest.fixture
def pi_file(tmp_path: Path) -> Path:
    out = tmp_path / "pi" / "--work--" / "2026-01-05_session.jsonl"  # a name that says nothing
    out.parent.mkdir(parents=True)
    out.write_bytes(lzma.decompress((DATA / "pi" / "before-compaction.jsonl.xz").read_bytes()))
    return out


def test_each_agent_is_told_by_content_not_name(tmp_path: Path, pi_file: Path) -> None:
    claude = tmp_path / "renamed" / "x.jsonl"
    claude.parent.mkdir()
    shutil.copyfile(CLAUDE / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl", claude)
    codex = tmp_path / "c" / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl"  # a Claude-like name
    codex.parent.mkdir()
    shutil.copyfile(CODEX, codex)
    assert detect(claude) == "claude" and detect(CLAUDE) == "claude" and detect(DATA / "claude-code") == "claude"
    assert detect(codex) == "codex" and detect(codex.parent) == "codex"
    assert detect(pi_file) == "pi" and detect(tmp_path / "pi") == "pi"
    (tmp_path / "junk.jsonl").write_bytes(b'{"a": 1}\nnot json\n')
    assert detect(tmp_path / "junk.jsonl") is None
    with pytest.raises(ArchiveError, match="no such file"):
        detect(tmp_path / "nothing")


def test_an_importer_refuses_another_agents_sessions_in_one_line(tmp_path: Path, pi_file: Path) -> None:
    store = castore.open(str(tmp_path / "store"), durable=False)
    with pytest.raises(ArchiveError, match=r"looks like Pi sessions, not Claude Code: import it with "
                                           r"`castore import pi PATH`"):
        import_claude(store, pi_file)
    with pytest.raises(ArchiveError, match="looks like Claude Code sessions, not Codex CLI"):
        import_codex(store, CLAUDE)
    with pytest.raises(ArchiveError, match="looks like Codex CLI sessions, not Claude Code"):
        import_claude(store, CODEX)
    assert not store.exists or store.apps() == []  # nothing written


def _cli(tmp_path: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(tmp_path / "store"), *args])


def test_import_path_alone_runs_the_importer_of_its_agent(tmp_path: Path, pi_file: Path) -> None:
    r = _cli(tmp_path, "import", str(CLAUDE))
    assert r.exit_code == 0, r.output
    assert "Claude Code sessions" in r.stderr and "claude/session-share/0ccf1a04" in r.stdout
    r = _cli(tmp_path, "import", str(CODEX), "--json")
    assert r.exit_code == 0 and '"session": "codex/local/019b64e5' in r.stdout
    r = _cli(tmp_path, "import", str(pi_file))
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("pi/local/")
    # the wrong agent named: one line, exit 1, nothing imported
    r = _cli(tmp_path, "import", "claude", str(pi_file))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "looks like Pi sessions" in r.stderr
    r = _cli(tmp_path, "import", "codex", str(CLAUDE))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "looks like Claude Code sessions" in r.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.jsonl").write_text('{"hello": 1}\n')
    r = _cli(tmp_path, "import", str(tmp_path / "junk"))
    assert r.exit_code == 2 and "no session file of a known agent" in r.stderr
    assert "name the agent: `castore import claude|codex|pi|gemini PATH`" in r.stderr  # was "VENDOR"
    # a path that is not there is named as such (not as an unknown command)
    r = _cli(tmp_path, "import", str(tmp_path / "no-such-folder"))
    assert r.exit_code == 2 and f"Error: {tmp_path / 'no-such-folder'}: no such file or folder" in r.stderr


def test_import_pi_refuses_a_claude_file(tmp_path: Path) -> None:
    from castore.adapters.pi import import_session

    store = castore.open(str(tmp_path / "store"), durable=False)
    with pytest.raises(ArchiveError, match="looks like Claude Code sessions, not Pi"):
        import_session(store, CLAUDE / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl")


def test_gemini_cli_files_are_told_by_content(tmp_path: Path) -> None:
    gem = DATA / "gemini" / "tmp" / "my-app" / "chats"
    assert detect(DATA / "gemini" / "tmp") == "gemini" and detect(gem) == "gemini"
    assert detect(gem / "session-2025-09-01T08-00-a1b2c3d4.json") == "gemini"  # the older whole-file JSON
    renamed = tmp_path / "rollout-2026-01-01.jsonl"  # a Codex-like name
    shutil.copyfile(gem / "session-2026-03-10T09-00-7f3c2a9e.jsonl", renamed)
    assert detect(renamed) == "gemini"
    store = castore.open(str(tmp_path / "store"), durable=False)
    with pytest.raises(ArchiveError, match="looks like Gemini CLI sessions, not Codex CLI"):
        import_codex(store, renamed)


def test_a_folder_of_several_agents_is_refused_naming_a_file_of_each(tmp_path: Path, pi_file: Path) -> None:
    # the real files side by side, as in a folder of downloads: `import PATH` took the folder
    # for Claude Code (most of its files) and imported the Codex and Pi files as Claude sessions
    mixed = tmp_path / "mixed"
    shutil.copytree(CLAUDE, mixed / "claude")
    (mixed / "codex").mkdir()
    shutil.copyfile(CODEX, mixed / "codex" / CODEX.name)
    shutil.copytree(pi_file.parent, mixed / "pi")
    want = (r"holds the sessions of several agents: Claude Code \(claude/.+\.jsonl\), Codex CLI "
            r"\(codex/sample_codex_session\.jsonl\), Pi \(pi/2026-01-05_session\.jsonl\); import each agent's "
            r"folder with `castore import claude\|codex\|pi\|gemini PATH`")
    with pytest.raises(ArchiveError, match=want):
        detect(mixed)
    store = castore.open(str(tmp_path / "store"), durable=False)
    with pytest.raises(ArchiveError, match=want):
        import_claude(store, mixed)
    for args in (["import", str(mixed)], ["import", "claude", str(mixed)], ["import", "codex", str(mixed)]):
        r = _cli(tmp_path, *args)
        assert r.exit_code == 1 and r.stdout == "" and r.stderr.count("\n") == 1, (args, r.output)
        assert r.stderr.startswith(f"Error: {mixed}: holds the sessions of several agents")
    assert not store.exists or store.apps() == []  # nothing written
    assert detect(mixed / "claude") == "claude"  # each agent's own folder is taken as before


def test_an_agents_own_folder_is_imported_as_its_sessions_folder(tmp_path: Path) -> None:
    # `castore import ~/.claude` was told Claude Code's, then refused: "no Claude Code session file"
    home = tmp_path / "home"
    shutil.copytree(CLAUDE, home / ".claude" / "projects" / "-home-me-proj")
    (home / ".claude" / "todos").mkdir()
    shutil.copytree(DATA / "gemini" / "tmp", home / ".gemini" / "tmp")
    for vendor, top, sessions in (("claude", ".claude", ".claude/projects"), ("gemini", ".gemini", ".gemini/tmp")):
        for store, args in (("a", ["import", str(home / top)]), ("b", ["import", vendor, str(home / top)])):
            r = _cli(tmp_path / vendor / store, *args)
            assert r.exit_code == 0 and r.stdout.startswith(f"{vendor}/"), (args, r.output)
        r = _cli(tmp_path / vendor / "b", "import", vendor, str(home / sessions), "--json")
        assert r.exit_code == 0 and '"lines": 0' in r.stdout and '"lines": 1' not in r.stdout, r.output


@pytest.mark.parametrize("vendor", ["claude", "codex", "gemini", "pi"])
def test_each_importer_refuses_json_lines_of_no_known_agent_in_one_line(tmp_path: Path, vendor: str) -> None:
    # `import claude` of any JSON lines imported them as empty `(event)` entries
    junk = tmp_path / "notes.jsonl"
    junk.write_text('{"a": 1}\n{"type": "message", "text": "hi"}\n[1, 2]\n')
    r = _cli(tmp_path, "import", vendor, str(junk))
    assert r.exit_code == 1 and r.stdout == "" and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith(f"Error: {junk}: looks like no {VENDORS[vendor]} session file: its first lines are "
                               "JSON of no known agent's sessions")
    r = _cli(tmp_path, "import", str(junk))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "looks like no known agent's sessions" in r.stderr
    assert not (tmp_path / "store").exists() or castore.open(str(tmp_path / "store")).apps() == []


def test_a_file_with_nothing_to_tell_by_is_left_to_the_importer(tmp_path: Path) -> None:
    # an empty file, a first line still being written, and Claude Code's title lines alone
    # are no other agent's: they are imported (as nothing, or as what they are)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "torn.jsonl").write_bytes(b'{"type": "user", "uuid": "a1", "mess')
    titled = tmp_path / "titled.jsonl"
    titled.write_text('{"type":"custom-title","customTitle":"refactor","sessionId":"s1"}\n'
                      '{"type":"last-prompt","lastPrompt":"go on","sessionId":"s1"}\n')
    assert file_kind(str(tmp_path / "empty.jsonl")) is None and file_kind(str(tmp_path / "torn.jsonl")) is None
    assert detect(titled) == "claude"
    for name in ("empty.jsonl", "titled.jsonl"):
        r = _cli(tmp_path, "import", "claude", str(tmp_path / name))
        assert r.exit_code == 0, r.output
    # the real files of every agent are still taken as their own
    edge = DATA / "claude-code" / "claude-code-log" / "edge_cases.jsonl"  # lines of no agent among Claude's
    assert file_kind(str(edge)) == "claude" and file_kind(str(CODEX)) == "codex"


def test_claude_codes_own_folder_with_its_history_file_imports_the_projects(tmp_path: Path) -> None:
    # a real ~/.claude holds history.jsonl (the typed prompts) beside projects/: `import claude
    # ~/.claude` took the folder for a project folder and imported that file as the one session
    home = tmp_path / "home" / ".claude"
    shutil.copytree(CLAUDE, home / "projects" / "-home-me-proj")
    (home / "history.jsonl").write_text('{"display":"fix the tests","pastedContents":{},"timestamp":1769116800000,'
                                        '"project":"/home/me/proj"}\n')
    (home / "settings.json").write_text('{"model": "opus"}\n')
    for store, args in (("a", ["import", "claude", str(home)]), ("b", ["import", str(home)])):
        r = _cli(tmp_path / store, *args, "--json")
        assert r.exit_code == 0, r.output
        got = sorted(d["session"] for d in json.loads(r.stdout))
        assert got and all(s.startswith("claude/-home-me-proj/0ccf1a04") for s in got), got
        assert len(got) == 1 + len(list((CLAUDE / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68" / "subagents").iterdir()))


def test_codex_and_pi_own_folders_import_their_sessions_only(tmp_path: Path, pi_file: Path) -> None:
    # ~/.codex holds history.jsonl (the prompts typed) beside sessions/: `import ~/.codex`
    # imported it as a thread `codex/local/history`
    codex = tmp_path / "home" / ".codex"
    (codex / "sessions" / "2025" / "12" / "28").mkdir(parents=True)
    shutil.copyfile(CODEX, codex / "sessions" / "2025" / "12" / "28" / CODEX.name)
    (codex / "archived_sessions").mkdir()
    (codex / "history.jsonl").write_text('{"session_id":"019b64e5-57fa-7463-b644-fba7e456f905","ts":1766924504,'
                                         '"text":"can you analyse the MD files"}\n')
    pi = tmp_path / "home" / ".pi"
    shutil.copytree(pi_file.parent, pi / "agent" / "sessions" / pi_file.parent.name)
    (pi / "agent" / "settings.json").write_text('{"defaultProvider": "anthropic"}\n')
    for args, want in ((["import", str(codex)], ["codex/local/019b64e5-57fa-7463-b644-fba7e456f905"]),
                       (["import", "codex", str(codex)], ["codex/local/019b64e5-57fa-7463-b644-fba7e456f905"]),
                       (["import", str(pi)], ["pi/local/ffae836b-9420-4060-ac13-7745215f90ff"]),
                       (["import", "pi", str(pi / "agent")], ["pi/local/ffae836b-9420-4060-ac13-7745215f90ff"])):
        r = _cli(tmp_path / args[-1].replace("/", "_"), *args, "--json")
        assert r.exit_code == 0, r.output
        assert [d["session"] for d in json.loads(r.stdout)] == want, args


def test_an_agents_own_folder_is_told_by_its_sessions_before_its_other_files(tmp_path: Path) -> None:
    # ~/.claude/local holds Claude Code's npm install: package.json files that sort before
    # projects/ filled the sample, and `castore import ~/.claude` found "no session file"
    home = tmp_path / ".claude"
    shutil.copytree(CLAUDE, home / "projects" / "-home-me-proj")
    for i in range(40):
        pkg = home / "local" / "node_modules" / f"pkg{i:02d}"
        pkg.mkdir(parents=True)
        (pkg / "package.json").write_text(json.dumps({"name": f"pkg{i}", "version": "1.0.0"}) + "\n")
    assert detect(home) == "claude"
    r = _cli(tmp_path, "import", str(home), "--json")
    assert r.exit_code == 0 and len(json.loads(r.stdout)) == 6, r.output
