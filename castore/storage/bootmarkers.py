"""The boot markers of deferred ref swaps on local disk, and the recovery that replays them
(format 3, docs/FORMAT.md 12).

Before the first deferred swap of a boot (a ref renamed into place with no sync, its intent
kept durable in the writer's log), ``journal/<boot id>`` is created durably: the *marker*.
While it exists, deletes of refs and checks after a dead writer's lock was cleared are
recorded in it (one JSON line, ``fdatasync``), before they land. Opening a store after a
power loss finds the marker of another boot and brings every ref that boot changed to the
value its changes end at (:meth:`BootMarkers.recover`), then removes the marker.
:class:`~castore.storage.local.LocalStorage` owns one :class:`BootMarkers` per handle.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable
from typing import Protocol

from ..errors import StorageError
from .base import RefIntent, Token, Versioned

try:  # hashlib's own blake2b, without importing OpenSSL's _hashlib (import time of a local store)
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - a Python built without _blake2
    from hashlib import blake2b

#: the folder of the boot markers, at the root of a local store
JOURNAL = "journal"
_MARKER_HEADER = b"castore ref journal\n"
#: only refs are journaled (the keys a replay may change)
_REFS = "refs/"
#: the header of a ref file written in place by a deferred swap (docs/FORMAT.md 12): this
#: magic (0xff starts no ref value: those are ASCII), the value's length (4 bytes, big
#: endian) and its 16-byte blake2b, then the value; bytes past the length are a longer old
#: value's tail
INPLACE_MAGIC = b"\xff\0ref"
_INPLACE_HEAD = len(INPLACE_MAGIC) + 4 + 16


class RefFiles(Protocol):
    """What a replay needs of the storage whose refs it brings up to date."""

    url: str
    durable: bool

    def read_ref_file(self, key: str) -> Versioned | None:
        """The value of ``key`` and its token as its file holds them now, or None when it is
        missing; a file written in place that fails its check gives its bytes as they are
        (which :func:`torn` reports)."""

    def swap(self, key: str, data: bytes, expect: Token | None) -> Token:
        """Replace ``key`` with ``data`` if its token is ``expect``; the new token."""

    def delete(self, key: str, expect: Token | None = None) -> None:
        """Delete ``key`` if its token is ``expect``."""


class BootMarkers:
    """The markers under ``<root>/journal`` of one storage handle; see the module docstring.

    ``ensure_dir`` makes a folder durably (parents synced); ``fsync_dir`` syncs a folder when
    the storage is durable. Both are the storage's own.
    """

    def __init__(self, storage: RefFiles, root: str, ensure_dir: Callable[[str], None],
                 fsync_dir: Callable[[str], None]) -> None:
        """Markers under ``root`` of ``storage``; see the class docstring."""
        self.storage = storage
        self.root = root
        self._ensure_dir = ensure_dir
        self._fsync_dir = fsync_dir
        self._made = ""  # the boot whose marker this handle made sure of

    def path(self, boot: str) -> str:
        """The file of the marker of ``boot``."""
        return os.path.join(self.root, JOURNAL, boot)

    def has(self, boot: str) -> bool:
        """Whether the marker of ``boot`` exists (then changes that a replay could undo are
        recorded in it)."""
        return self._made == boot or os.path.exists(self.path(boot))

    def ensure(self, boot: str) -> None:
        """Make sure ``journal/<boot>`` exists durably (once per handle and boot): before the
        first deferred swap of a boot, so that a recovery after a power loss knows to look.

        Raises:
            StorageError: it cannot be created or synced.
        """
        if self._made == boot:
            return
        url = self.storage.url
        d = os.path.join(self.root, JOURNAL)
        self._ensure_dir(d)
        try:
            fd = os.open(self.path(boot), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            pass
        except OSError as e:
            raise StorageError(f"cannot create {JOURNAL}/{boot}: {e.strerror or e}", url) from e
        else:
            try:
                os.write(fd, _MARKER_HEADER)
                os.fsync(fd)
            except OSError as e:
                raise StorageError(f"cannot write {JOURNAL}/{boot}: {e.strerror or e}", url) from e
            finally:
                os.close(fd)
        # whoever made the folder or the file may not have synced them yet: sync both here
        self._fsync_dir(d)
        self._fsync_dir(self.root)
        self._made = boot

    def record(self, boot: str, intent: RefIntent) -> None:
        """Append ``intent`` (a delete or a check: no data) to the boot's marker, synced.

        Raises:
            StorageError: it cannot be written (the change is then not made).
        """
        line = json.dumps({"k": intent.key, "o": intent.old, "n": intent.new, "t": intent.stamp},
                          separators=(",", ":")).encode() + b"\n"
        try:
            while True:
                fd = os.open(self.path(boot), os.O_WRONLY | os.O_APPEND)
                try:
                    # shared: a compaction (exclusive) may replace the file meanwhile, and
                    # then this record goes to the new one
                    fcntl.flock(fd, fcntl.LOCK_SH)
                    if os.fstat(fd).st_nlink == 0:
                        continue
                    os.write(fd, line)
                    os.fdatasync(fd)
                    return
                finally:
                    os.close(fd)
        except OSError as e:
            raise StorageError(f"cannot record the change of {intent.key} in {JOURNAL}/{boot}: "
                               f"{e.strerror or e}", self.storage.url) from e

    def compact(self, boot: str, intents_of: Callable[[str], list[RefIntent]]) -> int:
        """Drop from the marker of ``boot`` (this boot's) the records no replay needs; returns
        how many were dropped. A record (a delete, or a check after a dead writer) matters to
        a replay only beside an intent of the same ref in a writer's unsealed log
        (``intents_of(boot)``): alone, it brings a ref to where its synced delete, or its
        durable value, already is. Holding the marker's exclusive ``flock`` (a record waits,
        then writes to the new file), the records are read first and the intents after, so an
        intent older than a dropped record cannot be missed; the new marker is made whole and
        synced, then renamed over the old one. Keeps the marker's names of deleted refs from
        outliving them (``gc``), and its size bounded.

        Raises:
            StorageError: a file cannot be read or written (the marker is then as it was).
        """
        path = self.path(boot)
        fd = self._hold(boot)
        if fd is None:
            return 0
        tmp = f"{path}.tmp-{os.urandom(16).hex()}"
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
            body = data[len(_MARKER_HEADER):] if data.startswith(_MARKER_HEADER) else data
            lines = [line for line in body.split(b"\n") if line]
            if not lines:
                return 0
            needed = {i.key for i in intents_of(boot) if i.boot == boot}
            keep = [line for line, r in zip(lines, self._parsed(lines), strict=True)
                    if r is None or r.key in needed]
            if len(keep) == len(lines):
                return 0
            with open(tmp, "xb") as f:
                f.write(_MARKER_HEADER + b"".join(line + b"\n" for line in keep))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._fsync_dir(os.path.dirname(path))
            return len(lines) - len(keep)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StorageError(f"cannot compact {JOURNAL}/{boot}: {e.strerror or e}", self.storage.url) from e
        finally:
            os.close(fd)

    def _hold(self, boot: str) -> int | None:
        """The marker of ``boot`` opened under its exclusive ``flock``, or None when it is gone
        (or was replayed or replaced by another process while this one waited)."""
        try:
            fd = os.open(self.path(boot), os.O_RDONLY)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"cannot open {JOURNAL}/{boot}: {e.strerror or e}", self.storage.url) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink > 0:
                return fd
        except OSError as e:
            os.close(fd)
            raise StorageError(f"cannot lock {JOURNAL}/{boot}: {e.strerror or e}", self.storage.url) from e
        os.close(fd)
        return None

    @staticmethod
    def _parsed(lines: list[bytes]) -> list[RefIntent | None]:
        """Each line as a record, or None when it does not parse (kept as it is)."""
        out: list[RefIntent | None] = []
        for line in lines:
            got = BootMarkers._records(line, "")
            out.append(got[0] if got else None)
        return out

    @staticmethod
    def _records(data: bytes, boot: str) -> list[RefIntent]:
        """The records of a marker's bytes: every line that parses (not the header line, nor
        a torn last line cut by a crash; a marker whose creator died before its header still
        has its records read)."""
        out = []
        for line in data.split(b"\n"):
            try:
                r = json.loads(line)
                out.append(RefIntent(str(r["k"]), r["o"], r["n"], None, boot, int(r["t"])))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def recover(self, this_boot: str, intents_of: Callable[[str], list[RefIntent]]) -> int:
        """Replay the deferred swaps of every boot but ``this_boot`` that left a marker;
        ``intents_of(boot)`` gives that boot's intents in the writers' logs. Returns how many
        refs changed. One listing when there is no other marker.

        Raises:
            StorageError: a file cannot be read or written (the marker is kept).
        """
        try:
            names = os.listdir(os.path.join(self.root, JOURNAL))
        except (FileNotFoundError, NotADirectoryError):
            return 0
        except OSError as e:
            raise StorageError(f"cannot list {JOURNAL}: {e.strerror or e}", self.storage.url) from e
        changed = 0
        for name in sorted(names):
            if name != this_boot and ".tmp-" not in name:
                changed += self._recover_boot(name, intents_of)
        return changed

    def _recover_boot(self, boot: str, intents_of: Callable[[str], list[RefIntent]]) -> int:
        """Replay the marker ``boot`` under its exclusive ``flock`` (a rival opening the store
        meanwhile waits, then finds it gone), then remove it."""
        storage = self.storage
        path = self.path(boot)
        fd = self._hold(boot)
        if fd is None:
            return 0
        durable, storage.durable = storage.durable, True  # a replay is always synced (it runs at open)
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                events = self._records(f.read(), boot)
            events += [i for i in intents_of(boot) if i.boot == boot and i.key.startswith(_REFS)]
            by_key: dict[str, list[RefIntent]] = {}
            for ev in events:
                by_key.setdefault(ev.key, []).append(ev)
            changed = sum(self._replay(key, sorted(evs, key=lambda i: i.stamp)) for key, evs in sorted(by_key.items()))
            os.unlink(path)
            self._fsync_dir(os.path.dirname(path))
            return changed
        except OSError as e:
            raise StorageError(f"cannot recover {JOURNAL}/{boot}: {e.strerror or e}", storage.url) from e
        finally:
            storage.durable = durable
            os.close(fd)

    def _replay(self, key: str, events: list[RefIntent]) -> int:
        """Bring ``key`` to the value its journaled changes (in stamp order) end at; 1 if it
        changed. The ref holds the value after some change k; every change after k is in
        ``events`` (a change that is not is durable, so the ref would hold it or a later
        one), so the latest change whose old value is what the ref holds, from which every
        later change follows on, leads to the last value. None such: the ref holds it. A
        torn file (empty, zero-filled or cut short: its rename outlived its data) takes the
        last change's value."""
        storage = self.storage
        current = storage.read_ref_file(key)
        tok = current.token if current is not None else None
        known = {e.new for e in events} | {e.old for e in events}
        data_of = {e.new: e.data for e in events if e.data is not None}
        final: Token | None = tok
        if current is not None and tok not in known and torn(current.data):
            final = events[-1].new
        else:
            for j in range(len(events) - 1, -1, -1):
                if events[j].old != tok:
                    continue
                state: Token | None = tok
                for e in events[j:]:
                    if e.old != state:
                        break
                    state = e.new
                else:
                    final = state
                    break
        if final == tok:
            return 0
        if final is None:
            storage.delete(key, tok)
        elif final in data_of:
            storage.swap(key, data_of[final], tok)
        else:
            return 0  # a check of a value whose bytes no change here holds: nothing to write
        return 1


def torn(data: bytes) -> bool:
    """Whether a journaled file's bytes are not what any write left whole: empty, holding
    zeros (blocks allocated but never written), cut short (journaled values end with a
    newline: ref files do), or a file written in place that failed its check (a value that
    passed it is read without its header)."""
    return not data or b"\0" in data or not data.endswith(b"\n") or data.startswith(INPLACE_MAGIC)


def frame(value: bytes, digest: bytes | None = None) -> bytes:
    """``value`` with the header of a ref file written in place (see :data:`INPLACE_MAGIC`);
    ``digest``: ``blake2b(value, digest_size=16).digest()`` when the caller has it already."""
    if digest is None:
        digest = blake2b(value, digest_size=16).digest()
    return INPLACE_MAGIC + len(value).to_bytes(4, "big") + digest + value


def unframe(data: bytes) -> bytes | None:
    """The value of a file that :func:`frame` wrote (bytes past its length ignored), or None
    when it fails its check: a read that met a write in place, or one a crash cut short."""
    if len(data) < _INPLACE_HEAD or not data.startswith(INPLACE_MAGIC):
        return None
    n = int.from_bytes(data[len(INPLACE_MAGIC):len(INPLACE_MAGIC) + 4], "big")
    value = data[_INPLACE_HEAD:_INPLACE_HEAD + n]
    if len(value) != n or blake2b(value, digest_size=16).digest() != data[_INPLACE_HEAD - 16:_INPLACE_HEAD]:
        return None
    return value


def framed_token(data: bytes) -> str:
    """The hex of the digest in the header of ``data``, a file :func:`frame` wrote that passed
    :func:`unframe`: the token of its value (``blake2b(value, digest_size=16)``), unhashed."""
    return data[_INPLACE_HEAD - 16:_INPLACE_HEAD].hex()


__all__ = ["INPLACE_MAGIC", "JOURNAL", "BootMarkers", "RefFiles", "frame", "framed_token", "torn", "unframe"]
