"""The writer's log: a local handle's pack file that batches are appended to (docs/FORMAT.md, 4 and 12).

On storage that can append (local disk), each handle writes the small objects of every batch
as one record appended to its own log, ``packs/w-<...>.pack`` (:meth:`WriterLog._open_log`).
Past :data:`~castore.objectstore.SEAL_BYTES` the log is *sealed*: synced and given its index
(:meth:`~WriterLog._seal`). In format 3 a ref swap is journaled in the log as an *intent*
record (:meth:`~WriterLog.journal`), whose sync also makes the objects record before it
durable; a log holding intents is merged at close into an ``r-`` pack of blocks without them
(:meth:`~WriterLog._merge_log`), and a recovery after a power loss replays the intents of
the logs without an index (:meth:`~WriterLog.log_intents`).

:class:`WriterLog` is the part of :class:`~castore.objectstore.ObjectStore` that does it; it
records its appends in the pack map (:class:`~castore.objectstore.packmap.PackReader`) and merges
through :class:`~castore.objectstore.repack.Repacking`. The attributes declared on the class are
the store's state it reads and updates.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

from ..errors import StorageError
from ..storage import Appender, RefIntent
from . import packs
from .packmap import PackReader
from .packs import PACKS, Slot, index_key, pack_key
from .repack import Repacking


class WriterLog(PackReader, Repacking):
    """This handle's log: appending to it, sealing it, journaling ref intents in it (format 3)
    and merging it away at close."""

    # the object store's state this part uses (set by ObjectStore.__init__)
    format: int
    _recent: Mapping[str, bytes]
    _log_pid: int
    _journaled: packs.DeltaBases
    _synced_logs: set[str]
    _inflight: int
    _tls: threading.local

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
            log.append(packs.PACK_MAGIC_V2)
        except StorageError:
            log.close()
            raise
        self._log, self._log_name, self._log_pid = log, name, os.getpid()
        self._journaled = packs.DeltaBases()  # a new log: its first intent of a ref holds the whole value
        return log

    def _seal(self) -> None:
        """Write the index of this handle's log and stop appending to it. Its records are
        synced first, and the refs its intents moved (format 3): once it has an index, no
        recovery reads its intents (docs/FORMAT.md, 12)."""
        log, name = self._log, self._log_name
        assert log is not None
        pack = self._packs[name]
        log.sync()
        self._synced_logs.add(name)
        if self._journaled:
            self.storage.sync_keys(self._journaled.keys())
            self._journaled = packs.DeltaBases()
        self.storage.write(index_key(name), packs.encode_index(log.size, pack.where))
        pack.sealed = True
        log.close()
        self._log = None

    def _merge_log(self) -> None:
        """Close, format 3: merge this handle's log into a new pack of blocks with its index
        (:meth:`merge_packs`, as the background repack does, which leaves out its intent
        records), then delete the log (docs/FORMAT.md, 12: "Dropping the intents at close").
        The log is synced first, then the refs its intents moved (before the log goes); its
        objects are taken from memory when this handle still holds them all (else the log
        is read back and the merge finds the refs in its intents). The
        log stays held (``flock``) until it is deleted. Should the merge leave it (nothing
        to merge), it is sealed instead.

        Raises:
            StorageError, IntegrityError: the merge failed; the log is left unsealed and
                whole (its refs may have been synced), and closed.
        """
        log, name = self._log, self._log_name
        assert log is not None
        try:
            log.sync()
            self._log = None  # no append from here on: the next write opens a new log
            # another thread's objects record in it, not yet named by an intent, is durable
            # and is merged: its swap, finding no live log, is made durable on its own
            self._synced_logs.add(name)
            keys, self._journaled = self._journaled.keys(), packs.DeltaBases()
            groups = self._log_groups(name)
            if groups is not None:
                self.storage.sync_keys(keys)  # read back instead, the merge syncs them itself
            if self.merge_packs([name], by_mtime=False, held=None if groups is None else {name: groups}) is None:
                self.storage.sync_keys(keys)
                self.storage.write(index_key(name), packs.encode_index(log.size, self._packs[name].where))
                self._packs[name].sealed = True
        finally:
            log.close()

    def _log_groups(self, name: str) -> list[list[tuple[str, bytes]]] | None:
        """The objects of this handle's log ``name``, one group per record in write order,
        from the canonical bytes it keeps of recent writes (their ids were computed from
        them); None if any is no longer kept."""
        by_record: dict[int, list[tuple[int, str, bytes]]] = {}
        for oid, loc in self._packs[name].where.items():
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
        return self.format >= 3 and self.storage.durable and not self._no_append

    def journal(self, intent: RefIntent) -> bool:
        """Append ``intent`` to this handle's log and sync it (which also makes this thread's
        unsynced objects record durable: same file); True if done. False when this handle
        has no open log (the swap is then made durable on its own). Called by the storage
        under the ref's lock; :meth:`settle` is called once the swap is over.

        Raises:
            StorageError: the log cannot be written, or this thread's objects record went
                into a log that failed before it was synced (the swap must not land).
        """
        return self.journal_many((intent,))

    def journal_many(self, intents: Sequence[RefIntent]) -> bool:
        """:meth:`journal` for the intents of one :meth:`~castore.storage.Storage.swap_many`
        (distinct refs, all locked): one record each, appended with one write and synced
        once; True if done, False when this handle has no open log.

        Raises:
            StorageError: as :meth:`journal` (none of the swaps may land).
        """
        pending = getattr(self._tls, "pending", "")
        with self._lock:
            live = self._log is not None and self._log_pid == os.getpid() and self.format >= 3
            if pending and not (live and self._log_name == pending):
                p = self._packs.get(pending)
                if (p is None or not p.sealed) and pending not in self._synced_logs:
                    # sealing syncs a log (a repack may have merged it since: p is None):
                    # only a failed one whose sync failed too is left
                    raise StorageError(f"the objects of this append, in {pending}, were not made durable "
                                       "(the log failed); nothing was stored, try again", self.storage.url)
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
                records.append(packs.encode_intent(intent, base if ok else None))
            try:
                log.append(records[0] if len(records) == 1 else b"".join(records))
            except StorageError:
                self._abandon()
                raise
            self._add(self._log_name, {}, sealed=False, scanned=log.size, version=2)
            for intent in intents:
                self._journaled.add(intent)
            self._tls.pending = ""
            if not getattr(self._tls, "inflight", False):
                self._tls.inflight = True
                self._inflight += 1
        return True

    def _abandon(self) -> None:
        """Drop this handle's log after a failed append. In format 3 its records may not be
        synced yet (they wait for a ref intent): they are synced by path, once, best effort;
        a log that cannot be synced makes the swaps of its records fail (:meth:`journal`)."""
        self._log = None
        if self.format >= 3 and self.storage.durable:
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
            with self._lock:
                self._inflight -= 1

    def log_intents(self, boot: str) -> list[RefIntent]:
        """The ref intents of ``boot`` in every log without an index (what a recovery after a
        power loss replays; sealed logs' intents are no longer needed).

        Raises:
            StorageError: the backend failed.
        """
        listed = set(self.storage.list_dir(PACKS))
        logs = sorted(n for n in listed if n.startswith("w-") and n.endswith(packs.PACK_SUFFIX)
                      and n[:-len(packs.PACK_SUFFIX)] + packs.INDEX_SUFFIX not in listed)
        got = self.storage.read_many([f"{PACKS}/{n}" for n in logs]) if logs else {}
        return [i for data in got.values() if data is not None for i in packs.intents(data) if i.boot == boot]
