"""The object store: write-once, content-addressed objects on a :class:`~castore.storage.Storage`.

Format 1 keeps every object loose, at ``objects/<first two hex>/<other 62 hex>``. Format 2
(docs/FORMAT.md) keeps objects above :data:`LOOSE_MIN` bytes loose and writes the small
objects of each batch as one record of a pack (``packs/<name>.pack``): on local disk an
append to this handle's log, elsewhere one whole pack per batch. Reading is the same for
both formats: the pack map (id -> pack, offset), the loose files, then a refresh of the
pack map. Nothing above this module knows whether an object is loose or packed.
The pack map and the reads of packs are :mod:`castore.objectstore.packmap`'s, the writer's log and
its ref intents :mod:`castore.objectstore.packlog`'s, the merge of packs :mod:`castore.objectstore.repack`'s: the
parts of :class:`ObjectStore`, which is their one public face.

Writing an object that exists is harmless; every batch writes all its objects (rewriting
a loose object refreshes its age, which is what makes gc's grace period a guarantee).
Every read re-hashes the stored bytes. Decoded objects are immutable, so they are cached
per process (bounded) and shared between readers.
"""

from __future__ import annotations

import gc
import itertools
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

from .. import objects as o
from ..errors import AmbiguousRevision, FormatError, IntegrityError, ObjectNotFound, RevisionNotFound, StorageError
from ..objects import AnyObject, ObjectId
from ..storage import Appender, DeleteIncomplete, Storage
from . import packs
from .packlog import WriterLog
from .packs import PACKS, Place, index_key, pack_key

PREFIX = "objects"
#: the storage formats this castore reads and writes (castore.json's "format"); 3 is 2 with
#: deferred ref swaps on local disk (ref intents in the writers' logs, docs/FORMAT.md 12)
FORMATS = (1, 2, 3)
STORE_FORMAT = max(FORMATS)
#: the format a new store gets unless told otherwise (an existing store keeps its own), on
#: storage that can append (local disk: ref swaps journaled in the writer's log)
DEFAULT_FORMAT = 3
#: ... and on storage that cannot (object stores, memory), where format 3 would write format
#: 2's bytes: such a store stays readable by a castore that knows format 2 only
DEFAULT_FORMAT_NO_APPEND = 2
#: in format 2, objects whose canonical bytes exceed this stay loose (shared, deduplicated)
LOOSE_MIN = 4096
#: a local log is sealed (given its index, no longer appended to) past this many bytes
SEAL_BYTES = 1 << 20
CACHE_SIZE = 200_000
#: decoded objects larger than this (canonical bytes) are not cached: memory stays bounded
CACHE_MAX_OBJECT = 1 << 20
#: the canonical bytes kept for recent writes (segments are built from them), at most
RECENT_BYTES = 32 << 20
#: a path object (segment, index) up to this size is packed even above LOOSE_MIN: it is shared
#: with no other session, and in a repacked block it compresses against the objects it copies
PATH_OBJECT_MAX = 4 << 20
#: repack writes blocks of about this many content bytes, each one zstd frame at BLOCK_LEVEL
BLOCK_BYTES = 256 << 10
BLOCK_LEVEL = 9
#: background repack: an S3 (no-append) writer runs one after this many batch packs
AUTO_REPACK_BATCHES = 16


def object_key(oid: str) -> str:
    """The storage key of a loose object."""
    return f"{PREFIX}/{oid[:2]}/{oid[2:]}"


class gc_paused:
    """Pause Python's cyclic garbage collector for a bulk read (a ``with`` block).

    Reading a long path allocates tens of thousands of objects that all stay alive (the
    cache, the path): each allocation burst makes the collector walk every live object
    again, for nothing (decoded objects hold no cycles). A pause nested in another, or
    taken while the collector is off, leaves it as it was.
    """

    __slots__ = ("was",)

    def __enter__(self) -> None:
        self.was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()


class ObjectStore(WriterLog):
    """Content-addressed objects over a storage backend (its pack map and the reads of packs:
    :class:`~castore.objectstore.packmap.PackReader`; its writer's log: :class:`~castore.objectstore.packlog.WriterLog`;
    merging its packs: :class:`~castore.objectstore.repack.Repacking`)."""

    def __init__(self, storage: Storage, compress: bool = True, format: int = 1,  # noqa: A002
                 auto_repack: bool = True) -> None:
        self.storage = storage
        self.compress = compress
        #: merge small packs in a background thread when a log is sealed or after
        #: AUTO_REPACK_BATCHES batch packs (docs/FORMAT.md, 8)
        self.auto_repack = auto_repack
        #: the last error a background repack met, if any (it never fails an append)
        self.repack_error: BaseException | None = None
        self._repacker: threading.Thread | None = None
        self._repack_again = False
        self._batches = 0
        self._seq: dict[str, int] = {}  # packs this handle wrote -> the order it wrote them in
        self._own: OrderedDict[str, list[tuple[str, bytes]]] = OrderedDict()  # its batch packs' objects
        self._sizes: dict[str, int] = {}  # sealed packs' sizes read from their indexes (they never change)
        self.format = 1
        self.set_format(format)
        # decoded objects, oldest first (a plain dict: a cold read of a long path puts and
        # looks up tens of thousands at once, 4-7x faster than in an OrderedDict)
        self._cache: dict[str, AnyObject] = {}
        self._canonical: dict[str, bytes] = {}  # bytes known from segments, not yet decoded
        self._known: set[str] = set()  # ids known to be stored (written or read here)
        self._recent: OrderedDict[str, bytes] = OrderedDict()  # canonical bytes of recent writes
        self._recent_bytes = 0
        # format 2: the pack map and this handle's log
        self._packs = {}
        self._where: dict[str, tuple[str, Place]] = {}
        self._lazy: dict[str, packs.IndexView] = {}  # sealed packs whose index rows are not in _where
        self._contents: OrderedDict[tuple[str, int], bytes] = OrderedDict()  # (pack, payload offset) -> content
        self._contents_bytes = 0
        self._prefixes: OrderedDict[tuple[str, int], o.BlockPrefix] = OrderedDict()  # blocks read in part
        self._lock = threading.RLock()
        self._log: Appender | None = None
        self._log_name = ""
        self._log_pid = 0
        # a backend that keeps Storage's open_appender cannot append (object stores): known
        # before the first write, so that no swap hands such a backend a journal (format 3)
        self._no_append = type(storage).open_appender is Storage.open_appender
        self._new_packs: list[str] = []
        self._moved: OrderedDict[str, str] = OrderedDict()  # pack merged by this handle -> the pack it went into
        self._pack_data: OrderedDict[str, bytes] = OrderedDict()  # pack name -> bytes read by a scan
        self._pack_data_bytes = 0
        # format 3: the refs whose intents are in this handle's log (synced before it is sealed),
        # each with its latest intent there (the base of the next one's delta), swaps between
        # their intent and their rename, and per thread the log holding this thread's objects
        # record not yet synced
        self._journaled = packs.DeltaBases()
        # logs this handle stopped appending to once they were synced (sealed, merged at close,
        # or dropped after a failure and then synced): a record in one is durable even after a
        # background repack has merged the log away
        self._synced_logs: set[str] = set()
        self._inflight = 0
        self._tls = threading.local()
        # a power loss may have cut deferred ref swaps short: replay them before any ref is read
        storage.recover_refs(self.log_intents)

    @property
    def default_format(self) -> int:
        """The format a new store on this storage gets unless told otherwise:
        :data:`DEFAULT_FORMAT` where the storage can append, else
        :data:`DEFAULT_FORMAT_NO_APPEND`."""
        return DEFAULT_FORMAT_NO_APPEND if self._no_append else DEFAULT_FORMAT

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
        """Wait for a background repack to finish, seal this handle's log (write its index,
        so that repack may merge it at once) and release it; safe to call twice. The next
        write opens a new log. A log that holds ref intents (format 3) is merged instead
        into a pack of blocks without them (:meth:`_merge_log`). A failure to write the
        index or the pack leaves the log unsealed (a later repack merges it once it has
        been idle), and so does a ref swap of another thread still under way (its intent
        must stay live). Blocks read in part are dropped (their decompression contexts go
        back to the pool)."""
        self.wait_repack()
        with self._lock:
            if self._log is not None and self._log_pid == os.getpid():
                if self._log.size > packs.HEADER_SIZE and self._log_name in self._packs and not self._inflight:
                    try:
                        if self._journaled:
                            self._merge_log()
                        else:
                            self._seal()
                    except (StorageError, IntegrityError):
                        pass  # still a valid log: scanned by readers, merged by repack when idle
                if self._log is not None:
                    self._log.close()
            self._log = None
            while self._prefixes:  # their decompression contexts go back to the pool
                self._prefixes.popitem()[1].close()

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

    def put_encoded(self, encoded: Iterable[tuple[str, bytes]], sync: bool = True) -> int:
        """Store already-encoded ``(id, canonical bytes)`` pairs as one unit; return the
        stored bytes written. This is the one call the write path makes per append.

        Format 1: each object is a loose file (one batch; folders synced once). Format 2:
        objects above :data:`LOOSE_MIN` are loose files, the others one pack record.
        Everything is durable when this returns (on a durable storage), except, with
        ``sync`` False, a record appended to this handle's log: the ref swap that names the
        batch then makes it durable with its intent (:meth:`journal`; format 3).

        Raises:
            StorageError: the backend failed (the caller must not move a ref to the batch).
        """
        items: list[tuple[str, bytes, bytes | None]] = []
        for oid, canonical in encoded:
            self._keep_recent(oid, canonical)
            items.append((oid, canonical, None))
        return self._write_objects(items, sync)

    def _packed(self, canonical: bytes) -> bool:
        """Whether an object goes into a pack record (format 2) rather than a loose file."""
        n = len(canonical)
        return self.format >= 2 and (n <= LOOSE_MIN or (n <= PATH_OBJECT_MAX and o.is_path_object(canonical)))

    def _write_objects(self, items: Sequence[tuple[str, bytes, bytes | None]], sync: bool = True) -> int:
        """Write ``(id, canonical bytes, stored frame or None)`` triples: loose or packed by
        the format; return the bytes written."""
        loose: dict[str, bytes] = {}
        small: list[tuple[str, bytes]] = []
        ids: list[str] = []
        for oid, canonical, frame in items:
            ids.append(oid)
            if self._packed(canonical):
                small.append((oid, canonical))
            else:
                loose[object_key(oid)] = frame if frame is not None else o.to_stored(canonical, self.compress)
        if loose:
            self.storage.write_many(loose)
        written = sum(len(f) for f in loose.values())
        if small:
            written += self._write_record(small, sync)
        self._known.update(ids)
        return written

    def _write_record(self, small: list[tuple[str, bytes]], sync: bool = True) -> int:
        """Append one record (version 2) to this handle's log (not synced yet without
        ``sync``), or write it as a whole pack; return its size."""
        batch = False
        with self._lock:
            log = self._open_log()
            if log is None:
                data, where = packs.encode_pack_v2([small])
                name = packs.content_name("b", data)
                self.storage.write(pack_key(name), data)
                self._add(name, where, sealed=True, scanned=len(data), version=2)
                size = len(data)
                self._own[name] = list(small)  # a background repack merges it without reading it back
                while len(self._own) > 4 * AUTO_REPACK_BATCHES:
                    self._own.popitem(last=False)
                self._batches += 1
                batch = self._batches % AUTO_REPACK_BATCHES == 0
            else:
                rec, where = packs.encode_record_v2(small, log.size)
                try:
                    log.append(rec, sync=sync)
                except StorageError:
                    self._abandon()  # its torn tail is ignored; the next batch opens a new log
                    raise
                name = self._log_name
                self._tls.pending = "" if sync else name
                self._add(name, where, sealed=False, scanned=log.size, version=2)
                size = len(rec)
                if log.size >= SEAL_BYTES and not self._inflight:
                    self._seal()
                    batch = True
            if not self._new_packs or self._new_packs[-1] != name:
                self._new_packs.append(name)
            self._seq.setdefault(name, len(self._seq))
        if batch:
            self._start_repack()
        return size

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
        todo: list[tuple[str, bytes, bytes | None]] = []
        for oid, stored in items.items():
            canonical = o.from_stored(oid, stored)
            if stored[:1] == b"\x00" and self.compress:
                stored = o.to_stored(canonical)  # read raw from a version-2 pack: compress it loose
            todo.append((oid, canonical, stored))
        self._write_objects(todo)

    def knows(self, oid: str) -> bool:
        """Whether ``oid`` can be read without looking for it: decoded, or mapped to a pack
        (no I/O; a loose object is not "known" until read)."""
        return oid in self._cache or oid in self._canonical or oid in self._where

    def _checked(self, oid: str, stored: bytes) -> tuple[bytes, bytes]:
        """``(stored, canonical)``: :func:`objects.from_stored`, except that bytes failing their
        id through an index not yet checked get that index checked first: a damaged index is
        dropped, its pack scanned, and the object read again.

        Raises:
            IntegrityError: the stored bytes are corrupt.
            ObjectNotFound: the object was only where the damaged index said.
        """
        try:
            return stored, o.from_stored(oid, stored)
        except IntegrityError:
            hit = self._where.get(oid)
            if hit is None or not self._recheck(hit[0]):
                raise
        again = self._stored(oid)
        if again is None:
            raise ObjectNotFound(oid)
        return again, o.from_stored(oid, again)

    def _stored(self, oid: str) -> bytes | None:
        """The stored frame of ``oid`` wherever it is (pack or loose), or None; not verified."""
        got = self._from_pack(oid, True)
        if got is not None:
            return got
        try:
            return self.storage.read(object_key(oid))
        except FileNotFoundError:
            pass
        if self.refresh((oid,)) or self._locate(oid) is not None:
            got = self._from_pack(oid, True)
            if got is not None:
                return got
        # a miss is trusted only once every index searched has passed its check
        return self._from_pack(oid, True) if self._recheck() else None

    def _stored_many(self, oids: Sequence[str]) -> dict[str, bytes | None]:
        """Stored frames of several objects (None where missing): packed ones a pack or a
        record at a time, loose ones in one batch."""
        out: dict[str, bytes | None] = {}
        alone = len(oids) == 1
        if self._packs:
            self._prefetch_packs(oids)
        loose = []
        for oid in oids:
            got = self._from_pack(oid, alone)
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
            if missing and (self.refresh(missing) or any(self._locate(m) is not None for m in missing)):
                for oid in missing:
                    out[oid] = self._from_pack(oid, alone)
            # a miss is trusted only once every index searched has passed its check
            if any(out[m] is None for m in missing) and self._recheck():
                for oid in missing:
                    if out[oid] is None:
                        out[oid] = self._from_pack(oid, alone)
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
            self._trim_cache()

    def _trim_cache(self) -> None:
        """Drop the oldest decoded objects past :data:`CACHE_SIZE`, and a tenth more at once (a
        dict finds its oldest key by scanning past the slots freed before it: once per batch)."""
        cache = self._cache
        excess = len(cache) - CACHE_SIZE
        if excess > 0:
            for oid in list(itertools.islice(cache, excess + CACHE_SIZE // 10)):
                del cache[oid]

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
            canonical = self._checked(oid, stored)[1]
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
        if not isinstance(oids, (list, tuple)):
            oids = list(oids)
        try:
            # everything decoded already (the bodies of a path just read): no loop in Python
            return dict(zip(oids, map(self._cache.__getitem__, oids), strict=True))
        except KeyError:
            pass
        out: dict[str, AnyObject] = {}
        todo: list[str] = []
        cached, pending = self._cache.get, self._canonical
        for oid in oids:
            obj = cached(oid)
            if obj is not None:
                out[oid] = obj
            elif pending and oid in pending:
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
                canonical = self._checked(oid, stored)[1]
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

    def adopt_canonical_many(self, canonicals: Sequence[bytes]) -> list[tuple[ObjectId, AnyObject]]:
        """Ids and decoded objects of canonical bytes found inside a verified object (the
        commits and bodies of a segment), in order: each is hashed once for its id, decoded
        once (or taken from the cache) and cached. The bulk form of :meth:`add_known_canonical`
        followed by :meth:`get`, for reading a long path.

        Raises:
            IntegrityError: some bytes are not a castore object.
        """
        with gc_paused():
            ids = o.digest_many(canonicals)
            cache = self._cache
            if cache.keys().isdisjoint(ids) and max(map(len, canonicals), default=0) <= CACHE_MAX_OBJECT:
                # the usual cold read: nothing cached yet, nothing too big to cache; no loop
                # in Python per object
                decoded = o.decode_many(ids, canonicals)
                pending = self._canonical
                if pending:
                    for oid in ids:
                        pending.pop(oid, None)
                cache.update(zip(ids, decoded, strict=True))
                self._trim_cache()
                self._known.update(ids)
                return list(zip(ids, decoded, strict=True))
            found = list(map(cache.get, ids))
            fresh = [i for i, obj in enumerate(found) if obj is None]
            if fresh:
                decoded = o.decode_many([ids[i] for i in fresh], [canonicals[i] for i in fresh])
                pending = self._canonical
                for i, obj in zip(fresh, decoded, strict=True):
                    oid = ids[i]
                    found[i] = obj
                    if pending:
                        pending.pop(oid, None)
                    if len(canonicals[i]) <= CACHE_MAX_OBJECT:
                        cache[oid] = obj
                self._trim_cache()
            self._known.update(ids)
            return list(zip(ids, found, strict=True))  # type: ignore[arg-type]  # every None was filled

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
        return self._checked(oid, stored)[0]

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
            out[oid] = self._checked(oid, stored)[0]
        return out

    def read_stored_many(self, oids: Sequence[str]) -> dict[str, bytes | None]:
        """Stored bytes of several objects, not verified and bypassing every cache of
        decoded objects (None where missing): what fsck and gc read.

        Raises:
            StorageError: the backend failed.
        """
        return self._stored_many_rechecked(oids)

    def _stored_many_rechecked(self, oids: Sequence[str]) -> dict[str, bytes | None]:
        """:meth:`_stored_many` for callers that verify the bytes themselves (fsck, gc, sync):
        a frame found through an index not checked yet is hashed here, and one that fails
        gets its index checked (a damaged one is dropped, its pack scanned, the frame read
        again), so that such a caller never takes a lying index row for a damaged object."""
        got = self._stored_many(oids)
        for oid, stored in got.items():
            hit = self._where.get(oid)
            if stored is None or hit is None:
                continue
            view = self._lazy.get(hit[0])
            if view is None or view.checked:
                continue
            try:
                o.from_stored(oid, stored)
            except IntegrityError:
                if self._recheck(hit[0]):
                    got[oid] = self._stored(oid)
        return got

    def contains(self, oid: str) -> bool:
        """Whether the object is stored (not verified).

        Raises:
            StorageError: the backend failed.
        """
        if oid in self._known or self._locate(oid) is not None or self.storage.exists(object_key(oid)):
            return True
        self.refresh((oid,))
        return self._locate(oid) is not None or (self._recheck() and self._locate(oid) is not None)

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
        self._materialize()
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
        self._materialize()
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

    def delete_many(self, oids: Sequence[str]) -> None:
        """Delete loose objects in one batched delete (``castore repack`` after packing them;
        on S3 one request per 1,000 objects).

        Raises:
            DeleteIncomplete: the backend failed part-way; ``remaining`` names the keys left.
        """
        try:
            self.storage.delete_many([object_key(oid) for oid in oids])
        finally:
            for oid in oids:
                self._forget(oid)  # forgetting one still stored only costs a read

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
    def iter_contents(self, batch: int = 8) -> Iterator[tuple[bytes, bool]]:
        """Every stored object's canonical bytes, store-wide, each stored unit read once (what
        a search of every object reads): first the loose objects, then each pack record, the
        packs read whole, ``batch`` packs per concurrent read. Yields ``(bytes, is_record)``:
        a version-2 record's decompressed content (``is_record``: its objects are found with
        :func:`castore.objectstore.packs.content_spans`; it is also kept in the content cache, so that
        reading its objects again costs no I/O, as are the pack's bytes), or one object's
        canonical bytes (a loose object, a version-1 frame). Objects are not
        verified here: an object's id is the hash of its bytes, which a caller that needs the
        id computes. A damaged loose object or record is skipped (``fsck`` reports it).

        Raises:
            StorageError: the backend failed.
        """
        loose = [object_key(oid) for oid in self.iter_loose_ids()]
        for i in range(0, len(loose), 256):
            for raw in self.storage.read_many(loose[i:i + 256]).values():
                if raw is None:
                    continue  # collected since the listing
                try:
                    canonical = o.unframe(raw)
                except IntegrityError:
                    continue
                yield canonical, False
        names = sorted({n.rpartition(".")[0] for n in self.storage.list_dir(PACKS)
                        if n.endswith(packs.PACK_SUFFIX) and packs.is_pack_name(n.rpartition(".")[0])})
        for i in range(0, len(names), batch):
            keys = [pack_key(n) for n in names[i:i + batch]]
            datas = self.storage.read_many(keys)
            for name, key in zip(names[i:i + batch], keys, strict=True):
                data = datas.pop(key, None)
                if data is None:
                    continue  # repacked away since the listing: its objects are in a newer pack
                with self._lock:
                    self._keep_pack_data(name, data)  # reading its objects again costs no I/O
                try:
                    records = list(packs.payloads(data))
                except IntegrityError:
                    continue  # not a pack
                contents = _unframed(records, name)
                for version, offset, payload in records:
                    if version == 1:
                        for _, frame in packs.frames_v1(payload) or ():
                            try:
                                canonical = o.unframe(frame)
                            except IntegrityError:
                                continue
                            yield canonical, False
                        continue
                    content = next(contents)
                    if content is None:
                        continue
                    self._keep_content(name, offset, content)
                    yield content, True

    def write_pack(self, frames: Sequence[tuple[str, bytes]]) -> str:
        """Write stored frames as one new sealed pack (version 2, in the order given, in
        compressed blocks) with its index (gc); return its name. Each frame is verified.

        Raises:
            IntegrityError: a frame does not hash to its id (nothing is written).
            StorageError: the backend failed.
        """
        return self._write_groups([[(oid, o.from_stored(oid, frame))] for oid, frame in frames])

    def _write_groups(self, groups: Sequence[Sequence[tuple[str, bytes]]]) -> str:
        """Write groups of ``(id, canonical bytes)`` as one new version-2 pack of blocks (each
        laid out by kind, :func:`castore.objectstore.packs.block_layout`), then its index, each
        atomically: a pack without its index is still read (scanned); an index never names
        a pack that is not complete."""
        data, where = packs.encode_pack_v2(groups, BLOCK_BYTES, BLOCK_LEVEL, _ends_run, by_kind=True)
        name = packs.content_name("r", data)
        self.storage.write(pack_key(name), data)
        self.storage.write(index_key(name), packs.encode_index(len(data), where))
        with self._lock:
            self._add(name, where, sealed=True, scanned=len(data), version=2)
            self._seq.setdefault(name, len(self._seq))
            self._sizes[name] = len(data)
        return name

    def delete_pack(self, name: str, cutoff: float | None = None) -> bool:
        """Delete a pack and its index (repack and gc only); with ``cutoff``, only if the pack
        was last written before that POSIX time, checked right before the deletion (a batch
        pack written again with the same bytes is young again). True if deleted.

        Raises:
            StorageError: the backend failed.
        """
        indexed = not name.startswith("b-")  # a batch pack never gets an index: no request for one
        if name.startswith("w-") and not self.storage.exists(index_key(name)):
            # a log that was never sealed (its writer died): the refs its intents moved are
            # made durable before the intents go (docs/FORMAT.md, 12)
            try:
                data = self.storage.read(pack_key(name))
            except FileNotFoundError:
                data = b""
            keys = sorted({i.key for i in packs.intents(data)})
            if keys:
                self.storage.sync_keys(keys)
        if cutoff is not None:
            if not self.storage.delete_if_older(pack_key(name), cutoff):
                return False
            if indexed:
                self.storage.delete(index_key(name))
        else:
            if indexed:
                self.storage.delete(index_key(name))
            self.storage.delete(pack_key(name))
        with self._lock:
            self._drop(name)
            self._sizes.pop(name, None)
        return True

    def delete_packs(self, names: Sequence[str]) -> None:
        """Delete packs and their indexes (repack): every index first, then every pack, each
        set in one batched delete (on S3 one request per 1,000 keys), so that a failure or
        kill in between leaves packs without an index (scanned by readers), never an index
        without its pack.

        Raises:
            DeleteIncomplete: the backend failed part-way; ``remaining`` names the keys that
                may still be stored (the packs it names are still whole).
        """
        names = list(dict.fromkeys(names))
        gone = set(names)
        try:
            indexes = [index_key(n) for n in names if not n.startswith("b-")]  # a batch pack has none
            if indexes:
                self.storage.delete_many(indexes)
            self.storage.delete_many([pack_key(n) for n in names])
        except DeleteIncomplete as e:
            left = set(e.remaining)
            gone = {n for n in names if pack_key(n) not in left and index_key(n) not in left}
            raise
        finally:
            with self._lock:
                for name in gone:
                    self._drop(name)
                    self._sizes.pop(name, None)

    # -- sync: frames in bulk ------------------------------------------------------------
    def read_stored_packed(self, oids: Sequence[str]) -> dict[str, bytes]:
        """Stored bytes of several objects (for sync), read as :meth:`read_stored_many` reads
        them (a pack at a time where it holds several); not verified here:
        :meth:`put_stored_packed` verifies each on the receiving side.

        Raises:
            ObjectNotFound: one of them is not stored.
            StorageError: the backend failed.
        """
        out: dict[str, bytes] = {}
        for oid, stored in self._stored_many_rechecked(list(dict.fromkeys(oids))).items():
            if stored is None:
                raise ObjectNotFound(oid)
            out[oid] = stored
        return out

    def put_stored_packed(self, items: dict[str, bytes]) -> tuple[int, int]:
        """Store raw stored bytes read from another store (sync) in as few writes as the
        format allows; verify each. Returns ``(packed, loose)``: how many went each way.

        Placement is the write path's rule (:meth:`put_encoded`): format 1 writes every
        object loose; format 2 packs small objects and the segments and indexes of a path
        (one pack record: one PUT on an object store, one append to this handle's log on
        local disk) and writes larger objects loose, so bodies stay shared across
        sessions. A large object is written even if this store may hold it already, as the
        grace rule of docs/FORMAT.md 9.1 requires.

        Raises:
            IntegrityError: some bytes do not hash to their id (nothing is written).
            StorageError: the backend failed (the caller must not move a ref to them).
        """
        triples = [(oid, o.from_stored(oid, stored), stored) for oid, stored in items.items()]
        packed = sum(1 for _, canonical, _ in triples if self._packed(canonical))
        self._write_objects(triples)
        return packed, len(triples) - packed


def _ends_run(group: Sequence[tuple[str, bytes]]) -> bool:
    """Whether a block may end after this group: one that holds a segment or an index (the
    segment copies the commits before it, so a block ending there holds both)."""
    return any(o.is_path_object(c) for _, c in group)


#: version-2 records of one pack decompressed ahead of the one a scan is at (zstd releases
#: the GIL: the next records decompress on another core while the caller searches one)
_UNFRAME_AHEAD = 4


def _unframed(records: list[tuple[int, int, memoryview]], name: str) -> Iterator[bytes | None]:
    """The content of each version-2 record of ``records`` in order (None: it does not
    decompress), decompressed in a worker thread up to :data:`_UNFRAME_AHEAD` ahead."""
    def one(offset: int, payload: memoryview) -> bytes | None:
        try:
            return o.unframe(payload, f"record at {offset} of pack {name}")
        except IntegrityError:
            return None

    todo = [(offset, payload) for version, offset, payload in records if version != 1]
    if len(todo) < 2:
        for offset, payload in todo:
            yield one(offset, payload)
        return
    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="castore-unframe") as pool:
        ahead: deque[Future[bytes | None]] = deque()
        at = 0
        while at < len(todo) or ahead:
            while at < len(todo) and len(ahead) < _UNFRAME_AHEAD:
                ahead.append(pool.submit(one, *todo[at]))
                at += 1
            yield ahead.popleft().result()


__all__ = ["ObjectStore", "object_key", "pack_key", "index_key", "IntegrityError", "LOOSE_MIN",
           "STORE_FORMAT", "DEFAULT_FORMAT", "DEFAULT_FORMAT_NO_APPEND", "FORMATS"]
