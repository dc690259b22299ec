"""Two ``castore export`` runs into one folder at once, as two real processes (a cron job and a
hand-run export): each file is written under a side name of its writer's own before its rename.
With one side name per file (``NAME.castore-new``) one writer removed the other's half-written
file and renamed the rest into place, or failed on a file gone from under it."""

from __future__ import annotations

import lzma
import os
import subprocess
import sys
from pathlib import Path

import castore
from castore.adapters.pi import import_pi

DATA = Path(__file__).resolve().parent / "data"
ROUNDS = 40
_CHILD = """
import sys
import castore
from castore.adapters.pi import export_pi

store = castore.open(sys.argv[1])
for _ in range(int(sys.argv[3])):
    export_pi(store, sys.argv[2])
print("ok")
"""


def test_two_exports_into_one_folder_at_once_both_write_every_file_whole(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    originals = {}
    for name in ("large-session.jsonl", "before-compaction.jsonl"):  # 1 and 2.4 MB: writes that overlap
        originals[name] = lzma.decompress((DATA / "pi" / f"{name}.xz").read_bytes())
        (src / name).write_bytes(originals[name])
    with castore.open(str(tmp_path / "store")) as store:
        import_pi(store, str(src))
    dest = tmp_path / "out"
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path / "store"), str(dest), str(ROUNDS)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    for p in procs:
        out, err = p.communicate()
        assert p.returncode == 0 and out == "ok\n", err[-2000:]
    written = {p.name: p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert sorted(written.values(), key=len) == sorted(originals.values(), key=len)  # whole, and nothing beside
