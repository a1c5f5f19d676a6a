"""Hypothesis strategies over the same axes as the tiers, for property tests: each axis is drawn from
its domain in `AXES`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from cases import algorithms, axes, layouts
from cases.case import Case


@dataclass(frozen=True)
class Axis:
    """A `Case` field's domain, as the property tests draw it: `values` (the finite values the tiers and
    strategies use) and, for an open numeric axis, `span` (lo, hi) of what else may be drawn;
    `draw` says which: "values", "span", or "values|span" (either)."""

    field: str
    values: tuple[Any, ...]
    span: tuple[float, float] | None = None
    draw: str = "values"


AXES: dict[str, Axis] = {a.field: a for a in (
    Axis("optimizer", algorithms.names()),
    Axis("fraction", axes.FRACTIONS, (0.01, 1.0), "values|span"),
    Axis("scope", axes.SCOPES),
    Axis("layer", tuple(axes.all_layers())),
    Axis("megabatch", axes.MEGABATCH_SIZES),
    Axis("flatten", (False, True)),
    Axis("param_dtype", axes.DTYPES),
    Axis("compute_dtype", axes.DTYPES),
    Axis("orthogonalizer", axes.ORTHOGONALIZERS),  # Gram NS: cases of its own generator (axes.GRAM)
    Axis("adjust_lr", axes.ADJUST_LR),
    Axis("nesterov", (False, True)),
    Axis("weight_decay", axes.WEIGHT_DECAYS),
    Axis("lr", axes.LRS),
    *(Axis(name, values) for name, values in axes.HYPER_VALUES.items()),
    Axis("steps", axes.STEPS, (1, 3), "span"),
    Axis("grad", axes.GRADIENTS),
    Axis("seed", (0,), (0, 2**16), "span"),
    Axis("layout", layouts.LAYOUTS),
    Axis("world_size", (1, *layouts.NIGHTLY_WORLD_SIZES)),
    Axis("construct", axes.CONSTRUCTIONS[:1]),  # a defaults case holds a target's defaults: its own tier's rows
)}
"""Every `Case` field's drawn domain (tensor-parallel layouts are spelled by cases/layouts.py, not listed)."""


def axis(field: str) -> st.SearchStrategy[Any]:
    """A draw of `field` from its schema domain: its values (booleans for a boolean axis), its span, or either."""
    domain = AXES[field]
    if domain.values == (False, True):
        return st.booleans()
    values = st.sampled_from(domain.values)
    if domain.span is None:
        return values
    lo, hi = domain.span
    span = st.integers(int(lo), int(hi)) if isinstance(lo, int) and isinstance(hi, int) else st.floats(lo, hi)
    return {"values": values, "span": span, "values|span": values | span}[domain.draw]


@st.composite
def cases(draw: st.DrawFn, layers: tuple[str, ...] = tuple(axes.LAYERS),
          grads: tuple[str, ...] = axes.GRADIENTS, optimizers: tuple[str, ...] = ("muon",)) -> Case:
    """Any valid CI-sized case, dtype pairs and orthogonalizers as the tiers pair them; a selecting
    optimizer (Dion2, NorDion2) draws its fraction from (0, 1] and has no Nesterov form."""
    layer = draw(st.sampled_from(layers))
    ndim = len(axes.all_layers()[layer][1])
    orth = draw(axis("orthogonalizer"))
    param_dtype, compute_dtype = draw(st.sampled_from([p for p in axes.DTYPE_PAIRS if axes.compute_ok(orth, p[1])]))
    optimizer = draw(st.sampled_from(optimizers))
    selecting = algorithms.entry(optimizer).selecting
    fraction = draw(axis("fraction")) if selecting else None
    return Case(layer=layer, megabatch=draw(axis("megabatch")),
                flatten=draw(axis("flatten")) if ndim > 2 else False,
                param_dtype=param_dtype, compute_dtype=compute_dtype,
                orthogonalizer=orth, adjust_lr=draw(axis("adjust_lr")),
                nesterov=False if selecting else draw(axis("nesterov")), weight_decay=draw(axis("weight_decay")),
                steps=draw(axis("steps")), grad=draw(st.sampled_from(grads)),
                seed=draw(axis("seed")), optimizer=optimizer, fraction=fraction)
