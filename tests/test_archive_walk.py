"""What a Claude Code / Codex user met walking the archive in a terminal (import, sessions, use,
log, show, context, usage, grep, export, sync), each mended and kept here: the real files of
tests/data."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from castore.cli.main import main


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_a_session_id_alone_in_no_store_says_there_is_no_store(tmp_path: Path) -> None:
    # `castore --store laptop2 -s 0ccf append ...` where laptop2 held no store (clone puts it in
    # laptop2/.castore) said "session */*/0ccf not found"
    for args in (["-s", "0ccf", "append", "--role", "user", "hi"], ["-s", "0ccf", "log"], ["use", "0ccf"]):
        r = _run("--store", str(tmp_path / "none"), *args)
        assert r.exit_code == 1 and r.stderr.count("\n") == 1, (args, r.output)
        assert r.stderr.startswith(f"Error: no castore store at '{tmp_path / 'none'}'"), (args, r.stderr)
    assert not (tmp_path / "none").exists()
