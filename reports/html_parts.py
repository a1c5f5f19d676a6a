"""Pieces shared by the self-contained HTML reports (run report, diff, trend).

Everything here is inline: the page shell, the common CSS, and one vanilla
script that makes every `table.sortable` sort on header click and filters the
rows of every `table.filterable` by the `#filter-text` box and the
`select[data-filter]` controls (a link `#cell=KEY`, or a click on an
`a[data-cell]`, sets the `#filter-cell` select). No network access, no
external resources.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable

BASE_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.2rem 0.45rem; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.sortable th { cursor: pointer; background: #f3f3f3; position: sticky; top: 0; }
table.sortable th[aria-sort=ascending]::after { content: " \\25B2"; }
table.sortable th[aria-sort=descending]::after { content: " \\25BC"; }
.s-fail, .s-error { background: #fbd5d5; color: #8b0000; font-weight: 600; }
.s-pass { background: #d7f5d7; color: #115e11; }
.s-unsupported, .s-skipped { background: #e6e6e6; color: #555; }
dl.context { display: grid; grid-template-columns: max-content auto; gap: 0.15rem 1rem; }
dl.context dt { font-weight: 600; }
dl.context dd { margin: 0; overflow-wrap: anywhere; }
#filters { display: flex; flex-wrap: wrap; gap: 0.5rem 1rem; align-items: center; }
table.sortable { font-size: 0.875rem; }
div.clip { max-width: max(12rem, 100vw - 80rem); white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
"""
"""Styling common to every report: tables, status colours, context list, filter bar."""

TABLE_JS = """
(function () {
  "use strict";
  var each = function (list, fn) { Array.prototype.forEach.call(list, fn); };
  var selects = Array.prototype.slice.call(document.querySelectorAll("select[data-filter]"));
  var text = document.getElementById("filter-text");
  var shown = document.getElementById("shown");
  var filterable = document.querySelectorAll("table.filterable");

  function matches(row, needle) {
    for (var i = 0; i < selects.length; i++) {
      var s = selects[i];
      if (s.value !== "" && row.dataset[s.dataset.filter] !== s.value) return false;
    }
    return needle === "" || row.textContent.toLowerCase().indexOf(needle) >= 0;
  }

  function applyFilters() {
    var needle = text ? text.value.trim().toLowerCase() : "";
    var count = 0, total = 0;
    each(filterable, function (table) {
      each(table.tBodies[0].rows, function (row) {
        row.hidden = !matches(row, needle);
        total++;
        if (!row.hidden) count++;
      });
    });
    if (shown) shown.textContent = count + " of " + total + " rows shown";
  }

  function value(row, key, numeric) {
    var raw = row.dataset[key];
    if (!numeric) return raw;
    return raw === "" ? NaN : Number(raw);
  }

  // Blank and NaN values sort last in both directions.
  function compare(a, b, numeric, dir) {
    if (numeric) {
      var an = isNaN(a), bn = isNaN(b);
      if (an || bn) return an - bn;
      return a === b ? 0 : dir * (a < b ? -1 : 1);
    }
    if (a === "" || b === "") return (a === "") - (b === "");
    return dir * a.localeCompare(b, undefined, {numeric: true});
  }

  function sortable(table) {
    var body = table.tBodies[0], header = table.tHead.rows[0].cells;
    var current = {key: null, dir: 1};
    each(header, function (th) {
      th.addEventListener("click", function () {
        var key = th.dataset.key, numeric = th.dataset.kind === "num";
        var dir = current.key === key ? -current.dir : (numeric ? -1 : 1);
        current = {key: key, dir: dir};
        each(header, function (c) { c.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", dir > 0 ? "ascending" : "descending");
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (x, y) {
          return compare(value(x, key, numeric), value(y, key, numeric), numeric, dir);
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  }

  // "#cell=KEY" (a coverage grid link) filters the results to that cell.
  function showCell(key) {
    var s = document.getElementById("filter-cell");
    if (!s) return;
    s.value = key;
    applyFilters();
    var at = document.getElementById("filters");
    if (at) at.scrollIntoView();
  }

  function openTarget() {
    var hash = decodeURIComponent(location.hash.slice(1));
    if (hash.indexOf("cell=") === 0) { showCell(hash.slice(5)); return; }
    var el = document.getElementById(hash);
    if (el && el.tagName === "DETAILS") el.open = true;
  }

  each(document.querySelectorAll("table.sortable"), sortable);
  each(document.querySelectorAll("a[data-cell]"), function (a) {
    a.addEventListener("click", function () { showCell(a.dataset.cell); });
  });
  selects.forEach(function (s) { s.addEventListener("change", applyFilters); });
  if (text) text.addEventListener("input", applyFilters);
  window.addEventListener("hashchange", openTarget);
  openTarget();
  applyFilters();
})();
"""
"""Sorting for every `table.sortable` (header cells carry data-key and data-kind="num"|"text",
rows carry the raw values as data attributes) and filtering of every `table.filterable`."""


def escape(text: object) -> str:
    """Escape any value for element text or a double-quoted attribute."""
    return html.escape(str(text), quote=True)


def data_value(value: object) -> str:
    """Raw value for a data attribute: floats at full precision (NaN blank, JS-readable infinities)."""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    return str(value)


def case_id_html(case_id: str) -> str:
    """A case id escaped, with a line-break opportunity after each '/', and after each '_' of a token that
    names hyper-parameters (ids run to 140 characters: "plain_mu0.9/wd0.0001_lr0.05")."""
    return escape(case_id).replace("/", "/<wbr>").replace("_mu", "_<wbr>mu").replace("_lr", "_<wbr>lr")


def label(column: str) -> str:
    """Human column name: underscores become spaces."""
    return column.replace("_", " ")


def page(title: str, css: str, body: str) -> str:
    """A whole self-contained document running `TABLE_JS`: `title` is escaped here, `css` and `body`
    are taken as is."""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{escape(title)}</title>\n<style>{css}</style>\n</head>\n"
        f"<body>\n{body}\n<script>{TABLE_JS}</script>\n</body>\n</html>\n"
    )


def context_list(items: Iterable[tuple[str, str]]) -> str:
    """A `dl.context` of (name, already-escaped HTML value) pairs."""
    rows = "".join(f"<dt>{escape(name)}</dt><dd>{value}</dd>" for name, value in items)
    return f'<dl class="context">{rows}</dl>'
