"""Opening a store while another process makes its folder: the check that refuses a store root
that is a file (storage.local.refuse_file) asked "a folder?" and then "there at all?", so a
folder made between the two read as a file ("is a file, not a folder": an import's poll of a
store its child was creating failed so). One stat a step answers both at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from castore.storage.local import refuse_file

#: a process that makes and removes the folder as fast as it can, until killed
FLICKER = """
import os, sys
p = sys.argv[1]
print("go", flush=True)
while True:
    try:
        os.mkdir(p)
        os.rmdir(p)
    except OSError:
        pass
"""


def test_a_folder_made_meanwhile_is_never_called_a_file(tmp_path: Path) -> None:
    root = tmp_path / "store"
    child = subprocess.Popen([sys.executable, "-c", FLICKER, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "go\n"
        for _ in range(20_000):
            refuse_file(str(root), str(root))  # raises StorageError before
    finally:
        child.kill()
        child.wait()


def test_a_file_is_still_refused(tmp_path: Path) -> None:
    import pytest

    from castore.errors import StorageError

    (tmp_path / "f").write_text("x")
    for root in (tmp_path / "f", tmp_path / "f" / "below"):
        with pytest.raises(StorageError, match="is a file, not a folder"):
            refuse_file(str(root), str(root))
    refuse_file(str(tmp_path / "none" / "deeper"), "u")
