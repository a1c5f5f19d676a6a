"""Muon with megabatched orthogonalization, and an AdamW fallback for other parameters.

Per parameter, with momentum mu, learning rate lr and weight decay wd:

  M <- mu M + G
  U = mu M + G   (Nesterov)   else   U = M
  O = orth(U)    per matrix of the parameter's matrix view (see matrix_view)
  X <- X (1 - lr wd)
  X <- X - lr scale O           scale from `adjust_lr` and the matrix view

Parameters of one group with the same shape, dtype and device are stacked and
orthogonalized in one batched call (a megabatch). The stack axis is never merged
with the matrix axes, so each parameter gets exactly the update it gets alone.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import torch

from optimizers import adamw, checkpoint, distributed
from optimizers.coefficients import DEFAULT_STEPS
from optimizers.matrix_view import as_matrices, lr_scale
from optimizers.normuon import normalise_rows, variance_shape
from optimizers.orthogonalize import orthogonalize
from optimizers.validation import check_grad, check_group, check_layouts


def default_compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 on CUDA (tensor cores), fp32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class Muon(torch.optim.Optimizer):
    """Muon for matrix and convolution weights; group `algorithm="adamw"` for the rest.

    Args:
      params: parameters or parameter groups; a group may override any option below.
      lr, momentum, nesterov, weight_decay: as in the update above.
      adjust_lr: "spectral_norm" sqrt(fan_out/fan_in), "rms_norm" 0.2 sqrt(max(fan_out, fan_in)), or None.
      flatten: orthogonalize [out, *rest] as [out, prod(rest)] (fan_out=out, fan_in=prod(rest));
        otherwise a 3-D+ tensor is a batch of its trailing 2-D matrices (fans from the last two dims).
      orthogonalizer: "polar_express", "newton_schulz" or "svd".
      ns_steps: polynomial steps (default 5).
      compute_dtype: dtype of the orthogonalization (default bf16 on CUDA, fp32 elsewhere).
      eps: added to the Frobenius norm in the normaliser.
      mesh: None (one process), or the ProcessGroup / 1-D DeviceMesh the parameters are distributed over:
        plain tensors are replicated (DDP), DTensors sharded Shard(d) (FSDP2: d = 0) or replicated;
        every whole matrix is orthogonalized once, on one rank (optimizers/distributed.py). Every rank
        must step the same parameters (the same ones with gradients) in the same order.
      betas, adamw_eps: hyper-parameters of "adamw" groups.
      beta2, variance_eps: row second-moment decay and epsilon of "normuon" groups (see normuon.py).
      algorithm: the default group algorithm, "muon", "normuon" or "adamw".

    Raises ValueError/TypeError before touching anything on bad options or parameters.
    """

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = 0.95,
                 nesterov: bool = False, weight_decay: float = 0.0, adjust_lr: str | None = "spectral_norm",
                 flatten: bool = False, orthogonalizer: str = "polar_express", ns_steps: int | None = None,
                 compute_dtype: torch.dtype | None = None, eps: float = 1e-7, mesh: Any = None,
                 betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8, beta2: float = 0.95,
                 variance_eps: float = 1e-8, algorithm: str = "muon") -> None:
        self._group = distributed.process_group(mesh)
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        adjust_lr=adjust_lr, flatten=flatten, orthogonalizer=orthogonalizer,
                        ns_steps=ns_steps, compute_dtype=compute_dtype, eps=eps, algorithm=algorithm,
                        betas=betas, adamw_eps=adamw_eps, beta2=beta2, variance_eps=variance_eps)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate the group (defaults filled in) before it joins the optimizer."""
        merged = {**self.defaults, **param_group}
        params = merged["params"]
        merged["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        check_group(len(self.param_groups), merged)
        if merged["algorithm"] != "adamw":  # AdamW is elementwise: any DTensor layout steps as it is
            check_layouts(f"param group {len(self.param_groups)}", merged["params"], self._group,
                          merged["algorithm"])
        super().add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict plus the layout version (optimizers/checkpoint.py)."""
        return {**super().state_dict(), checkpoint.VERSION_KEY: checkpoint.LAYOUT_VERSION}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state of this layout; ValueError, with the live state untouched, for any other."""
        checkpoint.validate(state_dict, self.param_groups)
        super().load_state_dict({k: v for k, v in state_dict.items() if k != checkpoint.VERSION_KEY})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step for every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for index, group in enumerate(self.param_groups):
            check_group(index, group)
            if group["algorithm"] != "adamw":
                check_layouts(f"param group {index}", group["params"], self._group, group["algorithm"])
            for p in group["params"]:
                if p.grad is not None:
                    check_grad(f"param group {index}", p)
        for group in self.param_groups:
            if group["algorithm"] == "adamw":
                adamw.step_group(group, self.state)
            else:
                self._muon_group(group)
        return loss

    def _muon_group(self, group: dict[str, Any]) -> None:
        buckets: dict[tuple, list[tuple[torch.Tensor, torch.Tensor]]] = defaultdict(list)
        mu = group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buf = state["momentum_buffer"]
            buf.mul_(mu).add_(p.grad)
            u = p.grad.add(buf, alpha=mu) if group["nesterov"] else buf
            buckets[(tuple(p.shape), p.dtype, p.device, distributed.placements(p))].append((p, u))
        first_owner = 0  # spreads the megabatches of a step over the ranks
        for (shape, _, device, _), entries in buckets.items():
            params = [p for p, _ in entries]
            stack = torch.stack([distributed.local(u) for _, u in entries])
            if self._group is None:
                updates = self._orthogonalized(stack, group, device)
            else:
                layout = distributed.layout_of(params[0], self._group, first_owner)
                updates = self._distributed_orthogonalized(stack, layout, group, device)
                first_owner += len(entries)
            updates = self._postprocess(updates, params, group)
            scale = self._lr_scale(shape, group)
            for p, update in zip(params, updates.unbind(0)):
                x = distributed.local(p)
                x.mul_(1.0 - group["lr"] * group["weight_decay"])
                x.add_(update, alpha=-group["lr"] * scale)

    def _distributed_orthogonalized(self, pieces: torch.Tensor, layout: distributed.Layout, group: dict[str, Any],
                                    device: torch.device) -> torch.Tensor:
        """orth of a megabatch held as this rank's pieces [N, *piece] (whole members when replicated):
        each whole member is assembled on its owner rank, orthogonalized there by `_orthogonalized`,
        and this rank gets back its pieces of every result [N, *piece]."""
        whole = distributed.assemble(pieces, layout)
        done = self._orthogonalized(whole, group, device) if whole.shape[0] else whole
        return distributed.scatter(done, layout, pieces.shape[0])

    def _postprocess(self, updates: torch.Tensor, params: list[torch.Tensor], group: dict[str, Any]) -> torch.Tensor:
        """Transform a megabatch's orthogonalized updates [N, *shape] before they are applied:
        identity for "muon" groups, row normalisation for "normuon" groups."""
        if group["algorithm"] != "normuon":
            return updates
        return normalise_rows(updates, [self._variance(p, group) for p in params], group)

    def _variance(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """This rank's part of `p`'s NorMuon variance buffer, created as zeros at parameter rank and
        with `p`'s placement (a DTensor Shard(0) for a row-sharded parameter)."""
        state = self.state[p]
        if "variance" not in state:
            state["variance"] = distributed.zeros_placed_like(p, variance_shape(tuple(p.shape), group["flatten"]))
        return distributed.local(state["variance"])

    def _lr_scale(self, shape: tuple[int, ...], group: dict[str, Any]) -> float:
        """lr multiplier of a parameter of `shape` in `group`."""
        return lr_scale(shape, group["flatten"], group["adjust_lr"])

    def _orthogonalized(self, stack: torch.Tensor, group: dict[str, Any], device: torch.device) -> torch.Tensor:
        """orth of every member of a megabatch `stack` [N, *shape], in the stack's shape and dtype."""
        compute = group["compute_dtype"] or default_compute_dtype(device)
        steps = group["ns_steps"] or DEFAULT_STEPS
        mats = as_matrices(stack, group["flatten"])
        out = orthogonalize(mats, group["orthogonalizer"], steps, group["eps"], compute)
        return out.reshape(stack.shape)


class NorMuon(Muon):
    """Muon whose groups default to algorithm "normuon" (Li et al., 2025, arXiv:2510.05491):
    the orthogonalized update's rows are normalised by a running second moment, then its
    Frobenius norm is restored (optimizers/normuon.py). Takes every Muon option, plus
    beta2 (default 0.95) and variance_eps (default 1e-8)."""

    def __init__(self, params: Iterable[Any], **options: Any) -> None:
        super().__init__(params, **{"algorithm": "normuon", **options})
