"""What a framework user may pickle (send to another process) pickles, and what holds an
open store refuses with a clear error (castore/handles.py): before, a Store, a Session, a
LangGraph saver, an ADK session service or an OpenAI Agents session failed on whichever part
refused first ("cannot pickle '_thread.lock' object", a local function of LangGraph's
serializer), and a Codec could not be pickled even when it holds no key."""

from __future__ import annotations

import copy
import os
import pickle

import pytest

import castore
from castore import objects as o


@pytest.fixture
def store(tmp_path):
    with castore.open(str(tmp_path / "st")) as st:
        s = st.session("app", "alice", "s1")
        s.append(castore.Message(role="user", content="hi"))
        yield st


def test_what_a_read_returns_pickles(store: castore.Store) -> None:
    s = store.session("app", "alice", "s1")
    for value in (s.messages()[0], s.log()[0], store.sessions("app")[0], o.PLAIN,
                  castore.SessionDeleting(("app", "alice", "s1")), castore.SessionNotFound(("app", "alice", "nope"))):
        back = pickle.loads(pickle.dumps(value))
        assert type(back) is type(value) and (repr(back) == repr(value) or str(back) == str(value)), value
    assert pickle.loads(pickle.dumps(o.PLAIN)) is o.PLAIN  # the codec every plain store shares, as itself
    assert pickle.loads(pickle.dumps(o.Codec())).digest(b"x") == o.PLAIN.digest(b"x")


def _handles(store: castore.Store, tmp_path) -> list[object]:
    out: list[object] = [store, store.session("app", "alice", "s1")]
    try:
        from castore.adapters.langgraph import CastoreSaver
        out.append(CastoreSaver(store))
    except ImportError:
        pass
    try:
        from castore.adapters.adk import CastoreSessionService
        out.append(CastoreSessionService(store))
    except ImportError:
        pass
    try:
        from castore.adapters.openai_agents import CastoreSession
        out.append(CastoreSession("s1", store))
    except ImportError:
        pass
    return out


def test_what_holds_an_open_store_refuses_with_a_clear_error_and_still_copies(store: castore.Store,
                                                                              tmp_path) -> None:
    handles = _handles(store, tmp_path)
    assert len(handles) == 5  # the adapters' extras are installed in the test environment
    for h in handles:
        with pytest.raises(castore.NotPicklable, match=f"cannot pickle a castore {type(h).__name__}: .*store's URL"):
            pickle.dumps(h)
        with pytest.raises(TypeError):  # what pickle's callers catch
            pickle.dumps(h)
        with pytest.raises(castore.NotPicklable):
            copy.deepcopy(h)
        shallow = copy.copy(h)  # (a LangGraph saver's with_allowlist copies it)
        assert type(shallow) is type(h) and vars(shallow) == vars(h)


def test_a_keyed_codec_refuses_so_that_its_keys_never_land_in_a_pickle(tmp_path) -> None:
    key = os.urandom(32)
    with castore.open(str(tmp_path / "enc"), encrypted=True, master_key=key) as st:
        st.session("app", "alice", "s1").append(castore.Message(role="user", content="secret"))
        codec = st.tenant("app", "alice").objects.codec
        assert codec.keyed
        with pytest.raises(castore.NotPicklable, match="Codec: it holds a tenant's keys"):
            pickle.dumps(codec)
        with pytest.raises(castore.NotPicklable, match="cannot pickle a castore Store"):
            pickle.dumps(st)
