"""Commands that write: init, append, checkout, branch, label, labels, fork."""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click

from .. import objects as o
from .. import porcelain
from ..entries import DELETE, Event, Message
from ..errors import CorruptRef, InvalidEntry
from ..session import Session
from ..store import Store, check_url
from .common import (
    dry_run_option,
    duration,
    ensure_bucket,
    format_key,
    get_session,
    hint,
    internal_option,
    json_option,
    key_options,
    limit_option,
    note,
    pass_session,
    print_json,
    store_options,
    store_url,
    uses_session,
)
from .complete import complete_branch, complete_revision
from .render import Refs, safe, short


@click.command("init")
@click.argument("url", required=False)
@click.option("--format", "fmt", type=click.IntRange(1, 3), default=None, metavar="N",
              help="Storage format of a new store: 3 (packs, ref swaps journaled in the writer's log: one "
                   "fsync per append; the default on local disk), 2 (packs; the default on S3, where 3 "
                   "writes the same bytes) or 1 (one file per object); docs/FORMAT.md.")
@click.option("--layout", type=click.Choice(["flat", "tenants"]), default=None,
              help="Layout of a new store: flat (default) or tenants (each app/user's refs, packs and "
                   "objects under tenants/APP/USER/, so an S3 policy can confine a worker to one "
                   "tenant); docs/FORMAT.md 2.")
@click.option("--encrypted", is_flag=True,
              help="Create an encrypted store (docs/encryption.md): every tenant's objects sealed under "
                   "keys of its own, wrapped by the master key ($CASTORE_MASTER_KEY or --master-key-file; "
                   "make one with `castore key new`). Implies --layout tenants.")
@click.option("--key-store", metavar="URL", default=None,
              help="With --encrypted: keep the wrapped keys at URL instead of the store's own keys/ (so "
                   "that a backup of the data holds no key).")
@click.pass_context
def init_cmd(ctx: click.Context, url: str | None, fmt: int | None, layout: str | None, encrypted: bool,
             key_store: str | None) -> None:
    """Create a store at URL (default: the --store option).

    Doing it twice is harmless. Writing to a store that does not exist yet creates it
    too, so this is only needed to make an empty one, or an S3 bucket: on s3://BUCKET/...
    a missing bucket is created first (options from the global -o). --format chooses the
    storage format of a new store (default 3 on local disk: packs and journaled ref swaps;
    2 on S3: packs; 1: one file per object; see docs/FORMAT.md). --layout tenants keeps
    each app/user's data under its own prefix (docs/FORMAT.md 2).
    """
    target = url or store_url(ctx)
    check_url(target)
    ensure_bucket(target, ctx)
    if key_store and not encrypted:
        raise click.UsageError("--key-store goes with --encrypted")
    with Store.open(target, format=fmt, layout=layout, encrypted=encrypted or None, key_store=key_store,
                    **store_options(ctx), **key_options(ctx)) as store:
        created = store.init()
        shown = " (tenant layout)" if store.layout == "tenants" else ""
        shown = " (encrypted, tenant layout)" if store.encryption else shown
        note(f"{'Initialized empty' if created else 'Found existing'} castore store at {store.url}{shown}")


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

    The entry goes on the current branch. TEXT "-" reads the text from stdin. Prints the new
    commit id on stdout. The session (and the store) are created by the first append.
    Appending on a detached HEAD starts a new branch there. A session whose HEAD names a
    branch that was lost (fsck's bad ref) is refused with fsck's line: recreate the branch first.
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
@click.argument("rev", required=False, shell_complete=complete_revision)
@click.option("-b", "new_branch", metavar="NEW", help="Create branch NEW at REV (default HEAD) and switch to it.")
@pass_session()
def checkout_cmd(session: Session, rev: str | None, new_branch: str | None) -> None:
    """Move HEAD (the leaf) to a branch, or detach it at a commit (REV).

    On a branch, new entries extend the branch. At any other revision HEAD is detached:
    reading works as usual, and the next append starts a new branch there. `checkout -b
    NEW` names the place HEAD is at (a detached HEAD too), as git does. Leaving a branch
    that was lost (fsck's bad ref) gives it up: its commits are left dangling, as said.
    """
    if rev is None and new_branch is None:
        raise click.UsageError("give the REV to check out (or -b NEW to start a branch at HEAD)")
    was = session.current_branch
    lost = session.lost_branch() if was is not None and session.head is None else None
    branch = session.checkout(rev or "HEAD", create=new_branch)
    head = session.head
    if branch is None:
        note(
            f"HEAD is now detached at {short(head)} (not on any branch). Appending here starts a "
            f"new branch; name it with {hint('checkout -b NAME')}, or go back with "
            f"{hint('checkout BRANCH')}."
        )
    elif new_branch is not None:
        note(f"Switched to a new branch {branch!r} at {short(head)}")
    else:
        note(f"Switched to branch {branch!r} at {short(head)}")
    if lost is not None and branch != was:
        note(f"note: branch {was!r} that HEAD was on is lost, and fsck no longer reports it: what only it "
             f"held is dangling now (`castore fsck` lists it; `castore gc` deletes it after the grace period). "
             f"{hint(f'branch {was} ID')} brings it back at a commit of `castore reflog` or a dangling one.")


@click.command("branch")
@click.argument("name", required=False, shell_complete=complete_branch)
@click.argument("rev", required=False, shell_complete=complete_revision)
@click.option("-d", "--delete", "delete", is_flag=True, help="Delete branch NAME; refuses unmerged work.")
@click.option("-D", "force_delete", is_flag=True, help="Delete branch NAME even if its work is on no other ref.")
@click.option("-f", "--force", is_flag=True,
              help="Move an existing branch NAME to REV (its old tip goes to the reflog).")
@click.option("-r", "--remotes", "remotes", is_flag=True, help="List the remote-tracking branches.")
@click.option("-a", "--all", "all_", is_flag=True, help="List local and remote-tracking branches.")
@internal_option("branches")
@limit_option(what="branches")
@json_option('{"head": ID|null, "current": NAME|null, "branches": [{"name", "commit", "current", '
             '"made_by": TEXT|null (what made it, as the listing says: "rewind from line 9: user: ...")}], '
             '"lost": TEXT|null (HEAD\'s branch was lost: fsck\'s line, exit 1)}')
@pass_session()
def branch_cmd(session: Session, name: str | None, rev: str | None, delete: bool, force_delete: bool,
               force: bool, remotes: bool, all_: bool, internal: bool, limit: int | None, as_json: bool) -> None:
    """List, create (NAME [REV]), move (-f NAME REV) or delete (-d/-D NAME) branches.

    With no NAME, list them (the current one marked *; when the branch HEAD names was lost,
    the listing ends with fsck's line and exits 1); -r lists the remote-tracking
    branches a pull kept (revisions as remotes/REMOTE/BRANCH), -a both. NAME [REV] creates
    a branch at REV (default HEAD) without switching to it; -f moves an existing one there,
    keeping its old tip in `castore reflog`. -d refuses a branch whose tip is on no other
    branch, label or HEAD (its work would only be reachable by id); -D deletes it anyway.
    The checked-out branch cannot be deleted or moved with -f (use `castore reset`).
    """
    if (name is not None or delete or force_delete) and (remotes or all_ or internal or limit is not None or as_json):
        raise click.UsageError("-r, -a, --internal, -n and --json list branches; they take no NAME")
    if delete or force_delete:
        if name is None or rev is not None:
            raise click.UsageError("branch -d/-D takes exactly one NAME")
        was = session.branches().get(name)
        session.delete_branch(name, force=force_delete)
        note(f"Deleted branch {name!r} (was {short(was)})")
        return
    if force and name is None:
        raise click.UsageError("branch -f moves a branch: give its NAME (and REV)")
    if name is not None:
        was = session.branches().get(name) if force else None
        cid = session.branch(name, rev or "HEAD", force=force)
        if was is not None:
            note(f"Moved branch {name!r} from {short(was)} to {short(cid)}")
        else:
            note(f"Created branch {name!r} at {short(cid)}")
        return
    listing = porcelain.branch_list(session, local=all_ or not remotes, remotes=remotes or all_,
                                    internal=internal, notes=True)
    branches, current, head, notes = listing.branches, listing.current, listing.head, listing.notes
    branches = dict(list(branches.items())[:limit or None])
    if as_json:
        print_json({
            "head": head,
            "current": current,
            "branches": [{"name": b, "commit": c, "current": b == current, "made_by": notes.get(b)}
                         for b, c in branches.items()],
            "lost": listing.lost,
        })
        _refuse_lost(session, listing.lost)
        return
    shown_names = {b: safe(b) for b in branches}
    width = max((len(b) for b in shown_names.values()), default=0)
    if current is None:
        click.echo(f"* {click.style(f'(HEAD detached at {short(head)})', fg='red')}")
    for b, c in branches.items():
        mark = "*" if b == current else " "
        name = shown_names[b].ljust(width)
        shown = click.style(name, fg="green") if b == current else name
        note_text = f"  {safe(notes[b])}" if b in notes else ""
        click.echo(f"{mark} {shown}  {click.style(short(c), fg='yellow')}{note_text}")
    _refuse_lost(session, listing.lost)


def _refuse_lost(session: Session, lost: str | None) -> None:
    """After a listing of the branches left: the lost branch HEAD names (fsck's line), as
    the error that makes the exit status 1 (the listing is not the whole story)."""
    if lost is not None:
        raise CorruptRef(session.refs.head, lost)


@click.command("label")
@click.argument("name", required=False)
@click.argument("rev", required=False)
@click.option("-f", "--force", is_flag=True, help="Move the label if it already exists.")
@click.option("-d", "--delete", "delete", is_flag=True, help="Delete label NAME (the commit stays).")
@limit_option(what="labels (when listing)")
@json_option('{"labels": [{"name", "commit"}]} (when listing)')
@pass_session()
def label_cmd(session: Session, name: str | None, rev: str | None, force: bool, delete: bool, limit: int | None,
              as_json: bool) -> None:
    """Put label NAME on REV (default HEAD), as `git tag NAME [REV]`; -d deletes it.

    A label is a revision too: `castore show NAME`, `castore state NAME`. With no NAME,
    list the labels (as `castore labels`).
    """
    if name is not None and (limit is not None or as_json):
        raise click.UsageError("-n and --json list labels; they take no NAME")
    if delete:
        if name is None or rev is not None or force:
            raise click.UsageError("label -d takes exactly one NAME")
        was = session.labels().get(name)
        session.delete_label(name)
        note(f"Deleted label {name!r} (was {short(was)})")
        return
    if name is None:
        if rev is not None or force:
            raise click.UsageError("give the label's NAME")
        _list_labels(session, limit, as_json)
        return
    if name == "HEAD" and rev is None:
        raise click.UsageError(f"HEAD is not a label name: {hint('label NAME [REV]')}")
    if rev is not None and _old_label_order(session, name, rev):
        note(f"note: `castore label REV NAME` is the old order; write "
             f"{hint(f'label {shlex.quote(rev)} {shlex.quote(name)}')} (as git tag)")
        name, rev = rev, name
    cid = session.label(name, at=rev or "HEAD", force=force)
    note(f"Labelled {short(cid)} {name!r}")


def _old_label_order(session: Session, name: str, rev: str) -> bool:
    """Whether ``label NAME REV`` was typed in the old order (REV NAME).

    So it was when NAME is a revision and REV is not one, or REV is a label and NAME
    is a revision but no label (``label -f HEAD good``, moving label good).
    """
    from ..errors import AmbiguousRevision, RevisionNotFound

    def resolves(r: str) -> bool:
        try:
            session.resolve(r)
            return True
        except (RevisionNotFound, AmbiguousRevision):
            return False

    if not resolves(name):
        return False
    labels = session.labels()
    return not resolves(rev) or (rev in labels and name not in labels)


def _list_labels(session: Session, limit: int | None, as_json: bool) -> None:
    labels = dict(list(session.labels().items())[:limit or None])
    if as_json:
        print_json({"labels": [{"name": n, "commit": c} for n, c in labels.items()]})
        return
    if not labels:
        note("no labels")
    shown = {n: safe(n) for n in labels}
    width = max((len(n) for n in shown.values()), default=0)
    for n, c in labels.items():
        click.echo(f"{shown[n].ljust(width)}  {click.style(short(c), fg='yellow')}")


@click.command("labels")
@limit_option(what="labels")
@json_option('{"labels": [{"name", "commit"}]}')
@pass_session()
def labels_cmd(session: Session, limit: int | None, as_json: bool) -> None:
    """List the session's labels and the commits they name."""
    _list_labels(session, limit, as_json)


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


@click.command("reset")
@click.argument("rev", shell_complete=complete_revision)
@pass_session()
def reset_cmd(session: Session, rev: str) -> None:
    """Move the current branch (or a detached HEAD) to REV, as `git reset --soft`.

    Nothing is lost: the old tip is kept in `castore reflog` (and by gc), and is a
    revision by its id. A session whose HEAD names a branch that was lost (fsck's bad
    ref) is refused with fsck's line: recreate the branch first.
    """
    was = session.head
    cid = session.reset(rev)
    where = session.current_branch
    note(f"{'Branch ' + repr(where) if where else 'HEAD'} moved from {short(was)} to {short(cid)}")


@click.command("reflog")
@click.argument("action", required=False, type=click.Choice(["show", "expire"]), default="show")
@click.option("--older-than", "older_than", metavar="AGE", callback=duration,
              help="expire: drop the entries older than this (90d, 2w, 12h, ...), in every session.")
@dry_run_option("dropped", by="expire")
@limit_option(what="moves")
@json_option('{"reflog": [{"id", "time", "ref", "old", "new", "why"}]}; expire: '
             '{"expired": [{"app", "user", "session", "entries"}], "dry_run": bool}')
@uses_session
def reflog_cmd(action: str, older_than: float | None, dry_run: bool, limit: int | None, as_json: bool) -> None:
    """List the moves that overwrote a ref's tip (branch -f, reset, forced pull/push), newest first.

    Each overwritten tip stays reachable: `castore branch -f NAME OLD` or `castore reset OLD`
    brings it back. `castore reflog expire --older-than AGE` (git's `reflog expire --all`)
    drops the older entries of every session, so that `castore gc` can free what only they
    kept; set "reflog_expire" in castore.json (e.g. "90d") to have every gc do it.
    """
    if action == "expire":
        from .maintenance_cmds import reflog_expire

        if older_than is None:
            raise click.UsageError("reflog expire needs --older-than AGE")
        reflog_expire(older_than, dry_run, as_json)
        return
    if older_than is not None or dry_run:
        raise click.UsageError("--older-than and --dry-run go with `reflog expire`")
    session = get_session()
    entries = session.reflog(limit or None)
    if as_json:
        print_json({"reflog": entries})
        return
    if not entries:
        note("no moves: no tip was overwritten")
    for e in entries:
        new = short(e["new"]) if e["new"] else "(deleted)"
        click.echo(f"{click.style(short(e['old']), fg='yellow')} -> {new}  {safe(e['why'])}  {safe(e['ref'])}")


def refs_of(session: Session, internal: bool = True) -> Refs:
    """Where HEAD, the branches (remote-tracking ones as ``remotes/R/B``) and the labels point
    (an adapter's bookkeeping branches only if ``internal``), for decorating commits."""
    return Refs.from_names(porcelain.ref_names(session, internal=internal))


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for cmd in (init_cmd, append_cmd, checkout_cmd, branch_cmd, label_cmd, labels_cmd, fork_cmd, reset_cmd,
                reflog_cmd):
        group.add_command(cmd)


__all__ = ["register", "refs_of"]
