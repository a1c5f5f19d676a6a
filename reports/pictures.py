"""Inline SVG pictures of where an error sits, for the worst cases of a report.

  heatmap_svg               |err| of every element of the flattened [out, prod(rest)] update,
                            on a log colour scale relative to the largest error
  singular_values_svg       singular values of the judged update against the oracle's, log scale,
                            the axis labelled at every power of ten in range (and at both ends,
                            with as many digits as it takes to tell them apart)
  case_pictures             both, each in a <figure> whose caption is HTML text, so it wraps
                            instead of being clipped by the picture's width

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


def heatmap_svg(error: np.ndarray, *, cell: int = 0) -> str:
    """Heatmap of |error| for a matrix [m, n] (larger inputs are flattened to [shape[0], -1]);
    the caption is `heatmap_caption`'s, outside the picture."""
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
    return (f'<svg class="heatmap" width="{n * cell}" height="{m * cell}" role="img" '
            f'aria-label="|err| per element">{"".join(rects)}</svg>')


def heatmap_caption(error: np.ndarray) -> str:
    """What the heatmap's colours mean, as plain text."""
    top = float(np.max(np.abs(np.asarray(error, dtype=np.float64)), initial=0.0))
    return (f"|err| per element of the update, [output channels, prod(rest)]: max {top:.3g} (dark red) "
            f"down to {top * 10**-_DECADES:.1g} and below (white)")


def singular_values_svg(judged: np.ndarray, reference: np.ndarray, *, width: int = 360, height: int = 180) -> str:
    """Singular values (descending) of the judged update and the oracle's, on a log scale."""
    series = {"judged": np.asarray(judged, np.float64), "oracle": np.asarray(reference, np.float64)}
    positive = np.concatenate([s[s > 0] for s in series.values()])
    positive = positive if positive.size else np.array([1.0])  # all zero: any scale will do
    low, high = math.log10(positive.min()), math.log10(positive.max())
    span = max(high - low, 1e-12)
    count = max(len(s) for s in series.values())
    pad = 40

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
    ticks = []
    for value, text in axis_labels(10**low, 10**high):
        y = height - pad - (height - 2 * pad) * ((math.log10(value) - low) / span)
        ticks.append(f'<line x1="{pad - 3}" y1="{y:.1f}" x2="{width - pad}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{pad - 5}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{text}</text>')
    legend = (f'<text x="{pad}" y="{height - 8}" font-size="11">'
              f'<tspan fill="#b22222">judged</tspan> vs <tspan fill="#1f4e9e">oracle</tspan>, largest first</text>')
    return (f'<svg class="singular-values" width="{width}" height="{height}" role="img" '
            f'aria-label="singular values">{"".join(ticks)}<rect x="{pad}" y="{pad}" width="{width - 2 * pad}" '
            f'height="{height - 2 * pad}" fill="none" stroke="#ccc"/>{"".join(lines)}{legend}</svg>')


def axis_labels(low: float, high: float) -> list[tuple[float, str]]:
    """(value, SVG text) labels of a log axis from `low` to `high` (> 0), ascending: every power of
    ten in range, written 10^k; where fewer than two fall in range, the two ends as well, each with
    the fewest significant digits (2 to 6) that tell them apart."""
    decades = [10.0**k for k in range(math.ceil(math.log10(low) - 1e-9), math.floor(math.log10(high) + 1e-9) + 1)]
    labels = [(v, f'10<tspan dy="-4" font-size="8">{round(math.log10(v))}</tspan>') for v in decades]
    if len(decades) >= 2:
        return labels
    if high <= low:
        return labels or [(low, f"{low:.3g}")]
    digits = next((d for d in range(2, 7) if f"{low:.{d}g}" != f"{high:.{d}g}"), 6)
    ends = [(v, f"{v:.{digits}g}") for v in (low, high) if not any(math.isclose(v, d) for d in decades)]
    return sorted(labels + ends)


def case_pictures(where: str, error: np.ndarray, sv_judged: np.ndarray, sv_reference: np.ndarray) -> str:
    """Both pictures of one case's worst step, as one HTML fragment of two captioned figures."""
    return (f"<div>worst step: {escape(where)}</div>"
            f'<figure>{heatmap_svg(error)}<figcaption>{escape(heatmap_caption(error))}</figcaption></figure>'
            f"<figure>{singular_values_svg(sv_judged, sv_reference)}"
            f"<figcaption>singular values of the update (log scale)</figcaption></figure>")
