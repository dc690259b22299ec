"""Which coding agent wrote a session file or folder, told by content, never by name.

``castore import PATH`` asks :func:`detect` which importer to run; each importer asks
:func:`refuse_other` first, so that a file of another agent (a Pi file given to ``import
claude``, a Claude Code folder to ``import codex``) is refused with one line naming what it
looks like, instead of being imported as lines that mean nothing to that importer.

A file is recognised by its first records (at most :data:`SAMPLE_LINES` lines of the first
:data:`FIRST_BYTES` bytes, or of :data:`SAMPLE_BYTES` when its first line is longer, so a huge
file costs one bounded read), each record by the fields only one agent writes:

- Claude Code: ``uuid``/``parentUuid`` on a line, or its line types without them
  (``file-history-snapshot``, ``queue-operation``, a ``summary`` with ``leafUuid``, and the
  titles and settings it writes with a ``sessionId``: ``custom-title``, ``last-prompt``, ...);
- Codex CLI: a ``type`` of ``session_meta``/``response_item``/``event_msg``/``turn_context``/
  ``compacted`` with a ``payload`` (and the legacy bare meta line, with ``instructions``);
- Pi: a ``session`` header, or its entry types with an ``id`` (and a ``parentId``, or no
  ``role`` of its own, which an OpenAI message item given that type has);
- Gemini CLI: a record with ``sessionId`` and ``projectHash`` (the first line, or the whole
  file of the older JSON format), ``$set``/``$rewindTo`` records, or a message of type
  ``gemini``.

A file whose first records are JSON but none of them any agent's (``{"a": 1}`` lines) is
:data:`OTHER`: the importers refuse it (:func:`refuse_other`) rather than import lines that mean
nothing to them. A file with no record to tell by (empty, blank, lines that are not JSON, a first
line still being written) is let through: the importer says what it makes of it.

A folder is recognised by the files an import would read (``.jsonl``, and ``.json`` for Gemini's
older format), sampled up to :data:`SAMPLE_FILES`, those of an agent's session folders first
(:data:`SESSION_FOLDERS`): the agent the recognised ones point to. A
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
#: what :func:`file_kind` says of a file whose first records are JSON of no known agent
OTHER = "other"
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
    if "uuid" in d or "parentUuid" in d or t in _CLAUDE_TYPES or (t == "summary" and "leafUuid" in d) \
            or (isinstance(t, str) and isinstance(d.get("sessionId"), str)):  # custom-title, last-prompt, ...
        return "claude"
    if t in _CODEX_TYPES and "payload" in d:
        return "codex"
    if t == "session" and isinstance(d.get("id"), str):
        return "pi"
    if t in _PI_TYPES and "id" in d and ("parentId" in d or "role" not in d):  # an OpenAI item has its role
        return "pi"
    if "id" in d and "timestamp" in d and "instructions" in d and "type" not in d:
        return "codex"  # a legacy rollout's bare meta line
    return None


def file_vendor(path: str) -> str | None:
    """The agent a session file is of, by its first records (None: none recognised).

    Raises:
        OSError: the file cannot be read.
    """
    kind = file_kind(path)
    return None if kind == OTHER else kind


def file_kind(path: str) -> str | None:
    """What a file's first records are: an agent's (a key of :data:`VENDORS`, the one most of
    them point to), :data:`OTHER` (JSON, but no known agent's), or None (no record to tell by:
    empty, blank, or lines that are not JSON).

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
        votes[v or OTHER] += 1
    if not votes and head.lstrip().startswith(b"{"):  # a whole-file JSON document (Gemini's older format)
        try:
            votes[record_vendor(json.loads(head)) or OTHER] += 1
        except (ValueError, RecursionError):
            pass
    known = votes.copy()
    del known[OTHER]
    if known:
        return known.most_common(1)[0][0]
    return OTHER if votes else None


#: the folders an agent's own folder keeps its sessions in (``~/.claude/projects``,
#: ``~/.codex/sessions``, ``~/.pi/agent/sessions``, ``~/.gemini/tmp``), sampled before the rest
SESSION_FOLDERS = ("projects", "sessions", "archived_sessions", "agent/sessions", "tmp")


def _sample(root: str) -> list[str]:
    """The first files of ``root`` whose agent is asked, those of its :data:`SESSION_FOLDERS`
    first (``~/.claude/local`` holds an npm install's ``package.json`` files, which sort before
    ``projects`` and filled the sample); through linked folders, as Claude Code's importer reads
    them (``~/.claude`` with ``projects`` linked by a dotfiles manager)."""
    firsts = [os.path.join(root, d) for d in SESSION_FOLDERS if os.path.isdir(os.path.join(root, d))]
    out: dict[str, None] = {}  # a file of a session folder is met again under root
    for f in itertools.chain.from_iterable(files_under(d, (".jsonl", ".json"), links=True) for d in [*firsts, root]):
        out.setdefault(f)
        if len(out) == SAMPLE_FILES:
            break
    return list(out)


def detect(path: str | os.PathLike[str]) -> str | None:
    """The agent whose sessions ``path`` (a file, or a folder searched recursively) holds, or None.

    Raises:
        ArchiveError: no such file or folder.
    """
    p = os.fspath(path)
    if os.path.isfile(p):
        kind = _file(p)
        return None if kind == OTHER else kind
    if not os.path.isdir(p):
        raise ArchiveError(p, "no such file or folder")
    found = _folder(p)
    if len(found) > 1:
        raise ArchiveError(p, _mixed(p, found))
    return next(iter(found), None)


def _file(path: str) -> str | None:
    """:func:`file_kind` of ``path``, its error as an ArchiveError."""
    try:
        return file_kind(path)
    except OSError as e:
        raise ArchiveError(path, f"cannot read it: {e.strerror or e}") from e


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

    A file whose first records are JSON of no known agent (:data:`OTHER`) is refused too. A file
    with nothing to tell by (empty, blank, not JSON) and a folder none of whose sampled files
    is recognised are let through: the importer itself says what it makes of them (a folder
    such as ``~/.claude`` holds other JSON files beside the sessions, which say nothing).

    Raises:
        ArchiveError: one line naming the agent ``path`` looks like, and the command for it, or
            saying it looks like no known agent's; for a folder that holds other agents' files
            beside ``want``'s, naming a file of each; no such file or folder.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        found = _folder(p)
        if len(found) > 1:
            raise ArchiveError(p, _mixed(p, found))
        got = next(iter(found), None)
    elif os.path.isfile(p):
        got = _file(p)
    else:
        raise ArchiveError(p, "no such file or folder")
    if got == OTHER:
        raise ArchiveError(p, f"looks like no {VENDORS[want]} session file: its first lines are JSON of no known "
                              f"agent's sessions ({', '.join(VENDORS.values())})")
    if got is not None and got != want:
        raise ArchiveError(p, f"looks like {VENDORS[got]} sessions, not {VENDORS[want]}: "
                              f"import it with `castore import {got} PATH` (or `castore import PATH`)")


__all__ = ["OTHER", "VENDORS", "detect", "file_kind", "file_vendor", "record_vendor", "refuse_other"]
