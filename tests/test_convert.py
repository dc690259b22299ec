"""``castore encrypt``: a plain store converted into a new encrypted copy (castore/convert.py).

Every id changes (keyed hashes), so the tests compare what a reader sees: logs, contexts,
states at every branch and label, HEAD, the reflog, scope state, byte-exact exports of
imported Claude Code and Codex sessions, a LangGraph thread; the copy's fsck is clean and no
marker is in any of its bytes (the same scan finds them in the plain source: the control).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import Backend, backend_on

import castore
from castore.cli import main
from castore.convert import ConvertError, compare, convert
from castore.crypto.keys import MasterKey
from castore.entries import Message, ModelChange
from castore.maintenance import fsck
from castore.storage import open_storage

# S3 under -m slow (about 10 s): the encrypted store on S3 is covered in CI by test_encrypted_store
backend = backend_on("local", pytest.param("s3", marks=pytest.mark.slow))

DATA = Path(__file__).resolve().parent / "data"
TEXT = "QUOKKA-CONVERT-MARKER"
STATE = "WOMBAT-CONVERT-STATE"
TOOL = "NUMBAT-CONVERT-TOOL"
MARKERS = [m.encode() for m in (TEXT, STATE, TOOL)]


def every_byte(url: str, options: dict[str, Any]) -> dict[str, bytes]:
    storage = open_storage(url, **options)
    try:
        got = storage.read_many(storage.list(""))
    finally:
        storage.close()
    return {k: v for k, v in got.items() if v is not None}


def markers_in(url: str, options: dict[str, Any]) -> list[tuple[str, bytes]]:
    return [(k, m) for k, v in every_byte(url, options).items() for m in MARKERS if m in v]


def dest_of(backend: Backend) -> str:
    """A second, empty place beside the backend's store."""
    return backend.url.rsplit("/", 1)[0] + "/encrypted"


def uncompressed(url: str, options: dict[str, Any], **kw: Any) -> castore.Store:
    """A store whose frames are not compressed: a marker stored in clear would show as is."""
    return castore.Store(open_storage(url, **options), compress=False, **kw)


@pytest.fixture
def key() -> str:
    return MasterKey.new()


def fill(store: castore.Store) -> None:
    """Branches, a fork, a compaction, labels, a detached HEAD, a reset (reflog), remote-tracking
    tips, app and user state, a long path (segments and indexes), a big tool output, the
    session's info and a model (both kept in ref metadata, which the copy seals)."""
    s = store.session("app", "alice", "s1")
    s.set_info({"title": f"{TEXT} title", "path": f"/home/{TEXT}.jsonl"})
    s.append(ModelChange(model=f"{TEXT}-model", provider="p"))
    for i in range(150):  # over two segment blocks
        s.append(Message(role="user" if i % 2 == 0 else "assistant", content=f"{TEXT} turn {i}"),
                 state_delta={"note": f"{STATE} {i}"} if i % 20 == 0 else None)
    s.append(Message(role="tool", content=f"{TOOL} " + os.urandom(3000).hex(), tool_call_id="t1"))
    s.branch("retry", at="HEAD~5")
    s.label("v1", at="HEAD~2")
    s.compact(f"{TEXT} summary", keep_from="HEAD~10")
    s.append(Message(role="user", content=f"{TEXT} after the compaction"))
    s.reset("HEAD~1")  # the old tip goes to the reflog
    s.fork("s2").append(Message(role="user", content=f"{TEXT} in the fork"))
    store.update_scope("app", None, {"shared": f"{STATE} app scope"})
    store.update_scope("app", "alice", {"pref": f"{STATE} user scope"})
    d = store.session("app", "bob", "b1")
    d.append(Message(role="user", content=f"{TEXT} bob"))
    d.append(Message(role="assistant", content="ok"))
    d.checkout("HEAD~1")  # detached
    home = store.tenant("app", "alice")
    tip = s.resolve("retry")
    home.plumbing.swap(f"{s.refs.prefix}/remotes/origin/main", tip, None, {})


def test_a_plain_store_converts_into_an_encrypted_copy_that_reads_the_same(backend: Backend, key: str) -> None:
    with uncompressed(backend.url, backend.options) as src:
        fill(src)
    before = every_byte(backend.url, backend.options)
    assert markers_in(backend.url, backend.options)  # the control: the scan sees plaintext
    dest = dest_of(backend)
    with castore.open(backend.url, **backend.options) as src, \
            uncompressed(dest, backend.options, encrypted=True, master_key=key) as dst:
        report = convert(src, dst)
        assert report.differences == []
        assert report.sessions == 3 and report.refs > 8
        assert fsck(dst).ok
        s = dst.session("app", "alice", "s1")
        assert s.branches().keys() == {"main", "retry"} and "v1" in s.labels()
        assert s.remote_branches() and len(s.reflog()) == 1
        assert dst.session("app", "bob", "b1").current_branch is None
        assert dst.app_state("app") == {"shared": f"{STATE} app scope"}
        assert s.state()["user:pref"] == f"{STATE} user scope"
        assert f"{TEXT} summary" in s.context().messages[0].content
    assert every_byte(backend.url, backend.options) == before  # the source is only read
    assert markers_in(dest, backend.options) == []
    with castore.open(dest, master_key=key, **backend.options) as again:  # cold, with the key
        assert again.session("app", "alice", "s2").messages()[-1].content == f"{TEXT} in the fork"
        assert again.session("app", "alice", "s1").info["title"] == f"{TEXT} title"


class Stop(Exception):
    pass


def test_an_interrupted_run_goes_on_and_a_finished_copy_is_refused(tmp_path: Path, key: str) -> None:
    src_url, dest = str(tmp_path / "plain"), str(tmp_path / "enc")
    with castore.open(src_url) as src:
        fill(src)

        def stop_after_one(phase: str, n: int) -> None:
            if phase == "tenants":
                raise Stop

        with castore.open(dest, encrypted=True, master_key=key) as dst:
            with pytest.raises(Stop):
                convert(src, dst, progress=stop_after_one)
            partial = len(dst.sessions("app", None)) if dst.tenants() else 0
        with castore.open(dest, master_key=key) as dst:
            again = convert(src, dst)
            assert again.refs_present > 0 and again.refs > 0 and again.differences == []
            assert partial < 3 and len(dst.sessions("app")) == 3
            with pytest.raises(ConvertError, match="already holds"):
                convert(src, dst)
        with pytest.raises(ConvertError, match="is the store being converted"):
            convert(src, src)
        with castore.open(str(tmp_path / "other")) as other:
            other.session("x", "y", "z").append(Message(role="user", content="mine"))
            with pytest.raises(ConvertError, match="already holds"):
                convert(src, other)


def test_a_source_that_changed_after_the_copy_is_reported(tmp_path: Path, key: str) -> None:
    with castore.open(str(tmp_path / "plain")) as src:
        src.session("a", "u", "s").append(Message(role="user", content="one"))
        with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key) as dst:
            assert convert(src, dst).differences == []
            src.session("a", "u", "s").append(Message(role="user", content="two"))
            assert compare(src, dst) and any("differs" in d for d in compare(src, dst))


def test_imported_claude_code_and_codex_sessions_export_byte_for_byte(tmp_path: Path, key: str) -> None:
    from castore.adapters.claude_code import export_claude, import_claude
    from castore.adapters.codex import export_codex, import_codex

    codex = DATA / "codex" / "sample_codex_session.jsonl"
    with castore.open(str(tmp_path / "plain"), durable=False) as src:
        import_claude(src, DATA / "claude-code")
        import_codex(src, codex)
        export_claude(src, tmp_path / "claude-plain")
        with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key) as dst:
            assert convert(src, dst).differences == []
            export_claude(dst, tmp_path / "claude-enc")
            export_codex(dst, tmp_path / "codex-enc")
    plain = sorted(p.relative_to(tmp_path / "claude-plain") for p in (tmp_path / "claude-plain").rglob("*.jsonl"))
    assert plain
    for rel in plain:
        assert (tmp_path / "claude-enc" / rel).read_bytes() == (tmp_path / "claude-plain" / rel).read_bytes()
    assert (tmp_path / "codex-enc" / codex.name).read_bytes() == codex.read_bytes()


def test_a_langgraph_savers_store_converts_and_the_thread_reads_the_same(tmp_path: Path, key: str) -> None:
    pytest.importorskip("langgraph")
    from test_langgraph import THREAD, build, comparable, scenario

    from castore.adapters.langgraph import CastoreSaver

    with castore.open(str(tmp_path / "plain")) as src:
        g, _ = scenario(CastoreSaver(src))
        expected = comparable(g)
        with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key) as dst:
            assert convert(src, dst).differences == []
    with castore.open(str(tmp_path / "enc"), master_key=key) as dst:
        # the saver is given its tenant's store (it reads and writes the refs of the store
        # it is handed, which for a tenant-layout root are not its tenant's)
        g2 = build().compile(checkpointer=CastoreSaver(dst.tenant("langgraph", "default")))
        assert comparable(g2) == expected
        g2.invoke({"messages": []}, THREAD)  # the thread goes on in the copy
        assert len(comparable(g2)) > len(expected)


def test_cli_encrypt_writes_a_copy_and_refuses_a_store_that_is_not_empty(tmp_path: Path) -> None:
    runner = CliRunner()
    keyfile = tmp_path / "master.key"
    keyfile.write_text(MasterKey.new() + "\n")
    src = tmp_path / "plain"
    with castore.open(str(src)) as st:
        fill(st)
    dest = tmp_path / "enc"
    r = runner.invoke(main, ["--store", str(src), "--master-key-file", str(keyfile), "encrypt", str(dest)])
    assert r.exit_code == 0, r.output
    assert "3 sessions" in r.stdout and "differences" not in r.stderr
    r = runner.invoke(main, ["--store", str(dest), "--master-key-file", str(keyfile), "log", "-s", "app/alice/s2"])
    assert r.exit_code == 0 and "in the fork" in r.stdout
    again = runner.invoke(main, ["--store", str(src), "--master-key-file", str(keyfile), "encrypt", str(dest)])
    assert again.exit_code == 1 and "already holds" in again.stderr
    no_key = runner.invoke(main, ["--store", str(src), "encrypt", str(tmp_path / "enc2")],
                           env={"CASTORE_MASTER_KEY": ""})
    assert no_key.exit_code == 1 and "Error" in no_key.stderr
    shutil.rmtree(tmp_path / "enc2", ignore_errors=True)


def test_ids_kept_by_an_adapter_follow_their_objects_and_other_hex_stays(tmp_path: Path, key: str) -> None:
    from castore.objects import Blob

    with castore.open(str(tmp_path / "plain")) as src:
        home = src.tenant("app", "u")
        blob = home.objects.put(Blob(data=b"an archived line"))
        s = src.session("app", "u", "s")
        first = s.append(Message(role="user", content="one"))
        not_an_object = "f" * 64
        s.append(Message(role="user", content="two"),
                 meta={"raw": blob, "deep": [{"commit": first}], "other": not_an_object},
                 state_delta={"raw_id": bytes.fromhex(blob), "text": not_an_object})
        with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key) as dst:
            assert convert(src, dst).differences == []
            d = dst.session("app", "u", "s")
            le = d.show("HEAD")
            new_blob, new_first = le.meta["raw"], le.meta["deep"][0]["commit"]
            assert new_blob != blob and new_first != first and le.meta["other"] == not_an_object
            assert dst.tenant("app", "u").objects.get(new_blob) == Blob(data=b"an archived line")
            assert new_first == d.resolve("HEAD~1")
            state = d.state()
            assert state["raw_id"] == bytes.fromhex(new_blob) and state["text"] == not_an_object


def test_a_path_longer_than_the_recursion_limit_converts(tmp_path: Path, key: str) -> None:
    import sys

    n = sys.getrecursionlimit() * 3
    with castore.open(str(tmp_path / "plain"), durable=False) as src:
        s = src.session("app", "u", "long")
        for i in range(0, n, 500):
            s.append_many([Message(role="user", content=f"m{j}") for j in range(i, min(n, i + 500))])
        with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key, durable=False) as dst:
            report = convert(src, dst)
            assert report.differences == []
            assert len(dst.session("app", "u", "long").entries()) == n
