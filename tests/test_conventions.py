"""The conventions adapters declare for peers: each one's oracle support, checked on a small
hand-computed example, and each one load-bearing: a correct implementation of the convention
is judged "pass" when it is declared and "fail" when the default is declared instead."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from cases import Case
from harness.judging.checks import reference
from harness.running.inputs import make_inputs
from harness.targets.base import OptimizerTarget
from harness.targets.ours import OursMuon
from oracles import Conventions, MuonHyper, Orthogonalizer, reference_muon_step
from oracles.coefficients import GNS_SAFETY, POLAR_EXPRESS_RAW, POLAR_EXPRESS_SAFETY_102, YOU_QUINTICS, safety_scaled
from oracles.muon_reference import DebiasedMomentum, apply_update, momentum_and_direction, orthogonalized_direction
from oracles.normuon_reference import NorMuonHyper, initial_variance, normalise_rows
from oracles.rounding import machine_epsilon, round_to

NS = Orthogonalizer.named("newton_schulz")
PLAIN = MuonHyper(lr=0.5, momentum=0.5, nesterov=False, weight_decay=0.0, flatten=False)
NESTEROV = dataclasses.replace(PLAIN, nesterov=True)


def test_defaults_are_unchanged():
    conv = Conventions(orthogonalizer=NS)
    assert (conv.momentum, conv.nesterov, conv.weight_decay_mask, conv.rounding, conv.state_dtype, conv.lr_dtype,
            conv.normuon_rows, conv.decay_dtype) == ("sum", "sum", "all", "nearest", "fp64", "fp64", "matrix", "fp64")


@pytest.mark.parametrize("field", ["momentum", "nesterov", "weight_decay_mask", "rounding", "state_dtype",
                                   "lr_dtype", "normuon_rows", "decay_dtype"])
def test_unknown_values_are_refused_by_name(field):
    with pytest.raises(ValueError, match=f"Conventions.{field}="):
        Conventions(orthogonalizer=NS, **{field: "nonsense"})


def test_debiased_ema_by_hand():
    """mu = 1/2: step 1 keeps G1 (b_1 = 0); step 2 has b_2 = 1 - (1/2)/(3/4) = 1/3, so
    M2 = G1/3 + 2 G2/3 = EMA_2 / (1 - mu^2) with EMA_2 = G1/4 + G2/2."""
    conv = Conventions(orthogonalizer=NS, momentum="ema_debiased")
    g1, g2 = np.array([[3.0, 0.0]]), np.array([[0.0, 3.0]])
    m1, u1 = momentum_and_direction(np.zeros((1, 2)), g1, PLAIN, conv)
    assert isinstance(m1, DebiasedMomentum) and m1.steps == 1
    np.testing.assert_allclose(u1, g1)
    m2, u2 = momentum_and_direction(m1, g2, PLAIN, conv)
    np.testing.assert_allclose(u2, [[1.0, 2.0]], rtol=1e-15)
    assert m2.steps == 2


def test_nesterov_plus_by_hand():
    """U = G + M with the EMA M = mu M + (1-mu) G: from M = 0, mu = 1/2, G = 4 gives M = 2, U = 6."""
    conv = Conventions(orthogonalizer=NS, momentum="ema", nesterov="plus")
    m, u = momentum_and_direction(np.zeros((1, 1)), np.array([[4.0]]), NESTEROV, conv)
    assert m[0, 0] == 2.0 and u[0, 0] == 6.0


@pytest.mark.parametrize("mu, want_m, want_u", [(0.75, [1.75, 1.75], [2.3125, 0.8125]),
                                                 (0.25, [3.25, -0.75], [3.8125, -1.6875])])
def test_nesterov_ema_by_hand(mu, want_m, want_u):
    """U = (1-mu) G + mu M with the EMA M = mu M + (1-mu) G, from M = [1, 3] and G = [4, -2], at mu = 3/4 and 1/4
    (1 - mu is not mu, and 1 - mu is 1 mod mu only above 1/2)."""
    conv = Conventions(orthogonalizer=NS, momentum="ema", nesterov="ema")
    hyper = dataclasses.replace(NESTEROV, momentum=mu)
    m, u = momentum_and_direction(np.array([[1.0, 3.0]]), np.array([[4.0, -2.0]]), hyper, conv)
    assert m.tolist() == [want_m] and u.tolist() == [want_u]


def test_cautious_decay_by_hand():
    """Only entries with X * O > 0 decay: X (1 - lr wd) there, X elsewhere, where O = 0 too (scale 1: square)."""
    hyper = dataclasses.replace(PLAIN, lr=0.5, weight_decay=0.2)
    conv = Conventions(orthogonalizer=NS, weight_decay_mask="cautious")
    x = np.array([[1.0, 1.0, 1.0], [-1.0, -1.0, 1.0], [1.0, 1.0, 1.0]])
    o = np.array([[1.0, -1.0, 0.0], [1.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    decayed = 1.0 - 0.5 * 0.2
    expected = np.array([[decayed - 0.5, 1.0 + 0.5, 1.0], [-1.0 - 0.5, -decayed + 0.5, 1.0], [1.0, 1.0, 1.0]])
    np.testing.assert_array_equal(apply_update(x, o, hyper, conv), expected)


def test_cautious_decay_folded_into_the_update_by_hand():
    """decay_dtype fp32 with cautious decay: X - step fp32(O + (lr_wd / step) wd X mask), the mask X * O > 0, so
    not where O = 0 (lr 0.5, wd 0.25, scale 1: every value exact)."""
    hyper = dataclasses.replace(PLAIN, lr=0.5, weight_decay=0.25)
    conv = Conventions(orthogonalizer=NS, lr_scale="none", weight_decay_mask="cautious", decay_dtype="fp32")
    x = np.array([[1.0, 1.0], [1.0, -1.0]])
    o = np.array([[1.0, -1.0], [0.0, 0.5]])
    expected = np.array([[1.0 - 0.5 * 1.25, 1.0 + 0.5], [1.0, -1.0 - 0.25]])
    np.testing.assert_array_equal(apply_update(x, o, hyper, conv), expected)


def test_decay_dtype_folds_the_decay_into_the_held_update_by_hand():
    """decay_dtype bf16: X - step bf16(O + (lr_wd / step) wd X). With lr 0.5, wd 0.25, scale 1 and O = 1, a
    decay term below half a bf16 ulp of 1 is lost, one that is a bf16 value survives; cautious decay masks
    the decay term only; a base-lr decay is folded as (lr / step) wd X; an "after" order cannot fold."""
    hyper = dataclasses.replace(PLAIN, lr=0.5, weight_decay=0.25)
    conv = Conventions(orthogonalizer=NS, lr_scale="none", weight_decay_lr="adjusted", decay_dtype="bf16")
    x, o = np.array([[2.0**-8]]), np.array([[1.0]])
    # wd X = 2^-10: O + wd X = 1 + 2^-10, which bf16 (7 stored bits) rounds to 1: the decay term is lost
    assert apply_update(x, o, hyper, conv)[0, 0] == 2.0**-8 - 0.5
    exact = apply_update(x, o, hyper, dataclasses.replace(conv, decay_dtype="fp64"))[0, 0]
    assert exact == 2.0**-8 * (1 - 0.5 * 0.25) - 0.5
    # 2^-7 of decay survives: 1 + 2^-7 is a bf16 value
    big = np.array([[2.0**-5]])
    assert apply_update(big, o, hyper, conv)[0, 0] == 2.0**-5 - 0.5 * (1 + 2.0**-7)
    cautious = dataclasses.replace(conv, weight_decay_mask="cautious")
    assert apply_update(-big, o, hyper, cautious)[0, 0] == -(2.0**-5) - 0.5  # X O < 0: no decay term
    base = dataclasses.replace(conv, lr_scale="spectral_norm", weight_decay_lr="base")  # 1 x 4: scale 1/2
    wide = np.full((1, 4), 2.0**-5)
    # step 0.25, lr_wd 0.5: the folded term is (0.5 / 0.25) wd X = 2^-6, O + 2^-6 is a bf16 value
    np.testing.assert_array_equal(apply_update(wide, np.ones((1, 4)), hyper, base), wide - 0.25 * (1 + 2.0**-6))
    assert "the decay term in bf16" in conv.held_formats()
    with pytest.raises(ValueError, match="decay_dtype"):
        Conventions(orthogonalizer=NS, decay_dtype="bf16", weight_decay_order="after")


def test_state_dtype_rounds_the_buffer_and_its_inputs():
    """In fp32, 1 + 2^-30 is 1: the stored buffer holds 1; U = G + mu M uses the exact G."""
    conv = Conventions(orthogonalizer=NS, state_dtype="fp32")
    g = np.array([[1.0 + 2.0**-30]])
    m, u = momentum_and_direction(np.zeros((1, 1)), g, NESTEROV, conv)
    assert m[0, 0] == 1.0 and u[0, 0] == g[0, 0] + 0.5


def test_lr_dtype_rounds_lr_scale_and_product():
    """An fp32 lr of 0.02 is 0.0199999995529651641845703125: the step is X - fp32(lr) O."""
    hyper = dataclasses.replace(PLAIN, lr=0.02)
    conv = Conventions(orthogonalizer=NS, lr_scale="none", lr_dtype="fp32")
    x, o = np.zeros((2, 2)), np.ones((2, 2))
    step = apply_update(x, o, hyper, conv)
    assert step[0, 0] == -float(np.float32(0.02)) and step[0, 0] != -0.02


def test_held_formats_are_named_in_the_record():
    """A declared coarse lr or state is a real, harmless imprecision: the reference copies it and
    the reference check's message says so."""
    assert Conventions(orthogonalizer=NS).held_formats() == ""
    held = Conventions(orthogonalizer=NS, lr_dtype="fp32", state_dtype="bf16").held_formats()
    assert "lr in fp32" in held and "momentum in bf16" in held
    case = dataclasses.replace(CASE, nesterov=True)
    peer = ConventionMuon(VARIANTS["lr_dtype fp32"][0], VARIANTS["lr_dtype fp32"][0])
    inputs = make_inputs(case)
    outcome = reference(case, peer, inputs, peer.run(inputs.params, inputs.grads, case))
    assert outcome.status == "pass" and "the target holds lr in fp32" in outcome.message


def test_stochastic_rounding_reference_is_the_expectation():
    """Declared stochastic rounding: the oracle orthogonalizes U itself, not its nearest bf16."""
    u = np.array([[1.0 + 2.0**-10, 0.0], [0.0, 0.5]])
    hyper = dataclasses.replace(PLAIN, momentum=0.0)
    conv = Conventions(orthogonalizer=Orthogonalizer("svd"), compute_dtype="bf16", momentum="sum")
    _, nearest = orthogonalized_direction(np.zeros_like(u), u, hyper, conv)
    _, expected = orthogonalized_direction(np.zeros_like(u), u, hyper, dataclasses.replace(conv, rounding="stochastic"))
    assert round_to(u, "bf16")[0, 0] == 1.0  # nearest rounding drops the 2^-10
    np.testing.assert_allclose(nearest, np.eye(2), atol=0)
    np.testing.assert_allclose(expected, np.eye(2), atol=1e-15)  # the polar factor of a diagonal: I either way
    one_step = Orthogonalizer.polynomial([(1.0, 0.0, 0.0)], eps=0.0)
    _, lin_nearest = orthogonalized_direction(np.zeros_like(u), u, hyper, dataclasses.replace(conv, orthogonalizer=one_step))
    _, lin_exact = orthogonalized_direction(np.zeros_like(u), u, hyper,
                                            dataclasses.replace(conv, orthogonalizer=one_step, rounding="stochastic"))
    norm = math.hypot(1.0 + 2.0**-10, 0.5)
    assert lin_exact[0, 0] == pytest.approx((1.0 + 2.0**-10) / norm, rel=1e-15)
    assert lin_nearest[0, 0] == pytest.approx(1.0 / math.hypot(1.0, 0.5), rel=1e-15)


def test_fp16_compute_rounds_to_half():
    """fp16 keeps 10 mantissa bits: 1 + 2^-11 rounds to 1 (even), 1 + 2^-10 stays."""
    assert round_to(np.array([1.0 + 2.0**-11, 1.0 + 2.0**-10]), "fp16").tolist() == [1.0, 1.0 + 2.0**-10]
    conv = Conventions(orthogonalizer=Orthogonalizer.polynomial([(1.0, 0.0, 0.0)], eps=0.0), compute_dtype="fp16")
    _, o = orthogonalized_direction(np.zeros((1, 2)), np.array([[1.0 + 2.0**-11, 0.0]]),
                                    dataclasses.replace(PLAIN, momentum=0.0), conv)
    assert o[0, 0] == 1.0


def test_any_schedule_and_normaliser_by_hand():
    """One step p(x) = 1.5 x - 0.5 x^3 from X0 = G / (2 ||G||_F + 0): for G = diag(3, 4), ||G|| = 5,
    singular values 0.3 and 0.4 map to 0.4365 and 0.568."""
    orth = Orthogonalizer.polynomial([(1.5, -0.5, 0.0)], eps=0.0, scale=2.0)
    conv = Conventions(orthogonalizer=orth)
    _, o = orthogonalized_direction(np.zeros((2, 2)), np.diag([3.0, 4.0]), dataclasses.replace(PLAIN, momentum=0.0), conv)
    np.testing.assert_allclose(np.diag(o), [1.5 * 0.3 - 0.5 * 0.027, 1.5 * 0.4 - 0.5 * 0.064], rtol=1e-14)
    with pytest.raises(ValueError, match="no step"):
        Orthogonalizer.polynomial([], eps=1e-7)


def test_peer_schedules():
    """gram-newton-schulz: Polar Express / 1.05 on all five steps; dion's table is its own."""
    a, b, c = safety_scaled(POLAR_EXPRESS_RAW[:5], GNS_SAFETY)[0]
    assert (a, b, c) == (POLAR_EXPRESS_RAW[0][0] / 1.05, POLAR_EXPRESS_RAW[0][1] / 1.05**3,
                         POLAR_EXPRESS_RAW[0][2] / 1.05**5)
    assert len(YOU_QUINTICS) == len(POLAR_EXPRESS_SAFETY_102) == 5
    assert POLAR_EXPRESS_SAFETY_102[0][0] != pytest.approx(POLAR_EXPRESS_RAW[0][0] / 1.02, rel=1e-3)


def test_trailing_normuon_rows_by_hand():
    """A [1, 2, 2] parameter with flatten: "matrix" rows are the one row of [1, 4]; "trailing" rows
    are the two rows of the 2 x 2 slice, each normalised (v = (1-b2) mean(row^2)), then the slice
    restored to its norm."""
    hyper = NorMuonHyper(lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.0, flatten=True, beta2=0.5,
                         variance_eps=0.0)
    o = np.array([[[3.0, 4.0], [0.0, 1.0]]])
    assert initial_variance(o.shape, True, "trailing").shape == (1, 2)
    assert initial_variance(o.shape, True, "matrix").shape == (1, 1)
    normed, v = normalise_rows(o, np.zeros((1, 2)), hyper, rows="trailing")
    np.testing.assert_allclose(v, [[0.5 * 12.5, 0.5 * 0.5]])
    rows = np.array([[3.0, 4.0] / np.sqrt(6.25), [0.0, 1.0] / np.sqrt(0.25)])
    np.testing.assert_allclose(normed[0], rows * np.linalg.norm(o) / np.linalg.norm(rows), rtol=1e-15)
    flat, _ = normalise_rows(o, np.zeros((1, 1)), hyper, rows="matrix")
    np.testing.assert_allclose(flat, o, rtol=1e-15)  # one row: normalising then restoring is the identity
    matrix = dataclasses.replace(hyper, flatten=False)
    blocks = [normalise_rows(o[0], np.zeros((1, 2)), matrix, [1, 1], rows)[0] for rows in ("trailing", "matrix")]
    np.testing.assert_array_equal(*blocks)  # a 2-D parameter is its own slice: Shard(0) blocks still apply


# Load-bearing: a correct fp64 implementation of each convention, judged with it declared and not.

CASE = Case.from_id("muon/linear-12x20/mb1/noflat/fp64@fp64/ns/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0")


class ConventionMuon(OptimizerTarget):
    """A small fp64 torch Muon that does what `actual` says, and declares `declared`."""

    name = "convention-muon"

    def __init__(self, actual: Conventions, declared: Conventions) -> None:
        self.actual, self.declared = actual, declared

    def conventions(self, case: Case) -> Conventions:
        return self.declared

    def make(self, params, case):
        return _ConventionSGD(params, case, self.actual)


class _ConventionSGD(torch.optim.Optimizer):
    def __init__(self, params, case: Case, conv: Conventions) -> None:
        super().__init__(params, {})
        self.case, self.conv = case, conv

    @torch.no_grad()
    def step(self, closure=None):
        case, conv = self.case, self.conv
        held = {"fp64": torch.float64, "fp32": torch.float32}
        for p in self.param_groups[0]["params"]:
            state = self.state[p]
            t = state["t"] = state.get("t", 0) + 1
            m = state.setdefault("m", torch.zeros_like(p, dtype=held[conv.state_dtype]))
            mu = case.momentum
            if conv.momentum == "ema_debiased":
                beta = 1.0 - (1.0 - mu) / (1.0 - mu**t)
                m.mul_(beta).add_(p.grad.to(m.dtype) * (1.0 - beta))
            else:
                m.mul_(mu).add_(p.grad.to(m.dtype) * (1.0 if conv.momentum == "sum" else 1.0 - mu))
            buf = m.to(torch.float64)
            u = (p.grad + {"sum": mu * buf, "ema": buf, "plus": buf}[conv.nesterov]
                 if case.nesterov else buf)
            if conv.nesterov == "ema" and case.nesterov:
                u = (1.0 - mu) * p.grad + mu * buf
            x = u / (u.norm() + conv.orthogonalizer.normaliser.eps)
            for a, b, c in conv.orthogonalizer.schedule:
                s = x @ x.mT
                x = a * x + (b * s + c * s @ s) @ x
            lr = torch.tensor(case.lr, dtype=held[conv.lr_dtype])
            scale = torch.tensor(math.sqrt(p.shape[0] / p.shape[1]), dtype=held[conv.lr_dtype])
            step = float(lr * scale)
            mask = (p * x > 0).to(p.dtype) if conv.weight_decay_mask == "cautious" else 1.0
            if conv.decay_dtype == "bf16":  # decay added into a bf16 update, as dtensor-muon does
                held_update = (x + float(lr) / step * case.weight_decay * p * mask).to(torch.bfloat16)
                p.sub_(step * held_update.to(p.dtype))
                continue
            p.mul_(1.0 - float(lr) * case.weight_decay * mask).sub_(step * x)


BASE = Conventions(orthogonalizer=Orthogonalizer.named("newton_schulz"), compute_dtype="fp64")

VARIANTS = {
    "momentum ema_debiased": (dataclasses.replace(BASE, momentum="ema_debiased"), False),
    "nesterov plus": (dataclasses.replace(BASE, momentum="ema", nesterov="plus"), True),
    "weight_decay_mask cautious": (dataclasses.replace(BASE, weight_decay_mask="cautious"), True),
    "state_dtype fp32": (dataclasses.replace(BASE, state_dtype="fp32"), True),
    "lr_dtype fp32": (dataclasses.replace(BASE, lr_dtype="fp32"), True),
    "schedule You": (dataclasses.replace(BASE, orthogonalizer=Orthogonalizer.polynomial(YOU_QUINTICS, eps=1e-7)), True),
    "decay_dtype bf16": (dataclasses.replace(BASE, decay_dtype="bf16"), True),
}
"""name -> (a convention that differs from BASE, whether the case is Nesterov)."""

WRONG = {"momentum ema_debiased": dict(momentum="ema"), "nesterov plus": dict(nesterov="ema")}
"""The nearest wrong declaration where BASE would differ in more than the one field."""


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_convention_is_load_bearing(name):
    """Without Nesterov the debiased EMA differs from the EMA by a scale 1/(1 - mu^t) that the
    normaliser removes up to its eps: load-bearing at fp64 tolerance through eps alone."""
    actual, nesterov = VARIANTS[name]
    case = dataclasses.replace(CASE, nesterov=nesterov)
    wrong = dataclasses.replace(actual, **WRONG[name]) if name in WRONG else BASE
    inputs = make_inputs(case)
    right_peer, wrong_peer = ConventionMuon(actual, actual), ConventionMuon(actual, wrong)
    traj = right_peer.run(inputs.params, inputs.grads, case)
    assert reference(case, right_peer, inputs, traj).status == "pass"
    assert reference(case, wrong_peer, inputs, traj).status == "fail"


def test_trailing_rows_are_load_bearing():
    """Our NorMuon restores the norm of the whole parameter: declaring "trailing" for it (the
    convention of a per-slice implementation) fails on a batch of matrices, "matrix" passes."""
    case = Case.from_id("normuon/conv1d-8x4x5/mb1/noflat/fp64@fp64/ns/spectral_norm/nesterov/wd0.1/steps3/gaussian/seed0")

    class Declared(OursMuon):
        def __init__(self, rows):
            self.rows = rows

        def conventions(self, c):
            return dataclasses.replace(super().conventions(c), normuon_rows=self.rows)

    inputs = make_inputs(case)
    traj = Declared("matrix").run(inputs.params, inputs.grads, case)
    assert reference(case, Declared("matrix"), inputs, traj).status == "pass"
    assert reference(case, Declared("trailing"), inputs, traj).status == "fail"


def test_reference_step_threads_the_debiased_state():
    """reference_muon_step returns the DebiasedMomentum it needs back; the harness threads it."""
    conv = Conventions(orthogonalizer=NS, momentum="ema_debiased")
    g = np.random.default_rng(0).standard_normal((3, 4))
    _, m1 = reference_muon_step(np.zeros((3, 4)), np.zeros((3, 4)), g, PLAIN, conv)
    _, m2 = reference_muon_step(np.zeros((3, 4)), m1, g, PLAIN, conv)
    assert (m1.steps, m2.steps) == (1, 2)
    np.testing.assert_allclose(m2.buffer, g, rtol=1e-15)  # a constant gradient: the debiased EMA is G


@pytest.mark.parametrize("compute_dtype, fmt", [("fp64", "fp64"), ("fp32", "fp32"), ("bf16", "fp32"), ("fp16", "fp32")])
def test_the_svd_reference_cuts_off_at_the_eps_of_the_format_it_runs_in(compute_dtype, fmt):
    """oracles.Orthogonalizer.named("svd"): the SVD runs in at least fp32, so its rank cut-off factor is fp32's
    machine epsilon below fp64 and fp64's at fp64. The harness cannot judge it: the inputs where a cut-off decides
    the answer are rank-deficient ones, whose reference check it skips as ill-posed."""
    assert Orthogonalizer.named("svd", compute_dtype=compute_dtype).rcond_factor == machine_epsilon(fmt)


def test_the_svd_cut_off_is_relative_to_the_largest_singular_value_times_the_larger_side():
    """named("svd") in fp32 cuts at eps32 max(m, n) s_max: of a 3 x 40 matrix with singular values 1, 1 and 1e-6
    (above eps32 = 1.2e-7, below 40 eps32 = 4.8e-6) the polar factor keeps the first two only."""
    from oracles.muon_reference import orthogonalize
    rng = np.random.default_rng(5)
    u, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    v, _ = np.linalg.qr(rng.standard_normal((40, 3)))
    x = u @ np.diag([1.0, 1.0, 1e-6]) @ v.T
    got = orthogonalize(x[None], Orthogonalizer.named("svd", compute_dtype="fp32"), False)[0]
    np.testing.assert_allclose(got, u[:, :2] @ v[:, :2].T, atol=1e-9)


def test_an_svd_built_without_a_cut_off_drops_exact_zero_singular_values():
    """Orthogonalizer("svd") (rcond_factor left at 0): the polar factor of a matrix of rank 2 whose third singular
    value is exactly 0 is U V^T over the two others; a negative default factor kept the zero one's arbitrary
    direction (rank 3)."""
    from oracles.muon_reference import orthogonalize
    x = np.zeros((3, 4))
    x[0, 0], x[1, 1] = 3.0, 2.0
    got = orthogonalize(x[None], Orthogonalizer("svd"), False)[0]
    want = np.zeros((3, 4))
    want[0, 0] = want[1, 1] = 1.0
    np.testing.assert_allclose(got, want, atol=1e-15)


def test_an_orthogonalizers_options_are_keyword_only():
    """Orthogonalizer.named's and .polynomial's options are keyword-only: a positional step count or eps, easily
    swapped, is refused; the name and the schedule are positional or keyword."""
    with pytest.raises(TypeError):
        Orthogonalizer.named("newton_schulz", 3)
    with pytest.raises(TypeError):
        Orthogonalizer.polynomial([(3.0, -3.2, 1.2)], 1e-7)
    assert Orthogonalizer.named(name="newton_schulz", steps=3) == Orthogonalizer.named("newton_schulz", steps=3)
    assert Orthogonalizer.polynomial(schedule=[(3.0, -3.2, 1.2)], eps=1e-7).schedule == ((3.0, -3.2, 1.2),)


@pytest.mark.parametrize("dims, expected", [("flattened", (8, 36)), ("last_two", (3, 3)), ("first_two", (8, 4))])
def test_fans_of_a_conv_weight_under_each_lr_dims(dims, expected):
    """oracles.conventions.fans of an 8 x 4 x 3 x 3 weight: each LR_DIMS convention takes its own dims."""
    from oracles.conventions import fans
    assert fans((8, 4, 3, 3), dims) == expected


def test_an_unknown_orthogonalizer_name_is_refused():
    """Orthogonalizer.named refuses a name that is none of ORTHOGONALIZERS, whichever way it sorts against them."""
    for name in ("zzz", "qr", "nonexistent"):
        with pytest.raises(ValueError, match="unknown orthogonalizer"):
            Orthogonalizer.named(name)


def test_stochastic_rounding_is_named_among_what_the_target_holds():
    """Conventions.held_formats names U stochastically rounded to the compute dtype (the reference takes its
    expectation), and nothing of it under round-to-nearest."""
    stochastic = Conventions(orthogonalizer=NS, compute_dtype="bf16", rounding="stochastic").held_formats()
    assert "stochastically rounded to bf16" in stochastic
    assert "stochastic" not in Conventions(orthogonalizer=NS, compute_dtype="bf16").held_formats()


@pytest.mark.parametrize("shape, expected", [((8, 2), 2.0), ((2, 8), 1.0), ((6, 4), math.sqrt(1.5))])
def test_the_clamped_spectral_lr_scale_is_never_below_one(shape, expected):
    """lr_scale "spectral_norm_clamped": sqrt(max(1, fan_out / fan_in)); a wide matrix keeps lr as it is."""
    from oracles.conventions import lr_scale
    assert lr_scale(shape, "spectral_norm_clamped", "flattened") == pytest.approx(expected, rel=1e-15)


def test_a_computed_orthogonalizer_name_is_read_by_value():
    """A name built at run time (read from a file, joined) is the same name as the literal: "none" built from
    its halves is the identity orthogonalizer, not an unknown name."""
    assert Orthogonalizer.named("".join(["no", "ne"])) == Orthogonalizer.named("none")


def test_the_reference_matrix_view_refuses_a_vector():
    from oracles.muon_reference import matrix_view
    with pytest.raises(ValueError, match="2 or more dims, got shape \\(4,\\)"):
        matrix_view(np.zeros(4), False)
    assert matrix_view(np.zeros((3, 4, 5)), False).shape == (3, 4, 5)
    assert matrix_view(np.zeros((3, 4, 5)), True).shape == (1, 3, 20)


def _built_at_run_time(record):
    """`record` with every string field rebuilt at run time (equal, never the same object as the literal)."""
    return dataclasses.replace(record, **{f.name: "".join(list(getattr(record, f.name)))
                                          for f in dataclasses.fields(record) if isinstance(getattr(record, f.name), str)})


@pytest.mark.parametrize("conv", [
    Conventions(orthogonalizer=Orthogonalizer.named("svd"), momentum="ema_debiased", nesterov="ema",
                weight_decay_mask="cautious", weight_decay_order="before", weight_decay_lr="base", compute_dtype="bf16"),
    Conventions(orthogonalizer=NS, momentum="sum", nesterov="sum", weight_decay_order="after",
                weight_decay_lr="adjusted", rounding="stochastic", compute_dtype="bf16"),
    Conventions(orthogonalizer=NS, momentum="ema", nesterov="plus"),
    Conventions(orthogonalizer=NS, weight_decay_mask="cautious", decay_dtype="fp32"),
], ids=["svd-debiased-ema-cautious", "sum-sum-after", "ema-plus", "cautious-folded"])
def test_a_reference_step_reads_every_convention_by_value(conv):
    """Two Nesterov steps with weight decay under conventions whose names were built at run time (as an adapter
    reading them from a file has them) equal the steps under the literals: every branch compares by value."""
    built = dataclasses.replace(_built_at_run_time(conv), orthogonalizer=_built_at_run_time(conv.orthogonalizer))
    hyper = dataclasses.replace(NESTEROV, momentum=0.75, weight_decay=0.25)
    rng = np.random.default_rng(3)
    x0, g = rng.standard_normal((3, 5)), rng.standard_normal((2, 3, 5))
    runs = []
    for c in (conv, built):
        x, m = x0, np.zeros((3, 5))
        for step in range(2):
            x, m = reference_muon_step(x, m, g[step], hyper, c)
        runs.append(x)
    assert np.array_equal(runs[0], runs[1])


@pytest.mark.parametrize("record, field", [(Orthogonalizer.named("none"), "kind"),
                                           (Conventions(orthogonalizer=NS), "momentum")])
def test_the_conventions_records_are_frozen(record, field):
    """An oracle's conventions are values shared by every case that names them: they cannot be changed in place."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(record, field, "ema")
