"""scripts/bench_grep.py still runs end to end (a small smoke run; the full run is by hand)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path: Path, sessions: int, entries: int, *more: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_grep.py"), "--sessions", str(sessions),
                        "--entries", str(entries), "--repeat", "1", "--workdir", str(tmp_path / "w"), *more],
                       capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_smoke_run_reports_every_mode_with_the_same_match_counts(tmp_path: Path) -> None:
    page = tmp_path / "bench.md"
    out = _run(tmp_path, 5, 60, "--markdown", str(page))
    assert "castore grep vs GNU grep: 60 entries in 5 sessions" in out
    rows = [ln for ln in out.splitlines() if ln.startswith("| zanzibarquux |") or ln.startswith("| parser |")]
    assert len(rows) == 2
    for row in rows:
        counts = re.findall(r"x \((\d+)\)", row)
        assert len(counts) == 4
        assert counts[0] == counts[1] == counts[3]  # scan, index and cached index agree
    assert len([ln for ln in out.splitlines() if ln.startswith(("| zanzibarquux, command |", "| parser, command |"))]) == 2
    # --markdown: the same run as a page, a row per figure (4 searches, 3 searches in a warm process and
    # 4 commands per pattern)
    text = page.read_text()
    assert text.startswith("# castore grep vs GNU grep\n") and "--markdown" in text and " UTC" in text
    assert "load average" in text and "CPUs" in text and "entries 60; sessions 5" in text
    table = [ln for ln in text.splitlines() if ln.startswith(("| zanzibarquux |", "| parser |"))]
    assert len(table) == 22
    assert sum("in a warm process" in ln for ln in table) == 6 and "Start-up floor" in text
    for ln in table:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        gnu, ours, ratio, within = float(cells[2][:-3]), float(cells[3][:-3]), float(cells[4][:-1]), cells[5]
        assert within == ("yes" if ratio <= 2 else "no") and ours > 0 and gnu >= 0


@pytest.mark.slow
def test_full_size_run(tmp_path: Path) -> None:
    out = _run(tmp_path, 1000, 100_000)
    assert "100000 entries in 1000 sessions" in out
