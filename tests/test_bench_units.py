"""The benchmark pages' ratio cells (scripts/benchlib): a ratio far below 1 keeps its digits and a
missing figure is a dash (BENCHMARKS.md showed ``×0.00`` where castore's read was 285 times
faster than parsing Pi's JSONL)."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from benchlib import turn  # noqa: E402
from benchlib.units import times  # noqa: E402


def test_a_ratio_keeps_two_significant_digits_and_a_missing_figure_is_a_dash() -> None:
    assert times(4.29, 1222.0) == "×0.0035" and times(0.09, 98.0) == "×0.00092"
    assert times(2.02, 1.0) == "×2.02" and times(0.5, 1.0) == "×0.50" and times(3806.4, 1.0) == "×3,806"
    assert times(None, 1.0) == times(1.0, None) == times(1.0, 0.0) == "—"


def test_the_turn_table_says_what_pi_figure_there_is() -> None:
    sizes = [100, 100_000]
    runs = {("context", "fresh", "none", n): [v] for n, v in ((100, 0.00212), (100_000, 0.00429))}
    runs |= {("context", "warm", "none", n): [0.001] for n in sizes}
    with_pi = runs | {("pi", "fresh", "none", n): [v] for n, v in ((100, 0.00032), (100_000, 1.222))}
    row = next(r for r in turn.section(with_pi, sizes) if r.startswith("| `context(max_tokens=8,000)` | fresh"))
    assert row.endswith("| ×2.02 | ×0.0035 |")
    rows = [r for r in turn.section(runs, sizes) if r.startswith("| `context(max_tokens=8,000)`")]
    assert rows[0].endswith("| ×2.02 | — |") and rows[1].endswith("| ×1.00 |  |")  # warm: no Pi column
    assert "| Pi JSONL: parse the session (anchor) | fresh | — | — | — |  |" in turn.section(runs, sizes)
