"""Which coding agent wrote a session file or folder, told by content, never by name.

``castore import PATH`` asks :func:`detect` which importer to run; each importer asks
:func:`refuse_other` first, so that a file of another agent (a Pi file given to ``import
claude``, a Claude Code folder to ``import codex``) is refused with one line naming what it
looks like, instead of being imported as lines that mean nothing to that importer.

A file is recognised by its first records (at most :data:`SAMPLE_LINES` lines of the first
:data:`FIRST_BYTES` bytes, or of :data:`SAMPLE_BYTES` when its first line is longer, so a huge
file costs one bounded read), each record by the fields only one agent writes:

- Claude Code: ``uuid``/``parentUuid`` on a line, or its line types without them
  (``file-history-snapshot``, ``queue-operation``, a ``summary`` with ``leafUuid``);
- Codex CLI: a ``type`` of ``session_meta``/``response_item``/``event_msg``/``turn_context``/
  ``compacted`` with a ``payload`` (and the legacy bare meta line, with ``instructions``);
- Pi: a ``session`` header, or its entry types with ``id`` and ``parentId``;
- Gemini CLI: a record with ``sessionId`` and ``projectHash`` (the first line, or the whole
  file of the older JSON format), ``$set``/``$rewindTo`` records, or a message of type
  ``gemini``.

A folder is recognised by the files an import would read (``.jsonl``, and ``.json`` for Gemini's
older format), sampled up to :data:`SAMPLE_FILES`: the agent the recognised ones point to. A
folder whose files are of several agents is refused (by :func:`detect` and :func:`refuse_other`
alike), naming a file of each: an importer reads every file of a folder as its own agent's, so
``import PATH`` of a folder holding Claude Code, Codex and Pi files used to import the Codex and
Pi files as Claude Code sessions.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from typing import Any

from .jsonl_tree import ArchiveError, files_under

#: vendor key -> the name people know it by
VENDORS = {"claude": "Claude Code", "codex": "Codex CLI", "pi": "Pi", "gemini": "Gemini CLI"}
#: records read from the head of a file
SAMPLE_LINES = 8
#: bytes read from the head of a file first (an import checks at every round of ``--follow``)
FIRST_BYTES = 64 << 10
#: bytes read from the head of a file at most: a first line longer than FIRST_BYTES, or a whole
#: older-format Gemini file (one pretty-printed JSON document)
SAMPLE_BYTES = 4 << 20
#: files of a folder looked at
SAMPLE_FILES = 24

_CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
_PI_TYPES = frozenset({"message", "model_change", "thinking_level_change", "compaction", "branch_summary", "custom",
                       "custom_message", "label", "session_info"})
_CLAUDE_TYPES = frozenset({"file-history-snapshot", "queue-operation"})


def record_vendor(d: Any) -> str | None:
    """The agent a parsed record is of (a key of :data:`VENDORS`), or None when it does not say."""
    if not isinstance(d, dict):
        return None
    t = d.get("type")
    if ("sessionId" in d and "projectHash" in d) or isinstance(d.get("$set"), dict) \
            or isinstance(d.get("$rewindTo"), str) or (t == "gemini" and "id" in d):
        return "gemini"
    if "uuid" in d or "parentUuid" in d or t in _CLAUDE_TYPES or (t == "summary" and "leafUuid" in d):
        return "claude"
    if t in _CODEX_TYPES and "payload" in d:
        return "codex"
    if t == "session" and isinstance(d.get("id"), str):
        return "pi"
    if t in _PI_TYPES and "id" in d and "parentId" in d:
        return "pi"
    if "id" in d and "timestamp" in d and "instructions" in d and "type" not in d:
        return "codex"  # a legacy rollout's bare meta line
    return None


def file_vendor(path: str) -> str | None:
    """The agent a session file is of, by its first records (None: none recognised).

    Raises:
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        head = f.read(FIRST_BYTES)
        if b"\n" not in head or head.lstrip().startswith(b"{\n"):  # a long first line, or one JSON document
            head += f.read(SAMPLE_BYTES - len(head))
    votes: Counter[str] = Counter()
    for raw in head.split(b"\n")[:SAMPLE_LINES]:
        if not raw.strip():
            continue
        try:
            v = record_vendor(json.loads(raw))
        except (ValueError, RecursionError):
            continue
        if v is not None:
            votes[v] += 1
    if not votes and head.lstrip().startswith(b"{"):  # a whole-file JSON document (Gemini's older format)
        try:
            v = record_vendor(json.loads(head))
        except (ValueError, RecursionError):
            v = None
        if v is not None:
            votes[v] += 1
    return votes.most_common(1)[0][0] if votes else None


def _sample(root: str) -> list[str]:
    """The first files of ``root`` whose agent is asked: through linked folders, as Claude
    Code's importer reads them (``~/.claude`` with ``projects`` linked by a dotfiles manager)."""
    return list(itertools.islice(files_under(root, (".jsonl", ".json"), links=True), SAMPLE_FILES))


def detect(path: str | os.PathLike[str]) -> str | None:
    """The agent whose sessions ``path`` (a file, or a folder searched recursively) holds, or None.

    Raises:
        ArchiveError: no such file or folder.
    """
    p = os.fspath(path)
    if os.path.isfile(p):
        try:
            return file_vendor(p)
        except OSError as e:
            raise ArchiveError(p, f"cannot read it: {e.strerror or e}") from e
    if not os.path.isdir(p):
        raise ArchiveError(p, "no such file or folder")
    found = _folder(p)
    if len(found) > 1:
        raise ArchiveError(p, _mixed(p, found))
    return next(iter(found), None)


def _folder(root: str) -> dict[str, str]:
    """The agents the sampled files of folder ``root`` are of: vendor -> its first file."""
    found: dict[str, str] = {}
    for f in _sample(root):
        try:
            v = file_vendor(f)
        except OSError:
            continue
        if v is not None:
            found.setdefault(v, f)
    return found


def _mixed(root: str, found: dict[str, str]) -> str:
    said = ", ".join(f"{VENDORS[v]} ({os.path.relpath(f, root)})" for v, f in sorted(found.items()))
    return (f"holds the sessions of several agents: {said}; import each agent's folder with "
            "`castore import claude|codex|pi|gemini PATH`")


def refuse_other(path: str | os.PathLike[str], want: str) -> None:
    """Refuse ``path`` when it holds another agent's sessions than ``want``'s.

    Anything not recognised (an empty file, lines that are no known agent's) is let through:
    the importer itself says what it makes of it.

    Raises:
        ArchiveError: one line naming the agent ``path`` looks like, and the command for it; or,
            for a folder that holds other agents' files beside ``want``'s, naming a file of each.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        found = _folder(p)
        if len(found) > 1:
            raise ArchiveError(p, _mixed(p, found))
        got = next(iter(found), None)
    else:
        got = detect(p)
    if got is not None and got != want:
        raise ArchiveError(os.fspath(path), f"looks like {VENDORS[got]} sessions, not {VENDORS[want]}: "
                                            f"import it with `castore import {got} PATH` (or `castore import PATH`)")


__all__ = ["VENDORS", "detect", "file_vendor", "record_vendor", "refuse_other"]
