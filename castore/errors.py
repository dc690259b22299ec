"""The error hierarchy: one root, :class:`CastoreError`, and subclasses that carry data.

Each subclass also inherits the matching built-in exception where one fits, so that
callers who catch ``KeyError`` or ``ValueError`` keep working. Backend exceptions are
always chained as ``__cause__``; they never escape bare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class CastoreError(Exception):
    """Root of every error castore raises on purpose."""


class StorageError(CastoreError, OSError):
    """The storage backend failed (unreachable, denied, I/O error).

    Attributes:
        url: the store or object URL involved, when known.
    """

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url

    def __str__(self) -> str:  # OSError's __str__ would print an errno tuple
        return str(self.args[0]) if self.args else ""


class AccessDenied(StorageError, PermissionError):
    """The backend refused this request: the credentials lack a permission (an S3 policy that
    confines a worker to its tenant's prefix refuses every other tenant's keys)."""


class StoreNotFound(CastoreError, FileNotFoundError):
    """There is no castore store at the URL that was read."""

    def __init__(self, url: str) -> None:
        super().__init__(f"no castore store at {url!r} (create one with `castore init` or by writing to it)")
        self.url = url

    def __str__(self) -> str:
        return str(self.args[0])


class FormatError(CastoreError):
    """The store was written with a format this version of castore cannot read."""

    def __init__(self, message: str, found: object = None, supported: int | None = None) -> None:
        super().__init__(message)
        self.found = found
        self.supported = supported


class ObjectNotFound(CastoreError, KeyError):
    """An object id names no stored object (``note``: what else the store knows, a damaged
    record that may have held it)."""

    def __init__(self, object_id: str, note: str | None = None) -> None:
        super().__init__(object_id, note)
        self.object_id = object_id
        self.note = note

    def __str__(self) -> str:
        return f"object {self.object_id} not found" + (f"; {self.note}" if self.note else "")


class IntegrityError(CastoreError):
    """Stored bytes do not hash to the id they are stored under, or cannot be decoded."""

    def __init__(self, object_id: str, reason: str) -> None:
        super().__init__(f"object {object_id} is corrupt: {reason}")
        self.object_id = object_id
        self.reason = reason


class SealedFrameError(IntegrityError):
    """An encrypted store's sealed frame does not open: the store was opened without its key or
    with a wrong one, or the bytes were moved from another object or tenant, or damaged."""

    def __init__(self, object_id: str, reason: str) -> None:
        Exception.__init__(self, f"object {object_id} cannot be read: {reason}")
        self.object_id = object_id
        self.reason = reason


class DamagedPack(IntegrityError):
    """An object is in a pack record (a compressed block) whose bytes are damaged: the record
    does not decompress or open, or what it holds does not hash to the object's id. The
    object is stored but cannot be read; ``castore fsck`` lists the record and its objects.

    Attributes:
        object_id: the object that was read.
        pack: the pack file's key (``packs/<name>.pack``).
        offset, size: where the damaged record is in the pack (its header included).
        reason: what is wrong, with the pack and record named.
    """

    def __init__(self, object_id: str, pack: str, offset: int, size: int, why: str) -> None:
        reason = f"its record in {pack} (the block at offset {offset}, {size} bytes) is damaged: {why}"
        Exception.__init__(self, f"object {object_id} cannot be read: {reason}; run `castore fsck`")
        self.object_id = object_id
        self.pack = pack
        self.offset = offset
        self.size = size
        self.reason = reason


class CorruptRef(IntegrityError):
    """A ref file holds something that is not a ref (garbage, bad target, a symbolic loop).

    Attributes:
        ref: the ref name (relative to ``refs/``).
        reason: what is wrong with it.
        object_id: ``"ref <name>"``, for code that reports any :class:`IntegrityError`.
    """

    def __init__(self, ref: str, reason: str) -> None:
        Exception.__init__(self, f"ref {ref!r} is corrupt: {reason}")
        self.object_id = f"ref {ref}"
        self.ref = ref
        self.reason = reason


class InvalidName(CastoreError, ValueError):
    """A name (app, user, session, branch, label, ref) is not acceptable."""

    def __init__(self, name: object, reason: str, what: str = "name") -> None:
        super().__init__(f"invalid {what} {name!r}: {reason}")
        self.name = name
        self.reason = reason
        self.what = what


class InvalidEntry(CastoreError, ValueError):
    """A value given to be stored cannot be encoded (not msgpack-able, wrong shape)."""


class RefNotFound(CastoreError, KeyError):
    """A ref that was required does not exist."""

    def __init__(self, ref: str) -> None:
        super().__init__(ref)
        self.ref = ref

    def __str__(self) -> str:
        return f"ref {self.ref!r} not found"


class RefConflict(CastoreError):
    """A compare-and-swap on a ref lost: the ref did not hold the expected value.

    Attributes:
        ref: the ref name.
        expected: the value the caller expected (None: expected the ref to be absent).
        actual: the value found (None: the ref is absent), when known.
    """

    def __init__(self, ref: str, expected: str | None, actual: str | None, message: str | None = None) -> None:
        msg = message or (
            f"ref {ref!r} changed concurrently: expected {expected or '(absent)'}, found {actual or '(absent)'}"
        )
        super().__init__(msg)
        self.ref = ref
        self.expected = expected
        self.actual = actual


class RefLocked(CastoreError):
    """A local ref is locked by another live writer and the wait ran out.

    Not a :class:`RefConflict`: nothing was lost to a rival, and retrying at once would
    only wait again, so the retry loops that handle lost races let it through. The
    message names the lock file, its owner and what to do.

    Attributes:
        ref: the ref (or storage path) whose lock is held.
        expected, actual: as on :class:`RefConflict` (None: not known).
    """

    def __init__(self, ref: str, expected: str | None = None, actual: str | None = None,
                 message: str | None = None) -> None:
        super().__init__(message or f"ref {ref!r} is locked by another writer")
        self.ref = ref
        self.expected = expected
        self.actual = actual


class RevisionNotFound(CastoreError, KeyError):
    """A revision string names no commit."""

    def __init__(self, rev: str, reason: str = "") -> None:
        super().__init__(rev)
        self.rev = rev
        self.reason = reason

    def __str__(self) -> str:
        return f"unknown revision {self.rev!r}" + (f": {self.reason}" if self.reason else "")


class AmbiguousRevision(CastoreError, KeyError):
    """A short id prefix matches more than one object."""

    def __init__(self, rev: str, candidates: Sequence[str]) -> None:
        super().__init__(rev)
        self.rev = rev
        self.candidates = list(candidates)

    def __str__(self) -> str:
        shown = ", ".join(c[:12] for c in self.candidates[:10])
        return f"ambiguous revision {self.rev!r}: matches {shown}"


class SessionNotFound(CastoreError, KeyError):
    """A session key has no history in the store."""

    def __init__(self, key: tuple[str, str, str]) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return "session {}/{}/{} not found".format(*self.key)


class AmbiguousSession(CastoreError, KeyError):
    """A short session id (a prefix, or an id without its app and user) names more than one session.

    The message lists the sessions it could mean, each with a count of the matching sessions
    named after it (its subagents, ``ID.subagents.agent-X``), which are not listed one by one.

    Attributes:
        spec: what was typed.
        candidates: the ``(app, user, session)`` keys it matches, each session followed by
            the ones named after it.
        named_after: a listed session -> the matching sessions named after it.
    """

    def __init__(self, spec: str, candidates: Sequence[tuple[str, str, str]],
                 named_after: Mapping[tuple[str, str, str], Sequence[tuple[str, str, str]]] | None = None) -> None:
        super().__init__(spec)
        self.spec = spec
        self.named_after = {k: list(v) for k, v in (named_after or {}).items() if v}
        under = {c for v in self.named_after.values() for c in v}
        self.heads = [c for c in candidates if c not in under]
        self.candidates = [x for c in self.heads for x in (c, *self.named_after.get(c, ()))]

    def __str__(self) -> str:
        def one(c: tuple[str, str, str]) -> str:
            n = len(self.named_after.get(c, ()))
            return "/".join(c) + (f" (and {n} session{'s' if n > 1 else ''} named after it)" if n else "")

        shown = ", ".join(map(one, self.heads[:10]))
        more = f" and {len(self.heads) - 10} more" if len(self.heads) > 10 else ""
        return f"session {self.spec!r} is ambiguous: it matches {shown}{more}; give more of the id or APP/USER/SESSION"


class SessionExists(CastoreError, FileExistsError):
    """A session that was to be created already exists."""

    def __init__(self, key: tuple[str, str, str]) -> None:
        super().__init__("session {}/{}/{} already exists".format(*key))
        self.key = key

    def __str__(self) -> str:
        return str(self.args[0])


class NotPicklable(CastoreError, TypeError):
    """A handle on an open store (a Store, a Session, an adapter's saver or session service)
    or a keyed :class:`~castore.objects.Codec` was pickled (sent to another process): it holds
    storage, locks, threads and, when encrypted, a tenant's keys, none of which travel in a
    pickle. Send the store's URL (and a session's key) and open it again there.

    Attributes:
        what: the class refused.
    """

    def __init__(self, what: str, why: str = "it is a handle on an open store (its storage, locks and threads "
                                              "and, when encrypted, its keys)") -> None:
        super().__init__(f"cannot pickle a castore {what}: {why}, which never travel in a pickle; send the "
                         "store's URL (and a session's key) and open it again in the other process (castore.open)")
        self.what = what


class SessionDeleting(CastoreError):
    """A write (an append, a checkout) to a session whose HEAD carries the deleting mark, or a
    read of one whose branch that deletion took already: a
    deletion of it started and did not finish (docs/FORMAT.md, "Deleting a session"). Finish
    it with ``castore delete-session`` (or ``castore expire``); the session can then be
    started again under its name.

    Also raised to a session's first write when a deletion ran whole while it landed
    (``finished``): nothing of the write was kept, and writing again starts the session anew.

    Attributes:
        key: the session's ``(app, user, session)``.
        finished: the deletion had finished (nothing is left to finish).
    """

    def __init__(self, key: tuple[str, str, str], finished: bool = False) -> None:
        super().__init__(key, finished)
        self.key, self.finished = key, finished

    def __str__(self) -> str:
        if self.finished:
            return ("session {}/{}/{} was deleted while this write landed: nothing of it was kept; "
                    "write again to start the session anew").format(*self.key)
        return ("session {0}/{1}/{2} is being deleted (a deletion of it was interrupted): finish it with "
                "`castore delete-session {0}/{1}/{2}`, which frees its name").format(*self.key)


class BranchError(CastoreError, ValueError):
    """A branch operation is refused (exists, checked out, unmerged work)."""


class AuditError(CastoreError):
    """Replaying the events of a path does not give the stored state.

    Attributes:
        commit: the first commit whose stored state differs from the replay.
        key: the first differing state key, when one is known.
    """

    def __init__(self, commit: str, message: str, key: str | None = None) -> None:
        super().__init__(f"audit failed at {commit[:12]}: {message}")
        self.commit = commit
        self.key = key


class EncryptionError(CastoreError):
    """An encrypted store's keys cannot be used: a bad master key, a missing key store, a
    key wrapper (KMS) that failed."""


class KeyMissing(EncryptionError):
    """A key that is needed is not there: no master key given, no key store, or no data key
    for a tenant that was never written (and is not erased)."""


class WrongKey(EncryptionError):
    """The master key (or KMS) given is not the one the keys were wrapped with, or a wrapped
    key does not authenticate (damaged, or moved from another tenant or key store)."""


class TenantErased(EncryptionError):
    """A tenant's data keys were destroyed by ``castore erase``: its data cannot be read again.

    Attributes:
        app: the app whose data was erased.
        user: the user (None: the whole app, every user and the app's own scope).
        at: when, as an ISO 8601 UTC timestamp.
        by: who erased it, when it was recorded (else None).
    """

    def __init__(self, app: str, user: str | None, at: str, by: str | None = None) -> None:
        what = f"app {app!r} (all its users)" if user is None else f"user {user!r} of app {app!r}"
        super().__init__(f"{what} was erased at {at}" + (f" by {by}" if by else "")
                         + ": its keys are destroyed and its data cannot be read")
        self.app = app
        self.user = user
        self.at = at
        self.by = by
