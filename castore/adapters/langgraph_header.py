"""Thin encodings of LangGraph checkpoint headers and metadata, for commit metadata.

A checkpoint header (``v``, ``id``, ``ts``, ``channel_versions``, ``versions_seen``,
``updated_channels``) is mostly what its parent's header was: a step bumps the versions of
the channels it wrote and of the nodes that ran. So a checkpoint commit stores its header
as a difference from its parent checkpoint's header, and a full header every ``K``
commits and at every root, which bounds the chain a reader walks.

Everything here is plain data (str, int, float, bool, None, lists, str-keyed dicts) so
it is stored as msgpack inside the commit; a header or metadata holding anything else is
stored whole through LangGraph's serializer instead (see :mod:`castore.adapters.langgraph`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
#: header keys whose values are dicts stored as per-key differences
_DICTS = {"channel_versions": "cv", "versions_seen": "vs"}
_SHORT = {"v": "v", "updated_channels": "uc"}


def is_plain(x: Any) -> bool:
    """Whether ``x`` survives a msgpack round trip unchanged (no tuples, no odd keys)."""
    if x is None or isinstance(x, (bool, str, float)):
        return True
    if isinstance(x, int):
        return -(1 << 63) <= x < (1 << 64)
    if type(x) is list:
        return all(is_plain(v) for v in x)
    if type(x) is dict:
        return all(type(k) is str and is_plain(v) for k, v in x.items())
    return False


class NotPlain(ValueError):
    """A value that is not plain data (see :func:`is_plain`)."""


_INT_MIN, _INT_END = -(1 << 63), 1 << 64


def plain_copy(x: Any) -> Any:
    """A copy of ``x`` whose dicts and lists are new objects, when :func:`is_plain` holds
    for it (one walk for both).

    Raises:
        NotPlain: ``x`` is not plain data.
    """
    t = type(x)
    if t is dict:
        out = {}
        for k, v in x.items():
            if type(k) is not str:
                raise NotPlain(k)
            tv = type(v)
            out[k] = v if tv is str or tv is float or tv is bool or v is None \
                or (tv is int and _INT_MIN <= v < _INT_END) else plain_copy(v)
        return out
    if t is list:
        return [v if type(v) is str or v is None else plain_copy(v) for v in x]
    if is_plain(x):  # a scalar (or a subclass of one)
        return x
    raise NotPlain(x)


def _ts_encode(ts: Any) -> tuple[str, Any]:
    """``("tsu", microseconds)`` when the ISO timestamp rebuilds exactly from them."""
    if isinstance(ts, str):
        try:
            dt = datetime.fromisoformat(ts)
        except ValueError:
            return "ts", ts
        if dt.utcoffset() == timedelta(0) and dt.tzinfo is not None:
            us = (dt - _EPOCH) // _US
            if _ts_decode(us) == ts:
                return "tsu", us
    return "ts", ts


def _ts_decode(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat()


def encode_header(header: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """The stored form of ``header`` (without its ``id``): a difference from ``base``, the
    parent checkpoint's header, or the whole header when ``base`` is None.

    The caller checks :func:`is_plain` first.
    """
    base = base or {}
    out: dict[str, Any] = {}
    for key, value in header.items():
        if key == "id":
            continue
        if key == "ts":
            k, v = _ts_encode(value)
            out[k] = v
        elif key in _DICTS and type(value) is dict and type(base.get(key)) is dict:
            old = base[key]
            changed = {k: v for k, v in value.items() if k not in old or old[k] != v}
            if changed:
                out[_DICTS[key]] = changed
            gone = [k for k in old if k not in value]
            if gone:
                out[_DICTS[key] + "-"] = gone
        elif key in _DICTS:
            out[_DICTS[key] + "="] = value
        elif key in _SHORT:
            if key not in base or base[key] != value or key == "updated_channels":
                out[_SHORT[key]] = value
        elif key not in base or base[key] != value:
            out.setdefault("x", {})[key] = value
    gone = [k for k in base if k not in header and k != "id"]
    if gone:
        out["-"] = gone
    return out


def decode_header(stored: dict[str, Any], base: dict[str, Any] | None, checkpoint_id: str) -> dict[str, Any]:
    """Rebuild a header from its stored form and ``base`` (the parent's header, or None
    for a whole header). Raises KeyError or TypeError on a malformed form."""
    out = copy_header(base or {})
    out["id"] = checkpoint_id
    out.pop("updated_channels", None)
    for key, value in stored.items():
        if key == "tsu":
            out["ts"] = _ts_decode(value)
        elif key == "ts":
            out["ts"] = value
        elif key == "v":
            out["v"] = value
        elif key == "uc":
            out["updated_channels"] = value
        elif key == "x":
            out.update(value)
    for name, short in _DICTS.items():
        if short + "=" in stored:
            out[name] = stored[short + "="]
            continue
        if name not in out and short not in stored:
            continue
        d = out.setdefault(name, {})
        d.update(stored.get(short, {}))
        for k in stored.get(short + "-", ()):
            d.pop(k, None)
    for k in stored.get("-", ()):
        out.pop(k, None)
    return out


def copy_header(header: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``header`` whose dicts (two levels deep) and lists are new objects."""
    out: dict[str, Any] = {}
    for key, value in header.items():
        if type(value) is dict:
            value = {k: dict(v) if type(v) is dict else v for k, v in value.items()}
        elif type(value) is list:
            value = list(value)
        out[key] = value
    return out
