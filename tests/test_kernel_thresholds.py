"""benchmarks/kernel_thresholds.py, which prints the figures that decide the default's kernel thresholds
(symmetric.TRITON_ROWS, elementwise.MIN_NUMEL): its crossover rule, its refusal without a GPU, and a --quick run
under Triton's interpreter (skipped without triton)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before triton's import, which reads it (this process has no GPU to leak to)
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kernel_thresholds  # noqa: E402


def test_the_crossover_is_the_smallest_size_from_which_every_larger_size_wins():
    assert kernel_thresholds.crossover({256: [0.5, 1.2], 512: [1.0, 1.1], 1024: [1.3, 2.0]}) == 512
    assert kernel_thresholds.crossover({256: [1.5], 512: [0.9], 1024: [1.3]}) == 1024  # a loss in between
    assert kernel_thresholds.crossover({256: [1.5], 512: [1.2], 1024: [0.99]}) is None  # the largest loses


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU runs it")
def test_without_a_gpu_it_says_so(capsys):
    assert kernel_thresholds.main(["--products"]) == 2
    assert "needs CUDA and triton" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the --quick smoke run is the interpreter's")
def test_a_quick_run_prints_every_row_and_both_crossovers(capsys):
    pytest.importorskip("triton")
    assert kernel_thresholds.main(["--quick"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 3 * len(kernel_thresholds.QUICK_ROWS) + 3 * len(kernel_thresholds.QUICK_NUMELS), out
    assert "products crossover:" in out and "elementwise crossover:" in out
    assert "graphed crossover:" not in out  # whole steps with graphs: CUDA only
    assert kernel_thresholds.main(["--quick", "--graphed"]) == 2
    assert "need CUDA" in capsys.readouterr().out
