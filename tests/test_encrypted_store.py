"""Encrypted stores end to end (issue 36): created, opened with their key, refused without it
or with another, erased, rotated, through the library and the CLI, on every backend.

The markers below never appear in any byte of an encrypted store. The same scan finds them in
a plain store written the same way (the control), so the scan itself can fail.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import castore
from castore.cli import main
from castore.crypto.keys import CallableWrapper, MasterKey
from castore.entries import Message
from castore.errors import CastoreError, EncryptionError, KeyMissing, TenantErased, WrongKey
from castore.maintenance import fsck
from castore.storage import open_storage
from tests.conftest import Backend

TEXT = "QUOKKA-MESSAGE-MARKER"
STATE = "WOMBAT-STATE-MARKER"
TOOL = "NUMBAT-TOOL-OUTPUT-MARKER"
MARKERS = [m.encode() for m in (TEXT, STATE, TOOL)]


def every_byte(backend: Backend) -> dict[str, bytes]:
    """Every file of the store's storage, by key (listed and read back)."""
    storage = open_storage(backend.url, **backend.options)
    try:
        got = storage.read_many(storage.list(""))
    finally:
        storage.close()
    return {k: v for k, v in got.items() if v is not None}


def plaintext_in(blobs: dict[str, bytes]) -> list[tuple[str, bytes]]:
    return [(k, m) for k, v in blobs.items() for m in MARKERS if m in v]


def fill(store: castore.Store, user: str = "alice") -> None:
    """Two sessions of one tenant and one of another, with state, a branch, a big tool output."""
    s = store.session("app", user, "s1")
    for i in range(12):
        s.append(Message(role="user", content=f"{TEXT} {user} question {i}"),
                 state_delta={"note": f"{STATE} {i}"} if i % 4 == 0 else None)
        s.append(Message(role="assistant", content=f"answer {i}"))
    s.append(Message(role="tool", content=f"{TOOL} " + os.urandom(3000).hex(), tool_call_id="t1"))
    s.branch("retry", at="HEAD~3")
    s.fork("s2").append(Message(role="user", content=f"{TEXT} in the fork"))
    store.update_scope("app", None, {"shared": f"{STATE} app scope"})
    store.session("app", "bob", "b1").append(Message(role="user", content=f"{TEXT} bob"))


def uncompressed(backend: Backend, **kw: Any) -> castore.Store:
    """A store whose frames are not compressed: a marker stored in clear would show as is."""
    return castore.Store(open_storage(backend.url, **backend.options), compress=False, **kw)


@pytest.fixture
def key() -> str:
    return MasterKey.new()


def test_plain_control_shows_the_markers(backend: Backend) -> None:
    # uncompressed, as the encrypted store below: what the scan must not find there, it finds here
    with uncompressed(backend, layout="tenants") as store:
        fill(store)
    assert plaintext_in(every_byte(backend))


def test_an_encrypted_store_keeps_no_plaintext_and_reads_back(backend: Backend, key: str) -> None:
    with uncompressed(backend, encrypted=True, master_key=key) as store:
        fill(store)  # the store is created, with its keys, by its first write
        assert store.encryption is not None and store.layout == "tenants"
        report = fsck(store)
        assert not report.corrupt and not report.missing
    blobs = every_byte(backend)
    assert plaintext_in(blobs) == []
    assert "castore.json" in blobs and any(k.startswith("keys/") for k in blobs)
    assert any(k.startswith("tenants/app/alice/packs/") for k in blobs)
    with backend.open(master_key=key) as again:  # recognised from castore.json, read cold
        s = again.session("app", "alice", "s1")
        assert s.messages()[0].content == f"{TEXT} alice question 0"
        assert s.state()["note"] == f"{STATE} 8"
        assert s.messages()[-1].content.startswith(TOOL)
        assert "retry" in s.branches()
        assert again.session("app", "alice", "s2").messages()[-1].content == f"{TEXT} in the fork"
        assert again.app_state("app") == {"shared": f"{STATE} app scope"}
        assert {i.session for i in again.sessions("app")} == {"s1", "s2", "b1"}


def test_equal_content_in_two_tenants_has_two_ids(backend: Backend, key: str) -> None:
    with backend.open(encrypted=True, master_key=key) as store:
        a = store.session("app", "alice", "s").append(Message(role="user", content="same"))
        b = store.session("app", "bob", "s").append(Message(role="user", content="same"))
        assert a != b  # the two commits, and the bodies they name, differ in id
        ca, cb = store.tenant("app", "alice").history.commit(a), store.tenant("app", "bob").history.commit(b)
        assert ca.body != cb.body


def test_wrong_or_missing_key_is_one_clear_error(backend: Backend, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASTORE_MASTER_KEY", raising=False)
    with backend.open(encrypted=True, master_key=key) as store:
        fill(store)
    with pytest.raises(WrongKey, match="wrong master key"):
        backend.open(master_key=MasterKey.new())
    with backend.open() as keyless:  # names are readable; contents are not
        assert {i.session for i in keyless.sessions("app")} == {"s1", "s2", "b1"}
        with pytest.raises(KeyMissing, match="no master key"):
            keyless.session("app", "alice", "s1").messages()
        with pytest.raises(KeyMissing):
            keyless.session("app", "carol", "new").append(Message(role="user", content="x"))
    monkeypatch.setenv("CASTORE_MASTER_KEY", key)
    with backend.open() as from_env:
        assert from_env.session("app", "bob", "b1").messages()[0].content == f"{TEXT} bob"


def test_encrypted_true_on_a_plain_store_is_refused(backend: Backend, key: str) -> None:
    with backend.open() as plain:
        plain.session("a", "u", "s").append(Message(role="user", content="x"))
    with pytest.raises(EncryptionError, match="not encrypted"):
        backend.open(encrypted=True, master_key=key)
    with pytest.raises(castore.errors.FormatError):
        castore.Store(open_storage("memory://flat-enc"), encrypted=True, layout="flat", master_key=key)


def test_erasure_reaches_the_store_and_a_data_copy_taken_before(tmp_path: Path, key: str) -> None:
    data, keys = tmp_path / "data", tmp_path / "keys"
    with castore.open(str(data), encrypted=True, master_key=key, key_store=str(keys)) as store:
        fill(store)
    assert not (data / "keys").exists()  # the keys live apart from the data
    backup = tmp_path / "backup"
    shutil.copytree(data, backup)  # a backup of the data alone, taken before the erasure
    with castore.open(str(data), master_key=key) as store:
        store.encryption.keys.erase("app", "alice", by="test")
        with pytest.raises(TenantErased, match="erased at"):
            store.session("app", "alice", "s1").messages()
        with pytest.raises(TenantErased):
            store.session("app", "alice", "s9").append(Message(role="user", content="after"))
        assert store.session("app", "bob", "b1").messages()[0].content == f"{TEXT} bob"  # others unchanged
    with castore.open(str(backup), master_key=key) as old:
        with pytest.raises(TenantErased):
            old.session("app", "alice", "s2").messages()
        assert old.session("app", "bob", "b1").messages()[0].content == f"{TEXT} bob"


def test_erasing_an_app_reaches_every_user_and_its_scope(backend: Backend, key: str) -> None:
    with backend.open(encrypted=True, master_key=key) as store:
        fill(store)
        store.session("other", "u", "s").append(Message(role="user", content="kept"))
        store.encryption.keys.erase("app")
    with backend.open(master_key=key) as store:
        for user in ("alice", "bob"):
            with pytest.raises(TenantErased, match="all its users"):
                store.session("app", user, "s1" if user == "alice" else "b1").messages()
        with pytest.raises(TenantErased):
            store.app_state("app")
        assert store.session("other", "u", "s").messages()[0].content == "kept"


def test_rotation_keeps_everything_readable_with_the_new_key_only(backend: Backend, key: str) -> None:
    new = MasterKey.new()
    with backend.open(encrypted=True, master_key=key) as store:
        fill(store)
        assert store.encryption.keys.rotate(MasterKey.from_text(new)) >= 1
    with pytest.raises(WrongKey):
        backend.open(master_key=key)
    with backend.open(master_key=new) as store:
        assert store.session("app", "alice", "s1").messages()[0].content == f"{TEXT} alice question 0"


def test_a_kms_hook_stands_in_for_the_master_key(tmp_path: Path) -> None:
    kms_key = MasterKey.from_bytes(os.urandom(32))  # the KMS's own key, which castore never sees
    calls: list[str] = []

    def wrap(k: bytes, ctx: bytes) -> bytes:
        calls.append("wrap")
        return kms_key.wrap(k, ctx)

    def unwrap(k: bytes, ctx: bytes) -> bytes:
        calls.append("unwrap")
        return kms_key.unwrap(k, ctx)

    kms = CallableWrapper(wrap=wrap, unwrap=unwrap, key_id="kms-1")
    with castore.open(str(tmp_path / "s"), encrypted=True, master_key=kms) as store:
        store.session("a", "u", "s").append(Message(role="user", content="via kms"))
    with castore.open(str(tmp_path / "s"), master_key=kms) as store:
        assert store.session("a", "u", "s").messages()[0].content == "via kms"
    assert "wrap" in calls and "unwrap" in calls
    with pytest.raises(WrongKey):
        castore.open(str(tmp_path / "s"), master_key=MasterKey.new())


def test_cli_init_encrypted_read_with_key_file_and_erase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASTORE_MASTER_KEY", raising=False)
    runner = CliRunner()
    made = runner.invoke(main, ["key", "new"])
    assert made.exit_code == 0
    key_file = tmp_path / "master.key"
    key_file.write_text(made.output)
    url = str(tmp_path / "store")

    def run(*args: str) -> Any:
        return runner.invoke(main, ["--store", url, *args])

    r = run("--master-key-file", str(key_file), "init", "--encrypted")
    assert r.exit_code == 0, r.output
    assert "encrypted" in r.output
    assert run("--master-key-file", str(key_file), "-s", "a/u/s", "append", "--role", "user", TEXT).exit_code == 0
    r = run("-s", "a/u/s", "log", "--master-key-file", str(key_file))  # the global option after the command
    assert r.exit_code == 0 and TEXT in r.output
    r = run("-s", "a/u/s", "log")
    assert r.exit_code == 1 and r.output.startswith("Error: ") and "master key" in r.output
    other = tmp_path / "other.key"
    other.write_text(MasterKey.new())
    r = run("--master-key-file", str(other), "-s", "a/u/s", "log")
    assert r.exit_code == 1 and "Error: wrong master key" in r.output
    assert run("erase", "a/u", "--yes").exit_code == 0
    r = run("--master-key-file", str(key_file), "-s", "a/u/s", "log")
    assert r.exit_code == 1 and "was erased" in r.output
    assert "Traceback" not in r.output


def test_bad_master_keys_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(EncryptionError):
        castore.open(str(tmp_path / "s"), encrypted=True, master_key="not base64!")
    with pytest.raises(EncryptionError):
        castore.open(str(tmp_path / "s"), encrypted=True, master_key=b"short")
    with pytest.raises(KeyMissing, match="castore key new"):
        store = castore.open(str(tmp_path / "s2"), encrypted=True, master_key=None)
        store.init()
    assert issubclass(KeyMissing, CastoreError)


def test_push_and_pull_copy_ciphertext_and_carry_erasures(backend: Backend, key: str, tmp_path: Path) -> None:
    from castore.sync import clone, pull, push

    local = str(tmp_path / "laptop")
    with uncompressed(Backend("local", local), encrypted=True, master_key=key) as store:
        fill(store)
        with backend.open(master_key=key) as remote:  # a new, empty remote: created as a copy
            report = push(store, remote)
            assert report.ok and report.objects_sent > 0
            assert remote.encryption is not None
    blobs = every_byte(backend)
    assert plaintext_in(blobs) == []
    assert any(k.startswith("keys/tenants/app/alice") for k in blobs)  # wrapped keys crossed
    second = str(tmp_path / "desktop")
    clone(backend.url, second, master_key=key, **backend.options)
    with castore.open(second, master_key=key) as copy:
        s = copy.session("app", "alice", "s1")
        assert s.messages()[0].content == f"{TEXT} alice question 0"
        s.append(Message(role="user", content="from the desktop"))
        with backend.open(master_key=key) as remote:
            assert push(copy, remote).ok
    with castore.open(local, master_key=key) as store:
        with backend.open(master_key=key) as remote:
            assert pull(remote, store).ok
        assert store.session("app", "alice", "s1").messages()[-1].content == "from the desktop"
        store.encryption.keys.erase("app", "alice")
        with backend.open(master_key=key) as remote:
            push(store, remote, ("app", "bob"))  # any push carries the erasures
    with backend.open(master_key=key) as remote:
        with pytest.raises(TenantErased):
            remote.session("app", "alice", "s1").messages()
        assert remote.session("app", "bob", "b1").messages()[0].content == f"{TEXT} bob"


def test_a_plain_store_and_an_encrypted_one_do_not_mix(tmp_path: Path, key: str) -> None:
    from castore.sync import push

    with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key) as enc:
        enc.session("a", "u", "s").append(Message(role="user", content=TEXT))
        with castore.open(str(tmp_path / "plain"), layout="tenants") as plain:
            plain.session("a", "u", "p").append(Message(role="user", content="x"))
            with pytest.raises(EncryptionError, match="is not"):
                push(enc, plain)
            with pytest.raises(EncryptionError, match="is not"):
                push(plain, enc)
        with castore.open(str(tmp_path / "other"), encrypted=True, master_key=key) as other:
            other.session("b", "u", "s").append(Message(role="user", content="x"))
            with pytest.raises(EncryptionError, match="separately"):
                push(enc, other)
    assert plaintext_in(every_byte(Backend("local", str(tmp_path / "plain")))) == []


def test_session_info_is_sealed_in_ref_metadata(backend: Backend, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASTORE_MASTER_KEY", raising=False)
    info = {"title": f"{TEXT} a title", "path": f"/home/{STATE}/project.jsonl"}
    with uncompressed(backend, encrypted=True, master_key=key) as store:
        s = store.session("app", "alice", "s1")
        s.append(Message(role="user", content="x"))
        s.set_info(info)
        assert s.info == info
        assert [i.info for i in store.sessions("app")] == [info]
    assert plaintext_in(every_byte(backend)) == []
    with backend.open(master_key=key) as again:
        assert again.session("app", "alice", "s1").info == info
        again.session("app", "alice", "s1").append(Message(role="user", content="y"))  # HEAD keeps it
        assert again.session("app", "alice", "s1").info == info
    with backend.open() as keyless:  # listed without a key: names, no info
        assert [(i.session, i.info) for i in keyless.sessions("app")] == [("s1", {})]
        with pytest.raises(KeyMissing):
            _ = keyless.session("app", "alice", "s1").info


def test_plain_session_info_is_stored_as_it_was(tmp_path: Path) -> None:
    with castore.open(str(tmp_path / "p")) as store:
        s = store.session("a", "u", "s")
        s.set_info({"title": "t"})
        head = store.refs.read(s.refs.head)
        assert head is not None and head.meta["info"] == {"title": "t"}


def test_gc_deletes_an_erased_tenants_bytes_and_nothing_else(backend: Backend, key: str) -> None:
    from castore.maintenance import gc

    with backend.open(encrypted=True, master_key=key) as store:
        fill(store)
        store.encryption.keys.erase("app", "alice")
    with backend.open(master_key=key) as store:
        report = fsck(store)
        assert report.ok and report.erased == ["tenants/app/alice"]
        assert gc(store, dry_run=True).erased == ["tenants/app/alice"]
        assert any(k.startswith("tenants/app/alice/") for k in every_byte(backend))
        done = gc(store, grace=0)
        assert done.erased == ["tenants/app/alice"] and done.to_dict()["erased_tenants"] == ["tenants/app/alice"]
        assert {i.session for i in store.sessions("app")} == {"b1"}
        assert store.session("app", "bob", "b1").messages()[0].content == f"{TEXT} bob"
        assert store.app_state("app") == {"shared": f"{STATE} app scope"}
    assert not any(k.startswith("tenants/app/alice/") for k in every_byte(backend))
    with backend.open(master_key=key) as store:
        assert fsck(store).ok and fsck(store).erased == []


def test_rival_creators_of_a_new_encrypted_store_share_one_key_store(tmp_path: Path, key: str) -> None:
    import threading

    url = str(tmp_path / "new")
    errors: list[BaseException] = []
    handles: list[castore.Store] = []
    go = threading.Barrier(4)

    def create(i: int) -> None:
        try:
            st = castore.open(url, encrypted=True, master_key=key)
            handles.append(st)
            go.wait()
            st.session("app", f"u{i}", "s").append(Message(role="user", content=f"{TEXT} {i}"))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for st in handles:
        st.close()
    assert errors == []
    with castore.open(url, master_key=key) as st:
        assert sorted(i.user for i in st.sessions("app")) == ["u0", "u1", "u2", "u3"]
        assert [st.session("app", f"u{i}", "s").messages()[0].content for i in range(4)] == [
            f"{TEXT} {i}" for i in range(4)]
    # a creation cut short (keys made, castore.json not written) is finished by the next one
    cut = tmp_path / "cut"
    from castore.crypto.encryption import create_store_keys

    create_store_keys(open_storage(str(cut)), key).close()
    with castore.open(str(cut), encrypted=True, master_key=key) as st:
        st.session("a", "u", "s").append(Message(role="user", content="after"))
    with pytest.raises(WrongKey):  # another key finds the key store, and is refused by it
        create_store_keys(open_storage(str(cut)), MasterKey.new())


def _o(backend: Backend) -> list[str]:
    """The backend's storage options as ``-o KEY=VALUE`` arguments."""
    return [a for k, v in backend.options.items() for a in ("-o", f"{k}={v}")]


def test_encryption_arguments_given_as_storage_options_are_refused_with_one_line(backend: Backend,
                                                                                tmp_path: Path) -> None:
    """``-o master_key=K`` created a plain store when the store was new (the key unused, no
    word said), ``-o key_store=URL`` was dropped on every store, ``remote add -o master_key=K``
    wrote the master key in clear into castore.json, and ``-o master_key`` beside
    ``--master-key-file`` (or ``clone -o master_key`` with a key file) ended in a TypeError
    traceback. ``-o`` takes storage options only: each is refused with one line naming the
    option to use, nothing written (on local disk, memory and S3 alike)."""
    key = MasterKey.new()
    (tmp_path / "k").write_text(key)
    runner = CliRunner()
    base = ["--store", backend.url, *_o(backend)]
    for extra in (["-o", f"master_key={key}"], ["-o", "key_store=memory://ks"], ["-o", "encrypted=true"],
                  ["--master-key-file", str(tmp_path / "k"), "-o", f"master_key={key}"]):
        res = runner.invoke(main, [*base, *extra, "append", "--role", "user", "hi", "-s", "a/u/s"])
        assert res.exit_code == 2 and res.exception is None or isinstance(res.exception, SystemExit), res.output
        assert "is not a storage option" in res.stderr and key not in res.stderr, res.stderr
        assert "Traceback" not in res.output
    with castore.open(backend.url, **backend.options) as st:
        assert not st.exists  # nothing was written
        st.session("a", "u", "s").append(Message(role="user", content="plain"))
    res = runner.invoke(main, [*base, "remote", "add", "r", str(tmp_path / "r"), "-o", f"master_key={key}"])
    assert res.exit_code == 2 and "is not a storage option" in res.stderr, res.output
    res = runner.invoke(main, ["--master-key-file", str(tmp_path / "k"), "clone", backend.url, str(tmp_path / "c"),
                               *_o(backend), "-o", f"master_key={key}"])
    assert res.exit_code == 2 and "is not a storage option" in res.stderr and "Traceback" not in res.output, res.output
    with castore.open(backend.url, **backend.options) as st:
        assert key not in str(st.config) and "r" not in st.config.get("remotes", {})
        with pytest.raises(EncryptionError, match="not a storage option"):
            castore.sync.add_remote(st, "r", str(tmp_path / "r"), {"master_key": key})
        assert "r" not in st.config.get("remotes", {})


def test_a_key_for_a_store_that_is_not_encrypted_is_refused_or_said_unused(backend: Backend) -> None:
    """``castore.open(new_url, master_key=K)`` created a plain store at the first write (the
    key unused, nothing said): only ``encrypted=True`` creates an encrypted one, and a key
    alone now refuses the creation, nothing written. ``key_store=`` was dropped unless an
    encrypted store was being created: a new plain store, an existing plain one and an
    encrypted one whose key store is elsewhere now refuse it, naming the store. A key given
    for an existing plain store is not used (documented: an environment may hold a key for
    other stores); the store opens as before."""
    key = MasterKey.new()
    st = backend.open(master_key=key)
    with pytest.raises(EncryptionError, match="would not be encrypted.*encrypted=True"):
        st.session("a", "u", "s").append(Message(role="user", content=TEXT))
    st.close()
    with backend.open() as plain:
        assert not plain.exists
        with pytest.raises(EncryptionError, match="key_store"):
            backend.open(key_store="memory://ks-nowhere").session("a", "u", "s").append(
                Message(role="user", content=TEXT))
        plain.session("a", "u", "s").append(Message(role="user", content=TEXT))
    with backend.open(master_key=key) as again:  # an existing plain store: the key is not used
        assert [e.id for e in again.session("a", "u", "s").log()]
    with pytest.raises(EncryptionError, match="not encrypted"):
        backend.open(key_store="memory://ks-nowhere")
    enc_url = backend.url + "-enc"
    with castore.open(enc_url, encrypted=True, master_key=key, **backend.options) as enc:
        enc.session("a", "u", "s").append(Message(role="user", content=TEXT))
    with pytest.raises(EncryptionError, match="key store of .* is at its own keys/"):
        castore.open(enc_url, master_key=key, key_store="memory://ks-elsewhere", **backend.options)


def test_a_key_in_the_environment_is_read_by_encrypted_stores_only(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``$CASTORE_MASTER_KEY_FILE`` was read by the command line, which handed its key to every
    store it opened: a new plain store was then refused ("master_key= was given", though none
    was typed), where ``$CASTORE_MASTER_KEY`` left it alone. Both variables are the
    environment's key, read by an encrypted store only (in Python as on the command line; the
    file's variable first); ``--master-key-file`` typed for a new plain store is still refused."""
    key, other = MasterKey.new(), MasterKey.new()
    (tmp_path / "k").write_text(key + "\n")
    monkeypatch.setenv("CASTORE_MASTER_KEY_FILE", str(tmp_path / "k"))
    monkeypatch.setenv("CASTORE_MASTER_KEY", other)  # the file's variable comes first
    runner = CliRunner()
    plain = str(tmp_path / "plain")
    res = runner.invoke(main, ["--store", plain, "append", "--role", "user", "hi", "-s", "a/u/s"])
    assert res.exit_code == 0, res.output
    with castore.open(plain) as st:
        assert st.encryption is None and [m.content for m in st.session("a", "u", "s").messages()] == ["hi"]
    enc = str(tmp_path / "enc")
    res = runner.invoke(main, ["--store", enc, "init", "--encrypted"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["--store", enc, "append", "--role", "user", TEXT, "-s", "a/u/s"])
    assert res.exit_code == 0, res.output
    with castore.open(enc) as st:  # the library reads the same variable
        assert [m.content for m in st.session("a", "u", "s").messages()] == [TEXT]
    with castore.open(enc, master_key=key) as st:  # the store was made under the file's key
        assert [m.content for m in st.session("a", "u", "s").messages()] == [TEXT]
    res = runner.invoke(main, ["--store", str(tmp_path / "new"), "--master-key-file", str(tmp_path / "k"),
                               "append", "--role", "user", "hi", "-s", "a/u/s"])
    assert res.exit_code != 0 and "would not be encrypted" in res.stderr, res.output
    monkeypatch.setenv("CASTORE_MASTER_KEY_FILE", str(tmp_path / "missing"))
    with castore.open(plain) as st:  # a plain store never reads the key
        assert len(st.session("a", "u", "s").messages()) == 1
    with pytest.raises(KeyMissing, match="missing"):
        castore.open(enc).session("a", "u", "s").messages()
