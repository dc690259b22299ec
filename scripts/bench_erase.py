"""Erasure of an app with many users, and of one user, in a key store on local disk (durable);
and `castore erase` of one tenant holding many sessions, at two data sizes, in an encrypted store.

    .venv/bin/python -m compileall -q castore
    PYTHONPATH=. python scripts/bench_erase.py [--users 1000] [--rounds 3] [--sessions 1000] [--entries 5,50]

Each round makes a fresh key store in a temporary folder, creates one data key per user of
one app (plus the app's own scope, and one other app that must survive), then times
``KeyStore.erase(app)`` (every user of the app: one listing, to count them, one record, and
one delete, of the app key that wraps all their data keys), ``KeyStore.erase(other, user)``
(one user: one record, one delete), and ``KeyStore.sweep()`` (deleting the erased app's
users' key files, which nothing can open any more: tidiness, one delete per file). The
erasure touches only key files, whatever the size of the tenants' data, so no data is
written here. Prints the median and the worst round, in milliseconds.

Then the tenant: an encrypted store (``castore.open(path, encrypted=True)``) where one
tenant (app/user) holds ``--sessions`` sessions of E entries each, for each E of
``--entries``, next to another tenant that must survive. Each round copies the built store
and erases the tenant there as ``castore erase APP/USER --yes`` does (open the store, its
key store, ``erase``, ``sweep``), timed in process; once per size the command itself runs in
a new process (its wall time includes the interpreter and castore's imports). The time
should not move with E: the erasure deletes one key file and writes one record, whatever
the sessions hold. After each erasure the tenant's sessions must refuse to open
(TenantErased) and the other tenant must read unchanged.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import castore  # noqa: E402
from castore.crypto.keys import MasterKey  # noqa: E402
from castore.crypto.keystore import KeyStore  # noqa: E402
from castore.storage import open_storage  # noqa: E402


def one_round(users: int) -> tuple[float, float, float, int]:
    """Seconds to erase an app of ``users`` users, to erase one user, to sweep the erased
    app's key files afterwards; how many data keys the app's erasure made unreadable."""
    with tempfile.TemporaryDirectory(prefix="castore-bench-erase-") as tmp:
        storage = open_storage(str(Path(tmp) / "store"))
        ks = KeyStore.create(storage, MasterKey.from_text(MasterKey.new()))
        for i in range(users):
            ks.tenant_keys("app", f"user{i}", create=True)
        ks.tenant_keys("app", None, create=True)
        ks.tenant_keys("other", "alice", create=True)
        kept = ks.tenant_keys("other", "bob", create=True)
        t0 = time.perf_counter()
        [rec] = ks.erase("app")
        app_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ks.erase("other", "alice")
        user_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        swept = ks.sweep()
        sweep_s = time.perf_counter() - t0
        assert swept == rec.keys
        assert KeyStore.open(storage, ks.config, ks.wrapper).tenant_keys("other", "bob") == kept
        storage.close()
        return app_s, user_s, sweep_s, rec.keys


KEY = MasterKey.new()
TENANT, OTHER = ("app", "alice"), ("app", "bob")


def build_tenant(path: str, sessions: int, entries: int) -> int:
    """An encrypted store at ``path``: ``sessions`` sessions of ``entries`` entries for TENANT,
    one for OTHER; returns the bytes of TENANT's folder."""
    with castore.open(path, encrypted=True, master_key=KEY, durable=False) as st:
        for i in range(sessions):
            st.session(*TENANT, f"s{i}").append_many(
                [castore.Message(role="user" if j % 2 == 0 else "assistant", content=f"turn {j} of session {i}: "
                                 + "the weather in the valley is sunny with a light breeze " * 6)
                 for j in range(entries)])
        st.session(*OTHER, "kept").append(castore.Message(role="user", content="still here"))
    home = Path(path) / "tenants" / TENANT[0] / TENANT[1]
    assert home.is_dir(), home
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(home) for f in fs)


def erase_tenant(path: str) -> tuple[float, float]:
    """What ``castore erase APP/USER --yes`` does on the store at ``path``, checked after:
    (seconds to open the store and its key store, seconds of ``erase`` + ``sweep``)."""
    t0 = time.perf_counter()
    with castore.open(path) as st:
        ks = KeyStore.of_store(st.storage, st.config, None)
        t1 = time.perf_counter()
        ks.erase(*TENANT)
        ks.sweep()
        t2 = time.perf_counter()
        ks.close()
    check_erased(path)
    return t1 - t0, t2 - t1


def check_erased(path: str) -> None:
    with castore.open(path, master_key=KEY) as st:
        try:
            st.session(*TENANT, "s0").messages()
        except castore.TenantErased:
            pass
        else:
            raise AssertionError("the erased tenant still reads")
        assert st.session(*OTHER, "kept").messages()[0].content == "still here"


def erase_cli(path: str) -> float:
    """Wall seconds of ``castore --store PATH erase APP/USER --yes`` in a new process."""
    exe = Path(sys.executable).with_name("castore")
    t0 = time.perf_counter()
    subprocess.run([str(exe), "--store", path, "erase", "/".join(TENANT), "--yes"], check=True, capture_output=True)
    dt = time.perf_counter() - t0
    check_erased(path)
    return dt


def tenant_bench(sessions: int, sizes: list[int], rounds: int) -> None:
    """Erase one tenant of ``sessions`` sessions at each entry count of ``sizes``; prints a table."""
    with tempfile.TemporaryDirectory(prefix="castore-bench-erase-") as tmp:
        built = {}
        for e in sizes:
            t0 = time.perf_counter()
            built[e] = build_tenant(str(Path(tmp) / f"built-{e}"), sessions, e)
            print(f"built {sessions} sessions x {e} entries of {'/'.join(TENANT)}: {built[e] / 1e6:.2f} MB "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        times: dict[int, list[tuple[float, float]]] = {e: [] for e in sizes}
        for r in range(rounds):
            for e in (sizes if r % 2 == 0 else sizes[::-1]):
                work = str(Path(tmp) / f"r{r}-{e}")
                shutil.copytree(Path(tmp) / f"built-{e}", work)
                times[e].append(erase_tenant(work))
                shutil.rmtree(work)
        exe = str(Path(sys.executable).with_name("castore"))
        t0 = time.perf_counter()
        subprocess.run([exe, "--version"], check=True, capture_output=True)
        bare = (time.perf_counter() - t0) * 1e3
        cli = {}
        for e in sizes:
            work = str(Path(tmp) / f"cli-{e}")
            shutil.copytree(Path(tmp) / f"built-{e}", work)
            cli[e] = erase_cli(work) * 1e3
        print(f"\nerase one tenant ({'/'.join(TENANT)}) of {sessions} sessions, encrypted store on local disk, "
              f"durable ({rounds} rounds, sizes alternated):")
        print("| sessions x entries | tenant's bytes | erase + sweep: median | worst | open the store and "
              "key store: median | `castore erase` (new process, wall) |")
        print("|---|---:|---:|---:|---:|---:|")
        for e in sizes:
            er = [x[1] * 1e3 for x in times[e]]
            op = [x[0] * 1e3 for x in times[e]]
            print(f"| {sessions:,} x {e} | {built[e] / 1e6:.2f} MB | {statistics.median(er):.1f} ms | "
                  f"{max(er):.1f} ms | {statistics.median(op):.1f} ms | {cli[e]:.0f} ms |")
        print(f"(`castore --version` in a new process, for scale: {bare:.0f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=1000, help="sessions of the erased tenant (0: leave it out)")
    ap.add_argument("--entries", default="5,50", help="entries per session, comma-separated: one build each")
    args = ap.parse_args()
    results = [one_round(args.users) for _ in range(args.rounds)]
    apps = [r[0] * 1000 for r in results]
    ones = [r[1] * 1000 for r in results]
    sweeps = [r[2] * 1000 for r in results]
    print(f"erase an app of {args.users} users ({results[0][3]} data keys), local disk, durable:"
          f" median {statistics.median(apps):.1f} ms, worst {max(apps):.1f} ms ({args.rounds} rounds)")
    print(f"erase one user: median {statistics.median(ones):.1f} ms, worst {max(ones):.1f} ms")
    print(f"sweep the erased app's {results[0][3]} key files afterwards: median {statistics.median(sweeps):.0f} ms,"
          f" worst {max(sweeps):.0f} ms")
    if args.sessions:
        tenant_bench(args.sessions, [int(x) for x in args.entries.split(",")], args.rounds)


if __name__ == "__main__":
    main()
