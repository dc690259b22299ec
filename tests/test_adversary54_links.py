"""Claude Code's import follows linked folders (316255f), but never a link to a folder that
holds the link: a session's folder, or a folder in it, linked to ``/``, the home folder or a
folder above took in every file below that folder, the user's files read whole into the
store as the session's side files and every ``.jsonl`` imported as a subagent (through ``/``,
every file of the machine: the import never ended)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.adapters.claude_code import find_sessions
from castore.adapters.jsonl_tree import files_under
from castore.cli.main import main

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symbolic links on this platform")

DATA = Path(__file__).resolve().parent / "data" / "claude-code" / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


def _home(tmp: Path) -> Path:
    """``tmp/home`` with a private file and a stray ``.jsonl`` beside ``.claude/projects/proj``,
    which holds tests/data's session and its subagents."""
    home = tmp / "home"
    shutil.copytree(DATA, home / ".claude" / "projects" / "proj", ignore=shutil.ignore_patterns("LICENSE"))
    (home / "private").mkdir()
    (home / "private" / "id_ed25519").write_text("a private key\n")
    (home / "private" / "notes.jsonl").write_text('{"type": "user", "message": {"content": "mine"}}\n')
    return home


def _found(home: Path) -> list[tuple[str, str, str | None, list[str]]]:
    return [(s.rel, s.session_id, s.parent_id, sorted(s.side_files)) for s in find_sessions(home / ".claude")]


@pytest.mark.parametrize("where", ["subagents", "session"])
def test_a_link_to_a_folder_above_is_not_followed(tmp_path: Path, where: str) -> None:
    home = _home(tmp_path)
    want = _found(home)
    proj = home / ".claude" / "projects" / "proj"
    if where == "subagents":  # a folder in the session's folder linked to the home folder
        (proj / SID / "home").symlink_to(home, target_is_directory=True)
    else:  # a second session whose folder is a link to the projects folder
        shutil.copy(proj / f"{SID}.jsonl", proj / "other.jsonl")
        (proj / "other").symlink_to(proj.parent, target_is_directory=True)
        want = sorted([*want, ("proj/other.jsonl", "other", None, [])])
    got = _found(home)
    assert sorted(got) == sorted(want)
    assert not any("private" in s or "private" in rel for rel, _sid, _p, side in got for s in [*side, rel])


def test_a_link_to_the_root_folder_is_not_followed(tmp_path: Path) -> None:
    home = _home(tmp_path)
    want = _found(home)
    proj = home / ".claude" / "projects" / "proj"
    (proj / SID / "subagents" / "everything").symlink_to("/", target_is_directory=True)
    (proj / "root").symlink_to("/", target_is_directory=True)  # a project folder linked to /
    assert _found(home) == want
    assert list(files_under(str(proj / SID), links=True)) == list(files_under(str(proj / SID)))
    r = CliRunner().invoke(main, ["--store", str(tmp_path / "store"), "import", str(home / ".claude")])
    assert r.exit_code == 0, r.output
    with castore.open(str(tmp_path / "store")) as st:
        assert len(list(st.sessions("claude"))) == 6  # the session and its five subagents
