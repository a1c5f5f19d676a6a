"""One execution path: a target steps a case over its layout (one process being world size 1) and the
checks judge the pieces that came back, without knowing whose optimizer made them. Our Muon reaches the
ranks through the same `make_distributed` protocol method as any third-party adapter."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

import optimizers
from cases import Case
from harness.judging import registry
from harness.runner import run_case
from harness.targets.base import OptimizerTarget, distributed_maker
from harness.targets.ours import OursMuon
from harness.targets.tp_controls import per_shard_as_gather

SINGLE = Case(layer="linear", megabatch=2, flatten=False, param_dtype="fp32", compute_dtype="fp32",
              orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=True, weight_decay=0.1, steps=2,
              grad="gaussian")
SHARDED = dataclasses.replace(SINGLE, layout="shard0", world_size=2)


class ThirdParty(OptimizerTarget):
    """Our Muon wrapped as an outside adapter would wrap it: no subclass of OursMuon, the conventions and
    options borrowed, `make` for one process and `make_distributed` for a layout."""

    name = "third-party"
    exact_relations = True

    def conventions(self, case: Case) -> Any:
        return OursMuon().conventions(case)

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        return optimizers.Muon(params, **OursMuon().options(case))


class ThirdPartyDistributed(ThirdParty):
    def make_distributed(self, params: list[torch.nn.Parameter], case: Case, mesh: Any) -> torch.optim.Optimizer:
        return optimizers.Muon(params, **OursMuon().options(case), mesh=mesh)


def statuses(target: Any, spec: str, case: Case) -> dict[str, str]:
    return {r.check: r.status for r in run_case(case, target, spec)}


def test_ours_reaches_the_ranks_through_the_protocol_method():
    target = OursMuon()
    maker = distributed_maker(target)
    assert maker is not None and maker.__func__ is OursMuon.make_distributed
    assert distributed_maker(ThirdParty()) is None


def test_an_outside_adapter_with_make_distributed_runs_every_layout_as_ours_does():
    for case in (SINGLE, SHARDED):
        got = statuses(ThirdPartyDistributed(), "tests.test_execution_path:ThirdPartyDistributed", case)
        assert got == statuses(OursMuon(), "ours", case)
        assert set(got) == set(registry.applicable(case)) and set(got.values()) == {"pass"}
    assert "local_shard" in registry.applicable(SHARDED)
    assert "local_shard" not in registry.applicable(SINGLE)


def test_a_target_without_make_distributed_is_unsupported_on_ranks_and_runs_alone():
    assert set(statuses(ThirdParty(), "tests.test_execution_path:ThirdParty", SINGLE).values()) == {"pass"}
    records = run_case(SHARDED, ThirdParty(), "tests.test_execution_path:ThirdParty")
    assert {r.status for r in records} == {"unsupported"}
    assert all("make_distributed" in r.message for r in records)


def test_a_target_that_raises_alone_is_an_error_of_every_check():
    class Raising(ThirdParty):
        def make(self, params, case):
            raise RuntimeError("boom")

    records = run_case(SINGLE, Raising(), "raising")
    assert {r.status for r in records} == {"error"}
    assert all("target raised" in r.message and "boom" in r.message for r in records)


def test_the_controls_still_reach_their_broken_optimizer():
    """A control subclassing our adapter inherits make_distributed, so its override reaches the ranks:
    the per-shard-as-gather TP control is flagged on a TP case (it would pass were the ranks running
    the unbroken optimizer)."""
    case = dataclasses.replace(SINGLE, layer="linear_wide_big", megabatch=1, layout="tp0-gather", world_size=2,
                               steps=1)
    got = statuses(per_shard_as_gather(), "harness.targets.tp_controls:per_shard_as_gather", case)
    assert got["reference"] == "fail"
    assert set(statuses(OursMuon(), "ours", case).values()) == {"pass"}
