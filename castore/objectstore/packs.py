"""Pack bytes (format 2): many objects in one file. No I/O.

A pack is a header and a sequence of records; a record is one append's objects, checked
as a unit (a torn record at the end of a log is ignored). An index lists, sorted by id,
where each object of a sealed pack is: its layout is below, beside the pack's, and its codec
:mod:`castore.objectstore.packindex`. docs/FORMAT.md (sections 4 and 5) is the
specification; this module and that one are its only implementation. Two versions exist;
readers read both forever, writers write version 2.

Version 1 (each object its own frame, its id and size in front of it)::

    pack    = "CAPK" 0x01 0x00 0x00 0x00  record*
    record  = length:u32  check:16  payload        check = blake3(payload)[:16]
    payload = (id:32  size:u32  frame:size)+
    idx     = "CAIX" 0x01 0x00 0x00 0x00  pack_size:u64  count:u32  (id:32 offset:u64 size:u32)*  check:16

Version 2 (a record's objects compressed together as one frame; ids are not stored in the
pack: an object's id is the blake3 of its bytes, computed when the record is scanned)::

    pack    = "CAPK" 0x02 0x00 0x00 0x00  record*
    record  = length:u32  check:16  payload        check = blake3(payload)[:16]
    payload = frame of content                     (a header byte and a zstd frame, objects.unframe;
                                                    in an encrypted store sealed: 0x03, Codec.seal_record)
    content = (size:u32  canonical:size)+
    idx     = "CAIX" 0x02 0x00 0x00 0x00  pack_size:u64  nrec:u32  count:u32
              (offset:u64 size:u32){nrec}            each record's payload
              (id:32 rec:u32 start:u32 length:u32){count}   canonical bytes at content[start:start+length]
              check:16

A local writer's log (version 2) may also hold *ref intents* (format 3, docs/FORMAT.md 12):
records whose payload starts with the byte :data:`INTENT_FRAME` (``0x10``) instead of an
object frame's header. They hold no object: every reader of objects skips them; what they
hold is :mod:`castore.objectstore.refintents`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from .. import objects as o
from ..errors import IntegrityError, SealedFrameError

PACK_MAGIC = b"CAPK\x01\x00\x00\x00"
PACK_MAGIC_V2 = b"CAPK\x02\x00\x00\x00"
_VERSIONS = {PACK_MAGIC: 1, PACK_MAGIC_V2: 2}
HEADER_SIZE = len(PACK_MAGIC)
_SIZE = struct.Struct(">I")  # version 2: an object's size in a record's content
_REC = struct.Struct(">I16s")  # record length, check
#: bytes before a record's payload: its length and its check (docs/FORMAT.md, 4)
RECORD_HEADER_SIZE = _REC.size
_ENTRY = struct.Struct(">32sI")  # raw id, frame size
#: a record larger than this is refused when written and taken as damage when read
RECORD_MAX = 1 << 31
#: a writer puts at most this many bytes of content (objects and their sizes) in one
#: version-2 record and splits a larger batch (a packed object is at most 4 MiB): a scan
#: holds one record's content at a time, so this bounds its memory
RECORD_CONTENT_MAX = 16 << 20
#: a version-2 record whose frame declares more content than this is damage (corrupt or
#: hostile) and is refused before anything is decompressed; 4 x what a writer puts in one,
#: so that the larger records written before writers split their batches stay readable
RECORD_CONTENT_READ_MAX = 4 * RECORD_CONTENT_MAX
#: resynchronising past damaged records hashes at most this many bytes per byte of the
#: pack: candidates that pass every cheap check yet fail their checksum cost their length
#: each, and a crafted pack is all such candidates (past the budget, the rest is a torn tail)
RESYNC_WORK = 4
#: the first byte of a ref intent's payload (never an object frame's header: 0x00-0x03)
INTENT_FRAME = b"\x10"
PACK_SUFFIX = ".pack"
INDEX_SUFFIX = ".idx"
#: the folder of a store that holds its packs and their indexes
PACKS = "packs"


def pack_key(name: str) -> str:
    """The storage key of a pack."""
    return f"{PACKS}/{name}{PACK_SUFFIX}"


def index_key(name: str) -> str:
    """The storage key of a pack's index."""
    return f"{PACKS}/{name}{INDEX_SUFFIX}"


class Location(NamedTuple):
    """Where one frame is in a version-1 pack: its offset in the pack and its size."""

    offset: int
    size: int


class Slot(NamedTuple):
    """Where one object is in a version-2 pack: its record's payload (``offset``, ``size``
    in the pack) and its canonical bytes in that record's content (``start``, ``length``)."""

    offset: int
    size: int
    start: int
    length: int


Place = Location | Slot


def record_span(loc: Place) -> tuple[int, int]:
    """``(offset, bytes)`` in its pack of the record holding the object at ``loc``, header
    included (a version-1 place: its frame alone), as fsck names damaged records."""
    if isinstance(loc, Slot):
        return loc.offset - _REC.size, loc.size + _REC.size
    return loc.offset, loc.size


class Whole(NamedTuple):
    """A version-2 record a repack copies into its new pack as it is (a block this handle
    wrote in its final layout: :func:`whole_record`): its bytes (header and payload) and
    its objects' places in the pack it is copied from (their ``start`` and ``length`` in its
    content hold in the new pack too)."""

    record: bytes | memoryview
    slots: Mapping[str, Slot]


def whole_record(data: bytes | memoryview, slot: Slot, slots: Mapping[str, Slot]) -> Whole:
    """The record of a pack's ``data`` whose payload ``slot`` names, as a :class:`Whole`."""
    at, size = record_span(slot)
    return Whole(memoryview(data)[at:at + size], slots)


def framed(payload: bytes) -> bytes:
    """One record of a pack: ``payload`` behind its length and check. Raises nothing."""
    return _REC.pack(len(payload), o.checksum(payload)) + payload


def encode_record(frames: Iterable[tuple[str, bytes]], at: int) -> tuple[bytes, dict[str, Location]]:
    """One record holding ``(hex id, frame)`` pairs, for a pack where it will start at ``at``.

    Returns the record's bytes and where each frame will be in the pack.

    Raises:
        IntegrityError: the record would exceed :data:`RECORD_MAX` (an object that large
            belongs in a loose file), or an id is not a full hex id.
    """
    parts: list[bytes] = []
    where: dict[str, Location] = {}
    pos = at + _REC.size
    for oid, frame in frames:
        if oid in where:
            continue
        raw = o.raw_id(oid)
        parts.append(_ENTRY.pack(raw, len(frame)))
        parts.append(frame)
        pos += _ENTRY.size
        where[oid] = Location(pos, len(frame))
        pos += len(frame)
    payload = b"".join(parts)
    if len(payload) >= RECORD_MAX:
        raise IntegrityError("pack record", f"{len(payload)} bytes is more than a record holds")
    return framed(payload), where


def encode_pack(frames: Iterable[tuple[str, bytes]]) -> tuple[bytes, dict[str, Location]]:
    """A whole pack of one record (what a writer without append support writes in one PUT).

    Raises:
        IntegrityError: see :func:`encode_record`.
    """
    rec, where = encode_record(frames, HEADER_SIZE)
    return PACK_MAGIC + rec, where


def pack_version(data: bytes | memoryview) -> int:
    """The version of a pack from its first bytes (0: the header is not written yet).

    Raises:
        IntegrityError: the bytes do not begin with a castore pack header.
    """
    if len(data) < HEADER_SIZE:
        return 0
    version = _VERSIONS.get(bytes(data[:HEADER_SIZE]))
    if version is None:
        raise IntegrityError("pack", f"not a castore pack (header {bytes(data[:HEADER_SIZE])!r})")
    return version


def scan(data: bytes | memoryview, base: int = 0, version: int = 1,
         keep: Callable[[int, bytes], None] | None = None,
         damaged: list[tuple[int, int]] | None = None, codec: o.Codec = o.PLAIN,
         refused: list[SealedFrameError] | None = None,
         known: Mapping[int, Mapping[str, Slot]] | None = None) -> tuple[dict[str, Place], int]:
    """Every object of the valid records in ``data``: a pack's bytes from pack offset ``base``.

    A record that is incomplete or fails its check ends the scan when no valid record
    follows it: the *torn tail* of a log that is still being written, or that a crash cut
    short. When a valid record does follow it (found by :func:`_resync`), it is a *damaged
    record* in the middle: its span ``(pack offset, bytes)`` is appended to ``damaged`` and
    the scan goes on, so the objects after it stay readable (docs/FORMAT.md, 4). From
    offset 0 the version comes from the header; a resumed scan (``base`` > 0) is told it.
    A version-2 record is decompressed, a record at a time (one declaring more than
    :data:`RECORD_CONTENT_READ_MAX` is damaged), and each object in it hashed (that is its
    id under ``codec``, which also opens a sealed record); its content is handed to
    ``keep(payload offset, content)`` when given, so that reading its objects costs nothing
    more. A sealed record that passes its check yet does not open (a wrong key, or moved from
    another tenant) is skipped as damage is, its error appended to ``refused`` when given.
    The whole scan is linear in the bytes (:data:`RESYNC_WORK`). ``known``: the places of
    the objects of some version-2 records, by payload offset (records this handle wrote,
    whose ids it knows): such a record that passes its check, and is the size they say, is
    neither decompressed nor hashed, nor handed to ``keep``; its places are taken as they are.

    Returns:
        The objects found, each at its first copy (offsets relative to the start of the
        pack; an index names the first copy too), and the pack offset just after the last
        valid record (where the next scan of a growing log resumes).

    Raises:
        IntegrityError: ``base`` is 0 and the bytes do not begin with a pack header.
    """
    off = 0
    if base == 0:
        version = pack_version(data)
        if not version:
            return {}, 0  # a log whose header is not written yet
        off = HEADER_SIZE
    found: dict[str, Place] = {}
    view = memoryview(data)
    budget = _Budget(len(view))
    while off + _REC.size <= len(data):
        entries, nxt = _record(view, off, base, version, keep, codec, refused, known)
        if entries is None:
            resumed = _resync(view, off, version, budget)
            if resumed is None:
                break  # nothing valid follows: a torn tail
            if damaged is not None:
                damaged.append((base + off, resumed - off))
            off = resumed
            continue
        if found.keys().isdisjoint(entries):
            found.update(entries)
        else:  # an object written again (another session's append of the same body): its first copy
            for oid, place in entries.items():
                found.setdefault(oid, place)
        off = nxt
    return found, base + off


class _Budget:
    """The bytes resynchronising may still hash in one pass over a pack (:data:`RESYNC_WORK`)."""

    __slots__ = ("left",)

    def __init__(self, size: int) -> None:
        self.left = RESYNC_WORK * size


def _checked(view: memoryview, off: int, version: int, budget: _Budget | None = None) -> int:
    """The end of the record at ``off`` if its length fits and its check holds, else 0; with
    ``budget``, the bytes hashed are taken from it."""
    length, check = _REC.unpack_from(view, off)
    body_at = off + _REC.size
    if not 0 < length < RECORD_MAX or body_at + length > len(view):
        return 0
    if version == 2 and view[body_at] > 3 and view[body_at] != INTENT_FRAME[0]:
        return 0  # a version-2 payload starts with a frame header (0-2, 3 sealed) or is a ref intent
    if budget is not None:
        budget.left -= length
    return body_at + length if o.checksum(view[body_at:body_at + length]) == check else 0


def record_content(payload: bytes | memoryview, what: str, codec: o.Codec = o.PLAIN) -> bytes:
    """The content of a version-2 record's ``payload`` (the record named ``what``), opened by
    ``codec`` when sealed.

    Raises:
        IntegrityError: it does not open or decompress, or declares more than
            :data:`RECORD_CONTENT_READ_MAX` bytes (refused before decompressing).
    """
    return codec.unframe(payload, what, RECORD_CONTENT_READ_MAX)


def record_prefix(payload: bytes | memoryview, what: str) -> o.BlockPrefix:
    """A version-2 record's content decompressed only as far as asked (:class:`objects.BlockPrefix`).

    Raises:
        IntegrityError: as :func:`record_content`, or not a plain zstd frame.
    """
    return o.BlockPrefix(payload, what, RECORD_CONTENT_READ_MAX)


def declared_content(payload: bytes | memoryview) -> int:
    """The content size a version-2 record's payload declares, from its header (-1: none)."""
    return o.declared_size(payload)


def _record(view: memoryview, off: int, base: int, version: int, keep: Callable[[int, bytes], None] | None,
            codec: o.Codec, refused: list[SealedFrameError] | None = None,
            known: Mapping[int, Mapping[str, Slot]] | None = None,
            ) -> tuple[dict[str, Location] | dict[str, Slot] | None, int]:
    """The objects of the record at ``off`` and the offset after it; ``(None, 0)`` when the
    record is incomplete, fails its check, or does not parse."""
    end = _checked(view, off, version)
    if not end:
        return None, 0
    body_at = off + _REC.size
    payload = view[body_at:end]
    if version == 1:
        return _entries(payload, base + body_at), end
    slots = known.get(base + body_at) if known else None
    if slots:
        first = next(iter(slots.values()))
        if first.size == end - body_at:
            return dict(slots), end
    if payload[:1] == INTENT_FRAME:
        return {}, end  # a ref intent: no object in it
    try:
        content = record_content(payload, "pack record", codec)
    except SealedFrameError as e:
        if refused is not None:
            refused.append(e)
        return None, 0
    except IntegrityError:
        return None, 0  # passed its check yet does not open or decompress, or declares too much
    entries = content_slots(content, base + body_at, end - body_at, codec)
    if entries is not None and keep is not None:
        keep(base + body_at, content)
    return entries, end


def _resync(view: memoryview, off: int, version: int, budget: _Budget) -> int | None:
    """The offset of the first record after the bad one at ``off`` whose length fits and
    whose check holds (a false match is a 128-bit checksum collision), or None: then the
    bad record is a torn tail. Where the bad record's own length still leads to a valid
    record (damage inside its payload), that is tried first; otherwise every later offset,
    while ``budget`` lasts (a crafted pack must not cost a hash of the rest at each byte)."""
    length = _REC.unpack_from(view, off)[0]
    after = off + _REC.size + length
    if length and after + _REC.size <= len(view) and _checked(view, after, version, budget):
        return after
    for at in range(off + 1, len(view) - _REC.size + 1):
        if budget.left <= 0:
            return None
        if _checked(view, at, version, budget):
            return at
    return None


def record_length(data: bytes | memoryview, offset: int) -> int:
    """The payload length a record's header at ``offset`` of pack bytes ``data`` says (as
    written, or as damaged: not checked)."""
    length: int = _REC.unpack_from(data, offset)[0]
    return length


def content_slots(content: bytes, offset: int, size: int, codec: o.Codec = o.PLAIN) -> dict[str, Slot] | None:
    """The objects of one version-2 record's ``content`` (its payload at pack ``offset``,
    ``size`` bytes), each id computed from its bytes by ``codec``; None if the content does
    not parse."""
    out: dict[str, Slot] = {}
    pos, n = 0, len(content)
    view = memoryview(content)
    digest = codec.digest
    while pos < n:
        if pos + _SIZE.size > n:
            return None
        (length,) = _SIZE.unpack_from(content, pos)
        pos += _SIZE.size
        if pos + length > n:
            return None
        out.setdefault(digest(view[pos:pos + length]), Slot(offset, size, pos, length))
        pos += length
    return out


def payloads(data: bytes | memoryview) -> Iterator[tuple[int, int, memoryview]]:
    """``(version, payload offset, payload)`` of each valid object record of a whole pack's
    bytes, in order: past a damaged record in the middle and up to a torn tail, as
    :func:`scan` reads them; ref intents are not object records and are left out (nothing
    is decompressed or hashed here but the records' checks).

    Raises:
        IntegrityError: the bytes do not begin with a pack header.
    """
    version = pack_version(data)
    if not version:
        return
    for off, payload in _records(data, version):
        if version == 1 or payload[:1] != INTENT_FRAME:
            yield version, off, payload


def intent_payloads(data: bytes | memoryview) -> Iterator[memoryview]:
    """The payloads of the ref-intent records of a log's bytes (each beginning with
    :data:`INTENT_FRAME`), in order, past a damaged record and up to a torn tail; none in a
    version-1 pack or in bytes that are not a pack (:mod:`castore.objectstore.refintents`
    reads them). Raises nothing."""
    try:
        if pack_version(data) != 2:
            return
    except IntegrityError:
        return
    for _, payload in _records(data, 2):
        if payload[:1] == INTENT_FRAME:
            yield payload


def _records(data: bytes | memoryview, version: int) -> Iterator[tuple[int, memoryview]]:
    """``(payload offset, payload)`` of every record that passes its check, resynchronising
    past a damaged one (:func:`_resync`) and stopping at a torn tail."""
    view = memoryview(data)
    off = HEADER_SIZE
    budget = _Budget(len(view))
    while off + _REC.size <= len(view):
        end = _checked(view, off, version)
        if not end:
            resumed = _resync(view, off, version, budget)
            if resumed is None:
                return
            off = resumed
            continue
        yield off + _REC.size, view[off + _REC.size:end]
        off = end


def content_spans(content: bytes, whole: bool = True) -> list[tuple[int, int]] | None:
    """``(start, length)`` of each object in a version-2 record's ``content``, in order, without
    hashing them; None if the content does not parse. Not ``whole`` (the part of a damaged
    record's content that decoded): the objects before the first one cut short."""
    out: list[tuple[int, int]] = []
    pos, n = 0, len(content)
    unpack = _SIZE.unpack_from
    while pos < n:
        if pos + _SIZE.size > n:
            return None if whole else out
        (length,) = unpack(content, pos)
        pos += _SIZE.size
        if pos + length > n:
            return None if whole else out
        out.append((pos, length))
        pos += length
    return out


def tagged_objects(content: bytes, tag: bytes, start: int, end: int) -> list[bytes] | None:
    """The objects of a version-2 record's ``content`` whose bytes ``[start:end]`` are ``tag``
    (one kind of object: :func:`castore.objects.kind_tag_bytes`), in order, in one pass
    without hashing them; None if the content does not parse (:func:`content_spans`)."""
    out: list[bytes] = []
    pos, n = 0, len(content)
    unpack = _SIZE.unpack_from
    step = _SIZE.size
    while pos < n:
        if pos + step > n:
            return None
        (length,) = unpack(content, pos)
        pos += step
        if pos + length > n:
            return None
        if content[pos + start:pos + end] == tag:
            out.append(content[pos:pos + length])
        pos += length
    return out


def frames_v1(payload: memoryview) -> list[tuple[str, memoryview]] | None:
    """``(hex id, frame)`` of each object of one checked version-1 record payload; None if it
    does not parse."""
    entries = _entries(payload, 0)
    if entries is None:
        return None
    return [(oid, payload[loc.offset:loc.offset + loc.size]) for oid, loc in entries.items()]


def _entries(payload: memoryview, at: int) -> dict[str, Location] | None:
    """The frames of one checked record payload that starts at pack offset ``at``."""
    out: dict[str, Location] = {}
    pos = 0
    n = len(payload)
    while pos < n:
        if pos + _ENTRY.size > n:
            return None
        raw, size = _ENTRY.unpack_from(payload, pos)
        pos += _ENTRY.size
        if pos + size > n:
            return None
        out[raw.hex()] = Location(at + pos, size)
        pos += size
    return out


def encode_content(objects: Iterable[tuple[str, bytes]]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The content of a version-2 record holding ``(hex id, canonical bytes)`` pairs (each
    id once) and where each object's bytes are in it (start, length)."""
    parts: list[bytes] = []
    where: dict[str, tuple[int, int]] = {}
    pos = 0
    for oid, canonical in objects:
        if oid in where:
            continue
        parts.append(_SIZE.pack(len(canonical)))
        parts.append(canonical)
        pos += _SIZE.size
        where[oid] = (pos, len(canonical))
        pos += len(canonical)
    return b"".join(parts), where


#: a repacked block (``by_kind``) ends a zstd block at least every this many content bytes
BLOCK_CUT = 32 << 10
#: the part of a repacked block each kind of object goes to, in this order: commits and
#: trees (what a reader of one revision needs: the state at the middle), then bodies and
#: the rest, then segments and indexes (what copies the commits and bodies before them)
_BLOCK_PARTS = {"c": 0, "t": 0, "s": 2, "i": 2}
#: an object's first five bytes (a map of 0 to 15 fields, its tag first: ``o.kind_tag``) -> its part
_PART_OF = {bytes((0x80 + n,)) + b"\xa1k\xa1" + t.encode(): part for n in range(16) for t, part in _BLOCK_PARTS.items()}


def block_layout(objects: Sequence[tuple[str, bytes]]) -> tuple[list[tuple[str, bytes]], list[int]]:
    """The order of a repacked block's objects and where its zstd blocks end (docs/FORMAT.md,
    4): commits and trees first, then bodies and other objects, then segments and indexes,
    each part in the order given (write order); a cut (an offset into the record's content,
    as :func:`encode_content` lays it out) where a part starts and at the first object
    boundary at or after every :data:`BLOCK_CUT` bytes of a part. So a reader of one commit
    of a long session decodes at most the commits and trees before it (about a sixth of a
    block), in zstd blocks of about 32 KiB, not up to 128 KiB of bodies and segments."""
    ordered, cuts, _, _ = _laid_out(objects)
    return ordered, cuts


def _laid_out(objects: Sequence[tuple[str, bytes]]
              ) -> tuple[list[tuple[str, bytes]], list[int], bytes, dict[str, tuple[int, int]]]:
    """:func:`block_layout` and :func:`encode_content` of its order in one pass: the order,
    the cuts, the content and where each object's bytes are in it (one pass over a landing's
    objects, not three)."""
    parts: list[list[tuple[str, bytes]]] = [[], [], []]
    adds = [p.append for p in parts]
    part_of = _PART_OF.get
    for item in objects:
        adds[part_of(item[1][:5], 1)](item)
    ordered: list[tuple[str, bytes]] = []
    cuts: list[int] = []
    chunks: list[bytes] = []
    where: dict[str, tuple[int, int]] = {}
    size, head = _SIZE.size, _SIZE.pack
    pos = 0
    for part in parts:
        since = -1  # a part starts a zstd block
        for item in part:
            oid, canonical = item
            if oid in where:
                continue  # encode_content keeps the first
            if since < 0 or since >= BLOCK_CUT:
                if pos:
                    cuts.append(pos)
                since = 0
            ordered.append(item)
            n = len(canonical)
            chunks.append(head(n))
            chunks.append(canonical)
            where[oid] = (pos + size, n)
            pos += size + n
            since += size + n
    return ordered, cuts, b"".join(chunks), where


def encode_record_v2(objects: Iterable[tuple[str, bytes]], at: int, level: int | None = None,
                     compress: bool = True, by_kind: bool = False,
                     codec: o.Codec = o.PLAIN) -> tuple[bytes, dict[str, Slot]]:
    """One version-2 record holding ``(hex id, canonical bytes)`` pairs, for a pack where it
    will start at ``at``: their content compressed as one frame (the built-in dictionary for
    a small record, as objects.to_stored; plain zstd at ``level`` when given: a repacked block;
    raw, header ``0x00``, without ``compress``). With ``by_kind`` (a repacked block), the
    objects are laid out by :func:`block_layout` and a plain zstd frame ends a zstd block at
    each of its cuts. The payload is sealed when ``codec`` has a cipher
    (:meth:`~castore.objects.Codec.seal_record`).

    Returns the record's bytes and where each object will be.

    Raises:
        IntegrityError: the record would exceed :data:`RECORD_MAX` or hold more than
            :data:`RECORD_CONTENT_MAX` bytes of content (:func:`encode_records_v2` splits).
    """
    cuts: list[int] = []
    if by_kind:
        _, cuts, content, spans = _laid_out(list(objects))
    else:
        content, spans = encode_content(objects)
    if level is None or not compress:
        payload = codec.seal_record(o.to_stored(content, compress))
    else:
        payload = codec.frame_block(content, level, cuts)
    if len(payload) >= RECORD_MAX or len(content) > RECORD_CONTENT_MAX:
        raise IntegrityError("pack record", f"{len(content)} bytes is more than a record holds")
    offset = at + _REC.size
    where = {oid: Slot(offset, len(payload), start, length) for oid, (start, length) in spans.items()}
    return framed(payload), where


def encode_records_v2(objects: Iterable[tuple[str, bytes]], at: int, level: int | None = None,
                      compress: bool = True, by_kind: bool = False,
                      codec: o.Codec = o.PLAIN, most: int | None = None) -> tuple[bytes, dict[str, Slot]]:
    """:func:`encode_record_v2` of ``objects`` cut, in order, into as few records as hold at
    most :data:`RECORD_CONTENT_MAX` bytes of content each (one record for any batch a
    session writes; ``most``: about that many bytes each instead, a record ending at the
    first object past it); their bytes back to back, from pack offset ``at``, and where
    each object will be (its first copy).

    Raises:
        IntegrityError: one object is larger than a record holds.
    """
    parts: list[bytes] = []
    where: dict[str, Slot] = {}
    for run in _runs(objects, min(most or RECORD_CONTENT_MAX, RECORD_CONTENT_MAX)):
        rec, w = encode_record_v2(run, at, level, compress, by_kind, codec)
        parts.append(rec)
        at += len(rec)
        if where.keys().isdisjoint(w):
            where.update(w)
        else:
            for oid, slot in w.items():
                where.setdefault(oid, slot)
    return b"".join(parts), where


def _runs(objects: Iterable[tuple[str, bytes]], most: int = RECORD_CONTENT_MAX) -> Iterator[list[tuple[str, bytes]]]:
    """``objects`` in order, cut into runs of at most ``most`` content bytes (or one object)."""
    run: list[tuple[str, bytes]] = []
    held = 0
    for item in objects:
        step = _SIZE.size + len(item[1])
        if run and held + step > most:
            yield run
            run, held = [], 0
        run.append(item)
        held += step
    if run:
        yield run


def encode_pack_v2(groups: Iterable[Sequence[tuple[str, bytes]] | Whole], block_bytes: int = 0,
                   level: int | None = None,
                   cut_after: Callable[[Sequence[tuple[str, bytes]]], bool] | None = None,
                   compress: bool = True, by_kind: bool = False,
                   codec: o.Codec = o.PLAIN, aside: Callable[[bytes], bool] | None = None,
                   aside_bytes: int = 0) -> tuple[bytes, dict[str, Slot]]:
    """A whole version-2 pack (records sealed when ``codec`` has a cipher). Each group of
    ``(hex id, canonical bytes)`` (one append's objects, in write order) goes whole into one
    record; with ``block_bytes``, consecutive groups share a record until it holds that many
    bytes and ``cut_after`` (when given) says the last group ends a run (a repacked pack:
    blocks compressed together, so that neighbouring objects share their bytes; a block also
    ends at 4 x ``block_bytes``). With both, a group in write order is taken run by run
    (:func:`write_runs`): a block may end inside it, after a segment or an index.
    ``by_kind``: each record laid out by kind (:func:`block_layout`; what repack writes).
    A :class:`Whole` among the groups is copied as it is, as a record of its own.
    ``aside``: the objects it takes (by their canonical bytes) go, in order, into blocks of
    their own of at most ``aside_bytes`` each (or one object) (a repack's path indexes: each copies the one
    before it, so many share a block cheaply, and a block of entries holds none).

    Raises:
        IntegrityError: see :func:`encode_record_v2`.
    """
    parts = [PACK_MAGIC_V2]
    where: dict[str, Slot] = {}
    pos = HEADER_SIZE
    block: list[tuple[str, bytes]] = []
    side: list[tuple[str, bytes]] = []
    held = side_held = 0

    def flush(objects: list[tuple[str, bytes]]) -> None:
        nonlocal pos
        if objects:
            rec, w = encode_records_v2(objects, pos, level, compress, by_kind, codec)
            parts.append(rec)
            for oid, slot in w.items():
                where.setdefault(oid, slot)
            pos += len(rec)
            objects.clear()

    for group in groups:
        if isinstance(group, Whole):
            flush(block)
            held = 0
            rec = group.record
            at, size = pos + _REC.size, len(rec) - _REC.size
            for oid, old in group.slots.items():
                where.setdefault(oid, Slot(at, size, old.start, old.length))
            parts.append(bytes(rec))
            pos += len(rec)
            continue
        for run in (write_runs(group, cut_after) if cut_after is not None and block_bytes else (group,)):
            ends = cut_after is None or cut_after(run)
            if aside is not None:
                kept = [item for item in run if not aside(item[1])]
                if len(kept) < len(run):
                    for item in run:
                        if aside(item[1]):
                            if side and side_held + len(item[1]) > aside_bytes:
                                flush(side)
                                side_held = 0
                            side.append(item)
                            side_held += len(item[1])
                    run = kept
            block.extend(run)
            held += sum(len(c) for _, c in run)
            if held >= block_bytes and (ends or held >= 4 * block_bytes):
                flush(block)
                held = 0
    flush(block)
    flush(side)
    return b"".join(parts), where


def write_runs(group: Sequence[tuple[str, bytes]], cut_after: Callable[[Sequence[tuple[str, bytes]]], bool]
               ) -> list[Sequence[tuple[str, bytes]]]:
    """``group`` cut into runs where a block may end: after each object ``cut_after`` takes
    as a run's last (a segment or an index) that no other such object follows, when the
    group is in write order (one append's objects, a log's or a batch pack's record: a
    segment comes after the commits and bodies it copies); whole when it is laid out by kind
    (a repacked block, :func:`block_layout`: its segments are last, after every commit it
    holds, and a block cut there would part them from what they copy). So one append of many
    entries no longer makes one block of its own, however large: the newest entries of a
    session written 500 at a time sat in a block of 1 MiB that a reader of the last few
    decompressed whole. Raises nothing."""
    if len(group) < 2 or _by_kind(group):
        return [group]
    runs: list[Sequence[tuple[str, bytes]]] = []
    start = 0
    ends = [cut_after((item,)) for item in group]
    for i in range(len(group)):
        if ends[i] and (i + 1 == len(group) or not ends[i + 1]):
            runs.append(group[start:i + 1])
            start = i + 1
    if start < len(group):
        runs.append(group[start:])
    return runs


def _by_kind(group: Sequence[tuple[str, bytes]]) -> bool:
    """Whether ``group``'s objects are in :func:`block_layout`'s order of parts."""
    part_of = _PART_OF.get
    last = 0
    for _, canonical in group:
        part = part_of(canonical[:5], 1)
        if part < last:
            return False
        last = part
    return True


def content_name(prefix: str, data: bytes) -> str:
    """A pack name derived from its bytes: ``<prefix>-<32 hex>`` (``b`` batch, ``r`` repack)."""
    return f"{prefix}-{o.checksum(data).hex()}"


def log_name() -> str:
    """A fresh name for a local writer's log: ``w-<32 random hex>``."""
    return f"w-{os.urandom(16).hex()}"


def is_pack_name(name: str) -> bool:
    """Whether ``name`` (without suffix) is a pack name castore writes."""
    head, sep, tail = name.partition("-")
    return sep == "-" and head in ("w", "b", "r") and len(tail) == 32 and not tail.strip("0123456789abcdef")


__all__ = ["Location", "Slot", "Place", "Whole", "whole_record",
           "payloads", "content_spans", "tagged_objects", "frames_v1",
           "encode_record", "encode_pack", "encode_content",
           "encode_record_v2", "encode_records_v2", "encode_pack_v2", "record_content", "record_prefix",
           "declared_content", "RECORD_CONTENT_MAX", "RECORD_CONTENT_READ_MAX", "RESYNC_WORK",
           "block_layout", "BLOCK_CUT", "write_runs",
           "scan", "content_slots", "pack_version",
           "content_name", "log_name", "is_pack_name", "INTENT_FRAME",
           "framed", "intent_payloads",
           "PACK_MAGIC", "PACK_MAGIC_V2", "HEADER_SIZE", "PACK_SUFFIX", "INDEX_SUFFIX",
           "PACKS", "pack_key", "index_key"]
