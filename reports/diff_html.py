"""The diff of two runs as one self-contained HTML page and as a short Markdown summary.

`render_diff_html` shows both runs' context, a count per category and a section
per category (see `reports.diff`) whose rows sort on header click and filter by
text and by column, like report.html. `render_diff_markdown` is the CI job
summary: the verdict, the counts and at most `max_rows` worst rows per category;
its size is bounded by `max_rows`, never by the number of records.
"""

from __future__ import annotations

import math
from typing import Any

from reports.diff import CATEGORIES, Diff, Pair, growth_factor, is_regression
from reports.html_parts import BASE_CSS, case_id_html, data_value, escape, label, page
from reports.markdown import cell_text, code_span
from reports.records import CodeIdentity, format_metric, harness_text

DESCRIPTIONS = {
    "new_failures": "fail or error in head; pass, unsupported or skipped in base, or not run there",
    "error_grew": "same status (pass or fail) in both, and the ratio grew more than {growth:g}x, above {floor:g}",
    "status_changed": "any other change of status; a pass that became unsupported or skipped is a regression",
    "vanished": "run in base only: the check no longer runs; a pass that vanished is a regression",
    "appeared": "run in head only, not failing",
    "tolerance_changed": "tolerance or its source differs (whatever the status)",
    "error_shrank": "same status (pass or fail) in both, and the ratio shrank more than {growth:g}x, "
                    "from above {floor:g}",
    "fixed": "fail or error in base, pass in head",
}
"""What each category holds, for both renderings; formatted with the diff's growth and floor."""

ACROSS_BACKENDS = (
    "Paired across backends: each check of a case in base meets the same check of the same case and world "
    "size in head. Compared: each run's verdict and error ratio against the same FP64 reference; tolerance: "
    "each record's own (its device class's measured policy, so a cpu/gloo record and a cuda/nccl one may "
    "differ: listed under tolerance changed). A difference beyond tolerance is a check that passes on one "
    "backend and fails or errors on the other (new failures, the only regressions here; fixed); a status "
    "that changed otherwise or a ratio that grew more than {growth:g}x is listed, not charged (a relation exact "
    "on one backend may be inexact or ill-posed with the other's kernels); why is the failing record's message. Two passing records' updates are "
    "within rel_err(base) + rel_err(head) of each other, relative to the reference update."
)
"""The paragraph both renderings put first in a diff across backends."""

CONTEXT_KEYS = ("path", "judged", "target", "tier", "date", "harness", "torch_version", "python_version", "device",
                "platform", "backends", "world_sizes", "records")
"""Context entries compared side by side, in display order, where either run has them."""
CONTEXT_LABELS = {"judged": "judged code"}
"""Names shown for context entries whose key alone would not say what they hold."""

ROW_COLUMNS = {"case_id": "case_id", "check": "check", "backend": "backend", "status": "head_status",
                 "base_ratio": "base_ratio", "head_ratio": "head_ratio", "growth": "growth",
                 "tolerance": "head_tolerance", "note": "note"}
"""Columns of every category table, each with the row data attribute (`_row_values`) its header sorts
by; every value of a row is such an attribute. A row fits one or two lines at 1,400 px: status reads
"base -> head", tolerance one value or "base -> head" where it changed, the world size is in the case
id, the note is one line (all of it on hover)."""

NUMERIC_COLUMNS = frozenset({"world_size", "base_ratio", "head_ratio", "growth", "base_tolerance", "head_tolerance"})
FILTER_COLUMNS = ("check", "backend", "base_status", "head_status", "regression")
ABSENT = "absent"
NOTE_CHARS = 200
MD_CELL_CHARS = 120

_CSS = BASE_CSS + """
.s-absent { color: #555; font-style: italic; }
h1.regressed { color: #8b0000; }
h1.ok { color: #115e11; }
tr.regression td:first-child { border-left: 4px solid #8b0000; }
td.changed { background: #fff3c4; }
td.case-id { font-size: 0.8rem; }
td.transition { white-space: nowrap; }
section { margin-top: 1.2rem; }
"""


def render_diff_html(diff: Diff, base_ctx: dict[str, Any], head_ctx: dict[str, Any]) -> str:
    """The whole diff as one self-contained HTML document (no external resources)."""
    verdict = _verdict(diff)
    same = same_code_note(base_ctx, head_ctx)
    body = "\n".join((
        f'<h1 class="{verdict.lower()}">{verdict}: diff of two conformance runs</h1>',
        _context_table(base_ctx, head_ctx),
        f'<p id="same-code">{escape(same)}</p>' if same else "",
        f"<p id=\"pairing\">{escape(ACROSS_BACKENDS.format(growth=diff.growth))}</p>" if diff.across_backends else "",
        _count_table(diff),
        _filters(diff),
        *(_section(diff, name, pairs) for name, pairs in diff.categories().items()),
    ))
    return page(f"Muon conformance diff: {verdict}", _CSS, body)


def render_diff_markdown(
    diff: Diff, base_ctx: dict[str, Any], head_ctx: dict[str, Any], artifact: str = "diff.html", *,
    max_rows: int = 15,
) -> str:
    """The CI summary: REGRESSED or OK, counts, the worst `max_rows` rows per category; no links."""
    verdict = _verdict(diff)
    parts = [
        f"# {verdict}: conformance diff, head {_commit(head_ctx)} against base {_commit(base_ctx)}",
        _md_context("Base", base_ctx) + "  \n" + _md_context("Head", head_ctx),
        *([cell_text(same)] if (same := same_code_note(base_ctx, head_ctx)) else []),
        *([cell_text(ACROSS_BACKENDS.format(growth=diff.growth))] if diff.across_backends else []),
        _md_counts(diff),
        *(_md_section(diff, name, pairs, max_rows, artifact) for name, pairs in diff.categories().items() if pairs),
        f"Full diff: {code_span(artifact)} (HTML artifact of this job).",
    ]
    return "\n\n".join(parts) + "\n"


def _verdict(diff: Diff) -> str:
    return "REGRESSED" if diff.regressed else "OK"


def same_code_note(base_ctx: dict[str, Any], head_ctx: dict[str, Any]) -> str:
    """A sentence when both runs judged the same code (`CodeIdentity.same_code`), else ""."""
    base, head = (CodeIdentity.from_context(ctx.get("judged")) for ctx in (base_ctx, head_ctx))
    if not base.same_code(head):
        return ""
    return (f"Base and head judged the same code, {head.named()}: what differs between them comes from the "
            f"harness, torch or the machine, not from the judged code.")


def _commit(ctx: dict[str, Any]) -> str:
    """The judged code's commit (12 digits, dirty marked), or for a run stored before schema version 6
    the commit it recorded."""
    judged = CodeIdentity.from_context(ctx.get("judged"))
    if judged.commit:
        return judged.commit[:12] + (" (dirty)" if judged.dirty else "")
    return cell_text(ctx.get("commit") or "unknown")


def _regression_counts(diff: Diff) -> dict[str, int]:
    counts = {name: 0 for name in CATEGORIES}
    for name, _ in diff.regressions():
        counts[name] += 1
    return counts


def _describe(diff: Diff, name: str) -> str:
    return DESCRIPTIONS[name].format(growth=diff.growth, floor=diff.floor)


def _context_value(ctx: dict[str, Any], key: str) -> str:
    if key == "judged":
        return CodeIdentity.from_context(ctx.get(key)).named() if key in ctx else ""
    if key == "harness":
        return harness_text(CodeIdentity.from_context(ctx.get(key)), ctx.get("commit", "")) \
            if key in ctx or "commit" in ctx else ""
    value = ctx.get(key, "")
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def _context_table(base_ctx: dict[str, Any], head_ctx: dict[str, Any]) -> str:
    """Base and head context side by side; differing values highlighted."""
    rows = []
    for key in CONTEXT_KEYS:
        old, new = _context_value(base_ctx, key), _context_value(head_ctx, key)
        if old or new:
            changed = ' class="changed"' if old != new else ""
            rows.append(f'<tr><th>{CONTEXT_LABELS.get(key, label(key))}</th><td>{escape(old)}</td>'
                        f'<td{changed}>{escape(new)}</td></tr>')
    return (
        '<h2>Runs</h2>\n<table id="runs"><thead><tr><th></th><th>base</th><th>head</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _count_table(diff: Diff) -> str:
    """Pairs and regressions per category, each linking to its section."""
    regressions = _regression_counts(diff)
    rows = "".join(
        f'<tr data-category="{name}"><td><a href="#cat-{name}">{label(name)}</a></td>'
        f'<td class="num" data-count="pairs">{len(pairs)}</td>'
        f'<td class="num" data-count="regressions">{regressions[name]}</td>'
        f"<td>{escape(_describe(diff, name))}</td></tr>"
        for name, pairs in diff.categories().items()
    )
    return (
        f"<h2>Summary</h2>\n<p>{diff.compared} keys in both runs.</p>\n"
        '<table id="counts"><thead><tr><th>category</th><th>count</th><th>regressions</th><th>meaning</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>"
    )


def _row_values(name: str, pair: Pair, across: bool = False) -> dict[str, object]:
    """Raw values of one table row; `regression` is a filter-only attribute."""
    base, head = pair
    some = head if head is not None else base
    return {
        "case_id": some.case_id,
        "check": some.check,
        "backend": some.backend if base is None or head is None or base.backend == head.backend
        else f"{base.backend} \u2192 {head.backend}",
        "world_size": some.world_size,
        "base_status": base.status if base else ABSENT,
        "head_status": head.status if head else ABSENT,
        "base_ratio": base.ratio if base else math.nan,
        "head_ratio": head.ratio if head else math.nan,
        "growth": growth_factor(pair),
        "base_tolerance": base.tolerance if base else math.nan,
        "head_tolerance": head.tolerance if head else math.nan,
        "note": _note(pair),
        "regression": "yes" if is_regression(name, pair, across) else "no",
    }


def _note(pair: Pair) -> str:
    """The failing record's message (head's when both fail or neither does), else the other's."""
    base, head = pair
    if base is not None and base.failing and not (head is not None and head.failing):
        return base.message or (head.message if head else "")
    return (head.message if head else "") or (base.message if base else "")


def _filters(diff: Diff) -> str:
    """Free-text filter box and one <select> per `FILTER_COLUMNS` entry, options from the data."""
    values: dict[str, set[str]] = {column: set() for column in FILTER_COLUMNS}
    for name, pairs in diff.categories().items():
        for pair in pairs:
            row = _row_values(name, pair, diff.across_backends)
            for column in FILTER_COLUMNS:
                values[column].add(str(row[column]))
    controls = ['<label>text <input id="filter-text" type="search" placeholder="filter rows"></label>']
    for column in FILTER_COLUMNS:
        options = "".join(f'<option value="{escape(v)}">{escape(v)}</option>' for v in sorted(values[column]))
        controls.append(
            f'<label>{label(column)} <select id="filter-{column}" data-filter="{column}">'
            f'<option value="">all</option>{options}</select></label>'
        )
    return f'<h2>Changes</h2>\n<div id="filters">{"".join(controls)}<span id="shown"></span></div>'


def _section(diff: Diff, name: str, pairs: list[Pair]) -> str:
    """One category: heading with its count, what it means, and its rows worst first."""
    heading = f'<section id="cat-{name}"><h2>{label(name)} ({len(pairs)})</h2><p>{escape(_describe(diff, name))}</p>'
    if not pairs:
        return heading + "<p>none</p></section>"
    head = "".join(
        f'<th data-key="{key}" data-kind="{"num" if key in NUMERIC_COLUMNS else "text"}">{label(c)}</th>'
        for c, key in ROW_COLUMNS.items()
    )
    rows = "\n".join(_row(name, pair, diff.across_backends) for pair in pairs)
    return (
        f'{heading}<table id="table-{name}" class="sortable filterable"><thead><tr>{head}</tr></thead>'
        f"<tbody>\n{rows}\n</tbody></table></section>"
    )


def _row(name: str, pair: Pair, across: bool = False) -> str:
    values = _row_values(name, pair, across)
    attrs = "".join(f' data-{c}="{escape(data_value(v))}"' for c, v in values.items())
    regression = ' class="regression"' if values["regression"] == "yes" else ""
    return f"<tr{regression}{attrs}>{''.join(_cell(c, values) for c in ROW_COLUMNS)}</tr>"


def _cell(column: str, values: dict[str, object]) -> str:
    if column == "status":
        base, head = (f'<span class="s-{escape(values[k])}">{escape(values[k])}</span>'
                      for k in ("base_status", "head_status"))
        return f'<td class="transition">{base} \u2192 {head}</td>'
    if column == "tolerance":
        base, head = (format_metric(values[k]) for k in ("base_tolerance", "head_tolerance"))
        shown = f"{base} \u2192 {head}" if base and head and base != head else head or base
        return f'<td class="num">{shown}</td>'
    value = values[column]
    if column == "note":
        text = str(value)
        short = text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS] + "\u2026"
        return f'<td title="{escape(text)}"><div class="clip">{escape(short)}</div></td>'
    if column == "case_id":
        return f'<td class="case-id">{case_id_html(str(value))}</td>'
    if column in NUMERIC_COLUMNS:
        shown = format_metric(value) if isinstance(value, float) else str(value)
        return f'<td class="num">{shown}</td>'
    return f"<td>{escape(value)}</td>"


def _md_context(name: str, ctx: dict[str, Any]) -> str:
    values = ((k, _context_value(ctx, k)) for k in ("judged", "harness", "date", "device", "records"))
    return f"{name}: " + " · ".join(f"{CONTEXT_LABELS.get(k, label(k))} {cell_text(v)}" for k, v in values if v)


def _md_counts(diff: Diff) -> str:
    regressions = _regression_counts(diff)
    lines = ["| category | count | regressions |", "|---|---:|---:|"]
    lines += [f"| {label(n)} | {len(p)} | {regressions[n]} |" for n, p in diff.categories().items()]
    return "\n".join(lines)


def _md_section(diff: Diff, name: str, pairs: list[Pair], max_rows: int, artifact: str) -> str:
    across = diff.across_backends
    lines = [
        f"## {label(name)} ({min(max_rows, len(pairs))} of {len(pairs)})",
        "",
        cell_text(_describe(diff, name)),
        "",
        "| case id | check | backend | base | head | base ratio | head ratio | growth |"
        + (" base tolerance | head tolerance | why |" if across else ""),
        "|---|---|---|---|---|---:|---:|---:|" + ("---:|---:|---|" if across else ""),
    ]
    lines += [_md_row(_row_values(name, pair, across), across) for pair in pairs[:max_rows]]
    if len(pairs) > max_rows:
        lines += ["", f"+{len(pairs) - max_rows} more in {code_span(artifact)}."]
    return "\n".join(lines)


def _md_row(v: dict[str, object], across: bool = False) -> str:
    cells = (
        code_span(_clip(str(v["case_id"]))), cell_text(_clip(str(v["check"]))), cell_text(v["backend"]),
        str(v["base_status"]), str(v["head_status"]),
        format_metric(v["base_ratio"]), format_metric(v["head_ratio"]), format_metric(v["growth"]),
    )
    if across:
        cells += (format_metric(v["base_tolerance"]), format_metric(v["head_tolerance"]),
                  cell_text(_clip(str(v["note"]))))
    return "| " + " | ".join(cells) + " |"


def _clip(text: str) -> str:
    return text if len(text) <= MD_CELL_CHARS else text[:MD_CELL_CHARS] + "\u2026"
