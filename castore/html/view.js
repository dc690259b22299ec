
(function () {
"use strict";
const D = JSON.parse(document.getElementById("castore-data").textContent);
const N = D.nodes, n = N.length, ROW = 26, LW = 16, PAD = 12;
const kids = N.map(() => []);
N.forEach((x, i) => { if (x.p.length) kids[x.p[0]].push(i); });
const byId = new Map(N.map((x, i) => [x.id, i]));
const byRow = new Array(n);
N.forEach((x, i) => { byRow[x.r] = i; });
const deco = N.map(() => ({ head: false, branches: [], labels: [] }));
for (const [b, i] of Object.entries(D.refs.branches)) deco[i].branches.push(b);
for (const [l, i] of Object.entries(D.refs.labels)) deco[i].labels.push(l);
if (D.refs.head !== null && D.refs.head !== undefined) deco[D.refs.head].head = true;
const runAt = new Map();
D.runs.forEach((r, k) => runAt.set(r[0], k));
const open = new Set();
let sel = -1, vrow = new Int32Array(n), items = [];

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  return e;
}
const short = (id) => String(id).slice(0, 8);
const json = (v) => JSON.stringify(v, null, 2);
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);
function oneLine(s, w) { s = String(s).replace(/\s+/g, " ").trim(); return s.length > w ? s.slice(0, w - 1) + "\u2026" : s; }

// -- text of entries -------------------------------------------------------------
const CALLS = new Set(["toolCall", "tool_use", "function_call"]);
const TOOLROLES = new Set(["tool", "toolResult", "tool_result", "function"]);
function contentText(c) {
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  if (Array.isArray(c)) return c.map((b) => typeof b === "string" ? b : (b && typeof b === "object")
    ? (typeof b.text === "string" ? b.text : typeof b.thinking === "string" ? b.thinking
      : (b.type === "image" || b.type === "image_url") ? "[image]" : "") : "").filter((s) => s).join("\n");
  return typeof c === "object" ? JSON.stringify(c) : String(c);
}
function callName(c) {
  if (!c || typeof c !== "object") return String(c);
  const f = (c.function && typeof c.function === "object") ? c.function : c;
  return String(f.name === undefined ? "?" : f.name);
}
function callArgs(c) {
  if (!c || typeof c !== "object") return "";
  const f = (c.function && typeof c.function === "object") ? c.function : c;
  let a = f.arguments !== undefined ? f.arguments : f.args !== undefined ? f.args : f.input !== undefined ? f.input : "";
  if (typeof a === "string") { try { a = JSON.parse(a); } catch (e) { return a; } }
  return typeof a === "string" ? a : JSON.stringify(a);
}
function isToolResult(m) { return TOOLROLES.has(m.role) || (m.tool_call_id !== undefined && m.tool_call_id !== null) || "toolCallId" in m; }
function messageSummary(m) {
  if (!m) return "(event)";
  const parts = [contentText(m.content)];
  for (const c of (Array.isArray(m.tool_calls) ? m.tool_calls : [])) parts.push("\u2192 " + callName(c) + "(" + callArgs(c) + ")");
  if (Array.isArray(m.content)) for (const b of m.content) if (b && CALLS.has(b.type)) parts.push("\u2192 " + callName(b) + "(" + callArgs(b) + ")");
  const label = (m.role === "tool" && m.name) ? "tool " + m.name : m.role;
  return label + ": " + parts.filter((s) => s).join(" ");
}
function summary(x) {
  if (typeof x.o === "string") return x.o;  // an imported line, as `castore log --oneline` reads it
  const e = x.e || {};
  switch (x.k) {
    case "message": return messageSummary(e);
    case "event": return (e.author || "event") + ": " + (e.message ? contentText(e.message.content) || messageSummary(e.message) : "(event)");
    case "compaction": return "compaction: " + e.summary;
    case "branch_summary": return "branch summary: " + e.summary;
    case "model_change": return "model \u2192 " + (e.model || "?") + (e.provider ? " (" + e.provider + ")" : "");
    case "custom": return "custom " + e.type;
    default: return e.summary ? (x.k === "checkpoint" ? "checkpoint " : "") + e.summary : x.k;
  }
}

// -- the graph --------------------------------------------------------------------
function visible() {
  items = [];
  for (let r = 0; r < n; r++) {
    const k = runAt.get(r);
    if (k !== undefined && !open.has(k)) {
      const [a, b] = D.runs[k];
      for (let q = a; q <= b; q++) vrow[byRow[q]] = items.length;
      items.push({ run: k, lane: N[byRow[a]].l });
      r = b;
    } else {
      vrow[byRow[r]] = items.length;
      items.push({ node: byRow[r] });
    }
  }
}
const X = (lane) => PAD + lane * LW;
const Y = (v) => v * ROW + ROW / 2;
function pills(box, i) {
  const d = deco[i], x = N[i];
  if (d.head) box.append(el("span", "pill head", D.refs.branch !== null && D.refs.branch !== undefined ? "HEAD \u2192 " + D.refs.branch : "HEAD (detached)"));
  for (const b of d.branches) if (!(d.head && b === D.refs.branch)) box.append(el("span", "pill br", b));
  for (const l of d.labels) box.append(el("span", "pill lb", "label: " + l));
  if (x.k === "compaction") box.append(el("span", "pill cp", "compaction"));
  if (x.k === "branch_summary") box.append(el("span", "pill cp", "branch summary"));
  if (kids[i].length > 1) box.append(el("span", "pill fk", "fork \u00d7" + kids[i].length));
  for (const h of x.h || []) box.append(el("span", "pill hb", oneLine(h.s, 48)));
}
function draw() {
  visible();
  const g = document.getElementById("graph");
  g.textContent = "";
  const w = PAD * 2 + Math.max(D.lanes - 1, 0) * LW;
  const h = items.length * ROW;
  g.style.height = h + "px";
  const s = svg("svg", { width: w, height: h });
  const edges = svg("g", {}), dots = svg("g", {});
  s.append(edges, dots);
  for (let i = 0; i < n; i++) {
    const x = N[i];
    x.p.forEach((p, j) => {
      const y1 = Y(vrow[p]), y2 = Y(vrow[i]);
      if (y1 === y2) return;
      const x1 = X(N[p].l), x2 = X(x.l);
      let d;
      if (x1 === x2) d = "M" + x1 + " " + y1 + "V" + y2;
      else d = "M" + x1 + " " + y1 + "C" + x1 + " " + (y1 + ROW * 0.7) + " " + x2 + " " + (y1 + ROW * 0.3) + " " + x2 + " " + (y1 + ROW) + "V" + y2;
      edges.append(svg("path", { d: d, "class": (j ? "m c" : "e c") + (x.l % 8) }));
    });
  }
  const frag = document.createDocumentFragment();
  items.forEach((it, v) => {
    const row = el("div", "row");
    row.style.top = v * ROW + "px";
    row.style.paddingLeft = (w + 4) + "px";
    if (it.run !== undefined) {
      const [a, b] = D.runs[it.run];
      row.classList.add("fold");
      row.dataset.run = it.run;
      row.append(el("span", "", "\u22ef " + (b - a + 1) + " more commits (click to show)"));
      dots.append(svg("circle", { cx: X(it.lane), cy: Y(v), r: 2, "class": "c" + (it.lane % 8) }));
      dots.append(svg("circle", { cx: X(it.lane), cy: Y(v) - 6, r: 2, "class": "c" + (it.lane % 8) }));
      dots.append(svg("circle", { cx: X(it.lane), cy: Y(v) + 6, r: 2, "class": "c" + (it.lane % 8) }));
    } else {
      const i = it.node, x = N[i], cx = X(x.l), cy = Y(v), c = "dot c" + (x.l % 8);
      row.classList.add("node");
      row.dataset.i = i;
      row.dataset.id = x.id;
      if (i === sel) row.classList.add("sel");
      if (x.k === "compaction" || x.k === "branch_summary") dots.append(svg("rect", { x: cx - 5, y: cy - 5, width: 10, height: 10, transform: "rotate(45 " + cx + " " + cy + ")", "class": c }));
      else dots.append(svg("circle", { cx: cx, cy: cy, r: x.k === "message" || x.k === "event" ? 5 : 4, "class": c }));
      if (deco[i].head) dots.append(svg("circle", { cx: cx, cy: cy, r: 8.5, "class": "hd" }));
      row.append(el("span", "sid mono", short(x.id)));
      pills(row, i);
      row.append(el("span", "sum", oneLine(summary(x), 160)));
    }
    frag.append(row);
  });
  g.append(s, frag);
}

// -- state, paths, context -------------------------------------------------------------
function pathTo(i) {
  const out = [];
  for (let j = i; j !== undefined; j = N[j].p[0]) out.push(j);
  return out.reverse();
}
function stateAt(i) {
  const s = {};
  if (i === undefined) return s;
  for (const j of pathTo(i)) {
    const x = N[j];
    for (const k in x.d) s[k] = x.d[k];
    for (const k in (x.x || {})) s[k] = (Array.isArray(s[k]) ? s[k] : []).concat(x.x[k]);
    for (const k of x.u) delete s[k];
  }
  return s;
}
function pyJson(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return "[" + v.map(pyJson).join(", ") + "]";
  if (typeof v === "object") return "{" + Object.keys(v).map((k) => JSON.stringify(k) + ": " + pyJson(v[k])).join(", ") + "}";
  return String(v);
}
const clen = (s) => [...s].length;
function jsonLen(v) { return v === null || v === undefined ? 0 : typeof v === "string" ? clen(v) : clen(pyJson(v)); }
function estimate(m) {
  let chars = 0, images = 0;
  const c = m.content;
  if (typeof c === "string") chars += clen(c);
  else if (Array.isArray(c)) {
    for (const b of c) {
      if (typeof b === "string") chars += clen(b);
      else if (b && typeof b === "object" && !Array.isArray(b)) {
        if (b.type === "image" || b.type === "image_url" || b.type === "input_image") images++;
        else if (typeof b.text === "string") chars += clen(b.text);
        else if (typeof b.thinking === "string") chars += clen(b.thinking);
        else if (CALLS.has(b.type)) chars += clen(String(b.name === undefined ? "" : b.name)) + jsonLen("arguments" in b ? b.arguments : b.input);
        else chars += jsonLen(b);
      }
    }
  } else if (c !== null && c !== undefined) chars += typeof c === "object" ? jsonLen(c) : clen(String(c));
  if (m.tool_calls) chars += jsonLen(m.tool_calls);
  return Math.ceil(chars / 4) + D.text.overhead + images * D.text.image;
}
function contextAt(i) {
  const path = pathTo(i);
  let model = null, provider = null, thinking = null, last = -1;
  path.forEach((j, k) => {
    const x = N[j], e = x.e || {};
    if (x.k === "model_change") {
      if (e.model !== null && e.model !== undefined) { model = e.model; provider = e.provider === undefined ? null : e.provider; }
      if (e.thinking_level !== null && e.thinking_level !== undefined) thinking = e.thinking_level;
    } else if (x.k === "message" && e.role === "assistant" && typeof e.model === "string") {
      model = e.model; provider = typeof e.provider === "string" ? e.provider : null;
    } else if (x.k === "compaction") last = k;
  });
  const msgs = [], from = [];
  const emit = (j) => {
    const x = N[j], e = x.e || {};
    let m = null;
    if (x.k === "message") m = e;
    else if (x.k === "event") m = e.message || null;
    else if (x.k === "branch_summary" && e.summary) m = { role: "user", content: D.text.branch[0] + e.summary + D.text.branch[1] };
    if (m) { msgs.push(m); from.push(j); }
  };
  if (last >= 0) {
    const comp = N[path[last]];
    msgs.push({ role: "user", content: D.text.compaction[0] + comp.e.summary + D.text.compaction[1] });
    from.push(path[last]);
    let keeping = false;
    for (const j of path.slice(0, last)) { keeping = keeping || N[j].id === comp.e.first_kept; if (keeping) emit(j); }
    for (const j of path.slice(last + 1)) emit(j);
  } else path.forEach(emit);
  return { messages: msgs, from: from, model: model, provider: provider, thinking: thinking,
           tokens: msgs.reduce((t, m) => t + estimate(m), 0) };
}

// -- the detail panel ------------------------------------------------------------------
function link(i) {
  const a = el("a", "cid mono", short(N[i].id));
  a.title = N[i].id;
  a.addEventListener("click", (ev) => { ev.preventDefault(); select(i, true); });
  return a;
}
function linkId(id) {
  const i = byId.get(id);
  return i === undefined ? el("span", "mono", id ? short(id) + " (not in this session)" : "-") : link(i);
}
function pre(v) { return el("pre", "", typeof v === "string" ? v : json(v)); }
function fold(label, body, isOpen) {
  const d = el("details");
  if (isOpen) d.open = true;
  d.append(el("summary", "", label), body);
  return d;
}
function renderBlocks(box, c) {
  if (c === null || c === undefined) return;
  if (typeof c === "string") { box.append(el("div", "text", c)); return; }
  if (!Array.isArray(c)) { box.append(pre(c)); return; }
  for (const b of c) {
    if (typeof b === "string") box.append(el("div", "text", b));
    else if (!b || typeof b !== "object") box.append(pre(b));
    else if (b.type === "text" || (typeof b.text === "string" && !b.type)) box.append(el("div", "text", b.text));
    else if (typeof b.thinking === "string") box.append(fold("thinking", el("div", "text", b.thinking)));
    else if (CALLS.has(b.type)) box.append(fold("tool call: " + callName(b) + "(" + oneLine(callArgs(b), 60) + ")", pre(b)));
    else if (b.type === "tool_result" || b.type === "toolResult") {
      const inner = el("div");
      renderBlocks(inner, b.content);
      box.append(fold("tool result" + (b.tool_use_id ? " for " + b.tool_use_id : ""), inner));
    } else if (b.type === "image" || b.type === "image_url" || b.type === "input_image") box.append(el("div", "muted", "[image]"));
    else box.append(fold(String(b.type || "block"), pre(b)));
  }
}
const FIELDS = new Set(["role", "content", "tool_calls", "tool_call_id", "name"]);
function renderMessage(m, box) {
  if (!m || typeof m !== "object") { box.append(pre(m)); return; }
  const role = String(m.role);
  const w = el("div", "msg " + (TOOLROLES.has(role) ? "tool" : role));
  let head = role + (m.name ? " (" + m.name + ")" : "");
  if (m.tool_call_id) head += " \u2014 answers " + m.tool_call_id;
  w.append(el("div", "role", head));
  if (isToolResult(m)) {
    const inner = el("div");
    renderBlocks(inner, m.content);
    w.append(fold("result: " + oneLine(contentText(m.content), 80), inner));
  } else renderBlocks(w, m.content);
  for (const c of (Array.isArray(m.tool_calls) ? m.tool_calls : [])) {
    w.append(fold("\u2192 tool call " + callName(c) + "(" + oneLine(callArgs(c), 60) + ")", pre(c)));
  }
  const extra = {};
  for (const k in m) if (!FIELDS.has(k)) extra[k] = m[k];
  if (Object.keys(extra).length) w.append(fold("other fields", pre(extra)));
  box.append(w);
}
function renderEntry(i, box) {
  const x = N[i], e = x.e || {};
  switch (x.k) {
    case "message": renderMessage(e, box); break;
    case "event":
      box.append(el("div", "muted", "event by " + (e.author || "?")));
      if (e.message) renderMessage(e.message, box);
      break;
    case "compaction": {
      box.append(el("div", "text", e.summary));
      const p = el("div", "muted", "keeps from ");
      p.append(linkId(e.first_kept), document.createTextNode(" \u00b7 " + e.tokens_before + " tokens before"));
      box.append(p);
      if (e.details !== null && e.details !== undefined) box.append(fold("details", pre(e.details)));
      break;
    }
    case "branch_summary": {
      box.append(el("div", "text", e.summary));
      const p = el("div", "muted", "summarizes the branch at ");
      p.append(linkId(e.from_id));
      box.append(p);
      if (e.details !== null && e.details !== undefined) box.append(fold("details", pre(e.details)));
      break;
    }
    case "model_change": box.append(kv({ model: e.model, provider: e.provider, thinking_level: e.thinking_level })); break;
    case "custom": box.append(el("div", "", "custom record: " + e.type), fold("data", pre(e.data), true)); break;
    default: box.append(pre(e));
  }
}
function kv(obj, nodes) {
  const t = el("table", "kv");
  for (const k of Object.keys(obj)) {
    const tr = el("tr");
    const v = obj[k];
    const td = el("td");
    if (nodes && v instanceof Node) td.append(v);
    else if (typeof v === "string") td.append(el("span", "text", v));
    else { const s = json(v); td.append(s.length > 300 ? fold(oneLine(s, 80), pre(v)) : el("span", "mono text", s)); }
    tr.append(el("td", "", k), td);
    t.append(tr);
  }
  return t;
}
function diffBox(before, after) {
  const box = el("div");
  const keys = new Set([...Object.keys(before), ...Object.keys(after)]);
  let any = false;
  for (const k of [...keys].sort()) {
    const inA = k in before, inB = k in after;
    if (inA && inB && same(before[k], after[k])) continue;
    any = true;
    const line = el("div", "mono text " + (!inA ? "add" : !inB ? "del" : "chg"));
    line.textContent = !inA ? "+ " + k + " = " + JSON.stringify(after[k])
      : !inB ? "- " + k + " (was " + JSON.stringify(before[k]) + ")"
      : "~ " + k + ": " + JSON.stringify(before[k]) + " \u2192 " + JSON.stringify(after[k]);
    box.append(line);
  }
  if (!any) box.append(el("div", "muted", "no change"));
  return box;
}
function renderContext(i, box) {
  const c = contextAt(i);
  let head = c.messages.length + " messages, \u2248" + c.tokens + " tokens (estimate)";
  if (c.model) head += " \u00b7 model " + c.model + (c.provider ? " (" + c.provider + ")" : "");
  if (c.thinking) head += " \u00b7 thinking " + c.thinking;
  box.append(el("div", "muted", head));
  c.messages.forEach((m, k) => {
    const w = el("div", "ctxmsg");
    w.dataset.commit = N[c.from[k]].id;
    const f = el("span", "from muted", "from ");
    f.append(link(c.from[k]));
    w.append(f);
    renderMessage(m, w);
    box.append(w);
  });
}
function detail() {
  const box = document.getElementById("detail");
  box.textContent = "";
  if (sel < 0) { box.append(el("div", "muted", "Click a commit to see it.")); return; }
  const i = sel, x = N[i];
  const h = el("h2");
  h.append(el("span", "", x.k), el("span", "mono", short(x.id)));
  pills(h, i);
  box.append(h);
  const showCtx = document.getElementById("ctx").checked;
  const ctxSec = el("section");
  ctxSec.id = "context";
  if (showCtx) {
    ctxSec.append(el("h3", "", "Context a model receives here"));
    renderContext(i, ctxSec);
    box.append(ctxSec);
  }
  const entry = el("section");
  entry.id = "entry";
  entry.append(el("h3", "", "Entry"));
  renderEntry(i, entry);
  box.append(entry);
  if (x.h) {
    const hid = el("section");
    hid.id = "left-out";
    hid.append(el("h3", "", "Left out here (bookkeeping lines; export html --all-entries shows them)"));
    for (const h of x.h) {
      const line = el("div");
      line.append(el("span", "mono", short(h.id)), " " + (h.a || "") + (h.before ? " (before this entry)" : " (after this entry)") + ": " + h.s);
      hid.append(line);
    }
    box.append(hid);
  }
  const meta = el("section");
  meta.id = "meta";
  meta.append(el("h3", "", "Metadata"));
  const ps = el("span");
  x.p.forEach((p, k) => { if (k) ps.append(" "); ps.append(link(p)); });
  if (!x.p.length) ps.append("(root)");
  const cs = el("span");
  kids[i].forEach((c, k) => { if (k) cs.append(" "); cs.append(link(c)); });
  if (!kids[i].length) cs.append("(leaf)");
  const rows = { id: el("span", "mono", x.id), kind: x.k, author: x.a || "-",
    time: x.t ? new Date(x.t * 1000).toISOString() : "-", depth: String(x.n), parents: ps, children: cs };
  for (const k in (x.m || {})) rows["meta." + k] = x.m[k];
  meta.append(kv(rows, true));
  box.append(meta);
  const before = stateAt(x.p[0]), after = stateAt(i);
  const st = el("section");
  st.id = "state";
  st.append(el("h3", "", "State at this commit"));
  st.append(Object.keys(after).length ? kv(after) : el("div", "muted", "(empty)"));
  box.append(st);
  const df = el("section");
  df.id = "diff";
  df.append(el("h3", "", x.p.length ? "Change from the parent" : "Change from the empty state"));
  df.append(diffBox(before, after));
  box.append(df);
}
function rowOf(i) { return document.querySelector('.node[data-i="' + i + '"]'); }
function select(i, scroll) {
  const k = D.runs.findIndex((r) => N[i].r >= r[0] && N[i].r <= r[1]);
  if (k >= 0 && !open.has(k)) { open.add(k); sel = i; draw(); }
  const old = document.querySelector(".row.sel");
  if (old) old.classList.remove("sel");
  sel = i;
  const r = rowOf(i);
  if (r) { r.classList.add("sel"); if (scroll) r.scrollIntoView({ block: "nearest" }); }
  if (history.replaceState) history.replaceState(null, "", "#" + N[i].id);
  detail();
}
function find(q) {
  q = q.trim();
  if (!q) return -1;
  if (q in D.refs.branches) return D.refs.branches[q];
  if (q in D.refs.labels) return D.refs.labels[q];
  if (q === "HEAD" && D.refs.head !== null) return D.refs.head;
  const l = q.toLowerCase();
  const hits = N.map((x, i) => x.id.startsWith(l) ? i : -1).filter((i) => i >= 0);
  return hits.length === 1 ? hits[0] : -1;
}

// -- the page ---------------------------------------------------------------------------
function header() {
  const k = D.key;
  const key = k.app + " / " + k.user + " / " + k.session;
  document.getElementById("key").textContent = typeof D.title === "string" ? D.title + "  \u00b7  " + key : key;
  document.getElementById("count").textContent = String(n);
  document.getElementById("nbranch").textContent = String(Object.keys(D.refs.branches).length);
  document.getElementById("nlabel").textContent = String(Object.keys(D.refs.labels).length);
  const ff = D.info && D.info.forked_from;
  if (ff && typeof ff === "object") {
    const f = document.getElementById("forked");
    f.textContent = "forked from " + ff.app + " / " + ff.user + " / " + ff.session + " at " + short(ff.commit || "");
  }
}
header();
draw();
document.getElementById("graph").addEventListener("click", (ev) => {
  const r = ev.target.closest(".row");
  if (!r) return;
  if (r.dataset.run !== undefined) { open.add(Number(r.dataset.run)); draw(); return; }
  select(Number(r.dataset.i), false);
});
document.getElementById("ctx").addEventListener("change", detail);
document.getElementById("unfold").addEventListener("click", () => { D.runs.forEach((_, k) => open.add(k)); draw(); });
document.getElementById("refold").addEventListener("click", () => { open.clear(); draw(); if (sel >= 0) select(sel, true); });
document.getElementById("go").addEventListener("keydown", (ev) => {
  if (ev.key !== "Enter") return;
  const i = find(ev.target.value);
  ev.target.setCustomValidity(i < 0 ? "no single commit by that name" : "");
  ev.target.reportValidity();
  if (i >= 0) select(i, true);
});
document.addEventListener("keydown", (ev) => {
  if (ev.target.tagName === "INPUT" || sel < 0 || (ev.key !== "ArrowDown" && ev.key !== "ArrowUp")) return;
  let v = vrow[sel] + (ev.key === "ArrowDown" ? 1 : -1);
  while (v >= 0 && v < items.length && items[v].node === undefined) v += ev.key === "ArrowDown" ? 1 : -1;
  if (v >= 0 && v < items.length) { ev.preventDefault(); select(items[v].node, true); }
});
const want = decodeURIComponent(location.hash.slice(1));
const start = want ? find(want) : -1;
if (start >= 0) select(start, true);
else if (D.refs.head !== null && D.refs.head !== undefined) select(D.refs.head, true);
else detail();
window.castoreView = { data: D, select: select, stateAt: stateAt, contextAt: contextAt };
})();
