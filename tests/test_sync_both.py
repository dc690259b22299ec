"""`castore sync` and :func:`castore.sync.both_ways`: pull then push, between local stores and an
S3 bucket (moto on 127.0.0.1), as a laptop and a second machine sharing one bucket do.

What is checked: each side's new entries reach the other; a remote without a store is
created; a branch that moved on both sides is overwritten on neither, reported once with
commands that settle it (and they do), and the command exits 1; ``--json``.
"""

from __future__ import annotations

import json
import shlex
import uuid
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore import Message, sync
from castore.cli import main as cli

KEY = ("claude", "proj", "0ccf1a04-aaaa")


def _cli(store: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", store, *args], catch_exceptions=False)


@pytest.fixture
def bucket(moto_server: Any) -> tuple[str, list[str]]:
    """A fresh prefix of the test bucket, with the `-o` options that reach it."""
    opts = ["-o", f"endpoint_url={moto_server.endpoint_url}", "-o", "key=testkey", "-o", "secret=testsecret",
            "-o", "client_kwargs.region_name=us-east-1"]
    return f"s3://castore-tests/{uuid.uuid4().hex}", opts


def _machine(tmp_path: Any, name: str, bucket: tuple[str, list[str]]) -> str:
    """A local store (one machine's archive) with the bucket as remote origin."""
    url = str(tmp_path / name)
    r = _cli(url, "remote", "add", "origin", bucket[0], *bucket[1])
    assert r.exit_code == 0, r.output
    return url


def _say(url: str, text: str, key: tuple[str, str, str] = KEY) -> str:
    with castore.open(url) as st:
        return st.session(*key).append(Message(role="user", content=text))


def _texts(url: str, key: tuple[str, str, str] = KEY, rev: str = "HEAD") -> list[str]:
    with castore.open(url) as st:
        return [e.entry.content for e in st.session(*key).log(rev)][::-1]


def _tip(url: str, key: tuple[str, str, str] = KEY, branch: str = "main") -> str | None:
    with castore.open(url) as st:
        return st.session(*key).branches().get(branch)


def test_two_machines_share_one_bucket(tmp_path: Any, bucket: tuple[str, list[str]]) -> None:
    laptop = _machine(tmp_path, "laptop", bucket)
    _say(laptop, "hello from the laptop")
    r = _cli(laptop, "sync")
    assert r.exit_code == 0, r.output
    assert "held no store: created" in r.stderr and f"pushed   sessions/claude/proj/{KEY[2]}/heads/main" in r.stdout

    desk = _machine(tmp_path, "desk", bucket)
    r = _cli(desk, "sync")
    assert r.exit_code == 0, r.output
    assert _texts(desk) == ["hello from the laptop"]

    # each side adds to its own sessions: one sync each brings both up to date
    _say(desk, "the desk goes on")
    other = ("claude", "proj", "5e55-b")
    _say(laptop, "a second session", other)
    assert _cli(desk, "sync").exit_code == 0
    r = _cli(laptop, "sync", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["diverged"] == [] and doc["remote"] == "origin"
    assert f"sessions/claude/proj/{KEY[2]}/heads/main" in doc["pulled"]["refs_updated"]
    assert _texts(laptop) == ["hello from the laptop", "the desk goes on"]
    assert _cli(desk, "sync").exit_code == 0
    assert _texts(desk, other) == ["a second session"]
    # nothing new: nothing sent either way
    doc = json.loads(_cli(desk, "sync", "--json").stdout)
    assert doc["pulled"]["objects_sent"] == doc["pushed"]["objects_sent"] == 0 and doc["ok"]

    # --app (and --user) narrow it: another app's session stays here
    _say(desk, "elsewhere", ("weather", "alice", "w1"))
    _say(desk, "more", other)
    r = _cli(desk, "sync", "--app", "claude", "--user", "proj")
    assert r.exit_code == 0 and "weather" not in r.stdout and "5e55-b/heads/main" in r.stdout
    with castore.open(bucket[0], **_opts(bucket)) as remote:
        assert remote.apps() == ["claude"]
    assert _cli(desk, "sync", "--user", "proj").exit_code == 2


def test_divergence_is_reported_never_overwritten(tmp_path: Any, bucket: tuple[str, list[str]]) -> None:
    laptop = _machine(tmp_path, "laptop", bucket)
    desk = _machine(tmp_path, "desk", bucket)
    _say(laptop, "shared start")
    assert _cli(laptop, "sync").exit_code == 0
    assert _cli(desk, "sync").exit_code == 0
    _say(desk, "desk went on")
    assert _cli(desk, "sync").exit_code == 0
    _say(laptop, "laptop went on")
    mine, theirs = _tip(laptop), _tip(desk)

    r = _cli(laptop, "sync")
    assert r.exit_code == 1, r.output
    assert _tip(laptop) == mine and _tip(desk) == theirs  # neither side overwritten
    with castore.open(bucket[0], **_opts(bucket)) as remote:
        assert remote.session(*KEY).branches()["main"] == theirs
    err = r.stderr
    assert err.count("diverged: branch 'main' of session claude/proj/0ccf1a04-aaaa") == 1
    assert "theirs is kept here as remotes/origin/main" in err
    assert f"castore push origin -s {'/'.join(KEY)} --force --store {laptop}" in err

    # the report is the same on a second run (the remote tip was kept by the first)
    doc = json.loads(_cli(laptop, "sync", "--json").stdout)
    assert not doc["ok"] and len(doc["diverged"]) == 1
    d = doc["diverged"][0]
    assert (d["kind"], d["name"], d["session"], d["local"], d["remote"], d["kept_as"]) == (
        "branch", "main", list(KEY), mine, theirs, "remotes/origin/main")
    assert set(d["resolve"]) == {"compare", "keep both", "keep yours", "keep theirs"}

    # "keep both", run as printed: theirs becomes main, ours a branch beside it, and the sync passes
    for cmd in d["resolve"]["keep both"].split(" && "):
        words = shlex.split(cmd)
        assert words[0] == "castore"
        r = CliRunner().invoke(cli, words[1:], catch_exceptions=False)
        assert r.exit_code == 0, (cmd, r.output)
    assert _tip(laptop) == theirs and _tip(laptop, branch="main-local") == mine
    assert _cli(desk, "sync").exit_code == 0
    assert _tip(desk, branch="main-local") == mine and _tip(desk) == theirs


def _opts(bucket: tuple[str, list[str]]) -> dict[str, Any]:
    from castore.cli.common import parse_options

    return parse_options(tuple(bucket[1][1::2]))


def test_both_ways_library(tmp_path: Any, moto_server: Any) -> None:
    """The library call: local folder <-> bucket, a label that differs is a divergence too."""
    remote = castore.open(f"s3://castore-tests/{uuid.uuid4().hex}", **moto_server.storage_options)
    a = castore.open(str(tmp_path / "a"))
    b = castore.open(str(tmp_path / "b"))
    with remote, a, b:
        with pytest.raises(castore.StoreNotFound):
            sync.both_ways(castore.open(str(tmp_path / "none")), remote)
        s = a.session(*KEY)
        s.append(Message(role="user", content="one"))
        first = sync.both_ways(a, remote)
        assert first.ok and first.remote_created and first.pulled.objects_sent == 0
        rep = sync.both_ways(b, remote)  # b has no store yet: the pull makes it
        assert rep.ok and b.session(*KEY).messages()[0].content == "one"
        s.label("good")
        b.session(*KEY).label("good", at=b.session(*KEY).append(Message(role="user", content="two")))
        assert sync.both_ways(b, remote).ok
        rep = sync.both_ways(a, remote)
        assert not rep.ok
        labels = [d for d in rep.diverged if d.kind == "label"]
        assert [(d.name, d.kept_as) for d in labels] == [("good", None)]
        assert s.labels()["good"] != b.session(*KEY).labels()["good"]  # not overwritten
        assert a.session(*KEY).messages()[-1].content == "two"  # main fast-forwarded all the same


# -- import --follow --sync ------------------------------------------------------------------------
SHARE = __import__("pathlib").Path(__file__).resolve().parent / "data" / "claude-code" / "session-share"
SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


def _heads(url: str, **options: Any) -> dict[tuple[str, str, str], dict[str, str]]:
    """Every session's branches and their tips (HEAD is created by a sync, never moved)."""
    with castore.open(url, **options) as st:
        return {(s.app, s.user, s.session): st.session(s.app, s.user, s.session).branches()
                for app in st.apps() for s in st.sessions(app)}


def test_import_follow_keeps_the_remote_current(tmp_path: Any, bucket: tuple[str, list[str]],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Each round that imported something is synced; a round with nothing new is not;
    Ctrl-C (here raised where the loop waits) ends it with both sides equal."""
    from castore.adapters import follow

    laptop = _machine(tmp_path, "laptop", bucket)
    proj = tmp_path / "projects" / "p"
    proj.mkdir(parents=True)
    full = (SHARE / f"{SID}.jsonl").read_bytes()
    cut = full.index(b"\n", len(full) // 2) + 1
    (proj / f"{SID}.jsonl").write_bytes(full[:cut])
    remote_heads: list[dict[Any, Any]] = []

    def waits() -> Any:
        remote_heads.append(_heads(bucket[0], **_opts(bucket)))  # what the remote held after round 1
        yield
        (proj / f"{SID}.jsonl").write_bytes(full)  # the agent writes on
        yield
        yield  # a round with nothing new
        raise KeyboardInterrupt

    steps = waits()
    monkeypatch.setattr(follow.time, "sleep", lambda _s: next(steps))
    r = _cli(laptop, "import", "claude", str(proj), "--follow", "--interval", "0.01", "--sync", "origin")
    assert r.exit_code == 0, r.output
    assert r.stderr.count("synced with origin") == 2 and "stopped" in r.stderr
    assert remote_heads[0] and remote_heads[0] != _heads(laptop)  # the first round was synced at once
    assert _heads(bucket[0], **_opts(bucket)) == _heads(laptop)  # and the second too

    # without --follow: nothing new, no sync
    r = _cli(laptop, "import", "claude", str(proj), "--sync", "origin")
    assert r.exit_code == 0 and "0 new lines" in r.stderr and "synced with" not in r.stderr
    # one import that brought something: one sync, and the remote has it
    codex = tmp_path / "codex"
    codex.mkdir()
    (codex / "rollout.jsonl").write_bytes((SHARE.parent.parent / "codex" / "sample_codex_session.jsonl").read_bytes())
    r = _cli(laptop, "import", "codex", str(codex), "--sync", "origin")
    assert r.exit_code == 0 and r.stderr.count("synced with origin") == 1, r.output
    assert _heads(bucket[0], **_opts(bucket)) == _heads(laptop)


def test_a_short_session_id_not_on_the_remote_is_named_there(tmp_path: Any) -> None:
    # `castore pull R -s 019b` of a session this store holds and R does not said "session
    # */*/019b not found", as if the local store lacked it: the short id is looked up in R
    local, remote = str(tmp_path / "local"), str(tmp_path / "remote")
    with castore.open(local) as st:
        st.session("codex", "local", "019b64e5-thread").append(Message(role="user", content="hi"))
    assert _cli(remote, "init").exit_code == 0
    r = _cli(local, "pull", remote, "-s", "019b")
    assert r.exit_code == 1 and r.stderr.splitlines() == [f"Error: session */*/019b not found in {remote}"]
    r = _cli(local, "push", remote, "-s", "019b")  # a push finds it here, where it is read
    assert r.exit_code == 0 and "2 refs updated" in r.stderr
    assert _cli(local, "pull", remote, "-s", "019b").exit_code == 0
