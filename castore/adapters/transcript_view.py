"""How imported coding-agent sessions (Claude Code, Codex, Pi, Gemini CLI) read in ``log``, ``show`` and ``context``.

The importers keep each line's message as the vendor wrote its content blocks: Claude's
``tool_use``/``tool_result``/``thinking``/``image``, Codex's ``function_call``/
``function_call_output``/``reasoning``, Pi's ``toolCall``/``thinking`` and ``toolResult``
messages. Read as plain text, a tool call is empty. This view writes them as a person wants
to scan them: a call as ``→ Bash(ls -la …)`` (the tool and a one-line, cut summary of its
argument), a result as ``← 14 lines`` (all of it when asked), thinking folded to one line,
an image as ``[image]``, a command Pi's user ran with ``!`` as ``$ ls`` and its output.
Lines that are bookkeeping (Claude's ``progress``,
``file-history-snapshot``, ``summary``, ``queue-operation``; Codex's ``session_meta`` header,
``turn_context``, ``token_count`` and the ``event_msg`` copies of its messages and reasoning;
Gemini CLI's metadata line, ``$set`` records and a message written again with nothing new) are
marked so that ``log`` leaves them out unless asked for every entry. A line with no message
(a Claude Code ``system`` line, a Gemini CLI ``$rewindTo``) is shown by ``show`` as the agent
wrote it, field by field, read from its stored bytes.

Registered for the ``event`` (Claude Code, Codex, Gemini CLI) and ``message`` (Pi) kinds; an entry whose
content holds none of these blocks and that no importer wrote reads as castore's own. What
is returned is unescaped: the CLI escapes it (one rule, ``castore.cli.text``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import views
from ..entries import Event, Message, content_text

if TYPE_CHECKING:
    from ..entries import LogEntry
    from ..session import Session

#: the metadata key each importer files its lines under (the adapters' ``KEY``)
IMPORTERS = ("claude", "codex", "pi", "gemini")
#: line types that are a client's bookkeeping, not what happened in the session
BOOKKEEPING = frozenset({"progress", "file-history-snapshot", "summary", "queue-operation",
                         "session_meta", "turn_context", "token_count", "metadata", "$set", "update"})
#: Codex ``event_msg`` types that copy a ``response_item`` (the message or reasoning itself):
#: what Codex's own UI replays, written beside what the model saw
CODEX_COPIES = frozenset({"user_message", "agent_message", "agent_reasoning", "agent_reasoning_raw_content"})
#: ``show`` cuts a field of a stored line with no message to this many characters (all with ``-v``)
FIELD_CHARS = 300
#: a tool call's argument is cut to this many characters
ARG_CHARS = 60
#: how far back from a branch's tip its note looks for the line that started it
NOTE_WALK = 2_000
#: the branch names the importers give (see :func:`castore.adapters.tree_writer.branch_layout`)
_MADE = re.compile(r"(rewind|rollback|fork)-(\d+)(?:-[0-9a-f]{8})?")
#: the arguments that say best what a call does, first found wins
_MAIN_ARGS = ("command", "cmd", "file_path", "path", "pattern", "url", "query", "description", "prompt",
              "skill", "subject", "content")
_CALLS = ("tool_use", "function_call", "custom_tool_call", "local_shell_call", "toolCall", "server_tool_use")
_RESULTS = ("tool_result", "function_call_output", "custom_tool_call_output")
_THINKING = ("thinking", "reasoning", "redacted_thinking")
_IMAGES = ("image", "input_image", "image_url")
_KNOWN = frozenset(_CALLS + _RESULTS + _THINKING + _IMAGES)


def fold(text: str, width: int) -> str:
    """``text`` on one line (whitespace folded), cut to ``width`` characters with ``…``."""
    s = " ".join(text.split())
    return s if len(s) <= width else s[: width - 1] + "…"


def _text(content: Any) -> str:
    """The text of a result's content: a string, the text parts of a list of blocks, or JSON."""
    if content is None or isinstance(content, (str, list)):
        return content_text(content)
    if isinstance(content, Mapping) and isinstance(content.get("text"), str):
        return str(content["text"])
    return json.dumps(content, ensure_ascii=False, sort_keys=True, default=str)


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def arg_summary(raw: Any) -> str:
    """What a tool call's argument says, on one line, uncut: its command, path, pattern, ...

    ``raw``: the input object, or its JSON text (Codex), or a plain string.
    """
    args = _args(raw)
    if isinstance(args, Mapping):
        for key in _MAIN_ARGS:
            v = args.get(key)
            if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
                return " ".join(v[2:] if len(v) > 2 and v[1] in ("-lc", "-c") else v)
            if isinstance(v, str) and v:
                return v
        args = {k: v for k, v in args.items() if v not in (None, "", [], {})}
        if len(args) == 1 and isinstance(next(iter(args.values())), str):
            return str(next(iter(args.values())))
    if isinstance(args, str):
        return args
    return "" if args in (None, {}) else json.dumps(args, ensure_ascii=False, sort_keys=True, default=str)


def _lines_word(n: int) -> str:
    return f"{n} line" if n == 1 else f"{n} lines"


def _result(content: Any, error: bool, verbose: bool, one: bool) -> list[str]:
    text = _text(content)
    lines = text.splitlines()
    head = "← " + ("error, " if error else "") + (_lines_word(len(lines)) if lines else "(empty)")
    if verbose and not one:
        return [head, *("  " + ln for ln in lines)]
    return [head + (": " + fold(text, ARG_CHARS) if lines else "")]


def _call(name: Any, raw: Any, verbose: bool, one: bool) -> list[str]:
    name = name if isinstance(name, str) and name else "?"
    head = f"→ {name}({fold(arg_summary(raw), ARG_CHARS)})"
    if not verbose or one:
        return [head]
    args = _args(raw)
    full = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False, indent=2, sort_keys=True,
                                                         default=str)
    return [head, *("  " + ln for ln in full.splitlines())]


def block_lines(b: Any, verbose: bool = False, one: bool = False) -> list[str]:
    """How one content block reads: text as it is, a call, a result, thinking, an image.

    ``verbose``: a result's and a call's whole text; ``one``: one short line for the block.
    """
    if isinstance(b, str):
        return b.splitlines() or [""]
    if not isinstance(b, Mapping):
        return [json.dumps(b, ensure_ascii=False, default=str)]
    t = b.get("type")
    if t in _CALLS:
        raw = b.get("input", b.get("arguments", b.get("action")))
        return _call(b.get("name") or ("local_shell" if t == "local_shell_call" else None), raw, verbose, one)
    if t in _RESULTS:
        return _result(b.get("content", b.get("output")), b.get("is_error") is True, verbose, one)
    if t in _THINKING:
        said = b.get("thinking", b.get("text"))
        if not isinstance(said, str) or not said.strip():
            return ["∴ (thinking)"]
        return ["∴ " + said] if verbose and not one else ["∴ " + fold(said, ARG_CHARS + 20)]
    if t in _IMAGES:
        src = b.get("source")
        mime = b.get("mimeType") or (src.get("media_type") if isinstance(src, Mapping) else None)
        return [f"[image {mime}]" if isinstance(mime, str) and mime else "[image]"]
    if isinstance(b.get("text"), str):
        return b["text"].splitlines() or [""]
    return [f"[{t}]" if isinstance(t, str) else json.dumps(b, ensure_ascii=False, sort_keys=True, default=str)]


def _failed(m: Message) -> str | None:
    """The error of an assistant message that holds nothing (Pi: a request aborted), or None."""
    said = m.extra.get("errorMessage")
    return said if isinstance(said, str) and said and not m.content else None


def _speaks(m: Message) -> bool:
    """Whether the message holds a block this view reads (else castore's own reading is as good)."""
    return m.role in ("toolResult", "bashExecution") or _failed(m) is not None or (
        isinstance(m.content, list) and any(isinstance(b, Mapping) and b.get("type") in _KNOWN for b in m.content))


def message_lines(m: Message, verbose: bool = False, one: bool = False) -> list[str] | None:
    """How a coding agent's message reads (see the module), or None when castore's own reading
    says it as well (no call, result, thinking or image in it)."""
    if not _speaks(m):
        return None
    if m.role == "toolResult":  # Pi: the message itself is the result
        return _result(m.content, m.extra.get("isError") is True, verbose, one)
    if m.role == "bashExecution":  # Pi: a command the user ran with `!`
        code = m.extra.get("exitCode")
        return [f"$ {fold(str(m.extra.get('command', '')), ARG_CHARS)}",
                *_result(m.extra.get("output"), isinstance(code, int) and code != 0, verbose, one)]
    if (error := _failed(m)) is not None:
        return [f"(no answer: {fold(error, ARG_CHARS)})"]
    blocks = m.content if isinstance(m.content, list) else [m.content]
    out: list[str] = []
    for b in blocks:
        out += block_lines(b, verbose, one)
    return out


def _importer_line(e: LogEntry) -> Mapping[str, Any] | None:
    for key in IMPORTERS:
        got = e.meta.get(key)
        if isinstance(got, Mapping):
            return got
    return None


def _message(e: LogEntry) -> Message | None:
    entry = e.entry
    if isinstance(entry, Event):
        return entry.message
    return entry if isinstance(entry, Message) else None


def _label(m: Message) -> str:
    if m.role == "toolResult" or (isinstance(m.content, list) and m.content and all(
            isinstance(b, Mapping) and b.get("type") in _RESULTS for b in m.content)):
        return "tool"
    return m.role


def _entry_label(e: LogEntry, m: Message) -> str:
    """:func:`_label`, and ``, continued`` for an assistant part that adds to the message before
    it (Gemini CLI writes a message again as its calls arrive: ``context`` joins the parts)."""
    label = _label(m)
    line = _importer_line(e)
    if label == "assistant" and line is not None and line.get("update") is True and not line.get("fork"):
        return f"{label}, continued"
    return label


class TranscriptView(views.View):
    """Claude Code, Codex, Pi and Gemini CLI lines: calls, results, thinking, images; bookkeeping marked."""

    kinds = frozenset({"event", "message"})

    def describe(self, e: LogEntry) -> str | None:
        """``assistant: → Bash(ls -la)``, ``tool: ← 14 lines: total 48``, or None."""
        m = _message(e)
        if m is None or (lines := message_lines(m, one=True)) is None:
            return None
        return f"{_entry_label(e, m)}: " + " · ".join(fold(ln, 200) for ln in lines if ln.strip())

    def body(self, e: LogEntry, verbose: bool = False) -> list[str] | None:
        """``[assistant]`` and the message's blocks as :func:`message_lines` reads them, or None."""
        m = _message(e)
        if m is None or (lines := message_lines(m, verbose)) is None:
            return None
        return [f"[{_entry_label(e, m)}]", *lines]

    def message(self, m: Message, verbose: bool = False) -> list[str] | None:
        """A message with no commit (``context``) as :func:`message_lines` reads it, or None."""
        return message_lines(m, verbose)

    def branch_notes(self, session: Session, branches: Mapping[str, str]) -> dict[str, str]:
        """What made each branch of an imported session (``rewind-81`` -> ``rewind from line
        81: user: are they still being written?``): the first line of the branch's own part
        (from the line its name gives) that is not bookkeeping (a Gemini CLI rewind's part may
        start with a ``$set`` record), looked for at most :data:`NOTE_WALK` commits back from
        its tip."""
        out: dict[str, str] = {}
        for name in branches:
            m = _MADE.fullmatch(name)
            if m is None:
                continue
            n = int(m.group(2))
            first: tuple[int, LogEntry] | None = None
            for e in session.log(name, limit=NOTE_WALK):
                line = _importer_line(e)
                at = line.get("o") if line is not None else None
                if not isinstance(at, int):
                    continue
                if at < n and first is not None and first[0] == n:
                    break  # past the line the name gives: what is older is not the branch's own
                if at >= n and not self.bookkeeping(e) and (first is None or at <= first[0]):
                    first = (at, e)
            if first is None:
                continue
            e = first[1]
            msg = _message(e)
            text = self.describe(e) or (f"{_label(msg)}: {content_text(msg.content)}" if msg is not None
                                        else e.author or e.kind)
            out[name] = fold(f"{m.group(1)} from line {n}: {text}", 100)
        return out

    def links(self, session: Session) -> dict[str, list[str]]:
        """The turns that spawned subagents (``subagent: <session>`` on the call and on its
        result) and, in a subagent, its first line (``spawned by: <session> <commit>``), as
        the importers recorded them in the sessions' info: Claude Code's agents name their
        session, call and result; Gemini CLI's name the commit of the call, and the subagent
        is the session ``<parent>.<agent id>`` whose first message is its first line."""
        info = session.info
        out: dict[str, list[str]] = {}
        for key in IMPORTERS:
            agents = info.get(key, {}).get("agents") if isinstance(info.get(key), Mapping) else None
            for agent, a in agents.items() if isinstance(agents, Mapping) else ():
                if isinstance(a, str):  # Gemini CLI: agent id -> the commit of the call that ran it
                    out.setdefault(a, []).append(f"subagent: {session.id}.{agent}")
                    continue
                sub = a.get("session") if isinstance(a, Mapping) else None
                for cid in (a.get("call"), a.get("commit")) if isinstance(sub, str) else ():
                    if isinstance(cid, str):
                        out.setdefault(cid, []).append(f"subagent: {sub}")
        by = info.get("spawned_by")
        first = _first_line(info) if isinstance(by, Mapping) else None
        if isinstance(by, Mapping) and first is not None and isinstance(by.get("session"), str):
            at = f" {by['commit'][:8]}" if isinstance(by.get("commit"), str) else ""
            out.setdefault(first, []).append(f"spawned by: {by['session']}{at}")
        return out

    def said(self, session: Session, entries: Iterable[LogEntry]) -> dict[str, str]:
        """For each imported line with no message that is not bookkeeping (a Claude Code
        ``system`` line, a Gemini CLI ``$rewindTo``), what its stored line says, on one line
        (:func:`line_said`); the lines are read in one batch.

        Raises:
            ObjectNotFound, IntegrityError, StorageError: reading the stored lines failed.
        """
        raws: dict[str, str] = {}
        for e in entries:
            line = _importer_line(e)
            raw = line.get("raw") if line is not None else None
            if isinstance(raw, str) and _message(e) is None and not self.bookkeeping(e):
                raws[e.id] = raw
        if not raws:
            return {}
        from .jsonl_tree import NOT_JSON, parse_line, read_blobs

        got = read_blobs(session.store, list(raws.values()))
        out: dict[str, str] = {}
        for cid, raw in raws.items():
            d = parse_line(got[raw])
            if d is not NOT_JSON and (text := line_said(d)):
                out[cid] = text
        return out

    def details(self, session: Session, e: LogEntry, verbose: bool = False) -> list[tuple[str, list[tuple[str, Any]]]]:
        """For an imported line with no message (a Claude Code ``system`` line, a Codex
        ``event_msg``, a Gemini CLI ``$rewindTo``): the line as the agent wrote it, one field
        a row (an object's fields as ``payload.type``), each cut to :data:`FIELD_CHARS`
        characters unless ``verbose``; nothing for any other commit.

        Raises:
            ObjectNotFound, IntegrityError, StorageError: reading the stored line failed.
        """
        line = _importer_line(e)
        raw = line.get("raw") if line is not None else None
        if _message(e) is not None or not isinstance(raw, str):
            return []
        from .jsonl_tree import NOT_JSON, parse_line, read_blobs

        got = parse_line(read_blobs(session.store, [raw])[raw])
        if got is NOT_JSON:
            return []
        rows: list[tuple[str, Any]] = []
        for k, v in (got.items() if isinstance(got, Mapping) else [("", got)]):
            rows += [(f"{k}.{k2}", v2) for k2, v2 in v.items()] if isinstance(v, Mapping) and v else [(k, v)]
        if not verbose:
            rows = [(k, fold(v, FIELD_CHARS) if isinstance(v, str) else v) for k, v in rows]
        return [(f"line {line.get('o')}" if line is not None else "line", rows)]

    def settings(self, session: Session, entries: Iterable[LogEntry]) -> dict[str, str]:
        """For the bookkeeping lines that set the session's title (Claude Code's ``summary``,
        ``custom-title``, ``ai-title``; Gemini CLI's ``$set`` and ``metadata`` summary) or
        name a model other than the one before them on their path (Codex's ``turn_context``,
        ``session_meta``): ``title: ...`` or ``model: ...``; the lines are read in one batch.

        Raises:
            ObjectNotFound, IntegrityError, StorageError: reading the stored lines failed.
        """
        entries = list(entries)
        raws: dict[str, str] = {}
        for e in entries:
            line = _importer_line(e)
            raw = line.get("raw") if line is not None else None
            if isinstance(raw, str) and line is not None and line.get("type") in _SETTING_TYPES and self.bookkeeping(e):
                raws[e.id] = raw
        if not raws:
            return {}
        from .jsonl_tree import parse_line, read_blobs

        got = read_blobs(session.store, list(raws.values()))
        found = {cid: setting for cid, raw in raws.items() if (setting := _setting(parse_line(got[raw]))) is not None}
        out: dict[str, str] = {}
        model: dict[str, str | None] = {}  # commit -> the model in effect there
        for e in sorted(entries, key=lambda e: e.depth):
            before = model.get(e.parents[0]) if e.parents else None
            what, value = found.get(e.id) or ("", None)
            model[e.id] = value if what == "model" else before
            if value is not None and not (what == "model" and value == before):
                out[e.id] = f"{what}: {value}"
        return out

    def model(self, session: Session, entries: Sequence[LogEntry]) -> str | None:
        """The model the newest imported line of ``entries`` that names one names (at most
        :data:`NOTE_WALK` lines back): a Claude Code or Gemini CLI response's (its usage record
        as the importer keeps it, else its stored line), a Codex ``turn_context``'s or
        ``session_meta``'s (its stored line); stored lines are read newest first, one at a time,
        until one names a model.

        Raises:
            ObjectNotFound, IntegrityError, StorageError: reading a stored line failed.
        """
        from .jsonl_tree import parse_line, read_blobs

        for e in reversed(entries[-NOTE_WALK:]):
            line = _importer_line(e)
            if line is None or line.get("type") not in _MODEL_TYPES:
                continue
            kept = line.get("u")
            if isinstance(kept, list) and len(kept) == 6 and isinstance(kept[1], str) and kept[1]:
                return kept[1]
            raw = line.get("raw")
            if isinstance(raw, str) and not (kept == [] and line.get("type") in ("assistant", "gemini")):
                name = _named_model(parse_line(read_blobs(session.store, [raw])[raw]))
                if name is not None:
                    return name
        return None

    def bookkeeping(self, e: LogEntry) -> bool:
        """Whether an imported line is the client's bookkeeping (a ``progress`` line, a Codex
        ``event_msg`` copying a message, ...)."""
        line = _importer_line(e)
        if line is None or _message(e) is not None:
            return False
        if "codex" in e.meta and line.get("type") == "event_msg" and e.author in CODEX_COPIES:
            return True
        return line.get("type") in BOOKKEEPING or e.author in BOOKKEEPING


#: the ``type`` of the bookkeeping lines that may set a title or a model (:meth:`TranscriptView.settings`)
_SETTING_TYPES = frozenset({"summary", "custom-title", "ai-title", "$set", "metadata", "turn_context", "session_meta"})


def _setting(d: Any) -> tuple[str, str] | None:
    """What a stored bookkeeping line sets: ``("model", NAME)`` or ``("title", TEXT)``, or None."""
    if not isinstance(d, Mapping):
        return None
    if d.get("type") in ("turn_context", "session_meta"):
        payload = d.get("payload")
        name = payload.get("model") if isinstance(payload, Mapping) else None
        return ("model", fold(name, 80)) if isinstance(name, str) and name.strip() else None
    sets = d.get("$set")
    for v in (d.get("summary"), d.get("customTitle"), d.get("aiTitle"), d.get("title"),
              sets.get("summary") if isinstance(sets, Mapping) else None):
        if isinstance(v, str) and v.strip():
            return "title", fold(v, 120)
    return None


#: the ``type`` of the imported lines that may name the model in use (:meth:`TranscriptView.model`)
_MODEL_TYPES = frozenset({"assistant", "gemini", "turn_context", "session_meta"})


def _named_model(d: Any) -> str | None:
    """The model a stored line names: a Codex ``turn_context``'s or ``session_meta``'s
    ``payload.model``, a Claude Code response's ``message.model`` (not its ``<synthetic>``
    stand-in), a Gemini CLI message's ``model``; or None."""
    if not isinstance(d, Mapping):
        return None
    payload, msg = d.get("payload"), d.get("message")
    name = payload.get("model") if isinstance(payload, Mapping) else \
        msg.get("model") if isinstance(msg, Mapping) else d.get("model")
    return name if isinstance(name, str) and name.strip() and name != "<synthetic>" else None


#: fields of a stored line that say where and when it was written, not what it says
_CONTEXT_FIELDS = frozenset({"uuid", "parentUuid", "logicalParentUuid", "sessionId", "timestamp", "cwd", "version",
                             "gitBranch", "userType", "isSidechain", "isMeta", "slug", "requestId", "id", "type"})


def line_said(d: Any) -> str:
    """What a stored line with no message says, on one line: its ``subtype`` first, then its
    other fields as ``key=value`` (an object's fields as ``cause.code=...``), without those
    that only say where and when it was written (its ids, time, folder, version)."""
    if not isinstance(d, Mapping):
        return fold(json.dumps(d, ensure_ascii=False, default=str), 200)
    pairs: list[tuple[str, Any]] = []
    for k, v in d.items():
        if k in _CONTEXT_FIELDS:
            continue
        if isinstance(v, Mapping):
            pairs += [(f"{k}.{k2}", v2) for k2, v2 in v.items() if k2 not in _CONTEXT_FIELDS]
        else:
            pairs.append((k, v))
    lead = [str(v) for k, v in pairs if k in ("subtype", "payload.type") and isinstance(v, str)]
    rest = [f"{k}={fold(v, ARG_CHARS) if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)}"
            for k, v in pairs if k not in ("subtype", "payload.type") and not isinstance(v, (Mapping, list))]
    return fold(" ".join(lead + rest), 200)


def _first_line(info: Mapping[str, Any]) -> str | None:
    """The commit of a subagent session's first line, as its importer's info names it (Claude
    Code: ``spawned_by.first``; Gemini CLI: the first message of ``msgs``, by its ``commits``)."""
    by = info.get("spawned_by")
    if isinstance(by, Mapping) and isinstance(by.get("first"), str):
        return str(by["first"])
    c = info.get("gemini")
    if not isinstance(c, Mapping) or not isinstance(c.get("msgs"), list) or not isinstance(c.get("commits"), Mapping):
        return None
    lines = [m[1] for m in c["msgs"] if isinstance(m, list) and len(m) > 1 and isinstance(m[1], int)]
    got = c["commits"].get(str(min(lines))) if lines else None
    return got if isinstance(got, str) else None


views.register(TranscriptView())
