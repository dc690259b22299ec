"""Two imports of overlapping files at once: each reports what it stored itself over its
attempts (castore.adapters.import_jobs.import_here), never what the other stored, and what
it stored before a lost race is not forgotten by the attempt that follows it. Real stores,
real threads; the race is forced by a second import landing the same file
between the first import's reading of it and its landing."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import castore
from castore.adapters import gemini
from castore.adapters.claude_code import find_sessions, import_claude
from castore.adapters.codex import find_rollouts, import_codex
from castore.adapters.import_jobs import import_here
from castore.adapters.tree_writer import TreeWriter
from castore.groupcommit import WriteBatch
from castore.maintenance import fsck

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "data" / "claude-code" / "claude-code-log"


class _RivalAfter(list[Any]):
    """The results list of an import (import_here's ``out``) that, when the result of ``path``
    is added the first time, has a second handle of the store import that same file in
    another thread (a batch is one thread's), to the end, before the first import lands."""

    def __init__(self, url: str, path: str) -> None:
        super().__init__()
        self.url, self.path = url, path
        self.rival: list[Any] = []

    def append(self, r: Any) -> None:
        super().append(r)
        if r.path == self.path and not self.rival:
            def run() -> None:
                with castore.open(self.url) as other:
                    self.rival.extend(import_claude(other, self.path))
            t = threading.Thread(target=run)
            t.start()
            t.join()


def test_an_import_that_lost_a_race_reports_what_it_stored_before_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASTORE_LAND_EVERY", "3600")  # one landing, at the end: the race is certain
    url = str(tmp_path / "store")
    alone = import_claude(castore.open(str(tmp_path / "alone")), FOLDER)
    sources = find_sessions(FOLDER)
    raced = sources[-1].path
    out = _RivalAfter(url, raced)
    with castore.open(url) as store:
        results = import_here(store, "claude", sources, {}, out)
        assert out.rival and out.rival[0].lines > 0  # the rival stored the raced file first
        # the lost file is the rival's; every other file this import stored (its first
        # attempt's landing), which its second attempt found stored
        want = {r.path: (0 if r.path == raced else r.lines) for r in alone}
        assert {r.path: r.lines for r in results} == want
        assert sum(r.lines for r in results) + out.rival[0].lines == sum(r.lines for r in alone)
        assert [r.total for r in results] == [r.total for r in alone]
        assert all(r.branches == a.branches for r, a in zip(results, alone, strict=True) if r.path != raced)
        assert fsck(store).ok


@pytest.mark.parametrize("vendor", ["claude", "codex", "gemini"])
def test_a_rival_that_records_the_position_after_this_import_read_it_is_not_counted_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor: str) -> None:
    # The window of 3 runs in 40 of two imports at once (CASTORE_LAND_EVERY=0): this import has
    # landed the raced file's lines (every land_due lands here), and before it reads the
    # session's HEAD again the rival imports the whole file, finds the lines stored, and records
    # the position; this import's set_info used to write over it, and both counted the lines.
    # A compare-and-swap of the info (set_info(expect=...)) makes it a lost race: this import
    # goes again from what is stored, and the file is the rival's.
    monkeypatch.setattr(WriteBatch, "due", lambda self: True)  # a landing at each land_due
    url = str(tmp_path / "store")
    folder, find, import_one = {
        "claude": (FOLDER, find_sessions, import_claude),
        "codex": (ROOT / "tests" / "data" / "codex", find_rollouts, import_codex),
        "gemini": (ROOT / "tests" / "data" / "gemini" / "tmp", gemini.find_sessions, gemini.import_gemini)}[vendor]
    alone = import_one(castore.open(str(tmp_path / "alone")), folder)
    sources = find(folder)
    raced = [src.path for src in sources if src.path.endswith(".jsonl")][-1]  # (a file of lines, not one JSON)
    key = "/".join(next(r.session for r in alone if r.path == raced))
    rival: list[Any] = []
    started: list[bool] = []
    real_finish = TreeWriter.finish

    def finish(self: TreeWriter) -> str | None:
        self.flush()  # its last run lands: HEAD is read afresh by what follows
        if self.key == key and not started:
            started.append(True)
            def run() -> None:
                with castore.open(url) as other:
                    rival.extend(import_one(other, raced))
            t = threading.Thread(target=run)
            t.start()
            t.join()
        return real_finish(self)

    monkeypatch.setattr(TreeWriter, "finish", finish)
    with castore.open(url) as store:
        results = import_here(store, vendor, sources, {})
        assert rival and rival[0].lines > 0  # the rival found the lines stored, and recorded them
        want = {r.path: (0 if r.path == raced else r.lines) for r in alone}
        assert {r.path: r.lines for r in results} == want
        assert sum(r.lines for r in results) + rival[0].lines == sum(r.lines for r in alone)
        assert [r.total for r in results] == [r.total for r in alone]
        assert fsck(store).ok


def test_a_pi_rival_that_records_the_position_after_this_import_read_it_is_not_counted_twice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # As above for Pi's importer: the rival imports the whole file after this import read the
    # session (none yet) and before it sets the session's refs and records its position.
    # Before Pi's set_info compared the info it read, it wrote over the rival's, and both
    # reported the file's 1,002 entries (as two `castore import pi` of one folder at once did).
    import lzma

    from castore.adapters import pi

    folder = tmp_path / "sessions"
    folder.mkdir()
    raced = folder / "before-compaction.jsonl"
    raced.write_bytes(lzma.decompress((ROOT / "tests" / "data" / "pi" / "before-compaction.jsonl.xz").read_bytes()))
    alone = pi.import_pi(castore.open(str(tmp_path / "alone")), folder)
    url = str(tmp_path / "store")
    rival: list[Any] = []
    real_set_refs = pi._set_refs  # the point the rival runs at

    def set_refs(*args: Any, **kwargs: Any) -> None:
        if not rival:
            rival.append(None)

            def run() -> None:
                with castore.open(url) as other:
                    rival[:] = pi.import_pi(other, folder)
            t = threading.Thread(target=run)
            t.start()
            t.join()
        real_set_refs(*args, **kwargs)

    monkeypatch.setattr(pi, "_set_refs", set_refs)
    with castore.open(url) as store:
        results = import_here(store, "pi", pi.find_files(folder), {})
        assert rival[0].entries == alone[0].entries > 0  # the rival stored the file and recorded it
        assert [r.entries for r in results] == [0]
        assert [r.total for r in results] == [r.total for r in alone]
        assert fsck(store).ok
