"""Print the format-2 golden fixtures as JSON: a pack, its records and its index, byte for byte.

Run ``python tests/golden/make_golden_packs.py > tests/golden/format2.json`` only when the
pack format changes on purpose (a new format version, written down in docs/FORMAT.md);
tests/test_packs.py fails when these bytes no longer come out the same. The frames are the
raw (``0x00``) frames of the format-1 golden objects, so no zstd version is involved.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from make_golden import golden_objects

from castore import objects as o
from castore.objectstore import packindex, packs


def golden() -> dict[str, object]:
    """A pack of two records (the golden objects split in two), its index, and a batch pack."""
    frames = []
    for obj in golden_objects().values():
        oid, canonical = o.encode(obj)
        frames.append((oid, o.to_stored(canonical, compress=False)))
    half = len(frames) // 2
    rec1, where1 = packs.encode_record(frames[:half], packs.HEADER_SIZE)
    rec2, where2 = packs.encode_record(frames[half:], packs.HEADER_SIZE + len(rec1))
    log = packs.PACK_MAGIC + rec1 + rec2
    batch, _ = packs.encode_pack(frames[:3])
    return {
        "format": 2,
        "log": log.hex(),
        "log_index": packindex.encode_index(len(log), {**where1, **where2}).hex(),
        "batch_pack": batch.hex(),
        "batch_pack_name": packs.content_name("b", batch),
        "locations": {oid: list(loc) for oid, loc in sorted({**where1, **where2}.items())},
    }


if __name__ == "__main__":
    print(json.dumps(golden(), indent=1))
