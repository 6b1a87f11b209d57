"""The attention explorer: one self-contained HTML file (script, style and data inline; no network)
to browse a run's attention maps. Pick a view (cross / encoder self / decoder self, or self for a
language model), a layer and a head (or the mean of all heads); hover a query token to see what it
attends to, a key token to see what attends to it, a cell for its weight.

The page takes the dict of `handformer.see.viz.AttentionReport.to_dict()`:
    {"task", "text", "output", "output_label",
     "views": [{"name", "title", "queries", "keys", "query_title", "key_title", "split",
                "layers": per layer (H, T, S) nested lists}]}
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

from handformer.io import atomic_write_text

# A Content-Security-Policy that forbids every fetch: the file works offline or not at all.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:")

STYLE = """
body { font-family: system-ui, "DejaVu Sans", "Noto Sans CJK SC", "WenQuanYi Zen Hei", sans-serif;
       margin: 1.2em; color: #1f2328; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
.io { margin: .2em 0; } .io b { display: inline-block; min-width: 9em; }
.controls { margin: .8em 0; display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center; }
.views button { margin-right: .3em; padding: .3em .7em; border: 1px solid #8c959f; background: #f6f8fa;
                border-radius: 4px; cursor: pointer; }
.views button.active { background: #0969da; color: white; border-color: #0969da; }
#viewtitle { color: #57606a; margin: .3em 0 .8em; }
.strip { margin: .4em 0; line-height: 2.1em; }
.strip .label { display: inline-block; min-width: 7em; color: #57606a; font-size: .9em; }
.tok { padding: .15em .35em; margin: 0 .1em; border: 1px solid #d0d7de; border-radius: 3px;
       cursor: default; white-space: pre; }
.tok.gen { border-style: dashed; border-color: #cf222e; }
.tok.active { outline: 2px solid #bf8700; }
#matrix { border-collapse: collapse; margin-top: .6em; font-size: 12px; }
#matrix th { font-weight: normal; padding: 0 .3em; white-space: pre; }
#matrix th.col { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left;
                 vertical-align: bottom; height: 6em; }
#matrix th.row { text-align: right; }
#matrix td.cell { width: 22px; height: 22px; min-width: 22px; border: 1px solid #fff; padding: 0; }
#matrix .hl { outline: 2px solid #bf8700; }
#matrix th.hl { background: #fff8c5; outline: none; }
#info { min-height: 1.4em; margin: .6em 0; font-family: ui-monospace, monospace; }
.note { color: #57606a; font-size: .85em; }
"""

SCRIPT = r"""
(() => {
"use strict";
const DATA = JSON.parse(document.getElementById("attention-data").textContent);
const TEXT = JSON.parse(document.getElementById("explorer-text").textContent);
const say = (key, vars = {}) => TEXT[key].replace(/\{(\w+)\}/g, (_, k) => String(vars[k]));
const state = {view: 0, layer: 0, head: "mean"};
const $ = (id) => document.getElementById(id);

function view() { return DATA.views[state.view]; }

function matrix() {  // the (T, S) weights shown now
  const layer = view().layers[Math.min(state.layer, view().layers.length - 1)];
  if (state.head !== "mean") return layer[Number(state.head)];
  const H = layer.length;
  return layer[0].map((row, t) => row.map((_, s) => {
    let sum = 0;
    for (let h = 0; h < H; h++) sum += layer[h][t][s];
    return sum / H;
  }));
}

function shade(w, max) {
  const a = max > 0 ? w / max : 0;
  return `rgba(9, 105, 218, ${a.toFixed(3)})`;
}

function showToken(tok) { return tok.replace(/\n/g, "\\n").replace(/^ /, "\u2581"); }

function tokenSpan(text, cls, i, isGen) {
  const span = document.createElement("span");
  span.className = "tok " + cls + (isGen ? " gen" : "");
  span.dataset.i = String(i);
  span.textContent = showToken(text);
  return span;
}

function fillSelect(select, options, value) {
  select.replaceChildren();
  for (const [v, label] of options) {
    const opt = document.createElement("option");
    opt.value = String(v); opt.textContent = label;
    select.appendChild(opt);
  }
  select.value = String(value);
}

function render() {
  const v = view(), W = matrix();
  const max = Math.max(1e-9, ...W.map((row) => Math.max(...row)));
  document.querySelectorAll(".views button")
    .forEach((b, i) => b.classList.toggle("active", i === state.view));
  $("viewtitle").textContent = v.title;
  const split = v.split === null || v.split === undefined ? Infinity : v.split;
  $("qlabel").textContent = v.query_title;
  $("klabel").textContent = v.key_title;
  $("queries").replaceChildren(...v.queries.map((t, i) => tokenSpan(t, "q", i, i >= split)));
  $("keys").replaceChildren(...v.keys.map((t, i) => tokenSpan(t, "k", i, i >= split)));
  const table = $("matrix");
  table.replaceChildren();
  const head = table.insertRow();
  head.appendChild(document.createElement("th"));
  v.keys.forEach((t, s) => {
    const th = document.createElement("th");
    th.className = "col"; th.dataset.k = String(s); th.textContent = showToken(t);
    head.appendChild(th);
  });
  W.forEach((row, t) => {
    const tr = table.insertRow();
    const th = document.createElement("th");
    th.className = "row"; th.dataset.q = String(t); th.textContent = showToken(v.queries[t]);
    tr.appendChild(th);
    row.forEach((w, s) => {
      const td = tr.insertCell();
      td.className = "cell"; td.dataset.q = String(t); td.dataset.k = String(s);
      td.dataset.w = w.toFixed(4);
      td.style.backgroundColor = shade(w, max);
      td.title = `${showToken(v.queries[t])} \u2192 ${showToken(v.keys[s])}: ${w.toFixed(4)}`;
    });
  });
  const headText = state.head === "mean" ? say("mean_of", {n: v.layers[0].length})
    : say("head_n", {n: state.head});
  $("info").textContent = say("info", {layer: say("layer_n", {n: state.layer}), head: headText});
}

function clearHighlight() {
  document.querySelectorAll(".hl, .tok.active").forEach((e) => e.classList.remove("hl", "active"));
  document.querySelectorAll(".tok").forEach((e) => { e.style.backgroundColor = ""; });
}

function strongest(weights, labels, n) {
  return weights.map((w, i) => [w, i]).sort((a, b) => b[0] - a[0]).slice(0, n)
    .map(([w, i]) => `${showToken(labels[i])} ${w.toFixed(2)}`).join(", ");
}

function highlightQuery(q) {  // what query q attends to
  const v = view(), row = matrix()[q], max = Math.max(1e-9, ...row);
  document.querySelectorAll(`.tok.q[data-i="${q}"]`).forEach((e) => e.classList.add("active"));
  document.querySelectorAll("#keys .tok").forEach((e) => {
    e.style.backgroundColor = shade(row[Number(e.dataset.i)], max);
  });
  document.querySelectorAll(`#matrix [data-q="${q}"]`).forEach((e) => e.classList.add("hl"));
  $("info").textContent =
    say("attends_to", {token: showToken(v.queries[q]), i: q, top: strongest(row, v.keys, 3)});
}

function highlightKey(k) {  // what attends to key k
  const v = view(), col = matrix().map((row) => row[k]), max = Math.max(1e-9, ...col);
  document.querySelectorAll(`.tok.k[data-i="${k}"]`).forEach((e) => e.classList.add("active"));
  document.querySelectorAll("#queries .tok").forEach((e) => {
    e.style.backgroundColor = shade(col[Number(e.dataset.i)], max);
  });
  document.querySelectorAll(`#matrix [data-k="${k}"]`).forEach((e) => e.classList.add("hl"));
  $("info").textContent =
    say("attended_by", {token: showToken(v.keys[k]), i: k, top: strongest(col, v.queries, 3)});
}

function onHover(event) {
  const e = event.target;
  if (!(e instanceof HTMLElement)) return;
  clearHighlight();
  if (e.classList.contains("tok")) {
    (e.classList.contains("q") ? highlightQuery : highlightKey)(Number(e.dataset.i));
  } else if (e.tagName === "TH" && e.dataset.q !== undefined) {
    highlightQuery(Number(e.dataset.q));
  } else if (e.tagName === "TH" && e.dataset.k !== undefined) {
    highlightKey(Number(e.dataset.k));
  } else if (e.classList.contains("cell")) {
    const v = view(), q = Number(e.dataset.q), k = Number(e.dataset.k);
    document.querySelectorAll(`#matrix [data-q="${q}"], #matrix [data-k="${k}"]`)
      .forEach((x) => x.classList.add("hl"));
    $("info").textContent = say("cell", {query: showToken(v.queries[q]), q, key: showToken(v.keys[k]), k,
                                         w: e.dataset.w});
  }
}

function setView(i) {
  state.view = i;
  const n = view().layers.length, H = view().layers[0].length;
  state.layer = Math.min(state.layer, n - 1);
  if (state.head !== "mean" && Number(state.head) >= H) state.head = "mean";
  fillSelect($("layer"), [...Array(n).keys()].map((l) => [l, say("layer_n", {n: l})]), state.layer);
  const heads = [...Array(H).keys()].map((h) => [h, say("head_n", {n: h})]);
  fillSelect($("head"), [["mean", say("all_heads")], ...heads], state.head);
  render();
}

function init() {
  $("text").textContent = DATA.text;
  $("output").textContent = DATA.output;
  $("outlabel").textContent = say("labelled", {label: DATA.output_label});
  DATA.views.forEach((v, i) => {
    const b = document.createElement("button");
    b.type = "button"; b.dataset.view = v.name; b.textContent = v.label || v.name;
    b.addEventListener("click", () => setView(i));
    $("views").appendChild(b);
  });
  $("layer").addEventListener("change", (e) => { state.layer = Number(e.target.value); render(); });
  $("head").addEventListener("change", (e) => { state.head = e.target.value; render(); });
  for (const id of ["queries", "keys", "matrix"]) {
    $(id).addEventListener("mouseover", onHover);
    $(id).addEventListener("mouseleave", clearHighlight);
  }
  setView(0);
  document.body.dataset.ready = "true";
}

init();
})();
"""

BODY = """
<h1>{heading}</h1>
<div class="io"><b>{input}</b> <span id="text"></span></div>
<div class="io"><b id="outlabel"></b> <span id="output"></span></div>
<div class="controls">
  <span class="views" id="views"></span>
  <label>{layer} <select id="layer"></select></label>
  <label>{head} <select id="head"></select></label>
</div>
<div id="viewtitle"></div>
<div class="strip"><span class="label" id="qlabel"></span> <span id="queries"></span></div>
<div class="strip"><span class="label" id="klabel"></span> <span id="keys"></span></div>
<div id="info"></div>
<table id="matrix"></table>
<p class="note">{note}</p>
"""

# Every string the page shows, per language. The body's ({heading} ...) are filled in Python; the
# script's ({n}, {token} ... placeholders) in the page, by say().
TEXTS: dict[str, dict[str, str]] = {
    "en": {
        "title": "handformer attention explorer",
        "playground_title": "handformer playground: attention",
        "heading": "handformer attention explorer",
        "input": "input:",
        "layer": "layer",
        "head": "head",
        "note": ("Rows are queries, columns are keys; each row sums to 1. Hover a query token to see\n"
                 "what it attends to, a key token to see what attends to it. Dashed tokens were generated "
                 "by the\nmodel. Layers and heads are counted from 0."),
        "labelled": "{label}:",
        "layer_n": "layer {n}",
        "head_n": "head {n}",
        "all_heads": "all heads (mean)",
        "mean_of": "mean of {n} heads",
        "info": "{layer}, {head}. Hover a token or a cell.",
        "attends_to": "{token} (query {i}) attends to: {top}",
        "attended_by": "{token} (key {i}) is attended to by: {top}",
        "cell": "{query} (query {q}) \u2192 {key} (key {k}): {w}",
    },
    "zh": {
        "title": "handformer 注意力浏览器",
        "playground_title": "handformer playground：注意力",
        "heading": "handformer 注意力浏览器",
        "input": "输入：",
        "layer": "层",
        "head": "头",
        "note": "行是查询，列是键；每一行加起来等于 1。把鼠标停在一个查询 token 上，看它关注哪些键；\n"
                "停在一个键 token 上，看哪些查询关注它。虚线框的 token 是模型生成的。层和头都从 0 开始计数。",
        "labelled": "{label}：",
        "layer_n": "层 {n}",
        "head_n": "头 {n}",
        "all_heads": "所有头（平均）",
        "mean_of": "{n} 个头的平均",
        "info": "{layer}，{head}。把鼠标停在 token 或格子上。",
        "attends_to": "{token}（查询，位置 {i}）关注：{top}",
        "attended_by": "{token}（键，位置 {i}）被这些查询关注：{top}",
        "cell": "{query}（查询，位置 {q}）\u2192 {key}（键，位置 {k}）：{w}",
    },
}

# The Chinese words for what the report dicts carry in English (see/viz.py), by view name and by
# output label; English pages keep the report's own words.
VIEWS_ZH = {
    "cross": ("交叉注意力", "交叉注意力：每个输出 token 对源 token 的注意力", "正在生成的输出 token",
              "源 token"),
    "encoder": ("编码器", "编码器自注意力：源 token 对源 token", "源 token（查询）", "源 token（键）"),
    "decoder": ("解码器", "解码器自注意力（因果）：目标 token 只看它和它之前的目标 token",
                "目标 token，解码器输入（查询）", "目标 token（键）"),
    "self": ("自注意力", "因果自注意力：提示词和生成的 token", "token（查询）", "它能关注的 token（键）"),
}
OUTPUT_LABELS_ZH = {"translation": "译文", "greedy continuation": "续写（贪心）", "continuation": "续写"}
LANGUAGES = tuple(TEXTS)


def explorer_text(lang: str) -> dict[str, str]:
    """The page's strings in `lang` (en or zh)."""
    if lang not in TEXTS:
        raise ValueError(f"lang must be one of {', '.join(LANGUAGES)}, got {lang!r}")
    return TEXTS[lang]


def _localized(data: dict[str, Any], lang: str) -> dict[str, Any]:
    """`data` with the report's English titles and labels in `lang` (English: unchanged)."""
    if lang == "en":
        return data
    views = []
    for v in data["views"]:
        label, title, query_title, key_title = VIEWS_ZH.get(v.get("name"), (None,) * 4)
        views.append({**v, "label": label or v.get("name"), "title": title or v.get("title"),
                      "query_title": query_title or v.get("query_title"),
                      "key_title": key_title or v.get("key_title")})
    label = data.get("output_label")
    return {**data, "views": views, "output_label": OUTPUT_LABELS_ZH.get(label, label)}


def _script_json(data: Any) -> str:
    """JSON that is safe inside a <script> element: no '<', '>' or '&' can end it early."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def explorer_html(data: dict[str, Any], title: str | None = None, lang: str = "en") -> str:
    """The whole page as one string, its words in `lang` (en or zh); `title` defaults to the
    language's "handformer attention explorer"."""
    text = explorer_text(lang)
    if not data.get("views"):
        raise ValueError("the explorer needs at least one attention view")
    shown = _localized(data, lang)
    body = BODY.format(**{k: html.escape(text[k]) for k in ("heading", "input", "layer", "head", "note")})
    return (
        f"<!DOCTYPE html>\n<html lang=\"{lang}\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">\n"
        f"<title>{html.escape(title or text['title'])}</title>\n<style>{STYLE}</style>\n</head>\n<body>{body}"
        f"<script type=\"application/json\" id=\"attention-data\">{_script_json(shown)}</script>\n"
        f"<script type=\"application/json\" id=\"explorer-text\">{_script_json(text)}</script>\n"
        f"<script>{SCRIPT}</script>\n</body>\n</html>\n"
    )


def write_explorer(data: dict[str, Any], out: str | os.PathLike, lang: str = "en") -> Path:
    """Write the explorer page for a report dict to `out` (atomically), its words in `lang`."""
    atomic_write_text(out, explorer_html(data, lang=lang))
    return Path(out)
