"""An archived line's bytes (a blob its commit's meta names, ``{"o": n, "raw": ID}``) are part of
the history: fsck counts them reachable, gc keeps them, and sync carries them, so that the
real Claude Code and Codex files export byte for byte after a gc and on a second machine
(before, they were unreachable: gc deleted them and a pushed copy could not export)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import castore
from castore import maintenance, sync
from castore import objects as o
from castore.adapters.claude_code import export_claude, import_claude
from castore.adapters.codex import export_codex, import_codex
from castore.adapters.gemini import export_gemini, import_gemini

DATA = Path(__file__).resolve().parent / "data"
SHARE = DATA / "claude-code" / "session-share"
GEMINI = DATA / "gemini" / "tmp"


def _same(exported: Path, original: Path, base: Path) -> None:
    """Every session file under ``original`` is in ``exported`` (at its place below ``base``), byte for byte."""
    files = [*original.rglob("*.jsonl"), *original.rglob("*.json")]
    assert files
    for f in files:
        assert (exported / f.relative_to(base)).read_bytes() == f.read_bytes(), f


def _archive(url: str, **options: Any) -> castore.Store:
    st = castore.open(url, **options)
    import_claude(st, SHARE)
    import_codex(st, DATA / "codex")
    import_gemini(st, GEMINI)  # an older whole-file JSON is kept in chunks named by HEAD's info
    return st


def test_meta_links_finds_the_named_blobs() -> None:
    a, b, c, d, e, f = (x * 64 for x in "abcdef")
    meta = {"cc": {"o": 3, "raw": a, "uuid": "x", "tips": f}, "info": {"cx": {"prefix": [{"raw": b}, {"from": 1}]},
                                                                     "gm": {"whole": [d], "adopted": {"4": [e, f]}}},
            "img": [{"type": "image", "data": {"castore:blob": c}}], "raw": "not-an-id", "other": {"raw": 5}}
    assert sorted(o.meta_links(meta)) == [a, b, c, d, e, f]
    assert o.meta_links({"x": 1}) == [] and o.meta_links("raw") == []


def test_gc_keeps_the_archived_lines(tmp_path: Path) -> None:
    with _archive(str(tmp_path / "st")) as st:
        report = maintenance.fsck(st)
        assert report.ok and report.unreachable == []
        maintenance.gc(st, grace=0)
        export_claude(st, tmp_path / "out")
        export_codex(st, tmp_path / "out-codex")
        export_gemini(st, tmp_path / "out-gemini")
    _same(tmp_path / "out", SHARE, SHARE.parent)
    _same(tmp_path / "out-codex", DATA / "codex", DATA / "codex")
    _same(tmp_path / "out-gemini", GEMINI, GEMINI)


def test_sync_carries_the_archived_lines(tmp_path: Path, moto_server: Any) -> None:
    bucket = f"s3://castore-tests/{uuid.uuid4().hex}"
    with _archive(str(tmp_path / "laptop")) as laptop, castore.open(bucket, **moto_server.storage_options) as remote:
        assert sync.both_ways(laptop, remote).ok
        with castore.open(str(tmp_path / "desk")) as desk:
            assert sync.both_ways(desk, remote).ok
            assert maintenance.fsck(desk).ok
            export_claude(desk, tmp_path / "out")
            export_codex(desk, tmp_path / "out-codex")
            export_gemini(desk, tmp_path / "out-gemini")
    _same(tmp_path / "out", SHARE, SHARE.parent)
    _same(tmp_path / "out-codex", DATA / "codex", DATA / "codex")
    _same(tmp_path / "out-gemini", GEMINI, GEMINI)
