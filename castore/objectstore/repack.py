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

:class:`Repacking` is the part of :class:`~castore.objectstore.ObjectStore` that does it:
the merge (:meth:`~Repacking.merge_packs`, also what ``castore repack`` calls) and
the background repack of normal writes (:meth:`~Repacking.auto_repack_once`, run in a
thread of the handle, like git's ``gc --auto`` or Delta Lake's checkpoint). The attributes
declared on the class are the store's state it reads and updates.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from .. import objects as o
from ..errors import IntegrityError
from ..storage import Appender, Storage
from . import packs
from .packs import PACKS, Slot, index_key, pack_key

#: background repack reads at most this many bytes of packs per run (the rest waits its turn)
AUTO_REPACK_MAX_BYTES = 256 << 20


class Repacking:
    """Merging packs, in the foreground or in a background thread of an object store."""

    # the object store's state this part uses (set by ObjectStore.__init__)
    storage: Storage
    auto_repack: bool
    repack_error: BaseException | None
    _repacker: threading.Thread | None
    _repack_again: bool
    _lock: threading.RLock
    _own: OrderedDict[str, list[tuple[str, bytes]]]
    _seq: dict[str, int]
    _sizes: dict[str, int]
    _moved: OrderedDict[str, str]
    _log: Appender | None
    _log_name: str
    _no_append: bool

    def _write_groups(self, groups: Sequence[Sequence[tuple[str, bytes]]]) -> str:
        raise NotImplementedError  # ObjectStore's: writes one pack of blocks and its index

    def delete_packs(self, names: Sequence[str]) -> None:
        """Delete packs and their indexes in batches (ObjectStore's)."""
        raise NotImplementedError

    def merge_packs(self, names: Iterable[str], extra: Sequence[tuple[str, bytes]] = (),
                    by_mtime: bool = True,
                    held: Mapping[str, Sequence[Sequence[tuple[str, bytes]]]] | None = None) -> str | None:
        """Merge packs, and ``extra`` ``(id, canonical bytes)`` objects, into one new pack with
        its index, then delete the merged packs (repack; docs/FORMAT.md, 8). Objects keep their
        write order (oldest pack first, record by record) and are compressed in blocks of about
        :data:`BLOCK_BYTES`, so that neighbours (a segment and the commits it copies, one
        message and the next) share their bytes; inside a block they are laid out by kind
        (commits and trees first: :func:`castore.objectstore.packs.block_layout`). Every object is
        verified on the way.

        Safe against a concurrent repack or gc: a pack gone meanwhile is skipped (whoever
        deleted it had first written its objects into another pack), and a pack is deleted only
        after the new one is durable, so a kill at any point loses nothing. A sealed pack whose
        bytes stop short of a damaged record is left alone. Returns the new pack's name, or None
        when there was nothing to merge. Without ``by_mtime`` (an object store, where an age
        costs a HEAD), packs this handle wrote keep their order and the others come first.
        ``held`` gives the objects of some of the packs, as groups in write order, that the
        caller has in memory (its own log at close): those are not read back, and the caller
        has synced the refs of their intents.

        Raises:
            IntegrityError: an object does not hash to its id (nothing is deleted).
            StorageError: the backend failed.
        """
        chosen = [n for n in dict.fromkeys(names) if packs.is_pack_name(n)]
        if by_mtime:
            order = {n: (self.storage.mtime(pack_key(n)) or 0.0, n) for n in chosen}
        else:
            order = {n: (float(self._seq.get(n, -1)), n) for n in chosen}
        with self._lock:
            own = {n: [self._own[n]] for n in chosen if n in self._own}
        own.update((n, [list(g) for g in held[n]]) for n in chosen if held and n in held)
        seen: set[str] = set()
        groups: list[list[tuple[str, bytes]]] = []
        for oid, canonical in extra:
            if oid not in seen:
                seen.add(oid)
                groups.append([(oid, canonical)])
        unread = [pack_key(n) for n in chosen if n not in own]
        datas = self.storage.read_many(unread) if unread else {}
        done: list[str] = []
        for name in sorted(chosen, key=lambda n: order[n]):
            found: list[list[tuple[str, bytes]]] | None
            if name in own:
                found = own[name]  # written by this handle: its objects are still in memory
            else:
                data = datas.get(pack_key(name))
                if data is None:
                    continue  # merged or collected by someone else since it was chosen
                found = self._pack_groups(name, data)
            if found is None:
                continue
            done.append(name)
            for group in found:
                fresh = [(oid, c) for oid, c in group if oid not in seen]
                seen.update(oid for oid, _ in fresh)
                if fresh:
                    groups.append(fresh)
        if not groups or (len(done) < 2 and not extra and done and done[0].startswith("r-")):
            return None
        self._sync_intent_refs([n for n in done if n.startswith("w-") and n not in own], datas)
        new = self._write_groups(groups)
        self.delete_packs([n for n in done if n != new])  # one batched delete, not one per pack
        with self._lock:
            for name in done:
                self._own.pop(name, None)
                if name != new:
                    self._moved[name] = new
            while len(self._moved) > 4096:
                self._moved.popitem(last=False)
        return new

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
                keys.update(i.key for i in packs.intents(data))
        if keys:
            self.storage.sync_keys(sorted(keys))

    def live_packs(self, names: Sequence[str]) -> list[str]:
        """``names`` (oldest first) with each pack that a repack by this handle merged
        replaced by the pack it went into, each name once, at its newest place: what a read
        hint should name after a background repack (docs/FORMAT.md, 6 and 8)."""
        out: list[str] = []
        with self._lock:
            for name in names:
                for _ in range(64):  # a chain of merges: r-1 merged into r-2 ...
                    nxt = self._moved.get(name)
                    if nxt is None:
                        break
                    name = nxt
                out.append(name)
        return list(reversed(dict.fromkeys(reversed(out))))

    def _pack_groups(self, name: str, data: bytes) -> list[list[tuple[str, bytes]]] | None:
        """The objects of a pack's bytes as ``(id, canonical bytes)`` groups in write order
        (one per version-2 record, in the order of its content: a repacked block's is by kind,
        stable when laid out again; one per object in a version-1 pack), each verified; None
        for a pack with a damaged record, or a sealed one whose records stop short of its
        end (damage: left for fsck).

        Raises:
            IntegrityError: an object does not hash to its id.
        """
        try:
            version = packs.pack_version(data)
        except IntegrityError:
            return None
        if not version:
            return []
        contents: dict[int, bytes] = {}
        damaged: list[tuple[int, int]] = []
        where, end = packs.scan(data, contents=contents, damaged=damaged)
        if damaged:
            return None  # a damaged record: left whole for fsck and a human, never dropped
        if end != len(data) and not (name.startswith("w-") and not self.storage.exists(index_key(name))):
            return None  # a complete pack that does not scan to its end: do not drop what follows
        if version == 2:
            by_record: dict[int, list[tuple[int, str, bytes]]] = {}
            for oid, loc in where.items():
                assert isinstance(loc, Slot)
                content = contents[loc.offset]
                # the id was computed from these very bytes by the scan
                by_record.setdefault(loc.offset, []).append((loc.start, oid, content[loc.start:loc.start + loc.length]))
            return [[(oid, c) for _, oid, c in sorted(items)] for _, items in sorted(by_record.items())]
        return [[(oid, o.from_stored(oid, bytes(data[loc.offset:loc.offset + loc.size])))]
                for oid, loc in sorted(where.items(), key=lambda kv: kv[1].offset)]

    # -- background repack ------------------------------------------------------------
    def _start_repack(self) -> None:
        """Run :meth:`auto_repack_once` in a background thread, unless one is running or
        ``auto_repack`` is off. Never raises: an append must not fail because of it."""
        if not self.auto_repack:
            return
        with self._lock:
            if self._repacker is not None and self._repacker.is_alive():  # (not alive: a forked child's)
                # a run is going: it runs once more when done, for the packs written since it
                # listed (dropping this request left up to twice the batch packs behind)
                self._repack_again = True
                return
            t = threading.Thread(target=self._repack_quietly, name="castore-repack", daemon=True)
            self._repacker = t
            self._repack_again = False
        t.start()

    def _repack_quietly(self) -> None:
        while True:
            failed = False
            try:
                self.auto_repack_once()
            except Exception as e:  # noqa: BLE001 - a background merge must never fail an append; kept for the caller
                self.repack_error, failed = e, True
            with self._lock:
                if failed or not self._repack_again:  # a failed run is not repeated at once
                    self._repacker = None  # under the lock: a request after this starts a new run
                    return
                self._repack_again = False

    def wait_repack(self) -> None:
        """Wait for this handle's background repack, if one is running (with the run it owes
        for appends made while it ran)."""
        t = self._repacker
        if t is not None and t is not threading.current_thread():
            t.join()

    def auto_repack_once(self, max_bytes: int = AUTO_REPACK_MAX_BYTES) -> str | None:
        """One bounded geometric repack of the sealed packs (what a writer runs in the
        background; docs/FORMAT.md, 8): every sealed log and batch pack (their records were
        compressed one by one) and the repacked packs the geometric rule picks, smallest
        first, up to ``max_bytes``. A log without an index (a live writer's) is never
        touched; on object storage only the packs this handle wrote are merged.
        One listing and one batch read of indexes; no lock held while reading or
        writing. Returns the new pack's name, or None.

        Raises:
            IntegrityError, StorageError (see :meth:`merge_packs`).
        """
        listed: dict[str, bool] = {}
        for n in self.storage.list_dir(PACKS):
            stem, dot, ext = n.rpartition(".")
            if dot and packs.is_pack_name(stem) and "." + ext in (packs.PACK_SUFFIX, packs.INDEX_SUFFIX):
                listed[stem] = listed.get(stem, False) or "." + ext == packs.INDEX_SUFFIX
        with self._lock:
            live = self._log_name if self._log is not None else ""
        sealed = {n for n, has_index in listed.items() if n != live and (has_index or n.startswith("b-"))}
        if self._no_append:
            # object storage: only the packs this handle wrote (its batch packs are still in
            # memory). Writers merging each other's packs GET, rewrite and DELETE the same
            # packs over and over: ~19 extra requests per append for 16 writers
            # (BENCHMARKS-fleet.md). Other writers' packs are theirs, or `castore repack`'s.
            sealed &= self._seq.keys()
        sizes: dict[str, int] = {n: 0 for n in sealed if n.startswith("b-")}
        indexed = sorted(n for n in sealed if listed[n])
        unknown = [n for n in indexed if n not in self._sizes]  # sealed packs never change: read once
        raw = self.storage.read_many([index_key(n) for n in unknown]) if unknown else {}
        for n in unknown:
            got = raw.get(index_key(n))
            if got is None:
                continue
            try:
                self._sizes[n] = packs.IndexView(got).pack_size
            except IntegrityError:
                continue  # a damaged index: left for an explicit repack or fsck
        sizes.update((n, self._sizes[n]) for n in indexed if n in self._sizes)
        chosen = set(geometric(list(sizes.items()))) | {n for n in sizes if not n.startswith("r-")}
        take: list[str] = []
        total = 0
        for n in sorted(chosen, key=lambda n: (sizes[n], n)):
            if take and total + sizes[n] > max_bytes:
                break
            take.append(n)
            total += sizes[n]
        if not take or (len(take) == 1 and take[0].startswith("r-")):
            return None
        return self.merge_packs(take, by_mtime=not self._no_append)


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


__all__ = ["Repacking", "geometric", "AUTO_REPACK_MAX_BYTES"]
