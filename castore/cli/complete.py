"""Shell completion: sessions for ``-s``, ``use`` and ``delete-session``, branches and labels for revisions.

click calls these while the shell completes a word (``castore log -s 0c<TAB>``), before any
command runs: the store is read from the options typed so far (``--store``, ``-o``, the
environment, else the store found as git finds ``.git``). A completion never fails: an
unreadable store, a bad name or a missing session offers nothing.
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

import click

from ..errors import CastoreError
from .common import SESSION_ENV, CliState, default_session, escape, find_session, format_key, parse_options

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

    from ..store import Store


def _store(ctx: click.Context) -> Store | None:
    """The store the command line typed so far names, if there is one."""
    from ..store import Store, default_url  # only while completing: `castore --version` loads no store

    root = ctx.find_root().params
    st = ctx.find_object(CliState)
    url = (st.store_url if st is not None else None) or root.get("store_url") or default_url()
    opts = parse_options(tuple(root.get("store_options") or ()))
    if st is not None:
        opts = {**opts, **st.store_options}
    store = Store.open(url, **opts)
    if not store.exists:
        store.close()
        return None
    return store


def _quiet(f: Any) -> Any:
    """Offer nothing when the store cannot be read: a completion must not print an error."""

    @functools.wraps(f)
    def wrapper(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            store = _store(ctx)
            if store is None:
                return []
            with store:
                return list(f(ctx, store, incomplete))
        except (CastoreError, OSError, click.ClickException, ValueError):
            return []

    return wrapper


@_quiet
def complete_session(_ctx: click.Context, store: Store, incomplete: str) -> list[CompletionItem]:
    """Sessions for ``-s`` and ``use``, newest first, each with its title as help.

    Typed without ``/``: the session ids starting with it, or whose subagent's own id does
    (``a9cad17`` of ``ID.subagents.agent-a9cad17``, :func:`castore.porcelain.own_id`, as
    ``use`` finds it), written alone (as ``-s`` takes them) unless several apps or users have
    the same id, and the APP/USER/SESSION keys starting with it; typed with ``/``: the keys.
    """
    from ..porcelain import own_id  # only while completing

    infos = sorted((s for app in store.apps() for s in store.sessions(app)), key=lambda s: s.updated, reverse=True)
    ids = Counter(s.session for s in infos)
    out: dict[str, str] = {}
    for s in infos:
        key = format_key(s.app, s.user, s.session)
        title = s.info.get("title")
        help_ = title if isinstance(title, str) else key
        if "/" not in incomplete and (s.session.startswith(incomplete)
                                      or any(x.startswith(incomplete) for x in own_id(s.session))):
            out.setdefault(escape(s.session) if ids[s.session] == 1 else key, help_)
        elif key.startswith(incomplete):
            out.setdefault(key, help_)
    from click.shell_completion import CompletionItem  # only while completing: not on every command's path

    return [CompletionItem(v, help=" ".join(h.split())[:80]) for v, h in out.items()]


@_quiet
def complete_key(_ctx: click.Context, store: Store, incomplete: str) -> list[CompletionItem]:
    """Sessions for a command that takes only APP/USER/SESSION (``delete-session``), newest
    first: the keys starting with what was typed, or whose session id does."""
    from click.shell_completion import CompletionItem

    infos = sorted((s for app in store.apps() for s in store.sessions(app)), key=lambda s: s.updated, reverse=True)
    keys = [format_key(s.app, s.user, s.session) for s in infos]
    return [CompletionItem(k) for k, s in zip(keys, infos, strict=True)
            if k.startswith(incomplete) or ("/" not in incomplete and s.session.startswith(incomplete))]


def _session_of(ctx: click.Context, store: Store) -> Any:
    st = ctx.find_object(CliState)
    spec = ((st.session_spec if st is not None else None) or ctx.find_root().params.get("session_spec")
            or os.environ.get(SESSION_ENV) or default_session(store))
    return find_session(store, spec) if spec else None


@_quiet
def complete_branch(ctx: click.Context, store: Store, incomplete: str) -> list[CompletionItem]:
    """The branches of the session of ``-s`` (or ``castore use``)."""
    session = _session_of(ctx, store)
    if session is None:
        return []
    from click.shell_completion import CompletionItem

    return [CompletionItem(b) for b in session.branches() if b.startswith(incomplete)]


@_quiet
def complete_revision(ctx: click.Context, store: Store, incomplete: str) -> list[CompletionItem]:
    """Branches, labels and kept remote branches (``remotes/R/B``) of the session of ``-s``."""
    session = _session_of(ctx, store)
    if session is None:
        return []
    names = [*session.branches(), *session.labels(), *(f"remotes/{n}" for n in session.remote_branches())]
    from click.shell_completion import CompletionItem

    return [CompletionItem(n) for n in dict.fromkeys(names) if n.startswith(incomplete)]


__all__ = ["complete_session", "complete_branch", "complete_revision"]
