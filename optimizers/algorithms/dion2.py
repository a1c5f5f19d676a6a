"""Dion2 and NorDion2: Muon on a selected fraction of each matrix's slices, with error feedback.

Per matrix [m, n] of a parameter's matrix view (flatten: the one matrix [out, prod(rest)], so
the slices of a convolution are output channels or input-kernel columns, never kernel rows;
otherwise the trailing matrices of a 3-D+ tensor):

  M <- M + G
  slices: the rows if m <= n, else the columns (NorDion2: always the rows)
  S = the k = max(1, ceil(fraction * #slices)) slices of largest L1 norm in M; equal norms are
      taken in ascending index order (a stable descending sort)
  U = M[S];  M[S] <- ef_decay * M[S]          error feedback, on the selected slices only
  O = orth(U)                                  the selected submatrix alone
  X <- X (1 - lr wd);  X[S] <- X[S] - lr scale O   scale from the FULL matrix view, as Muon's

Selection scope of a sharded parameter (DTensor Shard(d)): "global" takes the top-k of the
whole matrix, so the step does not depend on the layout; "local" lets every rank take the
top-k of the slices it holds (max(1, ceil(fraction * n_r)) of its n_r, none of none), as
Microsoft's `dion` does on its row-sharded path: the selected set then depends on the layout.
Where the layout does not split the slices among the ranks (replicated, a batch dim of an
unflattened tensor, or the other side of the matrix) the two scopes coincide.
"""

from __future__ import annotations

import math

import torch

from optimizers.matrix_view import matrix_dims


def select_count(n: int, fraction: float) -> int:
    """How many of `n` slices are selected: max(1, ceil(fraction n)), none of none."""
    return max(1, math.ceil(fraction * n)) if n else 0


def selects_rows(shape: tuple[int, ...], flatten: bool, rows_only: bool) -> bool:
    """True if the slices of a parameter of `shape` are the rows of its matrix view."""
    m, n = matrix_dims(shape, flatten)
    return rows_only or m <= n


def reduced_dims(ndim: int, flatten: bool, rows: bool) -> tuple[int, ...]:
    """The parameter dims a slice's L1 norm sums over (the other dims index the slices)."""
    if flatten:
        return tuple(range(1, ndim)) if rows else (0,)
    return (ndim - 1,) if rows else (ndim - 2,)


def slice_norms(m: torch.Tensor, flatten: bool, rows: bool) -> torch.Tensor:
    """L1 norm of every slice of `m`, at parameter rank (reduced dims kept as 1), in at least fp32."""
    work = torch.promote_types(m.dtype, torch.float32)
    return m.abs().to(work).sum(dim=reduced_dims(m.ndim, flatten, rows), keepdim=True)


def top_k_mask(norms: torch.Tensor, fraction: float, groups: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean mask [B, n] of the selected slices of each row of `norms` [B, n]: the select_count
    largest, ties to the lower index. `groups` (local scope; [B, n] or [n], integer ids): within
    each row, every group selects its own select_count of its members."""
    order = torch.sort(norms, dim=-1, descending=True, stable=True).indices
    if groups is None:
        mask = torch.zeros(norms.shape, dtype=torch.bool, device=norms.device)
        return mask.scatter_(-1, order[:, :select_count(norms.shape[-1], fraction)], True)
    groups = groups.expand(norms.shape)
    sorted_groups = torch.gather(groups, -1, order)
    mask = torch.zeros(norms.shape, dtype=torch.bool, device=norms.device)
    for gid in groups.unique().tolist():
        member = sorted_groups == gid                       # in descending-norm order
        place = member.cumsum(dim=-1)                       # 1-based rank within the group
        counts = member.sum(dim=-1, keepdim=True)
        # select_count per row, in float64 as Python computes it: max(1, ceil(fraction n)), 0 of 0
        limit = torch.where(counts > 0, torch.ceil(counts.double() * fraction).clamp(min=1), 0)
        mask |= torch.zeros_like(mask).scatter_(-1, order, member & (place <= limit))
    return mask


def error_feedback(m: torch.Tensor, mask: torch.Tensor, ef_decay: float) -> None:
    """M[S] <- ef_decay M[S] in place (`mask` broadcasts over `m`; other entries untouched)."""
    m.copy_(torch.where(mask, m * ef_decay, m))


def gather_selected(mats: torch.Tensor, rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(submatrices, indices) of the nonzero slices of each matrix of `mats` [B, m, n] (the
    direction with its unselected slices zeroed): [B, K, n] or [B, m, K], K the largest count of
    nonzero slices in the batch (at least 1), indices [B, K] ascending within each matrix."""
    norms = mats.abs().sum(dim=-1 if rows else -2)
    k = max(1, int((norms > 0).sum(dim=-1).max())) if norms.numel() else 1
    order = torch.sort(norms, dim=-1, descending=True, stable=True).indices[:, :k]
    idx = order.sort(dim=-1).values
    return torch.gather(mats, -2 if rows else -1, _expand(idx, mats, rows)), idx


def scatter_selected(sub: torch.Tensor, idx: torch.Tensor, like: torch.Tensor, rows: bool) -> torch.Tensor:
    """Inverse placement of `gather_selected`: `sub` written at slices `idx` of zeros shaped `like`,
    and only where `like`'s slice is nonzero (a zero filler slice of a short matrix stays zero)."""
    out = torch.zeros_like(like).scatter_(-2 if rows else -1, _expand(idx, like, rows), sub.to(like.dtype))
    nonzero = like.abs().sum(dim=-1 if rows else -2, keepdim=True) > 0
    return torch.where(nonzero, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _expand(idx: torch.Tensor, mats: torch.Tensor, rows: bool) -> torch.Tensor:
    if rows:
        return idx.unsqueeze(-1).expand(*idx.shape, mats.shape[-1])
    return idx.unsqueeze(-2).expand(idx.shape[0], mats.shape[-2], idx.shape[-1])
