"""The public surface: every name in ``castore.__all__`` resolves, heavy parts load lazily,
``python -m castore`` runs the command line, nothing exported is dead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import castore

ROOT = Path(__file__).resolve().parent.parent


def test_every_exported_name_resolves() -> None:
    for name in castore.__all__:
        assert getattr(castore, name) is not None, name
    assert {"Context", "push", "pull", "clone", "SyncReport", "RetryPolicy", "RefContended"} <= set(castore.__all__)


def test_import_castore_does_not_load_sync_until_asked() -> None:
    code = ("import sys, castore; assert 'castore.sync' not in sys.modules; "
            "from castore import push; assert 'castore.sync' in sys.modules; print(push.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""}, check=True)
    assert out.stdout.strip() == "castore.sync"


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        castore.no_such_thing  # noqa: B018 - the access is the test


def test_python_dash_m_castore_runs_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "castore", "--help"], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert out.returncode == 0 and "Usage:" in out.stdout


def test_ref_not_found_is_raised_for_a_missing_branch_or_label() -> None:
    s = castore.open("memory://api-missing-ref").session("a", "u", "s")
    s.append(castore.Message(role="user", content="x"))
    with pytest.raises(castore.RefNotFound) as e:
        s.delete_branch("nope")
    assert e.value.ref == s.refs.branch("nope") and isinstance(e.value, castore.BranchError)
    with pytest.raises(castore.RefNotFound):
        s.delete_label("nope")
