"""The layers of castore, enforced: a module imports only its own layer and the ones below.

The list is :data:`LAYERS` below; the docstring of ``castore/__init__.py`` shows the same
list (a test compares them).

Third-party packages stay in their corner: click only in cli/; fsspec, s3fs, botocore and
aiobotocore only in storage/; msgspec only in objects.py; blake3 and zstandard only there and in
frames.py; cryptography only in crypto/.
No module imports another's private name (``from .refs import _x``).
``castore/__init__.py`` (the curated public API) is exempt. Imports under
``if TYPE_CHECKING:`` count like any other: a type-only import of a higher layer is a
dependency cycle all the same (define a small Protocol below instead).
A module with no layer fails the test until it is given one below.
"""

from __future__ import annotations

import ast
import io
import itertools
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "castore"

LAYERS: list[tuple[str, ...]] = [
    ("errors", "names", "aio", "redact", "gcpause", "listing", "forked", "handles"),
    ("storage",),
    ("objects", "frames", "zdict", "crypto", "objectstore", "refs", "formats"),
    ("history", "state", "entries", "pathfacts"),
    ("plumbing", "refnames", "retry", "groupcommit", "revisions", "pathview", "deletion"),
    ("context",),
    ("session", "store", "sessionlist", "scopes"),
    ("sync", "remotes", "maintenance", "scrub", "grep", "views", "porcelain", "convert", "cachedir"),
    ("adapters", "html", "usage"),
    ("cli", "__main__"),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
#: ``import castore`` from inside the package pulls in what __init__ re-exports (session, store)
PACKAGE_RANK = RANK["session"]

CORNERS = {
    "click": ("cli",),
    "fsspec": ("storage",),
    "s3fs": ("storage",),
    "botocore": ("storage",),
    "aiobotocore": ("storage",),
    "msgspec": ("objects",),
    "blake3": ("objects", "frames"),
    "zstandard": ("objects", "frames"),
    "cryptography": ("crypto",),
}


def module_name(path: Path, root: Path = PACKAGE) -> list[str]:
    """``castore/storage/local.py`` -> ``["castore", "storage", "local"]``."""
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return parts


def area(mod: list[str]) -> str | None:
    """The layer key of a castore module: its first part below ``castore``."""
    return mod[1] if len(mod) > 1 else None


def rank_of(mod: list[str]) -> int | None:
    a = area(mod)
    if a is None:
        return PACKAGE_RANK
    return RANK.get(a)


def imports_of(source: str, mod: list[str], is_package: bool, root: Path = PACKAGE) -> list[tuple[int, str, str]]:
    """Every import in ``source`` as ``(line, imported module, as written)``, relative ones resolved."""
    tree = ast.parse(source)
    out: list[tuple[int, str, str]] = []
    package = mod if is_package else mod[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                out.append((node.lineno, alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            written = f"from {'.' * node.level}{node.module or ''} import {', '.join(a.name for a in node.names)}"
            if node.level == 0:
                base = (node.module or "").split(".")
            else:
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                target = base + [alias.name]
                # ``from . import names``: a submodule; ``from .errors import X``: the module itself
                if base[:1] == ["castore"] and _is_module(target, root):
                    out.append((node.lineno, ".".join(target), written))
                else:
                    out.append((node.lineno, ".".join(base), written))
    return out


def private_imports(source: str, mod: list[str], is_package: bool, root: Path = PACKAGE) -> list[tuple[int, str, str]]:
    """``(line, name, module)`` for each private name (``_x``, not a dunder) that ``source``
    imports from another castore module: a private name stays in its module (ruff's SLF001
    catches ``module._x`` and ``obj._x``; this catches ``from .module import _x``)."""
    package = mod if is_package else mod[:-1]
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 0:
            base = (node.module or "").split(".")
        else:
            base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
        if base[:1] != ["castore"] or base == mod:
            continue
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            if private and not _is_module(base + [alias.name], root):
                out.append((node.lineno, alias.name, ".".join(base)))
    return out


def _is_module(parts: list[str], root: Path) -> bool:
    p = root.parent.joinpath(*parts)
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def violations(path: Path, source: str, root: Path = PACKAGE) -> list[str]:
    """What is wrong with the imports of one file, one message per bad import."""
    rel = path.relative_to(root.parent).as_posix()
    mod = module_name(path, root)
    if len(mod) == 1:
        return []  # castore/__init__.py: the public API, exempt
    own = rank_of(mod)
    if own is None:
        return [f"{rel}: module has no layer; add {area(mod)!r} to LAYERS in tests/test_layers.py"]
    problems = [f"{rel}:{line}: imports {name}, a private name of {where}: make it public there, or move "
                "what uses it into that module" for line, name, where in private_imports(source, mod, path.name ==
                                                                                   "__init__.py", root)]
    for line, target, written in imports_of(source, mod, path.name == "__init__.py", root):
        parts = target.split(".")
        top = parts[0]
        if top in CORNERS and area(mod) not in CORNERS[top]:
            allowed = " or ".join(f"castore/{c}" for c in CORNERS[top])
            problems.append(f"{rel}:{line}: `{written}` - {top} may only be imported in {allowed}")
        if top != "castore":
            continue
        theirs = rank_of(parts)
        if theirs is None:
            continue  # reported when that module itself is checked
        if theirs > own:
            problems.append(
                f"{rel}:{line}: `{written}` - layer {LAYERS[own]} imports {target} "
                f"from the higher layer {LAYERS[theirs]}"
            )
    return problems


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_imports_only_its_layer_and_below():
    problems = [msg for p in _sources() for msg in violations(p, p.read_text(encoding="utf-8"))]
    assert not problems, "layer violations:\n" + "\n".join(problems)


#: no module holds more lines of code than this (docstrings, comments and blank lines not
#: counted): one sitting's read
MAX_CODE_LINES = 800
#: modules over the limit while being split, each with the reason it may stay for now
OVER_THE_LIMIT: dict[str, str] = {}
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENDMARKER, tokenize.ENCODING}


def code_lines(source: str) -> int:
    """The lines of ``source`` that hold code: a token other than a comment, and not part of
    a docstring (a string standing alone as a statement: module, class, function and
    attribute docstrings)."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.difference_update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return len(lines)


def test_no_module_has_more_than_800_lines_of_code():
    sizes = {p.relative_to(PACKAGE.parent).as_posix(): code_lines(p.read_text(encoding="utf-8")) for p in _sources()}
    over = {rel: n for rel, n in sizes.items() if n > MAX_CODE_LINES and rel not in OVER_THE_LIMIT}
    assert not over, f"modules over {MAX_CODE_LINES} lines of code (split them by concept): {over}"
    stale = [rel for rel in OVER_THE_LIMIT if sizes.get(rel, 0) <= MAX_CODE_LINES]
    assert not stale, f"no longer over the limit, drop them from OVER_THE_LIMIT: {stale}"


#: where each family of module-level constants is defined, the one place per protocol: the keys
#: of ref metadata (castore.refnames) and of a ref's read hint (castore.history.Hint); no other
#: module defines a constant of the same name
CONSTANT_HOMES = {"META_": "castore/refnames.py", "HINT_": "castore/history.py"}


def constants_defined(source: str, prefix: str) -> list[str]:
    """The module-level names starting with ``prefix`` that ``source`` assigns."""
    out = []
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        out += [t.id for t in targets if isinstance(t, ast.Name) and t.id.startswith(prefix)]
    return out


def test_ref_metadata_and_read_hint_keys_are_defined_in_one_module_each():
    for prefix, home in CONSTANT_HOMES.items():
        own = set(constants_defined((PACKAGE.parent / home).read_text(encoding="utf-8"), prefix))
        assert own, f"{home} defines no {prefix}* constant"
        elsewhere = {rel: sorted(own & set(constants_defined(p.read_text(encoding="utf-8"), prefix)))
                     for p in _sources() if (rel := p.relative_to(PACKAGE.parent).as_posix()) != home}
        elsewhere = {rel: names for rel, names in elsewhere.items() if names}
        assert not elsewhere, f"these constants of {home} are defined again (import them from there): {elsewhere}"


#: modules that still import castore.refnames' names through castore.plumbing's re-exports,
#: each with why it may for now; the list only shrinks
THROUGH_PLUMBING: dict[str, str] = {}


def names_through_plumbing(source: str) -> list[str]:
    """The names of castore.refnames that ``source`` imports from castore.plumbing."""
    moved = set(constants_defined((PACKAGE / "refnames.py").read_text(encoding="utf-8"), ""))
    moved |= {n.name for n in ast.parse((PACKAGE / "refnames.py").read_text(encoding="utf-8")).body
              if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    return sorted(a.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
                  and (node.module or "").split(".")[-1] == "plumbing" for a in node.names if a.name in moved)


def test_ref_names_are_imported_from_refnames_not_through_plumbing():
    found = {rel: got for p in _sources() if (rel := p.relative_to(PACKAGE.parent).as_posix()) not in THROUGH_PLUMBING
             and (got := names_through_plumbing(p.read_text(encoding="utf-8")))}
    assert not found, f"import these from castore.refnames, where they are defined: {found}"
    stale = [rel for rel in THROUGH_PLUMBING if not names_through_plumbing((PACKAGE.parent / rel).read_text("utf-8"))]
    assert not stale, f"these import from castore.refnames now, drop them from THROUGH_PLUMBING: {stale}"


def test_the_checks_of_one_home_find_a_constant_and_a_name_elsewhere():
    assert constants_defined("META_X = 'x'\nHINT_Y: str = 'y'\ndef f():\n    META_Z = 1\n", "META_") == ["META_X"]
    assert names_through_plumbing("from .plumbing import Batch, SessionRefs, real_name\n") == ["SessionRefs", "real_name"]
    assert names_through_plumbing("from .refnames import SessionRefs\n") == []


def test_code_lines_leave_out_docstrings_comments_and_blank_lines():
    source = '''"""Module docstring,
on two lines."""

import os  # a comment


class A:
    """Class docstring."""

    x = 1
    """An attribute docstring."""

    def f(self):
        # a comment alone
        return """not a docstring:
a value"""
'''
    assert code_lines(source) == 6  # import, class, x, def, and the returned string's two lines


def _documented_layers() -> list[tuple[str, ...]]:
    doc = (PACKAGE / "__init__.py").read_text(encoding="utf-8")
    lines = doc.split("(``tests/test_layers.py`` enforces exactly this list)::\n\n", 1)[1].splitlines()
    block = [line for line in itertools.takewhile(lambda line: line.startswith("    "), lines)]
    return [tuple(n.strip() for n in line.strip().split("  ", 1)[0].split(",")) for line in block]


def test_the_package_docstring_lists_exactly_the_enforced_layers():
    assert _documented_layers() == LAYERS


def test_no_reference_to_a_design_document_that_is_not_there():
    cited = "DESIGN" + ".md"  # spelled apart so that this test does not find itself
    for p in [*_sources(), Path(__file__)]:
        text = p.read_text(encoding="utf-8")
        if cited in text:
            assert (PACKAGE.parent / cited).is_file(), f"{p} cites {cited}, which is not in the repository"


def test_the_scan_sees_the_whole_package():
    found = {module_name(p)[1] for p in _sources() if len(module_name(p)) > 1}
    assert {"errors", "names", "storage", "objects", "objectstore", "refs", "history", "session", "store"} <= found


# -- the checker itself catches what it must ---------------------------------------------------


def _check(rel: str, source: str, tmp_path: Path) -> list[str]:
    root = tmp_path / "castore"
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in ("session.py", "store.py", "errors.py", "names.py", "objects.py", "refs.py", "history.py"):
        (root / name).touch()
    (root / "storage").mkdir(exist_ok=True)
    (root / "storage" / "__init__.py").touch()
    path.write_text(source)
    return violations(path, source, root)


@pytest.mark.parametrize(
    "rel, source, needle",
    [
        ("storage/local.py", "from ..session import Session\n", "castore.session"),
        ("storage/local.py", "def f():\n    from castore import store\n", "castore.store"),
        ("refs.py", "from . import history\n", "castore.history"),
        ("objects.py", "import castore\n", "castore"),
        ("history.py", "import click\n", "click may only be imported in castore/cli"),
        ("refs.py", "import s3fs\n", "s3fs may only be imported in castore/storage"),
        ("session.py", "from botocore.exceptions import ClientError\n", "botocore may only"),
        ("objectstore.py", "import msgspec.msgpack\n", "msgspec may only be imported in castore/objects"),
        ("cli/main.py", "import blake3\n", "blake3"),
        ("newthing.py", "import os\n", "has no layer"),
        ("context.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .session import LogEntry\n",
         "castore.session"),
        ("session.py", "from .refs import _serialize\n", "imports _serialize, a private name of castore.refs"),
        ("storage/local.py", "def f():\n    from ..names import _ALLOWED\n", "a private name of castore.names"),
    ],
)
def test_the_checker_names_the_file_and_the_bad_import(tmp_path, rel, source, needle):
    problems = _check(rel, source, tmp_path)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"castore/{rel}")
    assert needle in problems[0]


@pytest.mark.parametrize(
    "rel, source",
    [
        ("session.py", "from .store import Store\nfrom . import names\nfrom .errors import CastoreError\n"),
        ("storage/s3.py", "import s3fs\nfrom botocore.exceptions import ClientError\nfrom ..errors import X\n"),
        ("objects.py", "import msgspec\nfrom blake3 import blake3\nimport zstandard\n"),
        ("cli/main.py", "import click\nimport castore\nfrom ..session import Session\n"),
        ("storage/local.py", "from ..errors import StorageError\nfrom .base import Storage\n"),
        ("session.py", "from .errors import __all__ as error_names\n"),
    ],
)
def test_the_checker_allows_what_the_layers_allow(tmp_path, rel, source):
    assert _check(rel, source, tmp_path) == []
