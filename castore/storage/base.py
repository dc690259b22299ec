"""The storage contract: bytes in and out of keys under one root URL.

Every backend (local disk, memory, S3, any other fsspec file system) implements
:class:`Storage`. Keys are relative, ``/``-separated paths made only of segments that
:mod:`castore.names` or the object layout produce. Two kinds of writes exist:

* plain writes, used for write-once objects (writing the same bytes again is harmless);
* conditional writes on small mutable files (refs): :meth:`Storage.read_versioned`
  returns the bytes and an opaque version token; :meth:`Storage.swap` replaces the file
  only if it still has that token (``None``: only if it does not exist), atomically, and
  raises :class:`PreconditionFailed` otherwise.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from ..errors import CastoreError, InvalidName, StorageError

#: the stamp of a ref folder changed too recently for its stamp to be trusted
#: (:meth:`Storage.ref_stamps`): it equals no stamp taken later
UNSETTLED = -2

Token = str


class Versioned(NamedTuple):
    """The bytes of a mutable file and the token that names this version of it."""

    data: bytes
    token: Token


class RefIntent(NamedTuple):
    """A ref change about to be made by a swap whose rename is not synced (docs/FORMAT.md, 12):
    the redo record a journal keeps durable before the change lands, or, with ``data`` None,
    a delete (``new`` None) or a check that the ref still holds ``old`` (``new == old``).

    Attributes:
        key: the storage key of the ref (under ``refs/``).
        old: the token the ref had when the change was decided (None: absent).
        new: the token of ``data`` (None: the ref is deleted).
        data: the bytes written (None for a delete or a check).
        boot: the id of the boot the change was made in.
        stamp: CLOCK_MONOTONIC nanoseconds, taken under the ref's lock (orders the changes
            of one ref within a boot, across processes).
    """

    key: str
    old: Token | None
    new: Token | None
    data: bytes | None
    boot: str
    stamp: int


#: called by :meth:`Storage.swap` under the ref's lock, after the compare passed: keeps the
#: intent durable (True), or declines (False: the swap is then made durable on its own)
Journal = Callable[[RefIntent], bool]
#: called by :meth:`Storage.swap_many` under the locks of all its refs, after their compares
#: passed: keeps all their intents durable at once (True), or declines (False)
JournalMany = Callable[[Sequence[RefIntent]], bool]


class PreconditionFailed(CastoreError):
    """A conditional write or delete found the file in another state than expected.

    Attributes:
        key: the storage key.
        expected: the token the caller expected (None: expected absent).
    """

    def __init__(self, key: str, expected: Token | None) -> None:
        super().__init__(f"{key}: condition failed (expected {'absent' if expected is None else expected})")
        self.key = key
        self.expected = expected


class DeleteIncomplete(StorageError):
    """A :meth:`Storage.delete_many` that failed part-way: some keys may still be stored.

    Attributes:
        remaining: the keys that may still be stored (the failed ones and those not tried),
            in the order given; every other key was deleted.
    """

    def __init__(self, url: str, remaining: list[str], reason: str) -> None:
        shown = ", ".join(remaining[:5]) + (f" and {len(remaining) - 5} more" if len(remaining) > 5 else "")
        super().__init__(f"deleting from {url} stopped with {len(remaining)} key(s) left ({shown}): {reason}", url)
        self.remaining = remaining


def check_key(key: str, prefix: bool = False) -> str:
    """Check that ``key`` is a relative key that stays inside the store's root.

    A key is ``/``-separated segments, none empty, ``.`` or ``..``, with no NUL; it does not
    start with ``/``. A folder ``prefix`` may also be empty or end with one ``/`` (dropped).
    Every backend calls this, whatever its caller, so that no name read from a remote or a
    listing can make a backend touch a file outside its root.

    Returns:
        The key (a prefix without its trailing ``/``).

    Raises:
        InvalidName: naming the key and what is wrong with it.
    """
    if not isinstance(key, str):
        raise InvalidName(key, "a storage key must be a string", "storage key")
    if prefix:
        if not key:
            return key
        if key.endswith("/"):
            key = key[:-1]
    if not key or key[0] == "/" or "//" in key or key[-1] == "/":
        raise InvalidName(key, "not a relative path of non-empty segments", "storage key")
    if "\0" in key:
        raise InvalidName(key, "contains a NUL character", "storage key")
    if "." in key and any(seg in (".", "..") for seg in key.split("/")):
        raise InvalidName(key, "'.' and '..' segments could leave the store", "storage key")
    return key


class Appender(ABC):
    """An append-only log that one writer owns: each :meth:`append` is durable on return
    (when the storage is durable) and lands whole or is ignored by readers as a torn tail."""

    key: str
    #: the log's size in bytes, which is where the next append starts
    size: int

    @abstractmethod
    def append(self, data: bytes, sync: bool = True) -> int:
        """Append ``data``; return the offset it starts at. With ``sync`` False the append
        is not made durable yet: a later synced append (or :meth:`sync`) covers it.

        Raises:
            StorageError: the write failed (the log must not be appended to again).
        """

    def sync(self) -> None:  # noqa: B027 - appenders without unsynced appends have nothing to do
        """Make every append so far durable.

        Raises:
            StorageError: the sync failed (the log must not be appended to again).
        """

    @abstractmethod
    def close(self) -> None:
        """Release the log (it is not appended to again)."""


class Storage(ABC):
    """Bytes by key under one root URL. See the module docstring for the contract."""

    #: the URL this storage was opened with (credentials never included)
    url: str
    #: whether writes are made durable (fsync) before returning
    durable: bool = True

    @abstractmethod
    def read(self, key: str) -> bytes:
        """Return the bytes stored at ``key``.

        Raises:
            FileNotFoundError: nothing is stored there.
            StorageError: the backend failed.
        """

    def read_many(self, keys: Iterable[str]) -> dict[str, bytes | None]:
        """Read several keys at once (concurrently where the backend allows).

        Returns:
            A dict from each key to its bytes, or None where nothing is stored.

        Raises:
            StorageError: the backend failed for a reason other than a missing key.
        """
        out: dict[str, bytes | None] = {}
        for k in keys:
            try:
                out[k] = self.read(k)
            except FileNotFoundError:
                out[k] = None
        return out

    @abstractmethod
    def write(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key``, replacing what was there (not atomic against rivals).

        Raises:
            StorageError: the backend failed.
        """

    def write_many(self, items: Mapping[str, bytes]) -> None:
        """Store several keys at once (concurrently where the backend allows).

        Raises:
            StorageError: the backend failed; some keys may have been written.
        """
        for k, v in items.items():
            self.write(k, v)

    def write_unsynced(self, items: Mapping[str, bytes]) -> bool:
        """:meth:`write_many`, leaving what makes the writes durable to a later
        :meth:`sync_keys` of their keys when the backend can (True: local disk, where that
        saves a sync per file); False when they were written as :meth:`write_many` writes.

        Raises:
            StorageError: the backend failed; some keys may have been written.
        """
        self.write_many(items)
        return False

    @abstractmethod
    def read_versioned(self, key: str) -> Versioned | None:
        """Read a mutable file and its version token; None when it does not exist.

        Raises:
            StorageError: the backend failed.
        """

    @abstractmethod
    def swap(self, key: str, data: bytes, expect: Token | None, journal: Journal | None = None) -> Token:
        """Atomically replace ``key`` with ``data`` if its token is ``expect``.

        ``expect=None`` creates the file only if it does not exist. ``journal``: where a
        backend that can defer the durability of the change (local disk, format 3) keeps its
        intent durable first (docs/FORMAT.md, 12); backends whose write is durable on its own
        (a conditional PUT) ignore it.

        Returns:
            The new version token.

        Raises:
            PreconditionFailed: the file is not in the expected state.
            StorageError: the backend failed; the write may or may not have landed.
        """

    def swap_many(self, items: Sequence[tuple[str, bytes, Token | None]],
                  journal: JournalMany | None = None) -> builtins.list[Token | Exception]:
        """:meth:`swap` each ``(key, data, expect)`` (distinct keys); return, per item in
        order, the new token or the exception its swap raised (:class:`PreconditionFailed`,
        :class:`~castore.errors.StorageError`: as :meth:`swap`, each item alone). Here one
        :meth:`swap` after the other, each intent journaled on its own; local disk takes
        every lock first and journals all the intents with one sync (docs/FORMAT.md, 12).

        Raises:
            StorageError: the backend failed before any item was swapped (none landed).
        """
        out: builtins.list[Token | Exception] = []
        for key, data, expect in items:
            try:
                if journal is None:
                    out.append(self.swap(key, data, expect))
                else:
                    out.append(self.swap(key, data, expect, lambda intent: journal((intent,))))
            except (PreconditionFailed, StorageError) as e:
                out.append(e)
        return out

    @abstractmethod
    def delete(self, key: str, expect: Token | None = None) -> None:
        """Delete ``key``; with ``expect``, only if it still has that token.

        Deleting a missing key without ``expect`` is not an error.

        Raises:
            PreconditionFailed: ``expect`` was given and does not match (or the key is gone).
            StorageError: the backend failed.
        """

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete several keys (each once, missing ones ignored), in as few requests as the
        backend allows: here one :meth:`delete` per key, in the order given; on S3 one
        multi-object delete per 1,000 keys.

        Raises:
            InvalidName: a key is not a valid storage key (nothing is deleted).
            DeleteIncomplete: the backend failed part-way; ``remaining`` names the keys that
                may still be stored (every other key was deleted).
        """
        todo = [check_key(k) for k in dict.fromkeys(keys)]
        for i, k in enumerate(todo):
            try:
                self.delete(k)
            except StorageError as e:
                raise DeleteIncomplete(self.url, todo[i:], str(e)) from e

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """List every key below the folder ``prefix`` (recursive), relative to the root.

        Raises:
            StorageError: the backend failed.
        """

    @abstractmethod
    def list_dir(self, prefix: str) -> builtins.list[str]:
        """List the immediate children names (files and folders) of the folder ``prefix``.

        Returns an empty list when the folder does not exist.

        Raises:
            StorageError: the backend failed.
        """

    def exists(self, key: str) -> bool:
        """Whether something is stored at ``key``.

        Raises:
            StorageError: the backend failed.
        """
        try:
            self.read(key)
        except FileNotFoundError:
            return False
        return True

    def read_range(self, key: str, offset: int, size: int) -> bytes:
        """Return ``size`` bytes of ``key`` from ``offset`` (fewer if the file is shorter).

        Raises:
            FileNotFoundError: nothing is stored there.
            StorageError: the backend failed.
        """
        return self.read(key)[offset:offset + size]

    def read_heads(self, keys: Iterable[str], size: int) -> dict[str, bytes | None]:
        """The first ``size`` bytes of several keys (all of a shorter one), concurrently where
        the backend allows: one ranged read each (:meth:`read_range`).

        Returns:
            A dict from each key to its first bytes, or None where nothing is stored.

        Raises:
            StorageError: the backend failed for a reason other than a missing key.
        """
        out: dict[str, bytes | None] = {}
        for k in keys:
            try:
                out[k] = self.read_range(k, 0, size)
            except FileNotFoundError:
                out[k] = None
        return out

    def open_appender(self, key: str) -> Appender | None:
        """Create ``key`` as an append-only log owned by this handle, or None if the backend
        cannot append (object stores: write whole packs instead).

        Raises:
            StorageError: the backend failed.
        """
        return None

    def is_held(self, key: str) -> bool:
        """Whether a live :class:`Appender` still owns the log at ``key`` (never, where the
        backend has no appenders)."""
        return False

    def delete_if_older(self, key: str, cutoff: float) -> bool:
        """Delete ``key`` only if it was last written before the POSIX time ``cutoff``,
        checking its age right before the deletion; True if it was deleted.

        Backends without an atomic way to do this leave a window of one call between the
        check and the deletion.

        Raises:
            StorageError: the backend failed.
        """
        t = self.mtime(key)
        if t is None or t >= cutoff:
            return False
        self.delete(key)
        return True

    def mtime(self, key: str) -> float | None:
        """The modification time of ``key`` as a POSIX timestamp, or None if missing.

        Raises:
            StorageError: the backend failed.
        """
        return None

    def swaps_since(self, mark: str | None) -> tuple[str, builtins.list[str] | None] | None:
        """The keys that :meth:`swap` or :meth:`delete` changed since ``mark``, cheaply.

        A derived-data reader (the search index) calls this instead of re-reading every ref
        to learn that nothing changed. Returns ``(new mark, keys)``: keys swapped or deleted
        after ``mark`` (``None`` when they cannot be told: no or a foreign ``mark``, a log
        that was replaced, a reboot since; then read everything). A change whose conditional
        write was under way at the call may be missing from ``keys``: such a key's lock is
        held, so :meth:`pending_swaps` names it. None: this backend keeps no such log.

        Raises:
            StorageError: the backend failed.
        """
        return None

    def ref_stamps(self, folders: Sequence[str], settled: int | None = None) -> builtins.list[int] | None:
        """A stamp of each folder of ``folders`` (keys below ``refs/``: a session's ref folder)
        that changes when a branch is made or removed in its ``heads/``, or the folder, whoever did it
        (a writer of this storage, or a hand deleting a file): what tells a reader of
        :meth:`swaps_since`, which logs only this storage's own changes, that a folder changed
        unlogged. None: this backend does not tell (it keeps no log either, so its readers
        read every ref).

        ``settled``: the time (ns since the epoch, this machine's clock) at which the caller
        began reading the folders' refs. A folder that changed too close to it, or after, gets
        :data:`UNSETTLED`, a stamp no later stamp equals: a change in the same tick of the
        file system's clock leaves its stamp as it was, so only a stamp taken once the folder's
        last change is older than a tick is kept as the refs' (a reader told UNSETTLED reads the
        folder's refs again next time).

        Raises:
            StorageError: the backend failed.
        """
        return None

    def pending_swaps(self, prefix: str) -> builtins.list[str]:
        """Keys below the folder ``prefix`` whose conditional write is under way (or was left
        half-done by a dead writer): their change may not be in :meth:`swaps_since` yet.

        Raises:
            StorageError: the backend failed.
        """
        return []

    def recover_refs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> int:
        """Replay the journaled ref changes of a boot that ended without making them durable
        (a power loss), before anything reads a ref; ``intents_of(boot)`` returns the intents
        the writers' logs hold for that boot. Returns how many refs were changed. Backends
        without a journal have nothing to do.

        Raises:
            StorageError: the backend failed (the journal is kept for the next open).
        """
        return 0

    def compact_ref_logs(self, intents_of: Callable[[str], builtins.list[RefIntent]]) -> None:  # noqa: B027
        """Bound the logs of ref changes the backend keeps beside the refs, and drop from them
        the names no one needs any more (what ``gc`` calls, so that a deleted ref's name does
        not outlive it): a reader's mark into a replaced log makes :meth:`swaps_since` say it
        cannot tell. ``intents_of(boot)`` as for :meth:`recover_refs`. Backends without
        such logs have nothing to do.

        Raises:
            StorageError: the backend failed.
        """

    def sync_keys(self, keys: Iterable[str]) -> None:  # noqa: B027 - durable-on-write backends
        """Make the current state of ``keys`` durable (their files and folders synced), so that
        the intents that moved them are no longer needed.

        Raises:
            StorageError: the backend failed.
        """

    def child(self, prefix: str) -> Storage:
        """A storage rooted at the folder ``prefix`` of this one, on the same backend with the
        same options: its keys are this storage's keys below ``prefix`` (the tenant layout,
        docs/FORMAT.md 2, keeps each tenant's complete store in one). Here: refused; every
        backend castore ships implements it.

        Raises:
            InvalidName: ``prefix`` is not a valid key.
            StorageError: this backend cannot make one.
        """
        raise StorageError(f"{type(self).__name__} cannot open a storage below {prefix!r}", self.url)

    def close(self) -> None:  # noqa: B027 - optional hook: most backends hold nothing to release
        """Release what the backend holds (connections, threads)."""

    def __enter__(self) -> Storage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"
