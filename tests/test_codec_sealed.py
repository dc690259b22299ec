"""An encrypted store's codec: keyed ids and sealed frames, on every backend.

A store made with ``codec=Codec(id_key, AeadCipher(key), tenant)`` keeps no plaintext in any
byte it writes (loose objects, pack records, indexes, the grep index), refuses a ciphertext
moved to another id or tenant, and names a wrong key as such. A plain store's bytes are the
golden tests' business (tests/golden, unchanged).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Backend, backend_on

from castore import Message
from castore.crypto.aead import OVERHEAD, AeadCipher
from castore.errors import CastoreError, IntegrityError, InvalidEntry, SealedFrameError
from castore.grep import grep
from castore.maintenance import fsck, gc
from castore.objects import PLAIN, Blob, Codec, Value, is_sealed
from castore.objectstore import LOOSE_MIN, object_key
from castore.storage import open_storage
from castore.store import Store
from castore.sync import push

TEXT = "QUOKKA-MESSAGE-MARKER"
STATE = "WOMBAT-STATE-MARKER"
TOOL = "NUMBAT-TOOL-OUTPUT-MARKER"
MARKERS = [m.encode() for m in (TEXT, STATE, TOOL)]


# the codec on local disk and memory in CI; on S3 under -m slow (the encrypted store on S3,
# its codec included, is covered in CI by test_encrypted_store and test_encrypted_adapters)
backend = backend_on("local", "memory", pytest.param("s3", marks=pytest.mark.slow))

def sealed_codec(tenant: bytes = b"app/user", id_key: bytes | None = None, key: bytes | None = None) -> Codec:
    return Codec(id_key=id_key or os.urandom(32), cipher=AeadCipher(key or os.urandom(32)), tenant=tenant)


def open_store(backend: Backend, codec: Codec, **kw: Any) -> Store:
    return Store(open_storage(backend.url, **backend.options), codec=codec, **kw)


def every_byte(store: Store) -> dict[str, bytes]:
    """Every object of the store's storage (listed and read back), by key."""
    keys = store.storage.list("")
    got = store.storage.read_many(keys)
    return {k: v for k, v in got.items() if v is not None}


def plaintext_in(blobs: dict[str, bytes]) -> list[tuple[str, bytes]]:
    return [(k, m) for k, v in blobs.items() for m in MARKERS if m in v or m.lower() in v.lower()]


def fill(store: Store) -> None:
    """A session with messages, a large tool output, state, a branch, a fork, a compaction."""
    s = store.session("app", "user", "s1")
    for i in range(40):
        s.append(Message(role="user", content=f"{TEXT} question {i}"),
                 state_delta={"note": f"{STATE} {i}"} if i % 10 == 0 else None)
        s.append(Message(role="assistant", content=f"answer {i}"))
    s.append(Message(role="tool", content=f"{TOOL} " + "x" * (2 * LOOSE_MIN), tool_call_id="t1"))
    s.branch("retry", at="HEAD~3")
    s.checkout("retry")
    s.append(Message(role="user", content=f"{TEXT} on the retry branch"))
    s.checkout("main")
    s.fork("s2").append(Message(role="user", content=f"{TEXT} in the fork"))
    s.compact(f"summary {TEXT}", keep_from="HEAD~4")


def test_sealed_store_works_end_to_end_and_stores_no_plaintext(backend: Backend, tmp_path: Path) -> None:
    codec = sealed_codec()
    with open_store(backend, codec) as store:
        fill(store)
        assert store.objects.codec is codec
        store.objects.repack(all_packs=True)
        gc(store, grace=0)
        report = fsck(store)
        assert not report.corrupt and not report.missing and not report.damaged_records
        hits = list(grep(store, TEXT))
        assert len(hits) >= 42
        assert list(grep(store, TOOL, kinds=["tool_result", "text"]))  # a tool result is found too
        blobs = every_byte(store)
    assert plaintext_in(blobs) == []
    assert any(k.startswith("packs/") for k in blobs)
    assert any(k.startswith("objects/") for k in blobs)  # the large tool output is loose
    for k, v in blobs.items():
        if k.startswith("objects/"):
            assert is_sealed(v)
    # no grep index was written, anywhere
    index_root = Path(os.environ["CASTORE_GREP_INDEX"])
    assert not index_root.exists() or not [p for p in index_root.rglob("*") if p.is_file()]
    with open_store(backend, codec) as again:  # reopened, read cold
        s = again.session("app", "user", "s1")
        assert s.state()["note"] == f"{STATE} 30"
        assert again.session("app", "user", "s2").messages()[-1].content == f"{TEXT} in the fork"
        assert len(s.context().messages) < len(s.messages("main"))  # the compaction holds
        assert s.messages("retry")[-1].content == f"{TEXT} on the retry branch"
        assert not fsck(again).corrupt


def test_a_wrong_key_or_no_key_is_a_clear_error(backend: Backend) -> None:
    codec = sealed_codec()
    with open_store(backend, codec) as store:
        store.session("app", "user", "s1").append(Message(role="user", content=TEXT))
    wrong = Codec(id_key=codec.id_key, cipher=AeadCipher(os.urandom(32)), tenant=codec.tenant)
    for other in (wrong, PLAIN):
        with open_store(backend, other) as store:
            with pytest.raises(SealedFrameError) as e:
                store.session("app", "user", "s1").messages()
            assert "key" in str(e.value)


def test_a_sealed_loose_object_moved_to_another_id_is_refused(tmp_path: Path) -> None:
    codec = sealed_codec()
    with Store(open_storage(str(tmp_path / "s")), codec=codec) as store:
        a = store.objects.put(Blob(data=b"a" * (2 * LOOSE_MIN)))
        b = store.objects.put(Blob(data=b"b" * (2 * LOOSE_MIN)))
        store.storage.write(object_key(b), store.storage.read(object_key(a)))
    with Store(open_storage(str(tmp_path / "s")), codec=codec) as store:
        with pytest.raises(IntegrityError):
            store.objects.get(b)
        assert store.objects.get(a) == Blob(data=b"a" * (2 * LOOSE_MIN))


def test_sealed_records_and_objects_moved_to_another_tenant_are_refused(tmp_path: Path) -> None:
    id_key, key = os.urandom(32), os.urandom(32)
    a_codec, b_codec = sealed_codec(b"app/a", id_key, key), sealed_codec(b"app/b", id_key, key)
    with Store(open_storage(str(tmp_path / "a")), codec=a_codec) as a:
        s = a.session("app", "user", "s1")
        s.append(Message(role="user", content=TEXT))
        big = a.objects.put(Blob(data=b"z" * (2 * LOOSE_MIN)))
        a.objects.repack(all_packs=True)
        cid = s.head
        blobs = every_byte(a)
    # tenant b's store holds a byte-for-byte copy of tenant a's (same keys, another tenant tag)
    with Store(open_storage(str(tmp_path / "b")), codec=b_codec) as b:
        b.storage.write_many(blobs)
    with Store(open_storage(str(tmp_path / "b")), codec=b_codec) as b:
        assert cid is not None
        with pytest.raises(SealedFrameError):
            b.objects.get(cid)
        with pytest.raises(SealedFrameError):
            b.objects.get(big)
        with pytest.raises(SealedFrameError):
            b.session("app", "user", "s1").messages()


def test_equal_content_under_two_id_keys_has_two_ids() -> None:
    value = Value(value={"text": TEXT})
    one, two = sealed_codec(), sealed_codec()
    ids = {PLAIN.encode(value)[0], one.encode(value)[0], two.encode(value)[0]}
    assert len(ids) == 3
    assert one.encode(value) == one.encode(value)  # deterministic under one key
    canon = [one.encode(Value(value=i))[1] for i in range(5)]
    assert one.digest_many(canon) == [one.digest(c) for c in canon]


def test_plain_codec_makes_the_module_functions_bytes() -> None:
    from castore import objects as o

    for v in (Value(value="x"), Value(value="y" * 5000), Blob(data=b"")):
        oid, canonical = PLAIN.encode(v)
        assert (oid, canonical) == o.encode(v)
        assert PLAIN.to_stored(canonical) == o.to_stored(canonical)
        assert PLAIN.from_stored(oid, o.to_stored(canonical)) == canonical
    assert not PLAIN.keyed and PLAIN.cipher is None


def test_sealing_adds_a_constant_overhead_and_compresses_first() -> None:
    codec = sealed_codec()
    oid, canonical = codec.encode(Value(value="repeat " * 2000))
    from castore import objects as o

    plain = o.to_stored(canonical)
    sealed = codec.to_stored(canonical, oid=oid)
    assert len(sealed) == len(plain) + 1 + OVERHEAD
    assert codec.to_stored(canonical, oid=oid) != sealed  # a fresh nonce each time
    assert codec.from_stored(oid, sealed) == canonical


def test_sync_copies_sealed_frames_between_stores_of_one_codec_only(tmp_path: Path) -> None:
    codec = sealed_codec()
    with Store(open_storage(str(tmp_path / "src")), codec=codec) as src:
        fill(src)
        with Store(open_storage(str(tmp_path / "dst")), codec=codec) as dst:
            report = push(src, dst)
            assert report.objects_sent
            assert dst.session("app", "user", "s1").messages() == src.session("app", "user", "s1").messages()
            assert plaintext_in(every_byte(dst)) == []
        for other in (PLAIN, sealed_codec(b"app/user", codec.id_key), sealed_codec(b"app/other", codec.id_key)):
            with Store(open_storage(str(tmp_path / f"x{time.monotonic_ns()}")), codec=other) as dst:
                with pytest.raises(SealedFrameError):
                    push(src, dst)
                assert plaintext_in(every_byte(dst)) == []
    # the plain store on the other side, reading: refused the same way
    with Store(open_storage(str(tmp_path / "plain"))) as plain, \
            Store(open_storage(str(tmp_path / "src")), codec=codec) as src:
        plain.session("app", "user", "p").append(Message(role="user", content="plain"))
        with pytest.raises(SealedFrameError):
            push(plain, src)


def test_a_sealed_frame_put_under_another_codec_is_refused(tmp_path: Path) -> None:
    codec = sealed_codec()
    oid, canonical = codec.encode(Value(value=TEXT))
    with Store(open_storage(str(tmp_path / "p"))) as plain:
        with pytest.raises(IntegrityError):
            plain.objects.put_stored_packed({oid: codec.to_stored(canonical, oid=oid)})
        assert plaintext_in(every_byte(plain)) == []


def test_aead_cipher_binds_its_associated_data() -> None:
    c = AeadCipher(os.urandom(32))
    sealed = c.seal(b"secret", b"ad-1")
    assert c.open(sealed, b"ad-1") == b"secret"
    assert b"secret" not in sealed and len(sealed) == len(b"secret") + OVERHEAD
    for bad in (lambda: c.open(sealed, b"ad-2"), lambda: AeadCipher(os.urandom(32)).open(sealed, b"ad-1"),
                lambda: c.open(sealed[:-1] + bytes([sealed[-1] ^ 1]), b"ad-1"), lambda: c.open(b"short", b"")):
        with pytest.raises(SealedFrameError):
            bad()
    with pytest.raises(CastoreError):
        AeadCipher(b"too short")


def test_codec_refuses_bad_keys() -> None:
    with pytest.raises(InvalidEntry):
        Codec(id_key=b"short")
    with pytest.raises(InvalidEntry):
        Codec(cipher=AeadCipher(os.urandom(32)))  # sealed frames need keyed ids
    assert "key" not in repr(sealed_codec()).lower().replace("keyed", "")


def test_missing_cryptography_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cryptography.exceptions", None)
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.ciphers.aead", None)
    with pytest.raises(CastoreError, match=r"pip install 'castore\[crypto\]'"):
        AeadCipher(os.urandom(32))


def test_a_plain_store_never_imports_cryptography(tmp_path: Path) -> None:
    code = (
        "import sys, castore\n"
        f"s = castore.open({str(tmp_path / 's')!r})\n"
        "x = s.session('a', 'u', 's'); x.append(castore.Message(role='user', content='hi')); x.messages()\n"
        "s.close()\n"
        "assert not [m for m in sys.modules if m.startswith('cryptography') or m.startswith('castore.crypto')], "
        "sorted(m for m in sys.modules if 'crypt' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _borrowed() -> list[Any]:
    """Session behaviour tests of other modules that take only a ``store``: run again below on
    a sealed store."""
    import test_append_api
    import test_session

    names = ["test_a_short_id_of_another_sessions_commit_does_not_resolve", "test_sessions_are_listed_newest_first",
             "test_delete_session_removes_it_from_listings", "test_unmerged_branch_is_kept_without_force",
             "test_bad_input_raises_a_clear_error_and_writes_nothing", "test_async_twins_work_under_asyncio"]
    return [getattr(test_session, n) for n in names] + [
        getattr(test_append_api, n) for n in dir(test_append_api) if n.startswith("test_")]


@pytest.mark.parametrize("test", _borrowed(), ids=lambda f: f.__name__)
def test_session_behaviour_holds_on_a_sealed_store(test: Any, backend: Backend) -> None:
    with open_store(backend, sealed_codec()) as store:
        test(store)
        assert all(is_sealed(v) for k, v in every_byte(store).items() if k.startswith("objects/"))
