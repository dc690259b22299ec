"""A file imported while its last line had no newline yet, whose newline arrives afterwards (a
`--follow` round that read a line written in two parts, or a file finished later) with nothing
after it: the re-import said "0 new line(s)" and never recorded the newline, so `export` came out
one byte short. The newline is recorded now (the state's flag, the position past it) and the
export is byte for byte; lines that follow later are read after it, not doubled."""
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from castore.cli.main import main

DATA = Path(__file__).parent / "data"
FILES = [  # (vendor, file, its folder under the folder imported)
    ("claude", DATA / "claude-code" / "claude-code-log" / "dag_compact_after_rewind.jsonl", "proj"),
    ("codex", DATA / "codex" / "sample_codex_session.jsonl", "proj"),
    ("gemini", DATA / "gemini" / "tmp" / "my-app" / "chats" / "session-2026-03-10T09-00-7f3c2a9e.jsonl",
     "my-app/chats"),
]


@pytest.mark.parametrize("vendor, src, sub", FILES)
def test_a_final_newline_that_arrives_after_the_import_is_exported(tmp_path: Path, vendor: str, src: Path,
                                                                   sub: str) -> None:
    whole = src.read_bytes()
    assert whole.endswith(b"\n")
    folder = tmp_path / "in" / sub
    folder.mkdir(parents=True)
    f = folder / src.name
    st = str(tmp_path / "st")
    run = CliRunner().invoke

    def import_then_export(data: bytes, out: str) -> bytes:
        f.write_bytes(data)
        res = run(main, ["--store", st, "import", vendor, str(tmp_path / "in")])
        assert res.exit_code == 0, res.output
        res = run(main, ["--store", st, "export", vendor, str(tmp_path / out)])
        assert res.exit_code == 0, res.output
        (got,) = list((tmp_path / out).rglob("*.jsonl"))
        return got.read_bytes()

    assert import_then_export(whole[:-1], "o1") == whole[:-1]  # the last line complete, its newline not yet
    assert import_then_export(whole, "o2") == whole  # the newline arrives, nothing after it
    assert import_then_export(whole, "o3") == whole  # nothing new: unchanged
    more = whole + whole.splitlines(keepends=True)[-1]  # a line follows (a copy of the last)
    assert import_then_export(more[:-1], "o4") == more[:-1]  # again without its newline
    assert import_then_export(more, "o5") == more
    res = run(main, ["--store", st, "fsck"])
    assert res.exit_code == 0, res.output
    assert json.loads(whole.splitlines()[-1])  # (the data's last line is JSON: it is imported before its newline)


@pytest.mark.parametrize("vendor, src, sub", FILES)
def test_a_crlf_that_arrives_after_the_import_ends_the_line_before(tmp_path: Path, vendor: str, src: Path,
                                                                   sub: str) -> None:
    """A file of CRLF lines whose last line was imported before its ``\\r\\n``: the ``\\r\\n``
    that arrives later (alone, or with lines after it) is that line's ending, and the export
    wrote a newline before it (``}\\n\\r\\n``). So is a ``\\n`` that arrives after a ``\\r``
    imported with the line (a read that stopped between the two): no line of its own."""
    whole = src.read_bytes().replace(b"\n", b"\r\n")
    more = whole + whole.splitlines(keepends=True)[-1]
    folder = tmp_path / "in" / sub
    folder.mkdir(parents=True)
    f = folder / src.name
    run = CliRunner().invoke
    # (whole[:-1]: the read stopped between the \r and the \n, whose \n then starts the next read)
    for k, steps in enumerate(([whole[:-2], whole, more], [whole[:-2], more], [whole[:-1], whole, more],
                               [whole[:-1], more])):
        st = str(tmp_path / f"st{k}")
        for i, data in enumerate(steps):
            f.write_bytes(data)
            res = run(main, ["--store", st, "import", vendor, str(tmp_path / "in")])
            assert res.exit_code == 0, res.output
            out = tmp_path / f"out{k}-{i}"
            res = run(main, ["--store", st, "export", vendor, str(out)])
            assert res.exit_code == 0, res.output
            (got,) = list(out.rglob("*.jsonl"))
            assert got.read_bytes() == data, (steps.index(data), vendor)
