#!/usr/bin/env python
"""``castore usage`` against ccusage on the same session files, case by case: where a response is
stored more than once (a resumed session, a fork, a ``/btw`` aside, a Codex fork), what each
reports, next to what the files themselves say once the copies are removed.

The cases are built from the real files in tests/data (Claude Code: session-share; Pi: the two
real sessions) and, for Codex, whose real sample has no ``token_count``, from the record types
of openai/codex's protocol.rs, as tests/test_codex.py builds them:

* ``claude``: the real session and its five subagent files, as recorded;
* ``claude+resume``: plus a resumed session: its first 60 lines replayed under a new
  ``sessionId`` with the same uuids, as Claude Code writes a resumed session's prefix;
* ``claude+fork``: plus a fork whose replayed lines got new uuids (``--fork-session``, a
  compaction replay), the same ``message.id`` and ``requestId``;
* ``claude+aside``: plus a ``/btw`` aside file under ``subagents/`` replaying every assistant
  line of the parent under new request ids (ccusage #913);
* ``codex+fork``: a thread of three turns (each ``token_count`` written twice, as Codex does
  when only the rate limits change) and a fork copying its first two turns with new times;
* ``codex+subagent``: the same thread and a subagent thread (``source.subagent.thread_spawn``,
  no ``forked_from_id``) whose file starts with the parent's whole history replayed at its
  creation time (ccusage #950, #1349), then one turn of its own;
* ``pi``: the two real Pi sessions.

"truth" is computed here from the JSONL alone: every response's own usage once (Claude Code:
per ``message.id`` and model; Codex: per pair of cumulative and last counts; Pi: per message
timestamp, model and counts). ccusage runs offline on a folder laid out as each agent lays
out its files (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, ``--pi-path``).

    .venv/bin/python scripts/usage_vs_ccusage.py --ccusage PATH [--ccusage-codex PATH] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MAIN = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"
CASTORE = [sys.executable, "-m", "castore"]


def jsonl_objects(path: Path) -> list[dict[str, Any]]:
    """The lines of a JSONL file that are JSON objects."""
    out = []
    for raw in path.read_bytes().splitlines():
        try:
            d = json.loads(raw)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out


def _rewrite(src: Path, dst: Path, edit: Any) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    lines = [edit(i, d) for i, d in enumerate(jsonl_objects(src))]
    dst.write_text("".join(json.dumps(d, separators=(",", ":")) + "\n" for d in lines if d is not None))


# -- the cases -----------------------------------------------------------------------------------
def claude_case(base: Path, extra: str | None) -> Path:
    """A ``~/.claude`` folder: the real session, and the copy ``extra`` adds."""
    proj = base / "projects" / "session-share"
    shutil.copytree(DATA / "claude-code" / "session-share", proj, ignore=shutil.ignore_patterns("LICENSE"))
    main = proj / f"{MAIN}.jsonl"

    def resumed(i: int, d: dict[str, Any]) -> dict[str, Any] | None:
        if i >= 60:
            return None
        if "sessionId" in d:
            d["sessionId"] = "11111111-1111-4111-8111-111111111111"
        return d

    def forked(i: int, d: dict[str, Any]) -> dict[str, Any] | None:
        got = resumed(i, d)
        if got is not None:
            for k in ("uuid", "parentUuid"):
                if isinstance(got.get(k), str):
                    got[k] = "f" + got[k][1:]
            got["sessionId"] = "22222222-2222-4222-8222-222222222222"
        return got

    def aside(i: int, d: dict[str, Any]) -> dict[str, Any] | None:
        if d.get("type") != "assistant":
            return None
        d.update(isSidechain=True, requestId=f"req_aside_{i}")
        return d

    if extra == "resume":
        _rewrite(main, proj / "11111111-1111-4111-8111-111111111111.jsonl", resumed)
    elif extra == "fork":
        _rewrite(main, proj / "22222222-2222-4222-8222-222222222222.jsonl", forked)
    elif extra == "aside":
        _rewrite(main, proj / MAIN / "subagents" / "agent-aside_question-x.jsonl", aside)
    return base


def _ts(i: int) -> str:
    return f"2026-01-02T10:{i // 60:02d}:{i % 60:02d}.000Z"


def _rl(i: int, type_: str, payload: dict[str, Any]) -> str:
    return json.dumps({"timestamp": _ts(i), "type": type_, "payload": payload}, separators=(",", ":")) + "\n"


def codex_case(base: Path, extra: str = "fork") -> Path:
    """A ``~/.codex`` folder: a thread of three turns and a fork of its first two (``fork``),
    or a subagent thread that replays the whole parent at its start (``subagent``)."""
    parent_id, fork_id = "0199bbbb-0000-7000-8000-000000000001", "0199bbbb-0000-7000-8000-000000000002"

    def meta(tid: str, **extra: Any) -> dict[str, Any]:
        return {"id": tid, "timestamp": _ts(0), "cwd": "/w", "originator": "codex_cli_rs", "cli_version": "0.90.0",
                "source": "cli", "model_provider": "openai", **extra}

    def turn(i: int, k: int, total: dict[str, int]) -> tuple[list[str], dict[str, int]]:
        last = {"input_tokens": 1000 * k, "cached_input_tokens": 600 * k, "output_tokens": 50 * k,
                "reasoning_output_tokens": 0, "total_tokens": 1050 * k}
        total = {f: total.get(f, 0) + v for f, v in last.items()}
        info = {"total_token_usage": total, "last_token_usage": last, "model_context_window": 272000}
        return [_rl(i, "turn_context", {"cwd": "/w", "approval_policy": "on-request", "model": "gpt-5-codex"}),
                _rl(i + 1, "response_item", {"type": "message", "role": "user",
                                             "content": [{"type": "input_text", "text": f"question {k}"}]}),
                _rl(i + 2, "response_item", {"type": "message", "role": "assistant",
                                             "content": [{"type": "output_text", "text": f"answer {k}"}]}),
                _rl(i + 3, "event_msg", {"type": "token_count", "info": info, "rate_limits": None}),
                _rl(i + 4, "event_msg", {"type": "token_count", "info": info, "rate_limits": {"primary": k}})], total

    parent, total = [_rl(0, "session_meta", meta(parent_id))], {}
    for k in (1, 2, 3):
        lines, total = turn(10 * k, k, total)
        parent += lines
    if extra == "fork":
        fork = [_rl(100, "session_meta", meta(fork_id, forked_from_id=parent_id))]
        copied, at = parent[1:11], 9
    else:  # a subagent: its own meta, the parent's history replayed at its start
        spawn = {"subagent": {"thread_spawn": {"parent_thread_id": parent_id, "depth": 1}}}
        fork = [_rl(100, "session_meta", meta(fork_id, source=spawn))]
        copied, at = parent[1:], len(parent) - 1
    for line in copied:
        d = json.loads(line)
        d["timestamp"] = _ts(100)
        fork.append(json.dumps(d, separators=(",", ":")) + "\n")
    fork += turn(200, 9, json.loads(parent[at])["payload"]["info"]["total_token_usage"])[0]
    day = base / "sessions" / "2026" / "01" / "02"
    day.mkdir(parents=True)
    (day / f"rollout-2026-01-02T10-00-00-{parent_id}.jsonl").write_text("".join(parent))
    (day / f"rollout-2026-01-02T10-01-40-{fork_id}.jsonl").write_text("".join(fork))
    return base


def pi_case(base: Path) -> Path:
    """A Pi sessions folder with the two real sessions."""
    d = base / "sessions" / "--w--"
    d.mkdir(parents=True)
    for name in ("large-session.jsonl", "before-compaction.jsonl"):
        (d / name).write_bytes(lzma.decompress((DATA / "pi" / f"{name}.xz").read_bytes()))
    return base


# -- what the files say ----------------------------------------------------------------------------
def truth(vendor: str, folder: Path) -> int:
    """The tokens of every response once, from the JSONL alone (see the module docstring)."""
    seen: dict[Any, int] = {}
    for f in sorted(folder.rglob("*.jsonl")):
        for d in jsonl_objects(f):
            m = d.get("message") if isinstance(d.get("message"), dict) else {}
            u = m.get("usage") if isinstance(m.get("usage"), dict) else None
            if vendor == "claude" and d.get("type") == "assistant" and u and m.get("model") != "<synthetic>":
                seen.setdefault((m.get("id"), m.get("model")), sum(u.get(k, 0) for k in (
                    "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")))
            elif vendor == "pi" and d.get("type") == "message" and m.get("role") == "assistant" and u:
                n = sum(u.get(k, 0) for k in ("input", "output", "cacheRead", "cacheWrite"))
                seen.setdefault((m.get("timestamp"), m.get("model"), n), n)
            elif vendor == "codex" and (d.get("payload") or {}).get("type") == "token_count":
                info = d["payload"].get("info") or {}
                last = info.get("last_token_usage") or {}
                seen.setdefault(json.dumps([info.get("total_token_usage"), last], sort_keys=True),
                                last.get("input_tokens", 0) + last.get("output_tokens", 0))
    return sum(seen.values())


def run_castore(vendor: str, folder: Path, work: Path) -> int:
    store = str(work / "store")
    src = {"claude": folder / "projects", "codex": folder / "sessions", "pi": folder / "sessions"}[vendor]
    env = {**os.environ, "CASTORE_USAGE_CACHE": str(work / "usage-cache.json")}
    if vendor == "pi":
        for f in sorted(src.rglob("*.jsonl")):
            subprocess.run([*CASTORE, "--store", store, "import", "pi", str(f)], check=True, capture_output=True,
                           env=env)
    else:
        subprocess.run([*CASTORE, "--store", store, "import", vendor, str(src)], check=True, capture_output=True,
                       env=env)
    out = subprocess.run([*CASTORE, "--store", store, "usage", "--json"], check=True, capture_output=True,
                         text=True, env=env).stdout
    return int(json.loads(out)["total"]["total"])


def run_ccusage(ccusage: str, vendor: str, folder: Path, codex: str | None = None) -> int | None:
    """ccusage's total tokens (None: it failed); ``codex``: the separate ``ccusage-codex`` of
    ccusage 18-19, used for the Codex cases."""
    env = {**os.environ, "TZ": "UTC"}
    args = [ccusage, vendor, "daily", "--offline", "--json"]
    if vendor == "codex" and codex:
        args = [codex, "daily", "--offline", "--json"]
    if vendor == "claude":
        env["CLAUDE_CONFIG_DIR"] = str(folder)
    elif vendor == "codex":
        env["CODEX_HOME"] = str(folder)
    else:
        args += ["--pi-path", str(folder / "sessions")]
    got = subprocess.run(args, capture_output=True, text=True, env=env)
    if got.returncode and vendor == "claude":  # a ccusage before 18 reads Claude Code only
        got = subprocess.run([ccusage, "daily", "--offline", "--json"], capture_output=True, text=True, env=env)
    try:
        doc = json.loads(got.stdout)
    except ValueError:
        return None
    totals = doc.get("totals") or {}
    return int(totals.get("totalTokens", 0)) if totals else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ccusage", default=shutil.which("ccusage") or "ccusage", help="the ccusage executable")
    ap.add_argument("--ccusage-codex", help="the ccusage-codex executable (@ccusage/codex, ccusage 18-19) for the "
                                            "Codex cases")
    ap.add_argument("--markdown", help="also write the table to this file")
    a = ap.parse_args()
    version = subprocess.run([a.ccusage, "--version"], capture_output=True, text=True).stdout.strip()
    version = version.removeprefix("ccusage").strip()
    if a.ccusage_codex:
        version += " (Codex: @ccusage/codex " + subprocess.run([a.ccusage_codex, "--version"], capture_output=True,
                                                                text=True).stdout.strip() + ")"
    rows = []
    with tempfile.TemporaryDirectory(prefix="usage-vs-ccusage-") as tmp:
        cases: list[tuple[str, str, Any]] = [
            ("claude", "claude", lambda p: claude_case(p, None)),
            ("claude+resume", "claude", lambda p: claude_case(p, "resume")),
            ("claude+fork", "claude", lambda p: claude_case(p, "fork")),
            ("claude+aside", "claude", lambda p: claude_case(p, "aside")),
            ("codex+fork", "codex", codex_case),
            ("codex+subagent", "codex", lambda p: codex_case(p, "subagent")),
            ("pi", "pi", pi_case),
        ]
        for name, vendor, build in cases:
            folder = build(Path(tmp) / name / "home")
            want = truth(vendor, folder)
            ours = run_castore(vendor, folder, Path(tmp) / name)
            theirs = run_ccusage(a.ccusage, vendor, folder, a.ccusage_codex)
            rows.append((name, want, ours, theirs))
    lines = [f"ccusage {version}, offline: total tokens (input + output + cache read + cache write)", "",
             "| case | the files, copies removed | castore usage | ccusage | ccusage / files |",
             "|---|---:|---:|---:|---:|"]
    for name, want, ours, theirs in rows:
        ratio = f"{theirs / want:.2f}x" if theirs and want else "-"
        lines.append(f"| {name} | {want:,} | {ours:,} | {theirs:,} | {ratio} |" if theirs is not None
                     else f"| {name} | {want:,} | {ours:,} | (failed) | - |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.markdown:
        Path(a.markdown).write_text(text)


if __name__ == "__main__":
    main()
