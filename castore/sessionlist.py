"""The sessions of a store, listed from their refs alone: no commit, no history is read.

Two readers share it: :meth:`castore.Store.sessions` (what ``castore status``, ``ls``, fsck
and the adapters list: a :class:`~castore.listing.SessionInfo` per session, from its HEAD and
branch ref) and the readers of derived data (the search index, the usage cache), which compare
each session's refs with what they recorded (:func:`session_refs_and_heads`). Both read every
ref in batches, and neither lets one damaged session hide the others: a garbage ref reads as
absent and what is wrong with it is said (fsck reports it), a HEAD whose branch is lost is
judged by :func:`castore.refnames.lost_branch_problem`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import CorruptRef, EncryptionError, IntegrityError
from .refnames import (
    HEADS,
    META_INFO,
    META_LENGTH,
    META_NAMES,
    META_TIME,
    SessionRefs,
    branches_made_since,
    deleting_since,
    head_segment,
    lost_branch_problem,
    meta_number,
    real_name,
    session_key,
    valid_segment,
)
from .refs import PREFIX as REFS_PREFIX
from .refs import RefStore, RefValue
from .refs import parse as parse_ref

if TYPE_CHECKING:
    from .listing import SessionInfo
    from .objects import Codec

#: a session's refs as :func:`session_refs_and_heads` gives them, by ``(app, user, session)``:
#: its ref folder, its refs (name below the folder -> target), the branch segment HEAD is on
SessionRefsAndHead = dict[tuple[str, str, str], tuple[str, dict[str, str], str | None]]


def sessions_of(refs: RefStore, app_seg: str, user_segs: Sequence[str],
                codec: Callable[[], Codec]) -> list[SessionInfo]:
    """The sessions in ``refs`` of an app's users, by encoded segments, newest first: each
    session's HEAD and branch ref read in two batches. ``codec`` gives the store's codec, which
    opens the sealed info of an encrypted store's sessions (called only for a session that has
    info).

    Raises:
        StorageError: the backend failed.
    """
    from .listing import SessionInfo  # here: a command that lists no session never compiles the dataclass

    heads: list[str] = []
    for useg in user_segs:
        if not valid_segment(useg):
            continue  # not a name castore writes (a foreign or hostile key): never read
        for sseg in refs.list_dir(f"sessions/{app_seg}/{useg}"):
            if valid_segment(sseg):
                heads.append(SessionRefs(f"sessions/{app_seg}/{useg}/{sseg}").head)
    damage: dict[str, str] = {}  # a session's HEAD or branch ref -> what is wrong with it
    got = read_refs_skipping_damage(refs, heads)  # (a garbage HEAD: not listed, fsck reports it)
    branch_refs: dict[str, str] = {}
    segs: dict[str, str] = {}
    for h, v in got.items():
        if v is not None and v.symbolic:
            try:
                segs[h] = head_segment(v)
            except CorruptRef as e:
                damage[h] = str(e)  # a HEAD naming no branch: listed with that (fsck reports it)
                continue
            branch_refs[h] = f"{h.rsplit('/', 1)[0]}/{HEADS}/{segs[h]}"
    tips = read_refs_skipping_damage(refs, list(branch_refs.values()), damage)
    out: list[SessionInfo] = []
    for h, v in got.items():
        if v is None:
            continue
        problem = damage.get(h) or damage.get(branch_refs.get(h, ""))
        if problem is None and h in branch_refs and tips.get(branch_refs[h]) is None:
            problem = _lost_branch(refs, h, segs[h], v)  # absent: never born, or lost (one listing)
        _, aseg, useg, sseg, _ = h.split("/")
        nm = v.meta.get(META_NAMES)
        nm = nm if isinstance(nm, dict) else {}
        tipv = tips.get(branch_refs[h]) if h in branch_refs else (None if v.symbolic else v)
        head = tipv.target if tipv is not None and not tipv.symbolic else None
        branch = None
        if h in segs:
            branch = real_name(segs[h], v.meta)
            if branch == segs[h] and tipv is not None:
                branch = real_name(segs[h], tipv.meta)
        meta = tipv.meta if tipv is not None else {}
        # Ref metadata is a display cache written by any client: a value of the wrong
        # type reads as unknown rather than failing the whole listing.
        info = _opened_info(codec, v.meta.get(META_INFO, {}))
        out.append(
            SessionInfo(
                # names come from the keys; HEAD's copy only fills in a digest it matches
                app=real_name(aseg, {"name": nm.get("app")}),
                user=real_name(useg, {"name": nm.get("user")}),
                session=real_name(sseg, {"name": nm.get("session")}),
                head=head,
                branch=branch,
                updated=_number(meta.get(META_TIME, v.meta.get(META_TIME)), 0.0),
                entries=int(_number(meta.get(META_LENGTH), 0)),
                info=info if isinstance(info, dict) else {},
                problem=problem, deleting=deleting_since(v),
            )
        )
    out.sort(key=lambda s: s.updated, reverse=True)
    return out


def _opened_info(codec: Callable[[], Codec], stored: Any) -> Any:
    """A listed session's info, opened when sealed; {} when it cannot be (no key, an
    erased tenant, damage): a listing shows names, and reads no content it cannot."""
    try:
        return codec().open_meta(stored, META_INFO)
    except (EncryptionError, IntegrityError):
        return {}


def _lost_branch(refs: RefStore, head: str, seg: str, value: RefValue) -> str | None:
    """What fsck and ``status`` say of session HEAD ``head`` naming branch ``seg``, which
    is absent (:func:`castore.refnames.lost_branch_problem`); None: never born."""
    folder = head.rsplit("/", 1)[0]
    why = lost_branch_problem(folder, seg, value, {f"{REFS_PREFIX}/{n}" for n in refs.list(folder)})
    return str(CorruptRef(head, why)) if why is not None else None


def session_refs_and_heads(
        refs: RefStore, folders: Iterable[str] | None = None,
        lost: dict[tuple[str, str, str], CorruptRef] | None = None,
) -> SessionRefsAndHead:
    """Every session's ref folder (``sessions/A/U/S``), refs (name -> target; HEAD too when
    detached) and the branch segment its HEAD is on (None: detached, or not a branch), by
    ``(app, user, session)``: one listing and one batch read, each ref file read once (and the
    branch a HEAD names read again when the listing lacked it: made since, or absent). What a
    reader of derived data (the search index, the usage cache) compares with what it recorded.
    Only the sessions of these ref ``folders`` when given.

    ``lost``: where each session whose HEAD names a lost branch
    (:func:`castore.refnames.lost_branch_problem`, judged from HEAD as stored and the refs
    listed) is noted, key -> the error (fsck's line), whether or not it is in what is
    returned (a session whose only ref left is HEAD is not); so is each session one of whose
    ref files is not a ref (CorruptRef), which is left out of what is returned.

    A session whose HEAD carries the deleting mark (:func:`castore.refnames.deleting_since`:
    a deletion interrupted or under way) is left out, as once its deletion finishes: what
    is derived from it (searched, counted) is what its deletion was asked to remove.

    Raises:
        CorruptRef: (without ``lost``) a session's ref file is not a ref.
        IntegrityError, StorageError.
    """
    if folders is None:
        names_ = refs.list("sessions")
    else:
        names_ = [n for f in sorted(set(folders)) for n in refs.list(f)]
    bad: dict[str, CorruptRef] = {}  # (noted only with lost)
    vals = refs.read_many(names_, None if lost is None else bad)
    out: dict[str, dict[str, str]] = {}
    keys: dict[str, tuple[str, str, str]] = {}
    heads: dict[str, str | None] = {}
    symbolic: dict[str, RefValue] = {}
    for name, v in vals.items():
        if v is None:
            continue
        parts = name.split("/")
        if len(parts) < 5:
            continue
        folder = "/".join(parts[:4])
        if parts[4] == "HEAD":
            if deleting_since(v) is not None:
                continue  # no key: the session is not returned
            keys[folder] = session_key(parts[1:4], v.meta)
            if v.symbolic is not None and len(parts) == 5:
                try:
                    heads[folder] = head_segment(v)
                    symbolic[folder] = v
                except CorruptRef:
                    pass
        if v.symbolic is None:
            out.setdefault(folder, {})[name[len(folder) + 1:]] = v.target
    # a HEAD naming a branch the listing lacks: read again (branches_made_since), then judged
    late = branches_made_since({f"{f}/HEAD": v for f, v in symbolic.items() if f in keys}, set(names_))
    for ref, v in (refs.read_many(late) if late else {}).items():
        f, seg = ref.rsplit("/", 2)[0], ref.rsplit("/", 1)[1]
        if v is not None and v.symbolic is None:
            out.setdefault(f, {})[ref[len(f) + 1:]] = v.target
        elif lost is not None and (why := lost_branch_problem(
                f, seg, symbolic[f], {f"{REFS_PREFIX}/{n}" for n in names_ if n.startswith(f + "/")})):
            lost[keys[f]] = CorruptRef(symbolic[f].name, why)
    for name, e in bad.items():  # (lost is given): noted, and the session left out
        if lost is not None and len(parts := name.split("/")) >= 5:
            folder = "/".join(parts[:4])
            lost[keys.get(folder) or session_key(parts[1:4], {})] = e
            out.pop(folder, None)
    return {keys[f]: (f, refs_, heads.get(f)) for f, refs_ in out.items() if f in keys}


def read_refs_skipping_damage(refs: RefStore, names_: list[str], damage: dict[str, str] | None = None
                              ) -> dict[str, RefValue | None]:
    """Read the refs ``names_`` in one batch; a garbage ref reads as absent (``fsck`` reports
    it; what is wrong with it goes into ``damage``), so that one damaged session does not hide
    the others from a listing.

    Raises:
        StorageError: the backend failed.
    """
    got = refs.storage.read_many([f"{REFS_PREFIX}/{r}" for r in names_])
    out: dict[str, RefValue | None] = {}
    for r in names_:
        raw = got.get(f"{REFS_PREFIX}/{r}")
        try:
            out[r] = parse_ref(r, raw) if raw is not None else None
        except IntegrityError as e:
            out[r] = None
            if damage is not None:
                damage[r] = str(e)
    return out


def _number(value: object, default: float) -> float:
    """``value`` as a finite float if it is a real number, else ``default``."""
    number = meta_number(value)
    return default if number is None else number


__all__ = ["SessionRefsAndHead", "read_refs_skipping_damage", "session_refs_and_heads", "sessions_of"]
