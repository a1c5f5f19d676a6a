"""Negative controls of distributed Muon: each deliberately wrong distributed path is flagged by the
checks meant to catch it, stays invisible where it is harmless, and our Muon passes the same cases."""

from __future__ import annotations

import dataclasses

import pytest
from failing_cases import failed_cases

from cases import Case, ci_cases
from harness.runner import run_case
from harness.targets import load_target

BASE = Case(layer="conv2d", megabatch=3, flatten=True, param_dtype="fp32", compute_dtype="fp32",
            orthogonalizer="polar_express", adjust_lr="spectral_norm", nesterov=True, weight_decay=0.1, steps=2,
            grad="gaussian", layout="shard0", world_size=2)
CONTROLS = "harness.targets.distributed_controls:"


def case(**changes: object) -> Case:
    return dataclasses.replace(BASE, **changes)


def statuses(spec: str, c: Case) -> dict[str, str]:
    return {r.check: r.status for r in run_case(c, load_target(spec), spec)}


FLAGGED = [
    # (control, case, checks that must fail)
    ("local_shard", case(), {"reference", "local_shard", "layout"}),
    ("local_shard", case(layout="shard1", world_size=3, layer="linear", flatten=False), {"reference", "layout"}),
    ("padding_leak", case(world_size=3), {"reference", "local_shard", "layout"}),          # 8 rows: 3+3+2
    ("padding_leak", case(layer="conv3d", world_size=4), {"reference", "layout"}),         # 6 rows: 2+2+2+0
    ("wrong_params", case(megabatch=5), {"reference", "local_shard", "layout"}),
    ("wrong_params", case(megabatch=5, layout="replicated", world_size=3), {"reference", "layout"}),
    ("no_gather", case(layout="replicated"), {"replicas", "local_shard"}),
]

INVISIBLE = [
    # (control, case): the bug cannot show here, so the harness must not cry wolf
    ("local_shard", case(layout="replicated")),                     # no shards
    ("local_shard", case(flatten=False)),                           # noflat conv: Shard(0) splits the batch of 3x3 matrices
    ("padding_leak", case()),                                       # 8 rows over 2 ranks: no padding
    ("wrong_params", case(megabatch=2)),                            # one member per owner
    ("no_gather", case()),                                          # sharded layouts have no all-gather
]


@pytest.mark.parametrize("control, c, must_fail", FLAGGED, ids=[f"{n}-{c.id}" for n, c, _ in FLAGGED])
def test_control_is_flagged(control, c, must_fail):
    got = statuses(CONTROLS + control, c)
    assert {k for k, v in got.items() if v == "fail"} >= must_fail, got
    assert all(v == "pass" for v in statuses("ours", c).values())


@pytest.mark.parametrize("control, c", INVISIBLE, ids=[f"{n}-{c.id}" for n, c in INVISIBLE])
def test_control_is_invisible_where_harmless(control, c):
    assert all(v == "pass" for v in statuses(CONTROLS + control, c).values())


@pytest.mark.parametrize("control", ["local_shard", "padding_leak", "wrong_params", "no_gather"])
def test_each_control_fails_many_ci_cases(control):
    can_show = {
        "padding_leak": lambda c: c.layout_detail.endswith(("uneven", "empty")),  # a sharded dim split unevenly
        "local_shard": lambda c: c.layout.startswith("shard"),                     # there are shards
        "wrong_params": lambda c: c.megabatch > c.world_size,                      # an owner of two members
    }.get(control, bool)
    distributed = [c for c in ci_cases() if c.layout != "single" and can_show(c)]
    failed, run = failed_cases(distributed, CONTROLS + control, enough=5)
    assert failed == 5, f"{control} failed only {failed} of the {run} distributed CI cases it can show on"
