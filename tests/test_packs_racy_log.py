"""A reader's refresh skips a live log whose mtime has not changed since its scan; an append
in the same coarse clock tick as that scan leaves the mtime as it was, so the log is also
asked whether it grew (as git re-checks a "racily clean" index entry)."""

from __future__ import annotations

import os
from pathlib import Path

import castore
from castore.objectstore.packs import pack_key


def test_an_append_in_the_tick_of_a_readers_scan_is_seen(tmp_path: Path) -> None:
    root = tmp_path / "st"
    w = castore.open(str(root), format=2)
    s = w.session("app", "u", "s")
    first = s.append(castore.Message(role="user", content="first"))
    r = castore.open(str(root))  # another handle: it learns of the log by scanning it
    assert r.objects.get(first).kind == "message"
    log = root / pack_key(w.objects.writer_log.name)
    before = os.stat(log)
    second = s.append(castore.Message(role="user", content="second"))
    assert os.stat(log).st_size > before.st_size
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns))  # the same clock tick as the scan
    assert r.objects.get(second).kind == "message"
    assert [m.content for m in r.session("app", "u", "s").messages()] == ["first", "second"]
    r.close()
    w.close()
