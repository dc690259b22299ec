"""Commands that read: sessions, log, show, state, diff, context, replay, verify, cat-object."""

from __future__ import annotations

import shlex
from typing import Any

import click

from .. import porcelain, views
from ..entries import LogEntry, Message
from ..errors import DamagedPack, RevisionNotFound
from ..session import Session
from ..store import Store
from . import render as r
from .common import (
    all_entries_option,
    hint,
    internal_option,
    json_option,
    limit_option,
    note,
    paged,
    pass_session,
    pass_store,
    plural,
    print_json,
    split_key,
)
from .complete import complete_revision
from .session_cmds import refs_of

_COMMIT_FIELDS = (
    '{"id", "short", "kind", "parents": [ID], "depth", "time" (Unix seconds), "author", "summary", '
    '"entry" (the message, or the event/compaction/... fields), "delta", "unset", "meta", '
    '"refs": {"head": BOOL, "branches": [NAME], "labels": [NAME]}}'
)


@click.command("sessions")
@click.argument("prefix", metavar="[APP[/USER]]", required=False)
@limit_option(what="sessions")
@json_option('{"sessions": [{"key": "APP/USER/SESSION", "app", "user", "session", "head": ID|null, '
             '"branch": NAME|null, "entries": N (on the path to HEAD), "updated": Unix seconds, "title": TEXT|null, '
             '"subagent_of": {"key": KEY, "session": ID, "commit": ID (when known)}|null (an imported subagent), '
             '"info": {...}, "problem": TEXT|null (what `status` says of a damaged or lost HEAD or branch), '
             '"deleting": Unix seconds|null (when a deletion of it began that did not finish)}]}')
@pass_store()
@paged
def sessions_cmd(store: Store, prefix: str | None, limit: int | None, as_json: bool) -> None:
    """List sessions, newest first: entries on the path to HEAD, branch, last activity, title.

    Without an argument every app's sessions are listed; APP or APP/USER narrows it.
    A session whose HEAD or branch is damaged or lost is listed as `damaged:` with what
    `status` and `fsck` say of it; one whose deletion was interrupted, with the command
    that finishes it (`grep` and `usage` skip it, as they would once it is deleted).
    """
    if prefix:
        parts = split_key(prefix, 1, 2, "APP[/USER]")
        infos = store.sessions(*parts)
    else:
        infos = sorted((s for app in store.apps() for s in store.sessions(app)),
                       key=lambda s: s.updated, reverse=True)
    infos = infos[:limit or None]
    if as_json:
        print_json({"sessions": [r.session_info_json(s) for s in infos]})
        return
    if not infos:
        note("no sessions" + (_which_apps(store, parts[0]) if prefix else ""))
    for line in r.sessions_table(infos):
        click.echo(line)


def _which_apps(store: Store, app: str) -> str:
    """After "no sessions" of APP[/USER]: the apps there are, when APP is none of them (a typo)."""
    apps = store.apps()
    if app in apps:
        return ""
    return f": no app {r.safe(repr(app))} here" + (f" (apps: {r.safe(', '.join(apps))})" if apps else "")


_verbose_option = click.option(
    "-v", "--verbose", is_flag=True,
    help="Tool calls and results of imported sessions in full (else `→ Bash(ls …)` and `← 14 lines`).")


@click.command("log")
@click.argument("rev", default="HEAD", shell_complete=complete_revision)
@click.option("--oneline", is_flag=True, help="One line per commit: short id, refs, summary.")
@click.option("--graph", is_flag=True,
              help="Draw the tree as `git log --graph` does, one line per commit; the current leaf is '@'.")
@click.option("--all", "all_", is_flag=True, help="Every commit of every branch and label, not just the path to REV.")
@limit_option(default=10, what="commits, newest first")
@internal_option("branches, with --all")
@all_entries_option
@_verbose_option
@json_option('{"session": {"key", "app", "user", "session"}, "head": ID|null, "branch": NAME|null, '
             f'"commits": [{_COMMIT_FIELDS}], "graph": [LINE] (with --graph only)}}; commits are newest '
             'first (with --graph, in the order drawn), bookkeeping lines included as with --all-entries')
@pass_session()
@paged
def log_cmd(session: Session, rev: str, oneline: bool, graph: bool, all_: bool, limit: int, internal: bool,
            all_entries: bool, verbose: bool, as_json: bool) -> None:
    """Show history, newest first; --all: every branch, --graph: the tree.

    Without --all: the path from the root to REV (default HEAD). Like `llm logs`, the last
    10 entries by default (-n 0 for all). With --all, every
    branch; with --graph, the tree drawn with | * / as git does. A commit in a damaged
    pack record stops the log as git's stops at an object it cannot read: the commits
    newer than it are shown, then one `Error:` line naming the pack (exit 1).
    """
    if all_ and rev != "HEAD":
        raise click.UsageError("--all shows every branch; give no REV with it")
    every = all_entries or as_json
    # one entry more than shown tells whether the note below has anything to say
    want = limit + 1 if limit and not all_ else limit
    damaged: DamagedPack | None = None
    try:
        names, entries = porcelain.log(session, rev, limit=want or None, all_branches=all_, internal=internal,
                                       all_entries=every)
        refs = r.Refs.from_names(names)
    except DamagedPack:
        if all_ or graph or as_json:
            raise
        # as git's log: the commits readable from REV, newest first, then the error
        entries, damaged = _readable_tail(session, rev, want, every)
        refs = refs_of(session, internal=internal)
    more = bool(limit) and len(entries) > limit
    entries = entries[:limit] if limit else entries
    if graph:
        entries = r.topo_order(entries)
    if as_json:
        doc: dict[str, Any] = {"session": r.session_json(session.key), "head": refs.head, "branch": refs.branch,
               "commits": [r.commit_json(e, refs) for e in entries]}
        if graph:
            doc["graph"] = r.graph_lines(entries, refs, r.plain)
        print_json(doc)
        return
    refs.said = views.said(session, entries)  # an imported line with no message: what its stored line says
    if graph:
        lines = r.graph_lines(entries, refs)
    elif oneline:
        lines = [r.oneline(e, refs) for e in entries]
    else:
        lines = []
        for e in entries:
            lines += [*r.commit_block(e, refs, body_limit=None if verbose else r.LOG_BODY_LINES, show_hint=hint,
                                      verbose=verbose), ""]
    for line in lines:
        click.echo(line)
    if not all_ and more:
        # left-out bookkeeping lines are on the path too: only an unfiltered log knows the total
        of = f" of {plural(entries[0].depth + 1, 'entry')}" if every else " entries"
        note(f"(the last {len(entries)}{of}; -n 0 shows all)")
    if damaged is not None:
        raise damaged


def _readable_tail(session: Session, rev: str, want: int, every: bool) -> tuple[list[LogEntry], DamagedPack | None]:
    """The commits of the path to ``rev`` readable from ``rev`` back (first parents), up to
    ``want`` shown ones (0: all; bookkeeping lines left out unless ``every``), and the
    :class:`DamagedPack` error of the first one that is not (None: none met before ``want``)."""
    out: list[LogEntry] = []
    shown = 0
    cid: str | None = session.resolve(rev)
    while cid is not None and not (want and shown >= want):
        try:
            e = session.show(cid)
        except DamagedPack as err:
            return (out if every else porcelain.readable(out)), err
        out.append(e)
        shown += every or not views.bookkeeping(e)
        cid = e.parents[0] if e.parents else None
    return (out if every else porcelain.readable(out)), None


@click.command("show")
@click.argument("rev", default="HEAD", shell_complete=complete_revision)
@_verbose_option
@json_option(_COMMIT_FIELDS)
@pass_session()
@paged
def show_cmd(session: Session, rev: str, verbose: bool, as_json: bool) -> None:
    """Show one commit: its entry, metadata, state delta and parents."""
    e = session.show(rev)
    refs = refs_of(session, internal=True)
    if as_json:
        print_json(r.commit_json(e, refs))
        return
    for line in r.commit_block(e, refs, full=True, verbose=verbose):
        click.echo(line)
    # what an adapter adds (a LangGraph checkpoint's updated channels, a task's writes, an
    # imported line with no message as the agent wrote it)
    for title, pairs in views.details(session, e, verbose):
        for i, (k, v) in enumerate(pairs):
            click.echo((f"{title}:".ljust(9) if i == 0 else " " * 9) + f"{r.safe(k)} = {r.fmt_value(v)}")


@click.command("state")
@click.argument("rev", default="HEAD", shell_complete=complete_revision)
@click.argument("key", required=False)
@json_option("the output is JSON anyway (the state object, or the value of KEY); accepted for uniformity")
@paged
@pass_session()
def state_cmd(session: Session, rev: str, key: str | None, as_json: bool) -> None:
    """Print the state at REV (default HEAD) as JSON, or the value of KEY.

    `castore state KEY` is HEAD's KEY when KEY is not a revision. Time travel: at any
    revision the state is exactly what it was after that commit, app: and user: keys
    included. At a LangGraph checkpoint: its channel values, decoded when langgraph is
    installed.
    """

    def state_of(rev: str) -> dict[str, Any]:
        return views.state_at(session, rev)  # a LangGraph checkpoint: its channel values, decoded

    if key is None and rev != "HEAD":
        try:
            state = state_of(rev)
        except RevisionNotFound:
            head_state = state_of("HEAD")
            if rev not in head_state:
                raise RevisionNotFound(rev, "neither a revision nor a key of HEAD's state") from None
            print_json(head_state[rev])
            return
        if rev in state_of("HEAD"):
            note(f"{r.safe(repr(rev))} is a revision and a state key: this is the state at the revision; "
                 f"for the key write {r.safe(hint(f'state HEAD {shlex.quote(rev)}'))}")
        print_json(state)
        return
    state = state_of(rev)
    if key is None:
        print_json(state)
        return
    if key not in state:
        raise click.ClickException(f"no key {key!r} in the state at {rev}")
    print_json(state[key])


@click.command("diff")
@click.argument("rev1", shell_complete=complete_revision)
@click.argument("rev2", default="HEAD", shell_complete=complete_revision)
@json_option('{"base": ID|null (the common ancestor), "added": {KEY: VALUE}, "removed": {KEY: VALUE}, '
             '"changed": {KEY: [OLD, NEW]}, "entries1": [COMMIT], "entries2": [COMMIT]} '
             '(entriesN: the commits after the base up to REVN, oldest first, fields as in `log --json`)')
@all_entries_option
@pass_session()
@paged
def diff_cmd(session: Session, rev1: str, rev2: str, all_entries: bool, as_json: bool) -> None:
    """State changes from REV1 to REV2 (default HEAD), and the entries since they forked.

    `castore diff REV` compares REV with HEAD, as git does. The fork point is the common
    ancestor of the two; the entries after it on each side are listed, as `log` lists them.
    """
    d = session.diff(rev1, rev2)
    decoded = views.diff_states(session, rev1, rev2)  # LangGraph checkpoints: their channel values
    if decoded is not None:
        d.update(decoded)
    refs = refs_of(session)
    if as_json:
        print_json({**{k: d[k] for k in ("base", "added", "removed", "changed")},
                    "entries1": [r.commit_json(e, refs) for e in d["entries1"]],
                    "entries2": [r.commit_json(e, refs) for e in d["entries2"]]})
        return
    click.echo(f"common ancestor: {r.short(d['base']) if d['base'] else '(none)'}")
    changes = ([click.style(f"+ {r.safe(k)} = {r.fmt_value(v)}", fg="green") for k, v in d["added"].items()]
               + [click.style(f"- {r.safe(k)} = {r.fmt_value(v)}", fg="red") for k, v in d["removed"].items()]
               + [f"~ {r.safe(k)}: {r.fmt_value(a)} -> {r.fmt_value(b)}" for k, (a, b) in d["changed"].items()])
    click.echo("state:" + ("" if changes else " no change"))
    for c in changes:
        click.echo("  " + c)
    sides = [(rev, d[key] if all_entries else [e for e in d[key] if not views.bookkeeping(e)])
             for rev, key in ((rev1, "entries1"), (rev2, "entries2"))]
    refs.said = views.said(session, [e for _, entries in sides for e in entries])  # as log reads them
    for rev, entries in sides:
        click.echo(f"only on {r.safe(rev)} ({len(entries)}):")
        for e in entries:
            click.echo("  " + r.oneline(e, refs))


#: the newest commits of a path ``context --json`` asks an adapter's view for the model in force
#: when the path's entries name none (:func:`castore.views.model`)
MODEL_WALK = 2_000


@click.command("context")
@click.argument("rev", default="HEAD", shell_complete=complete_revision)
@click.option("--max-tokens", type=click.IntRange(min=0), metavar="N",
              help="Token budget: the oldest turns are left out first.")
@click.option("--max-messages", type=click.IntRange(min=0), metavar="N", help="Message budget.")
@click.option("--tool-output-limit", type=click.IntRange(min=0), metavar="N",
              help="Replace tool outputs over N tokens by a placeholder naming their commit.")
@json_option('{"rev": REV, "model": NAME|null (in force at REV: set by the entries, else named by an imported '
             'line), "tokens": N|null, "dropped": N, "messages": [{"role", "content", ...}], "commits": [ID] '
             '(the commit each message comes from)}')
@_verbose_option
@pass_session()
@paged
def context_cmd(session: Session, rev: str, max_tokens: int | None, max_messages: int | None,
                tool_output_limit: int | None, verbose: bool, as_json: bool) -> None:
    """Print the messages a model would be sent for the path ending at REV.

    The latest compaction and the branch summaries on the path are honoured, budgets trim
    the oldest turns; the stored history is never changed (see `log` for all of it).
    """
    try:
        result = session.context(rev, max_tokens=max_tokens, max_messages=max_messages,
                                 tool_output_limit=tool_output_limit)
    except ModuleNotFoundError as e:
        if e.name != "castore.context":
            raise
        raise click.ClickException("context projection is not available in this castore "
                                   "(castore.context is missing)") from e
    messages = r.context_messages(result)
    tokens, dropped = getattr(result, "tokens", None), getattr(result, "dropped", 0)
    if as_json:
        model = getattr(result, "model", None)
        if model is None:  # an imported session may name it in lines the entries do not hold
            model = views.model(session, session.log(rev, limit=MODEL_WALK)[::-1])
        print_json({"rev": rev, "model": model, "tokens": tokens, "dropped": dropped,
                    "messages": messages, "commits": list(getattr(result, "commits", []))})
        return
    for m in messages:
        if isinstance(m, dict) and m.get("role"):
            for line in r.context_lines(Message.from_dict(m), verbose):
                click.echo(line)
        else:
            click.echo(r.fmt_value(m))
    note(f"({plural(len(messages), 'message')}" + (f", ~{tokens} tokens" if tokens is not None else "")
         + (f", {dropped} left out by the budget" if dropped else "") + ")")


@click.command("replay")
@click.argument("rev", default="HEAD", shell_complete=complete_revision)
@json_option("the output is JSON anyway (the replayed state object); accepted for uniformity")
@pass_session()
def replay_cmd(session: Session, rev: str, as_json: bool) -> None:
    """Rebuild the state at REV from the entries' deltas alone, and print it.

    Compare with `castore state REV` (the stored snapshot), or run `castore verify`.
    """
    print_json(session.replay(rev))


@click.command("verify")
@click.argument("rev", default="HEAD", shell_complete=complete_revision)
@json_option('{"ok": true, "commits": N, "head": ID}')
@pass_session()
def verify_cmd(session: Session, rev: str, as_json: bool) -> None:
    """Audit REV's path: re-hash objects, replay deltas against snapshots.

    Every object on the path is re-read and re-hashed, and replaying the state deltas
    must give every stored state snapshot. Exits 1 with `Error: ...` naming the first bad commit or object.
    """
    res = session.verify(rev)
    if as_json:
        print_json({"ok": True, **res})
        return
    click.echo(f"OK: {plural(res['commits'], 'commit')} up to {r.short(res['head'])} verified "
               "(objects re-hashed, replayed state equals every snapshot)")


@click.command("cat-object")
@click.argument("object_id", metavar="ID")
@json_option('the output is JSON anyway: {"id", "type": "commit"|"value"|"tree"|"blob"|"segment"|"index", '
             '...its fields, ids in hex, bytes in base64}; accepted for uniformity')
@pass_store()
def cat_object_cmd(store: Store, object_id: str, as_json: bool) -> None:
    """Print a stored object by id or unique prefix (4+ hex characters)."""
    if not 4 <= len(object_id) <= 64 or any(c not in "0123456789abcdefABCDEF" for c in object_id):
        raise click.ClickException(f"{object_id!r} is not an object id: give 4 to 64 hex characters (0-9, a-f), "
                                   f"e.g. a commit id from {hint('log -s APP/USER/SESSION', session=False)}")
    oid = store.objects.resolve_prefix(object_id)
    print_json(r.object_json(oid, store.objects.get(oid), store.objects.codec))


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for cmd in (sessions_cmd, log_cmd, show_cmd, state_cmd, diff_cmd, context_cmd, replay_cmd,
                verify_cmd, cat_object_cmd):
        group.add_command(cmd)


__all__ = ["register"]
