"""Print, as JSON, what importing the real session files under tests/data gives: per session
its HEAD, branches, labels and info (commit ids, blob ids), and a digest of each exported file.

The same file must give the same commits whatever version of castore imports it (content
addressing: a re-import, a second machine, a sync all rely on it). Run
``python tests/golden/make_import_ids.py > tests/golden/import-ids.json`` only when the
commits an import makes change on purpose (a new branch layout, a new field in an archived
line's entry); tests/test_import_ids.py fails when an import no longer gives these.

The scenarios: each vendor's real files imported at once (Claude Code, Codex, Gemini CLI,
Pi); the Claude Code session's main file imported in three steps, as a live file grows; an
old-layout main file (its subagent's lines inside it, ``isSidechain``) built from the real
files; a few library appends with fixed times (no app or user state: a scope's commit takes the
clock's time).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import castore
from castore.adapters.claude_code import export_claude, import_claude
from castore.adapters.codex import export_codex, import_codex
from castore.adapters.gemini import export_gemini, import_gemini
from castore.adapters.pi import export_pi, import_pi

DATA = Path(__file__).resolve().parent.parent / "data"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


def _sessions(store: castore.Store) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for app in sorted(store.apps()):
        for si in sorted(store.sessions(app), key=lambda si: (si.user, si.session)):
            s = store.session(si.app, si.user, si.session)
            out[f"{si.app}/{si.user}/{si.session}"] = {
                "head": s.head, "branches": s.branches(), "labels": s.labels(), "info": s.info}
    return out


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _old_layout(work: Path) -> Path:
    """A main file of Claude Code's old layout: the real main file with one subagent's lines
    (``isSidechain: true``) written into it after the Task call that spawned it."""
    main = (DATA / "claude-code" / "session-share" / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    sub = (DATA / "claude-code" / "session-share" / SID / "subagents" / "agent-a5bdbc1.jsonl").read_bytes()
    at = next(i for i, line in enumerate(main) if b'"name":"Task"' in line) + 1
    proj = work / "old" / "proj"
    proj.mkdir(parents=True)
    (proj / "old-1.jsonl").write_bytes(b"".join(main[:at]) + sub + b"".join(main[at:]))
    return proj


def scenarios(work: Path, jobs: int = 1, vendors_only: bool = False) -> dict[str, Any]:
    """Each scenario's sessions and exported files, from stores made under ``work``; the
    vendors' folders imported over ``jobs`` processes (the same commits, whatever ``jobs``),
    and with ``vendors_only`` nothing else."""
    out: dict[str, Any] = {}

    def run(name: str, importer: Any, path: Path, exporter: Any, jobs: int = 1) -> castore.Store:
        store = castore.open(str(work / f"store-{name}"), durable=False)
        importer(store, path, jobs=jobs)
        exporter(store, work / f"out-{name}")
        out[name] = {"sessions": _sessions(store), "files": _files(work / f"out-{name}")}
        return store

    run("claude", import_claude, DATA / "claude-code", export_claude, jobs)
    run("codex", import_codex, DATA / "codex", export_codex, jobs)
    run("gemini", import_gemini, DATA / "gemini" / "tmp", export_gemini, jobs)
    pi = work / "pi-in"
    pi.mkdir()
    for xz in sorted((DATA / "pi").glob("*.xz")):
        (pi / xz.name.removesuffix(".xz")).write_bytes(lzma.decompress(xz.read_bytes()))
    run("pi", import_pi, pi, export_pi, jobs)
    if vendors_only:
        return out
    # a live file: imported as it grows, in three steps
    lines = (DATA / "claude-code" / "session-share" / f"{SID}.jsonl").read_bytes().splitlines(keepends=True)
    grow = work / "grow" / "proj"
    grow.mkdir(parents=True)
    store = castore.open(str(work / "store-grow"), durable=False)
    for cut in (30, 61, len(lines)):
        (grow / f"{SID}.jsonl").write_bytes(b"".join(lines[:cut]))
        import_claude(store, grow)
    export_claude(store, work / "out-grow")
    out["claude-grow"] = {"sessions": _sessions(store), "files": _files(work / "out-grow")}
    run("claude-old-layout", import_claude, _old_layout(work), export_claude)
    # library appends with fixed times
    store = castore.open(str(work / "store-lib"), durable=False)
    s = store.session("app", "u", "s")
    s.append_many([{"role": "user", "content": "hi"},
                   castore.Message("assistant", [{"type": "text", "text": "hello"}]),
                   castore.Event("tool", castore.Message("tool", "42", tool_call_id="c1"),
                                 state_delta={"k": [1, {"x": 2.5}]}, meta={"m": {"n": None}})],
                  times=[1.0, 2.0, 3.0])
    s.append(castore.Compaction("summary", first_kept=s.head, tokens_before=9), time=4.0)
    out["library"] = {"sessions": _sessions(store), "files": {}}
    return out


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="castore-import-ids-"))
    try:
        # a Pi session's info names the file it came from
        print(json.dumps(scenarios(work), indent=1, sort_keys=True).replace(str(work), "WORK"))
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
