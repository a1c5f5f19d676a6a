"""The optimizers as most users build them (lr only, or nothing) step as their documented defaults say.

Every conformance case passes its hyper-parameters explicitly, so a changed default (NorMuon's beta2
0.95 mutated to 1.95 survived the harness: issue 31) is judged here: each optimizer is built with
no option, or with lr only, and three steps of it are compared with the FP64 oracles' functions run
with the values the documentation states (DOCUMENTED, written out here, never read from the
optimizers). fp64 parameters: the compute dtype (fp32 by default on CPU) is the only rounding.
Negative controls: the same optimizer with one documented default changed (CHANGED) fails the same
comparison, so every default is observable by it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from optimizers import Dion2, Muon, NorDion2, NorMuon
from oracles import (Conventions, Dion2Hyper, MuonHyper, NorDion2Hyper, NorMuonHyper, Orthogonalizer,
                     initial_variance, reference_dion2_step, reference_muon_step, reference_normuon_step)
from oracles.dion2_reference import initial_row_variance, reference_nordion2_step

DOCUMENTED = {
    # optimizers/muon.py (Muon's docstring and README): lr 0.02, Polar Express in 5 steps, normaliser
    # ||X|| * 1.01 + 1e-7, fp32 compute on CPU, lr scale sqrt(fan_out / fan_in) of the last two dims.
    "muon": dict(lr=0.02, momentum=0.95, nesterov=False, weight_decay=0.0, flatten=False, ns_steps=5, eps=1e-7),
    # README, NorMuon: NorMuon(params, beta2=0.95, variance_eps=1e-8, ...)
    "normuon": dict(beta2=0.95, variance_eps=1e-8),
    # README, Dion2 and NorDion2: Dion2(params, lr=0.01, fraction=0.25, ef_decay=0.95, ...)
    "dion2": dict(lr=0.01, fraction=0.25, ef_decay=0.95),
    # optimizers/algorithms/adamw.py: betas (0.9, 0.95), adamw_eps 1e-8; the group's lr is Muon's
    "adamw": dict(betas=(0.9, 0.95), adamw_eps=1e-8),
}

STEPS = 3
RTOL = 1e-4
"""Worst relative error of an update allowed: the fp32 orthogonalization's rounding (measured worst
6.2e-6, Dion2; AdamW computes in fp64, 0) with 16x margin; every control measured 57x or more above it."""

SHAPES = ((6, 10), (12, 5), (4, 3, 5))
"""Wide, tall, and a 3-D parameter (a batch of 3 x 5 matrices without flatten)."""
GRAD_SCALES = (1.0, 1.0, 1e-6)
"""The 3-D parameter's gradients are tiny, so that the normaliser's eps shows in its update."""
VECTOR_SCALES = (1.0, 1e-6)
"""AdamW's two 1-D parameters; the tiny one shows adamw_eps."""


def data(shapes, scales, seed=0):
    """Parameters and STEPS gradients per parameter, fp64."""
    gen = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    grads = [[scale * torch.randn(s, generator=gen, dtype=torch.float64) for s, scale in zip(shapes, scales)]
             for _ in range(STEPS)]
    return params, grads


def trajectory(build, shapes, scales):
    """(initial parameters, gradients, the parameters after each step) of the optimizer `build` makes."""
    x0, grads = data(shapes, scales)
    params = [torch.nn.Parameter(x.clone()) for x in x0]
    opt = build(params)
    after = []
    for g in grads:
        for p, gi in zip(params, g):
            p.grad = gi.clone()
        opt.step()
        after.append([p.detach().clone() for p in params])
    return x0, grads, after


def conventions() -> Conventions:
    d = DOCUMENTED["muon"]
    return Conventions(orthogonalizer=Orthogonalizer.named("polar_express", steps=d["ns_steps"], eps=d["eps"]),
                       lr_scale="spectral_norm", lr_dims="last_two", compute_dtype="fp32", state_dtype="fp64")


def muon_hyper(**override) -> dict:
    d = DOCUMENTED["muon"]
    return dict(lr=d["lr"], momentum=d["momentum"], nesterov=d["nesterov"], weight_decay=d["weight_decay"],
                flatten=d["flatten"], **override)


def oracle_state(algorithm: str, shape: tuple[int, ...]):
    zeros = np.zeros(shape)
    if algorithm == "normuon":
        return (zeros, initial_variance(shape, DOCUMENTED["muon"]["flatten"]))
    if algorithm == "nordion2":
        return (zeros, initial_row_variance(shape, DOCUMENTED["muon"]["flatten"]))
    return zeros


def oracle_step(algorithm: str, x: np.ndarray, state, g: np.ndarray):
    """(new parameter, new state) of one FP64 step with the documented defaults."""
    conv, dion = conventions(), DOCUMENTED["dion2"]
    if algorithm == "muon":
        return reference_muon_step(x, state, g, MuonHyper(**muon_hyper()), conv)
    if algorithm == "normuon":
        x, m, v = reference_normuon_step(x, *state, g, NorMuonHyper(**muon_hyper(), **DOCUMENTED["normuon"]), conv)
        return x, (m, v)
    common = dict(lr=dion["lr"], fraction=dion["fraction"], ef_decay=dion["ef_decay"],
                  weight_decay=DOCUMENTED["muon"]["weight_decay"], flatten=DOCUMENTED["muon"]["flatten"])
    if algorithm == "dion2":
        x, m, _ = reference_dion2_step(x, state, g, Dion2Hyper(**common), conv)
        return x, m
    x, m, v, _ = reference_nordion2_step(x, *state, g, NorDion2Hyper(**common, **DOCUMENTED["normuon"]), conv)
    return x, (m, v)


def adamw_reference(x0, grads):
    """FP64 AdamW with the documented defaults, the parameters after each step."""
    (b1, b2), eps, lr = DOCUMENTED["adamw"]["betas"], DOCUMENTED["adamw"]["adamw_eps"], DOCUMENTED["muon"]["lr"]
    out, xs = [], [x.numpy() for x in x0]
    m = [np.zeros_like(x) for x in xs]
    v = [np.zeros_like(x) for x in xs]
    for t, g in enumerate(grads, start=1):
        for i, gi in enumerate(g):
            gi = gi.numpy()
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            xs[i] = xs[i] - lr * (m[i] / (1 - b1**t)) / (np.sqrt(v[i] / (1 - b2**t)) + eps)
        out.append([x.copy() for x in xs])
    return out


def worst_error(algorithm: str, build) -> float:
    """Worst relative error of an update of `build`'s optimizer against the oracle with the documented
    defaults: each step re-seeded from the optimizer's own previous parameter (the oracle keeps its
    own FP64 state), as the harness's `reference` check does."""
    if algorithm == "adamw":
        shapes = tuple((n,) for n in (7, 9))
        x0, grads, after = trajectory(build, shapes, VECTOR_SCALES)
        ref = adamw_reference(x0, grads)
        prev = [x.numpy() for x in x0]
        worst = 0.0
        for k in range(STEPS):  # AdamW's reference has no re-seeding: its state is elementwise and exact
            for i in range(len(shapes)):
                delta_ref = ref[k][i] - (x0[i].numpy() if k == 0 else ref[k - 1][i])
                delta = after[k][i].numpy() - prev[i]
                worst = max(worst, np.linalg.norm(delta - delta_ref) / np.linalg.norm(delta_ref))
                prev[i] = after[k][i].numpy()
        return worst
    x0, grads, after = trajectory(build, SHAPES, GRAD_SCALES)
    worst = 0.0
    for i, shape in enumerate(SHAPES):
        state, prev = oracle_state(algorithm, shape), x0[i].numpy()
        for k in range(STEPS):
            ref, state = oracle_step(algorithm, prev, state, grads[k][i].numpy())
            delta, delta_ref = after[k][i].numpy() - prev, ref - prev
            worst = max(worst, np.linalg.norm(delta - delta_ref) / np.linalg.norm(delta_ref))
            prev = after[k][i].numpy()
    return worst


def adamw(**options):
    """Muon with its 1-D parameters in an "adamw" group, as users route them; `options` go to Muon."""
    return lambda params: Muon([{"params": params, "algorithm": "adamw"}], **options)


BUILT = {
    "muon": {"nothing": lambda params: Muon(params), "lr only": lambda params: Muon(params, lr=0.02)},
    "normuon": {"nothing": lambda params: NorMuon(params), "lr only": lambda params: NorMuon(params, lr=0.02)},
    "dion2": {"nothing": lambda params: Dion2(params), "lr only": lambda params: Dion2(params, lr=0.01)},
    "nordion2": {"nothing": lambda params: NorDion2(params), "lr only": lambda params: NorDion2(params, lr=0.01)},
    "adamw": {"nothing": adamw(), "lr only": adamw(lr=0.02)},
}
"""How each optimizer is built: with no option, and with its documented default lr only."""


@pytest.mark.parametrize("algorithm,how", [(a, h) for a, hows in BUILT.items() for h in hows])
def test_defaults_step_as_documented(algorithm, how):
    assert worst_error(algorithm, BUILT[algorithm][how]) <= RTOL


CHANGED = {
    "muon": dict(lr=0.03, momentum=0.9, nesterov=True, weight_decay=0.1, flatten=True, ns_steps=6, eps=1e-5,
                 adjust_lr="rms_norm", orthogonalizer="newton_schulz", compute_dtype=torch.bfloat16),
    "normuon": dict(beta2=0.9, variance_eps=1e-2),
    "dion2": dict(lr=0.02, fraction=0.5, ef_decay=0.9),
    "nordion2": dict(beta2=0.9, variance_eps=1e-2, fraction=0.5),
    "adamw": dict(lr=0.03, betas=(0.8, 0.95), adamw_eps=1e-4),
}
"""Per optimizer, documented defaults each changed alone: the negative controls."""
CHANGED_ADAMW_BETA2 = dict(betas=(0.9, 0.99))


def _controls():
    for algorithm, options in CHANGED.items():
        for name, value in options.items():
            yield algorithm, {name: value}
    yield "adamw", CHANGED_ADAMW_BETA2


@pytest.mark.parametrize("algorithm,changed", list(_controls()), ids=lambda v: str(v))
def test_a_changed_default_is_flagged(algorithm, changed):
    """Control: one default changed fails the comparison by far (>= 30x RTOL)."""
    if algorithm == "adamw":
        build = adamw(**changed)
    else:
        cls = {"muon": Muon, "normuon": NorMuon, "dion2": Dion2, "nordion2": NorDion2}[algorithm]
        build = lambda params: cls(params, **changed)  # noqa: E731
    assert worst_error(algorithm, build) > 30 * RTOL
