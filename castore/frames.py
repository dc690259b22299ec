"""The frames of stored bytes (object format 1, docs/FORMAT.md 3): the header byte and the
zstd compression behind it, with castore's built-in dictionary. No ids, no I/O.

A frame is one header byte followed by the bytes as they are (:data:`RAW`, ``0x00``), their
zstd frame (:data:`ZSTD`, ``0x01``), or their zstd frame made with castore's built-in
format-1 dictionary (:data:`ZSTD_DICT`, ``0x02``, the bytes of :mod:`castore.zdict`, pinned
below by their blake3 digest; the frame is zstd's magicless format: the header byte already
says what follows); :data:`SEALED` (``0x03``) starts an encrypted store's sealed frame
(:class:`castore.objects.Codec` opens it). :func:`to_stored` frames an object's canonical
bytes, :func:`frame_block` a block of many (a repacked pack record, a search index chunk),
:func:`unframe` undoes either, :class:`BlockPrefix` reads a block in part.

Its own module, below :mod:`castore.objects` (which frames its objects with it and re-exports
these names), so that a reader of frames alone (the search index) loads neither msgspec nor
the object structs. With :mod:`castore.objects`, the only module that imports zstandard and
blake3.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import zstandard

from .errors import FormatError, IntegrityError, SealedFrameError

#: the object format these frames belong to (docs/FORMAT.md)
FORMAT = 1

RAW = b"\x00"
ZSTD = b"\x01"
ZSTD_DICT = b"\x02"
SEALED = b"\x03"  # a sealed frame: a Cipher's nonce, ciphertext of an ordinary frame, and tag
#: objects shorter than this are stored raw (below it even the dictionary rarely pays for the frame)
COMPRESS_MIN = 32
#: objects up to this size use the dictionary; a larger one is its own context: plain zstd
#: did as well on segments (within 2% either way) and big blobs skip the dictionary's setup
DICT_MAX = 16 * 1024
#: the dictionary codec's level: 5 stores small objects about 4% smaller than 3, for ~5 us more
ZDICT_LEVEL = 5
#: blake3 of :data:`castore.zdict.ZDICT`, loaded as a full (trained) zstd dictionary: the format
ZDICT_BLAKE3 = "fd841db6a0db4799db66e718d7b3dc02406ca0df73e6b2bf81516e2c1a6d1461"
_ZDICT_TYPE = zstandard.DICT_TYPE_FULLDICT
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FRAME_HEADER_MAX = 18  # bytes of a zstd frame header at most, magic included
#: no stored object decompresses to more than this (objects are held in memory whole)
MAX_OBJECT_SIZE = 1 << 32
#: the most content a zstd frame can make of each of its bytes: a block makes at most 128 KiB
#: and takes at least 4 bytes (its 3-byte header and an RLE byte). A frame declaring more than
#: this times its length (and more than 1 MiB: a smaller claim is allocated at no risk, and
#: unchecked on the path of every small object) lies, and is refused before its declared size
#: is allocated.
MAX_RATIO = (128 << 10) // 4



def dictionary() -> bytes:
    """The built-in dictionary (:mod:`castore.zdict`), checked against :data:`ZDICT_BLAKE3`:
    loaded by the first frame that uses it (a reader of plain zstd frames alone, the search
    index, never loads it), and by :mod:`castore.objects` on import.

    Raises:
        FormatError: castore/zdict.py does not hold the pinned dictionary.
    """
    from blake3 import blake3

    from .zdict import ZDICT

    found = blake3(ZDICT).hexdigest()
    if found != ZDICT_BLAKE3:
        raise FormatError(
            f"castore/zdict.py does not hold the format-1 zstd dictionary (blake3 {found}, pinned "
            f"{ZDICT_BLAKE3}); objects stored with header 0x02 would not read back: restore that file",
            found=found,
            supported=FORMAT,
        )
    return ZDICT


# zstd contexts are not thread-safe, and a new one costs far more than compressing a small
# object (its tables are allocated and initialised on first use: 80-220 us against 15 us).
# So they live in pools that every thread takes from and gives back to, not in
# thread-locals, which a short-lived thread would lose (LangGraph runs each checkpoint
# write in a new thread). The digested dictionary is shared (zstd's CDict and DDict are
# read-only once built).
_zdict_lock = threading.Lock()
_zdict: zstandard.ZstdCompressionDict | None = None
_Ctx = TypeVar("_Ctx")


class _Pool(Generic[_Ctx]):
    """Contexts made by ``make``, each used by one thread at a time: :meth:`take` one (a new
    one when all are in use), :meth:`give` it back. ``list.pop``/``append`` are atomic."""

    __slots__ = ("_make", "_free")

    def __init__(self, make: Callable[[], _Ctx]) -> None:
        self._make = make
        self._free: list[_Ctx] = []

    def take(self) -> _Ctx:
        try:
            return self._free.pop()
        except IndexError:
            return self._make()

    def give(self, ctx: _Ctx) -> None:
        self._free.append(ctx)


def _dict_compressor(d: zstandard.ZstdCompressionDict) -> zstandard.ZstdCompressor:
    """A compressor for the ``0x02`` codec: magicless frame, content size, no checksum, no dict id."""
    params = zstandard.ZstdCompressionParameters.from_level(
        ZDICT_LEVEL, format=zstandard.FORMAT_ZSTD1_MAGICLESS, write_content_size=1, write_checksum=0,
        write_dict_id=0,
    )
    return zstandard.ZstdCompressor(dict_data=d, compression_params=params)


def _dict_decompressor(d: zstandard.ZstdCompressionDict) -> zstandard.ZstdDecompressor:
    return zstandard.ZstdDecompressor(dict_data=d, format=zstandard.FORMAT_ZSTD1_MAGICLESS)


def _digest_dict(data: bytes, dict_type: int) -> zstandard.ZstdCompressionDict:
    """``data`` as a zstd dictionary with its compression and decompression forms built.

    python-zstandard builds the decompression form on first use with the GIL released, so
    two threads could both build it; one round trip here builds it once, up front.
    """
    d = zstandard.ZstdCompressionDict(data, dict_type=dict_type)
    d.precompute_compress(level=ZDICT_LEVEL)
    _dict_decompressor(d).decompress(_dict_compressor(d).compress(b"castore"))
    return d


def _shared_zdict() -> zstandard.ZstdCompressionDict:
    global _zdict
    if _zdict is None:
        with _zdict_lock:
            if _zdict is None:
                _zdict = _digest_dict(dictionary(), _ZDICT_TYPE)
    return _zdict


_compressors = _Pool(lambda: zstandard.ZstdCompressor(level=3))
_decompressors = _Pool(zstandard.ZstdDecompressor)
_dict_compressors = _Pool(lambda: _dict_compressor(_shared_zdict()))
_dict_decompressors = _Pool(lambda: _dict_decompressor(_shared_zdict()))
_level_compressors: dict[int, _Pool[zstandard.ZstdCompressor]] = {}
#: :func:`frame_block`'s compressors with a shortest match, by the parameters zstd picks for the
#: level and size (a compressor per frame cost a grep index build 6% of its chunks' compression)
_match_compressors: dict[tuple[int, ...], _Pool[zstandard.ZstdCompressor]] = {}


def to_stored(canonical: bytes, compress: bool = True) -> bytes:
    """Frame canonical bytes for storage: compressed (one attempt) when that saves space.

    Objects of :data:`COMPRESS_MIN` to :data:`DICT_MAX` bytes try the dictionary codec
    (``0x02``), larger ones plain zstd (``0x01``); what does not shrink is stored raw. The
    result is never more than one byte longer than ``canonical``.
    """
    n = len(canonical)
    if compress and n >= COMPRESS_MIN:
        head, pool = (ZSTD_DICT, _dict_compressors) if n <= DICT_MAX else (ZSTD, _compressors)
        c = pool.take()
        try:
            z = c.compress(canonical)
        finally:
            pool.give(c)
        if len(z) < n:
            return head + z
    return RAW + canonical


def unframe(stored: bytes | memoryview, what: str = "frame", limit: int = MAX_OBJECT_SIZE) -> bytes:
    """Undo :func:`to_stored` or :func:`frame_block` without checking any id (a pack record's
    content is checked by the ids of the objects it holds).

    Raises:
        IntegrityError: (naming ``what``) empty, unknown header, bad compression, or a frame
            declaring no size, more than ``limit`` bytes (:data:`MAX_OBJECT_SIZE`; a pack
            record's: less, see :mod:`castore.objectstore.packs`), more than its length can
            hold (:data:`MAX_RATIO`: refused before the declared size is allocated), or a size
            its data does not make.
        SealedFrameError: the frame is sealed (an encrypted store's), not for this reader.
    """
    if not stored:
        raise IntegrityError(what, "empty file")
    head, body = bytes(stored[:1]), stored[1:]
    if head == RAW:
        return bytes(body)
    if head == ZSTD or head == ZSTD_DICT:
        magicless = head == ZSTD_DICT
        try:
            # a damaged size field must not make us allocate gigabytes before failing
            size = _declared(head, body)
            if size < 0 or size > limit or (size > 1 << 20 and size > len(body) * MAX_RATIO):  # (1 MiB: harmless)
                raise _refused(size, len(body), limit, what)
            # one frame and nothing after it: what the writer made, byte for byte
            pool = _dict_decompressors if magicless else _decompressors
            d = pool.take()
            try:
                return d.decompress(body, allow_extra_data=False)
            finally:
                pool.give(d)
        except zstandard.ZstdError as e:
            raise IntegrityError(what, f"bad compressed data ({e})") from e
    if head == SEALED:
        raise SealedFrameError(what, "it is sealed (an encrypted store's): open the store with its key")
    raise IntegrityError(what, f"unknown header byte 0x{stored[0]:02x}")


def _refused(size: int, stored: int, limit: int, what: str) -> IntegrityError:
    """Why a reader does not allocate ``size``, the content size a zstd frame of ``stored``
    bytes declares: none declared, more than ``limit``, or more than :data:`MAX_RATIO` times
    ``stored`` (a frame cannot make that much). Raises nothing."""
    if size < 0 or size > limit:
        return IntegrityError(what, f"compressed frame declares {size} bytes (at most {limit} here)")
    return IntegrityError(what, f"compressed frame declares {size} bytes, more than its {stored} bytes "
                                f"can hold (at most {MAX_RATIO} each)")


def _declared(head: bytes, body: bytes | memoryview) -> int:
    """The content size a zstd frame's header declares (-1: none).

    Raises:
        zstandard.ZstdError: not a frame header.
    """
    if head == ZSTD_DICT:
        return int(zstandard.frame_content_size(_ZSTD_MAGIC + bytes(body[:_FRAME_HEADER_MAX])))
    return int(zstandard.frame_content_size(body))


def declared_size(stored: bytes | memoryview) -> int:
    """How many bytes :func:`unframe` would make of ``stored``, from its header alone (no
    decompression): -1 when the frame declares no size or is not a frame."""
    head = bytes(stored[:1])
    if head == RAW:
        return len(stored) - 1
    if head not in (ZSTD, ZSTD_DICT):
        return -1
    try:
        return _declared(head, stored[1:])
    except zstandard.ZstdError:
        return -1


class BlockPrefix:
    """The content of a plain zstd frame (``0x01``: a repacked pack's block) decompressed only
    as far as its readers ask: a reader of one object near the start of a 256 KiB block stops
    after the zstd blocks (up to 128 KiB each, or up to a cut of a block laid out by kind)
    that hold it, and a later reader of the same frame goes on from there. No id is checked
    here (the objects read from it are).

    While the frame is read in part, the prefix holds a decompression context of the pool
    :func:`unframe` uses (a new one costs ~20 us); it goes back once the whole frame is read
    or :meth:`close` is called. A closed prefix asked for more than it holds decompresses
    again from the start of the frame (a reader that took it before another closed it).

    Raises:
        IntegrityError: (from the constructor, naming ``what``) not a ``0x01`` frame, or one
            declaring no size or more than ``limit`` bytes.
    """

    __slots__ = ("size", "data", "what", "_body", "_reader", "_ctx")

    def __init__(self, stored: bytes | memoryview, what: str = "frame", limit: int = MAX_OBJECT_SIZE) -> None:
        if bytes(stored[:1]) != ZSTD:
            raise IntegrityError(what, "not a plain zstd frame")
        body = bytes(stored[1:])
        try:
            size = zstandard.frame_content_size(body)
        except zstandard.ZstdError as e:
            raise IntegrityError(what, f"bad compressed data ({e})") from e
        if size < 0 or size > limit or size > len(body) * MAX_RATIO:
            raise _refused(size, len(body), limit, what)
        self.size: int = size
        self.data = b""
        self.what = what
        self._body = body
        self._ctx: zstandard.ZstdDecompressor | None = None
        self._reader: Any = None
        self._open()

    def _open(self) -> None:
        # a context of its own until it is done: a stream left open is not shared
        self._ctx = _decompressors.take()
        self._reader = self._ctx.stream_reader(self._body, read_across_frames=False)

    def upto(self, n: int) -> bytes:
        """At least the first ``n`` bytes of the content (all of it when ``n`` is not less).

        Raises:
            IntegrityError: the frame does not decompress, or ends before its declared size.
        """
        want = min(n, self.size)
        parts = [self.data]
        held = len(self.data)
        if held < want and self._reader is None:
            self._open()  # closed meanwhile: from the start again
            parts, held = [], 0
        try:
            while held < want:
                more = self._reader.read(want - held)
                if not more:
                    raise IntegrityError(self.what, f"compressed frame ends at {held} of {self.size} bytes")
                parts.append(more)
                held += len(more)
        except zstandard.ZstdError as e:
            self._ctx = None  # its state is that of a failed stream: not given back
            raise IntegrityError(self.what, f"bad compressed data ({e})") from e
        if held != len(self.data):
            self.data = b"".join(parts)
        if held >= self.size:
            self.close()
        return self.data

    def close(self) -> None:
        """Read no further for now: the decompression context goes back to the pool (what
        was read stays in :attr:`data`). Safe to call twice."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
            if self._ctx is not None:
                _decompressors.give(self._ctx)
        self._ctx = None


def frame_block(data: bytes, level: int, cuts: Sequence[int] = (), *, min_match: int = 0) -> bytes:
    """Frame a block of many objects' bytes (a repacked pack record) as one plain zstd frame
    at ``level`` (``0x01``), or raw when that does not shrink it. :func:`unframe` reads it.
    ``min_match``: zstd's shortest match, instead of the level's for the size of ``data`` (a
    longer one makes fewer, longer sequences: a frame that decodes faster).

    ``cuts``: offsets into ``data`` (ascending) at which a zstd block ends (zstd's block
    flush: the frame and its window go on, the next block may still copy from the earlier
    ones), so that a reader of a prefix (:class:`BlockPrefix`) decodes only the blocks up to
    the bytes it needs, not up to 128 KiB more. The content is the same either way.
    """
    pool: _Pool[zstandard.ZstdCompressor] | None
    if min_match:
        params = zstandard.ZstdCompressionParameters.from_level(level, source_size=len(data), min_match=min_match)
        key = (params.window_log, params.chain_log, params.hash_log, params.search_log, params.min_match,
               params.target_length, params.strategy)
        pool = _match_compressors.get(key)
        if pool is None:
            pool = _match_compressors.setdefault(
                key, _Pool(lambda: zstandard.ZstdCompressor(compression_params=params)))
    else:
        pool = _level_compressors.get(level)
        if pool is None:
            pool = _level_compressors.setdefault(level, _Pool(lambda: zstandard.ZstdCompressor(level=level)))
    c = pool.take()
    try:
        if not cuts:
            z = c.compress(data)
        else:
            co = c.compressobj(size=len(data))
            parts, at = [], 0
            for cut in cuts:
                if at < cut < len(data):
                    parts.append(co.compress(data[at:cut]))
                    parts.append(co.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK))
                    at = cut
            parts.append(co.compress(data[at:]))
            parts.append(co.flush())
            z = b"".join(parts)
    finally:
        pool.give(c)
    return ZSTD + z if len(z) < len(data) else RAW + data


__all__ = ["FORMAT", "RAW", "ZSTD", "ZSTD_DICT", "SEALED", "COMPRESS_MIN", "DICT_MAX", "ZDICT_LEVEL", "ZDICT_BLAKE3",
           "MAX_OBJECT_SIZE", "dictionary", "to_stored", "unframe", "declared_size", "BlockPrefix", "frame_block"]
