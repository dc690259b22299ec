"""Repack: merge small packs into one pack of compressed blocks (docs/FORMAT.md, 8).

A writer's small packs (a local writer's sealed logs, an object-store writer's batch packs,
one per append) are compressed record by record. A *repack* reads a set of packs (and,
from ``castore repack``, small loose objects), writes every object they hold, once, in
write order, as one new version-2 pack of zstd blocks (each laid out by kind inside:
:func:`castore.objectstore.packs.block_layout`) with its index, and only then
deletes the packs it merged: a kill at any point leaves the objects in the old packs, or
in the old and the new, never in neither. Which packs to merge follows git's
``repack --geometric=2`` (:func:`geometric`), so each byte is rewritten O(log n) times
and the packs a reader lists stay O(log n).

:class:`Repacker` is the part of :class:`~castore.objectstore.ObjectStore` that does it,
handed the storage and the pack map (:class:`~castore.objectstore.packmap.PackMap`, whose
lock it takes): the merge (:meth:`~Repacker.merge_packs`, also what ``castore repack``
calls), the writes and deletions of whole packs for repack and gc, and the background
repack of normal writes (:meth:`~Repacker.auto_repack_once`, run in a thread of the handle,
like git's ``gc --auto`` or Delta Lake's checkpoint), which the writer's log starts. It keeps
what this handle wrote (:meth:`~Repacker.note_written`): a merge on object storage takes
only those packs, in their write order.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import objects as o
from ..errors import IntegrityError, StorageError
from ..gcpause import gc_paused
from ..storage import DeleteIncomplete, Storage
from . import packindex, packs, refintents
from .packmap import PackMap, damaged_intent_tail
from .packs import PACKS, Slot, index_key, pack_key

#: repack writes blocks of about this many content bytes, each one zstd frame at BLOCK_LEVEL
BLOCK_BYTES = 256 << 10
BLOCK_LEVEL = 9
#: repack writes a path's indexes (each lists every segment of its path, so one at depth 100,000
#: is 53 KB of ids, and each copies the one before it) in blocks of their own of at most this
#: many content bytes: in a block of entries each block's first index is a literal copy (a store
#: written 500 entries per append grew by 45% when its blocks held 256 KiB, not 1 MiB), and a
#: block of indexes, copies of copies, decompresses at about memcpy's speed (0.03 ms per MiB,
#: where a block of entries takes 0.15 ms per 480 KB); a fresh reader of a path's end reads one
INDEX_BLOCK_BYTES = 2 * BLOCK_BYTES
#: a write batch's landing writes its objects as final blocks of about this many content bytes
#: (:meth:`Repacker.note_written`), which the repack after the batch copies as they are: the
#: size of the blocks repack makes (:data:`BLOCK_BYTES` up to the end of a run, at most 4x)
FINAL_RECORD_BYTES = 4 * BLOCK_BYTES
#: the zstd level of those blocks: on a Claude Code import's blocks level 9 took 3.7x the CPU
#: of level 3 (139 against 38 ms per 28.7 MB of content) for a pack 3.5% smaller (3.22 against
#: 3.34 MB), a twentieth of the import's CPU; decoding is as fast. A later repack that merges
#: the pack (another handle's) lays these blocks out again at :data:`BLOCK_LEVEL`
LANDING_LEVEL = 3
#: the plain zstd level of a log's records while a write batch holds the repack (:meth:`Repacker.
#: hold`): the repack that follows the batch compresses them again into blocks, so a record's
#: own compression only has to keep the log small until then (a quarter of the dictionary
#: codec's time per record, about 5% larger)
HELD_RECORD_LEVEL = 1
#: background repack: an S3 (no-append) writer runs one after this many batch packs
AUTO_REPACK_BATCHES = 16
#: background repack reads at most this many bytes of packs per run (the rest waits its turn)
AUTO_REPACK_MAX_BYTES = 256 << 20
#: a local writer's close runs one :meth:`Repacker.auto_repack_once` in the foreground when
#: the sealed packs its handle knows hold more than this many that the run would merge
#: (git's ``gc.autoPackLimit``): a process per turn seals no log past SEAL_BYTES, which is
#: what starts the background run, and left one pack per turn that nothing merged
AUTO_PACK_LIMIT = 8
#: that run, in the closing thread (the caller waits for it), reads at most this many bytes of
#: packs: the small packs of single turns, never a backlog of large ones (a close that merged
#: 21 MB took 2.4 s), which the background run of a writer or ``castore repack`` takes
CLOSE_REPACK_MAX_BYTES = 4 << 20
#: the suffix of a repacked pack's ages (docs/FORMAT.md, 8): when its records' objects were
#: first written, which gc reads in place of the pack's own, younger, time
AGE_SUFFIX = ".age"


def age_key(name: str) -> str:
    """The storage key of the ages of pack ``name``."""
    return f"{PACKS}/{name}{AGE_SUFFIX}"


#: an object written this much before the latest of its record gets its own entry in the ages
AGE_SLACK = 60.0


class Ages:
    """A repacked pack's ages: when the objects of each record were first written (the
    latest of them), and the objects written over :data:`AGE_SLACK` seconds before the
    latest of their record (a record mixing a young object with old ones)."""

    def __init__(self, records: dict[int, float], objects: dict[str, float]) -> None:
        self.records = records
        self.objects = objects

    def of(self, oid: str, offset: int) -> float | None:
        """When object ``oid`` of the record at ``offset`` was first written, if known."""
        t = self.objects.get(oid)
        return t if t is not None else self.records.get(offset)


def parse_ages(data: bytes | None) -> Ages | None:
    """A pack's ages file, or None when there is none or it does not parse (then the pack's
    own time stands: younger, never older)."""
    if data is None:
        return None
    try:
        got = json.loads(data)
        return Ages({int(off): float(t) for off, t in got["born"]},
                    {str(k): float(t) for k, t in got.get("objects", {}).items()})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None



@dataclass
class RepackReport:
    """What a repack (``castore repack``, :meth:`castore.objectstore.ObjectStore.repack`) merged."""

    packs_merged: list[str] = field(default_factory=list)
    loose_packed: int = 0
    objects: int = 0
    new_pack: str | None = None
    bytes_written: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        return {"packs_merged": list(self.packs_merged), "loose_packed": self.loose_packed,
                "objects": self.objects, "new_pack": self.new_pack, "bytes_written": self.bytes_written}


class Repacker:
    """Merging packs, in the foreground or in a background thread of an object store, and
    writing and deleting whole packs (repack, gc)."""

    def __init__(self, storage: Storage, packmap: PackMap, auto: bool = True) -> None:
        self.storage = storage
        self.packmap = packmap
        #: merge small packs in a background thread when a log is sealed or after
        #: AUTO_REPACK_BATCHES batch packs (docs/FORMAT.md, 8)
        self.auto = auto
        #: merge only the packs this handle wrote in the background, also on local disk
        #: (:meth:`auto_repack_once`; on object storage always)
        self.own_only = False
        #: the last error a background repack met, if any (it never fails an append)
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._again = False
        self._held = 0  # hold() calls not released
        self._owed = False  # a run was asked for while held
        # all under packmap.lock:
        self._seq: dict[str, int] = {}  # packs this handle wrote -> the order it wrote them in
        self._own: OrderedDict[str, list[tuple[str, bytes]]] = OrderedDict()  # its batch packs' objects
        # when this handle wrote each of its batch packs: their age, without a HEAD on object storage
        self._own_written: dict[str, float] = {}
        self._sizes: dict[str, int] = {}  # sealed packs' sizes read from their indexes (they never change)
        self._moved: OrderedDict[str, str] = OrderedDict()  # pack merged by this handle -> the pack it went into
        # the records of its logs this handle wrote as final blocks (a write batch's landings),
        # by payload offset: a merge copies them as they are
        self._final: dict[str, set[int]] = {}

    def note_written(self, name: str, objects: Sequence[tuple[str, bytes]] | None = None,
                     final: Mapping[str, packs.Slot] | None = None) -> None:
        """Record that this handle wrote into pack ``name`` (its log, or with ``objects`` a
        batch pack holding them: a background repack merges it without reading it back).
        ``final``: where the objects of records just appended to the log are, records in
        the final block layout (:func:`~castore.objectstore.packs.block_layout`, at
        :data:`BLOCK_LEVEL`) that a merge copies as they are, neither decompressed nor
        hashed again (this handle computed their ids from the bytes it compressed)."""
        with self.packmap.lock:
            self._seq.setdefault(name, len(self._seq))
            if final:
                self._final.setdefault(name, set()).update(slot.offset for slot in final.values())
            if objects is not None:
                self._own[name] = list(objects)
                self._own_written[name] = time.time()
                while len(self._own) > 4 * AUTO_REPACK_BATCHES:
                    self._own_written.pop(self._own.popitem(last=False)[0], None)

    def choose(self, all_packs: bool, idle: float) -> list[str]:
        """The packs ``castore repack`` merges: those the geometric rule picks plus every
        sealed log and batch pack (every sealed pack with ``all_packs``), and the logs no
        writer holds that have not grown for ``idle`` seconds (a writer that died).

        Raises:
            StorageError: the backend failed.
        """
        now = time.time()
        sealed_sizes: list[tuple[str, int]] = []
        chosen: list[str] = []
        for name in self.packmap.pack_names():
            mtime, sealed, held = self.packmap.pack_info(name)
            if held:
                continue
            if not sealed and name.startswith("w-"):
                if mtime is not None and now - mtime > idle:
                    chosen.append(name)
                continue
            sealed_sizes.append((name, self.packmap.pack_bytes(name)))
        if all_packs:
            chosen += [n for n, _ in sealed_sizes]
        else:
            # logs and batch packs were compressed record by record: always worth a block rewrite
            chosen += geometric(sealed_sizes + [(n, 0) for n in chosen])
            chosen += [n for n, _ in sealed_sizes if not n.startswith("r-")]
        return sorted(set(chosen))

    def merge_packs(self, names: Iterable[str], extra: Sequence[tuple[str, bytes]] = (),
                    by_mtime: bool = True,
                    held: Mapping[str, Sequence[Sequence[tuple[str, bytes]]]] | None = None,
                    extra_born: Mapping[str, float] | None = None) -> str | None:
        """Merge packs, and ``extra`` ``(id, canonical bytes)`` objects, into one new pack with
        its index, then delete the merged packs (repack; docs/FORMAT.md, 8). Objects keep their
        write order (oldest pack first, record by record) and are compressed in blocks of about
        :data:`BLOCK_BYTES`, so that neighbours (a segment and the commits it copies, one
        message and the next) share their bytes; inside a block they are laid out by kind
        (commits and trees first: :func:`castore.objectstore.packs.block_layout`), an append of
        many entries cut after its segments (:func:`~castore.objectstore.packs.write_runs`), the
        paths' indexes in blocks of their own (:data:`INDEX_BLOCK_BYTES`). Every object is
        verified on the way, except in the records of a log this handle wrote as final blocks
        (:meth:`note_written`): those are copied as they are once their record's check holds.

        Safe against a concurrent repack or gc: a pack gone meanwhile is skipped (whoever
        deleted it had first written its objects into another pack), and a pack is deleted only
        after the new one is durable, so a kill at any point loses nothing. A pack with a damaged
        record, or a sealed one whose bytes stop short of its end or of the size its index
        gives, is left alone with its index (fsck names it). Returns the new pack's name, or None
        when there was nothing to merge. Without ``by_mtime`` (an object store, where an age
        costs a HEAD), packs this handle wrote keep their order and the others come first.
        ``held`` gives the objects of some of the packs, as groups in write order, that the
        caller has in memory (its own log at close): those are not read back, and the caller
        has synced the refs of their intents. ``extra_born`` gives when some of ``extra`` were
        written (else: now). The new pack's ages file keeps when each merged record's objects
        were first written (docs/FORMAT.md, 8), so that gc's grace period runs from then.

        Raises:
            IntegrityError: an object does not hash to its id (nothing is deleted).
            StorageError: the backend failed.
        """
        # the collector paused (gc_paused): a merge makes a place per object and keeps them
        # all until the pack is written, none in a cycle; after an import (the repack it held
        # runs once, at the end) each of its bursts walked everything the import left alive
        with gc_paused():
            return self._merge_packs(names, extra, by_mtime, held, extra_born)

    def _merge_packs(self, names: Iterable[str], extra: Sequence[tuple[str, bytes]], by_mtime: bool,
                     held: Mapping[str, Sequence[Sequence[tuple[str, bytes]]]] | None,
                     extra_born: Mapping[str, float] | None) -> str | None:
        chosen = [n for n in dict.fromkeys(names) if packs.is_pack_name(n)]
        if by_mtime:
            order = {n: (self.storage.mtime(pack_key(n)) or 0.0, n) for n in chosen}
        else:
            order = {n: (float(self._seq.get(n, -1)), n) for n in chosen}
        with self.packmap.lock:
            own = {n: [self._own[n]] for n in chosen if n in self._own}
            written = {n: self._own_written[n] for n in own if n in self._own_written}
            final = {n: self._final_slots(n) for n in chosen if n in self._final}
        own.update((n, [list(g) for g in held[n]]) for n in chosen if held and n in held)
        seen: set[str] = set()
        groups: list[list[tuple[str, bytes]] | packs.Whole] = []
        for oid, canonical in extra:
            if oid not in seen:
                seen.add(oid)
                groups.append([(oid, canonical)])
        unread = [pack_key(n) for n in chosen if n not in own]
        datas = self.storage.read_many(unread + [age_key(n) for n in chosen if n.startswith("r-")]) if chosen else {}
        sizes = self._indexed_sizes([n for n in chosen if n not in own])
        done: list[str] = []
        # when each object was first written, kept across merges (docs/FORMAT.md, 8): a
        # repack must not restart the grace period of the unreachable objects it carries
        born = dict(extra_born or {})
        now = time.time()
        ages_of = {n: parse_ages(datas.get(age_key(n))) for n in chosen if n.startswith("r-")}
        rank = dict(order)
        if by_mtime:
            # a repacked pack is as new as its newest object, not as its own write: a log sealed
            # while a repack ran is younger by mtime than that repack's pack, yet holds newer
            # objects, which go after the pack's, next to what was written after them
            for n, ages in ages_of.items():
                if ages is not None and ages.records:
                    rank[n] = (min(order[n][0] or now, max(ages.records.values())), n)
        for name in sorted(chosen, key=lambda n: rank[n]):
            found: list[list[tuple[str, bytes]] | packs.Whole] | None
            offsets: list[int] = []
            if name in own:
                found = list(own[name])  # written by this handle: its objects are still in memory
            else:
                data = datas.get(pack_key(name))
                if data is None:
                    continue  # merged or collected by someone else since it was chosen
                found = self._pack_groups(name, data, offsets, final.get(name), sizes.get(name))
            if found is None:
                continue
            done.append(name)
            ages = ages_of.get(name)
            mtime = (order[name][0] if by_mtime and order[name][0]
                     else written[name] if name in written else self.storage.mtime(pack_key(name)))
            for i, group in enumerate(found):
                if isinstance(group, packs.Whole):
                    # copied whole: an object met before stays in it, unindexed
                    ids = [oid for oid in group.slots if oid not in seen]
                    groups.append(group)
                else:
                    fresh = [(oid, c) for oid, c in group if oid not in seen]
                    ids = [oid for oid, _ in fresh]
                    if fresh:
                        groups.append(fresh)
                seen.update(ids)
                for oid in ids:
                    t = ages.of(oid, offsets[i]) if ages is not None and i < len(offsets) else None
                    born[oid] = t if t is not None else (mtime if mtime is not None else now)
        if not groups or (len(done) < 2 and not extra and done and done[0].startswith("r-")):
            return None
        self._sync_intent_refs([n for n in done if n.startswith("w-") and n not in own], datas)
        new = self.write_groups(groups, born)
        self.delete_packs([n for n in done if n != new])  # one batched delete, not one per pack
        with self.packmap.lock:
            for name in done:
                self._own.pop(name, None)
                self._own_written.pop(name, None)
                self._final.pop(name, None)
                if name != new:
                    self._moved[name] = new
            while len(self._moved) > 4096:
                self._moved.popitem(last=False)
        return new

    def has_final(self, name: str) -> bool:
        """Whether this handle wrote final blocks into its log ``name`` (:meth:`note_written`)."""
        with self.packmap.lock:
            return name in self._final

    def _final_slots(self, name: str) -> dict[int, dict[str, Slot]]:
        """The places of the objects of the final blocks of this handle's log ``name``
        (:meth:`note_written`), by record, as the pack map holds them (under its lock; all of
        them for this handle's log): ``{payload offset: {id: place}}``. An object the map
        places in another record of the log is read from that one."""
        at = self._final[name]
        out: dict[int, dict[str, Slot]] = {}
        for oid, loc in self.packmap.places(name).items():
            if loc.offset in at and isinstance(loc, Slot):
                got = out.get(loc.offset)
                if got is None:
                    got = out[loc.offset] = {}
                got[oid] = loc
        return out

    def write_pack(self, frames: Sequence[tuple[str, bytes]], born: Mapping[str, float] | None = None) -> str:
        """Write stored frames as one new sealed pack (version 2, in the order given, in
        compressed blocks) with its index (gc); return its name. Each frame is verified.
        ``born``: when objects were first written (see :meth:`write_groups`).

        Raises:
            IntegrityError: a frame does not hash to its id (nothing is written).
            StorageError: the backend failed.
        """
        codec = self.packmap.codec
        return self.write_groups([[(oid, codec.from_stored(oid, frame))] for oid, frame in frames], born)

    def write_groups(self, groups: Sequence[Sequence[tuple[str, bytes]] | packs.Whole],
                     born: Mapping[str, float] | None = None) -> str:
        """Write groups of ``(id, canonical bytes)`` as one new version-2 pack of blocks (each
        laid out by kind, :func:`castore.objectstore.packs.block_layout`; the indexes in blocks
        of their own, :data:`INDEX_BLOCK_BYTES`; a
        :class:`~castore.objectstore.packs.Whole` record copied as it is), then its ages
        (:class:`Ages` from ``born``, now for an object ``born`` does not name; docs/FORMAT.md,
        8), then its index, each atomically: a pack without its index
        is still read (scanned); an index never names a pack that is not complete, nor one
        whose ages are not written."""
        data, where = packs.encode_pack_v2(groups, BLOCK_BYTES, BLOCK_LEVEL, _ends_run, by_kind=True,
                                           codec=self.packmap.codec, aside=_is_index,
                                           aside_bytes=INDEX_BLOCK_BYTES)
        name = packs.content_name("r", data)
        self.storage.write(pack_key(name), data)
        now = time.time()
        got = (born or {}).get
        when = {oid: min(now, got(oid, now)) for oid in where}
        ages: dict[int, float] = {}
        for oid, slot in where.items():
            ages[slot.offset] = max(ages.get(slot.offset, when[oid]), when[oid])
        # sorted by id once picked (few are), not all of them sorted to pick a few
        older = dict(sorted((oid, t) for oid, t in when.items() if t < ages[where[oid].offset] - AGE_SLACK))
        self.storage.write(age_key(name), json.dumps({"born": sorted(ages.items()), "objects": older}).encode())
        self.storage.write(index_key(name), packindex.encode_index(len(data), where))
        with self.packmap.lock:
            self.packmap.add(name, where, sealed=True, scanned=len(data), version=2)
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
            keys = sorted({i.key for i in refintents.intents(data)})
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
        if name.startswith("r-"):
            self.storage.delete(age_key(name))  # ages without their pack: read by no one
        with self.packmap.lock:
            self.packmap.drop(name)
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
            ages = [age_key(n) for n in names if n.startswith("r-")]
            if ages:
                self.storage.delete_many(ages)  # ages without their pack: read by no one
        except DeleteIncomplete as e:
            left = set(e.remaining)
            gone = {n for n in names if pack_key(n) not in left and index_key(n) not in left}
            raise
        finally:
            with self.packmap.lock:
                for name in gone:
                    self.packmap.drop(name)
                    self._sizes.pop(name, None)

    def _sync_intent_refs(self, names: Sequence[str], datas: Mapping[str, bytes | None]) -> None:
        """Make durable the refs that the intents of the logs ``names`` moved, for each of
        them that was never sealed (no index: a dead writer's, or this handle's own at
        close when it was read back), before the merge deletes it: its intents may be the only durable record of
        swaps whose ref writes were not synced (format 3; docs/FORMAT.md, 12). A sealed
        log's refs were synced when it was sealed.

        Raises:
            StorageError: a sync failed (nothing is deleted).
        """
        keys: set[str] = set()
        for name in names:
            data = datas.get(pack_key(name))
            if data is not None and not self.storage.exists(index_key(name)):
                keys.update(i.key for i in refintents.intents(data))
        if keys:
            self.storage.sync_keys(sorted(keys))

    def live_packs(self, names: Sequence[str]) -> list[str]:
        """``names`` (oldest first) with each pack that a repack by this handle merged
        replaced by the pack it went into, each name once, at its newest place: what a read
        hint should name after a background repack (docs/FORMAT.md, 6 and 8)."""
        out: list[str] = []
        with self.packmap.lock:
            for name in names:
                for _ in range(64):  # a chain of merges: r-1 merged into r-2 ...
                    nxt = self._moved.get(name)
                    if nxt is None:
                        break
                    name = nxt
                out.append(name)
        return list(reversed(dict.fromkeys(reversed(out))))

    def _indexed_sizes(self, names: Sequence[str]) -> dict[str, int]:
        """The size each of the sealed packs ``names`` has by its index (a pack without one,
        or whose index is damaged, is left out: the pack is the truth then).

        Raises:
            StorageError: the backend failed.
        """
        heads = self.storage.read_heads([index_key(n) for n in names if packs.is_pack_name(n)], packindex.INDEX_HEAD)
        out: dict[str, int] = {}
        for name in names:
            head = heads.get(index_key(name))
            if head is not None:
                try:
                    out[name] = packindex.IndexView(head, check=False).pack_size
                except IntegrityError:
                    continue
        return out

    def _pack_groups(self, name: str, data: bytes, offsets: list[int] | None = None,
                     final: Mapping[int, Mapping[str, Slot]] | None = None, size: int | None = None,
                     ) -> list[list[tuple[str, bytes]] | packs.Whole] | None:
        """The objects of a pack's bytes as ``(id, canonical bytes)`` groups in write order
        (one per version-2 record, in the order of its content: a repacked block's is by kind,
        stable when laid out again; one per object in a version-1 pack), each verified, each
        group's offset in the pack appended to ``offsets`` when given; a record ``final``
        names (by payload offset: its objects' places, :meth:`note_written`) as a
        :class:`~castore.objectstore.packs.Whole`, its check verified, not its objects; None
        for a pack with a damaged record, a sealed one whose records stop short of its end,
        one of another ``size`` than its index says (cut short at a record's end, to its
        header or to nothing, it scans clean), or a log whose tail is a damaged ref intent
        (:func:`~castore.objectstore.packmap.damaged_intent_tail`): damage, left for fsck.

        Raises:
            IntegrityError: an object does not hash to its id.
        """
        if size is not None and size != len(data):
            return None
        try:
            version = packs.pack_version(data)
        except IntegrityError:
            return None
        if not version:
            return []
        contents: dict[int, bytes] = {}
        damaged: list[tuple[int, int]] = []
        where, end = packs.scan(data, keep=contents.__setitem__, damaged=damaged, codec=self.packmap.codec,
                                known=final)
        if damaged:
            return None  # a damaged record: left whole for fsck and a human, never dropped
        if end != len(data) and not (name.startswith("w-") and not self.storage.exists(index_key(name))):
            return None  # a complete pack that does not scan to its end: do not drop what follows
        if end != len(data) and damaged_intent_tail(data, end):
            return None  # a log's tail that is a damaged ref intent, not a torn write
        if version == 2:
            by_record: dict[int, list[tuple[int, str, bytes]]] = {}
            whole: dict[int, packs.Whole] = {}
            for oid, loc in where.items():
                assert isinstance(loc, Slot)
                content = contents.get(loc.offset)
                if content is None:  # a final block (scan kept no content): copied whole
                    if loc.offset not in whole and final is not None:
                        whole[loc.offset] = packs.whole_record(data, loc, final[loc.offset])
                    continue
                # the id was computed from these very bytes by the scan
                by_record.setdefault(loc.offset, []).append((loc.start, oid, content[loc.start:loc.start + loc.length]))
            if offsets is not None:
                offsets.extend(sorted([*by_record, *whole]))
            out: dict[int, list[tuple[str, bytes]] | packs.Whole] = dict(whole)
            out.update((at, [(oid, c) for _, oid, c in sorted(items)]) for at, items in by_record.items())
            return [out[at] for at in sorted(out)]
        frames = sorted(where.items(), key=lambda kv: kv[1].offset)
        if offsets is not None:
            offsets.extend(loc.offset for _, loc in frames)
        codec = self.packmap.codec
        return [[(oid, codec.from_stored(oid, bytes(data[loc.offset:loc.offset + loc.size])))] for oid, loc in frames]

    # -- background repack ------------------------------------------------------------
    def start(self) -> None:
        """Run :meth:`auto_repack_once` in a background thread, unless one is running or
        :attr:`auto` is off. Never raises: an append must not fail because of it."""
        if not self.auto:
            return
        with self.packmap.lock:
            if self._held:  # a write batch is under way: one run once it is over (hold)
                self._owed = True
                return
            if self._thread is not None and self._thread.is_alive():  # (not alive: a forked child's)
                # a run is going: it runs once more when done, for the packs written since it
                # listed (dropping this request left up to twice the batch packs behind)
                self._again = True
                return
            t = threading.Thread(target=self._repack_quietly, name="castore-repack", daemon=True)
            self._thread = t
            self._again = False
        t.start()

    def hold(self) -> None:
        """Start no background repack until :meth:`release` (calls nest): a long write batch
        (an import) would otherwise merge its growing packs again and again while it writes."""
        with self.packmap.lock:
            self._held += 1

    @property
    def held(self) -> bool:
        """Whether a write batch holds the background repack (:meth:`hold`): the log's records
        of a landing are written as final blocks, the others at :data:`HELD_RECORD_LEVEL`,
        for the repack after it to copy the first and compress the others once."""
        return self._held > 0

    def release(self) -> None:
        """End a :meth:`hold`; the last one starts the background repack asked for meanwhile."""
        with self.packmap.lock:
            self._held -= 1
            owed = self._owed and not self._held
            if owed:
                self._owed = False
        if owed:
            self.start()

    def _repack_quietly(self) -> None:
        while True:
            failed = False
            try:
                self.auto_repack_once()
            except Exception as e:  # noqa: BLE001 - a background merge must never fail an append; kept for the caller
                self.error, failed = e, True
            with self.packmap.lock:
                if failed or not self._again:  # a failed run is not repeated at once
                    self._thread = None  # under the lock: a request after this starts a new run
                    return
                self._again = False

    def wait(self) -> None:
        """Wait for this handle's background repack, if one is running (with the run it owes
        for appends made while it ran)."""
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()

    def auto_repack_once(self, max_bytes: int = AUTO_REPACK_MAX_BYTES) -> str | None:
        """One bounded geometric repack of the sealed packs (what a writer runs in the
        background; docs/FORMAT.md, 8): every sealed log and batch pack (their records were
        compressed one by one) and the repacked packs the geometric rule picks, smallest
        first, up to ``max_bytes``. A log without an index (a live writer's) is never
        touched; on object storage (and with :attr:`own_only`) only the packs this handle
        wrote are merged.
        One listing and one batch read of the heads of the indexes whose sizes this handle
        does not know; no lock held while reading or writing. Returns the new pack's name, or None.

        Raises:
            IntegrityError, StorageError (see :meth:`merge_packs`).
        """
        listed: dict[str, bool] = {}
        for n in self.storage.list_dir(PACKS):
            stem, dot, ext = n.rpartition(".")
            if dot and packs.is_pack_name(stem) and "." + ext in (packs.PACK_SUFFIX, packs.INDEX_SUFFIX):
                listed[stem] = listed.get(stem, False) or "." + ext == packs.INDEX_SUFFIX
        live = self.packmap.live
        sealed = {n for n, has_index in listed.items() if n != live and (has_index or n.startswith("b-"))}
        if self.packmap.no_append or self.own_only:
            # object storage: only the packs this handle wrote (its batch packs are still in
            # memory). Writers merging each other's packs GET, rewrite and DELETE the same
            # packs over and over: ~19 extra requests per append for 16 writers
            # (docs/benchmarks/BENCHMARKS-fleet.md). Other writers' packs are theirs, or `castore repack`'s.
            # Local disk, own_only: import workers, each merging its own packs at once.
            sealed &= self._seq.keys()
        sizes: dict[str, int] = {n: 0 for n in sealed if n.startswith("b-")}
        indexed = sorted(n for n in sealed if listed[n])
        # sealed packs never change: each size read once, from the head of its index (a
        # fresh handle's run at close must not read a large index whole for its size); an
        # index whose head is damaged is left for an explicit repack or fsck
        known = self.packmap.sealed_sizes()
        self._sizes.update((n, known[n]) for n in indexed if n not in self._sizes and n in known)
        unknown = [n for n in indexed if n not in self._sizes]
        self._sizes.update(self._indexed_sizes(unknown) if unknown else {})
        sizes.update((n, self._sizes[n]) for n in indexed if n in self._sizes)
        take = _auto_choice(sizes, max_bytes)
        if not take:
            return None
        return self.merge_packs(take, by_mtime=not self.packmap.no_append)

    def repack_if_due(self) -> str | None:
        """At a local writer's close: one :meth:`auto_repack_once`, in the foreground, when the
        sealed packs this handle knows (as of its last listing: no I/O to decide) hold more
        than :data:`AUTO_PACK_LIMIT` that the run would merge, reading at most
        :data:`CLOSE_REPACK_MAX_BYTES` of them (git's ``gc.autoPackLimit``;
        docs/FORMAT.md, 8). A process per turn never seals a log past SEAL_BYTES, so no
        background run starts; without this its packs, one per turn, stayed. Nothing on
        object storage (a writer merges its own packs there), with :attr:`own_only`, while
        a write batch holds the repack, or with :attr:`auto` off. It runs in the closing
        thread, under the handle's lock (nothing else uses a handle being closed). Never
        raises: a failed run is kept in :attr:`error` (the close has already made the
        writes durable). Returns the new pack's name, or None.
        """
        if not self.auto or self._held or self.own_only or self.packmap.no_append:
            return None
        live = self.packmap.live
        sizes = {n: size for n, size in self.packmap.sealed_sizes().items() if n != live}
        if len(_auto_choice(sizes, CLOSE_REPACK_MAX_BYTES)) <= AUTO_PACK_LIMIT:
            return None
        try:
            return self.auto_repack_once(CLOSE_REPACK_MAX_BYTES)
        except (StorageError, IntegrityError) as e:
            self.error = e
            return None


def _ends_run(group: Sequence[tuple[str, bytes]]) -> bool:
    """Whether a block may end after this group: one that holds a segment or an index (the
    segment copies the commits before it, so a block ending there holds both)."""
    return any(o.is_path_object(c) for _, c in group)


def _is_index(canonical: bytes) -> bool:
    """Whether canonical bytes are a path's :class:`~castore.objects.Index`."""
    return o.kind_tag(canonical) == "i"


def _auto_choice(sizes: Mapping[str, int], max_bytes: int) -> list[str]:
    """What a background repack merges of the sealed packs ``sizes`` (name -> bytes): every
    log and batch pack and the repacked packs :func:`geometric` picks, smallest first, up to
    ``max_bytes``; nothing when that is one repacked pack alone."""
    chosen = set(geometric(list(sizes.items()))) | {n for n in sizes if not n.startswith("r-")}
    take: list[str] = []
    total = 0
    for n in sorted(chosen, key=lambda n: (sizes[n], n)):
        if take and total + sizes[n] > max_bytes:
            break
        take.append(n)
        total += sizes[n]
    return [] if len(take) == 1 and take[0].startswith("r-") else take


def geometric(sizes: Sequence[tuple[str, int]]) -> list[str]:
    """The smallest packs to merge so that each remaining pack is at least twice the size of
    all smaller ones together (git's ``repack --geometric=2``); ``sizes`` are (name, bytes)."""
    order = sorted(sizes, key=lambda x: (x[1], x[0]))
    total, cut = 0, 0
    for i, (_, n) in enumerate(order):
        if n < 2 * total:
            cut = i + 1
        total += n
    return [name for name, _ in order[:cut]] if cut > 1 else []


__all__ = ["Repacker", "geometric", "AUTO_PACK_LIMIT", "CLOSE_REPACK_MAX_BYTES", "AUTO_REPACK_BATCHES",
           "AUTO_REPACK_MAX_BYTES", "BLOCK_BYTES", "BLOCK_LEVEL", "FINAL_RECORD_BYTES", "INDEX_BLOCK_BYTES",
           "LANDING_LEVEL", "HELD_RECORD_LEVEL"]
