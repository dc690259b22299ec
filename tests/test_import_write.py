"""A first import's write path: a session new with the import is built in memory and its
branches move once per landing, not once per run of lines (the commits are those of the
append path: tests/test_import_ids.py holds their golden ids)."""

from __future__ import annotations

import gc
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import castore
from castore.adapters.claude_code import export_claude, import_claude
from castore.refs import RefStore

SHARE = Path(__file__).resolve().parent / "data" / "claude-code" / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"
_UUID = re.compile(rb"[0-9a-f]{8}(-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")


def _moves(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every ref move (staged or landed) by ref name, from now on."""
    moved: Counter[str] = Counter()
    real = RefStore.swap

    def counted(self: RefStore, name: str, *a: Any, **k: Any) -> Any:
        moved[name] += 1
        return real(self, name, *a, **k)

    monkeypatch.setattr(RefStore, "swap", counted)
    return moved


def test_a_first_import_moves_each_branch_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASTORE_LAND_EVERY", "1e9")  # one landing, at the end
    # the real session four times over, each copy with uuids of its own: a rewind in each,
    # main extended again after each (five runs on it, appended one by one before)
    src = (SHARE / f"{SID}.jsonl").read_bytes()
    body = b"".join(_UUID.sub(lambda m, r=r: b"%08x" % r + m.group(1), src) for r in range(4))
    (tmp_path / "projects" / "p").mkdir(parents=True)
    (tmp_path / "projects" / "p" / "s.jsonl").write_bytes(body)
    store = castore.open(str(tmp_path / "store"), durable=False)
    moved = _moves(monkeypatch)
    import_claude(store, tmp_path / "projects")
    branches = store.session("claude", "p", "s").branches()
    assert len(branches) == 5
    heads = {name.rsplit("/", 1)[1]: n for name, n in moved.items() if "/heads/" in name}
    assert heads == dict.fromkeys(branches, 1)  # staged once each (main: five times before)
    export_claude(store, tmp_path / "out")
    assert (tmp_path / "out" / "p" / "s.jsonl").read_bytes() == body


def test_an_imported_file_leaves_nothing_for_the_cyclic_collector(tmp_path: Path) -> None:
    # an import pauses the collector (jsonl_tree.import_batched): a file's importer caught in a
    # reference cycle kept every parsed line of the file alive until the next collection
    (tmp_path / "projects" / "p").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "projects" / "p" / f"s{i}.jsonl").write_bytes((SHARE / f"{SID}.jsonl").read_bytes())
    store = castore.open(str(tmp_path / "store"), durable=False)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage, to look at
    try:
        import_claude(store, tmp_path / "projects")
        gc.collect()
        left = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        store.close()
    assert store.session("claude", "p", "s2").branches()
    assert not {"_Importer", "Event", "Session"} & set(left), left
