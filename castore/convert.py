"""Copy a store into another whose objects have other ids: ``castore encrypt``.

In an encrypted store every id is a keyed hash under its tenant's key, so every object of
a plain store gets a new id there, and every object that names another by id must be
written again with the new ids. :func:`convert` does that, tenant by tenant (the apps' own
tenants first: their users' commits name their app-state commits):

* **Exact links** are rewritten field by field: a commit's ``parents``, ``body``, ``state``,
  ``scopes`` (``app``: a commit of the app's own tenant) and ``index``; a tree's ``refs``
  and ``sub``; an index's ``segments``; a segment's ``objects`` (canonical bytes of commits
  and bodies: each is replaced by its converted copy's canonical bytes).
* **Anything else id-shaped** is rewritten by one generic rule: in a commit's ``meta`` and
  ``delta``, a tree's inline ``values``, a value's contents and a ref's metadata, every
  string of 64 lowercase hex characters and every ``bytes`` of 32 that is the id of an
  object stored in the source tenant names that object, and becomes its converted copy's
  id (an archived line's ``raw`` blob, a reflog entry's ``old``/``new`` tip, a read hint's
  ``tl``/``ix``, whatever an adapter keeps). Strings and bytes of that shape that name no
  stored object stay as they are; an id embedded in a longer string is not seen.

Objects are converted in post-order (what an object names before it) with an explicit
stack, never by recursion, so a session of any length converts; each object once per
tenant (memoized). Only what a ref reaches is copied. Refs are written last, through the
destination's write path (:meth:`castore.plumbing.Plumbing.swap`), each only where it does
not exist yet: a run that stopped half way can be run again and finishes the copy. The
source is only read. :func:`compare` checks the copy afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from . import names
from . import objects as o
from .errors import CastoreError, IntegrityError
from .history import HINT_FACTS, HINT_PACKS
from .objects import Blob, Commit, Index, ObjectId, Segment, Tree, Value
from .refnames import META_INFO, META_WRITE_ID, SESSIONS, STATE, parse_ref_name, real_name
from .store import Store

#: converted objects are written in groups of about this many canonical bytes
WRITE_BYTES = 4 << 20
#: how deep the generic rule looks into nested dicts and lists
_GENERIC_DEPTH = 64
#: ref metadata a copy does not keep: the source's write id and its pack names (the
#: destination's packs have other names; a cold reader lists them once instead)
_DROPPED_META = (META_WRITE_ID, HINT_PACKS)
#: ref metadata an encrypted store seals (:meth:`Codec.seal_meta <castore.objects.Codec.seal_meta>`)
_SEALED_META = (META_INFO, HINT_FACTS)


def _opened(meta: Mapping[str, Any], codec: o.Codec) -> dict[str, Any]:
    """Ref metadata with the values a codec seals there (a session's info, the read hint's
    facts) opened: their ids can then be rewritten, and sealed again by the new codec."""
    return {k: codec.open_meta(v, k) if k in _SEALED_META else v for k, v in meta.items()}


def _sealed(meta: Mapping[str, Any], codec: o.Codec) -> dict[str, Any]:
    """Ref metadata as the store of ``codec`` keeps it (an encrypted one seals what
    docs/FORMAT.md 15 lists as sealed)."""
    return {k: codec.seal_meta(v, k) if k in _SEALED_META else v for k, v in meta.items()}


class ConvertError(CastoreError, ValueError):
    """A store cannot be converted into that destination (it holds data, or is the source)."""


@dataclass
class ConvertReport:
    """What :func:`convert` copied."""

    tenants: int = 0
    sessions: int = 0
    refs: int = 0
    refs_present: int = 0
    objects: int = 0
    bytes: int = 0
    #: differences :func:`compare` found (empty when the copy reads as the source)
    differences: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (``--json``)."""
        return asdict(self)


_Key = tuple[str, str]  # (app segment, user segment) of a destination tenant


class _Pair:
    """One tenant: where its objects are read (``src``) and written (``dst``)."""

    def __init__(self, key: _Key, src: Store, dst: Store) -> None:
        self.key, self.src, self.dst = key, src, dst
        self.new: dict[str, str] = {}  # source id -> converted id (this tenant's)
        self.pending: dict[ObjectId, bytes] = {}  # converted, not written yet
        self.pending_bytes = 0


def _home(ref: str) -> _Key | None:
    """The tenant of a ref name castore writes (None: not one)."""
    p = parse_ref_name(ref)
    return None if p is None else p.tenant


def _id_shaped(value: Any) -> Iterator[str]:
    """The hex form of every id-shaped leaf of ``value`` (see the module doc), depth first."""
    todo: list[tuple[Any, int]] = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        if isinstance(v, str):
            if len(v) == 64 and o.is_hex_id(v):
                yield v
        elif isinstance(v, (bytes, bytearray, memoryview)):
            if len(v) == 32:
                yield bytes(v).hex()
        elif depth < _GENERIC_DEPTH:
            if isinstance(v, dict):
                todo.extend((x, depth + 1) for x in v.values())
            elif isinstance(v, (list, tuple)):
                todo.extend((x, depth + 1) for x in v)


def _remapped(value: Any, new: Mapping[str, str], depth: int = 0) -> Any:
    """``value`` with every id-shaped leaf found in ``new`` replaced by its converted id."""
    if isinstance(value, str):
        return new.get(value, value) if len(value) == 64 else value
    if isinstance(value, (bytes, bytearray)):
        if len(value) == 32:
            got = new.get(bytes(value).hex())
            return bytes.fromhex(got) if got is not None else value
        return value
    if depth >= _GENERIC_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _remapped(v, new, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_remapped(v, new, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_remapped(v, new, depth + 1) for v in value)
    return value


class _Converter:
    def __init__(self, src: Store, dst: Store, progress: Callable[[str, int], None] | None) -> None:
        self.src, self.dst, self.progress = src, dst, progress
        self.pairs: dict[_Key, _Pair] = {}
        self.report = ConvertReport()
        self._done = 0

    def pair(self, key: _Key) -> _Pair:
        got = self.pairs.get(key)
        if got is None:
            got = self.pairs[key] = _Pair(key, self.src.tenant_at(*key), self.dst.tenant_at(*key))
        return got

    # -- reading the source ----------------------------------------------------------------
    def _children(self, t: _Pair, oid: str, obj: Any) -> list[tuple[_Pair, str]]:
        """What ``obj`` names, each with the tenant it lives in: exact links must be stored,
        generic ones count only when they are (they are read here in one batch)."""
        exact: list[str] = []
        generic: list[str] = []
        foreign: list[tuple[_Pair, str]] = []
        if isinstance(obj, Commit):
            exact += [p.hex() for p in obj.parents]
            exact += [x.hex() for x in (obj.body, obj.state, obj.index) if x is not None]
            for scope, s in obj.scopes.items():
                if scope == "app" and t.key[1] != names.APP_SCOPE:
                    foreign.append((self.pair((t.key[0], names.APP_SCOPE)), s.hex()))
                else:
                    exact.append(s.hex())
            generic += _id_shaped(obj.meta)
            generic += _id_shaped(obj.delta)
        elif isinstance(obj, Tree):
            exact += [r.hex() for r in obj.refs.values()] + [r.hex() for r in obj.sub.values()]
            generic += _id_shaped(obj.values)
        elif isinstance(obj, Index):
            exact += [s.hex() for s in obj.segments]
        elif isinstance(obj, Segment):
            exact += t.src.objects.codec.digest_many(list(obj.objects))
        elif isinstance(obj, Value):
            generic += _id_shaped(obj.value)
        exact = [x for x in dict.fromkeys(exact) if x not in t.new]
        generic = [x for x in dict.fromkeys(generic) if x not in t.new and x != oid and x not in exact]
        found = t.src.objects.get_many(exact + generic, missing_ok=True) if exact or generic else {}
        for x in exact:
            if x not in found:
                raise t.src.objects.missing_error(x)  # not found, or in a damaged pack record
        out = [(t, x) for x in exact] + [(t, x) for x in generic if x in found]
        return out + [(p, x) for p, x in foreign if x not in p.new]

    # -- converting ------------------------------------------------------------------------
    def convert(self, t: _Pair, root: str) -> str:
        """The converted id of ``root`` in tenant ``t``, converting what it reaches first.

        Raises:
            ObjectNotFound: an object named by an exact link is missing in the source.
            IntegrityError: a link loop (a corrupt source). StorageError.
        """
        if root in t.new:
            return t.new[root]
        stack: list[tuple[_Pair, str, bool]] = [(t, root, False)]
        opened: set[tuple[_Key, str]] = set()
        while stack:
            p, oid, expanded = stack.pop()
            if oid in p.new:
                continue
            obj = p.src.objects.get(oid)
            if not expanded:
                if (p.key, oid) in opened:
                    raise IntegrityError(oid, "objects name each other in a loop")
                opened.add((p.key, oid))
                stack.append((p, oid, True))
                stack.extend((q, x, False) for q, x in self._children(p, oid, obj))
                continue
            opened.discard((p.key, oid))
            self._write(p, oid, self._rewrite(p, obj))
        return t.new[root]

    def _rewrite(self, t: _Pair, obj: Any) -> Any:
        """``obj`` with its links replaced by the converted ids (its children are converted)."""
        new = t.new

        def one(x: bytes) -> bytes:
            return bytes.fromhex(new[x.hex()])

        if isinstance(obj, Commit):
            scopes = {}
            for scope, s in obj.scopes.items():
                home = self.pairs[(t.key[0], names.APP_SCOPE)] if scope == "app" and t.key[1] != names.APP_SCOPE \
                    else t
                scopes[scope] = bytes.fromhex(home.new[s.hex()])
            return Commit(kind=obj.kind, parents=tuple(one(x) for x in obj.parents),
                          body=one(obj.body) if obj.body is not None else None,
                          state=one(obj.state) if obj.state is not None else None,
                          delta=_remapped(obj.delta, new), unset=obj.unset, scopes=scopes, author=obj.author,
                          time=obj.time, meta=_remapped(obj.meta, new), depth=obj.depth,
                          index=one(obj.index) if obj.index is not None else None)
        if isinstance(obj, Tree):
            return Tree(values=_remapped(obj.values, new), refs={k: one(v) for k, v in obj.refs.items()},
                        sub={k: one(v) for k, v in obj.sub.items()})
        if isinstance(obj, Index):
            return Index(segments=tuple(one(x) for x in obj.segments))
        if isinstance(obj, Segment):
            ids = [new[x] for x in t.src.objects.codec.digest_many(list(obj.objects))]
            canon = self._canonical(t, ids)
            return Segment(start=obj.start, objects=tuple(canon[x] for x in ids))
        if isinstance(obj, Value):
            return Value(_remapped(obj.value, new))
        if isinstance(obj, Blob):
            return obj
        raise IntegrityError("?", f"unknown object {type(obj).__name__}")

    def _canonical(self, t: _Pair, ids: list[str]) -> dict[str, bytes]:
        """Converted canonical bytes by id: pending ones from memory, the others read back."""
        out: dict[str, bytes] = {x: t.pending[ObjectId(x)] for x in ids if x in t.pending}
        rest = [x for x in ids if x not in out]
        if rest:
            out.update(t.dst.objects.get_canonical_many(rest))
        return out

    def _write(self, t: _Pair, oid: str, obj: Any) -> None:
        nid, canonical = t.dst.objects.codec.encode(obj)
        t.new[oid] = nid
        if nid not in t.pending:
            t.pending[nid] = canonical
            t.pending_bytes += len(canonical)
        self._done += 1
        if self.progress is not None and self._done % 1000 == 0:
            self.progress("objects", self._done)
        if t.pending_bytes >= WRITE_BYTES:
            self.flush(t)

    def flush(self, t: _Pair) -> None:
        """Write the tenant's pending converted objects (one group)."""
        if not t.pending:
            return
        self.report.objects += len(t.pending)
        self.report.bytes += t.dst.plumbing.write(t.pending)
        t.pending, t.pending_bytes = {}, 0

    # -- refs ------------------------------------------------------------------------------
    def refs_of(self) -> dict[_Key, list[str]]:
        """The source's refs castore writes, by destination tenant (apps' own tenants first)."""
        listed: list[str] = []
        for st in self.src.stores():
            listed += st.refs.list(SESSIONS) + st.refs.list(STATE)
        out: dict[_Key, list[str]] = {}
        for ref in listed:
            key = _home(ref)
            if key is not None:
                out.setdefault(key, []).append(ref)
        return dict(sorted(out.items(), key=lambda kv: (kv[0][1] != names.APP_SCOPE, kv[0])))

    def copy_tenant(self, key: _Key, refs: list[str]) -> None:
        t = self.pair(key)
        values = t.src.refs.read_many(sorted(refs))
        have = t.dst.refs.read_many(sorted(refs))
        moves: list[tuple[str, str, dict[str, Any]]] = []
        for ref, v in values.items():
            if v is None:
                continue  # deleted since the listing
            if v.symbolic is None:
                self.convert(t, v.target)
            opened = _opened(v.meta, t.src.objects.codec)
            for x in _id_shaped(opened):
                if x not in t.new and t.src.objects.get_many([x], missing_ok=True):
                    self.convert(t, x)
            meta = _remapped({k: m for k, m in opened.items() if k not in _DROPPED_META}, t.new)
            target = v.target if v.symbolic is not None else t.new[v.target]
            moves.append((ref, target, _sealed(meta, t.dst.objects.codec)))
        self.flush(t)
        # branches before HEAD: a HEAD lands only where its branch does
        moves.sort(key=lambda m: m[0].endswith("/HEAD"))
        for ref, target, meta in moves:
            cur = have.get(ref)
            if cur is not None:
                if cur.target != target:
                    raise ConvertError(f"{self.dst.url}: ref {ref} is there already and names {cur.target[:12]}, "
                                       f"not the converted {target[:12]}: convert into a new store")
                self.report.refs_present += 1
                continue
            t.dst.plumbing.swap(ref, target, None, meta)
            self.report.refs += 1
        self.report.sessions += len({p.session_prefix for r in refs if (p := parse_ref_name(r)) is not None
                                     and p.session_prefix is not None})

    def run(self) -> ConvertReport:
        by_tenant = self.refs_of()
        self.report.tenants = len(by_tenant)
        for key, refs in by_tenant.items():
            self.copy_tenant(key, refs)
            if self.progress is not None:
                self.progress("tenants", list(by_tenant).index(key) + 1)
        return self.report


def _empty(store: Store) -> bool:
    """Whether ``store`` holds no ref (a new, or a freshly created, destination)."""
    return not any(st.refs.list(SESSIONS) or st.refs.list(STATE) for st in store.stores())


#: castore.json key of a destination being written: the source's URL (a run that stopped
#: half way leaves it; the next run into that destination from that source goes on)
CONVERTING = "converting"


def convert(src: Store, dst: Store, *, check: bool = True,
            progress: Callable[[str, int], None] | None = None) -> ConvertReport:
    """Copy every session (branches, labels, HEAD attached or detached, remote-tracking tips,
    the reflog) and the app and user state of ``src`` into ``dst``, whose objects have other
    ids (an encrypted store: ``castore.open(url, encrypted=True)``), tenant by tenant; see
    the module doc for how ids are rewritten. ``src`` is only read.

    ``dst`` must hold no session or state, unless an earlier run of this conversion (from
    the same source URL) stopped before its end: then this run goes on, writing only the
    refs not there yet (each must name what this run converts).

    Args:
        check: afterwards compare the copy with the source (:func:`compare`); the
            differences are in the report (empty: the copy reads as the source).
        progress: called with ``(phase, count)``: ``objects`` converted, ``tenants`` done.

    Raises:
        ConvertError: ``dst`` is ``src``, or holds sessions or state of its own, or a
            ref there names something else.
        StoreNotFound: no store at ``src``.
        ObjectNotFound, IntegrityError: the source is damaged (``castore fsck`` says where).
        EncryptionError: ``dst``'s keys are missing or wrong. StorageError.
    """
    src.require()
    if src.url == dst.url:
        raise ConvertError(f"{dst.url} is the store being converted: name a new one")
    dst.init()
    if dst.config.get(CONVERTING) != src.url:
        if not _empty(dst):
            raise ConvertError(f"{dst.url} already holds sessions or state: convert into a new, empty store")
        dst.update_config(lambda c: {**c, CONVERTING: src.url})
    if src.objects.format >= 2:
        for st in src.stores():
            st.objects.refresh()
    report = _Converter(src, dst, progress).run()
    dst.update_config(lambda c: {k: v for k, v in c.items() if k != CONVERTING})
    if check:
        report.differences = compare(src, dst)
    return report


# -- checking a copy ---------------------------------------------------------------------------
def _session_keys(store: Store) -> list[tuple[str, str, str]]:
    keys = set()
    for st in store.stores():
        for ref in st.refs.list(SESSIONS):
            p = parse_ref_name(ref)
            if p is not None and p.session is not None:
                keys.add((p.app, p.user or "", p.session))
    return sorted(keys)


def _session_view(store: Store, key: tuple[str, str, str]) -> dict[str, Any]:
    """What a reader of one session sees, without ids: per branch and label its log,
    context, state and entry count; HEAD; the reflog's moves; the remote-tracking tips."""
    app, user, sess = (real_name(k, None) for k in key)
    s = store.session(app, user, sess)
    out: dict[str, Any] = {"head": s.current_branch, "info": _no_ids(s.info)}
    revs: dict[str, str] = {f"branch {b}": b for b in s.branches()} | {f"label {x}": c for x, c in s.labels().items()}
    revs["HEAD"] = "HEAD"
    for what, rev in sorted(revs.items()):
        entries = s.entries(rev)
        out[what] = {
            "entries": len(entries),
            "log": [_no_ids(_entry_view(e)) for e in s.log(rev)],
            "context": _no_ids(o.to_builtins(_context_view(s.context(rev)))),
            "state": _no_ids(s.state(rev)),
        }
    out["remotes"] = sorted(s.remote_branches())
    out["reflog"] = [(r.get("ref"), r.get("why")) for r in s.reflog()]
    return out


def _entry_view(e: Any) -> Any:
    return o.to_builtins({"kind": e.kind, "author": e.author, "time": e.time, "entry": e.entry, "meta": e.meta,
                          "delta": e.delta, "unset": e.unset, "depth": e.depth, "parents": len(e.parents)})


def _context_view(c: Any) -> Any:
    return {"messages": c.messages, "model": c.model, "provider": c.provider, "thinking": c.thinking_level,
            "tokens": c.tokens}


def _no_ids(value: Any) -> Any:
    """``value`` with every id-shaped leaf replaced by a placeholder (ids differ by design)."""
    if isinstance(value, str) and len(value) == 64 and o.is_hex_id(value):
        return "<id>"
    if isinstance(value, (bytes, bytearray)) and len(value) == 32:
        return "<id>"
    if isinstance(value, str) and len(value) == 44 and value.endswith("="):
        return "<id>"  # 32 bytes as to_builtins writes them (base64)
    if isinstance(value, dict):
        return {k: _no_ids(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_ids(v) for v in value]
    return value


def compare(src: Store, dst: Store) -> list[str]:
    """How ``dst`` (a converted copy) reads differently from ``src``: the sessions each
    holds, and per session its HEAD, info, remote-tracking tips, reflog moves, and at every
    branch and label the entry count, log, context and state (ids aside, which differ by
    design); the app and user states; and ``castore fsck`` of ``dst``. Empty: the same.

    Raises:
        StorageError, EncryptionError: a store cannot be read.
    """
    from .maintenance import fsck

    out: list[str] = []
    keys = _session_keys(src)
    if keys != _session_keys(dst):
        out.append(f"sessions differ: {len(keys)} in the source, {len(_session_keys(dst))} in the copy")
    for key in keys:
        try:
            a, b = _session_view(src, key), _session_view(dst, key)
        except CastoreError as e:
            out.append(f"session {'/'.join(key)}: {e}")
            continue
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                out.append(f"session {'/'.join(key)}: {k} differs")
    for app_seg in sorted({k[0] for k in keys} | {a for a, _ in _scope_keys(src)}):
        app = real_name(app_seg, None)
        if _no_ids(src.app_state(app)) != _no_ids(dst.app_state(app)):
            out.append(f"app state of {app} differs")
    for app_seg, user_seg in _scope_keys(src):
        if user_seg is None:
            continue
        app, user = real_name(app_seg, None), real_name(user_seg, None)
        if _no_ids(src.user_state(app, user)) != _no_ids(dst.user_state(app, user)):
            out.append(f"user state of {app}/{user} differs")
    report = fsck(dst)
    if not report.ok:
        out.append(f"fsck of the copy finds damage: {report.to_dict()}")
    return out


def _scope_keys(store: Store) -> list[tuple[str, str | None]]:
    out = set()
    for st in store.stores():
        for ref in st.refs.list(STATE):
            p = parse_ref_name(ref)
            if p is not None and p.remote is None:
                out.add((p.app, p.user))
    return sorted(out, key=lambda k: (k[0], k[1] or ""))


__all__ = ["ConvertError", "ConvertReport", "compare", "convert"]
