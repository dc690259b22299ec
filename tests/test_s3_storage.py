"""S3Storage against real S3 HTTP servers: moto always, SeaweedFS when its binary starts."""

from __future__ import annotations

import gc
import itertools
import threading
import weakref
from collections.abc import Iterator

import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

from click.testing import CliRunner
from helpers.threads import race

from castore.cli import main
from castore.errors import StorageError
from castore.storage import open_storage
from castore.storage.base import PreconditionFailed
from castore.storage.s3 import S3Storage

try:
    from . import s3server
except ImportError:  # tests/ is not a package: pytest put it on sys.path
    import s3server  # type: ignore[no-redef]

pytestmark = pytest.mark.s3
_n = itertools.count()


@pytest.fixture(scope="session")
def moto(moto_server: s3server.Server) -> s3server.Server:
    """conftest's session server (one moto process for the suite); tests here use buckets of their own."""
    return moto_server


@pytest.fixture(scope="session")
def seaweed(seaweedfs: s3server.Server) -> s3server.Server:
    """conftest's session SeaweedFS (skips when it cannot start)."""
    return seaweedfs


def _fresh(server: s3server.Server) -> S3Storage:
    bucket = f"bkt-{next(_n)}"
    s3server.make_bucket(server.endpoint_url, bucket)
    return S3Storage(f"{bucket}/some/prefix", **server.storage_options)


@pytest.fixture
def st(moto: s3server.Server) -> Iterator[S3Storage]:
    s = _fresh(moto)
    yield s
    s.close()


def test_a_storage_that_was_used_is_freed_once_dropped(moto: s3server.Server) -> None:
    """The request-counting hook on the botocore client must not keep the storage (its file
    system and botocore's parsed models) alive: s3fs's finalizer holds that client until exit."""
    s = _fresh(moto)
    s.write("k", b"v")
    assert s.request_count >= 1
    ref = weakref.ref(s)
    del s
    gc.collect()
    assert ref() is None


def test_storages_share_botocore_models_and_keep_their_own_sessions(moto: s3server.Server) -> None:
    """Every S3 storage of a process shares one botocore model loader (S3's service model is
    parsed once, not at each storage's first request), while its session, and with it its
    credentials and profile, stays its own; a session the caller passes is used as given."""
    from aiobotocore.session import AioSession

    a, b = _fresh(moto), _fresh(moto)
    other = S3Storage(f"{b.bucket}/elsewhere", **{**moto.storage_options, "key": "otherkey"})
    for s in (a, b, other):
        s.write("k", b"v")
        assert s.read("k") == b"v"
    sessions = [s._fs.session for s in (a, b, other)]
    assert len({id(x) for x in sessions}) == 3
    assert len({id(x.get_component("data_loader")) for x in sessions}) == 1
    own = AioSession()
    mine = S3Storage(f"{a.bucket}/mine", **moto.storage_options, session=own)
    mine.write("k", b"w")
    assert mine._fs.session is own and mine.read("k") == b"w"
    with pytest.raises(StorageError, match="profile"):
        S3Storage(f"{a.bucket}/p", profile="castore-no-such-profile")
    for s in (a, b, other, mine):
        s.close()


def test_url_and_open_storage(moto: s3server.Server) -> None:
    s = open_storage("s3://mybucket/a/b", **moto.storage_options)
    assert isinstance(s.inner, S3Storage)  # wrapped in RetryingStorage
    assert s.url == "s3://mybucket/a/b" and s.durable
    assert "testsecret" not in repr(s)
    s.close()
    assert S3Storage("mybucket", **moto.storage_options).url == "s3://mybucket"


def test_round_trip(st: S3Storage) -> None:
    st.write("objects/ab/cdef", b"hello")
    assert st.read("objects/ab/cdef") == b"hello"
    st.write("objects/ab/cdef", b"again")
    assert st.read("objects/ab/cdef") == b"again"
    assert st.exists("objects/ab/cdef") and not st.exists("objects/ab/nope")
    m = st.mtime("objects/ab/cdef")
    assert isinstance(m, float) and m > 1e9
    assert st.mtime("nope") is None


def test_empty_value(st: S3Storage) -> None:
    st.write("e", b"")
    assert st.read("e") == b""
    assert st.read_many(["e"]) == {"e": b""}


def test_missing_key(st: S3Storage) -> None:
    with pytest.raises(FileNotFoundError):
        st.read("no/such/key")
    assert st.read_versioned("no/such/key") is None


def test_many_and_request_count(st: S3Storage) -> None:
    items = {f"objects/{i:02x}/{i}": bytes([i]) * (i + 1) for i in range(50)}
    before = st.request_count
    st.write_many(items)
    assert st.request_count - before == 50
    before = st.request_count
    got = st.read_many(list(items))
    assert st.request_count - before == 50  # one GET each, no HEAD
    assert got == items
    before = st.request_count
    got = st.read_many(["objects/00/0", "missing/1"])
    assert got == {"objects/00/0": b"\x00", "missing/1": None}
    assert st.request_count - before == 2
    assert st.read_many([]) == {}
    st.write_many({})


def test_swap_create_twice(st: S3Storage) -> None:
    tok = st.swap("refs/heads/main", b"one", None)
    assert tok.startswith('"')
    with pytest.raises(PreconditionFailed) as ei:
        st.swap("refs/heads/main", b"two", None)
    assert ei.value.key == "refs/heads/main" and ei.value.expected is None
    assert st.read_versioned("refs/heads/main") == (b"one", tok)


def test_swap_tokens(st: S3Storage) -> None:
    t1 = st.swap("refs/r", b"one", None)
    t2 = st.swap("refs/r", b"two", t1)
    assert t2 != t1
    assert st.read_versioned("refs/r") == (b"two", t2)
    with pytest.raises(PreconditionFailed) as ei:
        st.swap("refs/r", b"three", t1)
    assert ei.value.expected == t1
    # unquoted form of the token is accepted too
    t3 = st.swap("refs/r", b"three", t2.strip('"'))
    assert st.read("refs/r") == b"three"
    with pytest.raises(PreconditionFailed):
        st.swap("refs/absent", b"x", t3)


def test_same_bytes_keep_the_token(st: S3Storage) -> None:
    """ETags hash the content: rewriting the same bytes leaves the token unchanged, so a
    rival holding that token still wins. Refs stamp each write with a write id for this."""
    t1 = st.swap("refs/aba", b"same", None)
    assert st.swap("refs/aba", b"same", t1) == t1
    assert st.swap("refs/aba", b"other", t1) != t1


def test_delete(st: S3Storage) -> None:
    t = st.swap("refs/d", b"one", None)
    with pytest.raises(PreconditionFailed):
        st.delete("refs/d", expect='"0123"')
    assert st.read("refs/d") == b"one"
    st.delete("refs/d", expect=t)
    assert st.read_versioned("refs/d") is None
    with pytest.raises(PreconditionFailed):
        st.delete("refs/d", expect=t)
    st.delete("refs/d")  # missing without expect: fine
    st.write("plain", b"x")
    st.delete("plain")
    assert not st.exists("plain")


def test_list(st: S3Storage) -> None:
    st.write_many({"a/b/c": b"1", "a/b/d": b"2", "a/e": b"3", "f": b"4", "ab/x": b"5"})
    assert st.list("a") == ["a/b/c", "a/b/d", "a/e"]
    assert st.list("a/b/") == ["a/b/c", "a/b/d"]
    assert st.list("") == ["a/b/c", "a/b/d", "a/e", "ab/x", "f"]
    assert st.list("nope") == []
    assert st.list_dir("a") == ["b", "e"]
    assert st.list_dir("") == ["a", "ab", "f"]
    assert st.list_dir("nope") == []
    st.write("a/new", b"6")  # a fresh listing, never a cached one
    assert st.list_dir("a") == ["b", "e", "new"]


def test_list_paginates(st: S3Storage) -> None:
    items = {f"p/{i:04d}": b"x" for i in range(1005)}
    st.write_many(items)
    assert st.list("p") == sorted(items)
    assert len(st.list_dir("p")) == 1005


def test_list_dir_excludes_folder_marker(moto: s3server.Server, st: S3Storage) -> None:
    import boto3

    c = boto3.client("s3", endpoint_url=moto.endpoint_url, aws_access_key_id=s3server.KEY,
                     aws_secret_access_key=s3server.SECRET, region_name=s3server.REGION)  # fmt: skip
    c.put_object(Bucket=st.bucket, Key=f"{st.prefix}/dir/", Body=b"")
    st.write("dir/x", b"1")
    assert st.list_dir("dir") == ["x"]
    assert st.list("dir") == ["dir/x"]


def _run_race(stores: list[S3Storage], rounds: int = 20) -> None:
    """Each round, every thread swaps from the same token; exactly one must win."""
    n = len(stores)
    key = "refs/heads/race"
    tok = stores[0].swap(key, b"start", None)
    for rnd in range(rounds):
        wins: list[tuple[int, str]] = []
        losses: list[int] = []
        lock = threading.Lock()

        def worker(i: int, expect: str = tok, rnd: int = rnd, lock: threading.Lock = lock, wins: list = wins,
                   losses: list = losses) -> None:
            try:
                new = stores[i].swap(key, f"{rnd}:{i}".encode(), expect)
                with lock:
                    wins.append((i, new))
            except PreconditionFailed:
                with lock:
                    losses.append(i)

        errors = race(worker, n, together=True)
        assert not errors, errors
        assert len(wins) == 1, f"round {rnd}: {len(wins)} winners"
        assert len(losses) == n - 1
        winner, tok = wins[0]
        assert stores[0].read_versioned(key) == (f"{rnd}:{winner}".encode(), tok)


@pytest.fixture(scope="module")
def moto_serial() -> Iterator[s3server.Server]:
    server = s3server.start_moto_server(serialize=True)
    yield server
    server.stop()


def test_race_moto(moto_serial: s3server.Server) -> None:
    """On moto this checks the client's logic: moto checks then writes without a lock,
    so the server is run one request at a time to make its conditions atomic."""
    st = _fresh(moto_serial)
    try:
        _run_race([st] * 32)
    finally:
        st.close()


@pytest.fixture
def weed_store(seaweed: s3server.Server) -> Iterator[S3Storage]:
    s = _fresh(seaweed)
    yield s
    s.close()


def test_seaweed_conditions(seaweed: s3server.Server, weed_store: S3Storage) -> None:
    got = s3server.check_conditions(seaweed.endpoint_url, weed_store.bucket)
    assert got == {"if_none_match": True, "if_match": True, "delete_if_match": True}


def test_seaweed_basics(weed_store: S3Storage) -> None:
    st = weed_store
    st.write_many({"a/b": b"1", "a/c": b"2"})
    assert st.read_many(["a/b", "a/c", "a/x"]) == {"a/b": b"1", "a/c": b"2", "a/x": None}
    t = st.swap("refs/x", b"1", None)
    with pytest.raises(PreconditionFailed):
        st.swap("refs/x", b"2", None)
    with pytest.raises(PreconditionFailed):
        st.swap("refs/x", b"2", '"0000"')
    t2 = st.swap("refs/x", b"2", t)
    assert st.read_versioned("refs/x") == (b"2", t2)
    with pytest.raises(PreconditionFailed):
        st.delete("refs/x", expect=t)
    st.delete("refs/x", expect=t2)
    assert st.read_versioned("refs/x") is None
    # SeaweedFS keeps the emptied folder "refs" (its filer has real directories)
    assert "a" in st.list_dir("") and st.list("refs") == []
    assert st.list("a") == ["a/b", "a/c"]


def _seaweed_race(seaweed: s3server.Server, weed_store: S3Storage, threads: int, rounds: int) -> None:
    stores = [S3Storage(f"{weed_store.bucket}/{weed_store.prefix}", **seaweed.storage_options) for _ in range(threads)]
    try:
        _run_race(stores, rounds)
    finally:
        for s in stores:
            s.close()


def test_race_seaweed(seaweed: s3server.Server, weed_store: S3Storage) -> None:
    """SeaweedFS applies conditions atomically: this tests the server and the mapping.

    SeaweedFS makes racing conditional PUTs on one key wait for each other (about 1-5 s a
    round), so the default run is small; the full 32 x 20 race is marked slow.
    """
    _seaweed_race(seaweed, weed_store, threads=8, rounds=3)


@pytest.mark.slow
def test_race_seaweed_full(seaweed: s3server.Server, weed_store: S3Storage) -> None:
    _seaweed_race(seaweed, weed_store, threads=32, rounds=20)


def test_seaweed_missing_bucket(seaweed: s3server.Server) -> None:
    st = S3Storage("no-such-bucket-sw/p", **seaweed.storage_options)
    with pytest.raises(StorageError, match="no-such-bucket-sw"):
        st.write("k", b"1")
    st.close()


def test_bad_endpoint() -> None:
    (port,) = s3server.free_ports(1)  # nothing listens there
    opts = s3server.storage_options(
        f"http://127.0.0.1:{port}",
        retries=1,
        config_kwargs={"connect_timeout": 1, "read_timeout": 1, "retries": {"total_max_attempts": 1}},
    )
    st = S3Storage("bucket/p", **opts)
    for call in (lambda: st.read("k"), lambda: st.write("k", b"1"), lambda: st.swap("k", b"1", None),
                 lambda: st.list_dir(""), lambda: st.read_many(["a", "b"])):  # fmt: skip
        with pytest.raises(StorageError, match="cannot reach S3 endpoint") as ei:
            call()
        assert ei.value.__cause__ is not None
        assert f"127.0.0.1:{port}" in str(ei.value)
    st.close()


def test_missing_bucket(moto: s3server.Server) -> None:
    st = S3Storage("no-such-bucket/p", **moto.storage_options)
    for call in (lambda: st.write("k", b"1"), lambda: st.read("k"), lambda: st.list(""),
                 lambda: st.swap("k", b"1", None), lambda: st.write_many({"a": b"1"})):  # fmt: skip
        with pytest.raises(StorageError, match="bucket 'no-such-bucket' does not exist"):
            call()
    st.close()


def test_bad_credentials(moto: s3server.Server) -> None:
    """moto's server accepts any credentials; check the mapping of a 403 directly."""
    from botocore.exceptions import ClientError

    st = S3Storage("b/p", **moto.storage_options)
    err = ClientError({"Error": {"Code": "InvalidAccessKeyId", "Message": "no"},
                       "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject")  # fmt: skip
    wrapped = PermissionError("no")
    wrapped.__cause__ = err
    assert "access denied" in str(st._error(wrapped, "read", "k"))
    st.close()


@pytest.mark.parametrize("opt", [{"retries": "abc"}, {"config_kwargs": 5}, {"client_kwargs": 5}],
                         ids=["retries", "config_kwargs", "client_kwargs"])
def test_an_option_of_the_wrong_shape_is_one_storage_error(opt: dict[str, object]) -> None:
    """``-o retries=abc``, ``-o config_kwargs=5`` or ``-o client_kwargs=5`` (a remote's options
    too): one StorageError naming the option, at open (nothing is sent), not a traceback of
    ``int()`` or of s3fs reading a number as a mapping."""
    name = next(iter(opt))
    with pytest.raises(StorageError, match=f"storage option {name} must be"):
        S3Storage("mybucket/p", key="k", secret="s", **opt)
    res = CliRunner().invoke(main, ["--store", "s3://mybucket/p", "-o", f"{name}={opt[name]}", "sessions"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit | None), res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and f"storage option {name} must be" in errors[0], res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize("name, value", [
    ("config_kwargs.max_pool_connections", -3),  # hung in aiohttp's connector
    ("config_kwargs.max_pool_connections", 0),
    ("endpoint_url", 9000),  # "'int' object is not iterable"
    ("client_kwargs.region_name", 5),  # "expected string or bytes-like object"
    ("config_kwargs.retries", 5),  # "'int' object has no attribute 'items'"
    ("key", 5),
])
def test_a_nested_option_of_the_wrong_shape_is_one_storage_error_naming_it(name: str, value: int) -> None:
    """``-o config_kwargs.max_pool_connections=-3`` hung forever (checked at open now, before
    it reaches botocore: nothing is sent), and a number where botocore wants a string or a
    mapping failed with a message naming no option: one StorageError naming the option."""
    first, _, rest = name.partition(".")
    opt: dict[str, object] = {first: {rest: value} if rest else value}
    with pytest.raises(StorageError, match=f"storage option {name} must be"):
        S3Storage("mybucket/p", key="k", secret="s", **opt) if first != "key" else S3Storage("mybucket/p", **opt)
    res = CliRunner().invoke(main, ["--store", "s3://mybucket/p", "-o", f"{name}={value}", "sessions"])
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error:")]
    assert res.exit_code == 1 and len(errors) == 1 and f"storage option {name} must be" in errors[0], res.output
