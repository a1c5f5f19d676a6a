"""Every check, as one record each, and which apply to a case: the one registry of checks.

A `Check` names its `policy` (the part of harness/policy that judges it: "coefficient" for the tolerance
derived from the spectrum and the measured coefficients, "noise" for the measured bf16 noise of a
statistic, "exact" for a bound with no measured part). Its `judge` takes the pieces the case's ranks sent
back (one piece for one process, harness/judging/distributed_checks.py); `applies(case, compute_dtype)`
says whether it judges `case` run in `compute_dtype` (the case's own by default). `CHECKS` is in the order
checks run and records are written.

  reference    every case
  local_shard  distributed cases                       layout       where the algorithm is layout invariant
  replicas     the replicated layout
  megabatch    one process, 2+ members                  equiv2d      one process, flatten of a 3-D+ layer
  mixed        one process, flatten of a matrix algorithm's layer (its twins of the other layer kind in its group)
  fraction1    one process, an equivalent case exists   scale        one process, Gaussian gradients
  finite       one process, degenerate gradients (extreme ones too)
  norm, probe  the bf16-robust checks (harness/judging/robust_checks.py `applies`); with them the
  spectrum, rows  algorithm's own (harness/algorithms: `robust_checks`), rescale (its gradient kinds)
  drift        and drift (long runs of an algorithm judged for drift)
  nonfinite    one process, a NaN gradient element (the only check of such a case)
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from cases import Case
from cases.axes import DEGENERATE_GRADIENTS, NO_ORTHOGONALIZER, NONFINITE_GRADIENT
from harness.algorithms import algorithm
from harness.judging import checks, distributed_checks, robust_checks
from harness.judging.distributed_checks import Pieces, gather
from harness.judging.outcome import Outcome, Trajectory
from harness.running.inputs import Inputs
from harness.targets.base import Target

Judge = Callable[[Case, Target, Inputs, Pieces], Outcome]


@dataclass(frozen=True)
class Check:
    name: str
    applies: Callable[[Case, str], bool]
    judge: Judge
    policy: str


def _whole(check: Callable[[Case, Target, Inputs, Trajectory], Outcome]) -> Judge:
    """A check of one process's trajectory, judged from its one piece."""
    return lambda case, target, inputs, pieces: check(case, target, inputs, gather(case, pieces))


def _single(rule: Callable[[Case], bool]) -> Callable[[Case, str], bool]:
    return lambda case, compute: case.world_size == 1 and rule(case)


def _robust(rule: Callable[[Case], bool]) -> Callable[[Case, str], bool]:
    return lambda case, compute: robust_checks.applies(case, compute) and rule(case)


def _finite_inputs(rule: Callable[[Case, str], bool]) -> Callable[[Case, str], bool]:
    return lambda case, compute: case.grad != NONFINITE_GRADIENT and rule(case, compute)


def _own(name: str) -> Callable[[Case], bool]:
    """The robust check `name` of the algorithms that name it as their own."""
    return lambda case: name in algorithm(case).robust_checks


_FINITE_INPUT_CHECKS: tuple[Check, ...] = (
    Check("reference", lambda case, compute: True, distributed_checks.reference, "coefficient"),
    Check("local_shard", lambda case, compute: case.world_size > 1, distributed_checks.local_shard, "coefficient"),
    Check("layout", lambda case, compute: case.world_size > 1 and algorithm(case).layout_invariant(case),
          distributed_checks.layout, "coefficient"),
    Check("replicas", lambda case, compute: case.layout == "replicated", distributed_checks.replicas, "exact"),
    Check("megabatch", _single(lambda case: case.megabatch > 1), _whole(checks.megabatch), "coefficient"),
    Check("equiv2d", _single(lambda case: case.flatten and len(case.shape) > 2), _whole(checks.equiv2d),
          "coefficient"),
    Check("mixed", _single(lambda case: case.flatten and case.orthogonalizer != NO_ORTHOGONALIZER),
          _whole(checks.mixed), "coefficient"),
    Check("fraction1", _single(lambda case: algorithm(case).equivalent(case) is not None), _whole(checks.fraction1),
          "coefficient"),
    Check("scale", _single(lambda case: case.grad == "gaussian"), _whole(checks.scale), "coefficient"),
    Check("finite", _single(lambda case: case.grad in DEGENERATE_GRADIENTS), _whole(checks.finite), "exact"),
    Check("norm", _robust(lambda case: True), _whole(robust_checks.norm_check), "noise"),
    Check("spectrum", _robust(_own("spectrum")), _whole(robust_checks.spectrum_check), "noise"),
    Check("rows", _robust(_own("rows")), _whole(robust_checks.rows_check), "noise"),
    Check("probe", _robust(lambda case: True), _whole(robust_checks.probe_check), "exact"),
    Check("rescale", _robust(lambda case: case.grad in robust_checks.RESCALE_GRADIENTS),
          _whole(robust_checks.rescale_check), "exact"),
    Check("drift", _robust(robust_checks.drift_applies), _whole(robust_checks.drift_check), "noise"),
)

CHECKS: tuple[Check, ...] = (
    *(Check(c.name, _finite_inputs(c.applies), c.judge, c.policy) for c in _FINITE_INPUT_CHECKS),
    Check("nonfinite", _single(lambda case: case.grad == NONFINITE_GRADIENT), _whole(checks.nonfinite), "exact"),
)
"""Every check in the order they run: those of finite gradients, then the non-finite policy's, which alone
judges a case with a NaN gradient element (no oracle steps a NaN)."""

BY_NAME: Mapping[str, Check] = types.MappingProxyType({c.name: c for c in CHECKS})


def applicable(case: Case, compute_dtype: str | None = None) -> list[str]:
    """Names of the checks that judge `case` run in `compute_dtype` (default its own), in the order they run."""
    compute = case.compute_dtype if compute_dtype is None else compute_dtype
    return [c.name for c in CHECKS if c.applies(case, compute)]


def robust_applicable(case: Case, compute_dtype: str | None = None) -> list[str]:
    """The bf16-robust checks among `applicable(case, compute_dtype)`."""
    return [name for name in applicable(case, compute_dtype) if name in robust_checks.ROBUST]


def judge(name: str) -> Judge:
    """The judge of check `name` (KeyError names a check that does not exist)."""
    return BY_NAME[name].judge
