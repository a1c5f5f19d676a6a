"""step() is all or nothing: every failure kind raises before the first write, leaving every parameter,
gradient, state entry and param group as it was; 0-size parameters are no-ops."""

from __future__ import annotations

import math
from typing import Any, Callable

import pytest
import torch
from snapshots import differences, snapshot

from optimizers import Muon, NorMuon


def failure_changes(opt: torch.optim.Optimizer, call: Callable[[], Any], error: type[Exception],
                    match: str) -> list[str]:
    """Run `call`, which must raise `error` matching `match`; return what it changed."""
    before = snapshot(opt)
    with pytest.raises(error, match=match):
        call()
    return differences(before, snapshot(opt))


def make(*shapes: tuple[int, ...], algorithm: str = "muon", seed: int = 0, **options: Any) -> tuple[Muon, list]:
    """A two-group optimizer stepped once: group 0 (`algorithm`) over `shapes`, group 1 AdamW over a
    vector and a matrix. Every parameter has a gradient."""
    g = torch.Generator().manual_seed(seed)
    def param(shape):
        p = torch.nn.Parameter(torch.randn(*shape, generator=g))
        p.grad = torch.randn(*shape, generator=g)
        return p
    matrices, others = [param(s) for s in shapes], [param((5,)), param((3, 4))]
    opt = Muon([{"params": matrices, "algorithm": algorithm}, {"params": others, "algorithm": "adamw"}], **options)
    opt.step()
    for p in matrices + others:
        p.grad = torch.randn(p.shape, generator=g)
    return opt, matrices + others


SHAPES = ((4, 6), (4, 6), (8, 3, 2, 2), (6, 5))


def _set(target: Callable[[Muon, list], dict], key: str, value: Callable[[Muon, list], Any]):
    def breaks(opt, ps):
        target(opt, ps)[key] = value(opt, ps)
    return breaks


def _grad(value: Callable[[torch.Tensor], torch.Tensor]):
    def breaks(opt, ps):
        ps[3].grad_dtype = None  # torch refuses a gradient of another dtype unless told to allow it
        ps[3].grad = value(ps[3])
    return breaks


def _reshape_last_matrix(opt, ps):
    """The parameter's shape changed between steps (its momentum still has the old shape)."""
    ps[3].data = torch.randn(7, 5)
    ps[3].grad = torch.randn(7, 5)


def _reshape_last_matrix_only(opt, ps):
    """The parameter's shape changed, its gradient still has the old one (torch refuses to assign a
    gradient of another shape, but keeps one across a change of `.data`)."""
    ps[3].data = torch.randn(7, 5)


def _no_group_state(opt, ps):
    return opt.param_groups[1]


def _last_muon_state(opt, ps):
    return opt.state[ps[3]]


def _adamw_state(opt, ps):
    return opt.state[ps[-1]]


FAILURES = [
    # (name, break it, error, match)
    ("nan-lr", _set(_no_group_state, "lr", lambda o, p: math.nan), ValueError, "param group 1: lr must be finite"),
    ("unknown-orthogonalizer", _set(lambda o, p: o.param_groups[0], "orthogonalizer", lambda o, p: "qr"),
     ValueError, "orthogonalizer"),
    ("unknown-algorithm", _set(_no_group_state, "algorithm", lambda o, p: "lion"), ValueError, "algorithm"),
    ("sparse-grad", _grad(lambda p: torch.zeros(p.shape).to_sparse()), TypeError, "parameter 3: sparse"),
    ("grad-dtype", _grad(lambda p: torch.zeros(p.shape, dtype=torch.float64)), TypeError, "gradient dtype"),
    ("grad-shape", _reshape_last_matrix_only, ValueError, "gradient shape"),
    ("shape-changed", _reshape_last_matrix, ValueError, "parameter 3: momentum_buffer has shape"),
    ("state-shape", _set(_last_muon_state, "momentum_buffer", lambda o, p: torch.zeros(6, 6)), ValueError,
     "momentum_buffer has shape"),
    ("state-dtype", _set(_last_muon_state, "momentum_buffer", lambda o, p: torch.zeros(6, 5, dtype=torch.float64)),
     ValueError, "float64"),
    ("state-type-list", _set(_last_muon_state, "momentum_buffer", lambda o, p: [[0.0] * 5] * 6), ValueError,
     "is a list, not a tensor"),
    ("state-extra-key", _set(_last_muon_state, "variance", lambda o, p: torch.zeros(6, 1)), ValueError,
     "algorithm 'muon' keeps"),
    ("adamw-step-string", _set(_adamw_state, "step", lambda o, p: "3"), ValueError, "step count"),
    ("adamw-step-negative", _set(_adamw_state, "step", lambda o, p: -1), ValueError, "step count"),
    ("adamw-moment-list", _set(_adamw_state, "exp_avg", lambda o, p: [0.0] * 12), ValueError, "not a tensor"),
    ("algorithm-switched", _set(lambda o, p: o.param_groups[0], "algorithm", lambda o, p: "normuon"), ValueError,
     "algorithm 'normuon' keeps"),
]


@pytest.mark.parametrize("name, breaks, error, match", FAILURES, ids=[f[0] for f in FAILURES])
def test_a_failing_step_changes_nothing(name, breaks, error, match):
    opt, ps = make(*SHAPES)
    breaks(opt, ps)
    assert failure_changes(opt, opt.step, error, match) == []


def _append_vector_to_muon_group(opt, ps):
    """A new parameter joins a cached group's list (not through add_param_group): a 1-D one, which
    a Muon group rejects."""
    v = torch.nn.Parameter(torch.ones(5))
    v.grad = torch.ones(5)
    opt.param_groups[0]["params"].append(v)


def _append_param_with_bad_grad(opt, ps):
    """A new matrix joins a cached group with a gradient of another shape."""
    q = torch.nn.Parameter(torch.ones(4, 6))
    q.grad = torch.ones(4, 6)
    q.data = torch.ones(6, 4)
    opt.param_groups[0]["params"].append(q)


CACHE_CHANGES = FAILURES + [
    ("new-1d-param", _append_vector_to_muon_group, ValueError, "param group 0: parameter 4 has shape"),
    ("new-param-bad-grad", _append_param_with_bad_grad, ValueError, "parameter 4: gradient shape"),
]


@pytest.mark.parametrize("name, breaks, error, match", CACHE_CHANGES, ids=[f[0] for f in CACHE_CHANGES])
def test_a_change_after_cached_steps_is_validated_before_any_write(name, breaks, error, match):
    """The plan cache must not hide a change made after several good steps: a changed option, shape,
    gradient, state entry or a new parameter is checked again, and the step changes nothing."""
    opt, ps = make(*SHAPES)
    opt.step()
    opt.step()
    cached = opt._cached
    opt.step()
    assert opt._cached is cached  # the steps above reused one plan: the change below must rebuild it
    breaks(opt, ps)
    assert failure_changes(opt, opt.step, error, match) == []


def test_a_fixed_problem_steps_again():
    opt, ps = make(*SHAPES)
    opt.param_groups[1]["lr"] = math.nan
    with pytest.raises(ValueError):
        opt.step()
    opt.param_groups[1]["lr"] = 0.02
    opt.step()


def test_the_snapshot_check_flags_a_call_that_writes_before_failing():
    """Negative control: a step that moves one parameter and then raises must be reported."""
    opt, ps = make(*SHAPES)

    def half_step():
        ps[0].data.add_(1.0)
        opt.state[ps[1]]["momentum_buffer"].mul_(0.5)
        opt.param_groups[1]["lr"] = 0.5
        raise ValueError("late check")
    changes = failure_changes(opt, half_step, ValueError, "late check")
    assert changes == ["param 0 changed", "state 'momentum_buffer' of parameter 1 changed",
                       "param group 1 option 'lr' changed"]


@pytest.mark.parametrize("empty, flatten", [((0, 4), False), ((2, 0, 3, 3), True), ((4, 0), True)])
@pytest.mark.parametrize("algorithm", ["muon", "normuon"])
def test_zero_size_parameters_are_no_ops_and_the_others_step_as_without_them(empty, flatten, algorithm):
    shapes = ((4, 6), (2, 3, 3, 3) if len(empty) == 4 else (6, 5))
    with_empty, ps = make(*shapes, empty, algorithm=algorithm, flatten=flatten, seed=3)
    alone, qs = make(*shapes, algorithm=algorithm, flatten=flatten, seed=3)
    zero = ps[len(shapes)]
    zero.grad = torch.zeros(zero.shape)
    for _ in range(2):
        with_empty.step()
        alone.step()
    ps_without = ps[:len(shapes)] + ps[len(shapes) + 1:]
    assert all(torch.equal(p, q) for p, q in zip(ps_without, qs))
    assert zero.shape == empty and zero not in with_empty.state


def test_zero_size_parameters_in_an_adamw_group_are_no_ops():
    p, q = torch.nn.Parameter(torch.zeros(0)), torch.nn.Parameter(torch.ones(3))
    p.grad, q.grad = torch.zeros(0), torch.ones(3)
    opt = Muon([{"params": [p, q], "algorithm": "adamw"}])
    opt.step()
    assert p not in opt.state and opt.state[q]["step"] == 1


def test_normuon_variance_of_the_wrong_shape_changes_nothing():
    opt, ps = make(*SHAPES, algorithm="normuon", flatten=True)
    opt.state[ps[2]]["variance"] = torch.zeros(8, 3, 2, 1)
    assert failure_changes(opt, opt.step, ValueError, "parameter 2: variance has shape") == []


def test_a_normuon_optimizer_rejects_a_bad_group_change_before_writing():
    g = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(4, 6, generator=g)) for _ in range(3)]
    for p in ps:
        p.grad = torch.randn(4, 6, generator=g)
    opt = NorMuon([{"params": ps[:2]}, {"params": ps[2:]}])
    opt.step()
    opt.param_groups[1]["beta2"] = 1.5
    assert failure_changes(opt, opt.step, ValueError, "param group 1: beta2") == []


def test_the_plan_is_rebuilt_exactly_when_what_it_checked_changes(monkeypatch):
    """lr and weight_decay (schedulers) reuse the plan; an option, a gradient's presence or a replaced
    state buffer rebuild it."""
    from optimizers import plan
    built = []
    make_plan = plan.make_plan
    monkeypatch.setattr(plan, "make_plan", lambda *args: built.append(1) or make_plan(*args))
    opt, ps = make(*SHAPES)
    opt.step()  # the first step created the state, so this one planned again
    start = len(built)
    counts = []
    for change in (lambda: None, lambda: opt.param_groups[0].update(lr=0.01, weight_decay=0.1),
                   lambda: opt.param_groups[0].update(momentum=0.9), lambda: setattr(ps[1], "grad", None),
                   lambda: opt.state[ps[0]].update(momentum_buffer=torch.zeros(4, 6))):
        change()
        opt.step()
        counts.append(len(built) - start)
    assert counts == [0, 0, 1, 2, 3]
