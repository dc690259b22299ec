"""Bytes stored (sum of file sizes) and disk usage (st_blocks * 512, folders included, like du)."""

from __future__ import annotations

import os
from collections.abc import Iterable


def tree(path: str) -> tuple[int, int, int]:
    """(sum of file sizes, disk usage of files and folders, file count) under ``path``."""
    size = blocks = files = 0
    if not os.path.exists(path):
        return 0, 0, 0
    if os.path.isfile(path):
        st = os.stat(path)
        return st.st_size, st.st_blocks * 512, 1
    for dirpath, _dirs, names in os.walk(path):
        blocks += os.stat(dirpath).st_blocks * 512
        for name in names:
            st = os.stat(os.path.join(dirpath, name))
            size += st.st_size
            blocks += st.st_blocks * 512
            files += 1
    return size, blocks, files


def files(paths: Iterable[str]) -> tuple[int, int]:
    """(sum of sizes, disk usage) of the files in ``paths`` that exist."""
    size = blocks = 0
    for p in paths:
        if os.path.exists(p):
            st = os.stat(p)
            size += st.st_size
            blocks += st.st_blocks * 512
    return size, blocks


def stored_bytes(root: str) -> int:
    """Bytes of a local store's objects as stored: every file under ``objects/`` and ``packs/``
    (loose objects, packs and their indexes; refs, logs of live writers and config excluded)."""
    total = 0
    for sub in ("objects", "packs"):
        for dirpath, _dirs, names in os.walk(os.path.join(root, sub)):
            total += sum(os.path.getsize(os.path.join(dirpath, name)) for name in names)
    return total
