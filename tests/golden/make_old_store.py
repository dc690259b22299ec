"""Build the store in ``tests/golden/store-before-plumbing.tar.gz`` and print what it holds.

The archive is a local store written by castore *before* the plumbing layer
(``castore/branches.py``) existed: ``tests/test_branches.py`` checks that the current code
reads it identically and that ``castore fsck`` finds it clean. Re-make it only with the old
code (the commit before the plumbing layer)::

    PYTHONPATH=<checkout of the old code> python tests/golden/make_old_store.py OUT_DIR > expected.json
    tar -C OUT_DIR -czf tests/golden/store-before-plumbing.tar.gz store

It holds what the plumbing layer rewrote: hashed (long) branch and label names, a detached
HEAD, app and user state, a fork, a path longer than one segment block, session info.
"""

from __future__ import annotations

import json
import os
import sys

import castore

LONG = "ветка-" * 40
LONG_LABEL = "метка-" * 40


def build(url: str) -> dict:
    store = castore.open(url)
    s = store.session("app", "alice", "s1")
    for i in range(70):
        s.append(castore.Message(role="user" if i % 2 == 0 else "assistant", content=f"turn {i}"),
                 state_delta={"n": i, "app:seen": i, "user:last": f"t{i}"})
    s.branch(LONG, at="HEAD~3")
    s.checkout(LONG)
    s.append(castore.Message(role="user", content="on the long branch"))
    s.label("HEAD~1", LONG_LABEL)
    s.label("main", "v1")
    s.set_info({"title": "before plumbing"})
    s.fork("s2", at="main~10")
    d = store.session("app", "bob", "detached")
    d.append(castore.Message(role="user", content="one"))
    d.append(castore.Message(role="user", content="two"))
    d.checkout("HEAD~1")
    return describe(store)


def describe(store: castore.Store) -> dict:
    """What a reader sees: the same code runs on the old and the new castore."""
    out: dict = {"sessions": []}
    for info in sorted(store.sessions("app"), key=lambda i: (i.user, i.session)):
        s = store.session(info.app, info.user, info.session)
        out["sessions"].append({
            "key": [info.app, info.user, info.session],
            "head": s.head,
            "branch": s.current_branch,
            "branches": s.branches(),
            "labels": s.labels(),
            "messages": [m.content for m in s.messages()],
            "state": s.state(),
            "info": s.info,
            "listed": [info.head, info.branch, info.entries],
            "log_all": [e.id for e in s.log(all_branches=True)],
        })
    return out


if __name__ == "__main__":
    root = sys.argv[1]
    print(json.dumps(build(os.path.join(root, "store")), indent=1, sort_keys=True, ensure_ascii=False))
