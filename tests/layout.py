"""Tests that damage or inspect a store object by object, whatever its format (docs/FORMAT.md).

Format 1 keeps every object in its own file (``objects/xx/...``); format 2 keeps the small
ones in packs. These helpers find an object wherever it is and change it there, so a test
of fsck, gc or the read path checks the same behaviour on both layouts:

* :func:`stored_ids`: every stored id, loose or packed (from a fresh handle: no cache);
* :func:`stored` / :func:`replace`: an object's stored frame, and storing other bytes under
  its id (as a loose file: damage that only re-hashing catches);
* :func:`corrupt`: flip the last byte of an object's frame;
* :func:`delete`: remove one object (a pack is rewritten without it, as a repack that
  dropped it would leave it);
* :func:`backdate`: make objects look old to gc (local disk: the file, or the whole pack).

A pack is rewritten under a new name and the old one deleted, through the object store's
own pack calls, so a handle that had the old pack mapped finds it gone and looks again
(docs/FORMAT.md, 7) instead of reading stale offsets. The handle's own log is released
first (its next write opens a new log).
"""

from __future__ import annotations

import json
import os

import castore
from castore.objectstore import PACKS, ObjectStore, object_key, pack_key


def stored_ids(store: castore.Store) -> set[str]:
    """Every object id stored, loose or packed, listed by a fresh handle."""
    return set(ObjectStore(store.storage).iter_ids())


def _packs_holding(objs: ObjectStore, oid: str) -> list[str]:
    return [name for name in objs.pack_names() if oid in objs.pack_contents(name)]


def where(store: castore.Store, oid: str) -> list[str]:
    """Where ``oid`` is stored: ``"loose"`` and/or the names of the packs holding it."""
    objs = store.objects
    objs.close()
    out = ["loose"] if store.storage.exists(object_key(oid)) else []
    return out + _packs_holding(objs, oid)


def stored(store: castore.Store, oid: str) -> bytes | None:
    """The stored frame of ``oid`` (not verified), or None if it is stored nowhere."""
    if store.storage.exists(object_key(oid)):
        return store.storage.read(object_key(oid))
    objs = store.objects
    objs.close()
    for name in _packs_holding(objs, oid):
        return objs.read_frame(name, objs.pack_contents(name)[oid])
    return None


def _rewrite_packs(store: castore.Store, oid: str) -> bool:
    """Rewrite every pack holding ``oid`` without it; True if some pack held it."""
    objs = store.objects
    objs.close()  # never rewrite a log this handle still appends to
    names = _packs_holding(objs, oid)
    for name in names:
        frames = [(x, objs.read_frame(name, loc)) for x, loc in objs.pack_contents(name).items() if x != oid]
        if frames:
            objs.write_pack(sorted(frames))
        objs.delete_pack(name)
    return bool(names)


def replace(store: castore.Store, oid: str, data: bytes) -> None:
    """Make ``data`` the stored bytes of ``oid``: a packed object leaves its packs and
    ``data`` becomes its loose file (a version-2 pack computes ids from the bytes it holds,
    so damaged bytes cannot sit in a pack under the id they no longer hash to; a loose file
    can, and every read re-hashes it)."""
    _rewrite_packs(store, oid)
    store.storage.write(object_key(oid), data)


def corrupt(store: castore.Store, oid: str) -> None:
    """Flip the last byte of the stored frame of ``oid``."""
    data = stored(store, oid)
    assert data is not None, f"{oid} is not stored"
    replace(store, oid, data[:-1] + bytes([data[-1] ^ 0x01]))


def delete(store: castore.Store, oid: str) -> None:
    """Remove ``oid`` from the store, loose or packed (other objects stay)."""
    if store.storage.exists(object_key(oid)):
        store.storage.delete(object_key(oid))
    _rewrite_packs(store, oid)


def backdate(store: castore.Store, oids: list[str], when: float) -> None:
    """Set the age gc sees of ``oids`` to ``when`` (local disk): a loose object's file, or
    the whole pack holding a packed one (its file, and every time in its ages file, as if
    all its objects were written then)."""
    root = store.storage.root  # type: ignore[attr-defined]
    objs = store.objects
    for oid in oids:
        keys = [object_key(oid)] if store.storage.exists(object_key(oid)) else []
        objs.close()  # a held log is never collected: let this one go like a closed writer's
        keys += [pack_key(name) for name in _packs_holding(objs, oid)]
        assert keys, f"{oid} is not stored"
        for key in keys:
            path = os.path.join(root, *key.split("/"))
            ages = path[:-len(".pack")] + ".age"
            if key.endswith(".pack") and os.path.exists(ages):
                with open(ages) as f:
                    offsets = [off for off, _ in json.load(f)["born"]]
                with open(ages, "w") as f:
                    json.dump({"born": [[off, when] for off in offsets]}, f)
            os.utime(path, (when, when))


def stored_bytes(store: castore.Store) -> int:
    """The bytes the store's objects take: loose files and packs with their indexes."""
    keys = store.storage.list("objects") + store.storage.list(PACKS)
    return sum(len(v or b"") for v in store.storage.read_many(keys).values())
