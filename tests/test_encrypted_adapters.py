"""Every adapter and every store-wide tool on an encrypted store (issue 36, part 6): the
LangGraph saver, the ADK session service, the OpenAI Agents session, Pi, Claude Code and Codex
import/export (byte for byte), grep, the HTML viewer, the CLI's reading commands, and
fsck/gc/repack, each as on a plain store; and no marker written through an adapter shows in
any byte of an uncompressed encrypted store, while the same scan finds it in a plain one.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import lzma
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import backend_on
from helpers.interrupt import same_tree

import castore
from castore.cli import main
from castore.crypto.keys import MasterKey
from castore.entries import Message
from castore.maintenance import fsck, gc, repack
from tests.conftest import Backend
from tests.test_encrypted_store import MARKERS, TEXT, every_byte, plaintext_in, uncompressed

DATA = Path(__file__).resolve().parent / "data"
CLAUDE = DATA / "claude-code"
CODEX = DATA / "codex" / "sample_codex_session.jsonl"
PI = DATA / "pi" / "before-compaction.jsonl.xz"

backend = backend_on("local", "s3")


@pytest.fixture
def key() -> str:
    return MasterKey.new()


@pytest.fixture
def enc(tmp_path: Path, key: str) -> castore.Store:
    """An encrypted store on local disk."""
    store = castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key, durable=False)
    yield store
    store.close()


# -- LangGraph -------------------------------------------------------------------------------
def test_langgraph_graph_runs_as_on_an_in_memory_saver(backend: Backend, key: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from test_langgraph import THREAD, comparable, scenario

    from castore.adapters.langgraph import CastoreSaver

    g_mem, _ = scenario(InMemorySaver())
    with backend.open(encrypted=True, master_key=key) as store:
        saver = CastoreSaver(store)
        g, _ = scenario(saver)
        assert comparable(g) == comparable(g_mem)
        got = saver.get_tuple(THREAD)
        assert got is not None and [c.config for c in saver.list(THREAD, limit=1)] == [got.config]
    with backend.open(master_key=key) as again:  # read cold by a new handle
        g2 = build_graph(CastoreSaver(again))
        assert comparable(g2) == comparable(g_mem)


def build_graph(saver: Any) -> Any:
    from test_langgraph import build

    return build().compile(checkpointer=saver)


# -- ADK ---------------------------------------------------------------------------------------
def test_adk_session_service_keeps_events_and_state(backend: Backend, key: str) -> None:
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    from castore.adapters.adk import CastoreSessionService

    async def go(store: castore.Store) -> None:
        svc = CastoreSessionService(store)
        s = await svc.create_session(app_name="app", user_id="alice", session_id="s1", state={"k": 1})
        ev = Event(invocation_id="i1", author="user", content=types.Content(role="user", parts=[types.Part(text=TEXT)]),
                   actions=EventActions(state_delta={"app:shared": "a", "user:pref": "u", "n": 2}))
        await svc.append_event(s, ev)
        got = await svc.get_session(app_name="app", user_id="alice", session_id="s1")
        assert got is not None and got.events[-1].content.parts[0].text == TEXT
        assert got.state["k"] == 1 and got.state["n"] == 2 and got.state["app:shared"] == "a"
        listed = await svc.list_sessions(app_name="app", user_id="alice")
        assert [x.id for x in listed.sessions] == ["s1"]

    with backend.open(encrypted=True, master_key=key) as store:
        asyncio.run(go(store))
    with backend.open(master_key=key) as again:
        assert again.app_state("app") == {"shared": "a"}


# -- OpenAI Agents -----------------------------------------------------------------------------
def test_openai_agents_session_matches_sqlite(enc: castore.Store) -> None:
    from test_openai_agents import ITEMS, compare

    ops: list[tuple[Any, ...]] = [("add", ITEMS[:3]), ("get", None), ("pop", None), ("get", 1),
                                  ("clear", None), ("add", ITEMS[3:]), ("get", None)]
    asyncio.run(compare(enc, ops))


# -- Pi, Claude Code, Codex ----------------------------------------------------------------------
def test_pi_import_export_round_trips(enc: castore.Store, tmp_path: Path) -> None:
    from castore.adapters import pi

    path = tmp_path / "pi.jsonl"
    path.write_bytes(lzma.decompress(PI.read_bytes()))
    r = pi.import_session(enc, path)
    buf = io.StringIO()
    pi.export_session(enc.session(*r.key), out=buf)
    again = tmp_path / "again.jsonl"
    again.write_text(buf.getvalue())
    r2 = pi.import_session(enc, again, session_id="again")
    assert r2.head == r.head
    out = io.StringIO()
    pi.export_session(enc.session(*r2.key), out=out)
    assert out.getvalue() == buf.getvalue()


def test_claude_code_round_trips_byte_for_byte(backend: Backend, key: str, tmp_path: Path) -> None:
    import shutil

    from castore.adapters.claude_code import export_claude, import_claude

    src = tmp_path / "src"
    shutil.copytree(CLAUDE, src)
    # a side file of a session (kept as a blob of the session's tenant, written back on export)
    (src / "session-share" / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68" / "tool-results").mkdir()
    (src / "session-share" / "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68" / "tool-results" / "r1.txt").write_bytes(
        b"side file bytes\n")
    with backend.open(encrypted=True, master_key=key) as store:
        import_claude(store, src)
    with backend.open(master_key=key) as again:
        export_claude(again, tmp_path / "out")
        same_tree(src, tmp_path / "out")
        assert import_claude(again, src)  # a re-import reads nothing new and changes nothing
        export_claude(again, tmp_path / "out2")
        same_tree(src, tmp_path / "out2")


def test_codex_round_trips_byte_for_byte(enc: castore.Store, tmp_path: Path) -> None:
    from castore.adapters.codex import export_codex, import_codex

    r = import_codex(enc, CODEX)[0]
    export_codex(enc, tmp_path / "out")
    assert (tmp_path / "out" / CODEX.name).read_bytes() == CODEX.read_bytes()
    assert enc.session(*r.session).info["codex"]["path"] == CODEX.name


# -- grep, the viewer, the CLI -----------------------------------------------------------------------
def fill(store: castore.Store) -> castore.Session:
    s = store.session("app", "alice", "s1")
    for i in range(6):
        s.append(Message(role="user", content=f"{TEXT} question {i}"), state_delta={"n": i})
        s.append(Message(role="assistant", content=f"answer {i}"))
    s.branch("retry", at="HEAD~3")
    store.session("app", "bob", "b1").append(Message(role="user", content=f"{TEXT} bob"))
    return s


def test_grep_library_and_cli(tmp_path: Path, key: str) -> None:
    from castore.grep import grep

    url = str(tmp_path / "enc")
    with castore.open(url, encrypted=True, master_key=key) as store:
        fill(store)
        found = list(grep(store, "question 3"))
        assert [m.session for m in found] == [("app", "alice", "s1")]
        assert {m.session for m in grep(store, TEXT)} == {("app", "alice", "s1"), ("app", "bob", "b1")}
    r = CliRunner().invoke(main, ["--store", url, "grep", "question 4"], env={"CASTORE_MASTER_KEY": key})
    assert r.exit_code == 0, r.output
    assert "question 4" in r.output and "alice" in r.output


def test_cli_reading_commands(tmp_path: Path, key: str) -> None:
    url = str(tmp_path / "enc")
    with castore.open(url, encrypted=True, master_key=key) as store:
        fill(store)
    runner = CliRunner(env={"CASTORE_MASTER_KEY": key})

    def run(*args: str) -> str:
        r = runner.invoke(main, ["--store", url, *args])
        assert r.exit_code == 0, (args, r.output)
        assert "Traceback" not in r.output
        return r.output

    assert "question 5" in run("-s", "app/alice/s1", "log")
    assert "question 5" in run("-s", "app/alice/s1", "show", "HEAD~1")
    assert "question 5" in run("-s", "app/alice/s1", "context")
    out = run("sessions")
    assert "s1" in out and "b1" in out
    run("-s", "app/alice/s1", "status")
    assert "retry" in run("-s", "app/alice/s1", "branch")
    run("fsck")  # exits 0: nothing corrupt or missing


def test_html_view_and_server(enc: castore.Store) -> None:
    from castore.html import render_session
    from castore.html.server import make_server

    s = fill(enc)
    page = render_session(s)
    assert "question 5" in page
    srv = make_server(enc, "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        host, port = srv.server_address[:2]
        for path, want in (("/", "s1"), ("/s/app/alice/s1", "question 5")):
            conn = http.client.HTTPConnection(host, port, timeout=30)
            conn.request("GET", path)
            r = conn.getresponse()
            body = r.read().decode("utf-8", "replace")
            conn.close()
            assert r.status == 200 and want in body, (path, r.status, body[:500])
    finally:
        srv.shutdown()
        srv.server_close()


# -- fsck, gc, repack ------------------------------------------------------------------------
def test_fsck_gc_repack_keep_everything_readable(backend: Backend, key: str) -> None:
    with backend.open(encrypted=True, master_key=key) as store:
        s = fill(store)
        assert fsck(store).ok
        repack(store, all_packs=True)
        gc(store, grace=0)
        report = fsck(store)
        assert report.ok and not report.corrupt and not report.missing
    with backend.open(master_key=key) as again:
        s = again.session("app", "alice", "s1")
        assert s.messages()[0].content == f"{TEXT} question 0"
        assert s.state()["n"] == 5 and "retry" in s.branches()
        assert again.session("app", "bob", "b1").messages()[0].content == f"{TEXT} bob"


# -- no plaintext ------------------------------------------------------------------------------
def write_through_adapters(store: castore.Store) -> None:
    """A marker through each adapter that writes content of its own."""
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.genai import types
    from langchain_core.messages import HumanMessage

    from castore.adapters.adk import CastoreSessionService
    from castore.adapters.langgraph import CastoreSaver
    from castore.adapters.openai_agents import CastoreSession

    text, state, tool = (m.decode() for m in MARKERS)
    g = build_graph(CastoreSaver(store))
    g.invoke({"messages": [HumanMessage(f"{text} to langgraph", id="h1")]}, {"configurable": {"thread_id": "t1"}})

    async def go() -> None:
        svc = CastoreSessionService(store)
        s = await svc.create_session(app_name="adk", user_id="alice", session_id="s1")
        await svc.append_event(s, Event(invocation_id="i", author="user",
                                        content=types.Content(role="user", parts=[types.Part(text=f"{text} adk")]),
                                        actions=EventActions(state_delta={"user:x": f"{state} adk"})))
        oa = CastoreSession("conv", store)
        await oa.add_items([{"role": "user", "content": f"{text} openai"},
                            {"type": "function_call_output", "call_id": "c1", "output": f"{tool} openai"}])

    asyncio.run(go())


def test_adapters_leave_no_plaintext_in_an_encrypted_store(backend: Backend, key: str) -> None:
    with uncompressed(backend, encrypted=True, master_key=key) as store:
        write_through_adapters(store)
    assert plaintext_in(every_byte(backend)) == []


def test_the_same_adapters_leave_the_markers_in_a_plain_store(backend: Backend) -> None:
    with uncompressed(backend, layout="tenants") as store:
        write_through_adapters(store)
    found = {m for _, m in plaintext_in(every_byte(backend))}
    assert found >= set(MARKERS[:2])  # the message and the state (a tool output may go compressed)


def test_imports_leave_no_plaintext_in_an_encrypted_store(tmp_path: Path, key: str) -> None:
    from castore.adapters.claude_code import import_claude
    from castore.adapters.codex import import_codex

    # words of the recorded sessions' text (never part of a name or path castore keeps readable)
    words = [b"Security review is crucial", b"Thai green curry", b"homelab-migration"]
    sources = b"".join(p.read_bytes() for p in [*CLAUDE.rglob("*.jsonl"), CODEX])
    assert all(w in sources for w in words)
    blobs: dict[str, list[bytes]] = {}
    for name, kw in (("plain", {"layout": "tenants"}), ("enc", {"encrypted": True, "master_key": key})):
        b = Backend("local", str(tmp_path / name))
        with uncompressed(b, **kw) as store:
            import_claude(store, CLAUDE)
            import_codex(store, CODEX)
        blobs[name] = [w for w in words if any(w in v for v in every_byte(b).values())]
    assert blobs["plain"] and blobs["enc"] == []  # (big raw lines are compressed even here)
