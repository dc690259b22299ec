"""Sessions found the way short commit ids are (a unique prefix, or the id without APP/USER),
and shell completion of sessions and branches, through click's own completion API."""

from __future__ import annotations

from typing import Any

import pytest
from click.shell_completion import ShellComplete
from click.testing import CliRunner

import castore
from castore import AmbiguousSession, Message, SessionNotFound, porcelain
from castore.cli import main as cli

LONG = "z" * 250  # too long for its key: kept as a digest, its name on HEAD
KEYS = [("claude", "proj", "0ccf1a04-1b4c"), ("claude", "proj", "0ccf9999-aaaa"), ("codex", "local", "0ccf1a04-1b4c"),
        ("codex", "local", "5e55-Upper"), ("claude", "other", LONG),
        ("claude", "proj", "0ccf9999-aaaa.subagents.agent-a1")]  # a subagent, named after its session


@pytest.fixture(params=["flat", "tenants"])
def url(tmp_path: Any, request: pytest.FixtureRequest) -> str:
    """A store on local disk with the sessions of KEYS, in either layout."""
    u = str(tmp_path / "store")
    with castore.open(u, layout=request.param) as st:
        for k in KEYS:
            s = st.session(*k)
            s.append(Message(role="user", content=f"hello {k[2][:8]}"))
            s.branch("retry")
            s.label("good")
    return u


def test_find_session_by_prefix_or_id_alone(url: str) -> None:
    with castore.open(url) as st:
        assert set(porcelain.session_keys(st)) == set(KEYS)
        assert porcelain.session_keys(st, "codex") == sorted(k for k in KEYS if k[0] == "codex")
        assert porcelain.find_session(st, "5e55") == ("codex", "local", "5e55-Upper")
        assert porcelain.find_session(st, "zzz") == KEYS[4]
        assert porcelain.find_session(st, "0ccf9") == KEYS[1]  # its subagent does not make it ambiguous
        assert porcelain.find_session(st, "0ccf9999-aaaa.s") == KEYS[5]
        # the same id in two apps: alone it is ambiguous, with APP/USER it is not
        with pytest.raises(AmbiguousSession) as e:
            porcelain.find_session(st, "0ccf1a04-1b4c")
        assert sorted(e.value.candidates) == [KEYS[0], KEYS[2]]
        assert porcelain.find_session(st, "0ccf1a04", "codex", "local") == KEYS[2]
        assert porcelain.find_session(st, "0ccf1a04-1b4c", "claude", "proj") == KEYS[0]
        with pytest.raises(AmbiguousSession) as e:
            porcelain.find_session(st, "0ccf", "claude", "proj")
        assert "claude/proj/0ccf1a04-1b4c, claude/proj/0ccf9999-aaaa" in str(e.value)
        with pytest.raises(SessionNotFound):
            porcelain.find_session(st, "nope")
        with pytest.raises(SessionNotFound):
            porcelain.find_session(st, "5e55", "claude", "proj")


def test_a_rewritten_files_newest_version_is_the_session_its_id_means(tmp_path: Any) -> None:
    # any agent's file imported again as ID.v2, ID.v3 (rewritten under it): the id alone or a
    # prefix means the newest, a version named in full or the full key each one
    with castore.open(str(tmp_path / "s")) as st:
        for sid in ("ab12", "ab12.v2", "ab12.v3", "ab12.subagents.agent-x", "ab12.v10x"):
            st.session("claude", "p", sid).append(Message(role="user", content="hi"))
        assert porcelain.find_session(st, "ab12") == ("claude", "p", "ab12.v3")
        assert porcelain.find_session(st, "ab") == ("claude", "p", "ab12.v3")
        assert porcelain.find_session(st, "ab12.v2") == ("claude", "p", "ab12.v2")
        assert porcelain.find_session(st, "ab12", "claude", "p") == ("claude", "p", "ab12")
    assert [porcelain.file_version(x) for x in ("a.v2", "a.v10", "a.v1", "a.v02", "a.vx", "a", ".v2")] == \
        [("a", 2), ("a", 10), ("a.v1", 1), ("a.v02", 1), ("a.vx", 1), ("a", 1), (".v2", 1)]


def _run(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", url, *args], catch_exceptions=False)


def test_cli_takes_short_sessions(url: str) -> None:
    r = _run(url, "use", "0ccf9")
    assert r.exit_code == 0 and "Using session claude/proj/0ccf9999-aaaa" in r.stderr
    assert _run(url, "use").stdout.strip() == "claude/proj/0ccf9999-aaaa"
    r = _run(url, "-s", "5e55", "log", "--oneline")
    assert r.exit_code == 0 and "hello 5e55-Upp" in r.stdout
    r = _run(url, "log", "-s", "codex/local/0ccf", "--oneline")  # a prefix after APP/USER
    assert r.exit_code == 0 and "hello 0ccf1a04" in r.stdout
    # ambiguous: one Error line naming the candidates, exit 1
    r = _run(url, "-s", "0ccf", "log")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.startswith("Error: session '0ccf' is ambiguous") and len(r.stderr.strip().splitlines()) == 1
    for k in KEYS[:3]:
        assert "/".join(k) in r.stderr
    # the subagent (KEYS[5]) is counted under its session, not listed after it
    assert "claude/proj/0ccf9999-aaaa (and 1 session named after it)" in r.stderr
    assert "0ccf9999-aaaa.subagents.agent-a1" not in r.stderr
    assert _run(url, "use", "0ccf").exit_code == 1
    # status resolves a prefix as log does, and still shows a new session typed in full
    r = _run(url, "status", "--json", "-s", "codex/local/0ccf")
    assert r.exit_code == 0 and '"session": "codex/local/0ccf1a04-1b4c"' in r.stdout, r.output
    r = _run(url, "-s", "codex/local/brand-new", "status")
    assert r.exit_code == 0 and "codex/local/brand-new" in r.stdout and "none yet" in r.stdout
    assert "not found" in _run(url, "-s", "nope", "log").stderr
    # a new session typed in full is taken as typed, never as an existing one it prefixes
    r = _run(url, "append", "-s", "claude/proj/0ccf", "--role", "user", "new")
    assert r.exit_code == 0
    with castore.open(url) as st:
        assert st.session("claude", "proj", "0ccf").messages()[0].content == "new"
    assert "Using session x/y/z (it has no entries yet)" in _run(url, "use", "x/y/z").stderr
    assert _run(url, "-s", "a/b", "log").exit_code == 2  # neither form: a usage mistake
    # push finds the session in this store, pull in the remote's
    remote, third = url + "-remote", url + "-third"
    r = _run(url, "push", remote, "-s", "5e55")
    assert r.exit_code == 0 and "sessions/codex/local/5e55-Upper/heads/main" in r.stdout, r.output
    with castore.open(remote) as st:
        assert porcelain.session_keys(st) == [("codex", "local", "5e55-Upper")]
    r = _run(third, "pull", remote, "-s", "5e5")
    assert r.exit_code == 0, r.output
    with castore.open(third) as st:
        assert porcelain.session_keys(st) == [("codex", "local", "5e55-Upper")]
    assert "ambiguous" in _run(url, "push", remote, "-s", "0ccf1a04").stderr


def test_a_prefix_of_a_real_session_with_subagents(tmp_path: Any) -> None:
    # the real Claude Code session with 5 subagent files: a prefix means the session; the same
    # session archived under two apps is ambiguous, one line naming the two, their subagents counted
    from pathlib import Path

    from castore.adapters.claude_code import import_claude

    share = Path(__file__).resolve().parent / "data" / "claude-code" / "session-share"
    url = str(tmp_path / "store")
    with castore.open(url, durable=False) as st:
        import_claude(st, share)
        sid = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"
        assert len(porcelain.session_keys(st)) == 6
        assert porcelain.find_session(st, "0") == ("claude", "session-share", sid)
        import_claude(st, share, app="copy")
        with pytest.raises(AmbiguousSession) as e:
            porcelain.find_session(st, "0")
        assert e.value.heads == [("claude", "session-share", sid), ("copy", "session-share", sid)]
        assert len(e.value.candidates) == 12 and e.value.candidates[0] == e.value.heads[0]
        assert all(porcelain.named_after(k, e.value.heads[0]) for k in e.value.candidates[1:6])
    r = _run(url, "-s", "0", "log")
    assert r.exit_code == 1 and len(r.stderr.strip().splitlines()) == 1
    assert r.stderr == (f"Error: session '0' is ambiguous: it matches claude/session-share/{sid} (and 5 sessions "
                        f"named after it), copy/session-share/{sid} (and 5 sessions named after it); give more of "
                        "the id or APP/USER/SESSION\n")
    assert _run(url, "-s", f"claude/session-share/{sid[:4]}", "log", "-n1").exit_code == 0


def test_a_subagent_is_found_by_its_own_id(tmp_path: Any) -> None:
    # the real Claude Code subagents (agent-a9cad17) and the Gemini CLI fixture's
    # (PARENT.c2d9e1f0-...): the id the agent gave it, or a prefix of it, finds it
    from pathlib import Path

    from castore.adapters.claude_code import import_claude
    from castore.adapters.gemini import import_gemini

    data = Path(__file__).resolve().parent / "data"
    url = str(tmp_path / "store")
    with castore.open(url, durable=False) as st:
        import_claude(st, data / "claude-code" / "session-share")
        import_gemini(st, data / "gemini" / "tmp")
        sid, gid = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68", "7f3c2a9e-4b1d-4e8a-9c55-2d6b8e0f1a47"
        sub = ("claude", "session-share", f"{sid}.subagents.agent-a9cad17")
        assert porcelain.find_session(st, "a9cad") == sub
        assert porcelain.find_session(st, "agent-a9cad17") == sub
        assert porcelain.find_session(st, "c2d9") == ("gemini", "my-app", f"{gid}.c2d9e1f0-5a6b-4c7d-8e9f-0a1b2c3d4e5f")
        assert porcelain.find_session(st, "7f3c") == ("gemini", "my-app", gid)  # the parent, as before
        with pytest.raises(AmbiguousSession):  # agent-a9cad17, agent-aa5ef13, agent-ac27727, ...
            porcelain.find_session(st, "agent-a")
        with pytest.raises(SessionNotFound):  # the older JSON file's ".json" is no id
            porcelain.find_session(st, "json")
        with pytest.raises(castore.InvalidName, match="it is empty"):  # was: ambiguous, listing every session
            porcelain.find_session(st, "")
    r = _run(url, "use", "c2d9")
    assert r.exit_code == 0 and f"{gid}.c2d9e1f0" in r.stderr
    r = _run(url, "use", "")
    assert r.exit_code == 1 and r.stderr == "Error: invalid session id '': it is empty: give a session id or a " \
        "unique prefix of it\n"


def _complete(url: str, args: list[str], incomplete: str) -> list[str]:
    comp = ShellComplete(cli, {}, "castore", "_CASTORE_COMPLETE")
    return [c.value for c in comp.get_completions(["--store", url, *args], incomplete)]


def test_completion_offers_sessions_and_branches(url: str) -> None:
    # ids alone where they are unique, full keys where the same id is in two apps
    assert set(_complete(url, ["use"], "0c")) == {"claude/proj/0ccf1a04-1b4c", "codex/local/0ccf1a04-1b4c",
                                                  "0ccf9999-aaaa", "0ccf9999-aaaa.subagents.agent-a1"}
    assert _complete(url, ["-s"], "5e") == ["5e55-Upper"]
    assert _complete(url, ["log", "-s"], "codex/") == ["codex/local/5e55-Upper", "codex/local/0ccf1a04-1b4c"]
    assert _complete(url, ["use"], "zz") == [LONG]
    # branches (and labels, for a revision) of the session given so far
    assert sorted(_complete(url, ["-s", "5e55", "checkout"], "")) == ["good", "main", "retry"]
    assert sorted(_complete(url, ["branch", "-s", "5e55", "-d"], "")) == ["main", "retry"]
    assert _complete(url, ["-s", "0ccf9", "log"], "re") == ["retry"]
    _run(url, "use", "5e55")
    assert sorted(_complete(url, ["show"], "")) == ["good", "main", "retry"]  # the session of `castore use`
    # nothing to offer, and no error: no store, an ambiguous session
    assert _complete(url + "-none", ["use"], "") == []
    assert _complete(url, ["-s", "0ccf", "checkout"], "") == []


def test_completion_offers_a_subagent_by_its_own_id_as_use_takes_it(url: str) -> None:
    # `castore use a1` finds the subagent ...subagents.agent-a1; `castore use a<TAB>` offered nothing
    assert _complete(url, ["use"], "a1") == ["0ccf9999-aaaa.subagents.agent-a1"]
    assert _complete(url, ["-s"], "agent-") == ["0ccf9999-aaaa.subagents.agent-a1"]
    assert _run(url, "use", "a1").exit_code == 0


def test_delete_session_completes_the_full_key_it_needs(url: str) -> None:
    # delete-session takes only APP/USER/SESSION: its completion offered nothing at all
    assert _complete(url, ["delete-session"], "5e") == ["codex/local/5e55-Upper"]
    assert _complete(url, ["delete-session"], "codex/local/5") == ["codex/local/5e55-Upper"]
    assert "0ccf9999-aaaa" not in _complete(url, ["delete-session"], "0c")  # never an id alone
    assert _complete(url + "-none", ["delete-session"], "") == []


def test_an_empty_session_option_is_refused_not_taken_for_the_current_session(url: str) -> None:
    """``-s ''`` names no session: refused as ``use ''`` is, not read as "no -s given" (which
    falls back to the session chosen with ``castore use``)."""
    assert _run(url, "use", "0ccf9999").exit_code == 0
    assert _run(url, "log").exit_code == 0  # the session chosen with use
    r = _run(url, "-s", "", "log")
    assert r.exit_code == 1 and r.stderr.startswith("Error: invalid session id '': it is empty")
    r = _run(url, "log", "-s", "")
    assert r.exit_code == 1 and r.stderr.startswith("Error: invalid session id '': it is empty")
