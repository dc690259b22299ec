"""The object store: write-once, content-addressed objects on a :class:`~castore.storage.Storage`.

Objects live at ``objects/<first two hex>/<other 62 hex>``. Writing an object that exists
is a no-op that counts as success. Every read re-hashes the stored bytes. Decoded objects
are immutable, so they are cached per process (bounded) and shared between readers.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from . import objects as o
from .errors import AmbiguousRevision, IntegrityError, ObjectNotFound, RevisionNotFound
from .objects import AnyObject, ObjectId
from .storage import Storage

PREFIX = "objects"
#: an object this process wrote less than this many seconds ago is not written again
FRESH_FOR = 3600.0
WRITTEN_MAX = 1_000_000
CACHE_SIZE = 200_000
#: decoded objects larger than this (canonical bytes) are not cached: memory stays bounded
CACHE_MAX_OBJECT = 1 << 20
#: the canonical bytes kept for recent writes (segments are built from them), at most
RECENT_BYTES = 32 << 20


def object_key(oid: str) -> str:
    """The storage key of an object id."""
    return f"{PREFIX}/{oid[:2]}/{oid[2:]}"


class ObjectStore:
    """Content-addressed objects over a storage backend."""

    def __init__(self, storage: Storage, compress: bool = True) -> None:
        self.storage = storage
        self.compress = compress
        self._cache: OrderedDict[str, AnyObject] = OrderedDict()
        self._canonical: dict[str, bytes] = {}  # bytes known from segments, not yet decoded
        self._known: set[str] = set()  # ids known to be stored (written or read here)
        # ids this process wrote, and when: a rewrite within FRESH_FOR is skipped. Older ones
        # are written again, which refreshes their age so that gc's grace period protects an
        # object a writer is about to make reachable (git "freshens" objects the same way).
        self._written: OrderedDict[str, float] = OrderedDict()
        self._recent: OrderedDict[str, bytes] = OrderedDict()  # canonical bytes of recent writes
        self._recent_bytes = 0

    # -- writing ---------------------------------------------------------------------
    def prepare(self, obj: AnyObject) -> tuple[ObjectId, bytes]:
        """Encode ``obj``; return its id and canonical bytes without writing.

        Raises:
            InvalidEntry: the object cannot be encoded.
        """
        return o.encode(obj)

    def put(self, obj: AnyObject) -> ObjectId:
        """Store one object and return its id.

        Raises:
            InvalidEntry: the object cannot be encoded.
            StorageError: the backend failed.
        """
        return self.put_many([obj])[0]

    def cache(self, oid: str, obj: AnyObject) -> None:
        """Cache a decoded object about to be written (not yet known to be stored)."""
        self._remember(oid, obj, stored=False)

    def put_many(self, objs: Sequence[AnyObject]) -> list[ObjectId]:
        """Store several objects in one batch; return their ids in order.

        Raises:
            InvalidEntry: an object cannot be encoded (nothing is written).
            StorageError: the backend failed.
        """
        encoded = [o.encode(obj) for obj in objs]
        self.put_encoded(encoded)
        for (oid, _), obj in zip(encoded, objs, strict=True):
            self._remember(oid, obj)
        return [oid for oid, _ in encoded]

    def put_encoded(self, encoded: Iterable[tuple[str, bytes]]) -> int:
        """Store already-encoded ``(id, canonical bytes)`` pairs; return the bytes written.

        Raises:
            StorageError: the backend failed.
        """
        items: dict[str, bytes] = {}
        ids: list[str] = []
        now = time.monotonic()
        for oid, canonical in encoded:
            self._keep_recent(oid, canonical)
            when = self._written.get(oid)
            if when is not None and now - when < FRESH_FOR:
                continue
            items[object_key(oid)] = o.to_stored(canonical, self.compress)
            ids.append(oid)
        if items:
            self.storage.write_many(items)
            self._known.update(ids)
            for oid in ids:
                self._written[oid] = now
                self._written.move_to_end(oid)
            while len(self._written) > WRITTEN_MAX:
                self._written.popitem(last=False)
        return sum(len(v) for v in items.values())

    def put_stored(self, items: dict[str, bytes]) -> None:
        """Store raw stored bytes by id, as read from another store (sync). Verifies each.

        Raises:
            IntegrityError: some bytes do not hash to their id.
            StorageError: the backend failed.
        """
        for oid, stored in items.items():
            o.from_stored(oid, stored)
        self.storage.write_many({object_key(k): v for k, v in items.items()})
        self._known.update(items)

    # -- reading ---------------------------------------------------------------------
    def _remember(self, oid: str, obj: AnyObject, stored: bool = True, size: int = 0) -> None:
        if stored:
            self._known.add(oid)
        if size > CACHE_MAX_OBJECT:
            return  # a huge tool output or image is read again when needed, not kept
        cache = self._cache
        cache[oid] = obj
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)

    def get(self, oid: str) -> AnyObject:
        """Read, verify and decode one object.

        Raises:
            ObjectNotFound: no object has this id.
            IntegrityError: the stored bytes are corrupt.
            StorageError: the backend failed.
        """
        obj = self._cache.get(oid)
        if obj is not None:
            return obj
        canonical = self._canonical.pop(oid, None)
        if canonical is None:
            try:
                stored = self.storage.read(object_key(oid))
            except FileNotFoundError:
                raise ObjectNotFound(oid) from None
            canonical = o.from_stored(oid, stored)
        obj = o.decode(oid, canonical)
        self._remember(oid, obj, size=len(canonical))
        return obj

    def get_many(self, oids: Iterable[str], missing_ok: bool = False) -> dict[str, AnyObject]:
        """Read several objects in one concurrent batch.

        Raises:
            ObjectNotFound: one is missing (unless ``missing_ok``: then it is left out).
            IntegrityError: one is corrupt.
            StorageError: the backend failed.
        """
        out: dict[str, AnyObject] = {}
        todo: list[str] = []
        for oid in oids:
            obj = self._cache.get(oid)
            if obj is not None:
                out[oid] = obj
            elif oid in self._canonical:
                out[oid] = self.get(oid)
            else:
                todo.append(oid)
        if todo:
            got = self.storage.read_many([object_key(x) for x in todo])
            for oid in todo:
                stored = got.get(object_key(oid))
                if stored is None:
                    if missing_ok:
                        continue
                    raise ObjectNotFound(oid)
                canonical = o.from_stored(oid, stored)
                obj = o.decode(oid, canonical)
                self._remember(oid, obj, size=len(canonical))
                out[oid] = obj
        return out

    def _keep_recent(self, oid: str, canonical: bytes) -> None:
        if len(canonical) > 65536 or oid in self._recent:
            return
        self._recent[oid] = canonical
        self._recent_bytes += len(canonical)
        while len(self._recent) > 8192 or self._recent_bytes > RECENT_BYTES:
            self._recent_bytes -= len(self._recent.popitem(last=False)[1])

    def get_canonical_many(self, oids: Sequence[str]) -> dict[str, bytes]:
        """Verified canonical bytes of several objects (recent writes come from memory).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        out: dict[str, bytes] = {}
        todo = []
        for oid in oids:
            c = self._recent.get(oid) or self._canonical.get(oid)
            if c is not None:
                out[oid] = c
            else:
                todo.append(oid)
        if todo:
            for oid, stored in self.get_stored_many(todo).items():
                out[oid] = o.from_stored(oid, stored)
        return out

    def add_known_canonical(self, canonical: bytes) -> ObjectId:
        """Register verified canonical bytes found inside a segment; return their id."""
        oid = o.digest(canonical)
        if oid not in self._cache:
            self._canonical[oid] = canonical
        return oid

    def get_stored(self, oid: str) -> bytes:
        """The stored (framed) bytes of an object, verified (for sync).

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        try:
            stored = self.storage.read(object_key(oid))
        except FileNotFoundError:
            raise ObjectNotFound(oid) from None
        o.from_stored(oid, stored)
        return stored

    def get_stored_many(self, oids: Sequence[str]) -> dict[str, bytes]:
        """Stored bytes of several objects in one batch, each verified.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        got = self.storage.read_many([object_key(x) for x in oids])
        out = {}
        for oid in oids:
            stored = got.get(object_key(oid))
            if stored is None:
                raise ObjectNotFound(oid)
            o.from_stored(oid, stored)
            out[oid] = stored
        return out

    def contains(self, oid: str) -> bool:
        """Whether the object is stored (not verified).

        Raises:
            StorageError: the backend failed.
        """
        return oid in self._known or self.storage.exists(object_key(oid))

    def verify(self, oid: str) -> None:
        """Re-read and re-hash one object, bypassing the cache.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        self.get_stored(oid)

    # -- enumeration -------------------------------------------------------------------
    def iter_ids(self) -> Iterator[ObjectId]:
        """Every object id in the store (lists the whole object folder).

        Raises:
            StorageError: the backend failed.
        """
        for key in self.storage.list(PREFIX):
            parts = key.split("/")
            if len(parts) == 3 and len(parts[1]) == 2:
                oid = parts[1] + parts[2]
                if o.is_hex_id(oid):
                    yield ObjectId(oid)

    def resolve_prefix(self, prefix: str) -> ObjectId:
        """The one object id starting with ``prefix`` (4 or more hex characters).

        Raises:
            RevisionNotFound: no object matches, or the prefix is too short or not hex.
            AmbiguousRevision: several match (their ids are in ``candidates``).
        """
        p = prefix.lower()
        if len(p) < 4 or any(c not in "0123456789abcdef" for c in p):
            raise RevisionNotFound(prefix, "an id prefix needs at least 4 hex characters")
        if len(p) == 64:
            if self.contains(p):
                return ObjectId(p)
            raise RevisionNotFound(prefix, "no such object")
        names = self.storage.list_dir(f"{PREFIX}/{p[:2]}")
        found = sorted(p[:2] + n for n in names if (p[:2] + n).startswith(p) and len(n) == 62)
        if not found:
            raise RevisionNotFound(prefix, "no object id starts with it")
        if len(found) > 1:
            raise AmbiguousRevision(prefix, found)
        return ObjectId(found[0])

    def delete(self, oid: str) -> None:
        """Delete one object (gc only).

        Raises:
            StorageError: the backend failed.
        """
        self.storage.delete(object_key(oid))
        self._known.discard(oid)
        self._written.pop(oid, None)
        self._cache.pop(oid, None)

    def mtime(self, oid: str) -> float | None:
        """When the object was written, if the backend knows."""
        return self.storage.mtime(object_key(oid))


__all__ = ["ObjectStore", "object_key", "IntegrityError"]
