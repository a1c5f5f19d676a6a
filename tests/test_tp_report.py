"""The TP-dependence table: its stored figures are what benchmarks/tp_dependence.py computes, they
reproduce the published per-shard figures, and the reports show them exactly for runs with TP cases."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from oracles import Orthogonalizer
from oracles.tensor_parallel import dependence
from reports import tp_table
from reports.html import render_html
from reports.markdown import render_markdown
from reports.records import Record, RunInfo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from tp_dependence import SEED_FIGURES, block  # noqa: E402  (benchmarks/ is no package)

INFO = RunInfo(target="ours", tier="ci", backends="gloo", command="python -m harness run", started="2026-01-01T00:00:00Z",
               seconds=1.0, torch_version="2.13.0+cpu", commit="abc1234")


def rec(layout: str) -> Record:
    return Record(case_id=f"muon/linear-12x20/x/{layout}/ws4", check="reference", status="pass", ratio=0.5,
                  target="ours", backend="gloo", world_size=4, layout=layout, optimizer="muon", layer="linear",
                  shape="12x20", megabatch=1, flatten=False, param_dtype="fp64", compute_dtype="fp64",
                  orthogonalizer="polar_express")


@pytest.fixture(scope="module")
def stored():
    data = tp_table.load()
    assert data is not None, "reports/tp_dependence.json is missing: python benchmarks/tp_dependence.py --out it"
    return data


def test_stored_rows_cover_every_matrix_mode_and_degree(stored):
    got = {(r["matrix"], r["tp"], r["mode"]) for r in stored["rows"]}
    for m in block(256, 8, 512):
        for tp in (2, 4):
            assert {(m.name, tp, "gather"), (m.name, tp, "per_shard")} <= got
            if m.num_heads:
                assert (m.name, tp, "per_shard+heads") in got
    for r in stored["rows"]:
        exact = r["mode"] in ("gather", "per_shard+heads")
        assert (r["rel_diff"] == 0.0) == exact and (r["cosine"] > 0.9999999) == exact, r


def test_stored_row_is_what_the_oracle_computes(stored):
    """Recompute one per-shard row (q at tp 2) from its seed: the stored numbers are these."""
    s = stored["settings"]
    u = np.random.default_rng([s["seed"], 0]).standard_normal((s["hidden"], s["hidden"]))
    rel, cos, _ = dependence(u, Orthogonalizer.named("newton_schulz", steps=5), 0, 2)
    (row,) = [r for r in stored["rows"] if (r["matrix"], r["tp"], r["mode"]) == ("q", 2, "per_shard")]
    assert row["rel_diff"] == pytest.approx(rel, rel=1e-12, abs=0) and row["cosine"] == pytest.approx(cos, rel=1e-12, abs=0)


def test_seed_figures_reproduce_the_published_ones(stored):
    """Within 0.05 of each published relative difference (per rank for the square matrix)."""
    assert [(tuple(f["shape"]), f["dim"], f["tp"]) for f in stored["seed_figures"]] == \
        [(shape, dim, tp) for shape, dim, tp, _ in SEED_FIGURES]
    for f in stored["seed_figures"]:
        ours = f["per_rank"] if f["shape"] == [256, 256] else [f["rel_diff"]]
        assert all(abs(x - f["published"]) < 0.05 for x in ours), f


def test_reports_show_the_table_only_for_runs_with_tp_cases(stored):
    tp, plain = [rec("dp2tp0-per_shard-h4-even")], [rec("shard0-even")]
    assert "TP dependence of the update" in render_markdown(tp, INFO)
    assert "| q | 256x256 | dim 0 (column-parallel) | 2 | per_shard+heads |" in render_markdown(tp, INFO)
    assert 'id="tp-table"' in render_html(tp, INFO) and 'id="tp-seed"' in render_html(tp, INFO)
    assert "TP dependence" not in render_markdown(plain, INFO) and "tp-table" not in render_html(plain, INFO)
