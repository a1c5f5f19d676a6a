"""Tensor-parallel cases (cases/layouts.py TP layouts) on gloo ranks: our Muon passes them, and
each TP negative control (harness/targets/tp_controls.py) is flagged by the checks meant to catch it."""

from __future__ import annotations

import dataclasses

import pytest

from cases import Case, ci_cases, nightly_cases
from cases.layouts import regions, tensor_parallel
from harness.runner import run_case
from harness.targets import load_target

BASE = Case(layer="linear", megabatch=2, flatten=False, param_dtype="fp64", compute_dtype="fp64",
            orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=False, weight_decay=0.1, steps=2,
            grad="gaussian", layout="tp0-gather", world_size=2)
CONTROLS = "harness.targets.tp_controls:"


def case(**changes: object) -> Case:
    return dataclasses.replace(BASE, **changes)


def statuses(spec: str, c: Case) -> dict[str, str]:
    return {r.check: r.status for r in run_case(c, load_target(spec), spec)}


FLAGGED = [
    # (control, case, checks that must fail)
    ("per_shard_as_gather", case(), {"reference", "local_shard", "layout"}),
    ("per_shard_as_gather", case(layout="dp2tp1-gather", world_size=4), {"reference", "local_shard", "layout"}),
    ("gather_as_per_shard", case(layout="tp1-per_shard"), {"reference", "local_shard"}),
    ("heads_ignored", case(layout="dp2tp0-per_shard-h4", world_size=4), {"reference", "local_shard", "layout"}),
]


@pytest.mark.parametrize("control, c, must_fail", FLAGGED, ids=[f"{n}-{c.layout}" for n, c, _ in FLAGGED])
def test_tp_control_is_flagged_and_ours_passes(control, c, must_fail):
    got = statuses(CONTROLS + control, c)
    assert {k for k, v in got.items() if v == "fail"} >= must_fail, got
    ours = statuses("ours", c)
    assert ours and all(v == "pass" for v in ours.values()), ours


def test_per_head_exactness_is_judged_bitwise_under_column_tp():
    """per_shard with heads on whole-head column shards: the layout check (per-head exactness) runs
    and is bitwise in fp64; without heads per_shard has no layout check (it is layout dependent)."""
    with_heads = {r.check: r for r in run_case(case(layout="tp0-per_shard-h4", world_size=4), load_target("ours"),
                                                "ours")}
    assert with_heads["layout"].status == "pass" and with_heads["layout"].ratio == 0.0
    assert "layout" not in statuses("ours", case(layout="tp0-per_shard"))


def test_tp_layout_tokens_round_trip_and_invalid_ones_are_refused():
    for c in (case(layout="dp2tp1-per_shard", world_size=4), case(layout="tp0-gather-h4", world_size=4)):
        assert Case.from_id(c.id) == c
    for layout, ws in (("dp1tp0-gather", 2), ("tp0-gather-h0", 2), ("tp2-gather", 2), ("dp2tp0-gather", 2)):
        with pytest.raises(ValueError):
            case(layout=layout, world_size=ws)
    with pytest.raises(ValueError, match="whole heads"):
        case(layout="tp1-per_shard-h4")            # row-parallel shards split every head
    with pytest.raises(ValueError, match="whole heads"):
        case(layout="tp0-per_shard-h4", world_size=3)  # 12 rows over 3: 4+4+4 cut heads of 3


def test_regions_tile_the_parameter_once():
    """Every layout's pieces cover each element exactly once (replicated: every rank whole)."""
    import numpy as np
    for layout, ws, shape in (("dp2tp0-gather", 4, (10, 6)), ("dp2tp1-gather", 4, (10, 6)), ("tp0-gather", 4, (10, 6)),
                              ("shard1", 3, (4, 7))):
        count = np.zeros(shape, dtype=int)
        for box in regions(layout, ws, shape):
            count[box] += 1
        assert (count == 1).all(), (layout, count)


def test_tiers_hold_tp_cases():
    ci = [c for c in ci_cases() if tensor_parallel(c.layout)]
    nightly = [c for c in nightly_cases() if tensor_parallel(c.layout)]
    assert 0 < len(ci) <= len([c for c in ci_cases() if c.world_size > 1]) // 4, len(ci)  # a minority of the layouts
    kinds = {(c.tensor_parallel.dp, c.tensor_parallel.dim, c.tensor_parallel.mode, c.tensor_parallel.heads is not None,
              c.world_size) for c in nightly}
    for dp, ws in ((1, 2), (1, 4), (2, 4)):
        for dim in (0, 1):
            for mode in ("gather", "per_shard"):
                assert (dp, dim, mode, False, ws) in kinds, (dp, dim, mode, ws)
    assert any(c.tensor_parallel.heads for c in ci) and any(c.tensor_parallel.dp == 2 for c in ci)
