"""The selftest's catalog: deliberately wrong optimizers, each one plausible bug, each our algorithm
record with one stage replaced (`dataclasses.replace(MUON, <stage>=broken)`, through
harness.targets.controls.Control) and judged exactly as a third-party target is.

Each `Defect` says where it can show (`shows(case)`: the cases whose mathematics it changes; the
selftest also drops a case on which the defect's trajectory is bitwise ours), which diagnosis it
must get (a harness.judging.diagnosis label), and where such a bug was seen. A defect is also a target
spec: `--target harness.apps.selftest_catalog:<name with _ for ->`.
"""

from __future__ import annotations

import dataclasses
import math
import types
from dataclasses import dataclass
from typing import Any, Callable

import torch

from cases import Case
from cases.layouts import piece_sizes, shard_dim
from harness.algorithms import algorithm
from harness.targets import controls, dion2_controls, distributed_controls
from harness.targets.base import Target
from harness.targets.controls import Control
from optimizers import Algorithm
from optimizers.algorithms.base import Group, State
from optimizers.algorithms.dion2 import reduced_dims, selects_rows
from optimizers.algorithms.muon import matrix_lr_scale, orthogonalize_group
from optimizers.algorithms.normuon import normalise_rows
from optimizers.coefficients import DEFAULT_STEPS, normaliser_scale, schedule
from optimizers.distributed import local
from optimizers.matrix_view import as_matrices, lr_scale, matrix_dims


@dataclass(frozen=True)
class Defect:
    name: str
    make: Callable[[], Target]
    expected: str
    shows: Callable[[Case], bool]
    source: str
    distributed: bool = False
    """Judged on the tier's distributed cases (else on its single-process ones)."""
    ambiguous: Callable[[Case], str | None] = lambda case: None
    """Why no diagnosis can single the defect out on `case` (None where one must): the stated reason
    the selftest reports instead of a right diagnosis."""
    baseline: Callable[[], Target] | None = None
    """The same code with the defect undone (None: ours): where the defect's run is bitwise this
    one's, the rounding has absorbed the defect (eps = 1e-2 added to a norm of 15 held in bf16)."""


def _stage(name: str, stage: str, broken: Any, only: str | None = None) -> Callable[[], Control]:
    """A Control whose algorithm has `stage` replaced by `broken` (for algorithm `only`, if given)."""
    def variant(algorithm: Algorithm) -> Algorithm:
        if only is not None and algorithm.name != only:
            return algorithm
        return dataclasses.replace(algorithm, **{stage: broken})
    return lambda: Control(name, variant)


# --- apply: weight decay -------------------------------------------------------------------------

def _decay_after(x: torch.Tensor, update: torch.Tensor, state: State, group: Group, scale: float) -> None:
    x.add_(update, alpha=-group["lr"] * scale)
    x.mul_(1.0 - group["lr"] * group["weight_decay"])


def _no_decay(x: torch.Tensor, update: torch.Tensor, state: State, group: Group, scale: float) -> None:
    x.add_(update, alpha=-group["lr"] * scale)


def _decay_adjusted_lr(x: torch.Tensor, update: torch.Tensor, state: State, group: Group, scale: float) -> None:
    x.mul_(1.0 - group["lr"] * scale * group["weight_decay"])
    x.add_(update, alpha=-group["lr"] * scale)


def _bf16_factor(lr: float, weight_decay: float) -> float:
    """1 - lr wd rounded to bf16, as a torch._foreach_* scalar op on bf16 tensors rounds it on CPU."""
    return float(torch.tensor(1.0 - lr * weight_decay, dtype=torch.bfloat16))


def _decay_factor_bf16(x: torch.Tensor, update: torch.Tensor, state: State, group: Group, scale: float) -> None:
    """X (1 - lr wd) with the factor rounded to bf16, whatever the parameter's dtype: at lr 0.02 and wd 0.01 it is
    1.0 and decay vanishes; at wd 0.1 it is 0.99609375 and decay nearly doubles."""
    x.mul_(_bf16_factor(group["lr"], group["weight_decay"]))
    x.add_(update, alpha=-group["lr"] * scale)


def _decay_factor_rounds(case: Case) -> bool:
    decay = 1.0 - case.lr * case.weight_decay
    return case.weight_decay > 0 and _bf16_factor(case.lr, case.weight_decay) != decay


# --- direction: momentum -------------------------------------------------------------------------

def _momentum_bf16(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """The momentum accumulated in bf16 (the buffer rounded every step), whatever the parameter dtype."""
    g, buf = local(grad), local(state["momentum_buffer"])
    buf.copy_(buf.bfloat16().mul_(group["momentum"]).add_(g.bfloat16()))
    return g.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf.clone()


def _ema_sum_nesterov(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """EMA momentum M <- mu M + (1 - mu) G, Nesterov U = G + mu M (mixing the two conventions)."""
    g, buf = local(grad), local(state["momentum_buffer"])
    buf.lerp_(g, 1.0 - group["momentum"])
    return g.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf


def _nesterov_ignored(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    g, buf = local(grad), local(state["momentum_buffer"])
    buf.mul_(group["momentum"]).add_(g)
    return buf


def _nesterov_lerp_swapped(grad: torch.Tensor, state: State, group: Group) -> torch.Tensor:
    """Nesterov written as buf.lerp(g, mu) where g.lerp(buf, mu) was meant: weights swapped."""
    g, buf = local(grad), local(state["momentum_buffer"])
    buf.mul_(group["momentum"]).add_(g)
    return buf.lerp(g, group["momentum"]) if group["nesterov"] else buf


# --- orthogonalize ---------------------------------------------------------------------------------

Coefficients = list[tuple[float, float, float]]


def _polynomial(mats: torch.Tensor, group: Group, coefficients: Coefficients, safety: float,
                eps: float) -> torch.Tensor:
    """The polynomial iteration with the given coefficients, normaliser safety factor and eps."""
    compute = group["compute_dtype"] or torch.float32
    x = mats.to(compute)
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) * safety + eps)
    for a, b, c in coefficients:
        gram = x @ x.mT
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x.mT if tall else x).to(mats.dtype)


Change = Callable[[Coefficients, str, Group], tuple[Coefficients, float, float]]


def _polynomial_stage(change: Change) -> Callable[[torch.Tensor, Group], torch.Tensor]:
    """An orthogonalize stage running the polynomial iteration as `change` alters it (the others, SVD
    and Gram Newton-Schulz, unchanged)."""
    def orthogonalize(mats: torch.Tensor, group: Group) -> torch.Tensor:
        name = group["orthogonalizer"]
        if name not in ("newton_schulz", "polar_express"):
            return orthogonalize_group(mats, group)
        coefficients, safety, eps = change(schedule(name, group["ns_steps"] or DEFAULT_STEPS), name, group)
        return _polynomial(mats, group, coefficients, safety, eps)
    return orthogonalize


def _ns_typo(coefficients: Coefficients, name: str, group: Group) -> tuple[Coefficients, float, float]:
    """Keller Jordan's b = -4.7750 typed -4.7705 (fourth significant digit)."""
    if name == "newton_schulz":
        coefficients = [(a, -4.7705, c) for a, _, c in coefficients]
    return coefficients, normaliser_scale(name), group["eps"]


def _pe_typo(coefficients: Coefficients, name: str, group: Group) -> tuple[Coefficients, float, float]:
    """Polar Express's first a = 8.2872 typed 8.2827 (fourth significant digit)."""
    if name == "polar_express":
        (a, b, c), rest = coefficients[0], coefficients[1:]
        coefficients = [(a * 8.2827 / 8.28721201814563, b, c), *rest]
    return coefficients, normaliser_scale(name), group["eps"]


def _pe_no_safety(coefficients: Coefficients, name: str, group: Group) -> tuple[Coefficients, float, float]:
    """Polar Express without its 1.01 safety factor in the normaliser."""
    return coefficients, 1.0, group["eps"]


def _unchanged(coefficients: Coefficients, name: str, group: Group) -> tuple[Coefficients, float, float]:
    """The declared schedule, safety factor and eps: the polynomial defects' baseline."""
    return coefficients, normaliser_scale(name), group["eps"]


_POLYNOMIAL = _stage("polynomial", "orthogonalize", _polynomial_stage(_unchanged))
"""The polynomial defects' baseline: their own iteration (`_polynomial`) with nothing changed."""


def _one_step_short(coefficients: Coefficients, name: str, group: Group) -> tuple[Coefficients, float, float]:
    """range(steps - 1): one polynomial step fewer than asked."""
    return coefficients[:-1], normaliser_scale(name), group["eps"]


def _large_eps(coefficients: Coefficients, name: str, group: Group) -> tuple[Coefficients, float, float]:
    """eps = 1e-2 in X / (s ||X|| + eps)."""
    return coefficients, normaliser_scale(name), 1e-2


def _svd_no_cutoff(mats: torch.Tensor, group: Group) -> torch.Tensor:
    """U V^T over every singular value, the numerically zero ones too."""
    if group["orthogonalizer"] != "svd":
        return orthogonalize_group(mats, group)
    x = mats.to(torch.float64 if group["compute_dtype"] == torch.float64 else torch.float32)
    u, _, vh = torch.linalg.svd(x, full_matrices=False)
    return (u @ vh).to(mats.dtype)


# --- lr scale --------------------------------------------------------------------------------------

def _rms_min(shape: tuple[int, ...], group: Group) -> float:
    """0.2 sqrt(min(fan_out, fan_in)) where max belongs."""
    fan_out, fan_in = matrix_dims(shape, group["flatten"])
    if group["adjust_lr"] == "rms_norm":
        return 0.2 * math.sqrt(min(fan_out, fan_in))
    return _matrix_lr(shape, group)


def _spectral_inverted(shape: tuple[int, ...], group: Group) -> float:
    """sqrt(fan_in / fan_out)."""
    fan_out, fan_in = matrix_dims(shape, group["flatten"])
    if group["adjust_lr"] == "spectral_norm":
        return math.sqrt(fan_in / fan_out)
    return _matrix_lr(shape, group)


def _first_two(shape: tuple[int, ...], group: Group) -> float:
    """Fans from shape[:2] (out, in channels of a conv), as torch.optim.Muon reads them."""
    return lr_scale(shape[:2], False, group["adjust_lr"])


def _matrix_lr(shape: tuple[int, ...], group: Group) -> float:
    return matrix_lr_scale(shape, group)


# --- NorMuon post-processing ----------------------------------------------------------------------

def _rows(updates: torch.Tensor, states: list[State], group: Group, **changes: Any) -> torch.Tensor:
    return normalise_rows(updates, [local(s["variance"]) for s in states], {**group, **changes})


def _no_renorm(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    """Rows normalised by sqrt(v) + eps, the update's Frobenius norm not restored."""
    mats = as_matrices(updates, group["flatten"]).float()
    variances = [local(s["variance"]) for s in states]
    v = torch.stack(variances).float().reshape(mats.shape[0], mats.shape[1], 1)
    v = torch.lerp(mats.square().mean(dim=-1, keepdim=True), v, group["beta2"])
    for buffer, new in zip(variances, v.reshape(updates.shape[0], *variances[0].shape).unbind(0)):
        buffer.copy_(new)
    return (mats / (v.sqrt() + group["variance_eps"])).reshape(updates.shape).to(updates.dtype)


def _rms_rescale(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    """Norm restored to 0.2 sqrt(m n) (constant RMS 0.2) instead of ||O||_F."""
    out = _rows(updates, states, group)
    n = out.shape[0]
    flat = out.reshape(n, -1).float()
    target = 0.2 * math.sqrt(flat.shape[1])
    norm = flat.norm(dim=1, keepdim=True)
    return (flat * torch.where(norm > 0, target / norm.clamp_min(1e-30), 0.0)).to(out.dtype).reshape(out.shape)


def _variance_no_ema(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    """beta2 ignored: v = mean_row(O^2) of this step only."""
    return _rows(updates, states, group, beta2=0.0)


def _variance_bf16(updates: torch.Tensor, states: list[State], group: Group) -> torch.Tensor:
    """The row second moment kept in bf16 (rounded every step), whatever the parameter dtype."""
    out = _rows(updates, states, group)
    for s in states:
        v = local(s["variance"])
        v.copy_(v.bfloat16())
    return out


# --- megabatch / geometry --------------------------------------------------------------------------

def _select_flatten_4d_only(mats: torch.Tensor, group: Group) -> tuple[torch.Tensor, Callable]:
    """flatten honoured for 4-D parameters only (`if g.ndim == 4`): a flattened conv1d or conv3d is
    orthogonalized as its trailing matrices."""
    shape = tuple(group["params"][0].shape)
    if not group["flatten"] or len(shape) in (2, 4):
        return mats, lambda o: o
    trailing = mats.reshape(-1, *shape).reshape(-1, shape[-2], shape[-1])
    return trailing, lambda o: o.reshape(mats.shape)


def _split(case: Case) -> bool:
    """A sharded layout that cuts the parameter into two or more nonempty pieces."""
    dim = shard_dim(case.layout)
    return dim is not None and sum(n > 0 for n in piece_sizes(case.shape[dim], case.world_size)) >= 2


def _pads_a_matrix(case: Case) -> bool:
    """An uneven (or empty) shard along a row or column dim of the matrix view: padding there lands
    inside an orthogonalized matrix. Along a batch dim (an unflattened 3-D+ parameter's leading dims)
    it adds whole matrices, which are cut off again: harmless."""
    n = len(case.shape)
    view = range(n) if case.flatten or n == 2 else (n - 2, n - 1)
    return _split(case) and shard_dim(case.layout) in view and case.layout_detail.endswith(("uneven", "empty"))


def _decayed(case: Case) -> bool:
    return case.weight_decay > 0


def _selecting(case: Case) -> bool:
    """Dion2 / NorDion2 selecting a proper subset of slices (fraction 1 selects every slice)."""
    return algorithm(case).selects and case.fraction is not None and case.fraction < 1.0


def _splits_slices(case: Case) -> bool:
    """A sharded layout that splits Dion2's slices among the ranks (the scopes differ only there:
    the shard dim indexes the slices rather than being summed over)."""
    dim = shard_dim(case.layout)
    if dim is None or not _split(case):
        return False
    rows = selects_rows(case.shape, case.flatten, rows_only=case.optimizer == "nordion2")
    return dim not in reduced_dims(len(case.shape), case.flatten, rows)


def _tiny_scale(case: Case) -> str | None:
    """Why a momentum defect that only rescales U cannot be told from the orthogonalizer under tiny
    gradients."""
    if case.grad != "tiny":
        return None
    return ("tiny gradients: ||U|| is near the normaliser's eps, so U's scale changes the orthogonalized "
            "direction and a momentum off by a factor is wrong from step 1, like the orthogonalizer")


def _rank_one(case: Case) -> str | None:
    """Why an orthogonalizer defect cannot be told from an lr scale on a rank-1 matrix view, or under
    tiny gradients."""
    if min(matrix_dims(case.shape, case.flatten)) == 1:
        return ("a 1 x n matrix has one singular value: any error of f(sigma) is one constant factor of "
                "the step, which is what an lr-scale error is")
    if case.grad == "tiny":
        return ("tiny gradients: the normaliser's eps shrinks every singular value into the polynomial's "
                "linear range, where a changed coefficient or step scales them all alike: one constant "
                "factor of the step, which is what an lr-scale error is")
    return None


def _every_slice_selected(case: Case) -> str | None:
    """Why an error-feedback mask defect shows as momentum alone where the top-k keeps every slice."""
    m, n = matrix_dims(case.shape, case.flatten)
    slices = m if selects_rows(case.shape, case.flatten, rows_only=case.optimizer == "nordion2") else n
    if case.fraction is None or math.ceil(case.fraction * slices) < slices:
        return None
    return (f"the top-k keeps all {slices} slice(s) of the matrix here: no slice is unselected, so the inverted "
            f"mask only leaves the error feedback undecayed, state that no selection evidence can name")


def _short_rows(case: Case) -> str | None:
    """Why a NorMuon row-statistics defect cannot be told from other state on short matrix rows."""
    fan_in = matrix_dims(case.shape, case.flatten)[1] if case.flatten or len(case.shape) == 2 else case.shape[-1]
    if fan_in >= 4:
        return None
    return (f"NorMuon's rows here are rows of {fan_in} element(s) (trailing {case.shape[-2]} x {fan_in} "
            f"matrices): one factor per such row fits nearly any error, so no structure singles out row "
            f"statistics from other state")


def _non_square(case: Case) -> bool:
    fan_out, fan_in = matrix_dims(case.shape, case.flatten)
    return fan_out != fan_in


CATALOG: tuple[Defect, ...] = (
    Defect("wd-after-update", _stage("wd-after-update", "apply", _decay_after), "weight-decay", _decayed,
           "bitsandbytes#2010/#2040: decay applied after the update, p = (p + step) (1 - lr wd)"),
    Defect("wd-missing", _stage("wd-missing", "apply", _no_decay), "weight-decay", _decayed,
           "tinygrad#17708: Muon's weight decay computed and never used"),
    Defect("wd-adjusted-lr", _stage("wd-adjusted-lr", "apply", _decay_adjusted_lr), "weight-decay",
           lambda c: _decayed(c) and c.adjust_lr != "none",
           "decay with the adjusted lr (dtensor-muon's convention) under a declared base-lr convention"),
    Defect("wd-factor-bf16", _stage("wd-factor-bf16", "apply", _decay_factor_bf16), "weight-decay",
           _decay_factor_rounds,
           "issue 26: a decay factor built in bf16 (CPU torch._foreach_mul_ rounds its scalar to a bf16 tensor's "
           "dtype, optimizers/algorithms/base.py FOREACH_DTYPES); at lr 0.02, wd 0.01 decay vanishes"),
    Defect("momentum-bf16", _stage("momentum-bf16", "direction", _momentum_bf16), "momentum",
           lambda c: c.param_dtype != "bf16" and not algorithm(c).selects,  # Dion2 keeps no momentum_buffer
           "NorDion2 review (microsoft/dion#82): state EMAs kept in bf16; torch's bf16 buffer aliasing",
           ambiguous=lambda c: ("the buffer's bf16 rounding changes the update by a bf16 rounding of U, "
                                "as an orthogonalizer that reads U in bf16 would: the steps' error has "
                                "no structure that tells the two apart")),
    Defect("momentum-ema-sum-nesterov", _stage("momentum-ema-sum-nesterov", "direction", _ema_sum_nesterov),
           "momentum", lambda c: c.nesterov and c.steps > 1,
           "EMA momentum with a sum-form Nesterov (heavyball's default form under a sum declaration)",
           ambiguous=_tiny_scale),
    Defect("nesterov-ignored", _stage("nesterov-ignored", "direction", _nesterov_ignored), "momentum",
           lambda c: c.nesterov and c.steps > 1, "nesterov flag read from the wrong group key",
           ambiguous=_tiny_scale),
    Defect("nesterov-lerp-swapped", _stage("nesterov-lerp-swapped", "direction", _nesterov_lerp_swapped),
           "momentum", lambda c: c.nesterov and c.steps > 1,
           "physicsnemo#1743 review: Nesterov as a lerp, whose argument order is easy to swap",
           ambiguous=_tiny_scale),
    Defect("ns-coefficient-typo", _stage("ns-coefficient-typo", "orthogonalize", _polynomial_stage(_ns_typo)),
           "orthogonalizer", lambda c: c.orthogonalizer == "newton_schulz",
           "templar#493 review: wrong Newton-Schulz coefficients; here one digit",
           ambiguous=_rank_one, baseline=_POLYNOMIAL),
    Defect("pe-coefficient-typo", _stage("pe-coefficient-typo", "orthogonalize", _polynomial_stage(_pe_typo)),
           "orthogonalizer", lambda c: c.orthogonalizer == "polar_express",
           "Polar Express tables copied by hand (dion folds its own safety factor in)",
           ambiguous=_rank_one, baseline=_POLYNOMIAL),
    Defect("pe-no-safety", _stage("pe-no-safety", "orthogonalize", _polynomial_stage(_pe_no_safety)),
           "orthogonalizer", lambda c: c.orthogonalizer == "polar_express",
           "Polar Express Algorithm 1's 1.01 safety factor left out of the normaliser",
           ambiguous=_rank_one, baseline=_POLYNOMIAL),
    Defect("one-step-short", _stage("one-step-short", "orthogonalize", _polynomial_stage(_one_step_short)),
           "orthogonalizer", lambda c: c.orthogonalizer != "svd", "off-by-one in the iteration loop",
           ambiguous=_rank_one, baseline=_POLYNOMIAL),
    Defect("normaliser-eps-large", _stage("normaliser-eps-large", "orthogonalize", _polynomial_stage(_large_eps)),
           "normaliser-eps", lambda c: c.orthogonalizer != "svd" and c.grad in ("gaussian", "lowrank"),
           "eps = 1e-2 in X / (||X|| + eps), a value from another code path", baseline=_POLYNOMIAL),
    Defect("svd-no-cutoff", _stage("svd-no-cutoff", "orthogonalize", _svd_no_cutoff), "orthogonalizer",
           lambda c: c.orthogonalizer == "svd" and c.grad in ("rankdef", "zero"),
           "NVIDIA Emerging-Optimizers compares NS with an SVD polar factor; U V^T without a rank cut-off"),
    Defect("lr-rms-min", _stage("lr-rms-min", "lr_scale", _rms_min), "lr-scale",
           lambda c: c.adjust_lr == "rms_norm" and _non_square(c), "0.2 sqrt(min(A, B)) where max belongs"),
    Defect("lr-spectral-inverted", _stage("lr-spectral-inverted", "lr_scale", _spectral_inverted), "lr-scale",
           lambda c: c.adjust_lr == "spectral_norm" and _non_square(c), "sqrt(fan_in / fan_out)"),
    Defect("lr-first-two-dims", _stage("lr-first-two-dims", "lr_scale", _first_two), "lr-scale",
           lambda c: len(c.shape) > 2 and c.adjust_lr != "none",
           "torch.optim.Muon reads fans from shape[:2]; wrong for a flattened conv"),
    Defect("lr-last-two-dims", controls.lr_last_two_dims, "lr-scale",
           lambda c: c.flatten and len(c.shape) > 2 and c.adjust_lr != "none",
           "KellerJordan/Muon: the lr scale read from kh, kw (context report 000)"),
    Defect("normuon-no-renorm", _stage("normuon-no-renorm", "postprocess", _no_renorm, "normuon"), "lr-scale",
           lambda c: c.optimizer == "normuon", "NorMuon rows normalised, the update's norm not restored"),
    Defect("normuon-rms-rescale", _stage("normuon-rms-rescale", "postprocess", _rms_rescale, "normuon"),
           "lr-scale", lambda c: c.optimizer == "normuon",
           "zichongli5/NorMuon#6: constant-RMS rescale (paper) vs the Frobenius restore (code)"),
    Defect("normuon-variance-no-ema", _stage("normuon-variance-no-ema", "postprocess", _variance_no_ema, "normuon"),
           "per-row-state", lambda c: c.optimizer == "normuon" and c.steps > 1, "beta2 dropped from the row EMA",
           ambiguous=_short_rows),
    Defect("normuon-variance-bf16", _stage("normuon-variance-bf16", "postprocess", _variance_bf16, "normuon"),
           "per-row-state", lambda c: c.optimizer == "normuon" and c.param_dtype != "bf16" and c.steps > 1,
           "microsoft/dion#82 review: NorMuon's variance EMA in bf16", ambiguous=_short_rows),
    Defect("normuon-kernel-slice", controls.normuon_kernel_slice_variance, "flattened-geometry",
           lambda c: c.optimizer == "normuon" and c.flatten and len(c.shape) > 2,
           "context report 000: variance shaped param[..., 0:1]"),
    Defect("normuon-trailing-dims", controls.normuon_trailing_dims_variance, "flattened-geometry",
           lambda c: c.optimizer == "normuon" and c.flatten and len(c.shape) > 3,
           "row statistics over the unflattened kernel"),
    Defect("layer-mixing", controls.layer_mixing, "members-mixed", lambda c: c.flatten and c.megabatch > 1,
           "context report 000: stacked [N, out, ...] reshaped to [N, numel]"),
    Defect("stack-norm", controls.stack_norm, "members-mixed",
           lambda c: c.megabatch > 1 and c.orthogonalizer in ("newton_schulz", "polar_express"),
           "one Frobenius norm over the whole megabatch"),
    Defect("flatten-4d-only", _stage("flatten-4d-only", "select", _select_flatten_4d_only), "flattened-geometry",
           lambda c: c.flatten and len(c.shape) in (3, 5), "KellerJordan/Muon flattens only 4-D parameters"),
    Defect("local-shard", distributed_controls.local_shard, "shard-local",
           lambda c: _split(c) and c.grad != "zero", "context report 003: tensor-parallel Muon per shard",
           distributed=True),

    Defect("padding-leak", distributed_controls.padding_leak, "shard-local",
           lambda c: _pads_a_matrix(c) and c.grad not in ("zero", "huge"),
           "padding rows (ones) of an uneven shard inside the orthogonalized matrix (invisible under huge gradients)", distributed=True),

    Defect("wrong-params", distributed_controls.wrong_params, "shard-local",
           lambda c: c.layout != "single" and c.megabatch > c.world_size and c.grad != "zero",
           "results returned to the wrong member", distributed=True),

    Defect("no-gather", distributed_controls.no_gather, "replicas", lambda c: c.layout == "replicated" and c.grad != "zero",
           "replicas skip the all-gather and drift apart", distributed=True),

    Defect("dion2-kernel-selection", dion2_controls.kernel_selection, "selection",
           lambda c: _selecting(c) and c.flatten and len(c.shape) > 2,
           "microsoft/dion: Dion2 selected over the kernel rows of an unflattened conv (before it rejected "
           "flatten=True)"),
    Defect("dion2-ef-unselected", dion2_controls.ef_unselected, "selection",
           lambda c: _selecting(c) and c.steps > 1,
           "error feedback decays the unselected slices instead of the selected (mask inverted)",
           ambiguous=_every_slice_selected),
    Defect("dion2-submatrix-lr", dion2_controls.submatrix_lr, "lr-scale",
           lambda c: _selecting(c) and c.adjust_lr != "none",
           "adjust_lr computed on the selected submatrix [k, n] instead of the full matrix view"),
    Defect("dion2-local-as-global", dion2_controls.local_as_global, "selection",
           lambda c: _selecting(c) and c.scope == "global" and _splits_slices(c) and c.grad != "zero",
           "microsoft/dion: top-k over the local shard's slices where the global top-k is declared",
           distributed=True),
)
"""The defects, by name."""

BY_NAME = types.MappingProxyType({d.name: d for d in CATALOG})


def __getattr__(name: str) -> Callable[[], Target]:
    """`harness.apps.selftest_catalog:<name>` (dashes as underscores) is a target factory."""
    defect = BY_NAME.get(name.replace("_", "-"))
    if defect is None:
        raise AttributeError(name)
    return defect.make


def spec(defect: Defect) -> str:
    """The target spec of `defect`."""
    return f"harness.apps.selftest_catalog:{defect.name.replace('-', '_')}"
