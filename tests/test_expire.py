"""Nothing grows forever (issue 37): reflog entries expire (``castore reflog expire``), sessions
not updated for a while are deleted (``castore expire``, the ``retention`` setting), and gc
applies both settings of ``castore.json``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import layout
import pytest
from click.testing import CliRunner
from conftest import Backend, backend_on
from helpers.storage import PassThrough

import castore
from castore import maintenance
from castore.cli import main
from castore.storage import Storage, Token, open_storage

backend = backend_on("local", "s3")


def has(store: castore.Store, oid: str) -> bool:
    """Whether ``oid`` is stored (a fresh handle's listing)."""
    return oid in layout.stored_ids(store)
DAY = 86400.0


def _reset_away(store: castore.Store, sid: str, text: str) -> str:
    """A session whose last message ``text`` was reset away: only its reflog keeps it."""
    s = store.session("app", "alice", sid)
    s.append(castore.Message(role="user", content="kept"))
    dropped = s.append(castore.Message(role="user", content=text))
    s.reset("HEAD~1")
    return dropped


def test_reflog_expire_drops_old_entries_and_gc_then_frees_what_only_they_kept(backend: Backend) -> None:
    store = backend.open()
    dropped = _reset_away(store, "s1", "dropped by reset")
    s = store.session("app", "alice", "s1")
    assert len(s.reflog()) == 1
    maintenance.gc(store, grace=0)
    assert has(store, dropped)  # the reflog keeps it
    assert maintenance.expire_reflogs(store, 90 * DAY) == {}  # younger than 90 days: kept
    assert maintenance.expire_reflogs(store, 90 * DAY, dry_run=True, now=time.time() + 91 * DAY) == {
        ("app", "alice", "s1"): 1}
    assert len(s.reflog()) == 1
    assert maintenance.expire_reflogs(store, 90 * DAY, now=time.time() + 91 * DAY) == {("app", "alice", "s1"): 1}
    assert s.reflog() == []
    maintenance.gc(store, grace=0)
    assert not has(store, dropped)
    assert [m.content for m in s.messages()] == ["kept"]
    assert maintenance.fsck(store).ok
    store.close()


def test_reflog_expire_keeps_the_entries_younger_than_the_age(local_store: castore.Store,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(castore.Message(role="user", content="one"))
    old_tip = s.append(castore.Message(role="user", content="two"))
    real = time.time
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: real() - 100 * DAY)  # a reset a hundred days ago
        s.reset("HEAD~1")
    new_tip = s.append(castore.Message(role="user", content="three"))
    s.reset("HEAD~1")  # now
    assert [e["old"] for e in s.reflog()] == [new_tip, old_tip]
    assert maintenance.expire_reflogs(local_store, 90 * DAY) == {("app", "alice", "s1"): 1}
    assert [e["old"] for e in s.reflog()] == [new_tip]
    maintenance.gc(local_store, grace=0)
    assert not has(local_store, old_tip) and has(local_store, new_tip)


def test_expire_deletes_the_sessions_not_updated_since(backend: Backend) -> None:
    store = backend.open()
    now = time.time()
    store.session("app", "alice", "old").append(castore.Message(role="user", content="x"), time=now - 100 * DAY)
    old_other = store.session("other", "bob", "old2")
    old_other.append(castore.Message(role="user", content="y"), time=now - 100 * DAY)
    store.session("app", "alice", "new").append(castore.Message(role="user", content="z"), time=now - 10 * DAY)
    mixed = store.session("app", "alice", "mixed")  # an old main, a recent branch: updated
    mixed.append(castore.Message(role="user", content="w"), time=now - 100 * DAY)
    mixed.branch("b2")
    mixed.checkout("b2")
    mixed.append(castore.Message(role="user", content="v"), time=now - DAY)

    dry = maintenance.expire_sessions(store, 90 * DAY, app="app", dry_run=True)
    assert [k[:3] for k in dry.sessions] == [("app", "alice", "old")]
    assert store.session("app", "alice", "old").exists()
    got = maintenance.expire_sessions(store, 90 * DAY, app="app")
    assert [k[:3] for k in got.sessions] == [("app", "alice", "old")]
    assert not store.session("app", "alice", "old").exists()
    assert old_other.exists() and mixed.exists() and store.session("app", "alice", "new").exists()
    assert [k[:3] for k in maintenance.expire_sessions(store, 90 * DAY).sessions] == [("other", "bob", "old2")]
    store.close()


def test_gc_applies_the_retention_and_reflog_settings(backend: Backend) -> None:
    store = backend.open()
    now = time.time()
    store.session("app", "alice", "old").append(castore.Message(role="user", content="x"), time=now - 100 * DAY)
    dropped = _reset_away(store, "s1", "dropped by reset")
    store.update_config(lambda c: {**c, "retention": "90d", "reflog_expire": "0"})
    report = maintenance.gc(store, grace=0)
    assert [k[:3] for k in report.expired.sessions] == [("app", "alice", "old")]  # type: ignore[union-attr]
    assert report.reflog_expired == 1 and report.to_dict()["sessions_expired"][0]["session"] == "old"
    assert not store.session("app", "alice", "old").exists() and not has(store, dropped)
    store.update_config(lambda c: {**c, "retention": "soon"})
    with pytest.raises(castore.CastoreError, match="retention is not a duration"):
        maintenance.gc(store, grace=0)
    store.close()


def test_expire_and_reflog_expire_commands(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    store = castore.open(url)
    now = time.time()
    store.session("app", "alice", "old").append(castore.Message(role="user", content="x"), time=now - 100 * DAY)
    store.session("app", "alice", "new").append(castore.Message(role="user", content="y"))
    _reset_away(store, "s1", "gone")
    store.close()

    def run(*args: str) -> tuple[int, str]:
        r = CliRunner().invoke(main, ["--store", url, *args])
        return r.exit_code, r.output

    code, out = run("expire", "--older-than", "90d", "--dry-run", "--json")
    assert code == 0 and [e["session"] for e in json.loads(out)["expired"]] == ["old"]
    code, out = run("expire", "--older-than", "90d", "--app", "app")
    assert code == 0 and "deleted app/alice/old" in out
    code, out = run("expire", "--older-than", "90d")
    assert code == 0 and "nothing to expire" in out
    code, out = run("expire", "--older-than", "soon")
    assert code == 2 and "not a duration" in out
    code, out = run("reflog", "expire", "--older-than", "0", "--json")
    assert code == 0 and json.loads(out) == {"expired": [{"app": "app", "user": "alice", "session": "s1",
                                                         "entries": 1}], "dry_run": False}
    code, out = run("reflog", "-s", "app/alice/s1")
    assert code == 0 and out == "no moves: no tip was overwritten\n"  # on stderr: stdout lists nothing
    code, out = run("reflog", "expire")
    assert code == 2 and "--older-than" in out


class _AppendBeforeDelete(PassThrough):
    """A storage on which another process's append (``then``) lands just before the first ref
    delete: a writer updating the session between expire's read of its refs and its deletion."""

    def __init__(self, inner: Storage, then: Callable[[], None]) -> None:
        super().__init__(inner)
        self.then: Callable[[], None] | None = then

    def delete(self, key: str, expect: Token | None = None) -> None:
        then, self.then = self.then, None
        if then is not None:
            then()
        self.inner.delete(key, expect)


def test_expire_keeps_a_session_a_writer_updates_while_it_deletes(backend: Backend) -> None:
    """expire deletes each ref of an idle session only if it still holds what was read, its current
    branch first: an append landing between its read and its delete stops the deletion, and the
    session is kept with the new entry, its HEAD without the deleting mark. (Each delete was
    unconditional: the refs were read without their tokens, so the appended entry, acknowledged
    to its writer, was deleted with the session.) A writer that reads HEAD once it is marked
    deleting is refused instead (castore.deletion): nothing acknowledged is deleted either way."""
    holder = backend.open()
    held = holder.session("app", "alice", "idle")  # this handle keeps HEAD from before the mark
    held.append(castore.Message(role="user", content="old"), time=time.time() - 100 * DAY)
    held.label("v1")
    refused: list[Exception] = []

    def writer() -> None:
        held.append(castore.Message(role="user", content="new"))
        with backend.open() as w, pytest.raises(castore.SessionDeleting) as e:
            w.session("app", "alice", "idle").append(castore.Message(role="user", content="refused"))
        refused.append(e.value)

    wrapped = castore.Store(_AppendBeforeDelete(open_storage(backend.url, **{
        k: v for k, v in backend.options.items() if k != "layout"}), writer))
    report = maintenance.expire_sessions(wrapped, 90 * DAY)
    assert report.sessions == [] and len(refused) == 1
    holder.close()
    with backend.open() as again:
        kept = again.session("app", "alice", "idle")
        assert [m.content for m in kept.messages()] == ["old", "new"]
        kept.append(castore.Message(role="user", content="later"))
        assert maintenance.fsck(again).ok
