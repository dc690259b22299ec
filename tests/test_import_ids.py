"""The same session files give the same commits: importing the real files under tests/data
(every vendor, a live file in steps, Claude Code's old layout) and a few library appends give
the HEADs, branches, labels, infos and exported bytes checked in by
tests/golden/make_import_ids.py (taken before the import's per-line work was cut down)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from make_import_ids import scenarios  # noqa: E402


@pytest.fixture(scope="module")
def got(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("import-ids")
    return json.loads(json.dumps(scenarios(work), sort_keys=True).replace(str(work), "WORK"))


WANT = json.loads((GOLDEN / "import-ids.json").read_text())


@pytest.mark.parametrize("scenario", sorted(WANT))
def test_import_gives_the_checked_in_commits(got: dict, scenario: str) -> None:
    assert got[scenario]["files"] == WANT[scenario]["files"]
    assert sorted(got[scenario]["sessions"]) == sorted(WANT[scenario]["sessions"])
    for key, want in WANT[scenario]["sessions"].items():
        assert got[scenario]["sessions"][key] == want, key
