"""The tenant layout (docs/FORMAT.md 2): each (app, user) in a complete store of its own under
``tenants/<app>/<user>/``.

The session conformance suite (tests/test_session.py) runs again here on tenant-layout stores
(local, memory, S3 on moto); then what only the layout promises: every byte of a tenant under
its prefix, the listing of tenants, a layout fixed at creation, a child storage per backend.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from conftest import TENANT_BACKENDS, backend_on
from test_session import *  # noqa: F403 - the session suite, run again on tenant-layout stores
from test_session import (
    ev,
    test_a_turn_that_fails_to_land_leaves_the_branch_as_it_was,
    test_append_many_moves_the_ref_once,
    test_identical_message_bodies_are_stored_once,
)

import castore
from castore import Message

backend = backend_on(*TENANT_BACKENDS)

# These count the requests of a flat store's root storage, which a tenant-layout store does
# not write to (its tenants' stores do): their flat variants run in test_session.py.
del test_a_turn_that_fails_to_land_leaves_the_branch_as_it_was, test_append_many_moves_the_ref_once
# Shares a body between two users: the layout keeps it once per tenant (see below).
del test_identical_message_bodies_are_stored_once


# -- what only the tenant layout promises ------------------------------------------------------
def _keys(st: castore.Store) -> set[tuple[str, bytes | None]]:
    """Every key with its bytes: a change shows as a new pair, in place or not."""
    return set(st.storage.read_many(st.storage.list("")).items())


def test_a_tenants_bytes_are_all_under_its_prefix(store: castore.Store) -> None:
    alice = store.session("app", "alice", "s1")
    alice.append(ev(0, **{"app:seen": 1, "user:lang": "en"}))
    store.session("app", "bob", "s1").append(Message(role="user", content="bob's"))
    before = _keys(store)
    alice.append(Message(role="user", content="alice again " * 300))  # a large body: a loose object too
    alice.branch("b2")
    alice.fork("s2")
    changed = _keys(store) - before
    assert changed and all(k.startswith("tenants/app/alice/") for k, _ in changed)
    before = _keys(store)
    store.update_scope("app", None, {"shared": True})
    changed = _keys(store) - before
    assert changed and all(k.startswith("tenants/app/@app/") for k, _ in changed)
    outside = {k for k, _ in _keys(store) if not k.startswith("tenants/")}
    assert outside <= {"castore.json", "swaps.log"}
    assert {a for a, _ in store.tenant_keys()} == {"app"}
    assert store.tenants() == [("app", None), ("app", "alice"), ("app", "bob")]
    # the scopes read back across the tenants' stores, by a fresh handle too
    assert {k: v for k, v in alice.state().items() if ":" in k} == {"app:seen": 1, "app:shared": True,
                                                                    "user:lang": "en"}
    assert castore.open(store.url, **_opts(store)).session("app", "alice", "s1").state()["app:shared"] is True


def _opts(store: castore.Store) -> dict[str, Any]:
    storage = store.storage
    inner = getattr(storage, "inner", storage)
    fs = getattr(inner, "_fs", None)
    if fs is None:
        return {}
    return {"endpoint_url": inner.endpoint, "key": fs.key, "secret": fs.secret}


def test_a_tenant_is_an_ordinary_store_and_keeps_dedup_within_itself(store: castore.Store) -> None:
    body = "shared prompt " * 400
    store.session("app", "alice", "s1").append(Message(role="system", content=body))
    home = store.tenant("app", "alice")
    assert home is store.tenant("app", "alice") and home.root is store and home.layout == "flat"
    assert home.tenant_segments == ("app", "alice")
    before = set(home.storage.list(""))
    store.session("app", "alice", "s2").append(Message(role="system", content=body))
    new_objects = [k for k in set(home.storage.list("")) - before if k.startswith(("objects/", "packs/"))]
    assert len(new_objects) <= 1  # the commit only (in a pack), the body shared within the tenant
    bob = store.tenant("app", "bob")
    store.session("app", "bob", "s1").append(Message(role="system", content=body))
    assert bob.storage.list("objects")  # bob keeps his own copy: nothing is shared across tenants
    assert [i.session for i in home.sessions("app", "alice")] == ["s2", "s1"]
    assert sorted(i.user for i in store.sessions("app")) == ["alice", "alice", "bob"]


def test_a_fork_into_another_user_is_refused(store: castore.Store) -> None:
    """Each user's sessions are kept in a store of their own, sharing no object: a fork into
    another user's sessions wrote its refs into this user's store, where nothing lists them
    (the other user's listing, exists(), an erasure of that user), and returned as if done."""
    s = store.session("app", "alice", "s1")
    s.append(Message(role="user", content="hi"))
    home = store.tenant("app", "alice")
    before = home.refs.list("sessions")
    with pytest.raises(castore.BranchError, match="cannot fork into user 'bob'"):
        s.fork("s2", user="bob")
    assert home.refs.list("sessions") == before and not store.session("app", "bob", "s2").exists()
    assert s.fork("s2").key == ("app", "alice", "s2")  # within the user, as ever
    assert s.fork("s3", user="alice").messages()[0].content == "hi"


def test_the_layout_is_chosen_at_creation_and_kept(backend: Any) -> None:
    st = backend.open()
    st.init()
    assert st.layout == "tenants"
    raw = json.loads(st.storage.read("castore.json"))
    assert raw["layout"] == "tenants"
    opts = {k: v for k, v in backend.options.items() if k != "layout"}
    with castore.open(backend.url, **opts) as again:
        assert again.layout == "tenants"
    with pytest.raises(castore.FormatError, match="layout"):
        castore.open(backend.url, layout="flat", **opts)
    with pytest.raises(castore.FormatError, match="unknown store layout"):
        castore.open(backend.url, layout="sideways", **opts)
    st.close()


def test_a_flat_store_is_its_own_tenant(tmp_path: Any) -> None:
    with castore.open(str(tmp_path / "flat")) as st:
        assert st.layout == "flat" and st.tenant("app", "alice") is st and st.tenants() == []
        assert list(st.stores()) == [st]
        st.session("app", "alice", "s").append(Message(role="user", content="hi"))
        assert "layout" not in json.loads(st.storage.read("castore.json"))
        assert not st.storage.list("tenants")


def test_tenant_options_reach_each_tenants_store(tmp_path: Any) -> None:
    seen: list[tuple[str, str | None]] = []

    def options(app: str, user: str | None) -> dict[str, Any]:
        seen.append((app, user))
        return {"compress": user is not None}

    with castore.open(str(tmp_path / "s"), layout="tenants", tenant_options=options) as st:
        st.session("app", "alice", "s").append(ev(0, **{"app:k": 1}))
        assert sorted(seen, key=str) == [("app", "alice"), ("app", None)]
        assert st.tenant("app", None).objects.compress is False


# -- store-wide work on the tenant layout --------------------------------------------------------
def _fill(st: castore.Store) -> None:
    st.session("app", "alice", "s1").append(ev(0, **{"app:motd": "hi", "user:units": "metric"}))
    st.session("app", "alice", "s2").append(Message(role="user", content="alice two"))
    st.session("app", "bob", "s1").append(Message(role="user", content="bob one"))
    st.session("other", "carol", "s1").append(Message(role="user", content="carol one"))


def _view(st: castore.Store) -> dict[tuple[str, str, str], Any]:
    return {(i.app, i.user, i.session): (i.head, st.session(i.app, i.user, i.session).state())
            for app in st.apps() for i in st.sessions(app)}


@pytest.mark.parametrize("dst_layout", ["tenants", "flat"])
def test_push_pull_and_clone_between_tenant_layout_stores(store: castore.Store, backend: Any, tmp_path: Any,
                                                          dst_layout: str) -> None:
    from castore import sync

    _fill(store)
    with castore.open(str(tmp_path / "copy"), layout=dst_layout) as dst:
        report = sync.push(store, dst)
        assert report.ok and report.objects_sent
        assert dst.layout == dst_layout and _view(dst) == _view(store)
        if dst_layout == "tenants":
            assert dst.tenants() == store.tenants()
        assert sync.push(store, dst).refs_updated == []  # up to date: nothing to send
        dst.session("app", "bob", "s1").append(Message(role="user", content="bob two"))
        dst.update_scope("app", None, {"motd": "bye"})
        pulled = sync.pull(dst, store, ("app", "bob"))
        assert pulled.ok and pulled.refs_updated
        assert store.session("app", "bob", "s1").messages()[-1].content == "bob two"
        assert store.app_state("app") == {"motd": "bye"}
        assert _view(dst) == _view(store)
    cloned = sync.clone(store.url, str(tmp_path / "clone"), "app", **_opts(store))
    assert cloned.ok
    with castore.open(str(tmp_path / "clone")) as c:
        assert c.layout == "tenants"
        assert {k for k in _view(c)} == {k for k in _view(store) if k[0] == "app"}


def test_a_flat_store_pushes_into_a_new_tenant_layout_store(tmp_path: Any) -> None:
    from castore import sync

    with castore.open(str(tmp_path / "flat")) as flat, \
            castore.open(str(tmp_path / "t"), layout="tenants") as dst:
        _fill(flat)
        assert sync.push(flat, dst).ok
        assert _view(dst) == _view(flat)
        # each tenant got only its own refs: alice's user state, not the app's
        assert dst.tenant("app", "alice").refs.list("state") == ["state/app/users/alice"]
        assert dst.tenant("app", None).refs.list("") == ["state/app/app"]


def test_fsck_gc_repack_and_expire_work_tenant_by_tenant(store: castore.Store, backend: Any) -> None:
    from castore import maintenance as m

    _fill(store)
    for i in range(3):
        store.session("app", "bob", "s1").append(Message(role="user", content=f"more {i}"))
    report = m.fsck(store)
    assert report.ok and report.reachable and not report.unreachable, report.to_dict()
    before = {t.tenant_segments: set(t.objects.iter_ids()) for t in store.stores()}
    store.delete_session("app", "alice", "s2")
    gone = m.gc(store, grace=0)
    assert gone.deleted
    after = {t.tenant_segments: set(t.objects.iter_ids()) for t in store.stores()}
    assert after[("app", "bob")] == before[("app", "bob")]  # no other tenant lost anything
    assert set(gone.deleted) <= before[("app", "alice")] - after[("app", "alice")]
    assert m.fsck(store).ok
    # the app state alice's first commit names lives in the app's store, and stays
    assert store.session("app", "alice", "s1").state()["app:motd"] == "hi"
    repacked = m.repack(store, all_packs=True)
    if backend.name != "local-tenants":  # on local disk this handle's logs are still its own
        assert repacked.objects and repacked.new_pack.startswith("tenants/")
    for t in store.stores():  # each tenant's objects in its own packs, none in another's
        ids = set(t.objects.iter_ids())
        for name in t.objects.pack_names():
            assert set(t.objects.pack_contents(name)) <= ids
    assert m.fsck(store).ok and _view(store)
    expired = m.expire_sessions(store, 0, app="other")
    assert [s[:3] for s in expired.sessions] == [("other", "carol", "s1")]
    assert store.sessions("other") == []


def test_gc_keeps_an_app_state_commit_only_a_users_commit_names(store: castore.Store) -> None:
    from castore import maintenance as m

    s = store.session("app", "alice", "s1")
    s.append(ev(0, **{"app:motd": "hi"}))
    first = s.head
    assert first is not None
    app_home = store.tenant("app", None)
    named = store.tenant("app", "alice").history.commit(first).scopes["app"]
    # the app's ref moves to a new root: only alice's commit still names the old state
    app_home.refs.swap("state/app/app", app_home.objects.put(castore.objects.Commit(kind="state")),
                       app_home.refs.read("state/app/app"))
    m.gc(store, grace=0)
    assert castore.objects.hex_id(named) in set(app_home.objects.iter_ids())
    assert s.state(first)["app:motd"] == "hi"
    assert m.fsck(store).ok


def _stray(st: castore.Store) -> list[str]:
    """Keys of a tenant-layout store written beside its tenants (none may be)."""
    own = ("castore.json", "swaps.log", "locks/", "journal/")  # the root's config, local disk's own files
    return [k for k in st.storage.list("") if not k.startswith(("tenants/", *own))]


def test_imports_grep_and_the_viewer_work_tenant_by_tenant(tmp_path: Any) -> None:
    from pathlib import Path

    from castore.adapters.claude_code import import_claude
    from castore.adapters.codex import import_codex
    from castore.grep import grep, grep_counts, grep_rows
    from castore.html import render_session

    data = Path(__file__).resolve().parent / "data"
    with castore.open(str(tmp_path / "s"), layout="tenants") as st:
        assert import_claude(st, data / "claude-code")
        assert import_codex(st, data / "codex" / "sample_codex_session.jsonl")
        st.session("app", "alice", "s1").append(ev(0, **{"app:motd": "hi", "user:lang": "en"}))
        st.session("app", "alice", "s1").append(Message(role="user", content="needle in alice"))
        st.session("app", "bob", "s1").append(Message(role="user", content="needle in bob"))
        assert not _stray(st)
        apps = {a for a, _ in st.tenants()}
        assert {"claude", "codex", "app"} <= apps
        found = [m.session for m in grep(st, "needle in", index=False)]
        assert sorted(found) == [("app", "alice", "s1"), ("app", "bob", "s1")]
        assert [m.session for m in grep(st, "needle in", limit=1)] in ([found[0]], [found[1]])
        assert grep_counts(st, "needle in") == {("app", "alice", "s1"): 1, ("app", "bob", "s1"): 1}
        assert len(list(grep_rows(st, "needle in"))) == 2
        page = render_session(st.session("app", "alice", "s1"))
        assert "needle in alice" in page and "motd" in page
        for info in st.sessions("claude"):
            assert st.session(info.app, info.user, info.session).messages() is not None
        assert not _stray(st)
