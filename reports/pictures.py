"""Inline SVG pictures of where an error sits, for the worst cases of a report.

  heatmap_svg               |err| of every element of the flattened [out, prod(rest)] update,
                            on a log colour scale relative to the largest error
  singular_values_svg       singular values of the judged update against the oracle's, log scale

Plain SVG strings: no plotting library, no network, embeddable in a self-contained page.
"""

from __future__ import annotations

import math

import numpy as np

from reports.html_parts import escape

_DECADES = 6
"""The heatmap spans 6 decades below the largest error; smaller errors share the lightest colour."""


def _colour(level: float) -> str:
    """White (0) to dark red (1)."""
    level = min(1.0, max(0.0, level))
    red = 255 - int(115 * level)
    other = int(255 * (1.0 - level) ** 1.5)
    return f"rgb({red},{other},{other})"


def heatmap_svg(error: np.ndarray, *, cell: int = 0, title: str = "") -> str:
    """Heatmap of |error| for a matrix [m, n] (larger inputs are flattened to [shape[0], -1])."""
    err = np.abs(np.asarray(error, dtype=np.float64))
    err = err.reshape(err.shape[0], -1) if err.ndim != 2 else err
    m, n = err.shape
    cell = cell or max(2, min(16, 640 // max(n, 1), 320 // max(m, 1)))
    top = float(err.max(initial=0.0))
    rects = []
    for i in range(m):
        for j in range(n):
            value = err[i, j]
            level = 0.0 if top == 0.0 or value == 0.0 else 1.0 + math.log10(value / top) / _DECADES
            rects.append(f'<rect x="{j * cell}" y="{i * cell}" width="{cell}" height="{cell}" '
                         f'fill="{_colour(level)}"><title>[{i}, {j}] {value:.3g}</title></rect>')
    legend_y = m * cell + 14
    caption = escape(f"{title} |err|: max {top:.3g} (dark) down to {top * 10**-_DECADES:.1g} (white); "
                     f"rows = output channels")
    return (f'<svg class="heatmap" width="{max(n * cell, 320)}" '
            f'height="{legend_y + 6}" role="img">{"".join(rects)}'
            f'<text x="0" y="{legend_y}" font-size="11">{caption}</text></svg>')


def singular_values_svg(judged: np.ndarray, reference: np.ndarray, *, width: int = 360, height: int = 180) -> str:
    """Singular values (descending) of the judged update and the oracle's, on a log scale."""
    series = {"judged": np.asarray(judged, np.float64), "oracle": np.asarray(reference, np.float64)}
    positive = np.concatenate([s[s > 0] for s in series.values()])
    positive = positive if positive.size else np.array([1.0])  # all zero: any scale will do
    low, high = math.log10(positive.min()), math.log10(positive.max())
    span = max(high - low, 1e-12)
    count = max(len(s) for s in series.values())
    pad = 30

    def point(k: int, value: float) -> str:
        x = pad + (width - 2 * pad) * (k / max(count - 1, 1))
        y = height - pad - (height - 2 * pad) * ((math.log10(max(value, positive.min())) - low) / span)
        return f"{x:.1f},{y:.1f}"

    styles = {"judged": ("#b22222", "4 0"), "oracle": ("#1f4e9e", "5 3")}
    lines = []
    for name, values in series.items():
        colour, dash = styles[name]
        points = " ".join(point(k, v) for k, v in enumerate(values))
        lines.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5" '
                     f'stroke-dasharray="{dash}"><title>{name}</title></polyline>')
    labels = (f'<text x="2" y="{pad}" font-size="10">{10**high:.2g}</text>'
              f'<text x="2" y="{height - pad}" font-size="10">{10**low:.2g}</text>'
              f'<text x="{pad}" y="{height - 8}" font-size="11">singular values of the update: '
              f'<tspan fill="#b22222">judged</tspan> vs <tspan fill="#1f4e9e">oracle</tspan></text>')
    return (f'<svg class="singular-values" width="{width}" height="{height}" '
            f'role="img"><rect x="{pad}" y="{pad}" width="{width - 2 * pad}" height="{height - 2 * pad}" '
            f'fill="none" stroke="#ccc"/>{"".join(lines)}{labels}</svg>')


def case_pictures(where: str, error: np.ndarray, sv_judged: np.ndarray, sv_reference: np.ndarray) -> str:
    """Both pictures of one case's worst step, as one HTML fragment."""
    return (f"<div>worst step: {escape(where)}</div>" + heatmap_svg(error) + " "
            + singular_values_svg(sv_judged, sv_reference))
