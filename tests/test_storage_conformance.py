"""One contract for every Storage backend (local disk, memory, S3 on a loopback moto server,
and the generic fsspec backend on fsspec's memory file system).

Each test runs on every backend through the ``backend`` fixture and
``castore.storage.open_storage(backend.url, **backend.options)``; what a backend may not
do differently from the others is written down here.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from conftest import BACKENDS, Backend, make_backend

from castore.errors import CastoreError, InvalidName
from castore.storage import DeleteIncomplete, PreconditionFailed, Storage, Versioned, open_storage
from castore.storage.faulty import FaultyStorage
from castore.storage.fsspec_generic import FsspecStorage
from castore.storage.retrying import RetryingStorage


@pytest.fixture(params=[*BACKENDS, "fsspec"])
def backend(request, tmp_path):
    """The shared backends, plus the generic fsspec backend on fsspec's memory file system."""
    if request.param == "fsspec":
        return Backend("fsspec", f"memory://fsspec-{uuid.uuid4().hex}")
    return make_backend(request.param, request, tmp_path)


def _open(backend) -> Storage:
    if backend.name == "fsspec":
        return FsspecStorage(backend.url)  # open_storage sends memory:// to MemoryStorage
    return open_storage(backend.url, **backend.options)


@pytest.fixture
def storage(backend) -> Iterator[Storage]:
    st = _open(backend)
    try:
        yield st
    finally:
        st.close()


@pytest.fixture
def other(backend) -> Iterator[Storage]:
    """A second, independent handle on the same root."""
    st = _open(backend)
    try:
        yield st
    finally:
        st.close()


# -- plain reads and writes ----------------------------------------------------------------


def test_write_then_read_returns_the_same_bytes(storage):
    storage.write("a/b/c", b"hello\x00\xff")
    assert storage.read("a/b/c") == b"hello\x00\xff"


def test_write_replaces_what_was_there(storage):
    storage.write("k", b"one")
    storage.write("k", b"two")
    assert storage.read("k") == b"two"


def test_empty_bytes_are_stored_and_read_back(storage):
    storage.write("empty", b"")
    assert storage.read("empty") == b""
    assert storage.exists("empty")


def test_large_value_round_trips(storage):
    data = bytes(range(256)) * 4096  # 1 MiB
    storage.write("big/blob", data)
    assert storage.read("big/blob") == data


def test_read_missing_key_raises_file_not_found(storage):
    with pytest.raises(FileNotFoundError):
        storage.read("no/such/key")


def test_read_of_a_folder_raises_file_not_found(storage):
    storage.write("dir/file", b"x")
    with pytest.raises(FileNotFoundError):
        storage.read("dir")


def test_a_second_handle_sees_the_writes_of_the_first(storage, other):
    storage.write("shared/k", b"v")
    assert other.read("shared/k") == b"v"


def test_write_many_then_read_many(storage):
    items = {f"objects/{i:02x}/{i:062x}": f"value {i}".encode() for i in range(40)}
    storage.write_many(items)
    got = storage.read_many(list(items))
    assert got == items


def test_read_many_gives_none_for_missing_keys(storage):
    storage.write("x/present", b"1")
    got = storage.read_many(["x/present", "x/absent", "y/absent"])
    assert got == {"x/present": b"1", "x/absent": None, "y/absent": None}


def test_read_many_of_nothing_is_empty(storage):
    assert storage.read_many([]) == {}


def test_read_heads_gives_the_first_bytes_of_each_key_and_none_for_missing_ones(storage):
    storage.write("packs/a.idx", bytes(range(200)))
    storage.write("packs/b.idx", b"short")
    storage.write("packs/e.idx", b"")
    got = storage.read_heads(["packs/a.idx", "packs/b.idx", "packs/e.idx", "packs/none.idx"], 64)
    assert got == {"packs/a.idx": bytes(range(64)), "packs/b.idx": b"short", "packs/e.idx": b"",
                   "packs/none.idx": None}
    assert storage.read_heads([], 64) == {}


def test_write_many_of_nothing_writes_nothing(storage):
    storage.write_many({})
    assert storage.list("") == []


# -- compare-and-swap ------------------------------------------------------------------------


def test_swap_with_none_creates_an_absent_key(storage):
    token = storage.swap("refs/r", b"first", None)
    assert token
    got = storage.read_versioned("refs/r")
    assert got == Versioned(b"first", token)


def test_swap_with_none_fails_when_the_key_exists(storage):
    storage.swap("refs/r", b"first", None)
    with pytest.raises(PreconditionFailed) as ei:
        storage.swap("refs/r", b"second", None)
    assert ei.value.key == "refs/r"
    assert ei.value.expected is None
    assert isinstance(ei.value, CastoreError)
    assert storage.read("refs/r") == b"first"


def test_swap_with_none_fails_on_a_key_written_plainly(storage):
    storage.write("refs/plain", b"x")
    with pytest.raises(PreconditionFailed):
        storage.swap("refs/plain", b"y", None)
    assert storage.read("refs/plain") == b"x"


def test_swap_with_current_token_replaces_and_returns_the_new_token(storage):
    t1 = storage.swap("refs/r", b"one", None)
    t2 = storage.swap("refs/r", b"two", t1)
    assert t2 != t1
    assert storage.read_versioned("refs/r") == Versioned(b"two", t2)
    t3 = storage.swap("refs/r", b"three", t2)
    assert storage.read_versioned("refs/r") == Versioned(b"three", t3)


def test_swap_with_stale_token_fails_and_leaves_the_value(storage):
    t1 = storage.swap("refs/r", b"one", None)
    storage.swap("refs/r", b"two", t1)
    with pytest.raises(PreconditionFailed) as ei:
        storage.swap("refs/r", b"three", t1)
    assert ei.value.expected == t1
    assert storage.read("refs/r") == b"two"


def test_swap_with_a_token_on_an_absent_key_fails(storage):
    t1 = storage.swap("refs/r", b"one", None)
    storage.delete("refs/r")
    with pytest.raises(PreconditionFailed):
        storage.swap("refs/r", b"two", t1)
    assert storage.read_versioned("refs/r") is None


def test_token_read_by_another_handle_is_accepted(storage, other):
    storage.swap("refs/r", b"one", None)
    seen = other.read_versioned("refs/r")
    assert seen is not None
    other.swap("refs/r", b"two", seen.token)
    assert storage.read("refs/r") == b"two"


def test_read_versioned_of_missing_key_is_none(storage):
    assert storage.read_versioned("refs/nothing") is None


def test_read_versioned_token_is_stable_while_unchanged(storage):
    storage.swap("refs/r", b"one", None)
    a = storage.read_versioned("refs/r")
    b = storage.read_versioned("refs/r")
    assert a == b


def test_swap_leaves_no_visible_side_files(storage):
    t = storage.swap("refs/a/HEAD", b"1", None)
    storage.swap("refs/a/HEAD", b"2", t)
    with pytest.raises(PreconditionFailed):
        storage.swap("refs/a/HEAD", b"3", t)
    assert storage.list("refs") == ["refs/a/HEAD"]
    assert storage.list_dir("refs/a") == ["HEAD"]


# -- delete ---------------------------------------------------------------------------------


def test_delete_without_expect_removes_the_key(storage):
    storage.write("d/k", b"v")
    storage.delete("d/k")
    assert not storage.exists("d/k")
    with pytest.raises(FileNotFoundError):
        storage.read("d/k")


def test_delete_of_a_missing_key_without_expect_is_not_an_error(storage):
    storage.delete("d/never")


def test_delete_with_current_token_removes_the_key(storage):
    t = storage.swap("refs/r", b"v", None)
    storage.delete("refs/r", expect=t)
    assert storage.read_versioned("refs/r") is None


def test_delete_with_stale_token_fails_and_keeps_the_key(storage):
    t1 = storage.swap("refs/r", b"one", None)
    storage.swap("refs/r", b"two", t1)
    with pytest.raises(PreconditionFailed):
        storage.delete("refs/r", expect=t1)
    assert storage.read("refs/r") == b"two"


def test_delete_with_expect_of_a_missing_key_fails(storage):
    t = storage.swap("refs/r", b"one", None)
    storage.delete("refs/r")
    with pytest.raises(PreconditionFailed):
        storage.delete("refs/r", expect=t)


def test_delete_leaves_siblings_alone(storage):
    storage.write("p/a", b"1")
    storage.write("p/b", b"2")
    storage.write("p/sub/c", b"3")
    storage.delete("p/a")
    assert storage.list("p") == ["p/b", "p/sub/c"]


def test_a_key_can_be_created_again_after_delete(storage):
    t = storage.swap("refs/sessions/a/u/s/HEAD", b"one", None)
    storage.delete("refs/sessions/a/u/s/HEAD", expect=t)
    t2 = storage.swap("refs/sessions/a/u/s/HEAD", b"two", None)
    assert storage.read_versioned("refs/sessions/a/u/s/HEAD") == Versioned(b"two", t2)


def test_delete_many_removes_every_key_and_ignores_missing_ones(storage):
    keys = [f"packs/b-{i:032x}.pack" for i in range(20)]
    storage.write_many({k: b"x" * 10 for k in keys})
    storage.write("packs/keep.pack", b"k")
    storage.delete_many([*keys, "packs/never.pack", keys[0]])
    assert storage.list("packs") == ["packs/keep.pack"]
    storage.delete_many([])


def test_delete_many_with_a_key_that_leaves_the_root_deletes_nothing(storage):
    storage.write("a/k", b"v")
    with pytest.raises(CastoreError, match="outside|leave"):
        storage.delete_many(["a/k", "a/../../outside"])
    assert storage.read("a/k") == b"v"


# -- listing --------------------------------------------------------------------------------


@pytest.fixture
def tree(storage) -> Storage:
    storage.write_many(
        {
            "refs/sessions/app/alice/s1/HEAD": b"h",
            "refs/sessions/app/alice/s1/heads/main": b"m",
            "refs/sessions/app/alice/s1/heads/dev": b"d",
            "refs/sessions/app/alice/s2/HEAD": b"h",
            "refs/sessions/app/bob/s1/HEAD": b"h",
            "refs/sessions/apple/x/y/HEAD": b"h",
            "objects/ab/cdef": b"o",
            "castore.json": b"{}",
        }
    )
    return storage


def test_list_is_recursive_sorted_and_relative_to_the_root(tree):
    assert tree.list("refs/sessions/app/alice") == [
        "refs/sessions/app/alice/s1/HEAD",
        "refs/sessions/app/alice/s1/heads/dev",
        "refs/sessions/app/alice/s1/heads/main",
        "refs/sessions/app/alice/s2/HEAD",
    ]


def test_list_treats_the_prefix_as_a_folder_not_a_string_prefix(tree):
    # "app" must not match "apple"
    assert all(not k.startswith("refs/sessions/apple") for k in tree.list("refs/sessions/app"))
    assert tree.list("refs/sessions/apple") == ["refs/sessions/apple/x/y/HEAD"]


def test_list_accepts_a_trailing_slash(tree):
    assert tree.list("refs/sessions/app/bob/") == ["refs/sessions/app/bob/s1/HEAD"]


def test_list_of_the_root_lists_everything(tree):
    assert len(tree.list("")) == 8
    assert "castore.json" in tree.list("")


def test_list_of_a_missing_prefix_is_empty(tree):
    assert tree.list("refs/sessions/nobody") == []
    assert tree.list_dir("refs/sessions/nobody") == []


def test_list_of_an_empty_store_is_empty(storage):
    assert storage.list("") == []
    assert storage.list("refs") == []
    assert storage.list_dir("") == []
    assert storage.list_dir("refs") == []


def test_list_dir_gives_immediate_files_and_folders(tree):
    assert tree.list_dir("refs/sessions/app/alice/s1") == ["HEAD", "heads"]
    assert tree.list_dir("refs/sessions/app") == ["alice", "bob"]
    assert tree.list_dir("refs/sessions") == ["app", "apple"]
    assert tree.list_dir("") == ["castore.json", "objects", "refs"]


def test_list_dir_accepts_a_trailing_slash(tree):
    assert tree.list_dir("refs/sessions/app/") == ["alice", "bob"]


def test_listing_forgets_deleted_keys(tree):
    tree.delete("refs/sessions/app/bob/s1/HEAD")
    assert tree.list_dir("refs/sessions/app") == ["alice"]
    assert tree.list("refs/sessions/app/bob") == []


# -- exists and mtime -----------------------------------------------------------------------


def test_exists_tells_present_from_missing(storage):
    storage.write("e/k", b"1")
    assert storage.exists("e/k")
    assert not storage.exists("e/other")
    assert not storage.exists("nothing/at/all")


def test_mtime_of_a_fresh_write_is_now(storage):
    before = time.time()
    storage.write("m/k", b"1")
    m = storage.mtime("m/k")
    assert m is not None
    # S3 keeps whole seconds, and the test server's clock is this machine's
    assert before - 2 <= m <= time.time() + 2


def test_mtime_of_a_missing_key_is_none(storage):
    assert storage.mtime("m/none") is None


def test_storage_is_a_context_manager(backend):
    with _open(backend) as st:
        st.write("cm", b"1")
        assert st.read("cm") == b"1"


# -- local disk specifics --------------------------------------------------------------------


def test_local_writes_survive_a_folder_pruned_by_another_handle(tmp_path):
    a = open_storage(str(tmp_path / "s"))
    b = open_storage(str(tmp_path / "s"))
    a.write("objects/ab/one", b"1")  # a now believes objects/ab exists
    b.delete("objects/ab/one")  # b removes the emptied folder
    assert not (tmp_path / "s" / "objects" / "ab").exists()
    a.write_many({"objects/ab/two": b"2", "objects/cd/three": b"3"})
    a.write("objects/ab/four", b"4")
    assert a.list("objects") == ["objects/ab/four", "objects/ab/two", "objects/cd/three"]


def test_local_delete_many_that_fails_part_way_names_the_keys_left(tmp_path):
    st = open_storage(str(tmp_path / "st"))
    st.write_many({"k/1": b"1", "k/3": b"3", "k/2/inside": b"2"})  # k/2 is a folder: unlink fails
    with pytest.raises(DeleteIncomplete) as e:
        st.delete_many(["k/1", "k/2", "k/3"])
    assert e.value.remaining == ["k/2", "k/3"] and "k/2" in str(e.value)
    assert not st.exists("k/1") and st.read("k/3") == b"3" and st.read("k/2/inside") == b"2"


def test_s3_delete_many_that_cannot_reach_s3_names_every_key_left():
    st = open_storage("s3://b/p", endpoint_url="http://127.0.0.1:9", key="k", secret="s", retries=1)
    with pytest.raises(DeleteIncomplete) as e:
        st.delete_many(["a", "b"])
    assert e.value.remaining == ["a", "b"] and "cannot reach" in str(e.value)


def test_retrying_storage_retries_a_failed_delete_many_on_the_keys_left(tmp_path):
    faulty = FaultyStorage(open_storage(str(tmp_path / "st")), rate=1.0, kinds={"fail": 1.0},
                           methods=("delete_many",), seed=3)
    keys = [f"k/{i}" for i in range(50)]
    faulty.write_many({k: b"v" for k in keys})
    with pytest.raises(DeleteIncomplete) as e:
        faulty.delete_many(keys)
    left = e.value.remaining
    assert 0 < len(left) < 50 and left == keys[50 - len(left):]
    assert sorted(faulty.list("k")) == sorted(left)
    faulty.write_many({k: b"v" for k in keys})
    retrying = RetryingStorage(faulty, sleep=lambda _: setattr(faulty, "rate", 0.0))  # fails once, then works
    retrying.delete_many(keys)
    assert faulty.list("k") == [] and retrying.retries == 1


def test_local_delete_prunes_empty_folders_but_not_the_root(tmp_path):
    st = open_storage(str(tmp_path / "s"))
    st.write("refs/sessions/a/u/s/HEAD", b"1")
    st.delete("refs/sessions/a/u/s/HEAD")
    assert (tmp_path / "s").is_dir()
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["swaps.log"]  # the log of ref changes stays


def test_local_listing_hides_locks_and_temporary_files(tmp_path):
    st = open_storage(str(tmp_path / "s"))
    st.write("refs/x/HEAD", b"1")
    (tmp_path / "s" / "refs" / "x" / "HEAD.lock").write_bytes(b"")
    (tmp_path / "s" / "refs" / "x" / "HEAD.tmp-0123").write_bytes(b"")
    assert st.list("refs") == ["refs/x/HEAD"]
    assert st.list_dir("refs/x") == ["HEAD"]


def test_local_mtime_below_a_file_is_none(tmp_path):
    st = open_storage(str(tmp_path / "s"))
    st.write("a", b"1")
    assert st.mtime("a/b") is None
    assert not st.exists("a/b")
    with pytest.raises(FileNotFoundError):
        st.read("a/b")


def test_a_child_storage_is_the_folder_below_its_prefix(storage: Storage) -> None:
    """``child(prefix)`` (the tenant layout's per-tenant storage) reads and writes exactly the
    parent's keys below ``prefix``, lists relative to itself, and nests."""
    child = storage.child("tenants/app/alice")
    child.write("objects/ab/cd", b"one")
    assert storage.read("tenants/app/alice/objects/ab/cd") == b"one"
    token = child.swap("refs/x", b"r1", None)
    assert storage.read_versioned("tenants/app/alice/refs/x").data == b"r1"
    child.swap("refs/x", b"r2", token)
    storage.write("tenants/app/bob/objects/ef", b"bob")
    storage.write("outside", b"root")
    own = {"swaps.log"}  # local disk logs the swaps of its refs at its root
    assert [k for k in child.list("") if k not in own] == ["objects/ab/cd", "refs/x"]
    assert [k for k in child.list_dir("") if k not in own] == ["objects", "refs"]
    assert child.read_many(["refs/x", "nope"]) == {"refs/x": b"r2", "nope": None}
    grand = child.child("refs")
    assert grand.read("x") == b"r2"
    child.delete("refs/x")
    assert not storage.exists("tenants/app/alice/refs/x")
    assert storage.read("tenants/app/bob/objects/ef") == b"bob"
    for bad in ("", "../bob", "/abs", "a//b"):
        with pytest.raises(InvalidName):
            storage.child(bad)
