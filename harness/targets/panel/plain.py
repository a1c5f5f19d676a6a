"""A plain, op-by-op Muon, NorMuon, Dion2 and NorDion2, written from the published mathematics and independent
of this project's optimizers/: one torch call per operation, each rounded where torch rounds it, one parameter
at a time (no stacking, no fused kernels).

Per parameter X with gradient G (momentum mu, Nesterov, lr, weight decay wd; matrix view: with flatten
[out, prod(rest)], else the trailing 2-D matrices):

  M <- mu M + G                                   buffer in `state`: the parameter's dtype, or at least fp32
  U = G + mu M (Nesterov) or M
  X0 = round_compute(U) / (s ||.||_F + eps)        per matrix, wide orientation (transposed if tall)
  polynomial, per step (a, b, c), `form`:
    "fused"     A = X X^T;  B = b A + c A A;  X = a X + B X       (Keller Jordan's code, the textbook loop)
    "expanded"  X = a X + b (X X^T) X + c (X X^T)^2 X             (his iteration as the formula is written:
                Keller Jordan's quintic only; with Polar Express's first steps, coefficients ~20 whose
                separately rounded terms cancel, bf16 drives singular values out of the schedule's range
                and the iteration diverges, |norm| statistic 5e8 measured: not a correct implementation)
  Gram iteration (Gram Newton-Schulz): R = X X^T, Q = I; per step Z = a I + b R + c R^2, Q <- Z Q,
    R <- Z R Z, restarted (X <- Q X, R = X X^T, Q = I) before the second step; O = Q X; with bf16 compute the
    iterates are fp16 (as the published Gram Newton-Schulz), else the compute dtype
  SVD: U V^T over the singular values above rcond max(m, n) s_max, in fp64 for fp64 compute, else fp32
  NorMuon: v <- beta2 v + (1 - beta2) mean_row(O^2); N = O / (sqrt(v) + 1e-8); N *= ||O||_F / ||N||_F
    (rows of the matrix view, the norm of the whole parameter), statistics in fp32 (fp64 for fp64 parameters)
  X <- X (1 - lr wd);  X <- X - lr scale O         scale from the matrix view's (fan_out, fan_in)

Dion2 (NorDion2), per matrix of the view: M <- M + G (no momentum coefficient); its slices are the rows if
m <= n, else the columns (NorDion2: the rows); the k = max(1, ceil(fraction * #slices)) slices of largest L1
norm (in fp32 at least; equal norms by index) are orthogonalized as one submatrix, scaled back by ef_decay in
M, and applied to their own slices of X (lr scale of the whole matrix view); NorDion2 normalises the selected
rows as NorMuon does (v kept for every row, updated where selected) and restores the parameter's norm.

The coefficients are the ones the target declares (its `Conventions.orthogonalizer`): it runs exactly what it
says it runs. Every choice above is a legitimate implementation; each differs from optimizers.Muon's in its
rounding only.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any

import torch

from cases import Case
from harness.policy.keys import OWN_SCHEDULES, SCHEDULES
from harness.running.inputs import TORCH_DTYPES
from harness.targets.base import OptimizerTarget
from oracles import Conventions, Orthogonalizer

FORMS = ("fused", "expanded")
STATES = ("param", "fp32")
ALGORITHMS = ("muon", "normuon", "dion2", "nordion2")
SELECTING = types.MappingProxyType({"dion2": False, "nordion2": True})
"""The selecting algorithms, each with whether it selects rows only."""
NAMED = types.MappingProxyType({**OWN_SCHEDULES, **SCHEDULES})
"""Schedules a Plain target can be told to run in place of its case's: a peer's, or ours by option name."""
VARIANCE_EPS = 1e-8
GRAM_RESTART = 1
"""The Gram iteration restarts before this step (0-based): before the second, as the published one does."""


def _wide(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    tall = x.size(-2) > x.size(-1)
    return (x.mT if tall else x), tall


def _normalised(x: torch.Tensor, spec: Orthogonalizer) -> torch.Tensor:
    """X / (s ||X||_F + eps) per matrix (the "plus" normaliser every Plain target declares)."""
    return x / (torch.linalg.matrix_norm(x, keepdim=True) * spec.normaliser.scale + spec.normaliser.eps)


def polynomial(u: torch.Tensor, spec: Orthogonalizer, form: str) -> torch.Tensor:
    """The declared polynomial iteration of matrices `u` [B, m, n], in `u`'s dtype, evaluated in `form`."""
    x, tall = _wide(u)
    x = _normalised(x, spec)
    for a, b, c in spec.schedule:
        gram = x @ x.mT
        if form == "fused":
            x = a * x + (b * gram + c * (gram @ gram)) @ x
        else:
            x = a * x + b * (gram @ x) + c * ((gram @ gram) @ x)
    return x.mT if tall else x


def gram_iteration(u: torch.Tensor, spec: Orthogonalizer) -> torch.Tensor:
    """The declared polynomial by the Gram iteration on X X^T (module doc), restarted before GRAM_RESTART."""
    x, tall = _wide(u)
    iterate = torch.float16 if u.dtype == torch.bfloat16 else u.dtype
    x = _normalised(x.to(torch.promote_types(u.dtype, torch.float32)), spec).to(iterate)
    eye = torch.eye(x.size(-2), dtype=iterate)
    r, q = x @ x.mT, None
    for k, (a, b, c) in enumerate(spec.schedule):
        if k == GRAM_RESTART and q is not None:
            x, q = q @ x, None
            r = x @ x.mT
        z = a * eye + b * r + c * (r @ r)
        q = z if q is None else z @ q
        r = z @ (r @ z)
    out = (q @ x).to(u.dtype)
    return out.mT if tall else out


def polar(u: torch.Tensor, spec: Orthogonalizer) -> torch.Tensor:
    """U V^T of matrices `u` over the singular values above rcond_factor max(m, n) s_max."""
    x = u.to(torch.float64 if u.dtype == torch.float64 else torch.float32)
    left, s, right = torch.linalg.svd(x, full_matrices=False)
    keep = s > spec.rcond_factor * max(x.shape[-2:]) * s[..., :1]
    return (left * keep[..., None, :].to(x.dtype)) @ right


def matrices(x: torch.Tensor, flatten: bool) -> torch.Tensor:
    """The matrix view [B, m, n] of a parameter-shaped tensor."""
    return x.reshape(1, x.shape[0], -1) if flatten else x.reshape(-1, x.shape[-2], x.shape[-1])


def lr_scale(shape: tuple[int, ...], flatten: bool, adjust: str) -> float:
    fan_out, fan_in = (shape[0], math.prod(shape[1:])) if flatten else (shape[-2], shape[-1])
    return {"spectral_norm": math.sqrt(fan_out / fan_in), "rms_norm": 0.2 * math.sqrt(max(fan_out, fan_in)),
            "none": 1.0}[adjust]


class PlainMuon(torch.optim.Optimizer):
    """Muon (and NorMuon, `normuon=True`) as in the module doc, one parameter at a time."""

    def __init__(self, params: Any, *, spec: Orthogonalizer, lr: float, momentum: float, nesterov: bool,
                 weight_decay: float, flatten: bool, adjust_lr: str, compute_dtype: torch.dtype, form: str,
                 state_dtype: torch.dtype | None, normuon: bool = False, beta2: float = 0.95) -> None:
        if form not in FORMS:
            raise ValueError(f"form {form!r}; expected one of {FORMS}")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                                      flatten=flatten, adjust_lr=adjust_lr, beta2=beta2))
        self.spec, self.compute, self.form = spec, compute_dtype, form
        self.state_dtype, self.normuon = state_dtype, normuon

    def orthogonalize(self, u: torch.Tensor) -> torch.Tensor:
        x = u.to(self.compute)
        if self.spec.kind == "svd":
            return polar(x, self.spec)
        if self.spec.iteration == "gram":
            return gram_iteration(x, self.spec)
        return polynomial(x, self.spec, self.form)

    def normalise_rows(self, o: torch.Tensor, p: torch.Tensor, beta2: float) -> torch.Tensor:
        stats = torch.float64 if p.dtype == torch.float64 else torch.float32
        o = o.to(stats)
        state = self.state[p]
        if "variance" not in state:
            state["variance"] = torch.zeros(o.shape[:-1], dtype=stats)
        v = state["variance"]
        v.mul_(beta2).add_(o.square().mean(dim=-1), alpha=1.0 - beta2)
        normed = o / (v.sqrt() + VARIANCE_EPS)[..., None]
        size = normed.norm()
        return normed * (o.norm() / size) if size > 0 else normed

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, mu, flatten = group["lr"], group["momentum"], group["flatten"]
            for p in group["params"]:
                state = self.state[p]
                held = self.state_dtype or p.dtype
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=held)
                buf = state["momentum_buffer"]
                g = p.grad.to(held)
                buf.mul_(mu).add_(g)
                u = g + mu * buf if group["nesterov"] else buf
                o = self.orthogonalize(matrices(u, flatten))
                if self.normuon:
                    o = self.normalise_rows(o, p, group["beta2"])
                scale = lr_scale(tuple(p.shape), flatten, group["adjust_lr"])
                p.mul_(1.0 - lr * group["weight_decay"])
                p.add_(o.reshape(p.shape).to(torch.promote_types(p.dtype, torch.float32)), alpha=-lr * scale)


class PlainDion2(PlainMuon):
    """Dion2 (and NorDion2: `rows_only` and `normuon`) as in the module doc, one parameter at a time."""

    def __init__(self, params: Any, *, fraction: float, ef_decay: float, rows_only: bool, **muon: Any) -> None:
        super().__init__(params, nesterov=False, **muon)
        self.fraction, self.ef_decay, self.rows_only = fraction, ef_decay, rows_only

    def select(self, mat: torch.Tensor) -> tuple[bool, torch.Tensor]:
        """(whether the slices of `mat` are its rows; the indices of the selected ones, ascending)."""
        rows = self.rows_only or mat.size(0) <= mat.size(1)
        slices = mat if rows else mat.mT
        norms = slices.to(torch.promote_types(slices.dtype, torch.float32)).abs().sum(dim=1)
        k = max(1, math.ceil(self.fraction * slices.size(0)))
        return rows, torch.sort(torch.sort(-norms, stable=True).indices[:k]).values

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, flatten, beta2 = group["lr"], group["flatten"], group["beta2"]
            for p in group["params"]:
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p, dtype=self.state_dtype or p.dtype)
                buf = state["momentum_buffer"]
                buf.add_(p.grad.to(buf.dtype))
                stats = torch.float64 if p.dtype == torch.float64 else torch.float32
                update = torch.zeros(matrices(p, flatten).shape, dtype=stats)
                if self.normuon and "variance" not in state:
                    state["variance"] = torch.zeros(update.shape[:-1], dtype=stats)
                selected = torch.zeros((), dtype=stats)
                for b, mat in enumerate(matrices(buf, flatten)):
                    rows, chosen = self.select(mat)
                    slices, out = (mat, update[b]) if rows else (mat.mT, update[b].mT)
                    sub = slices[chosen].clone()
                    o = self.orthogonalize(sub[None])[0].to(stats)
                    if self.normuon:
                        v = state["variance"][b]
                        v[chosen] = v[chosen] * beta2 + o.square().mean(dim=-1) * (1.0 - beta2)
                        selected += o.square().sum()
                        o = o / (v[chosen].sqrt() + VARIANCE_EPS)[:, None]
                    out[chosen] = o
                    slices[chosen] = sub * self.ef_decay
                size = update.norm()
                if self.normuon and size > 0:
                    update *= selected.sqrt() / size
                scale = lr_scale(tuple(p.shape), flatten, group["adjust_lr"])
                p.mul_(1.0 - lr * group["weight_decay"])
                p.add_(update.reshape(p.shape), alpha=-lr * scale)


class Plain(OptimizerTarget):
    """PlainMuon as a harness target: `form` of the polynomial, momentum `state` ("param": the parameter's
    dtype; "fp32": at least fp32), optionally a `schedule` of NAMED and a normaliser `eps` in place of the
    case's orthogonalizer's."""

    exact_relations = True
    """Each parameter is stepped alone: a megabatch repeats its members' arithmetic exactly."""

    def __init__(self, form: str = "fused", state: str = "param", schedule: str | None = None,
                 eps: float | None = None) -> None:
        if form not in FORMS or state not in STATES or (schedule is not None and schedule not in NAMED):
            raise ValueError(f"Plain(form={form!r}, state={state!r}, schedule={schedule!r}): expected a form of "
                             f"{FORMS}, a state of {STATES} and a schedule of {sorted(NAMED)} or None")
        self.form, self.state, self.schedule, self.eps = form, state, schedule, eps
        self.name = "plain-" + "-".join([form, f"{state}-momentum", *([schedule] if schedule else []),
                                         *([f"eps{eps:g}"] if eps is not None else [])])

    def version(self) -> str:
        return f"harness.targets.panel.plain (torch {torch.__version__})"

    def unsupported(self, case: Case) -> str | None:
        if case.optimizer not in ALGORITHMS:
            return f"{self.name} implements {ALGORITHMS} (case: {case.optimizer})"
        if self.schedule is not None and case.orthogonalizer == "svd":
            return f"{self.name} runs the polynomial schedule {self.schedule!r}, not an SVD"
        spec = self.orthogonalizer(case)
        if self.form == "expanded" and (spec.schedule != NAMED["newton_schulz"][0] or spec.iteration != "standard"):
            return f"{self.name} is Keller Jordan's iteration as written: his quintic in the standard iteration only"
        return None

    def _state_dtype(self, case: Case) -> str:
        return "fp32" if self.state == "fp32" and case.param_dtype == "bf16" else case.param_dtype

    def orthogonalizer(self, case: Case) -> Orthogonalizer:
        own = Orthogonalizer.named(case.orthogonalizer, compute_dtype=case.compute_dtype)
        if self.schedule is None and self.eps is None:
            return own
        coefficients, scale = NAMED[self.schedule] if self.schedule else (own.schedule, own.normaliser.scale)
        eps = own.normaliser.eps if self.eps is None else self.eps
        return dataclasses.replace(Orthogonalizer.polynomial(coefficients, eps=eps, scale=scale),
                                   iteration=own.iteration)

    def conventions(self, case: Case) -> Conventions:
        return Conventions(orthogonalizer=self.orthogonalizer(case), lr_scale=case.adjust_lr,
                           lr_dims="flattened" if case.flatten else "last_two", compute_dtype=case.compute_dtype,
                           state_dtype=self._state_dtype(case))

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        common = dict(spec=self.orthogonalizer(case), lr=case.lr, momentum=case.momentum,
                      weight_decay=case.weight_decay, flatten=case.flatten, adjust_lr=case.adjust_lr,
                      compute_dtype=TORCH_DTYPES[case.compute_dtype], form=self.form,
                      state_dtype=TORCH_DTYPES[self._state_dtype(case)], beta2=case.beta2)
        if case.optimizer in SELECTING:
            return PlainDion2(params, fraction=case.fraction, ef_decay=case.ef_decay,
                              rows_only=SELECTING[case.optimizer], normuon=SELECTING[case.optimizer], **common)
        return PlainMuon(params, nesterov=case.nesterov, normuon=case.optimizer == "normuon", **common)
