"""``castore redact``: secrets redacted in sessions already stored, and the store's setting."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from .common import (
    dry_run_option,
    format_key,
    get_session,
    hint,
    json_option,
    note,
    open_store,
    plural,
    print_json,
    uses_session,
)
from .text import safe

if TYPE_CHECKING:
    from ..scrub import RedactReport
    from ..store import Store

_REDACT_JSON = ('a list of {"session": "APP/USER/SESSION" (for app or user state: "state": "APP" or "APP/USER"), '
                '"found": [{"commit": ID|null, "where": '
                '"body|state|meta|blob|info", "kind": KIND, "tag": "[REDACTED:KIND:HASH]"}, ...], "rewritten": N, '
                '"moved": {REF: [OLD, NEW]}, "skipped": [...], "dry_run": BOOL}')


@click.command("redact")
@click.argument("spec", required=False, metavar="[APP/USER/SESSION]")
@click.option("--all", "all_sessions", is_flag=True, help="Every session of the store.")
@dry_run_option("redacted")
@click.option("--enable", "setting", flag_value=True, default=None,
              help='Set castore.json\'s "redact": every later write to the store (imports, library appends, '
                   "adapters) is redacted before it is stored.")
@click.option("--disable", "setting", flag_value=False, help='Clear castore.json\'s "redact".')
@json_option(_REDACT_JSON)
@click.pass_context
@uses_session
def redact_cmd(ctx: click.Context, spec: str | None, all_sessions: bool, dry_run: bool, setting: bool | None,
               as_json: bool) -> None:
    """Redact secrets in sessions already stored (a session, default the current one, or --all),
    and in the app and user state they see.

    Cloud keys, GitHub and model-provider tokens, private keys, JWTs, passwords in URLs and
    high-entropy values assigned to secret-sounding names become [REDACTED:KIND:HASH]; HASH
    is keyed with the store's redaction key, so one secret has one tag in every session. Each
    session with something to redact is written again as new commits (refs moved, without a
    reflog entry) and its info is marked redacted; the report says what was found where, never
    the secret. The search index, if the store has one, is built again. The old objects stay
    until `castore gc` removes them (after its grace period; `castore reflog expire` first for
    moves recorded before).
    """
    from ..scrub import redact_sessions

    store = open_store(ctx)
    if setting is not None:
        store.set_redact(setting)
        note(f"castore.json: redact {'on: every write is redacted' if setting else 'off'}")
        if spec is None and not all_sessions:
            return
    if spec is not None and all_sessions:
        raise click.UsageError("give a session or --all, not both")
    sessions = None if all_sessions else [get_session(ctx, spec=spec)]
    reports = redact_sessions(store, sessions, dry_run=dry_run)
    rewritten = sum(r.rewritten for r in reports)
    if rewritten and _rebuild_index(store):
        note("search index rebuilt (the text it held before is gone)")
    if as_json:
        print_json([{**({"session": format_key(*r.session)} if r.session[2] else {"state": _label(r)}),
                     "found": [{"commit": f.commit, "where": f.where, "kind": f.kind, "tag": f.tag}
                               for f in r.found],
                     "rewritten": r.rewritten, "moved": r.moved, "skipped": r.skipped, "dry_run": r.dry_run}
                    for r in reports])
        return
    places = secrets = 0
    for r in reports:
        kind = "user" if r.session[1] else "app"
        key = safe(format_key(*r.session) if r.session[2] else f"{_label(r)} ({kind} state)")
        for f in r.found:
            where = f"{f.commit[:8]} {f.where}" if f.commit else f.where
            click.echo(f"{key}\t{where}\t{f.kind}\t{f.tag}")
        for s in r.skipped:
            note(f"{key}: {safe(s)}")
        places += len(r.found)
        secrets += len({f.tag for f in r.found})  # one secret, one tag: counted as an import counts it
    found = plural(secrets, "secret") + (f" ({plural(places, 'place')})" if places != secrets else "")
    if dry_run:
        note(f"dry run: {found} found in {plural(len(reports), 'session')}; nothing was written")
    else:
        note(f"{found} found in {plural(len(reports), 'session')}, {plural(rewritten, 'commit')} written again")
        if rewritten:
            note(f"the old objects stay until {hint('gc', session=False)} (after its grace period)")


def _rebuild_index(store: Store) -> bool:
    """Build the store's search index again, if it has one: an update would leave the old text
    of rewritten sessions in its files until they are compacted."""
    import os

    from ..grep.index import Index, index_dir, indexable

    if not indexable(store) or not os.path.exists(os.path.join(index_dir(store), "state.json")):
        return False
    Index(store).rebuild()
    return True


def _label(r: RedactReport) -> str:
    """``APP`` or ``APP/USER``: the state a report is about."""
    return format_key(r.session[0], r.session[1]) if r.session[1] else format_key(r.session[0], "").rstrip("/")


def register(group: click.Group) -> None:
    """Add ``redact`` to the ``castore`` group."""
    group.add_command(redact_cmd)


__all__ = ["register"]
