#!/usr/bin/env python
"""Where a one-process ``castore import claude`` spends its CPU, by stage, per line.

Runs ``castore --store STORE import claude FOLDER --jobs 1`` in this process (STORE is
removed first) with the stages below wrapped by a timer of the main thread's CPU
(``time.thread_time``; inclusive: a stage's time holds the stages it calls, a recursive call
counts once), and prints each stage's seconds, microseconds per line and calls, largest
first. The wrappers cost about a microsecond per call: compare stages, not the total with
an unwrapped run. Make a folder with ``scripts/bench_import.py --size-mb 20 --workdir DIR``
(its ``DIR/projects``).

    .venv/bin/python scripts/bench_import_stages.py FOLDER STORE
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import shutil
import sys
import time
from typing import Any

#: (module, owner within it or "", attribute, label): the stages timed
STAGES = [
    ("castore.adapters.claude_code", "_Importer", "run", "Importer.run (a file: all below but landings between files)"),
    ("castore.adapters.claude_code", "_Importer", "__init__", "Importer.__init__ (a file's session, its info)"),
    ("castore.adapters.claude_code", "", "_entry", "claude _entry (a line's message, usage, time)"),
    ("castore.adapters.claude_code", "", "parse_vouched", "parse_vouched (msgspec parse of a line)"),
    ("castore.adapters.claude_code", "", "encode_blob", "encode_blob (the raw line's blob, hashed)"),
    ("castore.adapters.claude_tree", "Paths", "place", "Paths.place (a line's parent)"),
    ("castore.adapters.tree_writer", "TreeWriter", "__init__", "TreeWriter.__init__"),
    ("castore.adapters.tree_writer", "TreeWriter", "add", "TreeWriter.add (with the flushes it starts)"),
    ("castore.adapters.tree_writer", "TreeWriter", "flush", "TreeWriter.flush (a run of lines appended)"),
    ("castore.adapters.tree_writer", "TreeWriter", "finish", "TreeWriter.finish (labels, layout, HEAD)"),
    ("castore.adapters.tree_writer", "", "land_due", "land_due (landings between runs of lines)"),
    ("castore.session", "Session", "append_many", "Session.append_many (a session that had commits)"),
    ("castore.plumbing", "Tree", "commit", "Tree.commit (a new session's line: its entry split, its commit built)"),
    ("castore.plumbing", "Tree", "end", "Tree.end (a run of a new session's lines to the write batch)"),
    ("castore.plumbing", "Tree", "publish", "Tree.publish (a new session's branches staged)"),
    ("castore.session", "Session", "set_info", "Session.set_info (a file's import state)"),
    ("castore.groupcommit", "GroupCommit", "land", "GroupCommit.land (stage and write an append)"),
    ("castore.plumbing", "Batch", "entry", "Batch.entry (body and commit encoded, hashed)"),
    ("castore.plumbing", "Batch", "commit", "Batch.commit"),
    ("castore.history", "History", "advance", "History.advance (read hint, path facts)"),
    ("castore.groupcommit", "WriteBatch", "_land", "WriteBatch._land (a landing)"),
    ("castore.objectstore", "ObjectStore", "write_held", "ObjectStore.write_held (a landing's objects)"),
    ("castore.objectstore.packs", "", "encode_records_v2", "encode_records_v2 (final blocks)"),
    ("castore.objects", "Codec", "frame_block", "Codec.frame_block (zstd of a block)"),
    ("castore.groupcommit", "", "land_staged", "land_staged (a landing's ref files)"),
    ("castore.groupcommit", "WriteBatch", "__exit__", "WriteBatch.__exit__ (the last landing)"),
]


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    folder, store = sys.argv[1], sys.argv[2]
    shutil.rmtree(store, ignore_errors=True)
    import importlib

    from castore.cli.main import run

    spent: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for mod, owner, attr, label in STAGES:
        m = importlib.import_module(mod)
        where: Any = getattr(m, owner) if owner else m
        raw = where.__dict__[attr] if owner else getattr(where, attr)
        static = isinstance(raw, staticmethod)
        f = raw.__func__ if static else raw
        inside = [False]

        def timed(*a: Any, _f: Any = f, _label: str = label, _inside: list[bool] = inside, **k: Any) -> Any:
            if _inside[0]:
                return _f(*a, **k)
            _inside[0] = True
            t = time.thread_time()
            try:
                return _f(*a, **k)
            finally:
                spent[_label] += time.thread_time() - t
                calls[_label] += 1
                _inside[0] = False

        functools.update_wrapper(timed, f)
        setattr(where, attr, staticmethod(timed) if static else timed)
    t0, w0 = time.thread_time(), time.perf_counter()
    sys.argv = ["castore", "--store", store, "import", "claude", folder, "--jobs", "1"]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        run()
    main_cpu, wall = time.thread_time() - t0, time.perf_counter() - w0
    lines = calls[STAGES[2][3]] or 1
    print(f"{lines:,} lines, {calls[STAGES[0][3]]:,} files; main thread CPU {main_cpu:.2f} s "
          f"({main_cpu / lines * 1e6:.0f} us a line), process CPU {time.process_time():.2f} s, wall {wall:.2f} s")
    for label, s in spent.most_common():
        print(f"{s:7.3f} s {s / lines * 1e6:7.1f} us/line {calls[label]:8,} calls  {label}")


if __name__ == "__main__":
    main()
