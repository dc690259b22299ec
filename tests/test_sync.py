"""Push, pull and clone between stores: local <-> S3 (moto on 127.0.0.1), S3 -> S3, local -> local.

What is checked: the destination ends with the same sessions, every object reachable from
its refs present; only what it lacks is sent; non-fast-forwards are refused (and forced);
a pull that finds both sides moved keeps the remote tip; an interrupted push leaves the
remote consistent and a resumed one sends the rest; racing pushers; clear errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import layout
import pytest
import s3server
from click.testing import CliRunner
from helpers.storage import PassThrough
from helpers.threads import run_threads

import castore
from castore import CastoreError, Event, Message, StorageError, sync
from castore import objects as o
from castore.cli import main as cli
from castore.history import Hint, K
from castore.objects import Commit, Index, Segment, Tree
from castore.storage import Storage
from castore.store import Store


# -- helpers -------------------------------------------------------------------------------
@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Any):
    """make_store(kind, fmt=None) -> a fresh empty store on 'local' or 's3' (moto), in storage
    format ``fmt`` (default: castore's), closed at the end."""
    opened: list[Store] = []

    def make(kind: str, fmt: int | None = None) -> Store:
        if kind == "local":
            st = castore.open(str(tmp_path / uuid.uuid4().hex), durable=False, format=fmt)
        elif kind == "s3":
            server = request.getfixturevalue("moto_server")
            st = castore.open(f"s3://castore-tests/{uuid.uuid4().hex}", format=fmt, **server.storage_options)
        else:
            raise ValueError(kind)
        if fmt is not None:
            st.init()  # castore.json names the format: every later handle writes in it
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()


def reopen(st: Store, **kw: Any) -> Store:
    """A second, independent handle on the same store (no shared caches)."""
    opts = getattr(st, "_test_options", None)
    return Store(st.storage) if opts is None else castore.open(st.url, **opts)


def fill(st: Store, key: tuple[str, str, str], n: int, start: int = 0, tag: str = "", scopes: bool = True) -> list[str]:
    """Append n events (messages with session state changes, and app and user state every
    10th) in turns of up to 10; return the commit ids."""
    s = st.session(*key)
    ids: list[str] = []
    for lo in range(start, start + n, 10):
        turn = []
        for i in range(lo, min(lo + 10, start + n)):
            delta: dict[str, Any] = {"step": i, "notes": f"{tag} note {i // 7} " + "x" * 300}
            if i % 10 == 0 and scopes:
                # tagged so that no two sessions share an object (the resume tests count exactly)
                delta["app:version"] = f"{tag}{i}"
                delta["user:seen"] = f"{tag}{i}"
            msg = Message(role="user" if i % 2 else "assistant", content=f"{tag} message {i}")
            turn.append(Event(author=msg.role, message=msg, state_delta=delta))
        ids += s.append_many(turn)
    return ids


def closure_ok(st: Store, via: Store | None = None) -> list[str]:
    """Every object reachable from every ref (hints included) exists; return what is missing.

    Existence comes from one listing of ``st``; contents are read from ``via`` (a local
    copy: ids are content hashes, so its bytes are the same) when it has them.
    """
    fresh = Store(st.storage)
    present = layout.stored_ids(fresh)
    reader = Store(via.storage) if via is not None else fresh
    missing: list[str] = []
    todo: list[str] = []
    for key in fresh.storage.list("refs"):
        v = fresh.refs.read(key[len("refs/"):])
        if v is None or v.symbolic:
            continue
        todo.append(v.target)
        hint = Hint.from_meta(v.meta)
        if hint is not None:
            todo.extend(hint.tail + ([hint.index] if hint.index else []))
    seen: set[str] = set()
    while todo:
        batch = [x for x in dict.fromkeys(todo) if x not in seen]
        todo = []
        seen.update(batch)
        have = [b for b in batch if b in present]
        missing += [b for b in batch if b not in present]
        got = reader.objects.get_many(have, missing_ok=True)
        if reader is not fresh:
            got.update(fresh.objects.get_many([b for b in have if b not in got]))
        for oid in have:
            obj = got.get(oid)
            if obj is None:
                missing.append(oid)
            elif isinstance(obj, Commit):
                todo += [o.hex_id(p) for p in obj.parents]
                todo += [o.hex_id(r) for r in (obj.body, obj.state, obj.index) if r is not None]
                todo += [o.hex_id(r) for r in obj.scopes.values()]
            elif isinstance(obj, Tree):
                todo += [o.hex_id(r) for r in list(obj.refs.values()) + list(obj.sub.values())]
            elif isinstance(obj, Index):
                todo += [o.hex_id(r) for r in obj.segments]
            elif isinstance(obj, Segment):
                for canonical in obj.objects:
                    oid2 = o.digest(canonical)
                    if isinstance(o.decode(oid2, canonical), Commit):
                        todo.append(oid2)
    return missing


def reachable_count(st: Store) -> int:
    fresh = Store(st.storage)
    seen: set[str] = set()
    todo = []
    for key in fresh.storage.list("refs"):
        v = fresh.refs.read(key[len("refs/"):])
        if v is not None and not v.symbolic:
            todo.append(v.target)
            h = Hint.from_meta(v.meta)
            if h is not None and h.index:
                todo.append(h.index)
    while todo:
        batch = [x for x in dict.fromkeys(todo) if x not in seen]
        todo = []
        seen.update(batch)
        for obj in fresh.objects.get_many(batch).values():
            if isinstance(obj, Commit):
                todo += [o.hex_id(p) for p in obj.parents]
                todo += [o.hex_id(r) for r in (obj.body, obj.state, obj.index) if r is not None]
                todo += [o.hex_id(r) for r in obj.scopes.values()]
            elif isinstance(obj, Tree):
                todo += [o.hex_id(r) for r in list(obj.refs.values()) + list(obj.sub.values())]
            elif isinstance(obj, Index):
                todo += [o.hex_id(r) for r in obj.segments]
    return len(seen)


def same_session(a: Store, b: Store, key: tuple[str, str, str]) -> None:
    sa, sb = Store(a.storage).session(*key), Store(b.storage).session(*key)
    assert sb.head == sa.head
    assert sb.branches() == sa.branches()
    assert sb.labels() == sa.labels()
    assert sb.messages() == sa.messages()
    assert sb.state() == sa.state()
    if not b.url.startswith("s3://"):
        sb.verify()  # an audit reads every commit one by one: too slow on moto


KEY = ("weather", "alice", "s1")


# -- the four directions --------------------------------------------------------------------
@pytest.mark.parametrize("src_kind,dst_kind", [("local", "s3"), ("s3", "local"), ("s3", "s3"), ("local", "local")])
def test_push_copies_sessions_between_backends(make_store, src_kind: str, dst_kind: str) -> None:
    src, dst = make_store(src_kind), make_store(dst_kind)
    # From local disk, a history longer than a segment block; from S3 a short one (moto is slow).
    fill(src, KEY, K + 6 if src_kind == "local" else 16)
    s = src.session(*KEY)
    s.label("checkpoint", at="HEAD~3")
    s.branch("retry", at="HEAD~10")
    s.checkout("retry")
    s.append(Message(role="user", content="on the retry branch"))
    fill(src, ("weather", "bob", "s2"), 5)
    report = sync.push(src, dst)
    assert report.ok and not report.refs_kept_as_remote
    assert report.objects_sent == reachable_count(src)
    assert closure_ok(dst, via=src) == []
    same_session(src, dst, KEY)
    same_session(src, dst, ("weather", "bob", "s2"))
    assert Store(dst.storage).session(*KEY).current_branch == "retry"
    assert Store(dst.storage).app_state("weather") == src.app_state("weather")
    assert Store(dst.storage).user_state("weather", "alice") == src.user_state("weather", "alice")


def test_second_push_sends_nothing(make_store) -> None:
    src, dst = make_store("local"), make_store("s3")
    fill(src, KEY, 20)
    first = sync.push(src, dst)
    again = sync.push(src, dst)
    assert first.objects_sent > 0
    assert again.objects_sent == 0 and again.refs_updated == [] and again.ok
    assert again.refs_up_to_date == len(first.refs_updated) - 1  # all but HEAD, which is only created


@pytest.mark.parametrize("extra", [1, 2])
def test_push_of_one_commit_onto_a_long_session_sends_a_few_objects(make_store, extra: int) -> None:
    src, dst = make_store("local"), make_store("s3")
    s = src.session(*KEY)
    # Reach a depth where the next commit(s) close a block: the hardest case (segment + index).
    base = 2 * K - extra
    s.append_many([Message(role="user", content=f"m{i}") for i in range(base)], state_delta={"n": 0})
    sync.push(src, dst)
    for i in range(extra):
        s.append(Message(role="user", content=f"new {i}"), state_delta={"n": i + 1})
    before = dst.storage.request_count
    report = sync.push(src, dst, KEY)
    requests = dst.storage.request_count - before
    # Per commit: commit, body, tree; plus the segment and index the block closing adds.
    assert report.objects_sent <= 3 * extra + 2
    assert requests <= 12 + report.objects_sent
    assert report.refs_updated == ["sessions/weather/alice/s1/heads/main"]
    assert closure_ok(dst, via=src) == []
    same_session(src, dst, KEY)
    more = s.append(Message(role="user", content="after the block"))
    assert sync.push(src, dst, KEY).objects_sent <= 3
    assert Store(dst.storage).session(*KEY).head == more


def test_pull_of_one_new_commit_reads_a_few_objects_from_s3(make_store) -> None:
    remote, local = make_store("s3"), make_store("local")
    s = remote.session(*KEY)
    s.append_many([Message(role="user", content=f"m{i}") for i in range(K + 3)])
    sync.pull(remote, local)
    s.append(Message(role="user", content="one more"))
    fresh = castore.open(remote.url, **_moto_opts(remote))
    report = sync.pull(fresh, local, KEY)
    assert report.objects_sent == 2 and report.ok
    assert fresh.storage.request_count <= 10
    same_session(remote, local, KEY)


def _moto_opts(st: Store) -> dict[str, Any]:
    return s3server.storage_options(st.storage.endpoint)


# -- selection ----------------------------------------------------------------------------
def test_push_sends_only_the_selected_sessions(make_store) -> None:
    src, dst = make_store("local"), make_store("local")
    for key in [("a1", "u1", "s1"), ("a1", "u1", "s2"), ("a1", "u2", "s1"), ("a2", "u1", "s1")]:
        fill(src, key, 3)
    sync.push(src, dst, ("a1", "u1", "s2"))
    assert [i.session for i in dst.sessions("a1")] == ["s2"]
    sync.push(src, dst, ("a1", "u1"))
    assert sorted(i.session for i in dst.sessions("a1")) == ["s1", "s2"]
    sync.push(src, dst, "a1")
    assert sorted((i.user, i.session) for i in dst.sessions("a1")) == [("u1", "s1"), ("u1", "s2"), ("u2", "s1")]
    assert dst.apps() == ["a1"]
    sync.push(src, dst)
    assert dst.apps() == ["a1", "a2"]
    assert closure_ok(dst, via=src) == []


def test_bad_selection_is_an_error(make_store) -> None:
    src, dst = make_store("local"), make_store("local")
    fill(src, KEY, 1)
    with pytest.raises(CastoreError):
        sync.push(src, dst, ("a", "b", "c", "d"))
    with pytest.raises(castore.InvalidName):
        sync.push(src, dst, ("", "b"))


def test_push_from_a_missing_store_raises_store_not_found(make_store, tmp_path: Any) -> None:
    with pytest.raises(castore.StoreNotFound):
        sync.push(castore.open(str(tmp_path / "nothing")), make_store("local"))


# -- diverged histories ---------------------------------------------------------------------
def _diverge(src: Store, dst: Store) -> tuple[str, str]:
    fill(src, KEY, 5)
    sync.push(src, dst)
    theirs = Store(dst.storage).session(*KEY).append(Message(role="user", content="written on the remote"))
    ours = src.session(*KEY).append(Message(role="user", content="written here"))
    return ours, theirs


@pytest.mark.parametrize("dst_kind", ["local", "s3"])
def test_diverged_push_is_refused_naming_the_branch_and_both_tips_then_forced(make_store, dst_kind: str) -> None:
    src, dst = make_store("local"), make_store(dst_kind)
    ours, theirs = _diverge(src, dst)
    report = sync.push(src, dst)
    assert report.objects_sent == 0 and not report.ok
    (ref, reason, local, remote), = report.refs_refused
    assert ref == "sessions/weather/alice/s1/heads/main"
    assert (local, remote) == (ours, theirs)
    assert "branch 'main'" in reason and ours[:12] in reason and theirs[:12] in reason and "--force" in reason
    assert Store(dst.storage).session(*KEY).head == theirs
    forced = sync.push(src, dst, force=True)
    assert forced.ok and forced.refs_updated == [ref]
    assert forced.objects_sent <= 3  # only the new commit's objects: the merge base is on the remote
    assert Store(dst.storage).session(*KEY).head == ours
    assert closure_ok(dst) == []


def test_push_behind_the_remote_is_refused(make_store) -> None:
    src, dst = make_store("local"), make_store("local")
    fill(src, KEY, 3)
    sync.push(src, dst)
    theirs = Store(dst.storage).session(*KEY).append(Message(role="user", content="remote only"))
    report = sync.push(src, dst)
    assert not report.ok and "remote is ahead" in report.refs_refused[0].reason
    assert Store(dst.storage).session(*KEY).head == theirs


def test_pull_fast_forwards_and_leaves_a_local_branch_that_is_ahead(make_store) -> None:
    remote, local = make_store("s3"), make_store("local")
    fill(remote, KEY, 4)
    sync.pull(remote, local)
    new = remote.session(*KEY).append(Message(role="user", content="remote moved"))
    r = sync.pull(remote, local)
    assert r.refs_updated == ["sessions/weather/alice/s1/heads/main"] and local.session(*KEY).head == new
    mine = local.session(*KEY).append(Message(role="user", content="local moved"))
    r = sync.pull(remote, local)
    assert r.ok and r.refs_updated == [] and r.objects_sent == 0
    assert local.session(*KEY).head == mine


def test_pull_with_both_sides_moved_keeps_the_remote_tip_as_a_remote_ref(make_store) -> None:
    local, remote = make_store("local"), make_store("s3")
    ours, theirs = _diverge(local, remote)
    report = sync.pull(remote, local, remote_name="origin")
    kept = "sessions/weather/alice/s1/remotes/origin/main"
    assert report.ok and report.refs_kept_as_remote == [kept] and report.refs_updated == []
    assert report.objects_sent <= 3
    s = Store(local.storage).session(*KEY)
    assert s.head == ours
    assert local.refs.read(kept).target == theirs
    assert {e.id for e in s.log(all_branches=True)} >= {ours, theirs}
    assert s.messages(theirs)[-1].content == "written on the remote"
    assert closure_ok(local) == []
    # Again: nothing new; pushing back is still refused; a forced pull takes the remote's.
    again = sync.pull(remote, local, remote_name="origin")
    assert again.objects_sent == 0 and again.refs_kept_as_remote == []
    assert not sync.push(local, remote).ok
    sync.pull(remote, local, force=True)
    assert Store(local.storage).session(*KEY).head == theirs


def test_labels_that_differ_are_refused_and_never_kept(make_store) -> None:
    local, remote = make_store("local"), make_store("local")
    fill(local, KEY, 4)
    local.session(*KEY).label("v1", at="HEAD~1")
    sync.push(local, remote)
    Store(remote.storage).session(*KEY).label("v1", at="HEAD~3", force=True)
    r = sync.pull(remote, local)
    assert [x.ref for x in r.refs_refused] == ["sessions/weather/alice/s1/tags/v1"]
    assert "label 'v1'" in r.refs_refused[0].reason and not r.refs_kept_as_remote


def test_app_state_moved_on_both_sides_is_refused_on_push(make_store) -> None:
    local, remote = make_store("local"), make_store("local")
    fill(local, KEY, 11)
    sync.push(local, remote)
    Store(remote.storage).update_scope("weather", None, {"owner": "remote"})
    local.update_scope("weather", None, {"owner": "local"})
    r = sync.push(local, remote)
    assert [x.ref for x in r.refs_refused] == ["state/weather/app"]
    assert "app state of 'weather'" in r.refs_refused[0].reason
    r = sync.pull(remote, local)
    assert r.refs_kept_as_remote == ["state/weather/remotes/origin/app"]
    assert closure_ok(local) == [] and closure_ok(remote) == []


def test_new_session_commit_naming_diverged_app_state_brings_that_state_along(make_store) -> None:
    local, remote = make_store("local"), make_store("local")
    fill(local, KEY, 1)
    sync.push(local, remote)
    Store(remote.storage).update_scope("weather", None, {"x": "remote"})
    local.session(*KEY).append(Message(role="user", content="hi"), state_delta={"app:x": "local"})
    r = sync.push(local, remote)
    assert [x.ref for x in r.refs_refused] == ["state/weather/app"]
    assert r.refs_updated == ["sessions/weather/alice/s1/heads/main"]
    assert closure_ok(remote) == []  # the scope commit the new session commit names was sent
    assert Store(remote.storage).session(*KEY).state(Store(remote.storage).session(*KEY).head)["app:x"] == "local"


def test_a_new_branch_sends_only_the_commits_after_its_fork_point(make_store) -> None:
    local, remote = make_store("local"), make_store("s3")
    fill(local, KEY, 30)
    sync.push(local, remote)
    s = local.session(*KEY)
    s.branch("alt", at="HEAD~5")
    s.checkout("alt")
    s.append(Message(role="user", content="alt"))
    r = sync.push(local, remote)
    assert r.refs_updated == ["sessions/weather/alice/s1/heads/alt"] and r.objects_sent <= 3


# -- interrupted pushes ---------------------------------------------------------------------
class FailingStorage(PassThrough):
    """Delegates to another storage and fails after ``budget`` object writes (some land)."""

    def __init__(self, inner: Storage, budget: int, fail_swaps_after: int | None = None) -> None:
        super().__init__(inner)
        self.budget = budget
        self.written = 0
        self.swaps_left = fail_swaps_after
        self.lock = threading.Lock()

    def write_many(self, items: Mapping[str, bytes]) -> None:
        objs = {k: v for k, v in items.items() if k.startswith("objects/")}
        room = self.budget - self.written
        if len(objs) > room:
            part = dict(list(items.items())[: max(room, 0)])
            self.inner.write_many(part)
            self.written += len(part)
            raise StorageError("injected failure: connection lost", self.url)
        self.inner.write_many(items)
        self.written += len(objs)

    def write(self, key: str, data: bytes) -> None:
        self.write_many({key: data})

    def swap(self, key: str, data: bytes, expect: Any) -> Any:
        if key.startswith("refs/") and self.swaps_left is not None:
            with self.lock:  # ref swaps run on several threads
                if self.swaps_left == 0:
                    raise StorageError("injected failure during a ref write", self.url)
                self.swaps_left -= 1
        return self.inner.swap(key, data, expect)

    def read_many(self, keys: Any) -> dict[str, bytes | None]:
        return self.inner.read_many(keys)


def _assert_remote_is_a_prefix(local: Store, remote: Store) -> None:
    assert closure_ok(remote, via=local) == []
    r = Store(remote.storage)
    for key in r.storage.list("refs/sessions"):
        v = r.refs.read(key[len("refs/"):])
        if v is not None and not v.symbolic:
            lv = local.refs.read(key[len("refs/"):])
            assert lv is not None and local.history.is_ancestor(v.target, lv.target)


def covered(remote: Store) -> int:
    """How many objects the remote's refs make reachable (0 when it has no refs)."""
    return reachable_count(remote) if remote.storage.list("refs") else 0


@pytest.mark.parametrize("budget", [0, 1, 37, 150, 333])
def test_interrupted_push_leaves_the_remote_consistent_and_resuming_sends_the_rest(
        make_store, monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    monkeypatch.setattr(sync, "BATCH", 40)
    # format 1: the budget counts one write per object (format 2 writes a pack per batch)
    local, remote = make_store("local"), make_store("local", fmt=1)
    fill(local, KEY, 2 * K + 10, tag="a")
    fill(local, ("weather", "bob", "s9"), 12, tag="b")
    total = reachable_count(local)
    flaky = Store(FailingStorage(remote.storage, budget))
    with pytest.raises(StorageError, match="injected"):
        sync.push(local, flaky)
    _assert_remote_is_a_prefix(local, remote)
    landed = covered(remote)
    assert budget < 150 or landed > 0  # long histories are checkpointed on the way
    resumed = sync.push(local, Store(remote.storage))
    assert resumed.ok
    assert resumed.objects_sent == total - landed  # exactly what the remote's refs do not cover
    assert closure_ok(remote, via=local) == []
    same_session(local, remote, KEY)
    same_session(local, remote, ("weather", "bob", "s9"))


@pytest.mark.parametrize("swaps", [0, 1, 3])
def test_push_failing_during_ref_writes_leaves_the_remote_consistent(
        make_store, monkeypatch: pytest.MonkeyPatch, swaps: int) -> None:
    monkeypatch.setattr(sync, "BATCH", 20)
    local, remote = make_store("local"), make_store("local")
    # No app or user state here: a scope commit a landed session names is sent again with
    # its scope chain when the scope ref did not land (harmless, but not an exact count).
    fill(local, KEY, 30, tag="a", scopes=False)
    fill(local, ("weather", "bob", "s9"), 3, tag="b", scopes=False)
    total = reachable_count(local)
    flaky = Store(FailingStorage(remote.storage, 10**9, fail_swaps_after=swaps))
    with pytest.raises(StorageError, match="injected"):
        sync.push(local, flaky)
    _assert_remote_is_a_prefix(local, remote)
    landed = covered(remote)
    again = sync.push(local, Store(remote.storage))
    assert again.ok and again.objects_sent == total - landed
    same_session(local, remote, KEY)


def test_push_over_s3_interrupted_midway_resumes(make_store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sync, "BATCH", 24)
    # format 1: the budget counts one write per object (format 2 writes a pack per batch)
    local, remote = make_store("local"), make_store("s3", fmt=1)
    fill(local, KEY, 40)
    total = reachable_count(local)
    with pytest.raises(StorageError):
        sync.push(local, Store(FailingStorage(remote.storage, 70)))
    _assert_remote_is_a_prefix(local, remote)
    landed = covered(remote)
    assert landed > 0
    resumed = sync.push(local, castore.open(remote.url, **_moto_opts(remote)))
    assert resumed.ok and resumed.objects_sent == total - landed
    same_session(local, remote, KEY)


_KILL_CHILD = textwrap.dedent("""
    import os, signal, sys
    import castore
    from castore import sync
    sync.BATCH = 30
    src, dst, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def progress(p):
        if p.objects_done >= after:
            os.kill(os.getpid(), signal.SIGKILL)
    sync.push(castore.open(src), castore.open(dst), progress=progress)
""")


@pytest.mark.parametrize("after", [30, 120])
def test_push_killed_midway_leaves_the_remote_consistent(make_store, after: int) -> None:
    local, remote = make_store("local"), make_store("local")
    fill(local, KEY, 80)
    remote.init()
    proc = subprocess.run([sys.executable, "-c", _KILL_CHILD, local.url, remote.url, str(after)],
                          capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()
    _assert_remote_is_a_prefix(local, remote)
    total, landed = reachable_count(local), covered(remote)
    resumed = sync.push(local, Store(remote.storage))
    assert resumed.objects_sent == total - landed
    same_session(local, remote, KEY)


# -- racing pushers -------------------------------------------------------------------------
class BarrierStorage(FailingStorage):
    """Holds every branch-ref write until both pushers have reached theirs."""

    def __init__(self, inner: Storage, barrier: threading.Barrier) -> None:
        super().__init__(inner, 10**9)
        self.barrier = barrier

    def swap(self, key: str, data: bytes, expect: Any) -> Any:
        if "/heads/" in key:
            self.barrier.wait(timeout=60)
        return self.inner.swap(key, data, expect)


@pytest.mark.parametrize("dst_kind", ["local", "seaweedfs"])
def test_two_pushers_racing_for_a_branch_exactly_one_wins(make_store, request: pytest.FixtureRequest,
                                                          dst_kind: str) -> None:
    if dst_kind == "seaweedfs":
        server = request.getfixturevalue("seaweedfs")  # atomic conditional writes (moto's are not)
        opts = server.storage_options
        remote = castore.open(f"s3://castore-tests/{uuid.uuid4().hex}", **opts)
        reopen_remote = lambda: castore.open(remote.url, **opts)  # noqa: E731
    else:
        remote = make_store("local")
        reopen_remote = lambda: Store(remote.storage)  # noqa: E731
    a, b = make_store("local"), make_store("local")
    fill(a, KEY, 3)
    sync.push(a, remote)
    sync.pull(reopen_remote(), b)
    tips = {"a": a.session(*KEY).append(Message(role="user", content="from a")),
            "b": b.session(*KEY).append(Message(role="user", content="from b"))}
    barrier = threading.Barrier(2)
    reports: dict[str, sync.SyncReport] = {}

    def run(name: str, src: Store) -> None:
        reports[name] = sync.push(src, Store(BarrierStorage(reopen_remote().storage, barrier)))

    errors = run_threads(lambda: run("a", a), lambda: run("b", b))
    assert set(reports) == {"a", "b"}, errors
    winners = [n for n, r in reports.items() if r.ok]
    assert len(winners) == 1
    loser = reports["b" if winners == ["a"] else "a"]
    (refusal,) = loser.refs_refused
    assert "branch 'main'" in refusal.reason and refusal.remote == tips[winners[0]]
    assert reopen_remote().session(*KEY).head == tips[winners[0]]
    assert closure_ok(reopen_remote(), via=a) == []


# -- remotes, clone, errors -------------------------------------------------------------------
def test_remotes_are_kept_in_the_store_config(make_store) -> None:
    st = make_store("local")
    sync.add_remote(st, "origin", "s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:9"})
    assert sync.list_remotes(Store(st.storage)) == {
        "origin": {"url": "s3://bucket/prefix", "options": {"endpoint_url": "http://127.0.0.1:9"}}}
    with pytest.raises(CastoreError, match="already exists"):
        sync.add_remote(st, "origin", "s3://other")
    with pytest.raises(castore.InvalidName):
        sync.add_remote(st, "a/b", "s3://other")
    sync.remove_remote(st, "origin")
    assert sync.list_remotes(st) == {}
    with pytest.raises(CastoreError, match="no remote"):
        sync.remove_remote(st, "origin")


def test_remote_add_of_an_empty_url_is_refused_not_the_working_folder(tmp_path: Any, monkeypatch: Any) -> None:
    """``castore remote add origin ''`` made the empty URL absolute first: the remote became the
    current folder (a push then wrote a store into it), exit 0. A blank URL is now refused, as
    the library refuses it."""
    from click.testing import CliRunner

    from castore.cli.main import main

    monkeypatch.chdir(tmp_path)
    root = str(tmp_path / "st")
    for url in ("", "   "):
        res = CliRunner().invoke(main, ["--store", root, "remote", "add", "origin", url])
        assert res.exit_code == 1 and "Error: a remote needs a URL" in res.output, res.output
    with castore.open(root) as st:
        assert sync.list_remotes(st) == {}


def test_clone_copies_a_selection_and_records_origin(make_store, moto_server: Any, tmp_path: Any) -> None:
    remote = make_store("s3")
    fill(remote, KEY, 4)
    fill(remote, ("other", "x", "y"), 2)
    dest = str(tmp_path / "clone")
    report = sync.clone(remote.url, dest, "weather", **moto_server.storage_options)
    assert report.ok
    with castore.open(dest) as c:
        assert c.apps() == ["weather"]
        same_session(remote, c, KEY)
        assert sync.list_remotes(c)["origin"]["url"] == remote.url
        back = sync.open_remote(c, "origin")[1]
        assert sync.pull(back, c, "weather").objects_sent == 0
    with pytest.raises(CastoreError, match="already holds"):
        sync.clone(remote.url, dest, **moto_server.storage_options)


def test_unknown_protocol_is_a_clear_error() -> None:
    with pytest.raises(StorageError, match="unknown or unavailable protocol"):
        castore.open("nosuchproto://bucket/x")


#: fail at the first refused connection instead of retrying for seconds
FAIL_FAST = {"retries": 1, "config_kwargs": {"retries": {"max_attempts": 1}}}


def test_closed_port_is_a_clear_storage_error(make_store) -> None:
    src = make_store("local")
    fill(src, KEY, 1)
    (port,) = s3server.free_ports(1)
    with pytest.raises(StorageError, match="cannot reach S3 endpoint"):
        dst = castore.open("s3://bucket/x", **s3server.storage_options(f"http://127.0.0.1:{port}"), **FAIL_FAST)
        sync.push(src, dst)


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for var in list(os.environ):
        if var.startswith("AWS_"):
            monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_missing_credentials_are_a_clear_storage_error(make_store, moto_server: Any, no_aws_credentials: None) -> None:
    src = make_store("local")
    fill(src, KEY, 1)
    with pytest.raises(StorageError, match="credentials"):
        dst = castore.open("s3://castore-tests/nocreds", endpoint_url=moto_server.endpoint_url, **FAIL_FAST)
        sync.push(src, dst)


# -- the CLI ----------------------------------------------------------------------------------
def _cli(store: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--store", store, *args], catch_exceptions=False)
    return result


def test_cli_remote_push_pull_clone(make_store, moto_server: Any, tmp_path: Any) -> None:
    local = make_store("local")
    fill(local, KEY, 5)
    bucket_url = f"s3://castore-tests/{uuid.uuid4().hex}"
    ep = moto_server.endpoint_url
    opts = ["-o", f"endpoint_url={ep}", "-o", "key=testkey", "-o", "secret=testsecret",
            "-o", "client_kwargs.region_name=us-east-1"]
    r = _cli(local.url, "remote", "add", "origin", bucket_url, *opts)
    assert r.exit_code == 0, r.output
    r = _cli(local.url, "remote", "list", "--json")
    listed = json.loads(r.stdout)["origin"]
    assert listed["url"] == bucket_url and listed["options"]["endpoint_url"] == ep
    assert listed["options"]["key"] == listed["options"]["secret"] == "***"  # credentials never printed
    assert listed["options"]["client_kwargs"] == {"region_name": "us-east-1"}
    r = _cli(local.url, "remote", "list")
    assert "testsecret" not in r.stdout and "testkey" not in r.stdout and bucket_url in r.stdout
    r = _cli(local.url, "push", "--all")
    assert r.exit_code == 0, r.output
    assert "updated  sessions/weather/alice/s1/heads/main" in r.stdout and "pushed to origin" in r.stderr
    assert "%" not in r.stderr  # no progress line when stderr is not a terminal
    r = _cli(local.url, "push", "--all", "--json")
    assert '"objects_sent": 0' in r.stdout
    r = _cli(local.url, "push", "-q", "--app", "weather")
    assert r.exit_code == 0 and r.stdout == "" and r.stderr == ""
    dest = str(tmp_path / "cloned")
    r = _cli(dest, "clone", bucket_url, dest, "weather/alice", *opts)
    assert r.exit_code == 0, r.output
    same_session(local, castore.open(dest), KEY)
    # diverge and see the refusal, then the pull that keeps the remote tip
    castore.open(dest).session(*KEY).append(Message(role="user", content="from the clone"))
    assert _cli(dest, "push", "-s", "weather/alice/s1").exit_code == 0
    local.session(*KEY).append(Message(role="user", content="from the original"))
    r = _cli(local.url, "push", "-s", "weather/alice/s1")
    assert r.exit_code == 1 and "refused: non-fast-forward: branch 'main'" in r.stderr
    r = _cli(local.url, "pull", "origin", "-s", "weather/alice/s1")
    assert r.exit_code == 0 and "remotes/origin/main" in r.stdout and "both sides moved" in r.stderr
    r = _cli(local.url, "push", "--force", "-s", "weather/alice/s1")
    assert r.exit_code == 0
    r = _cli(local.url, "remote", "remove", "origin")
    assert r.exit_code == 0 and sync.list_remotes(Store(local.storage)) == {}


def test_cli_errors_are_one_line_not_tracebacks(make_store, moto_server: Any, no_aws_credentials: None) -> None:
    local = make_store("local")
    fill(local, KEY, 1)
    (port,) = s3server.free_ports(1)
    cases = [
        (["push", "nosuch", "--all"], "no remote 'nosuch'"),
        (["push", "nosuchproto://x/y", "--all"], "unknown or unavailable protocol"),
        (["remote", "add", "closed", "s3://b/p", "-o", f"endpoint_url=http://127.0.0.1:{port}",
          "-o", "key=k", "-o", "secret=s", "-o", "retries=1", "-o", "config_kwargs.retries.max_attempts=1"], None),
        (["push", "closed", "--all"], "cannot reach S3 endpoint"),
        (["remote", "add", "nocreds", "s3://castore-tests/p", "-o", f"endpoint_url={moto_server.endpoint_url}",
          "-o", "retries=1", "-o", "config_kwargs.retries.max_attempts=1"], None),
        (["push", "nocreds", "--all"], "credentials"),
        (["clone", "nosuchproto://x", "somewhere"], "unknown or unavailable protocol"),
    ]
    for args, message in cases:
        r = _cli(local.url, *args)
        if message is None:
            assert r.exit_code == 0, r.output
            continue
        assert r.exit_code == 1, (args, r.output)
        assert r.stderr.startswith("Error: ") and message in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_cli_push_needs_a_selection(make_store) -> None:
    local = make_store("local")
    fill(local, KEY, 1)
    r = CliRunner().invoke(cli, ["--store", local.url, "push", str(local.url)])
    assert r.exit_code == 2 and "-s APP/USER/SESSION" in r.stderr
    r = CliRunner().invoke(cli, ["--store", local.url, "push", "--user", "u", "x"])
    assert r.exit_code == 2


def test_cli_push_and_pull_move_the_session_chosen_with_use_and_sync_moves_all(make_store) -> None:
    """As `git push` sends the current branch: with no -s, --app or --all, push and pull move
    the session of `castore use` (said on stderr); sync moves every session whatever is chosen."""
    def keys(st: Store) -> list[tuple[str, str, str]]:
        return sorted((i.app, i.user, i.session) for app in st.apps() for i in st.sessions(app))

    local, remote, other = make_store("local"), make_store("local"), make_store("local")
    fill(local, KEY, 3)
    fill(local, ("app", "bob", "s2"), 2, tag="b")
    ok = _cli(local.url, "use", "app/bob/s2")
    assert ok.exit_code == 0, ok.output
    r = _cli(local.url, "push", remote.url)
    assert r.exit_code == 0, r.output
    assert "app/bob/s2, the session chosen with `castore use`" in r.stderr
    assert keys(remote) == [("app", "bob", "s2")]
    assert _cli(other.url, "use", "app/bob/s2").exit_code == 0
    r = _cli(other.url, "pull", "-q", remote.url)
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert keys(other) == [("app", "bob", "s2")]
    r = _cli(other.url, "sync", local.url)
    assert r.exit_code == 0, r.output
    assert keys(other) == sorted([KEY, ("app", "bob", "s2")])


def test_cli_clone_of_a_selection_that_names_nothing_is_refused_before_any_store_is_made(make_store,
                                                                                          tmp_path: Any) -> None:
    src = make_store("local")
    fill(src, KEY, 2)
    for sel in ("wether", "weather/bob", "weather/alice/s9"):  # before: an empty store, exit 0
        dest = tmp_path / f"copy-{sel.replace('/', '-')}"
        r = CliRunner().invoke(cli, ["clone", src.url, str(dest), sel])
        assert r.exit_code == 1 and r.stderr == f"Error: nothing to clone: no session of {sel} at {src.url} " \
            "(apps: weather)\n", r.output
        assert not dest.exists()
    r = CliRunner().invoke(cli, ["clone", src.url, str(tmp_path / "copy"), "weather/alice"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["clone", src.url, str(tmp_path / "four"), "a/b/c/d"])  # said APP[/USER] before
    assert r.exit_code == 2 and "'a/b/c/d' is not APP[/USER[/SESSION]]" in r.stderr, r.stderr


def test_cli_push_runs_as_a_real_subprocess(make_store, tmp_path: Any) -> None:
    local = make_store("local")
    fill(local, KEY, 3)
    exe = os.path.join(os.path.dirname(sys.executable), "castore")
    dst = str(tmp_path / "remote")
    out = subprocess.run([exe, "--store", local.url, "push", dst, "--all"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pushed to" in out.stderr and "\r" not in out.stderr
    same_session(local, castore.open(dst), KEY)
