#!/usr/bin/env python
"""What no write path of castore's format can go below, on a Claude Code folder: the floor
(read and ``json.loads`` every line), the format's own share (``scripts/bench_import.py``'s
objects for every line, in memory), and the store's files alone: every folder and file the
import left in its store, made again by a bare program (``mkdir`` per folder; per file an
``O_EXCL`` create, one write, a close; one ``syncfs`` at the end), their bytes read into
memory before the clock starts; and the same with the refs packed, what a layout of packed
refs would write (every file under ``refs/`` appended to one file, with its name, by one write:
no ref folder, no ref file; the other folders and files as they are). The format's share plus
the files' is the bound; the import itself (``castore import claude FOLDER --jobs 1`` into a
fresh store) is timed beside them. Each a fresh process, alternated for ROUNDS rounds; prints
wall and CPU (user + system) medians and each one's ratio to the floor's.

    .venv/bin/python scripts/bench_import_bound.py FOLDER WORKDIR [--rounds 3]

FOLDER: a projects folder (``scripts/bench_import.py --size-mb 20 --workdir DIR`` makes
``DIR/projects``); WORKDIR: where the stores go (removed and made again).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_import import FLOOR, FORMAT

ROOT = Path(__file__).resolve().parent.parent

#: the store's files made again from memory: argv[1] the store an import left, argv[2] a new
#: folder, argv[3] "packed" for the refs in one file; prints the seconds and CPU seconds of
#: the writing alone
FILES = r"""
import ctypes, os, sys, time
src, dst = sys.argv[1], sys.argv[2]
packed = sys.argv[3:] == ["packed"]
folders, files, refs = [], [], []
for root, dirs, names in os.walk(src):
    rel = os.path.relpath(root, src)
    in_refs = rel == "refs" or rel.startswith("refs" + os.sep)
    if rel != "." and not (packed and in_refs):
        folders.append(rel)
    for n in names:
        with open(os.path.join(root, n), "rb") as f:
            (refs if packed and in_refs else files).append((os.path.join(rel, n), f.read()))
if refs:
    files.append(("refs.pack", b"".join(b"%d %s\n" % (len(d), r.encode()) + d for r, d in refs)))
libc = ctypes.CDLL(None, use_errno=True)
t, c = time.perf_counter(), os.times()
for rel in folders:
    os.mkdir(os.path.join(dst, rel))
for rel, data in files:
    fd = os.open(os.path.join(dst, rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    os.write(fd, data)
    os.close(fd)
made = time.perf_counter() - t
fd = os.open(dst, os.O_RDONLY)
libc.syncfs(fd)
os.close(fd)
e = os.times()
print(f"{time.perf_counter() - t:.4f} {e.user - c.user + e.system - c.system:.4f} {len(folders)} {len(files)} "
      f"{sum(len(d) for _, d in files)} {made:.4f}")
"""


def _timed(cmd: list[str], cwd: Path | None = None) -> tuple[float, float, str]:
    """Run ``cmd``; return its wall seconds, its CPU seconds (user + system) and its stdout."""
    before = os.times()
    t = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t
    after = os.times()
    return wall, after.children_user - before.children_user + after.children_system - before.children_system, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    py = sys.executable
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "castore")], check=True)
    shutil.rmtree(a.workdir, ignore_errors=True)
    a.workdir.mkdir(parents=True)
    ref = a.workdir / "ref"
    subprocess.run([py, "-m", "castore", "--store", str(ref), "import", "claude", str(a.folder), "--jobs", "1"],
                   cwd=ROOT, check=True, capture_output=True)
    rows: dict[str, list[tuple[float, float]]] = {"floor": [], "format": [], "files": [], "packed": [],
                                                   "import": []}
    shape = packed_shape = ""
    made: list[float] = []  # the files' seconds before their syncfs
    for r in range(a.rounds):
        rows["floor"].append(_timed([py, "-c", FLOOR, str(a.folder)])[:2])
        rows["format"].append(_timed([py, "-c", FORMAT, str(a.folder)], cwd=ROOT)[:2])
        dst = a.workdir / f"files-{r}"
        dst.mkdir()
        out = _timed([py, "-c", FILES, str(ref), str(dst)])[2].split()
        rows["files"].append((float(out[0]), float(out[1])))
        made.append(float(out[5]))
        shape = f"{int(out[2]):,} folders, {int(out[3]):,} files, {int(out[4]) / 1e6:.1f} MB"
        shutil.rmtree(dst)
        dst.mkdir()
        out = _timed([py, "-c", FILES, str(ref), str(dst), "packed"])[2].split()
        rows["packed"].append((float(out[0]), float(out[1])))
        packed_shape = f"{int(out[2]):,} folders, {int(out[3]):,} files"
        shutil.rmtree(dst)
        store = a.workdir / f"import-{r}"
        rows["import"].append(_timed([py, "-m", "castore", "--store", str(store), "import", "claude",
                                      str(a.folder), "--jobs", "1"], cwd=ROOT)[:2])
        shutil.rmtree(store)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1][0]:.2f} s" for k, v in rows.items()), flush=True)
    wall = {k: statistics.median(x[0] for x in v) for k, v in rows.items()}
    cpu = {k: statistics.median(x[1] for x in v) for k, v in rows.items()}
    wall["bound"], cpu["bound"] = wall["format"] + wall["files"], cpu["format"] + cpu["files"]
    wall["packed bound"] = wall["format"] + wall["packed"]
    cpu["packed bound"] = cpu["format"] + cpu["packed"]
    print(f"the store's files: {shape} (its folders and files as the import left them); made in "
          f"{statistics.median(made):.3f} s (median; {', '.join(f'{x:.2f}' for x in made)}), then the syncfs; "
          f"with the refs packed: {packed_shape}")
    labels = {"floor": "read + json.loads (the floor)", "format": "the format's own share (no store)",
              "files": "the store's files alone (writing, one syncfs)", "bound": "the bound: format + files",
              "packed": "the files with the refs packed in one (writing, one syncfs)",
              "packed bound": "a packed-refs bound: format + those files",
              "import": "castore import claude --jobs 1"}
    print("| what | wall (median) | CPU (median) | ratio to the floor (wall, CPU) |")
    print("|---|---:|---:|---:|")
    for k, label in labels.items():
        print(f"| {label} | {wall[k]:.3f} s | {cpu[k]:.3f} s | {wall[k] / wall['floor']:.2f}x, "
              f"{cpu[k] / cpu['floor']:.2f}x |")
    print("runs (wall): " + "; ".join(f"{k} " + ", ".join(f"{x[0]:.2f}" for x in v) for k, v in rows.items()))


if __name__ == "__main__":
    main()
