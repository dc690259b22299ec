"""The HTML view of a session (``castore export html``) and the read-only server (``castore serve``).

The browser tests drive Debian's Chromium (``/usr/bin/chromium``, see scripts/setup-browser)
through Playwright for Python with the system browser; they skip, saying what is missing,
where either is absent. They save a screenshot of the view to test-artifacts/session-view.png
(and to docs/session-view.png, the README's picture, when CASTORE_UPDATE_SCREENSHOT=1).
"""

from __future__ import annotations

import html
import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from helpers.viewer import replayed_state

import castore
from castore import porcelain
from castore.cli.demo import record
from castore.cli.main import main
from castore.context import project
from castore.html import build_model, render_session
from castore.html.layout import RUN_KEEP, layout
from castore.html.server import make_server

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MARKUP = "Show this as text: <script>alert(1)</script><img src=x onerror=alert(2)>"
APP, USER, SID = "weather-app", "alice", "demo-1"
KEY = f"{APP}/{USER}/{SID}"
CLAUDE = ROOT / "tests" / "data" / "claude-code" / "session-share"
CLAUDE_SID = "0ccf1a04-1b4c-43b6-8aa5-79e41db43a68"


def _build_demo(store: castore.Store) -> castore.Session:
    """The demo session, plus a compaction, user-scoped state and a message full of markup."""
    s, _ = record(store, SID)
    u2 = s.entries()[-4].id  # "And in Shanghai?"
    s.compact("The user asked about the weather in Beijing (sunny, 25°C).", keep_from=u2)
    s.append(castore.Message(role="user", content=MARKUP), state_delta={"user:tz": "Asia/Shanghai"})
    s.label("<b>markup</b>", at="HEAD")
    return s


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[castore.Session]:
    store = castore.open(str(tmp_path_factory.mktemp("html") / "store"))
    yield _build_demo(store)
    store.close()


@pytest.fixture(scope="module")
def exported(demo: castore.Session, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export")
    result = CliRunner().invoke(main, ["--store", demo.store.url, "export", "html", "-s", KEY,
                                       "-o", str(out / "view.html")])
    assert result.exit_code == 0, result.output
    return out / "view.html"


def _data(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="castore-data">(.*?)</script>', page, re.S)
    assert m is not None
    return json.loads(m.group(1))


# -- the exported file -------------------------------------------------------------------------
def test_export_writes_one_file_that_needs_no_network(exported: Path) -> None:
    assert [p.name for p in exported.parent.iterdir()] == ["view.html"]
    page = exported.read_text("utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(?:src|href|action)\s*=\s*["']?\s*(?:https?:)?//""", page, re.I)
    assert not re.search(r"<(?:link|iframe|object|embed)\b", page, re.I)
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)
    assert "import(" not in page and "fetch(" not in page and "XMLHttpRequest" not in page
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page)
    assert policy is not None
    assert html.unescape(policy.group(1)).startswith("default-src 'none'; script-src 'sha256-")  # no network


def test_export_embeds_one_node_per_commit(exported: Path, demo: castore.Session) -> None:
    data = _data(exported.read_text("utf-8"))
    commits = demo.log(all_branches=True)
    assert len(data["nodes"]) == len(commits) == 11
    assert {n["id"] for n in data["nodes"]} == {e.id for e in commits}
    ids = [n["id"] for n in data["nodes"]]
    assert data["refs"]["branches"] == {b: ids.index(t) for b, t in demo.branches().items()}
    assert data["refs"]["labels"] == {b: ids.index(t) for b, t in demo.labels().items()}
    assert ids[data["refs"]["head"]] == demo.head and data["refs"]["branch"] == "main"


def test_markup_in_messages_and_names_is_escaped(demo: castore.Session, tmp_path: Path) -> None:
    s = demo.store.session(APP, USER, "x</title><script>alert(3)</script>")
    s.append(castore.Message(role="user", content=MARKUP))
    s.branch("</script><script>alert(4)</script>")
    for session in (demo, s):
        page = render_session(session)
        assert page.count("<script") == 2  # the data block and the view's own script
        assert page.count("</script>") == 2
        head = page.split('id="castore-data">')[0]
        assert "<script>alert" not in page and "<title>" in head
        data = _data(page)
        assert MARKUP in [n["e"].get("content") for n in data["nodes"]]
        assert "\\u003cscript\\u003ealert(1)\\u003c/script\\u003e" in page
    assert "x&lt;/title&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in render_session(s)


def test_embedded_deltas_replay_to_each_commits_full_state(demo: castore.Session) -> None:
    data = build_model(demo)
    nodes = data["nodes"]
    for i, node in enumerate(nodes):
        state = replayed_state(nodes, i)
        assert state == demo.state(node["id"]), node["id"]
    assert any("user:tz" in n["d"] for n in nodes)


def test_export_size_grows_linearly_with_commits(tmp_path: Path) -> None:
    store = castore.open(str(tmp_path / "s"), durable=False)
    s = store.session("a", "u", "s")
    sizes = []
    for k in range(0, 600, 50):
        s.append_many([castore.Message(role="user", content=f"m{k + j} " + "x" * 100) for j in range(50)],
                      state_delta={"step": k, "seen": list(range(k))})
        if k + 50 in (200, 400, 600):
            sizes.append(len(render_session(s).encode()))
    first, second = sizes[1] - sizes[0], sizes[2] - sizes[1]
    assert 0.9 < second / first < 1.1, sizes  # each commit adds its entry and its delta, once


def test_export_html_of_a_missing_session_is_an_error(demo: castore.Session, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--store", demo.store.url, "export", "html", "-s", "a/b/none"])
    assert result.exit_code == 1
    assert "Error:" in result.output
    result = CliRunner(env={"CASTORE_SESSION": None}).invoke(main, ["--store", demo.store.url, "export", "html"])
    assert result.exit_code == 2


# -- the layout -------------------------------------------------------------------------------
def _check_layout(parents: list[list[int]], prefer: list[int]) -> None:
    n = len(parents)
    plan = layout(parents, prefer=prefer)
    assert sorted(plan.row) == list(range(n))
    by_row = sorted(range(n), key=lambda i: plan.row[i])
    for i, ps in enumerate(parents):
        for p in ps:
            assert plan.row[p] < plan.row[i]  # parents above children
    # No line of history is drawn through a commit it does not link: the line from a parent
    # down to its child runs in the child's lane, and no other commit sits there in between.
    for i, ps in enumerate(parents):
        for p in ps[:1]:
            between = by_row[plan.row[p] + 1:plan.row[i]]
            assert all(plan.lane[j] != plan.lane[i] for j in between), (p, i)
    for a, b in plan.runs:
        assert b - a + 1 >= 1 and len({plan.lane[by_row[r]] for r in range(a - RUN_KEEP, b + RUN_KEEP + 1)}) == 1
    if prefer:  # HEAD's path is the leftmost line
        j: int | None = prefer[0]
        while j is not None:
            assert plan.lane[j] == 0
            j = parents[j][0] if parents[j] else None


def test_layout_keeps_lines_of_history_apart_on_random_trees() -> None:
    rng = random.Random(12)
    for n in (1, 2, 30, 300):
        for _ in range(10):
            parents = [[]] + [[rng.choice(range(max(0, i - 5), i)) if rng.random() < 0.9 else rng.randrange(i)]
                              for i in range(1, n)]
            _check_layout(parents, [rng.randrange(n)])


def test_layout_of_5000_commits_folds_linear_runs() -> None:
    n = 5000
    parents = [[]] + [[i - 1] for i in range(1, n)]
    parents += [[1000], [n], [3000]]  # a side branch of two commits and one of one
    plan = layout(parents, prefer=[n - 1])
    assert plan.lanes == 2
    assert plan.lane[n] == plan.lane[n + 1] == plan.lane[n + 2] == 1
    hidden = sum(b - a + 1 for a, b in plan.runs)
    assert len(plan.runs) == 3 and hidden > n - 40
    assert plan.row[n] == plan.row[1000] + 1  # the side branch sits right under its fork point


# -- an imported Claude Code session ---------------------------------------------------------
@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[castore.Session]:
    """tests/data's real Claude Code session, whose HEAD is its closing ``summary`` line."""
    from castore.adapters.claude_code import import_claude

    store = castore.open(str(tmp_path_factory.mktemp("claude") / "store"), durable=False)
    import_claude(store, CLAUDE / f"{CLAUDE_SID}.jsonl")
    yield store.session("claude", "session-share", CLAUDE_SID)
    store.close()


def test_the_view_leaves_out_bookkeeping_lines_as_log_does_and_opens_on_the_newest_shown(
        imported: castore.Session) -> None:
    every = imported.log(all_branches=True)
    shown = porcelain.log(imported, all_branches=True, all_entries=False)[1]
    assert imported.show("HEAD").meta["claude"]["type"] == "summary"
    data = build_model(imported)
    assert sorted(n["id"] for n in data["nodes"]) == sorted(e.id for e in shown)
    assert data["bookkeeping"] == len(every) - len(shown) > 0 and not data["all_entries"]
    newest = porcelain.log(imported, limit=1, all_entries=False)[1][0]
    head = data["nodes"][data["refs"]["head"]]
    assert head["id"] == newest.id and head["a"] == "assistant"
    assert data["nodes"][data["refs"]["branches"]["main"]]["id"] == newest.id
    for i, node in enumerate(data["nodes"]):  # parents moved past the lines left out
        assert all(p < i for p in node["p"])
        assert replayed_state(data["nodes"], i) == imported.state(node["id"])
    everything = build_model(imported, all_entries=True)
    assert len(everything["nodes"]) == len(every) and everything["bookkeeping"] == data["bookkeeping"]
    assert everything["nodes"][everything["refs"]["head"]]["id"] == imported.head


def test_a_left_out_line_that_set_the_title_or_the_model_leaves_a_mark(imported: castore.Session,
                                                                     tmp_path: Path) -> None:
    """Claude Code's closing ``summary`` set the session's title, Codex's first ``turn_context``
    names the model: left out, each is marked on the commit shown in its place (before, with
    no trace); a turn_context naming the same model again leaves none."""
    from castore.adapters.codex import import_codex

    data = build_model(imported)
    [marked] = [n for n in data["nodes"] if "h" in n]
    assert marked is data["nodes"][data["refs"]["head"]]  # where HEAD, on the summary line, shows
    assert marked["h"] == [{"id": imported.head, "a": "summary", "s": f"title: {data['title']}"}]
    assert all("h" not in n for n in build_model(imported, all_entries=True)["nodes"])
    store = castore.open(str(tmp_path / "codex"), durable=False)
    import_codex(store, ROOT / "tests" / "data" / "codex" / "sample_codex_session.jsonl")
    [codex] = store.sessions("codex")
    session = store.session("codex", codex.user, codex.session)
    contexts = [e for e in session.log() if e.meta["codex"]["type"] == "turn_context"]
    assert len(contexts) > 1
    marks = [h for n in build_model(session)["nodes"] for h in n.get("h", ())]
    assert marks == [{"id": contexts[-1].id, "a": "turn_context", "s": "model: gpt-5.2-codex"}]  # the oldest
    store.close()


def test_an_imported_line_reads_as_log_oneline_reads_it(imported: castore.Session) -> None:
    """A tool result read "user: user:", a Claude Code system line "system: (event)"."""
    data = build_model(imported)
    out = CliRunner().invoke(main, ["--store", imported.store.url, "-s", "/".join(imported.key), "log", "--oneline",
                                    "--all", "-n", "0"], env={"COLUMNS": "400"}).stdout
    oneline = dict(re.fullmatch(r"([0-9a-f]{8}) (?:\([^)]*\) )?(.*)", ln).groups() for ln in out.splitlines())
    said = [n for n in data["nodes"] if "o" in n]
    assert len(said) > 20
    for n in said:  # an imported line as `castore log --oneline` reads it
        assert n["o"][:40] == oneline[n["id"][:8]][:40], (n["o"], oneline[n["id"][:8]])


def test_export_html_says_how_many_bookkeeping_lines_it_hides(imported: castore.Session, tmp_path: Path) -> None:
    key = f"claude/session-share/{CLAUDE_SID}"
    pages = {}
    for flag in ([], ["--all-entries"]):
        out = tmp_path / f"view{len(flag)}.html"
        result = CliRunner().invoke(main, ["--store", imported.store.url, "export", "html", "-s", key,
                                           "-o", str(out), *flag])
        assert result.exit_code == 0, result.output
        pages[bool(flag)] = out.read_text(encoding="utf-8")
    n = build_model(imported)["bookkeeping"]
    assert f"{n} bookkeeping lines hidden (export html --all-entries shows them)" in pages[False]
    assert f"{n} bookkeeping lines shown" in pages[True]
    assert len(_data(pages[True])["nodes"]) == len(_data(pages[False])["nodes"]) + n


def test_serve_links_a_session_view_with_and_without_its_bookkeeping_lines(imported: castore.Session) -> None:
    srv = make_server(castore.open(imported.store.url), "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        path = f"/s/claude/session-share/{CLAUDE_SID}"
        status, _, hidden = _request(srv.server_address[:2], "GET", path)
        assert status == 200 and f'<a href="{path}?all-entries">show them</a>' in hidden
        status, _, shown = _request(srv.server_address[:2], "GET", path + "?all-entries")
        assert status == 200 and f'<a href="{path}">hide them</a>' in shown
        assert len(_data(shown)["nodes"]) == len(imported.log(all_branches=True)) > len(_data(hidden)["nodes"])
    finally:
        srv.shutdown()
        srv.server_close()


# -- serve -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(demo: castore.Session) -> Iterator[tuple[str, int]]:
    srv = make_server(castore.open(demo.store.url), "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[:2]
    srv.shutdown()
    srv.server_close()


def _request(addr: tuple[str, int], method: str, path: str, host: str | None = None) -> tuple[int, dict, str]:
    conn = http.client.HTTPConnection(*addr, timeout=30)
    headers = {"Host": host} if host else {}
    conn.request(method, path, body=b"x" if method in ("POST", "PUT", "PATCH") else None, headers=headers)
    r = conn.getresponse()
    body = r.read().decode("utf-8", "replace")
    conn.close()
    return r.status, dict(r.getheaders()), body


def test_serve_lists_sessions_and_shows_a_session(server: tuple[str, int], demo: castore.Session) -> None:
    status, headers, body = _request(server, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert 'href="/s/weather-app/alice/demo-1"' in body and "demo-1-fork" in body
    status, headers, body = _request(server, "GET", "/s/weather-app/alice/demo-1")
    assert status == 200
    assert len(_data(body)["nodes"]) == len(demo.log(all_branches=True))
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    status, _, body = _request(server, "HEAD", "/s/weather-app/alice/demo-1")
    assert status == 200 and body == ""


def test_serve_escapes_names_in_the_session_list(server: tuple[str, int], demo: castore.Session) -> None:
    s = demo.store.session("<i>app</i>", "u/ser", "s&1")
    s.append(castore.Message(role="user", content="hi"))
    status, _, body = _request(server, "GET", "/")
    assert status == 200
    assert "<i>app" not in body and "&lt;i&gt;app&lt;/i&gt;" in body
    assert 'href="/s/%3Ci%3Eapp%3C%2Fi%3E/u%2Fser/s%261"' in body
    status, _, body = _request(server, "GET", "/s/%3Ci%3Eapp%3C%2Fi%3E/u%2Fser/s%261")
    assert status == 200 and _data(body)["key"] == {"app": "<i>app</i>", "user": "u/ser", "session": "s&1"}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_serve_refuses_every_write_method(server: tuple[str, int], method: str) -> None:
    for path in ("/", "/s/weather-app/alice/demo-1"):
        status, headers, _ = _request(server, method, path)
        assert status == 405 and headers["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", [
    "/s/../../castore.json", "/s/weather-app/../castore.json", "/s/weather-app/alice/../../../castore.json",
    "/s/weather-app/alice/..%2F..%2Fcastore.json", "/s/%2E%2E/alice/demo-1", "/castore.json",
    "/objects", "/s/weather-app/alice", "/s/weather-app/alice/no-such-session", "/s/a/b/c/d", "/s/%ff/a/b",
])
def test_serve_answers_404_for_anything_but_a_session(server: tuple[str, int], path: str) -> None:
    status, _, body = _request(server, "GET", path)
    assert status == 404
    assert '"format"' not in body


def test_serve_refuses_a_foreign_host_header(server: tuple[str, int]) -> None:
    assert _request(server, "GET", "/", host="evil.example:80")[0] == 400
    assert _request(server, "GET", "/", host=f"localhost:{server[1]}")[0] == 200


def test_castore_serve_runs_as_a_command(demo: castore.Session) -> None:
    exe = Path(sys.executable).with_name("castore")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from castore.cli import main; main()"]
    proc = subprocess.Popen([*cmd, "serve", "--store", demo.store.url,
                             "--port", "0", "-q"], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        status, _, body = _request(("127.0.0.1", int(m.group(1))), "GET", "/")
        assert status == 200 and "demo-1" in body
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# -- in a browser ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"Chromium is not installed at {CHROMIUM} (run scripts/setup-browser as root)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright; no `playwright install`)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, exported: Path) -> Iterator[Any]:
    pg = browser.new_page(viewport={"width": 1200, "height": 800})
    events: dict[str, list[str]] = {"dialogs": [], "errors": [], "requests": []}
    pg.on("dialog", lambda d: (events["dialogs"].append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: events["errors"].append(str(e)))
    pg.on("request", lambda r: events["requests"].append(r.url))
    pg.goto(exported.as_uri())
    pg.wait_for_selector(".node")
    pg.events = events
    yield pg
    pg.close()


def test_browser_draws_every_commit_and_shows_a_side_branch_state(page: Any, demo: castore.Session,
                                                                  exported: Path) -> None:
    commits = demo.log(all_branches=True)
    assert page.locator(".node").count() == len(commits)
    assert page.text_content("#count") == str(len(commits))
    retry = demo.branches()["retry"]
    page.click(f'.node[data-id="{retry}"]')
    assert page.locator(".node.sel").get_attribute("data-id") == retry
    rows = page.locator("#state table.kv tr")
    shown = {rows.nth(k).locator("td").nth(0).text_content(): rows.nth(k).locator("td").nth(1).text_content()
             for k in range(rows.count())}
    want = demo.state(retry)
    assert want == {"last_city": "Beijing", "units": "both"}
    assert shown == {k: v if isinstance(v, str) else json.dumps(v) for k, v in want.items()}
    assert "+ units" in page.text_content("#diff")
    out = ROOT / ("docs" if os.environ.get("CASTORE_UPDATE_SCREENSHOT") == "1" else "test-artifacts")
    out.mkdir(exist_ok=True)
    page.screenshot(path=str(out / "session-view.png"))
    assert page.events["errors"] == [] and page.events["requests"] == [exported.as_uri()]


def test_browser_shows_markup_as_text_and_runs_nothing(page: Any, demo: castore.Session) -> None:
    page.click(f'.node[data-id="{demo.head}"]')
    assert MARKUP in page.text_content("#entry")
    page.check("#ctx")
    assert MARKUP in page.text_content("#context")
    label = page.locator(".node.sel .pill.lb").text_content()
    assert label == "label: <b>markup</b>"
    assert page.locator("#graph script, #graph img, #graph b, #detail script, #detail img, #detail b").count() == 0
    page.wait_for_timeout(200)  # an injected onerror would have fired by now
    assert page.events["dialogs"] == [] and page.events["errors"] == []


def test_browser_reads_imported_lines_as_log_does_and_marks_a_left_out_title(browser: Any, imported: castore.Session,
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "claude.html"
    out.write_text(render_session(imported), encoding="utf-8")
    pg = browser.new_page(viewport={"width": 1200, "height": 800})
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.goto(out.as_uri())
    pg.wait_for_selector(".node.sel")  # it opens on HEAD, where the summary line's mark is
    assert pg.locator(".node.sel .pill.hb").text_content().startswith("title: Spawn curry poem agents")
    left_out = pg.text_content("#left-out")
    assert f"{imported.head[:8]} summary (after this entry): title: Spawn curry poem agents" in left_out
    pg.click("#unfold")  # each imported line reads as log reads it: a tool result was "user: user:"
    rows = pg.eval_on_selector_all(".node .sum", "els => els.map(e => e.textContent)")
    assert any(r.startswith("tool: \u2190 1 line: Session published") for r in rows)
    assert any(r.startswith("system: turn_duration durationMs=") for r in rows)
    assert any(r.startswith("assistant: \u2192 Bash(") for r in rows)
    assert not [r for r in rows if r.endswith(": user:") or r.endswith(": assistant:") or "(event)" in r]
    assert errors == []
    pg.close()


def test_browser_context_matches_the_library_projection(page: Any, demo: castore.Session) -> None:
    nodes = page.evaluate("castoreView.data.nodes.map(n => n.id)")
    for i, cid in enumerate(nodes):
        got = page.evaluate("i => { const c = castoreView.contextAt(i);"
                            " return [c.from.map(j => castoreView.data.nodes[j].id), c.tokens, c.model]; }", i)
        want = project(demo.entries(cid))
        assert got == [want.commits, want.tokens, want.model], cid
    page.click(f'.node[data-id="{demo.head}"]')
    page.check("#ctx")
    shown = page.eval_on_selector_all(".ctxmsg", "els => els.map(e => e.dataset.commit)")
    assert shown == demo.context().commits
