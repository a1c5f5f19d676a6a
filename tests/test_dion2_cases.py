"""Dion2 / NorDion2 cases (ids with fraction and scope) and their harness-side algorithm records."""

import dataclasses
import math
from types import SimpleNamespace

import pytest

from cases import Case
from harness.algorithms import algorithm
from harness.algorithms.dion2 import selection_blocks
from harness.judging import registry

BASE = Case(layer="conv2d", megabatch=2, flatten=True, param_dtype="fp32", compute_dtype="fp32",
            orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=False, weight_decay=0.1, steps=3,
            grad="gaussian", optimizer="dion2", fraction=0.25)


def dist(case, layout, ws, scope):
    return dataclasses.replace(case, layout=layout, world_size=ws, scope=scope)


def test_ids_carry_fraction_and_scope_and_round_trip():
    local = dist(BASE, "shard0", 3, "local")
    assert BASE.id.startswith("dion2-f0.25/conv2d-8x4x3x3/") and "/plain/" in BASE.id
    assert local.id.startswith("dion2-f0.25-local/") and local.id.endswith("/shard0/ws3")
    for case in (BASE, local, dataclasses.replace(BASE, optimizer="nordion2", fraction=1.0)):
        assert Case.from_id(case.id) == case


def test_muon_ids_are_unchanged():
    muon = dataclasses.replace(BASE, optimizer="muon", fraction=None, nesterov=True)
    assert muon.id == "muon/conv2d-8x4x3x3/mb2/flat/fp32@fp32/pe/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0"


@pytest.mark.parametrize("change,match", [
    (dict(optimizer="muon"), "takes no fraction"),
    (dict(fraction=None), "needs a fraction"),
    (dict(fraction=1.5), "needs a fraction"),
    (dict(nesterov=True), "no Nesterov"),
    (dict(scope="global"), "scope"),
    (dict(layout="shard0", world_size=2), "scope"),
    (dict(layout="shard0", world_size=2, scope="everywhere"), "scope"),
])
def test_bad_selection_axes_are_rejected(change, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(BASE, **change)


@pytest.mark.parametrize("token", ["dion2-x0.25", "dion2-f0.25-local-x", "dion2-fhalf"])
def test_bad_optimizer_tokens_are_rejected(token):
    with pytest.raises(ValueError, match="not a case id"):
        Case.from_id(BASE.id.replace("dion2-f0.25", token))


def test_local_scope_blocks_follow_the_split_of_the_selected_side():
    assert selection_blocks(dist(BASE, "shard0", 3, "local")) == [3, 3, 2]          # rows of [8, 36]
    assert selection_blocks(dist(BASE, "shard0", 3, "global")) is None
    assert selection_blocks(dist(BASE, "shard1", 3, "local")) is None              # splits the columns
    assert selection_blocks(dist(BASE, "replicated", 3, "local")) is None
    tall = dataclasses.replace(BASE, layer="conv2d_tall")                           # [40, 8]: columns
    assert selection_blocks(dist(tall, "shard1", 3, "local")) == [4, 4, 0]          # 2 channels x 2x2 each
    assert selection_blocks(dist(tall, "shard0", 3, "local")) is None
    noflat = dataclasses.replace(BASE, layer="conv1d", flatten=False)               # [8] x [4, 5]: rows
    assert selection_blocks(dist(noflat, "shard1", 3, "local")) == [2, 2, 0]
    assert selection_blocks(dist(noflat, "shard0", 3, "local")) is None             # the batch dim
    nor = dataclasses.replace(tall, optimizer="nordion2")                           # NorDion2: rows always
    assert algorithm(dist(nor, "shard0", 3, "local")).local_blocks(dist(nor, "shard0", 3, "local")) == [14, 14, 12]


def test_distributed_checks_judge_layout_invariance_only_where_it_holds():
    assert "layout" in registry.applicable(dist(BASE, "shard0", 3, "global"))
    assert "layout" not in registry.applicable(dist(BASE, "shard0", 3, "local"))
    assert "layout" in registry.applicable(dist(BASE, "shard1", 3, "local"))  # scopes coincide
    nor = dataclasses.replace(BASE, optimizer="nordion2")
    assert "layout" not in registry.applicable(dist(nor, "shard0", 3, "global"))  # shard-local norm
    assert "layout" in registry.applicable(dist(nor, "replicated", 3, "global"))


def test_fraction1_relation_applies_to_fraction_one_only():
    one = dataclasses.replace(BASE, fraction=1.0)
    assert "fraction1" in registry.applicable(one) and "fraction1" not in registry.applicable(BASE)
    twin = algorithm(one).equivalent(one)
    assert twin.optimizer == "muon" and twin.momentum == one.ef_decay and not twin.nesterov
    nor = dataclasses.replace(one, optimizer="nordion2")
    assert algorithm(nor).equivalent(nor).optimizer == "normuon"


def test_selection_ties_are_ill_posed_and_clear_margins_are_not():
    rule = algorithm(BASE)
    assert rule.ill_posed(BASE, 0.0) and "ill-posed selection" in rule.ill_posed(BASE, 1e-9)
    assert rule.ill_posed(BASE, 1e-3) is None and rule.ill_posed(BASE, math.inf) is None
    bf16 = dataclasses.replace(BASE, param_dtype="bf16", compute_dtype="bf16")
    assert rule.ill_posed(bf16, 1e-3)                      # a bf16 momentum cannot resolve 1e-3
    assert algorithm("muon").ill_posed(BASE, 0.0) is None  # Muon selects nothing


def test_unknown_algorithm_is_named():
    with pytest.raises(KeyError, match="no oracle for optimizer 'sgd'"):
        algorithm(SimpleNamespace(optimizer="sgd"))
