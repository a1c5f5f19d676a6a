"""The Muon optimizer: runs each parameter group's algorithm record (optimizers/algorithms/).

Matrix algorithms (Muon, NorMuon) are megabatched: parameters of one group with the same shape,
dtype, device and placements are stacked and orthogonalized in one batched call. The stack axis
is never merged with the matrix axes, so each parameter gets exactly the update it gets alone.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from optimizers import checkpoint, distributed, plan, tensor_parallel
from optimizers.agreement import agree
from optimizers.algorithms import ADAMW, MUON, NORMUON, REGISTRY, Algorithm, resolve
from optimizers.graphs import PlanGraphs
from optimizers.groups import check_group, check_scalars, filled
from optimizers.validation import check_layouts

OPTIONS = frozenset(k for a in REGISTRY.values() for k in a.defaults)
"""Options the constructor takes beyond its named ones: those of every registered algorithm."""


class Muon(torch.optim.Optimizer):
    """Muon for matrix and convolution weights; group `algorithm="adamw"` for the rest.

    Args:
      params: parameters or parameter groups; a group may override any option below.
      lr, momentum, nesterov, weight_decay: as in optimizers/algorithms/muon.py.
      adjust_lr: "spectral_norm" sqrt(fan_out/fan_in), "rms_norm" 0.2 sqrt(max(fan_out, fan_in)), or None.
      flatten: orthogonalize [out, *rest] as [out, prod(rest)] (fan_out=out, fan_in=prod(rest));
        otherwise a 3-D+ tensor is a batch of its trailing 2-D matrices (fans from the last two dims).
      orthogonalizer: "polar_express", "newton_schulz", "gram_newton_schulz" or "svd".
      ns_coefficients, gram_restarts: the schedule of "gram_newton_schulz" ("polar_express", the default, or
        "newton_schulz") and the steps before which it restarts (default (2,), as published); its divergences
        are recomputed by the standard iteration and counted in optimizers.gram_newton_schulz.STATS.
      ns_steps: polynomial steps (default 5).
      compute_dtype: dtype of the orthogonalization (default bf16 on CUDA, fp32 elsewhere); asked for bf16,
        "gram_newton_schulz" iterates in fp16 as the published versions do (gram_newton_schulz.HALF_ITERATES).
      eps: added to the Frobenius norm in the normaliser.
      mesh: None (one process), or the ProcessGroup / DeviceMesh the parameters are distributed over:
        plain tensors are replicated (DDP), DTensors sharded Shard(d) (FSDP2: d = 0) or replicated;
        every whole matrix is orthogonalized once, on one rank (optimizers/distributed.py). A mesh of
        2+ dims (FSDP2 x TP, e.g. ("dp", "tp")) and TP-sharded parameters: optimizers/tensor_parallel.py. Every rank
        must step the same parameters (the same ones with gradients) in the same order; a step where
        they differ, or that one rank rejects, raises on every rank before any rank writes
        (optimizers/agreement.py).
      betas, adamw_eps: hyper-parameters of "adamw" groups.
      beta2, variance_eps: row second-moment decay and epsilon of "normuon" groups.
      algorithm: the default group algorithm: a registered name ("muon", "normuon", "adamw") or an
        `Algorithm` record (optimizers/algorithms/base.py).
      tp_mode: "gather" (default: the whole matrix is orthogonalized, the unsharded update) or "per_shard"
        (each TP shard alone, as DeepSpeed's AutoTP; lr scale still from the global shape), for
        parameters sharded on the mesh dim named `tp_dim` (default "tp"); also a group option.
      num_heads: group option: orthogonalize a 2-D [num_heads * head_dim, in] parameter as num_heads
        [head_dim, in] blocks, lr scale from the head block (None: the whole matrix).
      cuda_graphs: replay the orthogonalizations of the small single-process megabatches on CUDA from one
        CUDA graph per plan, one launch instead of ~30 per megabatch, the megabatches side by side on
        parallel streams (polynomial orthogonalizers only; the same bits as eager; optimizers/graphs.py).
        Default False.
      options: options of other registered algorithms; a group's missing options default from its record.

    A NaN or inf gradient element is written into the parameter, as torch.optim does, and stays in the
    state; never skipped, and never silently dropped (the policy: optimizers/algorithms/base.py).

    Raises ValueError/TypeError before touching anything on bad options or parameters. `step()` is
    all or nothing: every check runs before its first write (optimizers/plan.py), and the validated
    plan is reused until a parameter, gradient kind, group option or state entry changes.
    """

    _cached: _Cached | None = None  # the last validated plan (a class default: survives copy and pickle)
    _tp_dim: str = "tp"
    _cuda_graphs: bool = False

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = MUON.defaults["momentum"],
                 nesterov: bool = MUON.defaults["nesterov"], weight_decay: float = 0.0,
                 adjust_lr: str | None = MUON.defaults["adjust_lr"], flatten: bool = MUON.defaults["flatten"],
                 orthogonalizer: str = MUON.defaults["orthogonalizer"],
                 ns_steps: int | None = MUON.defaults["ns_steps"],
                 compute_dtype: torch.dtype | None = MUON.defaults["compute_dtype"],
                 eps: float = MUON.defaults["eps"], mesh: Any = None,
                 betas: tuple[float, float] = ADAMW.defaults["betas"],
                 adamw_eps: float = ADAMW.defaults["adamw_eps"], beta2: float = NORMUON.defaults["beta2"],
                 variance_eps: float = NORMUON.defaults["variance_eps"], algorithm: str | Algorithm = "muon",
                 tp_mode: str = MUON.defaults["tp_mode"], tp_dim: str = "tp", cuda_graphs: bool = False,
                 **options: Any) -> None:
        unknown = sorted(set(options) - OPTIONS)
        if unknown:
            raise TypeError(f"Muon() got unknown options {unknown}; known: {sorted(OPTIONS)}")
        if not isinstance(tp_dim, str):
            raise TypeError(f"Muon(tp_dim=...) must be a mesh dim name (str), got {tp_dim!r}")
        if not isinstance(cuda_graphs, bool):
            raise TypeError(f"Muon(cuda_graphs=...) must be a bool, got {cuda_graphs!r}")
        self._cuda_graphs = cuda_graphs
        self._group = distributed.process_group(mesh)
        self._tp_dim = tp_dim
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        adjust_lr=adjust_lr, flatten=flatten, orthogonalizer=orthogonalizer,
                        ns_steps=ns_steps, compute_dtype=compute_dtype, eps=eps, algorithm=algorithm, tp_mode=tp_mode,
                        betas=betas, adamw_eps=adamw_eps, beta2=beta2, variance_eps=variance_eps, **options)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate the group (defaults filled in) before it joins the optimizer."""
        index = len(self.param_groups)
        merged = filled(index, self.defaults, param_group)
        params = merged["params"]
        merged["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        algorithm = check_group(index, merged)
        if not algorithm.elementwise:  # an elementwise algorithm steps any DTensor layout as it is
            check_layouts(f"param group {index}", merged["params"], self._group, algorithm.check_layout)
            for i, p in enumerate(merged["params"]):
                tensor_parallel.check_heads(f"param group {index}", i, p, merged, self._tp_dim)
        super().add_param_group({**merged, "params": param_group["params"]})

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict, each group's algorithm by name, plus the layout version
        (optimizers/checkpoint.py)."""
        state = super().state_dict()
        for saved, group in zip(state["param_groups"], self.param_groups):
            saved["algorithm"] = resolve("param group", group["algorithm"]).name
        return {**state, checkpoint.VERSION_KEY: checkpoint.LAYOUT_VERSION}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state of this layout (optimizers/checkpoint.py); ValueError, with the live state
        untouched, for any other. Each group keeps its live algorithm (a record stays a record) and
        the options the saved group does not name."""
        checkpoint.validate(state_dict, self.param_groups)
        self._cached = None
        groups = [checkpoint.loaded_group(i, saved, live)
                  for i, (saved, live) in enumerate(zip(state_dict["param_groups"], self.param_groups))]
        super().load_state_dict({k: v for k, v in state_dict.items() if k != checkpoint.VERSION_KEY})
        for group, loaded in zip(self.param_groups, groups):
            group.update({k: v for k, v in loaded.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step for every parameter that has a gradient, all or nothing: every check runs before
        the first write (optimizers/plan.py); under a process group every rank checks that every
        rank accepted its step and steps the same parameters (optimizers/agreement.py)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = self._plan()
        graphs = self._cached.graphs if self._cuda_graphs else None
        plan.execute(plans, self.state, graphs)
        if graphs is not None:
            graphs.armed = True
        return loss

    def _plan(self) -> list[plan.GroupPlan]:
        """The validated plan of this step: the cached one while its key holds (lr and weight_decay
        checked anew), else a new one, whose Triton kernels (when switched on) are compiled side by side
        before it runs (plan.compile_ahead); under a process group, only once every rank agrees."""
        key, held = plan.cache_key(self.param_groups, self.state)
        cached, error, fresh = self._cached, None, False
        if cached is not None and cached.key == key:
            try:
                for index, group in enumerate(self.param_groups):
                    check_scalars(index, group)
            except (ValueError, TypeError) as exc:
                error = exc
        else:
            try:
                plans = plan.make_plan(self.param_groups, self.state, self._group, self._tp_dim)
            except (ValueError, TypeError) as exc:
                plans, error = [], exc
            fingerprint = plan.fingerprint(self.param_groups) if self._group is not None else []
            cached = _Cached(key, held, plans, fingerprint, plan.digest(fingerprint), PlanGraphs())
            fresh = True
        if self._group is not None:
            agree(self._group, cached.fingerprint, cached.digest, error)
        if error is not None:
            self._cached = None
            raise error
        self._cached = cached
        if fresh:
            try:
                plan.compile_ahead(cached.plans, self.state)
            except Exception as exc:  # noqa: BLE001 - a speed-up only: the kernels then compile as they launch
                warnings.warn(f"compiling the step's Triton kernels ahead failed ({type(exc).__name__}: {exc}); "
                              "they compile at their first launch", RuntimeWarning, stacklevel=3)
        return cached.plans


@dataclass(frozen=True)
class _Cached:
    """A validated plan and what it was made from (optimizers.plan.cache_key); `held` keeps the state
    tensors the key names by id alive, so their ids cannot be reused; `graphs`: the plan's CUDA graphs
    (used with cuda_graphs=True)."""

    key: tuple
    held: list
    plans: list[plan.GroupPlan]
    fingerprint: list[tuple]
    digest: int
    graphs: PlanGraphs


class NorMuon(Muon):
    """Muon whose groups default to algorithm "normuon" (Li et al., 2025, arXiv:2510.05491):
    the orthogonalized update's rows are normalised by a running second moment, then its
    Frobenius norm is restored (optimizers/algorithms/normuon.py). Takes every Muon option, plus
    beta2 (default 0.95) and variance_eps (default 1e-8)."""

    def __init__(self, params: Iterable[Any], **options: Any) -> None:
        super().__init__(params, **{"algorithm": "normuon", **options})
