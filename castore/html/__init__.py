"""See a session in a browser: a self-contained HTML view of its tree, and a local read-only server.

* :func:`render_session` - one HTML document (scripts, styles and data inline; no network)
  drawing every commit of a session (an imported one's bookkeeping lines left out, as
  ``castore log`` leaves them out), its branches, labels and HEAD; clicking a commit shows
  its entry, metadata, full state, the change from its parent and the model's context there.
* :func:`build_model` - the data that document embeds (JSON-ready, linear in commits).
* :mod:`castore.html.server` - ``castore serve``: the same views for every session of a
  store, over HTTP on 127.0.0.1, read-only.
"""

from __future__ import annotations

from ..session import Session
from .model import build_model
from .page import index_page, session_page


def render_session(session: Session, internal: bool = False, all_entries: bool = False) -> str:
    """The self-contained HTML view of ``session`` (see the module doc); ``internal`` keeps
    an adapter's bookkeeping commits (a LangGraph thread's task writes), ``all_entries`` the
    bookkeeping lines of an imported session (Claude Code's ``progress``...; see :func:`build_model`).

    Raises:
        SessionNotFound: the session has no entries.
        ObjectNotFound, IntegrityError, StorageError: reading failed.
    """
    return session_page(build_model(session, internal=internal, all_entries=all_entries))


__all__ = ["render_session", "build_model", "session_page", "index_page"]
