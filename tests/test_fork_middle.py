"""A fork or branch at the middle of a long path reads only the fork point's block (issue 17).

The read hint of the new ref is built from one segment of the tip's index (or the tip's
hint tail), not from the whole path: the objects decoded do not grow with the path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import castore
from castore import objects as o
from castore.history import Hint, K

N = 3 * K + 10


@pytest.fixture(scope="module")
def long_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    url = str(tmp_path_factory.mktemp("fork-middle") / "store")
    with castore.open(url, durable=False) as st:
        s = st.session("app", "u", "s")
        ids = [s.append(castore.Message(role="user", content=f"m{i}"), state_delta={"turn": i}) for i in range(N)]
    return url, ids


def _decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = o.decode

    def counting(oid: str, canonical: bytes) -> o.AnyObject:
        seen.append(oid)
        return real(oid, canonical)

    monkeypatch.setattr(o, "decode", counting)
    return seen


@pytest.mark.parametrize("depth", [0, 5, K - 1, K, K + 7, 2 * K - 1, 2 * K + 3, N - 2])
def test_the_hint_of_a_fork_is_the_one_its_block_gives(long_store: tuple[str, list[str]], depth: int) -> None:
    url, ids = long_store
    with castore.open(url) as st:
        s = st.session("app", "u", "s")
        f = s.fork(f"at-{depth}", at=ids[depth])
        meta = st.refs.read(f.refs.branch("main")).meta  # type: ignore[union-attr]
        expect, _ = st.history.hint_for(ids[depth])
        assert Hint.from_meta(meta) == expect
        assert [m.content for m in f.messages()] == [f"m{i}" for i in range(depth + 1)]
        assert f.state(scopes=False)["turn"] == depth


def test_a_fork_at_the_middle_decodes_one_block_not_the_path(long_store: tuple[str, list[str]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url, ids = long_store
    seen = _decodes(monkeypatch)
    with castore.open(url) as st:
        st.session("app", "u", "s").fork("middle", at=ids[K + K // 2])
    # the tip's block and index, the fork point's segment (K commits and their bodies), refs
    assert len(seen) <= 3 * K + 10, len(seen)
    commits_below = {ids[d] for d in range(K)}
    assert not commits_below & set(seen)  # block 0 was never read


def test_a_tip_whose_segment_is_damaged_falls_back_to_walking(tmp_path: Path) -> None:
    url = str(tmp_path / "store")
    with castore.open(url, durable=False) as st:
        s = st.session("app", "u", "s")
        ids = [s.append(castore.Message(role="user", content=f"m{i}")) for i in range(2 * K + 3)]
    with castore.open(url) as st:
        path = st.history.path(ids[-1])
        seg_of_block_0 = o.hex_id(st.objects.get(o.hex_id(path[K][1].index)).segments[0])  # type: ignore[union-attr]
        st.storage.delete(f"objects/{seg_of_block_0[:2]}/{seg_of_block_0[2:]}")
    with castore.open(url) as st:
        f = st.session("app", "u", "s").fork("f", at=ids[5])
        meta = st.refs.read(f.refs.branch("main")).meta  # type: ignore[union-attr]
        assert Hint.from_meta(meta) == st.history.hint_for(ids[5])[0]
        assert f.head == ids[5]
