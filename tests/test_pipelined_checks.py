"""optimizers/plan.py `execute`: an eager megabatch whose Gram divergence flags are read on the host is
applied only after the next megabatch's kernels are queued, and such megabatches run first (`run_order`),
with the results and counts of checking each one at once."""

import contextlib

import pytest
import torch

from optimizers import Muon, plan
from optimizers import gram_newton_schulz as gram
from optimizers.counters import Stats, counting
from optimizers.algorithms.muon import matrix_lr_scale
from optimizers.matrix_view import as_matrices
from optimizers.orthogonalize import orthogonalize

SHAPES = [(8, 8), (12, 6), (6, 12), (8, 8), (5, 5)]
"""Square, tall, wide, square again (megabatched with the first), and another square: four megabatches."""


def make(seed=0, **options):
    """Muon on SHAPES, eager (cuda_graphs=False: a plan's graph reads every flag at once after its replay)."""
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    return Muon(ps, lr=0.1, **{"cuda_graphs": False, **options}), ps


@pytest.mark.parametrize("orthogonalizer, order", [
    ("gram_newton_schulz", [1, 2, 0, 3]), ("polar_express", [0, 1, 2, 3])])
def test_megabatches_checked_on_the_host_run_first(orthogonalizer, order):
    opt, _ = make(orthogonalizer=orthogonalizer)
    (group_plan,) = opt._plan()
    assert [b.shape for b in group_plan.megabatches] == [(8, 8), (12, 6), (6, 12), (5, 5)]
    assert plan.run_order(group_plan) == order


def test_flags_are_read_after_the_next_megabatch_is_queued(monkeypatch):
    """The order of a step's work: each checked megabatch's flag starts its copy to the host right after
    the megabatch; the tall one's is read after the wide one ran, the wide one's after the first square
    one ran; each is applied right after its read; unchecked ones at once."""
    events = []
    copy, diverged, apply = gram.FlagCopy.__init__, gram.FlagCopy.diverged, plan._apply

    def noted_orthogonalize(mats, *args):
        events.append(("run", tuple(mats.shape[1:])))
        return orthogonalize(mats, *args)

    def noted_copy(self, checks):
        events.append(("copy",))
        copy(self, checks)

    def noted_read(self):
        events.append(("read",))
        return diverged(self)

    def noted_apply(algorithm, group, route, batch, state, updates):
        events.append(("apply", batch.shape))
        apply(algorithm, group, route, batch, state, updates)

    monkeypatch.setattr(gram.FlagCopy, "__init__", noted_copy)
    monkeypatch.setattr(gram.FlagCopy, "diverged", noted_read)
    monkeypatch.setattr("optimizers.algorithms.muon.orthogonalize", noted_orthogonalize)
    monkeypatch.setattr(plan, "_apply", noted_apply)
    opt, _ = make(orthogonalizer="gram_newton_schulz")
    opt.step()
    assert events == [("run", (12, 6)), ("copy",), ("run", (6, 12)), ("copy",), ("read",), ("apply", (12, 6)),
                      ("run", (8, 8)), ("read",), ("apply", (6, 12)), ("apply", (8, 8)),
                      ("run", (5, 5)), ("apply", (5, 5))], events


@pytest.mark.parametrize("diverged", [gram.DIVERGED, 0.0])
def test_each_parameter_steps_as_if_checked_at_once(diverged, monkeypatch):
    """Muon's step against each parameter's update computed on its own by `orthogonalize` (its divergence
    read at once): the same bits and the same Gram counts, when nothing diverges and when everything does
    (DIVERGED at 0: every Gram result is recomputed by the standard iteration)."""
    monkeypatch.setattr(gram, "DIVERGED", diverged)
    opt, ps = make(orthogonalizer="gram_newton_schulz", compute_dtype=torch.bfloat16)
    group = opt.param_groups[0]
    expected = []
    warned = pytest.warns(RuntimeWarning, match="diverged") if diverged == 0.0 else contextlib.nullcontext()
    with counting(Stats()) as stats, warned:
        for p in ps:
            mats = as_matrices(p.grad.unsqueeze(0), group["flatten"])
            o = orthogonalize(mats, "gram_newton_schulz", 5, group["eps"], torch.bfloat16)
            expected.append(p.detach().clone().add_(o.reshape(p.shape), alpha=-0.1 * matrix_lr_scale(p.shape, group)))
    direct = (stats.gram, stats.fallbacks)
    warned = pytest.warns(RuntimeWarning, match="diverged") if diverged == 0.0 else contextlib.nullcontext()
    with warned:
        opt.step()
    assert (opt.stats.gram, opt.stats.fallbacks) == direct
    assert direct[0] == 2 and direct[1] == (2 if diverged == 0.0 else 0)
    for p, q in zip(ps, expected):
        assert torch.equal(p.detach(), q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA stream")
def test_a_flag_copy_waits_only_for_the_work_before_it():
    """gram.FlagCopy, made after a megabatch's kernels: `diverged()` returns while work queued after it
    (a long sleep kernel) still runs, with the flag's value."""
    flags = gram.DeferredChecks(flags=[torch.tensor(False, device="cuda"), torch.tensor(True, device="cuda")])
    copy = gram.FlagCopy(flags)
    torch.cuda._sleep(2_000_000_000)  # about a second at an H200's clocks
    later = torch.cuda.Event()
    later.record()
    assert copy.diverged() is True
    assert not later.query(), "the flag was read only after the later work finished"
    torch.cuda.synchronize()
