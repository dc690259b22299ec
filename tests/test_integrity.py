"""Damage on storage is reported precisely through the public API, and harms nothing else.

Each test writes two sessions, damages one object (or ref) of the first with plain
storage writes, then reads through a fresh ``castore.open`` handle (no cache).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import layout
import pytest

import castore
from castore import names
from castore import objects as o
from castore.refs import ref_key


@dataclass
class Damaged:
    backend: object
    victim_commit: str
    victim_body: str
    victim_branch_ref: str
    victim_head_ref: str
    bystander: list[castore.Message]

    def fresh(self) -> castore.Store:
        return self.backend.open()

    def victim(self, st: castore.Store) -> castore.Session:
        return st.session("app", "alice", "victim")


@pytest.fixture
def two_sessions(backend) -> Damaged:
    st = backend.open()
    try:
        v = st.session("app", "alice", "victim")
        for i in range(3):
            v.append(castore.Message(role="user", content=f"victim message {i}"))
        b = st.session("app", "bob", "bystander")
        for i in range(3):
            b.append(castore.Message(role="user", content=f"bystander message {i}"))
        head = v.head
        commit = st.objects.get(head)
        prefix = "sessions/" + names.encode_key("app", "alice", "victim")
        return Damaged(
            backend,
            victim_commit=head,
            victim_body=o.hex_id(commit.body),
            victim_branch_ref=f"{prefix}/heads/main",
            victim_head_ref=f"{prefix}/HEAD",
            bystander=b.messages(),
        )
    finally:
        st.close()


def _rewrite(d: Damaged, oid: str, change) -> None:
    with d.fresh() as st:
        data = layout.stored(st, oid)
        assert data is not None
        layout.replace(st, oid, change(data))


def _bystander_unharmed(d: Damaged) -> None:
    with d.fresh() as st:
        b = st.session("app", "bob", "bystander")
        assert b.messages() == d.bystander
        assert b.verify()["commits"] == 3
        assert [s.session for s in st.sessions("app", "bob")] == ["bystander"]


def _flip(data: bytes) -> bytes:
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x40]) + data[i + 1 :]


DAMAGE = {
    "flipped-byte": _flip,
    "truncated": lambda data: data[: max(1, len(data) // 2)],
    "unknown-header": lambda data: b"\x09" + data[1:],
    "empty": lambda data: b"",
}


@pytest.mark.parametrize(
    "damage, which",
    [("flipped-byte", "body"), ("flipped-byte", "commit"), ("truncated", "commit"),
     ("unknown-header", "body"), ("empty", "commit")],
)
def test_a_damaged_object_is_an_integrity_error_naming_its_id(two_sessions, damage, which):
    d = two_sessions
    oid = d.victim_commit if which == "commit" else d.victim_body
    _rewrite(d, oid, DAMAGE[damage])
    with d.fresh() as st:
        with pytest.raises(castore.IntegrityError) as ei:
            d.victim(st).messages()
        assert ei.value.object_id == oid
        assert oid in str(ei.value)
    with d.fresh() as st:
        with pytest.raises(castore.IntegrityError) as ei:
            d.victim(st).verify()
        assert ei.value.object_id == oid
    _bystander_unharmed(d)


def test_an_unknown_header_byte_is_named_in_the_error(two_sessions):
    d = two_sessions
    _rewrite(d, d.victim_body, DAMAGE["unknown-header"])
    with d.fresh() as st:
        with pytest.raises(castore.IntegrityError, match="unknown header byte 0x09"):
            d.victim(st).messages()


def test_a_missing_object_is_object_not_found(two_sessions):
    d = two_sessions
    with d.fresh() as st:
        layout.delete(st, d.victim_body)
    with d.fresh() as st:
        with pytest.raises(castore.ObjectNotFound) as ei:
            d.victim(st).messages()
        assert ei.value.object_id == d.victim_body
        assert isinstance(ei.value, KeyError)
    with d.fresh() as st:
        with pytest.raises(castore.ObjectNotFound):
            d.victim(st).verify()
    _bystander_unharmed(d)


def test_a_missing_commit_is_object_not_found(two_sessions):
    d = two_sessions
    with d.fresh() as st:
        layout.delete(st, d.victim_commit)
    with d.fresh() as st:
        with pytest.raises(castore.ObjectNotFound) as ei:
            d.victim(st).messages()
        assert ei.value.object_id == d.victim_commit
    _bystander_unharmed(d)


@pytest.mark.parametrize(
    "which, garbage", [("branch", b"garbage\n"), ("HEAD", b"\xff\xfe\x00"), ("branch", b"")],
    ids=["branch-text", "HEAD-binary", "branch-empty"],
)
def test_a_garbage_ref_is_an_integrity_error_naming_the_ref(two_sessions, which, garbage):
    d = two_sessions
    ref = d.victim_branch_ref if which == "branch" else d.victim_head_ref
    with d.fresh() as st:
        st.storage.write(ref_key(ref), garbage)
    with d.fresh() as st:
        with pytest.raises(castore.IntegrityError) as ei:
            d.victim(st).messages()
        assert ref in str(ei.value)
        assert ei.value.ref == ref
    with d.fresh() as st:
        with pytest.raises(castore.IntegrityError):
            d.victim(st).verify()
        # every public reader of the session says so, exists() too (no session "exists"
        # that info, head and fsck then fail on)
        readers = {"exists": lambda s: s.exists(), "info": lambda s: s.info, "head": lambda s: s.head}
        for what, read in readers.items():
            if which == "HEAD" or what == "head":
                with pytest.raises(castore.IntegrityError, match=re.escape(ref)):
                    read(d.victim(st))
    _bystander_unharmed(d)


def test_a_ref_to_a_missing_commit_is_object_not_found(two_sessions):
    d = two_sessions
    with d.fresh() as st:
        cur = st.refs.read(d.victim_branch_ref)
        st.refs.swap(d.victim_branch_ref, "ee" * 32, cur)
    with d.fresh() as st:
        with pytest.raises(castore.ObjectNotFound) as ei:
            d.victim(st).messages()
        assert ei.value.object_id == "ee" * 32
    _bystander_unharmed(d)


def test_an_undamaged_store_verifies(two_sessions):
    d = two_sessions
    with d.fresh() as st:
        assert d.victim(st).verify() == {"commits": 3, "head": d.victim_commit}
        assert [m.content for m in d.victim(st).messages()] == [f"victim message {i}" for i in range(3)]
