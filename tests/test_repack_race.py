"""A reader never misses an object that a rival's repack moves while the reader lists ``packs/``
(docs/FORMAT.md, 7 and 8). A listing is not a snapshot: a paginated S3 LIST, or a readdir of
a folder that changes between its getdents calls, may leave out both the new pack (written
behind the listing's cursor) and the old ones (deleted ahead of it). The test tears the
reader's listing at a page boundary with the rival's real repack between the two pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import castore
from castore.objectstore import ObjectStore
from castore.objectstore.packs import PACKS


def test_a_listing_torn_by_a_repack_is_followed_by_one_more(tmp_path: Path, monkeypatch: Any) -> None:
    url = str(tmp_path / "store")
    w = castore.open(url, format=2, auto_repack=False)
    tips = []
    for i in range(3):  # three sealed logs ("w-", listed after the repack's "r-" pack)
        s = w.session("app", "u", f"s{i}")
        tips.append(s.append(castore.Message(role="user", content=f"m{i}")))
        w.close()
        w = castore.open(url, format=2, auto_repack=False)
    assert w.objects.pack_names() and all(n.startswith("w-") for n in w.objects.pack_names())

    r = castore.open(url)
    storage = r.storage
    real_list_dir = storage.list_dir
    torn = {"n": 0}

    def list_dir(prefix: str) -> list[str]:
        if prefix != PACKS or torn["n"]:
            return real_list_dir(prefix)
        torn["n"] += 1
        first = [n for n in real_list_dir(prefix) if n < "s"]  # page 1: no "r-" pack yet
        report = w.objects.repack(all_packs=True)  # the rival's repack, between the pages
        assert report.new_pack is not None and report.new_pack.startswith("r-")
        return first + [n for n in real_list_dir(prefix) if n >= "s"]  # page 2: the logs are gone

    monkeypatch.setattr(storage, "list_dir", list_dir)
    reader = ObjectStore(storage, format=2)
    assert type(reader.get(tips[-1])).__name__ == "Commit"
    assert torn["n"] == 1
