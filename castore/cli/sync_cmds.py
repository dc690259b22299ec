"""Sync commands: remote add|list|remove, push, pull, sync, clone."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import click

from .. import sync
from ..errors import CastoreError, DamagedPack, IntegrityError, ObjectNotFound, SessionNotFound
from ..store import Store, store_dir
from .common import (
    CastoreGroup,
    CliState,
    default_session,
    escape,
    find_session,
    format_key,
    hint,
    json_option,
    key_options,
    limit_option,
    note,
    open_store,
    parse_options,
    plural,
    print_json,
    quiet_option,
    split_key,
    store_url,
)
from .complete import complete_session
from .render import safe

_SCHEMA = (
    '{"objects_sent": n, "bytes_sent": n, "packs_sent": n, "loose_sent": n, "refs_updated": [ref], "refs_refused": '
    '[{"ref", "reason", "local", "remote"}], "refs_kept_as_remote": [ref], "refs_up_to_date": n, '
    '"refs_forced": [[ref, old, new]], "refs_skipped": [[ref, reason]], '
    '"tenants_erased": ["tenants/APP/USER"]}'
)


class _Spec(str):
    """A session as typed with -s, looked up in the store it is read from (:func:`_resolved`)."""


#: no selection typed: the current session, as ``git push`` pushes the current branch (:func:`_current`)
_CURRENT = object()


def _selection(ctx: click.Context, session: str | None, app: str | None, user: str | None,
               all_: bool) -> Any:
    given = sum(x is not None and x is not False for x in (session, app, all_ or None))
    if given > 1:
        raise click.UsageError("give one of -s SESSION, --app APP [--user USER] or --all", ctx=ctx)
    if user is not None and app is None:
        raise click.UsageError("--user needs --app", ctx=ctx)
    if all_:
        return None
    if app is not None:
        return (app, user) if user is not None else app
    state = ctx.find_object(CliState)
    spec = session or (state.session_spec if state is not None else None)
    if not spec:
        return _CURRENT
    if spec.count("/") not in (0, 2):
        split_key(spec, 3, 3, "'-s' / '--session'")  # the usage error, before any store is opened
    return _Spec(spec)


def _current(ctx: click.Context, sel: Any, store: Store, verb: str, quiet: bool) -> Any:
    """The selection, where none was typed the session chosen with `castore use` in
    ``store`` (this one, also for a pull); said on stderr unless ``quiet``, since a user
    who chose a session may expect the whole store to move.

    Raises:
        click.UsageError: nothing typed and no session chosen (exit 2).
    """
    if sel is not _CURRENT:
        return sel
    spec = default_session(store)
    if spec is None:
        raise click.UsageError(f"say what to {verb}: -s APP/USER/SESSION, --app APP [--user USER] or --all "
                               f"(or choose a session with {hint('use APP/USER/SESSION', ctx, session=False)})",
                               ctx=ctx)
    if not quiet:
        note(f"{verb}: {safe(spec)}, the session chosen with `castore use` (--all for every session)")
    return _Spec(spec)


def _resolved(sel: Any, source: Store) -> Any:
    """The selection, with a session typed short (an id alone, a prefix) found in ``source``,
    the store the sessions are read from; one typed in full that is not there stays as typed.

    Raises:
        click.ClickException: a short one is not in ``source`` (the message names it: a pull
            reads the remote). AmbiguousSession, StorageError.
    """
    if not isinstance(sel, _Spec):
        return sel
    try:
        return find_session(source, sel, new_ok=True).key
    except SessionNotFound as e:
        raise click.ClickException(f"{e} in {source.url}") from e


@contextlib.contextmanager
def _reading(remote: Store | str, local: Store | None = None) -> Iterator[None]:
    """Name the remote in the error of an object it lacks or holds damaged: the library's
    message ("object X not found", "... is damaged: ...; run `castore fsck`") names no
    store, and this store's fsck says ok. With ``local`` (a sync, which also pushes), an
    object this store lacks, or holds damaged, keeps the message as it is.

    Raises:
        click.ClickException: the remote's object, the remote named.
    """
    try:
        yield
    except (IntegrityError, ObjectNotFound) as e:
        if not _the_remotes(e, remote, local):
            raise
        raise click.ClickException(f"{e} in {remote if isinstance(remote, str) else remote.url}") from e


def _the_remotes(e: IntegrityError | ObjectNotFound, remote: Store | str, local: Store | None) -> bool:
    """Whether the object ``e`` is about is the remote's: always in a pull or a clone (no
    ``local``); in a sync, a damaged record the remote holds, or an object missing that this
    store has."""
    if local is None or not isinstance(remote, Store):
        return True
    oid = getattr(e, "object_id", "")
    if isinstance(e, DamagedPack):
        return remote.objects.damage(oid) is not None
    return isinstance(e, ObjectNotFound) and local.objects.contains(oid)


def selection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The shared ``-s | --app [--user] | --all`` options."""
    f = click.option("--all", "all_", is_flag=True, help="Every session (and all app and user state).")(f)
    f = click.option("--user", metavar="USER", help="With --app: only this user's sessions.")(f)
    f = click.option("--app", metavar="APP", help="Every session of this app (and its app and user state).")(f)
    f = click.option("-s", "--session", "session", metavar="APP/USER/SESSION", shell_complete=complete_session,
                     help="One session, or its id alone or a unique prefix (default: the global -s / "
                          "$CASTORE_SESSION, else the session chosen with `castore use`).")(f)
    return f


class _Bar:
    """A progress line on stderr, only on a terminal and without --quiet."""

    def __init__(self, label: str, quiet: bool) -> None:
        self.label = label
        self.on = not quiet and sys.stderr.isatty()
        self.shown = False

    def __call__(self, p: sync.SyncProgress) -> None:
        if not self.on or p.objects_total == 0:
            return
        pct = 100 * p.objects_done // max(p.objects_total, 1)
        mb = p.bytes_done / 1e6
        click.echo(f"\r{self.label}: {pct:3d}% ({p.objects_done}/{p.objects_total} objects, {mb:.1f} MB)",
                   err=True, nl=False)
        self.shown = True

    def done(self) -> None:
        if self.shown:
            click.echo("", err=True)


def shown_ref(ref: str) -> str:
    """A ref as the report lines show it: each part of its stored path decoded (``s%2EV2`` is
    ``s.V2``, :func:`castore.names.decode`) and written as a key is typed (a ``/`` inside a name
    as ``%2F``); a part that is no encoded name (``HEAD``, a digest of a long name) as stored.
    Raises nothing; ``--json`` keeps the stored form."""
    from ..errors import InvalidName
    from ..names import decode

    def part(seg: str) -> str:
        try:
            return escape(decode(seg))
        except InvalidName:
            return seg

    return "/".join(map(part, ref.split("/")))


def _render(report: sync.SyncReport, verb: str, where: str, as_json: bool, quiet: bool) -> None:
    if as_json:
        print_json(report.to_dict())
    elif not quiet:
        size = f"{report.bytes_sent / 1e6:.2f} MB" if report.bytes_sent >= 1e5 else plural(report.bytes_sent, "byte")
        packs = f" in {plural(report.packs_sent, 'pack')}" if report.packs_sent else ""
        note(f"{verb} {where}: {plural(report.objects_sent, 'object')} ({size}){packs}, "
             f"{plural(len(report.refs_updated), 'ref')} updated, {report.refs_up_to_date} up to date")
        for ref in sorted(report.refs_updated):  # as the refs land, in parallel: sorted, as git lists them
            click.echo(f"updated  {safe(shown_ref(ref))}")
        for ref in report.refs_kept_as_remote:
            click.echo(f"kept     {safe(shown_ref(ref))}")
            note(f"both sides moved: the remote tip is kept as {safe(shown_ref(ref))}; nothing was overwritten")
        for ref, old, new in report.refs_forced:
            click.echo(f"forced   {safe(shown_ref(ref))}  {old[:12]} -> {new[:12]}")
            note(f"overwrote {safe(shown_ref(ref))} (was {old[:12]}): the old tip is kept in `castore reflog`")
        for ref, why in report.refs_skipped:
            note(f"skipped {safe(repr(shown_ref(ref)))}: {safe(why)}")
        _note_erased(report.tenants_erased)
    for r in report.refs_refused:
        note(f"refused: {safe(r.reason)}")
    if report.refs_refused:
        raise click.exceptions.Exit(1)


# -- remote -----------------------------------------------------------------------------
_REMOTES_SCHEMA = '{"NAME": {"url": URL, "options": {...}}}'


@click.group("remote", cls=CastoreGroup, invoke_without_command=True)
@limit_option(what="remotes (alone)")
@json_option(_REMOTES_SCHEMA + " (alone)")
@click.pass_context
def remote_group(ctx: click.Context, limit: int | None, as_json: bool) -> None:
    """Manage the remotes (other stores to push to and pull from) of this store.

    Alone, `castore remote` lists them, as `castore remote list` (and `git remote`) does,
    taking its -n and --json.
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(remote_list, limit=limit, as_json=as_json)
    elif limit is not None or as_json:
        raise click.UsageError(f"-n and --json list the remotes: write them after `{ctx.invoked_subcommand}`"
                               if ctx.invoked_subcommand == "list" else "-n and --json list the remotes; "
                               f"`remote {ctx.invoked_subcommand}` takes neither", ctx=ctx)


@remote_group.command("add")
@click.argument("name")
@click.argument("url")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="A storage option, e.g. endpoint_url=http://127.0.0.1:9000 or client_kwargs.region_name=eu-west-1 "
                   "(repeatable; stored in plain text in castore.json).")
@click.option("--replace", is_flag=True, help="Replace a remote of the same name.")
@click.pass_context
def remote_add(ctx: click.Context, name: str, url: str, options: tuple[str, ...], replace: bool) -> None:
    """Add remote NAME at URL (a path, s3://BUCKET/PREFIX, ...)."""
    opts = parse_options(options)
    if "://" not in url and url.strip():  # a local path: keep it valid from any working directory
        url = os.path.abspath(os.path.expanduser(url))
    store = open_store(ctx, must_exist=False)
    sync.add_remote(store, name, url, opts, replace=replace)
    note(f"remote {name} -> {url}")


@remote_group.command("list")
@limit_option(what="remotes")
@json_option(_REMOTES_SCHEMA)
@click.pass_context
def remote_list(ctx: click.Context, limit: int | None, as_json: bool) -> None:
    """List the remotes and their URLs."""
    remotes = {name: {**entry, "options": _masked(entry.get("options", {}))}
               for name, entry in sorted(sync.list_remotes(open_store(ctx, must_exist=False)).items())[:limit or None]}
    if as_json:
        print_json(remotes)
        return
    if not remotes:
        note(f"no remotes: {hint('remote add NAME URL', session=False)} adds one")
    for name, entry in sorted(remotes.items()):
        opts = " ".join(f"{k}={v}" for k, v in sorted(entry["options"].items()) if v != _HIDDEN)
        click.echo(f"{safe(name)}\t{safe(entry['url'])}" + (f"\t{safe(opts)}" if opts else ""))


_HIDDEN = "***"
_SECRET_WORDS = ("secret", "password", "token", "credential")


def _masked(options: Any) -> Any:
    """Storage options with credentials (``key``, ``secret``, ``*token*``, ...) shown as ``***``."""
    if not isinstance(options, dict):
        return options
    out = {}
    for k, v in options.items():
        low = str(k).lower()
        secret = low in ("key", "access_key", "aws_access_key_id") or any(w in low for w in _SECRET_WORDS)
        out[k] = _HIDDEN if secret and not isinstance(v, dict) else _masked(v)
    return out


@remote_group.command("remove")
@click.argument("name")
@click.pass_context
def remote_remove(ctx: click.Context, name: str) -> None:
    """Forget remote NAME (refs kept from it stay until deleted)."""
    sync.remove_remote(open_store(ctx), name)
    note(f"removed remote {name}")


# -- push / pull -------------------------------------------------------------------------
def open_remote(store: Store, remote: str | None) -> tuple[str, Store]:
    """The remote named (a configured name or a URL), or the default one: origin, else
    the only remote; returns its name and its opened store (the caller closes it).

    Raises:
        CastoreError: no remote named and no default; an unknown name. StorageError.
    """
    if remote is None:
        remotes = sync.list_remotes(store)
        if "origin" in remotes:
            remote = "origin"
        elif len(remotes) == 1:
            remote = next(iter(remotes))
        else:
            raise CastoreError(f"which remote? name one (see {hint('remote list', session=False)})" if remotes
                               else f"no remote configured: {hint('remote add NAME URL', session=False)} first")
    # an encrypted remote opens with the store's own master key (--master-key-file)
    return sync.open_remote(store, remote, **key_options())


@click.command("push")
@click.argument("remote", required=False)
@selection_options
@click.option("--force", "-f", is_flag=True, help="Overwrite remote refs that are not fast-forwards.")
@quiet_option("refusals are")
@json_option(_SCHEMA)
@click.pass_context
def push_cmd(ctx: click.Context, remote: str | None, session: str | None, app: str | None, user: str | None,
             all_: bool, force: bool, quiet: bool, as_json: bool) -> None:
    """Send sessions to REMOTE (a remote's name or a URL; default origin).

    As `git push` sends the current branch, a push with no -s, --app or --all sends
    the current session: the global -s, $CASTORE_SESSION or the one chosen with
    `castore use`. `castore sync` moves every session.
    Only the objects the remote lacks are sent; refs move last, by compare-and-swap.
    A branch that moved on the remote is refused (exit 1) unless --force.
    """
    sel = _selection(ctx, session, app, user, all_)
    store = open_store(ctx)
    sel = _resolved(_current(ctx, sel, store, "push", quiet), store)
    name, other = open_remote(store, remote)
    ctx.call_on_close(other.close)
    bar = _Bar(f"push {name}", quiet)
    try:
        report = sync.push(store, other, sel, force=force, progress=bar)
    finally:
        bar.done()
    _render(report, "pushed to", name, as_json, quiet)


@click.command("pull")
@click.argument("remote", required=False)
@selection_options
@click.option("--force", "-f", is_flag=True, help="Overwrite local refs that diverged from the remote.")
@quiet_option("refusals are")
@json_option(_SCHEMA)
@click.pass_context
def pull_cmd(ctx: click.Context, remote: str | None, session: str | None, app: str | None, user: str | None,
             all_: bool, force: bool, quiet: bool, as_json: bool) -> None:
    """Bring sessions from REMOTE (a remote's name or a URL; default origin).

    As `castore push`, with no -s, --app or --all it brings the current session (the
    global -s, $CASTORE_SESSION or the one chosen with `castore use`).
    A branch that moved on both sides is kept as remotes/REMOTE/BRANCH in the session
    (see `castore log --all`); the local branch is left as it was.
    """
    sel = _selection(ctx, session, app, user, all_)
    store = open_store(ctx, must_exist=False)
    sel = _current(ctx, sel, store, "pull", quiet)
    name, other = open_remote(store, remote)
    ctx.call_on_close(other.close)
    sel = _resolved(sel, other)
    bar = _Bar(f"pull {name}", quiet)
    remote_name = name if name in sync.list_remotes(store) else "remote"
    try:
        with _reading(other):
            report = sync.pull(other, store, sel, force=force, progress=bar, remote_name=remote_name)
    finally:
        bar.done()
    _render(report, "pulled from", name, as_json, quiet)


_BOTH_SCHEMA = (
    '{"remote": NAME, "remote_created": BOOL, "ok": BOOL, "pulled": REPORT, "pushed": REPORT (REPORT as '
    '`push --json`), "diverged": [{"ref", "kind", "session": [APP, USER, SESSION]|null, "app", "user", "name", '
    '"local", "remote", "kept_as", "resolve": {"compare"|"keep both"|"keep yours"|"keep theirs": COMMAND}}], '
    '"refused": [{"ref", "reason", "local", "remote"}]}'
)


def resolution(store: Store, d: sync.Diverged, remote: str) -> dict[str, str]:
    """The commands that settle a ref that diverged (see :func:`castore.sync.both_ways`),
    by what each keeps; each runs as printed."""
    r = shlex.quote(remote)
    if d.session is None:  # app or user state: only a forced pull or push of that scope settles it
        sel = f"--app {shlex.quote(d.app)}" + (f" --user {shlex.quote(d.user)}" if d.user is not None else "")
        return {"keep yours": _cmd(f"push {r} {sel} --force"), "keep theirs": _cmd(f"pull {r} {sel} --force")}
    key = "-s " + shlex.quote(format_key(*d.session))
    out = {}
    if d.kept_as is not None and d.name is not None:
        b, mine, theirs = shlex.quote(d.name), shlex.quote(f"{d.name}-local"), shlex.quote(d.kept_as)
        current = store.session(*d.session).current_branch == d.name
        move = f"reset {theirs}" if current else f"branch -f {b} {theirs}"
        out["compare"] = _cmd(f"log --all {key}")
        out["keep both"] = " && ".join((_cmd(f"branch {mine} {b} {key}"), _cmd(f"{move} {key}"), _cmd(f"sync {r}")))
    out["keep yours"] = _cmd(f"push {r} {key} --force")
    out["keep theirs"] = _cmd(f"pull {r} {key} --force")
    return out


def _cmd(args: str) -> str:
    return hint(args, session=False).strip("`")


def sync_summary(report: sync.BothWaysReport) -> str:
    """One line: what a :func:`castore.sync.both_ways` brought in and sent out."""
    got, sent = report.pulled, report.pushed
    made = " (it held no store: created)" if report.remote_created else ""
    return (f"synced with {safe(report.remote)}{made}: pulled {plural(got.objects_sent, 'object')} "
            f"({plural(len(got.refs_updated), 'ref')} updated), pushed {plural(sent.objects_sent, 'object')} "
            f"({plural(len(sent.refs_updated), 'ref')} updated)")


def problem_lines(store: Store, report: sync.BothWaysReport) -> list[str]:
    """What diverged, each with the commands that settle it, and what else was refused."""
    out = []
    for d in report.diverged:
        out.append(f"diverged: {safe(sync.describe(d.ref))} moved on both sides (local {(d.local or '-')[:12]}, "
                   f"{safe(report.remote)} {(d.remote or '-')[:12]}); neither was overwritten"
                   + (f"; theirs is kept here as {safe(d.kept_as)}" if d.kept_as else ""))
        out += [f"  {what + ':':<13}{safe(cmd)}" for what, cmd in resolution(store, d, report.remote).items()]
    return out + [f"refused: {safe(r.reason)}" for r in report.refused]


def _note_erased(prefixes: Iterable[str]) -> None:
    """Say on stderr which erased tenants a push, pull or sync skipped (each once)."""
    for prefix in dict.fromkeys(prefixes):
        note(f"skipped {safe(prefix)}: erased (its keys are destroyed)")


def _render_both(store: Store, report: sync.BothWaysReport, as_json: bool, quiet: bool) -> None:
    if as_json:
        doc = report.to_dict()
        for d, mine in zip(doc["diverged"], report.diverged, strict=True):
            d["resolve"] = resolution(store, mine, report.remote)
        print_json(doc)
    elif not quiet:
        note(sync_summary(report))
        for verb, refs in (("pulled", report.pulled.refs_updated), ("pushed", report.pushed.refs_updated)):
            for ref in sorted(refs):
                click.echo(f"{verb}   {safe(shown_ref(ref))}")
        _note_erased([*report.pulled.tenants_erased, *report.pushed.tenants_erased])
    for line in problem_lines(store, report):
        note(line)
    if not report.ok:
        raise click.exceptions.Exit(1)


@click.command("sync")
@click.argument("remote", required=False)
@click.option("--app", metavar="APP", help="Only this app's sessions (and its app and user state).")
@click.option("--user", metavar="USER", help="With --app: only this user's sessions.")
@quiet_option("what diverged is")
@json_option(_BOTH_SCHEMA)
@click.pass_context
def sync_cmd(ctx: click.Context, remote: str | None, app: str | None, user: str | None, quiet: bool,
             as_json: bool) -> None:
    """Pull then push every session: this store and REMOTE end up holding the same history.

    REMOTE is a remote's name or a URL (default origin). New entries on either side reach
    the other by fast-forward; a remote with no store yet is created. A branch that
    moved on both sides is overwritten on neither: it is listed with the commands that
    settle it (the remote tip is kept here as remotes/REMOTE/BRANCH), and the exit
    status is 1. A session deleted on one side only comes back from the other: delete
    it on both (`castore --store URL delete-session ...`). The session chosen with
    `castore use` does not narrow a sync, as it narrows a push or a pull: --app does.
    """
    if user is not None and app is None:
        raise click.UsageError("--user needs --app", ctx=ctx)
    sel = None if app is None else app if user is None else (app, user)
    store = open_store(ctx, must_exist=False)
    name, other = open_remote(store, remote)
    ctx.call_on_close(other.close)
    remote_name = name if name in sync.list_remotes(store) else "remote"
    bar = _Bar(f"sync {name}", quiet)
    try:
        with _reading(other, store):
            report = sync.both_ways(store, other, sel, remote_name=remote_name, progress=bar)
    finally:
        bar.done()
    _render_both(store, report, as_json, quiet)


def _same_place(a: str, b: str | None) -> bool:
    """Whether two store URLs or paths name the same place."""
    if b is None:
        return False
    norm = [u.rstrip("/") if "://" in u else os.path.abspath(os.path.expanduser(u)) for u in (a, b)]
    return norm[0] == norm[1]


def _require_selected(url: str, parts: tuple[str, ...], options: dict[str, Any]) -> None:
    """Refuse a clone of APP[/USER[/SESSION]] that names no session at ``url``, before any store
    is made: a typo made an empty store and exited 0, as if there were nothing to copy.

    Raises:
        click.ClickException: nothing selected (the apps ``url`` has named). StorageError, InvalidName.
    """
    with Store.open(url, **options, **key_options()) as source:
        if not source.exists:
            return  # sync.clone says so
        if len(parts) == 3:
            found = source.session(*parts).exists()
        else:
            found = bool(source.sessions(parts[0], parts[1] if len(parts) == 2 else None))
        if not found:
            apps = source.apps()
            raise click.ClickException(safe(f"nothing to clone: no session of {'/'.join(map(escape, parts))} at "
                                            f"{url}" + (f" (apps: {', '.join(apps)})" if apps else " (it has none)")))


@click.command("clone")
@click.argument("url")
@click.argument("dest", required=False)
@click.argument("selection", required=False, metavar="[APP[/USER[/SESSION]]]")
@click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
              help="A storage option for URL (repeatable), kept with remote origin.")
@quiet_option()
@json_option(_SCHEMA)
@click.pass_context
def clone_cmd(ctx: click.Context, url: str, dest: str | None, selection: str | None, options: tuple[str, ...],
              quiet: bool, as_json: bool) -> None:
    """Copy the store at URL (all of it, or APP[/USER[/SESSION]]) into folder DEST, as git clone does.

    As `git clone URL DIR`: `castore clone s3://bucket/agents ./copy weather-app` makes
    the store ./copy/.castore, so commands run in ./copy (or below it) find it. A DEST
    that is a URL (s3://...) or a .castore folder is the store itself. Without DEST: the
    store (--store, $CASTORE_STORE or ./.castore). When --store is typed, it is the
    destination and the argument after URL is the selection (`castore --store
    ./copy/.castore clone URL weather-app`). URL is recorded as remote origin.
    """
    state = ctx.find_object(CliState)
    if state is not None and state.store_given and dest is not None:
        if _same_place(dest, state.store_url):
            dest = None  # DEST repeats --store: the store named
        else:
            if selection is not None:
                raise click.UsageError(f"two destinations: --store {state.store_url} and DEST {dest}; give one",
                                       ctx=ctx)
            dest, selection = None, dest  # --store names the destination: the next argument selects
    target = store_dir(dest) if dest is not None else store_url(ctx)
    parts = tuple(split_key(selection, 1, 3, "SELECTION")) if selection else None
    sel: sync.Selection = parts[0] if parts is not None and len(parts) == 1 else parts
    if parts is not None:
        with _reading(url):
            _require_selected(url, parts, parse_options(options))
    bar = _Bar("clone", quiet)
    try:
        with _reading(url):
            report = sync.clone(url, target, sel, progress=bar, **parse_options(options), **key_options())
    finally:
        bar.done()
    _render(report, "cloned into", target, as_json, quiet)


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for cmd in (remote_group, push_cmd, pull_cmd, sync_cmd, clone_cmd):
        group.add_command(cmd)


__all__ = ["register", "resolution", "open_remote", "sync_summary", "problem_lines"]
