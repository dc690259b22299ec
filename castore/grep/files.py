"""The files of the search index (:mod:`castore.grep.index` describes the index and the format
of each file): a segment's parts as loaded or built, the commit numbering of an update, and
the writing and checking of each file.

A file is written once (a new file renamed into place) and its ``[size, crc, mtime_ns, inode]``
recorded; :func:`open_file` maps it read-only and checks it against that record: the size
always, the CRC-32 only when the modification time or inode are not the ones recorded.
"""

from __future__ import annotations

import array
import bisect
import itertools
import mmap
import os
import sys
import zlib
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

#: what follows each block's text in ``P.txt`` and ``P.low`` (replaced by a space inside a text)
SEP = "\x1e"
#: the kinds of block, by their number in ``P.rec``
KINDS = ("text", "thinking", "tool_call", "tool_result")
#: the parts of the index and the kinds each holds
PARTS = {"main": ("text", "thinking", "tool_call"), "res": ("tool_result",)}
_COLS = 9  # int32 columns of P.rec
_ASCII = 1  # the flag of a block whose text is ASCII
#: the two characters a case-insensitive ASCII pattern matches whose lower case is not that
#: ASCII letter (Python's re: ſ is s, dotless ı is i): P.low holds the letter instead
_FOLD = {0x17F: "s", 0x131: "i"}


class Part:
    """One part of one segment of an index (see :mod:`castore.grep.index`), as loaded or as being
    built: the bytes of ``P.txt`` and ``P.low``, decoded only when a search needs the whole text
    (a plain string is searched in the bytes, and only the blocks found are decoded)."""

    def __init__(self, name: str = "main") -> None:
        self.name = name  # main or res
        self.raw: Any = b""  # P.txt
        self.lowraw: Any = b""  # P.low
        self._text: str | None = None
        self._low: str | None = None
        self.starts: Any = array.array("q", [0])  # characters, in P.txt
        self.lstarts: Any = array.array("q", [0])  # characters, in P.low
        self.bstarts: Any = array.array("q", [0])  # bytes, in P.txt
        self.lbstarts: Any = array.array("q", [0])  # bytes, in P.low
        self.cols: list[Any] = [array.array("i") for _ in range(_COLS)]
        self.time: Any = array.array("d")

    @property
    def n(self) -> int:
        return len(self.time)

    @property
    def text(self) -> str:
        """``P.txt`` decoded (on first use).

        Raises:
            ValueError: the bytes are not UTF-8 (a damaged file).
        """
        if self._text is None:
            self._text = str(self.raw, "utf-8")
        return self._text

    @property
    def low(self) -> str:
        """``P.low`` decoded (on first use).

        Raises:
            ValueError: the bytes are not UTF-8 (a damaged file).
        """
        if self._low is None:
            self._low = str(self.lowraw, "utf-8")
        return self._low

    def block(self, i: int) -> str:
        """Block ``i``'s text (its bytes decoded alone)."""
        return self.raw[self.bstarts[i]:self.bstarts[i + 1] - 1].decode("utf-8")

    def fields(self, idx: list[int], cols: Iterable[int]) -> list[tuple[int, ...]]:
        """Columns ``cols`` of the blocks ``idx``: a tuple of values per column (one C-level pass each)."""
        if len(idx) == 1:
            return [(self.cols[c][idx[0]],) for c in cols]
        get = itemgetter(*idx)
        return [get(self.cols[c]) for c in cols]

    # -- building -------------------------------------------------------------------------
    def add(self, values: tuple[int, ...], when: float, text: str) -> None:
        """Append one block (``values``: its record's columns but the flags)."""
        low = text.lower()
        if not low.isascii():
            low = low.translate(_FOLD)
        btext, blow = (text + SEP).encode("utf-8"), (low + SEP).encode("utf-8")
        self._texts.append(btext)
        self._lows.append(blow)
        for col, v in zip(self.cols, values, strict=False):
            col.append(v)
        self.cols[8].append(_ASCII if len(btext) == len(text) + 1 else 0)
        self.time.append(when)
        self.starts.append(self.starts[-1] + len(text) + 1)
        self.lstarts.append(self.lstarts[-1] + len(low) + 1)
        self.bstarts.append(self.bstarts[-1] + len(btext))
        self.lbstarts.append(self.lbstarts[-1] + len(blow))

    def copy(self, q: Part, a: int, b: int) -> None:
        """Append blocks ``a`` to ``b`` of part ``q`` as they are (whole ranges, no per-block decoding)."""
        if a == b:
            return
        self._texts.append(q.raw[q.bstarts[a]:q.bstarts[b]])
        self._lows.append(q.lowraw[q.lbstarts[a]:q.lbstarts[b]])
        for mine, theirs in ((self.starts, q.starts), (self.lstarts, q.lstarts), (self.bstarts, q.bstarts),
                             (self.lbstarts, q.lbstarts)):
            base = mine[-1] - theirs[a]
            mine.extend([v + base for v in theirs[a + 1:b + 1]])
        for mine, theirs in zip(self.cols, q.cols, strict=True):
            mine.frombytes(_bytes_of(theirs[a:b]))
        self.time.frombytes(_bytes_of(q.time[a:b]))

    def begin(self) -> Part:
        """Make this (empty) part one being built."""
        self._texts: list[bytes] = []
        self._lows: list[bytes] = []
        return self

    def files(self) -> dict[str, bytes]:
        """The part's files as built (names without the segment), little-endian."""
        self.raw, self.lowraw = b"".join(self._texts), b"".join(self._lows)
        offs = array.array("q", self.starts)
        for more in (self.lstarts, self.bstarts, self.lbstarts):
            offs.extend(more)
        recs = array.array("i")
        for col in self.cols:
            recs.extend(col)
        times = array.array("d", self.time)
        if sys.byteorder != "little":
            offs.byteswap()
            recs.byteswap()
            times.byteswap()
        p = self.name
        return {f"{p}.txt": self.raw, f"{p}.low": self.lowraw, f"{p}.off": offs.tobytes(),
                f"{p}.rec": recs.tobytes(), f"{p}.time": times.tobytes()}


def _bytes_of(v: Any) -> Any:
    """The bytes of an array or a typed memoryview (for ``array.frombytes``)."""
    return v.cast("B") if isinstance(v, memoryview) else v.tobytes()


class Segment:
    """One segment as loaded: its parts and its commits (see :mod:`castore.grep.index`)."""

    def __init__(self, name: str, base: int) -> None:
        self.name = name
        self.base = base  # the number of its first commit
        self.commits: Any = b""
        self.parts: dict[str, Part] = {}


class Numbers:
    """Commit ids to commit numbers: those of an index (its segments' tables of ids, in order) and
    the ones given out since. An id is looked up among the numbers hinted (a re-extracted
    session's own), then found in the tables (``mmap.find``, at memchr speed: an append brings a
    few new commits), and past a few such finds in a dict of every id's first 8 bytes (made in C
    from the tables)."""

    _FINDS = 32

    def __init__(self, tables: list[Any]) -> None:
        self._tables = tables
        self._bases = list(itertools.accumulate((len(t) // 32 for t in tables), initial=0))
        self._n = self._bases[-1]
        self._known: dict[bytes, int] = {}
        self._by_head: dict[int, int] | None = None
        self._exact: dict[bytes, int] | None = None
        self._finds = 0
        self._new: dict[bytes, int] = {}

    def _id(self, c: int) -> bytes:
        k = bisect.bisect_right(self._bases, c) - 1
        at = 32 * (c - self._bases[k])
        return bytes(self._tables[k][at:at + 32])

    def hint(self, numbers: Iterable[int]) -> None:
        """Commit numbers the next lookups are likely to ask for."""
        self._known.update((self._id(c), c) for c in set(numbers))

    def _lookup(self, cid: bytes) -> int | None:
        got = self._known.get(cid)
        if got is not None or not self._n:
            return got
        if self._finds < self._FINDS:
            self._finds += 1
            for base, t in zip(self._bases, self._tables, strict=False):
                at = t.find(cid)
                while at >= 0 and at % 32:
                    at = t.find(cid, at + 1)
                if at >= 0:
                    return base + at // 32
            return None
        if self._by_head is None and self._exact is None:
            heads = [h for t in self._tables if len(t) for h in memoryview(t).cast("Q")[::4].tolist()]
            self._by_head = dict(zip(heads, range(self._n), strict=True))
            if len(self._by_head) != self._n:  # two ids with the same first 8 bytes: by the whole id
                self._exact = {self._id(c): c for c in range(self._n)}
        if self._exact is not None:
            return self._exact.get(cid)
        assert self._by_head is not None
        got = self._by_head.get(int.from_bytes(cid[:8], sys.byteorder))
        return got if got is not None and self._id(got) == cid else None

    def number(self, cid: bytes) -> int:
        """The number of commit ``cid`` (32 bytes): its own, or the next one free."""
        got = self._new.get(cid)
        if got is None:
            got = self._lookup(cid)
        if got is None:
            got = self._new[cid] = self._n + len(self._new)
        return got

    def table(self, start: int) -> bytes:
        """The ids of the tables from number ``start`` (where one begins) on, then the new ones."""
        k = self._bases.index(start)
        return b"".join([*(bytes(t) for t in self._tables[k:]), *self._new])


def stat_of(path: str) -> tuple[int, int, int] | None:
    """``(inode, mtime_ns, size)`` of a file, or None when it is not there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def write_file(folder: str, name: str, data: bytes) -> list[int]:
    """Write file ``name`` of the index (a new file renamed into place); its ``[size, crc,
    mtime_ns, inode]`` as :func:`open_file` checks them."""
    tmp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            st = os.fstat(f.fileno())
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return [len(data), zlib.crc32(data), st.st_mtime_ns, st.st_ino]


def open_file(folder: str, name: str, want: list[int]) -> Any:
    """File ``name`` of the index in ``folder``, mapped (a read-only :class:`mmap.mmap`, sliced and searched as bytes
    are; the bytes themselves where it is empty or cannot be mapped), checked against its
    recorded ``[size, crc, mtime_ns, inode]``: the size always, the CRC when the file's
    modification time or inode are not the ones recorded.

    Raises:
        ValueError: the file does not match.
        OSError: it cannot be read (FileNotFoundError: an update removed it meanwhile).
    """
    with open(os.path.join(folder, name), "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_size != want[0]:
            raise ValueError(f"{name} does not match its check")
        try:
            data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if want[0] else b""
        except (OSError, ValueError):
            data = f.read()
    if (st.st_mtime_ns, st.st_ino) != (want[2], want[3]) and (len(data) != want[0] or zlib.crc32(data) != want[1]):
        raise ValueError(f"{name} does not match its check")
    return data

def _view(folder: str, name: str, want: list[int], code: str) -> Any:
    """A file of numbers (``code``: an :mod:`array` type code), checked as :func:`open_file` does:
    a view of the mapping where the machine is little-endian, else a byte-swapped copy."""
    data = open_file(folder, name, want)
    size = array.array(code).itemsize
    if len(data) % size:
        raise ValueError(f"{name}: a size that is not a whole number of values")
    if sys.byteorder == "little":
        return memoryview(data).cast(code)  # type: ignore[call-overload]
    arr = array.array(code)
    arr.frombytes(data)
    arr.byteswap()
    return arr


def load_segment(folder: str, g: dict[str, Any], base: int) -> Segment:
    """Segment ``g`` (as ``state.json`` lists it; ``base``: the number of its first commit) of
    the index in ``folder``, every file opened and checked (see :func:`open_file`).

    Raises:
        ValueError: a file does not match its check, or the sizes do not agree.
        KeyError, TypeError: ``g`` does not name every file.
        OSError: a file cannot be read (FileNotFoundError: an update removed it meanwhile).
    """
    seg = Segment(g["name"], base)
    files = g["files"]
    seg.commits = open_file(folder, f"{g['name']}.commits", files["commits"])
    if len(seg.commits) != 32 * g["commits"]:
        raise ValueError("commits do not agree")
    for pname in PARTS:
        p = Part(pname)
        pre = f"{g['name']}.{pname}"
        p.raw = open_file(folder, f"{pre}.txt", files[f"{pname}.txt"])
        p.lowraw = open_file(folder, f"{pre}.low", files[f"{pname}.low"])
        offs = _view(folder, f"{pre}.off", files[f"{pname}.off"], "q")
        rec = _view(folder, f"{pre}.rec", files[f"{pname}.rec"], "i")
        p.time = _view(folder, f"{pre}.time", files[f"{pname}.time"], "d")
        n = g["n"][pname]
        if len(p.time) != n or len(offs) != 4 * (n + 1) or len(rec) != _COLS * n \
                or offs[3 * (n + 1) - 1] != len(p.raw) or offs[-1] != len(p.lowraw):
            raise ValueError(f"index part {pre}: sizes do not agree")
        m = n + 1
        p.starts, p.lstarts, p.bstarts, p.lbstarts = offs[:m], offs[m:2 * m], offs[2 * m:3 * m], offs[3 * m:]
        p.cols = [rec[c * n:(c + 1) * n] for c in range(_COLS)]
        seg.parts[pname] = p
    return seg


__all__ = ["KINDS", "PARTS", "SEP", "Numbers", "Part", "Segment", "load_segment", "open_file", "stat_of",
           "write_file"]
