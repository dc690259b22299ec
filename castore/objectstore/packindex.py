"""Pack indexes (``.idx``, format 2): where each object of a sealed pack is, sorted by id,
and how a reader searches one in place. No I/O.

docs/FORMAT.md (section 5) is the specification; the layouts of both versions are in
:mod:`castore.objectstore.packs`' docstring, beside the packs they index. Version 1 lists
each object's frame (:class:`~castore.objectstore.packs.Location`); version 2 each
object's place in a record's content (:class:`~castore.objectstore.packs.Slot`), after a
table of the records. :class:`IndexView` binary-searches the rows of either, from a whole
index or by ranged reads of its file.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping

from .. import objects as o
from ..errors import IntegrityError
from .packs import Location, Place, Slot

INDEX_MAGIC = b"CAIX\x01\x00\x00\x00"
INDEX_MAGIC_V2 = b"CAIX\x02\x00\x00\x00"
_IDX2_HEAD = struct.Struct(">8sQII")  # magic, pack size, records, count
_REC2 = struct.Struct(">QI")  # a record's payload offset and size
_ROW2 = struct.Struct(">32sIII")  # raw id, record number, start and length in its content
_IDX_HEAD = struct.Struct(">8sQI")  # magic, pack size, count
_ROW = struct.Struct(">32sQI")  # raw id, frame offset, frame size


def encode_index(pack_size: int, where: Mapping[str, Place]) -> bytes:
    """The index of a sealed pack of ``pack_size`` bytes holding the objects ``where``:
    version 1 for frames (:class:`Location`), version 2 for a version-2 pack (:class:`Slot`)."""
    if any(isinstance(loc, Slot) for loc in where.values()):
        return _encode_index_v2(pack_size, where)
    rows = [_ROW.pack(bytes.fromhex(oid), loc.offset, loc.size) for oid, loc in sorted(where.items())]
    body = _IDX_HEAD.pack(INDEX_MAGIC, pack_size, len(rows)) + b"".join(rows)
    return body + o.checksum(body)


def _encode_index_v2(pack_size: int, where: Mapping[str, Place]) -> bytes:
    recs = sorted({(s.offset, s.size) for s in where.values()})
    number = {r: i for i, r in enumerate(recs)}
    rows = []
    row = _ROW2.pack
    for oid in sorted(where):  # (the ids alone: sorting the items compares tuples, 1.5x the time)
        s = where[oid]
        if type(s) is not Slot and not isinstance(s, Slot):
            raise IntegrityError("pack index", "a version-2 pack holds no version-1 frames")
        rows.append(row(bytes.fromhex(oid), number[(s.offset, s.size)], s.start, s.length))
    body = (_IDX2_HEAD.pack(INDEX_MAGIC_V2, pack_size, len(recs), len(rows))
            + b"".join(_REC2.pack(*r) for r in recs) + b"".join(rows))
    return body + o.checksum(body)


#: the first bytes of an index a ranged reader reads at once (its header and record table, or
#: all of a small index); the rest is read a window of rows at a time (IndexView)
INDEX_HEAD = 16 << 10
#: a ranged view reads its whole index once its windows have cost 1/INDEX_RANGE_SHARE of
#: reading the index whole (their bytes, and INDEX_READ_COST a read), or it made
#: INDEX_RANGE_READS reads: a reader of many objects pays one whole read, not thousands. At 1
#: (as a renter buys once the rent paid equals the price) a reader never pays much more than
#: twice what the better of the two ways would have; at 4, the 34 lookups of a fresh turn's
#: read at 10,000 entries read a 2.2 MB index whole at the 27th (a sixth of that read's CPU:
#: docs/benchmarks/BENCHMARKS-turn.md)
INDEX_RANGE_SHARE = 1
#: what one ranged read costs beside its bytes, in bytes of a whole read: its system calls
#: and their Python, ~5 us on local disk, the time a whole read takes for ~32 KiB (copied
#: from the page cache into memory first touched)
INDEX_READ_COST = 32 << 10
INDEX_RANGE_READS = 256


#: on object storage (a ranged GET costs a round trip, whatever its size up to a few hundred
#: KiB): the first bytes read, and the window reads made before the whole index is read
INDEX_HEAD_REMOTE = 256 << 10
INDEX_RANGE_READS_REMOTE = 2


#: a ranged view reads its whole index in reads of at most this many bytes
INDEX_CHUNK = 8 << 20


class IndexView:
    """An index (either version) searched in place: its rows are sorted by id, so a reader
    that needs a few objects of a pack binary-searches them (as git reads an ``.idx``)
    instead of decoding every row.

    ``data`` is the whole index, or, with ``read`` (``read(offset, size)``: bytes of the
    index file, fewer at its end), its first bytes (at least :data:`INDEX_HEAD` of them, or
    all there are): then only the windows of rows a lookup needs are read. Ids are blake3
    hashes, evenly spread, so a lookup reads one window of about 2 x sqrt(count) rows
    around the place its id's first bytes predict, and narrows by windows (an interpolated
    step, then a halving one) when the id is not in it: O(log n) reads at worst, and one
    ~16 KiB read for 30,000 rows. A view whose windows have cost what reading the index
    whole does (:data:`INDEX_RANGE_SHARE`, :data:`INDEX_READ_COST`), or that made
    ``max_reads`` reads (default :data:`INDEX_RANGE_READS`), reads it whole.

    With ``check=False`` the check over the whole index (a blake3 of every byte: O(n) for a
    reader of one object, and for a ranged view a read of the whole index) is left for
    :meth:`verify`; the layout is still checked as far as it has been read (a ranged view
    checks a record when a row names it, and the index's size when it reads it whole). A
    reader that does so must call :meth:`verify` before trusting a miss or a row whose
    object does not hash to its id (docs/FORMAT.md, 7); :meth:`rows` verifies first. A row
    that lies cannot pass off other bytes: the object found is hashed to its id.

    Raises:
        IntegrityError: not an index, truncated, or its check fails (from the constructor).
    """

    __slots__ = ("data", "pack_size", "count", "version", "checked", "size", "reads", "fetched",
                 "_rows_at", "_step", "_recs", "_nrec", "_read", "_half", "_max_reads")

    def __init__(self, data: bytes, check: bool = True, read: Callable[[int, int], bytes] | None = None,
                 max_reads: int | None = None) -> None:
        magic = data[:len(INDEX_MAGIC)]
        if len(data) < _IDX_HEAD.size + 16 or magic not in (INDEX_MAGIC, INDEX_MAGIC_V2):
            raise IntegrityError("pack index", "not a castore pack index")
        self.checked = False
        self.reads = 0  # ranged reads made after the first bytes
        self.fetched = 0  # bytes they returned
        self._recs: dict[int, tuple[int, int]] = {}  # records named by the rows read so far
        if magic == INDEX_MAGIC_V2:
            if len(data) < _IDX2_HEAD.size + 16:
                raise IntegrityError("pack index", "cut short")
            _, pack_size, nrec, count = _IDX2_HEAD.unpack_from(data, 0)
            rows_at = _IDX2_HEAD.size + nrec * _REC2.size
            self.version, self._step = 2, _ROW2.size
        else:
            _, pack_size, count = _IDX_HEAD.unpack_from(data, 0)
            nrec, rows_at = 0, _IDX_HEAD.size
            self.version, self._step = 1, _ROW.size
        self.pack_size: int = pack_size
        self.count: int = count
        self._nrec = nrec
        self._rows_at = rows_at
        #: the index's size as its header declares it
        self.size = rows_at + count * self._step + 16
        self._half = math.isqrt(count) + 16
        self._max_reads = INDEX_RANGE_READS if max_reads is None else max_reads
        self.data = data
        self._read = read if read is not None and len(data) < self.size else None
        if self._read is None:
            self._whole(data)
        if check:
            self.verify()

    def _whole(self, data: bytes) -> None:
        """Take ``data`` as the whole index: its size is checked (a record's entry is checked
        when a row names it, :meth:`_record`)."""
        held = len(data) - 16
        if held != self.size - 16:
            if self.version == 2:
                raise IntegrityError("pack index", f"declares {self._nrec} records and {self.count} rows but "
                                                   f"holds {held - _IDX2_HEAD.size} bytes")
            raise IntegrityError("pack index", f"declares {self.count} rows but holds {held - self._rows_at} bytes")
        self.data = data
        self._read = None

    @property
    def held(self) -> bool:
        """Whether the whole index is in memory (a lookup reads nothing)."""
        return self._read is None

    def _fetch_whole(self) -> None:
        """Read the whole index (a ranged view) and search it in memory from now on.

        Raises:
            IntegrityError: the index is not the size its header declares.
        """
        read = self._read
        if read is None:
            return
        # one byte more than declared (an index longer than that is damaged), in reads of at
        # most INDEX_CHUNK: a damaged header declaring terabytes allocates no more than the file
        parts: list[bytes] = []
        held = 0
        while held <= self.size:
            want = min(INDEX_CHUNK, self.size + 1 - held)
            got = read(held, want)
            parts.append(got)
            held += len(got)
            if len(got) < want:
                break
        self._whole(b"".join(parts))

    def _range(self, off: int, size: int) -> bytes:
        """``size`` bytes of the index from ``off``, from memory or by one ranged read.

        Raises:
            IntegrityError: the index ends before them (cut short).
        """
        if off + size <= len(self.data):
            return self.data[off:off + size]
        read = self._read
        assert read is not None
        got = read(off, size)
        self.reads += 1
        self.fetched += len(got)
        if len(got) != size:
            raise IntegrityError("pack index", "cut short")
        return got

    def verify(self) -> None:
        """Check the index's check (once); a ranged view reads its whole index first.

        Raises:
            IntegrityError: it does not match (damaged or cut short), or the index is not
                the size its header declares.
        """
        if not self.checked:
            self._fetch_whole()
            if o.checksum(memoryview(self.data)[:-16]) != self.data[-16:]:
                raise IntegrityError("pack index", "its check does not match (damaged or cut short)")
            self.checked = True

    def _record(self, rec: int) -> tuple[int, int]:
        """Record ``rec``'s payload (offset, size) in the pack, read and checked when first named
        (a reader of a few objects does not unpack a log's table of thousands of records)."""
        if rec >= self._nrec:
            raise IntegrityError("pack index", f"a row names record {rec} of {self._nrec}")
        recs = self._recs
        got = recs.get(rec)
        if got is None:
            off, size = _REC2.unpack(self._range(_IDX2_HEAD.size + rec * _REC2.size, _REC2.size))
            if off + size > self.pack_size:
                raise IntegrityError("pack index",
                                     f"a record points past the pack's end ({off}+{size} > {self.pack_size})")
            got = recs[rec] = (off, size)
        return got

    def _place(self, row: bytes | memoryview, at: int = 0) -> tuple[bytes, Place]:
        if self.version == 2:
            raw, rec, start, length = _ROW2.unpack_from(row, at)
            off, size = self._record(rec)
            return raw, Slot(off, size, start, length)
        raw, off, size = _ROW.unpack_from(row, at)
        if off + size > self.pack_size:
            raise IntegrityError("pack index", f"a row points past the pack's end ({off}+{size} > {self.pack_size})")
        return raw, Location(off, size)

    def find(self, raw: bytes) -> Place | None:
        """Where the object with raw id ``raw`` is, or None when the pack lacks it.

        Raises:
            IntegrityError: its row points past the end of the pack or names no record, or
                the index is cut short.
        """
        if self._read is not None:
            if self.reads >= self._max_reads or \
                    (self.fetched + self.reads * INDEX_READ_COST) * INDEX_RANGE_SHARE >= self.size:
                self._fetch_whole()
            else:
                return self._find_ranged(raw)
        data, base, step = self.data, self._rows_at, self._step
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
        found, place = self._place(data, base + lo * step)
        return place if found == raw else None

    def _find_ranged(self, raw: bytes) -> Place | None:
        """:meth:`find` reading windows of rows: the first row whose id is not below ``raw``
        is in [lo, hi]; ``lo_key``/``hi_key`` bound the ids there (their first 8 bytes)."""
        base, step, count, half = self._rows_at, self._step, self.count, self._half
        key = int.from_bytes(raw[:8], "big")
        lo, hi, lo_key, hi_key = 0, count, 0, 1 << 64
        interpolate = True
        while True:
            if hi - lo <= 2 * half:
                a, b = lo, hi
            else:
                if interpolate:
                    guess = lo + (key - lo_key) * (hi - lo) // max(1, hi_key - lo_key)
                else:
                    guess = (lo + hi) // 2
                interpolate = not interpolate
                a = min(max(lo, guess - half), hi - 2 * half)
                b = a + 2 * half
            window = self._range(base + a * step, (b - a) * step)
            i, j = 0, b - a  # bisect the window: the first row whose id is not below raw
            while i < j:
                m = (i + j) // 2
                if window[m * step:m * step + 32] < raw:
                    i = m + 1
                else:
                    j = m
            if i == 0 and a > lo:
                hi, hi_key = a, int.from_bytes(window[:8], "big")
            elif i == b - a and b < hi:
                lo, lo_key = b, int.from_bytes(window[(i - 1) * step:(i - 1) * step + 8], "big")
            else:
                at = a + i
                if at == count:
                    return None
                row = window if i < b - a else self._range(base + at * step, step)
                found, place = self._place(row, (i if i < b - a else 0) * step)
                return place if found == raw else None

    def rows(self) -> dict[str, Place]:
        """Every object the index lists, by hex id.

        Raises:
            IntegrityError: the index's check fails, or a row points past the end of the
                pack or names no record.
        """
        self.verify()
        data, base, step = self.data, self._rows_at, self._step
        out: dict[str, Place] = {}
        for i in range(self.count):
            raw, place = self._place(data, base + i * step)
            out[raw.hex()] = place
        return out


def decode_index(data: bytes) -> tuple[int, dict[str, Place]]:
    """Parse an index (either version); return the size of the pack it covers and its objects.

    Raises:
        IntegrityError: not an index, truncated, its check fails, or a row points past the
            pack's end.
    """
    view = IndexView(data)
    return view.pack_size, view.rows()


__all__ = ["INDEX_CHUNK", "INDEX_HEAD", "INDEX_HEAD_REMOTE", "INDEX_MAGIC", "INDEX_MAGIC_V2", "INDEX_RANGE_READS",
           "INDEX_RANGE_READS_REMOTE", "INDEX_RANGE_SHARE", "INDEX_READ_COST", "IndexView", "decode_index",
           "encode_index"]
