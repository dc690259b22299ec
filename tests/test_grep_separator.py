"""A message holding U+001E, the character the search index puts after each block: before index
version 13 it was replaced by a space in the index's text, so a search through the index found
'alpha beta' in 'alpha\\x1ebeta' (printing a space there) and never the character itself, while
--no-index got both right (adversary54). Now both searches give the same answers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import castore
from castore.entries import Message

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("pattern", "found"), [("alpha beta", False), ("\x1e", True), ("alpha.beta", True),
                                                  ("alpha\x1ebeta", True), ("beta", True), ("-F\x1e", True)])
def test_the_index_separator_in_a_message(tmp_path: Path, pattern: str, found: bool) -> None:
    with castore.open(str(tmp_path / "st")) as st:
        s = st.session("app", "u", "s")
        s.append(Message(role="user", content="alpha\x1ebeta"))
        s.append(Message(role="assistant", content="gamma"))
    env = {**os.environ, "CASTORE_GREP_INDEX": str(tmp_path / "index")}
    args = ["-F", pattern[2:]] if pattern.startswith("-F") else [pattern]

    def grep(*a: str) -> tuple[int, str]:
        r = subprocess.run([sys.executable, "-m", "castore", "--store", str(tmp_path / "st"), "grep", *a],
                           capture_output=True, text=True, cwd=ROOT, env=env)
        return r.returncode, r.stdout

    want = (0, "app/u/s:1\n") if found else (1, "")
    assert grep("-c", "--no-index", *args) == want
    assert grep("-c", *args) == want
    assert grep(*args) == grep("--no-index", *args)
