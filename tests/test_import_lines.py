"""The per-line fast path of the JSONL importers: a line is parsed by msgspec where that gives
what ``json.loads`` gives, and an entry built from a vouched line skips the value checks an
append makes; lines where either would differ take the checked path, to the same commits."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

import castore
from castore.adapters import claude_code
from castore.adapters.claude_code import export_claude, import_claude
from castore.adapters.jsonl_tree import NOT_JSON, parse_line, parse_vouched
from castore.adapters.tree_writer import TreeWriter
from castore.entries import MAX_DEPTH, Event, Message, prepare, vouched_event
from castore.errors import InvalidEntry


def _json(raw: bytes | str) -> object:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return NOT_JSON


DEEP = b"[" * (MAX_DEPTH + 20) + b"]" * (MAX_DEPTH + 20)
CASES = [
    (b'{"type":"user","message":{"role":"user","content":[{"type":"text","text":"hi"}]}}\n', True),
    ('{"a": [1, 2.5, -0.0, null, true], "b": "\\u00e9"}', True),  # str input
    (b'{"a":1,"b":2,"a":3}', True),  # a repeated key: the last one, in the first one's place
    (b'{"n":123456789012345678901234567890}', True),  # beyond 64 bits: the append refuses it
    (b'{"x":NaN}', False), (b'{"x":-Infinity}', False), (b'{"x":1e999}', False),  # only json.loads takes these
    (b'"\\ud800"', False), (b'\xef\xbb\xbf{"a":1}', False),  # a lone surrogate, a byte-order mark
    (b"[" + b"{}," * MAX_DEPTH + b"{}]", False),  # more containers than MAX_DEPTH, shallow: the checks decide
    (DEEP, False), (b"[" * 5000 + b"]" * 5000, False),  # deeper than Python's recursion: not JSON
    (b"not json\n", False), (b'{"a":1', False), (b"\xff\xfe", False),
]


@pytest.mark.parametrize(("raw", "vouched"), CASES)
def test_parse_vouched_gives_what_json_loads_gives(raw: bytes | str, vouched: bool) -> None:
    value, ok = parse_vouched(raw)
    assert repr(value) == repr(_json(raw)) and repr(parse_line(raw)) == repr(value)
    if isinstance(value, dict):
        assert list(value) == list(_json(raw))  # type: ignore[arg-type]
    assert ok is vouched


def test_vouched_event_is_an_event_and_prepare_still_checks_what_was_not_vouched_for() -> None:
    msg = Message("user", [{"type": "text", "text": "hi"}])
    e = vouched_event("user", msg, {"claude": {"o": 1}})
    plain = Event(author="user", message=msg, meta={"claude": {"o": 1}})
    assert e == plain and repr(e) == repr(plain) and dataclasses.asdict(e) == dataclasses.asdict(plain)
    assert prepare(e) == prepare(plain)
    with pytest.raises(InvalidEntry, match="non-finite"):  # meta given to the append is checked
        prepare(e, meta={"t": math.nan})
    bad = vouched_event("user", Message("user", [{"x": math.inf}]), {})  # a maker's broken promise
    with pytest.raises(InvalidEntry, match="non-finite"):
        prepare(dataclasses.replace(bad))  # a copy is an ordinary event: checked in full


def _line(i: int, content: object) -> str:
    return json.dumps({"parentUuid": f"u{i - 1}" if i else None, "uuid": f"u{i}", "type": "user",
                       "timestamp": f"2025-11-19T22:00:{i:02d}.000Z", "message": {"role": "user", "content": content}})


def test_lines_castore_cannot_store_keep_their_bytes_and_give_the_commits_of_the_checked_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    deep: object = "x"
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    lines = [_line(0, "hi"), _line(1, [{"type": "text", "text": "ok", "n": 2.5}]), _line(2, deep),
             _line(3, [{"type": "text", "text": "big", "n": 2**70}]), _line(4, "bye")]
    lines.insert(2, _line(2, "nan").replace('"nan"', "NaN").replace('"u2"', '"u2n"'))  # beside line 2
    proj = tmp_path / "in" / "p"
    proj.mkdir(parents=True)
    (proj / "s.jsonl").write_text("\n".join(lines) + "\n")

    def heads(store: castore.Store) -> dict[str, str]:
        import_claude(store, proj)
        return store.session("claude", "p", "s").branches()

    fast = castore.open(str(tmp_path / "fast"), durable=False)
    got = heads(fast)
    s = fast.session("claude", "p", "s")
    les = sorted(s.log(all_branches=True), key=lambda le: le.meta["claude"]["o"])
    assert [le.entry.message is not None for le in les] == [True, True, False, False, False, True]
    export_claude(fast, tmp_path / "out")
    assert (tmp_path / "out" / "p" / "s.jsonl").read_bytes() == (proj / "s.jsonl").read_bytes()
    # every line unvouched: every value checked by the append, as before the fast path
    monkeypatch.setattr(claude_code, "parse_vouched", lambda raw: (parse_vouched(raw)[0], False))
    assert heads(castore.open(str(tmp_path / "slow"), durable=False)) == got


DATA = Path(__file__).resolve().parent / "data" / "claude-code" / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


def _infos(store: castore.Store) -> dict[str, object]:
    return {si.session: (si.head, store.session(si.app, si.user, si.session).info) for si in store.sessions("claude")}


@pytest.mark.parametrize("twice", [False, True])
def test_links_found_among_the_written_lines_are_those_read_back_from_the_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twice: bool) -> None:
    proj = tmp_path / "in" / "p"
    shutil.copytree(DATA, proj, ignore=shutil.ignore_patterns("LICENSE"))
    if twice:  # a second line naming an agent: the log's order decides, so the log is read
        main = proj / f"{SID}.jsonl"
        lines = main.read_bytes().splitlines(keepends=True)
        result = next(line for line in lines if b'"agentId"' in line and b'"tool_result"' in line)
        d = json.loads(result)
        d["uuid"], d["parentUuid"] = "dup-1", json.loads(lines[-1]).get("uuid")
        main.write_bytes(b"".join(lines) + json.dumps(d).encode() + b"\n")
    fast = castore.open(str(tmp_path / "fast"), durable=False)
    import_claude(fast, proj)

    class ReadBack(TreeWriter):  # keeps nothing: every link is read back from the store
        def __init__(self, *args: object, **kw: object) -> None:
            kw["keep"] = False
            super().__init__(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(claude_code, "TreeWriter", ReadBack)
    slow = castore.open(str(tmp_path / "slow"), durable=False)
    import_claude(slow, proj)
    got = _infos(fast)
    assert got == _infos(slow)
    assert all("spawned_by" in info for sid, (_, info) in got.items() if ".subagents." in sid)


def _nested(k: int) -> object:
    v: object = "x"
    for _ in range(k):
        v = [v]
    return v


def _codex_file(path: Path) -> Path:
    """A Codex rollout whose tool calls' arguments nest as deep as a vouched line's may (the
    call's message nests them two levels below its content, as the line does below it), one
    level more (unvouched: the append refuses it), and a NaN (only json.loads takes it)."""
    rec = {"timestamp": "2025-12-28T12:18:30.533Z", "type": "session_meta", "payload": {"id": "t1"}}
    lines = [json.dumps(rec)]
    for i, args in enumerate([_nested(MAX_DEPTH - 2), _nested(MAX_DEPTH - 1), "NaN", {"cmd": "ls"}]):
        call = {"timestamp": f"2025-12-28T12:18:3{i}.000Z", "type": "response_item",
                "payload": {"type": "function_call", "name": "shell", "arguments": args, "call_id": f"c{i}"}}
        lines.append(json.dumps(call).replace('"NaN"', "NaN"))
    path.write_text("\n".join(lines) + "\n")
    return path


DATA_ROOT = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("vendor", ["codex", "codex-deep", "gemini"])
def test_codex_and_gemini_lines_give_the_commits_of_the_checked_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, vendor: str) -> None:
    from castore.adapters import codex, gemini

    mod = gemini if vendor == "gemini" else codex
    src = DATA_ROOT / "gemini" / "tmp" if vendor == "gemini" else DATA_ROOT / "codex" \
        if vendor == "codex" else _codex_file(tmp_path / "deep.jsonl")
    run = gemini.import_gemini if vendor == "gemini" else codex.import_codex

    def commits(name: str) -> dict[tuple[str, ...], object]:
        with castore.open(str(tmp_path / name), durable=False) as store:
            rs = run(store, src)
            out = {}
            for r in rs:
                s = store.session(*r.session)
                out[r.session] = (s.branches(), s.current_branch, s.info,
                                  sorted((le.id, le.entry.message is not None) for le in s.log(all_branches=True)))
            return out

    fast = commits("fast")
    if vendor == "codex-deep":  # a call nested as deep as its line may be is read; the deeper one and NaN are not
        (_, _, _, les), = fast.values()
        assert sorted(has for _, has in les) == [False, False, False, True, True]
    monkeypatch.setattr(mod, "parse_vouched", lambda raw: (parse_vouched(raw)[0], False))
    assert commits("slow") == fast


def test_the_branch_digest_an_import_records_is_that_of_the_branches_stored(tmp_path: Path) -> None:
    """The writer records the tips it left (no listing again), which are what the store lists:
    sessions laid out again after a rewind, a Codex rollback and fork, Gemini rewinds."""
    from castore.adapters.codex import import_codex
    from castore.adapters.gemini import import_gemini
    from castore.adapters.jsonl_tree import as_dict, tips_digest

    with castore.open(str(tmp_path / "s"), durable=False) as store:
        import_claude(store, DATA_ROOT / "claude-code")
        import_codex(store, DATA_ROOT / "codex")
        import_gemini(store, DATA_ROOT / "gemini" / "tmp")
        recorded = multi = 0
        for app in ("claude", "codex", "gemini"):
            for si in store.sessions(app):
                s = store.session(si.app, si.user, si.session)
                tips = as_dict(s.info.get(app)).get("tips")
                if tips is not None:
                    assert tips == tips_digest(s.branches()), si.session
                    recorded += 1
                    multi += len(s.branches()) > 1
        assert recorded > 10 and multi >= 3


def test_head_state_is_what_exists_current_branch_and_head_say(tmp_path: Path) -> None:
    with castore.open(str(tmp_path / "s"), durable=False) as store:
        s = store.session("a", "u", "s")

        def said() -> tuple[bool, str | None, str | None]:
            return s.exists(), s.current_branch, s.head

        assert s.head_state() == said() == (False, "main", None)
        first = s.append(Message("user", "hi"))
        s.append(Message("assistant", "hello"))
        assert s.head_state() == said() and s.head_state()[:2] == (True, "main")
        s.checkout(first)  # detached
        assert s.head_state() == said() == (True, None, first)
        s.checkout("main")
        long = "é" * 120  # a ref segment too long to be the name: a digest, the name in the refs' metadata
        s.branch(long, at=first)
        s.checkout(long)
        assert s.head_state() == said() == (True, long, first)


def test_a_vouched_line_is_prepared_as_the_same_event_checked_in_full() -> None:
    # prepare's way for an importer's vouched events gives what the checked way gives
    from castore.adapters.jsonl_tree import encode_blob

    data = Path(__file__).resolve().parent / "data" / "claude-code"
    n = 0
    for path in sorted(data.rglob("*.jsonl")):
        for i, raw in enumerate(path.read_bytes().splitlines(keepends=True)):
            d, vouched = parse_vouched(raw)
            if not vouched or not isinstance(d, dict):
                continue
            e = claude_code._entry(i, encode_blob(raw, castore.objects.PLAIN)[0], d, True)
            checked = Event(author=e.author, message=e.message, meta=dict(e.meta))
            a, b = prepare(e, at=1.5), prepare(checked, at=1.5)
            assert {k: v for k, v in vars(a).items() if k != "entry"} == \
                   {k: v for k, v in vars(b).items() if k != "entry"}
            assert a.entry is e
            n += 1
    assert n > 100
