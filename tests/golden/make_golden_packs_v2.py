"""Print the golden fixtures of pack and index version 2 as JSON, byte for byte.

Run ``python tests/golden/make_golden_packs_v2.py > tests/golden/format2-v2.json`` only when
the version-2 encoding changes on purpose (a new pack version, written down in
docs/FORMAT.md, sections 4 and 5); tests/test_packs_v2.py fails when these bytes no longer
come out the same. Record payloads are raw (header ``0x00``: readers take raw and compressed
payloads alike), so no zstd version is involved; the compressed payloads are checked by
round trips instead. The version-1 fixtures (format2.json) stay as they are.
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
    """A log of two version-2 records (the golden objects split in two), its index, a batch
    pack of one record, a repacked pack of two blocks in write order (what repack wrote
    before blocks were laid out by kind) and one block of every golden object laid out by
    kind (what repack writes: commits and trees, then the rest, then segments and indexes)."""
    objs = [o.encode(obj) for obj in golden_objects().values()]
    half = len(objs) // 2
    rec1, where1 = packs.encode_record_v2(objs[:half], packs.HEADER_SIZE, compress=False)
    rec2, where2 = packs.encode_record_v2(objs[half:], packs.HEADER_SIZE + len(rec1), compress=False)
    log = packs.PACK_MAGIC_V2 + rec1 + rec2
    batch, _ = packs.encode_pack_v2([objs[:3]], compress=False)
    blocks, bwhere = packs.encode_pack_v2([[x] for x in objs], block_bytes=200, compress=False)
    kinds, kwhere = packs.encode_pack_v2([objs], block_bytes=1 << 20, compress=False, by_kind=True)
    where = {**where1, **where2}
    return {
        "format": 2,
        "pack_version": 2,
        "log": log.hex(),
        "log_index": packindex.encode_index(len(log), where).hex(),
        "batch_pack": batch.hex(),
        "batch_pack_name": packs.content_name("b", batch),
        "blocks_pack": blocks.hex(),
        "blocks_index": packindex.encode_index(len(blocks), bwhere).hex(),
        "kind_block_pack": kinds.hex(),
        "kind_block_index": packindex.encode_index(len(kinds), kwhere).hex(),
        "slots": {oid: list(slot) for oid, slot in sorted(where.items())},
    }


if __name__ == "__main__":
    print(json.dumps(golden(), indent=1))
