"""Build castore's format-1 zstd dictionary (``castore/zdict.py``), kept here for the record.

The dictionary is part of the on-disk format: objects stored with header byte ``0x02`` can
only be read with exactly these bytes, and ``castore/objects.py`` pins their blake3 digest.
Running this script again gives a *different* dictionary (times, uuids and random ids differ
between runs); never replace the checked-in one for an existing format. It is kept so the
next format can make its own the same way.

Samples are the canonical bytes of objects that castore's own code paths write for NEUTRAL
content (placeholder text: "hello", "ok", lorem-ipsum words, random letters): a scripted
session (messages, tool calls and results, events with state deltas, branches, labels,
forks, compactions, model changes), LangGraph graphs run through ``CastoreSaver``
(``add_messages`` channel, scalar channels, a tool node, an interrupt, ``update_state``),
and, when installed, the ADK and OpenAI Agents adapters. No benchmark text is used: the
dictionary should learn castore's and LangGraph's structure (keys, tags, type names,
channel names), not any payload.

Candidates (raw-content dictionaries of concatenated samples, and ``zstd.train_dictionary``
full dictionaries, at several sizes) are built from one run and scored on held-out objects
from a run with other seeds; the smallest held-out total wins.

    .venv/bin/python scripts/make_zdict.py            # build and score, print the table
    .venv/bin/python scripts/make_zdict.py --write    # also write castore/zdict.py
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import string
import sys
import tempfile
import textwrap
from collections import defaultdict
from typing import Annotated, Any, TypedDict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import zstandard
from blake3 import blake3

import castore
from castore import BranchSummary, Custom, Event, Message, ModelChange, frames
from castore import objects as o

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LOREM = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do", "eiusmod",
         "tempor", "incididunt", "ut", "labore", "et", "dolore", "magna", "aliqua")
TOOLS = ("lookup", "search", "read_file", "run_query", "calculator", "get_item")
Sample = tuple[str, bytes]  # (kind label, canonical bytes)


# -- neutral content ---------------------------------------------------------------------------


def text(rng: random.Random) -> str:
    """Placeholder text: short generic words, lorem ipsum, or random letters (never repeats)."""
    r = rng.random()
    if r < 0.25:
        return rng.choice(["", "ok", "hello", "yes", "no", "thanks", "done", "hi there"])
    if r < 0.5:
        return " ".join(rng.choice(LOREM) for _ in range(rng.randint(3, 60)))
    n = rng.randint(10, 700)
    return "".join(rng.choice(string.ascii_lowercase + "      ") for _ in range(n)).strip() or "x"


def rid(rng: random.Random, n: int = 24) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n))


def call_id(rng: random.Random) -> str:
    return rng.choice(["call_", "toolu_", "fc_", ""]) + rid(rng)


def args_json(rng: random.Random) -> str:
    keys = rng.sample(["query", "path", "id", "limit", "q", "expr", "name"], rng.randint(1, 3))
    return json.dumps({k: (rng.randint(0, 99) if k in ("limit", "id") else text(rng)[:40]) for k in keys})


# -- (a) a scripted castore session ------------------------------------------------------------


def session_run(store: castore.Store, rng: random.Random, sid: str, turns: int) -> None:
    """Messages, tool calls and results, events with state deltas, branches, labels, a fork,
    a compaction, a branch summary, model changes and custom entries."""
    s = store.session("app", "user", sid)
    s.append(Message(role="system", content=text(rng)))
    s.append(ModelChange(model=rng.choice(["model-a", "model-b"]), provider="provider", thinking_level="low"))
    for t in range(turns):
        s.append(Message(role="user", content=text(rng)))
        if rng.random() < 0.5:
            cid, tool = call_id(rng), rng.choice(TOOLS)
            s.append_many([
                Message(role="assistant", content=rng.choice([None, "", text(rng)]), tool_calls=[
                    {"id": cid, "type": "function", "function": {"name": tool, "arguments": args_json(rng)}}]),
                Message(role="tool", content=text(rng), tool_call_id=cid, name=tool),
            ])
        usage = {"input_tokens": rng.randint(10, 9000), "output_tokens": rng.randint(1, 900)}
        if rng.random() < 0.6:
            delta = {k: rng.choice([t, text(rng)[:20], True, None, rng.random()])
                     for k in rng.sample(["step", "status", "mode", "count", "notes", "app:flag", "user:pref"],
                                         rng.randint(1, 3))}
            s.append(Event(author=rng.choice(["agent", "assistant", "planner"]),
                           message=Message(role="assistant", content=text(rng)),
                           state_delta=delta, meta={"model": "model-a", "usage": usage}))
        else:
            s.append(Message(role="assistant", content=text(rng)), meta={"model": "model-b", "usage": usage})
        if t % 17 == 5:
            s.append(Custom(rng.choice(["note", "ui.event", "feedback"]), {"value": text(rng)[:30], "n": t}))
        if t % 23 == 7:
            s.label("HEAD", f"mark-{t}")
        if t % 29 == 11:
            here = s.current_branch or "main"
            s.checkout("HEAD~2", create=f"try-{t}")
            s.append(Message(role="assistant", content=text(rng)))
            s.checkout(here)
            s.summarize_branch(f"try-{t}", text(rng))
        if t % 41 == 20:
            s.compact(text(rng), "HEAD~3", details={"read_files": [], "modified_files": []})
    fork = s.fork(sid + "-fork", "HEAD~4")
    fork.append(Message(role="user", content=text(rng)))
    s.append(BranchSummary(summary=text(rng)))


# -- (b) LangGraph through CastoreSaver --------------------------------------------------------


def langgraph_run(store: castore.Store, rng: random.Random, thread: str, turns: int) -> None:
    """A StateGraph with an add_messages channel and two scalar ones, an agent node that
    sometimes asks for a tool, a tool node behind an interrupt, and one update_state."""
    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    from castore.adapters.langgraph import CastoreSaver

    # functional form: the class form's annotations would be looked up as module globals
    State = TypedDict(  # noqa: UP013
        "State", {"messages": Annotated[list[AnyMessage], add_messages], "step": int, "status": str}, total=False)

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        n = state.get("step", 0) + 1
        usage = {"input_tokens": rng.randint(10, 5000), "output_tokens": rng.randint(1, 500)}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        kw: dict[str, Any] = {}
        if rng.random() < 0.5:
            kw["response_metadata"] = {"model_name": "model-a", "finish_reason": "stop"}
            kw["usage_metadata"] = usage
        last = state["messages"][-1]
        if isinstance(last, HumanMessage) and rng.random() < 0.4:
            calls = [{"name": rng.choice(TOOLS), "args": json.loads(args_json(rng)), "id": call_id(rng),
                      "type": "tool_call"}]
            msg = AIMessage(content=rng.choice(["", text(rng)]), tool_calls=calls, id=f"run-{rid(rng, 12)}", **kw)
        else:
            msg = AIMessage(content=text(rng), id=f"run-{rid(rng, 12)}", **kw)
        return {"messages": [msg], "step": n, "status": rng.choice(["ok", "working", "done"])}

    def tools(state: dict[str, Any]) -> dict[str, Any]:
        calls = state["messages"][-1].tool_calls
        return {"messages": [ToolMessage(content=text(rng), tool_call_id=c["id"], name=c["name"]) for c in calls]}

    def route(state: dict[str, Any]) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    b = StateGraph(State)
    b.add_node("agent", agent)
    b.add_node("tools", tools)
    b.add_edge(START, "agent")
    b.add_conditional_edges("agent", route, ["tools", END])
    b.add_edge("tools", "agent")
    interrupt = rng.random() < 0.5
    g = b.compile(checkpointer=CastoreSaver(store), interrupt_before=["tools"] if interrupt else None)
    cfg = {"configurable": {"thread_id": thread}}
    for t in range(turns):
        g.invoke({"messages": [HumanMessage(content=text(rng), id=rid(rng, 8))]}, cfg)
        while interrupt and g.get_state(cfg).next:
            g.invoke(None, cfg)
        if t == turns // 2:
            g.update_state(cfg, {"status": "edited"})


# -- (c) ADK and OpenAI Agents adapters (when installed) ---------------------------------------


def adk_run(store: castore.Store, rng: random.Random, turns: int) -> None:
    from google.adk.events.event import Event as AdkEvent
    from google.adk.events.event_actions import EventActions
    from google.genai import types

    from castore.adapters.adk import CastoreSessionService

    async def go() -> None:
        svc = CastoreSessionService(store)
        sess = await svc.create_session(app_name="app", user_id="user", state={"mode": "x"})
        for t in range(turns):
            inv = "e-" + rid(rng, 8)
            await svc.append_event(sess, AdkEvent(invocation_id=inv, author="user", content=types.Content(
                role="user", parts=[types.Part(text=text(rng))])))
            if rng.random() < 0.5:
                name = rng.choice(TOOLS)
                await svc.append_event(sess, AdkEvent(invocation_id=inv, author="agent", content=types.Content(
                    role="model", parts=[types.Part(function_call=types.FunctionCall(
                        id=call_id(rng), name=name, args=json.loads(args_json(rng))))])))
                await svc.append_event(sess, AdkEvent(invocation_id=inv, author="agent", content=types.Content(
                    role="user", parts=[types.Part(function_response=types.FunctionResponse(
                        name=name, response={"result": text(rng)[:80]}))])))
            await svc.append_event(sess, AdkEvent(
                invocation_id=inv, author="agent",
                content=types.Content(role="model", parts=[types.Part(text=text(rng))]),
                actions=EventActions(state_delta={"step": t, "status": rng.choice(["ok", "done"])})))

    asyncio.run(go())


def openai_run(store: castore.Store, rng: random.Random, turns: int) -> None:
    from castore.adapters.openai_agents import CastoreSession

    async def go() -> None:
        s = CastoreSession("conv-" + rid(rng, 6), store)
        for _ in range(turns):
            items: list[dict[str, Any]] = [{"role": "user", "content": text(rng)}]
            if rng.random() < 0.5:
                cid = call_id(rng)
                items += [{"type": "function_call", "call_id": cid, "name": rng.choice(TOOLS),
                           "arguments": args_json(rng), "id": "fc_" + rid(rng), "status": "completed"},
                          {"type": "function_call_output", "call_id": cid, "output": text(rng)}]
            items.append({"id": "msg_" + rid(rng), "type": "message", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text(rng), "annotations": []}]})
            await s.add_items(items)

    asyncio.run(go())


# -- collecting and scoring --------------------------------------------------------------------


def kind_of(obj: o.AnyObject) -> str:
    return type(obj).__name__ + (f":{obj.kind}" if isinstance(obj, o.Commit) else "")


def objects_of(store: castore.Store) -> list[Sample]:
    """Every object of ``store`` as (kind, canonical bytes)."""
    ids = list(store.objects.iter_ids())
    canon = store.objects.get_canonical_many(ids)
    return [(kind_of(o.decode(i, canon[i])), canon[i]) for i in ids]


def collect(seed: int, scale: int = 1) -> dict[str, list[Sample]]:
    """The neutral sample objects of one run, by source."""
    rng = random.Random(seed)
    out: dict[str, list[Sample]] = {}
    runs = [("session", lambda st: [session_run(st, rng, f"s{seed}-{i}", n)
                                    for i, n in enumerate((150 * scale, 40, 12))]),
            ("langgraph", lambda st: [langgraph_run(st, rng, f"t{seed}-{i}", n)
                                      for i, n in enumerate((90 * scale, 25, 6))]),
            ("adk", lambda st: adk_run(st, rng, 40 * scale)),
            ("openai", lambda st: openai_run(st, rng, 40 * scale))]
    for name, fn in runs:
        with tempfile.TemporaryDirectory() as d:
            st = castore.open(d, durable=False)
            try:
                fn(st)
            except ImportError as e:
                print(f"skipping {name}: {e}", file=sys.stderr)
                continue
            out[name] = objects_of(st)
            st.close()
    return out


def small(samples: list[Sample]) -> list[Sample]:
    """The samples the dictionary codec will see (larger objects use plain zstd)."""
    return [(k, c) for k, c in samples if o.COMPRESS_MIN <= len(c) <= o.DICT_MAX]


def raw_content_dict(samples: list[Sample], size: int) -> bytes:
    """Concatenated samples, each kind given room in proportion to its bytes among the
    samples, the most common kinds last (zstd reaches the end of a dictionary cheapest)."""
    by_kind: dict[str, list[bytes]] = defaultdict(list)
    for k, c in small(samples):
        by_kind[k].append(c)
    weight = {k: sum(map(len, v)) for k, v in by_kind.items()}
    total = sum(weight.values())
    blocks: list[bytes] = []
    for k in sorted(by_kind, key=lambda k: weight[k]):
        room = max(size * weight[k] // total, len(by_kind[k][0]))
        block = b""
        for c in by_kind[k]:
            if len(block) + len(c) > room:
                break
            block += c
        blocks.append(block or by_kind[k][0])
    return b"".join(blocks)[-size:]


def trained_dict(samples: list[Sample], size: int) -> bytes:
    data = [c for _, c in small(samples)]
    return zstandard.train_dictionary(size, data, level=o.ZDICT_LEVEL, steps=64, threads=-1).as_bytes()


_plain = zstandard.ZstdCompressor(level=3)


def old_codec(canonical: bytes) -> int:
    """Stored size under the codec before the dictionary: zstd level 3 from 128 bytes when it saves 8."""
    if len(canonical) >= 128:
        z = _plain.compress(canonical)
        if len(z) < len(canonical) - 8:
            return 1 + len(z)
    return 1 + len(canonical)


def dict_codec(dict_bytes: bytes, dict_type: int):
    """Stored size under :func:`castore.objects.to_stored` if it used ``dict_bytes``."""
    # castore's own codec with a candidate dictionary: what the objects module would store
    c = frames._dict_compressor(frames._digest_dict(dict_bytes, dict_type))  # noqa: SLF001

    def size(canonical: bytes) -> int:
        n = len(canonical)
        if n < o.COMPRESS_MIN:
            return 1 + n
        z = c.compress(canonical) if n <= o.DICT_MAX else _plain.compress(canonical)
        return 1 + min(n, len(z))

    return size


def by_kind_sizes(codec, samples: list[Sample]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for k, c in samples:
        out[k.split(":")[0]] += codec(c)
    return out


def write_module(dict_bytes: bytes, note: str) -> str:
    path = os.path.join(ROOT, "castore", "zdict.py")
    b64 = "\n".join(textwrap.wrap(base64.b64encode(dict_bytes).decode(), 96))
    src = f'''"""castore's format-1 zstd dictionary: part of the on-disk format, never edit.

Objects stored with header byte ``0x02`` are zstd frames made with these bytes and cannot be
read without them; ``castore/objects.py`` pins their blake3 digest and refuses to import if
they change. Built by ``scripts/make_zdict.py`` ({note}) from castore's own objects for
neutral placeholder content.
"""

from __future__ import annotations

import base64

ZDICT: bytes = base64.b64decode(
    """
{b64}
"""
)
'''
    with open(path, "w") as f:
        f.write(src)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the winner to castore/zdict.py")
    ap.add_argument("--sizes", default="4096,8192,12288,16384", help="dictionary sizes to try")
    args = ap.parse_args()
    train = [s for v in collect(seed=1, scale=2).values() for s in v]
    held = [s for v in collect(seed=2).values() for s in v]
    print(f"training objects: {len(train)} ({sum(len(c) for _, c in train):,} B); "
          f"held-out: {len(held)} ({sum(len(c) for _, c in held):,} B)")
    types = {"raw": zstandard.DICT_TYPE_RAWCONTENT, "full": zstandard.DICT_TYPE_FULLDICT}
    candidates: dict[str, tuple[str, bytes]] = {}
    for size in (int(x) for x in args.sizes.split(",")):
        candidates[f"raw-{size}"] = ("raw", raw_content_dict(train, size))
        candidates[f"trained-{size}"] = ("full", trained_dict(train, size))
    codecs = {"raw (0x00 only)": lambda c: 1 + len(c), "zstd from 128 B (before)": old_codec}
    codecs |= {name: dict_codec(b, types[t]) for name, (t, b) in candidates.items()}
    kinds = sorted({k.split(":")[0] for k, _ in held})
    print("\nheld-out stored bytes by kind")
    print("| codec | " + " | ".join(kinds) + " | total |")
    print("|---|" + "---|" * (len(kinds) + 1))
    totals: dict[str, int] = {}
    for name, codec in codecs.items():
        sizes = by_kind_sizes(codec, held)
        totals[name] = sum(sizes.values())
        print(f"| {name} | " + " | ".join(f"{sizes[k]:,}" for k in kinds) + f" | {totals[name]:,} |")
    best = min(candidates, key=lambda n: totals[n])
    kind, dict_bytes = candidates[best]
    digest = blake3(dict_bytes).hexdigest()
    print(f"\nbest on held-out: {best} ({len(dict_bytes)} B, zstd dict type {kind!r}, blake3 {digest})")
    if args.write:
        print("wrote", write_module(dict_bytes, best))
        print(f"now set castore/objects.py: ZDICT_BLAKE3 = {digest!r}, "
              f"_ZDICT_TYPE = zstandard.{'DICT_TYPE_FULLDICT' if kind == 'full' else 'DICT_TYPE_RAWCONTENT'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
