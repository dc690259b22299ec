"""Print the format-1 golden fixtures as JSON: a few objects of each kind, their ids and bytes.

Run ``python tests/golden/make_golden.py > tests/golden/format1.json`` only when the format
changes on purpose (a new format version, written down in the README's "Format" section);
tests/test_objects.py fails when an object here no longer has its checked-in id or bytes.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from castore import objects as o


def _id(n: int) -> bytes:
    """A fixed raw id (objects inside objects keep ids as 32 raw bytes)."""
    return bytes([n]) * 32


def golden_objects() -> dict[str, o.AnyObject]:
    """The fixtures by name. Never change one: add new ones."""
    return {
        "blob-empty": o.Blob(b""),
        "blob-text": o.Blob(b"You are a helpful assistant."),
        "blob-binary": o.Blob(bytes(range(256))),
        "value-null": o.Value(None),
        "value-message": o.Value({"role": "user", "content": "Weather in Beijing?"}),
        "value-nested": o.Value(
            {"z": [1, 2.5, -3, True, None], "a": {"b": b"\x00\xff", "c": "\u00e9\u4e2d\U0001f600"},
             "big": 2**63, "neg": -(2**40)}
        ),
        "tree-empty": o.Tree(),
        "tree-state": o.Tree(values={"city": "Beijing", "count": 3}, refs={"history": _id(1)},
                             sub={"a": _id(2)}),
        "commit-root": o.Commit(kind="message"),
        "commit-full": o.Commit(
            kind="message",
            parents=(_id(3),),
            body=_id(4),
            state=_id(5),
            delta={"city": "Beijing", "n": 1},
            unset=("temp",),
            scopes={"app": _id(6)},
            author="assistant",
            time=1700000000.25,
            meta={"model": "gpt-x", "usage": {"in": 10, "out": 20}},
            depth=7,
            index=_id(7),
        ),
        "commit-merge": o.Commit(kind="event", parents=(_id(8), _id(9)), body=_id(10), depth=70),
        "segment": o.Segment(start=64, objects=(b"\x00canonical-1", b"\x00canonical-2")),
        "index-empty": o.Index(),
        "index-two": o.Index(segments=(_id(11), _id(12))),
    }


def golden() -> list[dict[str, str]]:
    """The fixtures as JSON-able records: name, kind tag, id, canonical bytes in hex."""
    out = []
    for name, obj in golden_objects().items():
        oid, canonical = o.encode(obj)
        out.append({"name": name, "type": type(obj).__name__, "id": oid, "canonical": canonical.hex()})
    return out


if __name__ == "__main__":
    print(json.dumps({"format": o.FORMAT, "objects": golden()}, indent=1))
