"""Pi's files changing under ``castore import pi`` and ``--follow``: a file rewritten a second time
is the next version (``ID.v3``), not a version of a version (``ID.v2.v2``, which the note called
``ID.v2``); a session file Pi has just made, its header not written whole (or not at all), waits
for the next import, as a torn last line does, where it failed the whole folder's import and
ended a follow of every session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_pi import _dump, every_type_entries

import castore
from castore.adapters import pi

ROOT = Path(__file__).resolve().parent.parent


def test_a_file_rewritten_twice_is_v2_then_v3(tmp_path: Path) -> None:
    store = castore.open(str(tmp_path / "store"), durable=False)
    entries = every_type_entries()
    f = tmp_path / "s.jsonl"
    f.write_bytes(_dump(entries))
    assert pi.import_pi(store, f)[0].key == ("pi", "local", "sess-1")
    f.write_bytes(_dump([{**entries[0], "cwd": "/elsewhere"}, *entries[1:]]))  # Pi rewrote it
    r = pi.import_pi(store, f)[0]
    assert r.key == ("pi", "local", "sess-1.v2") and r.notes[0].endswith("imported again as sess-1.v2")
    f.write_bytes(_dump([{**entries[0], "cwd": "/third"}, *entries[1:8]]))  # and again
    r = pi.import_pi(store, f)[0]
    assert r.key == ("pi", "local", "sess-1.v3") and r.notes[0].endswith("imported again as sess-1.v3")
    assert pi.import_pi(store, f)[0].key == ("pi", "local", "sess-1.v3")  # later imports continue v3
    assert sorted(i.session for i in store.sessions("pi")) == ["sess-1", "sess-1.v2", "sess-1.v3"]
    assert store.session("pi", "local", "sess-1.v2").info["pi"]["header"]["cwd"] == "/elsewhere"  # as it was


def test_a_file_whose_header_is_being_written_waits(tmp_path: Path) -> None:
    store = castore.open(str(tmp_path / "store"), durable=False)
    entries = every_type_entries()
    folder = tmp_path / "sessions" / "--w--"
    folder.mkdir(parents=True)
    (folder / "a.jsonl").write_bytes(_dump(entries))
    made = folder / "b.jsonl"
    other = [{**e, "id": f"b-{e['id']}"} if "id" in e else e for e in entries]
    other[0] = {**entries[0], "id": "sess-b"}
    for part in (b"", _dump(other)[:40]):  # Pi made the file; its header not written, or torn
        made.write_bytes(part)
        got = {r.key[2]: (r.entries, r.torn) for r in pi.import_pi(store, tmp_path / "sessions")}
        assert got == {"sess-1": (len(entries) - 1, 0) if not part else (0, 0), "b": (0, len(part))}
    made.write_bytes(_dump(other))
    got = {r.key[2]: r.entries for r in pi.import_pi(store, tmp_path / "sessions")}
    assert got == {"sess-1": 0, "sess-b": len(entries) - 1}


def test_follow_goes_on_past_a_file_being_made(tmp_path: Path) -> None:
    entries = every_type_entries()
    folder = tmp_path / "sessions" / "--w--"
    folder.mkdir(parents=True)
    (folder / "a.jsonl").write_bytes(_dump(entries))
    made = folder / "b.jsonl"
    made.write_bytes(b"")
    follow = subprocess.Popen([sys.executable, "-m", "castore", "--store", str(tmp_path / "store"), "import", "pi",
                               str(tmp_path / "sessions"), "--follow", "--interval", "0.05"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # a round that read the empty file too
        assert first.startswith("pi/local/sess-1: "), (first, follow.stderr.read() if follow.poll() is not None else "")
        other = [{**e, "id": f"b-{e['id']}"} if "id" in e else e for e in entries]
        other[0] = {**entries[0], "id": "sess-b"}
        made.write_bytes(_dump(other))
        line = follow.stdout.readline()  # before: the follow had ended at the empty file (EOF here)
        assert line.startswith("pi/local/sess-b: "), (line, follow.stderr.read() if follow.poll() is not None else "")
    finally:
        follow.terminate()
        follow.wait()
