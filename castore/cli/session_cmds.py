"""Commands that write: init, append, checkout, branch, label, labels, fork."""

from __future__ import annotations

import sys
from typing import Any

import click

from .. import objects as o
from ..entries import DELETE, Event, Message
from ..errors import InvalidEntry
from ..session import Session
from ..store import Store
from .common import format_key, json_option, note, pass_session, print_json, store_url
from .render import Refs, short


@click.command("init")
@click.argument("url", required=False)
@click.option("--format", "fmt", type=click.IntRange(1, 2), default=None,
              help="Storage format: 1 (one file per object, the default) or 2 (packs; docs/FORMAT.md).")
@click.pass_context
def init_cmd(ctx: click.Context, url: str | None, fmt: int | None) -> None:
    """Create a store at URL (default: the --store option).

    Doing it twice is harmless. Writing to a store that does not exist yet creates it
    too, so this is only needed to make an empty one (or to choose its format).
    """
    target = url or store_url(ctx)
    with Store.open(target, format=fmt) as store:
        created = store.init()
        note(f"{'Initialized empty' if created else 'Found existing'} castore store at {store.url}")


def _read_text(text: str) -> str:
    return sys.stdin.read() if text == "-" else text


def _parse_event(raw: str) -> Event:
    doc = o.json_loads(raw)
    if not isinstance(doc, dict):
        raise InvalidEntry("an event must be a JSON object: {\"author\": ..., \"message\": {...}, ...}")
    unknown = set(doc) - {"author", "message", "state_delta", "unset", "meta"}
    if unknown:
        raise InvalidEntry(f"unknown event field(s): {', '.join(sorted(unknown))}")
    msg = doc.get("message")
    delta = doc.get("state_delta") or {}
    unset = doc.get("unset") or []
    if not isinstance(delta, dict) or not isinstance(unset, list) or not all(isinstance(k, str) for k in unset):
        raise InvalidEntry("state_delta must be an object and unset a list of keys")
    meta = doc.get("meta") or {}
    if not isinstance(meta, dict):
        raise InvalidEntry("meta must be an object")
    return Event(
        author=doc.get("author", ""),
        message=Message.from_dict(msg) if msg is not None else None,
        state_delta={**delta, **{k: DELETE for k in unset}},
        meta=meta,
    )


@click.command("append")
@click.option("--role", metavar="ROLE", help="Append a message with this role (user, assistant, system, tool...).")
@click.option(
    "--event", "event_json", metavar="JSON",
    help='Append an event: {"author": "...", "message": {"role": ..., "content": ...}, '
         '"state_delta": {...}, "unset": ["key"], "meta": {...}}; "-" reads it from stdin.',
)
@click.argument("text", required=False)
@pass_session(must_exist=False)
def append_cmd(session: Session, role: str | None, event_json: str | None, text: str | None) -> None:
    """Append a message (--role ROLE TEXT) or an event (--event JSON).

    The entry goes on the current branch. TEXT "-" reads the text from stdin. Prints the new commit id on stdout. The session
    (and the store) are created by the first append. Appending on a detached HEAD starts
    a new branch there.
    """
    if (role is None) == (event_json is None):
        raise click.UsageError("give exactly one of --role ROLE TEXT or --event JSON")
    if role is not None:
        if text is None:
            raise click.UsageError("--role needs the message TEXT (or - to read it from stdin)")
        entry: Any = Message(role=role, content=_read_text(text))
    else:
        if text is not None:
            raise click.UsageError("--event takes its JSON as the option's value, not an extra TEXT")
        entry = _parse_event(_read_text(event_json or ""))
    was_detached = session.exists() and session.current_branch is None
    cid = session.append(entry)
    if was_detached:
        note(f"HEAD was detached: started branch {session.current_branch!r} at {short(cid)}")
    click.echo(cid)


@click.command("checkout")
@click.argument("rev")
@click.option("-b", "new_branch", metavar="NEW", help="Create branch NEW at REV and switch to it.")
@pass_session()
def checkout_cmd(session: Session, rev: str, new_branch: str | None) -> None:
    """Move HEAD (the leaf) to a branch, or detach it at a commit (REV).

    On a branch, new entries extend the branch. At any other revision HEAD is detached:
    reading works as usual, and the next append starts a new branch there.
    """
    branch = session.checkout(rev, create=new_branch)
    head = session.head
    if branch is None:
        note(
            f"HEAD is now detached at {short(head)} (not on any branch). Appending here starts a "
            f"new branch; name it with `castore checkout -b NAME`, or go back with "
            f"`castore checkout BRANCH`."
        )
    elif new_branch is not None:
        note(f"Switched to a new branch {branch!r} at {short(head)}")
    else:
        note(f"Switched to branch {branch!r} at {short(head)}")


@click.command("branch")
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-d", "--delete", "delete", is_flag=True, help="Delete branch NAME; refuses unmerged work.")
@click.option("-D", "force_delete", is_flag=True, help="Delete branch NAME even if its work is on no other ref.")
@json_option('{"head": ID|null, "current": NAME|null, "branches": [{"name", "commit", "current"}]}')
@pass_session()
def branch_cmd(session: Session, name: str | None, rev: str | None, delete: bool, force_delete: bool,
               as_json: bool) -> None:
    """List, create (NAME [REV]) or delete (-d/-D NAME) branches.

    With no NAME, list them (the current one marked *). NAME [REV] creates a branch at REV
    (default HEAD) without switching to it. -d refuses a branch whose tip is on no other branch, label or HEAD (its work would
    only be reachable by id); -D deletes it anyway. The checked-out branch cannot be
    deleted.
    """
    if delete or force_delete:
        if name is None or rev is not None:
            raise click.UsageError("branch -d/-D takes exactly one NAME")
        was = session.branches().get(name)
        session.delete_branch(name, force=force_delete)
        note(f"Deleted branch {name!r} (was {short(was)})")
        return
    if name is not None:
        if as_json:
            raise click.UsageError("--json lists branches; it takes no NAME")
        cid = session.branch(name, rev or "HEAD")
        note(f"Created branch {name!r} at {short(cid)}")
        return
    branches, current, head = session.branches(), session.current_branch, session.head
    if as_json:
        print_json({
            "head": head,
            "current": current,
            "branches": [{"name": b, "commit": c, "current": b == current} for b, c in branches.items()],
        })
        return
    width = max((len(b) for b in branches), default=0)
    if current is None:
        click.echo(f"* {click.style(f'(HEAD detached at {short(head)})', fg='red')}")
    for b, c in branches.items():
        mark = "*" if b == current else " "
        shown = click.style(b.ljust(width), fg="green") if b == current else b.ljust(width)
        click.echo(f"{mark} {shown}  {click.style(short(c), fg='yellow')}")


@click.command("label")
@click.argument("rev")
@click.argument("name")
@click.option("-f", "--force", is_flag=True, help="Move the label if it already exists.")
@pass_session()
def label_cmd(session: Session, rev: str, name: str, force: bool) -> None:
    """Put label NAME on the commit REV names (like a git tag).

    A label is a revision too: `castore show NAME`, `castore state NAME`.
    """
    cid = session.label(rev, name, force=force)
    note(f"Labelled {short(cid)} {name!r}")


@click.command("labels")
@json_option('{"labels": [{"name", "commit"}]}')
@pass_session()
def labels_cmd(session: Session, as_json: bool) -> None:
    """List the session's labels and the commits they name."""
    labels = session.labels()
    if as_json:
        print_json({"labels": [{"name": n, "commit": c} for n, c in labels.items()]})
        return
    width = max((len(n) for n in labels), default=0)
    for n, c in labels.items():
        click.echo(f"{n.ljust(width)}  {click.style(short(c), fg='yellow')}")


@click.command("fork")
@click.argument("new_session")
@click.argument("rev", default="HEAD")
@click.option("--user", metavar="USER", help="Fork into this user's sessions (default: the same user).")
@pass_session()
def fork_cmd(session: Session, new_session: str, rev: str, user: str | None) -> None:
    """Start session NEW_SESSION from this one's history up to REV (O(1)).

    The new session is in the same app (and user, unless --user) and shares every object. Prints the new session's key
    (APP/USER/SESSION) on stdout, ready for -s.
    """
    new = session.fork(new_session, rev, user=user)
    key = format_key(*new.key)
    note(f"Forked {format_key(*session.key)} at {short(new.head)} into {key}")
    click.echo(key)


def refs_of(session: Session) -> Refs:
    """Where HEAD, the branches and the labels of a session point."""
    return Refs(head=session.head, branch=session.current_branch,
                branches=session.branches(), labels=session.labels())


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for cmd in (init_cmd, append_cmd, checkout_cmd, branch_cmd, label_cmd, labels_cmd, fork_cmd):
        group.add_command(cmd)


__all__ = ["register", "refs_of"]
