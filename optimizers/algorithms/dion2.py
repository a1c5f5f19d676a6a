"""Dion2 and NorDion2: Muon on a selected fraction of each matrix's slices, with error feedback.

Per matrix [m, n] of a parameter's matrix view (flatten: the one matrix [out, prod(rest)], so
the slices of a convolution are output channels or input-kernel columns, never kernel rows;
otherwise the trailing matrices of a 3-D+ tensor):

  M <- M + G
  slices: the rows if m <= n, else the columns (NorDion2: always the rows)
  S = the k = max(1, ceil(fraction * #slices)) slices of largest L1 norm in M; equal norms are
      taken in ascending index order (a stable descending sort; dion's torch.topk(sorted=False)
      leaves the order of ties unspecified)
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

import dataclasses
import math
import types
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from optimizers.algorithms.base import Algorithm, Group, State, StateKey, parameter_shape
from optimizers.algorithms.muon import MUON, matrix_lr_scale, orthogonalize_group, validate_muon
from optimizers.algorithms.normuon import NORMUON, restore_factor, validate_variance
from optimizers.distributed import chunk_sizes, local
from optimizers.matrix_view import as_matrices, matrix_dims
from optimizers.norms import frobenius
from optimizers.validation import check_real


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


FP64_NORM_SCALE = 2.0**-64
"""The power of two fp64 slices are scaled by before their L1 norms are summed: no sum of fewer than 2^63
entries then overflows, and their order (all the selection reads) is kept (but among slices of entries
below 2^-958, which it flushes to zero)."""


def slice_norms(m: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """L1 norm of every slice of `m` (summed over `dims`, kept as size 1: parameter rank), in fp64 (the
    oracle's precision), where no sum of fp32 or bf16 values overflows (fp32 sums overflow from 3.4e38 / length);
    of an fp64 `m`, times FP64_NORM_SCALE."""
    if m.dtype == torch.float64:
        m = m * FP64_NORM_SCALE
    return torch.linalg.vector_norm(m, 1, dim=dims, keepdim=True, dtype=torch.float64)


def descending(norms: torch.Tensor) -> torch.Tensor:
    """Indices sorting each row of `norms` [B, n] by decreasing value, ties to the lower index; a NaN
    ranks as +inf, above every finite value (the non-finite policy: optimizers/algorithms/base.py)."""
    return torch.sort(torch.nan_to_num(norms, nan=math.inf, posinf=math.inf), dim=-1, descending=True,
                      stable=True).indices


def top_k_mask(norms: torch.Tensor, fraction: float, groups: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean mask [B, n] of the selected slices of each row of `norms` [B, n]: the select_count
    largest (`descending`: a norm that is not finite is selected first), ties to the lower index.
    `groups` (local scope; [B, n] or [n], integer ids): within each row, every group selects its own
    select_count of its members."""
    order = descending(norms)
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


def gather_selected(mats: torch.Tensor, rows: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(submatrices, indices) of the nonzero slices of each matrix of `mats` [B, m, n] (the
    direction with its unselected slices zeroed): [B, K, n] or [B, m, K], K the largest count of
    nonzero slices in the batch (at least 1), indices [B, K] ascending within each matrix.
    When every slice is nonzero, `mats` itself and None (no copy: the matrices Muon would see).
    A slice holding a NaN is nonzero (its L1 norm is NaN, not 0); an L1 norm that overflows is +inf."""
    norms = mats.abs().sum(dim=-1 if rows else -2)
    k = max(1, int((norms != 0).sum(dim=-1).max())) if norms.numel() else 1
    if k == norms.shape[-1]:
        return mats, None
    order = descending(norms)[:, :k]
    idx = order.sort(dim=-1).values
    return torch.gather(mats, -2 if rows else -1, _expand(idx, mats, rows)), idx


def scatter_selected(sub: torch.Tensor, idx: torch.Tensor | None, like: torch.Tensor, rows: bool) -> torch.Tensor:
    """Inverse placement of `gather_selected`: `sub` written at slices `idx` of zeros shaped `like`,
    and only where `like`'s slice is nonzero (a zero filler slice of a short matrix stays zero)."""
    out = sub if idx is None else torch.zeros_like(like).scatter_(-2 if rows else -1, _expand(idx, like, rows),
                                                                  sub.to(like.dtype))
    nonzero = like.abs().sum(dim=-1 if rows else -2, keepdim=True) != 0  # NaN: nonzero (gather_selected)
    return torch.where(nonzero, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _expand(idx: torch.Tensor, mats: torch.Tensor, rows: bool) -> torch.Tensor:
    if rows:
        return idx.unsqueeze(-1).expand(*idx.shape, mats.shape[-1])
    return idx.unsqueeze(-2).expand(idx.shape[0], mats.shape[-2], idx.shape[-1])


# --- The algorithm records -------------------------------------------------------------------
#
# Where each piece runs (optimizers/algorithms/base.py):
#   direction    (every rank, its local piece)  M <- M + G; the selection from the slice norms
#                (summed over the ranks by one all-reduce when the parameter is sharded); error
#                feedback on the selected slices; returns M with the unselected slices zeroed
#   select       (the owner, whole matrices)    gathers the nonzero (= selected) slices
#   orthogonalize                               the selected submatrices [B, k, n] or [B, m, k]
#   expand                                      back into zeros at the selected slices
#   postprocess  (every rank)                   NorDion2: NorMuon's normalisation of the selected
#                                               rows (their nonzero updates), v updated only there
#   apply                                       X (1 - lr wd) - lr scale O; scale of the full view
# Knowing the selection on every rank makes the error feedback exact (no mask is inferred from
# the orthogonalized result, as dion's global path does).


def validate_dion2(where: str, group: Group) -> None:
    """Muon's matrix options, plus fraction in (0, 1], ef_decay in [0, 1], selection_scope in
    SCOPES, and no Nesterov (Dion2 has no Nesterov form)."""
    validate_muon(where, group)
    check_real(where, "fraction", group["fraction"], 0.0, 1.0)
    if group["fraction"] == 0.0:
        raise ValueError(f"{where}: fraction must be in (0, 1], got 0")
    check_real(where, "ef_decay", group["ef_decay"], 0.0, 1.0)
    if group["selection_scope"] not in SCOPES:
        raise ValueError(f"{where}: selection_scope must be one of {SCOPES}, got {group['selection_scope']!r}")
    if group["nesterov"]:
        raise ValueError(f"{where}: Dion2 has no Nesterov form; nesterov must be False")
    if group["tp_mode"] != "gather" or group["num_heads"] is not None:
        raise ValueError(f"{where}: Dion2 takes tp_mode='gather' and num_heads=None only (got tp_mode="
                         f"{group['tp_mode']!r}, num_heads={group['num_heads']!r}): its selection is defined on "
                         f"whole matrices")


def one_dim_mesh(where: str, index: int, p: torch.Tensor) -> None:
    """Layout rule of Dion2: its sharded selection reads one Shard placement, so a mesh of 2+ dims is refused."""
    if p.device_mesh.ndim != 1:
        raise ValueError(f"{where}: Dion2 parameter {index} lives on a {p.device_mesh.ndim}-D DeviceMesh "
                         f"{tuple(p.device_mesh.shape)}; Dion2 supports 1-D meshes only")


def validate_nordion2(where: str, group: Group) -> None:
    """Dion2's options plus NorMuon's beta2 and variance_eps."""
    validate_dion2(where, group)
    validate_variance(where, group)


def _shard(stored: torch.Tensor) -> tuple[int, int, int, int, Any] | None:
    """(dim, offset, size, world, process group) of a Shard(d) DTensor's local piece; None otherwise."""
    if not isinstance(stored, DTensor) or not isinstance(stored.placements[0], Shard):
        return None
    dim, mesh = stored.placements[0].dim, stored.device_mesh
    world, rank = mesh.size(), mesh.get_local_rank()
    sizes = chunk_sizes(stored.shape[dim], world)
    return dim, sum(sizes[:rank]), sizes[rank], world, mesh.get_group()


def selection_mask(m: torch.Tensor, stored: torch.Tensor, group: Group, rows_only: bool) -> torch.Tensor:
    """The selected slices of this rank's momentum piece `m` (of the parameter state `stored`,
    a DTensor when sharded): a boolean mask at parameter rank that broadcasts over `m`."""
    shape, flatten = tuple(stored.shape), group["flatten"]
    summed = reduced_dims(len(shape), flatten, selects_rows(shape, flatten, rows_only))
    norms = slice_norms(m, summed)
    full_shape = tuple(1 if d in summed else s for d, s in enumerate(shape))
    shard, labels = _shard(stored), None
    if shard is not None:
        dim, offset, size, world, pg = shard
        if dim not in summed:  # this rank holds whole slices: place its norms among all
            whole = norms.new_zeros(full_shape)
            whole.narrow(dim, offset, size).copy_(norms)
            norms = whole
            if group["selection_scope"] == "local":
                owner = torch.repeat_interleave(torch.arange(world, device=m.device),
                                                torch.tensor(chunk_sizes(shape[dim], world), device=m.device))
                labels = owner.reshape([-1 if d == dim else 1 for d in range(len(shape))]).expand(full_shape)
        dist.all_reduce(norms, group=pg)  # whole slices: exact (zeros elsewhere); pieces: their sum
    batch = 1 if flatten or len(shape) == 2 else math.prod(shape[:-2])
    mask = top_k_mask(norms.reshape(batch, -1), group["fraction"],
                      None if labels is None else labels.reshape(batch, -1)).reshape(full_shape)
    if shard is not None and shard[0] not in summed:
        mask = mask.narrow(shard[0], shard[1], shard[2])
    return mask


def selected_direction(grad: torch.Tensor, state: State, group: Group, rows_only: bool = False) -> torch.Tensor:
    """Direction stage: M <- M + G; U = M on the selected slices, 0 elsewhere; M[S] <- ef_decay M[S]."""
    stored = state["momentum"]
    m = local(stored)
    m.add_(local(grad))
    mask = selection_mask(m, stored, group, rows_only)
    u = torch.where(mask, m, torch.zeros((), dtype=m.dtype, device=m.device))
    error_feedback(m, mask, group["ef_decay"])
    return u


def row_direction(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """NorDion2's direction stage: the selection is over rows (output channels) always."""
    return selected_direction(grad, state, group, rows_only=True)


def _selector(rows_only: bool) -> Callable[[torch.Tensor, Group], tuple[torch.Tensor, Callable]]:
    def select(mats: torch.Tensor, group: Group) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
        """Select stage: the nonzero (selected) slices of each whole matrix, and their placement back."""
        rows = rows_only or mats.shape[-2] <= mats.shape[-1]
        sub, idx = gather_selected(mats, rows)
        return sub, lambda done: scatter_selected(done, idx, mats, rows)
    return select


def normalise_selected_rows(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    """Postprocess stage of NorDion2: NorMuon's row normalisation of each member's selected rows
    (its nonzero update rows; this rank's, under Shard(0)), the variance updated only there, as
    dion's nordion2.py does (it gathers v at the selected rows and scatters them back):
      v[S] <- beta2 v[S] + (1 - beta2) mean_row(O^2);  N = O / (sqrt(v[S]) + eps);  N <- N ||O|| / ||N||
    On a contiguous copy, as NorMuon's (optimizers/algorithms/normuon.py): the bits do not depend on
    the memory layout the matrix update left."""
    n = updates.shape[0]
    if updates.numel() == 0:
        return updates
    work = torch.promote_types(updates.dtype, torch.float32)
    mats = as_matrices(updates.contiguous(), group["flatten"]).to(work)
    variances = [local(s["variance"]) for s in states]
    v = torch.stack(variances).to(work).reshape(mats.shape[0], mats.shape[1], 1)
    selected = mats.abs().sum(dim=-1, keepdim=True) != 0  # NaN: selected (gather_selected)
    v = torch.where(selected, torch.lerp(mats.square().mean(dim=-1, keepdim=True), v, group["beta2"]), v)
    normed = torch.where(selected, mats / (v.sqrt() + group["variance_eps"]), torch.zeros((), dtype=work))
    norm_o = frobenius(mats.reshape(n, -1), 1, keepdim=True)
    norm_n = frobenius(normed.reshape(n, -1), 1, keepdim=True)
    factor = restore_factor(norm_o, norm_n)
    for buffer, new in zip(variances, v.reshape(n, *variances[0].shape).unbind(0)):
        buffer.copy_(new)
    return (normed.reshape(n, -1) * factor).reshape(updates.shape).to(updates.dtype)


def whole_rows(where: str, index: int, p: torch.Tensor) -> None:
    """Layout rule of NorDion2 (NorMuon's): a parameter sharded on a dim other than 0 would have its
    rows split, and the row second moment needs whole rows."""
    one_dim_mesh(where, index, p)
    (placement,) = p.placements
    if isinstance(placement, Shard) and placement.dim != 0:
        raise ValueError(f"{where}: NorDion2 parameter {index} of shape {tuple(p.shape)} is sharded on dim "
                         f"{placement.dim}; NorDion2 needs whole output-channel rows: shard on dim 0 or replicate it")


SCOPES = ("local", "global")
DION2_DEFAULTS = types.MappingProxyType(dict(fraction=0.25, ef_decay=0.95, selection_scope="local"))

DION2 = Algorithm(
    name="dion2",
    defaults={**MUON.defaults, **DION2_DEFAULTS},
    validate=validate_dion2,
    state=(StateKey("momentum", parameter_shape),),
    direction=selected_direction,
    select=_selector(rows_only=False),
    orthogonalize=MUON.orthogonalize,
    lr_scale=matrix_lr_scale,
    check_layout=one_dim_mesh,
)

NORDION2 = dataclasses.replace(
    DION2,
    name="nordion2",
    defaults={**DION2.defaults, "beta2": NORMUON.defaults["beta2"], "variance_eps": NORMUON.defaults["variance_eps"]},
    validate=validate_nordion2,
    state=(*DION2.state, *(key for key in NORMUON.state if key.name == "variance")),
    direction=row_direction,
    select=_selector(rows_only=True),
    postprocess=normalise_selected_rows,
    check_layout=whole_rows,
)


# The convenience classes, after the records: `optimizers.muon` imports this package, not this module.
from optimizers.muon import Muon  # noqa: E402


class Dion2(Muon):
    """Dion2: Muon on the top `fraction` of each matrix's slices by L1 norm, error feedback
    `ef_decay` on the selected slices (the record above for the update).

    Args (beyond Muon's orthogonalizer, ns_steps, compute_dtype, eps, mesh, flatten, adjust_lr):
      fraction: share of slices orthogonalized each step, in (0, 1].
      ef_decay: error-feedback decay of the selected slices of the momentum, in [0, 1].
      selection_scope: "local" (each rank selects among the slices it holds) or "global"
        (top-k of the whole matrix: the step does not depend on the layout).
    Raises ValueError/TypeError at construction on bad options (nesterov=True included)."""

    def __init__(self, params: Iterable[Any], lr: float = 0.01, fraction: float = DION2.defaults["fraction"],
                 ef_decay: float = DION2.defaults["ef_decay"],
                 selection_scope: str = DION2.defaults["selection_scope"], **options: Any) -> None:
        super().__init__(params, **{"algorithm": "dion2", "lr": lr, "fraction": fraction, "ef_decay": ef_decay,
                                    "selection_scope": selection_scope, **options})


class NorDion2(Dion2):
    """NorDion2: Dion2 selecting rows (output channels) always, whose selected rows are normalised
    as NorMuon's (beta2, variance_eps; a second moment per row, updated where selected)."""

    def __init__(self, params: Iterable[Any], **options: Any) -> None:
        super().__init__(params, **{"algorithm": "nordion2", **options})
