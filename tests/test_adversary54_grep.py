"""castore grep's pattern as a grep user writes it, without -E: a POSIX class or GNU's word
edges (grep's basic syntax has them too) were read by Python as other characters, with no
error: ``\\<parser\\>`` found nothing (exit 1) and ``[[:alpha:]]`` printed Python's
FutureWarning with its source line on stderr. Refused as with -E now; a pattern Python only
warns about is searched as Python reads it, with no warning printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import castore

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "st"
    with castore.open(str(path)) as store:
        store.session("app", "u", "s").append_many([{"role": "user", "content": "the parser and the lexer"},
                                                   {"role": "assistant", "content": "a [bracket] and x"}])
    return path


def _grep(root: Path, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "CASTORE_GREP_INDEX": str(root.parent / "index"), "PYTHONWARNINGS": ""}
    r = subprocess.run([sys.executable, "-m", "castore", "--store", str(root), "grep", *args],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    return r.returncode, r.stdout, r.stderr


@pytest.mark.parametrize(("pattern", "said"), [("[[:alpha:]]+er", "[:alpha:] (a POSIX class)"),
                                               ("\\<parser\\>", "GNU's word edges")])
def test_what_python_would_misread_is_refused_without_e_too(root: Path, pattern: str, said: str) -> None:
    status, out, err = _grep(root, pattern)
    assert (status, out) == (2, "") and err.startswith("Error: ") and said in err and "Warning" not in err, err
    assert _grep(root, "-F", pattern)[0] == 1  # a plain string, found nowhere


def test_a_pattern_python_warns_about_prints_no_warning(root: Path) -> None:
    status, out, err = _grep(root, "[[]bracket")
    assert status == 0 and "[bracket]" in out and err == "", err
