"""The key store (castore.crypto.keystore) on local disk, memory and S3: tenant keys, the key
check, race-safe creation, erasure records, rotation and the KMS hook, with real crypto."""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest
from conftest import Backend, make_backend

from castore.crypto.keys import CallableWrapper, KeyWrapper, MasterKey
from castore.crypto.keystore import KeyStore
from castore.errors import EncryptionError, InvalidName, KeyMissing, StorageError, TenantErased, WrongKey
from castore.storage import Storage, open_storage
from castore.storage.faulty import FaultyStorage


def master() -> MasterKey:
    return MasterKey.from_text(MasterKey.new())


@pytest.fixture
def storage(backend: Backend) -> Any:
    st = open_storage(backend.url, **backend.options)
    yield st
    st.close()


def every_byte(storage: Storage) -> bytes:
    return b"".join(storage.read(k) for k in storage.list(""))


def test_keys_survive_a_reopen_and_differ_per_tenant(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    alice = ks.tenant_keys("app", "alice", create=True)
    bob = ks.tenant_keys("app", "bob", create=True)
    scope = ks.tenant_keys("app", None, create=True)
    other_app = ks.tenant_keys("other", "alice", create=True)
    assert len({alice.id_key, bob.id_key, scope.id_key, other_app.id_key, alice.enc_key}) == 5
    again = KeyStore.open(storage, ks.config, mk)
    assert again.tenant_keys("app", "alice") == alice and again.tenant_keys("app", None) == scope
    assert sorted(storage.list("keys/")) == [
        "keys/keystore.json", "keys/tenants/app.key", "keys/tenants/app/@app.key", "keys/tenants/app/alice.key",
        "keys/tenants/app/bob.key", "keys/tenants/other.key", "keys/tenants/other/alice.key"]
    assert again.tenants() == [("app", None), ("app", "alice"), ("app", "bob"), ("other", "alice")]
    stored = every_byte(storage)
    for k in (alice, bob, scope, other_app):  # no key in clear in any stored byte
        assert k.id_key not in stored and k.enc_key not in stored


def test_names_are_encoded_into_one_segment(storage):
    ks = KeyStore.create(storage, master())
    ks.tenant_keys("Weather App", "a/b@c", create=True)
    assert "keys/tenants/%57eather%20%41pp/a%2Fb%40c.key" in storage.list("keys/")
    assert "keys/tenants/%57eather%20%41pp.key" in storage.list("keys/")
    with pytest.raises(InvalidName):
        ks.tenant_keys("", "alice", create=True)


def test_a_wrong_master_key_is_told_at_open_and_a_missing_tenant_key_after(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    ks.tenant_keys("app", "alice", create=True)
    wrong = master()
    with pytest.raises(WrongKey, match=f"wrong master key.*its key is {mk.key_id}, the key given is {wrong.key_id}"):
        KeyStore.open(storage, ks.config, wrong)
    right = KeyStore.open(storage, ks.config, mk)
    right.check()
    with pytest.raises(KeyMissing, match="no data key for user 'bob' of app 'app'"):
        right.tenant_keys("app", "bob")
    with pytest.raises(KeyMissing, match="no data key for app 'app'"):
        right.tenant_keys("app", None)


def test_no_key_store_and_another_stores_key_store(storage, tmp_path):
    with pytest.raises(KeyMissing, match="no key store at"):
        KeyStore.open(storage, {}, master())
    mk = master()
    KeyStore.create(storage, mk)
    with pytest.raises(EncryptionError, match="already exists"):
        KeyStore.create(storage, mk)
    with pytest.raises(EncryptionError, match="belongs to another store"):
        KeyStore.open(storage, {"key_store_id": "0" * 32}, mk)


def test_without_a_master_key_only_erasure_works(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    ks.tenant_keys("app", "alice", create=True)
    keyless = KeyStore.open(storage, ks.config, None)
    with pytest.raises(KeyMissing, match="no master key given"):
        keyless.tenant_keys("app", "alice")
    with pytest.raises(KeyMissing):
        keyless.check()
    [rec] = keyless.erase("app", "alice", by="ops")
    assert rec.keys == 1 and keyless.erasures() == [rec]


def test_a_key_file_moved_to_another_tenant_or_key_store_does_not_unwrap(storage, tmp_path):
    mk = master()
    ks = KeyStore.create(storage, mk)
    ks.tenant_keys("app", "alice", create=True)
    alice_file = storage.read("keys/tenants/app/alice.key")
    storage.write("keys/tenants/app/mallory.key", alice_file)
    with pytest.raises(WrongKey, match="mallory.key does not open.*moved from another tenant"):
        KeyStore.open(storage, ks.config, mk).tenant_keys("app", "mallory")
    storage.write("keys/tenants/elsewhere.key", storage.read("keys/tenants/app.key"))
    storage.write("keys/tenants/elsewhere/alice.key", alice_file)
    with pytest.raises(WrongKey, match="elsewhere.key does not open with the master key"):
        KeyStore.open(storage, ks.config, mk).tenant_keys("elsewhere", "alice")  # another app
    other = open_storage(str(tmp_path / "other"))
    ks2 = KeyStore.create(other, mk)  # the same master key, another key store
    other.write("keys/tenants/app.key", storage.read("keys/tenants/app.key"))
    other.write("keys/tenants/app/alice.key", alice_file)
    with pytest.raises(WrongKey):
        ks2.tenant_keys("app", "alice")
    storage.delete("keys/tenants/app.key")
    with pytest.raises(EncryptionError, match="app.key is missing"):
        KeyStore.open(storage, ks.config, mk).tenant_keys("app", "alice")


def test_damaged_files_are_clear_errors(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    ks.tenant_keys("app", "someone", create=True)  # makes the app's key
    storage.write("keys/tenants/app/alice.key", b"{not json")
    with pytest.raises(EncryptionError, match="alice.key is damaged"):
        ks.tenant_keys("app", "alice")
    storage.write("keys/tenants/app/bob.key", b'{"format": 9}')
    with pytest.raises(EncryptionError, match="format 9"):
        ks.tenant_keys("app", "bob")
    storage.write("keys/tenants/app/carol.key", b'{"format": 1, "wrapped": "%%%"}')
    with pytest.raises(EncryptionError, match="not base64"):
        ks.tenant_keys("app", "carol")
    storage.write("keys/keystore.json", b"[]")
    with pytest.raises(EncryptionError, match="keystore.json is damaged"):
        KeyStore.open(storage, ks.config, mk)


def test_erasing_a_user_destroys_its_key_and_records_it(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    bob = ks.tenant_keys("app", "bob", create=True)
    ks.tenant_keys("app", "alice", create=True)
    [rec] = ks.erase("app", "alice", by="dpo@example.com")
    assert (rec.app, rec.user, rec.by, rec.keys) == ("app", "alice", "dpo@example.com", 1)
    assert "keys/tenants/app/alice.key" not in storage.list("keys/")
    assert "keys/erased/app/alice.json" in storage.list("keys/")
    fresh = KeyStore.open(storage, ks.config, mk)
    for handle in (ks, fresh):
        with pytest.raises(TenantErased, match=re.escape(f"user 'alice' of app 'app' was erased at {rec.at} by dpo@example.com")):
            handle.tenant_keys("app", "alice")
        with pytest.raises(TenantErased):  # an erased tenant is never given a new key
            handle.tenant_keys("app", "alice", create=True)
        assert handle.tenant_keys("app", "bob") == bob
    assert fresh.erased("app", "alice") == rec and fresh.erased("app", "bob") is None
    assert fresh.erasures() == [rec]
    [again] = fresh.erase("app", "alice", by="someone else")
    assert again == rec  # the first record is kept


def test_erasing_an_app_covers_every_user_its_scope_and_future_users(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    for user in ("u1", "u2", "u3", None):
        ks.tenant_keys("app", user, create=True)
    kept = ks.tenant_keys("other", "u1", create=True)
    [rec] = ks.erase("app")
    assert rec.user is None and rec.keys == 4 and rec.by is None
    assert "keys/tenants/app.key" not in storage.list("keys/")  # the one key every key of the app needs
    assert ks.tenants() == [("other", "u1")]
    assert ks.sweep() == 4  # the app's users' key files, which nothing can open any more
    assert [k for k in storage.list("keys/") if k.startswith("keys/tenants/")] == [
        "keys/tenants/other.key", "keys/tenants/other/u1.key"]
    fresh = KeyStore.open(storage, ks.config, mk)
    for user in ("u1", None, "newcomer"):
        with pytest.raises(TenantErased, match=r"app 'app' \(all its users\) was erased"):
            fresh.tenant_keys("app", user, create=True)
    assert fresh.erased("app", "u2") == rec and fresh.erased("app", None) == rec
    assert fresh.tenant_keys("other", "u1") == kept
    ks.erase("other", "u1")
    assert [(e.app, e.user) for e in fresh.erasures()] == [("app", None), ("other", "u1")]


def test_rotation_rewraps_every_key_and_the_old_key_stops_working(storage):
    old, new = master(), master()
    ks = KeyStore.create(storage, old)
    before = {t: ks.tenant_keys(*t, create=True) for t in [("a", "u1"), ("a", None), ("b", "u2")]}
    data_key_files = {k: storage.read(k) for k in storage.list("keys/tenants/") if k.count("/") == 3}
    assert ks.rotate(new) == 2  # the two app keys
    assert {k: storage.read(k) for k in data_key_files} == data_key_files  # data keys untouched
    with pytest.raises(WrongKey):
        KeyStore.open(storage, ks.config, old)
    after = KeyStore.open(storage, ks.config, new)
    assert {t: after.tenant_keys(*t) for t in before} == before  # the data keys did not change
    assert after.rotate(new) == 0  # nothing left under the old key
    assert ks.tenant_keys("a", "u1") == before[("a", "u1")]  # the rotating handle goes on


def test_a_rotation_cut_short_is_finished_by_running_it_again(storage):
    old, new = master(), master()
    ks = KeyStore.create(storage, old)
    for app in ("a1", "a2", "a3"):
        ks.tenant_keys(app, "u", create=True)
    check_before = storage.read("keys/keystore.json")
    a3_before = storage.read("keys/tenants/a3.key")
    ks.rotate(new)
    # as if it stopped after rewrapping a1 and a2: a3 and the key check still under the old key
    storage.write("keys/keystore.json", check_before)
    storage.write("keys/tenants/a3.key", a3_before)
    with pytest.raises(WrongKey):
        KeyStore.open(storage, ks.config, new)
    rerun = KeyStore.open(storage, ks.config, old)
    assert rerun.rotate(new) == 1
    done = KeyStore.open(storage, ks.config, new)
    assert len({done.tenant_keys(app, "u").id_key for app in ("a1", "a2", "a3")}) == 3


def test_a_kms_hook_wraps_the_keys(storage):
    kms_key = master()  # a real second wrapper, standing in for a KMS
    seen: list[bytes] = []

    def kms_wrap(key: bytes, ctx: bytes) -> bytes:
        seen.append(ctx)
        return kms_key.wrap(key, ctx)

    kms = CallableWrapper(wrap=kms_wrap, unwrap=kms_key.unwrap, key_id="kms:test")
    mk = master()
    ks = KeyStore.create(storage, mk)
    alice = ks.tenant_keys("app", "alice", create=True)
    assert ks.rotate(kms) == 1  # from a master key to the KMS
    opened = KeyStore.open(storage, ks.config, kms)
    assert opened.tenant_keys("app", "alice") == alice
    seen.clear()
    bob = opened.tenant_keys("app", "bob", create=True)
    assert seen == []  # a user's data key is wrapped by its app's key: no call to the KMS
    opened.tenant_keys("app2", "carol", create=True)
    assert len(seen) == 1 and seen[0].endswith(b"\0app2")  # the new app's key
    with pytest.raises(WrongKey, match="the key given is kms:other"):
        KeyStore.open(storage, ks.config, CallableWrapper(wrap=master().wrap, unwrap=master().unwrap,
                                                        key_id="kms:other"))
    with pytest.raises(WrongKey):
        KeyStore.open(storage, ks.config, mk)
    back: KeyWrapper = master()
    opened.rotate(back)
    assert KeyStore.open(storage, ks.config, back).tenant_keys("app", "bob") == bob


def test_a_key_store_apart_from_the_data(storage, backend, request, tmp_path):
    elsewhere = make_backend("local", request, tmp_path / "keys-apart")
    mk = master()
    ks = KeyStore.create(storage, mk, url=elsewhere.url)
    keys = ks.tenant_keys("app", "alice", create=True)
    assert ks.config == {"key_store_id": ks.id, "key_store": elsewhere.url}
    assert storage.list("") == []  # nothing of the keys in the data's storage
    with pytest.raises(KeyMissing, match="no key store"):
        KeyStore.open(storage, {"key_store_id": ks.id}, mk)  # a backup of the data alone
    with KeyStore.open(storage, ks.config, mk) as again:
        assert again.tenant_keys("app", "alice") == keys
    ks.close()


def race(n: int, fn: Any) -> list[Any]:
    """Run ``fn(i)`` in ``n`` threads released at once; their results (or exceptions)."""
    barrier = threading.Barrier(n)
    out: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = fn(i)
        except Exception as e:  # reported below
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.mark.parametrize("kind", ["local", "seaweedfs"])
def test_rival_creators_of_a_tenant_key_all_get_the_one_stored(kind, request, tmp_path):
    b = make_backend(kind, request, tmp_path)
    mk = master()
    first = open_storage(b.url, **b.options)
    config = KeyStore.create(first, mk).config
    handles = [KeyStore.open(open_storage(b.url, **b.options), config, mk) for _ in range(6)]
    for round_ in range(3):
        user = f"user{round_}"
        got = race(len(handles), lambda i, user=user: handles[i].tenant_keys("app", user, create=True))
        assert not [g for g in got if isinstance(g, Exception)], got
        assert len({g.id_key for g in got}) == 1
        assert KeyStore.open(first, config, mk).tenant_keys("app", user) == got[0]
    for h in handles:
        h.storage.close()
    first.close()


def test_a_creator_that_lost_reads_the_winners_key(storage):
    mk = master()
    a = KeyStore.create(storage, mk)
    b = KeyStore.open(storage, a.config, mk)
    with pytest.raises(KeyMissing):
        b.tenant_keys("app", "alice")  # b has looked: no key yet
    won = a.tenant_keys("app", "alice", create=True)
    assert b.tenant_keys("app", "alice", create=True) == won


def test_a_creation_whose_answer_was_lost_uses_what_is_stored(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    lossy = FaultyStorage(storage, rate=1.0, kinds={"lost": 1.0}, methods=["swap"])
    keys = KeyStore.open(lossy, ks.config, mk).tenant_keys("app", "alice", create=True)
    assert lossy.injected["lost"] == 2  # the app key's creation and the data key's
    assert KeyStore.open(storage, ks.config, mk).tenant_keys("app", "alice") == keys
    failing = FaultyStorage(storage, rate=1.0, kinds={"fail": 1.0}, methods=["swap"])
    with pytest.raises(StorageError):
        KeyStore.open(failing, ks.config, mk).tenant_keys("app", "bob", create=True)
    with pytest.raises(KeyMissing):
        KeyStore.open(storage, ks.config, mk).tenant_keys("app", "bob")


class EraseDuringCreation(FaultyStorage):
    """The real storage, with an erasure of ``tenant`` run by another handle just before the
    creation of that tenant's key file lands (the interleaving a race could produce)."""

    def __init__(self, inner: Storage, other: KeyStore, tenant: tuple[str, str]) -> None:
        super().__init__(inner, rate=0.0)
        self.other, self.tenant = other, tenant

    def swap(self, key: str, data: bytes, expect: Any, journal: Any = None) -> str:
        if key.endswith(f"/{self.tenant[0]}/{self.tenant[1]}.key"):
            self.other.erase(*self.tenant, by="rival")
        return super().swap(key, data, expect, journal)


def test_a_key_created_while_its_tenant_is_erased_is_deleted_by_its_creator(storage):
    mk = master()
    ks = KeyStore.create(storage, mk)
    ks.tenant_keys("app", "bob", create=True)
    racing = EraseDuringCreation(storage, KeyStore.open(storage, ks.config, None), ("app", "alice"))
    with pytest.raises(TenantErased, match="by rival"):
        KeyStore.open(racing, ks.config, mk).tenant_keys("app", "alice", create=True)
    assert "keys/tenants/app/alice.key" not in storage.list("keys/")
    assert ks.tenant_keys("app", "bob")  # the app's other tenants are untouched
