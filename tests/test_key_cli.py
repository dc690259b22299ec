"""The key commands: ``castore key new``, ``castore key rotate``, ``castore erase`` and
``castore erasures``, on a store whose key store was made with the library (until
``castore init --encrypted`` makes one)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore.cli.main import main
from castore.crypto.keys import MasterKey
from castore.crypto.keystore import CONFIG_KEY, KeyStore


def run(tmp_path: Path, *args: str, env: dict[str, str] | None = None, input: str | None = None) -> Any:  # noqa: A002
    return CliRunner().invoke(main, ["--store", str(tmp_path / "store"), *args], env=env, input=input)


@pytest.fixture
def encrypted(tmp_path: Path) -> tuple[str, KeyStore]:
    """A store with a key store (master key text, key store) and three tenants' keys."""
    text = MasterKey.new()
    store = castore.open(str(tmp_path / "store"))
    store.init()
    ks = KeyStore.create(store.storage, MasterKey.from_text(text))
    store.update_config(lambda cfg: {**cfg, CONFIG_KEY: ks.config})
    for user in ("alice", "bob", None):
        ks.tenant_keys("app", user, create=True)
    store.close()
    return text, ks


def test_key_new_prints_a_fresh_master_key(tmp_path):
    a, b = run(tmp_path, "key", "new"), run(tmp_path, "key", "new")
    assert a.exit_code == 0 and b.exit_code == 0
    assert len(base64.b64decode(a.stdout.strip(), validate=True)) == 32
    assert a.stdout != b.stdout


def test_erase_a_user_then_list_the_erasures(tmp_path, encrypted):
    text, ks = encrypted
    r = run(tmp_path, "erase", "app/alice", "--yes")  # no master key needed
    assert r.exit_code == 0, r.output
    assert "erased user 'alice' of app 'app'" in r.stderr and "1 data key destroyed" in r.stderr
    listed = run(tmp_path, "erasures", "--json")
    [doc] = json.loads(listed.stdout)
    assert doc["app"] == "app" and doc["user"] == "alice" and doc["keys"] == 1
    text_listing = run(tmp_path, "erasures").stdout
    assert "user 'alice' of app 'app'" in text_listing and "(1 key)" in text_listing
    with pytest.raises(castore.TenantErased, match="was erased"):
        KeyStore.open(ks.storage, ks.config, MasterKey.from_text(text)).tenant_keys("app", "alice")


def test_erasures_lists_the_latest_n_as_every_listing_takes_n(tmp_path, encrypted):
    empty = run(tmp_path, "erasures")
    assert empty.exit_code == 0 and empty.stdout == "" and empty.stderr == "no erasures\n"
    for user in ("alice", "bob"):
        assert run(tmp_path, "erase", f"app/{user}", "--yes").exit_code == 0
    users = [e["user"] for e in json.loads(run(tmp_path, "erasures", "--json", "-n", "1").stdout)]
    assert users == ["bob"]  # the latest, as `llm logs -n 1`
    assert [e["user"] for e in json.loads(run(tmp_path, "erasures", "--json", "-n", "0").stdout)] == ["alice", "bob"]
    lines = run(tmp_path, "erasures", "-n", "1").stdout.splitlines()
    assert len(lines) == 1 and "user 'bob'" in lines[0]


def test_erase_an_app_asks_first(tmp_path, encrypted):
    refused = run(tmp_path, "erase", "app")  # not at a terminal, no --yes
    assert refused.exit_code == 2 and "cannot be undone: pass --yes" in refused.output
    assert json.loads(run(tmp_path, "erasures", "--json").stdout) == []
    r = run(tmp_path, "erase", "app", "--yes")
    assert r.exit_code == 0 and "app 'app' (all its users)" in r.stderr
    assert "its app key is destroyed, and with it 3 data keys" in r.stderr
    assert [k for k in (tmp_path / "store" / "keys" / "tenants").rglob("*") if k.is_file()] == []
    bad = run(tmp_path, "erase", "a/b/c", "--yes")
    assert bad.exit_code == 2


def test_rotate_rewraps_under_the_new_key(tmp_path, encrypted):
    text, ks = encrypted
    new = MasterKey.new()
    (tmp_path / "new.key").write_text(new)
    (tmp_path / "old.key").write_text(text)
    r = run(tmp_path, "key", "rotate", "--new-key-file", str(tmp_path / "new.key"),
            "--master-key-file", str(tmp_path / "old.key"))
    assert r.exit_code == 0, r.output
    assert "rewrapped 1 app key (which wrap every data key)" in r.stderr
    with pytest.raises(castore.WrongKey):
        KeyStore.open(ks.storage, ks.config, MasterKey.from_text(text))
    KeyStore.open(ks.storage, ks.config, MasterKey.from_text(new)).tenant_keys("app", "bob")
    again = run(tmp_path, "key", "rotate", "--new-key-file", str(tmp_path / "new.key"),
                env={"CASTORE_MASTER_KEY": text})  # the old key from the environment: refused
    assert again.exit_code == 1
    assert again.output.startswith("Error: wrong master key") and len(again.output.strip().splitlines()) == 1


@pytest.mark.parametrize("args, env, needle", [
    (["key", "rotate", "--new-key-file", "NEW"], {"CASTORE_MASTER_KEY": ""}, "no master key: give --master-key-file"),
    (["key", "rotate", "--new-key-file", "NEW"], {"CASTORE_MASTER_KEY": "bad!"}, "not base64"),
    (["key", "rotate", "--new-key-file", "missing.key"], None, "no master key file"),
])
def test_key_mistakes_are_one_error_line(tmp_path, encrypted, monkeypatch, args, env, needle):
    text, _ = encrypted
    (tmp_path / "new.key").write_text(MasterKey.new())
    monkeypatch.chdir(tmp_path)
    args = [str(tmp_path / "new.key") if a == "NEW" else a for a in args]
    r = run(tmp_path, *args, env=env or {"CASTORE_MASTER_KEY": text})
    assert r.exit_code == 1
    assert r.output.startswith("Error: ") and needle in r.output and len(r.output.strip().splitlines()) == 1


def test_a_store_that_is_not_encrypted_says_so(tmp_path):
    castore.open(str(tmp_path / "store")).init()
    r = run(tmp_path, "erasures")
    assert r.exit_code == 1 and "is not encrypted" in r.output


@pytest.mark.parametrize("lost", ["keys/tenants/app/alice.key", "keys/tenants/app.key"])
def test_fsck_and_gc_with_a_lost_key_file_name_it_and_the_remedy_and_delete_nothing(tmp_path, lost: str) -> None:
    """A data key file or an app key file lost while the tenant holds data: fsck and gc stop
    with one line that names the file and the remedy (restore it from a backup of the key
    store: docs/encryption.md, "The key check"), and delete nothing. Before, the data key's
    line named only the key store, and the app key's gave no remedy."""
    text = MasterKey.new()
    url = str(tmp_path / "store")
    with castore.open(url, encrypted=True, master_key=text) as st:
        for user in ("alice", "bob"):
            st.session("app", user, "s").append(castore.Message(role="user", content=f"hi {user}"))
    (tmp_path / "store" / lost).unlink()
    before = sorted(p for p in (tmp_path / "store").rglob("*") if p.is_file())
    env = {"CASTORE_MASTER_KEY": text}
    for args in (["fsck"], ["gc", "--grace", "0"]):
        out = run(tmp_path, *args, env=env)
        assert out.exit_code == 1, out.output
        lines = out.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), out.output
        assert f"{url}/{lost}" in lines[0] and "restore it from a backup of the key store" in lines[0], lines[0]
    assert sorted(p for p in (tmp_path / "store").rglob("*") if p.is_file()) == before
