"""Maintenance commands: fsck (check the whole store), gc (remove unreachable objects), repack,
expire (retention: delete sessions not updated for a while), and the expiry of reflog entries
(``castore reflog expire``)."""

from __future__ import annotations

import sys
import time

import click

from .. import maintenance
from ..maintenance import ExpireReport, FsckReport, GcReport
from .common import (
    dry_run_option,
    duration,
    forget_deleted,
    hint,
    json_option,
    note,
    open_store,
    plural,
    print_json,
)
from .render import safe

_FSCK_SCHEMA = (
    '{"ok": bool, "objects": n, "refs": n, "reachable": n, "missing": [{"id", "from"}], '
    '"corrupt": [{"id", "reason"}], "bad_refs": [{"ref", "reason"}], "unreachable": [id], '
    '"dangling": [id], "stale_locks": [path], "stale_temps": [path], '
    '"damaged_records": [{"pack", "offset", "bytes"}], "unborn": [session folder], '
    '"deleting": [{"session", "reason"}]}'
)
_GC_SCHEMA = (
    '{"deleted": n, "kept_in_grace": n, "bytes_freed": n, "dry_run": bool, "ids": [id], '
    '"locks_cleared": [path], "temps_cleared": [path], "reflog_expired": n, '
    '"sessions_expired": [{"app", "user", "session", "updated"}]}'
)
_EXPIRE_SCHEMA = '{"expired": [{"app", "user", "session", "updated"}], "dry_run": bool}'
_REFLOG_EXPIRE_SCHEMA = '{"expired": [{"app", "user", "session", "entries"}], "dry_run": bool}'
_SHOWN = 20  # problems listed per kind in the text summary


def _progress(enabled: bool):
    if not enabled:
        return None

    def show(phase: str, n: int) -> None:
        click.echo(f"\r{phase}: {n} objects", err=True, nl=False)

    return show


def _render_fsck(r: FsckReport) -> None:
    click.echo(f"{plural(r.objects, 'object')}, {r.reachable} reachable from {plural(r.refs, 'ref')}")
    sections = [
        ("missing", [f"{oid}  (named by {src})" for oid, src in r.missing]),
        ("corrupt", [f"{oid}  {why}" for oid, why in r.corrupt]),
        ("bad ref", [f"{ref}  {why}" for ref, why in r.bad_refs]),
        ("damaged record", [f"packs/{pack}.pack at offset {off} ({n} bytes): "
                             "the objects or the ref intent it holds cannot be read" if n else
                            f"packs/{pack}.pack is cut short at offset {off}: what was past its end is lost"
                            for pack, off, n in r.damaged_records]),
        ("stale lock", [f"{lock}  (its writer died; the next writer or `castore gc` clears it)"
                        for lock in r.stale_locks]),
    ]
    for title, lines in sections:
        for line in lines[:_SHOWN]:
            click.echo(f"{title}: {safe(line)}")
        if len(lines) > _SHOWN:
            click.echo(f"{title}: ... and {len(lines) - _SHOWN} more (see --json)")
    if r.stale_temps:
        click.echo(f"{plural(len(r.stale_temps), 'temporary file')} left by cut-short writes: harmless; "
                   "`castore gc` removes them")
    if r.unreachable:
        click.echo(f"{plural(len(r.unreachable), 'unreachable object')} ({len(r.dangling)} dangling): "
                   "harmless; `castore gc` removes them")
    if r.unborn and r.dangling:
        # git's "HEAD points to an unborn branch" notice: harmless, unless a branch was lost
        shown = ", ".join(safe(x) for x in r.unborn[:3]) + (" ..." if len(r.unborn) > 3 else "")
        click.echo(f"notice: {plural(len(r.unborn), 'session')} with no commit yet (HEAD names a branch "
                   f"not made): {shown}; if one had commits, its branch was lost and its tip is "
                   "a dangling commit (`castore fsck --json`)")
    for folder, why in r.deleting[:_SHOWN]:  # not damage: a deletion that stopped halfway
        click.echo(f"notice: {safe(folder)}: {safe(why)}")
    if len(r.deleting) > _SHOWN:
        click.echo(f"notice: ... and {len(r.deleting) - _SHOWN} more interrupted deletions (see --json)")
    if r.ok:
        click.echo("ok")
    else:
        click.echo(f"damaged: {len(r.missing)} missing, {len(r.corrupt)} corrupt, "
                   f"{plural(len(r.bad_refs), 'bad ref')}, {plural(len(r.stale_locks), 'stale lock')}"
                   + (f", {plural(len(r.damaged_records), 'damaged pack record')}" if r.damaged_records else ""))


@click.command("fsck")
@json_option(_FSCK_SCHEMA)
def fsck_cmd(as_json: bool) -> None:
    """Check the whole store: every object re-hashed, every ref and link followed.

    Reports missing and corrupt objects, refs that are garbage or name a missing commit,
    a HEAD whose branch was deleted or lost (HEAD records a commit, or the session has another
    branch, a label, a remote-tracking branch or a reflog; reading that session, as `log`,
    `show`, `context` or `status`, stops with the same error; a session with only an older
    HEAD, which records nothing, is taken as not yet born, noted when dangling commits
    exist), damaged pack records (by pack and offset; their objects are corrupt, not
    missing; a writer's log may hold a damaged ref intent, which only the recovery after a
    power loss reads), stale locks left by a killed writer, and unreachable objects
    (harmless: a crash or a deleted session leaves them; `castore gc` removes them). Exits with status 1 when
    anything is damaged.
    """
    store = open_store()
    report = maintenance.fsck(store, progress=_progress(not as_json and sys.stderr.isatty()))
    if not as_json and sys.stderr.isatty():
        click.echo("", err=True)
    if as_json:
        print_json(report.to_dict())
    else:
        _render_fsck(report)
    if not report.ok:
        sys.exit(1)


def _render_gc(r: GcReport, grace: str) -> None:
    verb = "would delete" if r.dry_run else "deleted"
    if r.expired is not None and r.expired.sessions:
        _render_expire(r.expired, "retention setting")
    if r.reflog_expired:
        entries = plural(r.reflog_expired, "reflog entry", "reflog entries")
        click.echo(f"{'would drop' if r.dry_run else 'dropped'} {entries} (reflog_expire setting)")
    click.echo(f"{verb} {plural(len(r.deleted), 'unreachable object')} ({plural(r.bytes_freed, 'byte')})")
    if r.kept_young:
        click.echo(f"kept {plural(r.kept_young, 'unreachable object')} younger than {grace} "
                   "(a writer may still need them)")
    for lock in r.locks_cleared:
        click.echo(f"cleared stale lock {safe(lock)}")
    if r.temps_cleared:
        click.echo(f"removed {plural(len(r.temps_cleared), 'temporary file')} left by cut-short writes")


@click.command("gc")
@click.option("--grace", default="2w", show_default=True, metavar="AGE", callback=duration,
              help="Keep unreachable objects younger than this (2w, 3d, 12h, 30m, 45s, or 0).")
@dry_run_option("deleted")
@json_option(_GC_SCHEMA)
def gc_cmd(grace: float, dry_run: bool, as_json: bool) -> None:
    """Delete objects no ref reaches that are older than the grace period.

    Deleting a session and then running gc removes the content only that session held;
    content shared with other sessions stays. The grace period protects a writer that
    has stored its objects but not yet moved its ref. Refuses to run on a damaged
    store, as git's gc stops at a broken ref: a reachable object missing, a damaged pack
    record (its pack stays whole), a ref that does not parse, or a HEAD whose branch was deleted or lost
    (its commits would look unreachable; recreate the branch or check out another, as
    `castore fsck` says). Also clears stale locks. First applies the store's
    "retention" and "reflog_expire" settings in castore.json, if set (as `castore expire`
    and `castore reflog expire`).
    """
    store = open_store()
    report = maintenance.gc(store, grace=grace, dry_run=dry_run)
    if not dry_run and report.expired is not None and report.expired.sessions:
        forget_deleted(store, index=False)  # the retention's: gc's own pass updated the search index
    if as_json:
        print_json(report.to_dict())
    else:
        _render_gc(report, _human(grace))
        if dry_run:
            note("dry run: nothing was deleted")


_REPACK_SCHEMA = ('{"packs_merged": [name], "loose_packed": n, "objects": n, "new_pack": name | null, '
                  '"bytes_written": n}')


@click.command("repack")
@click.option("--all", "all_packs", is_flag=True, help="Merge every pack, not only the small ones.")
@json_option(_REPACK_SCHEMA)
def repack_cmd(all_packs: bool, as_json: bool) -> None:
    """Merge small packs and small loose objects into one pack (storage format 2).

    A format-1 store is raised to format 2 first (docs/FORMAT.md); older castore
    versions then refuse it with a clear message. By default packs are merged
    geometrically (each remaining pack at least twice all smaller ones together).
    Nothing is deleted before its objects are safely in the new pack.
    """
    store = open_store()
    report = maintenance.repack(store, all_packs=all_packs)
    if as_json:
        print_json(report.to_dict())
    elif report.new_pack is None:
        click.echo("nothing to repack")
    else:
        click.echo(f"packed {report.objects} objects into {report.new_pack} "
                   f"({len(report.packs_merged)} packs merged, {report.loose_packed} loose objects packed)")


def _render_expire(r: ExpireReport, why: str = "") -> None:
    verb = "would delete" if r.dry_run else "deleted"
    for app, user, sid, when in r.sessions:
        stamp = time.strftime("%Y-%m-%d", time.gmtime(when))
        click.echo(f"{verb} {safe(f'{app}/{user}/{sid}')} (last updated {stamp})" + (f" ({why})" if why else ""))


@click.command("expire")
@click.option("--older-than", "older_than", required=True, metavar="AGE", callback=duration,
              help="Delete the sessions not updated for this long (90d, 2w, 12h, ...).")
@click.option("--app", default=None, metavar="APP", help="Only the sessions of this app.")
@dry_run_option("deleted")
@json_option(_EXPIRE_SCHEMA)
def expire_cmd(older_than: float, app: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete the sessions no branch, label or HEAD of which moved for AGE (retention).

    As `castore delete-session` for each: their content goes at the next `castore gc`. A
    session written meanwhile is kept, and so is one whose HEAD is damaged (a lost branch,
    as `castore fsck` reports: when it last changed cannot be told). To apply it at every
    gc, set "retention" in castore.json (e.g. "retention": "90d"); "reflog_expire" does the
    same for reflogs.
    """
    store = open_store()
    report = maintenance.expire_sessions(store, older_than, app=app, dry_run=dry_run)
    if not dry_run and report.sessions:
        forget_deleted(store)  # the search index and usage cache forget them now
    if as_json:
        print_json(report.to_dict())
        return
    _render_expire(report)
    if not report.sessions:
        click.echo("nothing to expire")
    elif dry_run:
        note("dry run: nothing was deleted")


def reflog_expire(older_than: float, dry_run: bool, as_json: bool) -> None:
    """``castore reflog expire``: drop every session's reflog entries older than ``older_than``
    seconds and print what was dropped."""
    store = open_store()
    dropped = maintenance.expire_reflogs(store, older_than, dry_run=dry_run)
    if as_json:
        print_json({"expired": [{"app": a, "user": u, "session": s, "entries": n}
                                for (a, u, s), n in sorted(dropped.items())], "dry_run": dry_run})
        return
    verb = "would drop" if dry_run else "dropped"
    for (a, u, s), n in sorted(dropped.items()):
        click.echo(f"{verb} {plural(n, 'reflog entry', 'reflog entries')} of {safe(f'{a}/{u}/{s}')}")
    if not dropped:
        click.echo("nothing to expire")
    else:
        note(f"{hint('gc', session=False)} frees what only they kept")


def _human(seconds: float) -> str:
    for unit, size in (("w", 7 * 86400), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(fsck_cmd)
    group.add_command(gc_cmd)
    group.add_command(repack_cmd)
    group.add_command(expire_cmd)


__all__ = ["register"]
