"""``castore import pi`` and ``castore export pi``: Pi session files in and out."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import click

from ..errors import CastoreError
from .archive_cmds import export_options, import_options, run_export, run_import
from .common import (
    CastoreGroup,
    CliState,
    format_key,
    get_session,
    import_store,
    json_option,
    note,
    note_redacted,
    note_redactions,
    plural,
    print_json,
    redact_option,
    split_key,
)
from .render import safe

_DEFAULT_APP, _DEFAULT_USER = "pi", "local"


def _session_spec(ctx: click.Context, local: str | None) -> str | None:
    if local:
        return local
    state = ctx.find_object(CliState)
    return state.session_spec if state is not None else None


class ImportGroup(CastoreGroup):
    """``castore import VENDOR PATH``, or ``castore import PATH``: the vendor told by the content."""

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                           list[str]]:
        """As click's; a first argument that is no command but an existing path runs the
        importer of the agent whose sessions it holds (:func:`castore.adapters.detect.detect`).

        Raises:
            click.UsageError: a path whose sessions no importer recognises, or a path (a
                first argument with a ``/``) that does not exist.
            ArchiveError: a file whose first lines are JSON of no known agent's sessions.
        """
        import os

        from ..adapters.jsonl_tree import ArchiveError

        if args and args[0] not in self.commands and not args[0].startswith("-") and not os.path.exists(args[0]) \
                and os.sep in args[0]:
            raise click.UsageError(f"{args[0]}: no such file or folder", ctx=ctx)
        if args and args[0] not in self.commands and not args[0].startswith("-") and os.path.exists(args[0]):
            from ..adapters.detect import OTHER, VENDORS, detect, file_kind

            vendor = detect(args[0])
            cmd = self.commands.get(vendor) if vendor is not None else None
            if cmd is None and os.path.isfile(args[0]) and file_kind(args[0]) == OTHER:
                raise ArchiveError(args[0], f"looks like no known agent's sessions ({', '.join(VENDORS.values())}): "
                                            "its first lines are JSON of none of them")
            if cmd is None:
                known = ", ".join(VENDORS.values())
                raise click.UsageError(f"{args[0]}: no session file of a known agent ({known}) here; "
                                       "name the agent: `castore import claude|codex|pi|gemini PATH`", ctx=ctx)
            note(f"{args[0]}: {VENDORS[vendor or '']} sessions")
            return super().resolve_command(ctx, [vendor or "", *args])
        return super().resolve_command(ctx, args)


@click.group("import", cls=ImportGroup)
def import_group() -> None:
    """Import sessions from other agents' files (Claude Code, Codex CLI, Pi, Gemini CLI).

    `castore import PATH` (no agent named) recognises the agent by the files' content.
    """


@import_group.command("pi")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("-s", "--session", "spec", metavar="APP/USER[/SESSION]",
              help=f"Where to import: APP/USER (session id from each file's header) or APP/USER/SESSION "
                   f"(one file only) [default: {_DEFAULT_APP}/{_DEFAULT_USER}].")
@click.option("--skip-bad-lines", is_flag=True,
              help="Skip lines that are not JSON objects (a torn last line) and report them, instead of failing.")
@import_options
@redact_option
@json_option('a list of {"session": "APP/USER/SESSION", "head": ID, "entries": NEW, "total": N, "branches": {...}, '
             '"labels": {...}, "skipped": [[LINE, REASON], ...], "blobs": N, "upgraded_from": V, "path": FILE, '
             '"offset": BYTES, "torn": BYTES, "notes": [...], "redacted": {KIND: N, ...} (secrets replaced before they '
             'were stored)}')
@click.pass_context
def import_pi(ctx: click.Context, paths: tuple[str, ...], spec: str | None, skip_bad_lines: bool, jobs: int | None,
              follow: bool, interval: float, sync_remote: str | None, redact: bool, as_json: bool) -> None:
    """Archive Pi sessions: session files (v1-v3), or a folder such as ~/.pi/agent/sessions.

    One session per file. Every entry becomes a commit whose parent is its parentId; the
    last entry is HEAD (branch main), other leaves get branches pi-<id>, labels become
    labels. Importing again reads only what was added (a file Pi rewrote becomes
    SESSION.v2); entries castore appended and `export pi` wrote come back as those commits.
    Nothing is left under a ref if a file fails.
    """
    from ..adapters.pi import import_pi as import_tree
    from ..adapters.pi import import_session

    spec = _session_spec(ctx, spec)
    app, user, sid = _DEFAULT_APP, _DEFAULT_USER, None
    if spec:
        parts = split_key(spec, 2, 3, "'-s' / '--session'")
        app, user = parts[0], parts[1]
        sid = parts[2] if len(parts) == 3 else None
        if sid is not None and (len(paths) > 1 or os.path.isdir(paths[0])):
            raise click.UsageError("-s APP/USER/SESSION names one session: import one file, or pass -s APP/USER")
    store = import_store(ctx, redact)

    def once(jobs: int | None) -> list[Any]:
        if sid is not None:
            from ..adapters.detect import refuse_other

            refuse_other(paths[0], "pi")
            with open(paths[0], "rb") as f:
                return [import_session(store, f, app=app, user=user, session_id=sid, skip_bad_lines=skip_bad_lines,
                                       resume=True, wait_torn=follow)]
        return [r for p in paths for r in import_tree(store, p, app=app, user=user, skip_bad_lines=skip_bad_lines,
                                                      wait_torn=follow, jobs=jobs)]

    run_import(ctx, store, ", ".join(paths), once, app=app, jobs=jobs, follow=follow, interval=interval,
               sync_remote=sync_remote, as_json=as_json, echo=lambda rs, js: _echo_pi(store, rs, js))


def _echo_pi(store: Any, results: list[Any], as_json: bool) -> None:
    note_redactions(results)
    docs = []
    for r in results:
        key = format_key(*r.key)
        for line, reason in r.skipped:
            note(f"{r.path}:{line}: skipped: {safe(reason)}")
        for n in r.notes:
            note(safe(f"{r.path}: {n}"))
        if as_json:
            doc = dataclasses.asdict(r)
            doc["session"] = key
            del doc["key"]
            docs.append(doc)
            continue
        if r.entries < r.total:  # a session brought up to date
            if r.entries:
                click.echo(f"{safe(key)}: +{plural(r.entries, 'entry')} ({r.total} in all), HEAD {r.head[:8]}")
            continue
        extra = f", {plural(len(r.branches) - 1, 'other branch', 'other branches')}" if len(r.branches) > 1 else ""
        extra += f", {plural(len(r.labels), 'label')}" if r.labels else ""
        extra += f", upgraded from v{r.upgraded_from}" if r.upgraded_from else ""
        extra += f", {len(r.skipped)} skipped" if r.skipped else ""
        extra += f", {r.torn} bytes left for next time" if r.torn else ""
        if r.head:
            on_path = store.session(*r.key).show(r.head).depth + 1
            # `sessions` counts the path to HEAD; say both when other branches hold more
            path = "" if on_path == r.entries else f" ({on_path} on its path, as `sessions` counts)"
            click.echo(f"{safe(key)}: {plural(r.entries, 'entry')}, HEAD {r.head[:8]}{path}{extra}")
        else:
            click.echo(f"{safe(key)}: no entries{extra}")
    if as_json:
        print_json(docs)
    else:  # closing as the other agents' imports do (a Pi entry is a line of its file, the header aside)
        note(f"{plural(len(results), 'file')}, {plural(sum(r.entries for r in results), 'new entry', 'new entries')}")


@click.group("export", cls=CastoreGroup)
def export_group() -> None:
    """Export sessions: to Pi JSONL, Claude Code, Codex CLI or Gemini CLI files, or to a self-contained HTML view."""


@export_group.command("pi")
@export_options("pi", dest_required=False, metavar="[DEST | REV]")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False, writable=True), metavar="FILE",
              help="Write one session (-s, or the global -s / $CASTORE_SESSION) to FILE; DEST is then its REV.")
@click.option("--path-only", is_flag=True,
              help="One session: only the path from the root to REV (as Pi's /fork writes).")
@click.pass_context
def export_pi(ctx: click.Context, dest: str | None, app: str, specs: tuple[str, ...], output: str | None,
              path_only: bool, as_json: bool) -> None:
    """Write archived Pi sessions back under DEST, byte for byte, as Pi lays them out
    (DEST/--CWD--/FILE.jsonl), or one session as a Pi v3 JSONL file.

    Entries appended with castore follow the file's bytes as Pi entries (each naming its
    commit: importing the file again takes them as those commits); a v1 or v2 file castore
    appended to comes back upgraded to v3, as Pi rewrites it.

    One session (the -s, else the global one) goes to stdout or -o FILE, its leaf REV
    (default HEAD): `castore export pi [REV]`, `castore export pi -o FILE [REV]`. Every entry
    reachable from its branches and labels is written, in the order it was imported (entries
    made in castore after them, oldest first). A lone argument is a REV when it is a revision
    of the session and no folder; DEST/ (a trailing slash) always names a folder.
    """
    rev = _one_session_rev(ctx, dest, specs, output, path_only)
    if rev is None:
        from ..adapters.pi import export_pi as export_archive

        assert dest is not None
        run_export(ctx, export_archive, dest, app, specs, as_json)
        return
    if as_json:
        raise click.UsageError("--json lists the files of an export into a DEST folder; one session's export is "
                               "its JSONL file", ctx=ctx)
    from ..adapters.pi import export_session

    session = get_session(ctx, spec=specs[0] if specs else None)
    if output:
        try:
            n = export_session(session, rev, out=output, whole=not path_only)
        except OSError as e:
            if isinstance(e, CastoreError):
                raise
            raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from e
        note(f"wrote {plural(n, 'line')} to {output}")
    else:
        export_session(session, rev, out=sys.stdout, whole=not path_only)
    note_redacted([session])


def _one_session_rev(ctx: click.Context, arg: str | None, specs: tuple[str, ...], output: str | None,
                     path_only: bool) -> str | None:
    """The REV of a one-session export, or None for an export of the archive into ``arg``.

    Raises:
        click.UsageError: several -s for one session, or ``arg`` both a folder and a revision.
    """
    one = output is not None or path_only or arg is None
    if not one and arg is not None and not arg.endswith(("/", os.sep)):
        try:  # a revision of the session chosen, as `castore -s S export pi REV` always meant
            get_session(ctx, spec=specs[0] if len(specs) == 1 else None).resolve(arg)
        except (CastoreError, click.UsageError):
            pass
        else:
            if os.path.isdir(arg):
                raise click.UsageError(f"{arg!r} is both a folder and a revision: write {arg}/ for the folder, "
                                       f"or -o FILE for the revision", ctx=ctx)
            one = True
    if one and len(specs) > 1:
        raise click.UsageError("one session is exported to a file or stdout: pass one -s, or a DEST folder", ctx=ctx)
    return (arg or "HEAD") if one else None


def register(group: click.Group) -> None:
    """Add ``import`` and ``export`` to the ``castore`` group."""
    group.add_command(import_group)
    group.add_command(export_group)
