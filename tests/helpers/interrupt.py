"""An operation stopped at a chosen ref move: the store's ``swap``/``swap_many`` raise
KeyboardInterrupt right after the ``at``-th move lands (as Ctrl-C or kill -9 would leave the
store there), so that a test can stop a long operation at every point it writes
(:func:`interrupted_everywhere`); :func:`archive` and :func:`same_tree` compare the results
(used by the coding-agent import tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import castore


class Stopped(KeyboardInterrupt):
    """Raised by :func:`stop_after` (a KeyboardInterrupt: what Ctrl-C raises)."""


def stop_after(store: castore.Store, monkeypatch: pytest.MonkeyPatch, at: int) -> list[int]:
    """Make the ``at``-th ref move of ``store`` (1-based; 0: none) the last: it lands, then
    :class:`Stopped` is raised. Returns the running count of moves (one element)."""
    plumbing = store.plumbing
    real_swap, real_swap_many = plumbing.swap, plumbing.swap_many
    moves = [0]

    def after(f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*a: Any, **k: Any) -> Any:
            out = f(*a, **k)
            moves[0] += 1
            if moves[0] == at:
                raise Stopped
            return out
        return call

    monkeypatch.setattr(plumbing, "swap", after(real_swap))
    monkeypatch.setattr(plumbing, "swap_many", after(real_swap_many))
    return moves


def archive(store: castore.Store, app: str = "claude") -> dict[str, Any]:
    """Every session of ``app``: its lines as (line, parent line, body), its branches, the
    branch checked out: what must not depend on whether the import was interrupted."""
    out: dict[str, Any] = {}
    for si in store.sessions(app):
        s = store.session(si.app, si.user, si.session)
        les = s.log(all_branches=True)
        o_of = {le.id: le.meta[app]["o"] for le in les}
        out["/".join(s.key)] = (
            sorted((le.meta[app]["o"], o_of.get(le.parents[0], -1) if le.parents else -1,
                    json.dumps(le.entry.message.to_dict(), sort_keys=True) if le.entry.message else None)
                   for le in les),
            sorted(s.branches()), s.current_branch)
    return out


def same_tree(a: Path, b: Path, skip: tuple[str, ...] = ("LICENSE", "README.md")) -> None:
    """Every file under ``a`` (but ``skip``) is in ``b`` with the same bytes, and nothing else."""
    want = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file() and p.name not in skip)
    got = sorted(p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file())
    assert got == want
    for rel in want:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel


def interrupted_everywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: Callable[[castore.Store], Any],
                           before: Callable[[castore.Store], Any] = lambda s: None, app: str = "claude"
                           ) -> list[castore.Store]:
    """For every ref move ``run`` makes: a store where ``before`` ran, then ``run`` stopped
    right after that move (KeyboardInterrupt), then ``run`` again to the end. Returns the
    stores and checks each against ``run`` never stopped."""
    # a write batch lands when due (every 0.25 s): on a loaded machine the reference run could
    # land more often than a later one, which then never reaches its k-th move. Only the
    # batch's own rules (files, bytes, the end) land here: every run makes the same moves
    monkeypatch.setenv("CASTORE_LAND_EVERY", "1e9")
    ref = castore.open(str(tmp_path / "ref"), durable=False)
    before(ref)
    with monkeypatch.context() as m:
        moves = stop_after(ref, m, 0)
        run(ref)
    assert moves[0] > 3
    want = archive(ref, app)
    stores = []
    for k in range(1, moves[0] + 1):
        store = castore.open(str(tmp_path / f"s{k}"), durable=False)
        before(store)
        with monkeypatch.context() as m:
            stop_after(store, m, k)
            with pytest.raises(Stopped):
                run(store)
        run(store)
        assert archive(store, app) == want, k
        stores.append(store)
    return stores
