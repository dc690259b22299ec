"""The ``castore`` command: a thin click layer over the library (parse, call, print).

:func:`run` is the ``castore`` process (:func:`main`, the click group, in a process of its
own; the console script and ``python -m castore`` reach it through
:func:`castore.__main__.main`). Commands are grouped in modules (:mod:`.session_cmds`,
:mod:`.inspect_cmds`, :mod:`.demo`, and optional ones for other areas, see :mod:`.main`);
:mod:`.common` holds the helpers they share and :mod:`.render` the text and JSON rendering.
"""

from __future__ import annotations

from .main import cli, main, run

__all__ = ["main", "cli", "run"]
