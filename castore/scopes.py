"""App- and user-scoped state: a chain of state commits on each scope's ref.

A scope is an app (its ref ``state/<app>/app``) or one user of it (``state/<app>/users/<user>``;
:func:`castore.refnames.scope_ref` names both). Each change is a commit of kind ``state``
whose state tree (:mod:`castore.state`) is the scope's whole state after it, so that the
state after any change can be named: a session's entry records the scope commits after its
own change (``Commit.scopes``), and :meth:`castore.Session.state` reads them back.

A change is written in two steps, so that a session's append moves its own ref first and a
writer that loses that race changes no scope: :func:`prepare` writes the commits on the
scope's tip without moving its ref (a :class:`ScopePlan`), :func:`publish` moves the ref, and
writes the same changes again on the new tip when the scope moved meanwhile (a change
applies after whatever is there; none is lost). :class:`~castore.store.Store` routes each
call to the store holding the scope (a tenant's, in the tenant layout) and hands it here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .entries import Record, check_state
from .refnames import META_TIME
from .state import read_state, read_states

if TYPE_CHECKING:
    from .history import History
    from .objects import Commit
    from .objectstore import ObjectStore
    from .plumbing import Plumbing
    from .refs import RefValue

#: changes to a scope: each ``(delta, unset)`` becomes one commit
Changes = Sequence[tuple[Mapping[str, Any], tuple[str, ...]]]


@dataclass(frozen=True, repr=False, eq=False)
class ScopePlan(Record):
    """App or user state changes written as commits, waiting for their ref to move."""

    ref: str
    base: RefValue | None
    changes: tuple[tuple[dict[str, Any], tuple[str, ...]], ...]
    author: str
    ids: tuple[str, ...]


def check_changes(changes: Changes, author: str) -> None:
    """Refuse a change that is not a valid state change before anything is written.

    Raises:
        InvalidEntry: a delta or author that a state commit cannot hold.
    """
    for delta, _unset in changes:
        check_state(delta, author)


def prepare(plumbing: Plumbing, ref: str, changes: Changes, author: str = "") -> ScopePlan:
    """Write the commits of ``changes`` (checked first by :func:`check_changes`) on the
    current tip of scope ref ``ref``, without moving the ref: until :func:`publish` moves it,
    nothing reads them.

    Raises:
        StorageError: the backend failed.
    """
    return _chain(plumbing, ref, plumbing.refs.read(ref), changes, author)


def _chain(plumbing: Plumbing, ref: str, cur: RefValue | None, changes: Changes, author: str) -> ScopePlan:
    """Write one commit per change on ``cur``'s target (None: a new scope)."""
    batch = plumbing.batch(cur.target if cur else None)
    now = time.time()
    for delta, unset in changes:
        batch.entry("state", None, delta=delta, unset=tuple(unset), author=author, when=now, meta={})
    plumbing.write(batch)
    return ScopePlan(ref, cur, tuple((dict(d), tuple(u)) for d, u in changes), author, tuple(batch.ids))


def publish(plumbing: Plumbing, plan: ScopePlan) -> list[str]:
    """Move the scope's ref to a prepared chain; if the scope moved meanwhile, write the
    same changes again on its new tip and try again, under the plumbing's retry policy.

    Returns:
        The commit ids the ref now reaches for the changes, in order.

    Raises:
        RefContended: the scope kept changing (see :class:`~castore.retry.RetryPolicy`).
        StorageError: the backend failed.
    """
    plans = [plan]

    def attempt(n: int) -> list[str]:
        if n:
            p = plans[-1]
            plans.append(_chain(plumbing, p.ref, plumbing.refs.read(p.ref), p.changes, p.author))
        p = plans[-1]
        plumbing.swap(p.ref, p.ids[-1], p.base, {META_TIME: time.time()})
        return list(p.ids)

    return plumbing.land(plan.ref, attempt)


def states(history: History, objects: ObjectStore, commits: list[str | None]) -> list[dict[str, Any]]:
    """The states of several scope commits (None: empty), read in shared batches.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    wanted = [c for c in commits if c is not None]
    got = history.commits(wanted) if wanted else {}
    trees = read_states(objects, [got[c].state if c is not None else None for c in commits])
    return [t if c is not None else {} for c, t in zip(commits, trees, strict=True)]


def state_at(history: History, objects: ObjectStore, commit: str | None) -> dict[str, Any]:
    """The state at scope commit ``commit`` (None: a scope never written, empty).

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    return read_state(objects, history.commit(commit).state) if commit is not None else {}


def log(history: History, head: str | None) -> list[tuple[str, Commit]]:
    """The chain of scope commits ending at ``head`` (None: empty), newest first.

    Raises:
        ObjectNotFound, IntegrityError, StorageError.
    """
    if head is None:
        return []
    return list(reversed(history.walk(head)))  # scope chains are short: no segments


__all__ = ["Changes", "ScopePlan", "check_changes", "log", "prepare", "publish", "state_at", "states"]
