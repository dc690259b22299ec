"""The HTML viewer's state replay, in Python: what the page shows as the state of a commit;
and the session list a served viewer gives."""

from __future__ import annotations

import http.client
import threading
from typing import Any


def served_index(store: Any) -> str:
    """The page ``GET /`` of a viewer serving ``store`` (``castore view``'s server on a free
    loopback port, stopped after the one request) returns: its session list."""
    from castore.html.server import make_server

    srv = make_server(store, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        conn = http.client.HTTPConnection(*srv.server_address[:2])
        conn.request("GET", "/")
        body = conn.getresponse().read().decode()
        conn.close()
        return body
    finally:
        srv.shutdown()
        srv.server_close()


def replayed_state(nodes: list[dict[str, Any]], i: int) -> dict[str, Any]:
    """The state the viewer rebuilds at node ``i`` of :func:`castore.html.build_model`'s
    ``nodes``, as ``stateAt`` in ``castore/html/view.js`` does: from the root down the first
    parents, each node's delta ``d`` set, its extensions ``x`` appended to their lists, its
    removed keys ``u`` dropped."""
    path, j = [], i
    while True:
        path.append(j)
        if not nodes[j]["p"]:
            break
        j = nodes[j]["p"][0]
    state: dict[str, Any] = {}
    for j in reversed(path):
        state.update(nodes[j]["d"])
        for k, items in nodes[j].get("x", {}).items():
            state[k] = [*state.get(k, []), *items]
        for k in nodes[j]["u"]:
            state.pop(k, None)
    return state
