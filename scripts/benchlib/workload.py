"""The one workload every system runs: a session of N steps, one ~500-byte message and a state delta each.

Text is English-like: words drawn with a Zipf-like law from a fixed vocabulary of 2,000
pseudo-words, so that it compresses about like prose (not like random bytes, not like a
ten-word loop). Everything is a pure function of the step number.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache

MESSAGE_BYTES = 500
_SYLLABLES = ("ka", "lo", "mi", "ren", "sta", "por", "e", "an", "ti", "qua", "vel", "do", "ser", "in", "ur",
              "ba", "ne", "cho", "ly", "tor", "gra", "ou", "sim", "pe", "zu", "der", "fa", "wo", "is", "mon")


@lru_cache(maxsize=1)
def _vocabulary() -> tuple[list[str], list[float]]:
    rng = random.Random(12345)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < 2000:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((1, 2, 2, 3, 3, 4))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    weights = [1.0 / (r + 1) for r in range(len(words))]
    return words, weights


@dataclass(frozen=True)
class Step:
    """Step ``i`` of the session."""

    i: int
    role: str
    content: str
    delta: dict[str, object]

    @property
    def payload(self) -> int:
        """The raw payload of this step: the message text's UTF-8 bytes."""
        return len(self.content.encode())


def text(i: int, size: int = MESSAGE_BYTES) -> str:
    """About ``size`` bytes of English-like text, the same for the same ``i``."""
    words, weights = _vocabulary()
    rng = random.Random(i * 7919 + 17)
    out: list[str] = []
    n = 0
    while n < size:
        chunk = rng.choices(words, weights, k=16)
        for w in chunk:
            out.append(w)
            n += len(w) + 1
            if n >= size:
                break
    s = " ".join(out)[:size].rstrip()
    return s[:1].upper() + s[1:-1] + "."


def step(i: int) -> Step:
    """Step ``i``: a user or assistant message (alternating) and the delta ``{turn, topic}``."""
    words, _ = _vocabulary()
    return Step(i, "user" if i % 2 == 0 else "assistant", text(i), {"turn": i, "topic": words[(i * 31) % 97]})


def steps(n: int) -> list[Step]:
    """Steps 0..n-1."""
    return [step(i) for i in range(n)]


def pi_line(s: Step, eid: str, parent: str | None) -> str:
    """Step ``s`` as a line of a Pi session file: a ``message`` entry ``eid`` under
    ``parent``, the step's state delta on it (``stateDelta``)."""
    return json.dumps({"type": "message", "id": eid, "parentId": parent,
                       "timestamp": f"2026-03-10T09:00:00.{s.i % 1000:03d}Z",
                       "message": {"role": s.role, "content": [{"type": "text", "text": s.content}],
                                   "timestamp": 1_773_133_200_000 + s.i * 1000},
                       "stateDelta": s.delta}, separators=(",", ":")) + "\n"


def payload(n: int) -> int:
    """Raw payload of the first ``n`` steps (message text bytes)."""
    return sum(s.payload for s in steps(n))


def compressibility(n: int = 200) -> float:
    """zstd (level 3) size / raw size of the messages compressed one by one."""
    import zstandard

    c = zstandard.ZstdCompressor(level=3)
    raw = [step(i).content.encode() for i in range(n)]
    return sum(len(c.compress(r)) for r in raw) / sum(len(r) for r in raw)
