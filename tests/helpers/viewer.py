"""The HTML viewer's state replay, in Python: what the page shows as the state of a commit."""

from __future__ import annotations

from typing import Any


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
