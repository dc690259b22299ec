"""Terminal-safe text: the one escaping rule for everything castore prints for people.

What a model wrote (and names, authors, keys, paths from any client or remote) reaches the
reader's terminal: ESC starts colour and OSC sequences (OSC 52 writes the clipboard), CR
and backspace overwrite what was shown, C1 controls (0x9B is CSI) act as ESC on some
terminals, and bidi overrides (U+202E) reorder text. Like git quoting a path, human output
shows them as visible escapes (``\\x1b``, ``\\r``, ``\\x9b``, ``\\u202e``).

This module sits below :mod:`.common` and :mod:`.render` (both use it; it imports
neither). ``--json`` output stays exact JSON: :func:`safe_json` writes the same characters
as JSON escapes, so the document parses to the same value.
"""

from __future__ import annotations

import functools
import re

_NAMED = {0x07: "\\a", 0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0B: "\\v", 0x0C: "\\f", 0x0D: "\\r"}
_UNSAFE = [*range(0x20), 0x7F, *range(0x80, 0xA0), 0x061C, 0x200E, 0x200F,
           *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_LINE = {c: _NAMED.get(c) or (f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}") for c in _UNSAFE}
_BLOCK = {c: v for c, v in _LINE.items() if c not in (0x09, 0x0A)}
#: what JSON text may still hold raw (json.dumps escapes C0 itself): DEL, C1, bidi controls
_JSON = {c: f"\\u{c:04x}" for c in _UNSAFE if c >= 0x7F}


def _finder(chars: dict[int, str]) -> re.Pattern[str]:
    """A search for any of ``chars``, written as ranges (a class of a hundred single characters
    takes re a millisecond or more to compile, every ``castore`` command's start)."""
    codes = sorted(chars)
    runs: list[list[int]] = []
    for c in codes:
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return re.compile("[" + "".join(f"\\u{a:04x}" if a == b else f"\\u{a:04x}-\\u{b:04x}" for a, b in runs) + "]")


@functools.cache
def _any(which: str) -> re.Pattern[str]:
    """The search for the characters of ``_LINE``, ``_BLOCK`` or ``_JSON``, compiled on first use: a
    class beyond Latin-1 takes re a fraction of a millisecond, and printable ASCII needs none."""
    return _finder({"line": _LINE, "block": _BLOCK, "json": _JSON}[which])


def safe(text: object) -> str:
    """``text`` for one line of human output: every control character (C0 including
    newline and tab, DEL, C1) and every bidi control written as a visible escape
    (``\\x1b``, ``\\r``, ``\\x9b``, ``\\u202e``). Other text, backslashes included, is kept.

    Apply it to data (names, authors, keys, message text), never to castore's own colour
    codes: ``style(safe(name), fg="green")``.
    """
    s = str(text)
    # printable ASCII first (most names and text: nothing to escape), then a search (most other
    # text holds none of these either, and a regex scan is much faster than translate)
    if s.isascii() and s.isprintable():
        return s
    return s.translate(_LINE) if _any("line").search(s) else s


#: the characters :func:`safe_block` escapes that ASCII text may hold
_ASCII_BLOCK = [chr(c) for c in _BLOCK if c < 0x80]
#: from this length on, :func:`safe_block` looks for each of them in an ASCII text in turn
_LONG = 512


def safe_block(text: object) -> str:
    """Like :func:`safe`, for multi-line text: newlines and tabs are kept as they are.

    The escaping is character by character, so it gives for a text what it gives for its
    pieces, joined: a long text (``castore grep``'s output lines, a batch at once) costs less
    than its lines one by one."""
    s = str(text)
    if s.isascii():
        # a long one (a line break fails isprintable, which takes some 27 instructions a
        # character) by a search for each character to escape (memchr: a fraction of one)
        if s.isprintable() if len(s) < _LONG else not any(map(s.__contains__, _ASCII_BLOCK)):
            return s
    return s.translate(_BLOCK) if _any("block").search(s) else s


def safe_json(text: str) -> str:
    """JSON text with DEL, C1 and bidi controls written as ``\\uXXXX`` escapes.

    The document parses to the same value (those characters can only occur inside JSON
    strings, where the escape means the character itself), and a terminal shows it
    as written. ``json.dumps`` already escapes C0 controls.
    """
    if text.isascii() and "\x7f" not in text:
        return text
    return text.translate(_JSON) if _any("json").search(text) else text


__all__ = ["safe", "safe_block", "safe_json"]
