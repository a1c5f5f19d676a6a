"""benchmarks/gram_ns_accuracy.py: a tiny run prints its table, and bad options are refused before any work."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gram_ns_accuracy  # noqa: E402


@pytest.fixture(autouse=True)
def _threads():
    """The script pins torch to one thread (as it measured); the rest of this worker's tests keep theirs."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_tiny_run_prints_every_spectrum_and_fp64_agrees_near_1e_12(capsys):
    gram_ns_accuracy.main(["--sizes", "6x8,5x5", "--dtypes", "fp64,fp16", "--schedules", "polar_express"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| polar_express")]
    assert len(rows) == 2 * len(gram_ns_accuracy.SPECTRA)
    for row in rows[:len(gram_ns_accuracy.SPECTRA)]:  # fp64: standard and every restart schedule
        errors = [float(v) for v in re.findall(r"\d\.\de[-+]\d\d", row)]
        assert len(errors) == 1 + len(gram_ns_accuracy.RESTART_SCHEDULES) and max(errors) < 1e-9, row
    fp16 = [float(v) for row in rows[len(gram_ns_accuracy.SPECTRA):] for v in re.findall(r"\d\.\de[-+]\d\d", row)]
    assert max(fp16) > 1e-4  # negative control: half precision is visibly off the map


@pytest.mark.parametrize("argv, message", [(["--triton"], "needs --device cuda"),
                                           (["--dtypes", "fp8"], "unknown --dtypes")])
def test_bad_options_are_refused_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit):
        gram_ns_accuracy.main(argv)
    out = capsys.readouterr()
    assert message in out.err and "| schedule" not in out.out
