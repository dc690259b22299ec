"""A session deletion stopped at any step is recognisably a deletion, not damage
(:mod:`castore.deletion`): HEAD carries the deleting mark before any ref goes, so fsck lists
the session as "deletion interrupted" with the command that finishes it (never a lost
branch), gc still runs on the store, a write to the session is refused, and delete-session
or expire finishes it. Before, a deletion killed after the branch went left HEAD with its
born mark and no branch: fsck called it a lost branch, gc refused the whole store, and
expire kept the session forever."""

from __future__ import annotations

import html
import json
import threading
import time

import pytest
from click.testing import CliRunner
from conftest import Backend, backend_on
from helpers.storage import PassThrough
from helpers.viewer import served_index

import castore
import castore.grep
import castore.usage
from castore import maintenance
from castore.cli import main
from castore.refnames import META_DELETING
from castore.storage import Storage, Token, open_storage

backend = backend_on("local", "s3")
KEY = ("app", "alice", "doomed")


class Killed(KeyboardInterrupt):
    """What the wrapper raises: the deleting process dies there (Ctrl-C, kill -9)."""


class KillAt(PassThrough):
    """Storage whose ``at``-th ref change (a swap or a delete under ``refs/``, 1-based) never
    happens: the process is killed just before it."""

    def __init__(self, inner: Storage, at: int) -> None:
        super().__init__(inner)
        self.at, self.seen = at, 0

    def _step(self, key: str) -> None:
        if key.startswith("refs/"):
            self.seen += 1
            if self.seen == self.at:
                raise Killed

    def swap(self, key: str, data: bytes, expect: Token | None) -> Token:
        """See :meth:`Storage.swap`."""
        self._step(key)
        return self.inner.swap(key, data, expect)

    def delete(self, key: str, expect: Token | None = None) -> None:
        """See :meth:`Storage.delete`."""
        self._step(key)
        self.inner.delete(key, expect)


def _seed(backend: Backend) -> None:
    """A session with history on two branches and a label, and a neighbour that stays."""
    with backend.open() as st:
        s = st.session(*KEY)
        s.append(castore.Message(role="user", content="hello"), time=time.time() - 400 * 86400)
        s.branch("side")
        s.label("v1")
        s.append(castore.Message(role="user", content="more"), time=time.time() - 400 * 86400)
        st.session("app", "alice", "kept").append(castore.Message(role="user", content="stays"))


def _killed_at(backend: Backend, at: int, key: tuple[str, str, str] = KEY) -> KillAt:
    storage = KillAt(open_storage(backend.url, **backend.options), at)
    with castore.Store(storage) as st, pytest.raises(Killed):
        st.delete_session(*key)
    return storage


def _deletion_steps(backend: Backend) -> int:
    storage = KillAt(open_storage(backend.url, **backend.options), 0)
    with castore.Store(storage) as st:
        st.delete_session(*KEY)
    return storage.seen


def _gone(st: castore.Store) -> None:
    assert not st.session(*KEY).exists()
    assert not st.refs.list("sessions/app/alice/doomed")
    assert [m.content for m in st.session("app", "alice", "kept").messages()] == ["stays"]
    report = maintenance.fsck(st)
    assert report.ok and not report.deleting and not report.bad_refs, report


@pytest.mark.parametrize("finisher", ["delete-session", "expire"])
def test_a_deletion_killed_at_each_step_is_reported_and_finished(backend: Backend, finisher: str) -> None:
    first = Backend(backend.name, f"{backend.url}-all", backend.options)
    _seed(first)
    steps = _deletion_steps(first)
    assert steps >= 5  # mark HEAD, delete main, side, the label, ..., HEAD
    for at in range(1, steps + 1):
        b = Backend(backend.name, f"{backend.url}-{at}", backend.options)
        _seed(b)
        _killed_at(b, at)
        with b.open() as st:
            head = st.refs.read("sessions/app/alice/doomed/HEAD")
            report = maintenance.fsck(st)
            assert not report.bad_refs, (at, report.bad_refs)  # never a lost branch
            if at == 1:  # killed before the mark: nothing changed
                assert head is not None and META_DELETING not in head.meta and not report.deleting
                continue
            assert head is not None and isinstance(head.meta[META_DELETING], float), at
            assert report.deleting == [("sessions/app/alice/doomed",
                                        "deletion interrupted: finish it with `castore delete-session app/alice/doomed`")]
            maintenance.gc(st, grace=0)  # not refused: a deletion under way is not damage
            s = st.session(*KEY)
            with pytest.raises(castore.SessionDeleting, match="castore delete-session app/alice/doomed"):
                s.append(castore.Message(role="user", content="late"))
            with pytest.raises(castore.SessionDeleting):
                s.set_info({"x": 1})
            if at == 2:  # marked, nothing deleted yet
                with pytest.raises(castore.SessionDeleting):
                    s.checkout("side")
            if finisher == "delete-session":
                st.delete_session(*KEY)
            else:
                got = maintenance.expire_sessions(st, 10 ** 9)  # whatever its age: it was being deleted
                assert [x[:3] for x in got.sessions] == [KEY]
            _gone(st)
            st.session(*KEY).append(castore.Message(role="user", content="anew"))  # the name is free again
            assert [m.content for m in st.session(*KEY).messages()] == ["anew"]


def test_fsck_and_delete_session_commands_on_an_interrupted_deletion(tmp_path) -> None:
    backend = Backend("local", str(tmp_path / "st"))
    _seed(backend)
    _killed_at(backend, 3)  # HEAD marked, main deleted: the old lost-branch case
    runner = CliRunner()
    out = runner.invoke(main, ["--store", backend.url, "fsck"])
    assert out.exit_code == 0, out.output
    assert ("notice: sessions/app/alice/doomed: deletion interrupted: finish it with "
            "`castore delete-session app/alice/doomed`") in out.output
    assert runner.invoke(main, ["--store", backend.url, "gc"]).exit_code == 0
    out = runner.invoke(main, ["--store", backend.url, "delete-session", "app/alice/doomed"])
    assert out.exit_code == 0, out.output
    with backend.open() as st:
        _gone(st)


def test_expire_keeps_a_session_written_to_after_its_deletion_began_and_takes_the_mark_off(tmp_path) -> None:
    """A deletion marked HEAD and was killed; a writer holding HEAD from before the mark
    appended on (its branch swap still matched): expire finds the branch newer than the mark,
    keeps the session and takes the mark off, so that writes work again."""
    backend = Backend("local", str(tmp_path / "st"))
    _seed(backend)
    with backend.open() as writer:
        w = writer.session(*KEY)
        w.append(castore.Message(role="user", content="warm"))  # this handle keeps HEAD
        _killed_at(backend, 2)  # marked; nothing deleted
        w.append(castore.Message(role="user", content="after the mark"))
    with backend.open() as st:
        assert maintenance.expire_sessions(st, 10 ** 9).sessions == []
        head = st.refs.read("sessions/app/alice/doomed/HEAD")
        assert head is not None and META_DELETING not in head.meta
        s = st.session(*KEY)
        s.append(castore.Message(role="user", content="again"))
        assert [m.content for m in s.messages()][-3:] == ["warm", "after the mark", "again"]
        assert maintenance.fsck(st).ok and not maintenance.fsck(st).deleting


class _During(PassThrough):
    """Storage that runs ``then`` once, just before the ``nth`` call of ``op`` (``list``,
    ``swap``) whose key has ``key`` in it: another process's step at that moment."""

    def __init__(self, inner: Storage, op: str, key: str, nth: int, then) -> None:
        super().__init__(inner)
        self.op, self.key, self.nth, self.then, self.seen = op, key, nth, then, 0

    def _at(self, op: str, key: str) -> None:
        if op == self.op and self.key in key:
            self.seen += 1
            if self.seen == self.nth:
                self.then()

    def list(self, prefix: str) -> list[str]:
        """See :meth:`Storage.list`."""
        self._at("list", prefix)
        return self.inner.list(prefix)

    def swap(self, key: str, data: bytes, expect: Token | None) -> Token:
        """See :meth:`Storage.swap`."""
        self._at("swap", key)
        return self.inner.swap(key, data, expect)


def _whole_or_gone(st: castore.Store, acked: list[str]) -> None:
    """The session is gone (no ref of it left: nothing to come back under its name) or whole
    with every acknowledged entry; fsck finds nothing either way."""
    left = st.refs.list("sessions/app/alice/doomed")
    report = maintenance.fsck(st)
    assert report.ok and not report.bad_refs and not report.deleting, report
    if left:
        assert "sessions/app/alice/doomed/HEAD" in left, left
        assert [m.content for m in st.session(*KEY).messages()][-len(acked):] == acked
    maintenance.gc(st, grace=0)
    st.session(*KEY).append(castore.Message(role="user", content="anew"))
    got = [m.content for m in st.session(*KEY).messages()]
    assert got == (acked if left else []) + ["anew"], got


def test_a_deletion_racing_the_first_append_after_set_info_leaves_no_branch_behind(tmp_path) -> None:
    """A writer whose handle made HEAD (set_info) lands the session's first branch after a
    deletion marked HEAD and listed the refs: the deletion then deleted HEAD and left the branch,
    listed by nothing, whose content came back in the next session started under the name. The
    writer now reads the marked HEAD after its branch landed, takes the branch back and is
    refused."""
    url = str(tmp_path / "st")
    acked: list[str] = []
    with castore.open(url) as ws:
        w = ws.session(*KEY)
        w.set_info({"title": "t"})  # this handle keeps HEAD, unborn

        def append() -> None:
            with pytest.raises(castore.SessionDeleting):
                w.append(castore.Message(role="user", content="late"))

        with castore.Store(_During(open_storage(url), "list", "alice/doomed", 2, append)) as st:
            st.delete_session(*KEY)  # the second listing: the one after the mark
        w.append(castore.Message(role="user", content="after"))  # HEAD gone: a new session
        acked.append("after")
    with castore.open(url) as st:
        _whole_or_gone(st, acked)


def test_the_finishing_command_names_the_session_by_its_key_not_by_what_head_says(tmp_path) -> None:
    """HEAD's recorded names are any writer's (a damaged or hand-written ref): fsck's line for an
    interrupted deletion named the session HEAD said, so running it deleted another session."""
    backend = Backend("local", str(tmp_path / "st"))
    _seed(backend)
    _killed_at(backend, 2)
    with backend.open() as st:
        head = st.refs.read("sessions/app/alice/doomed/HEAD")
        assert head is not None
        said = {**head.meta, "names": {"app": "app", "user": "alice", "session": "kept"}}
        st.plumbing.swap(head.name, head.target, head, {k: v for k, v in said.items() if k != "w"})
        assert maintenance.fsck(st).deleting == [("sessions/app/alice/doomed",
                                                  "deletion interrupted: finish it with "
                                                  "`castore delete-session app/alice/doomed`")]


@pytest.mark.parametrize("when", [-30 * 86400.0, 30 * 86400.0], ids=["past", "future"])
def test_expire_tells_a_write_after_the_mark_by_what_the_refs_name_not_by_entry_times(tmp_path, when: float) -> None:
    """An entry's time is the caller's (an import's transcript time, a clock ahead), not when it
    was written: a writer holding HEAD from before the mark that appends an entry dated before the
    mark is still a write after it (expire keeps the session: nothing acknowledged is deleted),
    and a branch whose newest entry is dated in the future, untouched since the mark, does not
    keep an interrupted deletion from being finished."""
    backend = Backend("local", str(tmp_path / "st"))
    _seed(backend)
    if when > 0:
        with backend.open() as st:  # the seed's entries are 400 days old: one on side dated ahead
            st.session(*KEY).append(castore.Message(role="user", content="ahead"), time=time.time() + when,
                                    branch="side")
        _killed_at(backend, 3)  # marked, main deleted; side and the label left
        with backend.open() as st:
            assert [x[:3] for x in maintenance.expire_sessions(st, 10 ** 9).sessions] == [KEY]
            _gone(st)
        return
    with backend.open() as writer:
        w = writer.session(*KEY)
        w.append(castore.Message(role="user", content="warm"), time=time.time() + when)  # keeps HEAD
        _killed_at(backend, 2)  # marked; nothing deleted
        w.append(castore.Message(role="user", content="after the mark"), time=time.time() + when)
    with backend.open() as st:
        assert maintenance.expire_sessions(st, 10 ** 9).sessions == []
        head = st.refs.read("sessions/app/alice/doomed/HEAD")
        assert head is not None and not set(head.meta) & {META_DELETING, "deleting_refs"}
        assert [m.content for m in st.session(*KEY).messages()][-2:] == ["warm", "after the mark"]


@pytest.mark.parametrize("kind", ["local", pytest.param("seaweedfs", marks=pytest.mark.slow)])
def test_expire_racing_a_writer_leaves_a_whole_session_or_none(kind: str, request, tmp_path) -> None:
    """A writer appends (a handle that keeps HEAD, and fresh handles) while expire deletes the
    session, on storage whose compare-and-swap is atomic: afterwards the session is either gone
    or whole, HEAD without the mark, holding the writer's last acknowledged entry; fsck reports
    no lost branch and no interrupted deletion. A writer is refused (SessionDeleting) or loses
    a swap only while the deletion runs."""
    from conftest import make_backend

    b = make_backend(kind, request, tmp_path)
    with b.open() as st:
        st.session(*KEY).append(castore.Message(role="user", content="0"), time=time.time() - 10)
    acked: list[str] = []
    stop = threading.Event()

    def write() -> None:
        with b.open() as w:
            kept = w.session(*KEY)
            for i in range(1, 400):
                if stop.is_set():
                    return
                try:
                    (kept if i % 2 else w.session(*KEY)).append(castore.Message(role="user", content=str(i)))
                    acked.append(str(i))
                except (castore.SessionDeleting, castore.RefConflict):
                    return  # refused: nothing acknowledged

    t = threading.Thread(target=write)
    t.start()
    try:
        with b.open() as st:
            while not acked:
                time.sleep(0.001)
            maintenance.expire_sessions(st, 0)
    finally:
        stop.set()
        t.join()
    with b.open() as st:
        report = maintenance.fsck(st)
        assert not report.bad_refs and not report.deleting, report
        head = st.refs.read("sessions/app/alice/doomed/HEAD")
        if head is not None:
            assert META_DELETING not in head.meta
            got = [m.content for m in st.session(*KEY).messages()]
            assert got[-1] == acked[-1], (got[-3:], acked[-3:])


def test_a_push_of_a_session_whose_deletion_began_does_not_carry_the_mark(tmp_path) -> None:
    """HEAD marked deleting, its branch still there: a push copies the session, not the
    deletion (the copy's writers are not refused, its fsck lists nothing, expire keeps it)."""
    from castore import sync

    backend = Backend("local", str(tmp_path / "st"))
    _seed(backend)
    _killed_at(backend, 2)
    with backend.open() as st, castore.open(str(tmp_path / "copy")) as dst:
        sync.push(st, dst)
        head = dst.refs.read("sessions/app/alice/doomed/HEAD")
        assert head is not None and META_DELETING not in head.meta
        dst.session(*KEY).append(castore.Message(role="user", content="on the copy"))
        assert not maintenance.fsck(dst).deleting


@pytest.mark.parametrize("at", [2, 3])  # marked with nothing deleted; marked and its branch deleted
def test_listings_mark_an_interrupted_deletion_and_searches_skip_it(tmp_path, monkeypatch, at: int) -> None:
    """``sessions`` (table and --json), ``status`` and the HTML viewer's list show a session
    whose deletion was interrupted, marked with fsck's line (not as an empty session that an
    append would start, which is refused); ``grep`` and ``usage`` skip it, as they would the
    finished deletion. Before, the listings showed it as a healthy (or never-born) session and
    grep searched the branches left."""
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "grep-index"))
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(tmp_path / "usage.json"))
    backend = Backend("local", str(tmp_path / "st"))
    _seed(backend)
    runner = CliRunner()
    assert "doomed" in runner.invoke(main, ["--store", backend.url, "grep", "hello"]).output  # indexed before
    _killed_at(backend, at)
    line = "deletion interrupted: finish it with `castore delete-session app/alice/doomed`"
    out = runner.invoke(main, ["--store", backend.url, "sessions"])
    assert out.exit_code == 0, out.output
    doomed = [x for x in out.output.splitlines() if "doomed" in x]
    assert len(doomed) == 1 and doomed[0].split() == ["app/alice/doomed", *line.split()], out.output
    out = runner.invoke(main, ["--store", backend.url, "sessions", "--json"])
    got = {s["key"]: s for s in json.loads(out.output)["sessions"]}
    assert isinstance(got["app/alice/doomed"]["deleting"], float) and got["app/alice/kept"]["deleting"] is None
    out = runner.invoke(main, ["--store", backend.url, "-s", "app/alice/doomed", "status"])
    assert out.exit_code == 0, out.output
    assert f"deletion: {line}" in out.output and "append" not in out.output, out.output
    out = runner.invoke(main, ["--store", backend.url, "-s", "app/alice/doomed", "status", "--json"])
    assert isinstance(json.loads(out.output)["deleting"], float)
    for args in (["grep", "hello"], ["grep", "-c", "more"]):
        out = runner.invoke(main, ["--store", backend.url, *args])
        assert "doomed" not in out.output, (args, out.output)
    with backend.open() as st:
        for how in ({}, {"index": False}, {"index": False, "scan": False}):  # the index, the scan, the walk
            assert [m.session for m in castore.grep.grep(st, "hello", **how)] == [], how
            assert list(castore.grep.grep(st, "stays", **how)), how  # the neighbour is searched still
        assert ("app", "alice", "doomed") not in castore.usage.all_rows(st)
        page = served_index(st)
    row = next(r for r in page.split("<tr>") if ">doomed<" in r)
    assert html.escape(line) in row, row
    with backend.open() as st:
        st.delete_session(*KEY)
    out = runner.invoke(main, ["--store", backend.url, "sessions"])
    assert "doomed" not in out.output and "kept" in out.output



def test_reading_a_session_whose_deletion_stopped_after_its_branch_went_says_so(tmp_path) -> None:
    """``log``, ``context`` and the library's reads of a session whose deletion was interrupted
    after its branch went (HEAD marked, no branch) name the interrupted deletion and the command
    that finishes it; before, they showed an empty session and exited 0. A deletion stopped
    before the branch went still reads what is there."""
    backend = Backend("local", str(tmp_path / "st"))
    _seed(backend)
    _killed_at(backend, 3)
    runner = CliRunner()
    for args in (["log"], ["context"], ["log", "--oneline"]):
        out = runner.invoke(main, ["--store", backend.url, "-s", "app/alice/doomed", *args])
        assert out.exit_code == 1, (args, out.output)
        assert "`castore delete-session app/alice/doomed`" in out.output, (args, out.output)
    with backend.open() as st:
        with pytest.raises(castore.SessionDeleting):
            st.session(*KEY).messages()
        st.delete_session(*KEY)
        assert not st.session(*KEY).messages()  # finished: the name is free
    other = Backend("local", str(tmp_path / "st2"))
    _seed(other)
    _killed_at(other, 2)  # marked, nothing deleted yet: what is there reads
    with other.open() as st:
        assert [m.content for m in st.session(*KEY).messages()] == ["hello", "more"]


@pytest.mark.parametrize("at", [2, 3])
def test_pull_and_clone_copy_a_session_whose_deletion_began_without_the_mark(backend: Backend, tmp_path,
                                                                               at: int) -> None:
    """Pull and clone share push's rule (``castore.sync``): a session whose deletion began
    and whose branch is still there (``at`` 2) is copied as a session like any other, without
    the mark, from each backend and into each; once its branch went (``at`` 3), nothing of it
    is copied (before, its other branch and label landed with no HEAD: refs nothing lists,
    roots of what the user deleted) and the report says why."""
    from castore import sync

    local = Backend("local", str(tmp_path / "local-src"))
    into = Backend(backend.name, f"{backend.url}-into", backend.options)
    reports = []
    for src, dst in ((backend, Backend("local", str(tmp_path / "pulled"))), (local, into)):
        _seed(src)
        _killed_at(src, at)
        with src.open() as remote, dst.open() as st:
            st.init(like=remote)
            reports.append(sync.pull(remote, st))
    reports.append(sync.clone(backend.url, str(tmp_path / "clone"), **backend.options))
    for copy in (Backend("local", str(tmp_path / "pulled")), into, Backend("local", str(tmp_path / "clone"))):
        with copy.open() as st:
            head = st.refs.read("sessions/app/alice/doomed/HEAD")
            if at == 2:
                assert head is not None and META_DELETING not in head.meta, copy
                s = st.session(*KEY)
                assert [m.content for m in s.messages()] == ["hello", "more"]
                s.append(castore.Message(role="user", content="on the copy"))
                assert not maintenance.fsck(st).deleting
            else:
                assert head is None and st.refs.list("sessions/app/alice/doomed") == [], copy
            assert [m.content for m in st.session("app", "alice", "kept").messages()] == ["stays"]
            assert maintenance.fsck(st).ok
    for r in reports:
        if at == 3:
            assert [ref for ref, _ in r.refs_skipped] == ["sessions/app/alice/doomed/HEAD"], r.refs_skipped
            assert "delete-session app/alice/doomed" in r.refs_skipped[0][1]
        else:
            assert not r.refs_skipped and not r.refs_refused



def _racing_deletion(url: str, deletion: str) -> castore.Store:
    """A store over ``url`` on which KEY's deletion runs just before the first swap of KEY's
    HEAD (after a first write made its branch): ``whole``, or ``marked`` (stopped after its
    first change, which makes a marked HEAD where there was none)."""

    def delete() -> None:
        if deletion == "marked":
            with castore.Store(KillAt(open_storage(url), 2)) as st, pytest.raises(Killed):
                st.delete_session(*KEY)
        else:
            with castore.open(url) as st:
                st.delete_session(*KEY)

    return castore.Store(_During(open_storage(url), "swap", "alice/doomed/HEAD", 1, delete))


def _first_write(how: str, ws: castore.Store, cid: str) -> None:
    """Make KEY's first branch, then its HEAD, the way ``how`` does."""
    if how == "append":
        ws.session(*KEY).append(castore.Message(role="user", content="first"))
    elif how == "fork":
        ws.session("app", "alice", "src").fork("doomed")
    elif how == "reset":
        ws.session(*KEY).reset(cid)
    elif how == "checkout":
        ws.session(*KEY).checkout(cid, create="main")
    else:
        tree = ws.session(*KEY).tree()
        tip = tree.extend(None, [castore.Message(role="user", content="imported")], [0.0])[-1]
        tree.publish({"main": tip}, head="main")


@pytest.mark.parametrize("deletion", ["whole", "marked"])
@pytest.mark.parametrize("how", ["append", "fork", "reset", "checkout", "import"])
def test_a_deletion_between_a_first_branch_and_its_head_leaves_no_branch_behind(tmp_path, how: str,
                                                                                  deletion: str) -> None:
    """A first append, ``fork`` into a new session, ``reset`` or ``checkout -b`` on a session
    with no HEAD and an import's tree make the session's branch, then its HEAD, and settle HEAD
    by one rule
    (:func:`castore.deletion.first_commit_head`). A deletion run whole in between left a born
    HEAD on no branch (fsck's lost branch, gc refused the whole store; the append's and the
    import's were fixed first, a249002 and 269d9ff); it now goes again and the write is refused (SessionDeleting, finished; an import's
    publish loses the race, RefConflict, which its retry takes up). A deletion that marked HEAD
    and stopped in between left the write acknowledged (reset, import: what a finishing
    ``delete-session`` then deleted) or refused as SessionExists (fork) with its branch left:
    the write now takes its branch back and is refused as SessionDeleting."""
    url = str(tmp_path / "st")
    with castore.open(url) as st:
        st.session("app", "alice", "src").append(castore.Message(role="user", content="forked"))
        cid = st.session("app", "alice", "src").head
    assert cid is not None

    with _racing_deletion(url, deletion) as ws:
        refused = castore.RefConflict if how == "import" and deletion == "whole" else castore.SessionDeleting
        with pytest.raises(refused) as got:
            _first_write(how, ws, cid)
        if refused is castore.SessionDeleting:
            assert got.value.finished == (deletion == "whole")
    with castore.open(url) as st:
        if deletion == "marked":
            assert st.refs.list("sessions/app/alice/doomed") == ["sessions/app/alice/doomed/HEAD"]
            st.delete_session(*KEY)
        _whole_or_gone(st, [])
        assert [m.content for m in st.session("app", "alice", "src").messages()] == ["forked"]


@pytest.mark.parametrize("at", [2, 3])  # marked with nothing deleted; marked and its branch deleted
def test_pull_and_push_into_a_session_whose_deletion_began_there_are_refused(backend: Backend, tmp_path,
                                                                              at: int) -> None:
    """A pull (from each backend, into local disk) or a push (from local disk into each
    backend) into a store where the same session's deletion began and stopped: before, its
    branches came back under the marked HEAD (recreated once the branch went), for the finishing
    ``delete-session`` to delete. The session is now refused, as git refuses a ref it finds
    locked, with the command that finishes the deletion; the destination's refs stay as the
    deletion left them, the neighbour is copied, and once the deletion is finished the same
    sync copies the session whole."""
    from castore import sync

    line = "deletion interrupted: finish it with `castore delete-session app/alice/doomed`"
    for way in ("pull", "push"):
        src = backend if way == "pull" else Backend("local", str(tmp_path / f"{way}-src"))
        dst = Backend("local", str(tmp_path / "pulled")) if way == "pull" \
            else Backend(backend.name, f"{backend.url}-{way}-{at}", backend.options)
        _seed(src)
        with src.open() as s, dst.open() as d:
            d.init(like=s)
            assert sync.pull(s, d).ok
        _killed_at(dst, at)
        with src.open() as s:
            s.session(*KEY).append(castore.Message(role="user", content="newer"))
            s.session("app", "alice", "kept").append(castore.Message(role="user", content="too"))
        with dst.open() as d:
            left = {n: d.refs.read(n) for n in d.refs.list("sessions/app/alice/doomed")}
        with src.open() as s, dst.open() as d:
            report = sync.pull(s, d) if way == "pull" else sync.push(s, d)
            assert not report.ok and [r.ref for r in report.refs_refused] == ["sessions/app/alice/doomed/HEAD"]
            assert line in report.refs_refused[0].reason, report.refs_refused
            assert {n: d.refs.read(n) for n in d.refs.list("sessions/app/alice/doomed")} == left, way
            assert [m.content for m in d.session("app", "alice", "kept").messages()] == ["stays", "too"]
            d.delete_session(*KEY)
            assert (sync.pull(s, d) if way == "pull" else sync.push(s, d)).ok
            assert [m.content for m in d.session(*KEY).messages()] == ["hello", "more", "newer"]
            assert maintenance.fsck(d).ok and not maintenance.fsck(d).deleting


@pytest.mark.parametrize("at", [2, 3])  # marked with nothing deleted; marked and its branch deleted
def test_adks_list_sessions_leaves_out_a_session_whose_deletion_was_interrupted(tmp_path, at: int) -> None:
    """ADK's ``list_sessions`` lists a session whose deletion stopped halfway as ``castore
    sessions`` would not have it live: left out (an ADK session has no place for the mark), as
    once its deletion is finished, as ``grep`` and ``usage`` leave it out. Before, it was listed
    as a live session (its branch there) or the listing failed (its branch gone)."""
    pytest.importorskip("google.adk")
    import asyncio

    from google.adk.events.event import Event
    from google.genai import types

    from castore.adapters.adk import CastoreSessionService

    backend = Backend("local", str(tmp_path / "st"))

    async def listed(svc: CastoreSessionService) -> list[tuple[str, str]]:
        return [(s.user_id, s.id) for u in ("alice", None)
                for s in (await svc.list_sessions(app_name="app", user_id=u)).sessions]

    async def go() -> None:
        svc = CastoreSessionService(backend.url)
        for sid in ("doomed", "kept"):
            s = await svc.create_session(app_name="app", user_id="alice", session_id=sid, state={"k": sid})
            said = types.Content(role="user", parts=[types.Part(text=sid)])
            await svc.append_event(s, Event(invocation_id="i", author="user", content=said))
        assert await listed(svc) == [("alice", "doomed"), ("alice", "kept")] * 2
        _killed_at(backend, at)
        assert await listed(svc) == [("alice", "kept")] * 2
        await svc.delete_session(app_name="app", user_id="alice", session_id="doomed")  # finishes it
        assert await listed(svc) == [("alice", "kept")] * 2

    asyncio.run(go())


@pytest.mark.parametrize("at", [2, 3])
def test_langgraphs_checkpoint_listing_leaves_out_a_thread_whose_deletion_was_interrupted(tmp_path, at: int) -> None:
    """LangGraph's ``list(None)`` (every thread's checkpoints) and ``delete_for_runs`` leave out
    a thread whose deletion stopped halfway, as once its deletion is finished, and ``prune``
    refuses to rewrite it. Before, its checkpoints were listed while its branch was there, and
    ``delete_for_runs`` and ``prune`` rewrote the thread under the mark."""
    pytest.importorskip("langgraph")
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from castore.adapters.langgraph import CastoreSaver

    class State(TypedDict):
        n: int

    backend = Backend("local", str(tmp_path / "st"))
    with backend.open() as st:
        saver = CastoreSaver(st, app="app", user="alice")
        b = StateGraph(State)
        b.add_node("inc", lambda s: {"n": s["n"] + 1})
        b.add_edge(START, "inc")
        b.add_edge("inc", END)
        g = b.compile(checkpointer=saver)
        for tid in ("doomed", "kept"):
            g.invoke({"n": 0}, {"configurable": {"thread_id": tid}, "metadata": {"run_id": "r1"}})
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"doomed", "kept"}
    _killed_at(backend, at)
    with backend.open() as st:
        saver = CastoreSaver(st, app="app", user="alice")
        before = {n: st.refs.read(n) for n in st.refs.list("sessions/app/alice/doomed")}
        assert {t.config["configurable"]["thread_id"] for t in saver.list(None)} == {"kept"}
        saver.delete_for_runs(["r1"])
        assert not list(saver.list({"configurable": {"thread_id": "kept"}}))  # (run r1's checkpoints went)
        with pytest.raises(castore.SessionDeleting, match="castore delete-session app/alice/doomed"):
            saver.prune(["doomed"])  # keep_latest: a rewrite of what the deletion will delete
        assert {n: st.refs.read(n) for n in st.refs.list("sessions/app/alice/doomed")} == before
        saver.delete_thread("doomed")  # finishes it
        assert not st.refs.list("sessions/app/alice/doomed")


@pytest.mark.parametrize("deletion", ["whole", "marked"])
def test_a_pull_of_a_new_session_racing_its_deletion_there_leaves_no_branch_behind(tmp_path, deletion: str) -> None:
    """A pull (push, clone: one code path) makes a session new to the destination as a first
    append does, its branch, then its HEAD, and now settles HEAD by the same rule
    (:func:`castore.deletion.first_commit_head`). A deletion there run whole in between left a
    born HEAD on no branch (fsck's lost branch, gc refused the whole store); one that marked
    HEAD and stopped left the pulled branch under the mark, reported as copied. The session is
    now refused (its HEAD or its branch deleted again), with the reason, and the next pull,
    once the deletion is finished, copies it whole."""
    from castore import sync

    src, url = Backend("local", str(tmp_path / "src")), str(tmp_path / "dst")
    _seed(src)
    with src.open() as s, castore.open(url) as d:
        d.init(like=s)

    with src.open() as s, _racing_deletion(url, deletion) as d:
        report = sync.pull(s, d)
    assert [r.ref for r in report.refs_refused] == ["sessions/app/alice/doomed/HEAD"], report.refs_refused
    said = "was deleted while this write landed" if deletion == "whole" else "castore delete-session app/alice/doomed"
    assert said in report.refs_refused[0].reason
    with castore.open(url) as d:
        assert "sessions/app/alice/doomed/heads/main" not in d.refs.list("sessions/app/alice/doomed")
        if deletion == "marked":  # what else was pulled waits, under the mark, for the deletion's end
            assert maintenance.fsck(d).deleting
            d.delete_session(*KEY)
        report_ = maintenance.fsck(d)
        assert report_.ok and not report_.bad_refs and not report_.deleting, report_
        with src.open() as s:
            assert sync.pull(s, d).ok
        assert [m.content for m in d.session(*KEY).messages()] == ["hello", "more"]


@pytest.mark.parametrize("deletion", ["whole", "marked"])
def test_langgraphs_first_checkpoint_racing_the_threads_deletion_leaves_no_branch_behind(tmp_path,
                                                                                          deletion: str) -> None:
    """LangGraph's saver makes a new thread's branch, then its HEAD (``put``), by its own write
    path: a deletion run whole in between left a born HEAD on no branch (fsck's lost branch, gc
    refused the whole store); one that marked HEAD and stopped left the checkpoint's branch under
    the mark, the put acknowledged. It now settles HEAD by the first append's rule
    (:func:`castore.deletion.first_commit_head`): the graph's run is refused (SessionDeleting)
    and nothing of the thread is left but what the stopped deletion will finish."""
    pytest.importorskip("langgraph")
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from castore.adapters.langgraph import CastoreSaver

    class State(TypedDict):
        n: int

    url = str(tmp_path / "st")
    with castore.open(url) as st:
        st.init()

    b = StateGraph(State)
    b.add_node("inc", lambda s: {"n": s["n"] + 1})
    b.add_edge(START, "inc")
    b.add_edge("inc", END)
    with _racing_deletion(url, deletion) as ws:
        g = b.compile(checkpointer=CastoreSaver(ws, app="app", user="alice"))
        with pytest.raises(castore.SessionDeleting) as got:
            g.invoke({"n": 0}, {"configurable": {"thread_id": "doomed"}})
        assert got.value.finished == (deletion == "whole")
    # (LangGraph's writes of the refused step land on a branch of their own, which may come
    # before its checkpoint's: not a first branch HEAD is made on, and left here)
    writes = "sessions/app/alice/doomed/heads/writes"
    with castore.open(url) as st:
        assert [n for n in st.refs.list("sessions/app/alice/doomed/heads") if n != writes] == []
        if deletion == "marked":
            assert maintenance.fsck(st).deleting
            st.delete_session(*KEY)
        report = maintenance.fsck(st)
        assert report.ok and not report.bad_refs and not report.deleting, report
        assert [n for n in st.refs.list("sessions/app/alice/doomed") if n != writes] == []
        g = b.compile(checkpointer=CastoreSaver(st, app="app", user="alice"))
        assert g.invoke({"n": 0}, {"configurable": {"thread_id": "doomed"}}) == {"n": 1}  # the name is free


@pytest.mark.parametrize("how", ["marked", "branch-gone", "detached"])
def test_redact_of_a_session_whose_deletion_was_interrupted_keeps_it_finishable(tmp_path, how: str) -> None:
    """``castore redact`` rewrites the refs of a session whose deletion stopped halfway (the
    secret is still reachable from what is left). It moved them off what the deletion's mark
    records, so expire took the rewrite for a write after the mark and kept the session, taking
    the mark off (and a detached HEAD lost the mark outright): the deleted session came back.
    The mark's record now follows the rewrite (:func:`castore.deletion.rewritten`), and expire
    finishes the deletion."""
    from castore.scrub import redact_sessions

    secret = "ghp_" + "Xq7Lm2Rt9Wz4Kp8Vn3Hs6Jd1Fg5Bc0Ya7Te2Ui"[:36]
    backend = Backend("local", str(tmp_path / "st"))
    old = time.time() - 400 * 86400
    with backend.open() as st:
        s = st.session(*KEY)
        first = s.append(castore.Message(role="user", content=f"my key is {secret}"), time=old)
        s.branch("side")
        s.label("v1")
        s.append(castore.Message(role="user", content="more"), time=old)
        if how == "detached":
            s.checkout(first)
        st.session("app", "alice", "kept").append(castore.Message(role="user", content="stays"))
    _killed_at(backend, 3 if how == "branch-gone" else 2)
    with backend.open() as st:
        [report] = redact_sessions(st, [st.session(*KEY)])
        assert report.moved, report
        head = st.refs.read("sessions/app/alice/doomed/HEAD")
        assert head is not None and isinstance(head.meta.get(META_DELETING), float), head
        assert [x[:3] for x in maintenance.expire_sessions(st, 10 ** 9).sessions] == [KEY]
        _gone(st)
