"""Hypothesis strategies over the same axes as the tiers, for property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from cases import axes
from cases.case import Case


@st.composite
def cases(draw: st.DrawFn, layers: tuple[str, ...] = tuple(axes.LAYERS),
          grads: tuple[str, ...] = axes.GRADIENTS, optimizers: tuple[str, ...] = ("muon",)) -> Case:
    """Any valid CI-sized case, dtype pairs and orthogonalizers as the tiers pair them; a selecting
    optimizer (Dion2, NorDion2) draws its fraction from (0, 1] and has no Nesterov form."""
    layer = draw(st.sampled_from(layers))
    ndim = len(axes.all_layers()[layer][1])
    orth = draw(st.sampled_from(axes.ORTHOGONALIZERS))
    param_dtype, compute_dtype = draw(st.sampled_from([p for p in axes.DTYPE_PAIRS if axes.compute_ok(orth, p[1])]))
    optimizer = draw(st.sampled_from(optimizers))
    selecting = optimizer in axes.SELECTING
    fraction = draw(st.sampled_from(axes.FRACTIONS) | st.floats(0.01, 1.0)) if selecting else None
    return Case(layer=layer, megabatch=draw(st.sampled_from(axes.MEGABATCH_SIZES)),
                flatten=draw(st.booleans()) if ndim > 2 else False,
                param_dtype=param_dtype, compute_dtype=compute_dtype,
                orthogonalizer=orth, adjust_lr=draw(st.sampled_from(axes.ADJUST_LR)),
                nesterov=False if selecting else draw(st.booleans()), weight_decay=draw(st.sampled_from((0.0, 0.1))),
                steps=draw(st.integers(1, 3)), grad=draw(st.sampled_from(grads)),
                seed=draw(st.integers(0, 2**16)), optimizer=optimizer, fraction=fraction)
