"""Master keys, data key wrapping, the KMS hook and tenant key derivation (castore.crypto.keys),
with real crypto: keys from os.urandom, AES-256-GCM-SIV and HKDF from ``cryptography``."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest

from castore.crypto.keys import (
    ENC_INFO,
    ID_INFO,
    CallableWrapper,
    KeyWrapper,
    MasterKey,
    TenantKeys,
    derive_tenant_keys,
    new_data_key,
)
from castore.errors import CastoreError, EncryptionError, KeyMissing, WrongKey

CTX = b"castore/key/v1\0store\0app/alice"


def rfc5869_sha256(ikm: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 with no salt, written from RFC 5869 with the standard library: an
    independent check of the derivation ``cryptography`` does."""
    prk = hmac.new(b"\0" * 32, ikm, hashlib.sha256).digest()
    out, block, i = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
        i += 1
    return out[:length]


def test_new_is_base64_of_32_fresh_random_bytes():
    a, b = MasterKey.new(), MasterKey.new()
    assert len(base64.b64decode(a, validate=True)) == 32
    assert a != b
    assert MasterKey.from_text(a).key_id == MasterKey.from_text(a).key_id
    assert MasterKey.from_text(a).key_id != MasterKey.from_text(b).key_id


@pytest.mark.parametrize("text, needle", [
    ("not base64 at all!", "not base64"),
    (base64.b64encode(os.urandom(16)).decode(), "16 bytes, not 32"),
    (base64.b64encode(os.urandom(33)).decode(), "33 bytes, not 32"),
    ("", "0 bytes"),
    ("é", "not base64"),
], ids=["not-base64", "16-bytes", "33-bytes", "empty", "not-ascii"])
def test_a_bad_master_key_text_is_one_clear_error(text, needle):
    with pytest.raises(EncryptionError, match=needle) as e:
        MasterKey.from_text(text)
    assert "castore key new" in str(e.value)


def test_from_bytes_checks_the_length():
    with pytest.raises(EncryptionError, match="32 bytes, not 31"):
        MasterKey.from_bytes(os.urandom(31))
    key = os.urandom(32)
    assert MasterKey.from_bytes(key).key_id == MasterKey.from_text(base64.b64encode(key).decode()).key_id


def test_from_env(monkeypatch):
    text = MasterKey.new()
    monkeypatch.setenv("CASTORE_MASTER_KEY", text + "\n")
    assert MasterKey.from_env().key_id == MasterKey.from_text(text).key_id
    monkeypatch.setenv("CASTORE_MASTER_KEY", "garbage!")
    with pytest.raises(EncryptionError, match=r"\$CASTORE_MASTER_KEY is not base64"):
        MasterKey.from_env()
    monkeypatch.delenv("CASTORE_MASTER_KEY")
    with pytest.raises(KeyMissing, match="set CASTORE_MASTER_KEY"):
        MasterKey.from_env()


def test_from_file(tmp_path):
    text = MasterKey.new()
    path = tmp_path / "master.key"
    path.write_text(text + "\n")
    assert MasterKey.from_file(path).key_id == MasterKey.from_text(text).key_id
    with pytest.raises(KeyMissing, match="no master key file"):
        MasterKey.from_file(tmp_path / "absent.key")
    path.write_bytes(os.urandom(32) + b"\xff")
    with pytest.raises(EncryptionError, match="not base64"):
        MasterKey.from_file(path)
    with pytest.raises(EncryptionError, match="cannot read"):
        MasterKey.from_file(tmp_path)  # a folder


def test_wrap_round_trips_and_every_wrap_has_its_own_nonce():
    mk = MasterKey.from_text(MasterKey.new())
    key = new_data_key()
    w1, w2 = mk.wrap(key, CTX), mk.wrap(key, CTX)
    assert len(w1) == 61 and w1 != w2 and w1[1:13] != w2[1:13]
    assert key not in w1
    assert mk.unwrap(w1, CTX) == key == mk.unwrap(w2, CTX)


def test_unwrap_refuses_another_context_another_key_and_damage():
    mk = MasterKey.from_text(MasterKey.new())
    key = new_data_key()
    wrapped = mk.wrap(key, CTX)
    with pytest.raises(WrongKey):
        mk.unwrap(wrapped, b"castore/key/v1\0store\0app/bob")  # moved to another tenant
    other = MasterKey.from_text(MasterKey.new())
    with pytest.raises(WrongKey, match=f"master key {other.key_id} does not open"):
        other.unwrap(wrapped, CTX)
    for i in (0, 5, 20, 60):
        bad = bytearray(wrapped)
        bad[i] ^= 1
        with pytest.raises(WrongKey):
            mk.unwrap(bytes(bad), CTX)
    with pytest.raises(WrongKey, match="60 bytes"):
        mk.unwrap(wrapped[:-1], CTX)
    with pytest.raises(EncryptionError, match="32 bytes, not 16"):
        mk.wrap(os.urandom(16), CTX)


def test_repr_never_shows_a_key():
    raw = os.urandom(32)
    mk = MasterKey.from_bytes(raw)
    assert base64.b64encode(raw).decode() not in repr(mk) and raw.hex() not in repr(mk)
    assert mk.key_id in repr(mk)
    keys = derive_tenant_keys(new_data_key())
    assert keys.id_key.hex() not in repr(keys) and repr(keys) == "TenantKeys(...)"


def test_a_kms_plugs_in_through_two_functions():
    kms = MasterKey.from_text(MasterKey.new())  # a real second wrapper standing in for a KMS
    calls: list[bytes] = []

    def wrap(key: bytes, ctx: bytes) -> bytes:
        calls.append(ctx)
        return b"kms:" + kms.wrap(key, ctx)

    def unwrap(blob: bytes, ctx: bytes) -> bytes:
        if not blob.startswith(b"kms:"):
            raise WrongKey("not a blob of this KMS")
        return kms.unwrap(blob[4:], ctx)

    w = CallableWrapper(wrap=wrap, unwrap=unwrap, key_id="arn:test")
    assert isinstance(w, KeyWrapper) and isinstance(kms, KeyWrapper)
    key = new_data_key()
    blob = w.wrap(key, CTX)
    assert w.unwrap(blob, CTX) == key and calls == [CTX]
    with pytest.raises(WrongKey):
        w.unwrap(blob, CTX + b"x")
    with pytest.raises(WrongKey, match="not a blob"):
        w.unwrap(b"other", CTX)
    assert "arn:test" in repr(w)


def test_a_failing_kms_is_an_encryption_error_with_its_cause():
    def down(*_: bytes) -> bytes:
        raise ConnectionError("kms.example: connection refused")

    w = CallableWrapper(wrap=down, unwrap=down)
    with pytest.raises(EncryptionError, match="failed to wrap.*connection refused") as e:
        w.wrap(new_data_key(), CTX)
    assert isinstance(e.value.__cause__, ConnectionError) and not isinstance(e.value, WrongKey)
    with pytest.raises(EncryptionError, match="failed to unwrap") as e2:
        w.unwrap(b"x", CTX)
    assert not isinstance(e2.value, WrongKey)
    short = CallableWrapper(wrap=lambda k, c: b"", unwrap=lambda b, c: b"short")
    with pytest.raises(EncryptionError, match="not wrapped bytes"):
        short.wrap(new_data_key(), CTX)
    with pytest.raises(WrongKey, match="32-byte"):
        short.unwrap(b"x", CTX)


def test_tenant_keys_are_hkdf_sha256_of_the_data_key():
    data_key = new_data_key()
    keys = derive_tenant_keys(data_key)
    assert isinstance(keys, TenantKeys)
    assert keys.id_key == rfc5869_sha256(data_key, ID_INFO) == rfc5869_sha256(data_key, b"castore id v1")
    assert keys.enc_key == rfc5869_sha256(data_key, ENC_INFO) == rfc5869_sha256(data_key, b"castore enc v1")
    assert keys.id_key != keys.enc_key and len(keys.id_key) == len(keys.enc_key) == 32
    assert derive_tenant_keys(data_key) == keys
    assert derive_tenant_keys(new_data_key()) != keys
    with pytest.raises(EncryptionError, match="32 bytes, not 8"):
        derive_tenant_keys(b"12345678")


def test_the_errors_are_castore_errors():
    assert issubclass(WrongKey, EncryptionError) and issubclass(KeyMissing, EncryptionError)
    assert issubclass(EncryptionError, CastoreError)
