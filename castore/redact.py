"""Secrets redacted before they are stored: detection of well-known secret formats and their tags.

A :class:`Redactor` finds secrets in text (``str``), in raw bytes (a JSONL line as an agent
wrote it) and in msgpack-able values (an entry's body, a state value), and replaces each one
with ``[REDACTED:<kind>:<8 hex>]``. The 8 hex digits are a keyed hash (BLAKE2b, keyed with the
store's redaction key, :func:`new_key`) of the secret, so the same secret gets the same tag in
every session of a store (linkable: "this key leaked in these three sessions") while the tag
tells nothing about it to whoever lacks the key: it cannot be brute-forced from the tag.

What is found (:data:`KINDS`, one compiled pattern each, tried as two alternations):

* formats with a fixed shape: AWS access key ids, Google API keys, Azure storage account
  keys and Entra client secrets, GitHub (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``,
  ``github_pat_``) and GitLab tokens, OpenAI, Anthropic, OpenRouter, Hugging Face, Groq,
  xAI, Replicate and Perplexity keys, Slack tokens and webhooks, Stripe, npm and PyPI tokens,
  private key blocks (PEM and OpenSSH, JSON-escaped newlines included), JWTs;
* secrets named by their context: the password in a URL (``scheme://user:PASSWORD@host``),
  an ``Authorization: Bearer`` token, an AWS secret access key assigned to an ``aws_...secret``
  name, and any high-entropy value assigned to a secret-sounding name (``PASSWORD=...``,
  ``"api_key": "..."``, ``client_secret: ...``): at least 8 characters, not an identifier,
  not a placeholder, at least 3 bits of entropy per character.

Only the secret is replaced (``password="[REDACTED:password:1f2e3d4c]"``, the user of a URL
stays), and a tag is never matched again: redacting twice is redacting once. Patterns run
on ``str`` and on ``bytes`` alike (compiled once for each), so raw lines are redacted without
decoding them; inside JSON-escaped text a value stops at the escaped quote. A private key is
tagged by its base64 body alone, so the same key in a JSON-escaped line and in a decoded
message gets one tag.

The patterns are castore's own, not a detector library's: detect-secrets (PyPI) was measured
on the same text (``scripts/bench_redact.py``, docs/benchmarks/BENCHMARKS-redact.md); it runs
each of its ~25 plugins over each line, knows none of the current model-provider key formats
(its OpenAI pattern is the legacy ``T3BlbkFJ`` one; no Anthropic, no ``github_pat_``, no
Google key), and reports secret strings rather than their places, for two orders of magnitude
more time per MB.
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: bytes of a redaction key (:func:`new_key`)
KEY_BYTES = 32
#: hex digits of a tag's keyed hash
TAG_HEX = 8
#: what every tag starts with (also what stops a value from being redacted again)
TAG_PREFIX = "[REDACTED:"
#: the key of a session's info that says its content was redacted before it was stored
#: (an export of it is not the original file)
REDACTED_INFO = "redacted"

# A value in a keyworded context: no whitespace, quotes, backslash (the end of a JSON-escaped
# string), brackets or separators; never a tag already (nor the hash inside one: a kind such as
# ``api-key:`` reads like an assignment).
_VAL = r"(?!\[REDACTED:|[0-9a-f]{8}\])[^\s\"'\\`<>()\[\]{},;|]"
_Q = r"\\?[\"']?"  # an optional quote, JSON-escaped or not
#: characters a token continues with: a fixed format found right after one is part of a longer word
_WORDISH = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


@dataclass(frozen=True)
class _Rule:
    """One kind of secret: ``needles`` (for a pattern that does not start with a literal: one of
    them is in any text it matches, and a substring test skips the regex; a pattern starting
    with a literal is searched at once, the regex engine skipping to that literal as fast),
    the pattern, the group holding the secret (0: the whole match), and whether the character
    before the match must not continue a word."""

    kind: str
    needles: tuple[str, ...]
    pattern: str
    group: int = 0
    alone: bool = True


_RULES: tuple[_Rule, ...] = (
    _Rule("private-key", (),
          r"-----BEGIN[A-Z0-9 _-]{0,40}PRIVATE KEY(?: BLOCK)?-----[\s\S]{16,20000}?"
          r"-----END[A-Z0-9 _-]{0,40}PRIVATE KEY(?: BLOCK)?-----", alone=False),
    _Rule("aws-access-key", (), r"A(?:3T[A-Z0-9]|KIA|SIA|BIA|CCA)[A-Z0-9]{16}(?![A-Z0-9])"),
    _Rule("gcp-api-key", (), r"AIza[0-9A-Za-z_-]{35}(?![\w-])"),
    _Rule("github-token", (), r"gh[pousr]_[A-Za-z0-9]{36,255}(?!\w)"),
    _Rule("github-token", (), r"github_pat_[A-Za-z0-9_]{50,255}"),
    _Rule("gitlab-token", (), r"glpat-[A-Za-z0-9_-]{20,64}"),
    _Rule("anthropic-key", (), r"sk-ant-[A-Za-z0-9_-]{20,255}"),
    _Rule("openrouter-key", (), r"sk-or-v1-[A-Za-z0-9]{32,255}"),
    _Rule("openai-key", (), r"sk-(?:proj|svcacct|admin|None)-[A-Za-z0-9_-]{20,255}"
                                  r"|sk-[A-Za-z0-9]{32,255}(?![\w-])"),
    _Rule("stripe-key", ("k_live_", "k_test_"), r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,255}"),
    _Rule("huggingface-token", (), r"hf_[A-Za-z0-9]{34,64}(?![\w-])"),
    _Rule("groq-key", (), r"gsk_[A-Za-z0-9]{48,64}(?![\w-])"),
    _Rule("xai-key", (), r"xai-[A-Za-z0-9]{64,128}(?![\w-])"),
    _Rule("replicate-token", (), r"r8_[A-Za-z0-9]{37}(?![\w-])"),
    _Rule("perplexity-key", (), r"pplx-[A-Za-z0-9]{40,64}(?![\w-])"),
    _Rule("slack-token", (), r"xox[abposre]-[A-Za-z0-9-]{10,255}"),
    _Rule("slack-webhook", (),
          r"hooks\.slack\.com/services/T[A-Za-z0-9_]{6,}/B[A-Za-z0-9_]{6,}/[A-Za-z0-9_]{16,}", alone=False),
    _Rule("npm-token", (), r"npm_[A-Za-z0-9]{36}(?![\w-])"),
    _Rule("pypi-token", (), r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"),
    _Rule("azure-client-secret", ("Q~",), r"[A-Za-z0-9_~.-]{3}\dQ~[A-Za-z0-9_~.-]{31,34}(?![\w~.-])"),
    _Rule("jwt", (), r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    # secrets named by their context: the secret is group 1
    _Rule("url-password", (), r"://[^\s/:@\"'\\<>]{1,128}:(" + _VAL + r"[^\s/@\"'\\<>]{0,255})@",
          group=1, alone=False),
    _Rule("bearer-token", ("earer", "EARER"), r"(?i:bearer)\s+((?!\[REDACTED:)[A-Za-z0-9._~+/-]{20,1024}=*)",
          group=1),
    _Rule("azure-storage-key", ("ccountKey=",), r"(?i:accountkey)=([A-Za-z0-9+/]{86}==)", group=1, alone=False),
    _Rule("aws-secret-key", ("aws", "AWS", "Aws"),
          r"(?i:aws)[\w.-]{0,24}?(?i:secret|sk)[\w.-]{0,24}" + _Q + r"\s*[:=]\s*" + _Q
          + r"((?!\[REDACTED:)[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])", group=1, alone=False),
)
#: no text shorter than this holds a secret castore finds (``pwd=`` and 8 characters)
_SHORTEST = 10
#: the names (lowercase) a high-entropy value assigned to is a secret, and the kind it gets
_NAMES: tuple[tuple[str, str], ...] = (
    ("pass", "password"), ("secret", "secret"), ("api_key", "api-key"), ("api-key", "api-key"),
    ("apikey", "api-key"), ("access_key", "api-key"), ("private_key", "api-key"), ("token", "token"),
    ("credential", "secret"),
)
#: after a name: the rest of it, the assignment, the value (group 1)
_ASSIGN = r"[\w.-]{0,40}?" + _Q + r"\s*[:=]\s*" + _Q + r"(" + _VAL + r"{8,512})"

#: every kind a tag may name
KINDS: tuple[str, ...] = tuple(dict.fromkeys([r.kind for r in _RULES] + [k for _, k in _NAMES]))

_PLACEHOLDERS = ("xxxx", "****", "....", "example", "your", "changeme", "placeholder", "redacted", "dummy",
                 "sample", "password", "secret", "undefined", "null", "none", "true", "false")
_NOT_SECRET = re.compile(r"[A-Za-z_.$-]+|[0-9.:-]+|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                         r"[0-9a-fA-F]{12}")


def new_key() -> bytes:
    """A fresh random redaction key (:data:`KEY_BYTES` bytes from the OS)."""
    return os.urandom(KEY_BYTES)


def _entropy(s: str) -> float:
    """Shannon entropy of ``s`` in bits per character."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _placeholder(value: str) -> bool:
    """Whether a value reads as a placeholder or a reference (``${DB_PASSWORD}``, ``<token>``, ``xxxx``)."""
    low = value.lower()
    return value[:1] in "$<{%*" or any(p in low for p in _PLACEHOLDERS)


def _looks_secret(value: str) -> bool:
    """Whether a value assigned to a secret-sounding name is a secret: not a placeholder, an
    identifier (code: ``token = self.token``), a number, a date or a UUID; 3 bits per character."""
    if _placeholder(value) or _NOT_SECRET.fullmatch(value):
        return False
    return _entropy(value) >= 3.0


def _canonical(kind: str, secret: str) -> str:
    """What a tag hashes: the secret, a private key by its base64 body alone (so a key that
    arrives JSON-escaped and one decoded get the same tag)."""
    if kind == "private-key":
        body = re.sub(r"-----[A-Z0-9 _-]+-----|\\[nrt]|\s", "", secret)
        return body or secret
    return secret


@dataclass(frozen=True)
class Finding:
    """One secret found: its kind and its tag (never the secret).

    Attributes:
        kind: what it is (one of :data:`KINDS`).
        tag: the whole replacement, ``[REDACTED:<kind>:<8 hex>]``.
    """

    kind: str
    tag: str


@dataclass(frozen=True)
class _Family:
    """Rules searched in one pass: the fixed formats starting with the same character (the
    regex engine skips to that character, then tries each), or one rule alone. ``alts`` maps
    the group number of each alternative (``Match.lastindex``) to its rule."""

    needles: tuple[Any, ...]
    rx: re.Pattern[Any]
    alts: dict[int, _Rule]


@dataclass(frozen=True)
class _Compiled:
    """The rules for one text type (``str`` or ``bytes``)."""

    families: tuple[_Family, ...]
    names: tuple[tuple[Any, str], ...]
    assign: re.Pattern[Any]


def _compiled(enc: Callable[[str], Any]) -> _Compiled:
    groups: dict[str, list[_Rule]] = {}
    for r in _RULES:
        first = r.pattern[0]
        merged = not r.needles and (first.isalnum() or first in "-:")
        groups.setdefault(first if merged else f"{len(groups)}:{r.kind}", []).append(r)
    families = []
    for rules in groups.values():
        alts: dict[int, _Rule] = {}
        g = 1
        for r in rules:
            alts[g] = r
            g += 1 + re.compile(r.pattern).groups
        # the shared first character stands before the alternation: the engine then skips to it
        src = (rules[0].pattern[0] + "(?:" + "|".join(f"({r.pattern[1:]})" for r in rules) + ")"
               if len(rules) > 1 else f"({rules[0].pattern})")
        families.append(_Family(tuple(enc(n) for n in rules[0].needles), re.compile(enc(src)), alts))
    return _Compiled(tuple(families), tuple((enc(n), k) for n, k in _NAMES), re.compile(enc(_ASSIGN)))


def _strings(v: Any, out: list[str]) -> None:
    """Collect the strings of a msgpack-able value (dict values, list items; not dict keys)."""
    if isinstance(v, str):
        out.append(v)
    elif isinstance(v, dict):
        for x in v.values():
            _strings(x, out)
    elif isinstance(v, (list, tuple)):
        for x in v:
            _strings(x, out)


_recording = threading.local()


@contextmanager
def recording() -> Iterator[set[Finding]]:
    """Collect the secrets every :class:`Redactor` replaces in this thread while the block
    runs, as their findings (kind and tag, never the secret): what an import redacted before
    storing it. A secret found again (in another place, or by another check of the same
    text) is one finding, as its tag is the same. Blocks nest: an enclosing block collects
    what an inner one did too."""
    outer: set[Finding] | None = getattr(_recording, "found", None)
    _recording.found = found = set[Finding]()
    try:
        yield found
    finally:
        _recording.found = outer
        if outer is not None:
            outer.update(found)


def kind_counts(found: Iterable[Finding]) -> dict[str, int]:
    """How many secrets of each kind ``found`` holds (``{"aws-access-key": 2}``, sorted by kind)."""
    return dict(sorted(Counter(f.kind for f in found).items()))


@functools.cache
def _rules(for_bytes: bool) -> _Compiled:
    """The compiled rules (compiled on first use: a store that never redacts never pays for it)."""
    return _compiled(str.encode if for_bytes else str)


class Redactor:
    """Finds secrets and replaces them with keyed tags; see the module docstring.

    Args:
        key: the store's redaction key (at least 16 bytes).

    Raises:
        ValueError: the key is too short.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a redaction key has at least 16 bytes")
        #: the key (tags made with another key do not match these)
        self.key = key[:64]
        import hashlib  # here: a store that never redacts loads no OpenSSL binding

        self._blake2b = hashlib.blake2b

    def tag(self, kind: str, secret: str) -> str:
        """The tag that replaces ``secret`` of ``kind``: ``[REDACTED:<kind>:<8 hex>]``."""
        h = self._blake2b(_canonical(kind, secret).encode("utf-8", "surrogateescape"), key=self.key,
                            digest_size=TAG_HEX // 2, person=b"castore-redact").hexdigest()
        return f"{TAG_PREFIX}{kind}:{h}]"

    # -- text and bytes ----------------------------------------------------------------------
    def text(self, s: str, found: list[Finding] | None = None) -> str:
        """``s`` with every secret replaced by its tag; each one found is added to ``found``."""
        return self._redact(s, _rules(False), found, lambda x: x)

    def raw(self, b: bytes, found: list[Finding] | None = None) -> bytes:
        """``b`` (raw bytes, such as a JSONL line) with every secret replaced by its tag.

        Matching runs on the bytes themselves (a secret is ASCII); a tag is ASCII too, so
        UTF-8 text around it stays valid and a JSON line stays JSON.
        """
        return self._redact(b, _rules(True), found, lambda x: x.decode("utf-8", "surrogateescape"))

    def value(self, v: Any, found: list[Finding] | None = None) -> Any:
        """A msgpack-able value with every string redacted (dict keys, numbers, bools kept).
        ``bytes`` inside a value are left alone: they are a serializer's output or an image,
        whose bytes a tag would break (a blob of text is redacted with :meth:`data`).
        Returns ``v`` itself when nothing was found.

        The strings are searched joined first (one search instead of one per string: a body
        holds many small ones), and one by one only when the joined text holds something.
        """
        if not isinstance(v, str):
            strings: list[str] = []
            _strings(v, strings)
            joined = "\n".join(strings)  # a newline ends a value as the end of a string does
            if not strings or self.text(joined) is joined:
                return v
        return self._value(v, found)

    def _value(self, v: Any, found: list[Finding] | None) -> Any:
        if isinstance(v, str):
            return self.text(v, found)
        if isinstance(v, dict):
            new = {k: self._value(x, found) for k, x in v.items()}
            return v if all(new[k] is v[k] for k in v) else new
        if isinstance(v, (list, tuple)):
            items = [self._value(x, found) for x in v]
            if all(a is b for a, b in zip(items, v, strict=True)):
                return v
            return tuple(items) if isinstance(v, tuple) else items
        return v

    def data(self, b: bytes, found: list[Finding] | None = None) -> bytes:
        """Opaque bytes (a blob): redacted as :meth:`raw` when they are UTF-8 text, else as they are."""
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return b
        return self.raw(b, found)

    # -- the search ----------------------------------------------------------------------------
    def _redact(self, s: Any, c: _Compiled, found: list[Finding] | None, as_str: Callable[[Any], str]) -> Any:
        if len(s) < _SHORTEST:
            return s
        spans: list[tuple[int, int, int, str]] = []  # start, priority, end, kind
        for fam in c.families:
            if fam.needles and not any(n in s for n in fam.needles):
                continue
            for m in fam.rx.finditer(s):
                alt = m.lastindex or 0
                rule = fam.alts[alt]
                a, b = m.span(alt + rule.group) if rule.group else m.span()
                if rule.alone and m.start() > 0 and as_str(s[m.start() - 1:m.start()]) in _WORDISH:
                    continue
                if rule.kind == "url-password" and _placeholder(as_str(s[a:b])):
                    continue
                spans.append((a, 0, b, rule.kind))
        low = s.lower()
        if len(low) == len(s):  # (a str whose lowercase changes length is searched as it is)
            for name, kind in c.names:
                i = low.find(name)
                while i >= 0:
                    m = c.assign.match(s, i + len(name))
                    if m is not None and _looks_secret(as_str(m.group(1))):
                        spans.append((m.start(1), 1, m.end(1), kind))
                    i = low.find(name, i + 1)
        if not spans:
            return s
        spans.sort()
        recorded: set[Finding] | None = getattr(_recording, "found", None)
        out, pos = [], 0
        for a, _, b, kind in spans:
            if a < pos:  # overlapping: the earlier (or the fixed format) wins
                continue
            tag = self.tag(kind, as_str(s[a:b]))
            if found is not None:
                found.append(Finding(kind, tag))
            if recorded is not None:
                recorded.add(Finding(kind, tag))
            out.append(s[pos:a])
            out.append(tag if isinstance(s, str) else tag.encode())
            pos = b
        out.append(s[pos:])
        return s[:0].join(out)


__all__ = ["KEY_BYTES", "KINDS", "REDACTED_INFO", "TAG_PREFIX", "Finding", "Redactor", "kind_counts", "new_key",
           "recording"]
