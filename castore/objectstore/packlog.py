"""The writer's log: where a handle's batches go (docs/FORMAT.md, 4 and 12).

On storage that can append (local disk), each handle writes the small objects of every batch
as one record appended to its own log, ``packs/w-<...>.pack`` (:meth:`WriterLog.append`);
elsewhere each batch is written as one whole batch pack, ``packs/b-<...>.pack``. Past
:data:`SEAL_BYTES` the log is *sealed*: synced and given its index (:meth:`~WriterLog._seal`).
In format 3 a ref swap is journaled in the log as an *intent* record
(:meth:`~WriterLog.journal`), whose sync also makes the objects record before it durable; a
log holding intents is merged at close into an ``r-`` pack of blocks without them
(:meth:`~WriterLog._merge_log`), and a recovery after a power loss replays the intents of
the logs without an index (:meth:`~WriterLog.log_intents`). While a write batch holds the
repack, a landing's records are blocks in the repack's final layout, which the repack after
the batch copies as they are, other records plain zstd at a low level, and the log is sealed
less often (docs/FORMAT.md, 12).

:class:`WriterLog` is the part of :class:`~castore.objectstore.ObjectStore` that does it,
handed the storage, the pack map (:class:`~castore.objectstore.packmap.PackMap`: it records
each append there, names its open log in :attr:`~castore.objectstore.packmap.PackMap.live`,
and takes its lock), the repacker (:class:`~castore.objectstore.repack.Repacker`: it notes
the packs written, starts a background repack once a log is sealed or after
:data:`~castore.objectstore.repack.AUTO_REPACK_BATCHES` batch packs, merges the log at
close, and then the small packs when the handle knows more than
:data:`~castore.objectstore.repack.AUTO_PACK_LIMIT` of them), and the store's canonical
bytes of recent writes (what the merge at close takes the log's objects from).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

from ..errors import IntegrityError, StorageError
from ..storage import Appender, RefIntent, Storage
from . import packindex, packs, refintents
from .packmap import PackMap
from .packs import PACKS, Slot, index_key, pack_key
from .repack import AUTO_REPACK_BATCHES, FINAL_RECORD_BYTES, HELD_RECORD_LEVEL, LANDING_LEVEL, Repacker

#: a local log is sealed (given its index, no longer appended to) past this many bytes
SEAL_BYTES = 1 << 20
#: ... times this while a write batch holds the repack: a seal syncs the log and the refs its
#: intents moved (the whole file system, past a few), and nothing merges the sealed logs
#: before the batch ends; a log this size still holds few enough objects that the merge at
#: close takes them from memory
HELD_SEAL_FACTOR = 4


class WriterLog:
    """This handle's log: appending to it (or writing batch packs), sealing it, journaling
    ref intents in it (format 3) and merging it away at close."""

    def __init__(self, storage: Storage, packmap: PackMap, repacker: Repacker, recent: Mapping[str, bytes]) -> None:
        self.storage = storage
        self.packmap = packmap
        self.repacker = repacker
        self._recent = recent  # the store's canonical bytes of recent writes, by id (read only)
        #: format 3: ref swaps are journaled in this log (the store sets it with its format)
        self.journals = False
        # all under packmap.lock:
        self._log: Appender | None = None
        self._log_name = ""
        self._log_pid = 0
        self._batches = 0  # batch packs written (object storage): a background repack every AUTO_REPACK_BATCHES
        self._new_packs: list[str] = []  # packs written into since written_packs() was last called
        # format 3: the refs whose intents are in this log (synced before it is sealed), each
        # with its latest intent there (the base of the next one's delta), swaps between their
        # intent and their rename, and per thread the log holding this thread's objects record
        # not yet synced
        self._journaled = refintents.DeltaBases()
        # logs this handle stopped appending to once they were synced (sealed, merged at close,
        # or dropped after a failure and then synced): a record in one is durable even after a
        # background repack has merged the log away
        self._synced_logs: set[str] = set()
        self._inflight = 0
        self._tls = threading.local()
        #: the log was sealed by an append (not dropped after a failure, nor closed): the next
        #: intents open a new one
        self._reopen = False

    @property
    def name(self) -> str:
        """The name of this handle's current (or last) log ("" before the first)."""
        return self._log_name

    def _drop_log(self) -> None:
        """Stop appending to the log: the next write opens a new one."""
        self._reopen = False
        self._log = None
        self.packmap.live = ""

    def append(self, small: list[tuple[str, bytes]], sync: bool = True, most: int | None = None) -> int:
        """Append ``(id, canonical bytes)`` pairs as one record (version 2; ``most``: records
        of about that many bytes, with one write) to this handle's log (not synced yet without
        ``sync``: the ref intent that names it syncs it), or, where the storage cannot append,
        write them as one whole batch pack; return the bytes written. While a write batch
        holds the repack, the records of a landing (``most``) are blocks in the repack's final
        layout (by kind, at :data:`~castore.objectstore.repack.LANDING_LEVEL`), which the repack
        after the batch copies as they are, and another record is a plain zstd frame at
        :data:`~castore.objectstore.repack.HELD_RECORD_LEVEL` (compressed once more by that
        repack). A log past :data:`SEAL_BYTES` (:data:`HELD_SEAL_FACTOR`
        times that in a write batch) is sealed; a background repack is started then, and
        after every :data:`~castore.objectstore.repack.AUTO_REPACK_BATCHES` batch packs.

        Raises:
            StorageError: the backend failed (a log that failed is dropped: the next batch
                opens a new one).
            KeyMissing, TenantErased: the codec cannot seal (no key): nothing is written.
        """
        batch = False
        with self.packmap.lock:
            log = self._open_log()
            # in a write batch a landing's records (``most``) are blocks in the final layout,
            # which the repack after the batch copies as they are; another thread's, a plain
            # zstd frame at a low level (the dictionary codec costs 4x as much), compressed
            # again by that repack
            final = self.repacker.held and most is not None
            level = LANDING_LEVEL if final else HELD_RECORD_LEVEL if self.repacker.held else None
            if log is None:
                groups = [small] if most is None else [small[i:i + 1] for i in range(len(small))]
                data, where = packs.encode_pack_v2(groups, block_bytes=most or 0, level=level,
                                                   codec=self.packmap.codec)
                name = packs.content_name("b", data)
                self.storage.write(pack_key(name), data)
                self.packmap.add(name, where, sealed=True, scanned=len(data), version=2)
                size = len(data)
                self.repacker.note_written(name, small)  # a background repack merges it without reading it back
                self._batches += 1
                batch = self._batches % AUTO_REPACK_BATCHES == 0
            else:
                rec, where = packs.encode_records_v2(small, log.size, level, by_kind=final, codec=self.packmap.codec,
                                                     most=FINAL_RECORD_BYTES if final else most)
                try:
                    log.append(rec, sync=sync)
                except StorageError:
                    self._abandon()  # its torn tail is ignored; the next batch opens a new log
                    raise
                name = self._log_name
                self._tls.pending = "" if sync else name
                self.packmap.add(name, where, sealed=False, scanned=log.size, version=2)
                self.repacker.note_written(name, final=where if final else None)
                size = len(rec)
                if log.size >= SEAL_BYTES * (HELD_SEAL_FACTOR if self.repacker.held else 1) and not self._inflight:
                    self._seal()
                    self._reopen = True
                    batch = True
            if not self._new_packs or self._new_packs[-1] != name:
                self._new_packs.append(name)
        if batch:
            self.repacker.start()
        return size

    def written_packs(self) -> list[str]:
        """The packs this handle wrote into since the last call (for a ref's read hint)."""
        with self.packmap.lock:
            out, self._new_packs = self._new_packs, []
        return out

    def _open_log(self) -> Appender | None:
        """This handle's log, created if needed; None where the storage cannot append."""
        if self._log is not None and self._log_pid == os.getpid():
            return self._log
        self._drop_log()  # a forked child never appends to its parent's log
        if self.packmap.no_append:
            return None
        # no key, no log: a log of nothing but its header would be taken for the tenant's data
        # (KeyStore: a lost key file) and refuse every later write with the key
        self.packmap.codec.check_seal()
        name = packs.log_name()
        log = self.storage.open_appender(pack_key(name))
        if log is None:
            self.packmap.no_append = True
            return None
        try:
            # not synced: every record after it is made durable by an fdatasync of this file,
            # which takes the header with it, and a log whose header did not outlive a power
            # loss holds nothing, as one a crash stopped before its header (0.2 ms a new log)
            log.append(packs.PACK_MAGIC_V2, sync=False)
        except StorageError:
            log.close()
            raise
        self._log, self._log_name, self._log_pid = log, name, os.getpid()
        self.packmap.live = name
        self._journaled = refintents.DeltaBases()  # a new log: its first intent of a ref holds the whole value
        return log

    def close(self) -> None:
        """Seal this handle's log (write its index, so that repack may merge it at once) and
        release it; a log that holds ref intents (format 3) is merged instead into a pack of
        blocks without them (:meth:`_merge_log`). A failure to write the index or the pack
        leaves the log unsealed (a later repack merges it once it has been idle), and so does
        a ref swap of another thread still under way (its intent must stay live). The next
        write opens a new log. A close that sealed or merged its log then merges the small
        packs when the handle knows more than
        :data:`~castore.objectstore.repack.AUTO_PACK_LIMIT` of them
        (:meth:`~castore.objectstore.repack.Repacker.repack_if_due`): a process per turn
        leaves one pack per turn, and never seals a log large enough to start the
        background repack."""
        wrote = False
        with self.packmap.lock:
            if self._log is not None and self._log_pid == os.getpid():
                if self._log.size > packs.HEADER_SIZE and self._log_name in self.packmap and not self._inflight:
                    try:
                        if self._journaled:
                            self._merge_log()
                        else:
                            self._seal()
                        wrote = True
                    except (StorageError, IntegrityError):
                        pass  # still a valid log: scanned by readers, merged by repack when idle
                if self._log is not None:
                    self._log.close()
            self._drop_log()
        if wrote:
            self.repacker.repack_if_due()

    def _seal(self) -> None:
        """Write the index of this handle's log and stop appending to it. Its records are
        synced first, and the refs its intents moved (format 3): once it has an index, no
        recovery reads its intents (docs/FORMAT.md, 12)."""
        log, name = self._log, self._log_name
        assert log is not None
        where = self.packmap.places(name)
        log.sync()
        self._synced_logs.add(name)
        if self._journaled:
            self.storage.sync_keys(self._journaled.keys())
            self._journaled = refintents.DeltaBases()
        self.storage.write(index_key(name), packindex.encode_index(log.size, where))
        self.packmap.mark_sealed(name)
        log.close()
        self._drop_log()

    def _merge_log(self) -> None:
        """Close, format 3: merge this handle's log into a new pack of blocks with its index
        (:meth:`merge_packs`, as the background repack does, which leaves out its intent
        records), then delete the log (docs/FORMAT.md, 12: "Dropping the intents at close").
        The log is synced first, then the refs its intents moved (before the log goes); its
        objects are taken from memory when this handle still holds them all (else the log
        is read back and the merge finds the refs in its intents). The
        log stays held (``flock``) until it is deleted. Should the merge leave it (nothing
        to merge), it is sealed instead; a log of intents alone (the append of their objects
        sealed the log before it) is deleted once their refs are synced, as the merge would
        have: it left a sealed log with an empty index before. A log holding final blocks of
        a write batch is read back, for the merge to copy them.

        Raises:
            StorageError, IntegrityError: the merge failed; the log is left unsealed and
                whole (its refs may have been synced), and closed.
        """
        log, name = self._log, self._log_name
        assert log is not None
        try:
            log.sync()
            self._drop_log()  # no append from here on: the next write opens a new log
            # another thread's objects record in it, not yet named by an intent, is durable
            # and is merged: its swap, finding no live log, is made durable on its own
            self._synced_logs.add(name)
            keys, self._journaled = self._journaled.keys(), refintents.DeltaBases()
            # final blocks (a write batch's landings) are copied from the log as they are:
            # less work than laying out and compressing its objects again from memory
            groups = None if self.repacker.has_final(name) else self._log_groups(name)
            if groups is not None:
                self.storage.sync_keys(keys)  # read back instead, the merge syncs them itself
            held = None if groups is None else {name: groups}
            if self.repacker.merge_packs([name], by_mtime=False, held=held) is None:
                self.storage.sync_keys(keys)
                if self.packmap.places(name):
                    self.storage.write(index_key(name), packindex.encode_index(log.size, self.packmap.places(name)))
                    self.packmap.mark_sealed(name)
                else:  # intents only (its objects' append sealed the last log): not needed now
                    self.repacker.delete_packs([name])
        finally:
            log.close()

    def _log_groups(self, name: str) -> list[list[tuple[str, bytes]]] | None:
        """The objects of this handle's log ``name``, one group per record in write order,
        from the canonical bytes it keeps of recent writes (their ids were computed from
        them); None if any is no longer kept."""
        by_record: dict[int, list[tuple[int, str, bytes]]] = {}
        for oid, loc in self.packmap.places(name).items():
            canonical = self._recent.get(oid)
            if canonical is None or not isinstance(loc, Slot):
                return None
            by_record.setdefault(loc.offset, []).append((loc.start, oid, canonical))
        return [[(oid, c) for _, oid, c in sorted(items)] for _, items in sorted(by_record.items())]

    # -- format 3: ref intents in the log (docs/FORMAT.md, 12) ----------------------------
    @property
    def defers_refs(self) -> bool:
        """Whether ref swaps may be journaled in this handle's log (format 3, durable storage
        that can append): then an append's objects record is not synced on its own."""
        return self.journals and self.storage.durable and not self.packmap.no_append

    def journal(self, intent: RefIntent) -> bool:
        """Append ``intent`` to this handle's log and sync it (which also makes this thread's
        unsynced objects record durable: same file); True if done. False where this handle
        can open no log (the swap is then made durable on its own). Called by the storage
        under the ref's lock; :meth:`settle` is called once the swap is over.

        Raises:
            StorageError: the log cannot be written, or this thread's objects record went
                into a log that failed before it was synced (the swap must not land).
        """
        return self.journal_many((intent,))

    def journal_many(self, intents: Sequence[RefIntent]) -> bool:
        """:meth:`journal` for the intents of one :meth:`~castore.storage.Storage.swap_many`
        (distinct refs, all locked): one record each, appended with one write and synced
        once; True if done, False where this handle can open no log (a new one is opened
        when the last was sealed). The loose objects this
        thread wrote unsynced (:meth:`note_unsynced`) are synced first, in either case.

        Raises:
            StorageError: as :meth:`journal` (none of the swaps may land).
        """
        pending = getattr(self._tls, "pending", "")
        loose = getattr(self._tls, "loose", None)
        if loose:
            self.storage.sync_keys(loose)  # before any intent: a ref must not outlive its objects
            loose.clear()
        with self.packmap.lock:
            live = self._log is not None and self._log_pid == os.getpid() and self.journals
            if pending and not (live and self._log_name == pending):
                if not self.packmap.is_sealed(pending) and pending not in self._synced_logs:
                    # sealing syncs a log (a repack may have merged it since: p is None):
                    # only a failed one whose sync failed too is left
                    raise StorageError(f"the objects of this append, in {pending}, were not made durable "
                                       "(the log failed); nothing was stored, try again", self.storage.url)
            if not live and self._reopen:
                # sealed by the last append: a new log for these intents, not a sync per ref
                live = self._open_log() is not None
            if not live:
                return False
            log = self._log
            assert log is not None
            records: list[bytes] = []
            for intent in intents:
                # a delta only of the value this log's previous intent of the ref wrote: a
                # recovery then rebuilds it from this log alone (docs/FORMAT.md, 12)
                base = self._journaled.base(intent.old)
                ok = base is not None and base.key == intent.key and base.boot == intent.boot
                # (the refs are distinct: no intent of the batch is another's base)
                records.append(refintents.encode_intent(intent, base if ok else None))
            try:
                log.append(records[0] if len(records) == 1 else b"".join(records))
            except StorageError:
                self._abandon()
                raise
            self.packmap.add(self._log_name, {}, sealed=False, scanned=log.size, version=2)
            for intent in intents:
                self._journaled.add(intent)
            self._tls.pending = ""
            if not getattr(self._tls, "inflight", False):
                self._tls.inflight = True
                self._inflight += 1
        return True

    def note_unsynced(self, keys: list[str]) -> None:
        """Loose objects this thread wrote unsynced (format 3): the next :meth:`journal_many`
        of this thread syncs them before its intents."""
        got = getattr(self._tls, "loose", None)
        if got is None:
            got = self._tls.loose = []
        got.extend(keys)

    def _abandon(self) -> None:
        """Drop this handle's log after a failed append. In format 3 its records may not be
        synced yet (they wait for a ref intent): they are synced by path, once, best effort;
        a log that cannot be synced makes the swaps of its records fail (:meth:`journal`)."""
        self._drop_log()
        if self.journals and self.storage.durable:
            try:
                self.storage.sync_keys([pack_key(self._log_name)])
            except StorageError:
                return
            self._synced_logs.add(self._log_name)

    def settle(self) -> None:
        """The ref swap that called :meth:`journal` in this thread is over (landed or not):
        the log may be sealed again."""
        if getattr(self._tls, "inflight", False):
            self._tls.inflight = False
            with self.packmap.lock:
                self._inflight -= 1

    def log_intents(self, boot: str) -> list[RefIntent]:
        """The ref intents of ``boot`` in every log without an index (what a recovery after a
        power loss replays; sealed logs' intents are no longer needed).

        Raises:
            StorageError: the backend failed.
        """
        return log_intents(self.storage, boot)


def log_intents(storage: Storage, boot: str) -> list[RefIntent]:
    """The ref intents of ``boot`` in every writer's log of ``storage`` without an index: what
    a recovery after a power loss replays (sealed logs' intents are no longer needed). Needs no
    object store: :func:`castore.refs.recover` calls it when a replay is due.

    Raises:
        StorageError: the backend failed.
    """
    listed = set(storage.list_dir(PACKS))
    logs = sorted(n for n in listed if n.startswith("w-") and n.endswith(packs.PACK_SUFFIX)
                  and n[:-len(packs.PACK_SUFFIX)] + packs.INDEX_SUFFIX not in listed)
    got = storage.read_many([f"{PACKS}/{n}" for n in logs]) if logs else {}
    return [i for data in got.values() if data is not None for i in refintents.intents(data) if i.boot == boot]


__all__ = ["WriterLog", "SEAL_BYTES", "HELD_SEAL_FACTOR", "log_intents"]
