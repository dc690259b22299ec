#!/usr/bin/env python
"""Session cost benchmark (not a test): prints tables and exits 0.

1. Append: time and bytes per append, first vs last 10% of N appends (durable, local disk).
2. Storage: T turns of ~500-byte messages, each with a state delta: stored object bytes and
   disk usage against the raw payload (the messages' content bytes), every step's state
   reachable (verified).
3. Fork, branch, checkout, label: time and bytes at a short and a long session.
4. Reads (``--only reads``): castore's bytecode is compiled first (as an install does);
   ``import castore`` in fresh interpreters against ``python -c pass``; what opening a
   local store and reading a short session imports, against msgspec + blake3 + zstandard
   (castore's floor); a cold read of N entries (messages and state, import included, a new process each) on
   format 1 and format 2 against parsing the same entries from a Pi-style JSONL file and
   walking their parent ids (scripts/benchlib/cold.py's children); fork at the middle and
   the state at the middle (fresh handle) at a short and a long session, also while another
   writer holds an unsealed log (format 2). Alternated, one run.

Usage: .venv/bin/python scripts/bench_session.py [--appends 5000] [--turns 1600] [--dir DIR]
       .venv/bin/python scripts/bench_session.py --only reads [--read-n 100,10000] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import castore
from castore import Event, Message

_WORDS = (
    "the weather in beijing is sunny with a light breeze and temperatures around twenty degrees "
    "tomorrow expect rain later in the week please bring an umbrella when you go out the forecast "
    "model says humidity will rise pressure falls wind from the north east clouds gather evening"
).split()


def text(rng: random.Random, size: int) -> str:
    """About ``size`` bytes of word salad (compresses like prose, not like random bytes)."""
    out: list[str] = []
    n = 0
    while n < size:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:size]


def tree_size(root: str, sub: str = "objects") -> tuple[int, int, int]:
    """(sum of file sizes, disk usage in bytes from st_blocks, file count) under root/sub."""
    total = blocks = files = 0
    for dirpath, _dirs, names in os.walk(os.path.join(root, sub)):
        for name in names:
            st = os.stat(os.path.join(dirpath, name))
            total += st.st_size
            blocks += st.st_blocks * 512
            files += 1
    return total, blocks, files


def bench_append(workdir: str, n: int) -> tuple[castore.Session, str]:
    url = os.path.join(workdir, "append")
    rng = random.Random(1)
    st = castore.open(url)
    s = st.session("bench", "u", "s")
    tenth = max(1, n // 10)
    times: list[float] = []
    sizes: dict[int, int] = {0: 0}
    for i in range(n):
        e = Event(author="agent", message=Message(role="user" if i % 2 else "assistant", content=text(rng, 500)),
                  state_delta={"turn": i, "topic": rng.choice(_WORDS)})
        t0 = time.perf_counter()
        s.append(e)
        times.append(time.perf_counter() - t0)
        if i + 1 in (tenth, n - tenth, n):
            sizes[i + 1] = tree_size(url)[0]
    first, last = times[:tenth], times[-tenth:]
    print(f"\n## Append ({n} appends, durable, local disk)")
    print("| window | median ms/append | mean ms/append | bytes written/append |")
    print("|---|---|---|---|")
    print(f"| first 10% | {statistics.median(first) * 1e3:.2f} | {statistics.mean(first) * 1e3:.2f} | "
          f"{sizes[tenth] / tenth:.0f} |")
    print(f"| last 10% | {statistics.median(last) * 1e3:.2f} | {statistics.mean(last) * 1e3:.2f} | "
          f"{(sizes[n] - sizes[n - tenth]) / tenth:.0f} |")
    return s, url


def bench_storage(workdir: str, turns: int, wide: bool = False) -> None:
    """``wide``: the state also keeps 20 rotating 40-byte notes (a 22-key state rewritten each step)."""
    url = os.path.join(workdir, "storage-wide" if wide else "storage")
    rng = random.Random(2)
    st = castore.open(url, durable=False)
    s = st.session("bench", "u", "s")
    raw = 0
    for i in range(turns):
        content = text(rng, 500)
        raw += len(content.encode())
        s.append(Event(author="user" if i % 2 else "agent",
                       message=Message(role="user" if i % 2 else "assistant", content=content),
                       state_delta={"turn": i, "last_city": rng.choice(_WORDS),
                                    **({f"note{i % 20}": content[:40]} if wide else {})}))
    report = s.verify()  # every step's snapshot is stored and equals the replay
    assert report["commits"] == turns
    ids = [e.id for e in s.entries()]
    for i in (0, turns // 2, turns - 1):
        assert s.state(ids[i], scopes=False)["turn"] == i
    size, blocks, files = tree_size(url)
    refs, ref_blocks, _ = tree_size(url, "refs")
    kinds: dict[str, list[int]] = {}
    for oid in st.objects.iter_ids():
        obj = st.objects.get(oid)
        kinds.setdefault(type(obj).__name__, []).append(os.path.getsize(os.path.join(url, "objects", oid[:2], oid[2:])))
    shape = "a 22-key state: turn, last_city, 20 rotating notes" if wide else "delta {turn, last_city}"
    print(f"\n## Storage ({turns} turns of ~500-byte messages, {shape})")
    print("| measure | bytes | / raw payload |")
    print("|---|---|---|")
    print(f"| raw payload (message content) | {raw:,} | 1.00 |")
    print(f"| stored objects (sum of sizes, {files} files) | {size:,} | {size / raw:.2f} |")
    print(f"| disk usage of objects (st_blocks) | {blocks:,} | {blocks / raw:.2f} |")
    print(f"| refs (sum of sizes / disk usage) | {refs:,} / {ref_blocks:,} | |")
    print("\n| object kind | count | bytes | / raw payload |")
    print("|---|---|---|---|")
    for kind, sz in sorted(kinds.items()):
        print(f"| {kind} | {len(sz)} | {sum(sz):,} | {sum(sz) / raw:.2f} |")


def bench_ops(s: castore.Session, url: str, label: str) -> list[str]:
    rows = []
    root = url

    def measure(name: str, fn, reps: int = 10) -> None:
        before = sum(tree_size(root, sub)[0] for sub in ("objects", "refs"))
        t0 = time.perf_counter()
        for r in range(reps):
            fn(r)
        dt = (time.perf_counter() - t0) / reps
        after = sum(tree_size(root, sub)[0] for sub in ("objects", "refs"))
        rows.append(f"| {label} | {name} | {dt * 1e3:.2f} | {(after - before) / reps:.0f} |")

    tag = str(int(time.time() * 1000))
    measure("branch at HEAD~10", lambda r: s.branch(f"b{tag}{r}", at="HEAD~10"))
    measure("label at HEAD~5", lambda r: s.label("HEAD~5", f"l{tag}{r}"))
    measure("fork at HEAD", lambda r: s.fork(f"f{tag}{r}"))
    measure("checkout branch / main", lambda r: s.checkout(f"b{tag}{r}" if r % 2 == 0 else "main"))
    s.checkout("main")
    return rows


_IMPORT_ONLY = """import time; _t0 = time.perf_counter(); _c0 = time.process_time()
import castore
print('{"ms": %r, "cpu_ms": %r}' % ((time.perf_counter() - _t0) * 1e3, (time.process_time() - _c0) * 1e3))
"""
_PASS = "print('{}')"
#: open a local store and read a short session (messages and state): what a cold reader
#: imports beyond ``import castore``, the read itself costing little at N = 100
_OPEN_READ = """import time; _t0 = time.perf_counter(); _c0 = time.process_time()
import sys
import castore
s = castore.open(sys.argv[1]).session("bench", "u", "s"); s.messages(); s.state()
print('{"ms": %r, "cpu_ms": %r, "modules": %d}' % ((time.perf_counter() - _t0) * 1e3,
      (time.process_time() - _c0) * 1e3, len(sys.modules)))
"""
#: the third-party modules castore cannot read without: its floor
_FLOOR = """import time; _t0 = time.perf_counter(); _c0 = time.process_time()
import msgspec, blake3, zstandard
import sys
print('{"ms": %r, "cpu_ms": %r, "modules": %d}' % ((time.perf_counter() - _t0) * 1e3,
      (time.process_time() - _c0) * 1e3, len(sys.modules)))
"""


def compile_castore() -> None:
    """Compile castore's bytecode once, as installing the package does. Without it (a fresh
    checkout, or PYTHONDONTWRITEBYTECODE set) every child would compile castore from source,
    which no installed castore pays."""
    import compileall

    compileall.compile_dir(os.path.dirname(os.path.abspath(castore.__file__)), quiet=1)


def bench_open_read_imports(url: str, n: int, reps: int) -> None:
    """What opening a local store and reading a short session imports, in fresh interpreters:
    against ``import castore`` alone and against msgspec + blake3 + zstandard (castore's floor)."""
    from benchlib import cold

    print(f"\n## Open + read imports (fresh interpreters, alternated; best / median of {reps * 2})")
    read = f"open a local store + read N = {n:,} (messages, state)"
    runs: dict[str, list[dict[str, float]]] = {"import castore": [], "msgspec + blake3 + zstandard": [], read: []}
    for _ in range(reps * 2):
        runs["import castore"].append(cold.run(_IMPORT_ONLY, []))
        runs["msgspec + blake3 + zstandard"].append(cold.run(_FLOOR, []))
        runs[read].append(cold.run(_OPEN_READ, [url]))
    print("| in a fresh process | wall ms | CPU ms | modules loaded |")
    print("|---|---|---|---|")
    for k, xs in runs.items():
        mods = xs[0].get("modules", "-")
        print(f"| {k} | {_best_med([x['ms'] for x in xs])} | {_best_med([x['cpu_ms'] for x in xs])} | {mods} |")


def _build_reads(workdir: str, n: int) -> dict[str, object]:
    """A castore store per format and a Pi JSONL file with the same N steps (benchlib's workload)."""
    import json

    from benchlib.workload import pi_line, steps

    out: dict[str, object] = {}
    work = steps(n)
    for fmt in (1, 2):
        url = os.path.join(workdir, f"reads-f{fmt}-{n}")
        with castore.open(url, durable=False, format=fmt) as st:
            s = st.session("bench", "u", "s")
            out[f"ids{fmt}"] = [s.append(Message(role=w.role, content=w.content), state_delta=w.delta) for w in work]
        out[f"url{fmt}"] = url
    path = os.path.join(workdir, f"reads-pi-{n}.jsonl")
    rng = random.Random(n)
    parent = None
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({"type": "session", "version": 3, "id": f"bench-{n}", "cwd": "/bench"}) + "\n")
        for w in work:
            eid = f"{rng.getrandbits(32):08x}"
            f.write(pi_line(w, eid, parent))
            parent = eid
    out["pi"] = path
    return out


def _best_med(xs: list[float]) -> str:
    return f"{min(xs):.1f} / {statistics.median(xs):.1f}"


def bench_reads(workdir: str, sizes: list[int], reps: int) -> None:
    """Import time, cold reads against Pi JSONL, fork and state at the middle (see the module doc)."""
    from benchlib import cold

    compile_castore()
    print(f"\n## Import (fresh interpreters, alternated; best / median of {reps * 2})")
    walls: dict[str, list[float]] = {"python -c pass": [], "import castore": []}
    inner: list[float] = []
    cpu: list[float] = []
    for _ in range(reps * 2):
        walls["python -c pass"].append(cold.run(_PASS, [])["wall_ms"])
        got = cold.run(_IMPORT_ONLY, [])
        walls["import castore"].append(got["wall_ms"])
        inner.append(got["ms"])
        cpu.append(got["cpu_ms"])
    print("| measure | ms (best / median) |")
    print("|---|---|")
    print(f"| `python -c pass`, process wall | {_best_med(walls['python -c pass'])} |")
    print(f"| `python -c 'import castore'`, process wall | {_best_med(walls['import castore'])} |")
    print(f"| `import castore` inside the process (wall) | {_best_med(inner)} |")
    print(f"| `import castore` inside the process (CPU time) | {_best_med(cpu)} |")
    builds = {n: _build_reads(workdir, n) for n in sizes}
    bench_open_read_imports(str(builds[min(sizes)]["url2"]), min(sizes), reps)
    print(f"\n## Cold read (new process each, import included; best / median of {reps}, alternated)")
    print("CPU: the child's whole CPU time (user + system, interpreter start included, the same for all), "
          "steadier than wall time on a loaded machine.\n")
    print("| N | castore format 1 ms | format 2 ms | Pi JSONL ms | format 1 / Pi | format 2 / Pi "
          "| CPU f1 / Pi | CPU f2 / Pi |")
    print("|---|---|---|---|---|---|---|---|")
    for n, b in builds.items():
        t: dict[str, list[float]] = {"1": [], "2": [], "pi": []}
        c: dict[str, list[float]] = {"1": [], "2": [], "pi": []}

        def timed(key: str, code: str, argv: list[str], n: int = n, t: dict[str, list[float]] = t,
                  c: dict[str, list[float]] = c) -> None:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            got = cold.run(code, argv)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            assert got["n"] == n and got["turn"] == n - 1, got
            t[key].append(got["ms"])
            c[key].append((r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) * 1e3)

        for _ in range(reps):
            for fmt in ("1", "2"):
                timed(fmt, cold.CASTORE, [str(b[f"url{fmt}"]), "{}", "bench", "u", "s"])
            timed("pi", cold.PI, [str(b["pi"])])
        pi, cpi = statistics.median(t["pi"]), statistics.median(c["pi"])
        print(f"| {n:,} | {_best_med(t['1'])} | {_best_med(t['2'])} | {_best_med(t['pi'])} | "
              f"{statistics.median(t['1']) / pi:.2f}x | {statistics.median(t['2']) / pi:.2f}x | "
              f"{statistics.median(c['1']) / cpi:.2f}x | {statistics.median(c['2']) / cpi:.2f}x |")
    print(f"\n## CLI startup (process wall, spawn to exit; best / median of {reps}, alternated)")
    small = builds[min(sizes)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmds = {"`python -c pass`": [sys.executable, "-c", "pass"],
            "`castore --help`": [sys.executable, "-m", "castore", "--help"],
            f"`castore log` (N = {min(sizes):,}, format 1)": [sys.executable, "-m", "castore", "--store",
                                                               str(small["url1"]), "log", "-s", "bench/u/s"]}
    cli: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(reps):
        for k, argv in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(argv, check=True, capture_output=True, env=env, cwd=workdir)
            cli[k].append((time.perf_counter() - t0) * 1e3)
    print("| command | ms (best / median) |")
    print("|---|---|")
    for k, xs in cli.items():
        print(f"| {k} | {_best_med(xs)} |")
    print(f"\n## Fork and state at the middle (fresh handle each; best / median of {reps})")
    print("| N | format | fork at the middle ms | state at the middle ms |")
    print("|---|---|---|---|")
    per: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
    for n, b in builds.items():
        for fmt in ("1", "2"):
            ids = b[f"ids{fmt}"]
            assert isinstance(ids, list)
            mid = ids[n // 2]
            forks: list[float] = []
            states: list[float] = []
            for r in range(reps):
                with castore.open(str(b[f"url{fmt}"])) as st:
                    s = st.session("bench", "u", "s")
                    t0 = time.perf_counter()
                    f = s.fork(f"fork-{r}", at=mid)
                    forks.append((time.perf_counter() - t0) * 1e3)
                    assert f.head == mid
                with castore.open(str(b[f"url{fmt}"])) as st:
                    s = st.session("bench", "u", "s")
                    t0 = time.perf_counter()
                    state = s.state(mid, scopes=False)
                    states.append((time.perf_counter() - t0) * 1e3)
                assert state["turn"] == n // 2
            per[(fmt, n)] = (forks, states)
            print(f"| {n:,} | {fmt} | {_best_med(forks)} | {_best_med(states)} |")
    lo, hi = min(sizes), max(sizes)
    if lo != hi:
        for fmt in ("1", "2"):
            f_lo, s_lo = per[(fmt, lo)]
            f_hi, s_hi = per[(fmt, hi)]
            print(f"\nformat {fmt}: N = {hi:,} against N = {lo:,} (medians): fork "
                  f"{statistics.median(f_hi) / statistics.median(f_lo):.2f}x, state "
                  f"{statistics.median(s_hi) / statistics.median(s_lo):.2f}x")
    bench_state_with_live_writer(builds, reps)


def bench_state_with_live_writer(builds: dict[int, dict[str, object]], reps: int, appends: int = 800) -> None:
    """State at the middle of each format-2 session (fresh handle each) while another writer
    holds an unsealed log of ``appends`` entries of another session (not yet indexed)."""
    from benchlib.workload import step

    print(f"\n## State at the middle while another writer holds a live log (format 2, fresh handle each; "
          f"best / median of {reps})")
    print("| N | live log bytes | state at the middle ms |")
    print("|---|---|---|")
    per: dict[int, list[float]] = {}
    for n, b in builds.items():
        url = str(b["url2"])
        ids = b["ids2"]
        assert isinstance(ids, list)
        mid = ids[n // 2]
        with castore.open(url, durable=False, auto_repack=False) as writer:
            other = writer.session("bench", "u", f"live-{n}")
            for i in range(appends):
                w = step(i)
                other.append(Message(role=w.role, content=w.content), state_delta=w.delta)
            folder = os.path.join(url, "packs")
            live = [f for f in os.listdir(folder) if f.startswith("w-") and f.endswith(".pack")
                    and not os.path.exists(os.path.join(folder, f[:-5] + ".idx"))]
            assert len(live) == 1, live  # the writer's log, not sealed yet
            size = os.path.getsize(os.path.join(folder, live[0]))
            times: list[float] = []
            for _ in range(reps):
                with castore.open(url) as st:
                    t0 = time.perf_counter()
                    state = st.session("bench", "u", "s").state(mid, scopes=False)
                    times.append((time.perf_counter() - t0) * 1e3)
                assert state["turn"] == n // 2
        per[n] = times
        print(f"| {n:,} | {size:,} | {_best_med(times)} |")
    lo, hi = min(per), max(per)
    if lo != hi:
        print(f"\nN = {hi:,} against N = {lo:,} (medians): "
              f"{statistics.median(per[hi]) / statistics.median(per[lo]):.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--appends", type=int, default=5000)
    ap.add_argument("--turns", type=int, default=1600)
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--only", choices=("all", "writes", "reads"), default="all",
                    help="writes: sections 1-3; reads: section 4 (default: all)")
    ap.add_argument("--read-n", default="100,10000", help="session lengths of section 4 (comma-separated)")
    ap.add_argument("--reps", type=int, default=7, help="repetitions of each read in section 4")
    args = ap.parse_args()
    workdir = args.dir or tempfile.mkdtemp(prefix="castore-bench-")
    try:
        print(f"# castore session benchmark (K={castore.history.K}, python {sys.version.split()[0]})")
        if args.only in ("all", "reads"):
            bench_reads(workdir, [int(x) for x in args.read_n.split(",")], args.reps)
        if args.only == "reads":
            return 0
        long_s, long_url = bench_append(workdir, args.appends)
        bench_storage(workdir, args.turns)
        bench_storage(workdir, args.turns, wide=True)
        short_url = os.path.join(workdir, "short")
        short = castore.open(short_url).session("bench", "u", "s")
        rng = random.Random(3)
        for i in range(100):
            short.append(Message(role="user", content=text(rng, 500)), state_delta={"turn": i})
        print("\n## Fork, branch, checkout, label (durable, local disk; mean of 10)")
        print("| session length | operation | ms | bytes written |")
        print("|---|---|---|---|")
        for row in bench_ops(short, short_url, "N=100") + bench_ops(long_s, long_url, f"N={args.appends}"):
            print(row)
    finally:
        if args.dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
