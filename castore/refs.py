"""Refs: small mutable files that name a commit or another ref, changed only by compare-and-swap.

A ref file holds one line with its target (a 64-hex commit id, or ``ref: <name>`` for a
symbolic ref such as ``HEAD -> heads/main``), then optionally one line of JSON metadata.
The metadata carries a write id stamped on every write (so that a writer whose successful
conditional write lost its response can recognise its own landing on retry), the real
names behind hashed path segments, and read hints for the history layer.

Ref names are relative to ``refs/``: ``sessions/<app>/<user>/<session>/heads/<branch>``.

Staged refs (:class:`RefStage`, a write batch: :meth:`castore.Store.batch`): while a stage is
open in a thread, that thread's swaps and deletes through any :class:`RefStore` are compared
against what the stage holds and kept there instead of written, and its reads see them; the
stage lands them later as one group of compare-and-swaps from the values the batch first
built on (:func:`castore.groupcommit.land_staged`). Other threads see the refs as stored.
Until it lands, the stage's thread reads each stored ref once, and a folder it listed empty
answers for every ref below it: a ref so known absent is staged with no read (the landing
compares it, expected absent, under its lock), where one read present is compared with
storage again when staged (a rival's move found early).
"""

from __future__ import annotations

import bisect
import builtins
import itertools
import json
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .errors import CastoreError, CorruptRef, InvalidEntry, RefConflict, StorageError
from .storage import Journal, JournalMany, PreconditionFailed, RefIntent, Storage, Token, Versioned

PREFIX = "refs"
SYMBOLIC = "ref: "
#: the metadata key of the id every write of a ref is stamped with: what tells a writer its own
#: landing from a rival's when a conditional write's answer was lost
#: (:data:`castore.refnames.META_WRITE_ID` names the same key)
WRITE_ID = "w"
_MAX_SYMBOLIC_DEPTH = 5
_AMBIGUOUS_RETRIES = 3


def _frozen(self: object, name: str, *_: object) -> None:
    """What assigning or deleting a field of a :class:`RefValue` raises, as a frozen dataclass does.

    Raises:
        dataclasses.FrozenInstanceError: always.
    """
    from dataclasses import FrozenInstanceError  # only for this mistake: a ref read loads no dataclasses

    raise FrozenInstanceError(f"cannot assign to field {name!r}")


class RefValue:
    """The content of a ref as read, with the version token needed to change it.

    Frozen, shown, compared and hashed field by field, as the frozen dataclass it was (a plain
    class: a dataclass compiles its methods from generated source when its module loads, a
    millisecond of every command's start, and a search through the index reads no ref).
    """

    __match_args__ = ("name", "target", "meta", "token")
    name: str
    target: str
    meta: Mapping[str, Any]
    token: Token | None

    def __init__(self, name: str, target: str, meta: Mapping[str, Any] | None = None,
                 token: Token | None = None) -> None:
        put = object.__setattr__
        put(self, "name", name)
        put(self, "target", target)
        put(self, "meta", {} if meta is None else meta)
        put(self, "token", token)

    __setattr__ = _frozen
    __delattr__ = _frozen

    def _fields(self) -> tuple[str, str, Mapping[str, Any], Token | None]:
        return (self.name, self.target, self.meta, self.token)

    def __repr__(self) -> str:
        return (f"{type(self).__qualname__}(name={self.name!r}, target={self.target!r}, meta={self.meta!r}, "
                f"token={self.token!r})")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    @property
    def symbolic(self) -> str | None:
        """The ref this one points to, or None for a direct ref."""
        return self.target[len(SYMBOLIC) :] if self.target.startswith(SYMBOLIC) else None

    @property
    def write_id(self) -> str | None:
        """The id stamped by the write that produced this value."""
        return self.meta.get(WRITE_ID)


def ref_key(name: str) -> str:
    """The storage key of a ref name."""
    return f"{PREFIX}/{name}"


_HEX_DIGITS = frozenset("0123456789abcdef")


def _valid_target(target: str) -> bool:
    if target.startswith(SYMBOLIC):
        return len(target) > len(SYMBOLIC) and "\n" not in target and "\r" not in target and "\0" not in target
    return len(target) == 64 and _HEX_DIGITS.issuperset(target)


def _serialize(target: str, meta: Mapping[str, Any]) -> bytes:
    # checked before writing: a ref we wrote must never read back as garbage
    if not isinstance(target, str) or not _valid_target(target):
        raise InvalidEntry(f"bad ref target {target!r}: not a 64-hex commit id or 'ref: <name>'")
    fast = _fast_json(meta)
    if fast is not None:
        return b"".join((target.encode(), b"\n", fast, b"\n"))
    try:
        text = json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidEntry(f"ref metadata is not JSON-able: {e}") from e
    return (target + "\n" + text + "\n").encode()


def _check_serializable(target: str, meta: Mapping[str, Any]) -> None:
    """Raise what :func:`_serialize` would raise for ``target`` and ``meta``, without encoding
    them when ``meta`` is plain JSON (:func:`_plain_json`: what a staged swap checks).

    Raises:
        InvalidEntry: a bad target, or metadata that is not JSON-able.
    """
    if not isinstance(target, str) or not _valid_target(target):
        raise InvalidEntry(f"bad ref target {target!r}: not a 64-hex commit id or 'ref: <name>'")
    try:
        if type(meta) is dict and _plain_json(meta):
            return
    except RecursionError:
        pass
    _serialize(target, meta)


_SCALARS = frozenset((str, int, bool, type(None)))
_STR = frozenset((str,))


def _plain_json(v: Any) -> bool:
    """Whether ``v`` is made only of dicts with str keys, lists, tuples, str, int, bool, None
    and floats that ``repr`` writes without an exponent (0 and 1e-4 <= |x| < 1e16): values
    that msgspec's JSON encoder writes as ``json.dumps`` does, but for string escapes."""
    t = type(v)
    if t in _SCALARS:
        return True
    if t is float:
        return v == 0.0 or 1e-4 <= abs(v) < 1e16
    if t is dict:
        return set(map(type, v)) <= _STR and _plain_items(v.values())
    if t is list or t is tuple:
        return _plain_items(v)
    return False


def _plain_items(items: Collection[object]) -> bool:
    return set(map(type, items)) <= _SCALARS or all(map(_plain_json, items))


def _fast_json(meta: Mapping[str, Any]) -> bytes | None:
    """The bytes ``json.dumps(meta, sort_keys=True, separators=(",", ":"))`` makes, made
    by msgspec (several times faster on a ref's hint), or None where they might differ: a
    value of another type, a float ``repr`` writes with an exponent, or a string json would
    escape (msgspec escapes fewer: any backslash, DEL or non-ASCII byte in its output sends
    the meta to json)."""
    try:
        if type(meta) is not dict or not _plain_json(meta):
            return None
    except RecursionError:  # nested too deep, or a cycle: json says which
        return None
    from .objects import json_dumps_sorted  # lazily: a reader of refs never needs it

    try:
        out = json_dumps_sorted(meta)
    except Exception:  # noqa: BLE001 - whatever msgspec refuses, json judges
        return None
    if not out.isascii() or b"\\" in out or b"\x7f" in out:
        return None
    return out


def _json_loads(text: str) -> Any:
    """``json.loads(text)``, by msgspec where it can (:func:`castore.objects.json_loads`: twice
    as fast on a ref's hint, and a listing of every session reads thousands); what it refuses
    (``NaN``, a lone surrogate, a float out of range) json reads, or refuses, itself.

    Raises:
        json.JSONDecodeError: not JSON.
    """
    from .objects import json_loads  # lazily, as in _fast_json

    try:
        return json_loads(text)
    except InvalidEntry:
        return json.loads(text)


def parse(name: str, data: bytes, token: Token | None = None) -> RefValue:
    """Parse the bytes of a ref file.

    Raises:
        CorruptRef: (an IntegrityError) the file is not a ref (garbage, wrong encoding, bad
            target); it names the ref.
    """
    try:
        text = data.decode("utf-8")
        lines = text.split("\n")
        target = lines[0].strip()
        meta = _json_loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptRef(name, f"not a ref file ({e})") from e
    if not isinstance(meta, dict):
        raise CorruptRef(name, "metadata is not an object")
    if not _valid_target(target):
        raise CorruptRef(name, f"bad target {target[:80]!r}")
    return RefValue(name, target, meta, token)


_memo: dict[tuple[str, int, int], None] = {}
_memo_lock = threading.Lock()


def check_ref(name: str, data: bytes) -> None:
    """Parse ``data`` as :meth:`RefStore.read` does, unless the same bytes of ``name`` parsed
    before (a memo of the last 1,024, by name, size and hash: no bytes kept).

    Raises:
        CorruptRef: the bytes are not a ref.
    """
    key = (name, len(data), hash(data))
    if key in _memo:
        return
    parse(name, data)
    with _memo_lock:
        _memo[key] = None
        if len(_memo) > 1024:
            _memo.pop(next(iter(_memo)), None)


#: the token of a value a stage holds (never a storage's: a swap built on it cannot land by mistake)
STAGED_TOKEN = "staged:"
_current = threading.local()
_staged_ids = itertools.count()


class Staged:
    """One ref a stage changed: ``base`` is the value the batch first built on (None: absent;
    what the landing compares), ``value`` what the batch left (None: deleted). Shown and compared
    field by field, as the dataclass it was (a plain class, as :class:`RefValue` is)."""

    __match_args__ = ("name", "base", "value")
    __hash__ = None  # type: ignore[assignment]  # compared by value, and changed: as a dataclass

    def __init__(self, name: str, base: RefValue | None, value: RefValue | None) -> None:
        self.name = name
        self.base = base
        self.value = value

    def __repr__(self) -> str:
        return f"{type(self).__qualname__}(name={self.name!r}, base={self.base!r}, value={self.value!r})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.name, self.base, self.value) == (other.name, other.base, other.value)


class RefStage:
    """The ref changes of one write batch, by :class:`RefStore`; see the module docstring.

    Open it in the calling thread with ``with stage:`` (only one at a time per thread); the
    changes stay in memory until :meth:`take` hands them to the landing.
    """

    def __init__(self) -> None:
        self._by_store: dict[int, tuple[RefStore, dict[str, Staged]]] = {}
        self._names: dict[int, builtins.list[str]] = {}  # the names held, sorted, by store (listings)
        #: the stored refs this stage's thread read, as read (bytes and token; None: absent), by store
        self._seen: dict[int, dict[str, Versioned | None]] = {}
        #: the folders (ending in ``/``) this stage's thread listed and found no stored ref below, by store
        self._bare: dict[int, set[str]] = {}

    def __enter__(self) -> RefStage:
        if getattr(_current, "stage", None) is not None:
            raise CastoreError("a write batch is already open in this thread")
        _current.stage = self
        return self

    def __exit__(self, *exc: object) -> None:
        _current.stage = None

    def changes(self, refs: RefStore) -> dict[str, Staged]:
        """The refs of ``refs`` this stage holds, by name (a live view)."""
        got = self._by_store.get(id(refs))
        if got is None:
            got = self._by_store[id(refs)] = (refs, {})
        return got[1]

    def add(self, refs: RefStore, change: Staged) -> None:
        """Hold ``change`` of a ref of ``refs`` this stage did not hold yet."""
        self.changes(refs)[change.name] = change
        bisect.insort(self._names.setdefault(id(refs), []), change.name)

    def below(self, refs: RefStore, folder: str) -> builtins.list[str]:
        """The names of the refs of ``refs`` this stage holds below ``folder`` (ending in
        ``/``; "" for all), sorted: a listing costs a search, not a pass over the stage."""
        names = self._names.get(id(refs), [])
        if not folder:
            return list(names)
        return names[bisect.bisect_left(names, folder):bisect.bisect_left(names, folder[:-1] + chr(ord("/") + 1))]

    def seen(self, refs: RefStore) -> dict[str, Versioned | None]:
        """The stored refs of ``refs`` this stage's thread read, as first read (a live view):
        a read of one again in this stage is parsed from these bytes, not read again."""
        got = self._seen.get(id(refs))
        if got is None:
            got = self._seen[id(refs)] = {}
        return got

    def bare(self, refs: RefStore) -> set[str]:
        """The folders of ``refs`` (ending in ``/``) this stage's thread listed and found no
        stored ref below (a live view): a ref below one reads as absent, and a listing of one
        is empty, with no storage call, as a ref read once is not read again (a session new
        with an import: its branches listed, then each branch and HEAD read and staged)."""
        got = self._bare.get(id(refs))
        if got is None:
            got = self._bare[id(refs)] = set()
        return got

    def stores(self) -> builtins.list[RefStore]:
        """The ref stores this stage holds changes of."""
        return [refs for refs, changed in self._by_store.values() if changed]

    def take(self, refs: RefStore) -> builtins.list[Staged]:
        """Remove and return the refs of ``refs`` the stage holds, in the order first staged."""
        got = self._by_store.pop(id(refs), None)
        self._names.pop(id(refs), None)
        return list(got[1].values()) if got is not None else []

    def __len__(self) -> int:
        return sum(len(changed) for _, changed in self._by_store.values())


def open_stage() -> RefStage | None:
    """The stage open in this thread, if any."""
    return getattr(_current, "stage", None)


def _below(folders: set[str], name: str) -> bool:
    """Whether the ref or folder ``name`` is one of ``folders`` (each ending in ``/``) or
    below one."""
    i = name.find("/")
    while i >= 0:
        if name[:i + 1] in folders:
            return True
        i = name.find("/", i + 1)
    return name + "/" in folders


def recover(storage: Storage) -> int:
    """Replay the ref swaps a power loss cut short (format 3 on local disk, docs/FORMAT.md 12):
    what opening refs owes before any ref is read (:class:`RefStore` calls it). Returns how many
    refs changed. Cheap when there is nothing to replay (on local disk one listing of the boot
    markers; elsewhere nothing): the writers' logs, whose intents a replay needs, are read (and
    the object store's modules loaded) only when a marker of another boot is found.

    Raises:
        StorageError: the backend failed (the marker is kept for the next open).
    """

    def intents_of(boot: str) -> list[RefIntent]:
        from .objectstore.packlog import log_intents  # only for a replay: an object store's modules

        return log_intents(storage, boot)

    return storage.recover_refs(intents_of)


class RefStore:
    """Refs over a storage backend; every change is a compare-and-swap. Opening it replays the
    ref swaps a power loss cut short (:func:`recover`), so no ref is read before that.

    Raises:
        StorageError: the replay failed.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        recover(storage)

    def _staged(self) -> dict[str, Staged] | None:
        stage = getattr(_current, "stage", None)
        return stage.changes(self) if stage is not None else None

    def read(self, name: str) -> RefValue | None:
        """Read one ref (without following symbolic refs); None when it does not exist.
        In a thread with an open :class:`RefStage`, what the stage holds for it, else the
        stored ref as this stage first read it (a batch reads each ref once, and none below
        a folder it listed empty; a swap built on a ref read present is compared with
        storage when staged, and every swap when landed). Each call parses
        anew: no two callers share a value's metadata.

        Raises:
            IntegrityError: the ref file is garbage.
            StorageError: the backend failed.
        """
        got = self._stored(name)
        if isinstance(got, RefValue) or got is None:
            return got
        return parse(name, got.data, got.token)

    def exists(self, name: str) -> bool:
        """Whether the ref exists (as :meth:`read` sees it). The bytes are checked as
        :meth:`read` parses them, once for the same bytes (an importer asks again and again).

        Raises:
            CorruptRef: (an IntegrityError) the ref file is garbage, as :meth:`read` says.
            StorageError: the backend failed.
        """
        got = self._stored(name)
        if isinstance(got, Versioned):
            check_ref(name, got.data)
        return got is not None

    def _stored(self, name: str) -> RefValue | Versioned | None:
        """What :meth:`read` parses: the staged value, or the stored bytes (read once per stage)."""
        stage = open_stage()
        if stage is None:
            return self.storage.read_versioned(ref_key(name))
        got_staged = stage.changes(self).get(name)
        if got_staged is not None:
            return got_staged.value
        seen = stage.seen(self)
        if name in seen:
            return seen[name]
        bare = stage.bare(self)
        if bare and _below(bare, name):
            seen[name] = None  # in a folder this stage listed empty (RefStage.bare)
            return None
        got = seen[name] = self.storage.read_versioned(ref_key(name))
        return got

    def read_many(self, names: list[str], bad: dict[str, CorruptRef] | None = None) -> dict[str, RefValue | None]:
        """Read several refs in one batch (no tokens: for reading, not for swapping).

        ``bad``: where a ref file that is not a ref is noted (name -> the error) and read as
        absent (None), instead of raising: a reader of every session goes past one damaged.

        Raises:
            CorruptRef: (without ``bad``) a ref file is not a ref.
            IntegrityError, StorageError.
        """
        staged = self._staged() or {}
        got = self.storage.read_many([ref_key(n) for n in names if n not in staged])
        out: dict[str, RefValue | None] = {}
        for n in names:
            if n in staged:
                out[n] = staged[n].value
                continue
            raw = got.get(ref_key(n))
            try:
                out[n] = parse(n, raw) if raw is not None else None
            except CorruptRef as e:
                if bad is None:
                    raise
                bad[n] = e
                out[n] = None
        return out

    def resolve(self, name: str) -> tuple[str, RefValue | None]:
        """Follow symbolic refs from ``name``; return (final ref name, its value or None).

        Raises:
            CorruptRef: a symbolic loop or a garbage ref.
            StorageError: the backend failed.
        """
        current = name
        for _ in range(_MAX_SYMBOLIC_DEPTH):
            value = self.read(current)
            if value is None or value.symbolic is None:
                return current, value
            current = _sibling(current, value.symbolic)
        raise CorruptRef(name, "symbolic refs nest too deep (a loop?)")

    def swap(
        self,
        name: str,
        target: str,
        expect: RefValue | None,
        meta: Mapping[str, Any] | None = None,
        journal: Journal | None = None,
    ) -> RefValue:
        """Set ``name`` to ``target`` if it still holds ``expect`` (None: if it is absent).

        Args:
            name: the ref name.
            target: a commit id or ``ref: <name>``.
            expect: the value read before (its token is what is compared).
            meta: metadata to store with the ref (a write id is added).
            journal: where the storage may keep the swap's intent durable instead of
                syncing the ref (local disk, format 3: the writer's log; see
                :meth:`~castore.storage.Storage.swap`).

        Returns:
            The new value, with its token.

        Raises:
            InvalidEntry: ``target`` is neither a 64-hex id nor ``ref: <name>``.
            RefConflict: the ref changed since ``expect`` was read (``actual`` is set).
            StorageError: the backend failed and it cannot be told whether the write landed.
            CastoreError: ``expect`` was not read with its token (a caller's mistake).
        """
        staged = self._staged()
        # a staged value's write id need only be unique in this process (the landing stamps its own)
        write_id = os.urandom(16).hex() if staged is None else f"s{next(_staged_ids)}"
        meta = {**(meta or {}), WRITE_ID: write_id}
        exp_token = expect.token if expect is not None else None
        if staged is not None:
            # checked as a write would be, but encoded only by the landing (with its own write id)
            _check_serializable(target, meta)
            if expect is not None and exp_token is None:
                raise CastoreError("swap needs a ref value read with its token (RefStore.read)")
            return self._stage(staged, name, expect, RefValue(name, target, meta, STAGED_TOKEN + write_id))
        data = _serialize(target, meta)
        key = ref_key(name)
        if expect is not None and exp_token is None:
            raise CastoreError("swap needs a ref value read with its token (RefStore.read)")
        first: Token | Exception
        try:
            # a backend written before journals existed takes no ``journal``: none is passed
            first = self.storage.swap(key, data, exp_token) if journal is None \
                else self.storage.swap(key, data, exp_token, journal)
        except (PreconditionFailed, StorageError) as e:
            first = e
        return self._settle(name, target, expect, meta, data, first, journal)

    def swap_many(
        self,
        moves: Sequence[tuple[str, str, RefValue | None, Mapping[str, Any] | None]],
        journal: JournalMany | None = None,
    ) -> builtins.list[RefValue | Exception]:
        """:meth:`swap` each ``(name, target, expect, meta)`` (distinct names), in one
        :meth:`~castore.storage.Storage.swap_many` (on local disk in format 3: all the
        intents synced at once); return, per move in order, its new value or the exception
        :meth:`swap` would have raised for it alone (:class:`RefConflict`, ``StorageError``).

        Raises:
            InvalidEntry: a target is neither a 64-hex id nor ``ref: <name>`` (nothing moved).
            RefLocked: a live process held a ref's lock for the whole wait (nothing moved).
            CastoreError: an ``expect`` was not read with its token (a caller's mistake).
        """
        if self._staged() is not None:
            out_staged: list[RefValue | Exception] = []
            for name, target, expect, meta in moves:
                try:
                    out_staged.append(self.swap(name, target, expect, meta))
                except RefConflict as e:
                    out_staged.append(e)
            return out_staged
        prepared: list[tuple[str, bytes, Token | None, dict[str, Any]]] = []
        ids = os.urandom(16 * len(moves)).hex()  # every move's random write id, drawn at once
        for i, (name, target, expect, meta) in enumerate(moves):
            m = {**(meta or {}), WRITE_ID: ids[32 * i:32 * i + 32]}
            exp_token = expect.token if expect is not None else None
            if expect is not None and exp_token is None:
                raise CastoreError("swap needs a ref value read with its token (RefStore.read)")
            prepared.append((ref_key(name), _serialize(target, m), exp_token, m))
        firsts: Sequence[Token | Exception]
        try:
            firsts = self.storage.swap_many([(k, d, t) for k, d, t, _ in prepared], journal)
        except StorageError as e:  # none landed (a failed journal): each is retried alone, as by swap
            firsts = [e] * len(prepared)
        single: Journal | None = None if journal is None else (lambda intent: journal((intent,)))
        out: list[RefValue | Exception] = []
        for (name, target, expect, _), (_, data, _, m), first in zip(moves, prepared, firsts, strict=True):
            try:
                out.append(self._settle(name, target, expect, m, data, first, single))
            except (RefConflict, StorageError) as e:
                out.append(e)
        return out

    def _settle(self, name: str, target: str, expect: RefValue | None, meta: dict[str, Any], data: bytes,
                first: Token | Exception, journal: Journal | None) -> RefValue:
        """The outcome of a swap of ``name`` to ``data`` whose first attempt gave ``first``
        (the token, or what it raised): a lost compare is checked against our own write id
        (an earlier attempt that landed), a failed write is retried.

        Raises:
            RefConflict, StorageError: as :meth:`swap`.
        """
        key = ref_key(name)
        exp_token = expect.token if expect is not None else None
        write_id = meta[WRITE_ID]
        last_error: Exception | None = None
        for attempt in range(_AMBIGUOUS_RETRIES):
            try:
                if attempt == 0:
                    if isinstance(first, Exception):
                        raise first
                    token = first
                else:
                    token = self.storage.swap(key, data, exp_token) if journal is None \
                        else self.storage.swap(key, data, exp_token, journal)
                return RefValue(name, target, meta, token)
            except PreconditionFailed as e:
                # Lost, or our own earlier attempt landed and only its response was lost.
                current = self.read(name)
                if current is not None and current.write_id == write_id:
                    return current
                raise RefConflict(
                    name, _target_of(expect), current.target if current else None
                ) from e
            except StorageError as e:
                last_error = e
                current = self._read_quietly(name)
                if current is not None and current.write_id == write_id:
                    return current
                if current is not None and exp_token is not None and current.token != exp_token:
                    raise RefConflict(name, _target_of(expect), current.target) from e
                time.sleep(0.05 * (2**attempt))
        assert last_error is not None
        raise last_error

    def _stage(self, staged: dict[str, Staged], name: str, expect: RefValue | None,
               new: RefValue | None) -> RefValue:
        """Keep ``new`` (None: a delete) for ``name`` in the open stage, if the ref holds
        ``expect``: as the stage holds it, else as stored (read now; the landing compares
        again). Returns what a read now gives.

        Raises:
            RefConflict: the ref holds another value. IntegrityError, StorageError.
        """
        got = staged.get(name)
        if got is None:
            held = open_stage()
            assert held is not None and held.changes(self) is staged
            if expect is None and self._absent_in(held, name):
                # read absent by this stage: not read again (the early check of a rival's move,
                # below); the landing's compare, under the lock, expects it absent all the same
                held.add(self, Staged(name, None, new))
                return new  # type: ignore[return-value]  # (None only for a delete)
            stored = self.storage.read_versioned(ref_key(name))
            if (stored.token if stored is not None else None) != (expect.token if expect is not None else None):
                held.seen(self).pop(name, None)  # moved by another writer: the next read reads it anew
                raise RefConflict(name, _target_of(expect), parse(name, stored.data).target if stored else None)
            held.add(self, Staged(name, expect, new))
        else:
            have = got.value
            if (have.token if have is not None else None) != (expect.token if expect is not None else None):
                raise RefConflict(name, _target_of(expect), _target_of(have))
            got.value = new
        return new  # type: ignore[return-value]  # (None only for a delete, whose caller ignores it)

    def _absent_in(self, stage: RefStage, name: str) -> bool:
        """Whether ``stage`` read ``name`` as absent from storage, or listed a folder above it
        empty. Raises nothing."""
        seen = stage.seen(self)
        if name in seen:
            return seen[name] is None
        bare = stage.bare(self)
        return bool(bare) and _below(bare, name)

    def _read_quietly(self, name: str) -> RefValue | None:
        try:
            return self.read(name)
        except StorageError:
            return None

    def delete(self, name: str, expect: RefValue | None = None) -> None:
        """Delete a ref; with ``expect`` (read with its token, :meth:`read`), only if it still
        holds that value.

        Raises:
            RefConflict: the ref changed since ``expect`` was read.
            CastoreError: ``expect`` has no token (:meth:`read_many` gives none): the delete
                would not be a compare-and-swap.
            StorageError: the backend failed.
        """
        if expect is not None and expect.token is None:
            raise CastoreError("a delete needs a ref value read with its token (RefStore.read)")
        staged = self._staged()
        if staged is not None:
            if expect is None:
                expect = self.read(name)
                if expect is None:
                    return
            self._stage(staged, name, expect, None)
            return
        try:
            self.storage.delete(ref_key(name), expect.token if expect is not None else None)
        except PreconditionFailed as e:
            current = self.read(name)
            raise RefConflict(name, _target_of(expect), current.target if current else None) from e

    def list(self, prefix: str) -> list[str]:
        """Every ref name below the folder ``prefix`` (relative to ``refs/``).

        Raises:
            StorageError: the backend failed.
        """
        stage = open_stage()
        out = self._list_stored(stage, prefix, self.storage.list)
        out = [k[len(PREFIX) + 1 :] for k in out]
        staged = stage.changes(self) if stage is not None else None
        if staged and stage is not None:
            below = prefix.strip("/") + "/" if prefix.strip("/") else ""
            mine = {n: staged[n].value for n in stage.below(self, below)}
            out = [n for n in out if n not in mine] + sorted(n for n, v in mine.items() if v is not None)
        return out

    def list_dir(self, prefix: str) -> builtins.list[str]:
        """Immediate children of the ref folder ``prefix``.

        Raises:
            StorageError: the backend failed.
        """
        stage = open_stage()
        out = self._list_stored(stage, prefix, self.storage.list_dir)
        staged = stage.changes(self) if stage is not None else None
        if staged and stage is not None:
            below = prefix.strip("/") + "/" if prefix.strip("/") else ""
            have = set(out)
            for n in stage.below(self, below):
                c = staged[n]
                if c.value is not None:
                    child = n[len(below):].split("/", 1)[0]
                    if child not in have:
                        have.add(child)
                        out.append(child)
                elif "/" not in n[len(below):] and c.base is not None:
                    out = [x for x in out if x != n[len(below):]]
                    have.discard(n[len(below):])
        return out

    def _list_stored(self, stage: RefStage | None, prefix: str,
                     listing: Callable[[str], builtins.list[str]]) -> builtins.list[str]:
        """``listing`` of the ref folder ``prefix`` as stored; in a stage, a folder listed
        empty is remembered (:meth:`RefStage.bare`) and not listed again.

        Raises:
            StorageError: the backend failed.
        """
        folder = prefix.rstrip("/")
        if stage is None or not folder:
            return listing(ref_key(folder))
        bare = stage.bare(self)
        if bare and _below(bare, folder):
            return []
        out = listing(ref_key(folder))
        if not out:
            bare.add(folder + "/")
        return out

    def changes_since(self, prefix: str, mark: str | None) -> tuple[str | None, builtins.list[str] | None]:
        """Which refs below the folder ``prefix`` changed since ``mark``, without reading any:
        what a reader of derived data (the search index, a saver's cached view) asks instead
        of listing and reading every ref again.

        Built on the storage's ref-change log (:meth:`~castore.storage.Storage.swaps_since`;
        local disk keeps one, object storage and memory do not). Returns ``(mark, names)``:

        * ``names``: the ref names below ``prefix`` swapped or deleted since ``mark``, one per
          change, in the order they were logged; None when that cannot be told (no such log,
          ``mark`` None or not of this log, the log replaced, a reboot since): then every ref
          below ``prefix`` must be read.
        * ``mark``: what to pass next time, once the refs named (all of them when ``names``
          is None) have been read. It is taken before any ref is read, so a change made
          meanwhile is told next time. None when the storage keeps no log, or when a change
          told (or, with ``names`` None, any below ``prefix``) is a swap still under way (its
          lock held: logged, perhaps not landed when the caller reads): the next call then
          cannot tell either, and every ref is read again.

        Raises:
            StorageError: the backend failed.
        """
        got = self.storage.swaps_since(mark)
        if got is None:
            return None, None
        new, keys = got
        folder = ref_key(prefix.strip("/"))
        if keys is None:
            return (None if self.storage.pending_swaps(folder) else new), None
        below = folder.rstrip("/") + "/"
        moved = [k for k in keys if k.startswith(below)]
        if moved:
            # a swap that has not logged its key yet lands after the new mark: only the keys
            # logged can have landed after the caller's read
            logged = set(moved)
            if any(k in logged for p in sorted({k.rsplit("/", 1)[0] for k in logged})
                   for k in self.storage.pending_swaps(p)):
                return None, [k[len(PREFIX) + 1 :] for k in moved]
        return new, [k[len(PREFIX) + 1 :] for k in moved]

    def folder_stamps(self, folders: Sequence[str], settled: int | None = None) -> builtins.list[int] | None:
        """A stamp of each ref folder of ``folders`` (``sessions/<app>/<user>/<session>``) that
        changes when a branch is made or removed there (or the folder), by a writer or by
        hand (:meth:`~castore.storage.Storage.ref_stamps`): a reader of :meth:`changes_since`
        compares it to tell a change the ref-change log missed. ``settled``: when the caller
        began reading those refs (ns): a folder changed too close to it is stamped so that the
        next comparison says it changed. None: the storage does not tell (nor keeps a log: its
        readers read every ref).

        Raises:
            StorageError: the backend failed.
        """
        return self.storage.ref_stamps([ref_key(f) for f in folders], settled)


def _sibling(name: str, target: str) -> str:
    """A symbolic target is relative to the folder of the ref that names it (``HEAD``'s)."""
    folder = name.rsplit("/", 1)[0] if "/" in name else ""
    return f"{folder}/{target}" if folder else target


def _target_of(value: RefValue | None) -> str | None:
    return value.target if value is not None else None
