"""scripts/bench_langgraph.py still runs and writes its page: the race at N = 100..400.

Slow (a few hundred LangGraph turns on three durable savers): ``pytest -m slow``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_the_race_writes_a_page_with_its_command_machine_and_targets(tmp_path: str) -> None:
    pytest.importorskip("langgraph.checkpoint.sqlite")
    page = os.path.join(tmp_path, "page.md")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *sys.path]))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_langgraph.py"), "--quick",
                        "--workload", "race", "--dir", os.path.join(tmp_path, "stores"), "--markdown", page],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    text = open(page).read()
    assert text.startswith("# LangGraph saver benchmark\n")
    assert "Written by `scripts/bench_langgraph.py --quick --workload race" in text
    assert "load average (1, 5, 15 min)" in text and "CPUs" in text
    rows = [line for line in text.splitlines() if line.startswith(("| 100 |", "| 200 |", "| 400 |"))]
    assert len(rows) == 3 and all(len(r.split("|")) == 9 for r in rows)
    assert "- castore format 3 per turn at or below SqliteSaver's:" in text
    assert text.count("| N | SqliteSaver ms |") == 1  # the race only: the tables printed once
