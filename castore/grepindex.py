"""The search index of :func:`castore.grep.grep`: derived data, rebuildable, kept fresh.

The index is a local cache of every searchable block of a store (its text, and the commit,
session, branches, role, kind, tool and time it belongs to), so that a search is one regex
scan over one text file instead of reading every object. It lives outside the store, in
``$CASTORE_GREP_INDEX`` or ``~/.cache/castore/grep/<digest of the store URL>/``; deleting
it loses nothing (the next search rebuilds it).

Freshness: the index records the refs of every session it covers. Each search reads the
store's refs (one listing and one batch read), re-extracts the sessions whose refs moved
(imported, appended, branched, deleted), and keeps the others as they were. Files:

* ``text``: the blocks' text, UTF-8, each followed by ``\\x1e`` (a record separator; the
  character is replaced by a space inside a text);
* ``records``: one JSON array per block, ``[commit, session index, role, kind, tool, time,
  branches, block number within the commit]``;
* ``lower``: ``text`` in lower case when that keeps every offset (else empty), for fast
  case-insensitive searches;
* ``kinds``: one byte per block, its kind (0 text, 1 thinking, 2 tool call, 3 tool result);
* ``offsets``: little-endian 64-bit integers: for each block, the character offset of its
  text and the byte offset of its record (and one past the last);
* ``state.json``: the version, the store URL, and per session its key, refs and blocks.
"""

from __future__ import annotations

import array
import bisect
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import CastoreError

if TYPE_CHECKING:
    import re

    from .store import Store

VERSION = 3
SEP = "\x1e"
_KINDS = ("text", "thinking", "tool_call", "tool_result")

Key = tuple[str, str, str]


class IndexError_(CastoreError, OSError):
    """The search index cannot be written (its folder is not writable)."""


def index_dir(store: Store) -> str:
    """The folder of ``store``'s index."""
    base = os.environ.get("CASTORE_GREP_INDEX") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "castore", "grep")
    return os.path.join(base, hashlib.sha256(_url(store).encode()).hexdigest()[:32])


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


def _session_refs(store: Store) -> dict[Key, dict[str, str]]:
    """Every session's refs (name -> target; HEAD too when detached), by key."""
    names_ = store.refs.list("sessions")
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
    return {keys[f]: refs for f, refs in out.items() if f in keys}


def _extract(store: Store, key: Key) -> Iterator[tuple[Record, str]]:
    """Every searchable block of one session, each commit once, root to tip."""
    from .grep import _time_of, blocks, bodies_of

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


class Index:
    """An open, fresh index of one store (see the module docstring)."""

    def __init__(self, store: Store, folder: str | None = None) -> None:
        self.store = store
        self.folder = folder or index_dir(store)
        self.sessions: list[dict[str, Any]] = []
        self.text = ""
        self.offsets: array.array[int] = array.array("q")
        self._records: bytes = b""
        self.kinds: bytes = b""
        self._lower: str | None = None
        self.rebuilt: list[Key] = []

    # -- reading --------------------------------------------------------------------------
    def _load(self) -> bool:
        try:
            with open(os.path.join(self.folder, "state.json"), encoding="utf-8") as f:
                state = json.load(f)
            if state.get("version") != VERSION or state.get("url") != _url(self.store):
                return False
            with open(os.path.join(self.folder, "text"), encoding="utf-8", newline="") as f:
                self.text = f.read()
            with open(os.path.join(self.folder, "records"), "rb") as f:
                self._records = f.read()
            with open(os.path.join(self.folder, "kinds"), "rb") as f:
                self.kinds = f.read()
            offs = array.array("q")
            with open(os.path.join(self.folder, "offsets"), "rb") as f:
                offs.frombytes(f.read())
            if sys.byteorder != "little":
                offs.byteswap()
            self.sessions = state["sessions"]
            n = sum(s["n"] for s in self.sessions)
            if len(offs) != 2 * (n + 1) or len(self.kinds) != n:
                return False
            self.offsets = offs
            return True
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def record(self, i: int) -> Record:
        """Block ``i``'s record."""
        a, b = self.offsets[2 * i + 1], self.offsets[2 * i + 3]
        r = json.loads(self._records[a:b].decode("utf-8"))
        return Record(r[0], r[1], r[2], r[3], r[4], r[5], tuple(r[6]), r[7])

    def block_text(self, i: int) -> str:
        """Block ``i``'s text."""
        return self.text[self.offsets[2 * i]:self.offsets[2 * i + 2] - 1]

    def key(self, session: int) -> Key:
        """The key of session number ``session``."""
        k = self.sessions[session]["key"]
        return (k[0], k[1], k[2])

    def _lowered(self) -> str | None:
        """The text in lower case, when lowering kept every offset (else None)."""
        if self._lower is None:
            try:
                with open(os.path.join(self.folder, "lower"), encoding="utf-8", newline="") as f:
                    self._lower = f.read()
            except OSError:
                self._lower = ""
        return self._lower if len(self._lower) == len(self.text) else None

    def find(self, rx: re.Pattern[str], kinds: set[str] | None = None) -> list[int]:
        """The blocks (of these kinds) with a match of ``rx``, in order.

        A case-insensitive pattern with no backslash runs case-sensitively, lowered, over
        the lowered text (Python's case-insensitive search is many times slower); the
        caller matches the blocks found again with ``rx`` itself.
        """
        import re as re_

        starts = self.offsets[0::2]
        want = None if kinds is None else bytes(i for i, k in enumerate(_KINDS) if k in kinds)
        out: list[int] = []
        text = self.text
        if rx.flags & re_.IGNORECASE and "\\" not in rx.pattern and (low := self._lowered()) is not None:
            try:
                rx, text = re_.compile(rx.pattern.lower(), rx.flags & ~re_.IGNORECASE), low
            except re_.error:
                pass
        pos, end = 0, len(text)
        search = rx.search
        while pos < end:
            m = search(text, pos)
            if m is None:
                break
            i = bisect.bisect_right(starts, m.start()) - 1
            nxt = starts[i + 1]
            if m.end() < nxt and (want is None or self.kinds[i] in want):
                out.append(i)
                pos = nxt  # one hit per block is enough: its lines are matched later
            else:
                pos = m.start() + 1 if m.end() >= nxt else nxt
        return out

    # -- keeping it fresh ----------------------------------------------------------------
    def refresh(self, check: bool = True) -> Index:
        """Load the index and bring it up to date with the store's refs (rebuilding what moved).

        Args:
            check: compare with the store's refs (False: trust an index that loads, as the
                last import or search left it; build one only when there is none).

        Raises:
            IndexError_: the index folder cannot be written.
            StorageError, IntegrityError: the store cannot be read.
        """
        loaded = self._load()
        if loaded and not check:
            return self
        current = _session_refs(self.store)
        old = {tuple(s["key"]): (i, s) for i, s in enumerate(self.sessions)} if loaded else {}
        keys = sorted(current, key=lambda k: (k[0], k[1], k[2]))
        if loaded and len(old) == len(keys) and all(k in old and old[k][1]["refs"] == current[k] for k in keys):
            return self
        self._rebuild(keys, current, old)
        return self

    def _line(self, rec: Record, si: int) -> bytes:
        return json.dumps([rec.commit, si, rec.role, rec.kind, rec.tool, rec.time, list(rec.branches), rec.block],
                          ensure_ascii=False).encode() + b"\n"

    def _rebuild(self, keys: list[Key], current: dict[Key, dict[str, str]],
                 old: dict[Key, tuple[int, dict[str, Any]]]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        starts_old = [0]
        for s in self.sessions:
            starts_old.append(starts_old[-1] + s["n"])
        texts: list[str] = []
        recs: list[bytes] = []
        kinds = bytearray()
        offs = array.array("q")
        pos = bpos = 0
        sessions: list[dict[str, Any]] = []
        self.rebuilt = []
        for si, key in enumerate(keys):
            n = 0
            if key in old and old[key][1]["refs"] == current[key]:
                oi = old[key][0]
                items: Iterator[tuple[Record, str]] = (
                    (self.record(b), self.block_text(b)) for b in range(starts_old[oi], starts_old[oi + 1]))
            else:
                self.rebuilt.append(key)
                items = ((rec, text.replace(SEP, " ")) for rec, text in _extract(self.store, key))
            for rec, text in items:
                line = self._line(rec, si)
                offs.extend((pos, bpos))
                texts.append(text + SEP)
                recs.append(line)
                kinds.append(_KINDS.index(rec.kind) if rec.kind in _KINDS else 255)
                pos += len(text) + 1
                bpos += len(line)
                n += 1
            sessions.append({"key": list(key), "refs": current[key], "n": n})
        offs.extend((pos, bpos))
        self.text = "".join(texts)
        self._records = b"".join(recs)
        self.kinds = bytes(kinds)
        self.offsets = offs
        self.sessions = sessions
        disk = array.array("q", offs)
        if sys.byteorder != "little":
            disk.byteswap()
        try:
            if os.path.exists(os.path.join(self.folder, "state.json")):
                os.unlink(os.path.join(self.folder, "state.json"))  # a torn update reads as no index
            _write(self.folder, "text", self.text.encode("utf-8"))
            _write(self.folder, "records", self._records)
            _write(self.folder, "offsets", disk.tobytes())
            _write(self.folder, "kinds", self.kinds)
            low = self.text.lower()
            self._lower = low if len(low) == len(self.text) else ""
            _write(self.folder, "lower", self._lower.encode("utf-8"))
            _write(self.folder, "state.json", json.dumps({"version": VERSION, "url": _url(self.store),
                                                         "sessions": sessions}).encode())
        except OSError as e:
            raise IndexError_(f"cannot write the search index in {self.folder}: {e}") from e


def _write(folder: str, name: str, data: bytes) -> None:
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


__all__ = ["Index", "IndexError_", "Record", "index_dir", "open_index"]
