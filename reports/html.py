"""One self-contained HTML report of a run.

`render_html` returns a single document with inline CSS and inline vanilla
JavaScript (no network access, no external fonts): the run context, status
counts, per-check and per-dtype breakdowns, a legend, a worst-first results
table that sorts on header click and filters by text and by column, and a
<details> block per non-passing record plus the worst passing ones. Every
piece of record or run text goes through `html.escape`.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from reports.html_parts import BASE_CSS, context_list, data_value, escape, label, page
from reports.records import (
    COLUMNS,
    STATUSES,
    Record,
    RunInfo,
    format_metric,
    group_by,
    status_counts,
    worst_first,
    worst_ratio,
)

TABLE_COLUMNS: tuple[str, ...] = (
    "status", "ratio", "case_id", "check", "layer", "shape", "megabatch", "flatten",
    "param_dtype", "compute_dtype", "orthogonalizer", "rel_err", "max_abs", "max_ulp",
    "tolerance", "backend", "world_size", "layout",
)
"""Columns of the results table, in display order; each is also a row data attribute."""

FILTER_COLUMNS: tuple[str, ...] = (
    "status", "check", "layer", "param_dtype", "orthogonalizer", "backend", "layout",
)
"""Columns with a <select> filter; options are the values present in the data."""

NUMERIC_COLUMNS = frozenset({"ratio", "megabatch", "rel_err", "max_abs", "max_ulp", "tolerance", "world_size"})
WORST_PASSING_DETAILS = 20
SEVERITY = {s: len(STATUSES) - 1 - i for i, s in enumerate(STATUSES)}
"""Status rank for sorting, higher is worse, so a descending sort puts fail first."""

_CSS = BASE_CSS + """
details { border: 1px solid #ccc; margin: 0.3rem 0; padding: 0.3rem 0.6rem; }
details[open] { background: #fafafa; }
pre { white-space: pre-wrap; background: #f3f3f3; padding: 0.4rem; margin: 0.2rem 0; }
.legend { max-width: 60rem; }
"""


def render_html(records: list[Record], info: RunInfo, pictures: Mapping[tuple[str, str], str] | None = None) -> str:
    """The whole report as one self-contained HTML document (no external resources).

    `pictures` maps (case id, check) to an HTML fragment (reports.pictures) shown in that
    record's detail block; such records always get a detail block.
    """
    pictures = pictures or {}
    ordered = worst_first(records)
    anchors = _anchors(ordered, pictures)
    body = "\n".join((
        _header(info),
        _summary(records),
        _breakdown(records, "check"),
        _breakdown(records, "param_dtype"),
        _legend(),
        _filters(records),
        _table(ordered, anchors),
        _details(ordered, anchors, pictures),
    ))
    return page(f"Muon conformance: {info.target}", _CSS, body)


def _display(value: object) -> str:
    """Value as shown in a table cell: floats with 3 significant digits, NaN blank."""
    return format_metric(value) if isinstance(value, float) else str(value)


def _full(value: object) -> str:
    """Value as shown in a details block: floats at full precision, NaN spelled out."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else repr(value)
    return str(value)


def _anchors(ordered: list[Record], pictures: Mapping[tuple[str, str], str]) -> dict[int, str]:
    """Detail anchor per position in `ordered`, for every non-passing record, every record
    with a picture and the `WORST_PASSING_DETAILS` first passing ones. Ids derive from case id + check; a
    repeated id (same case and check on another backend, or equal after slugging)
    gets a numeric suffix so every id is unique."""
    anchors: dict[int, str] = {}
    suffixes: dict[str, int] = {}
    used: set[str] = set()
    passing = 0
    for i, r in enumerate(ordered):
        if r.status == "pass" and (r.case_id, r.check) not in pictures:
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


def _header(info: RunInfo) -> str:
    """Title and run context."""
    items = (
        ("target", escape(info.target)),
        ("tier", escape(info.tier)),
        ("backends", escape(info.backends)),
        ("command", f"<code>{escape(info.command)}</code>"),
        ("started", escape(info.started)),
        ("duration", escape(f"{info.seconds:.1f} s")),
        ("torch", escape(info.torch_version)),
        ("commit", escape(info.commit or "unknown")),
    )
    if info.interrupted:
        items = (("status", f"<strong>INCOMPLETE</strong>: interrupted by {escape(info.interrupted)}"), *items)
    incomplete = "INCOMPLETE " if info.interrupted else ""
    return f"<h1>{incomplete}Muon conformance report: {escape(info.target)}</h1>\n{context_list(items)}"


def _summary(records: list[Record]) -> str:
    """Status counts, one cell per status (zeros included), plus the total."""
    counts = status_counts(records)
    head = "".join(f"<th>{s}</th>" for s in STATUSES) + "<th>total</th>"
    cells = "".join(f'<td class="num s-{s}" data-status="{s}">{counts[s]}</td>' for s in STATUSES)
    return (
        f'<h2>Summary</h2>\n<table id="summary"><thead><tr>{head}</tr></thead>'
        f'<tbody><tr>{cells}<td class="num" data-status="total">{len(records)}</td></tr></tbody></table>'
    )


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
        '<h2>Legend</h2>\n<p class="legend"><b>ratio</b> = error / tolerance, where the error is the '
        "check's measured error and the tolerance is the bound it allows (each case's details "
        "show where that tolerance comes from). "
        "A check <b>passes iff ratio &le; 1</b>; <b>fail</b> means ratio &gt; 1 or a required relation "
        "did not hold, <b>error</b> means the target raised. <b>unsupported</b> (the target declined "
        "the case) and <b>skipped</b> (the harness could not run it here) are never counted as pass. "
        "Click a column header to sort (blank values last); click a case id for its details.</p>"
    )


def _options(records: list[Record], column: str) -> list[str]:
    """Distinct values of `column` in the data: statuses by severity, others sorted."""
    values = {str(getattr(r, column)) for r in records}
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
    attrs = "".join(f' data-{c}="{escape(data_value(getattr(record, c)))}"' for c in TABLE_COLUMNS)
    cells = "".join(_cell(record, c, anchor) for c in TABLE_COLUMNS)
    return f'<tr data-severity="{SEVERITY[record.status]}"{attrs}>{cells}</tr>'


def _cell(record: Record, column: str, anchor: str | None) -> str:
    text = escape(_display(getattr(record, column)))
    if column == "status":
        return f'<td class="s-{record.status}">{text}</td>'
    if column == "case_id" and anchor is not None:
        return f'<td><a href="#{escape(anchor)}">{text}</a></td>'
    if column in NUMERIC_COLUMNS:
        return f'<td class="num">{text}</td>'
    return f"<td>{text}</td>"


def _details(ordered: list[Record], anchors: dict[int, str], pictures: Mapping[tuple[str, str], str]) -> str:
    """One <details> block per anchored record, in worst-first order."""
    blocks = "\n".join(_detail(ordered[i], anchor, pictures.get((ordered[i].case_id, ordered[i].check), ""))
                       for i, anchor in anchors.items())
    return f'<h2>Case details</h2>\n<div id="details">\n{blocks}\n</div>'


def _detail(record: Record, anchor: str, picture: str) -> str:
    """Every field of `record`; message and repro in their own preformatted blocks; its picture."""
    rows = "".join(
        f"<tr><th>{label(c)}</th><td>{escape(_full(getattr(record, c)))}</td></tr>"
        for c in COLUMNS
        if c not in ("message", "repro")
    )
    ratio = format_metric(record.ratio) or "n/a"
    return (
        f'<details id="{escape(anchor)}" data-status="{record.status}">'
        f'<summary><span class="s-{record.status}">{record.status}</span> '
        f"<code>{escape(record.case_id)}</code> &middot; {escape(record.check)} &middot; ratio {ratio}</summary>"
        f'<table class="fields">{rows}</table>'
        f'<div>message</div><pre class="message">{escape(record.message)}</pre>'
        f'<div>repro</div><pre><code class="repro">{escape(record.repro)}</code></pre>'
        + (f'<div class="pictures">{picture}</div>' if picture else "")
        + "</details>"
    )
