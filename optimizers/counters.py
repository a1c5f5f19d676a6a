"""What an optimizer's steps computed, counted on the optimizer (`Muon.stats`).

`Muon.step` runs inside `counting(self.stats)`; the code that does the counted work adds to the innermost
counting scope of its thread and context (`current()`; outside any, nothing is counted): Gram Newton–Schulz its
matrices and its divergence fallbacks, the Triton symmetric kernel its products, a plan's CUDA graph its failed
captures. A step's rehearsal on meta tensors (optimizers/plan.py `rehearse`) runs in a scope of its own that
counts nothing.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Iterator


@dataclass
class Stats:
    """Counts of one optimizer's work since it was made (or since its owner reset them).

    gram: matrices Gram Newton–Schulz computed by the Gram iteration (wide or tall matrices);
    fallbacks: of those, results that diverged and were recomputed by the standard iteration (the first one
      also warns: optimizers/gram_newton_schulz.py);
    products: symmetric products computed by the Triton kernel, as launched from Python (a CUDA graph's
      replays run the products it captured without counting them again);
    variants: those products by the kernel variant that ran (optimizers/symmetric_triton.py);
    capture_failures: captures of a plan's CUDA graph that failed; each leaves its plan stepping eagerly, with the
      same bits, and warns (optimizers/graphs.py).
    """

    gram: int = 0
    fallbacks: int = 0
    products: int = 0
    variants: dict[str, int] = field(default_factory=dict)
    capture_failures: int = 0


_SCOPE: ContextVar[Stats | None] = ContextVar("optimizers.counters.scope", default=None)
"""The innermost `counting` scope of this thread and context."""


@contextlib.contextmanager
def counting(stats: Stats | None) -> Iterator[Stats | None]:
    """Within: the counted work adds to `stats` (None: to nothing)."""
    token = _SCOPE.set(stats)
    try:
        yield stats
    finally:
        _SCOPE.reset(token)


def current() -> Stats | None:
    """The Stats the counted work adds to here, or None."""
    return _SCOPE.get()
