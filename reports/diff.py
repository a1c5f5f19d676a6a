"""What changed between two runs, record by record, keyed by `Record.key`.

Every key of either run lands in exactly one of these, or in none when nothing
about it changed:

  new_failures    head fail/error; base pass/unsupported/skipped, or the key is new
  fixed           base fail/error; head pass
  status_changed  any other change of status (pass -> skipped, fail -> error, error -> unsupported, ...)
  error_grew      same status in both, pass or fail, both ratios finite,
                  head.ratio > growth * base.ratio and head.ratio > floor
  error_shrank    the mirror image: base.ratio > growth * head.ratio and base.ratio > floor
  appeared        the key is only in head and does not fail there
  vanished        the key is only in base

and, independently of those, a key in both runs is in

  tolerance_changed  tolerance (NaN equal to NaN) or tolerance_source differ

Two runs are *comparable* when they judged the same tier, target(s), backends and case
selection, and both completed or both did not (`incomparable` says how they differ); a diff
of others lists cases as vanished and appeared that no change made, so the command line
refuses it unless forced.

Pairs are keyed by `Record.key` (case, check, target, backend, world size), or, across backends
(`across_backends=True`: gloo against nccl, cpu against cuda), by the same without the backend, so
that each check of a case on one backend meets the same check of that case on the other. Each
record was judged against the same FP64 reference with its own device class's tolerance, so the
categories below say where the backends differ beyond tolerance: a check that passes on one and
fails or errors on the other, or whose error ratio grew; two passing records' updates are within
rel_err(base) + rel_err(head) of each other (relative to the reference update).

A pair is a *regression* when it is a new failure, an error that grew, or a check
that passed in base and no longer runs in head (unsupported, skipped or vanished):
a check that silently stops running counts against the head run. Across backends only a new
failure is (see `is_regression`).
`Diff.regressed` is True iff at least one pair is a regression.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reports.records import STATUSES, Record

Pair = tuple[Record | None, Record | None]
"""(base record, head record); None where the key is absent from that run."""

CATEGORIES: tuple[str, ...] = (
    "new_failures", "error_grew", "status_changed", "vanished",
    "appeared", "tolerance_changed", "error_shrank", "fixed",
)
"""Every category, in report order: the ones that can regress first."""

DEFAULT_GROWTH = 2.0
"""Factor by which an error/tolerance ratio must grow to count as grown."""

COMPARABLE_BY: tuple[str, ...] = ("tier", "targets", "backends", "selection", "complete")
"""Context keys (as from `reports.store.load_run`) that two comparable runs share."""


def incomparable(base: Mapping[str, Any], head: Mapping[str, Any],
                 keys: tuple[str, ...] = COMPARABLE_BY) -> list[str]:
    """How the contexts of two runs differ in `keys`, one phrase per key ("tier 'ci' vs 'nightly'");
    empty when comparable. A key that either run did not record is not compared."""
    return [f"{key} {_shown(base[key])} vs {_shown(head[key])}" for key in keys
            if key in base and key in head and _listed(base[key]) != _listed(head[key])]


def _listed(value: Any) -> Any:
    """A tuple as the list JSON stores it."""
    return list(value) if isinstance(value, tuple) else value


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return repr(",".join(map(str, value)) or "(all)")
    return repr(value)

@dataclass(frozen=True)
class Diff:
    """The categorised pairs of two runs (see the module docstring), each list worst first."""

    growth: float
    floor: float
    compared: int
    """Keys present in both runs."""
    across_backends: bool = False
    """Pairs were keyed without the backend (see the module docstring)."""
    new_failures: list[Pair] = field(default_factory=list)
    fixed: list[Pair] = field(default_factory=list)
    error_grew: list[Pair] = field(default_factory=list)
    error_shrank: list[Pair] = field(default_factory=list)
    appeared: list[Pair] = field(default_factory=list)
    vanished: list[Pair] = field(default_factory=list)
    status_changed: list[Pair] = field(default_factory=list)
    tolerance_changed: list[Pair] = field(default_factory=list)

    def categories(self) -> dict[str, list[Pair]]:
        """Category name to its pairs, in `CATEGORIES` order."""
        return {name: getattr(self, name) for name in CATEGORIES}

    def regressions(self) -> list[tuple[str, Pair]]:
        """(category, pair) of every pair that makes the head run a regression, in category order."""
        return [(name, pair) for name, pairs in self.categories().items() for pair in pairs
                if is_regression(name, pair, self.across_backends)]

    @property
    def regressed(self) -> bool:
        """True iff a new failure, a grown error, or a passing check that stopped running."""
        return bool(self.regressions())


def diff_runs(base: list[Record], head: list[Record], *, growth: float = DEFAULT_GROWTH, floor: float = 1e-3,
              across_backends: bool = False) -> Diff:
    """Compare `head` against `base` record by record, keyed by `Record.key`, or without its backend
    when `across_backends`; ValueError on a key repeated within a run (across backends: a case run on
    two backends in one run)."""
    if not (math.isfinite(growth) and growth >= 1.0):
        raise ValueError(f"growth must be a finite number of at least 1, got {growth}")
    key = case_key if across_backends else record_key
    old, new = _by_key(base, "base", key), _by_key(head, "head", key)
    diff = Diff(growth=growth, floor=floor, compared=len(old.keys() & new.keys()), across_backends=across_backends)
    for key in old.keys() | new.keys():
        pair = (old.get(key), new.get(key))
        category = _category(*pair, growth, floor)
        if category is not None:
            getattr(diff, category).append(pair)
        if _tolerance_changed(*pair):
            diff.tolerance_changed.append(pair)
    for name, pairs in diff.categories().items():
        pairs.sort(key=_ORDER[name])
    return diff


def growth_factor(pair: Pair) -> float:
    """head.ratio / base.ratio; inf when only base's is 0, NaN when either is missing or NaN."""
    base, head = pair
    if base is None or head is None or math.isnan(base.ratio) or math.isnan(head.ratio):
        return math.nan
    if base.ratio == 0:
        return 1.0 if head.ratio == 0 else math.inf
    return head.ratio / base.ratio


def is_regression(category: str, pair: Pair, across_backends: bool = False) -> bool:
    """Whether `pair`, listed under `category`, makes the head run a regression. Across backends
    only a new failure is: each record is within its own device class's tolerance, a relation exact
    on one backend (ratio 0) may use different kernels on the other (a finite ratio, or ill-posed
    there and skipped), so a grown ratio or a check the other backend cannot judge is listed, not
    charged."""
    if category == "new_failures":
        return True
    if across_backends:
        return False
    if category == "error_grew":
        return True
    return category in ("status_changed", "vanished") and pair[0].status == "pass"


def record_key(record: Record) -> tuple:
    """The pairing key of a diff of one backend's runs: `Record.key`."""
    return record.key


def case_key(record: Record) -> tuple:
    """The pairing key of a diff across backends: (case, check, target, world size)."""
    return (record.case_id, record.check, record.target, record.world_size)


def _by_key(records: Iterable[Record], run: str, key: Callable[[Record], tuple]) -> dict[tuple, Record]:
    keyed: dict[tuple, Record] = {}
    for r in records:
        k = key(r)
        if k in keyed:
            across = "" if key is record_key else (f" (backends {keyed[k].backend} and {r.backend}: a diff across "
                                                   f"backends needs each case on one backend per run)")
            raise ValueError(f"{run} run has the key {k} twice{across}; a diff needs one record per key")
        keyed[k] = r
    return keyed


def _category(base: Record | None, head: Record | None, growth: float, floor: float) -> str | None:
    """The one status/ratio category of a pair, None when it did not change."""
    if base is None:
        return "new_failures" if head.failing else "appeared"
    if head is None:
        return "vanished"
    if head.failing and not base.failing:
        return "new_failures"
    if base.failing and head.status == "pass":
        return "fixed"
    if base.status != head.status:
        return "status_changed"
    if _grew(base, head, growth, floor):
        return "error_grew"
    if _grew(head, base, growth, floor):
        return "error_shrank"
    return None


def _grew(before: Record, after: Record, growth: float, floor: float) -> bool:
    """Both pass or both fail, with finite ratios, and after's beyond growth x before's and `floor`."""
    if before.status != after.status or before.status not in ("pass", "fail"):
        return False
    if not (math.isfinite(before.ratio) and math.isfinite(after.ratio)):
        return False
    return after.ratio > growth * before.ratio and after.ratio > floor


def _tolerance_changed(base: Record | None, head: Record | None) -> bool:
    if base is None or head is None:
        return False
    same = base.tolerance == head.tolerance or (math.isnan(base.tolerance) and math.isnan(head.tolerance))
    return not same or base.tolerance_source != head.tolerance_source


_SEVERITY = {s: i for i, s in enumerate(STATUSES)}


def _worst(record: Record) -> tuple[int, float]:
    """Sort key of one record: worse status first, then larger ratio (NaN last)."""
    return (_SEVERITY[record.status], -record.ratio if not math.isnan(record.ratio) else math.inf)


def _by_head(pair: Pair) -> tuple:
    return (*_worst(pair[1]), pair[1].key)


def _by_base(pair: Pair) -> tuple:
    return (*_worst(pair[0]), pair[0].key)


def _by_growth(pair: Pair) -> tuple:
    return (-growth_factor(pair), pair[1].key)


def _by_shrink(pair: Pair) -> tuple:
    return (growth_factor(pair), pair[1].key)


def _by_lost_pass(pair: Pair) -> tuple:
    """A pass that stopped running first, then the worse base record."""
    return (pair[0].status != "pass", *_by_base(pair))


def _by_tolerance_change(pair: Pair) -> tuple:
    """Largest relative change of tolerance first; a change of source only, or NaN, last."""
    old, new = pair[0].tolerance, pair[1].tolerance
    change = abs(math.log(new / old)) if old > 0 and new > 0 else math.nan
    return (-change if not math.isnan(change) else math.inf, pair[1].key)


_ORDER: dict[str, Callable[[Pair], tuple]] = {
    "new_failures": _by_head,
    "error_grew": _by_growth,
    "status_changed": _by_lost_pass,
    "vanished": _by_lost_pass,
    "appeared": _by_head,
    "tolerance_changed": _by_tolerance_change,
    "error_shrank": _by_shrink,
    "fixed": _by_base,
}
