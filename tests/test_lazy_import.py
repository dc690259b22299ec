"""``import castore`` loads only what a local store needs, when it needs it (issue 17).

Each check runs in a fresh interpreter, since this test process has imported everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import castore

ROOT = Path(__file__).resolve().parent.parent

#: never loaded by importing castore and using a local store: S3 and fsspec backends, asyncio
#: (castore.aio imports it on first async call), OpenSSL's hashing, the CLI, sync's thread pool
NOT_FOR_A_LOCAL_STORE = ["fsspec", "s3fs", "botocore", "aiobotocore", "asyncio", "ssl", "_hashlib", "click",
                         "concurrent.futures", "castore.sync", "castore.cli", "castore.adapters",
                         "castore.grep", "castore.maintenance", "castore.context"]


def _modules_after(code: str, *args: str) -> list[str]:
    """Run ``code`` in a new interpreter (castore from this checkout); return sys.modules after it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    src = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    p = subprocess.run([sys.executable, "-c", src, *args], capture_output=True, text=True, env=env, cwd=str(ROOT),
                       check=False)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_import_castore_loads_only_the_errors() -> None:
    mods = _modules_after("import castore")
    assert "castore.errors" in mods
    heavy = [m for m in mods if m.split(".")[0] in ("msgspec", "blake3", "zstandard")
             or m in ("castore.store", "castore.session", "castore.objects")]
    assert heavy == []


def test_a_local_store_loads_no_remote_async_or_openssl_module(tmp_path: Path) -> None:
    code = """
import sys
import castore
st = castore.open(sys.argv[1])
s = st.session("app", "u", "s")
s.append(castore.Message(role="user", content="hello"), state_delta={"turn": 1})
assert [m.content for m in s.messages()] == ["hello"]
assert s.state()["turn"] == 1
s.branch("b", at="HEAD"); s.fork("s2")
st.close()
"""
    mods = _modules_after(code, str(tmp_path / "store"))
    assert "castore.storage.local" in mods and "msgspec" in mods  # the code above did run
    loaded = [m for m in NOT_FOR_A_LOCAL_STORE if m in mods or any(x.startswith(m + ".") for x in mods)]
    assert loaded == []


def test_every_public_name_resolves() -> None:
    for name in castore.__all__:
        assert getattr(castore, name) is not None, name
    assert set(castore.__all__) <= set(dir(castore))
    assert castore.open is castore.store.open
    assert castore.Message is castore.entries.Message
    assert castore.history.K > 0  # submodules as attributes, as when import castore loaded them


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        castore.nope  # noqa: B018
    assert not hasattr(castore, "Sessionn")


#: what the ``castore`` command loads before a command opens a store: never the store, the object
#: format or the library above it, nor a command module or click's completion machinery
NOT_BEFORE_A_STORE = ["msgspec", "blake3", "zstandard", "castore.store", "castore.session", "castore.objects",
                      "castore.storage", "castore.grep", "castore.redact", "click.shell_completion",
                      "castore.cli.render", "castore.cli.session_cmds", "castore.cli.inspect_cmds",
                      "castore.cli.archive_cmds", "castore.cli.grep_cmds"]
#: never loaded by ``castore grep`` through an up-to-date index: the Session class and what only it
#: uses, the store's parts it does not use (object store, history, write path, group commit: built on
#: first use; the replay of ref swaps a power loss cut short needs no object store when there is
#: none), the object format, msgspec, blake3 and the built-in dictionary (the index's chunks are
#: plain zstd frames, read with castore.frames), the entries, redaction, the scan without an index,
#: rendering, other commands' modules, remote backends, ctypes (only a sync of the file system uses it),
#: the Match classes (counting and printing lines build none: dataclasses compiled for nothing),
#: dataclasses at all (the refs' values are plain classes, a listing's SessionInfo is loaded by a
#: listing), zlib (the index's CRC checks a file only when it was written again since) and
#: fnmatch (for the --tool, --sessions and --app globs)
NOT_FOR_GREP = ["castore.grep.match", "dataclasses", "castore.listing", "zlib", "fnmatch", "castore.session", "castore.pathview", "castore.revisions", "castore.context", "castore.redact",
                "castore.objectstore", "castore.objects", "msgspec", "blake3", "castore.zdict", "castore.history",
                "castore.plumbing", "castore.retry", "castore.groupcommit", "castore.state", "castore.entries", "castore.pathfacts",
                "ctypes", "castore.grep.scan", "castore.cli.render", "castore.cli.session_cmds",
                "castore.cli.inspect_cmds", "castore.cli.archive_cmds", "castore.cli.io_cmds", "castore.usage",
                "castore.sync", "castore.adapters", "castore.crypto", "click.shell_completion", "fsspec", "s3fs",
                "asyncio", "concurrent.futures"]
#: the ``castore`` command run with the arguments given, in the same interpreter
_CLI = "import sys\nfrom castore.cli.main import cli\ntry:\n    cli(sys.argv[1:])\nexcept SystemExit as e:\n" \
       "    assert e.code == 0, e.code\n"


def _loaded(mods: list[str], names: list[str]) -> list[str]:
    return [m for m in names if m in mods or any(x.startswith(m + ".") for x in mods)]


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_the_cli_loads_no_store_before_a_command_opens_one(args: list[str]) -> None:
    mods = _modules_after(_CLI, *args)
    assert "click" in mods and "castore.cli.common" in mods  # the command did run
    assert _loaded(mods, NOT_BEFORE_A_STORE) == []


def _age_ref_folders(root: Path, seconds: int = 3600) -> None:
    """Set the time of every session's ``heads/`` ``seconds`` back, as if changed long ago: the
    search index keeps a folder's stamp only once the folder has settled (a stamp taken within a
    tick of its change makes the next search read that session's refs again, and load more)."""
    for heads in (root / "refs" / "sessions").rglob("heads"):
        t = heads.stat().st_mtime_ns - seconds * 10**9
        os.utime(heads, ns=(t, t))


@pytest.mark.parametrize("args", [["-c"], ["-l"], []])
def test_grep_through_the_index_loads_only_what_it_searches_with(tmp_path: Path, args: list[str]) -> None:
    from castore.grep import grep_counts

    url = str(tmp_path / "store")
    with castore.open(url) as st:
        s = st.session("app", "u", "s1")
        s.append(castore.Message(role="user", content="Weather in Beijing?"))
    _age_ref_folders(tmp_path / "store")
    with castore.open(url) as st:
        assert sum(grep_counts(st, "Beijing").values()) == 1  # the index is built (and sealed) here
    mods = _modules_after(_CLI, "--store", url, "grep", *args, "Beijing")
    assert "castore.grep.index" in mods and "castore.store" in mods  # the search did run, through the index
    assert _loaded(mods, NOT_FOR_GREP) == []


#: never loaded by the console script's fast path of ``castore grep`` (:mod:`castore.cli.fast`): click and
#: the standard modules it brings (its import was ~45% of a fresh rare-word search's instructions), the
#: click group and its helpers (not platform: zstandard imports it)
NOT_FOR_FAST_GREP = ["click", "castore.cli.main", "castore.cli.common", "castore.cli.complete",
                     "castore.cli.grep_cmds", "inspect", "uuid", "gettext", "difflib"]
_FAST = "import sys\nfrom castore.cli.fast import grep_main\nassert grep_main(sys.argv[1:]) == 0\n"


@pytest.mark.parametrize("args", [["-c"], ["-l"], ["--json"], []])
def test_grep_through_the_fast_path_loads_no_click(tmp_path: Path, args: list[str]) -> None:
    from castore.grep import grep_counts

    url = str(tmp_path / "store")
    with castore.open(url) as st:
        st.session("app", "u", "s1").append(castore.Message(role="user", content="Weather in Beijing?"))
    _age_ref_folders(tmp_path / "store")
    with castore.open(url) as st:
        assert sum(grep_counts(st, "Beijing").values()) == 1
    mods = _modules_after(_FAST, "--store", url, "grep", *args, "Beijing")
    assert "castore.grep.index" in mods and "castore.cli.grep_search" in mods  # the search did run
    matches = ["castore.grep.match", "dataclasses", "inspect"]  # --json builds Match dataclasses (which load inspect)
    assert _loaded(mods, [m for m in NOT_FOR_FAST_GREP + NOT_FOR_GREP if "--json" not in args or m not in matches]) \
        == []
    if args in (["-c"], ["-l"]):
        assert "datetime" not in mods  # a count prints no time, and parses none without --since/--until


def test_the_console_script_freezes_what_the_cli_imports_and_collects_again() -> None:
    """``castore`` (the console script and ``python -m castore``) imports the command line with
    the cyclic collector off, freezes what that made, and turns the collector back on."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["castore"] == "castore.__main__:main"
    code = """
import gc, sys
from castore.__main__ import main
sys.argv = ["castore", "--version"]
try:
    main()
except SystemExit as e:
    assert e.code in (0, None), e.code
assert gc.isenabled() and gc.get_freeze_count() > 1000, gc.get_freeze_count()
"""
    mods = _modules_after(code)
    assert "click" in mods


def test_the_parts_a_store_builds_on_first_use_are_one_per_store(tmp_path: Path) -> None:
    code = """
import sys, threading
import castore
st = castore.open(sys.argv[1])
assert "castore.plumbing" not in sys.modules and "castore.history" not in sys.modules  # nothing built yet
barrier = threading.Barrier(8)
got = []
def first_use():
    barrier.wait()
    got.append((st.plumbing, st.group_commit, st.history))
threads = [threading.Thread(target=first_use) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert len({tuple(map(id, g)) for g in got}) == 1, got
assert st.plumbing.history is st.history and st.group_commit.plumbing is st.plumbing
s = st.session("app", "u", "s")
s.append(castore.Message(role="user", content="hello"))
assert [m.content for m in st.session("app", "u", "s").messages()] == ["hello"]
st.close()
"""
    mods = _modules_after(code, str(tmp_path / "store"))
    assert "castore.groupcommit" in mods  # the code above did run
    with castore.open(str(tmp_path / "other")) as other, pytest.raises(AttributeError, match="no attribute 'plumbingg'"):
        other.plumbingg  # noqa: B018
