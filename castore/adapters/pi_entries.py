"""One Pi entry as one castore commit and back: the mapping table of :mod:`castore.adapters.pi`
(its module docstring), and inline images kept as blobs.

:func:`to_castore` maps an entry (upgraded to v3: ids, parent links) to a commit's kind,
body, author and metadata; :func:`to_pi` rebuilds the entry from them, field for field (an
entry it could not rebuild exactly keeps its fields verbatim in the metadata). Inline images
of at least :data:`IMAGE_MIN` base64 characters become blobs named ``{BLOB_KEY: id}``
(:func:`extract_images`) and are put back by :func:`inline_images`.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Any

from .. import objects as o
from ..entries import (
    BranchSummary,
    Compaction,
    Custom,
    Message,
    ModelChange,
    body_of,
)
from ..errors import InvalidEntry
from ..objects import Blob

if TYPE_CHECKING:
    from ..session import SessionHost
    from ..store import Store

#: base64 image data at least this long becomes a blob
IMAGE_MIN = 1024
#: the key of a blob reference in place of an image's base64 ``data``
BLOB_KEY = "castore:blob"

BASE = ("type", "id", "parentId", "timestamp")
#: the fields of an entry that name another entry
LINKS = ("parentId", "targetId", "firstKeptEntryId", "fromId")
MSG_PROVENANCE = ("timestamp", "usage")
CUSTOM_MESSAGE_FIELDS = ("customType", "content", "display", "details")


def to_castore(e: dict[str, Any], ids: dict[str, tuple[str, int]]) -> tuple[str, Any, str, dict[str, Any]]:
    """Map one (upgraded) Pi entry to ``(kind, body, author, meta)``; images still inline.
    ``ids``: Pi id -> (commit id, depth) of the entries before it. Raises nothing."""
    t = e.get("type")
    pi = {k: e[k] for k in BASE if k in e}
    rest = {k: v for k, v in e.items() if k not in BASE}
    meta: dict[str, Any] = {"pi": pi}
    kind, body, author = "custom", None, ""

    def cid(pid: Any) -> str | None:
        return ids[pid][0] if isinstance(pid, str) and pid in ids else None

    try:
        if t == "message" and isinstance(rest.get("message"), dict):
            m = rest.pop("message")
            prov = {k: m[k] for k in MSG_PROVENANCE if k in m}
            msg = Message.from_dict({k: v for k, v in m.items() if k not in prov})
            kind, body, author = "message", msg.to_dict(), msg.role
            if prov:
                meta["pm"] = prov
        elif t == "custom_message":
            fields = {k: rest.pop(k) for k in CUSTOM_MESSAGE_FIELDS if k in rest}
            msg = Message.from_dict({"role": "custom", **fields})
            kind, body, author = "message", msg.to_dict(), "custom"
        elif t == "compaction" and isinstance(rest.get("summary"), str):
            c = Compaction(rest.pop("summary"), cid(rest.get("firstKeptEntryId")),
                           rest.pop("tokensBefore", 0), rest.pop("details", None))
            kind, body = c.kind, body_of(c)
        elif t == "branch_summary" and isinstance(rest.get("summary"), str):
            b = BranchSummary(rest.pop("summary"), cid(rest.get("fromId")), rest.pop("details", None))
            kind, body = b.kind, body_of(b)
        elif t == "model_change":
            mc = ModelChange(model=rest.pop("modelId", None), provider=rest.pop("provider", None))
            kind, body = mc.kind, body_of(mc)
        elif t == "thinking_level_change":
            mc = ModelChange(thinking_level=rest.pop("thinkingLevel", None))
            kind, body = mc.kind, body_of(mc)
        elif t == "custom" and isinstance(rest.get("customType"), str):
            cu = Custom(rest.pop("customType"), rest.pop("data", None))
            kind, body = cu.kind, body_of(cu)
        elif t == "label":
            kind, body = "label", {}
            if cid(rest.get("targetId")):
                body["target"] = cid(rest.get("targetId"))
            if "label" in rest:
                body["label"] = rest.pop("label")
        elif t == "session_info":
            kind, body = "session_info", ({"name": rest.pop("name")} if "name" in rest else {})
        else:
            cu = Custom(f"pi.{t}", rest)
            kind, body, rest = cu.kind, body_of(cu), {}
    except InvalidEntry:  # e.g. a message without a usable role: keep it verbatim as a record
        rest = {k: v for k, v in e.items() if k not in BASE}
        cu = Custom(f"pi.{t}", rest)
        kind, body, rest = cu.kind, body_of(cu), {}
    if rest:
        meta["x"] = rest
    if to_pi(body, meta) != e:  # not exactly rebuildable: keep the fields verbatim as well
        meta.pop("x", None)
        meta.pop("pm", None)
        meta["raw"] = {k: v for k, v in e.items() if k not in BASE}
    return kind, body, author, meta


def to_pi(body: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """Rebuild a Pi entry from a commit's body and metadata (images already inlined). Raises
    nothing."""
    pi = meta["pi"]
    out: dict[str, Any] = dict(pi)
    if "raw" in meta:
        out.update(meta["raw"])
        return out
    b = body if isinstance(body, dict) else {}
    t = pi.get("type")
    if t == "message":
        out["message"] = {**b, **meta.get("pm", {})}
    elif t == "custom_message":
        out.update({k: v for k, v in b.items() if k != "role"})
    elif t == "compaction":
        out["summary"] = b.get("summary")
        out["tokensBefore"] = b.get("tokens_before", 0)
        if "details" in b:
            out["details"] = b["details"]
    elif t == "branch_summary":
        out["summary"] = b.get("summary")
        if "details" in b:
            out["details"] = b["details"]
    elif t == "model_change":
        if "provider" in b:
            out["provider"] = b["provider"]
        if "model" in b:
            out["modelId"] = b["model"]
    elif t == "thinking_level_change":
        if "thinking_level" in b:
            out["thinkingLevel"] = b["thinking_level"]
    elif t == "custom" and not str(b.get("type", "")).startswith("pi."):
        out["customType"] = b.get("type")
        if b.get("data") is not None:
            out["data"] = b["data"]
    elif t == "label":
        if "label" in b:
            out["label"] = b["label"]
    elif t == "session_info":
        out.update(b)
    else:
        out.update(b.get("data") or {})
    out.update(meta.get("x", {}))
    return out


def extract_images(value: Any, put: Any) -> Any:
    """Replace large inline base64 images by blob references; ``put(bytes) -> id``. Raises
    what ``put`` raises."""
    if isinstance(value, list):
        return [extract_images(v, put) for v in value]
    if not isinstance(value, dict):
        return value
    data = value.get("data")
    if value.get("type") == "image" and isinstance(data, str) and len(data) >= IMAGE_MIN:
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raw = None
        if raw is not None and base64.b64encode(raw).decode("ascii") == data:
            return {**value, "data": {BLOB_KEY: put(raw)}}
    return {k: extract_images(v, put) for k, v in value.items()}


def keep_id(ids: list[str], oid: str) -> str:
    """``oid``, added to ``ids`` (a ``put`` that remembers what it stored)."""
    ids.append(oid)
    return oid


def inline_blobs(value: Any, get: Any) -> Any:
    """``value`` with each blob reference replaced by its image's base64 data; ``get(id) -> bytes``.
    Raises what ``get`` raises."""
    if isinstance(value, list):
        return [inline_blobs(v, get) for v in value]
    if not isinstance(value, dict):
        return value
    data = value.get("data")
    if value.get("type") == "image" and isinstance(data, dict) and list(data) == [BLOB_KEY]:
        return {**value, "data": base64.b64encode(get(data[BLOB_KEY])).decode("ascii")}
    return {k: inline_blobs(v, get) for k, v in value.items()}


def inline_images(store: Store, value: Any) -> Any:
    """Put the image data back into a value (a message dict, a list of them) from its blobs.

    Imported images are blob references (``{"castore:blob": id}`` in place of the base64
    ``data``), also in :meth:`castore.Session.context`; call this before sending to a model.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    if isinstance(value, Message):
        return Message.from_dict(inline_images(store, value.to_dict()))
    if isinstance(value, list) and value and isinstance(value[0], Message):
        return [inline_images(store, m) for m in value]
    return inline_blobs(value, lambda oid: read_blob(store, oid))


def read_blob(store: Store | SessionHost, oid: str) -> bytes:
    """The bytes of blob ``oid``.

    Raises:
        InvalidEntry: ``oid`` is not a blob. ObjectNotFound, IntegrityError, StorageError.
    """
    # Not through ObjectStore.get: its cache is bounded by count, and images are large.
    b = o.decode(oid, store.objects.get_canonical_many([oid])[oid])
    if not isinstance(b, Blob):
        raise InvalidEntry(f"object {oid} is not a blob")
    return b.data


__all__ = ["IMAGE_MIN", "BLOB_KEY", "LINKS", "to_castore", "to_pi", "extract_images", "keep_id", "inline_blobs",
           "inline_images", "read_blob"]
