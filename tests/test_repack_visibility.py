"""A reader never misses an object that a rival's repack moves while the reader looks for it
(docs/FORMAT.md, 7 and 8): found on SeaweedFS by 8 writers appending to one session, where a
writer's background repack merged and deleted the batch pack holding a rival's new tip
between the rival's listing of ``packs/`` and its read of that pack."""

from __future__ import annotations

import uuid
from typing import Any

import castore
from castore.objectstore import ObjectStore


def test_a_pack_repacked_between_the_listing_and_the_read_is_found_in_its_new_pack(monkeypatch: Any) -> None:
    url = f"memory://repack-vis-{uuid.uuid4().hex}"
    w = castore.open(url, format=2, auto_repack=False)  # memory: no appends, one batch pack per append
    s = w.session("app", "u", "s")
    tips = [s.append(castore.Message(role="user", content=f"m{i}")) for i in range(3)]
    assert all(n.startswith("b-") for n in w.objects.pack_names())

    r = castore.open(url)
    storage = r.storage
    listed = {"n": 0}
    real_list_dir, real_read_many = storage.list_dir, storage.read_many

    def list_dir(prefix: str) -> list[str]:
        listed["n"] += 1
        return real_list_dir(prefix)

    def read_many(keys: Any) -> dict[str, bytes | None]:
        keys = list(keys)
        if listed["n"] == 1 and any(k.startswith("packs/b-") for k in keys):
            listed["n"] += 1
            merged = w.objects.merge_packs(w.objects.pack_names())  # the rival's repack, right now
            assert merged is not None and merged.startswith("r-")
        return real_read_many(keys)

    monkeypatch.setattr(storage, "list_dir", list_dir)
    monkeypatch.setattr(storage, "read_many", read_many)
    reader = ObjectStore(storage, format=2)
    assert reader.get(tips[-1]).__class__.__name__ == "Commit"
    assert listed["n"] >= 3  # it listed again after the listed packs vanished
