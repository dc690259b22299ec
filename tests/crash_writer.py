"""A child process for the reliability tests: appends to one session, or holds a ref lock.

Usage::

    python crash_writer.py append URL APP/USER/SESSION PREFIX START COUNT [OPTIONS_JSON]
    python crash_writer.py hold-lock ROOT REF_KEY
    python crash_writer.py churn URL APP/USER PREFIX ROUNDS [OPTIONS_JSON]

``append`` prints ``ready`` once the store is open, then ``<i> <commit id>`` after each
append returns (flushed at once, so a parent that kills this process knows every append
that was acknowledged), then ``done``, and ``lost_races <n>`` on stderr (the compare-and-swaps
it lost and retried). Entry ``i`` is the message ``PREFIX-i``. ``OPTIONS_JSON`` goes to
``castore.open``, except ``"retry"``: the fields of the writer's
:class:`~castore.retry.RetryPolicy`.

``churn`` makes garbage for gc races: each round appends a few entries to a new session
(``PREFIX-<round>``) and deletes that session; it prints ``done`` at the end.

``hold-lock`` takes a local ref's lock the way a writer does, prints ``locked`` and
waits to be killed.
"""

from __future__ import annotations

import json
import sys
import time


def append(url: str, key: str, prefix: str, start: int, count: int, options: dict) -> None:
    import castore
    from castore.retry import RetryPolicy

    lost = [0]

    class CountingPolicy(RetryPolicy):
        """The retry policy the run asked for, counting the lost compare-and-swaps."""

        def delay(self, attempt: int) -> float:
            lost[0] += 1  # called once after each lost race
            return super().delay(attempt)

    options = dict(options)
    policy = CountingPolicy(**options.pop("retry", {}))  # RetryPolicy's fields; its defaults otherwise
    app, user, sid = key.split("/")
    store = castore.open(url, **options)
    store.plumbing.policy = policy
    session = store.session(app, user, sid)
    print("ready", flush=True)
    for i in range(start, start + count):
        cid = session.append(castore.Message(role="user", content=f"{prefix}-{i}"))
        sys.stdout.write(f"{i} {cid}\n")
        sys.stdout.flush()
    print("done", flush=True)
    sys.stderr.write(f"lost_races {lost[0]}\n")
    store.close()


def churn(url: str, key: str, prefix: str, rounds: int, options: dict) -> None:
    import castore

    app, user = key.split("/")
    store = castore.open(url, **options)
    print("ready", flush=True)
    for r in range(rounds):
        session = store.session(app, user, f"{prefix}-{r}")
        session.append_many([castore.Message(role="user", content=f"{prefix} {r} {i} " + "z" * (r % 7) * 900)
                             for i in range(3)])
        store.delete_session(app, user, f"{prefix}-{r}")
    print("done", flush=True)
    store.close()


def hold_lock(root: str, ref_key: str) -> None:
    from castore.storage.local import LocalStorage

    st = LocalStorage(root)
    st._lock(st._path(ref_key))
    print("locked", flush=True)
    while True:
        time.sleep(60)


def main(argv: list[str]) -> None:
    if argv[0] == "append":
        opts = json.loads(argv[6]) if len(argv) > 6 else {}
        append(argv[1], argv[2], argv[3], int(argv[4]), int(argv[5]), opts)
    elif argv[0] == "churn":
        churn(argv[1], argv[2], argv[3], int(argv[4]), json.loads(argv[5]) if len(argv) > 5 else {})
    elif argv[0] == "hold-lock":
        hold_lock(argv[1], argv[2])
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
