"""How the benchmark pages write a time: one rule for every table (report.py's, turn.py's)."""

from __future__ import annotations


def ms(x: float | None) -> str:
    """``x`` milliseconds as a table cell (an em dash for no figure)."""
    if x is None:
        return "—"
    return f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms" if x < 100 else f"{x:,.0f} ms"
