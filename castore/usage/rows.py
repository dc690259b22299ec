"""The usage one session records: a row per model response, each commit read once, on every
branch (:func:`session_rows`), the rows that :mod:`castore.usage.cache` keeps and
:func:`castore.usage.usage` adds up.

A session's refs are walked as paths, root first: the path of the first tip once, each other
tip back to a commit already read. A commit is read by the reader of its source
(:data:`~castore.usage.records.READERS`, from the usage record its importer kept, else from
its raw line), or from its metadata (:func:`~castore.usage.records.meta_usage`); a reader
that keeps state along a path (Codex's) has every path read whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from itertools import repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast

from ..errors import InvalidEntry
from ..objects import json_loads
from .records import READERS, Reader, Response, Walk, kept_record, meta_usage

if TYPE_CHECKING:
    from ..objects import Commit
    from ..store import Store

#: a session's key: ``(app, user, session)``
Key = tuple[str, str, str]


#: the first reader of :data:`READERS` (Claude Code's), whose commits :func:`session_rows` tells
#: inline, and the metadata key of its commits: it is tried first (:func:`_reader_of`), so a commit
#: that has its key is its commit whatever else the metadata holds
_FAST_KEY, _FAST = next(iter(READERS.items()))

#: a row of the cache: [commit, identity, model, time, input, output, cache read, cache write, branch]
Row = list[Any]


#: what :func:`_reader_of` gives a commit its reader passes over (:attr:`Reader.counts`)
_PASSED: tuple[Reader, dict[str, Any], bool] = (Reader(lambda c, m: False, lambda w, i, c, m, d: None), {}, False)


def _reader_of(c: Commit) -> tuple[Reader, dict[str, Any], bool] | None:
    """The reader of commit ``c``, its metadata under the reader's key and whether it needs the
    raw line; :data:`_PASSED` when that reader passes the commit over; None: no reader's
    (:func:`~castore.usage.records.meta_usage` may still find usage)."""
    meta = c.meta
    for k, r in READERS.items():
        m = meta.get(k)
        if isinstance(m, dict) and isinstance(m.get("raw"), str):
            if r.counts is not None and not r.counts(m):
                return _PASSED
            if r.kept is not None and isinstance(m.get(r.kept[1]), list):
                return r, m, False
            return r, m, r.needs_line(c, m)
    return None


def session_rows(store: Store, key: Key, refs: Mapping[str, str] | None = None,
                 current: str | None = None, commits: Mapping[str, Commit] | None = None,
                 visited: set[str] | None = None) -> list[Row]:
    """The responses one session records, each commit once: a row per response.

    The branch a row names is the one HEAD is on when it holds the commit, else the first
    branch by name that does (a commit only a label reaches: the label's name; only a
    detached HEAD: ``HEAD``). ``refs`` and ``current``: the session's refs and the branch
    segment its HEAD is on, as :meth:`~castore.store.Store.session_refs_and_heads` reads them
    (else both are read). ``commits``: commits decoded already, by id (:func:`castore.usage.cache.load_commits`):
    the paths are walked through them, and one that is not there is read. ``visited``: the
    paths are walked through ``commits`` only (one that is not there, or a path whose depths do
    not count it, raises :class:`Elsewhere`: what a share of the store's commits cannot read),
    and the ids of the commits walked are added to it.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
        Elsewhere: (with ``visited``) a commit of the paths is not in ``commits``.
    """
    from ..objects import hex_id

    if refs is None:
        folder = store.session(*key).prefix
        _f, refs, current = store.session_refs_and_heads([folder]).get(key, (folder, {}, None))
    paths: list[list[tuple[str, Commit]]] = []
    names: list[str] = []  # the ref each path was read for
    owner: dict[str, int] = {}  # commit -> the first path that holds it
    # each commit at its first visit, in order, but those their reader passes over: the commits
    # read, unless some reader keeps state along each path (then every path is read whole);
    # each with the place of its row in rows (a commit whose usage record the importer kept
    # is given its row at once)
    firsts: list[tuple[int, str, Commit, tuple[Reader, dict[str, Any], bool] | None]] = []
    rows: list[Row | None] = []
    fast_source, fast_kept = _FAST.kept or ("", "")
    fast_key, fast_counts = _FAST_KEY, _FAST.counts or (lambda m: True)
    stateful = False
    want: list[str] = []
    bodies: list[str] = []
    path_of, commit_of = (store.history.path, store.history.commit) if visited is None else (_elsewhere, _elsewhere)
    decoded = (commits or {}).get
    tips = _tips(refs, current)
    # one commit every ref names (a session with no fork): one path, read root first, each
    # commit once; no bookkeeping of which path each commit is on
    only = tips[0][0] if tips and all(t == tips[0][1] for _n, t in tips) else None
    for name, tip in tips:
        if tip in owner or (only is not None and paths):
            continue
        # a path read once; another tip is walked back to a commit already read
        if not paths:
            path, start = (_decoded_path(decoded, tip) if commits else None) or path_of(tip), 0
        else:
            new: list[tuple[str, Commit]] = []
            cid: str | None = tip
            while cid is not None and cid not in owner:
                c = decoded(cid) or commit_of(cid)
                new.append((cid, c))
                cid = c.parents[0].hex() if c.parents else None
            new.reverse()
            if cid is None:
                path, start = new, 0
            else:
                below = paths[owner[cid]]
                i = _place(below, cid, new[0][1].depth - 1)
                path, start = below[:i + 1] + new, i + 1
        at = len(paths)
        paths.append(path)
        names.append(name)
        part = path[start:] if start else path  # the commits no path before holds
        if visited is not None:
            visited.update(map(_first, part))
        if only is None:
            owner.update(zip(map(_first, part), repeat(at)))
        for cid, c in part:
            # the first reader's commits (a Claude Code session's, all of them) inline: what
            # _reader_of and the kept record would give, without their calls per commit
            m = c.meta.get(fast_key)
            if m.__class__ is dict and m.get("raw").__class__ is str:
                if not fast_counts(m):
                    continue
                rec = m.get(fast_kept)
                if rec.__class__ is list:
                    got_row = kept_record(fast_source, rec, cid, c.time)
                    if got_row is not None:
                        rows.append([cid, *got_row, only or name])
                    continue
            got = _reader_of(c)
            if got is _PASSED:
                continue
            firsts.append((len(rows), cid, c, got))
            rows.append(None)  # its row's place, in the order of the path
            if got is not None:
                stateful = stateful or got[0].stateful
                if got[2]:
                    want.append(got[1]["raw"])
            elif c.body is not None and isinstance(c.meta.get("pm"), dict) and "usage" in c.meta["pm"]:
                bodies.append(hex_id(c.body))
    lines: dict[str, Any] = {}
    if want:  # lines of commits imported before their importer kept the usage record
        from ..adapters.jsonl_tree import read_blobs
    for i in range(0, len(want), 1024):
        for oid, raw in read_blobs(store, want[i:i + 1024]).items():
            with contextlib.suppress(InvalidEntry):
                lines[oid] = json_loads(raw)
    values = {oid: getattr(v, "value", None) for oid, v in store.objects.get_many(bodies).items()} if bodies else {}

    def read(cid: str, c: Commit, got: tuple[Reader, dict[str, Any], bool] | None, w: Walk) -> Response | None:
        if got is None:
            return meta_usage(cid, c, values.get(hex_id(c.body)) if c.body is not None else None)
        reader, m, needs = got
        d = lines.get(m["raw"]) if needs else None
        return reader.read(w, cid, c, m, d if isinstance(d, dict) else None)

    def row_of(cid: str, r: Response | None) -> Row | None:
        if r is None:
            return None
        t = r.tokens
        return [cid, r.identity, r.model, r.time, t.input, t.output, t.cache_read, t.cache_write,
                only or names[owner[cid]]]

    if not stateful or only is not None:  # each commit read once, where it was first visited
        w = Walk()
        for at, cid, c, got in firsts:
            kept = got[0].kept if got is not None else None
            if kept is not None:  # the usage record the importer kept: no call to the reader
                rec = got[1].get(kept[1])  # type: ignore[index]  # got is not None with kept
                if isinstance(rec, list):
                    got_row = kept_record(kept[0], rec, cid, c.time)
                    if got_row is not None:
                        rows[at] = [cid, *got_row, only or names[owner[cid]]]
                    continue
            rows[at] = row_of(cid, read(cid, c, got, w))
        return [r for r in rows if r is not None] if firsts else cast("list[Row]", rows)
    rows = []  # every path read again, root first
    done: set[str] = set()
    for path in paths:
        w = Walk()
        for cid, c in path:
            got = _reader_of(c)
            if got is _PASSED:
                continue
            if cid not in done:
                done.add(cid)
                rows.append(row_of(cid, read(cid, c, got, w)))
            elif got is not None and got[0].stateful:  # read again only for the state of this path's walk
                read(cid, c, got, w)
    return [r for r in rows if r is not None]


_first = itemgetter(0)


class Elsewhere(Exception):  # not an error: where a share's walk stops
    """A commit :func:`session_rows` needs is not among the commits it was given to walk
    through alone (``visited``): the session is read by who holds them all."""


def _elsewhere(cid: str) -> Any:
    raise Elsewhere(cid)


def _place(path: list[tuple[str, Commit]], cid: str, depth: int) -> int:
    """Where commit ``cid`` (of ``depth``, if the depths count the path) is on ``path``."""
    if 0 <= depth < len(path) and path[depth][0] == cid:
        return depth
    return next(i for i, (x, _c) in enumerate(path) if x == cid)


def _decoded_path(decoded: Callable[[str], Commit | None], tip: str) -> list[tuple[str, Commit]] | None:
    """The path root -> ``tip`` through the commits ``decoded`` gives, or None when one is not
    there or the depths do not count the path (then the history reads it, and says what is
    wrong)."""
    out: list[tuple[str, Commit]] = []
    add = out.append
    cid: str | None = tip
    depth = -1
    while cid is not None:
        c = decoded(cid)
        if c is None or (depth >= 0 and c.depth != depth - 1):
            return None
        add((cid, c))
        depth = c.depth
        cid = c.parents[0].hex() if c.parents else None
    if depth != 0:
        return None
    out.reverse()
    return out


def _tips(refs: Mapping[str, str], current: str | None) -> list[tuple[str, str]]:
    """``(name, commit)`` of what a session's refs (name -> target, as
    :meth:`~castore.store.Store.session_refs` reads them) name, in the order rows are given a
    branch: the branch HEAD is on (segment ``current``), the other branches by name, the
    labels, a detached HEAD."""
    from ..refnames import real_name

    ranked: list[tuple[tuple[int, str], str]] = []
    for rel, target in refs.items():
        kind, _, seg = rel.partition("/")
        if rel == "HEAD":
            ranked.append(((3, "HEAD"), target))
        elif kind in ("heads", "tags") and seg and "/" not in seg:
            rank = (0 if seg == current else 1) if kind == "heads" else 2
            ranked.append(((rank, real_name(seg, None)), target))
    ranked.sort()
    return [(n, t) for (_r, n), t in ranked]




__all__ = ["Elsewhere", "Key", "Row", "session_rows"]
