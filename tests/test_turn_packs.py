"""A process per turn (open the store, read the context, append, close) leaves one small pack
per turn; the close merges them once its handle knows more than AUTO_PACK_LIMIT that the
background repack would merge (Repacker.repack_if_due; docs/FORMAT.md, 8), so the packs
stay bounded, with nothing lost, also with two such writers and a reader at once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import castore
from castore import Message, maintenance
from castore.objectstore.repack import AUTO_PACK_LIMIT

ROOT = Path(__file__).resolve().parent.parent

# one process: TURNS turns of the agent, each on a fresh handle (opened, read, appended, closed)
_TURNS = r"""
import sys, castore
url, user, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(turns):
    with castore.open(url) as st:
        s = st.session("app", user, "turn")
        s.context(max_tokens=8000)
        s.append(castore.Message(role="user", content=f"{user} turn {i}"))
"""

# a reader while they run: fresh handles reading every session's context
_READ = r"""
import sys, castore
url, rounds = sys.argv[1], int(sys.argv[2])
for _ in range(rounds):
    with castore.open(url) as st:
        for user in ("a", "b"):
            st.session("app", user, "turn").context(max_tokens=8000)
"""


def _packs(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "packs").glob("*.pack"))


def _turns(url: str, user: str, turns: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", _TURNS, url, user, str(turns)], cwd=ROOT)


def _seed(root: Path) -> str:
    url = str(root)
    with castore.open(url) as st:
        for user in ("a", "b"):
            st.session("app", user, "turn").append(Message(role="user", content=f"{user} begins"))
    return url


def test_process_per_turn_packs_stay_bounded(tmp_path: Path) -> None:
    url = _seed(tmp_path)
    proc = _turns(url, "a", 4 * AUTO_PACK_LIMIT)
    assert proc.wait() == 0
    # before: one pack per turn (33); the geometric rule leaves O(log n) of the merged ones
    assert len(_packs(tmp_path)) <= AUTO_PACK_LIMIT + 4, _packs(tmp_path)
    with castore.open(url) as st:
        got = [m.content for m in st.session("app", "a", "turn").messages()]
        assert got == ["a begins"] + [f"a turn {i}" for i in range(4 * AUTO_PACK_LIMIT)]
        assert maintenance.fsck(st).ok


def test_two_writers_and_a_reader_lose_nothing(tmp_path: Path) -> None:
    url = _seed(tmp_path)
    turns = 3 * AUTO_PACK_LIMIT
    writers = [_turns(url, user, turns) for user in ("a", "b")]
    reader = subprocess.Popen([sys.executable, "-c", _READ, url, str(turns)], cwd=ROOT)
    assert [p.wait() for p in writers] == [0, 0]
    assert reader.wait() == 0
    assert len(_packs(tmp_path)) <= AUTO_PACK_LIMIT + 6, _packs(tmp_path)
    with castore.open(url) as st:
        for user in ("a", "b"):
            got = [m.content for m in st.session("app", user, "turn").messages()]
            assert got == [f"{user} begins"] + [f"{user} turn {i}" for i in range(turns)]
        report = maintenance.fsck(st)
        assert report.ok, report


def test_a_close_merges_the_small_packs_not_a_backlog_of_large_ones(tmp_path: Path) -> None:
    """The close waits for its run, so it reads at most CLOSE_REPACK_MAX_BYTES of packs: two
    repacked packs larger than that (which the geometric rule picks, with the turns' packs) stay
    as they are, and the turns' small packs are merged beside them."""
    import os

    from castore.objectstore.repack import CLOSE_REPACK_MAX_BYTES

    url = str(tmp_path)
    for user in ("a", "b"):  # two repacked packs of incompressible text, each over the cap
        with castore.open(url, auto_repack=False) as st:
            st.session("app", user, "big").append_many(  # entries below the loose objects' size
                [Message(role="user", content=os.urandom(1500).hex()) for _ in range(3200)])
            st.objects.merge_packs([p[:-len(".pack")] for p in _packs(tmp_path) if p.startswith("w-")])
    large = [p for p in _packs(tmp_path) if (tmp_path / "packs" / p).stat().st_size > CLOSE_REPACK_MAX_BYTES // 2]
    assert len(large) == 2, _packs(tmp_path)
    proc = _turns(url, "a", 2 * AUTO_PACK_LIMIT + 2)
    assert proc.wait() == 0
    left = _packs(tmp_path)
    assert set(large) <= set(left)  # before: the first due close merged them too (geometric picks both)
    assert len(left) <= AUTO_PACK_LIMIT + 4, left
    with castore.open(url) as st:
        assert maintenance.fsck(st).ok
