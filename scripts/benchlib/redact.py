"""The redaction section of docs/benchmarks/BENCHMARKS.md: what redacting secrets costs per MB.

``scripts/bench_redact.py`` measures it (it takes minutes of imports that have nothing to do
with the rest of ``scripts/bench``) and writes its figures to :data:`FIGURES`; this module
renders them, for ``scripts/bench`` when it writes the whole page and for
``scripts/bench_redact.py`` when it puts a new run in the page (:func:`splice`). One renderer,
one file of figures: the page never holds a hand-pasted figure.
"""

from __future__ import annotations

import json
import os
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: the figures of the last ``scripts/bench_redact.py --markdown`` run
FIGURES = os.path.join(ROOT, "docs", "benchmarks", "measurements", "redact.json")
#: the page ``scripts/bench`` writes
PAGE = os.path.join(ROOT, "docs", "benchmarks", "BENCHMARKS.md")
HEADER = "## Redaction: what it costs per MB"


def section(path: str = FIGURES) -> list[str]:
    """The section's lines (a header, the figures, the command that measured them), or a
    line saying no run was recorded."""
    if not os.path.exists(path):
        return [HEADER, "", "Not measured: `scripts/bench_redact.py --markdown FILE` writes the figures.", ""]
    with open(path) as f:
        fig: dict[str, Any] = json.load(f)
    out = [HEADER, "",
           f"`{fig['command']}` at commit {fig['commit']}, {fig['date']}, {fig['cores']} cores, load "
           f"{fig['load_before']:.1f} before and {fig['load_after']:.1f} after (figures in "
           "`docs/benchmarks/measurements/redact.json`; `scripts/bench` carries them over, "
           "[BENCHMARKS-redact.md](BENCHMARKS-redact.md) has the whole run).", "",
           f"Redaction of {fig['lines']:,} lines ({fig['mb']:.2f} MB) of the Claude Code, Codex, Pi and Gemini CLI "
           f"sessions under tests/data, best of {fig['repeat']} rounds:", "",
           "| what | MB/s | ms per MB |", "|---|---:|---:|"]
    for row in fig["scan"]:
        out.append(f"| {row['what']} | {row['mb'] / row['s']:.2f} | {row['s'] / row['mb'] * 1000:.1f} |")
    out += ["", "On an import into a fresh local store, plain and `--redact` alternated round by round, best of "
            f"{fig['repeat']}:", "", "| import | MB | plain | --redact | added | added per MB |",
            "|---|---:|---:|---:|---:|---:|"]
    for row in fig["imports"]:
        plain, red, mb = row["plain_s"], row["redact_s"], row["mb"]
        out.append(f"| `import {row['kind']}` | {mb:.2f} | {plain * 1000:.0f} ms | {red * 1000:.0f} ms | "
                   f"{(red - plain) / plain * 100:+.0f}% | {(red - plain) / mb * 1000:+.0f} ms |")
    out.append("")
    return out


def splice(lines: list[str], page: str = PAGE) -> None:
    """Put ``lines`` (a :func:`section`) in ``page`` in place of its redaction section, or
    before its targets when it has none yet."""
    with open(page) as f:
        text = f.read().split("\n")
    if HEADER in text:
        start = text.index(HEADER)
        end = next((i for i in range(start + 1, len(text)) if text[i].startswith("## ")), len(text))
    else:
        start = end = next((i for i, ln in enumerate(text) if ln.startswith("## Targets")), len(text))
    with open(page, "w") as f:
        f.write("\n".join(text[:start] + lines + text[end:]))
