"""Storage formats 1 (loose objects), 2 (packs) and 3 (packs, ref swaps journaled in the
writer's log: the default on local disk), side by side in one run.

    PYTHONPATH=. python scripts/bench_packs.py [--n 500] [--s3-n 40] [--markdown FILE]

Local disk, durable (fsync), one session per format, N appends of one ~500-byte message with
a state delta, alternated step by step with a durable SQLite insert of the same message
(WAL, synchronous=FULL), so the machine's noise hits all four alike. Counted per append:
new files, fsync + fdatasync calls (os.fsync and os.fdatasync are wrapped in this process),
time (median); at the end, disk use (allocated blocks) against the bytes stored (object
frames) and the raw message bytes. On S3 (moto on 127.0.0.1, from tests/s3server.py): the
HTTP requests per append, by method, read from moto's request log, after a warm-up append
(format 3 needs a storage that appends: S3 stores are format 2). Prints a markdown report on
stdout; ``--markdown FILE`` also writes it as a page (docs/benchmarks/BENCHMARKS-packs.md), with the durable
append against SQLite and, with ``--scale N``, the bytes-and-packs table.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib.fsize import stored_bytes  # noqa: E402

import castore  # noqa: E402

_WORDS = [f"w{i}" for i in range(2000)]
#: the local formats compared (3 is the default on local disk)
FORMATS = (1, 2, 3)
_fsyncs = {"n": 0}
_real_fsync, _real_fdatasync = os.fsync, os.fdatasync


def _count_fsync(fd: int) -> None:
    _fsyncs["n"] += 1
    _real_fsync(fd)


def _count_fdatasync(fd: int) -> None:
    _fsyncs["n"] += 1
    _real_fdatasync(fd)


os.fsync = _count_fsync  # type: ignore[assignment]
os.fdatasync = _count_fdatasync  # type: ignore[assignment]


def message(i: int, rng: random.Random) -> str:
    """About 500 bytes of Zipf-ish words (the docs/benchmarks/BENCHMARKS.md workload's shape)."""
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < 500:
        out.append(_WORDS[min(int(rng.paretovariate(1.1)) - 1, len(_WORDS) - 1)])
    return f"{i}: " + " ".join(out)


def files_and_blocks(root: str) -> tuple[int, int, int]:
    """(files, allocated bytes, apparent bytes) under ``root``."""
    n = alloc = size = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            st = os.stat(os.path.join(dirpath, f))
            n += 1
            alloc += st.st_blocks * 512
            size += st.st_size
    return n, alloc, size


def local(n: int) -> list[str]:
    tmp = tempfile.mkdtemp(prefix="bench-packs-")
    rng = random.Random(7)
    msgs = [message(i, rng) for i in range(n)]
    raw = sum(len(m.encode()) for m in msgs)
    roots = {f: os.path.join(tmp, f"f{f}") for f in FORMATS}
    stores = {f: castore.open(r, format=f) for f, r in roots.items()}
    sessions = {f: s.session("app", "u", "s") for f, s in stores.items()}
    db = sqlite3.connect(os.path.join(tmp, "sqlite.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, session TEXT, role TEXT, content TEXT, turn INTEGER)")
    times: dict[str, list[float]] = {f"format {f}": [] for f in FORMATS} | {"sqlite": []}
    fsyncs: dict[str, int] = {f"format {f}": 0 for f in FORMATS} | {"sqlite": 0}
    warm = min(20, n // 10)
    files_after_warm: dict[int, int] = {}
    for i, text in enumerate(msgs):
        role = "user" if i % 2 == 0 else "assistant"
        for f in FORMATS[i % len(FORMATS):] + FORMATS[:i % len(FORMATS)]:  # the order rotated
            before = _fsyncs["n"]
            t0 = time.perf_counter()
            sessions[f].append(castore.Message(role=role, content=text), state_delta={"turn": i, "topic": text[:8]})
            dt = time.perf_counter() - t0
            if i >= warm:
                times[f"format {f}"].append(dt)
                fsyncs[f"format {f}"] += _fsyncs["n"] - before
        before = _fsyncs["n"]
        t0 = time.perf_counter()
        db.execute("INSERT INTO m (session, role, content, turn) VALUES (?, ?, ?, ?)", ("s", role, text, i))
        dt = time.perf_counter() - t0
        if i >= warm:
            times["sqlite"].append(dt)
            fsyncs["sqlite"] += _fsyncs["n"] - before  # sqlite's own fsyncs are not Python calls: see note
        if i == warm - 1:
            files_after_warm = {f: files_and_blocks(r)[0] for f, r in roots.items()}
    measured = n - warm
    out = [f"### Local disk, durable, N = {n} appends (first {warm} not timed)", "",
           "| | files per append | fsyncs per append | median append | vs SQLite | disk / stored | stored / raw |",
           "|---|---|---|---|---|---|---|"]
    sql_med = statistics.median(times["sqlite"])
    for f in FORMATS:
        nfiles, alloc, _size = files_and_blocks(roots[f])
        stored = stored_bytes(roots[f])
        med = statistics.median(times[f"format {f}"])
        out.append(f"| format {f} | {(nfiles - files_after_warm[f]) / measured:.3f} | "
                   f"{fsyncs[f'format {f}'] / measured:.2f} | {med * 1000:.2f} ms | {med / sql_med:.1f}x | "
                   f"{alloc / stored:.1f}x | {stored / raw:.2f}x |")
    out.append(f"| SQLite (WAL, synchronous=FULL) | - | 1 (in C, not counted here) | {sql_med * 1000:.2f} ms "
               "| 1.0x | - | - |")
    # read back in a fresh handle
    for f in FORMATS:
        t0 = time.perf_counter()
        got = castore.open(roots[f]).session("app", "u", "s").messages()
        assert len(got) == n and got[-1].content == msgs[-1]
        ms = (time.perf_counter() - t0) * 1000
        out.append(f"\nformat {f}: read back {n} messages in a fresh handle in {ms:.0f} ms")
    for s in stores.values():
        s.close()
    return out


def _salad(rng: random.Random, size: int) -> str:
    """scripts/bench_session.py's ``text``: ~``size`` bytes of word salad (its storage workload)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_session import text

    return text(rng, size)


def scale(n: int, fmt: int = 2) -> list[str]:
    """Bytes and packs after ``n`` appends to one session of format ``fmt``, background repack
    on and off (local disk; format 2 not durable: its bytes do not depend on fsync; format 3
    durable, since only a durable swap writes a ref intent into the log). Two workloads: this script's
    Zipf messages (state delta {turn, topic}) and scripts/bench_session.py's storage workload
    (word salad, delta {turn, last_city}). Raw payload = the messages' content bytes (UTF-8),
    the definition both scripts use. Stored = every file under objects/ and packs/ (pack
    indexes included); refs and castore.json excluded. Every step's full state is checked
    reachable (``Session.verify``) before anything is measured; cold read = a fresh handle
    reading every message, in this process."""
    durable = fmt >= 3
    out = [f"### Bytes and packs at N = {n} appends (format {fmt}, local disk{', durable' if durable else ''})", "",
           "| workload | background repack | stored / raw | loose files | pack files | packs | "
           "new files per append | cold read |", "|---|---|---|---|---|---|---|---|"]
    for workload in ("zipf", "salad"):
        for auto in (True, False):
            tmp = tempfile.mkdtemp(prefix="bench-packs-scale-")
            root = os.path.join(tmp, "st")
            st = castore.open(root, format=fmt, durable=durable, auto_repack=auto)
            s = st.session("app", "u", "s")
            rng = random.Random(7)
            raw = 0
            for i in range(n):
                text = message(i, rng) if workload == "zipf" else _salad(rng, 500)
                raw += len(text.encode())
                delta = {"turn": i, "topic": text[:8]} if workload == "zipf" else {"turn": i, "last_city": text[:6]}
                s.append(castore.Message(role="user" if i % 2 == 0 else "assistant", content=text), state_delta=delta)
            st.close()
            fresh = castore.open(root)
            t0 = time.perf_counter()
            got = fresh.session("app", "u", "s").messages()
            cold = time.perf_counter() - t0
            assert len(got) == n
            assert fresh.session("app", "u", "s").verify()["commits"] == n  # every step's state reachable
            loose = sum(len(f) for _d, _s, f in os.walk(os.path.join(root, "objects")))
            pack_files = os.listdir(os.path.join(root, "packs"))
            stored = stored_bytes(root)
            out.append(f"| {workload} | {'on' if auto else 'off'} | {stored / raw:.3f}x | {loose} | "
                       f"{len(pack_files)} | {sum(1 for f in pack_files if f.endswith('.pack'))} | "
                       f"{(loose + len(pack_files)) / n:.4f} | {cold * 1000:.0f} ms |")
            fresh.close()
    return out


def s3(n: int) -> list[str]:
    import s3server

    server = s3server.start_moto_server()
    out = [f"### S3 (moto on 127.0.0.1), requests per append, {n} appends after one warm-up append", "",
           "| | requests per append | PUT | GET | HEAD | other |", "|---|---|---|---|---|---|"]
    try:
        for f in (1, 2):
            bucket = f"bench-packs-{f}"
            s3server.make_bucket(server.endpoint_url, bucket)
            st = castore.open(f"s3://{bucket}/store", format=f, **server.storage_options)
            s = st.session("app", "u", "s")
            s.append(castore.Message(role="user", content="warm-up"))
            start = os.path.getsize(server.log)
            rng = random.Random(3)
            for i in range(n):
                s.append(castore.Message(role="user", content=message(i, rng)), state_delta={"turn": i})
            time.sleep(0.3)  # let moto flush its log
            with open(server.log, errors="replace") as fh:
                fh.seek(start)
                lines = [ln for ln in fh if '" ' in ln and "HTTP/1." in ln]
            by = {m: sum(1 for ln in lines if f'"{m} ' in ln) for m in ("PUT", "GET", "HEAD")}
            other = len(lines) - sum(by.values())
            out.append(f"| format {f} | {len(lines) / n:.2f} | {by['PUT'] / n:.2f} | {by['GET'] / n:.2f} | "
                       f"{by['HEAD'] / n:.2f} | {other / n:.2f} |")
            st.close()
    finally:
        server.stop()
    return out


def local_ref_cost(n: int, fmt: int = 2) -> list[str]:
    """Where a durable append spends its time on local disk: the objects (format 2: one pack
    record, one fdatasync; format 3: the record, not synced), the ref swap (format 2: lock
    file written and fsynced, renamed, folder fsynced; format 3: the ref intent appended to
    the same log and fdatasynced, the ref file then written in place, not synced) and the rest (building commits,
    hashing), alternated with a durable SQLite insert of the same message. Medians over
    ``n`` appends after a warm-up."""
    tmp = tempfile.mkdtemp(prefix="bench-refcost-")
    rng = random.Random(11)
    msgs = [message(i, rng) for i in range(n)]
    st = castore.open(os.path.join(tmp, f"f{fmt}"), format=fmt)
    s = st.session("app", "u", "s")
    parts = {"objects": 0.0, "ref": 0.0}
    syncs = {"objects": 0, "ref": 0}

    def timed(name: str, fn):  # type: ignore[no-untyped-def]
        def run(*a, **kw):  # type: ignore[no-untyped-def]
            f0, t0 = _fsyncs["n"], time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                parts[name] += time.perf_counter() - t0
                syncs[name] += _fsyncs["n"] - f0
        return run

    st.objects.put_encoded = timed("objects", st.objects.put_encoded)  # type: ignore[method-assign]
    st.refs.swap = timed("ref", st.refs.swap)  # type: ignore[method-assign]
    db = sqlite3.connect(os.path.join(tmp, "sqlite.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, session TEXT, role TEXT, content TEXT, turn INTEGER)")
    rows: dict[str, list[float]] = {"append": [], "objects": [], "ref": [], "sqlite": []}
    nsync = {"objects": 0, "ref": 0}
    warm = min(20, n // 10)
    for i, text in enumerate(msgs):
        role = "user" if i % 2 == 0 else "assistant"
        for k in parts:
            parts[k], syncs[k] = 0.0, 0
        t0 = time.perf_counter()
        s.append(castore.Message(role=role, content=text), state_delta={"turn": i})
        dt = time.perf_counter() - t0
        t1 = time.perf_counter()
        db.execute("INSERT INTO m (session, role, content, turn) VALUES (?, ?, ?, ?)", ("s", role, text, i))
        dq = time.perf_counter() - t1
        if i >= warm:
            rows["append"].append(dt)
            rows["sqlite"].append(dq)
            for k in parts:
                rows[k].append(parts[k])
                nsync[k] += syncs[k]
    st.close()
    m = {k: statistics.median(v) * 1000 for k, v in rows.items()}
    measured = n - warm
    ref_how = "(lock file, rename, folder)" if fmt < 3 else "(intent in the log + fdatasync, ref written in place)"
    return [f"### Local disk, format {fmt}, durable: where an append's time goes (N = {n}, first {warm} not timed)",
            "", "| part | median | fsyncs per append |", "|---|---|---|",
            f"| objects: one pack record (put_encoded) | {m['objects']:.2f} ms | {nsync['objects'] / measured:.2f} |",
            f"| ref: compare-and-swap {ref_how} | {m['ref']:.2f} ms | "
            f"{nsync['ref'] / measured:.2f} |",
            f"| whole append | {m['append']:.2f} ms ({m['append'] / m['sqlite']:.1f}x SQLite) | "
            f"{(nsync['objects'] + nsync['ref']) / measured:.2f} |",
            f"| SQLite insert (WAL, synchronous=FULL) | {m['sqlite']:.2f} ms | 1 (in C, not counted) |"]


def durable_vs_sqlite(n: int) -> list[str]:
    """A durable append to a format-2 store, to a format-3 store (ref swaps journaled in the
    writer's log: one fdatasync per append) and a durable SQLite insert of the same message
    (WAL, synchronous=FULL), alternated step by step in one run so that the machine's noise
    hits the three alike. Medians and fsync + fdatasync calls per append, after a warm-up."""
    tmp = tempfile.mkdtemp(prefix="bench-walref-")
    rng = random.Random(13)
    msgs = [message(i, rng) for i in range(n)]
    sessions = {f: castore.open(os.path.join(tmp, f"f{f}"), format=f).session("app", "u", "s") for f in (2, 3)}
    db = sqlite3.connect(os.path.join(tmp, "sqlite.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE m (id INTEGER PRIMARY KEY, session TEXT, role TEXT, content TEXT, turn INTEGER)")
    times: dict[str, list[float]] = {"format 2": [], "format 3": [], "sqlite": []}
    syncs = {"format 2": 0, "format 3": 0}
    warm = min(20, n // 10)
    for i, text in enumerate(msgs):
        role = "user" if i % 2 == 0 else "assistant"
        order = (2, 3) if i % 2 == 0 else (3, 2)  # neither format always runs first
        for f in order:
            f0, t0 = _fsyncs["n"], time.perf_counter()
            sessions[f].append(castore.Message(role=role, content=text), state_delta={"turn": i})
            if i >= warm:
                times[f"format {f}"].append(time.perf_counter() - t0)
                syncs[f"format {f}"] += _fsyncs["n"] - f0
        t0 = time.perf_counter()
        db.execute("INSERT INTO m (session, role, content, turn) VALUES (?, ?, ?, ?)", ("s", role, text, i))
        if i >= warm:
            times["sqlite"].append(time.perf_counter() - t0)
    for s in sessions.values():
        s.store.close()
    measured = n - warm
    m = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return [f"### Durable append vs SQLite, alternated (local disk, N = {n}, first {warm} not timed)", "",
            "| | median | vs SQLite | fsyncs per append |", "|---|---|---|---|",
            f"| format 2 (ref: lock file fsync, rename, folder fsync) | {m['format 2']:.2f} ms | "
            f"{m['format 2'] / m['sqlite']:.2f}x | {syncs['format 2'] / measured:.2f} |",
            f"| format 3 (ref intent in the writer's log, one fdatasync) | {m['format 3']:.2f} ms | "
            f"{m['format 3'] / m['sqlite']:.2f}x | {syncs['format 3'] / measured:.2f} |",
            f"| SQLite insert (WAL, synchronous=FULL) | {m['sqlite']:.2f} ms | 1.00x | 1 (in C, not counted) |",
            "", f"load: {os.getloadavg()[0]:.2f}"]


def _page(body: list[str], argv: list[str], started: float, load_before: str) -> list[str]:
    """``body`` as a page of its own: the command, the commit, the machine and the load around it."""
    import platform
    import subprocess

    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    took = time.time() - started
    return ["# Benchmarks: storage formats 1, 2 and 3 on local disk and S3 (issue 17)", "",
            f"Written by `PYTHONPATH=. python scripts/bench_packs.py {' '.join(argv)}` at commit {commit}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, in {took / 60:.1f} minutes, on "
            f"{os.cpu_count()} cores ({platform.machine()}, Linux {platform.release()}); load average "
            f"{load_before} before the run, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after. "
            "Other sessions share the machine: absolute times are noisy, the systems are alternated "
            "append by append, so compare ratios within a table. Format 3 is the default for a new "
            "store on local disk, format 2 on S3 (docs/FORMAT.md). The module docstring of "
            "scripts/bench_packs.py says what each table measures.", ""] + body + [
            "", "Notes:",
            "- fsyncs are counted by wrapping os.fsync and os.fdatasync in the benchmark process; SQLite's "
            "fsync happens in C and is not counted (WAL with synchronous=FULL does one per commit).",
            "- disk / stored: allocated blocks against the bytes stored; format 1 puts every object in a file "
            "of its own (a 4 KB block each).", ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--s3-n", type=int, default=40)
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--ref-cost", action="store_true", help="only the split of a local append's time (objects, ref)")
    ap.add_argument("--scale", type=int, default=0, help="only the bytes-and-packs table at this N (e.g. 10000); "
                    "with --markdown: that table too")
    ap.add_argument("--format", type=int, default=2, choices=(2, 3),
                    help="the storage format of --scale's stores (3: durable, with ref intents)")
    ap.add_argument("--markdown", metavar="FILE",
                    help="also write everything as a page (e.g. docs/benchmarks/BENCHMARKS-packs.md): the formats "
                    "side by side, the durable append against SQLite, --scale's table if given")
    args = ap.parse_args()
    if args.ref_cost:
        print("\n".join(local_ref_cost(args.n) + [""] + local_ref_cost(args.n, fmt=3) + [""]
                        + durable_vs_sqlite(args.n)))
        return
    t0 = time.time()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.scale and not args.markdown:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        lines = [f"## Bytes and packs (scripts/bench_packs.py, {when})", ""]
        lines += scale(args.scale, args.format)
        lines += ["", f"run took {time.time() - t0:.0f} s; load: {os.getloadavg()[0]:.2f}"]
        print("\n".join(lines))
        return
    lines = ["## Formats 1, 2 and 3 side by side", ""] + local(args.n)
    if not args.no_s3:
        lines += [""] + s3(args.s3_n)
    if args.markdown:
        lines += ["", "## The durable append against SQLite", ""] + durable_vs_sqlite(args.n)
        if args.scale:
            lines += ["", "## Bytes and packs at scale", ""] + scale(args.scale, args.format)
    lines += ["", f"run took {time.time() - t0:.0f} s; load: {os.getloadavg()[0]:.2f}"]
    print("\n".join(lines))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(_page(lines[:-2], sys.argv[1:], t0, load_before)))


if __name__ == "__main__":
    main()
