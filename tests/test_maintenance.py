"""fsck and gc: damage of every kind is found, and gc deletes exactly the unreachable and old."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.storage import PassThrough

import castore
from castore import maintenance
from castore import objects as o
from castore.cli import main
from castore.objects import Blob, Value
from castore.storage import Storage
from castore.storage.local import LocalStorage

sys.path.insert(0, str(Path(__file__).resolve().parent))
import layout

HERE = Path(__file__).resolve().parent
CHILD = str(HERE / "crash_writer.py")
OLD = time.time() - 30 * 86400


def fill(store: castore.Store, sid: str = "s1", n: int = 5, app: str = "app", user: str = "alice") -> castore.Session:
    s = store.session(app, user, sid)
    if n > 3:  # one write for the bulk (one commit per entry), then single appends
        s.append_many([castore.Message(role="user", content=f"{sid} message {i}") for i in range(n - 3)])
    for i in range(max(n - 3, 0), n):
        s.append(castore.Message(role="user", content=f"{sid} message {i}"), state_delta={"i": i, "big": "x" * 300 + str(i)})
    return s


def rich_store(store: castore.Store) -> None:
    """Sessions with branches, labels, forks, app and user state, and a closed segment block."""
    s = fill(store, "s1", 70)
    s.branch("retry", at="HEAD~3")
    s.label("v1", at="HEAD~1")
    s.checkout("retry")
    s.append(castore.Message(role="assistant", content="again"), state_delta={"app:theme": "dark", "user:lang": "fr"})
    s.fork("s2", at="HEAD~2")
    fill(store, "s3", 3, user="bob")


def body_of(store: castore.Store, cid: str) -> str:
    c = store.history.commit(cid)
    assert c.body is not None
    return o.hex_id(c.body)


def run_cli(url: str, *args: str) -> Any:
    runner = CliRunner(env={"CASTORE_STORE": None, "CASTORE_SESSION": None})
    return runner.invoke(main, ["--store", url, *args], prog_name="castore")


def backdate(store: castore.Store, oids: list[str]) -> None:
    """Make objects look old (local disk: set their mtime, or their pack's, a month back)."""
    layout.backdate(store, oids, OLD)


# -- fsck ------------------------------------------------------------------------------------
def test_fsck_on_healthy_store_is_ok(store: castore.Store) -> None:
    rich_store(store)
    r = maintenance.fsck(store)
    assert r.ok, r.to_dict()
    assert r.objects == r.reachable > 70 * 2
    assert r.unreachable == [] and r.missing == [] and r.corrupt == []
    assert r.refs >= 8


def test_fsck_reports_missing_object(local_store: castore.Store) -> None:
    s = fill(local_store)
    tip = s.head
    body = body_of(local_store, tip)
    layout.delete(local_store, body)
    r = maintenance.fsck(local_store)
    assert not r.ok
    assert r.missing == [(body, tip)]


def test_fsck_finds_missing_object_even_when_the_process_has_it_cached(local_store: castore.Store) -> None:
    s = fill(local_store)
    s.messages()  # every object of the path is now in this process's cache
    body = body_of(local_store, s.head)
    layout.delete(local_store, body)
    assert [oid for oid, _ in maintenance.fsck(local_store).missing] == [body]


def test_fsck_reports_corrupt_object_by_rehashing(local_store: castore.Store) -> None:
    s = fill(local_store)
    cid = s.resolve("HEAD~2")
    layout.corrupt(local_store, cid)
    r = maintenance.fsck(local_store)
    assert [oid for oid, _ in r.corrupt] == [cid]
    assert "hashes to" in r.corrupt[0][1] or "compressed" in r.corrupt[0][1]


def test_fsck_reports_corrupt_unreachable_object(local_store: castore.Store) -> None:
    fill(local_store)
    oid, canonical = o.encode(Blob(b"orphan"))
    layout.replace(local_store, oid, o.to_stored(canonical)[:-1] + b"?")
    r = maintenance.fsck(local_store)
    assert [x for x, _ in r.corrupt] == [oid]
    assert oid in r.unreachable


def test_fsck_reports_ref_to_missing_commit(local_store: castore.Store) -> None:
    fill(local_store)
    ghost = "ab" * 32
    local_store.refs.swap("sessions/app/alice/s9/heads/main", ghost, None)
    r = maintenance.fsck(local_store)
    assert r.missing == [(ghost, "ref sessions/app/alice/s9/heads/main")]


def test_fsck_reports_garbage_ref(local_store: castore.Store) -> None:
    fill(local_store)
    local_store.storage.write("refs/sessions/app/alice/s1/tags/junk", b"\xff\xfe not a ref \x00")
    r = maintenance.fsck(local_store)
    assert [ref for ref, _ in r.bad_refs] == ["sessions/app/alice/s1/tags/junk"]
    assert not r.ok


def test_fsck_reports_ref_that_names_a_non_commit(local_store: castore.Store) -> None:
    s = fill(local_store)
    body = body_of(local_store, s.head)
    local_store.refs.swap("sessions/app/alice/s1/tags/odd", body, None)
    r = maintenance.fsck(local_store)
    assert r.bad_refs and r.bad_refs[0][0] == "sessions/app/alice/s1/tags/odd"
    assert "not a commit" in r.bad_refs[0][1]


def test_fsck_reports_link_to_object_of_wrong_kind(local_store: castore.Store) -> None:
    s = fill(local_store)
    parent = local_store.history.commit(s.head)
    vid = local_store.objects.put(Value("not a tree"))
    bad = o.Commit(kind="message", parents=(o.raw_id(s.head),), state=o.raw_id(vid), depth=parent.depth + 1)
    cid = local_store.objects.put(bad)
    local_store.refs.swap("sessions/app/alice/s1/tags/bad", cid, None)
    r = maintenance.fsck(local_store)
    assert [(x, "where" in why) for x, why in r.corrupt] == [(vid, True)]


def test_fsck_lists_unreachable_objects_and_stays_ok(local_store: castore.Store) -> None:
    fill(local_store)
    orphan = local_store.objects.put(Value("written by a writer that crashed before its ref"))
    r = maintenance.fsck(local_store)
    assert r.ok
    assert r.unreachable == [orphan] and r.dangling == [orphan]


def test_fsck_reports_deleted_session_content_as_unreachable_not_damage(local_store: castore.Store) -> None:
    fill(local_store, "s1")
    fill(local_store, "s2")
    local_store.delete_session("app", "alice", "s1")
    r = maintenance.fsck(local_store)
    assert r.ok and len(r.unreachable) >= 10
    assert len(r.dangling) == 1  # the deleted tip commit names the rest


def _hold_lock(root: str, ref: str) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, CHILD, "hold-lock", root, ref], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "locked"
    return child


def test_fsck_reports_stale_lock_of_killed_writer_and_gc_clears_it(local_store: castore.Store) -> None:
    s = fill(local_store)
    ref = "refs/sessions/app/alice/s1/heads/main"
    child = _hold_lock(local_store.storage.root, ref)
    try:
        assert maintenance.fsck(local_store).stale_locks == []  # a live writer's lock is not stale
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
    r = maintenance.fsck(local_store)
    assert r.stale_locks == [ref + ".lock"] and not r.ok
    assert maintenance.gc(local_store, grace=0).locks_cleared == [ref + ".lock"]
    assert maintenance.fsck(local_store).ok
    s.append(castore.Message(role="user", content="after the crash"))


def test_stale_lock_is_cleared_by_next_writer(local_store: castore.Store) -> None:
    s = fill(local_store)
    child = _hold_lock(local_store.storage.root, "refs/sessions/app/alice/s1/heads/main")
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()  # type: ignore[union-attr]
    s.append(castore.Message(role="user", content="next"))
    assert maintenance.fsck(local_store).ok


def test_fsck_cli_exits_1_with_json_report_when_damaged(local_store: castore.Store) -> None:
    s = fill(local_store)
    body = body_of(local_store, s.head)
    layout.delete(local_store, body)
    local_store.storage.write("refs/sessions/app/alice/s1/tags/junk", b"garbage")
    result = run_cli(local_store.url, "fsck", "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False
    assert doc["missing"] == [{"id": body, "from": s.head}]
    assert doc["bad_refs"][0]["ref"] == "sessions/app/alice/s1/tags/junk"
    text = run_cli(local_store.url, "fsck")
    assert text.exit_code == 1
    assert f"missing: {body}" in text.stdout and "damaged: 1 missing" in text.stdout


def test_fsck_cli_on_healthy_store_says_ok(local_store: castore.Store) -> None:
    fill(local_store)
    local_store.objects.put(Value("orphan"))
    result = run_cli(local_store.url, "fsck")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith("ok")
    assert "1 unreachable object " in result.stdout


def test_fsck_cli_without_store_is_an_error(tmp_path: Path) -> None:
    result = run_cli(str(tmp_path / "none"), "fsck")
    assert result.exit_code == 1 and "no castore store" in result.stderr


# -- gc ---------------------------------------------------------------------------------------
def test_gc_removes_only_unreachable_objects_older_than_grace(local_store: castore.Store) -> None:
    s = fill(local_store)
    before = s.messages()
    old = local_store.objects.put(Value("old orphan"))
    backdate(local_store, [old, s.head])  # an old reachable object must stay too
    young = local_store.objects.put(Value("young orphan"))  # format 2: in a pack of its own age
    local_store.objects.close()  # the writer is idle (format 2: gc never takes a held log)
    r = maintenance.gc(local_store, grace=7 * 86400)
    assert r.deleted == [old] and r.kept_young == 1 and r.bytes_freed > 0
    assert old not in layout.stored_ids(local_store)
    assert young in layout.stored_ids(local_store)
    assert castore.open(local_store.url).session("app", "alice", "s1").messages() == before
    assert maintenance.fsck(local_store).ok


def test_gc_dry_run_deletes_nothing(local_store: castore.Store) -> None:
    fill(local_store)
    orphan = local_store.objects.put(Value("orphan"))
    local_store.objects.close()  # the writer is idle (format 2: gc never takes a held log)
    r = maintenance.gc(local_store, grace=0, dry_run=True)
    assert r.deleted == [orphan] and r.dry_run
    assert orphan in layout.stored_ids(local_store)


class PausedSwaps(PassThrough):
    """A storage whose ref swaps wait for a signal: a writer caught between objects and ref."""

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self.entered, self.release = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_many(self, items: Any) -> None:
        self.inner.write_many(items)

    def read_many(self, keys: Any) -> Any:
        return self.inner.read_many(keys)

    def swap(self, key: str, data: bytes, expect: Any) -> Any:
        if key.startswith("refs/sessions/"):
            self.entered.set()
            assert self.release.wait(60)
        return self.inner.swap(key, data, expect)

    def mtime(self, key: str) -> float | None:
        return self.inner.mtime(key)


def test_gc_keeps_objects_of_in_flight_writer_within_grace(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    fill(castore.open(url))
    paused = PausedSwaps(LocalStorage(url))
    writer_store = castore.Store(paused)
    result: list[str] = []
    t = threading.Thread(target=lambda: result.append(
        writer_store.session("app", "alice", "s1").append(castore.Message(role="user", content="in flight"))))
    t.start()
    try:
        assert paused.entered.wait(60)  # its objects are written, its ref not yet moved
        gc_store = castore.open(url)
        in_flight = maintenance.fsck(gc_store).unreachable
        assert len(in_flight) >= 2
        # Without the grace period they would go: this is what the grace protects.
        assert set(maintenance.gc(gc_store, grace=0, dry_run=True).deleted) == set(in_flight)
        r = maintenance.gc(gc_store, grace=3600)
        assert r.deleted == [] and r.kept_young == len(in_flight)
    finally:
        paused.release.set()
        t.join()
    s = castore.open(url).session("app", "alice", "s1")
    assert s.head == result[0] and s.messages()[-1].content == "in flight"
    assert maintenance.fsck(castore.open(url)).ok


def test_gc_keeps_index_named_only_by_a_ref_hint(local_store: castore.Store) -> None:
    # 64 appends close a segment block: the new index is named by the branch ref's hint
    # alone until the next append names it from its commit.
    s = local_store.session("app", "alice", "s1")
    s.append_many([castore.Message(role="user", content=f"m{i}") for i in range(64)])
    r = maintenance.gc(local_store, grace=0)
    assert r.deleted == []
    castore.open(local_store.url).session("app", "alice", "s1").append(castore.Message(role="user", content="65th"))
    assert maintenance.fsck(local_store).ok


def test_delete_session_then_gc_forgets_only_what_that_session_held(store: castore.Store) -> None:
    shared_prompt = castore.Message(role="system", content="You are a helpful assistant. " * 20)
    s1 = store.session("app", "alice", "s1")
    s2 = store.session("app", "bob", "s2")
    s1.append(shared_prompt)
    s2.append(shared_prompt)
    secret = s1.append(castore.Message(role="user", content="my card number is 4111 1111 1111 1111"),
                       state_delta={"address": "1 Secret Lane " * 30})
    s2.append(castore.Message(role="user", content="hello"))
    secret_body = body_of(store, secret)
    shared_body = body_of(store, s1.resolve("HEAD~1"))
    assert shared_body == body_of(store, s2.resolve("HEAD~1"))
    s1_objects = maintenance.reachable(store)
    s2_before = s2.messages()
    store.delete_session("app", "alice", "s1")
    r = maintenance.gc(store, grace=0)  # the same handle: gc seals its own log first
    assert secret_body in r.deleted and secret in r.deleted
    assert secret_body not in layout.stored_ids(store)
    assert shared_body in layout.stored_ids(store)
    left = set(store.objects.iter_ids())
    assert left == maintenance.reachable(store) and left < s1_objects | left
    fresh = castore.Store.open(store.url, **_options(store))
    assert fresh.session("app", "bob", "s2").messages() == s2_before
    assert not fresh.session("app", "alice", "s1").exists()
    assert maintenance.fsck(fresh).ok and maintenance.fsck(fresh).unreachable == []


def _options(store: castore.Store) -> dict[str, Any]:
    # reopen the same store: S3 needs the endpoint options the fixture used
    endpoint = getattr(store.storage, "endpoint", None)
    if store.url.startswith("s3://") and endpoint:
        sys.path.insert(0, str(HERE))
        import s3server

        return s3server.storage_options(endpoint)
    return {}


def test_gc_refuses_damaged_store(local_store: castore.Store) -> None:
    s = fill(local_store)
    layout.delete(local_store, body_of(local_store, s.head))
    orphan = local_store.objects.put(Value("orphan"))
    local_store.objects.close()  # the writer is idle (format 2: gc never takes a held log)
    with pytest.raises(castore.CastoreError, match="run `castore fsck`"):
        maintenance.gc(local_store, grace=0)
    assert orphan in layout.stored_ids(local_store)


def test_gc_keeps_objects_of_unknown_age_unless_grace_is_zero(local_store: castore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(local_store)
    orphan = local_store.objects.put(Value("orphan"))
    local_store.objects.close()  # the writer is idle (format 2: gc never takes a held log)
    monkeypatch.setattr(LocalStorage, "mtime", lambda self, key: None)
    assert maintenance.gc(local_store, grace=60).deleted == []
    assert maintenance.gc(local_store, grace=0).deleted == [orphan]


def test_gc_cli_json_and_text(local_store: castore.Store) -> None:
    fill(local_store)
    orphan = local_store.objects.put(Value("orphan"))
    local_store.objects.close()  # the writer is idle (format 2: gc never takes a held log)
    dry = run_cli(local_store.url, "gc", "--grace", "0", "--dry-run", "--json")
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout)["ids"] == [orphan] and json.loads(dry.stdout)["dry_run"] is True
    kept = run_cli(local_store.url, "gc")
    assert kept.exit_code == 0 and "kept 1 unreachable object younger than 2w" in kept.stdout
    done = run_cli(local_store.url, "gc", "--grace=0s")
    assert done.exit_code == 0 and "deleted 1 unreachable object " in done.stdout
    assert orphan not in layout.stored_ids(local_store)
    bad = run_cli(local_store.url, "gc", "--grace", "soon")
    assert bad.exit_code == 2 and "not a duration" in bad.stderr


@pytest.mark.parametrize(("text", "seconds"), [("2w", 14 * 86400), ("3d", 3 * 86400), ("12h", 43200),
                                               ("30m", 1800), ("45s", 45), ("0", 0), (" 1.5H ", 5400)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert maintenance.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "w", "-1d", "soon", "nan", "inf", "1y"])
def test_parse_duration_rejects_nonsense(text: str) -> None:
    with pytest.raises(castore.CastoreError, match="not a duration"):
        maintenance.parse_duration(text)


def test_gc_removes_temporary_files_of_cut_short_writes_but_not_recent_ones(local_store: castore.Store) -> None:
    s = fill(local_store)
    root = Path(local_store.storage.root)
    some = root / "objects" / "ab" / ("cd" * 31)  # where a loose object's write would put its temporary file
    some.parent.mkdir(parents=True, exist_ok=True)
    old = some.with_name(some.name + ".tmp-" + "a" * 32)
    fresh = some.with_name(some.name + ".tmp-" + "b" * 32)
    old.write_bytes(b"half an object")
    fresh.write_bytes(b"a write in progress")
    two_hours_ago = time.time() - 2 * 3600
    os.utime(old, (two_hours_ago, two_hours_ago))
    rel = str(old.relative_to(root))
    r = maintenance.fsck(local_store)
    assert r.ok and r.stale_temps == [rel]  # harmless, listed, not damage
    out = CliRunner().invoke(main, ["--store", local_store.url, "fsck"])
    assert out.exit_code == 0 and "1 temporary file left by cut-short writes" in out.output
    assert maintenance.gc(local_store, grace=0, dry_run=True).temps_cleared == [] and old.exists()
    assert maintenance.gc(local_store, grace=0).temps_cleared == [rel]
    assert not old.exists() and fresh.exists()
    assert len(s.messages()) == 5 and maintenance.fsck(local_store).ok
