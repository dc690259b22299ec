"""Deleting a session: the one rule, used by ``Store.delete_session`` (``castore
delete-session``, the adapters' deletes, a LangGraph thread prune) and ``castore expire``.

A session's refs cannot go in one atomic step, and every order leaves something a crash
can strand: its current branch must go first (a writer appending meanwhile then loses its
compare-and-swap instead of writing on), and HEAD last (refs without a HEAD are listed by
nothing). A deletion killed between the two used to leave HEAD with its born mark and no
branch, which fsck calls a lost branch and gc refuses the whole store for. So a deletion
states its intent first, as git's and dulwich's ref transactions do: it moves HEAD, by
compare-and-swap, to carry :data:`~castore.refnames.META_DELETING` (the time) and
:data:`~castore.refnames.META_DELETING_REFS` (what the other refs named), then deletes the
branch HEAD names, the other refs, and HEAD (docs/FORMAT.md, "Deleting a session").

An interrupted deletion is then recognisably one: fsck lists it (``deleting``) with the
command that finishes it, gc is not refused (the refs left are roots as any; what the
deleted ones held is garbage by intent), a write that reads the marked HEAD is refused
(:class:`~castore.errors.SessionDeleting`) rather than starting a new branch in a
half-deleted session, and running the deletion again, or ``castore expire``, finishes it
unless a ref was written since the mark (:func:`written_since`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from .errors import CorruptRef, RefConflict, SessionDeleting
from .plumbing import Plumbing
from .refnames import (
    DELETING_KEYS,
    HEADS,
    META_DELETING,
    META_DELETING_REFS,
    SessionRefs,
    carried_meta,
    deleting_since,
    head_segment,
    parse_ref_name,
    session_key,
    symbolic_to,
)
from .refs import RefValue


class _Moved(Exception):
    """With ``expect`` (expire), a ref moved or appeared since the session was judged idle."""


def finish_hint(head_name: str, head: RefValue) -> str:
    """fsck's line for the session whose HEAD ``head_name`` is ``head``, marked deleting: the
    deletion was interrupted, and the command that finishes it."""
    return finish_line(head_key(head_name, head.meta))


def head_key(head_name: str, meta: Mapping[str, Any]) -> tuple[str, str, str]:
    """The ``(app, user, session)`` of the session whose HEAD is ``head_name`` with ``meta``,
    by its folder (:func:`~castore.refnames.session_key`). Raises nothing."""
    parsed = parse_ref_name(head_name)
    segs = (parsed.app, parsed.user or "", parsed.session or "") if parsed is not None else ("?", "?", "?")
    return session_key(segs, meta)


def finish_line(key: tuple[str, ...]) -> str:
    """What fsck, ``castore sessions``, ``status`` and the viewer's list say of the session
    ``key`` (``(app, user, session)``) whose deletion was interrupted. Raises nothing."""
    return f"deletion interrupted: finish it with `castore delete-session {'/'.join(key)}`"


def stranded(session: str, head: RefValue | None, refs: Collection[str]) -> str | None:
    """fsck's line (:func:`finish_hint`) when ``head``, the HEAD of the session whose ref
    folder is ``session``, carries the deleting mark and names a branch absent from ``refs``
    (the session's ref names, as listed): its deletion was interrupted after the branch went,
    and what is left of it (other branches, labels) is no session: a copy would land without
    HEAD, refs nothing lists (push, pull and clone copy nothing of it). None otherwise.
    Raises nothing."""
    if head is None or head.symbolic is None or deleting_since(head) is None:
        return None
    try:
        branch = f"{session}/{HEADS}/{head_segment(head)}"
    except CorruptRef:
        return None
    return None if branch in refs else finish_hint(head.name, head)


def delete_session_refs(plumbing: Plumbing, prefix: str, expect: Mapping[str, RefValue] | None = None) -> bool:
    """Delete the refs of the session whose ref folder is ``prefix`` (``sessions/a/u/s``):
    mark HEAD deleting (with what the other refs name as read before: ``expect``'s values, or
    read now; a session with refs and no HEAD gets a marked HEAD), delete its current branch,
    then its other refs, then HEAD, each by compare-and-swap of its value as read. A deletion
    interrupted earlier is finished. A writer whose first commit lands meanwhile reads the
    marked HEAD and takes it back (:class:`castore.Session`): no branch is left behind, listed
    by nothing, for the next session of the name to start on.

    Without ``expect`` (``delete-session``) a ref a rival moved meanwhile is read again and
    deleted still: the deletion was asked for. With ``expect`` (``expire``: each ref's value
    as read when the session was judged idle), a ref that moved or appeared since stops the
    deletion: HEAD's mark is taken off again (if HEAD is still as marked) and what is left stays.

    Returns:
        False when nothing was found (no ref under ``prefix``) or, with ``expect``, when the
        session changed; True when its refs are gone.

    Raises:
        RefContended: without ``expect``, rivals kept moving a ref (under the store's retry
            policy, :meth:`~castore.plumbing.Plumbing.land`). RefLocked. StorageError.
    """
    refs = plumbing.refs
    head_name = f"{prefix}/HEAD"
    strict = expect is not None
    if expect is None:
        listed = [n for n in refs.list(prefix) if n != head_name and parse_ref_name(n) is not None]
        before: Mapping[str, RefValue | None] = refs.read_many(listed)
    else:
        before = expect
    tips = {n[len(prefix) + 1:]: v.target for n, v in before.items() if n != head_name and v is not None}

    def mark(_: int) -> RefValue | None:
        head = refs.read(head_name)
        if expect is not None and not _same(head, expect.get(head_name)):
            raise _Moved
        if deleting_since(head) is not None or head is None and not tips:
            return head
        # No HEAD but refs (a first append between its branch and its HEAD): a marked HEAD is
        # made, which the writer's HEAD then loses to (else it named a branch deleted here).
        target = head.target if head is not None else symbolic_to("main")
        try:
            return plumbing.swap(head_name, target, head,
                                 {**carried_meta(head), META_DELETING: time.time(), META_DELETING_REFS: tips})
        except RefConflict:  # a rival's checkout, set_info or first HEAD: read again (expire: stop)
            if strict:
                raise _Moved from None
            raise

    try:
        head = plumbing.land(head_name, mark)
    except _Moved:
        return False
    names = [n for n in refs.list(prefix) if n != head_name and parse_ref_name(n) is not None]  # never a foreign name
    if head is None and not names:
        return False
    try:
        first = f"{prefix}/{HEADS}/{head_segment(head)}" if head is not None and head.symbolic else None
    except CorruptRef:
        first = None  # HEAD names no branch: nothing to delete first
    for name in sorted(names, key=lambda n: (n != first, n)):
        if not _delete(plumbing, name, None if expect is None else expect.get(name), expect is not None):
            _unmark(plumbing, head_name, head)
            return False
    if head is not None:
        _delete(plumbing, head_name, None, False)  # marked: nothing but a deletion moves it now
    return True


def first_commit_head(plumbing: Plumbing, key: tuple[str, str, str], landed: RefValue, target: str,
                      meta: Mapping[str, Any], had_head: bool) -> RefValue | None:
    """Settle HEAD once a session's first commit ``landed`` on its branch: HEAD made
    (``target``, ``meta``) when the session had none, or made again when a deletion deleted it
    meanwhile; HEAD made by ``set_info`` (``had_head``) or by another writer first is given the
    born mark (:meth:`~castore.plumbing.Plumbing.mark_born`). The one rule of every writer that
    makes a session's first branch: an append, a ``reset`` or ``checkout -b`` of a session with
    no HEAD, a ``fork``, an import's tree (:meth:`castore.Session.tree`), a push, pull or clone copying a
    session new to its destination (:mod:`castore.sync`), LangGraph's first checkpoint of a thread.

    A first commit racing a deletion must not outlive it in part. The deletion lists the refs
    once HEAD is marked, and would leave a branch made after that listing behind HEAD's deletion,
    listed by nothing, for the next session of the name to start on: HEAD found marked
    deleting, the branch is deleted again. A HEAD made here while the branch is gone (a
    deletion ran whole in between) names a lost branch: it is deleted again. Each by
    compare-and-swap (whoever moved it since decides).

    Returns:
        HEAD as made here; None when it was there (made by ``set_info`` or another writer).

    Raises:
        SessionDeleting: either race (``finished`` in the second). StorageError.
    """
    parsed = parse_ref_name(landed.name)
    assert parsed is not None and parsed.session_prefix is not None
    refs = SessionRefs(parsed.session_prefix)
    head = plumbing.mark_born(refs, landed.name) if had_head else None
    made = None
    if head is None:
        try:
            head = made = plumbing.swap(refs.head, target, None, meta)
        except RefConflict:  # another writer's HEAD made first (a first append's, a set_info's, a deletion's)
            head = plumbing.mark_born(refs, landed.name)
    if made is not None:
        if plumbing.refs.read(landed.name) is not None:
            return made
        drop, finished = made, True
    elif deleting_since(head) is not None:
        drop, finished = landed, False
    else:
        return None
    with contextlib.suppress(RefConflict):
        plumbing.delete(drop.name, drop)
    raise SessionDeleting(key, finished)


def _same(now: RefValue | None, then: RefValue | None) -> bool:
    return (now is None) == (then is None) and (
        now is None or then is None or (now.target, now.meta) == (then.target, then.meta))


def _delete(plumbing: Plumbing, name: str, then: RefValue | None, strict: bool) -> bool:
    """Delete ``name`` by compare-and-swap of its value read now (when ``strict``, only if
    that is ``then``), a lost race read again under the store's retry policy; False when
    ``strict`` and it moved."""

    def attempt(_: int) -> None:
        now = plumbing.refs.read(name)
        if now is None:
            if strict and then is not None:
                raise _Moved
            return
        if strict and not _same(now, then):
            raise _Moved
        try:
            plumbing.delete(name, now)
        except RefConflict:
            if strict:
                raise _Moved from None
            raise

    try:
        plumbing.land(name, attempt)
    except _Moved:
        return False
    return True


def written_since(head: RefValue, refs: Mapping[str, RefValue], when: float | None) -> bool:
    """Whether a ref of the session whose HEAD ``head`` carries the deleting mark was written
    after the mark: ``refs`` (its refs, name -> value, as read) holds one that names something
    else than the mark records (:data:`~castore.refnames.META_DELETING_REFS`), or that it does
    not record. Not told by times: an entry's time is its writer's (an import keeps the
    transcript's), so a write after the mark may be dated long before it, and a branch left
    untouched may be dated ahead. A mark without the record (castore of 2026-12-07 before it)
    is judged by ``when``, the newest time the refs record, against the mark's. Raises nothing."""
    tips = head.meta.get(META_DELETING_REFS)
    if not isinstance(tips, dict):
        marked = deleting_since(head)
        return when is not None and marked is not None and when > marked
    base = head.name[:-len("HEAD")]
    return any(tips.get(n[len(base):]) != v.target
               for n, v in refs.items() if n.startswith(base) and n != head.name)


def rewritten(head: RefValue, moved: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The deleting mark of ``head`` as it is to stay on HEAD after a rewrite of the session's
    history (``castore redact``) moved its refs ``moved`` (ref name -> ``(old, new)``): the record
    of what the refs named (:data:`~castore.refnames.META_DELETING_REFS`) follows each move it
    records. A rewrite is not a write after the mark: without this, :func:`written_since` reads
    it as one, and expire keeps the session the user deleted, taking the mark off. Empty for a
    HEAD without the mark. Raises nothing."""
    if deleting_since(head) is None:
        return {}
    out = {k: head.meta[k] for k in DELETING_KEYS if k in head.meta}
    tips = out.get(META_DELETING_REFS)
    if isinstance(tips, dict):
        base = head.name[:-len("HEAD")]
        out[META_DELETING_REFS] = {**tips, **{n[len(base):]: new for n, (old, new) in moved.items()
                                              if n.startswith(base) and tips.get(n[len(base):]) == old}}
    return out


def cancel(plumbing: Plumbing, prefix: str) -> None:
    """Take the deleting mark off the HEAD of the session whose ref folder is ``prefix``
    (if it has one and no rival moves HEAD meanwhile): what ``expire`` does to a session
    whose deletion was interrupted and that was written to after it began.

    Raises:
        StorageError.
    """
    head_name = f"{prefix}/HEAD"
    _unmark(plumbing, head_name, plumbing.refs.read(head_name))


def _unmark(plumbing: Plumbing, head_name: str, marked: RefValue | None) -> None:
    """Take the deleting mark off HEAD again, if it is still as this deletion marked it."""
    if marked is None or deleting_since(marked) is None:
        return
    meta = carried_meta(marked, *DELETING_KEYS)
    try:
        plumbing.swap(head_name, marked.target, marked, meta)
    except RefConflict:
        pass  # HEAD moved since: whoever moved it decides


__all__ = ["cancel", "delete_session_refs", "finish_hint", "finish_line", "first_commit_head", "head_key", "rewritten",
           "stranded", "written_since"]
