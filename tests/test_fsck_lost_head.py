"""A session's HEAD naming a branch that does not exist: never born (``set_info`` before the
first append) is normal; a branch deleted or lost while the session shows it had history is
damage that fsck reports and that stops gc, which would otherwise drop the branch's commits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers.storage import PassThrough

import castore
from castore import maintenance
from castore.cli import main
from castore.refnames import META_BORN
from castore.session import NEW_BRANCH
from castore.storage import Storage, Token, open_storage


def _msgs(s: castore.Session, n: int, tag: str = "m") -> list[str]:
    return [s.append(castore.Message(role="user", content=f"{tag} {i}")) for i in range(n)]


def _lose_branch(store: castore.Store, s: castore.Session, name: str = "main") -> None:
    """What a lost race, a failed backend or a hand-deleted ref file leaves: the branch HEAD
    is on is gone, HEAD still names it."""
    store.refs.delete(s.refs.branch(name))
    store.objects.close()  # the writer is idle: gc may take its log


def _lose_with_evidence(store: castore.Store, s: castore.Session, evidence: str) -> list[str]:
    """Four entries, then what shows the session had history (``evidence``: a label, a
    reflog, another branch, a remote-tracking branch), then its branch ``main`` lost; returns the entries' ids."""
    ids = _msgs(s, 4)
    if evidence == "label":
        s.label("v1", at="HEAD~2")
    elif evidence == "reflog":
        s.reset("HEAD~1")  # an overwrite: the reflog records it
    elif evidence == "remote":  # a remote tip a pull kept here (the branch had diverged from it)
        store.refs.swap(s.refs.remote("origin", "main"), ids[1], None)
    else:
        s.branch("side", at="HEAD~3")
    _lose_branch(store, s)
    return ids


def _fsck_cli(root: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["--store", str(root), "fsck"])
    return r.exit_code, r.output


@pytest.mark.parametrize("evidence", ["label", "reflog", "branch", "remote"])
def test_a_lost_branch_is_reported_and_stops_gc(tmp_path: Path, evidence: str) -> None:
    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    ids = _lose_with_evidence(store, s, evidence)

    report = maintenance.fsck(store)
    assert not report.ok and report.damaged
    assert [r for r, _ in report.bad_refs] == [s.refs.head]
    why = report.bad_refs[0][1]
    assert "'main'" in why and "deleted or lost" in why and "castore branch main" in why
    assert s.prefix not in report.unborn

    code, out = _fsck_cli(root)
    assert code == 1
    assert [line for line in out.splitlines() if line.startswith("bad ref:")] == [
        f"bad ref: {s.refs.head}  {why}"]

    with pytest.raises(castore.CastoreError, match="gc refused.*HEAD names branch 'main'.*run `castore fsck`"):
        maintenance.gc(store, grace=0)
    r = CliRunner().invoke(main, ["--store", str(root), "gc", "--grace", "0"])
    assert r.exit_code == 1
    assert [line for line in r.output.splitlines() if line.startswith("Error:")] \
        and "deleted or lost" in r.output
    # nothing was dropped: every commit the lost branch held reads back
    for cid in ids:
        assert store.history.commit(cid).kind == "message"

    s.branch("main", at=ids[-1])  # resolved as fsck says: the branch is back
    assert maintenance.fsck(store).ok
    maintenance.gc(store, grace=0)
    assert [e.id for e in s.log()][0] == ids[-1]
    store.close()


def test_a_never_born_session_is_not_damage(tmp_path: Path) -> None:
    root = tmp_path / "st"
    store = castore.open(str(root))
    born = store.session("app", "u", "born")
    _msgs(born, 2)
    fresh = store.session("app", "u", "fresh")
    fresh.set_info({"title": "not started yet"})
    store.objects.close()
    report = maintenance.fsck(store)
    assert report.ok and not report.bad_refs, report.to_dict()
    assert report.unborn == [fresh.prefix]
    code, out = _fsck_cli(root)
    assert code == 0 and out.splitlines()[-1] == "ok" and "notice" not in out  # nothing dangles
    maintenance.gc(store, grace=0)  # runs: an unborn HEAD is a normal state
    fresh.append(castore.Message(role="user", content="first"))
    assert maintenance.fsck(store).unborn == []
    store.close()


def _strip_born_mark(store: castore.Store, s: castore.Session) -> None:
    """HEAD as a castore before the born mark wrote it."""
    head = store.refs.read(s.refs.head)
    assert head is not None and head.meta.get(META_BORN) is True
    store.refs.swap(s.refs.head, head.target, head, {k: v for k, v in head.meta.items() if k != META_BORN})


def _born(store: castore.Store, root: Path, how: str) -> tuple[castore.Session, list[str]]:
    """A session born ``how`` (its first commit by append, by append after set_info, by an
    import, by Pi's import, by a fork), with one branch and nothing else: no label, no
    reflog, no remote."""
    if how == "import":
        from castore.adapters.claude_code import import_claude

        src = Path(__file__).parent / "data" / "claude-code" / "claude-code-log" / "session_b.jsonl"
        (root.parent / "p" / "proj").mkdir(parents=True)
        (root.parent / "p" / "proj" / src.name).write_bytes(src.read_bytes())
        import_claude(store, root.parent / "p")
        s = store.session("claude", "proj", "session_b")
        return s, [e.id for e in s.log()]
    if how == "pi import":  # (Pi's importer makes its branches before HEAD, by set_info)
        import lzma

        from castore.adapters.pi import import_pi

        (root.parent / "pi").mkdir()
        data = (Path(__file__).parent / "data" / "pi" / "before-compaction.jsonl.xz").read_bytes()
        (root.parent / "pi" / "s.jsonl").write_bytes(lzma.decompress(data))
        (result,) = import_pi(store, root.parent / "pi")
        s = store.session(*result.key)
        return s, [e.id for e in s.log()][:50]
    s = store.session("app", "u", "s1")
    if how == "set_info first":
        s.set_info({"title": "not started yet"})
    ids = _msgs(s, 3)
    if how == "fork":
        s = s.fork("s2")
        ids = [e.id for e in s.log()][::-1]
    return s, ids


@pytest.mark.parametrize("how", ["append", "set_info first", "import", "pi import", "fork"])
def test_a_session_whose_only_branch_is_lost_is_damage_not_a_new_session(tmp_path: Path, how: str) -> None:
    """A session whose only ref was its one branch, that branch lost: nothing but HEAD is left,
    and it looked never born (fsck ok, append started a new root on the lost name, gc could
    delete the lost commits). HEAD records that the session had a commit (its born mark,
    written with HEAD), so it is damage as with a label or a reflog; usage names it too."""
    root = tmp_path / "st"
    store = castore.open(str(root))
    s, ids = _born(store, root, how)
    assert [n.rsplit("/", 1)[-1] for n in store.refs.list(s.prefix)] == ["HEAD", "main"]
    _lose_branch(store, s)
    report = maintenance.fsck(store)
    assert not report.ok and [r for r, _ in report.bad_refs] == [s.refs.head]
    assert "HEAD names branch 'main'" in report.bad_refs[0][1] and s.prefix not in report.unborn
    with pytest.raises(castore.CorruptRef, match="HEAD names branch 'main'.*deleted or lost"):
        s.append(castore.Message(role="user", content="a new root"))
    with pytest.raises(castore.CorruptRef, match="deleted or lost"):
        s.log()
    with pytest.raises(castore.CastoreError, match="gc refused"):
        maintenance.gc(store, grace=0)
    for cid in ids:
        assert store.history.commit(cid) is not None
    store.close()
    res = CliRunner().invoke(main, ["--store", str(root), "usage", "--no-cache"])
    assert res.exit_code == 1 and "HEAD names branch 'main'" in res.stderr, res.output


def test_a_session_with_only_its_head_left_is_noted_with_its_dangling_tip(tmp_path: Path) -> None:
    """No commit names its session, so a session of an older store (HEAD without the born
    mark) that kept nothing but HEAD looks never born: fsck notes it when dangling commits
    exist (its tip is one of them), as git notes an unborn HEAD, and gc's grace period keeps
    them as it keeps any unreachable commit."""
    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    ids = _msgs(s, 3)
    _strip_born_mark(store, s)
    _lose_branch(store, s)
    report = maintenance.fsck(store)
    assert report.ok and report.unborn == [s.prefix]
    assert ids[-1] in report.dangling
    code, out = _fsck_cli(root)
    assert code == 0
    notes = [line for line in out.splitlines() if line.startswith("notice:")]
    assert len(notes) == 1 and s.prefix in notes[0] and "dangling" in notes[0]
    maintenance.gc(store)  # the default grace: nothing this young goes
    s.branch("main", at=ids[-1])
    assert [e.id for e in s.log()] == ids[::-1]
    store.close()


@pytest.mark.parametrize("evidence", ["label", "reflog", "branch", "remote"])
def test_reading_a_session_whose_branch_is_lost_says_so_not_no_entries_yet(tmp_path: Path, evidence: str) -> None:
    """``log``, ``context`` and ``status`` of a session whose HEAD branch is lost showed it as
    never born: nothing (exit 0), "(0 messages)", and "HEAD: none yet (the session has no
    entries; `castore append ...` starts it)", advice that starts a new root on that name
    and hides the loss from fsck and gc; ``show``, ``diff``, ``state`` and ``fork`` said
    "unknown revision 'HEAD': no entries yet". Each now says what fsck says (one ``Error:``
    line, exit 1); the library raises CorruptRef. A never-born session still reads as empty."""
    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    _lose_with_evidence(store, s, evidence)
    fresh = store.session("app", "u", "fresh")
    fresh.set_info({"title": "not started yet"})
    store.close()

    r = castore.open(str(root))
    lost = r.session("app", "u", "s1")
    with pytest.raises(castore.CorruptRef, match="HEAD names branch 'main'.*deleted or lost"):
        lost.log()
    with pytest.raises(castore.CorruptRef, match="deleted or lost"):
        lost.messages()
    assert "deleted or lost" in (lost.lost_branch() or "")
    with pytest.raises(castore.CorruptRef, match="deleted or lost"):
        lost.resolve("HEAD~1")
    assert r.session("app", "u", "fresh").log() == [] and r.session("app", "u", "fresh").lost_branch() is None
    r.close()

    runner = CliRunner()
    for args in (["log"], ["context"], ["status"], ["show"], ["show", "HEAD~1"], ["diff", "HEAD~1"], ["state"],
                 ["fork", "elsewhere"]):
        res = runner.invoke(main, ["--store", str(root), *args, "-s", "app/u/s1"])
        assert res.exit_code == 1, (args, res.output)
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "HEAD names branch 'main'" in errors[0] and "castore branch main" in errors[0], res.output
        assert "none yet" not in res.output and "0 messages" not in res.output
    res = runner.invoke(main, ["--store", str(root), "status", "-s", "app/u/fresh"])
    assert res.exit_code == 0 and "none yet" in res.output, res.output


def test_push_pull_and_sync_refuse_a_session_whose_branch_is_lost(tmp_path: Path) -> None:
    """push (and sync, and a pull from such a remote) of a session whose HEAD branch is lost
    sent its other branches and labels without its HEAD, said nothing and exited 0: the copy
    then holds the session without the lost branch's commits, and its fsck says ok (the damage
    laundered). Now the session is refused (nothing of it sent) with fsck's line, exit 1; the
    other sessions still travel."""
    root, remote = tmp_path / "st", tmp_path / "remote"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    _msgs(s, 4)
    s.label("v1", at="HEAD~2")
    _msgs(store.session("app", "u", "fine"), 2)
    _lose_branch(store, s)
    store.close()

    runner = CliRunner()
    for args in (["push", str(remote), "-s", "app/u/s1"], ["push", str(remote), "--all"], ["sync", str(remote)]):
        res = runner.invoke(main, ["--store", str(root), *args])
        assert res.exit_code == 1, (args, res.output)
        refused = [line for line in res.stderr.splitlines() if line.startswith("refused:")]
        assert len(refused) == 1 and "app/u/s1" in refused[0] and "HEAD names branch 'main'" in refused[0], res.output
        with castore.open(str(remote)) as r:
            assert r.refs.list("sessions/app/u/s1") == []  # nothing of it travelled
    with castore.open(str(remote)) as r:
        assert len(r.session("app", "u", "fine").log()) == 2  # the others did
        assert maintenance.fsck(r).ok

    # the other way: a remote holding such a session refuses it on pull (clone) and names it
    other = tmp_path / "other"
    res = runner.invoke(main, ["--store", str(other), "pull", str(root), "--all"])
    assert res.exit_code == 1 and "HEAD names branch 'main'" in res.output, res.output
    with castore.open(str(other)) as o:
        assert o.refs.list("sessions/app/u/s1") == []
        assert maintenance.fsck(o).ok


def test_the_html_view_of_a_session_whose_branch_is_lost_says_so(tmp_path: Path) -> None:
    """``export html`` (and ``serve``'s page) of a session whose HEAD branch is lost drew the
    tree without the lost branch's commits and without HEAD, exit 0: a view that looks whole.
    It now fails as ``log`` does, with fsck's line."""
    from castore.html import render_session

    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    _msgs(s, 4)
    s.branch("side", at="HEAD~3")
    _lose_branch(store, s)
    with pytest.raises(castore.CorruptRef, match="HEAD names branch 'main'.*deleted or lost"):
        render_session(s)
    store.close()
    out = tmp_path / "s1.html"
    res = CliRunner().invoke(main, ["--store", str(root), "export", "html", "-s", "app/u/s1", "-o", str(out)])
    assert res.exit_code == 1 and not out.exists(), res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "HEAD names branch 'main'" in errors[0], res.output


def test_push_refuses_a_session_whose_head_names_another_sessions_branch(tmp_path: Path) -> None:
    """A HEAD naming a path out of its session was skipped with a note while the session's
    branches travelled without it, exit 0; it is now refused like a lost branch, exit 1."""
    root, remote = tmp_path / "st", tmp_path / "remote"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    _msgs(s, 2)
    _msgs(store.session("app", "u", "s2"), 1)
    cur = store.refs.read(s.refs.head)
    assert cur is not None
    store.plumbing.swap(s.refs.head, "ref: heads/../../s2/heads/main", cur, dict(cur.meta))
    store.close()
    res = CliRunner().invoke(main, ["--store", str(root), "push", str(remote), "--all"])
    assert res.exit_code == 1, res.output
    refused = [line for line in res.stderr.splitlines() if line.startswith("refused:")]
    assert len(refused) == 1 and "app/u/s1" in refused[0] and "HEAD must name a branch" in refused[0], res.output
    with castore.open(str(remote)) as r:
        assert r.refs.list("sessions/app/u/s1") == [] and len(r.session("app", "u", "s2").log()) == 1


def test_redact_refuses_a_session_whose_branch_is_lost(tmp_path: Path) -> None:
    """``redact`` of a session whose HEAD branch is lost redacted its other branches and said
    "0 secrets found ... 0 commits written again": the lost branch's commits, secret and all,
    stay (gc keeps them while fsck lists the bad ref), and come back with the branch. It now
    says what fsck says, writing nothing, for the session and for ``--all``."""
    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    _msgs(s, 2)
    s.branch("side", at="HEAD~1")
    s.append(castore.Message(role="user", content="key AKIAIOSFODNN7EXAMPLE"))
    _msgs(store.session("app", "u", "fine"), 1)
    _lose_branch(store, s)
    store.close()
    before = sorted(p.name for p in (root / "refs").rglob("*"))
    for args in (["-s", "app/u/s1"], ["--all"], ["-s", "app/u/s1", "--dry-run"]):
        res = CliRunner().invoke(main, ["--store", str(root), "redact", *args])
        assert res.exit_code == 1, (args, res.output)
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "HEAD names branch 'main'" in errors[0], res.output
    assert sorted(p.name for p in (root / "refs").rglob("*")) == before


@pytest.mark.parametrize("evidence", ["label", "reflog", "branch", "remote"])
def test_appending_to_a_session_whose_branch_is_lost_is_refused(tmp_path: Path, evidence: str) -> None:
    """``append`` to a session whose HEAD branch is lost started a new root on that name: the
    new branch hid the loss from fsck, and gc could then delete what only the lost branch held.
    It is refused now with fsck's line (CorruptRef; one ``Error:`` line, exit 1), nothing
    written; the first append of a never-born session (``set_info`` first) still starts it."""
    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    _lose_with_evidence(store, s, evidence)
    refs = {n: store.refs.read(f"sessions/{n}") for n in store.refs.list(s.prefix)}
    for append in (lambda: s.append(castore.Message(role="user", content="x")),
                   lambda: s.append_many([castore.Message(role="user", content="x")], expect=NEW_BRANCH)):
        with pytest.raises(castore.CorruptRef, match="HEAD names branch 'main'.*deleted or lost"):
            append()
    with pytest.raises(castore.CastoreError):  # a named branch that is lost: no such branch
        s.append(castore.Message(role="user", content="x"), branch="main")
    store.close()

    res = CliRunner().invoke(main, ["--store", str(root), "append", "--role", "user", "x", "-s", "app/u/s1"])
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "HEAD names branch 'main'" in errors[0] and "castore branch main" in errors[0], res.output
    with castore.open(str(root)) as again:
        assert {n: again.refs.read(f"sessions/{n}") for n in again.refs.list(s.prefix)} == refs  # nothing written
        assert [r for r, _ in maintenance.fsck(again).bad_refs] == [s.refs.head]  # still reported
        fresh = again.session("app", "u", "fresh")
        fresh.set_info({"title": "not started yet"})
        fresh.append(castore.Message(role="user", content="first"))  # never born: starts it
        assert len(fresh.log()) == 1


@pytest.mark.parametrize("evidence", ["label", "reflog", "branch"])
def test_resetting_a_session_whose_branch_is_lost_is_refused(tmp_path: Path, evidence: str) -> None:
    """``reset REV`` on a session whose HEAD branch is lost recreated the branch at REV with
    no reflog entry (there was no old tip): fsck then said ok and gc deleted the lost commits.
    It is refused now with append's error (fsck's line), nothing written, loss still reported."""
    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    ids = _lose_with_evidence(store, s, evidence)
    refs = {n: store.refs.read(f"sessions/{n}") for n in store.refs.list(s.prefix)}
    with pytest.raises(castore.CorruptRef, match="HEAD names branch 'main'.*deleted or lost"):
        s.reset(ids[0])
    store.close()
    res = CliRunner().invoke(main, ["--store", str(root), "reset", ids[0], "-s", "app/u/s1"])
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "HEAD names branch 'main'" in errors[0], res.output
    with castore.open(str(root)) as again:
        assert {n: again.refs.read(f"sessions/{n}") for n in again.refs.list(s.prefix)} == refs  # nothing written
        assert [r for r, _ in maintenance.fsck(again).bad_refs] == [s.refs.head]  # still reported


def test_sessions_lists_a_damaged_or_lost_head_with_what_status_says(tmp_path: Path) -> None:
    """``castore sessions`` listed a session whose HEAD names another session's branch as
    "0 entries (detached at -)", one whose branch is lost as "0 entries main -", and one whose
    branch ref is garbage as "0 entries main". Each is listed now (the table and --json) with
    what ``status`` says of it; a healthy and a never-born session are listed as before (and
    a garbage HEAD is still not listed: test_session's one_garbage_head test)."""
    import json

    root = tmp_path / "st"
    store = castore.open(str(root))
    _msgs(store.session("app", "u", "fine"), 2)
    store.session("app", "u", "fresh").set_info({"title": "not started yet"})
    lost = store.session("app", "u", "lost")
    _msgs(lost, 3)
    lost.label("v1", at="HEAD~1")
    _lose_branch(store, lost)
    other = store.session("app", "u", "other")
    _msgs(other, 2)
    cur = store.refs.read(other.refs.head)
    assert cur is not None
    store.plumbing.swap(other.refs.head, "ref: heads/../../fine/heads/main", cur, dict(cur.meta))
    garbage = store.session("app", "u", "garbage")
    _msgs(garbage, 1)
    store.close()
    (root / "refs" / garbage.refs.branch("main")).write_bytes(b"\x00not a ref")

    runner = CliRunner()
    said = {}
    for sid in ("lost", "other", "garbage"):
        res = runner.invoke(main, ["--store", str(root), "status", "-s", f"app/u/{sid}"])
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error: ")]
        assert res.exit_code == 1 and len(errors) == 1, res.output
        said[sid] = errors[0].removeprefix("Error: ")
    assert "HEAD names branch 'main'" in said["lost"]

    res = runner.invoke(main, ["--store", str(root), "sessions", "--json"])
    assert res.exit_code == 0, res.output
    got = {s["session"]: s for s in json.loads(res.stdout)["sessions"]}
    assert {k: v["problem"] for k, v in got.items()} == {"fine": None, "fresh": None, **said}
    assert got["fine"]["entries"] == 2

    res = runner.invoke(main, ["--store", str(root), "sessions"])
    assert res.exit_code == 0, res.output
    lines = {line.split()[0]: line for line in res.stdout.splitlines()}
    for sid, why in said.items():
        assert lines[f"app/u/{sid}"].split(None, 1)[1] == f"damaged: {why}"
    assert "damaged" not in lines["app/u/fine"] + lines["app/u/fresh"]
    assert "2 entries  main" in lines["app/u/fine"]


def test_usage_names_a_session_whose_branch_is_lost_instead_of_undercounting(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``usage`` of a store with a session whose HEAD branch is lost counted only what its other
    branches hold and said nothing (exit 0): the lost branch's responses vanished from the
    totals. The session is now left out and named with fsck's line (exit 1, ``unreadable`` in
    ``--json``), with and without the cache, as a session whose objects cannot be read."""
    import json as _json

    from castore.adapters.claude_code import import_claude

    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(tmp_path / "usage.json"))
    root = tmp_path / "st"
    src = Path(__file__).parent / "data" / "claude-code" / "claude-code-log" / "dag_compact_after_rewind.jsonl"
    (tmp_path / "p" / "proj").mkdir(parents=True)
    (tmp_path / "p" / "proj" / src.name).write_bytes(src.read_bytes())
    store = castore.open(str(root))
    import_claude(store, tmp_path / "p")
    runner = CliRunner()
    assert runner.invoke(main, ["--store", str(root), "usage"]).exit_code == 0  # the cache is written
    s = store.session("claude", "proj", "dag_compact_after_rewind")
    assert "rewind-2" in s.branches()
    _lose_branch(store, s)
    store.close()
    for args in (["usage"], ["usage", "--no-cache"], ["usage", "--by", "session", "--json"]):
        res = runner.invoke(main, ["--store", str(root), *args])
        assert res.exit_code == 1, (args, res.output)
        errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and "claude/proj/dag_compact_after_rewind" in errors[0] \
            and "HEAD names branch 'main'" in errors[0], res.output
        if "--json" in args:
            doc = _json.loads(res.stdout)
            assert [u["session"] for u in doc["unreadable"]] == ["claude/proj/dag_compact_after_rewind"]


def test_pull_and_sync_do_not_put_a_lost_branch_back_at_the_remotes_older_tip(tmp_path: Path) -> None:
    """A session synced, then appended to here, then its HEAD branch lost here: the pull of
    ``sync`` created the branch again at the remote's older tip (a plain new branch to it),
    exit 0. fsck then said ok, the commits made here since were dangling, and gc deleted them.
    A destination session whose HEAD branch is lost is now refused as a source one is (nothing
    of it moves; the loss stays for fsck); and so is a push onto a remote in that state."""
    root, remote = tmp_path / "st", tmp_path / "remote"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    _msgs(s, 2)
    s.label("v1")
    store.close()
    runner = CliRunner()
    assert runner.invoke(main, ["--store", str(root), "sync", str(remote)]).exit_code == 0
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    (only_here,) = _msgs(s, 1, "only here")
    _lose_branch(store, s)
    store.close()
    for args in (["sync", str(remote)], ["pull", str(remote), "--all"]):
        res = runner.invoke(main, ["--store", str(root), *args])
        assert res.exit_code == 1, (args, res.output)
        refused = [line for line in res.stderr.splitlines() if line.startswith("refused:")]
        assert len(refused) == 1 and "app/u/s1" in refused[0] and "HEAD names branch 'main'" in refused[0], res.output
        with castore.open(str(root)) as st:
            assert st.refs.read(st.session("app", "u", "s1").refs.branch("main")) is None
            report = maintenance.fsck(st)
            assert not report.ok and report.bad_refs and only_here in report.dangling  # so gc refuses
    # the other way round: the remote lost it; a push of a sound copy does not put it back
    copy = tmp_path / "copy"
    assert runner.invoke(main, ["--store", str(copy), "pull", str(remote), "--all"]).exit_code == 0
    with castore.open(str(remote)) as r:
        _lose_branch(r, r.session("app", "u", "s1"))
    res = runner.invoke(main, ["--store", str(copy), "push", str(remote), "--all"])
    assert res.exit_code == 1 and "HEAD names branch 'main'" in res.output, res.output
    with castore.open(str(remote)) as r:
        assert r.refs.read(r.session("app", "u", "s1").refs.branch("main")) is None


def test_usage_names_a_lost_branch_by_its_real_name_not_its_hashed_segment(tmp_path: Path) -> None:
    """A branch name too long for a ref segment is stored as a digest, its real name on HEAD
    (and on the branch). usage judged a lost HEAD branch from the segment alone (HEAD's
    metadata not read), so its line named the digest where fsck and log name the branch."""
    root = tmp_path / "st"
    long = "é" * 120  # 240 bytes: hashed
    with castore.open(str(root)) as store:
        s = store.session("app", "u", "s1")
        _msgs(s, 2)
        s.checkout("main", create=long)
        _msgs(s, 1, "on the long branch")
        s.label("v1")
        _lose_branch(store, s, long)
        with pytest.raises(castore.CorruptRef, match=f"HEAD names branch '{long}'"):
            s.log()
    res = CliRunner().invoke(main, ["--store", str(root), "usage", "--no-cache"])
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1 and f"HEAD names branch '{long}'" in errors[0], res.output


@pytest.mark.parametrize("no_index", [False, True])
def test_grep_names_a_session_whose_branch_is_lost_and_searches_the_others(
        tmp_path: Path, no_index: bool, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    """``castore grep`` said nothing of a session whose HEAD branch is lost: its count, or its
    silence, looked whole. It now says it as usage does (one ``Error:`` line on stderr, after
    the other sessions' matches, exit 2 as grep's errors), through the index and without,
    from the click command and the fast path alike; a search that leaves it out says nothing."""
    from castore.cli import fast

    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "index"))
    root = tmp_path / "st"
    with castore.open(str(root)) as store:
        for sid in ("fine", "lost", "only"):
            _msgs(store.session("app", "u", sid), 3, "parser")
        store.session("app", "u", "lost").label("v1", at="HEAD~1")
        argv = ["--store", str(root), "grep", "-c", "parser", *(["--no-index"] if no_index else [])]
        assert CliRunner().invoke(main, argv).stdout.splitlines() == ["app/u/fine:3", "app/u/lost:3", "app/u/only:3"]
        for sid in ("lost", "only"):  # (only: nothing but HEAD left, its born mark)
            _lose_branch(store, store.session("app", "u", sid))
    res = CliRunner().invoke(main, argv)
    assert fast.grep_main(list(argv), {}) == res.exit_code == 2, res.output
    fast_out = capsysbinary.readouterr()
    for out, err in ((res.stdout, res.stderr), (fast_out.out.decode(), fast_out.err.decode())):
        assert out.splitlines() == ["app/u/fine:3"]
        assert err.splitlines() == [
            "Error: app/u/lost and 1 more cannot be searched whole (ref 'sessions/app/u/lost/HEAD' is corrupt: HEAD "
            "names branch 'main', which does not exist though the session has a label: the branch was deleted or lost "
            "(recreate it with `castore branch main REV` from `castore reflog` or a dangling commit, or check out "
            "another branch)); `castore fsck` says more"]
    res = CliRunner().invoke(main, [*argv, "--sessions", "fine"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, "app/u/fine:3\n", "")


def test_expire_keeps_a_session_whose_branch_is_lost(tmp_path: Path) -> None:
    """expire judged a session's last change from the refs left: with its HEAD branch lost, an
    old label made a session written to an hour ago look idle for 100 days, and expire deleted
    it (then fsck said ok, and gc took the lost commits once their grace ran out). A session
    whose HEAD is damaged is kept now: when it last changed cannot be told."""
    import time as _time

    root = tmp_path / "st"
    with castore.open(str(root)) as store:
        s = store.session("app", "u", "s1")
        ids = _msgs(s, 3)
        s.label("old", at="HEAD~2")
        label = store.refs.read(s.refs.label("old"))
        assert label is not None
        store.refs.swap(label.name, label.target, label, {**label.meta, "t": _time.time() - 100 * 86400})
        idle = store.session("app", "u", "idle")
        _msgs(idle, 1)
        _lose_branch(store, s)
        report = maintenance.expire_sessions(store, 30 * 86400, now=_time.time() + 31 * 86400)
        assert [k[:3] for k in report.sessions] == [("app", "u", "idle")]  # the sound idle one goes
        assert [r for r, _ in maintenance.fsck(store).bad_refs] == [s.refs.head]  # still reported
        s.branch("main", at=ids[-1])
        assert [e.id for e in s.log()] == ids[::-1]


@pytest.mark.parametrize("vendor, src, sub", [
    ("claude", "claude-code/claude-code-log/representative_messages.jsonl", "proj"),
    ("codex", "codex/sample_codex_session.jsonl", "proj"),
    ("gemini", "gemini/tmp/my-app/chats/session-2026-03-10T09-00-7f3c2a9e.jsonl", "my-app/chats"),
])
def test_importing_into_a_session_whose_branch_is_lost_is_refused(tmp_path: Path, vendor: str, src: str,
                                                                   sub: str) -> None:
    """The import of a file that grew, into its session whose HEAD branch is lost, started a new
    root on the lost name (or failed with a KeyError traceback after writing a branch): fsck then
    took the new branch for the session's history. It is refused before anything is written,
    with fsck's line (one ``Error:`` line, exit 1), as append is."""
    whole = (Path(__file__).parent / "data" / src).read_bytes()
    lines = whole.splitlines(keepends=True)
    folder = tmp_path / "in" / sub
    folder.mkdir(parents=True)
    f = folder / Path(src).name
    root = str(tmp_path / "st")
    run = CliRunner().invoke
    f.write_bytes(b"".join(lines[:-2]))
    assert run(main, ["--store", root, "import", vendor, str(tmp_path / "in")]).exit_code == 0
    with castore.open(root) as store:
        (folder_,) = {n.rsplit("/", 1)[0] for n in store.refs.list("sessions") if n.endswith("/HEAD")}
        store.refs.delete(f"{folder_}/heads/main")
        before = {n: store.refs.read(n) for n in store.refs.list(folder_)}
    f.write_bytes(whole)
    res = run(main, ["--store", root, "import", vendor, str(tmp_path / "in")])
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1 and "HEAD names branch 'main'" in errors[0], res.output
    with castore.open(root) as store:
        assert {n: store.refs.read(n) for n in store.refs.list(folder_)} == before  # nothing written


def test_branch_listing_and_checkout_of_a_session_whose_branch_is_lost_name_the_loss(tmp_path: Path) -> None:
    """``castore branch`` listed the other branches of a session whose HEAD branch is lost
    (no ``*``, no word of the loss, exit 0), and ``checkout OTHER`` moved HEAD off it saying
    only "Switched to branch": the loss then vanished from fsck and its commits were left to
    gc unsaid. The listing now ends with fsck's line (exit 1; ``--json`` says it in ``lost``),
    and checkout, the documented way to give the branch up, says what it gave up and how to
    get it back."""
    import json

    from castore import porcelain

    root = tmp_path / "st"
    store = castore.open(str(root))
    s = store.session("app", "u", "s1")
    ids = _lose_with_evidence(store, s, "branch")
    listing = porcelain.branch_list(s)
    assert listing.lost is not None and "HEAD names branch 'main'" in listing.lost
    assert porcelain.branch_list(store.session("app", "u", "fresh")).lost is None
    store.close()

    runner = CliRunner()
    res = runner.invoke(main, ["--store", str(root), "branch", "-s", "app/u/s1"])
    assert res.exit_code == 1 and res.stdout.split() == ["side", ids[0][:8]], res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "HEAD names branch 'main'" in errors[0] and "castore branch main" in errors[0]
    res = runner.invoke(main, ["--store", str(root), "branch", "--json", "-s", "app/u/s1"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and "HEAD names branch 'main'" in doc["lost"] and doc["current"] == "main", res.output

    res = runner.invoke(main, ["--store", str(root), "checkout", "side", "-s", "app/u/s1"])
    assert res.exit_code == 0, res.output
    assert "Switched to branch 'side'" in res.stderr
    assert "branch 'main' that HEAD was on is lost" in res.stderr and "castore fsck" in res.stderr, res.stderr
    with castore.open(str(root)) as again:
        assert porcelain.branch_list(again.session("app", "u", "s1")).lost is None
    res = runner.invoke(main, ["--store", str(root), "branch", "-s", "app/u/s1"])
    assert res.exit_code == 0 and "lost" not in res.output, res.output


class _Meanwhile(PassThrough):
    """A storage on which another process's write (``then``, armed by :meth:`arm`) runs once:
    just after the next listing of refs (``on="list"``: between a reader's listing and its read
    of what it listed), or just before the next compare-and-swap of a session's HEAD
    (``on="swap"``)."""

    def __init__(self, inner: Storage, on: str) -> None:
        super().__init__(inner)
        self.on = on
        self.then: Callable[[], None] | None = None

    def arm(self, then: Callable[[], None]) -> castore.Store:
        """A store opened on this storage (what opening reads runs first), ``then`` armed."""
        store = castore.Store(self)
        store.require()
        self.then = then
        return store

    def _run(self) -> None:
        then, self.then = self.then, None
        if then is not None:
            then()

    def list(self, prefix: str) -> list[str]:
        got = self.inner.list(prefix)
        if self.on == "list" and prefix.startswith("refs") and prefix != "refs/changes":
            self._run()
        return got

    def swap(self, key: str, data: bytes, expect: Token | None) -> Token:
        if self.on == "swap" and key.endswith("/HEAD"):
            self._run()
        return self.inner.swap(key, data, expect)


def _branch_made_during(tmp_path: Path, move: str) -> tuple[str, Callable[[], None]]:
    """A store whose session ``bot/ann/s`` is about to be moved onto a new branch (``checkout -b``,
    or its first append after ``set_info``), and the write that does it, from another handle."""
    root = str(tmp_path / "store")
    st = castore.open(root, durable=False)
    s = st.session("bot", "ann", "s")
    if move == "checkout -b":
        _msgs(s, 2)
    else:
        s.set_info({"title": "t"})

    def writer() -> None:
        w = castore.open(root, durable=False).session("bot", "ann", "s")
        if move == "checkout -b":
            w.checkout("HEAD~1", create="retry")
        else:
            _msgs(w, 1)
        assert w.lost_branch() is None

    return root, writer


@pytest.mark.parametrize("move", ["checkout -b", "first append"])
def test_a_branch_made_between_a_readers_listing_and_its_read_is_not_lost(tmp_path: Path, move: str) -> None:
    """A reader of every session's refs (the search index, usage) lists them, then reads them:
    a HEAD read after a writer made a branch and put HEAD on it (``checkout -b``; a first append
    after ``set_info``, which marks HEAD born) names a branch the listing did not have. That is
    a healthy session, not one whose branch was lost (grep said so and exited 2)."""
    root, writer = _branch_made_during(tmp_path, move)
    reader = _Meanwhile(open_storage(root), "list").arm(writer)
    found: dict[tuple[str, str, str], castore.CorruptRef] = {}
    got = reader.session_refs_and_heads(lost=found)
    assert found == {}
    branch = "retry" if move == "checkout -b" else "main"
    assert got[("bot", "ann", "s")][2] == branch
    assert f"heads/{branch}" in got[("bot", "ann", "s")][1]


@pytest.mark.parametrize("move", ["checkout -b", "first append"])
def test_fsck_during_a_checkout_b_or_a_first_append_finds_no_bad_ref(tmp_path: Path, move: str) -> None:
    """fsck lists every ref, then reads them: a HEAD put on a branch made after the listing is a
    healthy one (fsck reported it as a bad ref, a lost branch: a false alarm from a cron job while
    agents work), and that branch is one of the refs it checks."""
    root, writer = _branch_made_during(tmp_path, move)
    storage = _Meanwhile(open_storage(root), "list")
    report = maintenance.fsck(storage.arm(writer))
    assert storage.then is None  # the write ran between fsck's listing and its read
    assert report.ok, report.bad_refs
    assert report.unborn == []


@pytest.mark.parametrize("move", ["checkout -b", "first append"])
def test_a_push_during_a_checkout_b_or_a_first_append_refuses_nothing(tmp_path: Path, move: str) -> None:
    """A push lists the session's refs, then reads them: a HEAD put on a branch made after the
    listing is a healthy one, not a lost branch (the session was refused, with fsck's line)."""
    root, writer = _branch_made_during(tmp_path, move)
    storage = _Meanwhile(open_storage(root), "list")
    src = storage.arm(writer)
    dst = castore.open(str(tmp_path / "remote"), durable=False)
    report = castore.sync.push(src, dst)
    assert storage.then is None  # the write ran between the push's listing and its read
    assert report.refs_refused == []
    assert maintenance.fsck(dst).ok


def test_a_pull_into_a_session_during_its_checkout_b_refuses_nothing(tmp_path: Path) -> None:
    """The same on the destination's side: a pull lists the local session's refs, then reads
    them, while the local session checks out a new branch."""
    root, writer = _branch_made_during(tmp_path, "checkout -b")
    remote = castore.open(str(tmp_path / "remote"), durable=False)
    assert castore.sync.push(castore.open(root, durable=False), remote).ok
    storage = _Meanwhile(open_storage(root), "list")
    local = storage.arm(writer)
    report = castore.sync.pull(remote, local)
    assert storage.then is None  # the write ran between the pull's listing of the local refs and its read
    assert report.refs_refused == []
    assert maintenance.fsck(local).ok


def test_a_first_commit_marks_head_born_though_set_info_moved_head_meanwhile(tmp_path: Path) -> None:
    """The first append to a session whose HEAD ``set_info`` made adds the born mark with one
    compare-and-swap of HEAD after the branch landed; a ``set_info`` of another process landing
    just before it made it give up, leaving a session with history and no mark: its only
    branch lost would then look never born (a session passed as sound, its commits left to gc)."""
    root = str(tmp_path / "store")
    castore.open(root, durable=False).session("bot", "ann", "s").set_info({"title": "first"})

    def other() -> None:
        castore.open(root, durable=False).session("bot", "ann", "s").set_info({"title": "second"})

    storage = _Meanwhile(open_storage(root), "swap")
    s = storage.arm(other).session("bot", "ann", "s")
    _msgs(s, 1)
    assert storage.then is None  # the other's set_info landed just before the mark's swap
    head = castore.open(root, durable=False).refs.read(s.refs.head)
    assert head is not None and head.meta.get(META_BORN) is True
    assert castore.open(root, durable=False).session("bot", "ann", "s").info == {"title": "second"}


@pytest.mark.parametrize("ref", ["HEAD", "heads/main"])
def test_usage_and_grep_go_past_a_session_whose_ref_file_is_garbage(tmp_path: Path, ref: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """One session's ref file holding garbage stopped ``castore usage`` and ``castore grep`` of the
    whole store at it (one Error line, nothing counted or found). They now count and search the
    others and name that session after them (usage's exit 1, grep's exit 2), as a lost branch."""
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(tmp_path / "index"))
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(tmp_path / "usage.json"))
    root = tmp_path / "st"
    with castore.open(str(root)) as store:
        for sid in ("fine", "bad"):
            s = store.session("app", "u", sid)
            s.append(castore.Event(author="assistant", message=castore.Message(role="assistant", content="parser"),
                                   meta={"model": "m-x", "usage": {"input_tokens": 7, "output_tokens": 3}}))
    (root / "refs" / "sessions" / "app" / "u" / "bad" / ref).write_bytes(b"\x00not a ref")
    runner = CliRunner()
    res = runner.invoke(main, ["--store", str(root), "grep", "-c", "parser"])
    assert (res.exit_code, res.stdout) == (2, "app/u/fine:1\n"), res.output
    assert [line for line in res.stderr.splitlines() if line.startswith("Error: ")] == [
        f"Error: app/u/bad cannot be searched whole (ref 'sessions/app/u/bad/{ref}' is corrupt: bad target "
        "'\\x00not a ref'); `castore fsck` says more"]
    res = runner.invoke(main, ["--store", str(root), "usage", "--by", "session", "--json"])
    assert res.exit_code == 1, res.output
    doc = __import__("json").loads(res.stdout)
    assert [u["session"] for u in doc["unreadable"]] == ["app/u/bad"]
    assert [r["name"] for r in doc["rows"]] == ["app/u/fine"], doc
