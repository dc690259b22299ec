"""The object store: write-once, content-addressed objects on a :class:`~castore.storage.Storage`.

Format 1 keeps every object loose, at ``objects/<first two hex>/<other 62 hex>``. Format 2
(docs/FORMAT.md) keeps objects above :data:`LOOSE_MIN` bytes loose and writes the small
objects of each batch as one record of a pack (``packs/<name>.pack``): on local disk an
append to this handle's log, elsewhere one whole pack per batch. Reading is the same for
both formats: the pack map (id -> pack, offset), the loose files, then a refresh of the
pack map. Nothing above this module knows whether an object is loose or packed.

:class:`ObjectStore` is the one public face. It keeps the loose objects, the caches of
decoded objects and the rule of what goes loose or into a pack, and composes separate
parts, each handed what it needs at construction (in parentheses) and nothing else::

    packs.py    the pack codec: bytes only (docs/FORMAT.md, 4)
    packindex.py  the pack index codec and its search in place (docs/FORMAT.md, 5)
    refintents.py the ref intents of a writer's log: bytes only (docs/FORMAT.md, 12)
    packmap.py  PackMap(storage)                   which pack holds each object: refresh of
                                                   packs/, reads of records and frames, the
                                                   damaged records; owns the lock of the
                                                   pack state
    repack.py   Repacker(storage, packmap)         merging packs (geometric, merge_packs, the
                                                   background repack), writing and deleting
                                                   whole packs
    packlog.py  WriterLog(storage, packmap,        this handle's log: append, seal, index,
                repacker, recent writes)           ref intents (format 3), merge at close

Writing an object that exists is harmless; every batch writes all its objects (rewriting
a loose object refreshes its age, which is what makes gc's grace period a guarantee).
Every read re-hashes the stored bytes. Decoded objects are immutable, so they are cached
per process (bounded) and shared between readers.

Every id and every stored frame is made by the store's :class:`~castore.objects.Codec`
(:attr:`ObjectStore.codec`; :data:`~castore.objects.PLAIN` unless told otherwise): an
encrypted store's keyed ids and sealed loose objects and pack records.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence

from .. import objects as o
from ..errors import (
    AmbiguousRevision,
    CastoreError,
    DamagedPack,
    IntegrityError,
    ObjectNotFound,
    RevisionNotFound,
    SealedFrameError,
)
from ..formats import can_append, check_format, default_format
from ..gcpause import gc_paused  # re-exported: the search's scan and the archive engine take it from here
from ..objects import AnyObject, ObjectId
from ..storage import RefIntent, Storage
from . import packs
from .packlog import WriterLog
from .packmap import PackMap, check_part
from .packs import PACKS, Place, index_key, pack_key
from .repack import AUTO_REPACK_MAX_BYTES, BLOCK_BYTES, Ages, Repacker, RepackReport, age_key, parse_ages

PREFIX = "objects"
#: in format 2, objects whose canonical bytes exceed this stay loose (shared, deduplicated)
LOOSE_MIN = 4096
CACHE_SIZE = 200_000
#: decoded objects larger than this (canonical bytes) are not cached: memory stays bounded
CACHE_MAX_OBJECT = 1 << 20
#: the canonical bytes kept for recent writes (segments are built from them), at most
RECENT_BYTES = 32 << 20
#: a path object (segment, index) up to this size is packed even above LOOSE_MIN: it is shared
#: with no other session, and in a repacked block it compresses against the objects it copies
PATH_OBJECT_MAX = 4 << 20
#: loose objects read per batch by :meth:`ObjectStore.repack`
_REPACK_BATCH = 256


def object_key(oid: str) -> str:
    """The storage key of a loose object."""
    return f"{PREFIX}/{oid[:2]}/{oid[2:]}"


class ObjectStore:
    """Content-addressed objects over a storage backend: the one public face of the object
    store. It keeps the loose objects, the caches of decoded objects and bytes, and the rule
    of what goes loose or into a pack; it composes three parts, each handed what it needs:

    - :attr:`packmap`, a :class:`~castore.objectstore.packmap.PackMap`: which pack holds each
      object, and the reads of frames out of packs; it owns the lock of the pack state;
    - :attr:`repacker`, a :class:`~castore.objectstore.repack.Repacker` (the storage and the
      pack map): merging packs, in the foreground or in a background thread;
    - :attr:`writer_log`, a :class:`~castore.objectstore.packlog.WriterLog` (the storage, the
      pack map, the repacker, the canonical bytes of recent writes): this handle's log of
      batches and its ref intents.
    """

    def __init__(self, storage: Storage, compress: bool = True, format: int = 1,  # noqa: A002
                 auto_repack: bool = True, codec: o.Codec = o.PLAIN) -> None:
        self.storage = storage
        self.compress = compress
        #: how objects become ids and stored bytes (keyed ids, sealed frames in an encrypted store)
        self.codec = codec
        # decoded objects, oldest first (a plain dict: a cold read of a long path puts and
        # looks up tens of thousands at once, 4-7x faster than in an OrderedDict)
        self._cache: dict[str, AnyObject] = {}
        self._canonical: dict[str, bytes] = {}  # bytes known from segments, not yet decoded
        self._known: set[str] = set()  # ids known to be stored (written or read here)
        self._recent: OrderedDict[str, bytes] = OrderedDict()  # canonical bytes of recent writes
        self._recent_bytes = 0
        #: a write batch's objects, not written yet (:meth:`hold_writes`), by id, and its thread
        self._held: dict[str, bytes] | None = None
        self._held_thread = 0
        self._held_cached: list[str] = []  # objects the batch cached (cache()), dropped once written
        # a backend that keeps Storage's open_appender cannot append (object stores): known
        # before the first write, so that no swap hands such a backend a journal (format 3)
        self.packmap = PackMap(storage, no_append=not can_append(storage), codec=codec)
        self.repacker = Repacker(storage, self.packmap, auto=auto_repack)
        self.writer_log = WriterLog(storage, self.packmap, self.repacker, recent=self._recent)
        self.format = 1
        self.set_format(format)

    def compact_ref_logs(self) -> None:
        """Bound the storage's logs of ref changes and drop the names no replay needs
        (:meth:`~castore.storage.Storage.compact_ref_logs`, with the writers' logs' intents).

        Raises:
            StorageError: the backend failed.
        """
        self.storage.compact_ref_logs(self.writer_log.log_intents)

    @property
    def auto_repack(self) -> bool:
        """Whether small packs are merged in a background thread when a log is sealed or after
        :data:`~castore.objectstore.repack.AUTO_REPACK_BATCHES` batch packs (docs/FORMAT.md, 8)."""
        return self.repacker.auto

    @auto_repack.setter
    def auto_repack(self, on: bool) -> None:
        self.repacker.auto = on

    @property
    def repack_own(self) -> bool:
        """Whether the background repack merges only the packs this handle wrote (always on
        object storage; set by a writer among several writing at once on local disk, so that
        their repacks run side by side over their own packs, not each over all of them)."""
        return self.repacker.own_only or self.packmap.no_append

    @repack_own.setter
    def repack_own(self, on: bool) -> None:
        self.repacker.own_only = on

    def hold_repack(self) -> None:
        """Start no background repack until :meth:`release_repack` (a write batch holds it
        while it writes; see :meth:`Repacker.hold <castore.objectstore.repack.Repacker.hold>`)."""
        self.repacker.hold()

    def release_repack(self) -> None:
        """End a :meth:`hold_repack`; the last one starts the repack asked for meanwhile."""
        self.repacker.release()

    @property
    def repack_error(self) -> BaseException | None:
        """The last error a background repack met, if any (it never fails an append)."""
        return self.repacker.error

    @property
    def default_format(self) -> int:
        """The format a new store on this storage gets unless told otherwise:
        :func:`castore.formats.default_format`."""
        return default_format(self.storage)

    def set_format(self, fmt: int) -> None:
        """Write in storage format ``fmt`` from now on (reading covers every format).

        Raises:
            FormatError: not a format this castore knows.
        """
        self.format = check_format(fmt)
        self.writer_log.journals = fmt >= 3

    def close(self) -> None:
        """Wait for a background repack to finish, seal this handle's log (write its index,
        so that repack may merge it at once) and release it; safe to call twice. The next
        write opens a new log. A log that holds ref intents (format 3) is merged instead
        into a pack of blocks without them; a log that cannot be sealed or merged stays a
        valid log (:meth:`~castore.objectstore.packlog.WriterLog.close`). Blocks read in part
        are dropped (their decompression contexts go back to the pool)."""
        self.repacker.wait()
        with self.packmap.lock:
            self.writer_log.close()
            self.packmap.close()

    # -- writing ---------------------------------------------------------------------
    def prepare(self, obj: AnyObject) -> tuple[ObjectId, bytes]:
        """Encode ``obj``; return its id and canonical bytes without writing.

        Raises:
            InvalidEntry: the object cannot be encoded.
        """
        return self.codec.encode(obj)

    def put(self, obj: AnyObject) -> ObjectId:
        """Store one object and return its id.

        Raises:
            InvalidEntry: the object cannot be encoded.
            StorageError: the backend failed.
        """
        return self.put_many([obj])[0]

    def cache(self, oid: str, obj: AnyObject) -> None:
        """Cache a decoded object about to be written (not yet known to be stored). In the
        thread of a write batch (:meth:`hold_writes`) it stays cached until the landing that
        writes it (:meth:`write_held`): an import does not read back what it wrote before, and
        its commits would otherwise fill the cache (a 200 MB import: 200,000 of them)."""
        self._remember(oid, obj, stored=False)
        if self._held is not None and self._held_thread == threading.get_ident():
            self._held_cached.append(oid)

    def put_many(self, objs: Sequence[AnyObject]) -> list[ObjectId]:
        """Store several objects in one batch; return their ids in order.

        Raises:
            InvalidEntry: an object cannot be encoded (nothing is written).
            StorageError: the backend failed.
        """
        encode = self.codec.encode
        encoded = [encode(obj) for obj in objs]
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
        ``sync`` False, a record appended to this handle's log and the loose files written
        unsynced: the ref swap that names the batch then makes them durable with its intent
        (:meth:`journal`; format 3). In the thread of a write batch that holds this store's
        writes (:meth:`hold_writes`), the objects are kept in memory instead (readable here)
        and written by the batch's next landing, before any of its refs (returns 0).

        Raises:
            StorageError: the backend failed (the caller must not move a ref to the batch).
        """
        held = self._held
        if held is not None and self._held_thread == threading.get_ident():
            for oid, canonical in encoded:
                held[oid] = canonical
            return 0
        items: list[tuple[str, bytes, bytes | None]] = []
        for oid, canonical in encoded:
            self._keep_recent(oid, canonical)
            items.append((oid, canonical, None))
        return self._write_objects(items, sync)

    def hold_writes(self) -> None:
        """Keep what the calling thread writes with :meth:`put_encoded` in memory from now on
        (a write batch: every ref move of that thread is staged until the batch lands), to
        write it as a few records of one log append (one pack elsewhere) at the landing,
        :meth:`write_held`. Held objects read as stored ones do, from any thread
        (:meth:`get`, :meth:`knows`, :meth:`contains`). A second call, in the same thread,
        does nothing.

        Raises:
            CastoreError: another thread holds this store's writes already.
        """
        me = threading.get_ident()
        if self._held is not None:
            if self._held_thread != me:
                raise CastoreError("another thread's write batch holds this store's writes")
            return
        self._held_thread = me
        self._held = {}

    def write_held(self) -> int:
        """Write the held objects (:meth:`hold_writes`) as one unit, synced as an append's are
        (in format 3 by the next ref intent of this thread, else now), in records of about
        :data:`~castore.objectstore.repack.BLOCK_BYTES` each (a read of one object decodes
        one record, not the whole landing; in a local log while the repack is held, final
        blocks of :data:`~castore.objectstore.repack.FINAL_RECORD_BYTES` that the repack copies,
        read up to the zstd block that holds the object); go on holding. Returns the bytes written.

        Raises:
            StorageError: the backend failed; the objects stay held (no ref may land on them).
        """
        held, cached = self._held, self._held_cached
        if not held:
            return 0
        n = self._write_objects([(oid, c, None) for oid, c in held.items()], sync=not self.defers_refs,
                                most=BLOCK_BYTES)
        held.clear()
        cache, self._held_cached = self._cache, []
        for oid in cached:
            cache.pop(oid, None)
        return n

    def release_writes(self, keep: bool = True) -> None:
        """End :meth:`hold_writes`: the held objects are written first (:meth:`write_held`),
        or, with ``keep`` False (a batch dropped what it staged), forgotten.

        Raises:
            StorageError: as :meth:`write_held` (the store stops holding regardless).
        """
        if self._held is None:
            return
        try:
            if keep:
                self.write_held()
        finally:
            self._held = None
            self._held_cached = []

    def _held_stored(self, oid: str) -> bytes | None:
        """A held object's bytes as a read of the stored frame gives them (raw), or None."""
        held = self._held
        c = held.get(oid) if held else None
        return None if c is None else self.codec.to_stored(c, False, oid)

    def _packed(self, canonical: bytes) -> bool:
        """Whether an object goes into a pack record (format 2) rather than a loose file."""
        n = len(canonical)
        return self.format >= 2 and (n <= LOOSE_MIN or (n <= PATH_OBJECT_MAX and o.is_path_object(canonical)))

    def _write_objects(self, items: Sequence[tuple[str, bytes, bytes | None]], sync: bool = True,
                       most: int | None = None) -> int:
        """Write ``(id, canonical bytes, stored frame or None)`` triples: loose or packed by
        the format (``most``: the packed ones in records of about that many bytes); return
        the bytes written."""
        loose: dict[str, bytes] = {}
        small: list[tuple[str, bytes]] = []
        loose_ids: list[str] = []
        codec = self.codec
        for oid, canonical, frame in items:
            if self._packed(canonical):
                small.append((oid, canonical))
                continue
            loose_ids.append(oid)
            if frame is None or (codec.cipher is not None and not o.is_sealed(frame)):
                loose[object_key(oid)] = codec.to_stored(canonical, self.compress, oid)
            else:
                loose[object_key(oid)] = frame
        if loose:
            if sync or not self.defers_refs or not self.storage.write_unsynced(loose):
                self.storage.write_many(loose)
            else:  # made durable by the intent of the swap that names them, as the record is
                self.writer_log.note_unsynced(list(loose))
        written = sum(len(f) for f in loose.values())
        if small:
            written += self.writer_log.append(small, sync, most)
        # (a packed object is found by the pack map: only loose ones are kept here)
        self._known.update(loose_ids)
        return written

    def written_packs(self) -> list[str]:
        """The packs this handle wrote into since the last call (for a ref's read hint)."""
        return self.writer_log.written_packs()

    def put_stored(self, items: dict[str, bytes]) -> None:
        """Store raw stored bytes by id, as read from another store (sync). Verifies each.

        Raises:
            IntegrityError: some bytes do not hash to their id.
            StorageError: the backend failed.
        """
        todo: list[tuple[str, bytes, bytes | None]] = []
        for oid, stored in items.items():
            canonical = self.codec.from_stored(oid, stored)
            if stored[:1] == b"\x00" and self.compress:
                stored = self.codec.to_stored(canonical, oid=oid)  # read raw from a version-2 pack: compress it loose
            todo.append((oid, canonical, stored))
        self._write_objects(todo)

    def knows(self, oid: str) -> bool:
        """Whether ``oid`` can be read without looking for it: decoded, held, or mapped to a
        pack (no I/O; a loose object is not "known" until read)."""
        return oid in self._cache or oid in self._canonical or self.packmap.mapped(oid) \
            or bool(self._held and oid in self._held)

    def _checked(self, oid: str, stored: bytes) -> tuple[bytes, bytes]:
        """``(stored, canonical)``: the codec's ``from_stored``, except that bytes failing their
        id through an index not yet checked get that index checked first: a damaged index is
        dropped, its pack scanned, and the object read again.

        Raises:
            IntegrityError: the stored bytes are corrupt.
            ObjectNotFound: the object was only where the damaged index said.
        """
        try:
            return stored, self.codec.from_stored(oid, stored)
        except SealedFrameError:
            raise
        except IntegrityError as e:
            if not self.packmap.recheck_object(oid):
                raise self.packmap.damage(oid, e.reason) or e from None
        again = self._stored(oid)
        if again is None:
            raise self.missing_error(oid)
        try:
            return again, self.codec.from_stored(oid, again)
        except SealedFrameError:
            raise
        except IntegrityError as e:
            raise self.packmap.damage(oid, e.reason) or e from None

    def missing_error(self, oid: str) -> Exception:
        """What to raise for an object found nowhere readable (what a reader that took it with
        ``missing_ok`` raises when it has no other way to it): :class:`DamagedPack` when its
        pack record is damaged, :class:`SealedFrameError` naming ``oid`` when this store's
        sealed records do not open (a wrong key), else :class:`ObjectNotFound` (naming the first
        damaged record this handle knows, which may have held it, and `castore fsck`). Raises nothing."""
        damaged = self.packmap.damage(oid)
        if damaged is not None:
            return damaged
        failed = self.packmap.wrong_key()
        if failed is not None:
            return SealedFrameError(oid, f"not in any record that opens; {failed.reason}")
        records = self.packmap.known_damage()
        if not records:
            return ObjectNotFound(oid)
        name, offset, size = records[0]
        more = f", and {len(records) - 1} more" if len(records) > 1 else ""
        if not size:
            return ObjectNotFound(oid, f"{pack_key(name)} is cut short at offset {offset} (its bytes are not those "
                                       f"it was named for{more}), and what was past its end may have held it: "
                                       "`castore fsck` lists what is damaged")
        return ObjectNotFound(oid, f"a damaged record ({pack_key(name)} at offset {offset}{more}) may have "
                                   "held it: `castore fsck` lists what is damaged")

    def _stored(self, oid: str) -> bytes | None:
        """The stored frame of ``oid`` wherever it is (held, pack or loose), or None; not verified."""
        got = self._held_stored(oid) if self._held else None
        if got is not None:
            return got
        got = self.packmap.read_packed(oid, True)
        if got is not None:
            return got
        try:
            return self.storage.read(object_key(oid))
        except FileNotFoundError:
            pass
        if self.packmap.refresh((oid,)) or self.packmap.locate(oid) is not None:
            got = self.packmap.read_packed(oid, True)
            if got is not None:
                return got
        # a miss is trusted only once every index searched has passed its check
        return self.packmap.read_packed(oid, True) if self.packmap.recheck() else None

    def _stored_many(self, oids: Sequence[str]) -> dict[str, bytes | None]:
        """Stored frames of several objects (None where missing): packed ones a pack or a
        record at a time, loose ones in one batch."""
        out: dict[str, bytes | None] = {}
        if self._held:
            held = [oid for oid in oids if oid in self._held]
            if held:
                for oid in held:
                    out[oid] = self._held_stored(oid)
                oids = [oid for oid in oids if oid not in out]
        alone = len(oids) == 1
        self.packmap.prefetch(oids)
        loose = []
        for oid in oids:
            got = self.packmap.read_packed(oid, alone)
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
            if missing and (self.packmap.refresh(missing) or any(self.packmap.locate(m) is not None for m in missing)):
                for oid in missing:
                    out[oid] = self.packmap.read_packed(oid, alone)
            # a miss is trusted only once every index searched has passed its check
            if any(out[m] is None for m in missing) and self.packmap.recheck():
                for oid in missing:
                    if out[oid] is None:
                        out[oid] = self.packmap.read_packed(oid, alone)
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

    def decoded(self, oid: str) -> AnyObject | None:
        """The object ``oid`` if it is decoded already (in the cache), else None: no I/O,
        for a reader that takes another way to what is not. Raises nothing."""
        return self._cache.get(oid)

    def keep_decoded(self, objs: Mapping[str, AnyObject], biggest: int = 0) -> None:
        """Keep objects a caller decoded from stored bytes it hashed for their ids (what
        :meth:`iter_tagged` gives) in the cache of decoded objects, as if this handle had read
        them, within the cache's bound: they then live as long as this handle, and one asked
        for costs no read. ``biggest``: the size of the largest one's canonical bytes; past
        :data:`CACHE_MAX_OBJECT`, none of them is kept (memory stays bounded; they are read
        again when needed). Raises nothing."""
        if biggest > CACHE_MAX_OBJECT:
            return
        self._known.update(objs)
        self._cache.update(objs)
        self._trim_cache()

    def load_all(self, cls: type[AnyObject], budget: int = CACHE_SIZE * 3 // 4) -> int:
        """Decode every stored object of class ``cls`` (every :class:`~castore.objects.Commit`,
        say), store-wide, in one pass over what is stored (:meth:`iter_tagged`: each pack
        read whole, each record decompressed once), into the cache of decoded objects, up to
        ``budget`` of them (within the cache's bound); returns how many it decoded. What a
        reader of most of a store's paths may call first: reading them then costs no lookup
        and no read per object (100,000 commits in half a second, where reading them one by
        one took two).
        The objects are told by their kind tag without decoding the others; each id is the
        hash of the bytes found (nothing is taken on trust, as in
        :meth:`adopt_canonical_many`); bytes that do not decode are left out (``fsck``
        reports them).

        Raises:
            StorageError: the backend failed.
        """
        loaded = 0
        with gc_paused():
            for raws in self.iter_tagged(cls):
                raws = raws[:budget - loaded]
                try:
                    loaded += len(self.adopt_canonical_many(raws))
                except IntegrityError:  # one does not decode: the others one by one
                    for raw in raws:
                        try:
                            self.adopt_canonical_many([raw])
                            loaded += 1
                        except IntegrityError:
                            continue
                if loaded >= budget:
                    break
        return loaded

    def iter_tagged(self, cls: type[AnyObject], part: tuple[int, int, int] | None = None,
                    keep: bool = True) -> Iterator[list[bytes]]:
        """The canonical bytes of every stored object of class ``cls``, store-wide, in one pass
        over what is stored (:meth:`iter_contents`), a list per record (or loose object) that
        holds any: told by their kind tag (:func:`castore.objects.kind_tag_bytes`), neither
        hashed nor decoded (a caller that needs an id hashes the bytes, :attr:`codec`'s
        ``digest_many``: nothing is taken on trust). What :meth:`load_all` decodes, and what a
        reader of every commit that keeps them itself (``castore usage``'s first run) reads.
        ``part``: only some shares of what is stored, and ``keep=False``: nothing kept for a
        later read (:meth:`iter_contents`).

        Raises:
            ValueError: ``part`` is not ``(start, stop, n)`` (:meth:`iter_contents`).
            StorageError: the backend failed.
        """
        tag, t0, t1 = o.kind_tag_bytes(cls), o.TAG_START, o.TAG_END
        for content, is_record in self.iter_contents(part=part, keep=keep):
            if is_record:
                raws = packs.tagged_objects(content, tag, t0, t1) or []
            else:
                raws = [content] if content[t0:t1] == tag else []
            if raws:
                yield raws

    def get(self, oid: str) -> AnyObject:
        """Read, verify and decode one object.

        Raises:
            ObjectNotFound: no object has this id.
            DamagedPack: (an IntegrityError) its pack record is damaged: the message names
                the pack file and the record.
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
                raise self.missing_error(oid)
            canonical = self._checked(oid, stored)[1]
        obj = o.decode(oid, canonical)
        self._remember(oid, obj, size=len(canonical))
        return obj

    def get_many(self, oids: Iterable[str], missing_ok: bool = False) -> dict[str, AnyObject]:
        """Read several objects in one concurrent batch.

        Raises:
            ObjectNotFound: one is missing (unless ``missing_ok``: then it is left out).
            DamagedPack: one is in a damaged pack record (unless ``missing_ok``: then it is
                left out too, for a caller that has another way to it, a copy in another
                store or a segment).
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
                    if missing_ok and self.packmap.wrong_key() is None:
                        continue
                    raise self.missing_error(oid)
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
            c = self._recent.get(oid) or self._canonical.get(oid) or (self._held.get(oid) if self._held else None)
            if c is not None:
                out[oid] = c
            else:
                todo.append(oid)
        if todo:
            for oid, stored in self.get_stored_many(todo).items():
                out[oid] = self.codec.from_stored(oid, stored)
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
            ids = self.codec.digest_many(canonicals)
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
        oid = self.codec.digest(canonical)
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
            raise self.missing_error(oid)
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
                raise self.missing_error(oid)
            out[oid] = self._checked(oid, stored)[0]
        return out

    def damage(self, oid: str, why: str | None = None) -> DamagedPack | None:
        """The :class:`DamagedPack` error of ``oid`` when its pack record was found damaged
        (a read found it does not decompress or open), or, given ``why`` (a caller's reason
        the bytes read are wrong), the record it is in; None when ``oid`` is not packed or
        no damage was met (:meth:`PackMap.damage
        <castore.objectstore.packmap.PackMap.damage>`). What fsck reports. Raises nothing."""
        return self.packmap.damage(oid, why)

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
            if stored is None or not self.packmap.unchecked(oid):
                continue
            try:
                self.codec.from_stored(oid, stored)
            except IntegrityError:
                if self.packmap.recheck_object(oid):
                    got[oid] = self._stored(oid)
        return got

    def contains(self, oid: str) -> bool:
        """Whether the object is stored (not verified).

        Raises:
            StorageError: the backend failed.
        """
        if oid in self._known or (self._held and oid in self._held) or self.packmap.locate(oid) is not None \
                or self.storage.exists(object_key(oid)):
            return True
        self.packmap.refresh((oid,))
        return self.packmap.locate(oid) is not None or (self.packmap.recheck() and self.packmap.locate(oid) is not None)

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
        self.packmap.refresh()
        for key in self.packmap.packed_ids():
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
        self.packmap.refresh()
        found.update(x for x in self.packmap.packed_ids() if x.startswith(p))
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
    def iter_contents(self, batch: int = 8, part: tuple[int, int, int] | None = None,
                      keep: bool = True) -> Iterator[tuple[bytes, bool]]:
        """Every stored object's canonical bytes, store-wide, each stored unit read once (what
        a search of every object reads): first the loose objects, then each pack record, the
        packs read whole, ``batch`` packs per concurrent read. Yields ``(bytes, is_record)``:
        a version-2 record's decompressed content (``is_record``: its objects are found with
        :func:`castore.objectstore.packs.content_spans`; it is also kept in the content cache, so that
        reading its objects again costs no I/O, as are the pack's bytes), or one object's
        canonical bytes (a loose object, a version-1 frame). Objects are not
        verified here: an object's id is the hash of its bytes, which a caller that needs the
        id computes. A damaged loose object or record is skipped (``fsck`` reports it).
        ``part``: ``(start, stop, n)``, only the shares ``start`` to ``stop - 1`` of ``n`` (the
        loose objects are share 0's, the pack records are dealt as
        :meth:`PackMap.iter_pack_contents` deals them): processes that take the ``n`` shares
        between them read every unit once. ``keep=False``: nothing read is kept for a later
        read (:meth:`PackMap.iter_pack_contents`).

        Raises:
            ValueError: ``part`` is not of that form (on the first item asked for).
            StorageError: the backend failed.
        """
        check_part(part)
        loose = list(self.iter_loose_ids()) if part is None or part[0] == 0 else []
        for i in range(0, len(loose), 256):
            got = self.storage.read_many([object_key(oid) for oid in loose[i:i + 256]])
            for oid in loose[i:i + 256]:
                raw = got.get(object_key(oid))
                if raw is None:
                    continue  # collected since the listing
                try:
                    canonical = self.codec.unframe(raw, oid=oid)
                except IntegrityError:
                    continue
                yield canonical, False
        yield from self.packmap.iter_pack_contents(batch, part, keep)

    def write_pack(self, frames: Sequence[tuple[str, bytes]], born: Mapping[str, float] | None = None) -> str:
        """Write stored frames as one new sealed pack (version 2, in the order given, in
        compressed blocks) with its index (gc); return its name. Each frame is verified;
        ``born`` gives when objects were first written (the pack's ages; docs/FORMAT.md, 8).

        Raises:
            IntegrityError: a frame does not hash to its id (nothing is written).
            StorageError: the backend failed.
        """
        return self.repacker.write_pack(frames, born)

    def delete_pack(self, name: str, cutoff: float | None = None) -> bool:
        """Delete a pack and its index (repack and gc only); with ``cutoff``, only if the pack
        was last written before that POSIX time (:meth:`Repacker.delete_pack
        <castore.objectstore.repack.Repacker.delete_pack>`). True if deleted.

        Raises:
            StorageError: the backend failed.
        """
        return self.repacker.delete_pack(name, cutoff)

    def delete_packs(self, names: Sequence[str]) -> None:
        """Delete packs and their indexes (repack) in batched deletes, every index first
        (:meth:`Repacker.delete_packs <castore.objectstore.repack.Repacker.delete_packs>`).

        Raises:
            DeleteIncomplete: the backend failed part-way; ``remaining`` names the keys that
                may still be stored (the packs it names are still whole).
        """
        self.repacker.delete_packs(names)

    # -- the pack map, for readers with a hint, repack, gc and fsck ----------------------
    def refresh(self, need: Sequence[str] = ()) -> bool:
        """Bring the pack map up to date with ``packs/``; True when something new was found
        (:meth:`PackMap.refresh <castore.objectstore.packmap.PackMap.refresh>`: with ``need``,
        another writer's live log is scanned only if the indexes lack those ids).

        Raises:
            StorageError: the backend failed.
        """
        return self.packmap.refresh(need)

    def load_packs(self, names: Sequence[str]) -> bool:
        """Load the frames of the named packs without listing ``packs/`` (for a reader that
        knows them, e.g. from a ref's read hint); unknown or missing names are skipped.
        True when something new was found.

        Raises:
            StorageError: the backend failed.
        """
        return self.packmap.load_packs(names)

    def pack_names(self) -> list[str]:
        """Every pack in the store (after a refresh).

        Raises:
            StorageError: the backend failed.
        """
        return self.packmap.pack_names()

    def pack_contents(self, name: str) -> dict[str, Place]:
        """The objects of one pack as this handle knows them, in the order they were written
        (call :meth:`refresh` first)."""
        return self.packmap.pack_contents(name)

    def damaged_records(self) -> list[tuple[str, int, int]]:
        """``(pack, offset, bytes)`` of every damaged record (after a refresh; :meth:`PackMap.damaged_records
        <castore.objectstore.packmap.PackMap.damaged_records>`: what the scans of unindexed packs
        skipped, what reads found, and the damaged ref intents at the tails of other writers' logs).

        Raises:
            StorageError: the backend failed.
        """
        return self.packmap.damaged_records()

    def damage_text(self, pack: str, offset: int, size: int) -> str:
        """What one damaged record of :meth:`damaged_records` is, for a message
        (:meth:`PackMap.damage_text <castore.objectstore.packmap.PackMap.damage_text>`). Raises nothing."""
        return self.packmap.damage_text(pack, offset, size)

    def pack_bytes(self, name: str) -> int:
        """The size of a pack as this handle knows it (0 if unknown)."""
        return self.packmap.pack_bytes(name)

    def pack_info(self, name: str) -> tuple[float | None, bool, bool]:
        """``(mtime, sealed, held)`` of a pack: when it last changed, whether it has an index
        or cannot grow, and whether a live writer still appends to it.

        Raises:
            StorageError: the backend failed.
        """
        return self.packmap.pack_info(name)

    def pack_ages(self, name: str) -> Ages | None:
        """When the objects of a repacked pack were first written (:class:`~castore.objectstore.
        repack.Ages`; docs/FORMAT.md, 8), or None when the pack has no ages (its own time stands).

        Raises:
            StorageError: the backend failed.
        """
        if not name.startswith("r-"):
            return None
        return parse_ages(self.storage.read_many([age_key(name)]).get(age_key(name)))

    def read_frame(self, name: str, loc: Place) -> bytes:
        """One stored frame of a pack at ``loc``, not verified
        (:meth:`PackMap.read_frame <castore.objectstore.packmap.PackMap.read_frame>`).

        Raises:
            FileNotFoundError: the pack is gone.
            IntegrityError, StorageError: the record or the backend failed.
        """
        return self.packmap.read_frame(name, loc)

    # -- repack ------------------------------------------------------------------------
    def repack(self, all_packs: bool = False, loose: bool = True, idle: float = 60.0) -> RepackReport:
        """Merge packs and small loose objects into one new pack, then delete what was merged.

        The packs are :meth:`Repacker.choose <castore.objectstore.repack.Repacker.choose>`'s;
        with ``loose``, every loose object small enough to be packed (:data:`LOOSE_MIN`, or a
        path object up to :data:`PATH_OBJECT_MAX`) joins them, its age going with it. The new
        pack keeps the objects' write order in compressed blocks; every merged object is in it
        before its old copy is deleted, so a kill at any point loses nothing.

        Raises:
            IntegrityError: a merged object is corrupt (nothing is deleted).
            StorageError: the backend failed.
        """
        chosen = self.repacker.choose(all_packs, idle)
        extra: list[tuple[str, bytes]] = []
        loose_moved: list[str] = []
        if loose:
            ids = list(self.iter_loose_ids())
            for i in range(0, len(ids), _REPACK_BATCH):
                for oid, stored in self.read_stored_many(ids[i:i + _REPACK_BATCH]).items():
                    if stored is None:
                        continue
                    canonical = self.codec.from_stored(oid, stored)
                    if len(canonical) <= LOOSE_MIN or (len(canonical) <= PATH_OBJECT_MAX
                                                       and o.is_path_object(canonical)):
                        extra.append((oid, canonical))
                        loose_moved.append(oid)
        # a loose object's age goes with it into the pack (gc's grace runs from its first write)
        born = {oid: t for oid in loose_moved if (t := self.mtime(oid)) is not None}
        out = RepackReport()
        if not loose_moved and (not chosen or (len(chosen) == 1 and chosen[0].startswith("r-"))):
            return out  # nothing to merge
        before = {n: self.pack_contents(n) for n in chosen}
        out.new_pack = self.merge_packs(chosen, extra, extra_born=born)
        if out.new_pack is None:
            return out
        out.objects = len(self.pack_contents(out.new_pack))
        out.bytes_written = self.pack_bytes(out.new_pack)
        self.delete_many(loose_moved)
        out.packs_merged = [n for n in chosen if n != out.new_pack and before[n] and not self.pack_contents(n)]
        out.loose_packed = len(loose_moved)
        return out

    def merge_packs(self, names: Iterable[str], extra: Sequence[tuple[str, bytes]] = (),
                    by_mtime: bool = True, extra_born: Mapping[str, float] | None = None) -> str | None:
        """Merge packs, and ``extra`` ``(id, canonical bytes)`` objects, into one new pack with
        its index, then delete the merged packs; return its name, or None when there was
        nothing to merge (:meth:`Repacker.merge_packs
        <castore.objectstore.repack.Repacker.merge_packs>`; docs/FORMAT.md, 8).

        Raises:
            IntegrityError: an object does not hash to its id (nothing is deleted).
            StorageError: the backend failed.
        """
        return self.repacker.merge_packs(names, extra, by_mtime, extra_born=extra_born)

    def auto_repack_once(self, max_bytes: int = AUTO_REPACK_MAX_BYTES) -> str | None:
        """One bounded geometric repack of the sealed packs, what a writer runs in the
        background (:meth:`Repacker.auto_repack_once
        <castore.objectstore.repack.Repacker.auto_repack_once>`); the new pack's name, or None.

        Raises:
            IntegrityError, StorageError (see :meth:`merge_packs`).
        """
        return self.repacker.auto_repack_once(max_bytes)

    def wait_repack(self) -> None:
        """Wait for this handle's background repack, if one is running (with the run it owes
        for appends made while it ran)."""
        self.repacker.wait()

    def live_packs(self, names: Sequence[str]) -> list[str]:
        """``names`` (oldest first) with each pack that a repack by this handle merged
        replaced by the pack it went into, each name once: what a read hint should name
        after a background repack (docs/FORMAT.md, 6 and 8)."""
        return self.repacker.live_packs(names)

    # -- format 3: ref intents in the writer's log (docs/FORMAT.md, 12) ----------------
    @property
    def defers_refs(self) -> bool:
        """Whether ref swaps may be journaled in this handle's log (format 3, durable storage
        that can append): then an append's objects record is not synced on its own."""
        return self.writer_log.defers_refs

    def journal(self, intent: RefIntent) -> bool:
        """Journal a ref swap's intent in this handle's log and sync it; True if done, False
        when this handle has no open log (:meth:`WriterLog.journal
        <castore.objectstore.packlog.WriterLog.journal>`). :meth:`settle` follows the swap.

        Raises:
            StorageError: the log cannot be written, or this thread's objects record went
                into a log that failed before it was synced (the swap must not land).
        """
        return self.writer_log.journal_many((intent,))

    def journal_many(self, intents: Sequence[RefIntent]) -> bool:
        """:meth:`journal` for the intents of one :meth:`~castore.storage.Storage.swap_many`,
        appended with one write and synced once.

        Raises:
            StorageError: as :meth:`journal` (none of the swaps may land).
        """
        return self.writer_log.journal_many(intents)

    def settle(self) -> None:
        """The ref swap that called :meth:`journal` in this thread is over (landed or not)."""
        self.writer_log.settle()

    def log_intents(self, boot: str) -> list[RefIntent]:
        """The ref intents of ``boot`` in every log without an index (what a recovery after a
        power loss replays).

        Raises:
            StorageError: the backend failed.
        """
        return self.writer_log.log_intents(boot)

    # -- sync: frames in bulk ------------------------------------------------------------
    def read_stored_packed(self, oids: Sequence[str]) -> dict[str, bytes]:
        """Stored bytes of several objects (for sync), read as :meth:`read_stored_many` reads
        them (a pack at a time where it holds several); not verified here:
        :meth:`put_stored_packed` verifies each on the receiving side. In an encrypted store
        every one is sealed, as it would be stored loose (a packed object's bytes leave sealed
        to its id: only a store with the same codec can take them).

        Raises:
            ObjectNotFound: one of them is not stored.
            IntegrityError: (encrypted store) a packed object's bytes do not hash to its id.
            StorageError: the backend failed.
        """
        out: dict[str, bytes] = {}
        codec = self.codec
        for oid, stored in self._stored_many_rechecked(list(dict.fromkeys(oids))).items():
            if stored is None:
                raise self.missing_error(oid)
            if codec.cipher is not None and not o.is_sealed(stored):
                stored = codec.to_stored(codec.from_stored(oid, stored), self.compress, oid)
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
        from_stored = self.codec.from_stored
        triples = [(oid, from_stored(oid, stored), stored) for oid, stored in items.items()]
        packed = sum(1 for _, canonical, _ in triples if self._packed(canonical))
        self._write_objects(triples)
        return packed, len(triples) - packed


__all__ = ["ObjectStore", "object_key", "pack_key", "index_key", "PACKS", "packs", "IntegrityError", "LOOSE_MIN",
           "gc_paused"]
