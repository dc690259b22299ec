"""Where each commit of a session's tree is drawn: its row and its lane (column).

The tree is drawn root first, one commit per row, like ``git log --graph`` turned upside
down. Each commit has one *continuing* child that stays in its lane (the child toward HEAD,
else the one with the largest subtree); its other children open side lanes. Rows come in
depth-first order with side branches listed before the continuation, so a side branch's
commits sit together under the commit they leave from (after any elder sibling branch), and
a lane is held only from the row a line of history leaves its parent to its last row. Lanes are then
given out greedily (the lowest free one), as in interval partitioning.

Everything here is linear in the number of commits (plus a log factor for the heaps).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

#: a linear run of more plain commits than this is folded behind one "N more" row
RUN_MIN = 8
#: commits kept visible at each end of a folded run
RUN_KEEP = 2


@dataclass
class Layout:
    """The drawing plan of a tree of ``n`` commits.

    Attributes:
        row: for each commit (by index), its row.
        lane: for each commit, its lane (0 is the leftmost).
        lanes: how many lanes are used.
        runs: folded runs as ``[first_row, last_row]`` (inclusive): rows of plain commits,
            one after another in one lane, that a viewer hides behind one row until asked.
    """

    row: list[int] = field(default_factory=list)
    lane: list[int] = field(default_factory=list)
    lanes: int = 0
    runs: list[list[int]] = field(default_factory=list)


def layout(parents: Sequence[Sequence[int]], prefer: Sequence[int] = (), keep: Sequence[int] = (),
           run_min: int = RUN_MIN) -> Layout:
    """Place the commits of a tree (or DAG: only first parents shape the tree).

    Args:
        parents: for each commit, the indices of its parents (first parent first); a
            parent index outside ``range(n)`` is ignored.
        prefer: commits whose line of history should stay in the leftmost lanes (HEAD's
            path is given here): a commit on it continues its parent's lane.
        keep: commits that must stay visible (named by a ref, compactions, ...).
        run_min: fold linear runs of more than this many plain commits.

    Returns:
        The :class:`Layout`.
    """
    n = len(parents)
    first = [p[0] if p and 0 <= p[0] < n else -1 for p in parents]
    children: list[list[int]] = [[] for _ in range(n)]
    roots: list[int] = []
    for i, p in enumerate(first):
        (children[p] if p >= 0 else roots).append(i)

    # Subtree sizes, children before parents (an explicit stack: sessions can be deep).
    order: list[int] = []
    stack = list(reversed(roots))
    while stack:
        i = stack.pop()
        order.append(i)
        stack.extend(children[i])
    if len(order) != n:  # a cycle of first parents cannot happen in a content-addressed DAG
        missing = sorted(set(range(n)) - set(order))
        roots += missing
        order += missing
    size = [1] * n
    for i in reversed(order):
        if first[i] >= 0:
            size[first[i]] += size[i]

    preferred = set(prefer)
    on_pref = [False] * n
    for i in reversed(order):
        if i in preferred or any(on_pref[c] for c in children[i]):
            on_pref[i] = True

    def cont_key(c: int) -> tuple[bool, int, int]:
        return (on_pref[c], size[c], -c)

    cont = [max(ch, key=cont_key) if ch else -1 for ch in children]

    # Rows: depth-first, side children first (oldest first), the continuation last.
    row = [0] * n
    rows: list[int] = []
    # The main root (HEAD's, else the largest) is popped first.
    stack = sorted(roots, key=lambda r: (on_pref[r], size[r], -r))
    while stack:
        i = stack.pop()
        row[i] = len(rows)
        rows.append(i)
        if cont[i] >= 0:
            stack.append(cont[i])
        stack.extend(sorted((c for c in children[i] if c != cont[i]), reverse=True))

    # Chains: a commit that is not its parent's continuation starts a line of history.
    last = list(range(n))  # chain start -> last row of the chain (filled below)
    start = [0] * n
    for i in rows:
        p = first[i]
        start[i] = start[p] if p >= 0 and cont[p] == i else i
        last[start[i]] = row[i]
    # A line of history holds its lane from its parent's row (where it leaves) to its last row.
    # Side lines can start far below their parent (after their elder siblings' subtrees), so
    # lines are placed in the order of the row they leave from: plain interval partitioning.
    starts = [i for i in rows if start[i] == i]
    begin = {s: row[first[s]] if first[s] >= 0 else row[s] for s in starts}
    starts.sort(key=lambda s: (begin[s], row[s]))
    chain_lane: dict[int, int] = {}
    free: list[int] = []
    busy: list[tuple[int, int]] = []  # (last row, lane)
    used = 0
    for s in starts:
        while busy and busy[0][0] < begin[s]:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            ln = heapq.heappop(free)
        else:
            ln, used = used, used + 1
        chain_lane[s] = ln
        heapq.heappush(busy, (last[s], ln))
    lane = [chain_lane[start[i]] for i in range(n)]

    runs = _runs(rows, first, children, set(keep), on_pref, run_min)
    return Layout(row=row, lane=lane, lanes=used, runs=runs)


def _runs(rows: list[int], first: list[int], children: list[list[int]], keep: set[int],
          on_pref: list[bool], run_min: int) -> list[list[int]]:
    """Rows of long linear runs to fold, keeping :data:`RUN_KEEP` commits visible at each end."""

    def plain(i: int) -> bool:
        p = first[i]
        return (p >= 0 and len(children[p]) == 1 and len(children[i]) == 1 and i not in keep)

    out: list[list[int]] = []
    r = 0
    while r < len(rows):
        if not plain(rows[r]):
            r += 1
            continue
        s = r
        while r + 1 < len(rows) and plain(rows[r + 1]) and first[rows[r + 1]] == rows[r]:
            r += 1
        if r - s + 1 > run_min:
            out.append([s + RUN_KEEP, r - RUN_KEEP])
        r += 1
    return out


__all__ = ["Layout", "layout", "RUN_MIN", "RUN_KEEP"]
