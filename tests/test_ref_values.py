""":class:`castore.refs.RefValue` and :class:`castore.refs.Staged` are plain classes (a search
loads no dataclass machinery): each behaves as the dataclass it was, compared here with one
that the decorator makes."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest

from castore.refs import RefValue, Staged, parse


@dataclasses.dataclass(frozen=True)
class _RefValue:
    name: str
    target: str
    meta: Any = dataclasses.field(default_factory=dict)
    token: str | None = None


@dataclasses.dataclass
class _Staged:
    name: str
    base: Any
    value: Any


def _outcome(f: Any) -> object:
    try:
        return f()
    except TypeError as e:
        return type(e)


@pytest.mark.parametrize("args", [("heads/main", "ab" * 32), ("HEAD", "ref: heads/main", {"w": "w-1"}, "t1"),
                                  ("x", "cd" * 32, {}, None)])
def test_a_ref_value_behaves_as_the_frozen_dataclass_it_was(args: tuple[Any, ...]) -> None:
    v, twin = RefValue(*args), _RefValue(*args)
    assert repr(v) == repr(twin).replace("_RefValue", "RefValue")
    assert (v.name, v.target, v.meta, v.token) == (twin.name, twin.target, twin.meta, twin.token)
    assert v == RefValue(*args) and not (v != RefValue(*args)) and v != twin and v != args
    assert v != RefValue(args[0], args[1] + "x", *args[2:])
    assert _outcome(lambda: hash(v)) == _outcome(lambda: hash(twin))  # a dict meta: unhashable, as before
    assert RefValue.__match_args__ == _RefValue.__match_args__
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'target'"):
        v.target = "y"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del v.name  # type: ignore[misc]
    for other in (pickle.loads(pickle.dumps(v)), copy.copy(v), copy.deepcopy(v)):
        assert other == v and other is not v
    assert RefValue("a", "b").meta == {} and RefValue("a", "b").meta is not RefValue("a", "b").meta


def test_a_parsed_ref_and_its_properties() -> None:
    v = parse("HEAD", b"ref: heads/main\n{\"w\":\"w-7\"}\n", "tok")
    assert v == RefValue("HEAD", "ref: heads/main", {"w": "w-7"}, "tok")
    assert v.symbolic == "heads/main" and v.write_id == "w-7"
    match v:
        case RefValue(name, target, meta, token):
            assert (name, target, meta, token) == ("HEAD", "ref: heads/main", {"w": "w-7"}, "tok")


def test_a_staged_change_behaves_as_the_dataclass_it_was() -> None:
    base = RefValue("heads/main", "ab" * 32, {}, "t1")
    s, twin = Staged("heads/main", base, None), _Staged("heads/main", base, None)
    assert repr(s) == repr(twin).replace("_Staged", "Staged")
    assert s == Staged("heads/main", base, None) and s != Staged("heads/main", None, base) and s != twin
    assert _outcome(lambda: hash(s)) is TypeError and _outcome(lambda: hash(twin)) is TypeError
    s.value = base  # changed in place, as the stage does
    assert s.value is base and Staged.__match_args__ == _Staged.__match_args__
