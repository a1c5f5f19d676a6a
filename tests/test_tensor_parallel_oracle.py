"""FP64 tensor-parallel references: per-shard dependence reproduces the published kernel-level figures,
per-head orthogonalization of whole-head shards is exact, and shards that cut heads are refused."""

import sys
from pathlib import Path

import numpy as np
import pytest

from oracles import Orthogonalizer
from oracles.tensor_parallel import dependence, orth_tp, orth_whole, piece_bounds

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tp_dependence import markdown, table  # noqa: E402  (benchmarks/ is no package)

QUINTIC = Orthogonalizer.named("newton_schulz")


def gaussian(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def test_piece_bounds_follow_torch_chunk():
    assert piece_bounds(5, 2) == [(0, 3), (3, 5)]
    assert piece_bounds(6, 4) == [(0, 2), (2, 4), (4, 6), (6, 6)]


@pytest.mark.parametrize("shape,dim,tp,published", [
    ((256, 256), 0, 2, 0.53),    # per rank, DeepSpeed AutoTP report: 0.527 / 0.523
    ((512, 1024), 0, 2, 0.34),
    ((512, 1024), 0, 4, 0.38),
    ((512, 1024), 1, 2, 0.68),
    ((512, 1024), 1, 4, 0.66),
])
def test_per_shard_dependence_reproduces_the_published_figures(shape, dim, tp, published):
    """Keller Jordan's quintic, 5 steps, one Gaussian gradient: the figures are a property of the
    mathematics, not of any framework (measured here: 0.527/0.521, 0.345, 0.383, 0.682, 0.665)."""
    _, _, per_rank = dependence(gaussian(*shape), QUINTIC, dim, tp)
    assert all(abs(r - published) < 0.02 for r in per_rank), per_rank


@pytest.mark.parametrize("tp", [2, 4])
def test_per_head_on_whole_head_shards_is_exact(tp):
    u = gaussian(64, 48)
    whole = orth_whole(u, QUINTIC, num_heads=8)
    assert np.array_equal(orth_tp(u, QUINTIC, "per_shard", 0, tp, num_heads=8), whole)
    assert not np.allclose(orth_tp(u, QUINTIC, "per_shard", 0, tp), whole, atol=1e-3)


def test_gather_is_layout_invariant_and_shards_that_cut_heads_are_refused():
    u = gaussian(40, 24)
    assert np.array_equal(orth_tp(u, QUINTIC, "gather", 1, 3), orth_whole(u, QUINTIC))
    with pytest.raises(ValueError, match=r"rows \[0, 14\) of a 3-way split cut through heads of 10 rows"):
        orth_tp(u, QUINTIC, "per_shard", 0, 3, num_heads=4)     # 40 rows in pieces of 14: heads of 10
    small = gaussian(8, 6)  # pieces of one head of 2 rows each, past the first at rows 2, 4, 6: none refused
    assert np.array_equal(orth_tp(small, QUINTIC, "per_shard", 0, 4, num_heads=4),
                          orth_whole(small, QUINTIC, num_heads=4))
    with pytest.raises(ValueError, match="40 rows do not split into 3 heads"):
        orth_whole(u, QUINTIC, num_heads=3)
    with pytest.raises(ValueError, match="40 rows do not split into 0 heads"):
        orth_whole(u, QUINTIC, num_heads=0)
    with pytest.raises(ValueError, match="mode"):
        orth_tp(u, QUINTIC, "sharded", 0, 2)


def test_tp_dependence_table_says_which_modes_are_exact():
    rows = table(hidden=32, heads=4, ffn=64)
    assert {(r.matrix, r.mode) for r in rows if r.exact} >= {("q", "per_shard+heads"), ("down", "gather")}
    assert all(not r.exact and 0.1 < r.rel_diff < 1.0 and 0.5 < r.cosine < 1.0
               for r in rows if r.mode == "per_shard")
    assert not any(r.mode == "per_shard+heads" and r.matrix in ("o", "gate", "up", "down") for r in rows)
    text = markdown(rows)
    assert text.count("\n") == len(rows) + 1 and "| q | 32x32 | dim 0 (column-parallel) | 2 | per_shard |" in text


@pytest.mark.parametrize("dim", [0, 1])
def test_dependence_reports_each_nonempty_piece_of_the_split_dim(dim):
    """dependence's per-rank figures: one per rank whose piece is not empty (6 along the split dim over 4 ranks:
    pieces of 2, 2, 2 and none), each that piece's own relative difference, and the whole's the same way."""
    u = gaussian(6, 9) if dim == 0 else gaussian(9, 6)
    rel, cosine, per_rank = dependence(u, QUINTIC, dim, 4)
    whole, shard = orth_whole(u, QUINTIC), orth_tp(u, QUINTIC, "per_shard", dim, 4)
    pieces = [(slice(lo, lo + 2), slice(None)) if dim == 0 else (slice(None), slice(lo, lo + 2)) for lo in (0, 2, 4)]
    want = [np.linalg.norm(shard[i] - whole[i]) / np.linalg.norm(whole[i]) for i in pieces]
    np.testing.assert_allclose(per_rank, want, rtol=1e-12)
    assert rel == pytest.approx(np.linalg.norm(shard - whole) / np.linalg.norm(whole), rel=1e-12, abs=0) and 0 < cosine < 1


def test_heads_of_a_row_parallel_split_are_refused():
    with pytest.raises(ValueError, match="row-parallel"):
        orth_tp(gaussian(8, 6), QUINTIC, "per_shard", 1, 2, num_heads=2)


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_a_gathered_tp_step_is_the_plain_muon_step_under_either_rounding(rounding):
    """reference_tp_muon_step under "gather" rounds U to bf16 exactly where reference_muon_step does (nearest:
    rounded; stochastic: its expectation, U itself), its rounding name read by value (built at run time)."""
    from oracles import Conventions, MuonHyper, reference_muon_step
    from oracles.tensor_parallel import reference_tp_muon_step
    conv = Conventions(QUINTIC, compute_dtype="bf16", rounding="".join(list(rounding)))
    hyper = MuonHyper(lr=0.02, momentum=0.9, nesterov=False, weight_decay=0.1, flatten=False)
    x, g = gaussian(8, 6), gaussian(8, 6, seed=1)
    got, _ = reference_tp_muon_step(x, np.zeros((8, 6)), g, hyper, conv, "gather", 0, 2)
    want, _ = reference_muon_step(x, np.zeros((8, 6)), g, hyper, conv)
    assert np.array_equal(got, want)
