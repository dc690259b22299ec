"""A Claude file every line of which is a sidechain (a subagent transcript at a project's top
level, agent-<id>.jsonl) imports as a session with no commit of its own plus its
`.sidechains.agent-<id>` session. `export claude` of the archive refused it ("6 archived lines
but no commit on HEAD's path") and wrote no file at all, while fsck said ok: the lines its
sidechain sessions hold are not missing, and the file exports byte for byte now."""
import shutil
from pathlib import Path

from click.testing import CliRunner

from castore.cli.main import main

DATA = Path(__file__).parent / "data" / "claude-code"


def test_a_file_of_sidechain_lines_only_exports_byte_for_byte(tmp_path: Path) -> None:
    src = DATA / "session-share" / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68" / "subagents" / "agent-aa5ef13.jsonl"
    other = DATA / "claude-code-log" / "dag_compact_after_rewind.jsonl"
    (tmp_path / "p" / "proj").mkdir(parents=True)
    shutil.copy(src, tmp_path / "p" / "proj")
    shutil.copy(other, tmp_path / "p" / "proj")
    st = str(tmp_path / "st")
    r = CliRunner().invoke(main, ["--store", st, "import", "claude", str(tmp_path / "p")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["--store", st, "export", "claude", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    for f in (src, other):
        assert (tmp_path / "out" / "proj" / f.name).read_bytes() == f.read_bytes()
    r = CliRunner().invoke(main, ["--store", st, "fsck"])
    assert r.exit_code == 0, r.output
