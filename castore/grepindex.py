"""The search index of :func:`castore.grep.grep`: derived data, rebuildable, kept fresh.

The index is a local cache of every searchable block of a store (its text, and the commit,
session, branches, role, kind, tool and time it belongs to), so that a search is one scan
over one text file instead of reading every object. It lives outside the store, in
``$CASTORE_GREP_INDEX`` or ``~/.cache/castore/grep/<digest of the store URL>/``; deleting
it loses nothing (the next search rebuilds it), and a file that fails its check (size and
CRC-32 recorded in ``state.json``) is not trusted: the index is rebuilt.

Freshness: the index records the refs of every session it covers and a *mark* of the
store's swap log (:meth:`castore.storage.Storage.swaps_since`; local disk keeps one). A
search asks the storage which refs moved since the mark (one ``stat`` and one read of the
log's tail when nothing did), re-reads only the sessions those refs belong to, re-extracts
the sessions whose refs really moved (imported, appended, branched, deleted) and keeps the
others. Where the storage keeps no log (S3, memory), or cannot tell (a reboot since, a
replaced log), every session's refs are read (one listing and one batch read) and compared.

Blocks are kept in two *parts*: ``main`` (text, thinking, tool calls: what a search reads
by default) and ``res`` (tool results, most of the text, read only when asked). Per part:

* ``P.txt``: the blocks' text, UTF-8, each followed by ``\\x1e`` (a record separator; the
  character is replaced by a space inside a text); ``P.low``: the same blocks lower-cased
  (and ſ, ı as s, i), for fast case-insensitive searches of an ASCII pattern;
* ``P.off``: little-endian int64: the character offset of each block in ``P.txt`` (and one
  past the last), then the same for ``P.low``, then the byte offsets of the same in ``P.txt``
  and in ``P.low`` (a plain string is searched in the bytes: no decoding of the whole text);
* ``P.rec``: little-endian int32, 8 per block: commit number, session number, block number
  within the commit, kind (0 text, 1 thinking, 2 tool call, 3 tool result), role, tool
  (string numbers; -1: none), branch-set number, and the block's place in the index
  (both parts counted: sessions in order, each root to tip); ``P.time``: float64 per block.

``commits`` holds the 32-byte ids the commit numbers name; ``state.json`` the version, the
store URL, the swap-log mark, the strings and branch sets, every file's size and CRC-32,
and per session its key, ref folder, refs and block counts per part.
"""

from __future__ import annotations

import array
import bisect
import json
import os
import re
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CastoreError

if TYPE_CHECKING:
    from .store import Store

VERSION = 5
SEP = "\x1e"
_KINDS = ("text", "thinking", "tool_call", "tool_result")
#: the parts of the index and the kinds each holds
PARTS = {"main": ("text", "thinking", "tool_call"), "res": ("tool_result",)}
_W = 8  # int32 fields per block in P.rec
_SESSIONS = "sessions"
#: the two characters a case-insensitive ASCII pattern matches whose lower case is not that
#: ASCII letter (Python's re: ſ is s, dotless ı is i): P.low holds the letter instead
_FOLD = {0x17F: "s", 0x131: "i"}
#: what anchors a pattern to the start or end of the text it searches
_ANCHORS = ("^", "$", "\\A", "\\Z")

Key = tuple[str, str, str]


class IndexError_(CastoreError, OSError):
    """The search index cannot be written (its folder is not writable)."""


def index_dir(store: Store) -> str:
    """The folder of ``store``'s index."""
    base = os.environ.get("CASTORE_GREP_INDEX") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "castore", "grep")
    return os.path.join(base, _sha256(_url(store).encode()).hexdigest()[:32])


def _sha256(data: bytes) -> Any:
    """SHA-256 of ``data``: CPython's own module where it has one (``hashlib`` loads OpenSSL
    first, ~20 ms of a search's start), else hashlib's."""
    try:
        from _sha256 import sha256  # CPython 3.11
    except ImportError:
        try:
            from _sha2 import sha256  # CPython 3.12+
        except ImportError:
            from hashlib import sha256
    return sha256(data)


def _url(store: Store) -> str:
    url = str(getattr(store.storage, "url", "") or repr(store))
    return url if "://" in url else os.path.abspath(url)


@dataclass
class Record:
    """One searchable block as the index keeps it."""

    commit: str
    session: int
    role: str
    kind: str
    tool: str | None
    time: float
    branches: tuple[str, ...]
    block: int = 0  # the block's number within its commit


def _session_refs(store: Store, folders: Iterable[str] | None = None) -> dict[Key, tuple[str, dict[str, str]]]:
    """Every session's ref folder and refs (name -> target; HEAD too when detached), by key;
    only the sessions of these ref ``folders`` (``sessions/A/U/S``) when given."""
    if folders is None:
        names_ = store.refs.list(_SESSIONS)
    else:
        names_ = [n for f in sorted(set(folders)) for n in store.refs.list(f)]
    vals = store.refs.read_many(names_)
    out: dict[str, dict[str, str]] = {}
    keys: dict[str, Key] = {}
    for name, v in vals.items():
        if v is None:
            continue
        parts = name.split("/")
        if len(parts) < 5:
            continue
        folder = "/".join(parts[:4])
        if parts[4] == "HEAD":
            nm = v.meta.get("names") or {}
            if all(isinstance(nm.get(k), str) for k in ("app", "user", "session")):
                keys[folder] = (nm["app"], nm["user"], nm["session"])
        if v.symbolic is None:
            out.setdefault(folder, {})[name[len(folder) + 1:]] = v.target
    return {keys[f]: (f, refs) for f, refs in out.items() if f in keys}


def _extract(store: Store, key: Key) -> Iterator[tuple[Record, str]]:
    """Every searchable block of one session, each commit once, root to tip."""
    from .grep import _time_of, blocks
    from .grepscan import bodies_of

    s = store.session(*key)
    tips = dict(s.branches())
    if s.current_branch is None and s.head is not None:
        tips["HEAD"] = s.head
    member: dict[str, list[str]] = {}
    order: list[tuple[str, Any]] = []
    for bname, tip in tips.items():
        for cid, c in store.history.path(tip):
            if cid not in member:
                member[cid] = []
                order.append((cid, c))
            member[cid].append(bname)
    order.sort(key=lambda x: x[1].depth)
    calls: dict[str, str] = {}
    for cid, c, body in bodies_of(store, order):
        for j, (role, kind, tool, text) in enumerate(blocks(body, c.kind, calls)):
            if text:
                yield Record(cid, 0, role, kind, tool, _time_of(c), tuple(member[cid]), j), text


def _changes(store: Store, mark: str | None, known: bool
             ) -> tuple[str | None, dict[Key, tuple[str, dict[str, str]]], set[str] | None]:
    """What moved since ``mark``: ``(new mark, refs read, folders read)``; folders None when
    every session's refs were read (no usable mark, or a storage without a swap log).

    The new mark is taken before any ref is read, and is None (read everything next time)
    when a ref change was under way meanwhile (see :meth:`castore.storage.Storage.swaps_since`).
    """
    got = store.storage.swaps_since(mark if known else None)
    if got is None:
        return None, _session_refs(store), None
    new, keys = got
    if keys is None:
        pending = store.storage.pending_swaps(f"refs/{_SESSIONS}")
        return (None if pending else new), _session_refs(store), None
    folders = set()
    for k in keys:
        parts = k.split("/")
        if len(parts) >= 6 and parts[0] == "refs" and parts[1] == _SESSIONS:
            folders.add("/".join(parts[1:5]))
    if not folders:
        return new, {}, set()
    under_way = any(store.storage.pending_swaps(f"refs/{f}") for f in sorted(folders))
    return (mark if under_way else new), _session_refs(store, folders), folders


class _Part:
    """One part of an index (see the module docstring), as loaded or as being built: the
    bytes of ``P.txt`` and ``P.low``, decoded only when a search needs the whole text (a
    plain string is searched in the bytes, and only the blocks found are decoded)."""

    def __init__(self) -> None:
        self.raw = b""  # P.txt
        self.lowraw = b""  # P.low
        self._text: str | None = None
        self._low: str | None = None
        self.starts: array.array[int] = array.array("q", [0])  # characters, in P.txt
        self.lstarts: array.array[int] = array.array("q", [0])  # characters, in P.low
        self.bstarts: array.array[int] = array.array("q", [0])  # bytes, in P.txt
        self.lbstarts: array.array[int] = array.array("q", [0])  # bytes, in P.low
        self.rec: array.array[int] = array.array("i")
        self.time: array.array[float] = array.array("d")

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


def _literal(rx: re.Pattern[str]) -> str | None:
    """The plain string ``rx`` matches, when its pattern is one (no regex syntax at all)."""
    p = rx.pattern
    if not p or any(ch in p for ch in "\\.^$*+?{}[]|()") or rx.flags & re.VERBOSE:
        return None
    return p


def search_plan(rx: re.Pattern[str]) -> tuple[re.Pattern[str], bool, str | None]:
    """How :meth:`Index.find_blocks` runs ``rx`` (with no anchor): the pattern it searches with,
    whether over the lowered text (``P.low``), and the plain string that pattern is, if it is one.

    A case-insensitive ASCII pattern with no backslash runs case-sensitively, lowered, over the
    lowered text (Python's case-insensitive search is many times slower).
    """
    prx, lowered = rx, False
    if rx.flags & re.IGNORECASE and "\\" not in rx.pattern and rx.pattern.isascii():
        try:
            prx, lowered = re.compile(rx.pattern.lower(), rx.flags & ~re.IGNORECASE), True
        except re.error:
            pass
    return prx, lowered, (_literal(prx) if not prx.flags & re.IGNORECASE else None)


class Index:
    """An open, fresh index of one store (see the module docstring)."""

    def __init__(self, store: Store, folder: str | None = None) -> None:
        self.store = store
        self.folder = folder or index_dir(store)
        self.sessions: list[dict[str, Any]] = []
        self.mark: str | None = None
        self.strings: list[str] = []
        self.branch_sets: list[tuple[str, ...]] = []
        self.commits = b""
        self.files: dict[str, list[int]] = {}
        self.parts: dict[str, _Part] = {}
        self.rebuilt: list[Key] = []

    # -- reading --------------------------------------------------------------------------
    def _read(self, name: str) -> bytes:
        """A file of the index, checked against its recorded size and CRC-32.

        Raises:
            ValueError: missing from the state, or the bytes do not match.
            OSError: it cannot be read.
        """
        want = self.files[name]
        with open(os.path.join(self.folder, name), "rb") as f:
            data = f.read()
        if len(data) != want[0] or zlib.crc32(data) != want[1]:
            raise ValueError(f"{name} does not match its check")
        return data

    def _map(self, name: str) -> bytes:
        """A text file of the index as :meth:`_read` checks it, mapped rather than read: a search
        reads a few blocks of it (no copy of the whole file made first). The mapping is a
        read-only :class:`mmap.mmap` (sliced, searched and decoded as bytes are), or the
        bytes themselves where the file is empty or cannot be mapped.

        Raises:
            ValueError: missing from the state, or the bytes do not match.
            OSError: it cannot be read.
        """
        import mmap

        want = self.files[name]
        with open(os.path.join(self.folder, name), "rb") as f:
            try:
                data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if want[0] else b""
            except (OSError, ValueError):
                return self._read(name)
        if len(data) != want[0] or zlib.crc32(data) != want[1]:
            raise ValueError(f"{name} does not match its check")
        return data

    def _load(self) -> bool:
        try:
            with open(os.path.join(self.folder, "state.json"), encoding="utf-8") as f:
                state = json.load(f)
            if state.get("version") != VERSION or state.get("url") != _url(self.store):
                return False
            self.files = {k: list(v) for k, v in state["files"].items()}
            self.sessions = state["sessions"]
            self.mark = state["mark"]
            self.strings = list(state["strings"])
            self.branch_sets = [tuple(b) for b in state["branch_sets"]]
            self.commits = self._read("commits")
            self.parts = {}
            return len(self.commits) % 32 == 0
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def part(self, name: str) -> _Part:
        """Part ``name`` (``main`` or ``res``), read and checked on first use.

        Raises:
            ValueError: a file of it is damaged (the caller rebuilds the index).
        """
        got = self.parts.get(name)
        if got is not None:
            return got
        p = _Part()
        try:
            p.raw = self._map(f"{name}.txt")
            p.lowraw = self._map(f"{name}.low")
            offs = array.array("q")
            offs.frombytes(self._read(f"{name}.off"))
            p.rec.frombytes(self._read(f"{name}.rec"))
            p.time.frombytes(self._read(f"{name}.time"))
            if sys.byteorder != "little":
                offs.byteswap()
                p.rec.byteswap()
                p.time.byteswap()
        except (OSError, KeyError) as e:
            raise ValueError(f"index part {name}: {e}") from e
        n = len(p.time)
        if len(offs) != 4 * (n + 1) or len(p.rec) != _W * n or offs[3 * (n + 1) - 1] != len(p.raw) \
                or offs[-1] != len(p.lowraw):
            raise ValueError(f"index part {name}: sizes do not agree")
        m = n + 1
        p.starts, p.lstarts, p.bstarts, p.lbstarts = offs[:m], offs[m:2 * m], offs[2 * m:3 * m], offs[3 * m:]
        self.parts[name] = p
        return p

    def record(self, part: str, i: int) -> Record:
        """Block ``i`` of ``part``'s record."""
        r = self.part(part).rec[_W * i:_W * i + _W]
        c = r[0] * 32
        return Record(self.commits[c:c + 32].hex(), r[1], self.strings[r[4]], _KINDS[r[3]],
                      self.strings[r[5]] if r[5] >= 0 else None, self.part(part).time[i],
                      self.branch_sets[r[6]], r[2])

    def order(self, part: str, i: int) -> tuple[int, int]:
        """Where block ``i`` of ``part`` comes in the output: (session number, place)."""
        rec = self.part(part).rec
        return rec[_W * i + 1], rec[_W * i + 7]

    def block_text(self, part: str, i: int) -> str:
        """Block ``i`` of ``part``'s text."""
        return self.part(part).block(i)

    def key(self, session: int) -> Key:
        """The key of session number ``session``."""
        k = self.sessions[session]["key"]
        return (k[0], k[1], k[2])

    def find(self, rx: re.Pattern[str], kinds: set[str] | None = None) -> list[tuple[str, int]]:
        """The blocks (of these kinds) with a match of ``rx``, as ``(part, block)``, part by part
        (:meth:`find_blocks`, flattened).

        Raises:
            ValueError: a part is damaged (the caller rebuilds the index).
        """
        return [(name, i) for name, idx in self.find_blocks(rx, kinds).items() for i in idx]

    def find_blocks(self, rx: re.Pattern[str], kinds: set[str] | None = None) -> dict[str, list[int]]:
        """The blocks (of these kinds) with a match of ``rx``: per part searched, their numbers
        in increasing order.

        A case-insensitive ASCII pattern with no backslash runs case-sensitively, lowered, over
        the lowered text (Python's case-insensitive search is many times slower), and a
        pattern with no regex syntax runs as a plain string search; a pattern with an anchor
        (``^``, ``$``, ``\\A``, ``\\Z``) runs block by block. The caller matches the blocks
        found again with ``rx`` itself.

        Raises:
            ValueError: a part is damaged (the caller rebuilds the index).
        """
        out: dict[str, list[int]] = {}
        for name, held in PARTS.items():
            if kinds is not None and not kinds & set(held):
                continue
            p = self.part(name)
            got = out[name] = []
            want = None if kinds is None or set(held) <= kinds else {i for i, k in enumerate(_KINDS) if k in kinds}
            if any(a in rx.pattern for a in _ANCHORS):
                # an anchor means the start or end of a block (or line), not of the whole text:
                # each block is searched on its own
                rec, search = p.rec, rx.search
                got.extend(i for i in range(p.n)
                           if (want is None or rec[_W * i + 3] in want) and search(p.block(i)) is not None)
                continue
            prx, lowered, lit = search_plan(rx)
            rec = p.rec
            if lit is not None and SEP not in lit:
                # a plain string never spans two blocks, and its UTF-8 bytes are found exactly where
                # it is (UTF-8 synchronises): one C-level pass over the bytes finds the first hit of
                # each block (the match runs on to the block's end, so the next starts at the
                # following block), and the byte offsets map to blocks by bisect
                raw, bounds = (p.lowraw, p.lbstarts) if lowered else (p.raw, p.bstarts)
                bis = bisect.bisect_right
                at_ = [m.start() for m in re.finditer(re.escape(lit.encode("utf-8")) + b"[^\x1e]*", raw)]
                if len(at_) > 64:
                    bounds = bounds.tolist()  # type: ignore[assignment]  # a list bisects without making ints
                blocks_ = [bis(bounds, a) - 1 for a in at_]
                got.extend(blocks_ if want is None else [i for i in blocks_ if rec[_W * i + 3] in want])
                continue
            try:
                text, starts = (p.low, p.lstarts) if lowered else (p.text, p.starts)
            except UnicodeDecodeError as e:
                raise ValueError(f"index part {name}: {e}") from e
            pos, end = 0, len(text)
            search = prx.search
            while pos < end:
                if lit is not None:
                    at = text.find(lit, pos)
                    if at < 0:
                        break
                    mstart, mend = at, at + len(lit)
                else:
                    m = search(text, pos)
                    if m is None:
                        break
                    mstart, mend = m.span()
                i = bisect.bisect_right(starts, mstart) - 1
                nxt = starts[i + 1]
                if mend < nxt and (want is None or rec[_W * i + 3] in want):
                    got.append(i)
                    pos = nxt  # one hit per block is enough: its lines are matched later
                else:
                    pos = mstart + 1 if mend >= nxt else nxt
        return out

    # -- keeping it fresh ----------------------------------------------------------------
    def refresh(self, check: bool = True) -> Index:
        """Load the index and bring it up to date with the store's refs (rebuilding what moved).

        Args:
            check: ask the store what moved (False: trust an index that loads, as the last
                import or search left it; build one only when there is none).

        Raises:
            IndexError_: the index folder cannot be written.
            StorageError, IntegrityError: the store cannot be read.
        """
        loaded = self._load()
        if loaded and not check:
            return self
        mark, read, folders = _changes(self.store, self.mark, loaded)
        old = {tuple(s["key"]): (i, s) for i, s in enumerate(self.sessions) if not s.get("gone")} if loaded else {}
        if folders is None:
            current = {k: v for k, v in read.items()}
        else:
            current = {k: (s["folder"], s["refs"]) for k, (_, s) in old.items() if s["folder"] not in folders}
            current.update(read)
        keys = sorted(current)
        same = loaded and len(old) == len(keys) and all(
            k in old and old[k][1]["refs"] == current[k][1] for k in keys)
        if same:
            if mark != self.mark:
                self.mark = mark
                self._save_state()
            return self
        try:
            self._rebuild(keys, current, old, mark)
        except ValueError:  # a damaged part: everything from the store
            self._rebuild(keys, current, {}, mark)
        return self

    def rebuild(self) -> Index:
        """Build the index again from the store alone (what a damaged index file calls for).

        Raises:
            IndexError_, StorageError, IntegrityError.
        """
        mark, read, _ = _changes(self.store, None, False)
        self._rebuild(sorted(read), read, {}, mark)
        return self

    def _rebuild(self, keys: list[Key], current: dict[Key, tuple[str, dict[str, str]]],
                 old: dict[Key, tuple[int, dict[str, Any]]], mark: str | None) -> None:
        """Write the index for the sessions ``current``: the sessions of ``old`` whose refs did
        not move are copied as they were (whole ranges, no per-block work), the others are
        extracted from the store. Session numbers, commit numbers and strings stay as they
        were (a gone session keeps its number, with no blocks), so copied records hold."""
        os.makedirs(self.folder, exist_ok=True)
        if old:
            sessions = [dict(x) for x in self.sessions]
            commits = {self.commits[i:i + 32]: i // 32 for i in range(0, len(self.commits), 32)}
            strings = {x: i for i, x in enumerate(self.strings)}
            bsets = {x: i for i, x in enumerate(self.branch_sets)}
        else:
            sessions, commits, strings, bsets = [], {}, {}, {}
        olds = {name: [0] for name in PARTS}
        for x in sessions:
            for name in PARTS:
                olds[name].append(olds[name][-1] + x["n"][name])
        number = {tuple(x["key"]): i for i, x in enumerate(sessions) if not x.get("gone")}
        for key in keys:
            if key not in number:
                number[key] = len(sessions)
                sessions.append({"key": list(key), "folder": "", "refs": None, "n": dict.fromkeys(PARTS, 0)})
        built: dict[str, tuple[list[bytes], list[bytes], _Part]] = {name: ([], [], _Part()) for name in PARTS}
        self.rebuilt = []
        seq = [0]

        def put(rec: Record, text: str, si: int) -> str:
            name = "res" if rec.kind == "tool_result" else "main"
            texts, lows, p = built[name]
            cn = commits.setdefault(bytes.fromhex(rec.commit), len(commits))
            rn = strings.setdefault(rec.role, len(strings))
            tn = strings.setdefault(rec.tool, len(strings)) if rec.tool is not None else -1
            bn = bsets.setdefault(rec.branches, len(bsets))
            p.rec.extend((cn, si, rec.block, _KINDS.index(rec.kind), rn, tn, bn, seq[0]))
            seq[0] += 1
            p.time.append(rec.time)
            low = text.lower().translate(_FOLD)
            btext, blow = (text + SEP).encode("utf-8"), (low + SEP).encode("utf-8")
            texts.append(btext)
            lows.append(blow)
            p.starts.append(p.starts[-1] + len(text) + 1)
            p.lstarts.append(p.lstarts[-1] + len(low) + 1)
            p.bstarts.append(p.bstarts[-1] + len(btext))
            p.lbstarts.append(p.lbstarts[-1] + len(blow))
            return name

        for si, x in enumerate(sessions):
            key = (x["key"][0], x["key"][1], x["key"][2])
            if key not in current:
                x.update(gone=True, refs=None, n=dict.fromkeys(PARTS, 0))
                continue
            folder, refs = current[key]
            kept = key in old and old[key][1]["refs"] == refs
            n = dict.fromkeys(PARTS, 0)
            if kept:
                for name in PARTS:
                    a, b = olds[name][si], olds[name][si + 1]
                    if a == b:
                        continue
                    texts, lows, p = built[name]
                    q = self.part(name)
                    texts.append(q.raw[q.bstarts[a]:q.bstarts[b]])
                    lows.append(q.lowraw[q.lbstarts[a]:q.lbstarts[b]])
                    for mine, theirs in ((p.starts, q.starts), (p.lstarts, q.lstarts), (p.bstarts, q.bstarts),
                                         (p.lbstarts, q.lbstarts)):
                        base = mine[-1] - theirs[a]
                        mine.extend([v + base for v in theirs[a + 1:b + 1]])
                    p.rec.extend(q.rec[_W * a:_W * b])
                    p.time.extend(q.time[a:b])
                    n[name] = b - a
            else:
                self.rebuilt.append(key)
                for rec, text in _extract(self.store, key):
                    n[put(rec, text.replace(SEP, " "), si)] += 1
            x.update(folder=folder, refs=refs, n=n)
            x.pop("gone", None)
        self.sessions = sessions
        self.mark = mark
        self.strings = list(strings)
        self.branch_sets = list(bsets)
        self.commits = b"".join(commits)
        self.parts = {}
        files: dict[str, bytes] = {"commits": self.commits}
        for name, (texts, lows, p) in built.items():
            p.raw = b"".join(texts)
            p.lowraw = b"".join(lows)
            offs = array.array("q", p.starts)
            for more in (p.lstarts, p.bstarts, p.lbstarts):
                offs.extend(more)
            recs, times = array.array("i", p.rec), array.array("d", p.time)
            if sys.byteorder != "little":
                offs.byteswap()
                recs.byteswap()
                times.byteswap()
            files.update({f"{name}.txt": p.raw, f"{name}.low": p.lowraw,
                          f"{name}.off": offs.tobytes(), f"{name}.rec": recs.tobytes(),
                          f"{name}.time": times.tobytes()})
            self.parts[name] = p
        self.files = {k: [len(v), zlib.crc32(v)] for k, v in files.items()}
        try:
            if os.path.exists(os.path.join(self.folder, "state.json")):
                os.unlink(os.path.join(self.folder, "state.json"))  # a torn update reads as no index
            for k, v in files.items():
                _write(self.folder, k, v)
        except OSError as e:
            raise IndexError_(f"cannot write the search index in {self.folder}: {e}") from e
        self._save_state()

    def _save_state(self) -> None:
        try:
            _write(self.folder, "state.json", json.dumps({
                "version": VERSION, "url": _url(self.store), "mark": self.mark, "files": self.files,
                "strings": self.strings, "branch_sets": [list(b) for b in self.branch_sets],
                "sessions": self.sessions}).encode())
        except OSError as e:
            raise IndexError_(f"cannot write the search index in {self.folder}: {e}") from e


def _write(folder: str, name: str, data: bytes) -> None:
    import tempfile  # only a build writes: a search need not import it (nor random, shutil)

    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(folder, name))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_index(store: Store, folder: str | None = None, *, check: bool = True) -> Index:
    """The fresh index of ``store`` (built or updated as needed; see :meth:`Index.refresh`).

    Raises:
        IndexError_, StorageError, IntegrityError.
    """
    return Index(store, folder).refresh(check)


def update_if_present(store: Store) -> bool:
    """Bring ``store``'s index up to date if it has one (what an import calls); True if it did.

    Raises:
        IndexError_, StorageError, IntegrityError.
    """
    if not os.path.exists(os.path.join(index_dir(store), "state.json")):
        return False
    open_index(store)
    return True


__all__ = ["Index", "IndexError_", "Record", "index_dir", "open_index", "search_plan"]
