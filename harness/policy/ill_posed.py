"""When a comparison cannot tell rounding from a bug: every ill-posedness rule of the policy, in one place.
A check whose comparison is ill-posed records `skipped` with the rule's reason, never pass or fail.

  reference rtol   a derived rtol above ILL_POSED_RTOL (harness/policy/tolerance.py)
  SVD rank         an SVD whose rank cut-off falls among the singular values (oracles' `ambiguous_rank`); and
                   a relation across layouts of an SVD case whose reference rtol is ill-posed (for_relation)
  selection tie    the k-th and (k+1)-th slice L1 norms within the momentum's rounding (`selection_ill_posed`)
  noise ceiling    a robust statistic whose allowance reaches NOISE_CEILING (harness/policy/noise.py)
"""

from __future__ import annotations

from cases import Case
from oracles.rounding import machine_epsilon

ILL_POSED_RTOL = 0.25
"""Above this derived rtol the reference comparison cannot tell rounding from a bug (a megabatch that
mixes layers moves the update by ~0.7 of its norm, a wrong lr scale by more): skipped as ill-posed."""

NOISE_CEILING = 1.0
"""A robust statistic whose allowance reaches this is not judged: each is a relative error or a log ratio,
and an allowance of 1 (the update's norm off by 100%, singular values off by a factor e) passes what a
wrong update shows, so judging would only pretend."""

SELECTION_TIE_FACTOR = 4.0
"""A selection is ill-posed when the k-th and (k+1)-th slice L1 norms are closer (relatively) than
SELECTION_TIE_FACTOR x steps x u(parameter dtype). The target selects from its momentum buffer, kept in the
parameter's dtype: every step rounds it twice (M + G, then ef_decay M), each by up to u relative, so after
s steps its norms can sit 2 s u from the FP64 ones; the factor 2 above that covers the norm's own
summation."""


def selection_ill_posed(case: Case, margin: float) -> str | None:
    """Why a selection whose k-th and (k+1)-th slice norms differ by `margin` (relative) may go either way."""
    bound = SELECTION_TIE_FACTOR * case.steps * machine_epsilon(case.param_dtype) / 2.0
    if margin < bound:
        return (f"ill-posed selection: the k-th and (k+1)-th slice L1 norms differ by {margin:.3g} relative, "
                f"within the {case.param_dtype} momentum's rounding over {case.steps} steps ({bound:.3g}), so "
                f"either slice may be selected")
    return None
