"""What a tensor-parallel setting does to Muon: the TP-dependence table.

For each matrix kind of one transformer block (attention q, k, v, o with heads; MLP gate, up, down),
each TP degree and each mode (oracles/tensor_parallel.py), the relative difference and the cosine
between the update the TP ranks apply and the unsharded update, on one Gaussian gradient in FP64.
Column-parallel matrices (q, k, v, gate, up) are split on dim 0, row-parallel ones (o, down) on dim 1,
as PyTorch's ColwiseParallel / RowwiseParallel (and DeepSpeed's AutoTP) split them.

  gather             exact by construction (the whole matrix is orthogonalized): listed so the
                     table says which modes make each matrix exact
  per_shard          each shard alone: layout dependent
  per_shard+heads    each shard's whole heads alone (column-parallel attention projections): equals
                     per-head orthogonalization of the unsharded matrix, so exact against that

It also computes the kernel-level figures of a published measurement of DeepSpeed's Muon under
AutoTP (Keller Jordan's quintic, 5 steps, Gaussian gradients): per rank at tp 2 for 256x256, and
for 512x1024 split on dim 0 and on dim 1 at tp 2 and 4 (`SEED_FIGURES`: the published values, to
be quoted next to ours). `--out FILE` stores both as JSON, which the reports read
(reports/tp_table.py; computing them takes minutes, so reports never recompute them).

    python benchmarks/tp_dependence.py [--hidden 256 --heads 8 --ffn 512 --seed 0] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oracles import Orthogonalizer
from oracles.tensor_parallel import dependence, orth_tp, orth_whole
from reports.tp_table import STORED

TP_DEGREES = (2, 4)

SEED_FIGURES = (
    # (shape, split dim, tp, published relative difference: per rank for 256x256, whole for the others)
    ((256, 256), 0, 2, 0.53),
    ((512, 1024), 0, 2, 0.34),
    ((512, 1024), 0, 4, 0.38),
    ((512, 1024), 1, 2, 0.68),
    ((512, 1024), 1, 4, 0.66),
)
"""The kernel-level figures a published report measured for per-shard orthogonalization (DeepSpeed's
Muon under AutoTP): relative difference to the unsharded update."""


@dataclass(frozen=True)
class Matrix:
    """One weight of a transformer block: its name, shape [out, in], TP split dim and head count."""

    name: str
    shape: tuple[int, int]
    dim: int
    num_heads: int | None = None


@dataclass(frozen=True)
class Row:
    matrix: str
    shape: tuple[int, int]
    dim: int
    tp: int
    mode: str
    rel_diff: float
    cosine: float
    per_rank: tuple[float, ...]

    @property
    def exact(self) -> bool:
        return self.rel_diff == 0.0


def block(hidden: int, heads: int, ffn: int) -> list[Matrix]:
    """The seven Muon matrices of a Llama-style block (no grouped-query attention)."""
    return [Matrix("q", (hidden, hidden), 0, heads), Matrix("k", (hidden, hidden), 0, heads),
            Matrix("v", (hidden, hidden), 0, heads), Matrix("o", (hidden, hidden), 1),
            Matrix("gate", (ffn, hidden), 0), Matrix("up", (ffn, hidden), 0), Matrix("down", (hidden, ffn), 1)]


def table(hidden: int = 256, heads: int = 8, ffn: int = 512, seed: int = 0,
          orthogonalizer: str = "newton_schulz", steps: int = 5) -> list[Row]:
    """Every (matrix, TP degree, mode) row; Keller Jordan's quintic for 5 steps by default."""
    spec = Orthogonalizer.named(orthogonalizer, steps=steps)
    rows = []
    for k, m in enumerate(block(hidden, heads, ffn)):
        u = np.random.default_rng([seed, k]).standard_normal(m.shape)
        for tp in TP_DEGREES:
            gathered = orth_tp(u, spec, "gather", m.dim, tp)
            rows.append(_row(m, tp, "gather", orth_whole(u, spec), gathered))
            rows.append(Row(m.name, m.shape, m.dim, tp, "per_shard", *_dependence(u, spec, m, tp, None)))
            if m.num_heads is not None and m.dim == 0 and m.num_heads % tp == 0:
                rows.append(Row(m.name, m.shape, m.dim, tp, "per_shard+heads",
                                *_dependence(u, spec, m, tp, m.num_heads)))
    return rows


def _dependence(u: np.ndarray, spec: Orthogonalizer, m: Matrix, tp: int, heads: int | None):
    rel, cos, per_rank = dependence(u, spec, m.dim, tp, heads)
    return rel, cos, tuple(per_rank)


def _row(m: Matrix, tp: int, mode: str, whole: np.ndarray, got: np.ndarray) -> Row:
    rel = float(np.linalg.norm(got - whole) / np.linalg.norm(whole))
    cos = float(np.sum(got * whole) / (np.linalg.norm(got) * np.linalg.norm(whole)))
    return Row(m.name, m.shape, m.dim, tp, mode, rel, cos, ())


def seed_figures(seed: int = 0) -> list[dict]:
    """Our figures for SEED_FIGURES' settings: relative difference, cosine and per-rank differences."""
    spec = Orthogonalizer.named("newton_schulz", steps=5)
    out = []
    for k, (shape, dim, tp, published) in enumerate(SEED_FIGURES):
        u = np.random.default_rng([seed, 100 + k]).standard_normal(shape)
        rel, cos, per_rank = dependence(u, spec, dim, tp)
        out.append(dict(shape=list(shape), dim=dim, tp=tp, published=published, rel_diff=rel, cosine=cos,
                        per_rank=per_rank))
    return out


def store(path: Path, hidden: int, heads: int, ffn: int, seed: int) -> None:
    """Write the table and the seed figures, with how they were made, as JSON."""
    data = dict(command=" ".join(["python benchmarks/tp_dependence.py", *sys.argv[1:]]),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                settings=dict(hidden=hidden, heads=heads, ffn=ffn, seed=seed, orthogonalizer="newton_schulz",
                              steps=5, gradient="gaussian"),
                rows=[dataclasses.asdict(r) for r in table(hidden, heads, ffn, seed)],
                seed_figures=seed_figures(seed))
    path.write_text(json.dumps(data, indent=1) + "\n")


def markdown(rows: list[Row]) -> str:
    """The table as Markdown, one line per row."""
    lines = ["| matrix | shape | split | tp | mode | rel. difference | cosine | per rank | exact |",
             "|---|---|---|---:|---|---:|---:|---|---|"]
    for r in rows:
        split = "dim 0 (column-parallel)" if r.dim == 0 else "dim 1 (row-parallel)"
        ranks = ", ".join(f"{x:.3f}" for x in r.per_rank)
        lines.append(f"| {r.matrix} | {r.shape[0]}x{r.shape[1]} | {split} | {r.tp} | {r.mode} | {r.rel_diff:.3g} | "
                     f"{r.cosine:.4f} | {ranks} | {'yes' if r.exact else 'no'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python benchmarks/tp_dependence.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help=f"store the table and seed figures as JSON (the reports read {STORED.name})")
    args = parser.parse_args()
    if args.out:
        store(args.out, args.hidden, args.heads, args.ffn, args.seed)
        return
    print(markdown(table(args.hidden, args.heads, args.ffn, args.seed)))


if __name__ == "__main__":
    main()
