"""CastoreSaver.with_allowlist, as LangGraph's savers: the proxy decodes with its wider
msgpack allowlist and the saver it came from keeps its own, on one store.

LangGraph's ``InMemorySaver`` returns a shallow clone whose serializer admits the extra types;
what the proxy writes and reads back is the type itself, while the original saver, strict,
reads the same checkpoint as plain data. ``store`` (tests/conftest.py) is each backend in turn.
"""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from pydantic import BaseModel

from castore.adapters.langgraph import CastoreSaver


class Allowed(BaseModel):
    foo: str


CONFIG = {"configurable": {"thread_id": "thread-1", "checkpoint_ns": ""}}


def _put_through_proxy(saver):
    proxy = saver.with_allowlist([(__name__, "Allowed")])
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"foo": Allowed(foo="bar")}
    checkpoint["channel_versions"] = {"foo": 1}
    return proxy, proxy.put(CONFIG, checkpoint, {}, {"foo": 1})


@pytest.mark.parametrize("make", [lambda store, serde: CastoreSaver(store, serde=serde),
                                  lambda store, serde: InMemorySaver(serde=serde)],
                         ids=["castore", "InMemorySaver"])
def test_the_proxy_decodes_with_its_allowlist_and_the_saver_with_its_own(store, make):
    saver = make(store, JsonPlusSerializer(allowed_msgpack_modules=None))
    proxy, config = _put_through_proxy(saver)
    assert proxy is not saver
    proxied = proxy.get_tuple(config)
    assert proxied is not None and proxied.checkpoint["channel_values"]["foo"] == Allowed(foo="bar")
    direct = saver.get_tuple(config)
    assert direct is not None and direct.checkpoint["channel_values"]["foo"] == {"foo": "bar"}
    # and the other way round: the proxy, asked after the saver decoded, still gets the type
    again = proxy.get_tuple(config)
    assert again is not None and again.checkpoint["channel_values"]["foo"] == Allowed(foo="bar")


def test_an_allowlist_that_changes_nothing_returns_the_saver_itself(store):
    saver = CastoreSaver(store)  # the default serializer: no strict allowlist to widen
    assert saver.with_allowlist([]) is saver


def test_the_proxy_writes_where_the_saver_reads(store):
    saver = CastoreSaver(store, serde=JsonPlusSerializer(allowed_msgpack_modules=None))
    proxy, config = _put_through_proxy(saver)
    listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(CONFIG)]
    assert listed == [config["configurable"]["checkpoint_id"]]
    assert [t.config for t in proxy.list(CONFIG)] == [t.config for t in saver.list(CONFIG)]
