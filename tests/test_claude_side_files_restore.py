"""A store whose gc deleted an imported Claude Code session's side files (any gc before
45085c4: nothing followed the info's ``files``) gets them back by importing the folder again:
the import compared each side file's id with the one the info names and, equal, took the file
as settled, so the blob stayed missing (fsck names it, gc refuses, export fails). Now a side
file whose blob is missing from the store counts as changed and is stored again."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import castore
from castore.adapters.jsonl_tree import blob_id, stored_bytes
from castore.cli.main import main
from castore.maintenance import fsck

SRC = Path(__file__).parent / "data" / "claude-code" / "claude-code-log" / "representative_messages.jsonl"
SIDE = b"a tool's output Claude Code kept beside the session\n"
REL = "proj/s1/tool-results/out.txt"


def _castore(store: str, *args: str) -> str:
    r = CliRunner().invoke(main, ["--store", store, *args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout


def test_importing_again_restores_a_side_file_a_gc_lost(tmp_path: Path) -> None:
    proj = tmp_path / "projects" / "proj"
    proj.mkdir(parents=True)
    (proj / "s1.jsonl").write_bytes(SRC.read_bytes())
    store = str(tmp_path / "store")
    _castore(store, "import", "claude", str(proj.parent))
    with castore.open(store) as st:  # the state an old gc left: the info names a blob the store lacks
        s = st.session("claude", "proj", "s1")
        oid = blob_id(stored_bytes(st, SIDE), st.objects.codec)
        info = s.info
        s.set_info({**info, "claude": {**info["claude"], "files": {REL: oid}}}, expect=info)
        assert not st.objects.contains(oid)
        assert oid in {m for m, _ in fsck(st).missing}
    (proj / "s1" / "tool-results").mkdir(parents=True)
    (proj / "s1" / "tool-results" / "out.txt").write_bytes(SIDE)
    _castore(store, "import", "claude", str(proj.parent))
    with castore.open(store) as st:
        assert st.objects.contains(oid)
        assert not fsck(st).missing
    _castore(store, "export", "claude", str(tmp_path / "out"))
    assert (tmp_path / "out" / "proj" / "s1" / "tool-results" / "out.txt").read_bytes() == SIDE
