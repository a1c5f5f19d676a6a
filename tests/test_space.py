"""The full axis space of a tier and the covering array of what a target supports (cases/space.py)."""

from __future__ import annotations

import itertools

import pytest

from cases import Case, axes, space, tier
from cases.space import AXES, SPACES, sample, supported_covering, values_of


def test_draws_are_valid_cases_and_the_same_every_time():
    first = [c.id for c in sample(SPACES["ci"], False, 200)]
    assert first == [c.id for c in sample(SPACES["ci"], False, 200)]
    assert all(Case.from_id(i).id == i for i in first)
    assert {Case.from_id(i).world_size for i in first} == {1}
    assert {c.world_size > 1 for c in sample(SPACES["ci"], True, 50)} == {True}


def _narrow(case: Case) -> str | None:
    """A narrow target: Muon on 2-D weights, Newton-Schulz in fp32, one lr scale."""
    if case.optimizer != "muon" or len(case.shape) != 2:
        return "2-D Muon only"
    if case.orthogonalizer != "newton_schulz" or case.compute_dtype != "fp32" or case.adjust_lr != "spectral_norm":
        return "Newton-Schulz in fp32, one lr scale"
    return None


def _pairs(cases):
    return {p for c in cases for p in itertools.combinations(zip(AXES, values_of(c)), 2)}


def test_a_narrow_target_gets_every_pair_it_supports_and_nothing_else():
    found = supported_covering(SPACES["ci"], False, _narrow, tier("ci"))
    rows = found.rows
    assert rows and all(_narrow(c) is None for c in rows)
    assert found.covered == found.required
    drawn = [c for c in sample(SPACES["ci"], False, 2000) if _narrow(c) is None]
    assert _pairs(drawn) <= _pairs(rows), "a supported pair of a drawn case is missing from the rows"
    for axis, value in (("weight_decay", 1e-4), ("weight_decay", 0.01), ("lr", 0.05), ("momentum", 0.9),
                        ("flatten", True), ("param_dtype", "bf16"), ("layer", "linear_row")):
        assert value in found.values[axis] and any(getattr(c, axis) == value for c in rows), (axis, value)
    assert found.reasons["2-D Muon only"] > 0
    assert supported_covering(SPACES["ci"], False, _narrow, tier("ci")).rows == rows  # reproducible


def test_a_target_that_supports_nothing_gets_no_row():
    """Negative control: the covering never offers a case its predicate refused."""
    found = supported_covering(SPACES["ci"], False, lambda case: "nothing", tier("ci"), samples=300)
    assert found.rows == () and found.required == 0


def test_the_global_tier_keeps_its_written_cases_first_and_covers_the_new_values():
    from cases.tiers import written
    every = tier("ci")
    assert every[:len(written("ci"))] == list(written("ci"))
    single = [c for c in every if c.world_size == 1]
    for axis, values in (("weight_decay", axes.DECAYS), ("lr", axes.LRS), ("momentum", axes.HYPER_VALUES["momentum"]),
                         ("beta2", axes.HYPER_VALUES["beta2"]), ("ef_decay", axes.HYPER_VALUES["ef_decay"])):
        assert set(values) <= {getattr(c, axis) for c in single}, axis
    assert any(c.flatten and len(c.shape) == 2 and c.megabatch > 1 and c.optimizer == "muon" for c in single)
    assert {"bias", "embedding"} <= {c.layer for c in single if c.optimizer == "adamw"}
    swapped = {(c.momentum, c.beta2) for c in single if c.optimizer == "normuon"}
    assert (0.9, 0.95) in swapped and (0.95, 0.99) in swapped, "momentum and beta2 must vary independently"


@pytest.mark.parametrize("case_id, error", [
    ("muon-b0.99/linear-12x20/mb1/noflat/fp32@fp32/ns/none/plain/wd0/steps1/gaussian/seed0", "no beta2"),
    ("dion2-f0.5/linear-12x20/mb1/noflat/fp32@fp32/ns/none/plain_mu0.9/wd0/steps1/gaussian/seed0", "no momentum"),
    ("adamw/bias-16/mb1/noflat/fp32@fp32/ns/none/plain/wd0/steps1/gaussian/seed0", "elementwise"),
    ("muon/bias-16/mb1/noflat/fp32@fp32/ns/none/plain/wd0/steps1/gaussian/seed0", "orthogonalizes matrices"),
    ("adamw/bias-16/mb1/noflat/fp32@fp32/none/none/plain/wd0/steps1/lowrank/seed0", "takes gradients"),
])
def test_hyper_parameters_and_elementwise_rules_are_checked(case_id, error):
    with pytest.raises(ValueError, match=error):
        Case.from_id(case_id)


def test_hyper_parameters_ride_in_the_id_only_away_from_their_defaults():
    base = Case.from_id("normuon/linear-12x20/mb2/noflat/fp32@fp32/pe/rms_norm/nesterov/wd0/steps3/gaussian/seed0")
    assert base.lr == axes.LR and base.momentum == axes.MOMENTUM and base.beta2 == axes.BETA2
    varied = Case.from_id("normuon-b0.99/linear-12x20/mb2/noflat/fp32@fp32/pe/rms_norm/nesterov_mu0.9/"
                          "wd0.0001_lr0.05/steps3/gaussian/seed0")
    assert (varied.beta2, varied.momentum, varied.weight_decay, varied.lr) == (0.99, 0.9, 1e-4, 0.05)
    dion = Case.from_id("nordion2-f0.25-ef0.9-b0.99-local/conv2d-8x4x3x3/mb1/flat/fp32@fp32/pe/spectral_norm/plain/"
                        "wd0.1/steps3/gaussian/seed0/replicated/ws2")
    assert (dion.fraction, dion.ef_decay, dion.beta2, dion.scope) == (0.25, 0.9, 0.99, "local")


def test_space_axes_are_every_case_field():
    import dataclasses
    assert set(AXES) - {"kind"} | set(space.NOT_COMBINED) == {f.name for f in dataclasses.fields(Case)}
    assert space.GROUPS and all(set(g) <= set(AXES) for g in space.GROUPS)


def test_the_witness_search_satisfies_a_conjunction_no_draw_meets():
    """An adapter that refuses all but one corner of the space, one condition after another (as adapters are
    written), is satisfied field by field: each move lets it read further."""
    def corner(case: Case) -> str | None:
        if case.optimizer != "normuon" or case.layer != "linear_row":
            return "NorMuon on the 1 x 16 row only"
        if case.megabatch != 1 or case.grad != "gaussian" or case.adjust_lr != "rms_norm" or case.steps != 3:
            return "one parameter, Gaussian gradients, rms lr, three steps"
        return None if case.compute_dtype == "bf16" and case.param_dtype == "fp32" else "fp32@bf16 only"
    assert not [c for c in sample(SPACES["ci"], False, 2000) if corner(c) is None]
    found = space.search(tier("ci")[0], corner, SPACES["ci"])
    assert found is not None and corner(found) is None
    rows = supported_covering(SPACES["ci"], False, corner, tier("ci"), samples=500).rows
    assert rows and all(corner(c) is None for c in rows)
    assert {0.9, 0.95} == {c.momentum for c in rows} and {0.95, 0.99} == {c.beta2 for c in rows}


def test_the_witness_search_gives_up_on_an_impossible_target():
    """Negative control: no case satisfies it, and the search says so instead of returning a refused case."""
    assert space.search(tier("ci")[0], lambda case: "never" if case.megabatch else None, SPACES["ci"]) is None
