"""Bad input and hostile data (issue 18): what goes into an object is checked before anything
is written, reading survives one damaged session, storage keys stay inside the store, locks
are owned by their ``flock``, and human output cannot drive the reader's terminal."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore import maintenance
from castore.cli import main
from castore.entries import (
    MAX_DEPTH,
    BranchSummary,
    Compaction,
    Custom,
    Event,
    Message,
    ModelChange,
)
from castore.errors import InvalidEntry, InvalidName, RefLocked, StorageError
from castore.storage import locks as locks_mod

MSG = {"role": "user", "content": "hi"}
CRASH_WRITER = str(Path(__file__).parent / "crash_writer.py")


def _nested(depth: int) -> Any:
    v: Any = "leaf"
    for _ in range(depth):
        v = [v]
    return v


def _stored_files(store: castore.Store) -> list[str]:
    return store.storage.list("")


# -- 18.3: everything that goes into an object is validated first ----------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"time": "yesterday"}, "time"),
        ({"time": True}, "time"),
        ({"time": math.nan}, "time"),
        ({"time": math.inf}, "time"),
        ({"time": 10**400}, "time"),
        ({"author": 5}, "author"),
        ({"author": b"x"}, "author"),
        ({"meta": {1: "x"}}, "meta key"),
        ({"meta": {"usage": math.nan}}, "meta['usage']"),
        ({"meta": 5}, "meta"),
        ({"state_delta": {3: "x"}}, "state key"),
        ({"state_delta": {"score": math.inf}}, "state key 'score'"),
        ({"state_delta": {"app:deep": _nested(5000)}}, "state key 'app:deep'"),
        ({"state_delta": {"user:bad": {"k": {2: 3}}}}, "state key 'user:bad'"),
    ],
)
def test_append_refuses_bad_provenance_and_state_naming_the_field_and_writes_nothing(
    local_store: castore.Store, kwargs: dict[str, Any], field: str
) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    before = _stored_files(local_store)
    with pytest.raises(InvalidEntry, match=re.escape(field)):
        s.append(MSG, **kwargs)
    assert _stored_files(local_store) == before
    assert len(s.log()) == 1
    assert local_store.sessions("app")[0].entries == 1
    assert maintenance.fsck(local_store).ok


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: Compaction(summary=5), "Compaction.summary"),  # type: ignore[arg-type]
        (lambda: Compaction("s", first_kept=7), "Compaction.first_kept"),  # type: ignore[arg-type]
        (lambda: Compaction("s", tokens_before="many"), "Compaction.tokens_before"),  # type: ignore[arg-type]
        (lambda: Compaction("s", tokens_before=True), "Compaction.tokens_before"),
        (lambda: BranchSummary(summary=b"x"), "BranchSummary.summary"),  # type: ignore[arg-type]
        (lambda: BranchSummary("s", from_id=1), "BranchSummary.from_id"),  # type: ignore[arg-type]
        (lambda: ModelChange(model=3), "ModelChange.model"),  # type: ignore[arg-type]
        (lambda: ModelChange(thinking_level=["hi"]), "ModelChange.thinking_level"),  # type: ignore[arg-type]
        (lambda: Custom(type=None), "Custom.type"),  # type: ignore[arg-type]
        (lambda: Event(author=5), "author"),  # type: ignore[arg-type]
        (lambda: Event(author="a", message={"role": "user"}), "message"),  # type: ignore[arg-type]
        (lambda: Event(author="a", meta={1: 2}), "meta"),  # type: ignore[dict-item]
    ],
)
def test_entry_types_refuse_wrong_field_types_when_made(make: Any, field: str) -> None:
    with pytest.raises(InvalidEntry, match=field):
        make()


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        (Compaction("s", details=_nested(5000)), "compaction field 'details'"),
        (Compaction("s", details={"x": math.nan}), "compaction field 'details'"),
        (BranchSummary("s", details=_nested(MAX_DEPTH + 1)), "branch_summary field 'details'"),
        (Custom("t", data=_nested(5000)), "custom field 'data'"),
        (Custom("t", data=[1.0, -math.inf]), "custom field 'data'"),
        (Message("user", content=_nested(5000)), "message field 'content'"),
        (Message("user", content="x", tool_calls=5), "tool_calls"),  # type: ignore[arg-type]
        (Message("user", content="x", tool_calls=["call"]), "tool_calls"),  # type: ignore[list-item]
        (Message("user", content="x", tool_call_id=5), "tool_call_id"),  # type: ignore[arg-type]
        (Message("user", content="x", name=b"n"), "name"),  # type: ignore[arg-type]
        (Event("bot", message=Message("assistant", content=_nested(5000))), "event field 'content'"),
        (Event("bot", state_delta={"s": _nested(5000)}), "state key 's'"),
        (Event("bot", meta={"usage": {"tokens": math.nan}}), "meta['usage']"),
        ({"role": "user", "content": "x", "extra": _nested(5000)}, "message field 'extra'"),
    ],
)
def test_append_refuses_deep_or_non_finite_values_with_invalid_entry_not_recursion_error(
    local_store: castore.Store, entry: Any, field: str
) -> None:
    s = local_store.session("app", "alice", "s1")
    with pytest.raises(InvalidEntry, match=re.escape(field)):
        s.append(entry)
    assert _stored_files(local_store) == []


def test_values_up_to_the_depth_limit_are_stored_and_read_back(local_store: castore.Store) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(Custom("t", data=_nested(MAX_DEPTH - 1)), state_delta={"k": _nested(MAX_DEPTH - 1)}, time=1_700_000_000)
    fresh = castore.open(local_store.storage.root).session("app", "alice", "s1")
    e = fresh.log()[0]
    assert e.entry == Custom("t", data=_nested(MAX_DEPTH - 1)) and e.time == 1_700_000_000.0
    assert fresh.state()["k"] == _nested(MAX_DEPTH - 1)


def test_self_containing_value_is_refused(local_store: castore.Store) -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidEntry, match="deeper than"):
        local_store.session("app", "alice", "s1").append(Custom("t", data=loop))


def test_scope_state_and_session_info_are_checked_before_writing(local_store: castore.Store) -> None:
    with pytest.raises(InvalidEntry, match="state key 'x'"):
        local_store.update_scope("app", None, {"x": math.nan})
    with pytest.raises(InvalidEntry, match="author"):
        local_store.update_scope("app", "alice", {"x": 1}, author=5)  # type: ignore[arg-type]
    with pytest.raises(InvalidEntry, match="session info"):
        local_store.session("app", "alice", "s1").set_info({"deep": _nested(5000)})
    assert _stored_files(local_store) == []


def test_listing_survives_a_session_whose_ref_metadata_has_wrong_types(local_store: castore.Store) -> None:
    # Written by an older castore (which accepted time="yesterday") or by another client.
    good = local_store.session("app", "alice", "good")
    good.append(MSG)
    bad = local_store.session("app", "alice", "bad")
    bad.append(MSG)
    ref = "sessions/app/alice/bad/heads/main"
    cur = local_store.refs.read(ref)
    local_store.refs.swap(ref, cur.target, cur, {"t": "yesterday", "n": [1], "name": 5})
    head = local_store.refs.read("sessions/app/alice/bad/HEAD")
    local_store.refs.swap("sessions/app/alice/bad/HEAD", head.target, head, {"names": "x", "info": 3})
    infos = {i.session: i for i in local_store.sessions("app")}
    assert set(infos) == {"good", "bad"}
    assert infos["bad"].updated == 0.0 and infos["bad"].entries == 0 and infos["bad"].info == {}
    r = CliRunner().invoke(main, ["--store", local_store.storage.root, "sessions", "app"])
    assert r.exit_code == 0, r.output
    assert "app/alice/bad" in r.stdout and "app/alice/good" in r.stdout


def test_stored_entry_with_wrong_field_types_reads_as_a_custom_record(local_store: castore.Store) -> None:
    # A compaction body written before its fields were checked: reading keeps it verbatim.
    from castore.entries import entry_from

    e = entry_from("compaction", {"summary": 5}, "", {}, {})
    assert e == Custom("compaction", {"summary": 5})


# -- 18.1: a storage key never resolves outside the store ------------------------------------

BAD_KEYS = ["../escape", "refs/../../escape", "/tmp/escape", "refs//x", "refs/./x", "refs/x\0y", "refs/..", "", "a/"]


@pytest.fixture(params=["local", "memory"])
def plain_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from castore.storage import open_storage

    if request.param == "local":
        (tmp_path / "root" / "store").mkdir(parents=True)
        return open_storage(str(tmp_path / "root" / "store"))
    return open_storage(f"memory://hostile-{uuid.uuid4().hex}")


@pytest.mark.parametrize("key", BAD_KEYS)
def test_storage_refuses_keys_that_could_leave_its_root(plain_storage: Any, key: str, tmp_path: Path) -> None:
    st = plain_storage
    for call in (lambda: st.write(key, b"x"), lambda: st.write_many({"ok/a": b"1", key: b"x"}),
                 lambda: st.swap(key, b"x", None), lambda: st.delete(key), lambda: st.delete(key, expect="t")):
        with pytest.raises(InvalidName, match="storage key"):
            call()
    if st.url.startswith("memory://"):
        assert st.list("") == []
    else:
        for call in (lambda: st.read(key), lambda: st.read_versioned(key), lambda: st.exists(key)):
            with pytest.raises(InvalidName, match="storage key"):
                call()
        assert [p.name for p in (tmp_path / "root").iterdir()] == ["store"]
        assert list((tmp_path / "root" / "store").iterdir()) == []
        assert not (tmp_path / "escape").exists() and not Path("/tmp/escape").exists()


def test_ref_names_with_dot_dot_cannot_write_outside_a_local_store(local_store: castore.Store, tmp_path: Path) -> None:
    # What a hostile remote's listing would hand to the refs layer.
    outside = tmp_path / "outside"
    name = "sessions/app/u/s/heads/../../../../../../outside/evil"
    with pytest.raises(InvalidName):
        local_store.refs.swap(name, "0" * 64, None, {"x": "$(touch /tmp/pwned)"})
    assert not outside.exists()
    assert local_store.storage.list("") == []


def test_local_storage_refuses_to_follow_a_symlink_out_of_the_store(local_store: castore.Store, tmp_path: Path) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    root = Path(local_store.storage.root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_bytes(b"keep me")
    (root / "refs" / "sessions" / "evil").symlink_to(outside)
    fresh = castore.open(str(root))
    with pytest.raises(InvalidName, match="outside the store"):
        fresh.storage.write("refs/sessions/evil/planted", b"x")
    with pytest.raises(InvalidName, match="outside the store"):
        fresh.storage.delete("refs/sessions/evil/victim")
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"keep me"
    fresh.session("app", "alice", "s1").append(MSG)  # the rest of the store still works


def test_a_symlink_planted_under_a_folder_the_handle_made_is_still_refused(local_store: castore.Store,
                                                                           tmp_path: Path) -> None:
    # a handle makes new folders under the ones it made with plain mkdir calls: a folder that
    # is already there (here a symlink planted since) goes through the full check
    local_store.storage.write("refs/sessions/made/a/one", b"x")
    root = Path(local_store.storage.root)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "refs" / "sessions" / "made" / "evil").symlink_to(outside)
    with pytest.raises(InvalidName, match="outside the store"):
        local_store.storage.write("refs/sessions/made/evil/deeper/planted", b"x")
    assert list(outside.iterdir()) == []
    local_store.storage.write("refs/sessions/made/b/c/two", b"y")  # new folders under it still work
    assert local_store.storage.read("refs/sessions/made/b/c/two") == b"y"


# -- 18.4: a lock is owned by its flock, waits are bounded, lock failures are castore errors ---


def _plant_lock(store: castore.Store, ref: str, owner: str) -> Path:
    lock = Path(store.storage.root, *f"refs/{ref}.lock".split("/"))
    lock.write_text(owner)
    return lock


def test_lock_naming_a_live_pid_but_held_by_no_flock_is_stale(local_store: castore.Store) -> None:
    # A restarted container reuses pid 1: the recorded pid is alive, but nobody holds the lock.
    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    ref = "sessions/app/alice/s1/heads/main"
    _plant_lock(local_store, ref, f"{os.getpid()} {os.uname().nodename}\n")
    r = maintenance.fsck(local_store)
    assert r.stale_locks == [f"refs/{ref}.lock"] and not r.ok
    assert maintenance.gc(local_store, grace=0).locks_cleared == [f"refs/{ref}.lock"]
    assert maintenance.fsck(local_store).ok
    _plant_lock(local_store, ref, "1 some-other-host\n")
    t0 = time.monotonic()
    s.append(MSG)  # the next writer clears it at once instead of waiting for it
    assert time.monotonic() - t0 < locks_mod.LOCK_TIMEOUT
    assert len(s.log()) == 2


def test_a_lock_held_by_a_live_writer_ends_the_wait_with_ref_locked_naming_the_file(
    local_store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    ref = "refs/sessions/app/alice/s1/heads/main"
    child = subprocess.Popen([sys.executable, CRASH_WRITER, "hold-lock", local_store.storage.root, ref],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "locked"
        monkeypatch.setattr(locks_mod, "LOCK_TIMEOUT", 0.2)
        with pytest.raises(RefLocked) as info:
            local_store.refs.swap("sessions/app/alice/s1/heads/main", "1" * 64, local_store.refs.read(
                "sessions/app/alice/s1/heads/main"))
        msg = str(info.value)
        assert f"{ref}.lock" in msg and f"process {child.pid}" in msg and "stop it" in msg
        assert maintenance.fsck(local_store).stale_locks == []  # a held lock is not stale
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
    assert locks_mod.LOCK_TIMEOUT <= 10


def test_a_lock_file_that_cannot_be_created_is_a_storage_error_not_a_traceback(local_store: castore.Store) -> None:
    # The lock of a 255-byte name is 260 bytes: the file system refuses it (ENAMETOOLONG).
    long = "x" * 255
    with pytest.raises(StorageError, match="cannot create lock file"):
        local_store.storage.swap(f"refs/{long}", b"x", None)


def _without_root_powers() -> list[str]:
    """A command prefix under which folder permissions apply (root ignores them)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: folder permissions would not apply")
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}", "--"]


def test_an_unwritable_refs_folder_is_one_cli_error(local_store: castore.Store) -> None:
    local_store.session("app", "alice", "s1").append(MSG)
    heads = Path(local_store.storage.root, "refs", "sessions", "app", "alice", "s1", "heads")
    cmd = [*_without_root_powers(), sys.executable, "-c", "from castore.cli import main; main()",
           "--store", local_store.storage.root, "-s", "app/alice/s1", "append", "--role", "user", "x"]
    heads.chmod(0o555)
    try:
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(castore.__file__).parent.parent)})
    finally:
        heads.chmod(0o755)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "main.lock" in r.stderr and "Permission denied" in r.stderr
    assert len(local_store.session("app", "alice", "s1").log()) == 1


def test_a_store_in_proc_fails_at_once_with_an_error_line() -> None:
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    r = CliRunner().invoke(main, ["--store", "/proc/", "init"])
    assert r.exit_code == 1
    assert r.stderr.startswith("Error: ") and len(r.stderr.strip().splitlines()) == 1


# -- 18.6: no existence oracle, no raw tracebacks ----------------------------------------------


def test_another_tenants_body_id_answers_exactly_like_an_unknown_revision(local_store: castore.Store) -> None:
    from castore import objects as o
    from castore.objects import Value

    local_store.session("app", "bob", "s").append({"role": "user", "content": "bob's secret"})
    eve = local_store.session("app", "eve", "t")
    eve.append(MSG)
    body_id, _ = o.encode(Value({"role": "user", "content": "bob's secret"}))
    bob_commit = local_store.session("app", "bob", "s").head
    assert local_store.objects.get(body_id)  # it is stored
    unknown = ("f" if body_id[0] != "f" else "e") + body_id[1:]
    answers = []
    for rev in (body_id, unknown, body_id[:10], unknown[:10], bob_commit[:10], "0" * 10):
        with pytest.raises(castore.RevisionNotFound) as info:
            eve.resolve(rev)
        answers.append(str(info.value).replace(rev, "REV"))
        r = CliRunner().invoke(main, ["--store", local_store.storage.root, "-s", "app/eve/t", "show", rev])
        assert r.exit_code == 1
        answers.append(r.stderr.replace(rev, "REV"))
    assert len(set(answers[0::2])) == 1 and len(set(answers[1::2])) == 1, answers


def test_a_huge_step_count_is_a_short_revision_not_found(local_store: castore.Store) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    rev = "HEAD~" + "9" * 5000
    with pytest.raises(castore.RevisionNotFound) as info:
        s.resolve(rev)
    assert len(str(info.value)) < 200
    r = CliRunner().invoke(main, ["--store", local_store.storage.root, "-s", "app/alice/s1", "show", rev])
    assert r.exit_code == 1 and r.stderr.startswith("Error: unknown revision") and len(r.stderr) < 200
    with pytest.raises(castore.RevisionNotFound, match="only 0 commits"):
        s.resolve("HEAD~" + "9" * 18)


def test_serve_opens_every_session_it_lists_even_with_odd_names(local_store: castore.Store) -> None:
    import html as html_mod
    import http.client
    import re as re_mod
    import threading

    from castore.html.server import make_server

    odd = ["nul\0name", "a/../b", "..x", "dots..", "tab\tand\x1b[31mesc"]
    for sid in odd:
        local_store.session("app", "alice", sid).append(MSG)
    srv = make_server(castore.open(local_store.storage.root), "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        def get(path: str) -> tuple[int, str]:
            conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read().decode("utf-8", "replace")
            conn.close()
            return resp.status, body

        status, index = get("/")
        assert status == 200
        links = [html_mod.unescape(h) for h in re_mod.findall(r'href="(/s/[^"]+)"', index)]
        assert len(links) == len(odd)
        for link in links:
            assert get(link)[0] == 200, link
        assert get("/s/app/alice/..")[0] == 404
        assert get("/s/app/alice/no-such")[0] == 404
    finally:
        srv.shutdown()
        srv.server_close()


def test_openai_adapter_names_the_limit_it_was_given() -> None:
    pytest.importorskip("agents")
    import asyncio

    from castore.adapters.openai_agents import CastoreSession

    s = CastoreSession("lim", store=f"memory://oa-{uuid.uuid4().hex}")
    asyncio.run(s.add_items([{"role": "user", "content": "hi"}]))
    for bad in (1.5, "2", True):
        with pytest.raises(InvalidEntry, match=re.escape(f"limit must be a whole number or None, not {bad!r}")):
            asyncio.run(s.get_items(limit=bad))  # type: ignore[arg-type]
    # settings given as a dict are checked when the session is made, by the SDK's own rules
    # (as SQLiteSession does): a pydantic ValidationError, which is a ValueError
    with pytest.raises(ValueError, match="limit"):
        CastoreSession("lim", store=s.store, session_settings={"limit": 2.5})


# -- 18.5: what a model wrote cannot drive the reader's terminal ------------------------------

EVIL = "A\x1b]52;c;cm0gLXJmIH4=\x07B\x1b[2J\rC\x08D\x9b31mE\u202eF\u2066G\x7fH"
RAW_CONTROLS = ["\x1b", "\x07", "\x08", "\r", "\x9b", "\u202e", "\u2066", "\x7f"]


def _hostile_session(store: castore.Store) -> castore.Session:
    from castore.entries import Compaction as Comp

    s = store.session("app" + EVIL, "user" + EVIL, "sess" + EVIL)
    s.append({"role": "user", "content": "hello " + EVIL + "\nsecond line " + EVIL})
    s.append(Event(author="bot" + EVIL, message=Message("assistant", content=EVIL,
                                                           tool_calls=[{"id": "c1", "function": {"name": "f" + EVIL,
                                                                                                  "arguments": EVIL}}])),
             state_delta={"key" + EVIL: "value" + EVIL})
    s.append(Custom("type" + EVIL, {"d": EVIL}))
    s.append(Comp(summary="summary " + EVIL))
    s.branch("br" + EVIL)
    s.label("lab" + EVIL, at="HEAD~1")
    return s


def _human_commands(s: castore.Session) -> list[list[str]]:
    return [["log"], ["log", "--oneline"], ["log", "--graph", "--all"], ["show"], ["show", "HEAD~2"],
            ["context"], ["diff", "HEAD~3", "HEAD"], ["branch"], ["labels"], ["sessions"], ["fsck"]]


@pytest.mark.parametrize("color", [False, True])
def test_human_output_escapes_control_characters_from_stored_data(local_store: castore.Store, color: bool) -> None:
    from castore.cli.common import format_key

    s = _hostile_session(local_store)
    base = ["--store", local_store.storage.root, "-s", format_key(*s.key)]
    for cmd in _human_commands(s):
        argv = base[:2] if cmd[0] in ("sessions", "fsck") else base  # -s only where a session is worked on
        r = CliRunner().invoke(main, [*argv, *cmd], color=color)
        assert r.exit_code == 0, (cmd, r.output)
        out = r.stdout + r.stderr
        if color:  # castore's own colours stay; the data's escape sequences do not
            out = re.sub(r"\x1b\[[0-9;]*m", "", out)
        for ch in RAW_CONTROLS:
            assert ch not in out, (cmd, ch, out)
        if cmd[0] not in ("fsck", "branch", "labels", "sessions"):
            assert "\\x1b]52;c;" in out, (cmd, out)
    assert "\\u202e" in CliRunner().invoke(main, [*base, "branch"]).stdout
    assert "\\x9b31m" in CliRunner().invoke(main, [*base, "labels"]).stdout


def test_json_output_keeps_the_stored_text_exactly(local_store: castore.Store) -> None:
    import json

    from castore.cli.common import format_key

    s = _hostile_session(local_store)
    base = ["--store", local_store.storage.root, "-s", format_key(*s.key)]
    doc = json.loads(CliRunner().invoke(main, [*base, "show", "HEAD~3", "--json"]).stdout)
    assert doc["entry"]["content"] == "hello " + EVIL + "\nsecond line " + EVIL
    doc = json.loads(CliRunner().invoke(main, [*base, "labels", "--json"]).stdout)
    assert doc["labels"][0]["name"] == "lab" + EVIL


def test_an_error_quoting_a_name_is_escaped_too(local_store: castore.Store) -> None:
    local_store.session("app", "alice", "s1").append(MSG)
    r = CliRunner().invoke(main, ["--store", local_store.storage.root, "-s", "app/alice/x\x1b]52;c;YQ==\x07", "log"])
    assert r.exit_code == 1 and r.stderr.startswith("Error: ")
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "\\x1b]52;c;YQ==\\a" in r.stderr


# -- fsck reports what older versions (or other tools) could store --------------------------


def _store_raw_commit(store: castore.Store, sid: str, commit_kw: dict[str, Any], body: Any = None) -> str:
    from castore import objects as o
    from castore.objects import Commit, Value

    pending = {}
    body_id = None
    if body is not None:
        bid, data = o.encode(Value(body))
        pending[bid] = data
        body_id = o.raw_id(bid)
    cid, data = o.encode(Commit(body=body_id, **commit_kw))
    pending[cid] = data
    store.objects.put_encoded(pending.items())
    store.init()
    store.refs.swap(f"sessions/app/alice/{sid}/heads/main", cid, None, {"t": 1.0, "n": 1})
    store.refs.swap(f"sessions/app/alice/{sid}/HEAD", "ref: heads/main", None, {})
    return cid


def test_fsck_reports_entries_an_append_would_refuse_and_readers_survive_them(local_store: castore.Store) -> None:
    local_store.session("app", "alice", "fine").append(MSG)
    assert maintenance.fsck(local_store).ok
    _store_raw_commit(local_store, "c1", {"kind": "compaction", "time": 1.0}, {"summary": 5})
    _store_raw_commit(local_store, "c2", {"kind": "message", "time": math.inf}, MSG)
    _store_raw_commit(local_store, "c3", {"kind": "message", "time": 1.0, "delta": {"k": math.nan}}, MSG)
    _store_raw_commit(local_store, "c4", {"kind": "message", "time": 1.0}, {**MSG, "tool_calls": 5})
    r = maintenance.fsck(local_store)
    reasons = " | ".join(why for _, why in r.corrupt)
    assert not r.ok and len(r.corrupt) == 4, reasons
    assert "compaction body" in reasons and "time" in reasons and "non-finite" in reasons and "tool_calls" in reasons
    assert {s.session for s in local_store.sessions("app")} == {"fine", "c1", "c2", "c3", "c4"}
    e = local_store.session("app", "alice", "c1").log()[0]
    assert e.entry == Custom("compaction", {"summary": 5})
    rr = CliRunner().invoke(main, ["--store", local_store.storage.root, "fsck"])
    assert rr.exit_code == 1 and "compaction body" in rr.stdout


def test_append_and_checkout_do_not_retry_a_held_lock_as_a_lost_race(
    local_store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    s.branch("other")
    monkeypatch.setattr(locks_mod, "LOCK_TIMEOUT", 0.2)
    for ref, call in (("refs/sessions/app/alice/s1/heads/main", lambda: s.append(MSG)),
                      ("refs/sessions/app/alice/s1/HEAD", lambda: s.checkout("other"))):
        child = subprocess.Popen([sys.executable, CRASH_WRITER, "hold-lock", local_store.storage.root, ref],
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "locked"
            with pytest.raises(RefLocked, match=re.escape(f"{ref}.lock")):
                call()  # before: RefConflict "too much contention" after 200 waits (checkout: never)
        finally:
            child.kill()
            child.wait()
            child.stdout.close()  # type: ignore[union-attr]
    assert len(s.log()) == 1


def test_listing_survives_a_head_that_names_no_branch(local_store: castore.Store) -> None:
    local_store.session("app", "alice", "good").append(MSG)
    local_store.session("app", "alice", "bad").append(MSG)
    head = local_store.refs.read("sessions/app/alice/bad/HEAD")
    local_store.refs.swap("sessions/app/alice/bad/HEAD", "ref: HEAD", head, {})
    infos = {i.session: i for i in local_store.sessions("app")}
    assert set(infos) == {"good", "bad"} and infos["bad"].branch is None and infos["good"].branch == "main"
    r = CliRunner().invoke(main, ["--store", local_store.storage.root, "sessions"])
    assert r.exit_code == 0 and "app/alice/good" in r.stdout


def test_serve_log_escapes_control_characters_of_the_request_line(local_store: castore.Store) -> None:
    import socket
    import threading

    from castore.html.server import make_server

    lines: list[str] = []
    srv = make_server(castore.open(local_store.storage.root), "127.0.0.1", 0, log=lines.append)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        with socket.create_connection(srv.server_address[:2], timeout=30) as sock:
            sock.sendall(b"GET /\x1b]52;c;YQ==\x07 HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            while sock.recv(65536):
                pass
    finally:
        srv.shutdown()
        srv.server_close()
    assert lines and all("\x1b" not in line and "\x07" not in line for line in lines), lines
    assert any("\\x1b]52;c;YQ==\\x07" in line for line in lines), lines


@pytest.mark.parametrize("field", ["role", "name", "tool_calls", "author", "time"])
def test_a_deep_value_in_a_scalar_field_is_an_invalid_entry_with_a_short_message(
    local_store: castore.Store, field: str
) -> None:
    deep = _nested(5000)
    s = local_store.session("app", "alice", "s1")
    with pytest.raises(InvalidEntry, match=field) as info:
        if field in ("author", "time"):
            s.append(MSG, **{field: deep})
        else:
            s.append({"role": "user", "content": "x", field: deep})
    assert len(str(info.value)) < 200


def test_a_held_lock_with_a_garbled_owner_line_is_named_safely(
    local_store: castore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RefLocked message quoted the lock file's owner bytes as they were (up to 200 of
    them, decoded with replacement): a damaged file or another program could put terminal
    escapes (an OSC 52 clipboard write), a carriage return or kilobytes in every message and
    log line. Only an owner line as castore writes it is named as a process; anything else is
    shown escaped and cut."""
    import fcntl

    s = local_store.session("app", "alice", "s1")
    s.append(MSG)
    ref = "sessions/app/alice/s1/heads/main"
    monkeypatch.setattr(locks_mod, "LOCK_TIMEOUT", 0.2)
    for owner, shown in ((b"\x1b]52;c;cHduZWQ=\x07 \r\xff\xfe" + b"A" * 5000, "\\x1b]52;c;cHduZWQ=\\x07 \\x0d\\xff"),
                         (b"12 host\x9b31m", "12 host\\x9b31m"), (b"\n\n", None)):
        lock = _plant_lock(local_store, ref, "")
        lock.write_bytes(owner)
        with open(lock, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)  # a live holder: this open file, not the writer's
            with pytest.raises(RefLocked) as info:
                local_store.refs.swap(ref, "1" * 64, local_store.refs.read(ref))
        lock.unlink()
        msg = str(info.value)
        assert msg.isprintable() and msg.isascii() and len(msg) - len(str(lock)) < 350, msg
        assert "is held by another process" in msg and "stop it" in msg
        assert shown is None or (shown in msg and "its owner line is not castore's" in msg), msg
    assert len(s.log()) == 1


def test_an_archive_import_finds_no_file_through_a_symlink_but_claude_codes(tmp_path: Path) -> None:
    from castore.adapters import claude_code, codex, detect, gemini, pi

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "deep").mkdir(parents=True)
    for p in (elsewhere / "secret.jsonl", elsewhere / "deep" / "secret.jsonl"):
        p.write_text('{"type": "session"}\n')
    root = tmp_path / "sessions"

    def planted(folder: Path) -> Path:
        """``folder`` with one real file, a linked folder and a linked file in it."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "real.jsonl").write_text('{"type": "session"}\n')
        (folder / "linked").symlink_to(elsewhere, target_is_directory=True)
        (folder / "alias.jsonl").symlink_to(elsewhere / "secret.jsonl")
        return folder

    def found(paths: list[str]) -> list[str]:
        return sorted(os.path.relpath(p, tmp_path) for p in paths)

    assert found(pi.find_files(planted(root / "pi"))) == ["sessions/pi/real.jsonl"]
    assert found([s.path for s in codex.find_rollouts(planted(root / "codex"))]) == ["sessions/codex/real.jsonl"]
    assert found([s.path for s in gemini.find_sessions(planted(root / "gemini" / "chats"))]) == [
        "sessions/gemini/chats/real.jsonl"]
    # Claude Code's importer follows linked folders (dotfiles managers link ~/.claude/projects
    # or a project: test_claude_symlinks), each real folder once; not a linked file in a session's folder
    proj = root / "claude" / "proj"
    proj.mkdir(parents=True)
    (proj / "s1.jsonl").write_text('{"type": "user"}\n')
    planted(proj / "s1" / "subagents")
    assert found([s.path for s in claude_code.find_sessions(proj)]) == [
        "sessions/claude/proj/s1.jsonl", "sessions/claude/proj/s1/subagents/linked/deep/secret.jsonl",
        "sessions/claude/proj/s1/subagents/linked/secret.jsonl", "sessions/claude/proj/s1/subagents/real.jsonl"]
    assert not any("alias" in p for p in detect._sample(str(root)))


@pytest.mark.parametrize("ref", ["HEAD", "heads/main"])
def test_ref_metadata_numbers_beyond_any_float_are_no_time_not_a_traceback(tmp_path: Path, ref: str) -> None:
    """JSON bounds no integer: a ref file whose metadata holds one beyond any float (a deletion's
    mark, a time, a count; damaged or hand-written, or pulled) made sessions, fsck, usage, grep,
    expire, push and delete-session all end in an OverflowError traceback. Such a number now
    reads as none, as a string there does."""
    root = tmp_path / "st"
    with castore.open(str(root)) as store:
        for sid in ("odd", "fine"):
            store.session("app", "u", sid).append(castore.Message(role="user", content="parser"))
        value = store.refs.read(f"sessions/app/u/odd/{ref}")
    assert value is not None
    huge = 10 ** 400
    meta = {"deleting": huge, "created": -huge} if ref == "HEAD" else {"t": huge, "n": huge}
    first = f"ref: {value.symbolic}" if value.symbolic is not None else value.target
    (root / "refs" / "sessions" / "app" / "u" / "odd" / ref).write_text(f"{first}\n{json.dumps(meta)}\n")
    runner = CliRunner()
    for args in (["sessions"], ["sessions", "--json"], ["fsck"], ["usage"], ["grep", "-c", "parser"],
                 ["expire", "--older-than", "1d", "--dry-run"], ["push", "--all", str(tmp_path / "remote")],
                 ["-s", "app/u/odd", "log"], ["delete-session", "app/u/odd"]):
        res = runner.invoke(main, ["--store", str(root), *args])
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.output, res.exception)
        assert "Traceback" not in res.output, (args, res.output)
    res = runner.invoke(main, ["--store", str(root), "sessions"])
    assert [line.split()[0] for line in res.stdout.splitlines()] == ["app/u/fine"]
