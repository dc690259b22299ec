"""The object store: write-once, content-addressed objects on a :class:`~castore.storage.Storage`.

Format 1 keeps every object loose, at ``objects/<first two hex>/<other 62 hex>``. Format 2
(docs/FORMAT.md) keeps objects above :data:`LOOSE_MIN` bytes loose and writes the small
objects of each batch as one record of a pack (``packs/<name>.pack``): on local disk an
append to this handle's log, elsewhere one whole pack per batch. Reading is the same for
both formats: the pack map (id -> pack, offset), the loose files, then a refresh of the
pack map. Nothing above this module knows whether an object is loose or packed.

Writing an object that exists is harmless; every batch writes all its objects (rewriting
a loose object refreshes its age, which is what makes gc's grace period a guarantee).
Every read re-hashes the stored bytes. Decoded objects are immutable, so they are cached
per process (bounded) and shared between readers.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from . import objects as o
from . import packs
from .errors import AmbiguousRevision, FormatError, IntegrityError, ObjectNotFound, RevisionNotFound, StorageError
from .objects import AnyObject, ObjectId
from .packs import Location
from .storage import Appender, Storage

PREFIX = "objects"
PACKS = "packs"
#: the storage formats this castore reads and writes (castore.json's "format")
FORMATS = (1, 2)
STORE_FORMAT = max(FORMATS)
#: the format a new store gets unless told otherwise (an existing store keeps its own)
DEFAULT_FORMAT = 2
#: in format 2, objects whose canonical bytes exceed this stay loose (shared, deduplicated)
LOOSE_MIN = 4096
#: a local log is sealed (given its index, no longer appended to) past this many bytes
SEAL_BYTES = 1 << 20
CACHE_SIZE = 200_000
#: decoded objects larger than this (canonical bytes) are not cached: memory stays bounded
CACHE_MAX_OBJECT = 1 << 20
#: the canonical bytes kept for recent writes (segments are built from them), at most
RECENT_BYTES = 32 << 20
#: bytes of scanned packs kept in memory, so reading their frames costs no further I/O
PACK_DATA_BYTES = 64 << 20


def object_key(oid: str) -> str:
    """The storage key of a loose object."""
    return f"{PREFIX}/{oid[:2]}/{oid[2:]}"


def pack_key(name: str) -> str:
    """The storage key of a pack."""
    return f"{PACKS}/{name}{packs.PACK_SUFFIX}"


def index_key(name: str) -> str:
    """The storage key of a pack's index."""
    return f"{PACKS}/{name}{packs.INDEX_SUFFIX}"


class _Pack:
    """What this handle knows of one pack: its frames, whether it is sealed (complete),
    and how far a growing log has been scanned."""

    __slots__ = ("name", "where", "sealed", "scanned", "mtime")

    def __init__(self, name: str) -> None:
        self.name = name
        self.where: dict[str, Location] = {}
        self.sealed = False
        self.scanned = 0
        self.mtime: float | None = None  # a log's mtime when last scanned: unchanged, not read again


class ObjectStore:
    """Content-addressed objects over a storage backend."""

    def __init__(self, storage: Storage, compress: bool = True, format: int = 1) -> None:  # noqa: A002
        self.storage = storage
        self.compress = compress
        self.format = 1
        self.set_format(format)
        self._cache: OrderedDict[str, AnyObject] = OrderedDict()
        self._canonical: dict[str, bytes] = {}  # bytes known from segments, not yet decoded
        self._known: set[str] = set()  # ids known to be stored (written or read here)
        self._recent: OrderedDict[str, bytes] = OrderedDict()  # canonical bytes of recent writes
        self._recent_bytes = 0
        # format 2: the pack map and this handle's log
        self._packs: dict[str, _Pack] = {}
        self._where: dict[str, tuple[str, Location]] = {}
        self._lock = threading.RLock()
        self._log: Appender | None = None
        self._log_name = ""
        self._log_pid = 0
        self._no_append = False
        self._new_packs: list[str] = []
        self._pack_data: OrderedDict[str, bytes] = OrderedDict()  # pack name -> bytes read by a scan
        self._pack_data_bytes = 0

    def set_format(self, fmt: int) -> None:
        """Write in storage format ``fmt`` from now on (reading covers every format).

        Raises:
            FormatError: not a format this castore knows.
        """
        if fmt not in FORMATS:
            raise FormatError(f"unknown storage format {fmt!r} (this castore has {FORMATS})", found=fmt,
                              supported=STORE_FORMAT)
        self.format = fmt

    def close(self) -> None:
        """Release this handle's log (readers and repack then treat it as complete); safe
        to call twice. The next write opens a new log."""
        with self._lock:
            if self._log is not None and self._log_pid == os.getpid():
                self._log.close()
            self._log = None

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
        """Store already-encoded ``(id, canonical bytes)`` pairs as one unit; return the
        stored bytes written. This is the one call the write path makes per append.

        Format 1: each object is a loose file (one batch; folders synced once). Format 2:
        objects above :data:`LOOSE_MIN` are loose files, the others one pack record.
        Everything is durable when this returns (on a durable storage).

        Raises:
            StorageError: the backend failed (the caller must not move a ref to the batch).
        """
        frames: list[tuple[str, bytes, int]] = []
        for oid, canonical in encoded:
            self._keep_recent(oid, canonical)
            frames.append((oid, o.to_stored(canonical, self.compress), len(canonical)))
        return self._write_frames(frames)

    def _write_frames(self, frames: Sequence[tuple[str, bytes, int]]) -> int:
        """Write ``(id, frame, canonical size)`` triples: loose or packed by the format."""
        loose: dict[str, bytes] = {}
        small: list[tuple[str, bytes]] = []
        ids: list[str] = []
        for oid, frame, size in frames:
            ids.append(oid)
            if self.format >= 2 and size <= LOOSE_MIN:
                small.append((oid, frame))
            else:
                loose[object_key(oid)] = frame
        if loose:
            self.storage.write_many(loose)
        if small:
            self._write_record(small)
        self._known.update(ids)
        return sum(len(f) for _, f, _ in frames)

    def _write_record(self, small: list[tuple[str, bytes]]) -> None:
        """Append one record to this handle's log, or write it as a whole pack."""
        with self._lock:
            log = self._open_log()
            if log is None:
                data, where = packs.encode_pack(small)
                name = packs.content_name("b", data)
                self.storage.write(pack_key(name), data)
                self._add(name, where, sealed=True, scanned=len(data))
            else:
                rec, where = packs.encode_record(small, log.size)
                try:
                    log.append(rec)
                except StorageError:
                    self._log = None  # abandoned: its torn tail is ignored; the next batch opens a new log
                    raise
                name = self._log_name
                self._add(name, where, sealed=False, scanned=log.size)
                if log.size >= SEAL_BYTES:
                    self._seal()
            if not self._new_packs or self._new_packs[-1] != name:
                self._new_packs.append(name)

    def _open_log(self) -> Appender | None:
        """This handle's log, created if needed; None where the storage cannot append."""
        if self._log is not None and self._log_pid == os.getpid():
            return self._log
        self._log = None  # a forked child never appends to its parent's log
        if self._no_append:
            return None
        name = packs.log_name()
        log = self.storage.open_appender(pack_key(name))
        if log is None:
            self._no_append = True
            return None
        try:
            log.append(packs.PACK_MAGIC)
        except StorageError:
            log.close()
            raise
        self._log, self._log_name, self._log_pid = log, name, os.getpid()
        return log

    def _seal(self) -> None:
        """Write the index of this handle's log and stop appending to it."""
        log, name = self._log, self._log_name
        assert log is not None
        pack = self._packs[name]
        self.storage.write(index_key(name), packs.encode_index(log.size, pack.where))
        pack.sealed = True
        log.close()
        self._log = None

    def written_packs(self) -> list[str]:
        """The packs this handle wrote into since the last call (for a ref's read hint)."""
        with self._lock:
            out, self._new_packs = self._new_packs, []
        return out

    def put_stored(self, items: dict[str, bytes]) -> None:
        """Store raw stored bytes by id, as read from another store (sync). Verifies each.

        Raises:
            IntegrityError: some bytes do not hash to their id.
            StorageError: the backend failed.
        """
        frames = [(oid, stored, len(o.from_stored(oid, stored))) for oid, stored in items.items()]
        self._write_frames(frames)

    # -- the pack map ----------------------------------------------------------------
    def _add(self, name: str, where: dict[str, Location], sealed: bool, scanned: int) -> None:
        pack = self._packs.get(name)
        if pack is None:
            pack = self._packs[name] = _Pack(name)
        pack.where.update(where)
        pack.sealed = pack.sealed or sealed
        pack.scanned = max(pack.scanned, scanned)
        for oid, loc in where.items():
            self._where[oid] = (name, loc)

    def _drop(self, name: str) -> None:
        pack = self._packs.pop(name, None)
        if pack is not None:
            for oid in pack.where:
                if self._where.get(oid, ("",))[0] == name:
                    del self._where[oid]
                    # the object may also be in another pack we know
                    for other in self._packs.values():
                        if oid in other.where:
                            self._where[oid] = (other.name, other.where[oid])
                            break

    def refresh(self) -> bool:
        """Bring the pack map up to date with ``packs/``: new indexes are read, packs without
        one (logs, batch packs) are scanned from where their last scan stopped, packs that
        are gone (repacked) are forgotten. Returns True when something new was found.

        Raises:
            StorageError: the backend failed.
        """
        names = self.storage.list_dir(PACKS)
        with self._lock:
            listed: dict[str, bool] = {}
            for n in names:
                stem, dot, ext = n.rpartition(".")
                if dot and packs.is_pack_name(stem) and "." + ext in (packs.PACK_SUFFIX, packs.INDEX_SUFFIX):
                    listed[stem] = listed.get(stem, False) or "." + ext == packs.INDEX_SUFFIX
            for name in [n for n in self._packs if n not in listed and n != self._log_name]:
                self._drop(name)
            todo = []
            for name, has_index in sorted(listed.items()):
                pack = self._packs.get(name)
                if pack is not None and pack.sealed:
                    continue
                if name == self._log_name and self._log is not None:
                    continue  # ours: already mapped
                if pack is not None and not has_index and pack.mtime is not None \
                        and self.storage.mtime(pack_key(name)) == pack.mtime:
                    continue  # a log that has not changed since its last scan
                todo.append((name, has_index))
            return self._load_packs(todo)

    def load_packs(self, names: Sequence[str]) -> bool:
        """Load the frames of the named packs without listing ``packs/`` (for a reader that
        knows them, e.g. from a ref's read hint); unknown or missing names are skipped.
        Returns True when something new was found.

        Raises:
            StorageError: the backend failed.
        """
        with self._lock:
            todo = [(n, True) for n in names if packs.is_pack_name(n)
                    and not (n in self._packs and self._packs[n].sealed)]
            return self._load_packs(todo)

    def _load_packs(self, todo: Sequence[tuple[str, bool]]) -> bool:
        """Read the indexes of ``(name, has_index)`` packs, and scan the others (and those
        whose index is missing or damaged), each group in one concurrent batch. True if new
        frames were found."""
        if not todo:
            return False
        before = sum(len(self._packs[n].where) for n, _ in todo if n in self._packs)
        scan: list[str] = []
        wanted = [n for n, has_index in todo if has_index]
        got = self.storage.read_many([index_key(n) for n in wanted]) if wanted else {}
        for name, has_index in todo:
            raw = got.get(index_key(name)) if has_index else None
            if raw is not None:
                try:
                    size, where = packs.decode_index(raw)
                    self._add(name, where, sealed=True, scanned=size)
                    continue
                except IntegrityError:
                    pass  # the pack is the truth: scan it
            scan.append(name)
        # a log's mtime is taken before reading it: a record appended after the read changes it
        mtimes = {n: self.storage.mtime(pack_key(n)) for n in scan if n.startswith("w-")}
        datas = self.storage.read_many([pack_key(n) for n in scan]) if scan else {}
        for name in scan:
            data = datas.get(pack_key(name))
            if data is None:
                continue  # deleted by a repack since the listing, or never existed
            pack = self._packs.get(name)
            start = pack.scanned if pack is not None else 0
            where, end = packs.scan(memoryview(data)[start:], start) if start else packs.scan(data)
            self._keep_pack_data(name, data)
            # a batch or repack pack is complete when written; a log may still grow
            self._add(name, where, sealed=not name.startswith("w-"), scanned=end)
            # a torn tail may be a record still being written: scan again next time
            self._packs[name].mtime = mtimes.get(name) if end == len(data) else None
        return sum(len(self._packs[n].where) for n, _ in todo if n in self._packs) > before

    def _keep_pack_data(self, name: str, data: bytes) -> None:
        old = self._pack_data.pop(name, None)
        if old is not None:
            self._pack_data_bytes -= len(old)
        if len(data) > PACK_DATA_BYTES // 4:
            return
        self._pack_data[name] = data
        self._pack_data_bytes += len(data)
        while self._pack_data_bytes > PACK_DATA_BYTES:
            self._pack_data_bytes -= len(self._pack_data.popitem(last=False)[1])

    def _from_pack(self, oid: str) -> bytes | None:
        """The stored frame of ``oid`` from the pack the map names, or None."""
        hit = self._where.get(oid)
        if hit is None:
            return None
        name, loc = hit
        data = self._pack_data.get(name)
        if data is not None and loc.offset + loc.size <= len(data):
            return data[loc.offset:loc.offset + loc.size]  # packs never change below their end
        try:
            return self.storage.read_range(pack_key(name), loc.offset, loc.size)
        except FileNotFoundError:
            with self._lock:
                self._drop(name)  # repacked away: the caller looks elsewhere and refreshes
            return self._from_pack(oid)

    def _stored(self, oid: str) -> bytes | None:
        """The stored frame of ``oid`` wherever it is (pack or loose), or None; not verified."""
        got = self._from_pack(oid)
        if got is not None:
            return got
        try:
            return self.storage.read(object_key(oid))
        except FileNotFoundError:
            pass
        if self.refresh() or oid in self._where:
            return self._from_pack(oid)
        return None

    def _stored_many(self, oids: Sequence[str]) -> dict[str, bytes | None]:
        """Stored frames of several objects (None where missing), loose ones in one batch."""
        out: dict[str, bytes | None] = {}
        loose = []
        for oid in oids:
            got = self._from_pack(oid)
            if got is not None:
                out[oid] = got
            else:
                loose.append(oid)
        if loose:
            read = self.storage.read_many([object_key(x) for x in loose])
            missing = []
            for oid in loose:
                got = read.get(object_key(oid))
                out[oid] = got
                if got is None:
                    missing.append(oid)
            if missing and (self.refresh() or any(m in self._where for m in missing)):
                for oid in missing:
                    out[oid] = self._from_pack(oid)
        return out

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
            stored = self._stored(oid)
            if stored is None:
                raise ObjectNotFound(oid)
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
            got = self._stored_many(todo)
            for oid in todo:
                stored = got.get(oid)
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
        stored = self._stored(oid)
        if stored is None:
            raise ObjectNotFound(oid)
        o.from_stored(oid, stored)
        return stored

    def get_stored_many(self, oids: Sequence[str]) -> dict[str, bytes]:
        """Stored bytes of several objects in one batch, each verified.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        got = self._stored_many(oids)
        out = {}
        for oid in oids:
            stored = got.get(oid)
            if stored is None:
                raise ObjectNotFound(oid)
            o.from_stored(oid, stored)
            out[oid] = stored
        return out

    def read_stored_many(self, oids: Sequence[str]) -> dict[str, bytes | None]:
        """Stored bytes of several objects, not verified and bypassing every cache of
        decoded objects (None where missing): what fsck and gc read.

        Raises:
            StorageError: the backend failed.
        """
        return self._stored_many(oids)

    def contains(self, oid: str) -> bool:
        """Whether the object is stored (not verified).

        Raises:
            StorageError: the backend failed.
        """
        if oid in self._known or oid in self._where or self.storage.exists(object_key(oid)):
            return True
        self.refresh()
        return oid in self._where

    def verify(self, oid: str) -> None:
        """Re-read and re-hash one object, bypassing the cache.

        Raises:
            ObjectNotFound, IntegrityError, StorageError.
        """
        self.get_stored(oid)

    # -- enumeration -------------------------------------------------------------------
    def iter_loose_ids(self) -> Iterator[ObjectId]:
        """Every loose object id (lists the whole object folder).

        Raises:
            StorageError: the backend failed.
        """
        for key in self.storage.list(PREFIX):
            parts = key.split("/")
            if len(parts) == 3 and len(parts[1]) == 2:
                oid = parts[1] + parts[2]
                if o.is_hex_id(oid):
                    yield ObjectId(oid)

    def iter_ids(self) -> Iterator[ObjectId]:
        """Every object id in the store, loose or packed, each once.

        Raises:
            StorageError: the backend failed.
        """
        seen: set[str] = set()
        for oid in self.iter_loose_ids():
            seen.add(oid)
            yield oid
        self.refresh()
        for key in list(self._where):
            if key not in seen:
                yield ObjectId(key)

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
        found = {p[:2] + n for n in names if (p[:2] + n).startswith(p) and len(n) == 62}
        self.refresh()
        found.update(x for x in self._where if x.startswith(p))
        if not found:
            raise RevisionNotFound(prefix, "no object id starts with it")
        if len(found) > 1:
            raise AmbiguousRevision(prefix, sorted(found))
        return ObjectId(found.pop())

    def delete(self, oid: str) -> None:
        """Delete one loose object (gc only; packed objects go with their pack).

        Raises:
            StorageError: the backend failed.
        """
        self.storage.delete(object_key(oid))
        self._forget(oid)

    def delete_if_older(self, oid: str, cutoff: float) -> bool:
        """Delete one loose object if it was last written before ``cutoff`` (a POSIX time),
        re-checking its age right before the deletion; True if deleted (gc only).

        Raises:
            StorageError: the backend failed.
        """
        done = self.storage.delete_if_older(object_key(oid), cutoff)
        if done:
            self._forget(oid)
        return done

    def _forget(self, oid: str) -> None:
        self._known.discard(oid)
        self._cache.pop(oid, None)

    def mtime(self, oid: str) -> float | None:
        """When the object was written, if the backend knows (loose objects only)."""
        return self.storage.mtime(object_key(oid))

    # -- packs, for repack and gc ------------------------------------------------------
    def pack_names(self) -> list[str]:
        """Every pack in the store (after a refresh).

        Raises:
            StorageError: the backend failed.
        """
        self.refresh()
        with self._lock:
            return sorted(self._packs)

    def pack_contents(self, name: str) -> dict[str, Location]:
        """The frames of one pack as this handle knows them (call :meth:`refresh` first)."""
        with self._lock:
            pack = self._packs.get(name)
            return dict(pack.where) if pack is not None else {}

    def pack_info(self, name: str) -> tuple[float | None, bool, bool]:
        """``(mtime, sealed, held)`` of a pack: when it last changed, whether it has an index
        or cannot grow, and whether a live writer still appends to it.

        Raises:
            StorageError: the backend failed.
        """
        with self._lock:
            pack = self._packs.get(name)
            sealed = pack is not None and pack.sealed
            ours = name == self._log_name and self._log is not None
        held = ours or (name.startswith("w-") and not sealed and self.storage.is_held(pack_key(name)))
        return self.storage.mtime(pack_key(name)), sealed, held

    def read_frame(self, name: str, loc: Location) -> bytes:
        """One stored frame of a pack (not verified).

        Raises:
            FileNotFoundError: the pack is gone.
            StorageError: the backend failed.
        """
        return self.storage.read_range(pack_key(name), loc.offset, loc.size)

    def write_pack(self, frames: Sequence[tuple[str, bytes]]) -> str:
        """Write frames as one new sealed pack with its index (repack); return its name.

        The pack is written before its index, each atomically: a pack without its index
        is still read (scanned); an index never names a pack that is not complete.

        Raises:
            StorageError: the backend failed.
        """
        data, where = packs.encode_pack(frames)
        name = packs.content_name("r", data)
        self.storage.write(pack_key(name), data)
        self.storage.write(index_key(name), packs.encode_index(len(data), where))
        with self._lock:
            self._add(name, where, sealed=True, scanned=len(data))
        return name

    def delete_pack(self, name: str, cutoff: float | None = None) -> bool:
        """Delete a pack and its index (repack and gc only); with ``cutoff``, only if the pack
        was last written before that POSIX time, checked right before the deletion (a batch
        pack written again with the same bytes is young again). True if deleted.

        Raises:
            StorageError: the backend failed.
        """
        if cutoff is not None:
            if not self.storage.delete_if_older(pack_key(name), cutoff):
                return False
            self.storage.delete(index_key(name))
        else:
            self.storage.delete(index_key(name))
            self.storage.delete(pack_key(name))
        with self._lock:
            self._drop(name)
        return True


__all__ = ["ObjectStore", "object_key", "pack_key", "index_key", "IntegrityError", "LOOSE_MIN", "STORE_FORMAT",
           "DEFAULT_FORMAT", "FORMATS"]
