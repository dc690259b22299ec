"""scripts/bench_import.py still runs: its --size-mb 1 smoke mode, one round (the figures are not checked)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_bench_import_smoke_prints_floor_format_imports_and_reimport(tmp_path):
    work = tmp_path / "w"
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_import.py"), "--size-mb", "1",
                        "--rounds", "1", "--workdir", str(work)], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = [line for line in p.stdout.splitlines() if re.match(r"\| .* \| 1\.\d \| [\d.]+ s \|", line)]
    # the floor, the format alone, the import (default --jobs), with --jobs 1, the re-import
    assert len(rows) == 5, p.stdout
    assert rows[0].endswith("| 1.00x |")
    # every copy is its own session: file names (session ids) never repeat
    mains = [f for d in (work / "projects").iterdir() for f in d.glob("*.jsonl")]
    assert len(mains) > 12 and len({f.name for f in mains}) == len(mains)


def test_bench_import_stages_names_each_stage_it_times(tmp_path):
    # every stage it wraps still exists (a renamed function fails here, not in a benchmark run)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_import_stages.py"),
                        os.path.join(ROOT, "tests", "data", "claude-code"), str(tmp_path / "store")],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.search(r"^[\d,]+ lines, [\d,]+ files; main thread CPU", p.stdout, re.M), p.stdout
    for label in ("Importer.run", "claude _entry", "Batch.entry", "WriteBatch._land", "land_staged"):
        assert re.search(rf"us/line +[\d,]+ calls  {re.escape(label)}", p.stdout), (label, p.stdout)


def test_bench_import_lines_times_each_stage():
    # each per-line stage it runs still exists and takes what it is given (a renamed or
    # re-signed private fails here, not in a benchmark run)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "bench_import_lines.py"),
                        os.path.join(ROOT, "tests", "data", "claude-code"), "1"],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    for stage in ("parse_vouched", "encode_blob", "_entry", "place", "prepare", "Tree.extend"):
        assert re.search(rf"^{re.escape(stage)} +[\d.]+ us a line$", p.stdout, re.M), (stage, p.stdout)
    assert re.search(r"^[\d,]+ lines in [\d,]+ files$", p.stdout, re.M), p.stdout
