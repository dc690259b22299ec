"""Keys of encrypted stores: ``castore key new``, ``castore key rotate``, ``castore erase`` and
``castore erasures`` (the library side is :mod:`castore.crypto`; docs/encryption.md)."""

from __future__ import annotations

import getpass
import sys

import click

from ..crypto.keys import MASTER_KEY_ENV, MASTER_KEY_FILE_ENV, MasterKey, master_key
from ..crypto.keystore import CONFIG_KEY, Erasure, KeyStore
from ..errors import KeyMissing
from ..storage import split_url
from ..store import Store, check_url
from .common import (
    ensure_bucket,
    json_option,
    key_options,
    limit_option,
    note,
    open_store,
    plural,
    print_json,
    split_key,
    store_options,
    store_url,
)
from .text import safe

_ERASURES_SCHEMA = '[{"app", "user" (null: the whole app), "at", "by", "keys"}]'


def _key_store(wrapper: MasterKey | None) -> KeyStore:
    """The key store of the ``--store`` store (a separate key store URL gets the store's ``-o``
    options when it has the store's scheme), closed when the command ends."""
    ctx = click.get_current_context()
    store = open_store(ctx)
    settings = store.config.get(CONFIG_KEY)
    url = settings.get("key_store") if isinstance(settings, dict) else None
    same = isinstance(url, str) and split_url(url)[0] == split_url(store_url(ctx))[0]
    ks = KeyStore.of_store(store.storage, store.config, wrapper, storage_options=store_options(ctx) if same else None)
    ctx.find_root().call_on_close(ks.close)
    return ks


def _who() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return None


def _what(e: Erasure) -> str:
    return f"app {e.app!r} (all its users)" if e.user is None else f"user {e.user!r} of app {e.app!r}"


@click.group("key")
def key() -> None:
    """Master keys of encrypted stores: make one, rotate a store to a new one."""


@key.command("new")
def key_new() -> None:
    """Print a fresh master key (base64 of 32 random bytes).

    Keep it in a secret store or a file only you can read, and give it to castore with
    --master-key-file, in a file named by $CASTORE_MASTER_KEY_FILE, or in $CASTORE_MASTER_KEY:
    without it, an encrypted store cannot be read, and castore cannot recover it.
    """
    click.echo(MasterKey.new())
    if sys.stdout.isatty():
        note(f"keep this key secret and safe; castore reads it from --master-key-file, a file named by "
             f"${MASTER_KEY_FILE_ENV}, or ${MASTER_KEY_ENV}")


@key.command("rotate")
@click.option("--new-key-file", required=True, type=click.Path(dir_okay=False),
              help="File holding the new master key (as `castore key new` prints it).")
@click.option("--master-key-file", type=click.Path(dir_okay=False),
              help=f"File holding the current master key (default: the file ${MASTER_KEY_FILE_ENV} names, "
                   f"else ${MASTER_KEY_ENV}).")
def key_rotate(new_key_file: str, master_key_file: str | None) -> None:
    """Rewrap every data key of the store under a new master key.

    No session data is read or rewritten: only the small key files change. Afterwards the
    old master key no longer opens the store. If it stops part-way, run it again with the
    same two keys to finish.
    """
    current = master_key(master_key_file)
    new = master_key(new_key_file)
    n = _key_store(current).rotate(new)
    note(f"rewrapped {plural(n, 'app key')} (which wrap every data key) under master key {new.key_id};"
         f" the old key {current.key_id} no longer opens this store")


@click.command("erase")
@click.argument("target", metavar="APP[/USER]")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed when not at a terminal).")
def erase(target: str, yes: bool) -> None:
    """Destroy the data keys of APP/USER (or of APP and all its users), for good.

    Its sessions become unreadable at once wherever their keys come from this key store:
    in this store, in remotes and backups that hold only their ciphertext. The erasure is
    recorded (what, when, by whom: see `castore erasures`), and later reads of the tenant
    say it was erased. Needs no master key; cannot be undone.
    """
    parts = split_key(target, 1, 2, "'APP[/USER]'")
    app, user = parts[0], (parts[1] if len(parts) == 2 else None)
    what = f"app {app!r} and all its users" if user is None else f"user {user!r} of app {app!r}"
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError(f"erasing {what} cannot be undone: pass --yes to confirm")
        click.confirm(f"Destroy the keys of {what}? Its data can never be read again", abort=True, err=True)
    ks = _key_store(None)
    if not ks.has_keys(app, user):
        # a typo (another case, a look-alike letter) would record an erasure of nobody and
        # leave the tenant meant readable: say so, unless it is an erasure run again
        done = ks.erased(app, user)
        if done is None:
            raise KeyMissing(f"no keys of {what} in the key store: nothing to erase (check the name: "
                             "case and look-alike letters count)")
        note(safe(f"{_what(done)} was erased already, at {done.at}"))
        return
    [rec] = ks.erase(app, user, by=_who())
    ks.sweep()  # the erased app's users' key files: nothing can open them any more
    gone = (f"its app key is destroyed, and with it {plural(rec.keys, 'data key')}" if rec.user is None
            else f"{plural(rec.keys, 'data key')} destroyed")
    note(safe(f"erased {_what(rec)} at {rec.at}: {gone}"))


@click.command("erasures")
@limit_option(what="erasures, the latest ones")
@json_option(_ERASURES_SCHEMA)
def erasures(limit: int | None, as_json: bool) -> None:
    """List the erasures recorded in the store's key store, oldest first.

    With -n N, the N latest (still oldest first, as `llm logs -n` does).
    """
    recs = _key_store(None).erasures()
    recs = recs[-limit:] if limit else recs
    if as_json:
        print_json([{"app": e.app, "user": e.user, "at": e.at, "by": e.by, "keys": e.keys} for e in recs])
        return
    if not recs:
        note("no erasures")
    for e in recs:
        click.echo(safe(f"{e.at}  {_what(e)}" + (f"  by {e.by}" if e.by else "") + f"  ({plural(e.keys, 'key')})"))


@click.command("encrypt")
@click.argument("dest_url", metavar="DEST_URL")
@click.option("--key-store", metavar="URL", default=None,
              help="Keep the new store's wrapped keys at URL instead of its own keys/.")
@json_option('{"tenants", "sessions", "refs", "refs_present", "objects", "bytes", "differences": [...]}')
def encrypt(dest_url: str, key_store: str | None, as_json: bool) -> None:
    """Write an encrypted copy of the --store store at DEST_URL (a new, empty store).

    Every session (branches, labels, HEAD, remote-tracking tips, reflog) and the app and
    user state are copied tenant by tenant, every object under its new keyed id, sealed
    with the master key's data keys ($CASTORE_MASTER_KEY or --master-key-file). The
    source is only read. The copy is then checked against the source (every branch's log,
    context and state; fsck). Safe to run again after an interruption: it finishes the
    copy. See docs/encryption.md, "Converting a store".
    """
    from ..convert import ConvertError, convert

    ctx = click.get_current_context()
    src = open_store(ctx)
    check_url(dest_url)
    ensure_bucket(dest_url, ctx)
    with Store.open(dest_url, encrypted=True, key_store=key_store, **store_options(ctx), **key_options(ctx)) as dst:
        report = convert(src, dst)
    if as_json:
        print_json(report.to_dict())
    else:
        click.echo(f"{plural(report.sessions, 'session')} in {plural(report.tenants, 'tenant')}: "
                   f"{plural(report.refs, 'ref')} and {plural(report.objects, 'object')} "
                   f"({report.bytes} bytes) written to {safe(dst.url)}")
    if report.differences:
        for d in report.differences:
            note(safe(f"difference: {d}"))
        raise ConvertError(f"the copy at {dest_url} does not read as the source ({len(report.differences)} "
                           "differences above)")


def register(group: click.Group) -> None:
    """Add ``key``, ``encrypt``, ``erase`` and ``erasures`` to the ``castore`` group."""
    group.add_command(key)
    group.add_command(encrypt)
    group.add_command(erase)
    group.add_command(erasures)
