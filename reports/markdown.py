"""A short Markdown summary of a run, for a CI job summary.

`render_markdown` gives the verdict, status counts, the worst ratio per
parameter dtype and at most `max_rows` worst records (rel_err next to the whole
allowance and the policy's rtol, reports.derived; failing ones with their
diagnosis, clipped to `DIAGNOSIS_CHARS`), then names the HTML
artifact that holds everything else. Its size is bounded by `max_rows` and
the number of distinct dtypes, never by the number of records.
"""

from __future__ import annotations

import html
import math
import re

from reports import tp_table
from reports.derived import allowed, title
from reports.records import (STATUSES, Record, RunInfo, format_metric, group_by, harness_text, status_counts, worst_first,
                             worst_ratio)

DIAGNOSIS_CHARS = 160
"""Characters of a diagnosis shown in a table cell (the report's details hold all of it)."""


def render_markdown(
    records: list[Record], info: RunInfo, *, max_rows: int = 20, artifact: str = "report.html"
) -> str:
    """The summary, headed by the report title (reports.derived: verdict, target, tier); no links."""
    ordered = worst_first(records)
    failing = [r for r in ordered if r.failing]
    parts = (
        f"# {cell_text(title(records, info))}",
        _context(info),
        _status_table(records),
        _dtype_table(records),
        _worst_table(ordered, failing, max_rows),
        *_tp_section(records),
        f"Full report: {code_span(artifact)} (HTML artifact of this job).",
    )
    return "\n\n".join(parts) + "\n"


def _tp_section(records: list[Record]) -> tuple[str, ...]:
    """The TP-dependence table (reports/tp_table.py) when the run holds a tensor-parallel record."""
    data = tp_table.load() if tp_table.has_tp(records) else None
    return (tp_table.markdown(data),) if data else ()


def cell_text(value: object) -> str:
    """Plain text safe in a Markdown table cell: HTML-escaped, pipes escaped."""
    return html.escape(str(value), quote=False).replace("|", "\\|")


def code_span(value: str) -> str:
    """`value` as an inline code span, fenced longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    body = value.replace("|", "\\|")
    return f"{fence}{pad}{body}{pad}{fence}"


def _context(info: RunInfo) -> str:
    return (
        f"Backends: {cell_text(info.backends)} · torch {cell_text(info.torch_version)} · "
        f"judged code {cell_text(info.judged.named())} · harness {cell_text(harness_text(info.harness, info.commit))} · "
        f"started {cell_text(info.started)} · {info.seconds:.1f} s"
    )


def _status_table(records: list[Record]) -> str:
    counts = status_counts(records)
    lines = ["| status | count |", "|---|---:|"]
    lines += [f"| {s} | {counts[s]} |" for s in STATUSES]
    lines.append(f"| total | {len(records)} |")
    return "\n".join(lines)


def _dtype_table(records: list[Record]) -> str:
    """Worst ratio per param dtype, with how many of its records fail."""
    lines = ["| param dtype | worst ratio | failing | records |", "|---|---:|---:|---:|"]
    for dtype, group in group_by(records, "param_dtype").items():
        worst = format_metric(worst_ratio(group)) or "n/a"
        failing = sum(r.failing for r in group)
        lines.append(f"| {cell_text(dtype)} | {worst} | {failing} | {len(group)} |")
    return "\n".join(lines)


def _worst_table(ordered: list[Record], failing: list[Record], max_rows: int) -> str:
    """Up to `max_rows` worst failing records, or the worst by ratio when none fails."""
    if failing:
        title, rows = f"## Worst failing records ({min(max_rows, len(failing))} of {len(failing)})", failing
    else:
        rows = [r for r in ordered if not math.isnan(r.ratio)]
        title = f"## Worst records by ratio ({min(max_rows, len(rows))} of {len(rows)}, none failing)"
    diagnosed = bool(failing)
    lines = [title, "", "A check passes iff rel_err <= allowed (rtol plus the storage-rounding term; rtol alone "
             "is the policy's share).", "", "| status | case id | check | ratio | rel_err | allowed | rtol |"
             + (" diagnosis |" if diagnosed else ""), "|---|---|---|---:|---:|---:|---:|" + ("---|" if diagnosed else "")]
    lines += [
        f"| {r.status} | {code_span(r.case_id)} | {cell_text(r.check)} | {format_metric(r.ratio)} | "
        f"{format_metric(r.rel_err)} | {format_metric(allowed(r))} | {format_metric(r.tolerance)} |"
        + (f" {cell_text(_clip(r.diagnosis))} |" if diagnosed else "")
        for r in rows[:max_rows]
    ]
    return "\n".join(lines)


def _clip(text: str) -> str:
    return text if len(text) <= DIAGNOSIS_CHARS else text[:DIAGNOSIS_CHARS] + "\u2026"
