"""Covering arrays: every required pair and triple is in the tiers, counted independently; the
generator is deterministic, respects the constraints of valid cases, and the coverage counter
flags a hole (its negative control)."""

import itertools

import pytest

from cases import Case, axes, ci_cases
from cases.coverage import row_of, summary, tier_coverage
from cases.covering import Constraint, Space, coverage, covering_array
from cases.tiers import CONSTRAINTS, SPACES, cases_of
from harness.runner import run_case
from harness.targets import load_target

CI_SINGLE = SPACES["ci"]["single-process"]


def _brute_force_holes(rows: list[dict], space: Space, strength: int) -> list[tuple]:
    """Required value combinations of `strength` axes that no row holds, by enumeration over the
    full Cartesian product of values (constraints judged by building a Case where possible)."""
    present = {tuple((a, r[a]) for a in combo) for r in rows for combo in itertools.combinations(space.axes, strength)}
    holes = []
    varying = [a for a, v in space.axes.items() if len(v) > 1]
    for combo in itertools.combinations(space.axes, strength):
        if strength == 3 and not set(combo) <= set(varying):
            continue
        for values in itertools.product(*(space.axes[a] for a in combo)):
            t = tuple(zip(combo, values))
            if space.allows(dict(t)) and t not in present:
                holes.append(t)
    return holes


def test_ci_single_process_tier_holds_every_pair_and_triple():
    rows = [row_of(c) for c in ci_cases() if c.layout == "single"]
    assert _brute_force_holes(rows, CI_SINGLE, 2) == []
    assert _brute_force_holes(rows, CI_SINGLE, 3) == []


def test_every_space_of_every_tier_is_completely_covered():
    for name in SPACES:
        for space_name, (n, cov) in tier_coverage(name).items():
            assert n > 0 and cov.complete, (name, space_name, cov)
            assert cov.pairs_possible > 0 and cov.triples_possible > cov.pairs_possible


def test_the_published_normuon_hole_is_closed():
    """NorMuon, a flattened conv, Gaussian gradients (context: a kernel-slice variance buffer passed
    a tier that had no such case): the CI tier holds it, and the control fails there."""
    holes = [c for c in ci_cases() if c.optimizer == "normuon" and c.flatten and c.grad == "gaussian"
             and c.layout == "single"]
    assert holes
    spec = "control-normuon-kernel-slice"
    target = load_target(spec)
    assert any(r.failing for c in holes for r in run_case(c, target, spec))


def test_hole_is_reported_negative_control():
    rows = [row_of(c) for c in ci_cases() if c.layout == "single"]
    full = coverage(rows, CI_SINGLE)
    assert full.complete
    # every row of a covering array covers at least one combination no other row does? Not necessarily;
    # but dropping all rows with one value certainly opens holes.
    without = [r for r in rows if not (r["optimizer"] == "normuon" and r["grad"] == "gaussian")]
    cov = coverage(without, CI_SINGLE)
    assert not cov.complete and cov.pairs < full.pairs and cov.triples < full.triples
    assert "INCOMPLETE" not in summary()


def test_generation_is_deterministic_and_valid():
    first, second = cases_of(CI_SINGLE), cases_of(CI_SINGLE)
    assert [c.id for c in first] == [c.id for c in second]
    assert len({c.id for c in first}) == len(first)
    for c in first:
        assert Case.from_id(c.id) == c
        assert not (c.flatten and len(c.shape) == 2)
        assert axes.compute_ok(c.orthogonalizer, c.compute_dtype)
    dist = cases_of(SPACES["ci"]["distributed"])
    assert not any(c.optimizer == "normuon" and c.layout == "shard1" for c in dist)


def test_required_combinations_exclude_invalid_ones():
    pairs, _ = CI_SINGLE.required()
    assert (("orthogonalizer", "svd"), ("compute_dtype", "bf16")) not in pairs
    assert (("layer", "linear"), ("flatten", True)) not in pairs
    assert (("param_dtype", "fp64"), ("compute_dtype", "bf16")) not in pairs
    assert (("layer", "conv2d"), ("flatten", True)) in pairs


def test_small_space_is_minimal_and_constrained():
    """Three binary axes pairwise need 4 rows (a known optimum); a constraint removes a pair."""
    space = Space({"a": (0, 1), "b": (0, 1), "c": (0, 1)})
    rows = covering_array(space)
    assert len(rows) == 4 and coverage(rows, space).complete
    constrained = Space({"a": (0, 1), "b": (0, 1), "c": (0, 1)}, (Constraint(("a", "b"), lambda a, b: a <= b, "a<=b"),))
    rows = covering_array(constrained)
    assert all(r["a"] <= r["b"] for r in rows) and coverage(rows, constrained).complete


def test_space_rejects_unknown_axes_and_empty_values():
    with pytest.raises(ValueError, match="unknown axes"):
        Space({"a": (0,)}, (Constraint(("z",), lambda z: True, "z"),))
    with pytest.raises(ValueError, match="no values"):
        Space({"a": ()})
    with pytest.raises(ValueError, match="group"):
        Space({"a": (0,), "b": (0,)}, (), (("a", "b"),))


def test_constraints_match_what_a_case_accepts():
    """Every constraint forbids only combinations Case itself, or the tier rules, reject."""
    assert {c.why for c in CONSTRAINTS} >= {"svd never computes in bf16", "flatten only for 3-D+ layers"}
    for pd, cd in itertools.product(axes.DTYPES, axes.DTYPES):
        allowed = CI_SINGLE.allows({"param_dtype": pd, "compute_dtype": cd})
        assert allowed == ((pd, cd) in axes.DTYPE_PAIRS)
