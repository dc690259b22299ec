"""Pack and pack-index bytes (format 2): many object frames in one file. No I/O.

A pack is a header and a sequence of records; a record is one append's objects, checked
as a unit (a torn record at the end of a log is ignored). An index lists, sorted by id,
where each frame of a sealed pack starts. docs/FORMAT.md (sections 4 and 5) is the
specification; this module is its only implementation.

    pack    = "CAPK" 0x01 0x00 0x00 0x00  record*
    record  = length:u32  check:16  payload        check = blake3(payload)[:16]
    payload = (id:32  size:u32  frame:size)+
    idx     = "CAIX" 0x01 0x00 0x00 0x00  pack_size:u64  count:u32  (id:32 offset:u64 size:u32)*  check:16
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from typing import NamedTuple

from . import objects as o
from .errors import IntegrityError

PACK_MAGIC = b"CAPK\x01\x00\x00\x00"
INDEX_MAGIC = b"CAIX\x01\x00\x00\x00"
HEADER_SIZE = len(PACK_MAGIC)
_REC = struct.Struct(">I16s")  # record length, check
_ENTRY = struct.Struct(">32sI")  # raw id, frame size
_IDX_HEAD = struct.Struct(">8sQI")  # magic, pack size, count
_ROW = struct.Struct(">32sQI")  # raw id, frame offset, frame size
#: a record larger than this is refused when written and taken as damage when read
RECORD_MAX = 1 << 31
PACK_SUFFIX = ".pack"
INDEX_SUFFIX = ".idx"


class Location(NamedTuple):
    """Where one frame is: its offset in the pack and its size."""

    offset: int
    size: int


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
    return _REC.pack(len(payload), o.checksum(payload)) + payload, where


def encode_pack(frames: Iterable[tuple[str, bytes]]) -> tuple[bytes, dict[str, Location]]:
    """A whole pack of one record (what a writer without append support writes in one PUT).

    Raises:
        IntegrityError: see :func:`encode_record`.
    """
    rec, where = encode_record(frames, HEADER_SIZE)
    return PACK_MAGIC + rec, where


def scan(data: bytes | memoryview, base: int = 0) -> tuple[dict[str, Location], int]:
    """Every frame of the valid records in ``data``: a pack's bytes from pack offset ``base``.

    Reading stops at the first record that is incomplete or fails its check: the end of
    a log that is still being written, or that a crash cut short.

    Returns:
        The frames found (offsets relative to the start of the pack) and the pack offset
        just after the last valid record (where the next scan of a growing log resumes).

    Raises:
        IntegrityError: ``base`` is 0 and the bytes do not begin with a pack header.
    """
    off = 0
    if base == 0:
        if len(data) < HEADER_SIZE:
            return {}, 0  # a log whose header is not written yet
        if data[:HEADER_SIZE] != PACK_MAGIC:
            raise IntegrityError("pack", f"not a castore pack (header {bytes(data[:HEADER_SIZE])!r})")
        off = HEADER_SIZE
    found: dict[str, Location] = {}
    view = memoryview(data)
    while off + _REC.size <= len(data):
        length, check = _REC.unpack_from(data, off)
        body_at = off + _REC.size
        if length >= RECORD_MAX or body_at + length > len(data):
            break
        payload = view[body_at:body_at + length]
        if o.checksum(payload) != check:
            break
        entries = _entries(payload, base + body_at)
        if entries is None:
            break
        found.update(entries)
        off = body_at + length
    return found, base + off


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


def encode_index(pack_size: int, where: dict[str, Location]) -> bytes:
    """The index of a sealed pack of ``pack_size`` bytes holding the frames ``where``."""
    rows = [_ROW.pack(bytes.fromhex(oid), loc.offset, loc.size) for oid, loc in sorted(where.items())]
    body = _IDX_HEAD.pack(INDEX_MAGIC, pack_size, len(rows)) + b"".join(rows)
    return body + o.checksum(body)


class IndexView:
    """An index checked once (magic, row count, check) and searched in place: its rows are
    sorted by id, so a reader that needs a few objects of a pack binary-searches them (as
    git reads an ``.idx``) instead of decoding every row.

    Raises:
        IntegrityError: not an index, truncated, or its check fails (from the constructor).
    """

    __slots__ = ("data", "pack_size", "count")

    def __init__(self, data: bytes) -> None:
        if len(data) < _IDX_HEAD.size + 16 or data[:len(INDEX_MAGIC)] != INDEX_MAGIC:
            raise IntegrityError("pack index", "not a castore pack index")
        if o.checksum(memoryview(data)[:-16]) != data[-16:]:
            raise IntegrityError("pack index", "its check does not match (damaged or cut short)")
        _, pack_size, count = _IDX_HEAD.unpack_from(data, 0)
        held = len(data) - 16 - _IDX_HEAD.size
        if held != count * _ROW.size:
            raise IntegrityError("pack index", f"declares {count} rows but holds {held} bytes")
        self.data = data
        self.pack_size: int = pack_size
        self.count: int = count

    def find(self, raw: bytes) -> Location | None:
        """Where the frame of the object with raw id ``raw`` is, or None when the pack lacks it.

        Raises:
            IntegrityError: its row points past the end of the pack.
        """
        data, base, step = self.data, _IDX_HEAD.size, _ROW.size
        lo, hi = 0, self.count
        while lo < hi:
            mid = (lo + hi) // 2
            at = base + mid * step
            if data[at:at + 32] < raw:
                lo = mid + 1
            else:
                hi = mid
        if lo == self.count:
            return None
        found, off, size = _ROW.unpack_from(data, base + lo * step)
        if found != raw:
            return None
        if off + size > self.pack_size:
            raise IntegrityError("pack index", f"a row points past the pack's end ({off}+{size} > {self.pack_size})")
        return Location(off, size)

    def rows(self) -> dict[str, Location]:
        """Every frame the index lists, by hex id.

        Raises:
            IntegrityError: a row points past the end of the pack.
        """
        out: dict[str, Location] = {}
        pack_size = self.pack_size
        for raw, off, size in _ROW.iter_unpack(memoryview(self.data)[_IDX_HEAD.size:-16]):
            if off + size > pack_size:
                raise IntegrityError("pack index", f"a row points past the pack's end ({off}+{size} > {pack_size})")
            out[raw.hex()] = Location(off, size)
        return out


def decode_index(data: bytes) -> tuple[int, dict[str, Location]]:
    """Parse an index; return the size of the pack it covers and its frames.

    Raises:
        IntegrityError: not an index, truncated, its check fails, or a row points past the
            pack's end.
    """
    view = IndexView(data)
    return view.pack_size, view.rows()


def content_name(prefix: str, data: bytes) -> str:
    """A pack name derived from its bytes: ``<prefix>-<32 hex>`` (``b`` batch, ``r`` repack)."""
    return f"{prefix}-{o.checksum(data).hex()}"


def log_name() -> str:
    """A fresh name for a local writer's log: ``w-<32 random hex>``."""
    return f"w-{os.urandom(16).hex()}"


def is_pack_name(name: str) -> bool:
    """Whether ``name`` (without suffix) is a pack name castore writes."""
    head, sep, tail = name.partition("-")
    return sep == "-" and head in ("w", "b", "r") and len(tail) == 32 and all(c in "0123456789abcdef" for c in tail)


__all__ = ["Location", "IndexView", "encode_record", "encode_pack", "scan", "encode_index", "decode_index",
           "content_name", "log_name", "is_pack_name", "PACK_MAGIC", "INDEX_MAGIC", "HEADER_SIZE", "PACK_SUFFIX",
           "INDEX_SUFFIX"]
