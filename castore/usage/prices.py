"""What tokens cost: the price table (USD per million tokens per model), the one shipped with
castore (``castore/data/prices.json``) or one given, and the names of a model it knows.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from ..errors import CastoreError
from .records import Tokens


class UsageError(CastoreError, ValueError):
    """A bad argument to :func:`castore.usage.usage`, or a price table that cannot be read."""


_FIELDS = ("input", "output", "cache_read", "cache_write")


@dataclass
class Prices:
    """A price table: USD per million tokens per model (``input``, ``output``, ``cache_read``,
    ``cache_write``), with where it comes from."""

    models: dict[str, dict[str, float]]
    date: str = ""
    source: str = ""

    def of(self, model: str | None) -> dict[str, float] | None:
        """The prices of ``model``: its own entry, else that of the name without a ``-YYYYMMDD``
        date or a ``provider/`` prefix, else the longest entry the name starts with (None: unknown)."""
        if not model:
            return None
        for name in (model, model.rsplit("/", 1)[-1]):
            if name in self.models:
                return self.models[name]
            bare = re.sub(r"-\d{8}$", "", name)
            if bare in self.models:
                return self.models[bare]
        best = max((k for k in self.models if model.rsplit("/", 1)[-1].startswith(k)), key=len, default=None)
        return self.models[best] if best is not None else None

    def cost(self, model: str | None, t: Tokens) -> float | None:
        """What ``t`` costs with ``model``'s prices (None: the model has none)."""
        p = self.of(model)
        return None if p is None else priced(p, t.input, t.output, t.cache_read, t.cache_write)


def priced(p: dict[str, float], i: int, o: int, cr: int, cw: int) -> float:
    """What these counts (input, output, cache reads, cache writes) cost at prices ``p`` (USD per
    million tokens; a missing price is 0). Raises nothing."""
    return (i * p.get("input", 0.0) + o * p.get("output", 0.0)
            + cr * p.get("cache_read", 0.0) + cw * p.get("cache_write", 0.0)) / 1e6


def _price(v: Any) -> bool:
    """Whether ``v`` is a price: a number, finite (as a float), 0 or more."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v)) and v >= 0
    except OverflowError:  # an integer beyond any float
        return False


def load_prices(path: str | None = None) -> Prices:
    """The price table shipped with castore (``castore/data/prices.json``), or the one at ``path``.

    A table is ``{"date": ..., "source": ..., "models": {NAME: {"input": USD, "output": USD,
    "cache_read": USD, "cache_write": USD}}}`` (USD per million tokens, each a finite number
    of 0 or more; a missing price is 0). A table given replaces the shipped one whole.

    Raises:
        UsageError: the file cannot be read or is not such a table (a price that is no number,
            negative or infinite; a key other than those four, such as a misspelt one).
    """
    where = path or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "prices.json")
    try:
        with open(where, "rb") as f:
            doc = json.loads(f.read())
    except OSError as e:
        raise UsageError(f"cannot read the price table {where}: {e.strerror or e}") from e
    except ValueError as e:
        raise UsageError(f"the price table {where} is not JSON: {e}") from e
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict):
        raise UsageError(f"the price table {where} has no \"models\" object")
    out: dict[str, dict[str, float]] = {}
    for name, p in models.items():
        if not isinstance(p, dict) or not all(_price(p.get(k, 0)) for k in _FIELDS):
            raise UsageError(f"the price table {where}: model {name!r} needs numbers of 0 or more (USD per "
                             f"million tokens) for {', '.join(_FIELDS)}")
        if unknown := sorted(str(k) for k in p if k not in _FIELDS):
            raise UsageError(f"the price table {where}: model {name!r} has {', '.join(map(repr, unknown))}, "
                             f"not one of {', '.join(_FIELDS)}")
        out[name] = {k: float(p.get(k, 0)) for k in _FIELDS}
    return Prices(out, str(doc.get("date", "")), str(doc.get("source", "")))




__all__ = ["Prices", "UsageError", "load_prices", "priced"]
