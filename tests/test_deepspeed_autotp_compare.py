"""benchmarks/deepspeed_autotp.py's comparison (the DeepSpeed run itself needs deepspeed and
transformers and minutes; its figures are in docs/performance.md §11): tp=2 shards are put back on
AutoTP's split dim in rank order before they are compared with the tp=1 update."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "deepspeed_autotp.py"


def load_script():
    spec = importlib.util.spec_from_file_location("deepspeed_autotp", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(update_of, module):
    """A tp=1 run and a tp=2 run whose shards hold `update_of(name, whole)` of each whole update."""
    generator = torch.Generator().manual_seed(0)
    before = {name: torch.randn(8, 6, generator=generator) for name in module.PROJECTIONS}
    step = {name: torch.randn(8, 6, generator=generator) for name in module.PROJECTIONS}
    tp1 = [{"before": before, "after": {n: before[n] + step[n] for n in before}}]
    tp2 = [{"before": {}, "after": {}} for _ in range(2)]
    for name, (_, dim) in module.PROJECTIONS.items():
        for rank, (b, u) in enumerate(zip(before[name].chunk(2, dim), update_of(name, step[name]).chunk(2, dim))):
            tp2[rank]["before"][name], tp2[rank]["after"][name] = b, b + u
    return tp1, tp2


def test_identical_updates_compare_as_identical_on_each_split_dim():
    module = load_script()
    rows = module.compare(*runs(lambda name, whole: whole, module))
    for name, row in rows.items():
        assert row["same_start"], name
        assert row["rel_diff"] < 1e-6 and abs(row["cosine"] - 1) < 1e-6, name


def test_a_changed_shard_and_shards_out_of_rank_order_are_seen():
    """Negative controls: one shard scaled; the ranks' shards put back in the wrong order."""
    module = load_script()

    def scaled(name, whole):
        out = whole.clone()
        half = out.chunk(2, module.PROJECTIONS[name][1])[1]
        half.mul_(2.0)
        return out

    rows = module.compare(*runs(scaled, module))
    assert all(row["rel_diff"] > 0.3 for row in rows.values())
    tp1, tp2 = runs(lambda name, whole: whole, module)
    rows = module.compare(tp1, tp2[::-1])
    assert all(not row["same_start"] and row["rel_diff"] > 0.5 for row in rows.values())
