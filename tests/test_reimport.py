"""A re-import with nothing new does nothing but check: a file that did not grow, whose
session's branches are as the last import left them, builds no tree writer and writes
nothing (Claude Code, Codex, Gemini CLI); a session whose branches moved since is handled as
any interrupted import is, its whole way."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import castore
from castore.adapters import tree_writer
from castore.adapters.claude_code import import_claude
from castore.adapters.codex import import_codex
from castore.adapters.gemini import import_gemini
from castore.adapters.jsonl_tree import tips_digest

DATA = Path(__file__).resolve().parent / "data"
SHARE = DATA / "claude-code" / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    return castore.open(str(tmp_path / "store"), durable=False)


def _refs(store: castore.Store) -> dict[str, object]:
    """Every ref of the store and its value (what an import that writes nothing leaves as it was)."""
    names = store.refs.list("")
    return {n: store.refs.read(n) for n in names}


@pytest.mark.parametrize("vendor", ["claude", "codex", "gemini"])
def test_nothing_new_builds_no_tree_and_writes_nothing(store: castore.Store, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch, vendor: str) -> None:
    src = tmp_path / "src"
    run = {"claude": import_claude, "codex": import_codex, "gemini": import_gemini}[vendor]
    shutil.copytree({"claude": SHARE, "codex": DATA / "codex", "gemini": DATA / "gemini" / "tmp"}[vendor],
                    src / "p" if vendor == "claude" else src)
    first = run(store, src)
    assert sum(r.lines for r in first) > 0
    before = _refs(store)
    built: list[str] = []
    real = tree_writer.TreeWriter.__init__

    def spy(self: tree_writer.TreeWriter, session: castore.Session, *a: object, **k: object) -> None:
        built.append("/".join(session.key))
        real(self, session, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(tree_writer.TreeWriter, "__init__", spy)
    again = run(store, src)
    assert built == []
    assert _refs(store) == before
    assert [(r.lines, r.total, r.offset, r.head, r.torn) for r in again] == \
        [(0, r.total, r.offset, r.head, 0) for r in first]


def test_branches_moved_since_the_import_are_laid_out_again(store: castore.Store) -> None:
    """A user's branch (and its checkout) between two imports: the tips differ from the digest
    the import recorded, so the next one goes its whole way (as after an interrupted import)
    and records the tips it leaves, with HEAD back on main where the agent's lines go."""
    import_claude(store, SHARE / f"{SID}.jsonl")
    s = store.session("claude", "session-share", SID)
    laid = s.branches()
    s.branch("mine", at=s.entries("main")[20].id)
    s.checkout("mine")
    assert s.info["claude"]["tips"] != tips_digest(s.branches())
    r = import_claude(store, SHARE / f"{SID}.jsonl")[0]
    assert r.lines == 0
    assert s.current_branch == "main" and "mine" in s.branches()
    # the layout follows the agent's last line, not the user's checkout: from a commit before the
    # rewind the newest leaf is the rewind's, and main moved there (rewind-81 renamed rewind-33)
    assert {k: v for k, v in s.branches().items() if k != "mine"} == laid
    assert s.info["claude"]["tips"] == tips_digest(s.branches())
