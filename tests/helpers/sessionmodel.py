"""The plain reference model of ``tests/test_model.py``: what castore should hold, as Python
dicts, with the rules of branches, forks, compaction and push/pull written out the obvious way.

A store is ``{session id: SessionModel}``; a session's branches map a name to its path (the
commit ids root -> tip, a tuple); HEAD is a branch name or, detached, a path. Commit ids are
the real ones castore returned (content addresses), so a path copied by a push is the same
tuple on both sides; :class:`Commits` remembers what each commit holds and its path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Path = tuple[str, ...]


@dataclass(frozen=True)
class Said:
    """A message commit: who said what."""

    role: str
    text: str


@dataclass(frozen=True)
class Compacted:
    """A compaction commit: its summary and the commit the context keeps from."""

    summary: str
    first_kept: str


@dataclass
class Commits:
    """Every commit the machine made, on either store: what it holds and its path."""

    entry: dict[str, Said | Compacted] = field(default_factory=dict)
    path: dict[str, Path] = field(default_factory=dict)

    def add(self, cid: str, parent_path: Path, what: Said | Compacted) -> Path:
        """Record a new commit on ``parent_path``; return its path."""
        self.entry[cid] = what
        self.path[cid] = (*parent_path, cid)
        return self.path[cid]

    def messages(self, path: Path) -> list[tuple[str, str]]:
        """``messages()`` of a path: (role, text) of its message commits."""
        return [(e.role, e.text) for c in path if isinstance(e := self.entry[c], Said)]

    def context(self, path: Path, summary_text: object) -> list[tuple[str, str]]:
        """``context()`` of a path with no budget: after the last compaction, its summary
        (as ``summary_text(summary)`` renders it), the messages from its ``first_kept`` up to
        it, then every message after it; with no compaction, every message."""
        last = max((i for i, c in enumerate(path) if isinstance(self.entry[c], Compacted)), default=-1)
        if last < 0:
            return self.messages(path)
        comp = self.entry[path[last]]
        assert isinstance(comp, Compacted)
        start = path.index(comp.first_kept) if comp.first_kept in path[:last] else last
        return [summary_text(comp.summary), *self.messages(path[start:last]),  # type: ignore[operator]
                *self.messages(path[last + 1:])]


@dataclass
class SessionModel:
    """One session: branches (name -> path), HEAD (a branch name, or a detached path), and
    the remote-tracking branches a pull kept (``origin/<branch>`` -> tip)."""

    branches: dict[str, Path] = field(default_factory=dict)
    head: str | Path = "main"
    tracking: dict[str, str] = field(default_factory=dict)

    def head_path(self) -> Path:
        """The path HEAD names (empty for a branch with no commit)."""
        return self.branches.get(self.head, ()) if isinstance(self.head, str) else self.head

    def set_head_path(self, path: Path) -> None:
        """Move what HEAD names (its branch, or the detached HEAD) to ``path``."""
        if isinstance(self.head, str):
            self.branches[self.head] = path
        else:
            self.head = path

    def extend(self, path: Path) -> None:
        """An append or compaction made ``path``: HEAD's branch moves there; a detached HEAD
        starts a new branch there, ``branch-<first new id[:8]>``, and HEAD goes on it."""
        if isinstance(self.head, str):
            self.branches[self.head] = path
        else:
            self.head = f"branch-{path[-1][:8]}"
            self.branches[self.head] = path

    def all_commits(self) -> list[str]:
        """Every commit on a branch or HEAD path, each once, in a stable order."""
        seen: dict[str, None] = {}
        for path in [*self.branches.values(), self.head_path()]:
            seen.update(dict.fromkeys(path))
        return list(seen)


StoreModel = dict[str, SessionModel]


def sync(src: StoreModel, dst: StoreModel, *, force: bool, pull: bool, remote: str = "origin") -> set[tuple[str, str]]:
    """What ``castore.push`` (``pull=False``) or ``castore.pull`` does to ``dst``.

    For each branch of each source session: created where the destination lacks it, moved
    on a fast-forward (the destination's tip is on the source's path), else: a push refuses
    (with ``force``, overwrites); a pull leaves a branch alone where the local side is ahead,
    overwrites with ``force``, and otherwise keeps the remote tip as ``<remote>/<branch>``.
    HEAD is copied only to a destination session that has none. Deletions never travel.

    Returns:
        The (session, branch) pairs a push refused, or a pull kept as remote-tracking.
    """
    left: set[tuple[str, str]] = set()
    for sid, s in src.items():
        d = dst.get(sid)
        fresh = d is None
        if d is None:
            d = SessionModel(head=s.head)
        for name, sp in sorted(s.branches.items()):
            dp = d.branches.get(name)
            if dp is None or dp == sp or dp[-1] in sp:
                d.branches[name] = sp
            elif pull and sp[-1] in dp:
                continue  # the local side is ahead
            elif force:
                d.branches[name] = sp
            elif pull:
                if d.tracking.get(f"{remote}/{name}") != sp[-1]:
                    left.add((sid, name))
                d.tracking[f"{remote}/{name}"] = sp[-1]
            else:
                left.add((sid, name))  # a push refuses it
        if fresh:
            dst[sid] = d
    return left
