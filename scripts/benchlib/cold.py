"""Cold reads: each in a fresh Python process, timed from its first statement (imports included).

The child code of every system is here as source text. Its clock starts before any import,
so the figure includes importing the library, opening the store and reading the current
path (messages and state), and excludes only the interpreter's own start, which is the same
for every system. The parent also records the whole process's wall time (spawn to exit).
The OS page cache is warm for every system alike (the files were just written).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # scripts/

#: the LangGraph graph every LangGraph system uses (exec'd here and in the children)
GRAPH_SRC = '''
from typing import Annotated, Any, TypedDict
from langchain_core.messages import AnyMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

try:
    from langgraph.channels.delta import DeltaChannel
except ImportError:  # older LangGraph: no DeltaChannel
    DeltaChannel = None


def _delta_reducer(state, writes):
    out = list(state) if state else []
    for w in writes:
        out = add_messages(out, w)
    return out


def build_graph(delta, checkpointer):
    if delta:
        class State(TypedDict, total=False):
            messages: Annotated[list[AnyMessage], DeltaChannel(_delta_reducer, snapshot_frequency=50)]
            turn: int
            topic: str
    else:
        class State(TypedDict, total=False):
            messages: Annotated[list[AnyMessage], add_messages]
            turn: int
            topic: str
    b = StateGraph(State)
    b.add_node("agent", lambda s: {})
    b.add_edge(START, "agent")
    b.add_edge("agent", END)
    return b.compile(checkpointer=checkpointer)
'''

#: Pi's loader: parse every line, index by id, walk parentId from the leaf
PI_SRC = '''
def pi_all(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def pi_path(path, leaf=None):
    entries = pi_all(path)
    by_id = {e["id"]: e for e in entries if e.get("type") != "session"}
    if leaf is None:
        leaf = next(e["id"] for e in reversed(entries) if e.get("type") != "session")
    out = []
    e = by_id.get(leaf)
    while e is not None:
        out.append(e)
        p = e.get("parentId")
        e = by_id.get(p) if p is not None else None
    out.reverse()
    return out
'''

CASTORE = '''import time; _t0 = time.perf_counter()
import json, sys
import castore
_ti = time.perf_counter()
url, opts = sys.argv[1], json.loads(sys.argv[2])
if url.startswith("s3://"):
    from castore.storage import open_storage
    from benchlib.count import CountingStorage
    store = castore.Store(CountingStorage(open_storage(url, **opts)))
else:
    store = castore.open(url, **opts)
s = store.session(*sys.argv[3:6])
msgs = s.messages()
_t1 = time.perf_counter()
mid = store.storage.meter.snapshot() if hasattr(store.storage, "meter") else None
state = s.state()
_t2 = time.perf_counter()
out = {"ms": (_t2 - _t0) * 1e3, "path_ms": (_t1 - _t0) * 1e3, "import_ms": (_ti - _t0) * 1e3, "n": len(msgs),
       "turn": state.get("turn")}
if mid is not None:
    end = store.storage.meter.snapshot()
    out.update(path_requests=mid[0], path_rts=mid[1], requests=end[0], rts=end[1])
print(json.dumps(out))
'''

PI = '''import time; _t0 = time.perf_counter()
import json, sys
''' + PI_SRC + '''
path = pi_path(sys.argv[1])
msgs = [e["message"] for e in path if e["type"] == "message"]
state = {}
for e in path:
    state.update(e.get("stateDelta", {}))
_t1 = time.perf_counter()
print(json.dumps({"ms": (_t1 - _t0) * 1e3, "n": len(msgs), "turn": state.get("turn")}))
'''

FLOOR = '''import time; _t0 = time.perf_counter()
import sys
with open(sys.argv[1], "rb") as f:
    msgs = f.read().decode().split("\\n")[:-1]
_t1 = time.perf_counter()
print('{"ms": %r, "n": %d}' % ((_t1 - _t0) * 1e3, len(msgs)))
'''

LANGGRAPH = '''import time; _t0 = time.perf_counter()
import json, sqlite3, sys
from langgraph.checkpoint.sqlite import SqliteSaver
''' + GRAPH_SRC + '''
g = build_graph(sys.argv[2] == "1", SqliteSaver(sqlite3.connect(sys.argv[1], check_same_thread=False)))
st = g.get_state({"configurable": {"thread_id": "bench"}})
msgs, turn = st.values["messages"], st.values.get("turn")
_t1 = time.perf_counter()
print(json.dumps({"ms": (_t1 - _t0) * 1e3, "n": len(msgs), "turn": turn}))
'''

_ns: dict[str, Any] = {"json": json}
exec(PI_SRC, _ns)  # the parent's Pi reads run the very code the children run
pi_all = _ns["pi_all"]
pi_path = _ns["pi_path"]


def graph_module() -> dict[str, Any]:
    """The namespace of :data:`GRAPH_SRC` (imports LangGraph), as a registered module.

    LangGraph resolves the state's type hints in the module that defines the class.
    """
    import types

    mod = sys.modules.get("benchlib_graph")
    if mod is None:
        mod = types.ModuleType("benchlib_graph")
        sys.modules["benchlib_graph"] = mod
        exec(GRAPH_SRC, mod.__dict__)
    return mod.__dict__


def run(code: str, args: list[str], timeout: float = 900, cwd: str | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; return its JSON line plus ``wall_ms`` (spawn to exit).

    ``python -c`` puts its working folder first on ``sys.path``: a caller timing another
    checkout's castore passes that checkout (or any folder without one) as ``cwd``.

    Raises:
        RuntimeError: the child failed.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = _HERE + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout,
                       cwd=cwd)
    wall = (time.perf_counter() - t) * 1e3
    if p.returncode != 0:
        raise RuntimeError(f"cold read failed ({p.returncode}): {p.stderr.strip()[-1500:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall_ms"] = wall
    return out
