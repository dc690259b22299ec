"""Names become safe, distinct path segments; bad names are refused with a reason."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import castore
from castore import names
from castore.errors import InvalidName

# every code point except lone surrogates (not encodable), weighted towards the tricky ones
_tricky = st.sampled_from(list("./\\%~:*?\"<>|\x00\x01\x1f\x7f\u0085\u2028 .-_AaZz\u00e9\u0130\u212a\ufeff\U0001f600"))
_chars = st.one_of(_tricky, st.characters(blacklist_categories=("Cs",)))
valid_names = st.text(_chars, min_size=1, max_size=255)
short_names = st.text(_chars, min_size=1, max_size=40)


def _segment_is_safe(seg: str) -> None:
    assert seg, "empty segment"
    assert "/" not in seg and "\\" not in seg and "\x00" not in seg
    assert not any(unicodedata.category(c) == "Cc" for c in seg), seg
    assert seg not in (".", "..")
    assert not seg.endswith(".lock")
    assert len(seg.encode("utf-8")) <= names.MAX_SEGMENT
    assert seg.isascii()


@settings(max_examples=200, deadline=None)
@given(valid_names)
def test_a_segment_never_leaves_its_folder(name):
    _segment_is_safe(names.encode(name))


@settings(max_examples=200, deadline=None)
@given(valid_names, valid_names)
def test_encoding_is_injective(a, b):
    assume(a != b)
    assert names.encode(a) != names.encode(b)


@settings(max_examples=150, deadline=None)
@given(st.lists(short_names, min_size=2, max_size=20, unique=True))
def test_many_distinct_names_give_distinct_segments(ns):
    assert len({names.encode(n) for n in ns}) == len(ns)


@settings(max_examples=200, deadline=None)
@given(valid_names)
def test_decode_inverts_encode_for_names_that_are_not_hashed(name):
    seg = names.encode(name)
    if names.is_hashed(seg):
        with pytest.raises(InvalidName):
            names.decode(seg)
    else:
        assert names.decode(seg) == name


@settings(max_examples=150, deadline=None)
@given(short_names)
def test_segments_are_case_insensitive_safe(name):
    # two names never map to segments equal up to case (macOS and Windows fold case)
    seg = names.encode(name)
    other = name.swapcase()
    if other != name:
        assert names.encode(other).lower() != seg.lower() or names.encode(other) == seg


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=255))
def test_key_encoding_has_exactly_three_segments(name):
    key = names.encode_key(name, name, name)
    assert len(key.split("/")) == 3


def test_long_non_ascii_names_are_hashed_and_still_distinct():
    a = "\U0001f600" * 255
    b = "\U0001f600" * 254 + "\U0001f601"
    sa, sb = names.encode(a), names.encode(b)
    assert names.is_hashed(sa) and names.is_hashed(sb)
    assert sa != sb
    _segment_is_safe(sa)


def test_case_tricks_give_different_segments():
    assert names.encode("Alice") != names.encode("alice")
    assert names.encode("Alice").lower() != names.encode("alice").lower()
    assert names.encode("\u212a") != names.encode("K")  # Kelvin sign vs K


@pytest.mark.parametrize("name", [".", "..", "...", "a.lock", "x/../y", "/", "\\", "a\x00b", "\x1b[31m", "~abc", "%2F"])
def test_dangerous_names_are_encoded_safely_and_round_trip(name):
    seg = names.encode(name)
    _segment_is_safe(seg)
    assert names.decode(seg) == name


def test_slash_and_its_percent_encoding_differ():
    assert names.encode("a/b") != names.encode("a%2Fb")
    assert names.encode("a%2Fb") != names.encode("a%2fb")


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("", "empty"),
        ("x" * 256, "longer than 255"),
        (None, "string"),
        (b"alice", "string"),
        (42, "string"),
        ("a\ud800b", "surrogate"),
        ("\udfff", "surrogate"),
    ],
    ids=["empty", "too-long", "none", "bytes", "int", "surrogate", "lone-low-surrogate"],
)
def test_bad_names_raise_invalid_name_with_a_reason(bad, reason):
    with pytest.raises(InvalidName) as ei:
        names.encode(bad, "user name")
    assert reason in ei.value.reason
    assert ei.value.what == "user name"
    assert "user name" in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_255_characters_are_accepted():
    assert names.decode(names.encode("x" * 200)) == "x" * 200
    # longer segments are replaced by a digest (room is left for ".lock" and temp suffixes)
    seg = names.encode("x" * 255)
    _segment_is_safe(seg)
    assert names.is_hashed(seg)


@pytest.mark.parametrize("seg", ["", "A", "%2", "%zz", "%2f", "a/b", "%C3", "%61"])
def test_decode_refuses_what_encode_never_makes(seg):
    with pytest.raises(InvalidName):
        names.decode(seg)


def test_session_api_refuses_bad_names(store):
    for bad in ["", "x" * 256, "\ud800"]:
        with pytest.raises(InvalidName):
            store.session("app", bad, "s")
        with pytest.raises(InvalidName):
            store.session(bad, "u", "s")
        with pytest.raises(InvalidName):
            store.session("app", "u", bad)


# -- tenants stay apart through the store ----------------------------------------------------


@pytest.mark.parametrize(
    "users",
    [("Alice", "alice"), ("a/b", "a%2Fb"), ("..", "."), ("a\\b", "a/b"), ("x", "x.lock")],
    ids=["case", "slash-vs-escape", "dots", "backslash", "lock-suffix"],
)
def test_sessions_of_users_whose_names_look_alike_are_isolated(store, users):
    u1, u2 = users
    store.session("app", u1, "s").append(castore.Message(role="user", content=f"from {u1}"))
    store.session("app", u2, "s").append(castore.Message(role="user", content=f"from {u2}"))
    assert [m.content for m in store.session("app", u1, "s").messages()] == [f"from {u1}"]
    assert [m.content for m in store.session("app", u2, "s").messages()] == [f"from {u2}"]
    assert [(s.user, s.session) for s in store.sessions("app", u1)] == [(u1, "s")]
    assert [(s.user, s.session) for s in store.sessions("app", u2)] == [(u2, "s")]
    assert sorted(s.user for s in store.sessions("app")) == sorted([u1, u2])
    store.delete_session("app", u1, "s")
    assert store.sessions("app", u1) == []
    assert [m.content for m in store.session("app", u2, "s").messages()] == [f"from {u2}"]


def test_apps_whose_names_differ_by_case_are_isolated(store):
    store.session("App", "u", "s").append(castore.Message(role="user", content="upper"))
    store.session("app", "u", "s").append(castore.Message(role="user", content="lower"))
    assert [s.app for s in store.sessions("App")] == ["App"]
    assert [m.content for m in store.session("app", "u", "s").messages()] == ["lower"]
    assert sorted(store.apps()) == ["App", "app"]
