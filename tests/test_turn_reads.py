"""What an agent reads every turn, read from the tip and kept by the handle (castore.pathview,
castore.context.project_from_tip): the budgeted context, ``log -n`` and the newest entries
equal what a read of the whole path gives, on fresh and warm handles, while other handles
and other processes append, and after resets, checkouts and branches."""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import castore
from castore import BranchSummary, Compaction, Custom, Message, ModelChange
from castore.context import MAX_FACT_SYSTEMS, Context, PathFacts, facts_of, project, project_from_tip
from castore.entries import LogEntry
from castore.history import Hint, K

ROOT = Path(__file__).resolve().parent.parent


def same(a: Context, b: Context) -> bool:
    return (repr(a.messages), a.commits, a.tokens, a.model, a.provider, a.thinking_level, a.dropped) == \
        (repr(b.messages), b.commits, b.tokens, b.model, b.provider, b.thinking_level, b.dropped)


def random_entry(rng: random.Random, ids: list[str]) -> Any:
    r = rng.random()
    if r < 0.45:
        role = rng.choice(["user", "assistant", "assistant", "tool", "system", "developer"])
        return Message(role=role, content="x" * rng.randint(0, 600),
                       tool_call_id="c" if role == "tool" or rng.random() < 0.05 else None)
    if r < 0.6:
        extra = {"model": f"m{rng.randint(0, 9)}", "provider": "p"} if rng.random() < 0.5 else {}
        return Message(role="assistant", content="y" * rng.randint(0, 80), extra=extra,
                       tool_calls=[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}])
    if r < 0.72:
        return Message(role="tool", content="z" * rng.randint(0, 1500), tool_call_id="c")
    if r < 0.77:
        return ModelChange(model=rng.choice([None, "a", "b"]), provider=rng.choice([None, "q"]),
                           thinking_level=rng.choice([None, "high"]))
    if r < 0.81 and ids:
        return Compaction(summary="s" * rng.randint(0, 300), first_kept=rng.choice([*ids, None]), tokens_before=0)
    if r < 0.85:
        return BranchSummary(summary=rng.choice(["", "went elsewhere"]), from_id=None)
    return Custom("note", {"n": rng.randint(0, 9)})


BUDGETS = [dict(max_tokens=0), dict(max_tokens=300), dict(max_tokens=8000), dict(max_messages=3),
           dict(max_tokens=2000, max_messages=20, tool_output_limit=50), dict(max_messages=1, tool_output_limit=0)]


def check_reads(s: castore.Session, rng: random.Random) -> None:
    """Every per-turn read of ``s`` at HEAD equals its whole-path oracle."""
    whole = s.entries()
    budget = rng.choice(BUDGETS)
    assert same(s.context(**budget), project(whole, **budget))
    n = rng.randint(1, 2 * K + 5)
    assert [e.id for e in s.log(limit=n)] == [e.id for e in reversed(whole[-n:])]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 20))
def test_turn_reads_equal_whole_path_reads_on_random_sessions(tmp_path: Path, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    url = str(tmp_path / uuid.uuid4().hex)
    with castore.open(url) as store:
        warm = store.session("app", "u", "s")
        ids: list[str] = []
        for _ in range(steps):
            op = rng.random()
            if op < 0.7 or not ids:
                ids.extend(warm.append_many([random_entry(rng, ids) for _ in range(rng.randint(1, 70))]))
            elif op < 0.8:
                warm.reset(rng.choice(ids))
                ids = [e.id for e in warm.entries()]
            elif op < 0.9:
                name = f"b{rng.randint(0, 3)}"
                if warm.current_branch == name:
                    warm.reset(rng.choice(ids))
                else:
                    warm.branch(name, at=rng.choice(ids), force=True)
                    warm.checkout(name)
                ids = [e.id for e in warm.entries()]
            else:
                warm.checkout("main")
                ids = [e.id for e in warm.entries()]
            check_reads(warm, rng)
            with castore.open(url) as again:  # a fresh handle
                check_reads(again.session("app", "u", "s"), rng)


def test_project_from_tip_equals_project_on_random_paths() -> None:
    for seed in range(400):
        rng = random.Random(seed)
        entries: list[LogEntry] = []
        for d in range(rng.randint(1, 400)):
            e = random_entry(rng, [x.id for x in entries])
            entries.append(LogEntry(id=castore.ObjectId(f"{d:064x}"), kind="x", entry=e, parents=(), depth=d))
        budget = rng.choice(BUDGETS)
        got = project_from_tip(facts_of(entries), lambda lo, hi, es=entries: es[lo:hi + 1], **budget)
        assert got is not None and same(got, project(entries, **budget)), seed


def test_budgeted_context_of_a_long_session_reads_only_its_end_and_its_system_message() -> None:
    entries = [LogEntry(id=castore.ObjectId(f"{d:064x}"), kind="message", parents=(), depth=d,
                        entry=Message(role="system" if d == 0 else ("user", "assistant")[d % 2], content="w" * 200))
               for d in range(20_000)]
    touched: set[int] = set()

    def read(lo: int, hi: int) -> list[LogEntry]:
        touched.update(range(lo, hi + 1))
        return entries[lo:hi + 1]

    got = project_from_tip(facts_of(entries), read, max_tokens=8000)
    assert got is not None and same(got, project(entries, max_tokens=8000))
    assert got.messages[0].role == "system" and got.dropped > 19_000
    assert len(touched) < 400 and 0 in touched


def test_the_writer_keeps_the_path_facts_in_the_ref(local_store: castore.Store) -> None:
    s = local_store.session("a", "u", "s")
    rng = random.Random(7)
    kept_some = 0
    for _ in range(8):
        batch = [random_entry(rng, []) for _ in range(40)]
        s.append_many([e for e in batch if not (isinstance(e, Message) and e.role in ("system", "developer"))
                       or rng.random() < 0.1])
        s.append(Message(role="user", content="hi"))
        whole = s.entries()
        ref = local_store.refs.read(s.refs.branch("main"))
        assert ref is not None
        hint = Hint.from_meta(ref.meta)
        kept = hint.facts if hint is not None else None
        want = facts_of(whole)
        if want.compaction >= 0 or len(want.system) > MAX_FACT_SYSTEMS:
            assert kept is None  # not known without reading: a reader computes them
        else:
            assert kept == want
            kept_some += 1
    assert kept_some


def test_facts_in_ref_metadata_are_checked() -> None:
    good = PathFacts(depth=9, messages=3, system=(0, 4), user=7, model="m")
    meta = good.to_meta()
    assert meta is not None and PathFacts.from_meta(meta) == good
    for bad in [{**meta, "d": "9"}, {**meta, "s": [4, 0]}, {**meta, "n": 11}, {**meta, "u": 10},
                {**meta, "m": 3}, {**meta, "s": [True]}, [], None]:
        assert PathFacts.from_meta(bad) is None


def test_a_warm_handle_sees_what_another_handle_appended(backend: Any) -> None:
    with backend.open() as one, backend.open() as two:
        a, b = one.session("a", "u", "s"), two.session("a", "u", "s")
        a.append_many([Message(role="system", content="rules")] +
                      [Message(role=("user", "assistant")[i % 2], content=f"m{i} " * 40) for i in range(150)])
        for round_ in range(4):
            writer, reader = (a, b) if round_ % 2 else (b, a)
            reader.context(max_tokens=500)  # warm the reader
            writer.append_many([Message(role="user", content=f"r{round_}-{i}") for i in range(K + 3)])
            whole = writer.entries()
            for h in (a, b):
                assert same(h.context(max_tokens=500), project(whole, max_tokens=500))
                assert [e.id for e in h.log(limit=5)] == [e.id for e in reversed(whole[-5:])]
        b.reset("HEAD~100")
        whole = b.entries()
        assert same(a.context(max_tokens=500), project(whole, max_tokens=500))
        assert a.log(limit=1)[0].id == whole[-1].id


def test_a_warm_handle_sees_what_another_process_appended(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    with castore.open(url) as store:
        s = store.session("a", "u", "s")
        s.append_many([Message(role=("user", "assistant")[i % 2], content=f"m{i}") for i in range(100)])
        before = s.context(max_tokens=300)
        code = ("import castore, sys\n"
                "with castore.open(sys.argv[1]) as st:\n"
                "    s = st.session('a', 'u', 's')\n"
                "    s.append_many([castore.Message(role='user', content=f'other {i}') for i in range(70)])\n"
                "    s.append(castore.ModelChange(model='theirs'))\n")
        subprocess.run([sys.executable, "-c", code, url], check=True, cwd=ROOT)
        after = s.context(max_tokens=300)
        whole = s.entries()
        assert not same(before, after) and same(after, project(whole, max_tokens=300))
        assert after.model == "theirs" and s.log(limit=2)[0].kind == "model_change"


def test_log_of_any_revision_and_long_parent_steps_equal_the_whole_path(backend: Any) -> None:
    with backend.open() as store:
        s = store.session("a", "u", "s")
        ids = s.append_many([Message(role="user", content=f"m{i}") for i in range(3 * K + 7)])
        s.branch("side", at=ids[K + 3])
        s.checkout("side")
        side = s.append_many([Message(role="user", content=f"side {i}") for i in range(5)])
        s.checkout("main")
        rng = random.Random(3)
        for rev in [ids[0], ids[K], ids[2 * K + 1], ids[-1], side[-1], side[2], "side~3", "main~100", "HEAD~17",
                    "HEAD~" + str(len(ids) - 1)]:
            whole = s.entries(rev)
            n = rng.randint(1, 2 * K)
            assert [e.id for e in s.log(rev, limit=n)] == [e.id for e in reversed(whole[-n:])], rev
            assert s.resolve(rev) == whole[-1].id
        with pytest.raises(castore.RevisionNotFound):
            s.log(f"HEAD~{len(ids)}", limit=3)


def test_a_store_written_without_path_facts_reads_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "store")
    rng = random.Random(11)
    with monkeypatch.context() as m:  # a writer that keeps no facts in the ref (an older castore)
        m.setattr(PathFacts, "to_meta", lambda self: None)
        with castore.open(url) as store:
            s = store.session("a", "u", "s")
            ids: list[str] = []
            for _ in range(6):
                ids.extend(s.append_many([random_entry(rng, ids) for _ in range(60)]))
    for budget in BUDGETS:
        with castore.open(url) as store:
            s = store.session("a", "u", "s")
            whole = s.entries()
            fresh = store.session("a", "u", "s")
            assert same(fresh.context(**budget), project(whole, **budget))
            assert same(fresh.context(**budget), project(whole, **budget))  # warm
