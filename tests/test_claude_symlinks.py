"""Claude Code's folders linked by a dotfiles manager (``~/.claude/projects``, a project, a
session's subagents folder as symbolic links): ``castore import [claude] ~/.claude`` follows
them, as Claude Code reads them, each real folder once (a link that loops, two links to one
folder), and imports what the same files in plain folders give (tests/data's files)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.adapters.claude_code import find_sessions
from castore.cli.main import main

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links on this platform")

DATA = Path(__file__).resolve().parent / "data" / "claude-code" / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


def _linked(tmp: Path) -> Path:
    """``tmp/home/.claude``, its projects folder a link to a dotfiles folder in which project
    ``proj-a`` is real, ``proj-b`` a second link to it, and the session's subagents folder a
    link to a folder that holds a link to itself."""
    dot = tmp / "dotfiles"
    shutil.copytree(DATA / SID / "subagents", dot / "agents")
    (dot / "agents" / "loop").symlink_to(dot / "agents", target_is_directory=True)
    proj = dot / "projects" / "proj-a"
    (proj / SID).mkdir(parents=True)
    shutil.copy(DATA / f"{SID}.jsonl", proj)
    (proj / SID / "subagents").symlink_to(dot / "agents", target_is_directory=True)
    (dot / "projects" / "proj-b").symlink_to(proj, target_is_directory=True)
    home = tmp / "home" / ".claude"
    home.mkdir(parents=True)
    (home / "projects").symlink_to(dot / "projects", target_is_directory=True)
    return home


def _plain(tmp: Path) -> Path:
    """The same files in plain folders: ``tmp/plain/.claude/projects/proj-a``."""
    home = tmp / "plain" / ".claude"
    shutil.copytree(DATA, home / "projects" / "proj-a", ignore=shutil.ignore_patterns("LICENSE"))
    return home


def _found(home: Path) -> list[tuple[str, str, str | None, list[str]]]:
    return [(s.rel, s.session_id, s.parent_id, sorted(s.side_files)) for s in find_sessions(home)]


def test_linked_folders_are_followed_each_real_folder_once(tmp_path: Path) -> None:
    got, want = _found(_linked(tmp_path)), _found(_plain(tmp_path))
    assert got == want and len(want) == 6  # the session and its five subagents, none twice
    # a project folder given by its link, and one given through a linked projects folder
    assert _found(tmp_path / "dotfiles" / "projects" / "proj-b") == [
        (rel.replace("proj-a", "proj-b", 1), sid, parent, side) for rel, sid, parent, side in want]


@pytest.mark.parametrize("named", [True, False], ids=["import-claude", "import-detected"])
def test_import_of_a_linked_claude_folder_imports_what_plain_folders_give(tmp_path: Path, named: bool) -> None:
    runs = {}
    for kind, home in (("linked", _linked(tmp_path)), ("plain", _plain(tmp_path))):
        store = tmp_path / f"store-{kind}"
        r = CliRunner().invoke(main, ["--store", str(store), "import", *(["claude"] if named else []), str(home)])
        assert r.exit_code == 0, r.output
        with castore.open(str(store)) as st:
            runs[kind] = sorted((i.user, i.session, len(st.session("claude", i.user, i.session).log()))
                                for i in st.sessions("claude"))
    assert runs["linked"] == runs["plain"] and len(runs["plain"]) == 6
