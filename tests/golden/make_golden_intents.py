"""Print a golden fixture of the ref intent records (format 3, docs/FORMAT.md 12) as JSON.

Run ``python tests/golden/make_golden_intents.py > tests/golden/format3-intent.json`` (whole
values) or ``python tests/golden/make_golden_intents.py --delta >
tests/golden/format3-delta-intent.json`` (a whole value, then a delta of it) only when the
intent record's encoding changes on purpose; tests/test_ref_journal.py fails when these
bytes no longer come out the same.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from test_ref_journal import _golden_delta_intents, _golden_intents

from castore.objectstore import packs, refintents


def golden(delta: bool = False) -> dict[str, object]:
    """Two intent records, alone and as a log (a version-2 header, then both); with
    ``delta``, the second stores its value as a delta of the first's."""
    if delta:
        first, second = _golden_delta_intents()
        records = [refintents.encode_intent(first), refintents.encode_intent(second, first)]
    else:
        records = [refintents.encode_intent(i) for i in _golden_intents()]
    return {"format": 3, "records": [r.hex() for r in records], "log": (packs.PACK_MAGIC_V2 + b"".join(records)).hex()}


if __name__ == "__main__":
    print(json.dumps(golden("--delta" in sys.argv[1:]), indent=1))
