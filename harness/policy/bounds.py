"""What a check's allowance is (`Tolerance`), and every exact bound of the policy, in one place.

A tolerance bounds the normwise error of an update (harness/judging/metrics.py):
  ||err||_F <= rtol ||delta_ref||_F + storage_ulps ||ulp_param(x_ref)||_F
An exact bound has rtol 0: what is left is the rounding of storing the parameter in its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    storage_ulps: float
    source: str


STORAGE_ULPS = 1.0
"""Writing X <- X(1 - lr wd) - lr s O into the parameter dtype rounds twice, half an ulp each."""

RELATION_ULPS = 2.0
"""Relations in which rounding cancels (the decay probe, the bf16 scale relation): the related step rounds
twice (decay, update), each parameter of the other run once; 2 ulps bound them."""

EXACT = Tolerance(0.0, 0.0, "exact: two runs of the same arithmetic in fp64 must agree bitwise")
FINITENESS = Tolerance(0.0, 0.0, "finiteness: every parameter value must be finite")
REPLICAS = Tolerance(0.0, 0.0, "replicas: every rank must hold bitwise the parameters of rank 0")


def storage_relation(what: str) -> Tolerance:
    """A relation exact up to RELATION_ULPS ulps of the parameter dtype; `what` names it in the source."""
    return Tolerance(0.0, RELATION_ULPS, f"{what}: exact up to {RELATION_ULPS:g} ulps of the parameter dtype "
                                         f"(storage roundings)")
