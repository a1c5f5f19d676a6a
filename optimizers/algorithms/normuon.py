"""NorMuon (Li et al., 2025, arXiv:2510.05491) as an algorithm record: Muon followed by a
per-output-channel normalisation of the update (its post-processing stage).

For each matrix [m, n] of a parameter's matrix view (flatten: the one matrix
[out, prod(rest)], so rows are output channels; otherwise the trailing matrices):

  v <- beta2 v + (1 - beta2) mean_row(O^2)     one value per row
  N = O / (sqrt(v) + eps)
  N <- N * ||O||_F / ||N||_F                     per parameter (the norm Muon would apply)

then Muon's lr scale and decoupled weight decay. The variance buffer lives in the
parameter's state at parameter rank, one value per row: [out, 1, ..., 1] with
flatten, [*shape[:-1], 1] without, in the parameter's dtype and device, so sharded
checkpoints stay shard-compatible. Megabatched: the math runs on the stacked
[N, out, prod(rest)] view. Under row sharding the norm restore is shard-local.
"""

from __future__ import annotations

from typing import Any, Iterable

import dataclasses

import torch
from torch.distributed.tensor import Shard
from torch.distributed.tensor.placement_types import _StridedShard

from optimizers.algorithms.base import Group, State, StateKey
from optimizers.algorithms.muon import MUON, validate_muon
from optimizers.distributed import local
from optimizers.matrix_view import as_matrices
from optimizers.norms import frobenius
from optimizers.validation import check_real


def variance_shape(shape: tuple[int, ...], flatten: bool) -> tuple[int, ...]:
    """Shape of the variance buffer of a parameter of `shape`: one value per matrix row."""
    if flatten:
        return (shape[0],) + (1,) * (len(shape) - 1)
    return tuple(shape[:-1]) + (1,)


def normalise_rows(updates: torch.Tensor, variances: list[torch.Tensor], group: Group) -> torch.Tensor:
    """NorMuon's normalisation of a megabatch's orthogonalized updates [N, *shape], given each
    member's variance buffer (updated in place). Under row sharding `updates` and `variances`
    are this rank's rows, and the norm restore is over them: shard-local by design.

    The reductions run on a contiguous copy: a sum's order (and so its last bits) follows the
    memory layout, and the same update arrives as a transposed view in one process (a tall
    matrix is orthogonalized as its transpose) but contiguous from the distributed exchange."""
    n = updates.shape[0]
    if updates.numel() == 0:  # an empty row shard, or an empty megabatch: no rows to normalise
        return updates
    work_dtype = torch.promote_types(updates.dtype, torch.float32)
    mats = as_matrices(updates.contiguous(), group["flatten"]).to(work_dtype)
    v = torch.stack(variances).to(work_dtype).reshape(mats.shape[0], mats.shape[1], 1)
    v = torch.lerp(mats.square().mean(dim=-1, keepdim=True), v, group["beta2"])
    normed = mats / (v.sqrt() + group["variance_eps"])
    norm_o = frobenius(mats.reshape(n, -1), 1, keepdim=True)
    norm_n = frobenius(normed.reshape(n, -1), 1, keepdim=True)
    factor = restore_factor(norm_o, norm_n)
    for buffer, new in zip(variances, v.reshape(n, *variances[0].shape).unbind(0)):
        buffer.copy_(new)
    return (normed.reshape(n, -1) * factor).reshape(updates.shape).to(updates.dtype)


def restore_factor(norm_o: torch.Tensor, norm_n: torch.Tensor) -> torch.Tensor:
    """||O|| / ||N||, the factor restoring the norm: 0 where ||N|| = 0 (nothing to restore); NaN stays NaN
    (a non-finite update stays visible: optimizers/algorithms/base.py)."""
    return torch.where(norm_n == 0, 0.0, norm_o / norm_n.clamp_min(torch.finfo(norm_n.dtype).tiny))


def validate_variance(where: str, group: Group) -> None:
    """The row-variance options every NorMuon-family algorithm takes: beta2 in [0, 1), variance_eps > 0."""
    check_real(where, "beta2", group["beta2"], 0.0, 1.0, high_open=True)
    check_real(where, "variance_eps", group["variance_eps"], 0.0)
    if group["variance_eps"] == 0.0:
        raise ValueError(f"{where}: variance_eps must be > 0 (it guards the division by sqrt(v))")


def validate_normuon(where: str, group: Group) -> None:
    """Muon's options, plus beta2 in [0, 1) and variance_eps > 0."""
    validate_muon(where, group)
    validate_variance(where, group)
    if group["num_heads"] is not None:
        raise ValueError(f"{where}: NorMuon takes num_heads=None only (got {group['num_heads']!r}): per-head "
                         f"orthogonalization followed by row normalisation has no reference here")


def row_normalise(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    """Post-processing stage: `normalise_rows` with each member's (local) variance buffer."""
    return normalise_rows(updates, [local(s["variance"]) for s in states], group)


def whole_rows(where: str, index: int, p: torch.Tensor) -> None:
    """Layout rule: a parameter sharded on a dim other than 0 (on any mesh dim: a row-parallel TP
    shard included, under either tp_mode) would have its rows (output channels) split, and row
    statistics need whole rows."""
    for placement in p.placements:
        if isinstance(placement, (Shard, _StridedShard)) and placement.dim != 0:
            raise ValueError(f"{where}: NorMuon parameter {index} of shape {tuple(p.shape)} is sharded on dim "
                             f"{placement.dim}; NorMuon needs whole output-channel rows: shard on dim 0 (FSDP2's "
                             f"Shard(0), column-parallel TP) or replicate it")


def _variance_shape(shape: tuple[int, ...], group: Group) -> tuple[int, ...]:
    return variance_shape(shape, group["flatten"])


NORMUON = dataclasses.replace(
    MUON,
    name="normuon",
    defaults={**MUON.defaults, "beta2": 0.95, "variance_eps": 1e-8},
    validate=validate_normuon,
    state=MUON.state + (StateKey("variance", _variance_shape, nonnegative=True),),
    postprocess=row_normalise,
    check_layout=whole_rows,
)


# The convenience class, after the record: `optimizers.muon` imports this package, not this module.
from optimizers.muon import Muon  # noqa: E402


class NorMuon(Muon):
    """Muon whose groups default to algorithm "normuon" (Li et al., 2025, arXiv:2510.05491):
    the orthogonalized update's rows are normalised by a running second moment, then its
    Frobenius norm is restored (the record above). Takes every Muon option, plus
    beta2 (default 0.95) and variance_eps (default 1e-8)."""

    def __init__(self, params: Iterable[Any], **options: Any) -> None:
        super().__init__(params, **{"algorithm": "normuon", **options})
