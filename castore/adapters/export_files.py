"""The files an archive export writes: never over one that holds what the archive lacks.

``castore export claude ~/.claude/projects`` restores the transcripts Claude Code deleted into
the folder where it keeps the live ones. A live file the agent wrote on after the last import
(or rewrote) holds what the archive's copy lacks: writing that copy over it would lose it. So each
file is written beside its place first (under a side name of its own, ``NAME.<random>.castore-new``,
so that two exports into one folder never write one file) and moved there only when the file already there is
absent or a prefix of it (the archive holds all of it: the same file, or one cut short); any
other file (or a folder, a named pipe) is left as it is, and the export says which once the
others are written (:class:`FilesKept`). Every exporter (Claude Code, Codex, Gemini CLI, Pi) writes through
:class:`ExportWriter`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable

from .jsonl_tree import ArchiveError, safe_join

#: the suffix of a file being written beside its place (removed, or moved there, before the export returns)
NEW = ".castore-new"
#: tries at a side name no other writer holds (a clash of 48 random bits is next to impossible)
_SIDE_TRIES = 16
_CHUNK = 1 << 20


class FilesKept(ArchiveError):
    """An export left files under its destination as they were: they hold what the archive's
    copy lacks (import them first, or export into another folder). The other files were written.

    Attributes:
        written: the files written, relative to the destination.
        kept: the files left as they were, relative to the destination.
    """

    def __init__(self, dest: str, written: list[str], kept: list[str]) -> None:
        n = len(kept)
        shown = ", ".join(kept[:3]) + (f" and {n - 3} more" if n > 3 else "")
        super().__init__(dest, f"{n} file{'s' if n > 1 else ''} {'hold' if n > 1 else 'holds'} what the archive's "
                               f"copy lacks, left as {'they were' if n > 1 else 'it was'}: {shown} (import "
                               f"{'them' if n > 1 else 'it'} first, or export into another folder)")
        self.written = written
        self.kept = kept


class ExportWriter:
    """Writes an export's files under ``root``, never over a file that holds what the archive lacks."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.written: list[str] = []
        self.kept: list[str] = []

    def write(self, rel: str, chunks: Iterable[bytes]) -> None:
        """Write file ``root/rel`` of bytes ``chunks``, unless the file there holds what they lack.

        Raises:
            ArchiveError: ``rel`` would leave ``root`` (:func:`~castore.adapters.jsonl_tree.safe_join`).
            OSError, and what iterating ``chunks`` raises (nothing is left beside the file then).
        """

        def fill(path: str) -> None:
            with open(path, "wb") as f:
                f.writelines(chunks)

        self.write_with(rel, fill)

    def write_with(self, rel: str, fill: Callable[[str], None]) -> None:
        """Write file ``root/rel``: ``fill(path)`` writes its bytes at ``path`` (beside it), then
        it replaces the file there unless that one holds what it lacks (:func:`holds_more`).

        Raises:
            ArchiveError: ``rel`` would leave ``root`` (:func:`~castore.adapters.jsonl_tree.safe_join`).
            OSError, and what ``fill`` raises (nothing is left beside the file then).
        """
        out = safe_join(self.root, rel)
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        tmp = _side(out)
        try:
            fill(tmp)
            if holds_more(out, tmp):
                os.remove(tmp)
                self.kept.append(rel)
                return
            os.replace(tmp, out)
        except BaseException:
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise
        self.written.append(rel)

    def done(self) -> list[str]:
        """The files written, relative to ``root``.

        Raises:
            FilesKept: files were left as they were (the others are written).
        """
        if self.kept:
            raise FilesKept(self.root, self.written, self.kept)
        return self.written


def _side(out: str) -> str:
    """A new empty file beside ``out`` that is this writer's alone, ``out.<random>.castore-new``,
    and its name: created exclusively (a name another export holds, or a symbolic link planted
    there, is never opened: another name is drawn), so ``fill`` never writes a file another
    writer writes or through a link to a file outside the destination.

    Raises:
        OSError: the file cannot be created (FileExistsError: every name drawn was taken).
    """
    tries = _SIDE_TRIES
    while True:
        side = f"{out}.{os.urandom(6).hex()}{NEW}"
        try:
            fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except FileExistsError:
            tries -= 1
            if not tries:
                raise
            continue
        os.close(fd)
        return side


def holds_more(path: str, new: str) -> bool:
    """Whether something is at ``path`` that is not a prefix of file ``new``: writing ``new``
    over it would lose bytes. What is not a regular file there (a folder, a named pipe, which
    reading would wait on) is not a prefix. Raises OSError (reading either)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return True
        old = open(path, "rb")
    except FileNotFoundError:
        return False
    with old, open(new, "rb") as nf:
        while chunk := old.read(_CHUNK):
            if nf.read(len(chunk)) != chunk:
                return True
    return False


__all__ = ["NEW", "ExportWriter", "FilesKept", "holds_more"]
