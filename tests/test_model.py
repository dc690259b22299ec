"""A stateful model test: random sequences of what users do to two stores, checked against a
plain reference model (``tests/helpers/sessionmodel.py``) after every step.

The operations: create sessions and append messages, branch at a revision, check out (a
branch, or a commit: a detached HEAD), reset, delete a branch, fork at a commit, compact,
push from store A to store B and pull from B into A (with and without force), delete a
session, gc (grace 0: no other writer runs here, or a grace that keeps everything), repack,
and reopening a store (so reads go cold). After every step, on both stores: the sessions
listed, each session's branches, HEAD, remote-tracking branches, ``log`` and ``messages``
of every branch and of HEAD, and ``context`` at HEAD (with and without a budget). At the
end, ``fsck`` of both stores is clean.

It runs on local disk and on the S3 test server, a bounded number of examples here and many
more under ``-m slow``.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import s3server
from helpers.sessionmodel import Commits, Compacted, Path, Said, SessionModel, StoreModel, sync
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import castore
from castore import maintenance
from castore.context import project, summary_message

APP, USER = "app", "u"
SESSIONS = ["s1", "s2", "s3"]
BRANCHES = ["main", "alt", "topic"]
ROLES = ["user", "assistant"]

pick = st.integers(min_value=0, max_value=1 << 16)
store_ix = st.sampled_from([0, 1])
words = st.text(alphabet="abcxyz \u00e9\u4e2d", min_size=0, max_size=12)


def _summary_text(summary: str) -> tuple[str, str]:
    m = summary_message(summary)
    assert isinstance(m.content, str)
    return (m.role, m.content)


def _choose(seq: list[Any], n: int) -> Any:
    return seq[n % len(seq)]


def _session_branch(ref: str) -> tuple[str, str]:
    """(session, branch) of a stored branch or remote-tracking ref name
    (``sessions/APP/USER/SID/heads/NAME``, ``sessions/APP/USER/SID/remotes/R/NAME``)."""
    parts = ref.split("/")
    return parts[3], parts[-1]


class StoresMachine(RuleBasedStateMachine):
    """Two stores (A: index 0, B: index 1, A's remote) and their reference model."""

    #: a fresh, empty place for a store: returns (url, storage options); set per backend
    new_place: ClassVar[Callable[[], tuple[str, dict[str, Any]]]]

    def __init__(self) -> None:
        super().__init__()
        self.places = [type(self).new_place() for _ in range(2)]
        self.stores: list[castore.Store] = [castore.open(url, **opts) for url, opts in self.places]
        #: a second handle open on each store, as another process: :meth:`switch` swaps them
        self.twins: list[castore.Store] = [castore.open(url, **opts) for url, opts in self.places]
        for s in self.stores:
            s.init()
        self.model: list[StoreModel] = [{}, {}]
        self.commits = Commits()
        #: session handles kept between steps (their path views carry over, as an agent's do)
        self.handles: dict[tuple[int, str], castore.Session] = {}  # by (id of the Store, session)

    # -- helpers ------------------------------------------------------------------------------
    def handle(self, i: int, sid: str) -> castore.Session:
        key = (id(self.stores[i]), sid)
        if key not in self.handles:
            self.handles[key] = self.stores[i].session(APP, USER, sid)
        return self.handles[key]

    def existing(self, i: int, n: int) -> tuple[str, SessionModel, castore.Session] | None:
        """A session of store ``i`` (picked by ``n``): its id, model and handle; None if none."""
        names = sorted(self.model[i])
        if not names:
            return None
        sid = _choose(names, n)
        return sid, self.model[i][sid], self.handle(i, sid)

    def at_head(self, i: int, n: int) -> tuple[SessionModel, castore.Session, Path] | None:
        """A session of store ``i`` with a commit at HEAD: its model, handle and HEAD's path."""
        got = self.existing(i, n)
        return (got[1], got[2], got[1].head_path()) if got is not None and got[1].head_path() else None

    # -- sessions -----------------------------------------------------------------------------
    @rule(i=store_ix, n=pick, role=st.sampled_from(ROLES), text=words)
    def append(self, i: int, n: int, role: str, text: str) -> None:
        sid = _choose(SESSIONS, n)
        m = self.model[i].get(sid)
        cid = self.handle(i, sid).append(castore.Message(role=role, content=text))
        if m is None:
            m = self.model[i][sid] = SessionModel()
        m.extend(self.commits.add(cid, m.head_path(), Said(role, text)))

    @rule(i=store_ix, n=pick, b=pick, text=words)
    def append_to_branch(self, i: int, n: int, b: int, text: str) -> None:
        """Append to a named branch, checked out or not (HEAD stays where it is)."""
        if (got := self.existing(i, n)) is None:
            return
        _, m, s = got
        name = _choose(sorted({*BRANCHES, *m.branches}), b)
        if name not in m.branches:
            with pytest.raises(castore.BranchError):
                s.append(castore.Message(role="user", content=text), branch=name)
            return
        cid = s.append(castore.Message(role="user", content=text), branch=name)
        m.branches[name] = self.commits.add(cid, m.branches[name], Said("user", text))

    @rule(i=store_ix, n=pick, k=pick, name=st.sampled_from(BRANCHES), b=pick)
    def branch(self, i: int, n: int, k: int, name: str, b: int) -> None:
        if (got := self.existing(i, n)) is None:
            return
        _, m, s = got
        if not m.branches:
            return
        base = _choose(sorted(m.branches), b)
        path = m.branches[base]
        back = k % len(path)
        if name in m.branches:
            with pytest.raises(castore.BranchError):
                s.branch(name, at=f"{base}~{back}")
            return
        tip = s.branch(name, at=f"{base}~{back}")
        m.branches[name] = path[:len(path) - back]
        assert tip == m.branches[name][-1]

    @rule(i=store_ix, n=pick, b=pick, k=pick, detach=st.booleans())
    def checkout(self, i: int, n: int, b: int, k: int, detach: bool) -> None:
        if (got := self.existing(i, n)) is None:
            return
        _, m, s = got
        name = _choose(sorted({*BRANCHES, *m.branches}), b)
        if detach:
            commits = m.all_commits()
            if not commits:
                return
            cid = _choose(commits, k)
            assert s.checkout(cid) is None
            m.head = self.commits.path[cid]
        elif name in m.branches:
            assert s.checkout(name) == name
            m.head = name
        else:
            with pytest.raises(castore.RevisionNotFound):
                s.checkout(name)

    @rule(i=store_ix, n=pick, k=pick)
    def reset(self, i: int, n: int, k: int) -> None:
        if (got := self.existing(i, n)) is None:
            return
        _, m, s = got
        commits = m.all_commits()
        if not commits:
            return
        cid = _choose(commits, k)
        assert s.reset(cid) == cid
        m.set_head_path(self.commits.path[cid])

    @rule(i=store_ix, n=pick, b=pick, force=st.booleans())
    def delete_branch(self, i: int, n: int, b: int, force: bool) -> None:
        """Delete a branch; without ``force`` only a merged one: its tip on the path of
        another branch, the detached HEAD or a remote-tracking branch."""
        if (got := self.existing(i, n)) is None or not got[1].branches:
            return
        _, m, s = got
        name = _choose(sorted(m.branches), b)
        tip = m.branches[name][-1]
        others = [p for b_, p in m.branches.items() if b_ != name]
        others += [m.head_path()] if not isinstance(m.head, str) else []
        others += [self.commits.path[t] for t in m.tracking.values()]
        if m.head == name or not (force or any(tip in p for p in others)):
            with pytest.raises(castore.BranchError):
                s.delete_branch(name, force=force)
            return
        s.delete_branch(name, force=force)
        del m.branches[name]

    @rule(i=store_ix, n=pick, t=pick, k=pick)
    def fork(self, i: int, n: int, t: int, k: int) -> None:
        if (got := self.at_head(i, n)) is None:
            return
        m, s, path = got
        back = k % len(path)
        target = _choose(SESSIONS, t)
        if target in self.model[i]:
            with pytest.raises(castore.SessionExists):
                s.fork(target, at=f"HEAD~{back}")
            return
        s.fork(target, at=f"HEAD~{back}")
        self.model[i][target] = SessionModel(branches={"main": path[:len(path) - back]})

    @rule(i=store_ix, n=pick, k=pick, summary=words)
    def compact(self, i: int, n: int, k: int, summary: str) -> None:
        if (got := self.at_head(i, n)) is None:
            return
        m, s, path = got
        off = [c for c in m.all_commits() if c not in path]
        if off and k % 4 == 0:  # keep_from off the current path: refused, nothing written
            with pytest.raises(castore.RevisionNotFound):
                s.compact(summary, keep_from=_choose(off, k))
            return
        kept = _choose(list(path), k)
        cid = s.compact(summary, keep_from=kept)
        m.extend(self.commits.add(cid, path, Compacted(summary, kept)))

    @rule(i=store_ix, n=pick)
    def delete_session(self, i: int, n: int) -> None:
        sid = _choose(SESSIONS, n)
        if sid not in self.model[i]:
            with pytest.raises(castore.SessionNotFound):
                self.stores[i].delete_session(APP, USER, sid)
            return
        self.stores[i].delete_session(APP, USER, sid)
        del self.model[i][sid]

    # -- two stores ---------------------------------------------------------------------------
    @rule(force=st.booleans())
    def push(self, force: bool) -> None:
        report = castore.push(self.stores[0], self.stores[1], force=force)
        refused = sync(self.model[0], self.model[1], force=force, pull=False)
        assert {_session_branch(r.ref) for r in report.refs_refused} == refused, report.to_dict()

    @rule(force=st.booleans())
    def pull(self, force: bool) -> None:
        report = castore.pull(self.stores[1], self.stores[0], force=force)
        kept = sync(self.model[1], self.model[0], force=force, pull=True)
        assert report.refs_refused == [], report.to_dict()
        assert {_session_branch(r) for r in report.refs_kept_as_remote} == kept, report.to_dict()

    # -- maintenance --------------------------------------------------------------------------
    @rule(i=store_ix, grace=st.sampled_from([0.0, 0.05, 3600.0]))
    def gc(self, i: int, grace: float) -> None:
        """gc; with a short grace, after waiting it out. What sits in a writer log that a
        live handle holds is never touched, so grace 0 (no other writer) runs with the
        store's other handle closed, and then nothing unreachable may stay; with a grace,
        only fsck is checked."""
        short = grace < 1
        if short:
            time.sleep(grace)
        if grace == 0:
            self.reopen(i, twin=True, run=lambda: maintenance.gc(self.stores[i], grace=0))
        else:
            maintenance.gc(self.stores[i], grace=grace)
        if short:
            report = maintenance.fsck(self.stores[i])
            assert report.ok, report.to_dict()
            if grace == 0:
                assert report.unreachable == [], report.to_dict()

    @rule(i=store_ix, all_packs=st.booleans())
    def repack(self, i: int, all_packs: bool) -> None:
        maintenance.repack(self.stores[i], all_packs=all_packs)

    @rule(i=store_ix)
    def reopen(self, i: int, twin: bool = False, run: Callable[[], object] | None = None) -> None:
        """Close store ``i``'s handle (or its twin), call ``run`` meanwhile, open it again."""
        handles = self.twins if twin else self.stores
        self.handles = {k: v for k, v in self.handles.items() if k[0] != id(handles[i])}
        handles[i].close()
        if run is not None:
            run()
        url, opts = self.places[i]
        handles[i] = castore.open(url, **opts)

    @rule(i=store_ix)
    def switch(self, i: int) -> None:
        """Go on with the other open handle of store ``i``: what it kept (its sessions' path
        views, caches) is stale by now, and must not show."""
        self.stores[i], self.twins[i] = self.twins[i], self.stores[i]

    # -- the check after every step -----------------------------------------------------------
    @invariant()
    def matches_model(self) -> None:
        for i in (0, 1):
            self.check_store(i)

    def check_store(self, i: int) -> None:
        store, model = self.stores[i], self.model[i]
        listed = {si.session: si for si in store.sessions(APP)}
        assert set(listed) == set(model), (i, sorted(listed), sorted(model))
        for sid, m in model.items():
            info = listed[sid]
            head_path = m.head_path()
            assert info.branch == (m.head if isinstance(m.head, str) else None), (i, sid, info)
            assert info.head == (head_path[-1] if head_path else None), (i, sid, info)
            assert info.entries == len(head_path), (i, sid, info)
            s = self.handle(i, sid)
            assert s.branches() == {b: p[-1] for b, p in m.branches.items()}, (i, sid)
            assert s.current_branch == (m.head if isinstance(m.head, str) else None)
            assert s.remote_branches() == m.tracking, (i, sid)
            every = {c for p in [*m.branches.values(), head_path] for c in p}
            every |= {c for t in m.tracking.values() for c in self.commits.path[t]}
            assert {e.id for e in s.log(all_branches=True)} == every, (i, sid)
            for b, p in m.branches.items():
                self.check_path(s, b, p)
            self.check_path(s, "HEAD", head_path)
            msgs = [(x.role, x.content) for x in s.context().messages]
            assert msgs == self.commits.context(head_path, _summary_text), (i, sid)
            budget = s.context(max_messages=2)
            assert budget == project(s.entries(), max_messages=2), (i, sid)

    def check_path(self, s: castore.Session, rev: str, path: Path) -> None:
        assert [e.id for e in s.log(rev)] == list(reversed(path)), (s, rev)
        assert [(x.role, x.content) for x in s.messages(rev)] == self.commits.messages(path), (s, rev)
        if rev == "HEAD" and path:
            assert [e.id for e in s.log(limit=2)] == list(reversed(path[-2:])), s

    def teardown(self) -> None:
        try:
            for store in self.stores:
                report = maintenance.fsck(store)
                assert report.ok, report.to_dict()
        finally:
            for store in [*self.stores, *self.twins]:
                store.close()


# -- backends ----------------------------------------------------------------------------------
def _local(tmp: str) -> Callable[[], tuple[str, dict[str, Any]]]:
    return lambda: (os.path.join(tempfile.mkdtemp(dir=tmp, prefix="place-"), "store"), {})


def _s3(server: s3server.Server) -> Callable[[], tuple[str, dict[str, Any]]]:
    def place() -> tuple[str, dict[str, Any]]:
        bucket = f"m-{uuid.uuid4().hex[:20]}"
        s3server.make_bucket(server.endpoint_url, bucket)
        return f"s3://{bucket}/store", server.storage_options

    return place


def _run(place: Callable[[], tuple[str, dict[str, Any]]], examples: int, steps: int) -> None:
    machine = type("Machine", (StoresMachine,), {"new_place": staticmethod(place)})
    run_state_machine_as_test(machine, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
        suppress_health_check=list(HealthCheck)))


def test_model_local(tmp_path: Any) -> None:
    tmp = str(tmp_path / "places")
    os.makedirs(tmp)
    _run(_local(tmp), examples=50, steps=40)


def test_model_s3(moto_server: s3server.Server) -> None:
    _run(_s3(moto_server), examples=4, steps=12)


@pytest.mark.slow
def test_model_local_long(tmp_path: Any) -> None:
    tmp = str(tmp_path / "places")
    os.makedirs(tmp)
    _run(_local(tmp), examples=400, steps=60)


@pytest.mark.slow
def test_model_s3_long(moto_server: s3server.Server) -> None:
    _run(_s3(moto_server), examples=40, steps=40)
