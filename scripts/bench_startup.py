#!/usr/bin/env python
"""Benchmark: what a fresh ``castore`` process costs before and while it searches, compared
between checkouts (issue 38: a fresh ``castore grep -c WORD`` against GNU grep).

Times, each in a fresh process, with every given interpreter in turn within each round (so a
machine whose load changes weighs on every checkout alike): ``python -c pass`` (the floor any
Python command pays), ``castore --version``, ``castore --help``, ``castore grep -c`` of a rare
and a common word through the search index, ``castore grep`` of the common word printing every
match, and ``grep -r -c`` (GNU grep) of the same words over the same text as JSONL files, and
``grep -r`` of the common word printing every line; and once ``python -m castore grep -c`` of
the rare word, next to the ``castore`` command it runs as. Every process writes to a pipe this
script reads to its end: GNU grep writing to /dev/null would stop reading each file at its
first match. The store, its index and the JSONL files are those
``scripts/bench_grep.py --workdir DIR`` leaves in DIR (``store/``, ``jsonl/``); each checkout
searches its own index, ``DIR/index-LABEL/`` (built by its first, untimed round when absent or of
another version), so that checkouts that write different index versions never rebuild each
other's.

``castore`` is the console script the environment's installer wrote next to PYTHON
(``.venv/bin/castore``, what a user runs), not ``python -m castore`` (which loads ``runpy``
first): one more ``import`` line in a script the interpreter compiles each time.

Each PYTHON is the interpreter of a checkout's environment (``.venv/bin/python``; castore is
imported from wherever that environment installed it, every process started in the work folder
so that no checkout's own folder comes first on ``sys.path``), as ``LABEL=PATH`` to name its column.
Its castore is compiled to bytecode first, untimed, as an installed castore is
(``PYTHONDONTWRITEBYTECODE`` set would otherwise make every process compile it), and one
untimed round runs before the timed ones.

    .venv/bin/python scripts/bench_startup.py --workdir DIR [--rounds 15] [--markdown FILE] PYTHON [PYTHON...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

RARE, COMMON = "zanzibarquux", "parser"


#: in a command's arguments: the checkout's interpreter, and the console script next to it
PY, CASTORE = "{python}", "{castore}"


def commands(workdir: str) -> list[tuple[str, list[str]]]:
    """The timed commands: (label, arguments with :data:`PY` or :data:`CASTORE` first, or
    ``grep`` for GNU grep's, run once a round over the JSONL files in ``workdir``)."""
    jsonl = os.path.join(workdir, "jsonl")
    return [("python -c pass", [PY, "-c", "pass"]),
            ("castore --version", [CASTORE, "--version"]),
            ("castore --help", [CASTORE, "--help"]),
            (f"castore grep -c {RARE}", [CASTORE, "grep", "-c", RARE]),
            (f"python -m castore grep -c {RARE}", [PY, "-m", "castore", "grep", "-c", RARE]),
            (f"castore grep -c {COMMON}", [CASTORE, "grep", "-c", COMMON]),
            (f"castore grep {COMMON} (every match printed)", [CASTORE, "grep", COMMON]),
            (f"GNU grep -r -c {RARE}", ["grep", "-r", "-c", RARE, jsonl]),
            (f"GNU grep -r -c {COMMON}", ["grep", "-r", "-c", COMMON, jsonl]),
            (f"GNU grep -r {COMMON} (every line printed)", ["grep", "-r", COMMON, jsonl])]


def console_script(python: str) -> str:
    """The ``castore`` console script of the environment whose interpreter is ``python``.

    Raises:
        SystemExit: the environment has none (castore is not installed there).
    """
    path = os.path.join(os.path.dirname(python), "castore")
    if not os.path.exists(path):
        raise SystemExit(f"{path}: no castore console script next to {python} (run scripts/setup there)")
    return path


def _run(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t = time.perf_counter()
    # the output read through a pipe: GNU grep writing to /dev/null stops at the first match
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd) as p:
        assert p.stdout is not None
        read = p.stdout.read1
        while read(1 << 20):
            pass
        p.wait()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pythons", nargs="+", metavar="PYTHON",
                    help="the interpreter of each checkout's environment, PATH or LABEL=PATH")
    ap.add_argument("--workdir", required=True, help="a folder scripts/bench_grep.py --workdir left")
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds (the median and the minimum are shown)")
    ap.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    args = ap.parse_args()
    # absolute: every process starts in the work folder
    labels = {os.path.abspath(py.split("=", 1)[-1]): py.split("=", 1)[0] for py in args.pythons}
    args.pythons = list(labels)
    work = os.path.abspath(args.workdir)
    envs = {py: dict(os.environ, CASTORE_STORE=os.path.join(work, "store"),
                     CASTORE_GREP_INDEX=os.path.join(work, f"index-{labels[py]}")) for py in args.pythons}
    for py in args.pythons:
        src = subprocess.run([py, "-c", "import castore, os; print(os.path.dirname(castore.__file__))"],
                             capture_output=True, text=True, check=True, cwd=work).stdout.strip()
        print(f"{labels[py]}: {py} imports castore from {src}")
        subprocess.run([py, "-m", "compileall", "-q", src], check=True)
    scripts = {py: console_script(py) for py in args.pythons}
    cmds = commands(work)
    took: dict[tuple[str, str], list[float]] = {}
    load0 = os.getloadavg()
    for r in range(args.rounds + 1):
        for py in args.pythons:
            for label, argv in cmds:
                gnu = argv[0] == "grep"
                if gnu and py != args.pythons[0]:
                    continue  # GNU grep once a round
                dt = _run([{PY: py, CASTORE: scripts[py]}.get(a, a) for a in argv], envs[py], work)
                if r:
                    took.setdefault((label, "" if gnu else py), []).append(dt)
    load1 = os.getloadavg()
    head = ["command", *(labels[py] for py in args.pythons)]
    rows = []
    for label, argv in cmds:
        gnu = argv[0] == "grep"
        cells = []
        for py in [""] if gnu else args.pythons:
            v = took[(label, py)]
            cells.append(f"{statistics.median(v) * 1000:.0f} ms (min {min(v) * 1000:.0f})")
        name, paren, note = label.partition(" (")
        rows.append([f"`{name}`" + (f" ({note}" if paren else ""), *(cells * len(args.pythons) if gnu else cells)])
    lines = [f"Load average (1, 5, 15 min) {', '.join(f'{x:.2f}' for x in load0)} before, "
             f"{', '.join(f'{x:.2f}' for x in load1)} after; {args.rounds} rounds, each process once per round "
             "(the median, and the minimum in brackets).", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * len(args.pythons)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(f"Generated by `{' '.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])}`, "
                    f"finished {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.\n\n" + text)


if __name__ == "__main__":
    main()
