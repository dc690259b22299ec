"""Sync of encrypted stores: which tenants' keys cross, and what becomes of an erased tenant
(docs/encryption.md, "Copies" and "Erasure"): store-wide work skips it, so a push or a pull
of every session goes on for the others and carries the erasure; naming it is `TenantErased`."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import castore
from castore.cli import main
from castore.crypto.keys import MasterKey
from castore.entries import Message
from castore.errors import TenantErased
from castore.maintenance import gc
from castore.sync import pull, push
from tests.conftest import Backend


@pytest.fixture
def key() -> str:
    return MasterKey.new()


def _two_tenants(url: str, key: str) -> None:
    with castore.open(url, encrypted=True, master_key=key) as store:
        store.session("app", "alice", "s1").append(Message(role="user", content="alice's"))
        store.session("app", "bob", "b1").append(Message(role="user", content="bob's"))


def test_push_and_pull_of_everything_skip_an_erased_tenant(backend: Backend, key: str, tmp_path: Path) -> None:
    local = str(tmp_path / "laptop")
    _two_tenants(local, key)
    with castore.open(local, master_key=key) as store, backend.open(master_key=key) as remote:
        assert push(store, remote).ok
    with castore.open(local, master_key=key) as store:
        store.encryption.keys.erase("app", "alice", by="test")
        store.session("app", "bob", "b1").append(Message(role="user", content="bob's second"))
        with backend.open(master_key=key) as remote:
            report = push(store, remote)  # every session: alice's tenant is erased here
            assert report.ok and report.tenants_erased == ["tenants/app/alice"]
        gc(store, grace=0)  # alice's bytes go; her empty folder may stay
        with backend.open(master_key=key) as remote:
            assert pull(remote, store).tenants_erased == ["tenants/app/alice"]
            with pytest.raises(TenantErased):
                push(store, remote, ("app", "alice"))
            with pytest.raises(TenantErased):
                pull(remote, store, ("app", "alice", "s1"))
    with backend.open(master_key=key) as remote:
        assert remote.session("app", "bob", "b1").messages()[-1].content == "bob's second"
        with pytest.raises(TenantErased):
            remote.session("app", "alice", "s1").messages()


def test_a_pull_of_everything_from_a_copy_that_has_not_heard_of_the_erasure(key: str, tmp_path: Path) -> None:
    """The remote still holds the erased tenant's objects and key: the pull carries the
    erasure there and copies the others' sessions."""
    local, remote_url = str(tmp_path / "laptop"), str(tmp_path / "remote")
    _two_tenants(local, key)
    with castore.open(local, master_key=key) as store, castore.open(remote_url, master_key=key) as remote:
        assert push(store, remote).ok
        remote.session("app", "bob", "b1").append(Message(role="user", content="from the remote"))
    runner = CliRunner()
    env = {"CASTORE_MASTER_KEY": key}
    assert runner.invoke(main, ["--store", local, "erase", "app/alice", "--yes"], env=env).exit_code == 0
    assert runner.invoke(main, ["--store", local, "remote", "add", "origin", remote_url], env=env).exit_code == 0
    r = runner.invoke(main, ["--store", local, "pull", "--all", "origin"], env=env)
    assert r.exit_code == 0, r.output
    assert "erased" in r.stderr and "app/alice" in r.stderr
    with castore.open(local, master_key=key) as store:
        assert store.session("app", "bob", "b1").messages()[-1].content == "from the remote"
    r = runner.invoke(main, ["--store", local, "push", "--all", "origin"], env=env)
    assert r.exit_code == 0, r.output  # and the push carries the erasure
    r = runner.invoke(main, ["--store", local, "sync", "origin"], env=env)  # as push and pull say it, once
    assert r.exit_code == 0 and r.stderr.count("skipped tenants/app/alice: erased") == 1, r.output
    with castore.open(remote_url, master_key=key) as remote, pytest.raises(TenantErased):
        remote.session("app", "alice", "s1").messages()


def test_a_push_of_one_session_makes_no_key_for_an_app_state_neither_side_has(key: str, tmp_path: Path) -> None:
    """Before, each side made its own key for the app's tenant, and the pair could sync that
    app no more ("different codecs")."""
    local, remote_url = str(tmp_path / "laptop"), str(tmp_path / "remote")
    with castore.open(local, encrypted=True, master_key=key) as store:
        store.session("app", "bob", "b1").append(Message(role="user", content="bob's"))
        with castore.open(remote_url, master_key=key) as remote:
            assert push(store, remote, ("app", "bob", "b1")).ok
            store.update_scope("app", None, {"shared": 1})  # the app's key is made now, once
            assert push(store, remote, ("app", "bob")).ok
            assert push(store, remote).ok and pull(remote, store).ok
    with castore.open(remote_url, master_key=key) as remote:  # opened with the key it was given
        assert remote.scope_state("app", None) == {"shared": 1}


def test_a_pull_never_writes_back_the_key_of_a_tenant_erased_here(key: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The remote has not heard of the erasure and still holds alice's key. Before, the pull
    wrote it back here and deleted it again afterwards: a process that died between the two
    left the erased key in the key store (and in any backup of it)."""
    from castore.crypto.keystore import KeyStore

    local, remote_url = str(tmp_path / "laptop"), str(tmp_path / "remote")
    _two_tenants(local, key)
    with castore.open(local, master_key=key) as store, castore.open(remote_url, master_key=key) as remote:
        assert push(store, remote).ok
        store.encryption.keys.erase("app", "alice")

        def killed(self: KeyStore, erasures: object = None) -> int:
            raise SystemExit("killed before the sweep")

        monkeypatch.setattr(KeyStore, "drop_erased", killed)
        with pytest.raises(SystemExit):
            pull(remote, store)
    assert not (tmp_path / "laptop" / "keys" / "tenants" / "app" / "alice.key").exists()
    assert (tmp_path / "remote" / "keys" / "tenants" / "app" / "alice.key").exists()  # (the control)


def _facts_of(store: castore.Store, codec: object = None) -> tuple[dict, object]:
    from castore.history import Hint

    t = store.tenant("app", "alice")
    meta = t.refs.read("sessions/app/alice/s1/heads/main").meta
    hint = Hint.from_meta(meta, t.objects.codec if codec is None else codec)  # type: ignore[arg-type]
    return meta, hint.facts if hint is not None else None


@pytest.mark.parametrize("encrypted", [False, True])
def test_the_model_a_session_uses_is_sealed_in_its_ref(key: str, tmp_path: Path, encrypted: bool) -> None:
    """A ref's read hint keeps what a budgeted context needs (the model, provider and
    thinking level in force, counts of messages): in an encrypted store it was kept in clear
    in every branch's ref file. It is sealed now, and still read back (and carried from tip to
    tip by the writer) with the key."""
    from castore.entries import ModelChange
    from castore.objects import PLAIN

    url = str(tmp_path / "s")
    with castore.open(url, encrypted=encrypted, **({"master_key": key} if encrypted else {})) as store:
        s = store.session("app", "alice", "s1")
        s.append(Message(role="user", content="hello"))
        s.append(ModelChange(model="ZEBU-MODEL", provider="ZEBU-PROVIDER", thinking_level="ZEBU-LEVEL"))
        s.append(Message(role="assistant", content="hi"))
        s.append(Message(role="user", content="more"))
        meta, facts = _facts_of(store)
        assert facts is not None and facts.depth == 3  # known at the tip: each append carried them
        assert (facts.model, facts.provider, facts.thinking_level) == ("ZEBU-MODEL", "ZEBU-PROVIDER", "ZEBU-LEVEL")
        if encrypted:
            assert _facts_of(store, PLAIN)[1] is None  # without the key, not known (and no error)
    found = [p for p in (tmp_path / "s").rglob("*") if p.is_file() and b"ZEBU" in p.read_bytes()]
    assert (found == []) is encrypted, found


def test_a_lost_key_file_is_reported_and_never_replaced_by_a_new_key(backend: Backend, key: str) -> None:
    """Before, the next opening of the tenant (even a listing) made it a new key: every read
    then failed as damage ("does not open with this store's key"), and the key restored from
    a backup had a rival in its place."""
    from castore.errors import KeyMissing
    from castore.storage import open_storage

    with backend.open(encrypted=True, master_key=key) as store:
        store.session("app", "alice", "s1").append(Message(role="user", content="alice's"))
    storage = open_storage(backend.url, **backend.options)
    kept = storage.read("keys/tenants/app/alice.key")
    storage.delete("keys/tenants/app/alice.key")
    with backend.open(master_key=key) as store:
        assert ("app", "alice") in store.tenants()  # names need no key
        with pytest.raises(KeyMissing, match="its key file was lost"):
            store.session("app", "alice", "s1").messages()
        with pytest.raises(KeyMissing):
            store.session("app", "alice", "s1").append(Message(role="user", content="more"))
        store.session("app", "bob", "b1").append(Message(role="user", content="bob's"))  # a new tenant: a key
    assert storage.read_many(["keys/tenants/app/alice.key"]) == {"keys/tenants/app/alice.key": None}
    storage.write("keys/tenants/app/alice.key", kept)  # restored from a backup
    with backend.open(master_key=key) as store:
        assert store.session("app", "alice", "s1").messages()[0].content == "alice's"
        assert store.session("app", "bob", "b1").messages()[0].content == "bob's"
    storage.close()


def test_redact_of_every_session_skips_an_erased_tenant(key: str, tmp_path: Path) -> None:
    """Before, one erased user stopped `castore redact --all` of the whole store (TenantErased)."""
    from castore.scrub import redact_sessions

    url = str(tmp_path / "s")
    secret = "AKIAZQXM4RKER7EXAMPL"
    with castore.open(url, encrypted=True, master_key=key) as store:
        store.session("app", "alice", "s1").append(Message(role="user", content=f"key {secret}"))
        store.session("app", "bob", "b1").append(Message(role="user", content=f"key {secret}"))
        store.encryption.keys.erase("app", "alice")
    with castore.open(url, master_key=key) as store:
        reports = redact_sessions(store)
        assert [r.session for r in reports if r.found] == [("app", "bob", "b1")]
        assert secret not in store.session("app", "bob", "b1").messages()[0].content
        with pytest.raises(TenantErased):
            redact_sessions(store, [store.session("app", "alice", "s1")])


def test_erase_of_a_name_with_no_keys_is_refused_and_the_tenant_meant_stays_as_it_was(key: str,
                                                                                      tmp_path: Path) -> None:
    """Before, `castore erase a/alicе` (a Cyrillic е) or `A/alice` recorded an erasure of
    nobody and exited 0, while alice's data stayed readable."""
    url = str(tmp_path / "s")
    _two_tenants(url, key)
    runner = CliRunner()
    env = {"CASTORE_MASTER_KEY": key}
    for typo in ("app/alic\u0435", "App/alice", "ap"):
        r = runner.invoke(main, ["--store", url, "erase", typo, "--yes"], env=env)
        assert r.exit_code == 1 and "nothing to erase" in r.output, r.output
    assert runner.invoke(main, ["--store", url, "erasures"], env=env).stdout == ""
    r = runner.invoke(main, ["--store", url, "erase", "app/alice", "--yes"], env=env)
    assert r.exit_code == 0 and "1 data key destroyed" in r.stderr
    r = runner.invoke(main, ["--store", url, "erase", "app/alice", "--yes"], env=env)  # again: already done
    assert r.exit_code == 0 and "erased already" in r.stderr, r.output
    with castore.open(url, master_key=key) as store:
        assert store.session("app", "bob", "b1").messages()[0].content == "bob's"
