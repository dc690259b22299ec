"""Commands for the everyday loop: use, status, compact, delete-session."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click

from .. import porcelain
from ..deletion import finish_line
from ..errors import AmbiguousSession, InvalidName, SessionNotFound
from ..session import Session
from ..store import Store
from .common import (
    SESSION_CONFIG_KEY,
    default_session,
    find_session,
    forget_deleted,
    format_key,
    get_session,
    hint,
    json_option,
    note,
    open_store,
    pass_session,
    plural,
    print_json,
    session_source,
    split_key,
    store_url,
    uses_session,
)
from .complete import complete_key, complete_session
from .render import safe, short


@click.command("use")
@click.argument("session_key", metavar="[APP/USER/SESSION]", required=False, shell_complete=complete_session)
@click.option("--unset", is_flag=True, help="Forget the default session.")
@click.pass_context
def use_cmd(ctx: click.Context, session_key: str | None, unset: bool) -> None:
    """Make APP/USER/SESSION this store's default session (no -s needed after it).

    The session may be named by its id alone or a unique prefix of it (`castore use
    0ccf1a04`), as -s takes it everywhere; an ambiguous one lists the candidates.
    Kept in the store's castore.json, so everyone using this store (an S3 one too) gets
    it. -s and $CASTORE_SESSION still win over it. With no argument, print it.
    """
    store = open_store(ctx, must_exist=False)
    if unset:
        if session_key is not None:
            raise click.UsageError("--unset takes no APP/USER/SESSION")
        if store.exists:
            store.update_config(lambda cfg: {k: v for k, v in cfg.items() if k != SESSION_CONFIG_KEY})
        note("no default session")
        return
    if session_key is None:
        current = default_session(store)
        if current is None:
            raise click.ClickException(f"no default session: choose one with {hint('use APP/USER/SESSION')}")
        click.echo(safe(current))  # from castore.json, which a shared (S3) store's users all write
        return
    if "/" not in session_key:  # an id alone is looked up: in no store it is no store, not no session
        store.require()
    session = find_session(store, session_key, new_ok=True, param_hint="APP/USER/SESSION")
    spec = format_key(*session.key)
    store.update_config(lambda cfg: {**cfg, SESSION_CONFIG_KEY: spec})
    note(f"Using session {spec}" + ("" if session.exists() else " (it has no entries yet)"))


@click.command("status")
@uses_session
@json_option('{"store": URL, "store_exists": BOOL, "session": KEY|null, "session_from": "-s"|"$CASTORE_SESSION"|'
             '"castore use"|null, "exists": BOOL, "title": TEXT|null, "subagent_of": {"key": KEY, "session": ID, '
             '"commit": ID (when known)}|null, "head": ID|null, "branch": NAME|null, '
             '"entries": N, "branches": N, "labels": N, "remotes": {NAME: URL}, "kept_from_remotes": {REF: ID}, '
             '"deleting": Unix seconds|null (when a deletion of the session began that did not finish)}')
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool) -> None:
    """Show the store, the session, HEAD, its branch, the entries and the remotes' state.

    Nothing is sent over the network: the remote state is what the last pull left
    (remotes/REMOTE/BRANCH refs, kept when both sides moved).
    """
    store = open_store(ctx, must_exist=False)
    try:
        session: Session | None = get_session(ctx, must_exist=False, new_ok=True)
    except click.UsageError:
        session = None
    st = porcelain.status(store, session)
    doc: dict[str, Any] = {"store": st.store, "store_exists": st.store_exists,
                           "session": format_key(*st.session) if st.session else None,
                           "session_from": session_source(ctx) if st.session else None,
                           **{k: v for k, v in dataclasses.asdict(st).items()
                              if k not in ("store", "store_exists", "session")}}
    if as_json:
        print_json(doc)
        return
    shown = doc["store"] if doc["store"] == store_url(ctx) else f"{doc['store']} ({store_url(ctx)})"
    click.echo(f"store:    {shown}" + ("" if doc["store_exists"] else " (not created yet: the first write creates it)"))
    if session is None:
        click.echo("session:  none (pass -s APP/USER/SESSION, set $CASTORE_SESSION, or "
                   f"{hint('use APP/USER/SESSION', session=False)})")
    else:
        click.echo(f"session:  {safe(doc['session'])} (from {doc['session_from']})")
        if doc["title"]:
            click.echo(f"title:    {safe(doc['title'])}")
        if doc["subagent_of"]:
            by = doc["subagent_of"]
            at = f" (spawned at {short(by['commit'])})" if by.get("commit") else ""
            click.echo(f"subagent: of {safe(by['key'])}{at}")
        if doc["deleting"] is not None:
            click.echo(f"deletion: {click.style(safe(finish_line(session.key)), fg='yellow')}")
        if doc["exists"]:
            where = f"on branch {safe(doc['branch'])}" if doc["branch"] else click.style("detached", fg="red")
            click.echo(f"HEAD:     {click.style(short(doc['head']), fg='yellow')} {where}")
            click.echo(f"entries:  {doc['entries']} on the path to HEAD, "
                       f"{plural(doc['branches'], 'branch', 'branches')}, {plural(doc['labels'], 'label')}")
        elif doc["deleting"] is None:  # (an append to a session being deleted is refused)
            click.echo(f"HEAD:     none yet (the session has no entries; {hint('append --role user TEXT')} starts it)")
    if not doc["remotes"]:
        click.echo(f"remotes:  none ({hint('remote add NAME URL', session=False)})")
    for name, url in doc["remotes"].items():
        click.echo(f"remote:   {safe(name)} {safe(url)}")
    for ref, cid in doc["kept_from_remotes"].items():
        click.echo(f"kept:     {safe(ref)} at {short(cid)} (both sides moved; compare with {hint('log --all')})")


@click.command("compact")
@click.argument("summary")
@click.option("--keep-from", "keep_from", required=True, metavar="REV",
              help="The first entry kept as is; the summary stands for everything before it.")
@pass_session()
def compact_cmd(session: Session, summary: str, keep_from: str) -> None:
    """Append a compaction: SUMMARY replaces the entries before --keep-from in the context.

    Nothing is deleted: `castore log` still shows every entry, and `castore context`
    shows what a model is sent now. SUMMARY "-" reads it from stdin. Prints the new
    commit id.
    """
    text = sys.stdin.read() if summary == "-" else summary
    cid = session.compact(text, keep_from=keep_from)
    note(f"Compacted: the context now starts with the summary, then {keep_from}")
    click.echo(cid)


@click.command("delete-session")
@click.argument("session_key", metavar="APP/USER/SESSION", shell_complete=complete_key)
@click.pass_context
def delete_session_cmd(ctx: click.Context, session_key: str) -> None:
    """Delete session APP/USER/SESSION: its branches, labels and HEAD.

    Its content stays in the store until `castore gc` (after the grace period, and
    only what no other session shares). The session must be named in full: the default
    session is never deleted implicitly. Run again, it finishes a deletion that was
    interrupted (`castore fsck` lists those).
    """
    store: Store = open_store(ctx)
    if "/" not in session_key:
        _refuse_short(store, session_key)
    app, user, sid = split_key(session_key, 3, 3, "APP/USER/SESSION")
    session = store.session(app, user, sid)
    head = session.head
    if head is None and not session.exists():
        raise SessionNotFound(session.key)
    store.delete_session(app, user, sid)
    forget_deleted(store)  # the search index and usage cache forget it now, not at their next run
    key = format_key(*session.key)
    if default_session(store) == key:
        store.update_config(lambda cfg: {k: v for k, v in cfg.items() if k != SESSION_CONFIG_KEY})
        note(f"{key} was the default session (`castore use`): no default now")
    note(f"Deleted session {key} (HEAD was {short(head)}; {hint('gc', session=False)} frees what only it held)")


def _refuse_short(store: Store, typed: str) -> None:
    """Refuse a session named by its id alone or a prefix (as every other command takes it),
    naming the key to type when it finds one: a deletion is never guessed.

    Returns when it finds none (nor several): split_key's error says what a key is.

    Raises:
        click.BadParameter: the session ``typed`` names, its key in the message (exit 2).
    """
    try:
        key = format_key(*find_session(store, typed).key)
    except (SessionNotFound, AmbiguousSession, InvalidName):
        return  # split_key's error: not APP/USER/SESSION
    raise click.BadParameter(f"{typed!r} is not APP/USER/SESSION; name the session in full: "
                             f"castore delete-session {key}", param_hint="APP/USER/SESSION")


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for cmd in (use_cmd, status_cmd, compact_cmd, delete_session_cmd):
        group.add_command(cmd)


__all__ = ["register"]
