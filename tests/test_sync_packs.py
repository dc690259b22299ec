"""Sync into a format-2 (packed) store: push, pull and clone send packs, not objects.

What is checked: requests counted against the real moto server (a 2,000-entry session is
pushed in at most N/32 requests and pulled back in a handful); the missing objects land as
a few packs, bodies over 4 KB stay loose and shared; a format-1 destination still gets
loose objects; a new destination takes the source's format; an interrupted push (a pack
PUT failing, or the pusher killed) leaves refs that name only present objects, and pushing
again completes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import castore
from castore import Message, StorageError, sync
from castore import objects as o
from castore.maintenance import fsck
from castore.objectstore import object_key
from castore.storage import Storage
from castore.storage.faulty import FaultyStorage
from castore.store import Store

KEY = ("weather", "alice", "s1")


@pytest.fixture
def stores(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """stores(kind, format) -> a fresh store on 'local' or 's3' (moto); ``format`` None: not created."""
    opened: list[Store] = []

    def make(kind: str, format: int | None = 2) -> Store:  # noqa: A002
        if kind == "local":
            url, opts = str(tmp_path / uuid.uuid4().hex), {"durable": False}
        else:
            server = request.getfixturevalue("moto_server")
            url, opts = f"s3://castore-tests/{uuid.uuid4().hex}", dict(server.storage_options)
        st = castore.open(url, format=format, **opts)
        if format is not None:
            st.init()
        st._test_reopen = (url, opts)  # type: ignore[attr-defined]
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()


def fresh(st: Store) -> Store:
    """A new handle on the same store: nothing cached, its own request counter."""
    url, opts = st._test_reopen  # type: ignore[attr-defined]
    return castore.open(url, **opts)


def long_session(st: Store, key: tuple[str, str, str], n: int, big: str | None = None) -> None:
    s = st.session(*key)
    for lo in range(0, n, 200):
        s.append_many([Message(role="user" if i % 2 else "assistant", content=f"turn {i}: " + "w" * 180)
                       for i in range(lo, min(lo + 200, n))], state_delta={"turn": lo})
    if big is not None:
        s.append(Message(role="tool", content=big), state_delta={"big": True})


def same(a: Store, b: Store, key: tuple[str, str, str]) -> None:
    sa, sb = a.session(*key), b.session(*key)
    assert sb.head == sa.head
    assert sb.branches() == sa.branches()
    assert sb.messages() == sa.messages()
    assert sb.state() == sa.state()


def loose_keys(st: Store) -> list[str]:
    return st.storage.list("objects")


def pack_keys(st: Store) -> list[str]:
    return [k for k in st.storage.list("packs") if k.endswith(".pack")]


# -- the target: request counts against moto ----------------------------------------------
def test_push_of_a_2000_entry_session_to_s3_takes_at_most_n_over_32_requests(stores) -> None:
    local = stores("local", 2)
    long_session(local, KEY, 2000)
    remote = stores("s3", None)  # no store yet: the push creates it, in the source's format
    report = sync.push(local, remote)
    requests = remote.storage.request_count
    assert report.ok and report.objects_sent > 2000
    assert requests <= 2000 // 32, report.to_dict()
    assert report.packs_sent == 1 and report.loose_sent == 0
    assert remote.config["format"] == 2 and loose_keys(remote) == []
    same(local, fresh(remote), KEY)
    # and back: a pull of the whole session into an empty local store reads a few packs
    back = stores("local", 2)
    src = fresh(remote)
    pulled = sync.pull(src, back)
    assert pulled.ok and pulled.objects_sent == report.objects_sent
    assert src.storage.request_count <= 12
    same(local, back, KEY)
    assert not fsck(back).damaged


@pytest.mark.slow  # ~10 s against moto on a loaded 2-core machine
def test_push_of_one_more_turn_into_a_packed_store_is_a_few_requests(stores) -> None:
    local, remote = stores("local", 2), stores("s3", 2)
    long_session(local, KEY, 100)
    sync.push(local, remote)
    local.session(*KEY).append_many([Message(role="user", content="q"), Message(role="assistant", content="a")])
    again = fresh(remote)
    report = sync.push(local, again, KEY)
    # castore.json (the open), one listing of the session's refs, its HEAD and branch and
    # the app and user state refs read concurrently, one pack PUT, one ref swap
    assert report.packs_sent == 1 and again.storage.request_count <= 8, report.to_dict()
    same(local, fresh(remote), KEY)


def test_format_1_source_is_sent_as_packs_into_a_format_2_store(stores) -> None:
    local, remote = stores("local", 1), stores("local", 2)
    long_session(local, KEY, 150)
    long_session(local, ("weather", "bob", "s2"), 40)
    assert pack_keys(local) == []
    report = sync.push(local, remote)
    assert report.ok and report.packs_sent == 1 and report.loose_sent == 0
    assert loose_keys(remote) == [] and len(pack_keys(remote)) == 1
    same(local, fresh(remote), KEY)
    same(local, fresh(remote), ("weather", "bob", "s2"))


def test_format_1_destination_still_gets_loose_objects(stores) -> None:
    local, remote = stores("local", 2), stores("local", 1)
    long_session(local, KEY, 100)
    report = sync.push(local, remote)
    assert report.ok and report.packs_sent == 0 and report.loose_sent == report.objects_sent
    assert pack_keys(remote) == [] and len(loose_keys(remote)) == report.objects_sent
    assert fresh(remote).config["format"] == 1
    same(local, fresh(remote), KEY)


def test_large_bodies_stay_loose_and_shared_the_rest_goes_in_one_pack(stores) -> None:
    local, remote = stores("local", 2), stores("local", 2)
    big = "".join(f"line {i}: {uuid.UUID(int=i * 7919)}\n" for i in range(3000))  # ~150 KB
    long_session(local, KEY, 130, big=big)
    long_session(local, ("weather", "bob", "s2"), 10, big=big)
    report = sync.push(local, remote)
    assert report.loose_sent == 1  # one body, held by both sessions, sent once
    (key,) = loose_keys(remote)
    oid = key.split("/")[1] + key.split("/")[2]
    assert len(o.from_stored(oid, remote.storage.read(key))) > 100_000
    assert key == object_key(oid)
    # segments of the long session (over 4 KB, not shared) went into the pack with the rest
    assert report.packs_sent == 1 and len(pack_keys(remote)) >= 1
    same(local, fresh(remote), KEY)
    assert fresh(remote).session(*KEY).messages()[-1].content == big
    assert not fsck(fresh(remote)).damaged


@pytest.mark.slow  # ~10 s against moto on a loaded 2-core machine
def test_pull_into_a_local_packed_store_appends_to_its_log(stores) -> None:
    remote, local = stores("s3", 2), stores("local", 2)
    long_session(remote, KEY, 40)
    report = sync.pull(fresh(remote), local)
    assert report.ok and report.packs_sent == 1 and loose_keys(local) == []
    same(remote, local, KEY)


def test_clone_takes_the_format_of_the_remote(stores, tmp_path: Any) -> None:
    remote = stores("local", 2)
    long_session(remote, KEY, 20)
    dest = str(tmp_path / "clone")
    sync.clone(remote.url, dest)
    with castore.open(dest) as cl:
        assert cl.config["format"] == 2 and loose_keys(cl) == []
        same(remote, cl, KEY)


# -- interrupted pushes ----------------------------------------------------------------------
class PackPutFails(FaultyStorage):
    """Behaves like an object store (no appends); the ``fail_at``-th pack PUT raises."""

    def __init__(self, inner: Storage, fail_at: int) -> None:
        super().__init__(inner, rate=0.0)
        self.fail_at = fail_at
        self.pack_puts = 0

    def write(self, key: str, data: bytes) -> None:
        if key.startswith("packs/"):
            self.pack_puts += 1
            if self.pack_puts == self.fail_at:
                raise StorageError(f"injected failure writing {key}", self.url)
        self.inner.write(key, data)


def _refs_name_only_present_objects(local: Store, remote: Store) -> None:
    r = Store(remote.storage)
    report = fsck(r)
    assert not report.damaged, report.to_dict()
    for key in r.storage.list("refs/sessions"):
        v = r.refs.read(key[len("refs/"):])
        if v is not None and not v.symbolic:
            lv = local.refs.read(key[len("refs/"):])
            assert lv is not None and local.history.is_ancestor(v.target, lv.target)


@pytest.mark.parametrize("fail_at", [1, 2, 4])
def test_push_whose_pack_put_fails_leaves_refs_consistent_and_a_repush_completes(
        stores, monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    monkeypatch.setattr(sync, "BATCH", 64)
    monkeypatch.setattr(sync, "PACK_BYTES", 16 << 10)  # several packs, with checkpoints between
    local, remote = stores("local", 2), stores("local", 2)
    long_session(local, KEY, 400)
    long_session(local, ("weather", "bob", "s2"), 30)
    flaky = Store(PackPutFails(remote.storage, fail_at))
    with pytest.raises(StorageError, match="injected"):
        sync.push(local, flaky)
    assert flaky.storage.pack_puts == fail_at  # nothing was written after the failure
    _refs_name_only_present_objects(local, remote)
    if fail_at > 2:
        assert Store(remote.storage).refs.read("sessions/weather/alice/s1/heads/main") is not None  # checkpointed
    again = sync.push(local, fresh(remote))
    assert again.ok
    same(local, fresh(remote), KEY)
    same(local, fresh(remote), ("weather", "bob", "s2"))
    assert fsck(fresh(remote)).ok


_KILL_CHILD = textwrap.dedent("""
    import os, signal, sys
    import castore
    from castore import sync
    sync.BATCH, sync.PACK_BYTES = 64, 16 << 10
    src, dst, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def progress(p):
        if p.objects_done >= after:
            os.kill(os.getpid(), signal.SIGKILL)
    sync.push(castore.open(src), castore.open(dst), progress=progress)
""")


@pytest.mark.parametrize("after", [1, 300])
def test_push_killed_midway_into_a_packed_store_leaves_it_consistent(stores, after: int) -> None:
    local, remote = stores("local", 2), stores("local", 2)
    long_session(local, KEY, 400)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", _KILL_CHILD, local.url, remote.url, str(after)],
                          capture_output=True, env=env)
    assert proc.returncode == -9, proc.stderr.decode()
    assert pack_keys(remote)  # it was killed after writing something
    _refs_name_only_present_objects(local, remote)
    again = sync.push(local, fresh(remote))
    assert again.ok
    same(local, fresh(remote), KEY)
    assert not fsck(fresh(remote)).damaged
