"""Pi session import/export (castore.adapters.pi) and `castore import pi` / `castore export pi`."""

from __future__ import annotations

import base64
import io
import json
import lzma
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore.adapters import pi
from castore.context import BRANCH_PREFIX, BRANCH_SUFFIX, COMPACTION_PREFIX, COMPACTION_SUFFIX
from castore.objects import Blob
from castore.views import prompt_title, session_title

DATA = Path(__file__).resolve().parent / "data" / "pi"
REAL = ["large-session.jsonl", "before-compaction.jsonl"]


@pytest.fixture(scope="session")
def real_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The real Pi files (kept xz-compressed in tests/data/pi), unpacked as recorded."""
    out = tmp_path_factory.mktemp("pi-data")
    for name in REAL:
        (out / name).write_bytes(lzma.decompress((DATA / f"{name}.xz").read_bytes()))
    return {name: out / name for name in REAL}


@pytest.fixture
def path(request: pytest.FixtureRequest, real_files: dict[str, Path]) -> Path:
    """One real Pi file, by the name the test is parametrized with."""
    return real_files[request.param]


@pytest.fixture
def mem_store() -> Any:
    st = castore.open(f"memory://pi-{uuid.uuid4().hex}")
    yield st
    st.close()


def stored_bytes(store: castore.Store) -> int:
    return sum(len(store.storage.read(k)) for k in store.storage.list("objects"))


def lines_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def export_text(session: castore.Session, rev: str = "HEAD", whole: bool = True) -> str:
    buf = io.StringIO()
    pi.export_session(session, rev, out=buf, whole=whole)
    return buf.getvalue()


def write_jsonl(path: Path, entries: list[Any], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in entries) + tail)
    return path


def all_ids(session: castore.Session) -> list[str]:
    return sorted(e.id for e in session.log(all_branches=True))


# -- a reference of Pi's buildSessionContext + convertToLlm for summaries -----------------------
def pi_context(entries: list[dict[str, Any]]) -> list[Any]:
    """What Pi sends for the leaf (last entry), summaries as converted text, per the format doc."""
    by_id = {e["id"]: e for e in entries}
    path, cur = [], entries[-1]
    while cur is not None:
        path.insert(0, cur)
        cur = by_id.get(cur.get("parentId")) if cur.get("parentId") else None
    comp = None
    for e in path:
        if e["type"] == "compaction":
            comp = e

    def msg(e: dict[str, Any]) -> Any:
        if e["type"] == "message":
            return {k: v for k, v in e["message"].items() if k not in ("timestamp", "usage")}
        if e["type"] == "custom_message":
            return {"role": "custom", **{k: e[k] for k in ("customType", "content", "display", "details") if k in e}}
        if e["type"] == "branch_summary" and e["summary"]:
            return BRANCH_PREFIX + e["summary"] + BRANCH_SUFFIX
        return None

    out: list[Any] = []
    if comp is None:
        out = [msg(e) for e in path]
    else:
        out.append(COMPACTION_PREFIX + comp["summary"] + COMPACTION_SUFFIX)
        ci = path.index(comp)
        keep = False
        for e in path[:ci]:
            keep = keep or e["id"] == comp.get("firstKeptEntryId")
            if keep:
                out.append(msg(e))
        out += [msg(e) for e in path[ci + 1 :]]
    return [m for m in out if m is not None]


def castore_context(store: castore.Store, session: castore.Session) -> list[Any]:
    out = []
    for m in pi.inline_images(store, list(session.context())):
        summary = m.role == "user" and isinstance(m.content, str) and m.content.startswith(
            (COMPACTION_PREFIX, BRANCH_PREFIX))
        out.append(m.content if summary else m.to_dict())
    return out


# -- the real files -------------------------------------------------------------------------
@pytest.mark.parametrize("path", REAL, indirect=True)
def test_real_file_imports_exports_and_reimports_to_the_same_commits(mem_store, tmp_path, path):
    r = pi.import_session(mem_store, path)
    original = lines_of(path.read_text())
    assert r.upgraded_from == 1 and r.entries == len(original) - 1 and r.key == ("pi", "local", original[0]["id"])
    s = mem_store.session(*r.key)
    text = export_text(s)
    exported = lines_of(text)
    assert exported[0] == {**original[0], "version": 3}
    # Pi's v1 -> v3 upgrade: ids, parent = previous entry, firstKeptEntryIndex -> firstKeptEntryId
    for i, (a, b) in enumerate(zip(original[1:], exported[1:], strict=True), 1):
        want = {k: v for k, v in a.items() if k != "firstKeptEntryIndex"}
        want["id"] = b["id"]
        want["parentId"] = exported[i - 1]["id"] if i > 1 else None
        if "firstKeptEntryIndex" in a:
            want["firstKeptEntryId"] = exported[a["firstKeptEntryIndex"]]["id"]
        assert b == want
    out = write_jsonl(tmp_path / "exported.jsonl", exported)
    r2 = pi.import_session(mem_store, out, session_id="again")
    s2 = mem_store.session(*r2.key)
    assert r2.upgraded_from is None and r2.head == r.head and all_ids(s2) == all_ids(s)
    assert lines_of(export_text(s2)) == exported
    # the same v1 file imported twice gets the same (derived) ids, hence the same commits
    r3 = pi.import_session(mem_store, path, session_id="third")
    assert r3.head == r.head
    assert castore_context(mem_store, s) == pi_context(exported[1:])
    # neither file has a session_info name: the title is the first user message, as Pi lists it
    assert session_title(s.info) == session_title(s2.info) == first_prompt(path) is not None


def test_real_compacted_file_context_starts_with_the_latest_summary(mem_store, real_files):
    compacted = real_files["before-compaction.jsonl"]
    r = pi.import_session(mem_store, compacted)
    s = mem_store.session(*r.key)
    ctx = s.context()
    comps = [e for e in lines_of(compacted.read_text()) if e.get("type") == "compaction"]
    assert ctx[0].content == COMPACTION_PREFIX + comps[-1]["summary"] + COMPACTION_SUFFIX
    assert ctx.model == "claude-opus-4-5" and ctx.thinking_level == "off"
    assert len(ctx) < len(s.messages()) and len(s.messages()) == 990  # nothing deleted


# -- every entry type, a branched session ------------------------------------------------------
PNG = base64.b64encode(random.Random(7).randbytes(30_000)).decode()
SMALL_PNG = base64.b64encode(b"tiny").decode()


def every_type_entries() -> list[dict[str, Any]]:
    t = "2026-03-10T09:14:%02d.000Z"
    usage = {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 3,
             "cost": {"input": 0.1, "output": 0.2, "cacheRead": 0, "cacheWrite": 0, "total": 0.3}}
    return [
        {"type": "session", "version": 3, "id": "sess-1", "timestamp": t % 0, "cwd": "/w",
         "parentSession": "/p/old.jsonl"},
        {"type": "model_change", "id": "e01", "parentId": None, "timestamp": t % 1, "provider": "anthropic",
         "modelId": "claude-sonnet-4-5"},
        {"type": "thinking_level_change", "id": "e02", "parentId": "e01", "timestamp": t % 2, "thinkingLevel": "high"},
        {"type": "message", "id": "e03", "parentId": "e02", "timestamp": t % 3, "extraField": [1, 2],
         "message": {"role": "user", "content": [{"type": "text", "text": "look"},
                                                 {"type": "image", "data": PNG, "mimeType": "image/png"},
                                                 {"type": "image", "data": SMALL_PNG, "mimeType": "image/png"}],
                     "timestamp": 1773134071402}},
        {"type": "message", "id": "e04", "parentId": "e03", "timestamp": t % 4,
         "message": {"role": "assistant", "content": [
             {"type": "thinking", "thinking": "hmm", "thinkingSignature": "sig"},
             {"type": "toolCall", "id": "call_1|fc_1", "name": "read", "arguments": {"path": "a.py"}}],
             "api": "anthropic-messages", "provider": "anthropic", "model": "claude-sonnet-4-5", "usage": usage,
             "stopReason": "toolUse", "timestamp": 1773134071500}},
        {"type": "message", "id": "e05", "parentId": "e04", "timestamp": t % 5,
         "message": {"role": "toolResult", "toolCallId": "call_1|fc_1", "toolName": "read",
                     "content": [{"type": "text", "text": "print(1)"},
                                 {"type": "image", "data": PNG, "mimeType": "image/png"}],
                     "details": {"truncation": None}, "isError": False, "timestamp": 1773134071600}},
        {"type": "message", "id": "e06", "parentId": "e05", "timestamp": t % 6,
         "message": {"role": "bashExecution", "command": "ls", "output": "a.py", "exitCode": 0, "cancelled": False,
                     "truncated": False, "excludeFromContext": True, "timestamp": 1773134071700}},
        {"type": "custom_message", "customType": "ext", "content": "injected", "display": False,
         "details": {"k": 1}, "id": "e07", "parentId": "e06", "timestamp": t % 7},
        {"type": "message", "id": "e08", "parentId": "e07", "timestamp": t % 8,
         "message": {"role": "custom", "customType": "ext", "content": [{"type": "text", "text": "c"}],
                     "display": True, "timestamp": 1773134071800}},
        {"type": "compaction", "id": "e09", "parentId": "e08", "timestamp": t % 9, "summary": "## Goal\nstuff",
         "firstKeptEntryId": "e05", "tokensBefore": 1234, "details": {"readFiles": ["a.py"], "modifiedFiles": []},
         "fromHook": False},
        {"type": "custom", "customType": "state", "data": {"n": 1}, "id": "e10", "parentId": "e09",
         "timestamp": t % 10},
        {"type": "custom", "customType": "nodata", "id": "e11", "parentId": "e10", "timestamp": t % 11},
        {"type": "label", "id": "e12", "parentId": "e11", "timestamp": t % 12, "targetId": "e04", "label": "first"},
        {"type": "label", "id": "e13", "parentId": "e12", "timestamp": t % 13, "targetId": "e03", "label": "gone"},
        {"type": "label", "id": "e14", "parentId": "e13", "timestamp": t % 14, "targetId": "e03"},
        {"type": "session_info", "id": "e15", "parentId": "e14", "timestamp": t % 15, "name": "My session"},
        {"type": "message", "id": "e16", "parentId": "e15", "timestamp": t % 16,
         "message": {"role": "user", "content": "abandoned path", "timestamp": 1773134072000}},
        # /tree back to e15, with a summary of the abandoned branch
        {"type": "branch_summary", "id": "e17", "parentId": "e15", "timestamp": t % 17, "fromId": "e15",
         "summary": "tried something", "details": {"readFiles": [], "modifiedFiles": []}, "fromHook": False},
        {"type": "context_edit", "id": "e18", "parentId": "e17", "timestamp": t % 18, "targetId": "e08",
         "replacement": None},
        {"type": "compaction", "id": "e19", "parentId": "e16", "timestamp": t % 19, "summary": "on the side",
         "firstKeptEntryId": "zzz", "tokensBefore": 7, "details": None},
        {"type": "message", "id": "e20", "parentId": "e18", "timestamp": t % 20,
         "message": {"role": "user", "content": "hi again", "timestamp": 1773134073000, "newField": {"x": True}}},
    ]


def test_every_entry_type_round_trips_and_gives_pis_context(mem_store, tmp_path):
    entries = every_type_entries()
    path = write_jsonl(tmp_path / "all.jsonl", entries)
    r = pi.import_session(mem_store, path)
    s = mem_store.session(*r.key)
    assert lines_of(export_text(s)) == entries
    assert r.head == s.head and s.show("HEAD").meta["pi"]["id"] == "e20"
    assert r.branches.keys() == {"main", "pi-e19"}
    assert set(r.labels) == {"first"}
    assert s.show("first").meta["pi"]["id"] == "e04" and "gone" not in s.labels()
    assert s.info["name"] == "My session" and s.info["pi"]["header"] == entries[0]
    assert castore_context(mem_store, s) == pi_context(entries[1:])
    kinds = {e.meta["pi"]["type"]: e.kind for e in s.log(all_branches=True)}
    assert kinds == {"model_change": "model_change", "thinking_level_change": "model_change",
                     "message": "message", "custom_message": "message", "compaction": "compaction",
                     "custom": "custom", "label": "label", "session_info": "session_info",
                     "branch_summary": "branch_summary", "context_edit": "custom"}
    ctx = s.context()
    assert (ctx.model, ctx.provider, ctx.thinking_level) == ("claude-sonnet-4-5", "anthropic", "high")
    # the side branch keeps its own (Pi-exact) context: a compaction whose first kept entry is unknown
    side = s.context("pi-e19")
    assert [m.content for m in side] == [COMPACTION_PREFIX + "on the side" + COMPACTION_SUFFIX]
    # a compaction maps to a castore Compaction whose first kept entry is a commit
    comp = next(e.entry for e in s.entries() if e.meta["pi"]["id"] == "e09")
    assert isinstance(comp, castore.Compaction) and s.show(comp.first_kept).meta["pi"]["id"] == "e05"


def test_path_only_export_is_the_path_to_rev(mem_store, tmp_path):
    entries = every_type_entries()
    s = mem_store.session(*pi.import_session(mem_store, write_jsonl(tmp_path / "a.jsonl", entries)).key)
    got = lines_of(export_text(s, "pi-e19", whole=False))
    assert [e.get("id") for e in got[1:]] == [f"e{i:02d}" for i in range(1, 17)] + ["e19"]


def test_entries_appended_in_castore_are_exported_after_the_imported_ones(mem_store, tmp_path):
    entries = every_type_entries()
    s = mem_store.session(*pi.import_session(mem_store, write_jsonl(tmp_path / "a.jsonl", entries)).key)
    s.append(castore.Message(role="user", content="from castore"))
    s.append(castore.ModelChange(model="m2", provider="p2"))
    got = lines_of(export_text(s))
    assert got[: len(entries)] == entries
    assert got[-2]["message"]["role"] == "user" and got[-2]["parentId"] == "e20"
    assert got[-1]["type"] == "model_change" and got[-1]["parentId"] == got[-2]["id"]
    again = mem_store.session(*pi.import_session(mem_store, write_jsonl(tmp_path / "b.jsonl", got),
                                                 session_id="b").key)
    assert [m.content for m in again.messages()][-1] == "from castore"


# -- images --------------------------------------------------------------------------------
def test_same_screenshot_twice_is_stored_once(mem_store, tmp_path):
    entries = every_type_entries()
    r = pi.import_session(mem_store, write_jsonl(tmp_path / "a.jsonl", entries))
    file_bytes = set(mem_store.session(*r.key).info["pi"]["segments"])  # the file as read, for export
    blobs = [oid for oid in mem_store.objects.iter_ids() if isinstance(mem_store.objects.get(oid), Blob)
             and oid not in file_bytes]
    assert len(blobs) == 1 and r.blobs == 2  # the small image stays inline
    assert mem_store.objects.get(blobs[0]).data == base64.b64decode(PNG)
    # a second session with the same screenshot adds no image bytes
    before = stored_bytes(mem_store)
    pi.import_session(mem_store, write_jsonl(tmp_path / "a.jsonl", entries), session_id="copy")
    after = stored_bytes(mem_store)
    assert after - before < 8000 < len(PNG)


# -- older versions --------------------------------------------------------------------------
def test_v1_file_is_upgraded_as_pi_does(mem_store, tmp_path):
    v1 = [{"type": "session", "id": "old", "timestamp": "2025-01-01T00:00:00.000Z", "cwd": "/w",
           "provider": "anthropic", "modelId": "m", "thinkingLevel": "off"},
          {"type": "message", "timestamp": "2025-01-01T00:00:01.000Z",
           "message": {"role": "user", "content": [{"type": "text", "text": "a"}], "timestamp": 1}},
          {"type": "message", "timestamp": "2025-01-01T00:00:02.000Z",
           "message": {"role": "assistant", "content": [], "provider": "x", "model": "y", "timestamp": 2}},
          {"type": "message", "timestamp": "2025-01-01T00:00:03.000Z",
           "message": {"role": "user", "content": "b", "timestamp": 3}},
          {"type": "compaction", "timestamp": "2025-01-01T00:00:04.000Z", "summary": "S",
           "firstKeptEntryIndex": 3, "tokensBefore": 10},
          {"type": "compaction", "timestamp": "2025-01-01T00:00:05.000Z", "summary": "T",
           "firstKeptEntryIndex": 0, "tokensBefore": 11}]
    r = pi.import_session(mem_store, write_jsonl(tmp_path / "v1.jsonl", v1))
    s = mem_store.session(*r.key)
    got = lines_of(export_text(s))
    assert r.upgraded_from == 1 and got[0]["version"] == 3
    ids = [e["id"] for e in got[1:]]
    assert len(set(ids)) == 5 and all(len(i) == 8 for i in ids)
    assert [e["parentId"] for e in got[1:]] == [None] + ids[:-1]
    assert got[4]["firstKeptEntryId"] == ids[2] and "firstKeptEntryIndex" not in got[4]
    assert "firstKeptEntryId" not in got[5]  # index 0 is the header: Pi drops it
    assert [m.content for m in s.context()] == [COMPACTION_PREFIX + "T" + COMPACTION_SUFFIX]
    assert [m.content for m in s.context("HEAD~1")][1:] == ["b"]


def test_v2_hook_message_becomes_custom(mem_store, tmp_path):
    v2 = [{"type": "session", "version": 2, "id": "v2", "timestamp": "2026-01-02T00:00:00.000Z", "cwd": "/w"},
          {"type": "message", "id": "aa", "parentId": None, "timestamp": "2026-01-02T00:00:01.000Z",
           "message": {"role": "hookMessage", "customType": "h", "content": "x", "display": True, "timestamp": 1}}]
    s = mem_store.session(*pi.import_session(mem_store, write_jsonl(tmp_path / "v2.jsonl", v2)).key)
    got = lines_of(export_text(s))
    assert got[0]["version"] == 3 and got[1]["message"]["role"] == "custom" and got[1]["id"] == "aa"
    assert s.messages()[0].role == "custom"


# -- bad input -------------------------------------------------------------------------------
def test_torn_last_line_names_the_line_and_leaves_no_ref(mem_store, tmp_path):
    entries = every_type_entries()
    path = write_jsonl(tmp_path / "torn.jsonl", entries, tail='{"type":"message","id":"e21","par')
    with pytest.raises(pi.PiImportError) as ei:
        pi.import_session(mem_store, path)
    assert ei.value.line == len(entries) + 1 and "torn" in str(ei.value) and isinstance(ei.value, ValueError)
    assert not mem_store.session("pi", "local", "sess-1").exists()
    assert mem_store.refs.list("sessions") == []


def test_skip_bad_lines_reports_what_it_skipped(mem_store, tmp_path):
    entries = every_type_entries()
    text = "".join(json.dumps(e) + "\n" for e in entries[:3]) + "not json\n\n[1,2]\n" + \
        "".join(json.dumps(e) + "\n" for e in entries[3:]) + '{"torn'
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(pi.PiImportError) as ei:
        pi.import_session(mem_store, path)
    assert ei.value.line == 4
    r = pi.import_session(mem_store, path, skip_bad_lines=True)
    assert [n for n, _ in r.skipped] == [4, 6, len(entries) + 4]
    assert lines_of(export_text(mem_store.session(*r.key))) == entries


def test_lines_nested_too_deep_are_bad_lines_not_a_crash(mem_store, tmp_path):
    entries = every_type_entries()
    text = "".join(json.dumps(e) + "\n" for e in entries[:3]) + "[" * 5000 + "]" * 5000 + "\n" + \
        '{"a":' * 100_000 + "1" + "}" * 100_000 + "\n" + "".join(json.dumps(e) + "\n" for e in entries[3:])
    path = tmp_path / "deep.jsonl"
    path.write_text(text)
    with pytest.raises(pi.PiImportError) as ei:
        pi.import_session(mem_store, path)
    assert ei.value.line == 4 and not mem_store.session("pi", "local", "sess-1").exists()
    r = pi.import_session(mem_store, path, skip_bad_lines=True)
    assert [n for n, _ in r.skipped] == [4, 5]
    assert lines_of(export_text(mem_store.session(*r.key))) == entries


def test_bad_header_and_existing_session_are_refused(mem_store, tmp_path):
    with pytest.raises(pi.PiImportError) as ei:
        pi.import_session(mem_store, write_jsonl(tmp_path / "h.jsonl", [{"type": "message", "id": "x"}]))
    assert ei.value.line == 1
    with pytest.raises(pi.PiImportError):
        pi.import_session(mem_store, write_jsonl(tmp_path / "e.jsonl", []))
    path = write_jsonl(tmp_path / "ok.jsonl", every_type_entries())
    pi.import_session(mem_store, path)
    with pytest.raises(castore.SessionExists):
        pi.import_session(mem_store, path)


def test_import_into_s3_store(store, tmp_path):
    entries = every_type_entries()
    r = pi.import_session(store, write_jsonl(tmp_path / "a.jsonl", entries), app="a", user="u", session_id="s")
    assert lines_of(export_text(store.session("a", "u", "s"))) == entries and r.key == ("a", "u", "s")


# -- CLI -----------------------------------------------------------------------------------------
def test_cli_import_and_export(tmp_path):
    from castore.cli import main

    url = str(tmp_path / "cli-store")
    entries = every_type_entries()
    path = write_jsonl(tmp_path / "a.jsonl", entries)
    runner = CliRunner()
    res = runner.invoke(main, ["--store", url, "import", "pi", str(path), "-s", "app/bob"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("app/bob/sess-1: 20 entries, HEAD ")
    out = tmp_path / "out.jsonl"
    res = runner.invoke(main, ["--store", url, "export", "pi", "-s", "app/bob/sess-1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert lines_of(out.read_text()) == entries
    res = runner.invoke(main, ["--store", url, "-s", "app/bob/sess-1", "export", "pi", "pi-e19", "--path-only"])
    assert res.exit_code == 0 and lines_of(res.stdout)[-1]["id"] == "e19"
    torn = write_jsonl(tmp_path / "t.jsonl", entries, tail="{")
    res = runner.invoke(main, ["--store", url, "import", "pi", str(torn), "-s", "app/bob/t"])
    assert res.exit_code == 1 and f"t.jsonl:{len(entries) + 1}" in res.stderr
    res = runner.invoke(main, ["--store", url, "import", "pi", str(torn), "-s", "app/bob/t", "--skip-bad-lines",
                               "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["skipped"][0][0] == len(entries) + 1
    res = runner.invoke(main, ["--store", url, "import", "pi", str(path), str(torn), "-s", "app/bob/x"])
    assert res.exit_code == 2


# -- the archive: a sessions folder, incremental, following, castore's entries back ------------
def _dump(entries: list[Any]) -> bytes:
    return "".join(json.dumps(e, separators=(",", ":"), ensure_ascii=False) + "\n" for e in entries).encode()


def _refs(s: castore.Session) -> tuple[dict[str, str], dict[str, str], str | None]:
    return s.branches(), s.labels(), s.head


def test_a_sessions_folder_imports_at_once_then_only_what_is_new(tmp_path, real_files):
    # ~/.pi/agent/sessions: a folder per working directory, a file per session
    root = tmp_path / "sessions"
    entries = every_type_entries()
    (root / "--w--").mkdir(parents=True)
    (root / "--w--" / "2026-03-10T09-14-02-000Z_sess-1.jsonl").write_bytes(_dump(entries[:9]))
    (root / "--other--").mkdir()
    shutil.copyfile(real_files["before-compaction.jsonl"], root / "--other--" / "a.jsonl")
    store = castore.open(str(tmp_path / "store"), durable=False)
    rs = pi.import_pi(store, root)
    assert [(r.entries, r.total) for r in rs][1] == (8, 8) and rs[0].entries == rs[0].total > 0
    assert [r.entries for r in pi.import_pi(store, root)] == [0, 0]  # nothing new: nothing read past the position
    (root / "--w--" / "2026-03-10T09-14-02-000Z_sess-1.jsonl").write_bytes(_dump(entries))
    r = pi.import_pi(store, root)[1]
    assert (r.entries, r.total) == (12, 20)
    # the same commits, branches and labels as an import of the whole file at once
    once = castore.open(str(tmp_path / "once"), durable=False)
    pi.import_session(once, write_jsonl(tmp_path / "all.jsonl", entries))
    a, b = store.session("pi", "local", "sess-1"), once.session("pi", "local", "sess-1")
    assert all_ids(a) == all_ids(b) and _refs(a) == _refs(b) and a.info["name"] == "My session"
    assert castore_context(store, a) == pi_context(entries[1:])


def test_a_side_branch_that_grows_keeps_one_branch(mem_store, tmp_path):
    entries = every_type_entries()
    f = tmp_path / "s.jsonl"
    f.write_bytes(_dump(entries[:-1]))  # up to e19: main is e19 (the last line), pi-e18 the other leaf
    pi.import_pi(mem_store, f)
    s = mem_store.session("pi", "local", "sess-1")
    assert set(s.branches()) == {"main", "pi-e18"}
    more = [entries[-1], {"type": "message", "id": "e21", "parentId": "e19", "timestamp": "2026-03-10T09:15:00.000Z",
                          "message": {"role": "user", "content": "back on the side", "timestamp": 1}}]
    f.write_bytes(_dump(entries[:-1] + more))
    pi.import_pi(mem_store, f)
    once = castore.open(f"memory://pi-{uuid.uuid4().hex}")
    pi.import_session(once, f)
    assert _refs(s) == _refs(once.session("pi", "local", "sess-1"))
    assert set(s.branches()) == {"main", "pi-e20"}  # pi-e18 went: its leaf has a child now


def test_entries_castore_appended_come_back_as_those_commits_byte_for_byte(mem_store, tmp_path):
    entries = every_type_entries()
    f = tmp_path / "s.jsonl"
    f.write_bytes(_dump(entries))
    pi.import_pi(mem_store, f)
    s = mem_store.session("pi", "local", "sess-1")
    ids = s.append_many([castore.Message("user", "from castore"), castore.Message("assistant", "an answer")])
    exported = export_text(s).encode()
    assert exported.startswith(_dump(entries))
    written = lines_of(exported.decode())[len(entries):]
    assert [e[pi.MARK] for e in written] == ids and written[0]["parentId"] == "e20"
    # Pi goes on from castore's last entry, in the exported file
    after = {"type": "message", "id": "p1", "parentId": written[-1]["id"], "timestamp": "2026-03-10T10:00:00.000Z",
             "message": {"role": "user", "content": "and Pi again", "timestamp": 2}}
    f.write_bytes(exported + _dump([after]))
    n = len(s.log(all_branches=True))
    r = pi.import_pi(mem_store, f)[0]
    assert r.entries == 3 and len(s.log(all_branches=True)) == n + 1  # the two lines are castore's commits
    assert s.show("HEAD").parents == (ids[-1],) and s.show("HEAD").meta["pi"]["id"] == "p1"
    assert export_text(s).encode() == f.read_bytes()  # byte for byte
    assert [r.entries for r in pi.import_pi(mem_store, f)] == [0]


def test_castore_entries_the_agent_did_not_follow_keep_a_branch(mem_store, tmp_path):
    entries = every_type_entries()
    f = tmp_path / "s.jsonl"
    f.write_bytes(_dump(entries))
    pi.import_pi(mem_store, f)
    s = mem_store.session("pi", "local", "sess-1")
    mine = s.append(castore.Message("user", "castore only"))
    after = {"type": "message", "id": "p1", "parentId": "e20", "timestamp": "2026-03-10T10:00:00.000Z",
             "message": {"role": "user", "content": "Pi went on", "timestamp": 2}}
    f.write_bytes(_dump([*entries, after]))
    pi.import_pi(mem_store, f)
    assert s.branches()[f"castore-{mine[:12]}"] == mine and s.show("main").meta["pi"]["id"] == "p1"


def test_a_torn_last_line_waits_and_a_rewritten_file_is_a_new_version(mem_store, tmp_path):
    entries = every_type_entries()
    f = tmp_path / "s.jsonl"
    f.write_bytes(_dump(entries[:5]) + b'{"type":"message","id":"e05","par')
    r = pi.import_pi(mem_store, f)[0]
    assert (r.entries, r.torn) == (4, len(b'{"type":"message","id":"e05","par'))
    f.write_bytes(_dump(entries))
    assert pi.import_pi(mem_store, f)[0].entries == 16
    with pytest.raises(pi.PiImportError, match="torn"):  # not waiting: a bad line, as import_session says
        pi.import_pi(mem_store, write_jsonl(tmp_path / "t.jsonl", entries, tail="{"), wait_torn=False)
    f.write_bytes(_dump([{**entries[0], "cwd": "/elsewhere"}, *entries[1:]]))  # Pi rewrote it (a migration)
    r = pi.import_pi(mem_store, f)[0]
    assert r.key == ("pi", "local", "sess-1.v2") and r.total == 20 and "imported again" in r.notes[0]
    assert mem_store.session("pi", "local", "sess-1").info["pi"]["header"]["cwd"] == "/w"  # kept as it was
    assert pi.import_pi(mem_store, f)[0].key == ("pi", "local", "sess-1.v2")  # later imports continue v2


def test_a_label_cleared_or_renamed_in_a_later_round_is_as_an_import_of_the_whole_file(tmp_path):
    """A Pi label entry that clears a label (``e14``), read in a later import than the one that
    set it (``e13``, "gone"), left the castore label in place: the store differed from an
    import of the whole file, and test_follow_imports_entries_as_pi_writes_them failed when a
    follow round happened to stop between the two lines. The label an import made from a Pi
    label entry is recorded (``info["pi"]["labels"]``) and removed when Pi clears or renames it."""
    entries = every_type_entries()
    f = tmp_path / "sessions" / "--w--" / "s.jsonl"
    f.parent.mkdir(parents=True)
    cut = next(i for i, e in enumerate(entries) if e.get("label") == "gone") + 1
    f.write_bytes(_dump(entries[:cut]))
    store = castore.open(str(tmp_path / "store"), durable=False)
    pi.import_pi(store, tmp_path / "sessions")
    a = store.session("pi", "local", "sess-1")
    a.label("mine", at=a.resolve("HEAD"))  # a user's own label stays
    f.write_bytes(_dump([*entries, {"type": "label", "id": "e21", "parentId": "e20", "timestamp": 21,
                                    "targetId": "e04", "label": "renamed"}]))
    pi.import_pi(store, tmp_path / "sessions")
    once = castore.open(str(tmp_path / "once"), durable=False)
    b = once.session(*pi.import_session(once, f).key)
    assert {**b.labels(), "mine": a.labels()["mine"]} == a.labels()
    assert set(b.labels()) == {"renamed"}


def test_follow_imports_entries_as_pi_writes_them(tmp_path):
    import threading

    from castore.adapters.follow import follow

    entries = every_type_entries()
    f = tmp_path / "sessions" / "--w--" / "s.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(_dump(entries[:3]))
    store = castore.open(str(tmp_path / "store"), durable=False)
    seen: list[int] = []
    done = threading.Event()

    def writer() -> None:
        for i in range(3, len(entries)):
            with f.open("ab") as out:
                out.write(_dump([entries[i]]))
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    follow(lambda: pi.import_pi(store, tmp_path / "sessions"), interval=0.01,
           stop=lambda: done.is_set() and sum(seen) == len(entries) - 1, on_result=lambda r: seen.append(r.entries))
    t.join()
    assert sum(seen) == 20
    once = castore.open(str(tmp_path / "once"), durable=False)
    a, b = store.session("pi", "local", "sess-1"), once.session(*pi.import_session(once, f).key)
    assert all_ids(a) == all_ids(b) and _refs(a) == _refs(b)


def test_cli_import_pi_folder_again_and_follow_options(tmp_path, real_files):
    from castore.cli import main

    root = tmp_path / "sessions" / "--w--"
    root.mkdir(parents=True)
    entries = every_type_entries()
    (root / "s.jsonl").write_bytes(_dump(entries[:9]))
    url = str(tmp_path / "cli-store")
    res = CliRunner().invoke(main, ["--store", url, "import", "pi", str(tmp_path / "sessions")])
    assert res.exit_code == 0 and res.stdout.startswith("pi/local/sess-1: 8 entries, HEAD "), res.output
    assert res.stderr.splitlines()[-1] == "1 file, 8 new entries"  # as the other agents' imports close
    (root / "s.jsonl").write_bytes(_dump(entries))
    res = CliRunner().invoke(main, ["--store", url, "import", str(tmp_path / "sessions")])  # told by the content
    assert res.exit_code == 0 and res.stdout.startswith("pi/local/sess-1: +12 entries (20 in all), HEAD "), \
        res.output
    assert res.stderr.splitlines()[-1] == "1 file, 12 new entries"
    res = CliRunner().invoke(main, ["--store", url, "import", "pi", str(root / "s.jsonl"), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)[0]["entries"] == 0 and "new entries" not in res.stderr
    res = CliRunner().invoke(main, ["--store", url, "import", "pi", str(root / "s.jsonl")])
    assert res.exit_code == 0 and res.stdout == "" and res.stderr.splitlines()[-1] == "1 file, 0 new entries"


def test_images_survive_gc_and_push(tmp_path):
    # an image taken out of a message body is a blob only that body names: the commit's
    # metadata names it too, so gc keeps it and push sends it
    from castore.maintenance import gc
    from castore.sync import push

    entries = every_type_entries()
    with castore.open(str(tmp_path / "s")) as store:
        r = pi.import_session(store, write_jsonl(tmp_path / "a.jsonl", entries))
        gc(store, grace=0)
        msgs = pi.inline_images(store, list(store.session(*r.key).messages()))
        assert any("image" in str(m.content) and PNG in str(m.content) for m in msgs)
        with castore.open(str(tmp_path / "remote")) as remote:
            push(store, remote)
            got = pi.inline_images(remote, list(remote.session(*r.key).messages()))
            assert [m.to_dict() for m in got] == [m.to_dict() for m in msgs]


def test_the_kept_file_bytes_survive_gc_and_push(tmp_path):
    # the file's bytes are blobs only HEAD's info names (info["pi"]["segments"]): fsck counts them
    # reachable, gc keeps them and push sends them, so the archive exports byte for byte after a gc
    # and on a second machine (before, fsck called them dangling and gc deleted them: "object ... not found")
    from castore.maintenance import fsck, gc
    from castore.sync import push

    root = tmp_path / "sessions" / "--home-u-p--"
    root.mkdir(parents=True)
    src = write_jsonl(root / "a.jsonl", every_type_entries())
    with castore.open(str(tmp_path / "s")) as store:
        pi.import_pi(store, tmp_path / "sessions")
        report = fsck(store)
        assert report.ok and report.unreachable == []
        gc(store, grace=0)
        with castore.open(str(tmp_path / "remote")) as remote:
            push(store, remote)
            for st, out in ((store, tmp_path / "out"), (remote, tmp_path / "out-remote")):
                (rel,) = pi.export_pi(st, out)
                assert (out / rel).read_bytes() == src.read_bytes()


# -- titles --------------------------------------------------------------------------------------
def first_prompt(path: Path) -> str | None:
    """The title Pi's /resume list shows for a file without a name (its first user message), cut as castore cuts."""
    first = next(e for e in map(json.loads, path.read_bytes().splitlines())
                 if e.get("type") == "message" and e["message"].get("role") == "user")
    content = first["message"]["content"]
    return prompt_title(content if isinstance(content, str) else
                        " ".join(b["text"] for b in content if b.get("type") == "text"))


def test_incremental_imports_and_sessions_imported_before_titles_get_the_first_message(mem_store, tmp_path,
                                                                                       real_files):
    # the start of a real file, as Pi writes it today (v3: the v1 file upgraded by an import and export)
    start = tmp_path / "start.jsonl"
    start.write_bytes(b"".join(real_files["large-session.jsonl"].read_bytes().splitlines(keepends=True)[:40]))
    lines = export_text(mem_store.session(*pi.import_session(mem_store, start).key)).encode().splitlines(
        keepends=True)
    want = first_prompt(start)
    assert want == "/mode"
    f = tmp_path / "s.jsonl"
    f.write_bytes(lines[0])
    inc = castore.open(str(tmp_path / "inc"), durable=False)
    s = inc.session(*pi.import_pi(inc, f)[0].key)
    assert session_title(s.info) is None
    f.write_bytes(b"".join(lines))
    pi.import_pi(inc, f)
    assert session_title(s.info) == want
    # a session imported before titles gets its title on its next import that finds new lines
    f.write_bytes(b"".join(lines[:-1]))
    old = castore.open(str(tmp_path / "old"), durable=False)
    s3 = old.session(*pi.import_pi(old, f)[0].key)
    s3.set_info({k: v for k, v in s3.info.items() if k != "name"} | {"pi": {
        k: v for k, v in s3.info["pi"].items() if k != "titled"}})
    assert session_title(s3.info) is None
    pi.import_pi(old, f)  # nothing new: nothing read
    assert session_title(s3.info) is None
    f.write_bytes(b"".join(lines))
    pi.import_pi(old, f)
    assert session_title(s3.info) == want


def test_a_pi_name_wins_over_the_first_message_and_the_latest_name_counts(mem_store, tmp_path):
    entries = every_type_entries()
    f = tmp_path / "s.jsonl"
    f.write_bytes(_dump(entries[:5]))
    pi.import_pi(mem_store, f)
    s = mem_store.session("pi", "local", "sess-1")
    assert s.info["name"] == "look"  # the text of the first user message (its image left out)
    f.write_bytes(_dump(entries))
    pi.import_pi(mem_store, f)
    assert s.info["name"] == "My session"
    renamed = {"type": "session_info", "id": "e21", "parentId": "e20", "timestamp": "2026-03-10T09:15:00.000Z",
               "name": "  Renamed  "}
    f.write_bytes(_dump([*entries, renamed]))
    pi.import_pi(mem_store, f)
    assert s.info["name"] == "Renamed"


# -- export pi DIR: the archive, byte for byte ----------------------------------------------------
def test_export_of_the_archive_gives_every_file_back_byte_for_byte(tmp_path, real_files):
    # ~/.pi/agent/sessions: the two real files (v1, kept as read), and a v3 one castore appended to
    root = tmp_path / "sessions"
    (root / "--home-u-pi-mono--").mkdir(parents=True)
    for name, f in real_files.items():
        shutil.copyfile(f, root / "--home-u-pi-mono--" / name)
    store = castore.open(str(tmp_path / "store"), durable=False)
    start = tmp_path / "start.jsonl"
    start.write_bytes(b"".join(real_files["large-session.jsonl"].read_bytes().splitlines(keepends=True)[:40]))
    v3 = export_text(store.session(*pi.import_session(store, start, app="scratch").key)).encode().splitlines(
        keepends=True)
    header = json.loads(v3[0])
    folder = "--" + header["cwd"].strip("/").replace("/", "-") + "--"
    mine = root / folder / "2026-03-10T09-14-02-000Z_mine.jsonl"
    mine.parent.mkdir(exist_ok=True)
    mine.write_bytes(b"".join([v3[0].replace(header["id"].encode(), b"mine-1", 1), *v3[1:]]))
    rs = pi.import_pi(store, root)
    assert len(rs) == 3
    s = store.session("pi", "local", "mine-1")
    ids = s.append_many([castore.Message("user", "from castore"), castore.Message("assistant", "an answer")])
    out = tmp_path / "out"
    written = pi.export_pi(store, out)
    # Pi's layout, the folder named for the header's cwd as Pi names it (the two real files' cwd)
    assert sorted(written) == sorted([f"{folder}/{mine.name}",
                                      *(pi.archive_path(store.session(*r.key)) for r in rs if r.key[2] != "mine-1")])
    real_cwd = json.loads(real_files["large-session.jsonl"].read_bytes().splitlines()[0])["cwd"]
    for r in rs:
        rel = pi.archive_path(store.session(*r.key))
        got = (out / rel).read_bytes()
        src = Path(r.path).read_bytes()
        if r.key[2] == "mine-1":  # the file, then castore's entries: Pi and castore read them back
            assert got.startswith(src) and [e[pi.MARK] for e in lines_of(got[len(src):].decode())] == ids
            mine.write_bytes(got)
            assert pi.import_pi(store, mine)[0].entries == 2 and s.head == ids[-1]
        else:
            assert rel.startswith("--" + real_cwd.strip("/").replace("/", "-") + "--/") and got == src
    assert pi.export_pi(store, tmp_path / "again") == written
    assert all((tmp_path / "again" / rel).read_bytes() == (out / rel).read_bytes() for rel in written)


def test_cli_export_pi_dest_and_the_one_session_forms(tmp_path, monkeypatch):
    from castore.cli import main

    url = str(tmp_path / "cli-store")
    entries = every_type_entries()
    path = write_jsonl(tmp_path / "a.jsonl", entries)
    runner = CliRunner()
    assert runner.invoke(main, ["--store", url, "import", "pi", str(path)]).exit_code == 0
    res = runner.invoke(main, ["--store", url, "export", "pi", str(tmp_path / "out")])
    assert res.exit_code == 0 and res.stdout == "--w--/a.jsonl\n", res.output
    assert (tmp_path / "out" / "--w--" / "a.jsonl").read_bytes() == path.read_bytes()
    # a revision of the session chosen is still a revision (stdout), a folder a folder
    res = runner.invoke(main, ["--store", url, "-s", "pi/local/sess-1", "export", "pi", "pi-e19"])
    assert res.exit_code == 0 and lines_of(res.stdout)[-1]["id"] == "e19", res.output
    (tmp_path / "pi-e19").mkdir()
    res = runner.invoke(main, ["--store", url, "-s", "pi/local/sess-1", "export", "pi", str(tmp_path / "pi-e19")])
    assert res.exit_code == 0 and (tmp_path / "pi-e19" / "--w--" / "a.jsonl").exists()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "main").mkdir()
    res = runner.invoke(main, ["--store", url, "-s", "pi/local/sess-1", "export", "pi", "main"])
    assert res.exit_code == 2 and "both a folder and a revision" in res.stderr
    res = runner.invoke(main, ["--store", url, "export", "pi", "-s", "pi/local/sess-1", "-s", "pi/local/x", "-o",
                               str(tmp_path / "one.jsonl")])
    assert res.exit_code == 2 and "one -s" in res.stderr
    append = runner.invoke(main, ["--store", url, "-s", "scratch/u/s", "append", "--role", "user", "hello"])
    assert append.exit_code == 0, append.output
    res = runner.invoke(main, ["--store", url, "export", "pi", str(tmp_path / "o2"), "-s", "scratch/u/s"])
    assert res.exit_code == 1 and res.stderr.count("\n") == 1 and "not an archived Pi session" in res.stderr


def _newest_line_time(path: Path) -> float:
    return max(pi._time(json.loads(line).get("timestamp")) for line in path.read_text().splitlines())


def test_sessions_lists_real_files_by_their_own_newest_line_whenever_imported(tmp_path, real_files):
    # the importer moves main onto a commit it wrote: the ref's time is that line's, not the
    # import's, so an old session imported last still lists after a newer one
    from castore.cli import main

    url, runner = str(tmp_path / "store"), CliRunner()
    newer, older = real_files["before-compaction.jsonl"], real_files["large-session.jsonl"]
    for f in (newer, older):
        res = runner.invoke(main, ["--store", url, "import", "pi", str(f)])
        assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["--store", url, "sessions", "--json"])
    listed = [(s["session"], s["updated"]) for s in json.loads(res.stdout)["sessions"]]
    assert listed == [("ffae836b-9420-4060-ac13-7745215f90ff", _newest_line_time(newer)),
                      ("d703a1a9-1b7b-4fb1-b512-c9738b1fe617", _newest_line_time(older))]
    res = runner.invoke(main, ["--store", url, "sessions"])
    assert "2025-12-09" in res.stdout.splitlines()[0] and "2025-11-21" in res.stdout.splitlines()[1]


# -- v1 files: going on, and rewritten by Pi ---------------------------------------------------
def pi_migrates(data: bytes, rng: random.Random) -> bytes:
    """The file as Pi's SessionManager rewrites a v1/v2 file when it opens it (pi-mono,
    packages/coding-agent/src/core/session-manager.ts: migrateV1ToV2 gives each entry a random
    8-hex id and its predecessor as parent, a compaction's firstKeptEntryIndex becomes
    firstKeptEntryId; migrateV2ToV3 renames the hookMessage role; _rewriteFile writes every
    entry with JSON.stringify, one a line)."""
    entries = [json.loads(line) for line in data.splitlines() if line.strip()]
    if entries[0].get("version", 1) < 2:
        prev = None
        for e in entries[1:]:
            e["id"], e["parentId"], prev = rng.randbytes(4).hex(), prev, None
            prev = e["id"]
            if e.get("type") == "compaction" and isinstance(e.get("firstKeptEntryIndex"), int):
                e["firstKeptEntryId"] = entries[e.pop("firstKeptEntryIndex")]["id"]
    for e in entries[1:]:
        if e.get("type") == "message" and e["message"].get("role") == "hookMessage":
            e["message"]["role"] = "custom"
    entries[0]["version"] = 3
    return _dump(entries)


def test_a_v1_file_goes_on_then_pi_rewrites_it_and_the_rewritten_file_is_the_session(tmp_path, real_files):
    from castore.cli import main
    from castore.porcelain import find_session

    raw = real_files["large-session.jsonl"].read_bytes()
    sid = json.loads(raw.splitlines()[0])["id"]
    lines = raw.splitlines(keepends=True)
    root = tmp_path / "sessions"
    f = root / "--w--" / f"2025-11-20T23-33-50-805Z_{sid}.jsonl"
    f.parent.mkdir(parents=True)
    f.write_bytes(b"".join(lines[:40]))
    url = str(tmp_path / "store")
    store = castore.open(url, durable=False)
    assert [r.entries for r in pi.import_pi(store, root)] == [39]
    # an older Pi goes on writing v1 lines (no ids): they are imported, as the whole file would be
    f.write_bytes(raw)
    (r,) = pi.import_pi(store, root)
    assert (r.entries, r.total, r.key) == (len(lines) - 40, len(lines) - 1, ("pi", "local", sid))
    once = castore.open(str(tmp_path / "once"), durable=False)
    pi.import_session(once, real_files["large-session.jsonl"])
    v1 = store.session("pi", "local", sid)
    assert all_ids(v1) == all_ids(once.session("pi", "local", sid)) and _refs(v1) == _refs(
        once.session("pi", "local", sid))
    # Pi opens it: the file is rewritten as v3 (random ids), and Pi goes on with it
    v3 = pi_migrates(raw, random.Random(1))
    new = {"type": "message", "id": "feedf00d", "parentId": json.loads(v3.splitlines()[-1])["id"],
           "timestamp": "2025-12-01T10:00:00.000Z", "message": {"role": "user", "content": "go on", "timestamp": 1}}
    f.write_bytes(v3 + _dump([new]))
    (r,) = pi.import_pi(store, root)
    assert r.key == ("pi", "local", f"{sid}.v2") and "file rewritten?" in r.notes[0]
    # that file is the session Pi has under this id: its id or a prefix means it, the full key each one
    for typed in (sid, sid[:8]):
        assert find_session(store, typed) == ("pi", "local", f"{sid}.v2")
    res = CliRunner().invoke(main, ["--store", url, "use", sid[:8]])
    assert res.exit_code == 0 and f"pi/local/{sid}.v2" in res.stderr
    res = CliRunner().invoke(main, ["--store", url, "-s", f"pi/local/{sid}", "log", "--oneline", "-n", "1"])
    assert res.exit_code == 0 and res.stdout.strip()
    # both files come back byte for byte; the archive's export is the file Pi has now
    for key, data in ((v1.key, raw), (r.key, v3 + _dump([new]))):
        out = tmp_path / f"out-{key[2]}"
        (rel,) = pi.export_pi(store, out, sessions=[store.session(*key)])
        assert (out / rel).read_bytes() == data
    (rel,) = pi.export_pi(store, tmp_path / "all")
    assert (tmp_path / "all" / rel).read_bytes() == f.read_bytes() and rel.endswith(f"/{f.name}")
