"""The case generator: stable ids, tiers that cover every axis, deterministic data."""

import numpy as np
import pytest

from cases import Case, axes, ci_cases, gradient, initial_parameter, matrix_shape, nightly_cases, tier
from harness.judging.registry import applicable

KNOWN = Case(layer="conv2d", megabatch=3, flatten=True, param_dtype="bf16", compute_dtype="fp32",
             orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=True, weight_decay=0.1,
             steps=3, grad="gaussian", seed=0)


def test_case_id_is_stable():
    """Ids are shared across runs and reports: this literal must not change silently."""
    assert KNOWN.id == "muon/conv2d-8x4x3x3/mb3/flat/bf16@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"


def test_every_nightly_id_parses_back_and_is_unique():
    cases = nightly_cases()
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids)
    assert all(Case.from_id(i) == c for i, c in zip(ids, cases))


@pytest.mark.parametrize("bad", ["", "muon/conv2d-8x4x3x3", KNOWN.id.replace("8x4x3x3", "8x4x3x4"),
                                 KNOWN.id.replace("/pe/", "/qr/"), KNOWN.id.replace("mb3", "mbx")])
def test_malformed_ids_are_rejected(bad):
    with pytest.raises(ValueError, match="case id"):
        Case.from_id(bad)


def test_invalid_case_values_are_rejected():
    with pytest.raises(ValueError, match="layer"):
        Case(**{**KNOWN.__dict__, "layer": "conv4d"})
    with pytest.raises(ValueError, match="megabatch"):
        Case(**{**KNOWN.__dict__, "megabatch": 0})


def test_ci_tier_covers_every_axis_value():
    cases = ci_cases()
    for axis, values in [("layer", axes.LAYERS), ("megabatch", axes.MEGABATCH_SIZES),
                         ("orthogonalizer", axes.ORTHOGONALIZERS), ("adjust_lr", axes.ADJUST_LR),
                         ("grad", axes.GRADIENTS), ("param_dtype", axes.DTYPES), ("compute_dtype", axes.DTYPES),
                         ("nesterov", (False, True)), ("flatten", (False, True)), ("steps", (1, 3))]:
        seen = {getattr(c, axis) for c in cases}
        assert set(values) <= seen, f"CI tier misses {axis} values {set(values) - seen}"
    assert {c.kind for c in cases} == set(axes.LAYER_KINDS)


def test_ci_tier_has_at_least_500_case_checks_and_nightly_is_larger():
    ci = ci_cases()
    assert sum(len(applicable(c)) for c in ci) >= 500
    assert set(ci) < set(nightly_cases())


def test_unknown_tier():
    with pytest.raises(ValueError, match="unknown tier"):
        tier("weekly")


def test_member_data_does_not_depend_on_megabatch_size():
    one, five = KNOWN.__class__(**{**KNOWN.__dict__, "megabatch": 1}), KNOWN
    np.testing.assert_array_equal(initial_parameter(one, 0), initial_parameter(five, 0))
    np.testing.assert_array_equal(gradient(one, 0, 2), gradient(five, 0, 2))
    assert not np.array_equal(gradient(five, 0, 0), gradient(five, 1, 0))


@pytest.mark.parametrize("flatten", [True, False])
def test_gradient_kinds_have_their_structure(flatten):
    base = {**KNOWN.__dict__, "flatten": flatten}
    b, m, n = matrix_shape(KNOWN.shape, flatten)

    def mats(kind):
        return gradient(Case(**{**base, "grad": kind}), 0, 0).reshape(b, m, n)

    assert not mats("zero").any()
    ranks = [np.linalg.matrix_rank(x) for x in mats("rankdef")]
    assert ranks == [max(1, min(m, n) // 2)] * b
    s = np.linalg.svd(mats("lowrank")[0], compute_uv=False)
    top = max(1, min(m, n) // 8)
    np.testing.assert_allclose(s[top:] / s[0], 1e-2, rtol=1e-9)
    np.testing.assert_allclose(s[:top] / s[0], 1.0, rtol=1e-9)
    ratio = np.linalg.norm(mats("huge")) / np.linalg.norm(mats("tiny"))
    assert 1e19 < ratio < 1e21
