"""optimizers.Muon: validation before any change, megabatching, state, the AdamW fallback."""

import copy
import math

import pytest
import torch

from optimizers import Muon
from optimizers.matrix_view import as_matrices, lr_scale, matrix_count, matrix_dims


def params(*shapes, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(*shape, generator=g, dtype=dtype))
        p.grad = torch.randn(*shape, generator=g, dtype=dtype)
        out.append(p)
    return out


def snapshot(ps):
    return [p.detach().clone() for p in ps]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(adjust_lr="sqrt"), ValueError, "adjust_lr"),
    (dict(orthogonalizer="qr"), ValueError, "orthogonalizer"),
    (dict(lr=math.nan), ValueError, "lr must be finite"),
    (dict(momentum=math.inf), ValueError, "momentum must be finite"),
    (dict(momentum=1.0), ValueError, "momentum"),
    (dict(weight_decay=-0.1), ValueError, "weight_decay"),
    (dict(ns_steps=0), ValueError, "ns_steps"),
    (dict(eps=math.nan), ValueError, "eps"),
    (dict(compute_dtype=torch.int32), ValueError, "compute_dtype"),
    (dict(nesterov="yes"), TypeError, "nesterov"),
    (dict(algorithm="normuon", beta2=1.0), ValueError, "beta2"),
    (dict(algorithm="normuon", variance_eps=0.0), ValueError, "variance_eps"),
    (dict(algorithm="lion"), ValueError, "algorithm"),
])
def test_bad_options_raise_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        Muon(params((4, 6)), **kwargs)


def test_bad_parameters_raise_at_construction():
    with pytest.raises(ValueError, match="adamw"):
        Muon([torch.nn.Parameter(torch.zeros(5))])
    with pytest.raises(TypeError, match="dtype"):
        Muon([torch.nn.Parameter(torch.zeros(3, 3, dtype=torch.complex64))])
    with pytest.raises(TypeError, match="dtype"):
        Muon([torch.zeros(3, 3, dtype=torch.int64)])
    with pytest.raises(ValueError, match="algorithm"):
        Muon([{"params": params((3, 3)), "algorithm": "sgd"}])
    with pytest.raises(TypeError, match="mesh"):
        Muon(params((3, 3)), mesh=object())


def test_bad_group_added_later_leaves_the_optimizer_unchanged():
    opt = Muon(params((4, 6)))
    with pytest.raises(ValueError, match="param group 1"):
        opt.add_param_group({"params": params((5,))})
    assert len(opt.param_groups) == 1


def test_hyperparameter_broken_after_construction_fails_before_any_change():
    ps = params((4, 6), (4, 6), (3, 5))
    opt = Muon([{"params": ps[:2]}, {"params": ps[2:]}])
    before = snapshot(ps)
    opt.param_groups[1]["lr"] = math.nan
    with pytest.raises(ValueError, match="param group 1: lr"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(ps)))
    assert len(opt.state) == 0, "no momentum buffer may be created by a rejected step"


def test_bad_gradient_fails_before_any_change():
    ps = params((4, 6), (4, 6))
    ps[1].grad = torch.zeros(4, 6).to_sparse()
    opt = Muon(ps)
    before = snapshot(ps)
    with pytest.raises(TypeError, match="sparse"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(ps))) and len(opt.state) == 0


def test_flatten_view_keeps_the_stack_axis():
    stack = torch.zeros(3, 8, 4, 3, 3)
    assert as_matrices(stack, flatten=True).shape == (3, 8, 36)
    assert as_matrices(stack, flatten=False).shape == (3 * 8 * 4, 3, 3)
    assert lr_scale((8, 4, 3, 3), True, "spectral_norm") == pytest.approx(math.sqrt(8 / 36))
    assert lr_scale((8, 4, 3, 3), False, "spectral_norm") == 1.0
    assert lr_scale((8, 36), True, "rms_norm") == pytest.approx(0.2 * 6)


@pytest.mark.parametrize("shape", [(8, 4, 3, 3), (6, 20), (2, 3, 5, 7, 4)])
@pytest.mark.parametrize("flatten", [True, False])
def test_matrix_count_and_dims_are_those_of_the_view(shape, flatten):
    """matrix_count and matrix_dims (shape only) say what as_matrices makes of one parameter; with heads too."""
    view = as_matrices(torch.zeros(1, *shape), flatten)
    assert matrix_count(shape, flatten) == view.shape[0] and matrix_dims(shape, flatten) == tuple(view.shape[1:])
    if len(shape) == 2:
        heads = as_matrices(torch.zeros(1, *shape), flatten, head_dim=shape[0] // 2)
        assert matrix_count(shape, flatten, 2) == heads.shape[0] and matrix_dims(shape, flatten, 2) == tuple(heads.shape[1:])


@pytest.mark.parametrize("flatten", [True, False])
def test_megabatched_step_equals_separate_steps(flatten):
    torch.set_num_threads(1)
    together = params((8, 4, 3, 3), (8, 4, 3, 3), (8, 4, 3, 3), (6, 20), dtype=torch.float64)
    alone = [[torch.nn.Parameter(p.detach().clone())] for p in together]
    for (q,), p in zip(alone, together):
        q.grad = p.grad.clone()
    Muon(together, flatten=flatten, compute_dtype=torch.float64).step()
    for (q,) in alone:
        Muon([q], flatten=flatten, compute_dtype=torch.float64).step()
    for p, (q,) in zip(together, alone):
        assert torch.equal(p, q)


def test_state_dict_round_trip_continues_identically():
    a = params((8, 4, 3, 3), (6, 20))
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_a = Muon(a, nesterov=True, flatten=True)
    opt_a.step()
    for p, q in zip(a, b):
        q.data.copy_(p.data)
    opt_b = Muon(b, nesterov=True, flatten=True)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as if saved to disk: no aliasing
    g = torch.Generator().manual_seed(7)
    for p, q in zip(a, b):
        p.grad = torch.randn(p.shape, generator=g)
        q.grad = p.grad.clone()
    opt_a.step()
    opt_b.step()
    assert all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_update_keeps_parameter_dtype_and_is_finite(dtype):
    ps = params((8, 4, 3, 3), (24, 6), dtype=dtype)
    Muon(ps, flatten=True).step()
    assert all(p.dtype == dtype and torch.isfinite(p).all() for p in ps)


def test_zero_gradient_gives_a_finite_pure_decay_step():
    p = torch.nn.Parameter(torch.ones(4, 6))
    p.grad = torch.zeros(4, 6)
    Muon([p], weight_decay=0.5, lr=0.1).step()
    assert torch.equal(p.detach(), torch.full((4, 6), 0.95))


def test_adamw_group_matches_torch_adamw():
    a = params((5,), (7, 3))
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt = Muon([{"params": a, "algorithm": "adamw", "lr": 1e-3, "weight_decay": 0.1}])
    ref = torch.optim.AdamW(b, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=g)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)


def test_the_default_compute_dtype_is_bf16_on_cuda_and_fp32_elsewhere():
    """The documented default (a flipped or reordered comparison survived its mutation run: no single-process
    case reached the line, and its 40 tests did not look at the dtype)."""
    from optimizers.algorithms.muon import default_compute_dtype
    assert default_compute_dtype(torch.device("cuda")) == torch.bfloat16
    assert [default_compute_dtype(torch.device(d)) for d in ("cpu", "meta")] == [torch.float32, torch.float32]


@pytest.mark.parametrize("rows, cols, fused, want", [(8, 24, True, torch.float16), (24, 8, True, torch.float16),
                                                      (24, 8, False, None), (8, 8, True, torch.bfloat16)])
def test_a_gram_result_is_applied_in_its_iteration_dtype_only_with_fused(rows, cols, fused, want):
    """direct_dtype for Gram Newton-Schulz in bf16 (iterated in fp16): wide and tall results come in fp16 where the
    kernels apply them, a tall one not at all without them, a square one (the standard iteration) in bf16. The
    shape test `rows != cols` mutated to `rows < cols` sent tall results to the square row; no CPU case takes it."""
    from optimizers.algorithms.muon import direct_dtype
    group = {"orthogonalizer": "gram_newton_schulz", "compute_dtype": torch.bfloat16}
    assert direct_dtype(group, torch.device("cpu"), rows, cols, fused) == want


@pytest.mark.parametrize("name", ["gram_newton_schulz", "polar_express", "newton_schulz", "svd"])
def test_only_gram_newton_schulz_takes_the_momentum_launchs_norms(name):
    """Its normaliser is formed in at least fp32 and divides by given norms; the others form theirs in the compute
    dtype and refuse norms (optimizers/orthogonalize.py). The launch runs on CUDA only, so no CPU case sees it."""
    from optimizers.algorithms.muon import takes_norms
    assert takes_norms({"orthogonalizer": name}) == (name == "gram_newton_schulz")


@pytest.mark.parametrize("steps, ok", [(1, True), (7, True), (None, True), (0, False), (-1, False), (2.0, False),
                                       (True, False)])
def test_ns_steps_is_a_positive_int_or_none(steps, ok):
    """Every positive number of steps is taken, one included (`!= 1` and `<= 1` survived: the cases keep the
    schedule's own count)."""
    p = torch.nn.Parameter(torch.randn(4, 6))
    if ok:
        Muon([p], ns_steps=steps)
    else:
        with pytest.raises(ValueError, match="ns_steps must be a positive integer or None"):
            Muon([p], ns_steps=steps)


def test_num_heads_is_refused_for_a_parameter_of_more_than_two_dims():
    """Heads split a 2-D parameter's rows; a convolution has no head blocks (`p.ndim < 2` let it through)."""
    with pytest.raises(ValueError, match=r"parameter 0 of shape \(8, 4, 3, 3\) does not split into num_heads=2"):
        Muon([torch.nn.Parameter(torch.randn(8, 4, 3, 3))], num_heads=2)


@pytest.mark.parametrize("rows, ok", [(12, True), (24, True), (10, False), (6, False)])
def test_num_heads_splits_a_parameter_whose_rows_it_divides(rows, ok):
    """4 heads take 12 and 24 rows (whose bits overlap 4's: `&` for `%` refused them) and refuse 10 and 6."""
    make = lambda: Muon([torch.nn.Parameter(torch.randn(rows, 8))], num_heads=4)  # noqa: E731
    if ok:
        make()
    else:
        with pytest.raises(ValueError, match=rf"shape \({rows}, 8\) does not split into num_heads=4"):
            make()


@pytest.mark.parametrize("name", ["gram_newton_schulz", "polar_express", "newton_schulz", "svd"])
def test_an_orthogonalizer_named_at_run_time_steps_as_its_literal(name):
    """A name read from a config equals the literal but is another object: `is` for `==` in the options' checks
    refused Gram NS's coefficients or took another path."""
    built = "".join(list(name))
    assert built == name and built is not name
    coefficients = {"ns_coefficients": "polar_express"} if name == "gram_newton_schulz" else {}
    results = []
    for label in (built, name):
        g = torch.Generator().manual_seed(3)
        p = torch.nn.Parameter(torch.randn(12, 20, generator=g, dtype=torch.float64))
        p.grad = torch.randn(12, 20, generator=g, dtype=torch.float64)
        Muon([p], orthogonalizer=label, **coefficients).step()
        results.append(p.detach().clone())
    assert torch.equal(*results)


@pytest.mark.parametrize("option, value, ok, match", [
    ("momentum", -0.5, False, r"momentum=-0\.5 is outside \[0\.0, 1\.0\)"),
    ("momentum", 0.0, True, None),
    ("eps", -1e-8, False, r"eps=-1e-08 is outside \[0\.0, inf\]"),
    ("eps", 0.0, True, None),
    ("gram_restarts", (0, 2), True, None),
    ("gram_restarts", (-1,), False, "gram_restarts must be a tuple of step indices >= 0"),
    ("gram_restarts", (True,), False, "gram_restarts must be a tuple of step indices >= 0"),
    ("num_heads", 1, True, None),
    ("num_heads", True, False, "num_heads must be a positive integer or None"),
    ("num_heads", 0, False, "num_heads must be a positive integer or None"),
    ("ns_coefficients", "newton_schulz", False, r"\(or None: polar_express\)"),
])
def test_each_options_bound_is_where_its_documentation_puts_it(option, value, ok, match):
    """The edges of the options' ranges, each way (their mutants, a bound moved by one or a test of bool dropped,
    survived every case: the cases pass values inside). The coefficients' refusal names the default schedule."""
    p = torch.nn.Parameter(torch.randn(4, 6))
    if ok:
        Muon([p], **{option: value})
    else:
        with pytest.raises(ValueError, match=match):
            Muon([p], **{option: value})


def test_the_stages_declarations_compare_orthogonalizer_names_by_value():
    """direct_dtype, takes_norms and checked read the group's orthogonalizer as a name built at run time (a
    config's string: equal to the literal, another object); `is` for `==` in each survived every case, which
    only pass literals. Also direct_dtype's orientation: square and wide results apply directly without `fused`,
    tall ones only with it (`rows < cols` for `<=` sent square ones through a cast)."""
    from optimizers.algorithms import muon

    def built(name):  # equal to the literal, another object
        return "".join(list(name))

    cpu = torch.device("cpu")
    svd = {"orthogonalizer": built("svd"), "compute_dtype": torch.bfloat16}
    gram = {"orthogonalizer": built("gram_newton_schulz"), "compute_dtype": torch.bfloat16}
    pe = {"orthogonalizer": built("polar_express"), "compute_dtype": torch.bfloat16}
    assert muon.direct_dtype(svd, cpu, 4, 8, True) is None  # svd computes in fp32
    assert muon.direct_dtype(gram, cpu, 4, 8, True) == torch.float16  # the Gram iteration's dtype for bf16
    assert muon.direct_dtype(gram, cpu, 4, 8, False) is None
    assert muon.takes_norms(gram) and not muon.takes_norms(pe)
    assert muon.checked(gram, 4, 8) and not muon.checked(gram, 8, 8) and not muon.checked(pe, 4, 8)
    assert [muon.direct_dtype(pe, cpu, r, c, False) for r, c in ((8, 8), (4, 8), (8, 4))] == [
        torch.bfloat16, torch.bfloat16, None]
