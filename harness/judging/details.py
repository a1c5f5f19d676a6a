"""Pictures' data for the worst reference checks of a run, taken from the run that was judged.

The reference check keeps, for its worst member and step (the one its metrics come from), the
judged and the reference update as [out, prod(rest)] matrices (`harness.judging.outcome.Evidence`). The
runner offers each reference record and its evidence to a `Pictures` keeper, which holds only the
`limit` worst (so memory stays bounded on any tier) and, at the end, turns them into `Detail`s:
the elementwise error and the singular values of both updates. A distributed record's evidence is
its gathered distributed trajectory, never a single-process rerun.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.judging.outcome import Evidence
from oracles import singular_values
from reports import Record, worst_first

HEATMAP_CELLS = 2**15
"""The most cells a pooled picture's error matrix keeps (`pooled`). Drawn whole, one gpu-tier error
(2048 x 4608) is 9.4 million SVG rectangles, 85 s of Python and a 1 GB report.html."""
POOL_ABOVE = 2**17
"""Error matrices of more elements than this are pooled (`pooled`); smaller ones are kept element by element:
every CI and nightly matrix (the largest, 384 x 96, has 36864 elements)."""

Key = tuple[str, str, str, str, int]
"""Record.key: (case id, check, target, backend, world size)."""


@dataclass(frozen=True)
class Detail:
    key: Key
    where: str
    error: np.ndarray
    sv_judged: np.ndarray
    sv_reference: np.ndarray


def pooled(error: np.ndarray) -> tuple[np.ndarray, int]:
    """(|error| pooled into b x b blocks, each the block's largest |err|, b) for a matrix of more than
    POOL_ABOVE elements, b the least block side that leaves at most HEATMAP_CELLS cells; (error, 1) else."""
    m, n = error.shape
    if m * n <= POOL_ABOVE:
        return error, 1
    b = max(2, math.ceil(math.sqrt(m * n / HEATMAP_CELLS)))
    while math.ceil(m / b) * math.ceil(n / b) > HEATMAP_CELLS:
        b += 1
    rows, cols = math.ceil(m / b), math.ceil(n / b)
    padded = np.zeros((rows * b, cols * b))
    padded[:m, :n] = np.abs(error)
    return padded.reshape(rows, b, cols, b).max(axis=(1, 3)), b


class Pictures:
    """Keeps the evidence of the `limit` worst reference checks that ran (pass or fail with a finite
    ratio), in `reports.worst_first` order: as `Evidence`, or as a `Detail` already made from it (by a
    `--jobs` worker, `kept_details`: the singular values of a gpu-tier update are seconds of LAPACK each)."""

    def __init__(self, limit: int = 8) -> None:
        if limit < 0:
            raise ValueError(f"Pictures: limit must be >= 0, got {limit}")
        self.limit = limit
        self._kept: dict[Key, tuple[Record, Evidence | Detail]] = {}

    def offer(self, record: Record, evidence: Evidence | Detail | None) -> None:
        """Keep `evidence` if `record` is among the `limit` worst reference checks offered so far."""
        if (evidence is None or record.check != "reference" or record.status not in ("pass", "fail")
                or not math.isfinite(record.ratio)):
            return
        self._kept[record.key] = (record, evidence)
        ranked = worst_first(r for r, _ in self._kept.values())[:self.limit]
        self._kept = {r.key: self._kept[r.key] for r in ranked}

    def kept(self) -> list[tuple[Record, Evidence | Detail]]:
        """The kept (record, evidence) pairs, worst first: what another process's keeper can `offer`."""
        return [self._kept[r.key] for r in worst_first(r for r, _ in self._kept.values())]

    def kept_details(self) -> list[tuple[Record, Detail]]:
        """The kept pairs with each evidence made into its `Detail` here (in a worker process, beside the others)."""
        return [(record, _detail(record, evidence)) for record, evidence in self.kept()]

    def details(self) -> list[Detail]:
        """The kept checks' pictures' data, worst first."""
        return [_detail(record, evidence) for record, evidence in self.kept()]


def _detail(record: Record, evidence: Evidence | Detail) -> Detail:
    """The picture's data of one reference check: the (pooled) elementwise error and both updates' singular values."""
    if isinstance(evidence, Detail):
        return evidence
    error, block = pooled(evidence.judged - evidence.reference)
    where = evidence.where + (f" (heatmap of {evidence.judged.shape[0]} x {evidence.judged.shape[1]}: "
                              f"each cell the largest |err| of a {block} x {block} block)" if block > 1 else "")
    return Detail(record.key, where, error, singular_values(evidence.judged), singular_values(evidence.reference))
