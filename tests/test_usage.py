"""castore usage: the real session files imported, then the totals checked against the files'
own usage fields with the copies removed, computed here straight from the JSONL."""

from __future__ import annotations

import functools
import json
import lzma
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore.adapters.claude_code import import_claude
from castore.adapters.codex import import_codex
from castore.adapters.pi import import_session
from castore.cli import main as cli_main
from castore.entries import Message
from castore.usage import Prices, Tokens, UsageError, load_prices, tokens_of, usage

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
MAIN = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASTORE_USAGE_CACHE", str(tmp_path / "usage-cache.json"))


@pytest.fixture
def store(tmp_path: Path) -> castore.Store:
    return castore.open(str(tmp_path / "store"), durable=False)


@functools.cache
def _cases() -> Any:
    """The cases of scripts/usage_vs_ccusage.py (the copies each builds from the real files)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("usage_vs_ccusage", ROOT / "scripts" / "usage_vs_ccusage.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _lines(path: Path) -> list[dict[str, Any]]:
    return _cases().jsonl_objects(path)  # type: ignore[no-any-return]


def claude_truth(root: Path) -> tuple[int, Tokens]:
    """What the Claude Code files under ``root`` say: every assistant line's ``message.usage``,
    one per ``message.id`` and model (a response written as several lines, or again in another
    file; the model tells apart the hand-made files of claude-code-log that reuse ids)."""
    seen: dict[Any, Tokens] = {}
    for f in sorted(root.rglob("*.jsonl")):
        for d in _lines(f):
            m = d.get("message")
            if d.get("type") != "assistant" or not isinstance(m, dict) or not isinstance(m.get("usage"), dict):
                continue
            if m.get("model") == "<synthetic>":
                continue
            u = m["usage"]
            seen.setdefault((m.get("id"), m.get("model")) if m.get("id") else d.get("requestId") or d["uuid"], Tokens(
                u.get("input_tokens", 0), u.get("output_tokens", 0), u.get("cache_read_input_tokens", 0),
                u.get("cache_creation_input_tokens", 0)))
    total = Tokens()
    for t in seen.values():
        total.add(t)
    return len(seen), total


def _projects(tmp_path: Path) -> Path:
    root = tmp_path / "projects"
    shutil.copytree(DATA / "claude-code" / "session-share", root / "session-share")
    shutil.copytree(DATA / "claude-code" / "claude-code-log", root / "claude-code-log",
                    ignore=shutil.ignore_patterns("LICENSE"))
    return root


def test_claude_totals_match_the_files_own_usage_with_copies_removed(store: castore.Store, tmp_path: Path) -> None:
    root = _projects(tmp_path)
    import_claude(store, root)
    n, want = claude_truth(root)
    r = usage(store)
    assert (r.total.responses, r.total.tokens) == (n, want)
    assert n >= 36 and want.total > 0  # tests/data grows: the files themselves are the measure
    # the main file writes 25 assistant lines for 11 responses; each subagent file its own
    by_session = {g.name: g.responses for g in usage(store, by="session").groups}
    assert by_session[f"claude/session-share/{MAIN}"] == 11
    assert by_session[f"claude/session-share/{MAIN}.subagents.agent-a5bdbc1"] == 2
    assert sum(by_session.values()) == n
    # rows of every grouping add up to the total
    for by in ("session", "branch", "model", "project", "day"):
        rep = usage(store, by=by)
        got = Tokens()
        for g in rep.groups:
            got.add(g.tokens)
        assert got == want and sum(g.responses for g in rep.groups) == n
    assert r.total.cost == pytest.approx(sum(g.cost for g in r.groups))
    assert r.total.unpriced == 0 and r.total.cost > 0


def test_a_fresh_claude_import_keeps_usage_in_metadata_equal_to_the_raw_lines(store: castore.Store,
                                                                               tmp_path: Path) -> None:
    """The importer keeps each assistant line's usage in its commit's metadata, so usage reads no
    line; what it keeps is what the raw line gives (the reader of a store imported before)."""
    from castore.adapters.jsonl_tree import read_blobs
    from castore.objects import hex_id, json_loads
    from castore.usage import CLAUDE_USAGE, READERS, Walk

    root = _projects(tmp_path)
    import_claude(store, root)
    reader = READERS["claude"]
    commits: dict[str, Any] = {}
    for _folder, refs in store.session_refs().values():
        for tip in refs.values():
            cid: str | None = tip
            while cid is not None and cid not in commits:
                c = commits[cid] = store.history.commit(cid)
                cid = hex_id(c.parents[0]) if c.parents else None
    assistant = {cid: c for cid, c in commits.items() if c.meta.get("claude", {}).get("type") == "assistant"}
    assert len(assistant) >= 36
    lines = read_blobs(store, [c.meta["claude"]["raw"] for c in assistant.values()])
    kept = 0
    for cid, c in assistant.items():
        m = c.meta["claude"]
        assert isinstance(m[CLAUDE_USAGE], list) and not reader.needs_line(c, m)  # no line read
        old = {k: v for k, v in m.items() if k != CLAUDE_USAGE}  # as imported before
        assert reader.needs_line(c, old)
        from_raw = reader.read(Walk(), cid, c, old, json_loads(lines[m["raw"]]))
        assert reader.read(Walk(), cid, c, m, None) == from_raw
        kept += from_raw is not None
    n, want = claude_truth(root)
    assert kept >= n  # a response written as several lines keeps its usage on each
    r = usage(store, cache=False)
    assert (r.total.responses, r.total.tokens) == (n, want)


@pytest.mark.parametrize("extra", ["resume", "fork", "aside"])
def test_resumed_forked_and_replayed_copies_of_claude_responses_count_once(store: castore.Store, tmp_path: Path,
                                                                            extra: str) -> None:
    """A resume (the prefix replayed with the same uuids under a new sessionId), a fork with
    new uuids (as ``--fork-session``/compaction replays write them), and a ``/btw`` aside
    replaying the parent's responses under new request ids: no response counts twice."""
    cases = _cases()
    base = cases.claude_case(tmp_path / "base", None) / "projects"
    root = cases.claude_case(tmp_path / "home", extra) / "projects"
    n0, want0 = claude_truth(base)
    import_claude(store, root)
    assert claude_truth(root) == (n0, want0)  # the copies hold no new response
    assert sum(1 for _ in root.rglob("*.jsonl")) == 7
    r = usage(store, by="session")
    assert (r.total.responses, r.total.tokens) == (n0, want0)
    assert r.copies > 0
    # each response counts for its earliest copy: the original session keeps its 11
    assert {g.name: g.responses for g in r.groups}[f"claude/session-share/{MAIN}"] == 11


def test_paths_walked_through_a_store_wide_load_equal_the_paths_read_commit_by_commit(
        store: castore.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """usage's first run on a store decodes every commit in one pass (usage.load_commits, as
    History.load_commits does into the store's cache) and walks the paths through them: on the real files with their forks (rewinds, subagents,
    a forked session, a Codex fork) each path equals the one read a commit at a time and the
    one read through its index and segments, also when only some commits were decoded; and
    every report equals the one read path by path."""
    import castore.usage as usage_mod
    from castore.objects import Commit

    cases = _cases()
    root = cases.claude_case(tmp_path / "home", "fork") / "projects"
    import_claude(store, root)
    import_codex(store, cases.codex_case(tmp_path / "cx", "fork") / "sessions")
    url = str(tmp_path / "store")
    every = store.session_refs()
    tips = sorted({tip for _f, refs in every.values() for tip in refs.values()})
    truth = {tip: castore.open(url).history.walk(tip) for tip in tips}  # each its own handle: nothing decoded
    reachable = {cid for path in truth.values() for cid, _c in path}
    assert len(tips) > len(every) > 8  # branches and forks share commits
    assert max(map(len, truth.values())) > 64  # a path longer than a block: its index holds the rest

    loaded = castore.open(url)
    assert loaded.history.load_commits() >= len(reachable)
    assert all(isinstance(loaded.objects.decoded(cid), Commit) for cid in reachable)
    some = castore.open(url)
    assert some.objects.load_all(Commit, budget=40) == 40  # the rest read as a path needs them
    def no_fallback(tip: str) -> Any:
        raise AssertionError(f"the path to {tip} did not fit: read again commit by commit")

    for h in (loaded.history, some.history):
        monkeypatch.setattr(h, "walk", no_fallback)
    for name in ("get_many", "read_stored_many"):  # no index, no segment, no object read
        monkeypatch.setattr(loaded.objects, name, lambda *a, **k: pytest.fail("read: every commit was decoded"))
    monkeypatch.setattr(loaded.objects.packmap, "read_packed", lambda *a, **k: pytest.fail("read a packed object"))
    for tip in tips:
        assert loaded.history.path(tip) == truth[tip]
        assert some.history.path(tip) == truth[tip]
        assert castore.open(url).history.path(tip) == truth[tip]

    def report(scan_from: int, by: str, keep: int = usage_mod.cache.SCAN_MAX_COMMITS) -> Any:
        monkeypatch.setattr(usage_mod.cache, "SCAN_MIN_SESSIONS", scan_from)
        monkeypatch.setattr(usage_mod.cache, "SCAN_MAX_COMMITS", keep)
        return usage(castore.open(url), by=by, cache=False).to_json()

    for by in ("session", "branch", "model", "day"):
        assert report(0, by) == report(1 << 30, by)
        assert report(0, by, keep=40) == report(1 << 30, by)  # the paths beyond what the scan kept: read
    scanned = castore.open(url)  # every commit found by the scan: no path, no commit read on its own
    monkeypatch.setattr(usage_mod.cache, "SCAN_MIN_SESSIONS", 0)
    monkeypatch.setattr(usage_mod.cache, "SCAN_MAX_COMMITS", 1 << 30)
    for name in ("path", "commit", "walk"):
        monkeypatch.setattr(scanned.history, name, lambda *a, **k: pytest.fail("read: the scan found every commit"))
    assert usage(scanned, by="branch", cache=False).to_json() == report(1 << 30, "branch")
    # the scanned commits stay decoded with the store (a later read finds them), within the
    # bound on what the store keeps decoded
    assert all(isinstance(scanned.objects.decoded(cid), Commit) for cid in reachable)
    from castore.objectstore import CACHE_MAX_OBJECT

    fresh = castore.open(url)
    tip = tips[0]
    fresh.objects.keep_decoded({tip: truth[tip][-1][1]}, biggest=CACHE_MAX_OBJECT + 1)
    assert fresh.objects.decoded(tip) is None
    fresh.objects.keep_decoded({tip: truth[tip][-1][1]}, biggest=CACHE_MAX_OBJECT)
    assert fresh.objects.decoded(tip) == truth[tip][-1][1]
    n, want = claude_truth(root)
    r = usage(castore.open(url), app="claude", cache=False)
    assert (r.total.responses, r.total.tokens) == (n, want)


# -- Codex ---------------------------------------------------------------------------------------
def codex_truth(root: Path) -> tuple[int, Tokens]:
    """What the rollouts say: each ``token_count``'s ``last_token_usage``, one per pair of
    counts (a fork copies its parent's events; an event repeated for new rate limits)."""
    seen: dict[str, Tokens] = {}
    for f in sorted(root.rglob("*.jsonl")):
        for d in _lines(f):
            p = d.get("payload") or {}
            if d.get("type") == "event_msg" and p.get("type") == "token_count" and p.get("info"):
                last = p["info"]["last_token_usage"]
                key = json.dumps([p["info"]["total_token_usage"], last], sort_keys=True)
                seen.setdefault(key, Tokens(last["input_tokens"] - last["cached_input_tokens"],
                                            last["output_tokens"], last["cached_input_tokens"], 0))
    total = Tokens()
    for t in seen.values():
        total.add(t)
    return len(seen), total


@pytest.mark.parametrize("extra", ["fork", "subagent"])
def test_codex_fork_subagent_and_repeated_token_counts_count_once(store: castore.Store, tmp_path: Path,
                                                                  extra: str) -> None:
    """A thread of three turns (each token_count written twice, as for new rate limits) and
    a fork copying two of its turns, or a subagent replaying all of it; each adds one turn."""
    root = _cases().codex_case(tmp_path / "home", extra) / "sessions"
    import_codex(store, root)
    n, want = codex_truth(root)
    assert n == 4  # three parent turns and the copy's own
    r = usage(store, by="model")
    assert (r.total.responses, r.total.tokens) == (n, want)
    assert {g.name: g.responses for g in r.groups} == {"gpt-5-codex": 4}
    sessions = {g.name.rsplit("/", 1)[1][-2:]: g.responses for g in usage(store, by="session").groups}
    assert sessions == {"01": 3, "02": 1}
    # the cached part of the input counts as cache reads, priced as such
    p = load_prices().of("gpt-5-codex")
    assert p is not None
    t = r.groups[0].tokens
    assert t.cache_read == 600 * (1 + 2 + 3 + 9)
    assert r.groups[0].cost == pytest.approx((t.input * p["input"] + t.output * p["output"]
                                              + t.cache_read * p["cache_read"]) / 1e6)


def _codex_paths(store: castore.Store) -> list[list[tuple[str, Any]]]:
    """Every path (root to a tip) of every Codex session, as (commit id, commit)."""
    out = []
    for key, (_folder, refs) in store.session_refs().items():
        if key[0] == "codex":
            out += [store.history.path(tip) for name, tip in refs.items() if name.startswith(("heads/", "tags/"))]
    return out


def _codex_rollback_case(base: Path) -> Path:
    """The fork case with a rollback in the parent: its last turn dropped, another in its place
    (Codex's running total goes on growing: the dropped response was billed all the same)."""
    root = _cases().codex_case(base, "fork") / "sessions"
    f = next(root.rglob("*0001.jsonl"))
    lines = f.read_text().splitlines(keepends=True)
    total = json.loads(lines[-1])["payload"]["info"]["total_token_usage"]
    rl = _cases()._rl
    extra = [rl(60, "event_msg", {"type": "thread_rolled_back", "num_turns": 1})]
    last = {"input_tokens": 7000, "cached_input_tokens": 4200, "output_tokens": 350, "reasoning_output_tokens": 0,
            "total_tokens": 7350}
    info = {"total_token_usage": {k: total[k] + v for k, v in last.items()}, "last_token_usage": last}
    extra += [rl(61, "turn_context", {"cwd": "/w", "model": "gpt-5.1-codex"}),
              rl(62, "response_item", {"type": "message", "role": "user",
                                       "content": [{"type": "input_text", "text": "question 7"}]}),
              rl(63, "event_msg", {"type": "token_count", "info": info, "rate_limits": None})]
    f.write_text("".join(lines + extra))
    return root


@pytest.mark.parametrize("case", ["fork", "subagent", "rollback", "old"])
def test_a_fresh_codex_import_keeps_usage_in_metadata_equal_to_the_raw_lines(store: castore.Store, tmp_path: Path,
                                                                              case: str) -> None:
    """The importer keeps each token_count's usage (and the model its turn_context named) in the
    commit's metadata, read on the path the line hangs on (rollbacks, forks, subagent replays);
    usage then reads no line, and gets on every path what the stateful reader of the raw lines
    gets for a session imported before; the totals are the files' own counts with the copies
    removed. ``old``: rollouts too old to have ``last_token_usage`` (the growth of the total
    counts), with a rollback, a fork and a subagent (tests/test_codex.py's files)."""
    from castore.adapters.jsonl_tree import read_blobs
    from castore.objects import json_loads
    from castore.usage import CODEX_USAGE, READERS, Walk

    if case == "old":
        import test_codex as tc

        day = tmp_path / "sessions" / "2026" / "01" / "02"
        day.mkdir(parents=True)
        parent = tc._parent_lines()
        (day / f"rollout-2026-01-02T10-00-00-{tc.PARENT}.jsonl").write_bytes(b"".join(parent))
        (day / f"rollout-2026-01-02T10-03-20-{tc.FORK}.jsonl").write_bytes(b"".join(tc._fork_lines(parent, 22)))
        spawn = {"subagent": {"thread_spawn": {"parent_thread_id": tc.PARENT, "depth": 1}}}
        (day / f"rollout-2026-01-02T10-08-20-{tc.CHILD}.jsonl").write_bytes(b"".join(
            [tc._line(500, "session_meta", tc._meta(tc.CHILD, source=spawn)), *tc._turn(510, 7, "subagent")]))
        root = tmp_path / "sessions"
    elif case == "rollback":
        root = _codex_rollback_case(tmp_path / "home")
    else:
        root = _cases().codex_case(tmp_path / "home", case) / "sessions"
    import_codex(store, root)
    reader = READERS["codex"]
    paths = _codex_paths(store)
    raws = read_blobs(store, list({c.meta["codex"]["raw"] for p in paths for _, c in p}))
    kept = 0
    for path in paths:
        new, old = Walk(), Walk()
        for cid, c in path:
            m = c.meta["codex"]
            if c.author in ("token_count", "turn_context", "session_meta"):
                assert isinstance(m[CODEX_USAGE], list) and not reader.needs_line(c, m)  # no line read
            before = {k: v for k, v in m.items() if k != CODEX_USAGE}  # as imported before
            d = json_loads(raws[m["raw"]]) if reader.needs_line(c, before) else None
            want = reader.read(old, cid, c, before, d if isinstance(d, dict) else None)
            assert reader.read(new, cid, c, m, None) == want
            kept += want is not None
    assert kept > 0
    r = usage(store, cache=False)
    if case != "old":
        assert (r.total.responses, r.total.tokens) == codex_truth(root)
    else:  # the growth of the total on each path: turns 1 2 3, rolled back to 1, then 4 5; the fork's 9
        # after the parent's 2; the subagent's 7
        assert r.total.responses == 7 and r.total.tokens.input == 100 + 100 + 100 + 300 + 100 + 900 - 200 + 700


def test_a_codex_session_imported_before_usage_was_kept_is_read_from_its_lines(store: castore.Store,
                                                                              tmp_path: Path) -> None:
    """A session whose import recorded no usage walk (imported before the importer kept usage)
    goes on without keeping it (the walk at its end is not known), and usage reads its lines."""
    root = _codex_rollback_case(tmp_path / "home")
    f = next(root.rglob("*0001.jsonl"))
    whole = f.read_bytes()
    cut = whole.index(b"question 3")
    cut = whole.rindex(b"\n", 0, cut) + 1
    f.write_bytes(whole[:cut])
    import_codex(store, f)
    s = next(store.session(*k) for k in store.session_refs() if k[0] == "codex")
    info = s.info
    s.set_info({**info, "codex": {k: v for k, v in info["codex"].items() if k != "walk"}})
    f.write_bytes(whole)
    import_codex(store, root)
    news = [le for le in s.log(all_branches=True) if le.meta["codex"]["o"] > info["codex"]["lines"]]
    assert news and all("u" not in le.meta["codex"] for le in news)
    assert (lambda r: (r.total.responses, r.total.tokens))(usage(store, cache=False)) == codex_truth(root)


def test_gemini_fixtures_count_each_message_once(store: castore.Store) -> None:
    """Gemini CLI appends a message again, whole, each time it changes: the copies holding
    ``tokens`` are one response (the fixtures of tests/data/gemini, built from gemini-cli's format)."""
    from castore.adapters.gemini import import_gemini

    root = DATA / "gemini" / "tmp"
    seen: dict[Any, Tokens] = {}
    for f in sorted(root.rglob("*.json*")):
        msgs = _lines(f) if f.suffix == ".jsonl" else json.loads(f.read_text()).get("messages", [])
        for d in msgs:
            tok = d.get("tokens")
            if d.get("type") == "gemini" and isinstance(tok, dict):
                seen.setdefault((d["id"], d.get("model")), Tokens(
                    tok["input"] - tok["cached"] + tok["tool"], tok["output"] + tok["thoughts"], tok["cached"], 0))
    want = Tokens()
    for t in seen.values():
        want.add(t)
    import_gemini(store, root)
    r = usage(store, by="model")
    assert (r.total.responses, r.total.tokens) == (len(seen), want)
    assert len(seen) == 6 and {g.name for g in r.groups} == {"gemini-2.5-pro", "gemini-2.5-flash"}
    # the shipped table prices Gemini's models: gemini-2.5-flash must not fall back to another row
    assert r.total.unpriced == 0 and r.total.cost > 0
    flash = load_prices().of("gemini-2.5-flash-lite")
    assert flash is not None and flash == load_prices().models["gemini-2.5-flash-lite"]
    # the importer keeps each message's usage in its commit's metadata: no line is read, and
    # what it keeps is what the raw line gives (the reader of a session imported before)
    from castore.adapters.jsonl_tree import read_blobs
    from castore.objects import json_loads
    from castore.usage import GEMINI_USAGE, READERS, Walk

    reader = READERS["gemini"]
    commits = [c for key, (_f, refs) in store.session_refs().items() for name, tip in refs.items()
               if name.startswith("heads/") for _cid, c in store.history.path(tip)]
    said = [c for c in commits if c.meta.get("gemini", {}).get("type") in ("gemini", "update")]
    lines = read_blobs(store, [c.meta["gemini"]["raw"] for c in said])
    assert len(said) >= 10
    for c in said:
        m = c.meta["gemini"]
        assert isinstance(m[GEMINI_USAGE], list) and not reader.needs_line(c, m)
        old = {k: v for k, v in m.items() if k != GEMINI_USAGE}
        assert reader.needs_line(c, old)
        assert reader.read(Walk(), "c", c, m, None) == reader.read(Walk(), "c", c, old, json_loads(lines[m["raw"]]))


# -- Pi and library appends ------------------------------------------------------------------------
def test_pi_real_files_match_their_assistant_usage(store: castore.Store, tmp_path: Path) -> None:
    seen: dict[tuple[Any, ...], Tokens] = {}
    for name in ("large-session.jsonl", "before-compaction.jsonl"):
        f = tmp_path / name
        f.write_bytes(lzma.decompress((DATA / "pi" / f"{name}.xz").read_bytes()))
        import_session(store, f, session_id=name.split(".")[0])
        for d in _lines(f):
            m = d.get("message") or {}
            u = m.get("usage")
            if d.get("type") == "message" and m.get("role") == "assistant" and isinstance(u, dict):
                t = Tokens(u.get("input", 0), u.get("output", 0), u.get("cacheRead", 0), u.get("cacheWrite", 0))
                if t.total:
                    seen.setdefault((m.get("timestamp"), m.get("model"), t.input, t.output, t.cache_read,
                                     t.cache_write), t)
    want = Tokens()
    for t in seen.values():
        want.add(t)
    r = usage(store, by="model")
    assert (r.total.responses, r.total.tokens) == (len(seen), want)
    assert len(seen) > 10 and all(g.name != "unknown" for g in r.groups)


def test_appended_usage_counts_once_across_a_fork_and_per_branch(store: castore.Store) -> None:
    s = store.session("agents", "u", "s1")
    s.append(Message(role="user", content="hi"))
    s.append(Message(role="assistant", content="hello"), meta={
        "model": "gpt-4.1", "usage": {"input_tokens": 100, "output_tokens": 10,
                                      "input_tokens_details": {"cached_tokens": 40}}})
    s.branch("retry", at="HEAD~1")
    s.append(Message(role="assistant", content="hey"), branch="retry", meta={
        "model": "gpt-4.1", "usage": {"prompt_tokens": 100, "completion_tokens": 7}})
    s.fork("s2")
    r = usage(store, by="branch")
    assert {g.name: g.responses for g in r.groups} == {"agents/u/s1:main": 1, "agents/u/s1:retry": 1}
    assert r.total.tokens == Tokens(160, 17, 40, 0)


def test_tokens_of_reads_each_vendor_shape() -> None:
    assert tokens_of({"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 7,
                      "cache_creation_input_tokens": 3}) == Tokens(5, 2, 7, 3)
    assert tokens_of({"input_tokens": 50, "cached_input_tokens": 20, "output_tokens": 4}) == Tokens(30, 4, 20, 0)
    assert tokens_of({"input": 1, "output": 2, "cacheRead": 3, "cacheWrite": 4}) == Tokens(1, 2, 3, 4)
    assert tokens_of({"nothing": 1}) is None and tokens_of("x") is None


def test_a_count_beyond_what_json_readers_agree_on_is_no_count_and_the_import_goes_on(
        store: castore.Store, tmp_path: Path) -> None:
    """A usage field of 2**70 tokens stopped the whole Claude import (msgpack stores 64 bits):
    it is now no count (0), as any malformed count is, and the line and the rest are stored."""
    assert tokens_of({"input_tokens": 2**70, "output_tokens": 2**53, "cache_read_input_tokens": 2**53 - 1}) \
        == Tokens(0, 0, 2**53 - 1, 0)
    src = DATA / "claude-code" / "claude-code-log" / "session_b.jsonl"
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    hit = next(d for d in lines if d.get("type") == "assistant" and "usage" in (d.get("message") or {}))
    hit["message"]["usage"]["input_tokens"] = 2**70
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "s.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    r = import_claude(store, tmp_path / "p")
    assert [x.lines for x in r] == [len(lines)]
    assert usage(store).total.tokens.input == 0 and usage(store).total.responses >= 1


def test_prices_match_dated_names_and_prefixes() -> None:
    p = Prices({"claude-opus-4-5": {"input": 5.0, "output": 25.0, "cache_read": 0.5, "cache_write": 6.25},
                "gpt-5.1-codex": {"input": 1.25, "output": 10.0, "cache_read": 0.125, "cache_write": 0.0}})
    assert p.of("claude-opus-4-5-20251101") == p.models["claude-opus-4-5"]
    assert p.of("gpt-5.1-codex-max") == p.models["gpt-5.1-codex"]
    assert p.of("openai/gpt-5.1-codex") == p.models["gpt-5.1-codex"]
    assert p.of("llama") is None and p.cost("llama", Tokens(1)) is None
    assert p.cost("claude-opus-4-5", Tokens(1_000_000, 0, 2_000_000, 0)) == pytest.approx(6.0)
    shipped = load_prices()
    assert shipped.date and shipped.source and shipped.of("claude-sonnet-4-5-20250929") is not None


# -- the cache and the command -------------------------------------------------------------------
def test_cache_follows_new_responses(store: castore.Store, tmp_path: Path) -> None:
    s = store.session("agents", "u", "s1")
    meta = {"model": "claude-sonnet-4-5", "usage": {"input_tokens": 10, "output_tokens": 1}}
    s.append(Message(role="assistant", content="a"), meta=meta)
    assert usage(store).total.responses == 1
    assert Path(tmp_path / "usage-cache.json").exists()
    s.append(Message(role="assistant", content="b"), meta=meta)
    assert usage(store).total.responses == 2
    store.delete_session("agents", "u", "s1")
    assert usage(store).total.responses == 0
    assert usage(store, cache=False).total.responses == 0


@pytest.mark.parametrize("scan_from", [0, 1 << 30], ids=["store-wide-pass", "path-by-path"])
def test_cache_counts_as_a_fresh_run_through_each_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         scan_from: int) -> None:
    # the cached report after each change equals a run that reads every session again, by
    # each grouping, whether the sessions that moved are read in the store-wide pass or
    # path by path: an import after the cache was written, a branch deleted, a session
    # deleted, a lost branch (named, left out, and the cache not saved with it)
    import castore.usage as usage_mod
    from castore.usage import GROUPS

    monkeypatch.setattr(usage_mod.cache, "SCAN_MIN_SESSIONS", scan_from)
    root = _projects(tmp_path)
    url = str(tmp_path / "store")
    import_claude(castore.open(url, durable=False), root)
    cache = tmp_path / "usage-cache.json"

    def both() -> dict[str, Any]:
        got = {by: usage(castore.open(url), by=by).to_json() for by in GROUPS}
        assert got == {by: usage(castore.open(url), by=by, cache=False).to_json() for by in GROUPS}
        return got

    before = both()
    assert cache.exists() and before["model"]["total"]["responses"] == claude_truth(root)[0]
    # an import after the cache was written: a new response at the end of a file
    main = root / "session-share" / f"{MAIN}.jsonl"
    lines = main.read_bytes().splitlines()
    d = json.loads(next(raw for raw in reversed(lines) if b'"type":"assistant"' in raw))
    last = next(json.loads(raw) for raw in reversed(lines) if b'"uuid"' in raw)
    d["parentUuid"], d["uuid"] = last["uuid"], "0f0e0d0c-0b0a-4909-8807-060504030201"
    d["message"]["id"] = "msg_added_after_the_cache"
    main.write_bytes(main.read_bytes() + json.dumps(d).encode() + b"\n")
    import_claude(castore.open(url, durable=False), root)
    grown = both()
    assert grown["model"]["total"]["responses"] == before["model"]["total"]["responses"] + 1
    # a branch deleted: its own responses leave the counts
    st = castore.open(url, durable=False)
    keys = sorted(st.session_refs_and_heads())
    forked = next(k for k in keys if len(st.session(*k).branches()) > 1)
    s = st.session(*forked)
    side = next(b for b in sorted(s.branches()) if b != s.current_branch)
    s.delete_branch(side, force=True)
    less = both()
    assert less["branch"] != grown["branch"]
    assert not any(r["name"].endswith(":" + side) for r in less["branch"]["rows"])
    # a session deleted
    gone = next(k for k in keys if k != forked)
    st.delete_session(*gone)
    after = both()
    assert "/".join(gone) not in {r["name"] for r in after["session"]["rows"]}
    # a lost branch: the session is named unreadable by both, its rows left out, no cache saved
    lost = st.session(*forked)
    st.refs.delete(lost.refs.branch(lost.current_branch))
    cache.unlink()
    res = CliRunner().invoke(cli_main, ["--store", url, "usage", "--by", "session", "--json"])
    assert res.exit_code == 1 and "/".join(forked) in res.output and not cache.exists()
    named = both()
    assert "/".join(forked) not in {r["name"] for r in named["session"]["rows"]}
    assert usage(castore.open(url)).unreadable.keys() == {"/".join(forked)}


def test_cache_follows_a_checkout(store: castore.Store) -> None:
    # a commit two branches hold is the checked-out branch's: HEAD moving to the other one
    # moves it there, though no branch moved
    s = store.session("agents", "u", "s1")
    s.append(Message(role="assistant", content="a"), meta={
        "model": "gpt-4.1", "usage": {"input_tokens": 10, "output_tokens": 1}})
    s.branch("other")

    def names(r: Any) -> dict[str, int]:
        return {g.name: g.responses for g in r.groups}

    assert names(usage(store, by="branch")) == {"agents/u/s1:main": 1}
    s.checkout("other")
    assert names(usage(store, by="branch", cache=False)) == {"agents/u/s1:other": 1}
    assert names(usage(store, by="branch")) == {"agents/u/s1:other": 1}
    s.checkout(s.resolve("HEAD"))  # detached: the first branch by name again
    assert names(usage(store, by="branch")) == names(usage(store, by="branch", cache=False)) \
        == {"agents/u/s1:main": 1}


def test_the_castore_process_prints_what_the_command_prints(store: castore.Store, tmp_path: Path) -> None:
    # `castore usage` ends its process without the interpreter's teardown: all its output is
    # there all the same, its cache saved, and a failure still fails
    import os
    import subprocess
    import sys

    import_claude(store, _projects(tmp_path))
    url = str(tmp_path / "store")
    want = CliRunner().invoke(cli_main, ["--store", url, "usage", "--by", "branch", "--json"], env={
        "CASTORE_USAGE_CACHE": str(tmp_path / "in-process.json")})
    assert want.exit_code == 0 and (tmp_path / "in-process.json").exists()
    env = {**os.environ, "CASTORE_USAGE_CACHE": str(tmp_path / "process.json")}
    for args in (["--by", "branch", "--json"], ["--by", "branch"]):
        got = subprocess.run([sys.executable, "-m", "castore", "--store", url, "usage", *args], env=env,
                             capture_output=True, text=True, check=False)
        want = CliRunner().invoke(cli_main, ["--store", url, "usage", *args])
        assert (got.returncode, got.stdout, got.stderr) == (0, want.stdout, want.stderr)
    assert (tmp_path / "process.json").read_bytes() == (tmp_path / "in-process.json").read_bytes()
    got = subprocess.run([sys.executable, "-m", "castore", "--store", url, "usage", "--since", "yesterday"],
                         env=env, capture_output=True, text=True, check=False)
    assert got.returncode == 1 and "not a day" in got.stderr


def test_an_encrypted_store_is_counted_but_never_cached(tmp_path: Path) -> None:
    from castore.crypto.keys import MasterKey

    with castore.open(str(tmp_path / "sealed"), encrypted=True, master_key=MasterKey.new()) as st:
        st.session("agents", "u", "s1").append(Message(role="assistant", content="a"), meta={
            "model": "gpt-4.1", "usage": {"input_tokens": 10, "output_tokens": 2}})
        assert usage(st).total.tokens == Tokens(10, 2, 0, 0)
        assert not list(tmp_path.glob("usage-cache.json*"))


def test_tenants_layout_is_counted_tenant_by_tenant(tmp_path: Path) -> None:
    meta = {"model": "gpt-4.1", "usage": {"input_tokens": 10, "output_tokens": 2}}
    with castore.open(str(tmp_path / "t"), layout="tenants") as st:
        for user in ("alice", "bob"):
            st.session("agents", user, "s1").append(Message(role="assistant", content="a"), meta=meta)
        r = usage(st, by="project")
        assert {g.name: g.responses for g in r.groups} == {"agents/alice": 1, "agents/bob": 1}
        assert len(list(tmp_path.glob("usage-cache.json.*"))) == 2  # a cache per tenant
        st.session("agents", "bob", "s2").append(Message(role="assistant", content="b"), meta=meta)
        assert usage(st).total.responses == 3


def test_tenants_whose_names_join_alike_keep_caches_of_their_own(tmp_path: Path) -> None:
    # a tenant's cache was named by its segments joined with "-": a-b/c and a/b-c shared one file,
    # each run writing over the other's; and two long names made a file name too long to write
    meta = {"model": "gpt-4.1", "usage": {"input_tokens": 10, "output_tokens": 2}}
    long = "x" * 200
    tenants = (("a-b", "c"), ("a", "b-c"), (long, long))
    with castore.open(str(tmp_path / "t"), layout="tenants") as st:
        for app, user in tenants:
            st.session(app, user, "s1").append(Message(role="assistant", content="a"), meta=meta)
        assert usage(st).total.responses == 3
        caches = sorted(tmp_path.glob("usage-cache.json.*"))
        assert len(caches) == 3
        stamps = [c.stat().st_mtime_ns for c in caches]
        assert usage(st).total.responses == 3  # every tenant from its own cache: none written again
        assert [c.stat().st_mtime_ns for c in caches] == stamps


def test_the_usage_command_gives_its_caller_the_collector_back(store: castore.Store, tmp_path: Path) -> None:
    # castore usage runs with the collector paused (its decoded commits hold no cycles); run
    # in a caller's own process (CliRunner, as a library user calls the CLI) it left the
    # collector off for the rest of that process
    import gc

    store.session("app", "user", "s").append(Message(role="user", content="hi"))
    bad = tmp_path / "prices.json"
    bad.write_text("not a price table")
    assert gc.isenabled()
    for args, code in ((["usage"], 0), (["usage", "--json"], 0), (["usage", "--prices", str(bad)], 1)):
        res = CliRunner().invoke(cli_main, ["--store", str(tmp_path / "store"), *args])
        assert res.exit_code == code and gc.isenabled(), (args, res.output)


def test_cli_table_json_prices_and_errors(store: castore.Store, tmp_path: Path) -> None:
    root = _projects(tmp_path)
    import_claude(store, root)
    url = str(tmp_path / "store")
    runner = CliRunner()
    res = runner.invoke(cli_main, ["--store", url, "usage", "--by", "model"])
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[0].split()[:2] == ["MODEL", "RESPONSES"]
    assert "claude-opus-4-5-20251101" in res.stdout and res.stdout.splitlines()[-1].startswith("total")
    res = runner.invoke(cli_main, ["--store", url, "usage", "--json", "--by", "day"])
    doc = json.loads(res.stdout)
    assert doc["by"] == "day" and doc["total"]["responses"] == claude_truth(root)[0]
    table = tmp_path / "prices.json"
    table.write_text(json.dumps({"models": {"claude-opus-4-5": {"input": 0, "output": 0, "cache_read": 0,
                                                                "cache_write": 1000000}}}))
    res = runner.invoke(cli_main, ["--store", url, "usage", "--json", "--prices", str(table)])
    doc = json.loads(res.stdout)
    opus = next(r for r in doc["rows"] if r["name"].startswith("claude-opus"))
    assert opus["cost"] == pytest.approx(opus["cache_write"])
    assert next(r for r in doc["rows"] if r["name"].startswith("claude-haiku"))["unpriced_responses"] > 0
    table.write_text("{not json")
    res = runner.invoke(cli_main, ["--store", url, "usage", "--prices", str(table)])
    assert res.exit_code == 1 and res.stderr.startswith("Error: ") and "not JSON" in res.stderr
    res = runner.invoke(cli_main, ["--store", url, "usage", "--since", "yesterday"])
    assert res.exit_code == 1 and "not a day" in res.stderr
    for day in ("2025-13-01", "2025-02-30"):  # the shape of a day, no day of the calendar
        res = runner.invoke(cli_main, ["--store", url, "usage", "--until", day])
        assert res.exit_code == 1 and res.stderr == f"Error: not a day (YYYY-MM-DD): {day!r}\n"
    res = runner.invoke(cli_main, ["--store", url, "usage", "--by", "hour"])
    assert res.exit_code == 2
    # an import brings the cache up to date (as the search index), so usage reads no session after it
    extra = tmp_path / "more"
    _cases().claude_case(extra, "resume")
    res = runner.invoke(cli_main, ["--store", url, "import", "claude", str(extra / "projects")])
    assert res.exit_code == 0 and "usage cache updated" in res.stderr
    cached = json.loads((tmp_path / "usage-cache.json").read_text())
    assert any(v["key"][2] == "11111111-1111-4111-8111-111111111111" for v in cached["sessions"].values())
    with pytest.raises(UsageError):
        usage(store, by="hour")


def test_an_import_makes_no_usage_cache_and_updates_one_usage_made(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # an import never pays for a usage cache nobody asked for: the first `castore usage` makes
    # it; an import after that brings it up to date, so the usage after it reads no session
    import castore.usage as usage_mod

    url, cache = str(tmp_path / "store"), tmp_path / "usage-cache.json"
    projects = _projects(tmp_path)
    res = CliRunner().invoke(cli_main, ["--store", url, "import", "claude", str(projects)])
    assert res.exit_code == 0 and "usage cache" not in res.stderr and not cache.exists()
    usage(castore.open(url), by="branch")
    assert cache.exists()
    res = CliRunner().invoke(cli_main, ["--store", url, "import", "claude", str(projects)])
    assert res.exit_code == 0 and "usage cache updated" in res.stderr
    want = usage(castore.open(url), by="branch", cache=False).to_json()
    monkeypatch.setattr(usage_mod.cache, "session_rows", lambda *a, **k: pytest.fail("a session read: the cache is fresh"))
    assert usage(castore.open(url), by="branch").to_json() == want


@pytest.mark.parametrize("price", ['"x"', "-1", "1e400", "1" + "0" * 400, "true", "null", "[1]"])
def test_a_price_table_with_a_bad_price_is_refused(tmp_path: Path, price: str) -> None:
    # a negative, infinite or huge price made a negative or infinite cost (exit 0) before
    table = tmp_path / "prices.json"
    table.write_text('{"models": {"claude-opus-4": {"input": ' + price + ', "output": 1}}}')
    with pytest.raises(UsageError, match="needs numbers of 0 or more"):
        load_prices(str(table))


def test_a_price_table_with_a_misspelt_key_is_refused(store: castore.Store, tmp_path: Path) -> None:
    # {"inptu": 5} priced the model at 0 without a word before
    table = tmp_path / "prices.json"
    table.write_text('{"models": {"claude-opus-4": {"inptu": 5, "output": 1}}}')
    with pytest.raises(UsageError, match="'inptu', not one of input, output, cache_read, cache_write"):
        load_prices(str(table))
    store.session("app", "u", "s").append(castore.Message("user", "hi"))
    res = CliRunner().invoke(cli_main, ["--store", str(tmp_path / "store"), "usage", "--prices", str(table)])
    assert res.exit_code == 1 and res.stdout == "" and len(res.stderr.splitlines()) == 1
    assert res.stderr.startswith("Error: the price table")


def test_a_damaged_session_is_left_out_and_named_the_others_counted(tmp_path: Path) -> None:
    # the real files, the second import's pack damaged: `usage` stopped at the first unreadable
    # session ("Error: object ... not found") and counted none; now the others are counted, the
    # damaged ones named (stdout: the table or JSON; stderr: one Error line, the last; exit 1),
    # and no cache is saved that would say they were read
    from castore.adapters.claude_code import import_claude

    data = Path(__file__).resolve().parent / "data" / "claude-code"
    url = str(tmp_path / "store")
    with castore.open(url) as st:
        import_claude(st, data / "session-share")
        packs = set((tmp_path / "store" / "packs").glob("*.pack"))
        import_claude(st, data / "claude-code-log")
        whole = {g.name for g in usage(st, by="session", cache=False).groups}
    (damaged,) = set((tmp_path / "store" / "packs").glob("*.pack")) - packs
    b = bytearray(damaged.read_bytes())
    for i in range(len(b) // 3, len(b) // 3 + 40):
        b[i] ^= 0xFF
    damaged.write_bytes(bytes(b))
    for args in (["usage", "--by", "session", "--json"], ["usage", "--by", "session"]):
        res = CliRunner().invoke(cli_main, ["--store", url, *args])
        assert res.exit_code == 1, res.output
        err = res.stderr.splitlines()
        assert [ln for ln in err if ln.startswith("Error: ")] == err[-1:]
        # one damaged session or several (a batch writes blocks by kind, so the damage may hit one)
        assert re.search(r"cannot be read and (is|are) left out of the counts", err[-1]) and "castore fsck" in err[-1]
        if "--json" in args:
            doc = json.loads(res.stdout)
            bad = {u["session"] for u in doc["unreadable"]}
            assert bad and all(u["error"] for u in doc["unreadable"])
            counted = {r["name"] for r in doc["rows"]}
            assert counted and counted == whole - bad  # every readable session, as before the damage
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            assert err[-1].startswith(f"Error: {min(bad)}{more} cannot be read")
        else:
            assert res.stdout.splitlines()[-1].split()[:2] == ["total", str(doc["total"]["responses"])]
    assert not (tmp_path / "usage-cache.json").exists()
