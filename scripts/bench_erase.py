"""Erasure of an app with many users, and of one user, in a key store on local disk (durable).

    PYTHONPATH=. python scripts/bench_erase.py [--users 1000] [--rounds 3]

Each round makes a fresh key store in a temporary folder, creates one data key per user of
one app (plus the app's own scope, and one other app that must survive), then times
``KeyStore.erase(app)`` (every user of the app: one listing, to count them, one record, and
one delete, of the app key that wraps all their data keys), ``KeyStore.erase(other, user)``
(one user: one record, one delete), and ``KeyStore.sweep()`` (deleting the erased app's
users' key files, which nothing can open any more: tidiness, one delete per file). The
erasure touches only key files, whatever the size of the tenants' data, so no data is
written here. Prints the median and the worst round, in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
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


if __name__ == "__main__":
    main()
