"""The Muon optimizer: runs each parameter group's algorithm record (optimizers/algorithms/).

Matrix algorithms (Muon, NorMuon) are megabatched: parameters of one group with the same shape,
dtype, device and placements are stacked and orthogonalized in one batched call. The stack axis
is never merged with the matrix axes, so each parameter gets exactly the update it gets alone.
How a group steps (the Triton kernels, CUDA graphs) is its own options' choice, never a process
global: a changed option makes a fresh, validated plan.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from optimizers import checkpoint, distributed, plan, tensor_parallel
from optimizers.agreement import agree
from optimizers.algorithms import REGISTRY, Algorithm, resolve
from optimizers.algorithms.adamw import ADAMW
from optimizers.algorithms.muon import MUON
from optimizers.counters import Stats, counting
from optimizers.graphs import PlanGraphs, caller_capturing
from optimizers.groups import check_group, check_scalars, filled
from optimizers.validation import check_layouts


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
        are recomputed by the standard iteration, counted in `stats.fallbacks` and warned of at the first
        (RuntimeWarning).
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
      algorithm: the default group algorithm: a registered name ("muon", "normuon", "adamw") or an
        `Algorithm` record (optimizers/algorithms/base.py); a variant that wraps a stock stage with
        `before`/`after` keeps its fast paths (optimizers/algorithms/stages.py).
      tp_mode: "gather" (default: the whole matrix is orthogonalized, the unsharded update) or "per_shard"
        (each TP shard alone, as DeepSpeed's AutoTP; lr scale still from the global shape), for
        parameters sharded on the mesh dim named `tp_dim` (default "tp"); also a group option.
      num_heads: group option: orthogonalize a 2-D [num_heads * head_dim, in] parameter as num_heads
        [head_dim, in] blocks, lr scale from the head block (None: the whole matrix).
      fused: group option, as torch.optim's: None (default) takes the Triton kernels (symmetric products
        of bf16/fp16 stacks; the momentum, apply and normaliser passes over fp32 tensors) where they are
        correct and faster: on CUDA with triton installed, from the sizes symmetric.TRITON_ROWS (GRAPHED_ROWS
        in a megabatch the plan's CUDA graph captures) and elementwise.MIN_NUMEL; elsewhere none (a CPU step is
        the torch step, bit for bit). True takes them at every size and raises ValueError (at construction, or at the step whose plan meets it, before
        any write) where they cannot run: triton not importable, a parameter not on CUDA (CPU only under
        TRITON_INTERPRET=1). False never takes them (optimizers/kernels.py). The kernels' elementwise
        passes give the torch passes' bits; their products round W = aI + bA + cA² once, each judged
        against the oracle. There is no `foreach` option: the batched torch._foreach_* passes are taken
        wherever they give the per-parameter bits (fp32/fp64 tensors, stages that declare them), the
        per-parameter passes elsewhere.
      cuda_graphs: group option, as `fused`: replay the orthogonalizations of the group's single-process
        megabatches on CUDA from the plan's one CUDA graph, one launch instead of ~30 per megabatch, the
        megabatches side by side on parallel streams (polynomial orthogonalizers only; the same bits as
        eager; optimizers/graphs.py). None (default) captures the stacks of up to graphs.MAX_NUMEL
        elements, where the host's launches are the bound (larger ones keep the GPU busy eagerly and would
        only hold memory in the graph); True captures every stack; False none. A plan's first step runs
        eagerly, its second captures, later ones replay; a step that the caller is itself capturing records
        eagerly into the caller's graph; a capture that fails warns, counts in `stats.capture_failures` and
        leaves the plan eager. Per group: the graph holds the megabatches of the groups that allow it, and
        the others run eagerly beside it. Off CUDA it changes nothing.
      options: options of the other registered algorithms (NorMuon's beta2 and variance_eps, Dion2's
        fraction, ef_decay and selection_scope); a group's missing options default from its record.

    `stats` (optimizers/counters.py) counts what the steps computed: Gram Newton–Schulz's matrices and
    divergence fallbacks, the Triton kernel's products.

    A NaN or inf gradient element is written into the parameter, as torch.optim does, and stays in the
    state; never skipped, and never silently dropped (the policy: optimizers/algorithms/base.py).

    Raises ValueError/TypeError before touching anything on bad options or parameters. `step()` is
    all or nothing: every check runs before its first write (optimizers/plan.py), and the validated
    plan is reused until a parameter, gradient kind, group option or state entry changes; a changed
    option is validated and compiled ahead as a new plan is.
    """

    _cached: _Cached | None = None  # the last validated plan (a class default: survives copy and pickle)
    _tp_dim: str = "tp"

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = MUON.defaults["momentum"],
                 nesterov: bool = MUON.defaults["nesterov"], weight_decay: float = 0.0,
                 adjust_lr: str | None = MUON.defaults["adjust_lr"], flatten: bool = MUON.defaults["flatten"],
                 orthogonalizer: str = MUON.defaults["orthogonalizer"],
                 ns_steps: int | None = MUON.defaults["ns_steps"],
                 compute_dtype: torch.dtype | None = MUON.defaults["compute_dtype"],
                 eps: float = MUON.defaults["eps"], mesh: Any = None,
                 betas: tuple[float, float] = ADAMW.defaults["betas"],
                 adamw_eps: float = ADAMW.defaults["adamw_eps"], algorithm: str | Algorithm = "muon",
                 tp_mode: str = MUON.defaults["tp_mode"], tp_dim: str = "tp", fused: bool | None = None,
                 cuda_graphs: bool | None = None, **options: Any) -> None:
        known = {k for a in REGISTRY.values() for k in a.defaults}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"Muon() got unknown options {unknown}; known: {sorted(known)}")
        if not isinstance(tp_dim, str):
            raise TypeError(f"Muon(tp_dim=...) must be a mesh dim name (str), got {tp_dim!r}")
        self._group = distributed.process_group(mesh)
        self._tp_dim = tp_dim
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        adjust_lr=adjust_lr, flatten=flatten, orthogonalizer=orthogonalizer,
                        ns_steps=ns_steps, compute_dtype=compute_dtype, eps=eps, algorithm=algorithm, tp_mode=tp_mode,
                        betas=betas, adamw_eps=adamw_eps, fused=fused,
                        cuda_graphs=cuda_graphs, **options)
        super().__init__(params, defaults)

    @property
    def stats(self) -> Stats:
        """What this optimizer's steps computed (optimizers/counters.py); made at first use, so that a copy
        or an unpickled optimizer (torch's state holds only defaults, state and groups) counts anew."""
        if "_stats" not in self.__dict__:
            self._stats = Stats()
        return self._stats

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Validate the group (defaults filled in) before it joins the optimizer."""
        index = len(self.param_groups)
        merged = filled(index, self.defaults, param_group)
        params = merged["params"]
        merged["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        algorithm = check_group(index, merged)
        if not algorithm.elementwise:  # an elementwise algorithm steps any DTensor layout as it is
            check_layouts(f"param group {index}", merged["params"], self._group, algorithm.check_layout)
            view = algorithm.view(merged)
            for i, p in enumerate(merged["params"]):
                tensor_parallel.check_heads(f"param group {index}", i, p, view, self._tp_dim)
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
        rank accepted its step and steps the same parameters (optimizers/agreement.py). Counted in
        `stats`."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with counting(self.stats):
            plans = self._plan()
            graphs = self._cached.graphs
            plan.execute(plans, self.state, None if caller_capturing() else graphs)
        graphs.armed = True
        return loss

    def _plan(self) -> list[plan.GroupPlan]:
        """The validated plan of this step: the cached one while its key holds (lr and weight_decay
        checked anew), else a new one, whose Triton kernels (where its groups' `fused` takes them) are
        compiled side by side before it runs (plan.compile_ahead); under a process group, only once every
        rank agrees."""
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
    tensors the key names by id alive, so their ids cannot be reused; `graphs`: the plan's CUDA graph
    (of the megabatches of its groups whose cuda_graphs allows one)."""

    key: tuple
    held: list
    plans: list[plan.GroupPlan]
    fingerprint: list[tuple]
    digest: int
    graphs: PlanGraphs
