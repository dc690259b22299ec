"""Secrets redacted before they are stored: detection, the store setting on every write path,
``import --redact``, exports that say so, and ``castore redact`` over sessions already stored.

Every secret here is made up in the test (random characters in each format's shape), never a
real key. "No secret in the store" is checked on every file of the store folder as it lies on
disk and on every stored object's decompressed bytes (packs are compressed: a raw scan alone
would miss a secret); each such check has a control, the same writes without redaction, where
the scan does find the secret.
"""

from __future__ import annotations

import json
import lzma
import random
import string
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main
from castore.grep.files import plain_files
from castore.redact import KINDS, REDACTED_INFO, Finding, Redactor
from castore.scrub import redact_sessions

DATA = Path(__file__).resolve().parent / "data"
_rng = random.Random(38)
ALNUM = string.ascii_letters + string.digits


def _chars(n: int, alphabet: str = ALNUM) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def _upper(n: int) -> str:
    return _chars(n, string.ascii_uppercase + string.digits)


def _pem() -> str:
    body = "\n".join(_chars(64, ALNUM + "+/") for _ in range(6))
    return f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"


def _jwt() -> str:
    return "eyJhbGciOiJIUzI1NiJ9.eyJ" + _chars(40, ALNUM + "_-") + "." + _chars(43, ALNUM + "_-")


#: kind -> (text holding one secret of it, the secret)
def _samples() -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}

    def add(kind: str, secret: str, text: str = "{}") -> None:
        out[kind] = (text.format(secret), secret)

    add("aws-access-key", "AKIA" + _upper(16), "export AWS_ACCESS_KEY_ID={}")
    add("aws-secret-key", _chars(40, ALNUM + "/+"), 'aws_secret_access_key = "{}"')
    add("gcp-api-key", "AIza" + _chars(35, ALNUM + "_-"), "key={}&q=1")
    add("azure-storage-key", _chars(86, ALNUM + "+/") + "==",
        "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={};EndpointSuffix=core.windows.net")
    add("azure-client-secret", _chars(3) + "8Q~" + _chars(31, ALNUM + "_~.-") + "a",
        "client secret {} end")
    add("github-token", "ghp_" + _chars(36), "git push https://x@github.com with {}")
    add("gitlab-token", "glpat-" + _chars(20), "GITLAB {}")
    add("openai-key", "sk-proj-" + _chars(48, ALNUM + "_-"), "OPENAI {}")
    add("anthropic-key", "sk-ant-api03-" + _chars(90, ALNUM + "_-"), "use {} please")
    add("openrouter-key", "sk-or-v1-" + _chars(64, "0123456789abcdef"), "router {}")
    add("huggingface-token", "hf_" + _chars(34), "HF {}")
    add("groq-key", "gsk_" + _chars(52), "groq {}")
    add("xai-key", "xai-" + _chars(80), "grok {}")
    add("replicate-token", "r8_" + _chars(37), "rep {}")
    add("perplexity-key", "pplx-" + _chars(48), "pplx {}")
    add("slack-token", "xoxb-" + _chars(12, string.digits) + "-" + _chars(24), "slack {}")
    add("slack-webhook", "hooks.slack.com/services/T" + _upper(8) + "/B" + _upper(8) + "/" + _chars(24),
        "POST https://{}")
    add("stripe-key", "sk_live_" + _chars(24), "stripe {}")
    add("npm-token", "npm_" + _chars(36), "//registry.npmjs.org/:_authToken={}")
    add("pypi-token", "pypi-AgEIcHlwaS5vcmc" + _chars(60, ALNUM + "_-"), "password = {}")
    add("private-key", _pem(), "{}\n")
    add("jwt", _jwt(), "cookie: session={}")
    add("url-password", "Pw" + _chars(14) + "7!", "git clone https://alice:{}@git.example.org/repo.git")
    add("bearer-token", _chars(40, ALNUM + "._-"), "curl -H 'Authorization: Bearer {}' https://api")
    add("password", "Tr0ub4d" + _chars(10), "DB_PASSWORD={}")
    add("api-key", _chars(28), '{{"api_key": "{}"}}')
    add("token", _chars(32), "refresh_token: {}")
    add("secret", _chars(24), 'client_secret = "{}"')
    return out


SAMPLES = _samples()
KEY = bytes(range(32))


def test_every_kind_has_a_sample() -> None:
    assert set(SAMPLES) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_each_kind_is_replaced_by_its_tag_in_text_and_in_a_json_line(kind: str) -> None:
    text, secret = SAMPLES[kind]
    r = Redactor(KEY)
    found: list[Finding] = []
    out = r.text(text, found)
    assert secret not in out
    assert [f.kind for f in found] == [kind] and found[0].tag in out
    assert found[0].tag.startswith(f"[REDACTED:{kind}:") and len(found[0].tag) == len(f"[REDACTED:{kind}:]") + 8
    # the same text inside a JSON line, as an agent's transcript holds it (escaped quotes, \n)
    line = json.dumps({"type": "tool_result", "content": text}).encode() + b"\n"
    raw = r.raw(line)
    assert secret.encode() not in raw and secret.split("\n")[1].encode() not in raw if "\n" in secret else True
    assert json.loads(raw)["content"] == out  # still JSON; the same tag as in the decoded text
    assert r.text(out) == out and r.raw(raw) == raw  # a tag is never redacted again


@pytest.mark.parametrize("text", [
    "task-management-system-design-document", "password = get_password()", "token = self.token",
    "tokenizer = AutoTokenizer.from_pretrained('gpt2')", '"input_tokens": 1234, "output_tokens": 56',
    '"session_id": "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"', "postgres://user:${DB_PASSWORD}@db/app",
    "https://user:password@example.com", "PASSWORD=changeme", 'api_key = "<your-api-key>"',
    "see https://github.com/anthropics/claude-code/issues/63593", "sk-learn is a library", "AKIA lowercase akiaabc",
    "the keyword monkey=banana12", "secret: hunter2",
])
def test_ordinary_text_is_left_as_it_is(text: str) -> None:
    found: list[Finding] = []
    assert Redactor(KEY).text(text, found) == text and found == []


def test_tags_are_keyed_stable_and_never_the_secret() -> None:
    text, secret = SAMPLES["github-token"]
    a, b = Redactor(KEY), Redactor(bytes(32))
    assert a.text(text) == Redactor(KEY).text(text)  # the same key: the same tag
    assert a.text(text) != b.text(text)  # another store's key: another tag
    other = text.replace(secret, "ghp_" + _chars(36))
    assert a.text(other) != a.text(text)  # another secret: another tag
    with pytest.raises(ValueError):
        Redactor(b"short")


def test_a_private_key_has_one_tag_json_escaped_or_not() -> None:
    pem = SAMPLES["private-key"][1]
    r = Redactor(KEY)
    decoded = r.text(pem)
    escaped = r.raw(json.dumps({"private_key": pem}).encode())
    assert decoded in json.loads(escaped)["private_key"]


def test_values_are_redacted_inside_and_bytes_left_alone() -> None:
    secret = SAMPLES["aws-access-key"][1]
    r = Redactor(KEY)
    v = {"a": [secret, 1, {"b": (secret,)}], "img": secret.encode(), "n": None}
    out = r.value(v)
    assert secret not in json.dumps({k: x for k, x in out.items() if k != "img"})
    assert out["img"] == secret.encode()  # bytes inside a value: a serializer's output, untouched
    clean = {"a": ["x"]}
    assert r.value(clean) is clean


# -- the store ----------------------------------------------------------------------------------
def _store_bytes(url: str) -> list[tuple[str, bytes]]:
    """Every file of the store folder as it lies on disk, and every stored object's bytes
    (decompressed: what a pack holds compressed)."""
    out = [(str(p), p.read_bytes()) for p in Path(url).rglob("*") if p.is_file()]
    with castore.open(url) as st:
        ids = list(st.objects.iter_ids())
        out += [(f"object {oid}", c) for oid, c in st.objects.get_canonical_many(ids).items()]
    return out


def _holding(url: str, secrets: list[str]) -> list[str]:
    """Where in the store any of ``secrets`` (or any line of a multi-line one) is found."""
    needles = [s.encode() for s in secrets] + [ln.encode() for s in secrets for ln in s.split("\n")[1:-1]]
    return [name for name, data in _store_bytes(url) if any(n in data for n in needles)]


def _write_everywhere(st: castore.Store, app: str = "app", secrets: dict[str, tuple[str, str]] = SAMPLES) -> None:
    texts = [t for t, _ in secrets.values()]
    s = st.session(app, "u", "s1")
    s.append(castore.Message(role="user", content=texts[0]), meta={"note": texts[1]})
    s.append_many([castore.Message(role="assistant", content=[{"type": "tool_use", "name": "Bash",
                                                               "input": {"command": texts[2]}}]),
                   castore.Message(role="tool", content=texts[3])])
    s.append(castore.Custom("env", {"data": texts[4:8]}), state_delta={"big": " ".join(texts[8:20]),
                                                                        "small": texts[5]})
    s.append(castore.Event(author="tool", message=castore.Message(role="tool", content=texts[20]),
                           state_delta={"app:shared": texts[21:]}))
    s.set_info({"title": texts[6]})


def test_store_setting_redacts_library_appends_state_meta_and_info(tmp_path: Path) -> None:
    secrets = [s for _, s in SAMPLES.values()]
    plain, red = str(tmp_path / "plain"), str(tmp_path / "red")
    with castore.open(plain) as st:
        _write_everywhere(st)
    assert _holding(plain, secrets)  # control: the scan finds what was stored as given
    with castore.open(red) as st:
        st.set_redact(True)
        assert st.config["redact"] is True and len(st.config["redact_key"]) == 64
    with castore.open(red) as st:  # a later handle reads the setting
        assert st.redactor is not None
        _write_everywhere(st)
        s = st.session("app", "u", "s1")
        assert "[REDACTED:" in s.messages()[0].content and "[REDACTED:" in s.state()["big"]
        assert s.info[REDACTED_INFO] is True and "[REDACTED:" in s.info["title"]
    assert _holding(red, secrets) == []


def test_the_same_secret_has_the_same_tag_across_sessions_and_handles(tmp_path: Path) -> None:
    text = SAMPLES["anthropic-key"][0]
    url = str(tmp_path / "s")
    with castore.open(url) as st:
        st.set_redact(True)
        st.session("a", "u", "one").append(castore.Message(role="user", content=text))
    with castore.open(url) as st:
        st.session("b", "v", "two").append(castore.Message(role="user", content=f"again: {text}"))
        one = st.session("a", "u", "one").messages()[0].content
        two = st.session("b", "v", "two").messages()[0].content
    assert one.startswith("use [REDACTED:anthropic-key:") and two == f"again: {one}"


def test_a_handle_may_redact_without_the_setting_and_a_bad_key_is_refused(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    with castore.open(url) as st:
        st.init()
        assert st.redactor is None
        st.redact_writes(True)
        assert st.redactor is not None and "redact" not in st.config  # the key, not the setting
        st.redact_writes(False)
        assert st.redactor is None
        st.update_config(lambda c: {**c, "redact": True, "redact_key": "nothex"})
    with pytest.raises(castore.FormatError, match="redact_key"):
        castore.open(url)


def test_pi_adapter_writes_are_redacted_by_the_setting(tmp_path: Path) -> None:
    from castore.adapters.pi import import_session

    src = tmp_path / "pi.jsonl"
    src.write_bytes(_inject(lzma.decompress((DATA / "pi" / "before-compaction.jsonl.xz").read_bytes())))
    secrets = [s for _, s in SAMPLES.values()]
    with castore.open(str(tmp_path / "plain")) as st:
        import_session(st, str(src))
    assert _holding(str(tmp_path / "plain"), secrets)
    with castore.open(str(tmp_path / "red")) as st:
        st.set_redact(True)
        r = import_session(st, str(src))
        assert any("[REDACTED:" in str(m.content) for m in st.session(*r.key).messages())
    assert _holding(str(tmp_path / "red"), secrets) == []


# -- imports and exports --------------------------------------------------------------------------
def _inject(data: bytes, texts: list[str] | None = None) -> bytes:
    """A JSONL file's bytes with every sample secret added to the first "text" field found."""
    todo = ["\n".join(texts if texts is not None else [t for t, _ in SAMPLES.values()])]

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, x in v.items():
                if k == "text" and isinstance(x, str) and todo:
                    x = f"{x} {todo.pop()}"
                out[k] = walk(x)
            return out
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    lines = [json.dumps(walk(json.loads(ln))).encode() for ln in data.splitlines() if ln.strip()]
    assert not todo, "the file has no text field"
    return b"\n".join(lines) + b"\n"


def _claude_file(tmp_path: Path, n: int = 0) -> Path:
    """A Claude Code session: a prompt, a tool call and its result, each holding secrets."""
    texts = [t for t, _ in SAMPLES.values()]
    third = len(texts) // 3
    sid = "5e55a1d0-0000-4000-8000-00000000000" + str(n)
    base = {"sessionId": sid, "cwd": "/tmp", "version": "2.0.0", "isSidechain": False, "userType": "external"}
    lines = [
        {**base, "type": "user", "uuid": "u1", "parentUuid": None, "timestamp": "2026-01-01T00:00:00Z",
         "message": {"role": "user", "content": "\n".join(texts[:third])}},
        {**base, "type": "assistant", "uuid": "u2", "parentUuid": "u1", "timestamp": "2026-01-01T00:00:01Z",
         "message": {"role": "assistant", "model": "claude", "content": [
             {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "\n".join(texts[third:2 * third])}}],
             "usage": {"input_tokens": 10, "output_tokens": 5}}},
        {**base, "type": "user", "uuid": "u3", "parentUuid": "u2", "timestamp": "2026-01-01T00:00:02Z",
         "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                  "content": "\n".join(texts[2 * third:])}]}},
    ]
    path = tmp_path / "projects" / "-tmp-proj" / f"{sid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(ln) + "\n" for ln in lines))
    return path


def _cli(store: Path, *args: str) -> Any:
    return CliRunner().invoke(main, ["--store", str(store), *args])


def test_import_claude_redact_stores_no_secret_and_exports_redacted(tmp_path: Path) -> None:
    src = _claude_file(tmp_path)
    secrets = [s for _, s in SAMPLES.values()]
    assert _cli(tmp_path / "plain", "import", "claude", str(src)).exit_code == 0
    assert _holding(str(tmp_path / "plain"), secrets)  # control
    r = _cli(tmp_path / "red", "import", "claude", str(src), "--redact")
    assert r.exit_code == 0, r.output
    assert _holding(str(tmp_path / "red"), secrets) == []
    # the import says what it found, per session, kinds and counts, as castore redact does of
    # the same file stored plainly (one secret stored in two places is one secret); never a secret
    key = f"claude/-tmp-proj/{src.stem}"
    assert f"{key}: redacted " + ", ".join(f"{n} {k}" for k, n in _kinds_redact_finds(tmp_path / "plain", key).items()) \
        in r.stderr.splitlines()
    assert f"{len(SAMPLES)} secrets redacted in 1 session" in r.stderr
    assert not any(s in r.stdout + r.stderr for s in secrets)
    # more lines with secrets, imported incrementally: still none stored, nothing twice
    with src.open("a") as f:
        f.write(json.dumps({"type": "user", "uuid": "u4", "parentUuid": "u3", "sessionId": src.stem,
                            "timestamp": "2026-01-01T00:00:03Z",
                            "message": {"role": "user", "content": SAMPLES["openai-key"][0]}}) + "\n")
    r = _cli(tmp_path / "red", "import", "claude", str(src), "--redact", "--json")
    assert r.exit_code == 0 and [d["lines"] for d in json.loads(r.stdout)] == [1]
    assert [d["redacted"] for d in json.loads(r.stdout)] == [{"openai-key": 1}]  # what this import found
    assert r.stderr.splitlines()[0] == f"{key}: redacted 1 openai-key"
    assert _holding(str(tmp_path / "red"), secrets) == []
    r = _cli(tmp_path / "red", "export", "claude", str(tmp_path / "out"))
    assert r.exit_code == 0 and "redacted when stored" in r.stderr
    out = (tmp_path / "out" / "-tmp-proj" / src.name).read_bytes()
    assert out == Redactor(_key(tmp_path / "red")).raw(src.read_bytes())  # the file, redacted line by line
    assert not any(s.encode() in out for s in secrets)
    r = _cli(tmp_path / "red", "show", "-s", f"claude/-tmp-proj/{src.stem}", "HEAD")
    assert r.exit_code == 0 and "[REDACTED:openai-key:" in r.stdout
    # a store that was never redacted says nothing of the kind
    r = _cli(tmp_path / "plain", "export", "claude", str(tmp_path / "out2"))
    assert r.exit_code == 0 and "redacted" not in r.stderr


def test_redact_counts_secrets_as_the_import_does_and_takes_s_after_its_name(tmp_path: Path) -> None:
    # `castore redact` said "N secrets found" counting places (a secret in a line's body and in
    # its kept bytes twice), where `import --redact` of the same file counts each secret once;
    # and `castore redact -s KEY` (the global -s after the command's name) was "No such option"
    src = _claude_file(tmp_path)
    assert _cli(tmp_path / "plain", "import", "claude", str(src)).exit_code == 0
    r = _cli(tmp_path / "red", "import", "claude", str(src), "--redact")
    assert r.exit_code == 0 and f"{len(SAMPLES)} secrets redacted in 1 session" in r.stderr
    key = f"claude/-tmp-proj/{src.stem}"
    r = _cli(tmp_path / "plain", "redact", "-s", key, "--dry-run")
    assert r.exit_code == 0, r.output
    places = len(r.stdout.splitlines())
    assert places > len(SAMPLES)  # the body and the line's kept bytes
    assert f"dry run: {len(SAMPLES)} secrets ({places} places) found in 1 session; nothing was written" \
        in r.stderr.splitlines()


def test_export_of_a_redacting_import_that_found_nothing_does_not_say_the_file_changed(tmp_path: Path) -> None:
    # a session imported with --redact is marked redacted whether or not a secret was found;
    # its export said "the files are not the originals byte for byte" of a file given back exactly
    src = DATA / "claude-code" / "claude-code-log" / "session_b.jsonl"
    r = _cli(tmp_path / "red", "import", "claude", str(src), "--redact")
    assert r.exit_code == 0 and "redacted" not in r.stderr  # nothing found, nothing said
    r = _cli(tmp_path / "red", "export", "claude", str(tmp_path / "out"))
    assert r.exit_code == 0 and "redacted when stored" in r.stderr
    assert (tmp_path / "out" / "claude-code-log" / src.name).read_bytes() == src.read_bytes()
    assert "not the originals" not in r.stderr and "each secret replaced" in r.stderr


def _kinds_redact_finds(store: Path, key: str) -> dict[str, int]:
    """How many distinct secrets of each kind `castore redact --dry-run` finds in a session."""
    r = _cli(store, "redact", key, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    found = {(f["kind"], f["tag"]) for d in json.loads(r.stdout) if d.get("session") == key for f in d["found"]}
    return dict(sorted(Counter(kind for kind, _ in found).items()))


def _key(store: Path) -> bytes:
    return bytes.fromhex(json.loads((store / "castore.json").read_text())["redact_key"])


def test_import_codex_and_pi_take_redact(tmp_path: Path) -> None:
    secrets = [s for _, s in SAMPLES.values()]
    codex = tmp_path / "rollout.jsonl"
    codex.write_bytes(_inject((DATA / "codex" / "sample_codex_session.jsonl").read_bytes()))
    pi = tmp_path / "pi.jsonl"
    pi.write_bytes(_inject(lzma.decompress((DATA / "pi" / "before-compaction.jsonl.xz").read_bytes())))
    assert _cli(tmp_path / "plain", "import", "codex", str(codex)).exit_code == 0
    assert _holding(str(tmp_path / "plain"), secrets)  # control
    assert _cli(tmp_path / "plain", "import", "pi", str(pi)).exit_code == 0
    r = _cli(tmp_path / "red", "import", "codex", str(codex), "--redact")
    assert r.exit_code == 0, r.output
    assert "codex/local/019b64e5-57fa-7463-b644-fba7e456f905: redacted 1 anthropic-key, 1 api-key, " in r.stderr
    r = _cli(tmp_path / "red", "import", "pi", str(pi), "--redact", "--json")
    assert r.exit_code == 0, r.output
    pi_key = "pi/local/ffae836b-9420-4060-ac13-7745215f90ff"
    assert [d["redacted"] for d in json.loads(r.stdout)] == [_kinds_redact_finds(tmp_path / "plain", pi_key)]
    assert f"{len(SAMPLES)} secrets redacted in 1 session" in r.stderr
    assert _holding(str(tmp_path / "red"), secrets) == []
    r = _cli(tmp_path / "red", "export", "codex", str(tmp_path / "out"))
    assert r.exit_code == 0 and "redacted when stored" in r.stderr
    out = (tmp_path / "out" / codex.name).read_bytes()
    assert out == Redactor(_key(tmp_path / "red")).raw(codex.read_bytes())


def test_import_gemini_takes_redact_for_jsonl_and_whole_file_sessions(tmp_path: Path) -> None:
    secrets = [s for _, s in SAMPLES.values()]
    chats = tmp_path / "gemini" / "my-app" / "chats"
    chats.mkdir(parents=True)
    src = DATA / "gemini" / "tmp" / "my-app" / "chats"
    jsonl = chats / "session-2026-03-10T09-00-7f3c2a9e.jsonl"
    jsonl.write_bytes(_inject((src / jsonl.name).read_bytes()))
    whole = json.loads((src / "session-2025-09-01T08-00-a1b2c3d4.json").read_text())
    whole["messages"][0]["content"] += "\n" + "\n".join(t for t, _ in SAMPLES.values())
    (chats / "session-2025-09-01T08-00-a1b2c3d4.json").write_text(json.dumps(whole, indent=2))
    assert _cli(tmp_path / "plain", "import", "gemini", str(tmp_path / "gemini")).exit_code == 0
    assert _holding(str(tmp_path / "plain"), secrets)  # control
    r = _cli(tmp_path / "red", "import", "gemini", str(tmp_path / "gemini"), "--redact", "--json")
    assert r.exit_code == 0, r.output
    assert sum(d["lines"] for d in json.loads(r.stdout)) > 0
    assert [sum(d["redacted"].values()) for d in json.loads(r.stdout) if d["redacted"]] == [len(SAMPLES)] * 2
    assert f"{2 * len(SAMPLES)} secrets redacted in 2 sessions" in r.stderr
    assert _holding(str(tmp_path / "red"), secrets) == []
    r = _cli(tmp_path / "red", "export", "gemini", str(tmp_path / "out"))
    assert r.exit_code == 0 and "redacted when stored" in r.stderr
    out = b"".join(p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert b"[REDACTED:" in out and not any(s.encode() in out for s in secrets)


# -- castore redact ---------------------------------------------------------------------------------
def test_castore_redact_dry_run_changes_nothing_then_rewrites_and_gc_removes_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "s"
    index = tmp_path / "index"
    monkeypatch.setenv("CASTORE_GREP_INDEX", str(index))
    secrets = [s for _, s in SAMPLES.values()]
    src = _claude_file(tmp_path)
    assert _cli(store, "import", "claude", str(src)).exit_code == 0
    assert _cli(store, "grep", "-a", "AKIA").exit_code == 0  # the search index, built now, holds the text

    def in_index() -> bool:  # the chunks of text decompressed
        return any(s.encode() in data for folder in index.iterdir() for _, data in plain_files(str(folder))
                   for s in secrets)

    assert in_index()
    with castore.open(str(store)) as st:
        _write_everywhere(st)
        s = st.session("app", "u", "s1")
        s.branch("side", at="HEAD~1")
        s.label("v1", at="HEAD~2")
    files = {name: data for name, data in _store_bytes(str(store)) if not name.startswith("object")}
    r = _cli(store, "redact", "--all", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    docs = json.loads(r.stdout)
    assert [d.get("session", d.get("state")) for d in docs] == ["app", "app/u/s1", f"claude/-tmp-proj/{src.stem}"]
    kinds = {f["kind"] for d in docs for f in d["found"]}
    assert kinds == set(KINDS)
    assert {f["where"] for d in docs for f in d["found"]} >= {"body", "state", "meta", "blob", "info"}
    assert all(d["rewritten"] == 0 and d["moved"] == {} for d in docs)
    assert not any(s in r.stdout for s in secrets)  # the report never holds a secret
    after = {name: data for name, data in _store_bytes(str(store)) if not name.startswith("object")}
    assert after == files  # a dry run wrote nothing
    r = _cli(store, "redact", "--all")
    assert r.exit_code == 0, r.output
    assert not any(s in r.stdout + r.stderr for s in secrets)
    assert "commits written again" in r.stderr and "search index rebuilt" in r.stderr
    assert not in_index()
    with castore.open(str(store)) as st:
        s = st.session("app", "u", "s1")
        assert set(s.branches()) == {"main", "side"} and set(s.labels()) == {"v1"}
        assert "[REDACTED:" in s.messages()[0].content and s.info[REDACTED_INFO] is True
        assert "[REDACTED:" in s.state("side")["small"]
    # again: nothing left to find, nothing written
    r = _cli(store, "redact", "--all", "--json")
    assert all(d["found"] == [] and d["rewritten"] == 0 for d in json.loads(r.stdout))
    # the imported session goes on: a re-import adds nothing, the export is the redacted file
    r = _cli(store, "import", "claude", str(src), "--redact", "--json")
    assert r.exit_code == 0 and [d["lines"] for d in json.loads(r.stdout)] == [0]
    r = _cli(store, "export", "claude", str(tmp_path / "out"))
    assert r.exit_code == 0 and "redacted when stored" in r.stderr
    assert (tmp_path / "out" / "-tmp-proj" / src.name).read_bytes() == Redactor(_key(store)).raw(src.read_bytes())
    assert _holding(str(store), secrets)  # the old objects are still there ...
    assert _cli(store, "gc", "--grace", "0").exit_code == 0
    assert _holding(str(store), secrets) == []  # ... until gc


def test_castore_redact_enable_sets_the_store_setting_and_one_session_by_name(tmp_path: Path) -> None:
    store = tmp_path / "s"
    with castore.open(str(store)) as st:
        st.session("a", "u", "one").append(castore.Message(role="user", content=SAMPLES["jwt"][0]))
        st.session("a", "u", "two").append(castore.Message(role="user", content=SAMPLES["jwt"][0]))
    r = _cli(store, "redact", "a/u/one")
    assert r.exit_code == 0 and "jwt" in r.stdout
    with castore.open(str(store)) as st:
        assert "[REDACTED:jwt:" in st.session("a", "u", "one").messages()[0].content
        assert "[REDACTED" not in st.session("a", "u", "two").messages()[0].content
        assert st.redactor is None
    r = _cli(store, "redact", "--enable")
    assert r.exit_code == 0 and "redact on" in r.stderr
    with castore.open(str(store)) as st:
        assert st.redactor is not None
    assert _cli(store, "redact", "--disable").exit_code == 0
    with castore.open(str(store)) as st:
        assert st.redactor is None
    r = _cli(store, "redact", "a/u/one", "--all")
    assert r.exit_code == 2


def test_redact_sessions_in_the_library(tmp_path: Path) -> None:
    with castore.open(str(tmp_path / "s")) as st:
        s = st.session("a", "u", "one")
        s.append(castore.Message(role="user", content="fine"))
        before = s.head
        reports = redact_sessions(st, [s])
        assert reports[0].found == [] and s.head == before  # nothing to redact: nothing moves
        s.append(castore.Message(role="user", content=SAMPLES["github-token"][0]))
        reports = redact_sessions(st, [s])
        assert [f.kind for f in reports[0].found] == ["github-token"] and reports[0].rewritten == 1
        assert s.log()[-1].id == before  # the clean commit below keeps its id


def test_a_tenant_layout_store_redacts_every_tenant(tmp_path: Path) -> None:
    url = str(tmp_path / "s")
    text, secret = SAMPLES["openai-key"]
    with castore.open(url, layout="tenants") as st:
        st.session("a", "u", "before").append(castore.Message(role="user", content=text))  # a tenant opened first
        st.set_redact(True)
        st.session("a", "u", "s").append(castore.Message(role="user", content=text))
        st.session("b", "v", "s").append(castore.Message(role="user", content=text), state_delta={"app:k": text})
        assert st.session("b", "v", "s").messages()[0].content.startswith("OPENAI [REDACTED:openai-key:")
    holding = _holding(url, [secret])  # (every file on disk; the objects of the root store)
    assert holding and all("/tenants/a/u/" in h for h in holding)  # only the session written before
    with castore.open(url) as st:
        assert [f.kind for r in redact_sessions(st) for f in r.found] == ["openai-key"]
        assert "[REDACTED:openai-key:" in st.session("a", "u", "before").messages()[0].content
    with castore.open(url) as st:
        assert all(r.found == [] for r in redact_sessions(st, dry_run=True))


def test_redact_with_nothing_to_redact_leaves_real_sessions_as_they_were(tmp_path: Path) -> None:
    # the real Claude Code and Codex files hold no secret: `castore redact --all` found none,
    # yet marked each imported session redacted (its info names commits and blobs, mapped to
    # equal strings), so `export` said its files were not the originals
    from castore.adapters.claude_code import import_claude
    from castore.adapters.codex import import_codex

    url = str(tmp_path / "store")
    with castore.open(url, durable=False) as st:
        import_claude(st, DATA / "claude-code" / "session-share")
        import_codex(st, DATA / "codex")
        before = {s.key: (s.head, dict(s.info)) for s in (st.session(*k) for k in _keys(st))}
    runner = CliRunner()
    for _ in range(2):
        res = runner.invoke(main, ["--store", url, "redact", "--all"])
        assert res.exit_code == 0 and "0 secrets found in 7 sessions, 0 commits written again" in res.stderr
    with castore.open(url) as st:
        assert {s.key: (s.head, dict(s.info)) for s in (st.session(*k) for k in _keys(st))} == before
        assert not any(info.get(REDACTED_INFO) for _, info in before.values())
    res = runner.invoke(main, ["--store", url, "export", "codex", str(tmp_path / "out")])
    assert res.exit_code == 0 and "redacted" not in res.stderr
    assert (tmp_path / "out" / "sample_codex_session.jsonl").read_bytes() == \
        (DATA / "codex" / "sample_codex_session.jsonl").read_bytes()


def _keys(st: castore.Store) -> list[tuple[str, str, str]]:
    from castore.porcelain import session_keys

    return session_keys(st)
