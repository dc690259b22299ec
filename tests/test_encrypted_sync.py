"""Sync of encrypted stores: which tenants' keys cross (docs/encryption.md, "Copies")."""

from __future__ import annotations

from pathlib import Path

import pytest

import castore
from castore.crypto.keys import MasterKey
from castore.entries import Message
from castore.sync import pull, push


@pytest.fixture
def key() -> str:
    return MasterKey.new()


def test_a_push_of_one_session_makes_no_key_for_an_app_state_neither_side_has(key: str, tmp_path: Path) -> None:
    """Before, each side made its own key for the app's tenant, and the pair could sync that
    app no more ("different codecs")."""
    local, remote_url = str(tmp_path / "laptop"), str(tmp_path / "remote")
    with castore.open(local, encrypted=True, master_key=key) as store:
        store.session("app", "bob", "b1").append(Message(role="user", content="bob's"))
        with castore.open(remote_url, master_key=key) as remote:
            assert push(store, remote, ("app", "bob", "b1")).ok
            store.update_scope("app", None, {"shared": 1})  # the app's key is made now, once
            assert push(store, remote, ("app", "bob")).ok
            assert push(store, remote).ok and pull(remote, store).ok
    with castore.open(remote_url, master_key=key) as remote:  # opened with the key it was given
        assert remote.scope_state("app", None) == {"shared": 1}
