"""The files of the search index (:mod:`castore.grep.index` describes the index and the format
of each file): a segment's parts as loaded or built (their chunks decompressed on first use,
their trigram filters, the search of a part for a plain string or a regex), the commit
numbering of an update, and the writing and checking of each file.

A file is written once (a new file renamed into place) and its ``[size, crc, mtime_ns, inode]``
recorded; :func:`open_file` maps it read-only and checks it against that record: the size
always, the CRC-32 only when the modification time or inode are not the ones recorded.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import functools
import itertools
import mmap
import operator
import os
import re
import sys
import threading
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any

#: what follows each block's text in a chunk (replaced by a space inside a text)
SEP = "\x1e"
_SEPB = SEP.encode()
_SEP_BYTE = ord(SEP)
#: the kinds of block, by their number in ``P.rec``
KINDS = ("text", "thinking", "tool_call", "tool_result")
#: the parts of the index and the kinds each holds
PARTS = {"main": ("text", "thinking", "tool_call"), "res": ("tool_result",)}
_COLS = 10  # int32 columns of P.rec
_AT = 9  # the column of a block's byte offset in its chunk
#: the column number :meth:`Part.fields` reads a block's time by
TIME = _COLS
_ASCII = 1  # the flag of a block whose text is ASCII
#: a chunk is closed once its text reaches this many bytes (a block is never split)
CHUNK = 1 << 15
#: the bits of a chunk's trigram filter (a power of two), and its bytes
FILTER_BITS = 1 << 14
_FILTER_BYTES = FILTER_BITS // 8
#: a chunk's filters in P.flt: its words' (lowered) and its cased words'
_FILTERS_BYTES = 2 * _FILTER_BYTES
#: the chunk flag: a block holds a character that a case-insensitive ASCII pattern may match,
#: or whose case folds to ASCII letters, though bytes.lower() leaves it as it is (K, ſ, ı, İ,
#: ß, ligatures...): such a chunk is searched whatever its filter says
_SPECIAL = 1
#: the chunk flag: every block of the chunk is ASCII with no control character but line break and
#: tab, printable as it is (:meth:`Part.printable`; an index written before it flags no chunk so)
_PRINTABLE = 2
#: the bytes a chunk flagged :data:`_PRINTABLE` holds none of (the separator of its blocks aside)
_CONTROLS = bytes([*range(0x09), *range(0x0B, 0x1E), 0x1F, 0x7F])
_SPECIAL_CHARS = "[\u00df\u0130\u0131\u0149\u017f\u01f0\u1e96-\u1e9a\u212a\ufb00-\ufb06]"


@functools.cache
def _special_rx() -> re.Pattern[str]:
    """The search for :data:`_SPECIAL`'s characters, compiled on first use (a class of characters
    beyond Latin-1 takes re half a millisecond: a search of ASCII text never needs it)."""
    return re.compile(_SPECIAL_CHARS)
#: the two characters a case-insensitive ASCII pattern matches whose lower case is not that
#: ASCII letter (Python's re: ſ is s, dotless ı is i): a lowered regex search sees the letter
_FOLD = {0x17F: "s", 0x131: "i"}
#: the decompressed chunks (as written and lowered) the process keeps, across searches, by the
#: file they come from (its name, size, CRC, time and inode: a file is never rewritten in place):
#: a library user's repeated searches decompress nothing; beyond this many bytes the chunks
#: read first are let go (a search of a large archive holds no more of its text)
CACHE_BYTES = 128 << 20
_cache: dict[tuple[Any, ...], bytes] = {}
_cache_lock = threading.Lock()
_cache_size = [0]
#: whether a search keeps every chunk it reads (see :func:`keep_chunks`)
_keep_all = [True]


@contextlib.contextmanager
def keep_chunks(keep: bool) -> Iterator[None]:
    """Within the block (process-wide): whether a search keeps every chunk it decompresses for the
    searches after it (True, the default: a library user's next search decompresses nothing), or,
    for a process that searches once (``castore grep``), only what it reads again to check or print
    its matches: the blocks found (their own text, in the part, where they are fewer than an eighth
    of their chunk's blocks) or the chunk they are in, and no lower-cased copy at all; a count
    (:meth:`Part.find_plain` ``counting``) only the blocks it cannot count without reading them. The memory
    of one chunk is then used again for the next, where keeping them all would touch a new page of
    memory for every 4 KiB read (a page fault each: a tenth of a common word's search).
    Raises nothing of its own.
    """
    was = _keep_all[0]
    _keep_all[0] = keep
    try:
        yield
    finally:
        _keep_all[0] = was


def _cache_get(key: tuple[Any, ...]) -> bytes | None:
    return _cache.get(key)


def _cache_put(key: tuple[Any, ...], data: bytes) -> None:
    with _cache_lock:
        if key in _cache:
            return
        _cache[key] = data
        _cache_size[0] += len(data)
        while _cache_size[0] > CACHE_BYTES and _cache:
            _cache_size[0] -= len(_cache.pop(next(iter(_cache))))
#: the zstd level of a chunk: 9, as a repacked pack record's (docs/FORMAT.md 10), decodes with
#: about 8% fewer instructions than 3 in a common word's search (and is 4% smaller); it costs an
#: index build about 0.7 s more per 20 MB of text. A reader reads any level.
_LEVEL = 9
#: zstd's shortest match in a chunk: 6 rather than the 4 of level 9 for 32 KiB, fewer and longer
#: sequences: a common word's chunks decode with 6% fewer instructions (and are 1% smaller, and
#: compress faster)
_MIN_MATCH = 6
#: trigram hashes of the words seen while building, by word (bounded: cleared when full)
_GRAMS: dict[bytes, tuple[int, ...]] = {}
_GRAMS_MAX = 1 << 18


def _grams(word: bytes) -> tuple[int, ...]:
    """The filter bits of ``word``'s trigrams (a bytes word, as lowered by bytes.lower())."""
    mask = FILTER_BITS - 1
    return tuple(((int.from_bytes(word[i:i + 3], "little") * 2654435761) >> 13) & mask
                 for i in range(len(word) - 2))


def filter_bits(needle: bytes) -> set[int]:
    """The filter bits a chunk must have to hold ``needle`` (lowered here; no bits when it has
    no run of three characters that are not blanks). Every run of non-blanks of the needle lies
    within one word of the text (a run of non-blanks, split as bytes.split() does), whose
    trigrams the chunk's filter holds."""
    out: set[int] = set()
    for word in needle.lower().split():
        out.update(_grams(word))
    return out


def _filter(data: bytes) -> bytes:
    """The two trigram filters of a chunk's text ``data``: one bit per trigram of each of its
    words lower-cased by bytes.lower(), then the bits of its *cased* words alone (those
    bytes.lower() changes): where none of a lower-case needle's bits is among them, no word of
    the chunk holds the needle in another case, and the needle is sought in the text as it is."""
    bits: set[int] = set()
    cased: set[int] = set()
    grams = _GRAMS
    # the words of the blocks (the separator cuts them too); bytes.lower() changes no blank: the
    # same words, lowered
    for word in set(data.replace(_SEPB, b" ").split()):
        low = word.lower()
        got = grams.get(low)
        if got is None:
            if len(grams) >= _GRAMS_MAX:
                grams.clear()
            got = grams[low] = _grams(low)
        bits.update(got)
        if low != word:
            cased.update(got)
    out = bytearray(_FILTERS_BYTES)
    for b in bits:
        out[b >> 3] |= 1 << (b & 7)
    for b in cased:
        out[_FILTER_BYTES + (b >> 3)] |= 1 << (b & 7)
    return bytes(out)


class Part:
    """One part of one segment of an index (see :mod:`castore.grep.index`), as loaded or as being
    built: its blocks' text in zstd chunks, each with a trigram filter; a chunk is decompressed
    (once, then kept) only when a search needs its text."""

    def __init__(self, name: str = "main") -> None:
        self.name = name  # main or res
        self.z: Any = b""  # P.z: the chunks
        self.cstarts: Any = array.array("q", [0])  # per chunk: its offset in P.z (and the end)
        self.cfirst: Any = array.array("q", [0])  # per chunk: its first block (and the block count)
        self.cflags: Any = array.array("q")  # per chunk: _SPECIAL, _PRINTABLE
        self.filters: Any = b""  # P.flt: _FILTERS_BYTES per chunk
        self.cols: list[Any] = [array.array("i") for _ in range(_COLS)]
        self.time: Any = array.array("d")
        #: what the chunks are known by in the process's cache (load_segment: the file's name and
        #: record; else this part alone)
        self.ident: Any = object()
        self._cfirst: list[int] | None = None  # cfirst as a list, once a block is read
        #: the text of a block found, kept alone by a search that runs once (see :meth:`_found_in`)
        self._found: dict[int, bytes] = {}
        #: the chunk :meth:`texts` read last (the next session's first blocks are most often in it):
        #: ``(chunk, its text: decoded when ASCII, else its bytes, its blocks' offsets and its end)``
        self._last: tuple[int, str | bytes, list[int]] | None = None

    @property
    def n(self) -> int:
        """How many commits the part holds."""
        return len(self.time)

    @property
    def chunks(self) -> int:
        """How many chunks the part has."""
        return len(self.cflags)

    def chunk(self, c: int) -> bytes:
        """Chunk ``c``'s text: its blocks' UTF-8, each followed by :data:`SEP` (decompressed on
        first use, then kept in the process's cache, :data:`CACHE_BYTES` in all).

        Raises:
            ValueError: the chunk does not decompress, or does not end where its last block does.
        """
        got = _cache_get((self.ident, c))
        if got is None:
            got = self._decompress(c)
            _cache_put((self.ident, c), got)
        return got

    def _decompress(self, c: int) -> bytes:
        """Chunk ``c``'s text, decompressed and checked (not kept); ValueError as :meth:`chunk`."""
        from ..errors import IntegrityError
        from ..frames import unframe

        try:
            got = unframe(self.z[self.cstarts[c]:self.cstarts[c + 1]], "search index chunk", 1 << 31)
        except IntegrityError as e:
            raise ValueError(f"index part {self.name}: {e}") from e
        if got[-1:] != _SEPB or self.cols[_AT][self.cfirst[c + 1] - 1] >= len(got):
            raise ValueError(f"index part {self.name}: chunk {c} does not hold its blocks")
        return got

    def lowered(self, c: int) -> bytes:
        """Chunk ``c``'s text lower-cased by ``bytes.lower()`` (kept as :meth:`chunk` keeps it).

        Raises:
            ValueError: the chunk is damaged.
        """
        got = _cache_get((self.ident, c, 0))
        if got is None:
            got = self.chunk(c).lower()
            _cache_put((self.ident, c, 0), got)
        return got

    def _searched(self, c: int, lowered: bool, text: bytes) -> tuple[bytes, bytes | None]:
        """Chunk ``c``'s text to search (``lowered``: lower-cased), given its text ``text`` (as
        :meth:`_text` gives it), and its text as written when the search is to keep it only if it
        holds a hit (:func:`keep_chunks`; else None: kept already); ValueError as :meth:`chunk`."""
        if _keep_all[0]:
            return (self.lowered(c) if lowered else text), None
        return (text.lower() if lowered else text), text

    def _text(self, c: int) -> bytes:
        """Chunk ``c``'s text as :meth:`chunk` gives it, kept as it keeps it when the search keeps
        every chunk (:func:`keep_chunks`), else from the process's cache or decompressed, not kept
        here; ValueError as :meth:`chunk`."""
        if _keep_all[0]:
            return self.chunk(c)
        return _cache_get((self.ident, c)) or self._decompress(c)

    def _found_in(self, c: int, text: bytes | None, found: list[int]) -> None:
        """Blocks ``found`` of chunk ``c`` hold a hit: keep what is read of them again, when the
        search is to keep only that (:meth:`_searched`'s second value ``text``; None: the chunk is
        kept already): the chunk, or the blocks' own text when they are a few of its blocks (a
        rare word: a few hundred bytes kept of each 32 KiB chunk)."""
        if text is None or not found:
            return
        first, end = self.cfirst[c], self.cfirst[c + 1]
        if 8 * len(found) > end - first:
            _cache_put((self.ident, c), text)
            return
        at = self.cols[_AT]
        for i in found:
            self._found[i] = text[at[i]:(at[i + 1] if i + 1 < end else len(text)) - 1]

    def blocks_of(self, c: int, text: bytes | None = None) -> list[bytes]:
        """The blocks of chunk ``c`` (whose text is ``text`` when given), UTF-8 each.

        Raises:
            ValueError: the chunk is damaged.
        """
        data = self.chunk(c) if text is None else text
        first, end = self.cfirst[c], self.cfirst[c + 1]
        offs = self.cols[_AT][first:end].tolist()  # each block's start: a text may hold SEP itself
        offs.append(len(data))
        if offs[0] != 0 or any(data[o - 1] != _SEP_BYTE for o in offs[1:]):
            raise ValueError(f"index part {self.name}: chunk {c} does not hold its blocks")
        return [data[offs[k]:offs[k + 1] - 1] for k in range(end - first)]

    def block_bytes(self, i: int) -> bytes:
        """Block ``i``'s text as UTF-8.

        Raises:
            ValueError: its chunk is damaged.
        """
        if self._found:
            got = self._found.get(i)
            if got is not None:
                return got
        cf = self._cfirst
        if cf is None:
            cf = self._cfirst = self.cfirst.tolist()  # a list bisects without making ints
        c = bisect.bisect_right(cf, i) - 1
        data = _cache_get((self.ident, c)) or self.chunk(c)
        at = self.cols[_AT]
        return data[at[i]:(at[i + 1] if i + 1 < cf[c + 1] else len(data)) - 1]

    def block(self, i: int) -> str:
        """Block ``i``'s text.

        Raises:
            ValueError: its chunk is damaged.
        """
        return self.block_bytes(i).decode("utf-8")

    def texts(self, idx: list[int]) -> list[str]:
        """The texts of blocks ``idx`` (in increasing order), as :meth:`block` gives each, read a
        chunk at a time: the chunk found once (not bisected per block), and an ASCII chunk decoded
        once and sliced, kept for the next call (a common word prints tens of thousands of blocks,
        and the sessions after each other share chunks).

        Raises:
            ValueError: a chunk is damaged.
        """
        if len(idx) < 4:
            return [self.block(i) for i in idx]
        cf = self._cfirst
        if cf is None:
            cf = self._cfirst = self.cfirst.tolist()
        at = self.cols[_AT]
        out: list[str] = []
        alone = self._found
        i, n = 0, len(idx)
        while i < n:
            if alone and idx[i] in alone:  # kept alone (a chunk with few blocks found)
                out.append(alone[idx[i]].decode("utf-8"))
                i += 1
                continue
            c = bisect.bisect_right(cf, idx[i]) - 1
            first, end = cf[c], cf[c + 1]
            j = bisect.bisect_left(idx, end, i)
            last = self._last
            if last is None or last[0] != c:
                data = _cache_get((self.ident, c)) or self.chunk(c)
                # each block's start, then the chunk's end (each block is followed by SEP); an
                # ASCII chunk decoded once and sliced as text (a character is a byte)
                offs = at[first:end].tolist()
                offs.append(len(data))
                try:  # an ASCII chunk (most): decoded at once, with no test of it first
                    got: str | bytes = data.decode("ascii")
                except UnicodeDecodeError:
                    got = data
                last = self._last = (c, got, offs)
            _, got, offs = last
            rel = [b - first for b in idx[i:j]]
            if isinstance(got, str):
                out.extend([got[offs[r]:offs[r + 1] - 1] for r in rel])
            else:
                out.extend([got[offs[r]:offs[r + 1] - 1].decode("utf-8") for r in rel])
            i = j
        return out

    def candidates(self, bits: set[int], lowered: bool) -> list[int]:
        """The chunks whose filter has every one of ``bits`` (:func:`filter_bits`), and with
        ``lowered`` (a case-insensitive search) those flagged :data:`_SPECIAL` too."""
        n = self.chunks
        if not bits:
            return list(range(n))
        keep = (1 << (8 * n)) - 1  # one byte per chunk: 1 while it may hold the needle
        for b in bits:
            col = self.filters[b >> 3::_FILTERS_BYTES]
            keep &= int.from_bytes(bytes(col).translate(_bit(b & 7)), "big")
        got = keep.to_bytes(n, "big")
        out = [c for c in range(n) if got[c]] if keep else []
        if lowered:
            special = [c for c in range(n) if self.cflags[c] & _SPECIAL]
            if special:
                out = sorted(set(out) | set(special))
        return out

    def cased(self, bits: set[int]) -> bytes:
        """Per chunk a byte, not 0 when its cased words' filter has one of ``bits``
        (:func:`filter_bits` of a needle): the chunk may hold the needle in another case."""
        n = self.chunks
        anyone = 0
        for b in bits:
            col = self.filters[_FILTER_BYTES + (b >> 3)::_FILTERS_BYTES]
            anyone |= int.from_bytes(bytes(col).translate(_bit(b & 7)), "big")
        return anyone.to_bytes(n, "big")

    def find_plain(self, needle: bytes, lowered: bool, counting: bool = False) -> list[int]:
        """The blocks holding ``needle`` (UTF-8), in order; ``lowered``: ``needle`` is lower-case
        ASCII sought in any case, and the blocks found are a superset (a block with a character
        that folds otherwise is taken; the caller matches each found block again, or with
        ``counting`` only those it cannot count unread: a search that keeps only what it reads
        again, :func:`keep_chunks`, keeps only their text).

        Only the chunks whose filter may hold the needle are read. A plain string never spans
        two blocks, and its UTF-8 bytes are found exactly where it is (UTF-8 synchronises). A
        chunk is lowered only when its cased words' filter says it may hold the needle in another
        case (or the needle has a run of non-blanks too short for a trigram): else its text is
        searched as it is.

        Raises:
            ValueError: a chunk is damaged.
        """
        got: list[int] = []
        at, bisect_right = self.cols[_AT], bisect.bisect_right
        bits = filter_bits(needle)
        # a lower-case needle in another case is in a cased word of the chunk, and each of its
        # characters is in one of its trigrams when every run of non-blanks has three or more
        cased = self.cased(bits) if lowered and bits and all(len(w) >= 3 for w in needle.split()) else None
        # a count reads again only the blocks found it cannot count unread (castore.grep._count):
        # with a line break in the needle, every one (matched line by line); else, in a lowered
        # search, those that are not ASCII
        some = counting and b"\n" not in needle
        flags = self.cols[8]
        chunks = self.candidates(bits, lowered)
        for c in chunks:
            hay, text = self._searched(c, lowered and (cased is None or cased[c] != 0), self._text(c))
            first, end = self.cfirst[c], self.cfirst[c + 1]
            find = hay.find
            x = find(needle)
            found: list[int] = []
            if x >= 0:
                # offs: the start of each block but the first, then the chunk's end: the
                # bisection of a hit gives its block (from the chunk's first) and where the next
                # block starts, at once
                offs = at[first + 1:end].tolist()
                offs.append(len(hay))
                append = found.append
                while x >= 0:  # each block found once, skipped to its end
                    i = bisect_right(offs, x)
                    append(first + i)
                    x = find(needle, offs[i])
            if lowered and self.cflags[c] & _SPECIAL:
                found = sorted(set(found).union(
                    first + j for j, b in enumerate(self.blocks_of(c, text))
                    if not b.isascii() and _special_rx().search(b.decode("utf-8")) is not None))
            if found:
                if text is not None and some:
                    self._found_in(c, text, [i for i in found if not flags[i] & _ASCII]
                                   if lowered and not self.ascii_blocks(first, end) else [])
                else:
                    self._found_in(c, text, found)
                got.extend(found)
        return got

    def printable(self, first: int, end: int) -> bool:
        """Whether blocks ``first`` to ``end`` (``end`` excluded) are all ASCII text with no control
        character but line break and tab (what a terminal shows as it is): their chunks are all
        flagged :data:`_PRINTABLE`. Raises nothing."""
        cf = self._cfirst
        if cf is None:
            cf = self._cfirst = self.cfirst.tolist()
        flags = self.cflags[bisect.bisect_right(cf, first) - 1:bisect.bisect_right(cf, end - 1)]
        return all(f & _PRINTABLE for f in flags)

    def ascii_blocks(self, first: int, end: int) -> bool:
        """Whether blocks ``first`` to ``end`` (``end`` excluded) are all ASCII text: all have the
        flag :data:`_ASCII` (read in C: the flags' low bytes, each mapped to its bit). Raises
        nothing."""
        low = self.cols[8][first:end].tobytes()[0 if sys.byteorder == "little" else 3::4]
        return 0 not in low.translate(_bit(0))

    def find_regex(self, rx: re.Pattern[str], lowered: bool, whole: bool) -> list[int]:
        """The blocks with a match of ``rx``, in order, each block searched on its own
        (``lowered``: in its lower case, ſ and ı as s and i); ``whole``: a chunk is first searched
        at once, and left when nothing in it matches (not for a pattern that looks around).

        Raises:
            ValueError: a chunk is damaged (or not UTF-8).
        """
        got: list[int] = []
        search = rx.search
        for c in range(self.chunks):
            text = None if _keep_all[0] else self._text(c)
            try:
                texts = [b.decode("utf-8") for b in self.blocks_of(c, text)]
            except UnicodeDecodeError as e:
                raise ValueError(f"index part {self.name}: {e}") from e
            if lowered:
                texts = [t.lower().translate(_FOLD) for t in texts]
            if whole and search(SEP.join(texts)) is None:
                continue
            n = len(got)
            got.extend(itertools.compress(itertools.count(self.cfirst[c]), map(search, texts)))
            if len(got) > n:
                self._found_in(c, text, got[n:])
        return got

    def fields(self, idx: list[int], cols: Iterable[int]) -> list[tuple[Any, ...]]:
        """Columns ``cols`` of the blocks ``idx`` (in increasing order; the column :data:`TIME`: their
        times): a tuple of values per column (one C-level pass each)."""
        columns = [self.time if c == TIME else self.cols[c] for c in cols]
        if len(idx) == 1:
            return [(col[idx[0]],) for col in columns]
        get = itemgetter(*idx)
        return [get(col) for col in columns]

    # -- building -------------------------------------------------------------------------
    def begin(self) -> Part:
        """Make this (empty) part one being built."""
        self._zs: list[bytes] = []
        self._filters: list[bytes] = []
        self._buf: list[bytes] = []
        self._size = 0
        self._special = 0
        return self

    def add(self, values: tuple[int, ...], when: float, text: str) -> None:
        """Append one block (``values``: its record's columns but the flags)."""
        btext = text.encode("utf-8")
        ascii_ = len(btext) == len(text)
        self._put(values, _ASCII if ascii_ else 0, when, btext, not ascii_ and _special_rx().search(text) is not None)

    def _put(self, values: Iterable[int], flags: int, when: float, btext: bytes, special: bool) -> None:
        for col, v in zip(self.cols, values, strict=False):
            col.append(v)
        self.cols[8].append(flags)
        self.cols[_AT].append(self._size)
        self.time.append(when)
        self._buf.append(btext)
        self._size += len(btext) + 1
        if special:
            self._special = _SPECIAL
        if self._size >= CHUNK:
            self._close_chunk()

    def _close_chunk(self) -> None:
        if not self._buf:
            return
        from ..frames import frame_block

        self._buf.append(b"")
        data = _SEPB.join(self._buf)
        z = frame_block(data, _LEVEL, min_match=_MIN_MATCH)
        self._zs.append(z)
        self._filters.append(_filter(data))
        self.cstarts.append(self.cstarts[-1] + len(z))
        self.cfirst.append(self.n)
        # printable: no control character, and no separator but the blocks' own (a text's is one)
        printable = data.isascii() and len(data.translate(None, _CONTROLS)) == len(data) \
            and data.count(_SEPB) == len(self._buf) - 1
        self.cflags.append(self._special | (_PRINTABLE if printable else 0))
        self._buf, self._size, self._special = [], 0, 0

    def copy(self, q: Part, a: int, b: int) -> None:
        """Append blocks ``a`` to ``b`` of part ``q`` as they are (their bytes and records).

        Raises:
            ValueError: a chunk of ``q`` is damaged.
        """
        cols = [c[a:b] for c in q.cols]
        for k, i in enumerate(range(a, b)):
            btext = q.block_bytes(i)
            fl = cols[8][k]
            self._put([c[k] for c in cols[:8]], fl, q.time[i], btext,
                      not fl & _ASCII and _special_rx().search(btext.decode("utf-8")) is not None)

    def files(self) -> dict[str, bytes]:
        """The part's files as built (names without the segment), little-endian."""
        self._close_chunk()
        self.z, self.filters = b"".join(self._zs), b"".join(self._filters)
        offs = array.array("q", self.cstarts)
        offs.extend(self.cfirst)
        offs.extend(self.cflags)
        recs = array.array("i")
        for col in self.cols:
            recs.extend(col)
        times = array.array("d", self.time)
        if sys.byteorder != "little":
            offs.byteswap()
            recs.byteswap()
            times.byteswap()
        p = self.name
        return {f"{p}.z": self.z, f"{p}.flt": self.filters, f"{p}.off": offs.tobytes(),
                f"{p}.rec": recs.tobytes(), f"{p}.time": times.tobytes()}


@functools.cache
def _bit(k: int) -> bytes:
    """The table (for ``bytes.translate``) that maps a byte to 1 when it has bit ``k``, else to 0."""
    return bytes(x >> k & 1 for x in range(256))


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
    import zlib  # here and in open_file's check: a search of files as written never loads it

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
    if (st.st_mtime_ns, st.st_ino) != (want[2], want[3]):
        import zlib

        if len(data) != want[0] or zlib.crc32(data) != want[1]:
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
        p.z = open_file(folder, f"{pre}.z", files[f"{pname}.z"])
        p.ident = (folder, f"{pre}.z", *files[f"{pname}.z"])
        p.filters = open_file(folder, f"{pre}.flt", files[f"{pname}.flt"])
        offs = _view(folder, f"{pre}.off", files[f"{pname}.off"], "q")
        rec = _view(folder, f"{pre}.rec", files[f"{pname}.rec"], "i")
        p.time = _view(folder, f"{pre}.time", files[f"{pname}.time"], "d")
        n = g["n"][pname]
        if len(offs) % 3 != 2:
            raise ValueError(f"index part {pre}: sizes do not agree")
        k = (len(offs) - 2) // 3  # chunks
        p.cstarts, p.cfirst, p.cflags = offs[:k + 1], offs[k + 1:2 * k + 2], offs[2 * k + 2:]
        if len(p.time) != n or len(rec) != _COLS * n or p.cstarts[-1] != len(p.z) or p.cfirst[-1] != n \
                or len(p.filters) != k * _FILTERS_BYTES or any(map(operator.ge, cf := p.cfirst.tolist(), cf[1:])):
            raise ValueError(f"index part {pre}: sizes do not agree")
        p.cols = [rec[c * n:(c + 1) * n] for c in range(_COLS)]
        seg.parts[pname] = p
    return seg


def plain_files(folder: str) -> Iterator[tuple[str, bytes]]:
    """Every file of an index folder with what it holds in the clear: a part's chunks
    (``G.P.z``) decompressed and joined (their bounds read from ``G.P.off``), any other file
    as it is. What a check that no text or name outlives its session reads.

    Raises:
        OSError: a file cannot be read.
        ValueError: a chunk file does not agree with its offsets, or does not decompress.
    """
    from ..errors import IntegrityError
    from ..frames import unframe

    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        if name.endswith(".z"):
            with open(os.path.join(folder, name[:-2] + ".off"), "rb") as f:
                offs = array.array("q", f.read())
            if sys.byteorder != "little":
                offs.byteswap()
            starts = offs[:(len(offs) - 2) // 3 + 1]
            try:
                data = b"".join(unframe(data[a:b], name, 1 << 31) for a, b in zip(starts, starts[1:], strict=False))
            except IntegrityError as e:
                raise ValueError(f"{name}: {e}") from e
        yield name, data


__all__ = ["CHUNK", "FILTER_BITS", "KINDS", "PARTS", "SEP", "Numbers", "Part", "Segment", "filter_bits", "keep_chunks",
           "load_segment", "open_file", "plain_files", "stat_of", "write_file"]
