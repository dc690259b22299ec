"""The first hour of a new user (issue 19): git's habits in the CLI, clear errors, S3 setup.

Through click's runner, except where a terminal or a real process matters (the pager,
colors, the store found from a subfolder), which run ``castore`` in a subprocess, on a
pseudo-terminal when the behaviour depends on one.
"""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import s3server
from test_cli import KEY, Seeded, fails, ok, run, seed

import castore
from castore.errors import StorageError
from castore.store import default_url

ROOT = Path(__file__).resolve().parents[1]
CODE = "import sys; from castore.cli import main; main(prog_name='castore')"


def castore_proc(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``castore ARGS`` as a real process (this checkout first on the path)."""
    full = {k: v for k, v in os.environ.items() if k not in ("CASTORE_STORE", "CASTORE_SESSION")}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", CODE, *args], cwd=cwd, env=full, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL)


def on_terminal(*args: str, cwd: Path, env: dict[str, str]) -> str:
    """Run ``castore ARGS`` with stdin and stdout on a pseudo-terminal; return what it showed there."""
    full = {k: v for k, v in os.environ.items() if k not in ("CASTORE_STORE", "CASTORE_SESSION", "NO_COLOR")}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    full.update(env)
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-c", CODE, *args], cwd=cwd, env=full, stdin=follower,
                            stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    chunks = []
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(60)
    os.close(leader)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    return b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture
def url(tmp_path: Path) -> str:
    return str(tmp_path / "store")


@pytest.fixture
def seeded(url: str) -> Seeded:
    """As in test_cli: main q1 -> a1 (label good) -> q2 -> a2, and branch retry from q1."""
    return seed(url)


# -- the store is found as git finds .git ------------------------------------------------------------------
def test_a_subfolder_uses_the_nearest_store_above_it_in_the_library_and_the_cli(tmp_path: Path) -> None:
    project = tmp_path / "project"
    deep = project / "src" / "pkg"
    deep.mkdir(parents=True)
    assert castore_proc("-s", KEY, "append", "--role", "user", "hi", cwd=project).returncode == 0
    assert (project / ".castore" / "castore.json").is_file()
    assert default_url(str(deep)) == str(project / ".castore")
    r = castore_proc("sessions", cwd=deep)
    assert r.returncode == 0 and r.stdout.startswith("app/alice/s1") and "1 entry " in r.stdout
    assert not (deep / ".castore").exists() and not (project / "src" / ".castore").exists()
    r = castore_proc("-s", KEY, "append", "--role", "user", "again", cwd=deep)  # writes go there too
    assert r.returncode == 0 and not (deep / ".castore").exists()
    with castore.open(default_url(str(deep))) as store:  # the library's default agrees with the CLI
        assert len(store.session("app", "alice", "s1").messages()) == 2


def test_without_a_store_above_the_default_is_dot_castore_here(tmp_path: Path) -> None:
    assert default_url(str(tmp_path)) == str(tmp_path / ".castore")
    r = castore_proc("status", cwd=tmp_path)
    assert r.returncode == 0 and "not created yet" in r.stdout and not (tmp_path / ".castore").exists()


@pytest.mark.parametrize("typo", ["s3:/bucket/agents", "s3:bucket", "memory:/x"])
def test_a_mistyped_url_is_refused_not_made_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     typo: str) -> None:
    monkeypatch.chdir(tmp_path)
    err = fails(run(typo, "sessions", session=None))
    assert "looks like a mistyped URL" in err and "://" in err
    with pytest.raises(StorageError, match="mistyped"):
        castore.open(typo)
    assert list(tmp_path.iterdir()) == []


# -- a default session, and status ---------------------------------------------------------------------------
def test_use_sets_the_default_session_and_status_shows_it(seeded: Seeded) -> None:
    assert "castore use" in fails(run(seeded.url, "log", session=None), code=2)
    r = ok(run(seeded.url, "use", KEY, session=None))
    assert "Using session app/alice/s1" in r.stderr
    assert ok(run(seeded.url, "use", session=None)).stdout.strip() == KEY
    assert "Cloudy" in ok(run(seeded.url, "log", "--oneline", session=None)).stdout
    out = ok(run(seeded.url, "status", session=None)).stdout
    assert f"session:  {KEY} (from castore use)" in out
    assert f"HEAD:     {seeded.a2[:8]} on branch main" in out
    assert "entries:  4 on the path to HEAD, 2 branches, 1 label" in out
    doc = json.loads(ok(run(seeded.url, "status", "--json", session=None)).stdout)
    assert doc["head"] == seeded.a2 and doc["entries"] == 4 and doc["session_from"] == "castore use"
    # -s wins over the default
    doc = json.loads(ok(run(seeded.url, "status", "--json", session="app/alice/other")).stdout)
    assert doc["session"] == "app/alice/other" and doc["session_from"] == "-s" and doc["exists"] is False
    doc = json.loads(ok(run(seeded.url, "status", "--json", session=None, env={"CASTORE_SESSION": KEY})).stdout)
    assert doc["session_from"] == "$CASTORE_SESSION" and doc["entries"] == 4
    doc = json.loads(ok(run(seeded.url, "status", "--json", "-s", "app/alice/x", session=None,
                            env={"CASTORE_SESSION": KEY})).stdout)
    assert doc["session"] == "app/alice/x" and doc["session_from"] == "-s"
    ok(run(seeded.url, "use", "--unset", session=None))
    assert "no default session" in fails(run(seeded.url, "use", session=None))
    missing = seeded.url + "-none"  # an id alone looked up where there is no store: no store, not no session
    assert "no castore store at" in fails(run(missing, "use", "0ccf", session=None))
    assert not Path(missing).exists()


def test_status_shows_the_remotes_and_what_a_pull_kept(seeded: Seeded, tmp_path: Path) -> None:
    s = seeded.store.session("app", "alice", "s1")
    seeded.store.refs.swap(f"{s.prefix}/remotes/origin/main", seeded.q2, None, {})
    ok(run(seeded.url, "remote", "add", "origin", str(tmp_path / "elsewhere"), session=None))
    out = ok(run(seeded.url, "status")).stdout
    assert f"remote:   origin {tmp_path / 'elsewhere'}" in out
    assert f"kept:     remotes/origin/main at {seeded.q2[:8]}" in out


# -- label NAME [REV], state KEY, diff REV, global options after the command -------------------------------
def test_label_is_git_tag_name_rev_and_deletes_with_d(seeded: Seeded) -> None:
    ok(run(seeded.url, "label", "first", "HEAD~3"))
    ok(run(seeded.url, "label", "tip"))
    labels = seeded.store.session("app", "alice", "s1").labels()
    assert labels["first"] == seeded.q1 and labels["tip"] == seeded.a2
    assert "Deleted label 'first'" in ok(run(seeded.url, "label", "-d", "first")).stderr
    assert "first" not in seeded.store.session("app", "alice", "s1").labels()
    assert "no label" in fails(run(seeded.url, "label", "-d", "first"))
    assert ok(run(seeded.url, "label")).stdout.splitlines()[0].startswith("good ")


def test_library_label_takes_name_then_at_and_the_old_order_warns(seeded: Seeded) -> None:
    s = seeded.store.session("app", "alice", "s1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert s.label("v1", at="HEAD~1") == seeded.q2
        assert s.label("v2") == seeded.a2
    with pytest.warns(DeprecationWarning, match=r"label\(name, at=rev\)"):
        assert s.label("HEAD~3", "v3") == seeded.q1
    with pytest.warns(DeprecationWarning):
        assert s.label("HEAD", "v3", True) == seeded.a2  # force, positionally, as before
    assert s.labels()["v3"] == seeded.a2
    with pytest.warns(DeprecationWarning):
        assert s.label(rev="HEAD~2", name="v4") == seeded.a1  # the old keyword names
    with pytest.raises(TypeError):
        s.label("v5", "HEAD", at="HEAD~1")


def test_state_key_reads_heads_value_and_a_revision_still_wins(seeded: Seeded) -> None:
    assert json.loads(ok(run(seeded.url, "state", "last_city")).stdout) == "Shanghai"
    assert json.loads(ok(run(seeded.url, "state", "good")).stdout) == {"last_city": "Beijing"}
    assert json.loads(ok(run(seeded.url, "state", "good", "last_city")).stdout) == "Beijing"
    assert "neither a revision nor a key" in fails(run(seeded.url, "state", "nope"))


def test_diff_with_one_revision_compares_it_with_head(seeded: Seeded) -> None:
    out = ok(run(seeded.url, "diff", "good")).stdout
    assert '~ last_city: "Beijing" -> "Shanghai"' in out and "+ n = 2" in out
    assert "only on HEAD (2)" in out


def test_global_options_work_after_the_command(seeded: Seeded, tmp_path: Path) -> None:
    out = ok(run(None, "log", "--oneline", "-s", KEY, "--store", seeded.url, session=None)).stdout
    assert "Cloudy" in out
    ok(run(None, "label", "late", "--store", seeded.url, "--session", KEY, session=None))
    assert "late" in seeded.store.session("app", "alice", "s1").labels()
    # export html -s: the global -s, after the command, as everywhere
    ok(run(None, "export", "html", "-s", KEY, "-o", str(tmp_path / "x.html"), "--store", seeded.url, session=None))
    assert (tmp_path / "x.html").stat().st_size > 1000


def test_an_unknown_store_option_of_a_local_or_memory_store_is_one_error_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``castore --store DIR -o bogus=1 log`` ignored the option (local disk and memory take
    none) where S3 checks its options at open: a typo passed unseen. It is one ``Error:`` line
    naming the option now, on both ways ``grep`` runs too; ``-o durable=false`` still works, and
    ``durable`` and ``auto_repack`` of another type than true/false are refused too."""
    from castore.cli import fast

    root = str(tmp_path / "st")
    seed(root)
    for url in (root, f"memory://opts-{uuid.uuid4().hex}"):
        for name, args in (("bogus", ["-o", "bogus=1", "log"]),
                           ("endpoint_url", ["log", "-o", "durable=false", "-o", "endpoint_url=x"])):
            err = fails(run(url, *args))
            assert f"unknown storage option {name!r}" in err, err
    ok(run(root, "log", "-o", "durable=false"))
    # the options that are Store.open's take their type only (durable=maybe was durable, unsaid)
    assert "durable must be true or false, not 'maybe'" in fails(run(root, "-o", "durable=maybe", "log"))
    assert "auto_repack must be true or false, not 'maybe'" in fails(run(root, "-o", "auto_repack=maybe", "log"))
    ok(run(root, "-o", "auto_repack=false", "log"))
    assert fast.grep_main(["--store", root, "-o", "bogus=1", "grep", "-c", "Sunny"], {}) == 2
    assert capsys.readouterr().err.splitlines() == ["Error: unknown storage option 'bogus': a store on local disk "
                                                    "takes no options"]
    fails(run(root, "-o", "bogus=1", "grep", "-c", "Sunny", session=None), code=2)


# -- commands for what only the library did ------------------------------------------------------------------
def test_delete_session_and_compact_from_the_cli(seeded: Seeded) -> None:
    r = ok(run(seeded.url, "compact", "Asked about two cities.", "--keep-from", "HEAD~1"))
    s = seeded.store.session("app", "alice", "s1")
    assert r.stdout.strip() == s.head and s.show("HEAD").kind == "compaction"
    ctx = json.loads(ok(run(seeded.url, "context", "--json")).stdout)
    assert "Asked about two cities." in json.dumps(ctx["messages"][0])
    assert "not on the current branch" in fails(run(seeded.url, "compact", "x", "--keep-from", "retry"))
    ok(run(seeded.url, "use", KEY, session=None))
    r = ok(run(seeded.url, "delete-session", KEY, session=None))
    assert "Deleted session app/alice/s1" in r.stderr and "no default now" in r.stderr
    assert not seeded.store.session("app", "alice", "s1").exists()
    assert "not found" in fails(run(seeded.url, "delete-session", KEY, session=None)).lower()
    fails(run(seeded.url, "delete-session", "app/alice", session=None), code=2)


def test_delete_session_by_its_id_alone_names_the_key_to_type(seeded: Seeded) -> None:
    # every other command takes the id alone or a prefix; delete-session wants the key in full
    # (a deletion is never guessed) and said only "'s1' is not APP/USER/SESSION"
    for typed in ("s1", "s"):
        err = fails(run(seeded.url, "delete-session", typed, session=None), code=2)
        assert "name the session in full: castore delete-session app/alice/s1" in err, err
    assert seeded.store.session("app", "alice", "s1").exists()
    assert "not APP/USER/SESSION" in fails(run(seeded.url, "delete-session", "zz", session=None), code=2)


def test_words_of_git_and_llm_that_castore_spells_otherwise_name_its_command(seeded: Seeded) -> None:
    for typed, said in (("view", "castore export html -o FILE"), ("tag", "castore label"), ("logs", "castore log"),
                        ("ls", "castore sessions"), ("rm", "castore delete-session")):
        err = fails(run(seeded.url, typed, session=None), code=2)
        assert f"No such command '{typed}'" in err and said in err, err


def test_remote_alone_lists_the_remotes_as_git_remote_does(seeded: Seeded, tmp_path: Path) -> None:
    ok(run(seeded.url, "remote", "add", "origin", str(tmp_path / "other"), session=None))
    listed = ok(run(seeded.url, "remote", "list", session=None)).stdout
    assert "origin" in listed
    assert ok(run(seeded.url, "remote", session=None)).stdout == listed
    ok(run(seeded.url, "remote", "add", "backup", str(tmp_path / "backup"), session=None))
    assert list(json.loads(ok(run(seeded.url, "remote", "--json", session=None)).stdout)) == ["backup", "origin"]
    assert len(ok(run(seeded.url, "remote", "-n", "1", session=None)).stdout.splitlines()) == 1
    assert "`remote add` takes neither" in fails(run(seeded.url, "remote", "--json", "add", "x", "y", session=None),
                                                 code=2)


def test_an_empty_listing_says_so_on_stderr_and_prints_nothing(tmp_path: Path) -> None:
    fresh = str(tmp_path / "fresh")
    ok(run(fresh, "init", session=None))
    for args, said in ((("sessions",), "no sessions"), (("remote",), "no remotes")):
        r = ok(run(fresh, *args, session=None))
        assert r.stdout == "" and r.stderr.startswith(said), (args, r.stderr)
    with castore.open(fresh) as store:
        store.session("app", "bob", "s").append(castore.Message(role="user", content="hi"))
    typo = ok(run(fresh, "sessions", "ap", session=None))  # an app that is not there: the ones that are
    assert typo.stdout == "" and typo.stderr == "no sessions: no app 'ap' here (apps: app)\n"
    assert ok(run(fresh, "sessions", "app/alice", session=None)).stderr == "no sessions\n"
    for args, said in ((("labels",), "no labels"), (("label",), "no labels"), (("reflog",), "no moves")):
        r = ok(run(fresh, *args, session="app/bob/s"))
        assert r.stdout == "" and r.stderr.startswith(said), (args, r.stderr)


def test_push_and_sync_name_refs_as_typed_not_as_stored(seeded: Seeded, tmp_path: Path) -> None:
    # a dot or a capital is stored escaped (names.encode): the lines said ".../s%2EV2/heads/main"
    s = seeded.store.session("app", "alice", "s.V2")
    s.append(castore.Message(role="user", content="hi"))
    s.branch("Retry")
    other = str(tmp_path / "other")
    pushed = ok(run(seeded.url, "push", other, "-s", "app/alice/s.V2", session=None)).stdout.splitlines()
    assert "updated  sessions/app/alice/s.V2/heads/Retry" in pushed, pushed
    s.append(castore.Message(role="user", content="again"), branch="Retry")
    synced = ok(run(seeded.url, "sync", other, session=None)).stdout.splitlines()
    assert "pushed   sessions/app/alice/s.V2/heads/Retry" in synced, synced
    slash = seeded.store.session("app", "alice", "a/b")  # a '/' in a name stays %2F, as -s takes it
    slash.append(castore.Message(role="user", content="hi"))
    synced = ok(run(seeded.url, "sync", other, session=None)).stdout.splitlines()
    assert "pushed   sessions/app/alice/a%2Fb/heads/main" in synced, synced


def test_push_and_sync_list_the_refs_they_moved_sorted(seeded: Seeded, tmp_path: Path) -> None:
    for n in range(6):
        seeded.store.session("app", f"u{n}", "s").append(castore.Message(role="user", content="hi"))
    pushed = ok(run(seeded.url, "push", str(tmp_path / "a"), "--all", session=None)).stdout.splitlines()
    assert len(pushed) > 12 and pushed == sorted(pushed), pushed  # before, in the order they landed
    synced = ok(run(seeded.url, "sync", str(tmp_path / "b"), session=None)).stdout.splitlines()
    assert len(synced) > 12 and synced == sorted(synced), synced


# -- errors that were tracebacks -------------------------------------------------------------------------------
def test_export_to_a_missing_folder_is_one_error_line(seeded: Seeded) -> None:
    for sub in ("html", "pi"):
        err = fails(run(seeded.url, "export", sub, "-o", "/nonexistent/dir/x.out"))
        assert "cannot write /nonexistent/dir/x.out: No such file or directory" in err


def test_unknown_or_unreachable_store_urls_are_one_error_line(tmp_path: Path) -> None:
    assert "cannot open store ftp://x" in fails(run("ftp://x", "sessions", session=None))
    assert "unknown or unavailable protocol" in fails(run("nosuchproto://x", "sessions", session=None))


def test_cat_object_with_a_non_id_says_what_an_id_is(seeded: Seeded) -> None:
    assert "not an object id" in fails(run(seeded.url, "cat-object", "zzzz", session=None))
    assert "no object id starts with it" in fails(run(seeded.url, "cat-object", "ffff0000", session=None))


# -- output on a terminal: the pager, colors, long bodies -------------------------------------------------------
@pytest.fixture
def long_session(tmp_path: Path) -> Path:
    with castore.open(str(tmp_path / ".castore")) as store:
        s = store.session("app", "alice", "s1")
        s.append(castore.Message(role="user", content="\n".join(f"line {i}" for i in range(40))))
        s.append(castore.Message(role="assistant", content="short"))
    return tmp_path


def test_long_output_goes_through_the_pager_only_on_a_terminal(long_session: Path) -> None:
    paged = long_session / "paged.txt"
    pager = {"CASTORE_PAGER": f"{sys.executable} -c \"import sys; open({str(paged)!r}, 'w').write(sys.stdin.read())\""}
    on_terminal("-s", KEY, "log", cwd=long_session, env=pager)
    assert "line 3" in paged.read_text() and "short" in paged.read_text()
    paged.unlink()
    on_terminal("-s", KEY, "log", "--no-pager", cwd=long_session, env=pager)
    assert not paged.exists()
    on_terminal("-s", KEY, "--no-pager", "log", cwd=long_session, env=pager)
    assert not paged.exists()
    r = castore_proc("-s", KEY, "log", cwd=long_session, env=pager)  # not a terminal: no pager
    assert r.returncode == 0 and "short" in r.stdout and not paged.exists()


def test_colors_on_a_terminal_unless_no_color(long_session: Path) -> None:
    shown = on_terminal("-s", KEY, "log", "--oneline", cwd=long_session, env={"CASTORE_PAGER": "cat"})
    assert "\x1b[" in shown and "short" in shown
    shown = on_terminal("-s", KEY, "log", "--oneline", cwd=long_session, env={"CASTORE_PAGER": "cat", "NO_COLOR": "1"})
    assert "\x1b[" not in shown and "short" in shown
    r = castore_proc("-s", KEY, "log", "--oneline", cwd=long_session)
    assert "\x1b[" not in r.stdout


def test_log_cuts_long_bodies_and_show_prints_them_whole(long_session: Path) -> None:
    url = str(long_session / ".castore")
    out = ok(run(url, "log")).stdout
    # the hint repeats the --store and -s typed, so that it runs as printed
    assert "line 10" in out and "line 11" not in out and "29 more lines; `castore show" in out
    printed = out.split("29 more lines; `")[1].split("`")[0]
    assert printed.endswith(f" --store {url} -s {KEY}")
    shown = ok(run(None, *shlex.split(printed)[1:], session=None)).stdout
    assert "line 39" in shown and "more lines" not in shown


# -- setup: completion, S3 ---------------------------------------------------------------------------------------
def test_shell_completion_script_is_printed(tmp_path: Path) -> None:
    r = castore_proc(cwd=tmp_path, env={"_CASTORE_COMPLETE": "bash_source"})
    assert r.returncode == 0 and "complete -o nosort -F" in r.stdout and "castore" in r.stdout


@pytest.fixture
def s3_env(moto_server: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3server.KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3server.SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3server.REGION)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    return str(moto_server.endpoint_url)


def test_a_missing_bucket_is_named_with_the_endpoint_from_the_environment(s3_env: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env)
    bucket = f"nb-{uuid.uuid4().hex[:16]}"
    err = fails(run(f"s3://{bucket}/agents", "-s", KEY, "append", "--role", "user", "hi", session=None))
    assert f"bucket '{bucket}' does not exist at {s3_env}" in err and "castore init" in err
    assert "AWS default endpoint" not in err


def test_init_creates_the_bucket_and_store_options_follow_store(s3_env: str) -> None:
    bucket = f"nb-{uuid.uuid4().hex[:16]}"
    url = f"s3://{bucket}/agents"
    r = ok(run(url, "-o", f"endpoint_url={s3_env}", "init", session=None))
    assert f"Created bucket '{bucket}' at {s3_env}" in r.stderr and "Initialized empty" in r.stderr
    ok(run(url, "-o", f"endpoint_url={s3_env}", "append", "--role", "user", "hi"))
    out = ok(run(None, "sessions", "--store", url, "-o", f"endpoint_url={s3_env}", session=None)).stdout
    assert out.startswith("app/alice/s1") and "1 entry " in out
    r = ok(run(url, "-o", f"endpoint_url={s3_env}", "init", session=None))  # again: harmless
    assert "Found existing" in r.stderr and "Created bucket" not in r.stderr


def test_clone_with_store_typed_takes_the_next_argument_as_the_selection(seeded: Seeded, tmp_path: Path) -> None:
    ok(run(seeded.url, "fork", "s2"))
    seeded.store.session("other", "bob", "x").append(castore.Message(role="user", content="hi"))
    copy = tmp_path / "copy"
    ok(run(str(copy), "clone", seeded.url, "app/alice/s1", session=None))
    with castore.open(str(copy)) as store:
        assert store.apps() == ["app"] and [i.session for i in store.sessions("app")] == ["s1"]
    git_like = tmp_path / "git-like"
    ok(run(None, "clone", seeded.url, str(git_like), "other", session=None))
    with castore.open(str(git_like / ".castore")) as store:  # as git clone URL DIR: the store in DIR/.castore
        assert store.apps() == ["other"]
    assert "two destinations" in fails(run(str(tmp_path / "a"), "clone", seeded.url, str(tmp_path / "b"), "app",
                                           session=None), code=2)


# -- small things -------------------------------------------------------------------------------------------------
def test_counts_agree_in_number(seeded: Seeded) -> None:
    seeded.store.session("app", "alice", "one").append(castore.Message(role="user", content="hi"))
    out = ok(run(seeded.url, "sessions", session=None)).stdout
    assert "1 entry " in out and "4 entries" in out
    assert "OK: 1 commit up to" in ok(run(seeded.url, "verify", session="app/alice/one")).stdout


def test_an_archive_import_counts_its_lines_and_branches_in_number(tmp_path: Path) -> None:
    project = tmp_path / "projects" / "-home-me"
    project.mkdir(parents=True)
    line = {"type": "user", "uuid": "u1", "parentUuid": None, "sessionId": "s1", "timestamp": "2026-01-01T00:00:00Z",
            "message": {"role": "user", "content": "hi"}}
    (project / "s1.jsonl").write_text(json.dumps(line) + "\n")
    r = ok(run(str(tmp_path / "store"), "import", "claude", str(project), session=None))
    assert r.stdout.startswith("claude/-home-me/s1: +1 line (1 in all), HEAD "), r.stdout  # was "+1 lines"


def test_a_session_name_with_a_newline_stays_one_row(url: str) -> None:
    with castore.open(url) as store:
        store.session("app", "alice", "two\nlines").append(castore.Message(role="user", content="hi"))
        store.session("app", "alice", "plain").append(castore.Message(role="user", content="hi"))
    rows = ok(run(url, "sessions", session=None)).stdout.splitlines()
    assert len(rows) == 2 and any("two\\nlines" in row for row in rows)


def test_import_pi_says_how_many_entries_are_on_heads_path(tmp_path: Path, url: str) -> None:
    pi_file = tmp_path / "s.jsonl"
    header = {"type": "session", "version": 3, "id": "p1", "timestamp": "2026-01-01T00:00:00Z", "cwd": "/"}
    lines = [header]
    parent = None
    for i, (eid, par) in enumerate([("a", None), ("b", "a"), ("c", "b"), ("d", "b")]):
        parent = par
        lines.append({"type": "message", "id": eid, "parentId": parent, "timestamp": f"2026-01-01T00:00:0{i}Z",
                      "message": {"role": "user", "content": f"m{eid}", "timestamp": i}})
    pi_file.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = ok(run(url, "import", "pi", str(pi_file), session=None)).stdout
    assert "4 entries, HEAD" in out and "(3 on its path, as `sessions` counts)" in out and "1 other branch" in out
    assert "3 entries" in ok(run(url, "sessions", session=None)).stdout


# -- scripts/demo installs castore alone; scripts/test everything -------------------------------------------------
FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for python3 and the .venv's python: records pip calls instead of installing.
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python"
    printf '#!/bin/sh\\necho "castore $*" >> "$LOG"\\n' > "$3/bin/castore" && chmod +x "$3/bin/castore"
    exit 0
fi
echo "$*" >> "$LOG"
"""


def test_demo_installs_castore_alone_and_a_dev_install_covers_it(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("setup", "demo"):
        (checkout / "scripts" / name).write_bytes((ROOT / "scripts" / name).read_bytes())
        (checkout / "scripts" / name).chmod(0o755)
    (checkout / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "log"
    env = {**os.environ, "PYTHON": str(fake), "LOG": str(log)}
    env.pop("CASTORE_EXTRAS", None)

    def calls(*cmd: str) -> list[str]:
        log.write_text("")
        subprocess.run(list(cmd), cwd=checkout, env=env, check=True, capture_output=True)
        return log.read_text().splitlines()

    compat = "--config-settings editable_mode=compat"  # a .pth line, no import hook (scripts/setup)
    assert calls("scripts/demo") == [f"-m pip install -q --disable-pip-version-check {compat} -e .", "castore demo"]
    assert calls("scripts/demo") == ["castore demo"]  # installed: nothing to do
    dev = calls("scripts/setup")  # what scripts/test runs
    assert dev[-1] == f"-m pip install -q --disable-pip-version-check {compat} -e .[dev]"
    assert calls("scripts/demo") == ["castore demo"]  # the dev install holds everything the demo needs
