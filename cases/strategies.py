"""Hypothesis strategies over the same axes as the tiers, for property tests: each axis is drawn from
its domain in cases/schema.py `AXES`."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from cases import axes, schema
from cases.case import Case


def axis(field: str) -> st.SearchStrategy[Any]:
    """A draw of `field` from its schema domain: its values (booleans for a boolean axis), its span, or either."""
    domain = schema.AXES[field]
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
    selecting = optimizer in axes.SELECTING
    fraction = draw(axis("fraction")) if selecting else None
    return Case(layer=layer, megabatch=draw(axis("megabatch")),
                flatten=draw(axis("flatten")) if ndim > 2 else False,
                param_dtype=param_dtype, compute_dtype=compute_dtype,
                orthogonalizer=orth, adjust_lr=draw(axis("adjust_lr")),
                nesterov=False if selecting else draw(axis("nesterov")), weight_decay=draw(axis("weight_decay")),
                steps=draw(axis("steps")), grad=draw(st.sampled_from(grads)),
                seed=draw(axis("seed")), optimizer=optimizer, fraction=fraction)
