"""One self-contained HTML report of a run.

`render_html` returns a single document with inline CSS and inline vanilla
JavaScript (no network access, no external fonts). From the top: the verdict
and run context, status counts, a coverage grid that says where anything is
wrong (layer kind x param@compute dtype x layout, each cell coloured by its
worst ratio and linking to its rows), per-check and per-dtype breakdowns, a
legend, a worst-first results table that sorts on header click and filters by
text and by column, and a <details> block per non-passing record plus the
worst passing ones. Every piece of record or run text goes through `html.escape`;
every float shown has 3 significant digits (the data attributes, for sorting, hold
full precision). The results table fits a laptop's 1,400 px, a row in two lines: the
case's own axes (layer, shape, dtypes, layout, world size, ...) are in its id and in
the filters, max_abs in the details, not in columns of their own.
"""

from __future__ import annotations

import math
import re
from typing import Mapping
from urllib.parse import quote

from cases import schema
from reports import tp_table
from reports.derived import allowed, diagnosis_label, title, verdict
from reports.html_parts import BASE_CSS, case_id_html, context_list, data_value, escape, label, page
from reports.records import (
    COLUMNS,
    STATUSES,
    Record,
    RunInfo,
    format_metric,
    group_by,
    harness_text,
    status_counts,
    worst_first,
    worst_ratio,
)

TABLE_COLUMNS: tuple[str, ...] = (
    "status", "ratio", "case_id", "check", "diagnosis", "rel_err", "allowed", "rtol", "max_ulp", "backend",
)
"""Columns of the results table, in display order; each is also a row data attribute. `allowed` and
`rtol` are derived (`_value`): the whole allowance in rel_err's units, and the policy's rtol alone.
`diagnosis` shows its label, the whole text on hover and in the record's details."""

FILTER_COLUMNS: tuple[str, ...] = ("status", "check", *schema.FILTERS, "backend", "cell")
"""Columns with a <select> filter: the case's from cases/schema.py (its columns marked `filter`); options
are the values present in the data. `cell` is the coverage grid's cell of a row (`grid_cell`), set by
clicking that cell."""

NUMERIC_COLUMNS = frozenset({"ratio", "rel_err", "allowed", "rtol", "max_ulp"})
LAYOUT_ORDER = ("single", "replicated", "shard0", "shard1")
"""Grid columns come layout by layout in this order (others after, sorted)."""
WORST_PASSING_DETAILS = 20
SEVERITY = {s: len(STATUSES) - 1 - i for i, s in enumerate(STATUSES)}
"""Status rank for sorting, higher is worse, so a descending sort puts fail first."""

_CSS = BASE_CSS + """
details { border: 1px solid #ccc; margin: 0.3rem 0; padding: 0.3rem 0.6rem; }
details[open] { background: #fafafa; }
pre { white-space: pre-wrap; background: #f3f3f3; padding: 0.4rem; margin: 0.2rem 0; }
.legend { max-width: 60rem; }
h1 .verdict { padding: 0 0.3rem; }
div.grids { display: flex; flex-wrap: wrap; gap: 0 1rem; align-items: flex-start; }
table.grid td { text-align: center; min-width: 3.2rem; padding: 0; }
table.grid td a { display: block; padding: 0.2rem 0.3rem; color: inherit; text-decoration: none; }
table.grid td a:hover { outline: 2px solid #222; }
table.grid th { text-align: center; font-weight: 600; }
table.grid td.g-fail, table.grid td.g-error { color: #fff; font-weight: 600; }
figure { display: inline-block; margin: 0.3rem 1rem 0.3rem 0; vertical-align: top; }
figcaption { font-size: 0.8rem; max-width: 24rem; }
"""


def render_html(records: list[Record], info: RunInfo, pictures: Mapping[tuple[str, str], str] | None = None) -> str:
    """The whole report as one self-contained HTML document (no external resources).

    `pictures` maps a record's key (`Record.key`: case id, check, target, backend, world size) to
    an HTML fragment (reports.pictures) shown in that record's detail block; such records always
    get a detail block.
    """
    pictures = pictures or {}
    ordered = worst_first(records)
    anchors = _anchors(ordered, pictures)
    body = "\n".join((
        _header(info, records),
        _summary(records),
        _grid(records),
        _breakdown(records, "check"),
        _breakdown(records, "param_dtype"),
        _tp_section(records),
        _legend(),
        _filters(records),
        _table(ordered, anchors),
        _details(ordered, anchors, pictures),
    ))
    return page(title(records, info), _CSS, body)


def _tp_section(records: list[Record]) -> str:
    """The TP-dependence table (reports/tp_table.py) when the run holds a tensor-parallel record."""
    data = tp_table.load() if tp_table.has_tp(records) else None
    return tp_table.html_section(data) if data else ""


def grid_cell(record: Record) -> str:
    """The coverage grid cell of a record: layer kind | param@compute | layout (without its
    even/uneven/empty detail)."""
    return f"{record.layer}|{record.param_dtype}@{record.compute_dtype}|{record.layout.split('-')[0]}"


def _value(record: Record, column: str) -> object:
    """A table column's value: a record field, or a derived one."""
    if column == "allowed":
        return allowed(record)
    if column == "rtol":
        return record.tolerance
    if column == "cell":
        return grid_cell(record)
    return getattr(record, column)


def _display(value: object) -> str:
    """Value as shown in a table cell: floats with 3 significant digits, NaN blank."""
    return format_metric(value) if isinstance(value, float) else str(value)


def _detail_value(value: object) -> str:
    """Value as shown in a details block: floats with 3 significant digits, NaN as n/a."""
    if isinstance(value, float):
        return format_metric(value) or "n/a"
    return str(value)


def _anchors(ordered: list[Record], pictures: Mapping[tuple, str]) -> dict[int, str]:
    """Detail anchor per position in `ordered`, for every non-passing record, every record
    with a picture and the `WORST_PASSING_DETAILS` first passing ones. Ids derive from case id + check; a
    repeated id (same case and check on another backend, or equal after slugging)
    gets a numeric suffix so every id is unique."""
    anchors: dict[int, str] = {}
    suffixes: dict[str, int] = {}
    used: set[str] = set()
    passing = 0
    for i, r in enumerate(ordered):
        if r.status == "pass" and r.key not in pictures:
            if passing == WORST_PASSING_DETAILS:
                continue
            passing += 1
        base = "case-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{r.case_id}--{r.check}")
        n, anchor = suffixes.get(base, 1), base
        while anchor in used:
            n += 1
            anchor = f"{base}-{n}"
        suffixes[base] = n
        used.add(anchor)
        anchors[i] = anchor
    return anchors


def _header(info: RunInfo, records: list[Record]) -> str:
    """Title (the verdict first) and run context."""
    items = (
        ("target", escape(info.target)),
        ("tier", escape(info.tier)),
        ("backends", escape(info.backends)),
        ("command", f"<code>{escape(info.command)}</code>"),
        ("started", escape(info.started)),
        ("duration", escape(f"{info.seconds:.1f} s")),
        ("torch", escape(info.torch_version)),
        ("judged code", escape(info.judged.named())),
        ("harness", escape(harness_text(info.harness, info.commit))),
    )
    if info.interrupted:
        items = (("status", f"<strong>INCOMPLETE</strong>: interrupted by {escape(info.interrupted)}"), *items)
    if info.scope:
        items = (("judged", escape(info.scope)), *items)
    if info.thin:
        items = (("thin", f"<strong>THIN</strong>: {escape(info.thin)}"), *items)
    outcome = verdict(records, info.interrupted, info.thin)
    status = "fail" if "FAILED" in outcome else "pass" if outcome == "PASSED" else "skipped"
    return (f'<h1><span class="verdict s-{status}">{escape(outcome)}</span> Muon conformance of '
            f"{escape(info.target)}, {escape(info.tier)} tier</h1>\n{context_list(items)}")


def _summary(records: list[Record]) -> str:
    """Status counts, one cell per status (zeros included), plus the total."""
    counts = status_counts(records)
    head = "".join(f"<th>{s}</th>" for s in STATUSES) + "<th>total</th>"
    cells = "".join(f'<td class="num{f" s-{s}" if counts[s] else ""}" data-status="{s}">{counts[s]}</td>'
                    for s in STATUSES)
    return (
        f'<h2>Summary</h2>\n<table id="summary"><thead><tr>{head}</tr></thead>'
        f'<tbody><tr>{cells}<td class="num" data-status="total">{len(records)}</td></tr></tbody></table>'
    )


def _ordered_columns(records: list[Record]) -> list[tuple[str, str]]:
    """(layout, param@compute) columns present in the data, layout by layout (LAYOUT_ORDER)."""
    present = {(c.split("|")[2], c.split("|")[1]) for c in map(grid_cell, records)}
    rank = {name: i for i, name in enumerate(LAYOUT_ORDER)}
    return sorted(present, key=lambda col: (rank.get(col[0], len(rank)), col[0], col[1]))


def _heat(records: list[Record]) -> tuple[str, str, str]:
    """(class, inline colour, text) of a grid cell: error dark red, fail red (darker the larger the
    ratio), pass green turning amber towards ratio 1, nothing checked grey."""
    counts = status_counts(records)
    worst = worst_ratio([r for r in records if r.status in ("pass", "fail")])
    if counts["error"]:
        return "g-error", "#7a0000", "error"
    if counts["fail"]:
        level = min(1.0, math.log10(max(worst, 1.0)) / 2.0) if not math.isnan(worst) else 1.0
        red, green = int(214 - 90 * level), int(90 - 70 * level)
        return "g-fail", f"rgb({red},{green},{green})", format_metric(worst) or "fail"
    if counts["pass"]:
        level = 0.0 if math.isnan(worst) else min(1.0, max(0.0, worst))
        red, green, blue = int(200 + 45 * level), int(235 - 10 * level), int(200 - 80 * level)
        return "g-pass", f"rgb({red},{green},{blue})", format_metric(worst) or "pass"
    return "g-none", "#e6e6e6", "&ndash;"


def _grid(records: list[Record]) -> str:
    """Coverage grid: one table per layout, side by side and wrapping at the window's edge (a run may
    hold ten layouts), each with a row per layer kind and a column per param@compute present there; each
    cell coloured by its records' worst ratio and linking to the results filtered to that cell."""
    if not records:
        return '<h2>Coverage</h2>\n<p id="coverage">no records</p>'
    columns = _ordered_columns(records)
    layers = group_by(records, "layer")
    by_cell: dict[str, list[Record]] = {}
    for r in records:
        by_cell.setdefault(grid_cell(r), []).append(r)
    tables = []
    for layout in dict.fromkeys(c[0] for c in columns):
        dtypes = [d for lay, d in columns if lay == layout]
        head = (f'<tr><th rowspan="2">layer</th><th colspan="{len(dtypes)}">{escape(layout)}</th></tr><tr>'
                + "".join(f"<th>{escape(d)}</th>" for d in dtypes) + "</tr>")
        rows = [f"<tr><th>{escape(layer)}</th>{''.join(_grid_cell(f'{layer}|{d}|{layout}', by_cell) for d in dtypes)}</tr>"
                for layer in layers if any(f"{layer}|{d}|{layout}" in by_cell for d in dtypes)]
        tables.append(f'<table class="grid" data-layout="{escape(layout)}"><thead>{head}</thead>'
                      f'<tbody>{"".join(rows)}</tbody></table>')
    return (
        "<h2>Coverage</h2>\n<p class=\"legend\">Worst ratio of each layer kind &times; dtypes (param@compute) "
        "&times; layout: <b>green</b> passes (amber as it nears 1), <b>red</b> fails, <b>error</b> the target "
        "raised, <b>&ndash;</b> nothing checked (unsupported or skipped), blank: no case. Click a cell for its "
        "rows.</p>\n"
        f'<div id="coverage" class="grids">{"".join(tables)}</div>'
    )


def _grid_cell(key: str, by_cell: dict[str, list[Record]]) -> str:
    """One grid cell (`grid_cell` key): its heat and a link to its rows; blank where no case is."""
    members = by_cell.get(key)
    if not members:
        return '<td class="g-empty"></td>'
    cls, colour, text = _heat(members)
    counts = ", ".join(f"{n} {s}" for s, n in status_counts(members).items() if n)
    layer, dtypes, layout = key.split("|")
    tip = f"{layer}, {dtypes}, {layout}: {counts}"
    return (f'<td class="{cls}" style="background:{colour}" data-cell="{escape(key)}" title="{escape(tip)}">'
            f'<a href="#cell={escape(quote(key, safe="|@"))}" data-cell="{escape(key)}">{text}</a></td>')


def _breakdown(records: list[Record], field: str) -> str:
    """Status counts and worst ratio for each value of `field`."""
    head = f"<th>{label(field)}</th>" + "".join(f"<th>{s}</th>" for s in STATUSES) + "<th>worst ratio</th>"
    rows = []
    for value, group in group_by(records, field).items():
        counts = status_counts(group)
        cells = "".join(f'<td class="num" data-status="{s}">{counts[s]}</td>' for s in STATUSES)
        rows.append(
            f'<tr data-value="{escape(value)}"><td>{escape(value)}</td>{cells}'
            f'<td class="num" data-status="worst">{format_metric(worst_ratio(group))}</td></tr>'
        )
    return (
        f'<h2>By {label(field)}</h2>\n<table id="by-{field}" class="breakdown">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _legend() -> str:
    return (
        '<h2>Legend</h2>\n<p class="legend"><b>ratio</b> = error / tolerance: &#8214;err&#8214; / '
        "(rtol&middot;&#8214;&Delta;ref&#8214; + storage_ulps&middot;&#8214;ulp(x_ref)&#8214;), on the update "
        "(new minus previous parameter). <b>rel_err</b> = &#8214;err&#8214; / &#8214;&Delta;ref&#8214;; "
        "<b>allowed</b> = rel_err / ratio is the whole allowance in rel_err's units, the storage-rounding "
        "term included, so a row passes exactly when rel_err &le; allowed; <b>rtol</b> is the policy's "
        "share of it (for bf16 parameters the rounding term usually dominates, and rel_err may exceed rtol "
        "on a passing row). Each record's details show where its tolerance comes from. "
        "A check <b>passes iff ratio &le; 1</b>; <b>fail</b> means ratio &gt; 1 or a required relation "
        "did not hold, <b>error</b> means the target raised. <b>unsupported</b> (the target declined "
        "the case) and <b>skipped</b> (the harness could not run it here) are never counted as pass. "
        "Click a column header to sort (blank values last); click a case id for its details.</p>"
    )


def _options(records: list[Record], column: str) -> list[str]:
    """Distinct values of `column` in the data: statuses by severity, others sorted."""
    values = {str(_value(r, column)) for r in records}
    if column == "status":
        return [s for s in STATUSES if s in values]
    return sorted(values)


def _filters(records: list[Record]) -> str:
    """Free-text filter box and one <select> per `FILTER_COLUMNS` entry."""
    controls = ['<label>text <input id="filter-text" type="search" placeholder="filter rows"></label>']
    for column in FILTER_COLUMNS:
        options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in _options(records, column))
        controls.append(
            f'<label>{label(column)} <select id="filter-{column}" data-filter="{column}">'
            f'<option value="">all</option>{options}</select></label>'
        )
    return f'<h2>Results</h2>\n<div id="filters">{"".join(controls)}<span id="shown"></span></div>'


def _table(ordered: list[Record], anchors: dict[int, str]) -> str:
    """The results table, rows in `ordered` order."""
    head = "".join(
        f'<th data-key="{"severity" if c == "status" else c}" '
        f'data-kind="{"num" if c in NUMERIC_COLUMNS or c == "status" else "text"}">{label(c)}</th>'
        for c in TABLE_COLUMNS
    )
    rows = "\n".join(_row(r, anchors.get(i)) for i, r in enumerate(ordered))
    return (
        f'<table id="results" class="sortable filterable"><thead><tr>{head}</tr></thead>'
        f"<tbody>\n{rows}\n</tbody></table>"
    )


def _row(record: Record, anchor: str | None) -> str:
    """One results row: a data attribute per table column (raw values) and its cells."""
    attrs = "".join(f' data-{c}="{escape(data_value(_value(record, c)))}"'
                    for c in dict.fromkeys((*TABLE_COLUMNS, *FILTER_COLUMNS)))
    cells = "".join(_cell(record, c, anchor) for c in TABLE_COLUMNS)
    return f'<tr data-severity="{SEVERITY[record.status]}"{attrs}>{cells}</tr>'


def _cell(record: Record, column: str, anchor: str | None) -> str:
    text = escape(_display(_value(record, column)))
    if column == "status":
        return f'<td class="s-{record.status}">{text}</td>'
    if column == "case_id":
        shown = case_id_html(record.case_id)
        return f'<td><a href="#{escape(anchor)}">{shown}</a></td>' if anchor is not None else f"<td>{shown}</td>"
    if column == "diagnosis":
        return f'<td title="{text}">{escape(diagnosis_label(record))}</td>'
    if column in NUMERIC_COLUMNS:
        return f'<td class="num">{text}</td>'
    return f"<td>{text}</td>"


def _details(ordered: list[Record], anchors: dict[int, str], pictures: Mapping[tuple, str]) -> str:
    """One <details> block per anchored record, in worst-first order."""
    blocks = "\n".join(_detail(ordered[i], anchor, pictures.get(ordered[i].key, ""))
                       for i, anchor in anchors.items())
    return f'<h2>Case details</h2>\n<div id="details">\n{blocks}\n</div>'


def _detail(record: Record, anchor: str, picture: str) -> str:
    """Every field of `record`; message and repro in their own preformatted blocks; its picture."""
    rows = "".join(
        f"<tr><th>{label(c)}</th><td>{escape(_detail_value(getattr(record, c)))}</td></tr>"
        for c in COLUMNS
        if c not in ("message", "repro")
    ) + f"<tr><th>allowed (rel_err / ratio)</th><td>{escape(_detail_value(allowed(record)))}</td></tr>"
    ratio = format_metric(record.ratio) or "n/a"
    diagnosis = f" &middot; {escape(diagnosis_label(record))}" if record.diagnosis else ""
    return (
        f'<details id="{escape(anchor)}" data-status="{record.status}">'
        f'<summary><span class="s-{record.status}">{record.status}</span> '
        f"<code>{escape(record.case_id)}</code> &middot; {escape(record.check)} &middot; ratio {ratio}{diagnosis}</summary>"
        f'<table class="fields">{rows}</table>'
        f'<div>message</div><pre class="message">{escape(record.message)}</pre>'
        f'<div>repro</div><pre><code class="repro">{escape(record.repro)}</code></pre>'
        + (f'<div class="pictures">{picture}</div>' if picture else "")
        + "</details>"
    )
