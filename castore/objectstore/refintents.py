"""Ref intents in a writer's log (format 3, docs/FORMAT.md 12): the record a compare-and-swap
of a ref leaves in the same log as the objects it names, so that one sync makes both durable
and the swap can be replayed after a power loss. No I/O.

An intent is a record of a version-2 log whose payload starts with the byte
:data:`~castore.objectstore.packs.INTENT_FRAME` (0x10) instead of an object frame's header,
followed by a JSON object ``{"k": key, "o": old token, "n": new token, "d": new bytes
(latin-1), "b": boot id, "t": CLOCK_MONOTONIC ns}``, or ``{"o", "n", "z", "t"}``: ``"z"``
the new bytes as a delta (base64, :func:`ref_delta`) of the value the same log's previous
intent for that key wrote (whose ``"n"`` is this one's ``"o"``), whose key and boot it
has. The first intent of a key in a log always carries the whole value, so a log's intents
rebuild every value from that log alone. They hold no object: every reader of objects
skips them (:mod:`castore.objectstore.packs`, whose records they are); only the recovery
of refs after a power loss reads them (:func:`intents`).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib

from ..errors import IntegrityError
from ..storage import RefIntent
from .packs import INTENT_FRAME, RECORD_MAX, framed, intent_payloads


def ref_delta(base: bytes, new: bytes) -> bytes | None:
    """``new`` as a delta of ``base``, or None when that would not be smaller than ``new``.

    The delta is ``new`` compressed by zlib (raw deflate, level 1) with ``base`` as its
    preset dictionary: what an append leaves unchanged in a ref value (most of it) costs a
    few bytes of back references, what it changes (the tip, the time, the write id, one id
    added to the tail) costs its entropy. :func:`apply_ref_delta` undoes it.
    """
    c = zlib.compressobj(1, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, zdict=base)
    out = c.compress(new) + c.flush()
    return out if (len(out) + 2) // 3 * 4 < len(new) else None  # stored as base64


def apply_ref_delta(base: bytes, delta: bytes) -> bytes:
    """The bytes :func:`ref_delta` made ``delta`` of, from ``base``.

    Raises:
        ValueError: ``delta`` is not a whole delta of ``base``.
    """
    d = zlib.decompressobj(-15, zdict=base)
    try:
        out = d.decompress(delta) + d.flush()
    except zlib.error as e:
        raise ValueError(f"not a ref delta: {e}") from None
    if not d.eof or d.unused_data:
        raise ValueError("not a whole ref delta")
    return out


class DeltaBases:
    """What a delta intent of a log may be based on: the latest intent of each key so far in
    the log, found by its new token. A token that is the latest of two keys at once (two refs
    holding the same bytes) is no base for anything until the log ends. The writer (which
    decides to write a delta) and :func:`intents` (which rebuilds it) keep one each, fed the
    log's intents in the same order, so they always agree on a delta's base."""

    def __init__(self) -> None:
        """No intent yet (a new log)."""
        self._latest: dict[str, RefIntent] = {}
        self._by_token: dict[str, RefIntent | None] = {}  # None: ambiguous

    def base(self, old: object) -> RefIntent | None:
        """The intent whose new token is ``old`` and which is still its key's latest, or None."""
        return self._by_token.get(old) if isinstance(old, str) else None

    def add(self, intent: RefIntent) -> None:
        """``intent`` is the latest of its key from now on."""
        was = self._latest.get(intent.key)
        if was is not None and was.new is not None and self._by_token.get(was.new) is was:
            del self._by_token[was.new]
        self._latest[intent.key] = intent
        if intent.new is not None:
            self._by_token[intent.new] = None if intent.new in self._by_token else intent

    def keys(self) -> list[str]:
        """The keys of the intents added so far, sorted."""
        return sorted(self._latest)

    def __len__(self) -> int:
        return len(self._latest)


def _plain(token: str | None) -> bool:
    """Whether ``token`` is ASCII letters and digits (json.dumps leaves it as it is)."""
    return token is not None and token.isascii() and token.isalnum()


def encode_intent(intent: RefIntent, base: RefIntent | None = None) -> bytes:
    """One record of a version-2 log holding a ref intent (see the module docstring).

    ``base``: the same log's previous intent of ``intent.key`` (same boot), given only when
    it wrote ``intent.old`` and the log's :class:`DeltaBases` gives it for that token; the
    value is then stored as a delta of its bytes where that is smaller, and the key and boot
    are taken from it when read. Without it the whole value is stored.

    Raises:
        IntegrityError: the intent would exceed :data:`RECORD_MAX`; ``base`` is not such an
            intent.
    """
    delta = None
    if base is not None and intent.data is not None and intent.old is not None:
        if (base.key, base.new, base.boot) != (intent.key, intent.old, intent.boot) or base.data is None:
            raise IntegrityError("ref intent", f"{intent.key}: a delta's base must be the intent "
                                               "that wrote its old value")
        delta = ref_delta(base.data, intent.data)
    fields: dict[str, object]
    if delta is not None and type(intent.stamp) is int and _plain(intent.old) and _plain(intent.new):
        # the bytes json.dumps makes of these fields (nothing in them to escape), without its
        # encoder: an append writes one of these
        text = f'{{"o":"{intent.old}","n":"{intent.new}","z":"{base64.b64encode(delta).decode("ascii")}",' \
               f'"t":{intent.stamp}}}'
    elif delta is not None:
        fields = {"o": intent.old, "n": intent.new, "z": base64.b64encode(delta).decode("ascii"), "t": intent.stamp}
        text = json.dumps(fields, separators=(",", ":"))
    else:
        fields = {"k": intent.key, "o": intent.old, "n": intent.new,
                  "d": None if intent.data is None else intent.data.decode("latin-1"),
                  "b": intent.boot, "t": intent.stamp}
        text = json.dumps(fields, separators=(",", ":"))
    payload = INTENT_FRAME + text.encode()
    if len(payload) >= RECORD_MAX:
        raise IntegrityError("pack record", f"a ref intent of {len(payload)} bytes is more than a record holds")
    return framed(payload)


def intents(data: bytes | memoryview) -> list[RefIntent]:
    """The ref intents of a log's bytes, in the order written, each with its whole new value
    (none in a version-1 pack or in bytes that are not a pack). A delta is applied to the
    value of the intent its ``"o"`` names in the log's :class:`DeltaBases` (which gives the
    key and boot too). An intent record that passed its
    check yet does not parse is skipped (damage later than its writing), and so is a delta
    whose base is not there (that record was damaged), and with it the rest of its chain."""
    out: list[RefIntent] = []
    bases = DeltaBases()
    for payload in intent_payloads(data):
        try:
            r = json.loads(bytes(payload[1:]))
            if "z" in r:
                base = bases.base(r["o"])
                if base is None or base.data is None:
                    continue  # its base was damaged: so is every later delta of that ref
                value = apply_ref_delta(base.data, base64.b64decode(r["z"], validate=True))
                intent = RefIntent(base.key, r["o"], r["n"], value, base.boot, int(r["t"]))
            else:
                raw = r["d"]
                intent = RefIntent(str(r["k"]), r["o"], r["n"], None if raw is None else raw.encode("latin-1"),
                                   str(r["b"]), int(r["t"]))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeEncodeError, binascii.Error):
            continue
        bases.add(intent)
        out.append(intent)
    return out


__all__ = ["DeltaBases", "apply_ref_delta", "encode_intent", "intents", "ref_delta"]
