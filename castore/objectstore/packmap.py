"""The pack map: which pack holds each object, and reading frames out of packs (docs/FORMAT.md, 3-7).

A handle keeps one entry per pack it knows (``_Pack``): the places of its objects, whether
it is sealed (complete), how far a growing log has been scanned. A refresh lists ``packs/``
(:meth:`PackMap.refresh`): a sealed pack's index is read by its first bytes and searched
in place by ranged reads (:class:`castore.objectstore.packindex.IndexView`, checked in full only once a
miss or a bad object needs it), a pack without an index (a log, a batch pack) is scanned
from where its last scan stopped, and a pack gone (repacked) is forgotten. A frame is read
from the pack bytes a scan kept, or by a ranged read; a version-2 record is decompressed
whole, once, and kept, or (a reader of one object in the first half of a repacked block)
only as far as that object (:class:`castore.objects.BlockPrefix`).

:class:`PackMap` is one handle's map, a part of :class:`~castore.objectstore.ObjectStore`
(which keeps the loose objects, the caches of decoded objects and the write path's rule). It
owns the lock of the handle's pack state; the writer's log
(:class:`~castore.objectstore.packlog.WriterLog`) records its appends here and sets
:attr:`PackMap.live`, the repacker (:class:`~castore.objectstore.repack.Repacker`) records the
packs it writes and deletes. What a scan knows of each pack (its places, how far a growing log
was read, its mtime then) is kept in one place, ``PackMap._packs``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence

from .. import objects as o
from ..errors import CastoreError, DamagedPack, IntegrityError, SealedFrameError
from ..storage import Storage
from . import packindex, packs
from .packs import PACKS, Place, Slot, index_key, pack_key

#: bytes of scanned packs kept in memory, so reading their frames costs no further I/O
PACK_DATA_BYTES = 64 << 20
#: decompressed record contents kept in memory (a record is read whole, once)
CONTENT_BYTES = 64 << 20
#: a record whose compressed payload is at least this large (a repacked block) is decompressed
#: only as far as a reader of one object in its first half needs (objects.BlockPrefix)
PREFIX_MIN = 16 << 10
#: blocks kept decompressed in part, at most
PREFIXES = 4
#: seconds within which an append may leave a log's mtime as it was (the coarsest file-time
#: granularity castore meets: FAT's 2 s; ext4 and tmpfs tick every few ms)
RACY_TICK = 2.0
#: listings a refresh makes at most while the packs it listed keep vanishing (repacked meanwhile)
REFRESH_RELISTS = 4
#: an index of at most this many rows (what a process appending a turn or two leaves), read
#: whole, is mapped row by row when loaded
SMALL_INDEX_ROWS = 16


class _Pack:
    """What this handle knows of one pack: its frames, whether it is sealed (complete),
    and how far a growing log has been scanned."""

    __slots__ = ("name", "where", "index", "sealed", "scanned", "mtime", "stamped", "version", "damaged")

    def __init__(self, name: str) -> None:
        self.name = name
        self.version = 0  # the pack's version (0: not known yet)
        self.where: dict[str, Place] = {}
        self.index: packindex.IndexView | None = None  # rows searched in place, not yet all in where
        self.sealed = False
        self.scanned = 0
        self.mtime: float | None = None  # a log's mtime when last scanned: unchanged, not read again
        self.stamped = 0.0  # the clock when that mtime was taken (see PackMap._unchanged)
        self.damaged: list[tuple[int, int]] = []  # (offset, bytes) of damaged records a scan skipped


class PackMap:
    """Which pack holds each object of a store, as one handle knows it, and the reads of
    frames out of packs.

    It owns the lock of the handle's pack state (:attr:`lock`): the writer's log and the
    repacker, which are handed this map, take the same lock for their own state.
    """

    def __init__(self, storage: Storage, no_append: bool, codec: o.Codec = o.PLAIN) -> None:
        self.storage = storage
        #: the store's object codec: ids of packed objects, sealed records (the writer's log and
        #: the repacker, which are handed this map, write with it too)
        self.codec = codec
        # the last sealed record that did not open here, and whether any record opened: see
        # wrong_key()
        self._refused: SealedFrameError | None = None
        self._opened = False
        # objects whose pack record a read found damaged: id -> (pack, the error)
        self._damage: dict[str, tuple[str, DamagedPack]] = {}
        #: the one lock of a handle's pack state: this map's, the writer's log's, the repacker's
        self.lock = threading.RLock()
        #: whether the storage cannot append (object storage: a ranged read is a round trip,
        #: and a writer writes whole batch packs); the writer's log sets it when its storage
        #: refuses a log
        self.no_append = no_append
        #: this handle's own log while it is open ("" when none): mapped by its appends, so
        #: never scanned or listed away here (the writer's log sets it)
        self.live = ""
        # the scan state, one entry per pack known (_Pack: its places, sealed or not, how far
        # a growing log was scanned, its mtime then), the map id -> (pack, place), and the
        # sealed packs whose index rows are looked up in place, not yet all in _where
        self._packs: dict[str, _Pack] = {}
        self._where: dict[str, tuple[str, Place]] = {}
        self._lazy: dict[str, packindex.IndexView] = {}
        # bytes read, kept: whole packs read by a scan, decompressed records, blocks read in part
        self._pack_data: OrderedDict[str, bytes] = OrderedDict()
        self._pack_data_bytes = 0
        self._contents: OrderedDict[tuple[str, int], bytes] = OrderedDict()  # (pack, payload offset) -> content
        self._contents_bytes = 0
        self._prefixes: OrderedDict[tuple[str, int], o.BlockPrefix] = OrderedDict()

    # -- the pack map ----------------------------------------------------------------
    def add(self, name: str, where: Mapping[str, Place], sealed: bool, scanned: int, version: int = 0) -> None:
        """Record frames of pack ``name`` (written or read by this handle): their places,
        whether the pack is sealed (complete), and how far it is known (its bytes)."""
        with self.lock:
            pack = self._packs.get(name)
            if pack is None:
                pack = self._packs[name] = _Pack(name)
            if version:
                pack.version = version
            pack.where.update(where)
            pack.sealed = pack.sealed or sealed
            pack.scanned = max(pack.scanned, scanned)
            for oid, loc in where.items():
                self._where[oid] = (name, loc)

    def drop(self, name: str) -> None:
        """Forget pack ``name`` (deleted, or repacked away) and every byte kept of it; an
        object it held that another known pack holds too is mapped there."""
        with self.lock:
            for key in [k for k in self._contents if k[0] == name]:
                self._contents_bytes -= len(self._contents.pop(key))
            for key in [k for k in self._prefixes if k[0] == name]:
                self._prefixes.pop(key).close()
            self._lazy.pop(name, None)  # rows found in it so far are in pack.where, dropped below
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

    def __contains__(self, name: object) -> bool:
        """Whether this handle knows pack ``name``."""
        return name in self._packs

    def is_sealed(self, name: str) -> bool:
        """Whether pack ``name`` is known and sealed (indexed, or complete when written)."""
        pack = self._packs.get(name)
        return pack is not None and pack.sealed

    def mark_sealed(self, name: str) -> None:
        """Pack ``name`` (this handle's log, just given its index) is complete."""
        with self.lock:
            self._packs[name].sealed = True

    def places(self, name: str) -> dict[str, Place]:
        """The places of pack ``name``'s objects found so far, as the map holds them (no copy:
        read under :attr:`lock`; no I/O: a pack read through its index holds only the rows
        looked up, this handle's log all of them)."""
        pack = self._packs.get(name)
        return pack.where if pack is not None else {}

    def mapped(self, oid: str) -> bool:
        """Whether ``oid`` is in the map (no I/O: index rows not yet looked up are not)."""
        return oid in self._where

    def refresh(self, need: Sequence[str] = ()) -> bool:
        """Bring the pack map up to date with ``packs/``: new indexes are read, packs without
        one (logs, batch packs) are scanned from where their last scan stopped, packs that
        are gone (repacked) are forgotten. Returns True when something new was found.

        With ``need`` (the ids a reader is looking for), ``packs/`` is listed once more when
        they are still not found (a repack may have torn the first listing), and the packs
        without an index are scanned only when the new indexes do not hold all of them: a reader at the middle of
        a long session does not scan another writer's live log (up to
        :data:`~castore.objectstore.packlog.SEAL_BYTES`, every object hashed) for objects
        that sealed packs hold.

        Raises:
            StorageError: the backend failed.
        """
        found = False
        for _ in range(REFRESH_RELISTS):
            gone: list[str] = []
            found = self._refresh_once(gone, need) or found
            if not gone:
                break
            # a pack listed a moment ago was gone when read: a repack merged it since the
            # listing, and the pack it went into (written first) is in the next listing
        if need and not all(self.locate(x) is not None for x in need):
            # a listing is not a snapshot (a paginated LIST, a readdir of a folder changing
            # between its reads): a repack during it may have written its pack behind the
            # cursor and deleted the packs it merged ahead of it, so that neither was listed.
            # A listing started after that repack holds its pack (tests/test_repack_race.py)
            found = self._refresh_once([], need) or found
        return found

    def _refresh_once(self, gone: list[str], need: Sequence[str] = ()) -> bool:
        names = self.storage.list_dir(PACKS)
        with self.lock:
            listed: dict[str, bool] = {}
            for n in names:
                stem, dot, ext = n.rpartition(".")
                if dot and packs.is_pack_name(stem) and "." + ext in (packs.PACK_SUFFIX, packs.INDEX_SUFFIX):
                    listed[stem] = listed.get(stem, False) or "." + ext == packs.INDEX_SUFFIX
            for name in [n for n in self._packs if n not in listed and n != self.live]:
                self.drop(name)
            todo = []
            for name, has_index in sorted(listed.items()):
                pack = self._packs.get(name)
                if pack is not None and pack.sealed:
                    continue
                if name == self.live:
                    continue  # ours: already mapped
                if pack is not None and not has_index and self._unchanged(pack):
                    continue  # a log that has not changed since its last scan
                todo.append((name, has_index))
            indexed = [t for t in todo if t[1]]
            if need and indexed and len(indexed) < len(todo):
                found = self._load_packs(indexed, gone)
                if all(self.locate(x) is not None for x in need):
                    return found  # the others wait for an object no index holds
                return self._load_packs([t for t in todo if not t[1]], gone) or found
            return self._load_packs(todo, gone)

    def _unchanged(self, pack: _Pack) -> bool:
        """Whether the log ``pack`` holds nothing past its last scan. Its mtime says so, except
        while that mtime is within :data:`RACY_TICK` of when it was taken: an append in the same
        coarse clock tick as the scan leaves the mtime as it was (a "racily clean" entry, as
        git calls an index entry as new as the index), so such a log is asked for a byte past
        what was scanned (one ranged read, until the tick is over)."""
        if pack.mtime is None or self.storage.mtime(pack_key(pack.name)) != pack.mtime:
            return False
        if pack.stamped - pack.mtime > RACY_TICK:
            return True
        now = time.time()
        try:
            if self.storage.read_range(pack_key(pack.name), pack.scanned, 1):
                return False  # it grew in the tick of its scan: scan it again
        except FileNotFoundError:
            return False  # repacked away meanwhile: the scan finds it gone
        pack.stamped = now  # later appends change the mtime once the tick is over
        return True

    def load_packs(self, names: Sequence[str]) -> bool:
        """Load the frames of the named packs without listing ``packs/`` (for a reader that
        knows them, e.g. from a ref's read hint); unknown or missing names are skipped.
        Returns True when something new was found.

        A batch pack (``b-``) never has an index, so it is read whole at once (one GET on
        S3); the others are looked up by index first. This handle's own live log is
        already mapped and not read again.

        Raises:
            StorageError: the backend failed.
        """
        with self.lock:
            todo = [(n, not n.startswith("b-")) for n in dict.fromkeys(names) if packs.is_pack_name(n)
                    and not (n in self._packs and self._packs[n].sealed)
                    and n != self.live]
            return self._load_packs(todo)

    def _load_packs(self, todo: Sequence[tuple[str, bool]], gone: list[str] | None = None) -> bool:
        """Read the indexes of ``(name, has_index)`` packs, and scan the others (and those
        whose index is missing or damaged), each group in one concurrent batch. True if new
        frames were found. The packs found missing are added to ``gone``."""
        if not todo:
            return False
        before = sum(self._frames(n) for n, _ in todo)
        scan: list[str] = []
        wanted = [n for n, has_index in todo if has_index]
        # the first bytes of each index (all of a small one); a lookup reads the rows it
        # needs by range: a fresh reader of a few objects reads O(log n) of each index
        # (on object storage a ranged GET is a round trip: a larger head, few window reads)
        head, reads = ((packindex.INDEX_HEAD_REMOTE, packindex.INDEX_RANGE_READS_REMOTE) if self.no_append
                       else (packindex.INDEX_HEAD, packindex.INDEX_RANGE_READS))
        got = self.storage.read_heads([index_key(n) for n in wanted], head) if wanted else {}
        for name, has_index in todo:
            raw = got.get(index_key(name)) if has_index else None
            if raw is not None:
                try:
                    # the check over every row waits until a miss or a bad object needs it
                    # (:meth:`recheck`): a reader of a few objects pays O(log n), not O(n)
                    view = packindex.IndexView(raw, check=False, read=self._index_reader(name), max_reads=reads)
                    # a small index read whole is mapped at once (checked, every row decoded:
                    # microseconds), so that it costs a lookup nothing, not a search each
                    # (a process per turn leaves a pack of a few objects per turn)
                    rows = view.rows() if view.held and view.count <= SMALL_INDEX_ROWS else None
                except IntegrityError:
                    pass  # the pack is the truth: scan it
                else:
                    if rows is not None:
                        self.add(name, rows, sealed=True, scanned=view.pack_size, version=view.version)
                        continue
                    # rows are looked up when needed (:meth:`locate`): a reader of a few objects
                    # does not decode every row of every index
                    self.add(name, {}, sealed=True, scanned=view.pack_size, version=view.version)
                    self._packs[name].index = self._lazy[name] = view
                    continue
            scan.append(name)
        # a log's mtime is taken before reading it: a record appended after the read changes it
        # (or, in the same clock tick, makes it longer: see _unchanged)
        stamped = time.time()
        mtimes = {n: self.storage.mtime(pack_key(n)) for n in scan if n.startswith("w-")}
        datas = self.storage.read_many([pack_key(n) for n in scan]) if scan else {}
        for name in scan:
            data = datas.get(pack_key(name))
            if data is None:
                if gone is not None:
                    gone.append(name)
                continue  # deleted by a repack since the listing, or never existed
            pack = self._packs.get(name)
            start = pack.scanned if pack is not None else 0
            try:
                version = packs.pack_version(data)
            except IntegrityError:
                if not name.startswith("w-") and not start:  # written whole: its header cut short or damaged
                    self.add(name, {}, sealed=True, scanned=0)
                    self._note_cut(name, 0)
                continue  # not a pack: nothing in it can be read
            damaged: list[tuple[int, int]] = []
            refused: list[SealedFrameError] = []

            def keep(offset: int, content: bytes, name: str = name) -> None:
                self._keep_content(name, offset, content)  # a record at a time: kept while they fit

            where, end = packs.scan(memoryview(data)[start:], start, version, keep, damaged, self.codec, refused) \
                if start else packs.scan(data, keep=keep, damaged=damaged, codec=self.codec, refused=refused)
            if refused:
                self._refused = refused[-1]
            if where and self.codec.cipher is not None:
                self._opened = True
            self._keep_pack_data(name, data)
            # a batch or repack pack is complete when written; a log may still grow
            self.add(name, where, sealed=not name.startswith("w-"), scanned=end, version=version)
            if end < len(data) and not name.startswith("w-"):
                damaged.append((end, len(data) - end))  # written whole, so a short scan is damage, not a tail
            elif not name.startswith("w-") and not start and packs.content_name(name[0], data) != name:
                self._note_cut(name, end)  # a clean scan of bytes that are not those it was named for
            for d in damaged:
                if d not in self._packs[name].damaged:
                    self._packs[name].damaged.append(d)
                    self._note_salvaged(name, data, d, version)
            # a torn tail may be a record still being written: scan again next time
            self._packs[name].mtime = mtimes.get(name) if end == len(data) else None
            self._packs[name].stamped = stamped
        return sum(self._frames(n) for n, _ in todo) > before

    def _note_cut(self, name: str, end: int) -> None:
        """Record pack ``name``, written whole and named by the hash of its bytes
        (:func:`~castore.objectstore.packs.content_name`), as cut short at ``end``: its bytes
        are not those it was named for, and what was past ``end`` (records, whose objects
        nothing can name) is lost. The span ``(end, 0)`` is its damaged record
        (:meth:`damaged_records`; ``castore fsck`` says "cut short")."""
        with self.lock:
            if (end, 0) not in self._packs[name].damaged:
                self._packs[name].damaged.append((end, 0))

    def _index_reader(self, name: str) -> Callable[[int, int], bytes]:
        """``read(offset, size)`` of pack ``name``'s index, for a ranged :class:`packindex.IndexView`."""
        key = index_key(name)

        def read(offset: int, size: int) -> bytes:
            try:
                return self.storage.read_range(key, offset, size)
            except FileNotFoundError:
                # repacked away since its first bytes were read: the index is dropped
                # (IntegrityError) and its pack looked for, found gone, and the map refreshed
                raise IntegrityError("pack index", f"{key} is gone") from None

        return read

    def _frames(self, name: str) -> int:
        pack = self._packs.get(name)
        if pack is None:
            return 0
        return max(len(pack.where), pack.index.count) if pack.index is not None else len(pack.where)

    def locate(self, oid: str) -> tuple[str, Place] | None:
        """The pack and place of ``oid``'s frame as this handle knows them, or None: the
        pack map, then a search of each index not yet decoded: those held whole first, then
        those read by range, each group the index that held the last object found first.

        A miss in an index held whole costs a bisection in memory; a miss in one read by range
        costs a read of a window of its rows and brings a whole read of it nearer
        (``IndexView.find``). And objects read together were mostly written together (a
        path's tail commits, their bodies, its index and segments sit in the newest repacked
        blocks), so the index that held the last one most likely holds the next. A fresh
        reader of a session's last entries in a store of four repacked packs searched, by
        name, three indexes for nothing per object and read all four whole; in a store that
        a process per turn left a small pack per turn in, it missed in the large indexes for
        each entry those small packs hold."""
        hit = self._where.get(oid)
        if hit is not None or not self._lazy:
            return hit
        try:
            raw = bytes.fromhex(oid)
        except ValueError:
            return None
        if len(raw) != 32:
            return None
        with self.lock:
            lazy = self._lazy
            order = list(reversed(lazy))  # the most recently useful first (a hit moves last)
            for held in (True, False):
                for name in order:
                    view = lazy.get(name)
                    if view is None or view.held is not held:
                        continue  # (a ranged view read whole by its own search is searched once)
                    try:
                        loc = view.find(raw)
                    except IntegrityError:
                        self._unindex(name)  # a damaged row: the pack is the truth, scan it
                        return self._where.get(oid)
                    if loc is not None:
                        if next(reversed(lazy)) != name:
                            lazy[name] = lazy.pop(name)
                        hit = self._where[oid] = (name, loc)
                        self._packs[name].where[oid] = loc
                        return hit
        return None

    def _unindex(self, name: str) -> None:
        """Forget a damaged index, and every row found through it, and scan its pack instead."""
        self.drop(name)
        self._load_packs([(name, False)])

    def recheck(self, name: str | None = None) -> bool:
        """Verify the not yet checked index of pack ``name`` (every one when None); drop each
        damaged one and scan its pack instead. True when one was damaged (look again)."""
        with self.lock:
            damaged = False
            for pack, view in list(self._lazy.items()):
                if view.checked or (name is not None and pack != name):
                    continue
                try:
                    view.verify()
                except IntegrityError:
                    self._unindex(pack)  # the pack is the truth: scan it
                    damaged = True
            return damaged

    def _materialize(self) -> None:
        """Decode every index row not yet in the pack map (for what lists every frame)."""
        with self.lock:
            for name, view in list(self._lazy.items()):
                try:
                    where = view.rows()
                except IntegrityError:
                    self._unindex(name)
                    continue
                del self._lazy[name]
                self._packs[name].index = None
                self.add(name, where, sealed=True, scanned=view.pack_size)

    def unchecked(self, oid: str) -> bool:
        """Whether ``oid`` was mapped through an index not checked in full yet (a row that
        may lie: :meth:`recheck_object` tells)."""
        hit = self._where.get(oid)
        if hit is None:
            return False
        with self.lock:  # (locate moves a view to the end of _lazy: out of it for a moment)
            view = self._lazy.get(hit[0])
        return view is not None and not view.checked

    def recheck_object(self, oid: str) -> bool:
        """:meth:`recheck` the index that mapped ``oid``; True when it was damaged (dropped,
        its pack scanned: look again)."""
        hit = self._where.get(oid)
        return hit is not None and self.recheck(hit[0])

    def packed_ids(self) -> list[str]:
        """Every object id of every pack known (each index decoded in full: for what lists
        every object; call :meth:`refresh` first)."""
        with self.lock:
            self._materialize()
            return list(self._where)

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

    def read_packed(self, oid: str, alone: bool = False) -> bytes | None:
        """The stored frame of ``oid`` from the pack the map names, or None (``alone``: the
        only object its reader asks for, see :meth:`_content`)."""
        hit = self.locate(oid)
        if hit is None:
            return None
        name, loc = hit
        try:
            return self._frame(name, loc, alone)
        except FileNotFoundError:
            with self.lock:
                self.drop(name)  # repacked away: the caller looks elsewhere and refreshes
            return self.read_packed(oid, alone)
        except SealedFrameError as e:
            self._refused = e
            return None  # may be a record moved here from another store: the caller looks elsewhere
        except IntegrityError as e:
            self._note_damage(oid, name, loc, e.reason)
            return None  # a damaged record: the object may be elsewhere (the caller looks)

    def _note_damage(self, oid: str, name: str, loc: Place, why: str) -> DamagedPack:
        """Remember that ``oid``'s record at ``loc`` of pack ``name`` is damaged (for
        :meth:`damage` and :meth:`damaged_records`) and return the error that says so."""
        rec = packs.record_span(loc)
        err = DamagedPack(oid, pack_key(name), rec[0], rec[1], why)
        with self.lock:
            self._damage[oid] = (name, err)
            pack = self._packs.get(name)
            if pack is not None and rec not in pack.damaged:
                pack.damaged.append(rec)
        return err

    def _note_salvaged(self, name: str, data: bytes | memoryview, span: tuple[int, int], version: int) -> None:
        """Remember the objects that the damaged record ``span`` (pack offset, bytes) of the
        unindexed pack ``name`` (its bytes: ``data``) still shows (:func:`salvaged_ids`) as
        damaged there: a reader of one of them is told so (:class:`DamagedPack`), not that it
        is missing. Paid only when a scan meets damage."""
        for oid in salvaged_ids(data, span, version, self.codec):
            self._damage.setdefault(oid, (name, DamagedPack(
                oid, pack_key(name), span[0], span[1], "the record fails its check (the scan skipped it)")))

    def damage(self, oid: str, why: str | None = None) -> DamagedPack | None:
        """Why ``oid`` cannot be read from the pack this handle maps it to: the record a read
        met damaged (it did not decompress or open), or, given ``why`` (what a caller found
        wrong with the bytes read, a hash that does not match), that record; for an object
        in no pack, the damaged record of a pack without an index that shows it (a scan
        skipped the record: :meth:`_note_salvaged`); None when ``oid`` is in no pack, or no
        damage was met. Raises nothing."""
        hit = self._where.get(oid)
        if hit is None:
            with self.lock:
                skipped = self._damage.get(oid)
                return skipped[1] if skipped is not None and skipped[0] in self._packs else None
        if why is not None:
            return self._note_damage(oid, hit[0], hit[1], why)
        with self.lock:
            seen = self._damage.get(oid)
        return seen[1] if seen is not None and seen[0] == hit[0] else None

    def wrong_key(self) -> SealedFrameError | None:
        """A sealed record that did not open, when no record has opened in this handle: then the
        store was most likely opened with a wrong key, which a reader that finds no copy of an
        object reports instead of "not found" (None: no such doubt). Raises nothing."""
        return self._refused if not self._opened else None

    def _keep_content(self, name: str, offset: int, content: bytes) -> None:
        with self.lock:
            key = (name, offset)
            if key in self._contents or len(content) > CONTENT_BYTES // 4:
                return
            self._contents[key] = content
            self._contents_bytes += len(content)
            while self._contents_bytes > CONTENT_BYTES:
                self._contents_bytes -= len(self._contents.popitem(last=False)[1])

    def _content(self, name: str, loc: Slot, alone: bool = False) -> bytes:
        """The decompressed content of the version-2 record at ``loc`` (read whole, once), or
        (``alone``: a reader of this one object, and a repacked block it is in the first half
        of) a prefix of it holding the object.

        Raises:
            FileNotFoundError: the pack is gone.
            IntegrityError: the record does not decompress.
        """
        key = (name, loc.offset)
        got = self._contents.get(key)
        if got is not None:
            return got
        need = loc.start + loc.length
        with self.lock:
            part = self._prefixes.get(key)
            if part is not None and len(part.data) >= need:
                return part.data
        fresh = part is None
        if part is None:
            data = self._pack_data.get(name)
            if data is not None and loc.offset + loc.size <= len(data):
                payload = data[loc.offset:loc.offset + loc.size]  # packs never change below their end
            else:
                payload = self.storage.read_range(pack_key(name), loc.offset, loc.size)
            what = f"record at {loc.offset} of pack {name}"
            if not alone or payload[:1] != b"\x01" or loc.size < PREFIX_MIN:
                content = packs.record_content(payload, what, self.codec)
                self._opened = True
                self._keep_content(name, loc.offset, content)
                return content
            part = packs.record_prefix(payload, what)
            if need * 2 > part.size:
                content = packs.record_content(payload, what, self.codec)  # most of it: in one call
                self._keep_content(name, loc.offset, content)
                return content
        # a reader of one object of a repacked block decompresses it only up to that object
        # (the state at the middle of a long session reads a commit and its tree out of a
        # 256 KiB block); the next reader of the block that needs more decompresses the rest
        # (a bulk reader of the block then pays one more call, not one per object)
        with self.lock:
            part = self._prefixes.pop(key, part)
            content = part.upto(need if fresh else part.size)
            if len(content) == part.size:
                self._keep_content(name, loc.offset, content)
            else:
                self._prefixes[key] = part
                while len(self._prefixes) > PREFIXES:
                    self._prefixes.popitem(last=False)[1].close()
        return content

    def prefetch(self, oids: Sequence[str]) -> None:
        """Read whole, in one batch, each pack (up to a quarter of the pack cache) that holds
        two or more not-yet-read records of ``oids``, and keep it in the pack cache: one
        request per pack instead of one per record (a cold reader of a path on S3)."""
        if not self._packs:
            return
        with self.lock:
            wanted: dict[str, set[int]] = {}
            for oid in oids:
                hit = self.locate(oid)
                if hit is None or hit[0] in self._pack_data:
                    continue
                name, loc = hit
                if isinstance(loc, Slot) and (name, loc.offset) in self._contents:
                    continue
                wanted.setdefault(name, set()).add(loc.offset)
            whole = [n for n, recs in wanted.items() if len(recs) >= 2 and n in self._packs
                     and 0 < self._packs[n].scanned <= PACK_DATA_BYTES // 4]
        if not whole:
            return
        datas = self.storage.read_many([pack_key(n) for n in whole])
        with self.lock:
            for name in whole:
                data = datas.get(pack_key(name))
                pack = self._packs.get(name)
                if data is not None and pack is not None and len(data) >= pack.scanned:
                    self._keep_pack_data(name, data)

    def close(self) -> None:
        """Drop the blocks read in part (their decompression contexts go back to the pool)."""
        with self.lock:
            while self._prefixes:
                self._prefixes.popitem()[1].close()

    def iter_pack_contents(self, batch: int = 8, part: tuple[int, int, int] | None = None,
                           keep: bool = True) -> Iterator[tuple[bytes, bool]]:
        """Every pack's objects, each pack read whole once, ``batch`` packs per concurrent
        read: as :meth:`castore.objectstore.ObjectStore.iter_contents` yields them (a
        version-2 record's decompressed content, kept in the content cache, or one object's
        canonical bytes). The packs' bytes are kept too: reading their objects again costs no
        I/O. ``keep=False``: neither is kept (a reader that keeps what it needs of them itself:
        the memory of the records it is done with is used again, not taken new). A damaged
        record is skipped.

        ``part``: ``(start, stop, n)``, only the shares ``start`` to ``stop - 1`` of ``n`` of
        the records (every pack is read; the records, the packs sorted by name, are cut into
        runs of :data:`SHARE_RUN` stored bytes, run ``k`` share ``k % n``'s; only those of the
        shares asked for are decompressed): what processes that list the same packs read
        between them, each record once, most of a session's commits in one share.

        Raises:
            ValueError: ``part`` is not of that form (on the first item asked for).
            StorageError: the backend failed.
        """
        check_part(part)
        names = sorted({n.rpartition(".")[0] for n in self.storage.list_dir(PACKS)
                        if n.endswith(packs.PACK_SUFFIX) and packs.is_pack_name(n.rpartition(".")[0])})
        at = 0  # the stored bytes of the records before this pack's
        for i in range(0, len(names), batch):
            keys = [pack_key(n) for n in names[i:i + batch]]
            datas = self.storage.read_many(keys)
            for name, key in zip(names[i:i + batch], keys, strict=True):
                data = datas.pop(key, None)
                if data is None:
                    continue  # repacked away since the listing: its objects are in a newer pack
                if keep:
                    with self.lock:
                        self._keep_pack_data(name, data)  # reading its objects again costs no I/O
                try:
                    records = list(packs.payloads(data))
                except IntegrityError:
                    continue  # not a pack
                if part is not None:
                    records, at = _share(records, at, *part)
                yield from self._records_contents(name, records, keep)

    def _records_contents(self, name: str, records: list[tuple[int, int, memoryview]],
                          keep: bool = True) -> Iterator[tuple[bytes, bool]]:
        """What :meth:`iter_pack_contents` yields of ``records``, some records of pack ``name``
        (``keep``: each content kept in the content cache)."""
        contents = _unframed(records, name, self.codec)
        for version, offset, payload in records:
            if version == 1:
                for _, frame in packs.frames_v1(payload) or ():
                    try:
                        canonical = self.codec.unframe(frame)
                    except IntegrityError:
                        continue
                    yield canonical, False
                continue
            content = next(contents)
            if content is None:
                continue
            if keep:
                self._keep_content(name, offset, content)
            yield content, True

    def pack_names(self) -> list[str]:
        """Every pack in the store (after a refresh).

        Raises:
            StorageError: the backend failed.
        """
        self.refresh()
        with self.lock:
            return sorted(self._packs)

    def pack_contents(self, name: str) -> dict[str, Place]:
        """The objects of one pack as this handle knows them, in the order they were written
        (call :meth:`refresh` first)."""
        with self.lock:
            self._materialize()
            pack = self._packs.get(name)
            if pack is None:
                return {}
            return dict(sorted(pack.where.items(), key=lambda kv: (kv[1].offset, kv[1][2:])))

    def damaged_records(self) -> list[tuple[str, int, int]]:
        """``(pack, offset, bytes)`` of every damaged record the scans of unindexed packs
        skipped (after a refresh): records that fail their check with a valid record after
        them, unlike a log's torn tail, and the bad end of a pack written whole (a batch or
        repack pack) (docs/FORMAT.md, 4); and the records of indexed packs a read of this
        handle found damaged (:meth:`damage`). Their objects cannot be read; the others can.

        A log without an index that is not this handle's own, whose tail is a damaged ref
        intent (:func:`damaged_intent_tail`: only the recovery after a power loss reads it, and
        would skip it; docs/FORMAT.md, 12), is named too, at that tail.

        Raises:
            StorageError: the backend failed.
        """
        self.refresh()
        return sorted(self.known_damage() + self._damaged_intent_tails())

    def _damaged_intent_tails(self) -> list[tuple[str, int, int]]:
        """``(log, offset, bytes)`` of the tail of each unsealed log (no index; not this
        handle's own) that :func:`~castore.objectstore.packmap.damaged_intent_tail` calls
        damage: a ref intent that only the recovery after a power loss reads (docs/FORMAT.md,
        12), and would skip.

        Raises:
            StorageError: the backend failed.
        """
        names = [n for n in self.pack_names()
                 if n.startswith("w-") and n != self.live and not self.pack_info(n)[1]]
        datas = self.storage.read_many([pack_key(n) for n in names]) if names else {}
        out = []
        for name in names:
            data, end = datas.get(pack_key(name)), self.pack_bytes(name)
            if data is not None and damaged_intent_tail(data, end):
                out.append((name, end, len(data) - end))
        return out

    def damage_text(self, pack: str, offset: int, size: int) -> str:
        """What one damaged record of :meth:`damaged_records` is, for a message: where it is,
        what it held (objects, or a ref intent: its frame byte, when that byte is intact) and
        what that means. Raises nothing (an unreadable frame byte says "objects or a ref intent")."""
        if not size:
            return (f"{pack_key(pack)} is cut short at offset {offset}: its bytes are not those it was named for, "
                    "and the records past its end are lost (what they held cannot be named)")
        try:
            frame = self.storage.read_range(pack_key(pack), offset + packs.RECORD_HEADER_SIZE, 1)
        except (OSError, CastoreError):
            frame = b""
        if frame == packs.INTENT_FRAME:
            held = ("a ref intent, which only the replay of ref swaps after a power loss reads (it "
                    "would be skipped; the refs as they are now read and write as before)")
        elif frame[:1] and frame[0] <= 3:
            held = "objects, which cannot be read (fsck names those a ref reaches as missing or corrupt)"
        else:
            held = "objects or a ref intent, which cannot be read"
        return f"{pack_key(pack)} at offset {offset} ({size} bytes) is a damaged record holding {held}"

    def known_damage(self) -> list[tuple[str, int, int]]:
        """:meth:`damaged_records` as this handle knows them now (no refresh). Raises nothing."""
        with self.lock:
            return sorted((n, off, size) for n, p in self._packs.items() for off, size in p.damaged)

    def sealed_sizes(self) -> dict[str, int]:
        """The size of each sealed pack this handle knows, by name (no I/O: as of its last
        refresh, with the packs it wrote or merged since). Raises nothing."""
        with self.lock:
            return {n: p.scanned for n, p in self._packs.items() if p.sealed}

    def pack_bytes(self, name: str) -> int:
        """The size of a pack as this handle knows it (0 if unknown)."""
        with self.lock:
            pack = self._packs.get(name)
            return pack.scanned if pack is not None else 0

    def pack_info(self, name: str) -> tuple[float | None, bool, bool]:
        """``(mtime, sealed, held)`` of a pack: when it last changed, whether it has an index
        or cannot grow, and whether a live writer still appends to it.

        Raises:
            StorageError: the backend failed.
        """
        with self.lock:
            pack = self._packs.get(name)
            sealed = pack is not None and pack.sealed
            ours = name == self.live
        held = ours or (name.startswith("w-") and not sealed and self.storage.is_held(pack_key(name)))
        return self.storage.mtime(pack_key(name)), sealed, held

    def read_frame(self, name: str, loc: Place) -> bytes:
        """One stored frame of a pack (not verified): a version-1 frame as stored, or the
        canonical bytes of an object in a version-2 record as a raw (``0x00``) frame.

        Raises:
            FileNotFoundError: the pack is gone.
            IntegrityError: a version-2 record does not decompress.
            StorageError: the backend failed.
        """
        return self._frame(name, loc)

    def _frame(self, name: str, loc: Place, alone: bool = False) -> bytes:
        """:meth:`read_frame`; ``alone``: see :meth:`_content`."""
        if isinstance(loc, Slot):
            content = self._content(name, loc, alone)
            if loc.start + loc.length > len(content):
                raise IntegrityError(name, f"a record of {len(content)} bytes holds no object at {loc.start}")
            return b"\x00" + content[loc.start:loc.start + loc.length]
        data = self._pack_data.get(name)
        if data is not None and loc.offset + loc.size <= len(data):
            return data[loc.offset:loc.offset + loc.size]  # packs never change below their end
        return self.storage.read_range(pack_key(name), loc.offset, loc.size)


#: the stored bytes of a run of records that one share of :meth:`PackMap.iter_pack_contents`
#: takes before the next share takes the next run (small enough to share a store of a few
#: packs evenly, large enough that few sessions' commits straddle two runs)
SHARE_RUN = 1 << 20


def check_part(part: tuple[int, int, int] | None) -> None:
    """Check a ``part`` argument of :meth:`PackMap.iter_pack_contents` (None, or ``(start,
    stop, n)``: integers with ``0 <= start < stop <= n``).

    Raises:
        ValueError: it is neither.
    """
    if part is None:
        return
    ok = (isinstance(part, tuple) and len(part) == 3
          and all(isinstance(x, int) and not isinstance(x, bool) for x in part))
    if not ok or not 0 <= part[0] < part[1] <= part[2]:
        raise ValueError(f"part is None or (start, stop, n) with 0 <= start < stop <= n, not {part!r}")


def _share(records: list[tuple[int, int, memoryview]], at: int, start: int, stop: int, n: int
           ) -> tuple[list[tuple[int, int, memoryview]], int]:
    """The records of ``records`` (one pack's, in order; ``at``: the stored bytes of the
    records before them) in the runs of :data:`SHARE_RUN` bytes of shares ``start`` to ``stop
    - 1`` of ``n`` (run ``k`` is share ``k % n``'s; a record belongs to the run its first byte
    is in), and ``at`` after them."""
    mine = []
    for rec in records:
        if start <= at // SHARE_RUN % n < stop:
            mine.append(rec)
        at += len(rec[2])
    return mine, at


#: version-2 records of one pack decompressed ahead of the one a scan is at (zstd releases
#: the GIL: the next records decompress on another core while the caller searches one), as
#: long as the content they declare stays within what one record may hold
_UNFRAME_AHEAD = 4


def _unframed(records: list[tuple[int, int, memoryview]], name: str,
              codec: o.Codec = o.PLAIN) -> Iterator[bytes | None]:
    """The content of each version-2 record of ``records`` in order (None: it does not
    decompress), decompressed in a worker thread up to :data:`_UNFRAME_AHEAD` ahead."""
    def one(offset: int, payload: memoryview) -> bytes | None:
        try:
            return packs.record_content(payload, f"record at {offset} of pack {name}", codec)
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
        ahead: deque[tuple[int, Future[bytes | None]]] = deque()
        held = 0  # content bytes the records ahead declare
        at = 0
        while at < len(todo) or ahead:
            while at < len(todo) and len(ahead) < _UNFRAME_AHEAD:
                size = max(packs.declared_content(todo[at][1]), 0)
                if ahead and held + size > packs.RECORD_CONTENT_READ_MAX:
                    break  # memory stays one record's worth, whatever the records declare
                ahead.append((size, pool.submit(one, *todo[at])))
                held += size
                at += 1
            size, done = ahead.popleft()
            held -= size
            yield done.result()


def damaged_intent_tail(data: bytes | memoryview, end: int) -> bool:
    """Whether the bytes of log ``data`` after ``end`` (where its scan stopped: the end of its
    last valid record) begin with a damaged ref intent rather than a torn tail: a record whole
    in length, framed as an intent, that fails its check. A write cut short leaves a record
    shorter than its length says, so a flipped byte is what makes this one; a scan takes it
    for a torn tail (as it must a log still being written, docs/FORMAT.md 4), and the
    recovery after a power loss, the only reader of intents (12), would skip it. fsck names
    it as a damaged record, and repack leaves its log whole."""
    body = end + packs.RECORD_HEADER_SIZE
    if not packs.HEADER_SIZE <= end or body >= len(data):
        return False
    length = packs.record_length(data, end)
    return (0 < length and body + length <= len(data) and bytes(data[body:body + 1]) == packs.INTENT_FRAME
            and o.checksum(data[body:body + length]) != bytes(data[end + 4:body]))


def salvaged_ids(data: bytes | memoryview, span: tuple[int, int], version: int, codec: o.Codec = o.PLAIN) -> list[str]:
    """The ids of the objects a damaged version-2 record still shows: the record at pack
    offset ``span[0]`` of ``span[1]`` bytes (header included) in the pack bytes ``data``.
    Its payload (as its length says, else up to the span's end) is decompressed as far as
    it goes (a plain zstd block up to its first bad zstd block), and each object whose bytes
    are all there is hashed: an id is the hash of the bytes found, so a listed object was
    in the record. Damage in the record's length or check leaves every object shown;
    damage inside a small record's compressed bytes, none (then nothing can tell what it
    held). Raises nothing."""
    if version != 2:
        return []
    off, size = span
    view = memoryview(data)
    end = min(off + size, len(view))
    body = off + packs.RECORD_HEADER_SIZE
    if body >= end:
        return []
    length = packs.record_length(view, off)
    payloads = [view[body:body + length]] if 0 < length < end - body else []
    payloads.append(view[body:end])
    for payload in payloads:
        content = _as_far_as_it_goes(payload, codec)
        objects = memoryview(content)
        spans = packs.content_spans(content, whole=False) or []
        ids: list[str] = [codec.digest(objects[pos:pos + n]) for pos, n in spans]
        if ids:
            return ids
    return []


def _as_far_as_it_goes(payload: memoryview, codec: o.Codec) -> bytes:
    """A damaged record's content: all of it when its payload opens whole, else the part of
    a plain zstd frame decoded before its first bad zstd block ("" when nothing decodes)."""
    if payload[:1] == packs.INTENT_FRAME:
        return b""
    try:
        return packs.record_content(payload, "damaged record", codec)
    except IntegrityError:
        pass
    try:
        prefix = packs.record_prefix(payload, "damaged record")
    except IntegrityError:
        return b""
    try:
        while len(prefix.data) < prefix.size:
            prefix.upto(len(prefix.data) + (8 << 10))  # what decoded before the bad block is kept
    except IntegrityError:
        pass
    finally:
        prefix.close()
    return prefix.data

