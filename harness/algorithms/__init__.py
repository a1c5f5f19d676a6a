"""The harness's record of each algorithm a case can name (`Case.optimizer`), one module each, as
PyTorch's OpInfo has one record per operator: its FP64 oracle, what that oracle orthogonalizes, when its
answer is ill-posed, the relations its steps obey (an equivalent case of another algorithm, layout
invariance), its own robust checks and the optimizer options a case sets for it. Checks, the tolerance
policy and adapters read these records and never branch on an algorithm's name.

Adding an algorithm is four files: its optimizer record (optimizers/algorithms/), its oracle (oracles/),
its record here, and its case entry (cases/algorithms/); every registry discovers them
(tests/test_algorithm_homes.py counts the files that name each algorithm).

Oracle step contract: `step(x, state, g) -> (x, state, margin)` in FP64, `margin` the selection margin of a
selecting algorithm (inf for the others; oracles/dion2_reference.py).
Direction contract (what the tolerance policy reads the spectrum of, harness/policy/sensitivity.py):
`step(m, g) -> (m, mats)`, mats [B, r, c] (or a list of such stacks) the matrices the oracle's step
orthogonalizes, in the declared compute format.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

import numpy as np

from cases import Case, algorithms
from oracles import Conventions

Step = Callable[[np.ndarray, Any, np.ndarray], tuple[np.ndarray, Any, float]]


@dataclass(frozen=True)
class Oracle:
    initial: Any
    step: Step


@dataclass(frozen=True)
class Directions:
    initial: Any
    step: Callable[[Any, np.ndarray], tuple[Any, Any]]


@dataclass(frozen=True)
class AlgorithmInfo:
    """name: `Case.optimizer`; oracle(case, conv): the FP64 reference of one member;
    directions(case, conv): what each FP64 oracle step orthogonalizes (the direction contract);
    ill_posed(case, margin): why a reference comparison with that selection margin is ill-posed;
    selects: its steps select slices by value (the oracle's margin is meaningful);
    local_blocks(case): under a local selection scope, the slice groups each rank selects within (None:
    the scopes coincide);
    equivalent(case): a case of another algorithm whose steps this case's must equal (or None);
    layout_invariant(case): whether a distributed step must equal the single-process step;
    options(case): our optimizer's options for the algorithm's own hyper-parameters a case sets;
    defaults: our optimizer's documented defaults (docs/optimizers.md) as the `Case` fields they set, every
    hyper-parameter a case sets but the lr and the formats: what a defaults case (`Case.construct`) holds;
    includes: the algorithm whose every step this one can take (Dion2 with fraction 1 is Muon), or None:
    its measured rounding bounds this one's from below (harness/policy);
    robust_checks: its own bf16-robust checks beyond norm and probe (harness/judging/robust_checks.py);
    drift: whether its long bf16 runs are judged for drift.
    rows_only: a selecting algorithm that selects rows whatever the matrix's shape (NorDion2)."""

    name: str
    oracle: Callable[[Case, Conventions], Oracle]
    directions: Callable[[Case, Conventions], Directions]
    ill_posed: Callable[[Case, float], str | None] = lambda case, margin: None
    selects: bool = False
    local_blocks: Callable[[Case], list[int] | None] = lambda case: None
    equivalent: Callable[[Case], Case | None] = lambda case: None
    layout_invariant: Callable[[Case], bool] = lambda case: True
    options: Callable[[Case], dict[str, Any]] = lambda case: {}
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    includes: str | None = None
    robust_checks: tuple[str, ...] = ()
    drift: bool = False
    rows_only: bool = False

    @property
    def elementwise(self) -> bool:
        """No matrix stages (its case entry says so: cases/algorithms/)."""
        return algorithms.entry(self.name).elementwise


@functools.cache
def registry() -> dict[str, AlgorithmInfo]:
    """Every record, by name: the `INFO` of each module of this package."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        info = importlib.import_module(f"{__name__}.{module.name}").INFO
        found[info.name] = info
    return found


def algorithm(case: Case | str) -> AlgorithmInfo:
    """The record of `case.optimizer` (or of the name given); KeyError names an algorithm the harness has
    no oracle for."""
    name = case if isinstance(case, str) else case.optimizer
    try:
        return registry()[name]
    except KeyError:
        raise KeyError(f"the harness has no oracle for optimizer {name!r}; known: {tuple(registry())}") from None
