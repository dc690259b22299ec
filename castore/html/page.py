"""Assembling the self-contained HTML of a session view, and the store's index page.

The data goes in a ``<script type="application/json">`` block (never executed) with ``<``,
``>`` and ``&`` written as JSON escapes, so no stored text can close the block; the script
builds the page from it with ``textContent`` only. A Content-Security-Policy that allows
just the page's own inline script and style (by hash) and no network at all backs this up:
even an escaping bug could neither run injected code nor call out.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from .assets import CSS, JS

_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def csp(script: str | None, style: str) -> str:
    """The Content-Security-Policy of a page whose only script and style are these (by hash)."""
    parts = ["default-src 'none'", f"style-src {_sha256(style)}", "img-src data:", "base-uri 'none'",
             "form-action 'none'"]
    if script is not None:
        parts.insert(1, f"script-src {_sha256(script)}")
    return "; ".join(parts)


def _finite(value: Any) -> Any:
    """Non-finite floats as strings (JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def embed_json(data: Any) -> str:
    """JSON text safe to put inside a ``<script type="application/json">`` element."""
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"))
    for ch, esc in _JSON_ESCAPES.items():
        text = text.replace(ch, esc)
    return text


def _nav(back: str | None) -> str:
    return f'<a href="{html.escape(back, quote=True)}">all sessions</a>' if back else ""


def _bookkeeping(model: Mapping[str, Any], toggle: str | None) -> str:
    """The header's word on an imported session's bookkeeping lines: how many, whether shown,
    and a link that shows or hides them (served) or the option that shows them (exported)."""
    n = model.get("bookkeeping", 0)
    if not n:
        return ""
    shown = bool(model.get("all_entries"))
    said = f"{n} bookkeeping line{'' if n == 1 else 's'} {'shown' if shown else 'hidden'}"
    if toggle is not None:
        said += f' \u00b7 <a href="{html.escape(toggle, quote=True)}">{"hide" if shown else "show"} them</a>'
    elif not shown:
        said += " (export html --all-entries shows them)"
    return f'<span class="stat" id="bookkeeping">{said}</span>'


def session_page(model: Mapping[str, Any], back: str | None = None, toggle: str | None = None) -> str:
    """The HTML document of a session view, built from :func:`~castore.html.model.build_model`'s data.

    Args:
        model: the view's data.
        back: a link shown in the header (the store index when served), or None.
        toggle: a link to the same view with an imported session's bookkeeping lines shown
            or hidden the other way (when served), or None.
    """
    key = model["key"]
    named = model.get("title")
    title = html.escape(f"{named + ' - ' if named else ''}{key['app']}/{key['user']}/{key['session']} - castore",
                        quote=True)
    policy = csp(JS, CSS)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{html.escape(policy, quote=True)}\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{title}</title>\n<style>{CSS}</style>\n</head><body>\n"
        "<header><h1 id=\"key\"></h1>"
        "<span class=\"stat\"><span id=\"count\"></span> commits \u00b7 <span id=\"nbranch\"></span> branches"
        " \u00b7 <span id=\"nlabel\"></span> labels</span><span class=\"stat\" id=\"forked\"></span>"
        f"{_bookkeeping(model, toggle)}"
        "<label><input type=\"checkbox\" id=\"ctx\"> show the model's context</label>"
        "<input type=\"search\" id=\"go\" placeholder=\"go to id, branch, label\" aria-label=\"go to\">"
        "<button type=\"button\" id=\"unfold\">unfold all</button>"
        "<button type=\"button\" id=\"refold\">fold runs</button>"
        f"{_nav(back)}</header>\n"
        "<main><div id=\"graphpane\"><div id=\"graph\"></div></div><div id=\"detail\"></div></main>\n"
        f"<script type=\"application/json\" id=\"castore-data\">{embed_json(model)}</script>\n"
        f"<script>{JS}</script>\n</body></html>\n"
    )


INDEX_CSS = (
    "body{font:14px/1.5 system-ui,sans-serif;margin:20px;color:#1f2328}"
    "h1{font-size:18px}h2{font-size:15px;margin:18px 0 4px}table{border-collapse:collapse}"
    "td,th{padding:2px 10px;text-align:left;border-top:1px solid #eaeef2}"
    "th{color:#57606a;font-weight:500}.muted{color:#57606a}.warn{color:#9a6700}"
)


def session_href(app: str, user: str, session: str) -> str:
    """The served path of a session view: ``/s/<app>/<user>/<session>``, each part percent-encoded."""
    return "/s/" + "/".join(quote(p, safe="") for p in (app, user, session))


Row = tuple[str, str, str, int, str | None, float, str | None, str | None]


def index_page(url: str, rows: Iterable[Row]) -> str:
    """The store's index: one table row per session, grouped by app.

    Args:
        url: the store's URL (shown as text).
        rows: ``(app, user, session, entries, branch, updated, title, note)`` per session
            (``title``: :func:`castore.views.session_title`, or None; ``note``: shown in its
            place, what is wrong with the session (fsck's line) or that its deletion was
            interrupted, :func:`castore.deletion.finish_line`; None for a sound one).
    """
    import time as _time

    by_app: dict[str, list[Row]] = {}
    for r in rows:
        by_app.setdefault(r[0], []).append(r)
    out = [
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{html.escape(csp(None, INDEX_CSS), quote=True)}\">",
        f"<title>castore: {html.escape(url)}</title><style>{INDEX_CSS}</style></head><body>",
        f"<h1>castore store <span class=\"muted\">{html.escape(url)}</span></h1>",
    ]
    if not by_app:
        out.append("<p class=\"muted\">No sessions yet.</p>")
    for app in sorted(by_app):
        out.append(f"<h2>{html.escape(app)}</h2><table><tr><th>user</th><th>session</th><th>title</th>"
                   "<th>entries</th><th>branch</th><th>updated</th></tr>")
        for _, user, sid, entries, branch, updated, named, note in sorted(by_app[app], key=lambda r: (r[1], -r[5])):
            when = _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(updated)) if updated else "-"
            said = html.escape(named or "") if note is None else f"<span class=\"warn\">{html.escape(note)}</span>"
            out.append(
                f"<tr><td>{html.escape(user)}</td>"
                f"<td><a href=\"{html.escape(session_href(app, user, sid), quote=True)}\">{html.escape(sid)}</a></td>"
                f"<td>{said}</td><td>{entries}</td>"
                f"<td>{html.escape(branch) if branch is not None else '(detached)'}</td>"
                f"<td>{when}</td></tr>"
            )
        out.append("</table>")
    out.append("</body></html>\n")
    return "\n".join(out)


__all__ = ["session_page", "index_page", "session_href", "embed_json", "csp"]
