"""The benchmark suite (scripts/bench) still runs: a smoke run at N=100, local systems only.

The full run is not part of the tests; this one checks that every comparison still
executes end to end and that the report carries every table row and the targets.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEMS = ["castore local", "castore encrypted", "LangGraph InMemorySaver", "LangGraph SqliteSaver", "Pi JSONL", "floor (append to a file)"]
SECTIONS = ["Append: median time per step", "Append growth", "Bytes stored", "Disk usage", "Cold read of the current path",
            "Time travel", "Full log", "Fork at the middle step: bytes written", "Fork at the middle step: time"]


PUBLISHED = os.path.join(ROOT, "docs", "benchmarks", "BENCHMARKS.md")


def _mtime() -> int | None:
    return os.stat(PUBLISHED).st_mtime_ns if os.path.exists(PUBLISHED) else None


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int | None, int | None]:
    """One smoke run for the module: (report text, BENCHMARKS.md mtime before, after)."""
    tmp_path = tmp_path_factory.mktemp("bench")
    before = _mtime()
    out = tmp_path / "BENCH.md"
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "scripts"))
    p = subprocess.run([sys.executable, "-m", "benchlib", "--smoke", "--out", str(out), "--workdir", str(tmp_path / "w")],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == str(out)
    return out.read_text(), before, _mtime()


def _section(text: str, title: str) -> str:
    start = text.index(f"### {title}")
    end = text.find("\n### ", start + 4)
    return text[start:end if end > 0 else len(text)]


def test_smoke_run_writes_every_table_with_a_row_per_system_and_the_targets(smoke):
    text = smoke[0]
    assert "## Machine" in text and "load before the run" in text and "| langgraph |" in text
    assert "`scripts/bench --smoke --out" in text
    for title in SECTIONS:
        sec = _section(text, title)
        assert "| N = 100 |" in sec, title
        assert re.search(r"\| castore local \| [\d.,]+ (ms|B|kB|MB)? ?\|", sec) or title.startswith("Append growth"), sec
        for name in SYSTEMS:
            assert f"| {name} |" in sec, (title, name)
    # ratios to castore are shown, and the medians are real numbers
    append = _section(text, "Append: median time per step")
    assert re.search(r"\| LangGraph SqliteSaver \| [\d.,]+ ms \(×[\d.]+\) \|", append), append
    assert re.search(r"\| raw payload \| 49\.\d\d kB \|", _section(text, "Bytes stored"))
    targets = text[text.index("## Targets"):]
    for i in range(1, 6):
        assert re.search(rf"^{i}\. .*\*\*(met|not met|not measured)\*\*", targets, re.M), (i, targets)
    assert "castore S3: not run" in text  # smoke is local only


def test_smoke_run_writes_the_encrypted_store_against_plain_castore_with_its_targets(smoke):
    sec = _section(smoke[0], "Encrypted store: castore encrypted against castore local")
    for row in ("durable append, median per step", "cold read: messages + state, new process", "bytes stored"):
        assert re.search(rf"\| {re.escape(row)}[^|]*\| [\d.,]+ (ms|kB) / [\d.,]+ (ms|kB) \(×[\d.]+\) \|", sec), (row, sec)
    for target in ("durable append within 1.15×", "cold read of 10,000 entries within 1.2×", "bytes stored within 1.05×"):
        assert re.search(rf"^- {re.escape(target)}.*\*\*(met|not met)\*\*", sec, re.M), (target, sec)
    assert "S3 requests per append unchanged: **not measured**" in sec  # smoke is local only


def test_smoke_run_writes_the_turn_section_with_every_read(smoke):
    sec = smoke[0][smoke[0].index("## The turn: what an agent reads every turn"):]
    for read in ("`context(max_tokens=8,000)`", "`log(limit=20)`", "newest 100 entries", "`get_items(limit=20)`",
                 "`get_session(num_recent_events=20)`", "`get_tuple`"):
        assert re.search(r"\| [^|]*" + re.escape(read) + r"[^|]*\| fresh \| [\d.,]+ ms \|", sec), (read, sec)
    assert re.search(r"\| `context\(max_tokens=8,000\)` \| warm \| [\d.,]+ ms \|", sec), sec
    assert "| Pi JSONL: parse the session (anchor) | fresh |" in sec and "Beside a live writer" in sec


def test_smoke_run_writes_its_own_file_not_the_published_benchmarks(smoke):
    _, before, after = smoke
    assert before == after
