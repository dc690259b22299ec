#!/usr/bin/env python
"""Benchmark: what redacting secrets costs per MB, and on an import.

On real session text (the Claude Code, Codex, Pi and Gemini CLI sessions under tests/data,
every line as an agent wrote it), measures, best of ``--repeat`` in this process:

* castore's redaction (:class:`castore.redact.Redactor`) of each raw line, in MB/s and ms/MB
  (the raw bytes and the str forms alternated round by round);
* detect-secrets (PyPI, when installed) scanning the same lines with its default plugins
  (``scan_line``, detection only: no replacement, no keyed tag), the detector library it
  was weighed against;
* how many of the secret kinds castore redacts each finds in made-up samples (one text per
  kind, random characters in the kind's shape);
* ``import claude`` of the Claude Code sessions and ``import pi`` of the Pi sessions into a
  fresh local store, with and without redaction (``Store.redact_writes``), side by side.

Prints Markdown; ``--markdown FILE`` writes it as a page with the command, commit, machine
and load, writes the figures to ``docs/benchmarks/measurements/redact.json`` and puts them in
docs/benchmarks/BENCHMARKS.md's redaction section (rendered by ``scripts/benchlib/redact.py``,
which ``scripts/bench`` renders again from that file when it writes the whole page).

    .venv/bin/python scripts/bench_redact.py [--repeat 5] [--claude-copies 10] [--pi-copies 1] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import glob
import json
import lzma
import os
import random
import shutil
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from benchlib import redact as redact_section  # noqa: E402

import castore  # noqa: E402
from castore.redact import KINDS, Redactor  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data")
#: how much of the text detect-secrets scans (it takes minutes for the whole)
DS_BYTES = 200_000


def corpus() -> list[bytes]:
    """Every line of the session files under tests/data (Pi's decompressed)."""
    lines: list[bytes] = []
    for path in sorted(glob.glob(os.path.join(DATA, "**", "*.jsonl*"), recursive=True)):
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".xz"):
            data = lzma.decompress(data)
        lines += data.splitlines(keepends=True)
    return lines


def best(fn: Callable[[], Any], repeat: int) -> float:
    """The shortest of ``repeat`` runs of ``fn``, in seconds."""
    return alternated([fn], repeat)[0]


def alternated(fns: list[Callable[[], Any]], repeat: int) -> list[float]:
    """The shortest of ``repeat`` runs of each of ``fns``, in seconds, run in turn round by
    round (the machine's load moves the same for all)."""
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, times in zip(fns, out, strict=True):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return [min(times) for times in out]


def samples() -> dict[str, str]:
    """One made-up text per kind castore redacts (the shapes of tests/test_redact.py)."""
    rng = random.Random(38)
    an = string.ascii_letters + string.digits

    def c(n: int, alphabet: str = an) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    up = string.ascii_uppercase + string.digits
    pem = "\n".join(c(64, an + "+/") for _ in range(6))
    return {
        "aws-access-key": "export AWS_ACCESS_KEY_ID=AKIA" + c(16, up),
        "aws-secret-key": f'aws_secret_access_key = "{c(40, an + "/+")}"',
        "gcp-api-key": "key=AIza" + c(35, an + "_-"),
        "azure-storage-key": f"AccountName=a;AccountKey={c(86, an + '+/')}==;",
        "azure-client-secret": f"secret {c(3)}8Q~{c(31, an + '_~.-')}a end",
        "github-token": "ghp_" + c(36),
        "gitlab-token": "glpat-" + c(20),
        "openai-key": "sk-proj-" + c(48, an + "_-"),
        "anthropic-key": "sk-ant-api03-" + c(90, an + "_-"),
        "openrouter-key": "sk-or-v1-" + c(64, "0123456789abcdef"),
        "huggingface-token": "hf_" + c(34),
        "groq-key": "gsk_" + c(52),
        "xai-key": "xai-" + c(80),
        "replicate-token": "r8_" + c(37),
        "perplexity-key": "pplx-" + c(48),
        "slack-token": f"xoxb-{c(12, string.digits)}-{c(24)}",
        "slack-webhook": f"https://hooks.slack.com/services/T{c(8, up)}/B{c(8, up)}/{c(24)}",
        "stripe-key": "sk_live_" + c(24),
        "npm-token": "//registry.npmjs.org/:_authToken=npm_" + c(36),
        "pypi-token": "pypi-AgEIcHlwaS5vcmc" + c(60, an + "_-"),
        "private-key": f"-----BEGIN RSA PRIVATE KEY-----\n{pem}\n-----END RSA PRIVATE KEY-----\n",
        "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJ" + c(40, an + "_-") + "." + c(43, an + "_-"),
        "url-password": f"git clone https://alice:Pw{c(14)}7!@git.example.org/r.git",
        "bearer-token": f"curl -H 'Authorization: Bearer {c(40, an + '._-')}'",
        "password": "DB_PASSWORD=Tr0ub4d" + c(10),
        "api-key": f'{{"api_key": "{c(28)}"}}',
        "token": "refresh_token: " + c(32),
        "secret": f'client_secret = "{c(24)}"',
    }


_KEEP: list[Any] = []


def detect_secrets_scanner() -> Callable[[str], list[str]] | None:
    """detect-secrets' line scan (default plugins), returning the types of the secrets a line
    holds; None when detect-secrets is not installed."""
    try:
        from detect_secrets.core.scan import scan_line
        from detect_secrets.settings import default_settings
    except ImportError:
        return None
    ctx = default_settings()
    ctx.__enter__()  # entered for the whole run: the plugins are configured once
    _KEEP.append(ctx)  # (a context manager dropped would be closed, its settings reset)

    def scan(line: str) -> list[str]:
        return [p.type for p in scan_line(line)]

    return scan


def time_imports(kind: str, src: str, repeat: int) -> tuple[float, float]:
    """Seconds of the best of ``repeat`` imports of ``src`` into a fresh local store, without
    and with redaction, alternated (the machine's load moves the same for both)."""
    plain, red = [], []
    for _ in range(repeat):
        plain.append(time_import(kind, src, False))
        red.append(time_import(kind, src, True))
    return min(plain), min(red)


def time_import(kind: str, src: str, redact: bool) -> float:
    """Seconds of one import of ``src`` into a fresh local store."""
    from castore.adapters.claude_code import import_claude
    from castore.adapters.pi import import_session

    times = []
    for _ in range(1):
        work = tempfile.mkdtemp(prefix="bench-redact-")
        try:
            with castore.open(os.path.join(work, "store")) as st:
                st.init()
                if redact:
                    st.redact_writes(True)
                t = time.perf_counter()
                if kind == "claude":
                    import_claude(st, src)
                else:
                    for path in sorted(glob.glob(os.path.join(src, "*.jsonl"))):
                        import_session(st, path, session_id=os.path.basename(path)[:-6])
                times.append(time.perf_counter() - t)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return min(times)


def copies_of(kind: str, n: int, work: str) -> tuple[str, int]:
    """A folder holding ``n`` copies of the tests/data sessions of ``kind`` (distinct session
    ids), and its size in bytes."""
    out = os.path.join(work, kind)
    size = 0
    if kind == "claude":
        for i in range(n):  # a projects folder: one folder per project, each copy a project of its own
            for project in ("claude-code-log", "session-share"):
                shutil.copytree(os.path.join(DATA, "claude-code", project), os.path.join(out, f"{project}-{i}"),
                                ignore=shutil.ignore_patterns("LICENSE", "README.md"))
        files = glob.glob(os.path.join(out, "**", "*.jsonl"), recursive=True)
    else:
        os.makedirs(out)
        files = []
        for i in range(n):
            for path in sorted(glob.glob(os.path.join(DATA, "pi", "*.jsonl.xz"))):
                dst = os.path.join(out, f"{i}-{os.path.basename(path)[:-3]}")
                with open(dst, "wb") as f:
                    f.write(lzma.decompress(open(path, "rb").read()))
                files.append(dst)
    for f in files:
        size += os.path.getsize(f)
    return out, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--claude-copies", type=int, default=10, help="copies of the Claude Code sessions imported")
    ap.add_argument("--pi-copies", type=int, default=1, help="copies of the Pi sessions imported")
    ap.add_argument("--markdown", metavar="FILE")
    args = ap.parse_args()
    load_before = os.getloadavg()
    lines = corpus()
    texts = [ln.decode("utf-8", "replace") for ln in lines]
    mb = sum(len(ln) for ln in lines) / 1e6
    r = Redactor(bytes(32))
    out: list[str] = []
    found: list[Any] = []
    t_raw, t_text = alternated([lambda: [r.raw(ln) for ln in lines], lambda: [r.text(t) for t in texts]],
                               args.repeat)
    for ln in lines:
        r.raw(ln, found)
    rows = [("castore `Redactor.raw` (each raw line, as imports do)", mb, t_raw, len(found)),
            ("castore `Redactor.text` (each line as a str)", mb, t_text, len(found))]
    scan = detect_secrets_scanner()
    if scan is not None:
        # detect-secrets is slow: it scans the first DS_BYTES of the lines (once)
        part, size = [], 0
        for t in texts:
            if size >= DS_BYTES:
                break
            part.append(t)
            size += len(t.encode())
        flagged: list[list[str]] = []
        t_ds = best(lambda: flagged.append([x for t in part for x in scan(t)]), 1)
        rows.append((f"detect-secrets 1.5 `scan_line`, default plugins, detection only (first {size / 1e6:.2f} MB)",
                     size / 1e6, t_ds, len(flagged[-1])))
    out.append(f"Redaction of {len(lines):,} lines ({mb:.2f} MB) of the Claude Code, Codex, Pi and Gemini CLI sessions "
               f"under tests/data, best of {args.repeat}:\n")
    out.append("| what | MB/s | ms per MB | vs castore raw | secrets found |")
    out.append("|---|---:|---:|---:|---:|")
    per_mb = t_raw / mb
    for name, size, t, n in rows:
        out.append(f"| {name} | {size / t:.2f} | {t / size * 1000:.1f} | {t / size / per_mb:.1f}x | {n} |")
    found = sum(1 for _, t in [(k, r.text(v)) for k, v in samples().items()] if "[REDACTED:" in t)
    out.append("")
    out.append(f"Made-up samples, one per kind castore redacts ({len(KINDS)} kinds): castore finds {found}.")
    if scan is not None:
        generic = {"Base64 High Entropy String", "Hex High Entropy String", "Secret Keyword"}
        types = {k: {t for ln in v.splitlines() or [v] for t in scan(ln)} for k, v in samples().items()}
        missed = [k for k, t in types.items() if not t]
        named = [k for k, t in types.items() if t - generic]
        out.append(f"detect-secrets flags {len(KINDS) - len(missed)} (missed: {', '.join(missed) or 'none'}); "
                   f"{len(named)} of them by a plugin for the format, the rest only as a high-entropy string or a "
                   f"secret keyword (no kind): {', '.join(k for k in types if k not in named and k not in missed)}.")
    imports: list[dict[str, Any]] = []
    work = tempfile.mkdtemp(prefix="bench-redact-src-")
    try:
        out.append("")
        out.append(f"Import into a fresh local store (format 3, durable) of {args.claude_copies} copies of the Claude "
                   f"Code sessions under tests/data and {args.pi_copies} of the Pi sessions, without and with "
                   f"redaction alternated, best of {args.repeat}:\n")
        out.append("| import | MB | plain | --redact | added | added per MB |")
        out.append("|---|---:|---:|---:|---:|---:|")
        for kind, copies in (("claude", args.claude_copies), ("pi", args.pi_copies)):
            src, size = copies_of(kind, copies, work)
            plain, red = time_imports(kind, src, args.repeat)
            smb = size / 1e6
            imports.append({"kind": kind, "mb": smb, "plain_s": plain, "redact_s": red})
            out.append(f"| `import {kind}` | {smb:.2f} | {plain * 1000:.0f} ms | {red * 1000:.0f} ms | "
                       f"{(red - plain) / plain * 100:+.0f}% | {(red - plain) / smb * 1000:+.0f} ms |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for ctx in _KEEP:  # detect-secrets' settings, restored before the interpreter goes down
        ctx.__exit__(None, None, None)
    text = "\n".join(out)
    print(text)
    if args.markdown:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
        load_after = os.getloadavg()
        command = (f".venv/bin/python scripts/bench_redact.py --repeat {args.repeat} --claude-copies "
                   f"{args.claude_copies} --pi-copies {args.pi_copies} --markdown {args.markdown}")
        date = time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())
        head = [
            "# Redaction: what it costs",
            "",
            f"Written by `{command}` at commit {commit}, {date}, "
            f"on {os.cpu_count()} cores, load {load_before[0]:.1f} before and {load_after[0]:.1f} after "
            "(a shared machine: compare within a table).",
            "",
        ]
        with open(args.markdown, "w") as f:
            f.write("\n".join(head) + text + "\n")
        figures = {"command": command, "commit": commit, "date": date, "cores": os.cpu_count(),
                   "load_before": load_before[0], "load_after": load_after[0], "repeat": args.repeat,
                   "lines": len(lines), "mb": mb,
                   "scan": [{"what": name, "mb": size, "s": t} for name, size, t, _ in rows],
                   "imports": imports}
        os.makedirs(os.path.dirname(redact_section.FIGURES), exist_ok=True)
        with open(redact_section.FIGURES, "w") as f:
            json.dump(figures, f, indent=1)
            f.write("\n")
        redact_section.splice(redact_section.section())


if __name__ == "__main__":
    main()
