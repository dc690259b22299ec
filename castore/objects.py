"""The object format (format 1): structs, canonical encoding, ids, compression. No I/O.

Every object is a frozen msgspec struct with a short explicit tag, encoded as a msgpack map
with ``order="deterministic"`` and ``omit_defaults=True``, so that equal values give equal
bytes and a new optional field leaves every existing id unchanged. The id of an object is
the blake3 digest of those canonical bytes, written as 64 lowercase hex characters. Inside
objects, ids are kept as their 32 raw bytes.

On storage an object is one header byte followed by the canonical bytes (``0x00``), their
zstd frame (``0x01``), or their zstd frame made with castore's built-in format-1 dictionary
(``0x02``, the bytes of :mod:`castore.zdict`, pinned below by their blake3 digest; the
frame is zstd's magicless format: the header byte already says what follows). Writers pick
the dictionary codec for objects up to :data:`DICT_MAX` bytes and plain zstd above;
readers read all three, forever. The id never depends on compression. Every read re-hashes
the canonical bytes: a mismatch is an :class:`~castore.errors.IntegrityError`.

An encrypted store's objects go through a :class:`Codec` with keys: ids are blake3 keyed by
the tenant's id key, and frames are *sealed*: header ``0x03``, then a nonce, the ciphertext
of an ordinary frame (compression comes before encryption) and the AEAD tag, made by a
:class:`Cipher` (``castore.crypto``; this module holds no cipher). :data:`PLAIN` is the
codec of every other store: blake3 ids, plain frames, byte for byte what the module
functions below make.

The frames (the header byte and the compression) are :mod:`castore.frames`', re-exported
here. This is the only module that imports msgspec; with :mod:`castore.frames`, the only
one that imports blake3 and zstandard.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Sequence
from typing import Any, NewType, Protocol

import msgspec
from blake3 import blake3

from .errors import IntegrityError, InvalidEntry, NotPicklable, SealedFrameError
from .frames import (  # noqa: F401 - the frames' names re-exported: they are the object format's too
    COMPRESS_MIN,
    DICT_MAX,
    FORMAT,
    MAX_OBJECT_SIZE,
    SEALED,
    ZDICT_BLAKE3,
    ZDICT_LEVEL,
    BlockPrefix,
    declared_size,
    dictionary,
    frame_block,
    to_stored,
    unframe,
)

# a castore whose built-in dictionary is not the pinned one fails here, at once, before it
# writes an object (a reader of the search index alone loads the frames, never the dictionary)
dictionary()

ObjectId = NewType("ObjectId", str)
RawId = bytes  # 32 raw bytes of an ObjectId


class _Object(msgspec.Struct, frozen=True, omit_defaults=True, tag_field="k", gc=False):
    pass


class Blob(_Object, tag="b", frozen=True):
    """Opaque bytes (an image, a file, a large tool output)."""

    data: bytes


class Value(_Object, tag="v", frozen=True):
    """One msgpack value: an entry's body, or a large state value."""

    value: Any


class Tree(_Object, tag="t", frozen=True):
    """A state snapshot: small values inline, large ones by the id of a :class:`Value`.

    A large state is split by key hash: ``sub`` maps one hex digit to a child tree.
    """

    values: dict[str, Any] = {}
    refs: dict[str, bytes] = {}
    sub: dict[str, bytes] = {}


class Commit(_Object, tag="c", frozen=True):
    """One entry of a history, the state after it, and its parents.

    ``body`` names the :class:`Value` holding the entry's shareable content (a message,
    a summary); provenance that must not break deduplication (time, author, meta) lives
    here on the commit. ``delta`` and ``unset`` are the state changes this entry made, for
    replay; ``state`` names the full snapshot after it. ``depth`` counts commits on the
    first-parent path before this one; ``index`` names the :class:`Index` that covers the
    path below this commit's segment block (see :mod:`castore.history`).
    """

    kind: str
    parents: tuple[bytes, ...] = ()
    body: bytes | None = None
    state: bytes | None = None
    delta: dict[str, Any] = {}
    unset: tuple[str, ...] = ()
    scopes: dict[str, bytes] = {}
    author: str = ""
    time: float = 0.0
    meta: dict[str, Any] = {}
    depth: int = 0
    index: bytes | None = None


class Segment(_Object, tag="s", frozen=True):
    """K consecutive commits of a path and their bodies, as stored canonical bytes."""

    start: int
    objects: tuple[bytes, ...]


class Index(_Object, tag="i", frozen=True):
    """The segments of a path from its root, in order."""

    segments: tuple[bytes, ...] = ()


AnyObject = Blob | Value | Tree | Commit | Segment | Index
_encoder = msgspec.msgpack.Encoder(order="deterministic")
_decoder = msgspec.msgpack.Decoder(AnyObject)
def hex_id(raw: bytes) -> ObjectId:
    """The hex form of a raw 32-byte id."""
    return ObjectId(raw.hex())


def raw_id(oid: str) -> bytes:
    """The raw 32 bytes of a hex id.

    Raises:
        InvalidEntry: not 64 hex characters.
    """
    if len(oid) != 64:
        raise InvalidEntry(f"not an object id: {oid!r}")
    try:
        return bytes.fromhex(oid)
    except ValueError as e:
        raise InvalidEntry(f"not an object id: {oid!r}") from e


_HEX_ID = re.compile(r"[0-9a-f]{64}")


def is_hex_id(s: str) -> bool:
    """Whether ``s`` is a full 64-character lowercase hex id."""
    return isinstance(s, str) and _HEX_ID.fullmatch(s) is not None


#: the keys under which metadata names objects it needs (every full hex id in their value,
#: a string, or inside lists and dicts): ``raw``, an archived line's bytes (``{"o": LINE,
#: "raw": ID}`` in its commit's meta; a Codex fork's copied lines in HEAD's info),
#: ``castore:blob``, an image taken out of a Pi entry, ``whole``, the chunks of a Gemini
#: CLI whole-file JSON (HEAD's info), ``adopted``, the lines of castore's own commits an
#: import found again (``{LINE: [COMMIT, ID]}`` in HEAD's info), ``segments``, a Pi file's
#: bytes as imported (``info["pi"]["segments"]``, what ``export pi`` writes back)
META_LINK_KEYS = frozenset({"raw", "castore:blob", "whole", "adopted", "segments", "files"})
#: how deep :func:`meta_links` looks into metadata (dicts and lists)
_META_DEPTH = 8


def meta_links(meta: Any, _depth: int = 0, _named: bool = False) -> list[ObjectId]:
    """The objects that metadata (a commit's ``meta``, a ref's) names and needs: every full
    hex id in the value of a :data:`META_LINK_KEYS` key, in dicts and lists nested up to a
    few levels. Reachability (fsck, gc) and sync follow them as they follow a commit's
    body. Raises nothing."""
    if _named and isinstance(meta, str):
        return [ObjectId(meta)] if is_hex_id(meta) else []
    out: list[ObjectId] = []
    if _depth > _META_DEPTH:
        return out
    if isinstance(meta, dict):
        for k, v in meta.items():
            out += meta_links(v, _depth + 1, _named or k in META_LINK_KEYS)
    elif isinstance(meta, list):
        for v in meta:
            out += meta_links(v, _depth + 1, _named)
    return out


def digest(canonical: bytes | memoryview) -> ObjectId:
    """The id of canonical bytes."""
    return PLAIN.digest(canonical)


def digest_many(canonicals: Sequence[bytes]) -> list[ObjectId]:
    """The ids of many canonical bytes, in order (:func:`digest` of each: reading a long
    path hashes every commit and body it holds once)."""
    return _digest_many(blake3(), canonicals)


def _digest_many(h: Any, canonicals: Sequence[bytes]) -> list[ObjectId]:
    """The digests by the fresh hasher ``h`` (plain or keyed) of ``canonicals``, in order."""
    # One hasher, reset after each object: making a hasher per object is a third of the
    # cost of hashing a small one, and blake3's hexdigest is slower than bytes.hex of its
    # digest (20,000 objects of 250-800 bytes: 12.9 ms against 17.6)
    update, final, reset = h.update, h.digest, h.reset
    out: list[ObjectId] = []
    add = out.append
    for canonical in canonicals:
        update(canonical)
        add(final().hex())
        reset()
    return out


def checksum(data: bytes | memoryview) -> bytes:
    """The first 16 bytes of the blake3 digest of ``data`` (the check of pack records and indexes)."""
    return blake3(data).digest()[:16]


def encode(obj: _Object) -> tuple[ObjectId, bytes]:
    """Encode an object canonically and return ``(id, canonical bytes)``.

    Raises:
        InvalidEntry: the object holds a value msgpack cannot encode.
    """
    data = _canonical(obj)
    return digest(data), data


def _canonical(obj: _Object) -> bytes:
    """The canonical bytes of ``obj``.

    Raises:
        InvalidEntry: the object holds a value msgpack cannot encode.
    """
    try:
        return _encoder.encode(obj)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidEntry(f"cannot encode {type(obj).__name__}: {e}") from e


def from_stored(oid: str, stored: bytes) -> bytes:
    """Unframe stored bytes and check that they hash to ``oid``; return canonical bytes.

    Reads every codec ever written: raw (``0x00``), zstd (``0x01``) and zstd with the
    format-1 dictionary (``0x02``).

    Raises:
        IntegrityError: unknown header, bad compression, a frame declaring no size or more
            than :data:`MAX_OBJECT_SIZE`, or a hash mismatch.
    """
    return PLAIN.from_stored(oid, stored)


class Cipher(Protocol):
    """An authenticated cipher (:class:`castore.crypto.aead.AeadCipher`): what a :class:`Codec`
    seals frames with."""

    def seal(self, plaintext: bytes, ad: bytes) -> bytes:
        """``plaintext`` encrypted and bound to ``ad``: nonce, ciphertext and tag."""
        ...

    def open(self, sealed: bytes, ad: bytes) -> bytes:
        """The plaintext of :meth:`seal`'s output.

        Raises:
            IntegrityError: it does not authenticate under this key and ``ad``.
        """
        ...


class _Hashers(threading.local):
    """A blake3 hasher per thread (keyed by the codec's id key, when it has one): :meth:`Codec.digest`
    resets it before each object instead of making one per object."""

    def __init__(self, key: bytes | None) -> None:
        self.h = blake3() if key is None else blake3(key=key)


#: the associated data of a sealed loose object (then tenant, NUL, raw id) and of a sealed
#: pack record (then tenant): a ciphertext moved to another id or tenant does not open
_OBJECT_AD = b"castore/obj/v1\0"
_RECORD_AD = b"castore/rec/v1\0"
_META_AD = b"castore/meta/v1\0"
#: the one key of a ref metadata value sealed by :meth:`Codec.seal_meta`
SEALED_META = "sealed"


class Codec:
    """How objects become ids and stored bytes (docs/FORMAT.md). :data:`PLAIN` (no keys): blake3
    ids and plain frames, today's format. With ``id_key``, an id is blake3 keyed by it (equal
    content under two keys: two ids, and nobody without the key learns that two objects are
    equal); with ``cipher`` too, every frame this codec makes is sealed (``0x03``): a loose
    object's bound to its id and ``tenant``, a pack record's (:meth:`seal_record`) to
    ``tenant`` (each object in it is bound to its id by the keyed hash every read checks).

    Reading takes plain frames as well (a packed object is handed around as the plain frame
    of its bytes once its record opened): the keyed id every read checks is what binds
    bytes to an id, and nobody without the key can make bytes that hash to one.

    Raises:
        InvalidEntry: (constructor) an ``id_key`` that is not 32 bytes, or a ``cipher``
            without an ``id_key`` (plain ids would tell who holds the storage which sealed
            objects are equal, and confirm a guess of their content).
    """

    __slots__ = ("id_key", "cipher", "tenant", "keyed", "_record_ad", "_hashers")

    def __init__(self, id_key: bytes | None = None, cipher: Cipher | None = None, tenant: bytes = b"") -> None:
        if id_key is not None and len(id_key) != 32:
            raise InvalidEntry(f"an id key is 32 bytes, not {len(id_key)}")
        if cipher is not None and id_key is None:
            raise InvalidEntry("a codec that seals frames needs keyed ids (id_key)")
        self.id_key = id_key
        self.cipher = cipher
        self.tenant = bytes(tenant)
        #: True when ids are keyed and frames sealed (an encrypted store's codec)
        self.keyed = id_key is not None and cipher is not None
        self._record_ad = _RECORD_AD + self.tenant
        self._hashers = _Hashers(id_key)

    def __repr__(self) -> str:
        if self.id_key is None:
            return "Codec(PLAIN)"
        return f"Codec(keyed ids, {'sealed' if self.cipher else 'plain'} frames, tenant={self.tenant!r})"

    def __reduce__(self) -> str | tuple[Any, ...]:
        """Pickled when it holds no key (:data:`PLAIN` as itself, by name); a keyed codec is
        refused: its keys never travel in a pickle (open the store with its key there).

        Raises:
            NotPicklable: the codec holds keys.
        """
        if self.id_key is not None:
            raise NotPicklable("Codec", "it holds a tenant's keys")
        return "PLAIN" if self is PLAIN else (Codec, (None, None, self.tenant))

    def compatible(self, other: Codec) -> bool:
        """Whether ``other`` makes the same ids and opens the same sealed frames as this codec
        (the same keys and tenant): sync copies stored frames only between such codecs."""
        if other is self:
            return True
        return self.id_key == other.id_key and self.tenant == other.tenant and self.cipher == other.cipher

    def check_seal(self) -> None:
        """Raise what sealing a frame would raise, before anything is written (a writer calls
        it before it creates a file that only sealed frames would fill); nothing for a plain
        codec or one that has its key.

        Raises:
            KeyMissing: the store was opened without its master key.
            TenantErased: the tenant's keys were destroyed.
        """
        if self.cipher is not None:
            self.cipher.seal(b"", self._record_ad)  # one empty sealing per new file: cheap

    # -- ids -----------------------------------------------------------------------------
    def digest(self, canonical: bytes | memoryview) -> ObjectId:
        """The id of canonical bytes under this codec."""
        # one hasher per thread: making a hasher is a third of the cost of hashing a small
        # object (a line, its body, its commit). Reset before use, not after: an exception
        # (a KeyboardInterrupt) can arrive anywhere, a cleanup included, and a hasher left
        # holding an interrupted object's bytes would give the next object a wrong id
        h = self._hashers.h
        h.reset()
        h.update(canonical)
        return ObjectId(h.digest().hex())

    def digest_many(self, canonicals: Sequence[bytes]) -> list[ObjectId]:
        """The ids of many canonical bytes, in order (:meth:`digest` of each, batched)."""
        return _digest_many(blake3() if self.id_key is None else blake3(key=self.id_key), canonicals)

    def encode(self, obj: _Object) -> tuple[ObjectId, bytes]:
        """Encode an object canonically and return ``(id under this codec, canonical bytes)``.

        Raises:
            InvalidEntry: the object holds a value msgpack cannot encode.
        """
        data = _canonical(obj)
        return self.digest(data), data

    def encode_raw(self, obj: _Object) -> tuple[ObjectId, bytes, bytes]:
        """:meth:`encode`, with the id's raw 32 bytes too (what objects naming it hold):
        ``(id, raw id, canonical bytes)``.

        Raises:
            InvalidEntry: the object holds a value msgpack cannot encode.
        """
        data = _canonical(obj)
        h = self._hashers.h
        h.reset()  # before use, as digest's
        h.update(data)
        raw = h.digest()
        return ObjectId(raw.hex()), raw, data

    # -- frames ----------------------------------------------------------------------------
    def to_stored(self, canonical: bytes, compress: bool = True, oid: str | None = None) -> bytes:
        """:func:`to_stored` of ``canonical``, sealed (bound to its id ``oid``, computed when not
        given, and the tenant) when this codec has a cipher: a loose object's bytes."""
        frame = to_stored(canonical, compress)
        if self.cipher is None:
            return frame
        return self._seal(frame, self._object_ad(oid if oid is not None else self.digest(canonical)))

    def seal_record(self, frame: bytes) -> bytes:
        """A pack record's payload made of its content's ``frame``: sealed and bound to the
        tenant when this codec has a cipher, else ``frame`` itself."""
        if self.cipher is None:
            return frame
        return self._seal(frame, self._record_ad)

    def frame_block(self, data: bytes, level: int, cuts: Sequence[int] = ()) -> bytes:
        """:func:`frame_block`, sealed as a record's payload (:meth:`seal_record`)."""
        return self.seal_record(frame_block(data, level, cuts))

    def unframe(self, stored: bytes | memoryview, what: str = "frame", limit: int = MAX_OBJECT_SIZE,
                oid: str | None = None) -> bytes:
        """:func:`unframe`, opening a sealed frame first: a loose object's, bound to its id
        ``oid``, or (``oid`` None) a pack record's payload. No id is checked here.

        Raises:
            IntegrityError: (naming ``what``) as :func:`unframe`.
            SealedFrameError: (an IntegrityError) a sealed frame that does not open (a wrong
                key, or bytes moved from another id or tenant, or damaged), or that this codec
                has no key for.
        """
        if stored[:1] != SEALED:
            return unframe(stored, what, limit)
        if self.cipher is None:
            raise SealedFrameError(what, "it is sealed (an encrypted store's): open the store with its key")
        ad = self._record_ad if oid is None else self._object_ad(oid)
        try:
            frame = self.cipher.open(bytes(stored[1:]), ad)
        except IntegrityError as e:
            raise SealedFrameError(what, e.reason) from e
        if frame[:1] == SEALED:
            raise IntegrityError(what, "a sealed frame inside a sealed frame")
        return unframe(frame, what, limit)

    def from_stored(self, oid: str, stored: bytes) -> bytes:
        """Open and unframe stored bytes and check that they hash to ``oid`` under this codec;
        return canonical bytes.

        Raises:
            IntegrityError: as :meth:`unframe`, or a hash mismatch.
        """
        canonical = self.unframe(stored, oid, oid=oid)
        actual = self.digest(canonical)
        if actual != oid:
            raise IntegrityError(oid, f"content hashes to {actual}")
        return canonical

    # -- ref metadata ---------------------------------------------------------------------
    def seal_meta(self, value: Any, what: str) -> Any:
        """A JSON-able value kept in ref metadata (a session's info: titles, source paths), as
        stored: the value itself under a plain codec; with a cipher ``{"sealed": base64 of the
        sealed JSON}``, bound to the tenant and to ``what`` (the kind of value, e.g. ``"info"``).

        Raises:
            InvalidEntry: the value is not JSON-able.
        """
        if self.cipher is None:
            return value
        try:
            text = msgspec.json.encode(value, order="deterministic")
        except (TypeError, ValueError, OverflowError) as e:
            raise InvalidEntry(f"cannot encode {what}: {e}") from e
        sealed = self.cipher.seal(text, _META_AD + self.tenant + b"\0" + what.encode())
        return {SEALED_META: base64.b64encode(sealed).decode()}

    def meta_links(self, meta: Any) -> list[ObjectId]:
        """:func:`meta_links` of ref metadata, each value sealed in it (:meth:`seal_meta`, under
        the key it is kept at: a session's info) opened first: a session's info names blobs (a
        fork's copied lines, an import's side files) that reachability and sync must see in an
        encrypted store too.

        Raises:
            SealedFrameError: a sealed value does not open (another key or tenant, damaged).
            KeyMissing, TenantErased: this codec has no key.
        """
        out = meta_links(meta)
        if self.cipher is not None and isinstance(meta, dict):
            for k, v in meta.items():
                if isinstance(v, dict) and len(v) == 1 and SEALED_META in v:
                    out += meta_links(self.open_meta(v, k))
        return out

    def open_meta(self, stored: Any, what: str) -> Any:
        """The value :meth:`seal_meta` stored (a plain value is returned as it is: written before
        the store was encrypted, or by a plain codec).

        Raises:
            SealedFrameError: (an IntegrityError) a sealed value that does not open: another
                key or tenant, damaged, or this codec has no key.
        """
        if not (isinstance(stored, dict) and len(stored) == 1 and isinstance(stored.get(SEALED_META), str)):
            return stored
        if self.cipher is None:
            raise SealedFrameError(what, "it is sealed (an encrypted store's): open the store with its key")
        try:
            sealed = base64.b64decode(stored[SEALED_META], validate=True)
            return msgspec.json.decode(self.cipher.open(sealed, _META_AD + self.tenant + b"\0" + what.encode()))
        except (ValueError, msgspec.DecodeError) as e:
            raise SealedFrameError(what, f"a sealed value that is not one ({e})") from e
        except IntegrityError as e:
            raise SealedFrameError(what, e.reason) from e

    def _seal(self, frame: bytes, ad: bytes) -> bytes:
        assert self.cipher is not None  # callers check
        return SEALED + self.cipher.seal(frame, ad)

    def _object_ad(self, oid: str) -> bytes:
        return _OBJECT_AD + self.tenant + b"\0" + raw_id(oid)


#: the codec of an unencrypted store: blake3 ids, plain frames (byte for byte the module functions)
PLAIN = Codec()


def is_sealed(stored: bytes | memoryview) -> bool:
    """Whether stored bytes are a sealed frame (``0x03``, an encrypted store's)."""
    return stored[:1] == SEALED


#: the first bytes after the map header of a canonical Segment or Index (the tag comes first)
_PATH_TAGS = (b"\xa1k\xa1s", b"\xa1k\xa1i")


def is_path_object(canonical: bytes) -> bool:
    """Whether canonical bytes are a :class:`Segment` or an :class:`Index`: objects that belong
    to one path, are shared with no other session, and repeat their neighbours' bytes."""
    return 0x80 <= canonical[0] <= 0x8F and canonical[1:5] in _PATH_TAGS


def kind_tag(canonical: bytes | memoryview) -> str:
    """The tag of the object whose canonical bytes these are (``"c"`` a :class:`Commit`,
    ``"t"`` a :class:`Tree`, ``"v"`` a :class:`Value`, ``"b"`` a :class:`Blob`, ``"s"`` a
    :class:`Segment`, ``"i"`` an :class:`Index`), read from its first bytes (msgspec writes
    the tag first), without decoding it; ``""`` when they do not start like an object's."""
    if len(canonical) >= 5 and 0x80 <= canonical[0] <= 0x8F and canonical[1:4] == b"\xa1k\xa1":
        return chr(canonical[4])
    return ""


def decode(oid: str, canonical: bytes) -> AnyObject:
    """Decode canonical bytes (already verified) into an object.

    Raises:
        IntegrityError: the bytes are not a format-1 object.
    """
    try:
        return _decoder.decode(canonical)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise IntegrityError(oid, f"not a castore object ({e})") from e


def decode_many(oids: Sequence[str], canonicals: Sequence[bytes]) -> list[AnyObject]:
    """:func:`decode` of many canonical bytes (already verified), in order.

    Raises:
        IntegrityError: naming the first one that is not a format-1 object.
    """
    dec = _decoder.decode
    try:
        return list(map(dec, canonicals))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return [decode(oid, c) for oid, c in zip(oids, canonicals, strict=True)]  # raises for the bad one


def pack(value: Any) -> bytes:
    """Canonical msgpack bytes of a plain value.

    Raises:
        InvalidEntry: the value cannot be encoded.
    """
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidEntry(f"value cannot be stored: {e}") from e


def unpack(data: bytes) -> Any:
    """The plain value of msgpack bytes (what :func:`pack` wrote).

    Raises:
        InvalidEntry: the bytes are not msgpack.
    """
    try:
        return msgspec.msgpack.decode(data)
    except msgspec.DecodeError as e:
        raise InvalidEntry(f"not valid msgpack: {e}") from e


def to_builtins(value: Any) -> Any:
    """Turn a stored value into JSON-compatible builtins (bytes become base64 strings)."""
    return msgspec.to_builtins(value)


_SORTED_JSON = msgspec.json.Encoder(order="sorted")


def json_dumps_sorted(value: Any) -> bytes:
    """``value`` as compact JSON with every dict's keys sorted (msgspec's encoder).

    Raises:
        TypeError, ValueError, OverflowError: what msgspec cannot encode (see msgspec's docs).
    """
    return _SORTED_JSON.encode(value)


def json_loads(text: str | bytes) -> Any:
    """Parse JSON text.

    Raises:
        InvalidEntry: the text is not JSON.
    """
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError as e:
        raise InvalidEntry(f"not valid JSON: {e}") from e


#: a decoder per type :func:`json_loads_as` was asked for
_TYPED_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}


def json_loads_as(text: str | bytes, kind: Any) -> Any:
    """Parse JSON text as ``kind`` (a type msgspec decodes: a TypedDict, a list of tuples, ...),
    its shape checked as it is parsed (a key ``kind`` does not name is passed over).

    Raises:
        InvalidEntry: the text is not JSON, or not of that shape.
    """
    dec = _TYPED_DECODERS.get(kind)
    if dec is None:
        dec = _TYPED_DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        return dec.decode(text)
    except msgspec.DecodeError as e:  # msgspec.ValidationError too
        raise InvalidEntry(f"not JSON of the shape expected: {e}") from e


# -- probes: what a scan of stored bytes may rely on, without decoding ---------------------------
#: an object's kind tag lies at ``canonical[TAG_START:TAG_END]`` (msgspec writes the tag field
#: first, after the map's header byte): compared with :func:`kind_tag_bytes`, it tells what a
#: stored object is without decoding it
TAG_START, TAG_END = 1, 5
_TAG_FIELD = b"\xa1k\xa1"  # the tag field's name and the header of its one-letter value


def kind_tag_bytes(cls: type[AnyObject]) -> bytes:
    """``canonical[TAG_START:TAG_END]`` of every object of class ``cls`` (:class:`Commit`,
    :class:`Value`, ...). Raises nothing."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str) and len(tag) == 1  # every kind is tagged by one letter (above)
    return _TAG_FIELD + tag.encode()


_BODY_MARKER: list[bytes] = []


def body_marker() -> bytes:
    """The bytes in front of a commit's body id in its canonical bytes (the field's name and the
    header of 32 raw bytes): a scan finds the bodies commits name by them, without decoding one.

    Raises:
        AssertionError: the codec no longer stores a commit's body so (found out here, not by
            a scan that silently misses every commit).
    """
    if not _BODY_MARKER:
        probe = bytes(range(1, 33))
        marker = pack("body") + pack(bytes(32))[:-32]
        if encode(Commit(kind="message", body=probe))[1].find(marker + probe) < 0:
            raise AssertionError("a commit's body is not stored as expected")
        _BODY_MARKER.append(marker)
    return _BODY_MARKER[0]


#: UTF-8 of the non-ASCII letters Python's case-insensitive matching equates with i, s and k
_FOLDS = {ord("i"): b"(?:i|\xc4\xb0|\xc4\xb1)", ord("s"): b"(?:s|\xc5\xbf)", ord("k"): b"(?:k|\xe2\x84\xaa)"}


def string_probe(utf8: bytes, fold_case: bool = False) -> re.Pattern[bytes]:
    """The search, in canonical bytes, for a string holding the text ``utf8`` (its UTF-8 bytes).

    Every object holding a string (a map key too) that contains the text matches, as the
    codec keeps each string as its UTF-8 bytes, whole; a match is only a candidate (the bytes
    may be part of a binary value). Numbers, booleans and null are stored in binary: text a
    reader renders from them (as JSON does) is not in the bytes.

    Args:
        utf8: the text's UTF-8 bytes.
        fold_case: ``utf8`` is lower-case ASCII and the pattern is searched in the bytes
            lower-cased (``bytes.lower()``, which folds ASCII only); it then matches every
            string holding the text in any case as ``re.IGNORECASE`` sees it: i, s and k also
            stand for the UTF-8 of the four non-ASCII letters it equates with them.

    Raises:
        ValueError: ``fold_case`` with ``utf8`` that is not lower-case ASCII.
    """
    if not fold_case:
        return re.compile(re.escape(utf8))
    if not utf8.isascii() or utf8 != utf8.lower():
        raise ValueError(f"a case-folded probe is lower-case ASCII, not {utf8!r}")
    return re.compile(b"".join(_FOLDS.get(c) or re.escape(bytes([c])) for c in utf8))
