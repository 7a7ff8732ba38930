"""One self-contained page of a command's run (``--html FILE``): the inputs and the command line,
the headline figures, the figures ``--plot`` draws, the tables (sortable), the provenance shares,
the missing data, the notes and the command's JSON document, downloadable.

Self-contained: the figures are PNG data URIs, the style and the script are inline, and nothing
is fetched from a network (no CDN, no web font). Everything written comes from the JSON document
(:mod:`perfcast.report.html_views` reads it) or the figures, and every string is escaped. The same
document and figures give the same bytes (no time stamp: the page holds no figure the document
does not)."""

from __future__ import annotations

import base64
import html
import shlex

from perfcast.report.document import dumps
from perfcast.report.html_views import CAPTIONS, VIEWS, Table, View, cell

#: the page's sections, in order: (id, heading)
SECTIONS = (("headline", "Headline"), ("inputs", "Inputs"), ("figures", "Figures"), ("tables", "Tables"),
            ("provenance", "Provenance"), ("missing", "Missing data"), ("notes", "Assumptions and notes"),
            ("json", "JSON document"))
_NUMERIC = ("s", "B", "B/s", "FLOP", "share", "rate", "int", "num")
#: characters of text that wrap (a shorter value stays on one line)
_LONG = 44

_CSS = """
:root { --ink: #1b1f24; --muted: #57606a; --line: #d0d7de; --tint: #f6f8fa; --accent: #0072B2; --alarm: #b3261e; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 1240px; padding: 0 24px 48px; color: var(--ink); background: #fff;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif; }
header { padding: 20px 0 8px; border-bottom: 2px solid var(--accent); }
h1 { font-size: 22px; margin: 0; } h2 { font-size: 18px; margin: 28px 0 10px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.sub { color: var(--muted); margin: 4px 0 0; }
nav { position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid var(--line); z-index: 1; }
nav a { margin-right: 14px; color: var(--accent); text-decoration: none; }
.alert { border: 2px solid var(--alarm); color: var(--alarm); font-weight: 600; padding: 10px 14px; margin: 16px 0;
         border-radius: 6px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr)); gap: 10px; margin: 0; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px; background: var(--tint); }
.card dt { color: var(--muted); font-size: 12px; } .card dd { margin: 2px 0 0; font-size: 18px; font-weight: 600; }
pre { background: var(--tint); border: 1px solid var(--line); border-radius: 6px; padding: 10px; overflow: auto;
      white-space: pre-wrap; word-break: break-word; }
.scroll { overflow-x: auto; max-height: 640px; overflow-y: auto; border: 1px solid var(--line); border-radius: 6px; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top;
         white-space: nowrap; }
td.wrap { white-space: normal; min-width: 280px; }
thead th { position: sticky; top: 0; background: var(--tint); white-space: nowrap; }
table.sortable thead th { cursor: pointer; user-select: none; }
th[aria-sort="ascending"]::after { content: " \\25B2"; } th[aria-sort="descending"]::after { content: " \\25BC"; }
td.num, th.num { text-align: right; white-space: nowrap; }
.inputs { display: grid; grid-template-columns: repeat(auto-fill, minmax(360px, 1fr)); gap: 0 24px; margin: 0; }
.inputs div { display: flex; justify-content: space-between; gap: 12px; border-bottom: 1px solid var(--line);
              padding: 3px 0; }
.inputs dt { color: var(--muted); flex: 1 1 0; min-width: 0; overflow-wrap: anywhere; }
.inputs dd { margin: 0; text-align: right; flex: 0 1 auto; max-width: 62%; }
.inputs div.long { grid-column: 1 / -1; justify-content: flex-start; }
.inputs div.long dt { flex: 0 0 auto; min-width: 240px; } .inputs div.long dd { max-width: 80%; text-align: left; }
figure { margin: 0 0 20px; } figure img { width: 100%; max-width: 1000px; height: auto; border: 1px solid var(--line); }
figcaption { color: var(--muted); }
.bar { display: flex; height: 14px; min-width: 160px; border-radius: 3px; overflow: hidden; background: var(--tint); }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 4px; }
footer { margin-top: 36px; color: var(--muted); font-size: 12px; }
"""

# Click (or Enter) on a header sorts its table by that column, again to reverse; numbers by value
# (data-v), text by text, blanks last, ties in the original order. Then the JSON download.
_JS = """
(function () {
  "use strict";
  function key(td) {
    var v = td.getAttribute("data-v");
    if (v === null) { return td.textContent; }
    return v === "" ? null : Number(v);
  }
  function compare(a, b) {
    if (a === null || b === null) { return a === b ? 0 : (a === null ? 1 : -1); }
    if (typeof a !== typeof b) { a = String(a); b = String(b); }
    return a < b ? -1 : (a > b ? 1 : 0);
  }
  function sort(table, col, th) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var dir = th.getAttribute("aria-sort") === "ascending" ? -1 : 1;
    rows.sort(function (r, s) {
      var a = key(r.cells[col]), b = key(s.cells[col]);
      var c = (a === null || b === null) ? compare(a, b) : dir * compare(a, b);
      return c || (Number(r.getAttribute("data-i")) - Number(s.getAttribute("data-i")));
    });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir === 1 ? "ascending" : "descending");
    rows.forEach(function (r) { body.appendChild(r); });
  }
  var tables = document.querySelectorAll("table.sortable");
  Array.prototype.forEach.call(tables, function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.tabIndex = 0;
      th.addEventListener("click", function () { sort(table, col, th); });
      th.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sort(table, col, th); }
      });
    });
  });
  document.body.setAttribute("data-sortable", String(tables.length));
  var text = document.getElementById("document").textContent;
  var link = document.getElementById("download");
  link.href = URL.createObjectURL(new Blob([text + "\\n"], {type: "application/json"}));
  link.setAttribute("data-ready", "true");
})();
"""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def page(command: str, doc: dict, figures: dict | None = None, argv: list[str] | None = None) -> str:
    """The page of ``perfcast COMMAND`` from its JSON document ``doc`` (with the version fields,
    as ``--json`` prints it), the figures ``--plot`` draws (name → figure, or a
    :class:`~perfcast.report.plots.Skipped`) and the command line ``argv`` (after ``perfcast``)."""
    view = VIEWS[command](doc)
    text = dumps(doc)
    content = {"headline": _headline(view), "inputs": _inputs(view, argv), "figures": _figures(figures or {}),
               "tables": _tables(view.tables), "provenance": _provenance(view), "missing": _missing(view),
               "notes": _list(view.notes, "notes-list", "The document holds no notes."), "json": _json(command, text)}
    sections = [(sid, title, content[sid]) for sid, title in SECTIONS]
    nav = "".join(f'<a href="#{sid}">{_e(title)}</a>' for sid, title, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{_e(title)}</h2>{content}</section>\n' for sid, title, content in sections)
    alert = f'<p class="alert" id="alert">{_e(view.alert)}</p>' if view.alert else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f'<title>perfcast {_e(command)}: {_e(view.title)}</title>\n<style>{_CSS}</style>\n</head>\n'
            f'<body data-command="{_e(command)}">\n<header><h1>perfcast {_e(command)}</h1>'
            f'<p class="sub">{_e(view.title)}</p></header>\n<nav>{nav}</nav>\n{alert}\n{body}'
            f'<footer>perfcast {_e(doc.get("perfcast_version", ""))} · document schema '
            f'{_e(doc.get("schema_version", ""))}</footer>\n<script>{_JS}</script>\n</body>\n</html>\n')


def _inputs(view: View, argv: list[str] | None) -> str:
    line = f'<pre id="command-line">{_e(shlex.join(["perfcast", *argv]))}</pre>' if argv is not None else ""
    items = "".join(f'<div{" class=long" if len(k) + len(v) > _LONG else ""}><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>'
                    for k, v in view.inputs)
    return f'{line}<dl class="inputs" id="inputs-list">{items}</dl>'


def _headline(view: View) -> str:
    cards = "".join(f'<div class="card"><dt>{_e(k)}</dt><dd>{_e(v)}</dd></div>' for k, v in view.headline)
    return f'<dl class="cards" id="headline-figures">{cards}</dl>'


def _figures(figures: dict) -> str:
    from perfcast.report import plots

    out, skipped = [], []
    for name, fig in figures.items():
        if isinstance(fig, plots.Skipped):
            skipped.append(f"{name}: {fig.why}")
            continue
        data = base64.b64encode(plots.encoded(fig, "png")).decode("ascii")
        caption = CAPTIONS.get(name, "")
        out.append(f'<figure id="figure-{_e(name)}"><img alt="{_e(name)}: {_e(caption)}" '
                   f'src="data:image/png;base64,{data}"><figcaption><b>{_e(name)}</b>: {_e(caption)}</figcaption>'
                   f'</figure>')
    if not out and not skipped:
        out.append("<p>No figure was drawn.</p>")
    if skipped:
        out.append("<h3>Not drawn</h3>" + _list(skipped, "figures-skipped", ""))
    return "".join(out)


def _table(t: Table, sortable: bool = True, extra: list[str] | None = None) -> str:
    """``extra``: one more cell per row, after the table's own (not sorted on)."""
    if not t.rows:
        return f'<h3>{_e(t.title)}</h3><p id="{_e(t.id)}">None.</p>'
    num = [k in _NUMERIC for k in t.kinds]
    wrap = [not n and any(len(cell(row[i], "text")) > _LONG for row in t.rows) for i, n in enumerate(num)]
    head = "".join(f'<th scope="col"{" class=num" if n else ""}>{_e(c)}</th>' for c, n in zip(t.columns, num))
    head += '<th scope="col"></th>' if extra else ""
    body = []
    for i, row in enumerate(t.rows):
        cells = []
        for value, kind, n, w in zip(row, t.kinds, num, wrap):
            if n:
                v = "" if not isinstance(value, (int, float)) or isinstance(value, bool) else repr(float(value))
                cells.append(f'<td class="num" data-v="{v}">{_e(cell(value, kind))}</td>')
            else:
                cells.append(f'<td{" class=wrap" if w else ""}>{_e(cell(value, kind))}</td>')
        if extra:
            cells.append(f'<td data-v="">{extra[i]}</td>')
        body.append(f'<tr data-i="{i}">{"".join(cells)}</tr>')
    cls = ' class="sortable"' if sortable else ""
    return (f'<h3>{_e(t.title)}</h3><div class="scroll"><table{cls} id="{_e(t.id)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _tables(tables) -> str:
    return "".join(_table(t) for t in tables) or "<p>No table.</p>"


def _provenance(view: View) -> str:
    from perfcast.report.plots import PROVENANCE_COLOURS, provenance_colour

    if not view.provenance:
        return '<p id="provenance-table">This document holds no provenance shares.</p>'
    labels = sorted({k for _, shares in view.provenance for k in shares},
                    key=lambda k: (list(PROVENANCE_COLOURS).index(k) if k in PROVENANCE_COLOURS else 99, k))
    t = Table("provenance-table", "Share of the time by provenance", ("where", *labels),
              ("text", *("share",) * len(labels)),
              tuple((where, *(shares.get(k) for k in labels)) for where, shares in view.provenance))
    bars = ['<div class="bar">' + "".join(f'<span style="width:{100 * v:.3f}%;background:{provenance_colour(k)}" '
                                          f'title="{_e(k)} {_e(cell(v, "share"))}"></span>'
                                          for k, v in shares.items() if v > 0) + "</div>"
            for _, shares in view.provenance]
    key = "".join(f'<span class="swatch" style="background:{provenance_colour(k)}"></span>{_e(k)} ' for k in labels)
    return f"<p>{key}</p>" + _table(t, extra=bars)


def _missing(view: View) -> str:
    if not view.missing and not view.missing_tables:
        return '<p id="missing-list">The document lists no missing data: no unknown op, no miss, no approximation.</p>'
    lead = "<p>What the document says is approximate, assumed or missing:</p>" if view.missing else ""
    return lead + _list(view.missing, "missing-list", "") + "".join(_table(t) for t in view.missing_tables)


def _list(items, id_: str, empty: str) -> str:
    if not items:
        return f'<p id="{id_}">{_e(empty)}</p>' if empty else ""
    return f'<ul id="{id_}">' + "".join(f"<li>{_e(n)}</li>" for n in items) + "</ul>"


def _json(command: str, text: str) -> str:
    return (f'<p><a id="download" href="#json" download="perfcast-{_e(command)}.json">Download the JSON</a> — the '
            f"document <code>--json</code> prints ({len(text.encode()):,} bytes).</p>"
            f'<details><summary>Show the JSON</summary><pre id="document">{_e(text)}</pre></details>')
