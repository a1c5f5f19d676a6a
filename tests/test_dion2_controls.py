"""Each Dion2 negative control is flagged by the check meant to catch it (and our Dion2 is not)."""

import pytest

from cases import Case
from harness.runner import run_case
from harness.targets import load_target

CONV = "dion2-f0.25/conv2d-8x4x3x3/mb2/flat/fp64@fp64/svd/spectral_norm/plain/wd0.1/steps3/gaussian/seed0"
TALL = "dion2-f0.25/linear_tall-24x6/mb1/noflat/fp32@fp32/pe/spectral_norm/plain/wd0/steps3/gaussian/seed0"
GLOBAL = ("dion2-f0.25-global/conv2d-8x4x3x3/mb2/flat/fp32@fp32/pe/spectral_norm/plain/wd0.1/steps3/gaussian/"
          "seed0/shard0/ws3")


def statuses(case_id, alias):
    return {r.check: r for r in run_case(Case.from_id(case_id), load_target(alias), alias)}


@pytest.mark.parametrize("alias,case_id,flagged_by", [
    ("control-dion2-kernel-selection", CONV, ("reference", "equiv2d")),
    ("control-dion2-ef-unselected", CONV, ("reference",)),
    ("control-dion2-ef-unselected", TALL, ("reference",)),
    ("control-dion2-submatrix-lr", CONV, ("reference",)),
])
def test_single_process_controls_are_flagged(alias, case_id, flagged_by):
    ours, control = statuses(case_id, "ours"), statuses(case_id, alias)
    assert all(r.status == "pass" for r in ours.values()), [(r.check, r.message) for r in ours.values()]
    for check in flagged_by:
        assert control[check].status == "fail" and control[check].ratio > 10, (check, control[check].message)


def test_local_scope_judged_as_global_is_flagged():
    control = statuses(GLOBAL, "control-dion2-local-as-global")
    assert control["reference"].status == "fail" and control["layout"].status == "fail", \
        [(r.check, r.ratio) for r in control.values()]
