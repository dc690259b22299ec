"""What a Claude Code / Codex user met walking the archive in a terminal (import, sessions, use,
log, show, context, usage, grep, export, sync), each mended and kept here: the real files of
tests/data."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
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


DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize(("vendor", "src"), [("claude", "claude-code/session-share"),
                                             ("codex", "codex/sample_codex_session.jsonl"), ("gemini", "gemini/tmp")])
def test_an_archive_export_lists_its_files_as_json_too(tmp_path: Path, vendor: str, src: str) -> None:
    # every listing has --json: the exports listed the files written as lines only
    store = str(tmp_path / "store")
    assert _run("--store", store, "import", vendor, str(DATA / src)).exit_code == 0
    r = _run("--store", store, "export", vendor, str(tmp_path / "out"), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["dest"] == str(tmp_path / "out") and doc["kept"] == [] and doc["written"]
    assert sorted(doc["written"]) == sorted(str(p.relative_to(tmp_path / "out"))
                                            for p in (tmp_path / "out").rglob("*") if p.is_file())
    # a file that holds what the archive lacks: listed as kept, then the one Error: line
    ahead = tmp_path / "out" / doc["written"][0]
    ahead.write_bytes(ahead.read_bytes() + b'{"type": "user", "note": "written after the import"}\n')
    r = _run("--store", store, "export", vendor, str(tmp_path / "out"), "--json")
    assert r.exit_code == 1 and r.stderr.splitlines()[-1].startswith(f"Error: {tmp_path / 'out'}: 1 file holds")
    doc = json.loads(r.stdout)
    assert doc["kept"] == [str(ahead.relative_to(tmp_path / "out"))] and ahead.name not in doc["written"]


def test_export_pi_lists_its_files_as_json_and_refuses_json_for_one_session(tmp_path: Path) -> None:
    src = tmp_path / "pi"
    src.mkdir()
    (src / "s.jsonl").write_bytes(lzma.decompress((DATA / "pi" / "large-session.jsonl.xz").read_bytes()))
    store = str(tmp_path / "store")
    assert _run("--store", store, "import", "pi", str(src)).exit_code == 0
    r = _run("--store", store, "export", "pi", str(tmp_path / "out") + "/", "--json")
    assert r.exit_code == 0 and len(json.loads(r.stdout)["written"]) == 1, r.output
    r = _run("--store", store, "-s", "d703a1a9", "export", "pi", "-o", str(tmp_path / "one.jsonl"), "--json")
    assert r.exit_code == 2 and "--json lists the files of an export into a DEST folder" in r.stderr
    assert not (tmp_path / "one.jsonl").exists()


def test_a_folder_whose_dot_castore_holds_the_store_is_named_so(tmp_path: Path) -> None:
    # `castore clone URL laptop2` puts the store in laptop2/.castore; `--store laptop2` then said
    # "no castore store ... (create one with `castore init` ...)", as if nothing were there
    origin = str(tmp_path / "origin")
    assert _run("--store", origin, "append", "-s", "a/u/s1", "--role", "user", "hello").exit_code == 0
    assert _run("clone", origin, str(tmp_path / "laptop2")).exit_code == 0
    r = _run("--store", str(tmp_path / "laptop2"), "sessions")
    inner = tmp_path / "laptop2" / ".castore"
    assert r.exit_code == 1 and r.stderr == (f"Error: no castore store at '{tmp_path / 'laptop2'}'; {inner} is one: "
                                             f"pass --store {inner}, or run castore in {tmp_path / 'laptop2'}\n")
    assert _run("--store", str(inner), "sessions").stdout.startswith("a/u/s1 ")
