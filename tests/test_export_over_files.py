"""``castore export claude|codex|gemini|pi DIR`` into a folder that already holds the agent's
files (``~/.claude/projects``, to restore what Claude Code deleted): a file there that holds
lines the archive lacks (the agent wrote on after the last import) is left as it is, and the
export says so in one error line (exit 1) after writing the others; a file the archive holds
all of is written (completed, if it was cut short). The real files of tests/data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from castore.cli.main import main

DATA = Path(__file__).resolve().parent / "data"
PI = [{"type": "session", "version": 3, "id": "sess-1", "timestamp": "2026-03-10T09:14:00.000Z", "cwd": "/w"},
      {"type": "message", "id": "e01", "parentId": None, "timestamp": "2026-03-10T09:14:01.000Z",
       "message": {"role": "user", "content": [{"type": "text", "text": "look"}], "timestamp": 1773134071402}}]


def _cli(tmp_path: Path, *args: str):
    return CliRunner().invoke(main, ["--store", str(tmp_path / "store"), *args])


def _sources(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "src"
    shutil.copytree(DATA / "claude-code" / "session-share", src / "claude" / "proj")
    (src / "codex").mkdir(parents=True)
    shutil.copyfile(DATA / "codex" / "sample_codex_session.jsonl", src / "codex" / "rollout.jsonl")
    shutil.copytree(DATA / "gemini" / "tmp", src / "gemini")
    (src / "pi").mkdir()
    (src / "pi" / "s.jsonl").write_text("".join(json.dumps(e) + "\n" for e in PI))
    return {"claude": src / "claude", "codex": src / "codex", "gemini": src / "gemini", "pi": src / "pi"}


@pytest.mark.parametrize("vendor", ["claude", "codex", "gemini", "pi"])
def test_an_export_never_overwrites_a_file_holding_lines_the_archive_lacks(tmp_path: Path, vendor: str) -> None:
    src = _sources(tmp_path)[vendor]
    assert _cli(tmp_path, "import", vendor, str(src)).exit_code == 0
    out = tmp_path / "out"
    r = _cli(tmp_path, "export", vendor, str(out))
    assert r.exit_code == 0, r.output
    files = sorted(p for p in out.rglob("*.jsonl"))
    ahead, short = files[0], files[-1]
    archived = {p: p.read_bytes() for p in files}
    newer = b'{"type": "user", "note": "written after the last import"}\n'
    ahead.write_bytes(archived[ahead] + newer)
    if short != ahead:
        short.write_bytes(archived[short][: len(archived[short]) // 2])
    r = _cli(tmp_path, "export", vendor, str(out))
    assert r.exit_code == 1 and "Traceback" not in r.stderr, r.output
    assert r.stderr.splitlines()[-1].startswith(f"Error: {out}: 1 file holds what the archive's copy lacks")
    assert str(ahead.relative_to(out)) in r.stderr.splitlines()[-1]
    assert ahead.read_bytes() == archived[ahead] + newer  # kept as it was
    if short != ahead:  # (one file for Codex and Pi)
        assert short.read_bytes() == archived[short]  # the archive holds all of it: completed
        assert str(short.relative_to(out)) in r.stdout.splitlines()  # and listed as written
    assert str(ahead.relative_to(out)) not in r.stdout.splitlines()  # the files written are listed
    assert not [p for p in out.rglob("*") if p.name.endswith(".castore-new")]


@pytest.mark.parametrize("vendor", ["claude", "pi"])
def test_an_export_never_writes_through_a_link_left_at_its_side_name(tmp_path: Path, vendor: str) -> None:
    """A file is written beside its place first, under a side name of its own
    (NAME.<random>.castore-new, created exclusively): a symbolic link planted at a side name
    (here the one name older versions used) is never written through to a file outside DEST."""
    src = _sources(tmp_path)[vendor]
    assert _cli(tmp_path, "import", vendor, str(src)).exit_code == 0
    out = tmp_path / "out"
    assert _cli(tmp_path, "export", vendor, str(out)).exit_code == 0
    f = sorted(out.rglob("*.jsonl"))[0]
    archived = f.read_bytes()
    f.unlink()
    outside = tmp_path / "outside"
    outside.write_bytes(b"not the export's to write\n")
    Path(f"{f}.castore-new").symlink_to(outside)
    r = _cli(tmp_path, "export", vendor, str(out))
    assert r.exit_code == 0, r.output
    assert outside.read_bytes() == b"not the export's to write\n"
    assert not f.is_symlink() and f.read_bytes() == archived
    assert [p.name for p in f.parent.glob("*.castore-new")] == [f"{f.name}.castore-new"]  # not the export's


def test_an_export_keeps_what_is_not_a_file_at_a_files_place(tmp_path: Path) -> None:
    """A folder or a named pipe where the export would put a file is left as it is and named
    with the files kept, the others written: a folder stopped the export at it ('Is a
    directory', the files after it not written) and a pipe made it wait for a writer forever."""
    import os

    src = _sources(tmp_path)["claude"]
    assert _cli(tmp_path, "import", "claude", str(src)).exit_code == 0
    out = tmp_path / "out"
    assert _cli(tmp_path, "export", "claude", str(out)).exit_code == 0
    files = sorted(out.rglob("*.jsonl"))
    archived = {p: p.read_bytes() for p in files}
    folder, pipe = files[0], files[-1]
    folder.unlink()
    folder.mkdir()
    pipe.unlink()
    os.mkfifo(pipe)
    for p in files[1:-1]:
        p.unlink()
    r = _cli(tmp_path, "export", "claude", str(out))
    assert r.exit_code == 1, r.output
    last = r.stderr.splitlines()[-1]
    assert last.startswith(f"Error: {out}: 2 files hold what the archive's copy lacks"), last
    assert str(folder.relative_to(out)) in last and str(pipe.relative_to(out)) in last
    assert folder.is_dir() and pipe.is_fifo()
    assert all(p.read_bytes() == archived[p] for p in files[1:-1])
    assert not list(out.rglob("*.castore-new"))
