"""How the benchmark pages write a time and a ratio: one rule for every table (report.py's, turn.py's)."""

from __future__ import annotations


def ms(x: float | None) -> str:
    """``x`` milliseconds as a table cell (an em dash for no figure)."""
    if x is None:
        return "—"
    return f"{x:.2f} ms" if x < 10 else f"{x:.1f} ms" if x < 100 else f"{x:,.0f} ms"


def times(x: float | None, base: float | None) -> str:
    """``x`` over ``base`` as a table cell, ``×1.23``: two significant digits below 0.1 (a read
    a thousand times faster than the one it is set against is ``×0.0035``, never ``×0.00``), no
    decimals from 10 up; an em dash when either figure is missing (or ``base`` is 0)."""
    if x is None or not base:
        return "—"
    r = x / base
    return f"×{r:.2g}" if r < 0.1 else f"×{r:.2f}" if r < 10 else f"×{r:,.0f}"
