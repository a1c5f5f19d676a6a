"""How error/tolerance ratios move over many stored runs, as one self-contained HTML page.

`render_trend_html` orders the runs by their context's `date` and follows every
series (one `Record.key`: case, check, target, backend, world size) across them:
a table of the runs, the worst and the most changed series with a sparkline each,
and per check an inline SVG chart of the largest and the median ratio per run on a
log scale, with the tolerance (ratio 1) marked. No JavaScript library, no network.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from reports.html_parts import BASE_CSS, case_id_html, context_list, data_value, escape, label, page
from reports.records import Record, format_metric, group_by, worst_ratio

Run = tuple[dict[str, Any], list[Record]]
"""(context as from `load_run`, records) of one stored run."""

SERIES_ROWS = 25
"""Rows in each of the worst and most-changed tables."""

SERIES_COLUMNS = ("case_id", "check", "backend", "world_size", "runs", "first", "last", "max", "change")
NUMERIC_COLUMNS = frozenset({"world_size", "runs", "first", "last", "max", "change"})
LINE_COLOURS = {"max": "#8b0000", "median": "#1f5fa8"}

_CSS = BASE_CSS + """
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg .grid { stroke: #ddd; }
svg .tolerance { stroke: #8b0000; stroke-dasharray: 4 3; }
figure { margin: 0.5rem 0 1.5rem; }
"""


def render_trend_html(runs: list[Run]) -> str:
    """The trend page of `runs`, oldest first by context `date` (runs without one first)."""
    ordered = sorted(runs, key=lambda run: str(run[0].get("date", "")))
    dates = [str(ctx.get("date", "")) for ctx, _ in ordered]
    series = _series([records for _, records in ordered])
    stats = [_stats(key, values) for key, values in series.items()]
    worst = sorted(stats, key=lambda s: _desc(s["last"]))[:SERIES_ROWS]
    changed = sorted(stats, key=lambda s: _desc(s["change"]))[:SERIES_ROWS]
    body = "\n".join((
        f"<h1>Muon conformance trend over {len(ordered)} runs</h1>",
        context_list([("first", escape(dates[0] if dates else "")), ("last", escape(dates[-1] if dates else "")),
                      ("series", str(len(series)))]),
        _runs_table(ordered),
        _series_table("worst", "Worst series (largest most recent ratio)", worst, series),
        _series_table("changed", "Most changed series (latest over first ratio, either way)", changed, series),
        _charts(ordered, dates),
    ))
    return page(f"Muon conformance trend over {len(ordered)} runs", _CSS, body)


def repeated(contexts: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """Pairs (i, j), i < j, of contexts (as from `load_run`) of one stored run: the same directory, or
    a copy (every other context entry equal: date, duration to the last digit, results digests)."""
    def identity(ctx: dict[str, Any]) -> tuple[str | None, str]:
        rest = {k: v for k, v in ctx.items() if k != "path"}
        where = str(Path(ctx["path"]).resolve()) if "path" in ctx else None
        return where, json.dumps(rest, sort_keys=True, default=str)

    keys = [identity(ctx) for ctx in contexts]
    return [(i, j) for j in range(len(keys)) for i in range(j)
            if (keys[i][0] is not None and keys[i][0] == keys[j][0]) or keys[i][1] == keys[j][1]]


def _series(runs: list[list[Record]]) -> dict[tuple, list[float]]:
    """Ratio of every key in every run, NaN where the run lacks the key or a ratio."""
    series: dict[tuple, list[float]] = {}
    for i, records in enumerate(runs):
        for r in records:
            series.setdefault(r.key, [math.nan] * len(runs))[i] = r.ratio
    return series


def _stats(key: tuple, values: list[float]) -> dict[str, object]:
    """Table row of one series; `change` is the factor between the first and the latest ratio, >= 1."""
    finite = [v for v in values if math.isfinite(v)]
    first, last = (finite[0], finite[-1]) if finite else (math.nan, math.nan)
    case_id, check, _target, backend, world_size = key
    return {"key": key, "case_id": case_id, "check": check, "backend": backend, "world_size": world_size,
            "runs": len(finite), "first": first, "last": last, "max": max(finite, default=math.nan),
            "change": _change(first, last)}


def _change(first: float, last: float) -> float:
    """Factor between two ratios, at least 1: inf from or to zero, NaN unless both exist."""
    if math.isnan(first) or math.isnan(last):
        return math.nan
    if first == last:
        return 1.0
    if first == 0 or last == 0:
        return math.inf
    return max(last / first, first / last)


def _desc(value: object) -> float:
    """Sort key putting larger values first and NaN last."""
    return math.inf if math.isnan(value) else -value


def _runs_table(ordered: list[Run]) -> str:
    rows = []
    for i, (ctx, records) in enumerate(ordered, 1):
        failing = sum(r.failing for r in records)
        rows.append(
            f'<tr><td class="num">{i}</td><td>{escape(ctx.get("date", ""))}</td>'
            f'<td>{escape(ctx.get("commit", ""))}</td><td>{escape(ctx.get("target", ""))}</td>'
            f'<td class="num">{len(records)}</td><td class="num">{failing}</td>'
            f'<td class="num">{format_metric(worst_ratio(records))}</td></tr>'
        )
    return (
        '<h2>Runs</h2>\n<table id="runs"><thead><tr><th>#</th><th>date</th><th>commit</th><th>target</th>'
        f"<th>records</th><th>failing</th><th>worst ratio</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _series_table(name: str, title: str, rows: list[dict[str, object]], series: dict[tuple, list[float]]) -> str:
    head = "".join(
        f'<th data-key="{c}" data-kind="{"num" if c in NUMERIC_COLUMNS else "text"}">{label(c)}</th>'
        for c in SERIES_COLUMNS
    ) + "<th>ratio per run</th>"
    body = "\n".join(_series_row(row, series[row["key"]]) for row in rows)
    return (
        f'<h2>{escape(title)}</h2>\n<table id="series-{name}" class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>\n{body}\n</tbody></table>"
    )


def _series_row(row: dict[str, object], values: list[float]) -> str:
    attrs = "".join(f' data-{c}="{escape(data_value(row[c]))}"' for c in SERIES_COLUMNS)
    cells = "".join(
        f'<td class="num">{format_metric(row[c]) if isinstance(row[c], float) else row[c]}</td>'
        if c in NUMERIC_COLUMNS else f"<td>{case_id_html(str(row[c]))}</td>" if c == "case_id"
        else f"<td>{escape(row[c])}</td>"
        for c in SERIES_COLUMNS
    )
    return f"<tr{attrs}>{cells}<td>{_sparkline(values)}</td></tr>"


def _charts(ordered: list[Run], dates: list[str]) -> str:
    """One chart per check: max and median finite ratio of each run."""
    per_check: dict[str, dict[str, list[float]]] = {}
    for i, (_, records) in enumerate(ordered):
        for check, group in group_by(records, "check").items():
            lines = per_check.setdefault(check, {"max": [math.nan] * len(ordered),
                                                 "median": [math.nan] * len(ordered)})
            ratios = [r.ratio for r in group if math.isfinite(r.ratio)]
            if ratios:
                lines["max"][i], lines["median"][i] = max(ratios), statistics.median(ratios)
    figures = "\n".join(
        f'<figure id="chart-{escape(check)}"><figcaption>{escape(check)}: max and median ratio per run'
        f"</figcaption>{_chart(lines, dates)}</figure>"
        for check, lines in sorted(per_check.items())
    )
    return f"<h2>Ratio per run, by check</h2>\n{figures}"


class _LogScale:
    """Maps ratios to y pixels on whole decades covering `values` and 1 (the tolerance)."""

    def __init__(self, values: list[float], top: float, bottom: float) -> None:
        positive = [v for v in values if math.isfinite(v) and v > 0] + [1.0]
        self.lo = math.floor(math.log10(min(positive)))
        self.hi = max(math.ceil(math.log10(max(positive))), self.lo + 1)
        self.top, self.bottom = top, bottom

    def y(self, value: float) -> float:
        """Pixel of `value`; zero and below sit on the bottom edge."""
        exponent = math.log10(value) if value > 0 else self.lo
        return self.bottom - (exponent - self.lo) / (self.hi - self.lo) * (self.bottom - self.top)


def _x(i: int, n: int, left: float, right: float) -> float:
    return (left + right) / 2 if n == 1 else left + i * (right - left) / (n - 1)


def _path(points: list[tuple[float, float] | None]) -> str:
    """SVG path data through `points`, broken where a point is None."""
    parts, pen_down = [], False
    for point in points:
        if point is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{point[0]:.1f},{point[1]:.1f}")
        pen_down = True
    return " ".join(parts)


def _points(values: list[float], scale: _LogScale, left: float, right: float) -> list[tuple[float, float] | None]:
    return [(_x(i, len(values), left, right), scale.y(v)) if math.isfinite(v) else None
            for i, v in enumerate(values)]


def _chart(lines: dict[str, list[float]], dates: list[str]) -> str:
    """A log-scale line chart, one line per entry of `lines`, x = run in date order."""
    width, height, left, right, top, bottom = 640, 270, 56, 590, 12, 220
    scale = _LogScale([v for values in lines.values() for v in values], top, bottom)
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">']
    for exponent in range(scale.lo, scale.hi + 1):
        y = scale.y(10.0 ** exponent)
        parts.append(f'<line class="grid" x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">1e{exponent}</text>')
    y1 = scale.y(1.0)
    parts.append(f'<line class="tolerance" x1="{left}" x2="{right}" y1="{y1:.1f}" y2="{y1:.1f}"/>')
    step = max(1, math.ceil(len(dates) / 8))
    for i in range(0, len(dates), step):
        parts.append(f'<text x="{_x(i, len(dates), left, right):.1f}" y="{bottom + 18}" '
                     f'text-anchor="middle">{escape(dates[i][:10])}</text>')
    for n, (name, values) in enumerate(lines.items()):
        colour = LINE_COLOURS.get(name, "#333")
        points = _points(values, scale, left, right)
        parts.append(f'<path d="{_path(points)}" fill="none" stroke="{colour}" stroke-width="2" data-line="{name}"/>')
        parts += [
            f'<circle cx="{p[0]:.1f}" cy="{p[1]:.1f}" r="3" fill="{colour}">'
            f"<title>{escape(dates[i])}: {name} {format_metric(values[i])}</title></circle>"
            for i, p in enumerate(points) if p is not None
        ]
        parts.append(_legend_item(left + 110 * n, bottom + 42, f'stroke="{colour}" stroke-width="2"', name))
    parts.append(_legend_item(left + 110 * len(lines), bottom + 42, 'class="tolerance"', "tolerance (ratio 1)"))
    return "".join(parts) + "</svg>"


def _legend_item(x: float, y: float, line_attrs: str, text: str) -> str:
    return (f'<line {line_attrs} x1="{x}" x2="{x + 20}" y1="{y - 4}" y2="{y - 4}"/>'
            f'<text x="{x + 26}" y="{y}">{text}</text>')



def _sparkline(values: list[float]) -> str:
    """A small log-scale line of one series, the tolerance dashed."""
    width, height = 120, 24
    scale = _LogScale(values, 2, height - 2)
    y1 = scale.y(1.0)
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" class="spark">'
        f'<line class="tolerance" x1="0" x2="{width}" y1="{y1:.1f}" y2="{y1:.1f}"/>'
        f'<path d="{_path(_points(values, scale, 2, width - 2))}" fill="none" stroke="#1f5fa8" stroke-width="1.5"/>'
        "</svg>"
    )
