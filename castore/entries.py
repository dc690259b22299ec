"""What one commit adds to a session: messages, events, compactions, and other entries.

Entries are plain frozen dataclasses. Each has a ``kind`` and splits into two parts when
stored: the shareable *body* (the message text, a summary), stored content-addressed so
that identical content is stored once across every session, and per-call *provenance*
(author, time, model metadata, state delta), stored on the commit.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import reprlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from . import objects as o
from .errors import InvalidEntry

_MESSAGE_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "name")

#: how deeply lists and dicts may nest in a stored value (content, details, data, state,
#: meta); deeper input is refused with :class:`InvalidEntry` rather than overflowing the
#: encoder's (and every reader's) recursion
MAX_DEPTH = 100

#: the commit metadata key that marks an entry as written by the agent's program, not typed
#: by a human nor answered by the model (its value says what it is, e.g.
#: ``environment_context``): the archive importers set it, ``grep(typed=True)`` leaves it out
INJECTED = "injected"


class Record:
    """The ``__repr__``, ``__eq__`` and ``__hash__`` of a frozen dataclass, written once.

    A base for dataclasses declared ``@dataclass(frozen=True, repr=False, eq=False)``:
    instances behave as the methods ``dataclass`` would generate (the class name and every
    field in the repr; equal when of the same class with equal fields; the hash of the
    fields), and stay dataclasses (``fields``, ``replace``, ``asdict``, frozen). Why: the
    decorator compiles each generated method from source, and castore's ~15 dataclasses
    were a third of what importing castore costs (a cold read imports them all).
    """

    __slots__ = ()

    def _fields_key(self) -> tuple[Any, ...]:
        cls = type(self)
        get: Callable[[Any], tuple[Any, ...]] | None = cls.__dict__.get("_record_key")
        if get is None:
            names = [f.name for f in dataclasses.fields(cls) if f.compare]  # type: ignore[arg-type]
            get = operator.attrgetter(*names) if len(names) > 1 else lambda obj: tuple(getattr(obj, n) for n in names)
            type.__setattr__(cls, "_record_key", get)
        return get(self)

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}"
                          for f in dataclasses.fields(self) if f.repr)  # type: ignore[arg-type]
        return f"{type(self).__qualname__}({shown})"

    def __eq__(self, other: object) -> bool:
        if other.__class__ is self.__class__:
            return self._fields_key() == other._fields_key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._fields_key())


def _need(ok: bool, what: str, expected: str, value: object) -> None:
    if not ok:
        raise InvalidEntry(f"{what} must be {expected}, got {_show(value)}")


def _show(value: object) -> str:
    # reprlib: bounded in length and depth (a plain repr of 5,000 nested lists overflows)
    return f"{_REPR.repr(value)} ({type(value).__name__})"


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60


def _opt_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def _is_time(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_int(value) and -(2**53) <= value <= 2**53  # type: ignore[operator]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_value(value: Any, what: str) -> None:
    """Check that ``value`` can be stored as it will be read back.

    Lists, tuples, sets and dicts may nest at most :data:`MAX_DEPTH` deep (a container
    that holds itself counts as too deep), dict keys must be strings, and floats must be
    finite (NaN and infinities do not survive JSON output and break equality in audits).
    Anything else (a datetime, a msgspec struct) is left to the encoder.

    Raises:
        InvalidEntry: naming ``what`` and the problem.
    """
    # Breadth first, one level at a time: no call per node, and a self-containing value
    # stops at the depth limit. This runs on every append, hence the C-level extend/map.
    level = [value]
    depth = 0
    while level:
        deeper: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                if not set(map(type, v)) <= _STR_TYPE:
                    for k in v:
                        if not isinstance(k, str):
                            raise InvalidEntry(f"{what} has a non-string key {_show(k)}")
                children: Any = v.values()
            elif isinstance(v, _SEQUENCES):
                children = v
            elif isinstance(v, float):
                if not math.isfinite(v):
                    raise InvalidEntry(f"{what} holds a non-finite number ({v!r}): only finite numbers can be stored")
                continue
            else:
                continue
            if depth >= MAX_DEPTH:
                raise InvalidEntry(f"{what} nests lists or dicts deeper than {MAX_DEPTH} levels")
            deeper.extend(children)
        level = deeper
        depth += 1


def info_value(value: Any, what: str, *, as_read: bool = False) -> dict[str, Any]:
    """A session's info ``value`` (:meth:`castore.Session.set_info`) as a dict, checked as
    :func:`check_value` checks it; ``as_read``: as the info is read back from the store (its
    JSON: a tuple is a list then), to compare with what is stored.

    Raises:
        InvalidEntry: ``value`` is not a mapping, or holds what cannot be stored.
    """
    if not isinstance(value, Mapping):
        raise InvalidEntry(f"{what} must be a mapping of names to values, not {type(value).__name__}")
    out = dict(value)
    check_value(out, what)
    if as_read:
        import json

        try:
            out = json.loads(json.dumps(out))
        except (TypeError, ValueError) as e:
            raise InvalidEntry(f"{what} holds what a session's info cannot: {e}") from None
    return out


_STR_TYPE = {str}
_SEQUENCES = (list, tuple, set, frozenset)


def check_state(delta: Mapping[str, Any], author: str = "") -> None:
    """Check a state change given directly to a scope (app or user state).

    Raises:
        InvalidEntry: ``delta`` is not a mapping with string keys and storable values, or
            ``author`` is not a string.
    """
    _need(isinstance(delta, Mapping), "a state change", "a mapping", delta)
    _need(isinstance(author, str), "author", "a string", author)
    for k, v in delta.items():
        _need(isinstance(k, str), "a state key", "a string", k)
        check_value(v, f"state key {k!r}")


@dataclass(frozen=True, repr=False, eq=False)
class Message(Record):
    """A chat message in the common shape (OpenAI/Anthropic-like).

    Attributes:
        role: ``system``, ``user``, ``assistant``, ``tool``, or anything a model API uses.
        content: text, or a list of content blocks (dicts), or None.
        tool_calls: the tool calls an assistant message makes (dicts with an ``id``).
        tool_call_id: for a tool result, the id of the call it answers.
        name: an optional name (tool name, participant).
        extra: any other fields, kept verbatim.
    """

    kind: ClassVar[str] = "message"
    role: str
    content: Any = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role:
            raise InvalidEntry(f"a message needs a non-empty string role, got {_show(self.role)}")

    def to_dict(self) -> dict[str, Any]:
        """The message as a plain dict (unset optional fields left out)."""
        d: dict[str, Any] = dict(self.extra)
        d["role"] = self.role
        if self.content is not None:
            d["content"] = self.content
        if self.tool_calls is not None:
            d["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        """Build a message from a plain dict, keeping unknown fields in ``extra``.

        Raises:
            InvalidEntry: no usable ``role``.
        """
        if not isinstance(d, dict):
            raise InvalidEntry(f"a message must be a mapping, got {type(d).__name__}")
        extra = {k: v for k, v in d.items() if k not in _MESSAGE_FIELDS}
        return cls(
            role=d.get("role"),  # type: ignore[arg-type]
            content=d.get("content"),
            tool_calls=d.get("tool_calls"),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            extra=extra,
        )

    @property
    def text(self) -> str:
        """The message's text (text blocks joined), for display and token estimates."""
        return content_text(self.content)


_MESSAGE_KEYS = frozenset(_MESSAGE_FIELDS)
_new = object.__new__
_set = object.__setattr__


def message_from_body(body: Any) -> Message:
    """The :class:`Message` a stored message body holds: :meth:`Message.from_dict`, built
    faster for the common body (only known fields, a non-empty string role), which is what
    reading a long session does once per entry. The result is the same frozen dataclass.

    Raises:
        InvalidEntry: as :meth:`Message.from_dict` (not a mapping, no usable role).
    """
    if type(body) is dict and body.keys() <= _MESSAGE_KEYS:
        role = body.get("role")
        if type(role) is str and role:
            # the fields __init__ would set, checked as __post_init__ checks them
            m = _new(Message)
            _set(m, "__dict__", {"role": role, "content": body.get("content"), "tool_calls": body.get("tool_calls"),
                                 "tool_call_id": body.get("tool_call_id"), "name": body.get("name"), "extra": {}})
            return m
    return Message.from_dict(body)


def messages_from_bodies(bodies: Iterable[Any]) -> list[Message]:
    """:func:`message_from_body` of each stored message body, in order: the loop of a cold
    read of a long session, with no Python call per common body.

    Raises:
        InvalidEntry: as :meth:`Message.from_dict` (a body that is not a mapping or has no
            usable role).
    """
    out: list[Message] = []
    add = out.append
    keys = _MESSAGE_KEYS
    for body in bodies:
        if type(body) is dict and body.keys() <= keys:
            role = body.get("role")
            if type(role) is str and role:
                m = _new(Message)
                # the instance dict, filled in place: what __init__ would set (frozen: not via setattr)
                m.__dict__.update(role=role, content=body.get("content"), tool_calls=body.get("tool_calls"),
                                  tool_call_id=body.get("tool_call_id"), name=body.get("name"), extra={})
                add(m)
                continue
        add(Message.from_dict(body))
    return out


def content_text(content: Any) -> str:
    """Plain text of message content: a string, or the text parts of content blocks."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif isinstance(block.get("thinking"), str):
                    parts.append(block["thinking"])
                elif block.get("type") in ("image", "image_url"):
                    parts.append("[image]")
        return "\n".join(parts)
    return str(content)


@dataclass(frozen=True, repr=False, eq=False)
class Event(Record):
    """An agent event (as in ADK and trpc-agent-go): who acted, what was said, what changed.

    Attributes:
        author: who produced the event (``user``, an agent's name, a tool).
        message: the message the event carries, if any.
        state_delta: state keys set by this event; ``app:`` and ``user:`` keys go to the
            app- and user-scoped state, ``temp:`` keys are never stored. A value of
            :data:`DELETE` removes the key.
        meta: per-call details (model, token usage, invocation id, ...), kept on the commit.
    """

    kind: ClassVar[str] = "event"
    author: str
    message: Message | None = None
    state_delta: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _need(isinstance(self.author, str), "an event's author", "a string", self.author)
        _need(self.message is None or isinstance(self.message, Message), "an event's message",
              "a Message or None", self.message)
        if not isinstance(self.state_delta, dict) or not all(isinstance(k, str) for k in self.state_delta):
            raise InvalidEntry("state_delta must be a dict with string keys")
        if not isinstance(self.meta, dict) or not all(isinstance(k, str) for k in self.meta):
            raise InvalidEntry("an event's meta must be a dict with string keys")


def vouched_event(author: str, message: Message | None, meta: dict[str, Any]) -> Event:
    """An :class:`Event` (no state change) whose maker vouches for it: ``author`` a string,
    ``message`` a Message or None, ``meta`` a dict with string keys, and every value in the
    message and the meta made of what a JSON decoder gives (dicts with string keys, lists,
    strings, finite numbers, booleans, None) nested no deeper than :data:`MAX_DEPTH`. Made
    without the checks of ``__init__``, and :func:`prepare` skips :func:`check_value` on its
    message and meta (what an importer of JSON lines spends most of a line's checks on): it
    still checks the message's fields and encodes it all. A copy made by
    ``dataclasses.replace`` is an ordinary event, checked in full. Raises nothing.
    """
    e = _new(Event)
    # the fields __init__ would set, and the mark prepare reads (frozen: not via setattr)
    e.__dict__.update(author=author, message=message, state_delta={}, meta=meta, _vouched=True)
    return e


@dataclass(frozen=True, repr=False, eq=False)
class Compaction(Record):
    """A summary that replaces, in the model's context, every entry before ``first_kept``.

    Nothing is deleted: the full history stays readable.
    """

    kind: ClassVar[str] = "compaction"
    summary: str
    first_kept: str | None = None
    tokens_before: int = 0
    details: Any = None

    def __post_init__(self) -> None:
        _need(isinstance(self.summary, str), "Compaction.summary", "a string", self.summary)
        _need(_opt_str(self.first_kept), "Compaction.first_kept", "a commit id string or None", self.first_kept)
        _need(_is_int(self.tokens_before), "Compaction.tokens_before", "an integer", self.tokens_before)


@dataclass(frozen=True, repr=False, eq=False)
class BranchSummary(Record):
    """A summary of a branch the agent left (Pi's ``/tree``), shown where it stands."""

    kind: ClassVar[str] = "branch_summary"
    summary: str
    from_id: str | None = None
    details: Any = None

    def __post_init__(self) -> None:
        _need(isinstance(self.summary, str), "BranchSummary.summary", "a string", self.summary)
        _need(_opt_str(self.from_id), "BranchSummary.from_id", "a commit id string or None", self.from_id)


@dataclass(frozen=True, repr=False, eq=False)
class ModelChange(Record):
    """The model (and optionally provider and thinking level) used from here on."""

    kind: ClassVar[str] = "model_change"
    model: str | None = None
    provider: str | None = None
    thinking_level: str | None = None

    def __post_init__(self) -> None:
        for name in ("model", "provider", "thinking_level"):
            _need(_opt_str(getattr(self, name)), f"ModelChange.{name}", "a string or None", getattr(self, name))


@dataclass(frozen=True, repr=False, eq=False)
class Custom(Record):
    """An application record a model never sees; ``data`` is kept verbatim."""

    kind: ClassVar[str] = "custom"
    type: str
    data: Any = None

    def __post_init__(self) -> None:
        _need(isinstance(self.type, str), "Custom.type", "a string", self.type)


EntryType = Message | Event | Compaction | BranchSummary | ModelChange | Custom

#: a state delta value that removes the key
DELETE = object()


def body_of(entry: EntryType) -> dict[str, Any] | None:
    """The shareable body of an entry (stored content-addressed), or None.

    Raises:
        InvalidEntry: ``entry`` is not one of the entry types.
    """
    if isinstance(entry, Message):
        return entry.to_dict()
    if isinstance(entry, Event):
        return entry.message.to_dict() if entry.message is not None else None
    if isinstance(entry, Compaction):
        return _compact({"summary": entry.summary, "first_kept": entry.first_kept,
                         "tokens_before": entry.tokens_before, "details": entry.details})
    if isinstance(entry, BranchSummary):
        return _compact({"summary": entry.summary, "from_id": entry.from_id, "details": entry.details})
    if isinstance(entry, ModelChange):
        return _compact({"model": entry.model, "provider": entry.provider, "thinking_level": entry.thinking_level})
    if isinstance(entry, Custom):
        return {"type": entry.type, "data": entry.data}
    raise InvalidEntry(f"not an entry: {type(entry).__name__} (use Message, Event, Compaction, ...)")


def entry_from(kind: str, body: Any, author: str, delta: dict[str, Any], meta: dict[str, Any]) -> EntryType:
    """Rebuild a typed entry from its stored parts. Unknown kinds become :class:`Custom`.

    A stored body whose fields have the wrong types (written before they were checked, or
    by another tool) is read as a :class:`Custom` of its kind holding the body verbatim,
    so that one odd entry never makes a history unreadable.

    Raises:
        InvalidEntry: a message body without a usable role.
    """
    b = body if isinstance(body, dict) else {}
    if kind == "message":
        return message_from_body(b)
    try:
        if kind == "event":
            m, d, mt = message_from_body(b) if b else None, dict(delta), dict(meta)
            if type(author) is str and set(map(type, d)) <= _STR_TYPE and set(map(type, mt)) <= _STR_TYPE:
                # what __post_init__ would check holds: the fields as __init__ sets them (reading a
                # long session makes one event per entry)
                e = _new(Event)
                e.__dict__.update(author=author, message=m, state_delta=d, meta=mt)
                return e
            return Event(author=author, message=m, state_delta=d, meta=mt)
        if kind == "compaction":
            return Compaction(b.get("summary", ""), b.get("first_kept"), b.get("tokens_before", 0), b.get("details"))
        if kind == "branch_summary":
            return BranchSummary(b.get("summary", ""), b.get("from_id"), b.get("details"))
        if kind == "model_change":
            return ModelChange(b.get("model"), b.get("provider"), b.get("thinking_level"))
        if kind == "custom" and isinstance(b.get("type", ""), str):
            return Custom(b.get("type", ""), b.get("data"))
    except InvalidEntry:
        pass
    return Custom(kind, body)


_BODY_KINDS = ("message", "event", "compaction", "branch_summary", "model_change", "custom")


def stored_problem(commit: o.Commit, body: Any = None, has_body: bool = False) -> str | None:
    """Why a stored commit (and its body, when ``has_body``) is not what :func:`prepare`
    would have written, or None: for ``castore fsck``, since readers tolerate such objects
    (written by older versions or other tools) rather than fail on them.
    """
    if commit.kind not in _BODY_KINDS and commit.kind != "state":
        return None  # an adapter's own kind (a LangGraph checkpoint): its rules, not these
    try:
        _need(math.isfinite(commit.time), "time", "a finite number", commit.time)
        check_value(commit.delta, "state change")
        check_value(commit.meta, "meta")
        if not has_body or commit.kind == "state":
            return None
        check_value(body, f"{commit.kind} body")
        if commit.kind in ("message", "event"):
            if commit.kind == "message" or body is not None:
                _check_message(Message.from_dict(body), f"{commit.kind} message")
        elif isinstance(entry_from(commit.kind, body, "", {}, {}), Custom) and (
                commit.kind != "custom" or not isinstance(body, dict) or not isinstance(body.get("type", ""), str)):
            return f"its {commit.kind} body has fields of the wrong types: {_show(body)}"
    except InvalidEntry as e:
        return str(e)
    return None


def entry_fields(entry: EntryType) -> dict[str, Any]:
    """An entry as a plain dict of its fields, by kind (a message is its dict form)."""
    if isinstance(entry, Message):
        return entry.to_dict()
    if isinstance(entry, Event):
        return {
            "author": entry.author,
            "message": entry.message.to_dict() if entry.message is not None else None,
            "state_delta": dict(entry.state_delta),
            "meta": dict(entry.meta),
        }
    if isinstance(entry, Compaction):
        return {"summary": entry.summary, "first_kept": entry.first_kept,
                "tokens_before": entry.tokens_before, "details": entry.details}
    if isinstance(entry, BranchSummary):
        return {"summary": entry.summary, "from_id": entry.from_id, "details": entry.details}
    if isinstance(entry, ModelChange):
        return {"model": entry.model, "provider": entry.provider, "thinking_level": entry.thinking_level}
    if isinstance(entry, Custom):
        return {"type": entry.type, "data": entry.data}
    return {}


def _compact(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def coerce(entry: Any) -> EntryType:
    """Accept an entry object, or a plain message dict; return an entry.

    Raises:
        InvalidEntry: anything else.
    """
    if isinstance(entry, (Message, Event, Compaction, BranchSummary, ModelChange, Custom)):
        return entry
    if isinstance(entry, dict):
        return Message.from_dict(entry)
    raise InvalidEntry(
        f"cannot append {type(entry).__name__}: pass a Message, Event, Compaction, ... or a message dict")


@dataclass(frozen=True, repr=False, eq=False)
class Prepared(Record):
    """An entry split into what its commit stores, checked to be encodable."""

    kind: str
    body: Any
    author: str
    meta: dict[str, Any]
    delta: dict[str, Any]
    unset: tuple[str, ...]
    app_delta: dict[str, Any]
    app_unset: tuple[str, ...]
    user_delta: dict[str, Any]
    user_unset: tuple[str, ...]
    temp: dict[str, Any]
    time: float | None
    #: the entry as given (typed): what a reader rebuilds from the commit and its body
    entry: EntryType | None = None


def prepare(entry: Any, author: str | None = None, meta: Mapping[str, Any] | None = None,
            state_delta: Mapping[str, Any] | None = None, at: float | None = None) -> Prepared:
    """Split an entry into body, provenance and per-scope state changes; check all of it.

    ``temp:`` keys are set aside (never stored); ``app:`` and ``user:`` keys go to their
    scopes without the prefix; a value of :data:`DELETE` becomes an unset. Everything that
    will be stored is checked here, before anything is written: field types, the author
    and time, string keys, finite numbers, nesting depth (see :func:`check_value`), and that
    msgpack can encode it.

    Raises:
        InvalidEntry: not an entry, or a field that cannot be stored as given (the message
            names the field).
    """
    if type(entry) is Event and author is None and not meta and not state_delta \
            and entry.__dict__.get("_vouched", False):
        return _prepare_vouched(entry, at)
    e = coerce(entry)
    if isinstance(e, Message):
        _check_message(e, "message")
    elif isinstance(e, Event) and e.message is not None:
        _check_message(e.message, "event message")
    body = body_of(e)
    if isinstance(e, Event):
        author_, meta_, delta_in = e.author, dict(e.meta), dict(e.state_delta)
    else:
        author_ = e.role if isinstance(e, Message) else ""
        meta_, delta_in = {}, {}
    if author is not None:
        _need(isinstance(author, str), "author", "a string", author)
        author_ = author
    if at is not None:
        _need(_is_time(at), "time", "a finite number of seconds since the epoch", at)
    if meta:
        _need(isinstance(meta, Mapping), "meta", "a mapping", meta)
        meta_.update(meta)
    if state_delta:
        _need(isinstance(state_delta, Mapping), "state_delta", "a mapping", state_delta)
        delta_in.update(state_delta)
    vouched = e.__dict__.get("_vouched", False)  # vouched_event's: its body and meta are checked by its maker
    if isinstance(body, dict) and not vouched:
        for k, v in body.items():
            check_value(v, f"{e.kind} field {k!r}")
    for k, v in meta_.items() if not vouched or meta else ():
        _need(isinstance(k, str), "a meta key", "a string", k)
        check_value(v, f"meta[{k!r}]")
    parts: dict[str, tuple[dict[str, Any], list[str]]] = {"": ({}, []), "app:": ({}, []), "user:": ({}, [])}
    temp: dict[str, Any] = {}
    for k, v in delta_in.items():
        _need(isinstance(k, str), "a state key", "a string", k)
        if k.startswith("temp:"):
            temp[k] = v
            continue
        scope = "app:" if k.startswith("app:") else "user:" if k.startswith("user:") else ""
        key = k[len(scope):]
        if v is DELETE:
            parts[scope][1].append(key)
        else:
            check_value(v, f"state key {k!r}")
            parts[scope][0][key] = v
    # Encode now, so that bad input fails before anything is written.
    o.pack(body)
    o.pack(meta_)
    for d, _ in parts.values():
        if d:
            o.pack(d)
    out = _new(Prepared)
    # the fields __init__ would set (frozen: not via setattr; one Prepared per appended entry)
    out.__dict__.update(kind=e.kind, body=body, author=author_, meta=meta_, delta=parts[""][0],
                        unset=tuple(parts[""][1]), app_delta=parts["app:"][0], app_unset=tuple(parts["app:"][1]),
                        user_delta=parts["user:"][0], user_unset=tuple(parts["user:"][1]), temp=temp, time=at, entry=e)
    return out


def _prepare_vouched(e: Event, at: float | None) -> Prepared:
    """:func:`prepare` of a :func:`vouched_event` given alone (no author, meta or state
    change beside it; what an importer appends, line after line): the same checks that
    still apply to it (its message's fields, the time, that msgpack encodes its body and
    meta), without the splitting of a state change it cannot hold.

    Raises:
        InvalidEntry: as :func:`prepare`.
    """
    body = vouched_body(e, at)
    meta = dict(e.meta)
    o.pack(body)
    o.pack(meta)
    out = _new(Prepared)
    out.__dict__.update(kind=e.kind, body=body, author=e.author, meta=meta, delta={}, unset=(), app_delta={},
                        app_unset=(), user_delta={}, user_unset=(), temp={}, time=at, entry=e)
    return out


def is_vouched(entry: Any) -> bool:
    """Whether ``entry`` is a :func:`vouched_event` (not a copy of one). Raises nothing."""
    return type(entry) is Event and entry.__dict__.get("_vouched", False)


def vouched_body(e: Event, at: float | None) -> dict[str, Any] | None:
    """The body of a :func:`vouched_event` appended alone at time ``at``, checked as
    :func:`prepare` checks it (its message's fields, the time) but not encoded: for a writer
    whose one encode of the body and of the commit is the check that msgpack takes them, and
    which keeps nothing of an entry whose encode failed (:meth:`castore.plumbing.Tree.commit`).

    Raises:
        InvalidEntry: a message field or the time of the wrong type.
    """
    m = e.message
    if m is not None:
        _check_message(m, "event message")
    if at is not None:
        _need(_is_time(at), "time", "a finite number of seconds since the epoch", at)
    return m.to_dict() if m is not None else None


def _check_message(m: Message, what: str) -> None:
    """The fields of a message that readers rely on have their documented types."""
    if m.tool_calls is None and _opt_str(m.tool_call_id) and _opt_str(m.name) and isinstance(m.extra, dict):
        return  # (the common message: no call made; its checks' names are not formatted)
    _need(m.tool_calls is None or (isinstance(m.tool_calls, (list, tuple))
                                   and all(isinstance(c, dict) for c in m.tool_calls)),
          f"{what} tool_calls", "a list of dicts or None", m.tool_calls)
    _need(_opt_str(m.tool_call_id), f"{what} tool_call_id", "a string or None", m.tool_call_id)
    _need(_opt_str(m.name), f"{what} name", "a string or None", m.name)
    _need(isinstance(m.extra, dict), f"{what} extra", "a dict", m.extra)


@dataclass(frozen=True, repr=False, eq=False)
class LogEntry(Record):
    """One commit of a session as read back: the entry and its provenance."""

    id: o.ObjectId
    kind: str
    entry: EntryType
    parents: tuple[o.ObjectId, ...]
    author: str = ""
    time: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict)
    delta: Mapping[str, Any] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    depth: int = 0

    @property
    def short(self) -> str:
        """The first 8 characters of the id."""
        return self.id[:8]
