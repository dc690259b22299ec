"""Names of apps, users, sessions, branches and labels, and their encoding into path segments.

A name is any non-empty unicode string of at most 255 characters. It becomes exactly one
path segment: characters outside ``[a-z0-9_-]`` are percent-encoded from their UTF-8 bytes
(upper-case letters included, so that case-insensitive file systems cannot merge ``Alice``
and ``alice``; dots included, so that no segment is ``..`` or ends in ``.lock``). The
encoding is injective, and no segment contains ``/``, ``\\``, NUL or a control character.

A segment longer than :data:`MAX_SEGMENT` bytes (long non-ASCII names) is replaced by
``~`` and a SHA-256 digest of the name; callers keep the real name beside it (castore
stores it in the ref's metadata), since a digest cannot be decoded.
"""

from __future__ import annotations

import functools
import re

from .errors import InvalidName

MAX_NAME_CHARS = 255
MAX_SEGMENT = 200
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")  # not the string module: 3 ms of every start
#: a run of characters :func:`encode` escapes; a segment of canonical characters and escapes
_UNSAFE = re.compile(r"[^a-z0-9_-]+")
_CANONICAL = re.compile(r"(?:[a-z0-9_-]|%[0-9A-F]{2})*")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def _escaped(m: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in m.group().encode("utf-8"))


def _unescaped(m: re.Match[str]) -> str:
    return chr(int(m.group(1), 16))


def validate(name: object, what: str = "name") -> str:
    """Check that ``name`` is an acceptable name and return it.

    Raises:
        InvalidName: not a string, empty, longer than 255 characters, or not encodable
            as UTF-8 (lone surrogates).
    """
    if not isinstance(name, str):
        raise InvalidName(name, f"must be a string, not {type(name).__name__}", what)
    if not name:
        raise InvalidName(name, "must not be empty", what)
    if len(name) > MAX_NAME_CHARS:
        raise InvalidName(name[:40] + "...", f"longer than {MAX_NAME_CHARS} characters ({len(name)})", what)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidName(name, "not valid unicode (lone surrogate)", what) from e
    return name


@functools.lru_cache(maxsize=1 << 16)  # a pure function of strings; an import encodes each session's names ~7 times
def encode(name: str, what: str = "name") -> str:
    """Encode a name into one safe path segment.

    Raises:
        InvalidName: see :func:`validate`.
    """
    validate(name, what)
    seg = _UNSAFE.sub(_escaped, name)
    if len(seg) > MAX_SEGMENT:
        import hashlib  # here: OpenSSL's hashlib loads only for the rare over-long name

        return "~" + hashlib.sha256(name.encode("utf-8")).hexdigest()
    return seg


def is_hashed(segment: str) -> bool:
    """Whether a segment is a digest of a long name (and so cannot be decoded)."""
    return segment.startswith("~")


def decode(segment: str) -> str:
    """Decode a segment made by :func:`encode`.

    Raises:
        InvalidName: the segment is not one :func:`encode` makes (or is a digest).
    """
    if is_hashed(segment):
        raise InvalidName(segment, "is a digest of a long name and cannot be decoded", "segment")
    if _CANONICAL.fullmatch(segment):
        raw = _ESCAPE.sub(_unescaped, segment).encode("latin-1")  # (one char per byte: safe chars are ASCII)
    else:
        raw = _bytes_of(segment)
    try:
        name = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidName(segment, "escapes are not UTF-8", "segment") from e
    if encode(name) != segment:
        raise InvalidName(segment, "not in canonical form", "segment")
    return name


def _bytes_of(segment: str) -> bytes:
    """The bytes a segment's characters and escapes spell, character by character: for a
    segment not of canonical characters, to say where it goes wrong.

    Raises:
        InvalidName: a bad escape or an unexpected character.
    """
    raw = bytearray()
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "%":
            try:
                raw.append(int(segment[i + 1 : i + 3], 16))
            except ValueError as e:
                raise InvalidName(segment, f"bad escape at {i}", "segment") from e
            i += 3
        elif ch in _SAFE:
            raw.extend(ch.encode())
            i += 1
        else:
            raise InvalidName(segment, f"unexpected character {ch!r}", "segment")
    return bytes(raw)


def encode_key(app: str, user: str, session: str | None = None) -> str:
    """Encode a session key (or an app/user prefix of one) as ``app/user[/session]``.

    Raises:
        InvalidName: any part is not a valid name.
    """
    parts = [encode(app, "app name"), encode(user, "user name")]
    if session is not None:
        parts.append(encode(session, "session id"))
    return "/".join(parts)


#: the folder of the tenant layout (docs/FORMAT.md, 2): ``tenants/<app>/<user>/`` per tenant
TENANTS = "tenants"
#: the user segment of an app's own tenant (its app-scoped state): ``@`` is in no encoded name
APP_SCOPE = "@app"


def tenant_segments(app: str, user: str | None) -> tuple[str, str]:
    """The (app, user) segments of a tenant; ``user`` None is the app's own tenant
    (:data:`APP_SCOPE`).

    Raises:
        InvalidName: a bad app or user name.
    """
    return encode(app, "app name"), APP_SCOPE if user is None else encode(user, "user name")


def tenant_prefix(app_seg: str, user_seg: str) -> str:
    """The storage folder of the tenant with these segments: ``tenants/<app>/<user>``."""
    return f"{TENANTS}/{app_seg}/{user_seg}"
