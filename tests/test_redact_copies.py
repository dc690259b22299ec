"""A secret redacted after the session was pushed (docs/archive.md, "Copies pushed before"):
the remote keeps it until a forced push, an expiry of the remote's reflog (where the forced
push keeps the old tip) and a gc there. Every byte of both stores is scanned."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from castore.cli import main

SECRET = "AKIAZQXM4RKER7EXAMPL"


def _holding(*roots: Path) -> list[str]:
    return [str(p) for r in roots for p in r.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]


def test_a_remote_pushed_before_the_redaction_loses_the_secret_by_the_documented_steps(tmp_path: Path) -> None:
    local, remote = tmp_path / "laptop", tmp_path / "remote"
    runner = CliRunner()

    def run(*args: str, store: Path = local) -> str:
        r = runner.invoke(main, ["--store", str(store), *args])
        assert r.exit_code == 0, r.output
        return r.output

    run("-s", "a/u/s1", "append", "--role", "user", f"my key is {SECRET} ok")
    run("remote", "add", "origin", str(remote))
    run("push", "--all", "origin")
    run("redact", "--all")
    run("gc", "--grace", "0")
    assert _holding(local) == [] and _holding(remote)  # the remote still has it
    run("push", "--all", "--force", "origin")
    run("gc", "--grace", "0", store=remote)
    assert _holding(remote)  # the forced push kept the old tip in the remote's reflog
    run("reflog", "expire", "--older-than", "0s", store=remote)
    run("gc", "--grace", "0", store=remote)
    assert _holding(local, remote) == []
