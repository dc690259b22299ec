"""The ``castore`` command: a thin click layer over the library (parse, call, print).

:func:`run` is the ``castore`` process (:func:`main`, the click group, in a process of its
own; the console script and ``python -m castore`` reach it through
:func:`castore.__main__.main`). Commands are grouped in modules (:mod:`.session_cmds`,
:mod:`.inspect_cmds`, :mod:`.demo`, and optional ones for other areas, see :mod:`.main`);
:mod:`.common` holds the helpers they share and :mod:`.render` the text and JSON rendering.

``main``, ``cli`` and ``run`` are imported from :mod:`.main` on first use, not with the package:
a fresh ``castore grep`` runs :mod:`.fast`, which loads no click (:mod:`.grep_spec`,
:mod:`.plain`, :mod:`.grep_search` and :mod:`.text` are click-free too). ``castore.cli.main``
stays the click group once the module of that name is imported, as when this package imported
it eagerly.
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _Package(types.ModuleType):
    """This package, whose attribute ``main`` is the group, never the submodule ``castore.cli.main``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "main" and isinstance(value, types.ModuleType):
            return  # the import system naming the submodule on its package: the group keeps the name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        value = getattr(importlib.import_module(f"{__name__}.main"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["main", "cli", "run"]
