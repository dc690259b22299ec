"""Where a Claude Code line hangs in the tree: a turn is one path, a rewind is a branch.

Claude Code chains its lines by ``parentUuid``, but many lines of one turn are siblings under
one parent: an answer's content blocks are chained, yet the results of parallel tool calls
each name their own call (``tool_use`` A, B, C chained, then ``tool_result`` A under A, B
under B, ...), a ``progress`` line names the call it reports on, and a result that lags
names a call its turn has moved past. Taken at their word these are forks, and every
parallel call would be a branch. Claude Code itself reads them as one conversation: it
resumes from the newest leaf and walks ``parentUuid`` back, and the results find their
calls by ``tool_use_id``, not by the chain.

So a line is placed by what it is:

* a line whose parent is the last line of a path (or a line after which only lines that
  are no turn were written: snapshots, progress, system notes) continues that path;
* a line that is not a new prompt (an answer, a tool result, progress, a system note)
  whose parent is in the *open turn* of a path (the lines since that path's last prompt)
  continues that path too, in file order: parallel calls and their results, lagging
  results, progress threaded between them stay on one path;
* a new prompt (a user line that is no tool result, interrupt note, ``isMeta`` expansion or
  compact summary) whose parent is anywhere else is a rewind (Claude Code's ``/rewind``, an
  edited prompt, or a second process writing from where it last saw the session): a branch
  starts at its parent, its first line marked ``fork: rewind``;
* anything else whose parent is in no open turn starts a branch marked ``fork: fork``.

A line with no parent, or one this file does not hold (a resumed session's first line),
follows the line before it, as do lines without a ``uuid``. :class:`Paths` keeps, for
each leaf, what continues it; it is saved in the session's info so that an incremental
import (``--follow``) places lines as one import of the whole file would (a turn's last
:data:`TURN_KEPT` lines are kept per leaf, enough for the calls a result can name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: how many uuids of a leaf's open turn are kept between imports
TURN_KEPT = 256
#: what a line is, for placing it
PROMPT, TURN, OTHER = "prompt", "turn", "other"
#: user lines Claude Code writes inside a turn (``injected`` kinds): no new prompt
_IN_TURN = frozenset({"tool_result", "interrupt", "meta", "compact_summary", "sidechain"})


def role_of(t: str | None, has_uuid: bool, why: str | None) -> str:
    """:data:`PROMPT`, :data:`TURN` or :data:`OTHER` for a line of type ``t`` (``why``: what
    :func:`~castore.adapters.claude_code.injected` says of it)."""
    if not has_uuid or t not in ("user", "assistant"):
        return OTHER
    return PROMPT if t == "user" and why not in _IN_TURN else TURN


@dataclass
class _Leaf:
    reach: set[str] = field(default_factory=set)  # uuids whose children continue here
    turn: list[str] = field(default_factory=list)  # uuids of the open turn, oldest first


class Paths:
    """The leaves of a session's tree (by line number) and what continues each."""

    def __init__(self, leaves: dict[int, _Leaf]) -> None:
        self.leaves = leaves

    @classmethod
    def of(cls, state: Mapping[str, Any], cursor: int | None) -> Paths:
        """The leaves an import saved (:meth:`state`); from an older import's state, the last
        line with the uuids after which lines continue it (``reach``)."""
        leaves: dict[int, _Leaf] = {}
        saved = state.get("paths")
        if isinstance(saved, dict):
            for k, v in saved.items():
                if isinstance(v, dict) and str(k).isdigit():
                    reach = [u for u in v.get("reach") or () if isinstance(u, str)]
                    turn = [u for u in v.get("turn") or () if isinstance(u, str)]
                    leaves[int(k)] = _Leaf(set(reach), turn)
        elif cursor is not None:
            reach = [u for u in state.get("reach") or () if isinstance(u, str)]
            leaves[cursor] = _Leaf(set(reach), list(reach))
        return cls(leaves)

    def state(self, commits: Mapping[int, str]) -> dict[str, Any]:
        """What the next import needs (each leaf's commit too, when known)."""
        return {str(n): {"reach": sorted(lf.reach), "turn": lf.turn[-TURN_KEPT:],
                         **({"c": commits[n]} if n in commits else {})} for n, lf in self.leaves.items()}

    @staticmethod
    def commits(state: Mapping[str, Any]) -> dict[int, str]:
        """The leaves' commits an import saved: line -> commit."""
        saved = state.get("paths")
        out: dict[int, str] = {}
        for k, v in (saved.items() if isinstance(saved, dict) else ()):
            if str(k).isdigit() and isinstance(v, dict) and isinstance(v.get("c"), str):
                out[int(k)] = v["c"]
        return out

    def find(self, p: str, role: str, cursor: int | None) -> int | None:
        """The leaf a line whose parent is ``p`` continues, or None (a fork)."""
        last = self.leaves.get(cursor) if cursor is not None else None
        if last is not None and p in last.reach:  # the common case: the line after the last one
            return cursor
        order = sorted(self.leaves, key=lambda n: (n != cursor, -n))
        for n in order:
            if p in self.leaves[n].reach:
                return n
        if role != PROMPT:
            for n in order:
                if p in self.leaves[n].turn:
                    return n
        return None

    def place(self, n: int, u: str | None, p: str | None, role: str, cursor: int | None,
              line_of: Mapping[str, int]) -> tuple[int | None, str | None]:
        """Place line ``n`` (uuid ``u``, parent uuid ``p``); return its parent line and, when
        it starts a branch, the kind of fork (``rewind``, ``fork``).

        ``line_of``: the line of each uuid the session holds (for a parent far back).
        """
        fork: str | None = None
        at = self.find(p, role, cursor) if p is not None else None
        parent: int | None
        base: _Leaf | None
        if at is not None:
            parent, base = at, self.leaves.pop(at)
        elif p is None or p not in line_of:
            parent = cursor
            base = self.leaves.pop(cursor, None) if cursor is not None else None
        else:
            parent, base, fork = line_of[p], None, ("rewind" if role == PROMPT else "fork")
        here = [p] if p is not None and base is None else []
        if role == PROMPT:
            leaf = _Leaf({u} if u else set(), [u] if u else [])
        else:
            # the leaf taken (``base``) is no one else's: its turn, and an other line's reach, go on in place
            turn = base.turn if base else here
            if u:
                turn.append(u)
            if role == TURN:
                leaf = _Leaf({u} if u else set(), turn)
            else:
                leaf = _Leaf(base.reach if base else set(here), turn)
                if u:
                    leaf.reach.add(u)
        del leaf.turn[:-TURN_KEPT * 4]
        self.leaves[n] = leaf
        return parent, fork

    def follow(self, n: int, u: str | None, cursor: int | None) -> None:
        """Line ``n`` (castore's own commit, found again in the file) continues the last line."""
        base = self.leaves.pop(cursor, None) if cursor is not None else None
        self.leaves[n] = _Leaf({u} if u else set(), (base.turn if base else []) + ([u] if u else []))
