"""The stylesheet and script inlined into every session view (no network, no build step).

They are real files, ``view.css`` and ``view.js`` beside this module, shipped as package
data (``[tool.setuptools.package-data]`` in pyproject.toml) and read once at import. The
script reads the embedded JSON (see :mod:`castore.html.model`) and builds the page with
``textContent`` and DOM calls only: no data ever reaches ``innerHTML``.
"""

from __future__ import annotations

from importlib.resources import files


def _read(name: str) -> str:
    # newline="" semantics are not needed: the files hold "\n" only, as the page expects
    return files(__package__).joinpath(name).read_text(encoding="utf-8")


CSS = _read("view.css")
JS = _read("view.js")

__all__ = ["CSS", "JS"]
