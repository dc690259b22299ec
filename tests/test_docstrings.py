"""Every public function and method of castore has a docstring, and a docstring names each
CastoreError its function raises itself.

An AST walk over ``castore/``: a function or method is public when its name and the names of
the classes around it do not begin with ``_``. Exempt: a property's setter (its getter holds
the docstring), an ``@overload`` stub, the ``...`` body of a Protocol's member (the
implementation holds the docstring), and a click command (its docstring is the command's
``--help``; its errors are printed as ``Error: ...``). "Raises itself": a ``raise X(...)`` or
``raise X`` in the function's own body (not in a function nested in it), where ``X`` is
:class:`castore.errors.CastoreError` or a class of castore derived from it; the docstring must
name ``X`` (a ``Raises:`` section, or the prose).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "castore"

_Def = ast.FunctionDef | ast.AsyncFunctionDef


def _sources(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def castore_errors(trees: list[ast.Module]) -> set[str]:
    """The names of CastoreError and of every class in ``trees`` derived from it."""
    bases: dict[str, set[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                names = {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, ast.Name | ast.Attribute)}
                bases.setdefault(node.name, set()).update(names)
    errors = {"CastoreError"}
    grew = True
    while grew:
        grew = False
        for name, of in bases.items():
            if name not in errors and of & errors:
                errors.add(name)
                grew = True
    return errors


def _own_nodes(fn: _Def) -> Iterator[ast.AST]:
    """The nodes of ``fn``'s body, not descending into functions, lambdas or classes in it."""
    nested = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef
    todo: list[ast.AST] = [node for node in fn.body if not isinstance(node, nested)]
    while todo:
        node = todo.pop()
        yield node
        todo.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, nested))


def raised(fn: _Def, errors: set[str]) -> set[str]:
    """The CastoreErrors (by name) that ``fn`` raises in its own body."""
    out = set()
    for node in _own_nodes(fn):
        if isinstance(node, ast.Raise) and node.exc is not None:
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = exc.id if isinstance(exc, ast.Name) else exc.attr if isinstance(exc, ast.Attribute) else None
            if name in errors:
                out.add(name)
    return out


def _exempt(fn: _Def, in_protocol: bool) -> bool:
    for d in fn.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        if name in ("overload", "setter", "deleter", "command", "group"):
            return True
    stub = len(fn.body) == 1 and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
        and fn.body[0].value.value is Ellipsis
    return in_protocol and stub


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any((b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "") == "Protocol"
               for b in cls.bases)


def _public_functions(body: list[ast.stmt], where: str, in_protocol: bool = False) -> Iterator[tuple[str, _Def]]:
    for node in body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from _public_functions(node.body, f"{where}{node.name}.", _is_protocol(node))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            if not _exempt(node, in_protocol):
                yield f"{where}{node.name}", node


def problems(root: Path = PACKAGE) -> list[str]:
    """One line per public function of the package under ``root`` without a docstring, or
    whose docstring does not name a CastoreError it raises itself."""
    paths = _sources(root)
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in paths]
    errors = castore_errors(trees)
    out = []
    for path, tree in zip(paths, trees, strict=True):
        rel = path.relative_to(root.parent).as_posix()
        for name, fn in _public_functions(tree.body, ""):
            doc = ast.get_docstring(fn)
            if not doc:
                out.append(f"{rel}:{fn.lineno}: {name} has no docstring")
                continue
            unsaid = sorted(e for e in raised(fn, errors) if e not in doc)
            if unsaid:
                out.append(f"{rel}:{fn.lineno}: {name} raises {', '.join(unsaid)}; its docstring does not say so")
    return out


def test_every_public_function_has_a_docstring_that_says_what_it_raises() -> None:
    found = problems()
    assert not found, "public functions to document:\n" + "\n".join(found)


def _package(tmp_path: Path, source: str) -> Path:
    root = tmp_path / "castore"
    root.mkdir()
    (root / "errors.py").write_text("class CastoreError(Exception):\n    pass\n\n\n"
                                    "class BadThing(CastoreError, ValueError):\n    pass\n")
    (root / "mod.py").write_text(source)
    return root


def test_the_check_finds_a_missing_docstring(tmp_path: Path) -> None:
    root = _package(tmp_path, "class Thing:\n    def size(self) -> int:\n        return 1\n")
    assert problems(root) == ["castore/mod.py:2: Thing.size has no docstring"]


def test_the_check_finds_an_error_the_docstring_does_not_name(tmp_path: Path) -> None:
    source = ('from .errors import BadThing\n\n\ndef check(x: int) -> None:\n    """Check x."""\n'
              "    if x < 0:\n        raise BadThing(x)\n")
    assert problems(_package(tmp_path, source)) == [
        "castore/mod.py:4: check raises BadThing; its docstring does not say so"]


def test_the_check_passes_private_names_stubs_and_documented_raises(tmp_path: Path) -> None:
    source = ('from typing import Protocol\n\nfrom .errors import BadThing\n\n\n'
              "def _helper() -> None:\n    pass\n\n\n"
              "class _Private:\n    def run(self) -> None:\n        pass\n\n\n"
              "class Host(Protocol):\n    def exists(self) -> bool: ...\n\n\n"
              'def check(x: int) -> None:\n    """Check x.\n\n    Raises:\n        BadThing: x < 0.\n    """\n'
              "    def inner() -> None:\n        raise BadThing(x)\n"
              "    if x < 0:\n        raise BadThing(x)\n")
    assert problems(_package(tmp_path, source)) == []
