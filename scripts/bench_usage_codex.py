#!/usr/bin/env python
"""Benchmark: ``castore usage`` over Codex rollouts whose import kept each response's usage in the
commit metadata (``codex.u``), against the same rollouts imported as before it did (every
``token_count``, ``turn_context`` and ``session_meta`` line read again, walking each path).

Generates SESSIONS rollouts of TURNS turns each under ``sessions/YYYY/MM/DD`` (the record types
of openai/codex's protocol, as tests/test_codex.py writes them: turn_context, the prompt, a
reasoning summary, a shell call and its output, the answer, a token_count with
``last_token_usage``; every fifth turn a rollback of one turn), imports them twice into two
stores: as ``castore import codex`` does now, and with the usage record left out (the commits
of a session imported before: the same bodies, no ``u``), timing each import; then compiles
castore's bytecode and times ``castore usage --json --no-cache`` on each store, each run a
fresh process, alternating, and checks that both report the same totals. Then REPEAT
alternated rounds of importing the first 20 rollouts into fresh stores both ways (the cost of
working the usage out at import). Prints a Markdown table; ``--markdown FILE`` also writes it
as a page (the command, the machine and its load before and after).

    .venv/bin/python scripts/bench_usage_codex.py [--sessions 100] [--turns 20] [--repeat 5]
                                                  [--workdir DIR] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
#: imports codex without the usage record (as before the importer kept it)
BEFORE = ("import sys, castore.adapters.codex as c\n"
          "c.codex_record = lambda d, walk: (None, walk)\n"
          "from castore.cli.main import main\nsys.argv[0] = 'castore'\nmain()\n")


def _ts(i: int) -> str:
    return f"2026-01-02T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z"


def _line(i: int, type_: str, payload: dict) -> str:
    return json.dumps({"timestamp": _ts(i), "type": type_, "payload": payload}, separators=(",", ":")) + "\n"


def generate(out: Path, sessions: int, turns: int) -> tuple[int, int]:
    """Write the rollouts; returns (lines, bytes)."""
    day = out / "sessions" / "2026" / "01" / "02"
    day.mkdir(parents=True)
    n_lines = n_bytes = 0
    for s in range(sessions):
        tid = f"0199cccc-0000-7000-8000-{s:012d}"
        lines = [_line(0, "session_meta", {"id": tid, "timestamp": _ts(0), "cwd": "/w", "originator": "codex_cli_rs",
                                           "cli_version": "0.90.0", "source": "cli", "model_provider": "openai"})]
        total = {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0, "reasoning_output_tokens": 0,
                 "total_tokens": 0}
        for k in range(1, turns + 1):
            i = 10 * k
            last = {"input_tokens": 900 + 37 * k + s, "cached_input_tokens": 500 + k, "output_tokens": 40 + k,
                    "reasoning_output_tokens": 8, "total_tokens": 940 + 38 * k + s}
            total = {f: total[f] + v for f, v in last.items()}
            call = f"call_{s}_{k}"
            lines += [
                _line(i, "turn_context", {"cwd": "/w", "approval_policy": "on-request",
                                          "model": "gpt-5-codex" if k % 3 else "gpt-5.1-codex", "summary": "auto"}),
                _line(i + 1, "response_item", {"type": "message", "role": "user",
                                               "content": [{"type": "input_text", "text": f"find needle {k}"}]}),
                _line(i + 2, "response_item", {"type": "reasoning", "summary": [
                    {"type": "summary_text", "text": f"**Planning** step {k}"}], "content": None}),
                _line(i + 3, "response_item", {"type": "function_call", "name": "shell", "call_id": call,
                                               "arguments": json.dumps({"command": ["rg", "-n", f"needle{k}"]})}),
                _line(i + 4, "response_item", {"type": "function_call_output", "call_id": call,
                                               "output": json.dumps({"output": f"src/a.rs:{k}: needle{k}"})}),
                _line(i + 5, "response_item", {"type": "message", "role": "assistant",
                                               "content": [{"type": "output_text", "text": f"answer {k}"}]}),
                _line(i + 6, "event_msg", {"type": "token_count", "info": {
                    "total_token_usage": total, "last_token_usage": last, "model_context_window": 272000},
                    "rate_limits": None}),
            ]
            if k % 5 == 0:
                lines.append(_line(i + 7, "event_msg", {"type": "thread_rolled_back", "num_turns": 1}))
        text = "".join(lines)
        (day / f"rollout-2026-01-02T10-00-00-{tid}.jsonl").write_text(text)
        n_lines += len(lines)
        n_bytes += len(text.encode())
    return n_lines, n_bytes


def _castore(store: Path, *args: str, before: bool = False) -> tuple[float, str]:
    env = {**os.environ, "CASTORE_STORE": str(store)}
    cmd = [PY, "-c", BEFORE, *args] if before else [PY, "-m", "castore", *args]
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return time.perf_counter() - t, out


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--workdir")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    load0 = _load()
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="bench-usage-codex-"))
    shutil.rmtree(work / "home", ignore_errors=True)
    lines, size = generate(work / "home", a.sessions, a.turns)
    src = str(work / "home" / "sessions")
    subprocess.run([PY, "-m", "compileall", "-q", str(ROOT / "castore")], check=True)
    stores = {"now": work / "store-now", "before": work / "store-before"}
    imports: dict[str, float] = {}
    for name, st in stores.items():
        shutil.rmtree(st, ignore_errors=True)
        imports[name], _ = _castore(st, "import", "codex", src, before=name == "before")
    runs: dict[str, list[float]] = {"now": [], "before": []}
    totals: dict[str, object] = {}
    for _ in range(a.repeat):
        for name, st in stores.items():
            t, out = _castore(st, "usage", "--json", "--no-cache")
            runs[name].append(t)
            totals[name] = json.loads(out)["total"]
    if totals["now"] != totals["before"]:
        raise SystemExit(f"totals differ: {totals}")
    few = work / "home-few" / "sessions" / "2026" / "01" / "02"
    shutil.rmtree(work / "home-few", ignore_errors=True)
    few.mkdir(parents=True)
    for p in sorted(Path(src).rglob("*.jsonl"))[:20]:
        shutil.copy(p, few / p.name)
    small: dict[str, list[float]] = {"now": [], "before": []}
    for r in range(a.repeat):
        for name in ("now", "before"):
            st = work / f"store-few-{name}-{r}"
            shutil.rmtree(st, ignore_errors=True)
            small[name].append(_castore(st, "import", "codex", str(work / "home-few" / "sessions"),
                                        before=name == "before")[0])
            shutil.rmtree(st, ignore_errors=True)
    load1 = _load()
    med = {k: statistics.median(v) for k, v in runs.items()}
    smed = {k: statistics.median(v) for k, v in small.items()}
    tot = totals["now"]
    assert isinstance(tot, dict)
    rows = [
        "| run | median | runs (s) |",
        "|---|---:|---|",
        f"| `castore usage --no-cache`, imported now (usage in the metadata) | {med['now']:.2f} s | "
        + ", ".join(f"{x:.2f}" for x in runs["now"]) + " |",
        f"| `castore usage --no-cache`, imported as before (lines read again) | {med['before']:.2f} s | "
        + ", ".join(f"{x:.2f}" for x in runs["before"]) + " |",
        f"| ratio now / before | {med['now'] / med['before']:.2f}x | |",
        f"| `castore import codex` of 20 rollouts, now | {smed['now']:.2f} s | "
        + ", ".join(f"{x:.2f}" for x in small["now"]) + " |",
        f"| `castore import codex` of 20 rollouts, as before | {smed['before']:.2f} s | "
        + ", ".join(f"{x:.2f}" for x in small["before"]) + " |",
    ]
    head = (f"{a.sessions} rollouts, {lines:,} lines, {size / 2**20:.1f} MiB; whole imports took "
            f"{imports['now']:.1f} s (now) and {imports['before']:.1f} s (as before), once each; "
            f"both report {tot.get('responses')} responses, {tot.get('total', 0):,} tokens")
    text = head + "\n\n" + "\n".join(rows) + "\n"
    print(text)
    if a.markdown:
        import platform

        # the work folder is this machine's: the page names it DIR
        shown = ["DIR" if arg == a.workdir else arg for arg in sys.argv[1:]]
        cmd = "scripts/bench_usage_codex.py " + " ".join(shown)
        Path(a.markdown).write_text(
            "# `castore usage` over Codex rollouts: usage kept at import\n\n"
            "Generated by `scripts/bench_usage_codex.py` (its docstring says what it does). Command:\n\n"
            f"    .venv/bin/python {cmd}\n\n"
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
            f"load average before {load0}, after {load1} (a machine shared with other jobs: the runs "
            "alternate, so load hits both sides alike).\n\n" + text)


if __name__ == "__main__":
    main()
