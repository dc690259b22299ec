"""Every command and code line of the README runs, as written, in the order a reader meets them.

Python blocks run in one namespace (the frameworks block gets the agents it names from a
small prelude: a LangGraph builder, an ADK agent and an Agents SDK agent with scripted
models). Shell blocks run line by line in bash, in one scratch folder, with a ``castore``
on the PATH that runs this checkout. ``s3://bucket/...`` is the loopback moto server the
tests start: the environment names it (``AWS_ENDPOINT_URL``), and the README's example
endpoint ``http://127.0.0.1:9000`` is replaced by its address, the only change made.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import s3server

import castore

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXAMPLE_ENDPOINT = "http://127.0.0.1:9000"
#: the opening block: what a fresh clone runs (measured by hand, see the report; too slow here)
OPENING = ["scripts/demo", "scripts/test"]


def blocks() -> list[tuple[str, str, int]]:
    """The README's fenced blocks: (language, text, line)."""
    text = README.read_text()
    out = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M):
        out.append((m.group(1), m.group(2), text[: m.start()].count("\n") + 1))
    return out


def shell_lines(body: str) -> list[str]:
    """The commands of a shell block (one a line; blank lines and comment-only lines skipped)."""
    return [ln.strip() for ln in body.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_readme_opens_with_the_two_commands() -> None:
    lang, body, _ = blocks()[0]
    assert lang == "" and [ln.split()[0] for ln in shell_lines(body)] == OPENING
    for script in OPENING:
        assert os.access(ROOT / script, os.X_OK), f"{script} is not executable"


def test_every_block_is_python_shell_or_marked_text() -> None:
    """A block is run as Python (```python) or shell (```), unless marked ```text (not commands)."""
    kinds = {lang for lang, _, _ in blocks()}
    assert kinds <= {"", "python", "text"}, kinds
    assert [lang for lang, _, _ in blocks()].count("text") == 1  # the store layout, only


# -- running the README ---------------------------------------------------------------------------------
def _prelude() -> dict[str, Any]:
    """What the frameworks block takes as given: the user's graph builder and agents (no network)."""
    from typing import TypedDict

    from google.adk.agents import LlmAgent
    from google.genai import types
    from langgraph.graph import END, START, StateGraph
    from test_adk import ScriptedLlm
    from test_openai_agents import make_agent

    class State(TypedDict):
        n: int

    builder = StateGraph(State)
    builder.add_node("step", lambda s: {"n": s.get("n", 0) + 1})
    builder.add_edge(START, "step")
    builder.add_edge("step", END)
    adk_agent = LlmAgent(name="assistant", model=ScriptedLlm(model="scripted", script=[types.Part(text="Hi")]))
    agent, _ = make_agent()
    return {"builder": builder, "adk_agent": adk_agent, "agent": agent}


def _castore_on_path(bin_dir: Path) -> None:
    bin_dir.mkdir()
    exe = bin_dir / "castore"
    code = "import sys; from castore.cli import main; main(prog_name='castore')"
    exe.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} \"$@\"\n")
    exe.chmod(0o755)


def _run_python(body: str, line: int, scope: dict[str, Any]) -> None:
    code = compile(body, f"README.md:{line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, scope)
    if inspect.iscoroutine(result):
        asyncio.run(result)


def _run_serve(cmd: str, env: dict[str, str], cwd: Path) -> None:
    """`castore serve` runs until stopped: start it, fetch its page list, stop it."""
    proc = subprocess.Popen(["bash", "-c", f"exec {cmd}"], cwd=cwd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        if "cannot listen" in first:  # another run holds the default port: the error is the clean one
            assert first.startswith("Error: cannot listen on 127.0.0.1:8765"), first
            return
        m = re.search(r"at (http://\S+)", first)
        assert m, first
        with urllib.request.urlopen(m.group(1) + "/", timeout=30) as resp:
            assert resp.status == 200 and b"weather-app" in resp.read()
    finally:
        proc.terminate()
        proc.wait(30)


def _agent_home(home: Path) -> Path:
    """A home folder holding what the archive section imports: copies of the real Claude Code
    Codex, Pi and Gemini CLI files in tests/data (never the originals), where the agents keep them."""
    import lzma
    import shutil

    data = ROOT / "tests" / "data"
    shutil.copytree(data / "claude-code" / "session-share", home / ".claude" / "projects" / "-home-me-app",
                    ignore=shutil.ignore_patterns("LICENSE"))
    codex = home / ".codex" / "sessions" / "2025" / "12" / "28"
    codex.mkdir(parents=True)
    shutil.copy(data / "codex" / "sample_codex_session.jsonl", codex / "rollout-2025-12-28T12-18-30-x.jsonl")
    pi = home / ".pi" / "agent" / "sessions" / "--home-me-app--"
    pi.mkdir(parents=True)
    (pi / "2026-01-05T10-00-00-000Z_x.jsonl").write_bytes(lzma.decompress(
        (data / "pi" / "before-compaction.jsonl.xz").read_bytes()))
    shutil.copytree(data / "gemini" / "tmp", home / ".gemini" / "tmp")
    return home


def test_readme_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moto_server: Any) -> None:
    endpoint = moto_server.endpoint_url
    s3server.make_bucket(endpoint, "bucket")
    work = tmp_path / "work"
    work.mkdir()
    _castore_on_path(tmp_path / "bin")
    for var in ("CASTORE_STORE", "CASTORE_SESSION", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3server.KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3server.SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3server.REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("CASTORE_PAGER", "cat")
    home = _agent_home(tmp_path / "home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    scope: dict[str, Any] = {}
    ran: list[str] = []
    for lang, body, line in blocks()[1:]:
        if lang == "text":  # a picture of the layout, not commands
            continue
        if lang == "python":
            if "builder" in body:
                scope.update(_prelude())
                from castore.adapters import pi

                pi.export_session(scope["s"], out="session.jsonl")  # a Pi file to import: the example's session
            _run_python(body, line, scope)
            ran.append(f"python block at line {line}")
            continue
        for cmd in shell_lines(body):
            run = cmd.replace(EXAMPLE_ENDPOINT, endpoint)
            if run.split()[:2] == ["castore", "serve"]:
                _run_serve(run, env, work)
            else:
                if run.startswith("eval "):  # shell completion: it must define the completion function
                    run += " && complete -p castore"
                p = subprocess.run(["bash", "-c", run], cwd=work, env=env, capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL)
                assert p.returncode == 0, f"README.md:{line}: {cmd}\nstdout: {p.stdout}\nstderr: {p.stderr}"
                assert "Traceback" not in p.stderr, (cmd, p.stderr)
            ran.append(cmd)

    # what the blocks did, checked once they all ran
    s = scope["s"]
    assert [m.role for m in s.messages("main")][:4] == ["user", "assistant", "tool", "assistant"]
    assert scope["result"].final_output and (work / "back.jsonl").is_file()
    assert (work / "session.html").read_text().startswith("<!DOCTYPE html>")
    with castore.open(str(work / "copy" / ".castore")) as copy:  # clone DIR puts the store in DIR/.castore
        assert copy.apps() == ["weather-app"]
        assert {i.session for i in copy.sessions("weather-app")} >= {"s1"}
    with castore.open(str(work / ".castore")) as local:
        assert not local.session("weather-app", "alice", "s2").exists()  # delete-session ran
        s1 = local.session("weather-app", "alice", "s1")
        assert "answered" in s1.labels() and s1.show("HEAD").kind == "compaction"
        assert local.session("pi", "local", "s1").exists()  # the Pi import
    with castore.open("s3://bucket/agents") as bucket:
        assert {"weather-app", "openai-agents"} <= set(bucket.apps())  # pushed; the Agents SDK run
    assert any(c.startswith("castore clone") for c in ran) and any(c.startswith("eval ") for c in ran)
    # the coding-agent archive: exported files are the originals, byte for byte
    name = "-home-me-app/0ccf1a04-1b4c-43b6-8aa5-79e41db43a68.jsonl"
    assert (work / "restored" / name).read_bytes() == (home / ".claude" / "projects" / name).read_bytes()
    assert any(c.startswith("castore grep") for c in ran)
    # one bucket, two machines: the second machine's Codex sessions reached the laptop whole
    with castore.open(str(home / "desk" / ".castore")) as desk:
        assert {"claude", "codex"} <= set(desk.apps())
    with castore.open(str(work / ".castore")) as local:
        assert local.sessions("codex")
    rollout = "2025/12/28/rollout-2025-12-28T12-18-30-x.jsonl"
    assert (work / "restored-codex" / rollout).read_bytes() == (home / ".codex" / "sessions" / rollout).read_bytes()


def test_readme_library_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = README.read_text()
    block = re.search(r"## Use it as a library\n\n```python\n(.*?)```", text, re.DOTALL)
    assert block, "the README lost its library example"
    monkeypatch.setenv("CASTORE_STORE", str(tmp_path / "store"))
    scope: dict[str, Any] = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)
    s = scope["s"]
    assert s.current_branch == "retry"
    assert s.state(scope["q"]) == {}
    assert [m.role for m in s.messages("main")] == ["user", "assistant", "tool", "assistant"]
    assert s.state("main")["last_city"] == "Beijing"
    assert s.store.session("weather-app", "alice", "s2").exists()


def test_every_relative_link_of_the_documentation_resolves() -> None:
    """README.md and the pages under docs/ link only to files that are there (anchors not checked)."""
    pages = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert len(pages) > 5 and not broken, broken
