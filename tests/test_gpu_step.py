"""benchmarks/gpu_step.py on CPU: the --quick smoke run, a peer row in a process of its own (and a
failing one reported in its cell), the peers' set-up (recompile limit, gram-newton-schulz without quack)."""

from __future__ import annotations

import contextlib
import io
import re
import sys
import types

import pytest
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_step  # noqa: E402


def test_the_quick_run_measures_each_row_and_closes_with_the_summary():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        gpu_step.main(["--quick", "--sets", "gpt2_small", "--only", r"^ours \(polar_express"])
    text = out.getvalue()
    for label in ("ours (polar_express)", "ours (polar_express, cuda graphs)", "ours (polar_express), lever 2 off"):
        row = re.search(rf"^\| gpt2_small \| 48 \| \S+ \| {re.escape(label)} \| ([0-9.]+) \| 3 \| ([0-9.]+) \|", text, re.M)
        assert row and float(row.group(1)) > 0, (label, text)
    assert re.search(r"^\| gpt2_small \| ours \(polar_express.*\| none measured \|.*\(scaled set\) \| (yes|no)", text, re.M), text


def test_drop_leaves_out_a_row_on_the_sets_it_names_only():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        gpu_step.main(["--quick", "--sets", "gpt2_small,convnext_t", "--only", r"^ours \(polar_express\)$",
                       "--drop", r"^convnext_t/ours \(polar_express\)$"])
    text = out.getvalue()
    assert re.search(r"^\| gpt2_small \|.*\| ours \(polar_express\) \| [0-9.]+ \|", text, re.M), text
    assert not re.search(r"^\| convnext_t \|.*\| ours \(polar_express\) \|", text, re.M), text


@pytest.mark.slow
def test_a_peer_row_runs_in_a_process_of_its_own_and_a_failing_one_says_why():
    args = gpu_step.parse(["--quick"])
    result = gpu_step.run_isolated("gpt2_small", "ours (polar_express)", args, 30.0)
    assert isinstance(result, gpu_step.Result) and result.ms > 0 and result.steps == 3, result
    failed = gpu_step.run_isolated("gpt2_small", "no such row", args, 30.0)
    assert isinstance(failed, str) and failed.startswith("failed: its process exited 1: ValueError"), failed


def test_a_peer_process_raises_the_recompile_limit():
    import torch._dynamo.config as dynamo
    saved = dynamo.recompile_limit
    try:
        gpu_step.raise_recompile_limit()
        assert dynamo.recompile_limit == gpu_step.RECOMPILE_LIMIT == 100
    finally:
        dynamo.recompile_limit = saved


def test_gram_newton_schulz_without_quack_runs_its_torch_path(monkeypatch):
    made = []

    class FakeGramMuon:
        def __init__(self, params, ns_use_kernels=True):
            made.append(ns_use_kernels)

    monkeypatch.setitem(sys.modules, "gram_newton_schulz", types.SimpleNamespace(Muon=FakeGramMuon))
    real_find_spec = gpu_step.importlib.util.find_spec
    monkeypatch.setattr(gpu_step.importlib.util, "find_spec",
                        lambda name, *a: None if name == "quack" else real_find_spec(name, *a))
    rows = {c.label: c for c in gpu_step.contenders(False, False)}
    assert "gram-newton-schulz (kernels)" not in rows
    rows["gram-newton-schulz (torch, no quack)"].make([torch.nn.Parameter(torch.zeros(2, 2))])
    assert made == [False]


def test_dion_is_handed_convolutions_as_matrices_and_never_its_own_flatten(monkeypatch):
    made = []

    class FakeDionMuon:
        def __init__(self, params, **options):
            made.append(([tuple(p.shape) for p in params], [tuple(p.grad.shape) for p in params], options))

    dion = types.ModuleType("dion")
    dion.Muon = FakeDionMuon
    monkeypatch.setitem(sys.modules, "dion", dion)
    monkeypatch.setitem(sys.modules, "dion.cuda_graph", None)  # an older dion: no CUDA-graph wrapper
    rows = {c.label: c for c in gpu_step.contenders(True, True)}
    conv, linear = torch.nn.Parameter(torch.randn(8, 4, 3, 3)), torch.nn.Parameter(torch.randn(5, 7))
    conv.grad, linear.grad = torch.randn(8, 4, 3, 3), torch.randn(5, 7)
    for label in ("dion", "dion + triton"):
        rows[label].make([conv, linear])
    assert made == [([(8, 36), (5, 7)], [(8, 36), (5, 7)], {}),
                    ([(8, 36), (5, 7)], [(8, 36), (5, 7)], {"use_triton": True})], made
    assert rows["dion + cuda graphs"].make is None and "not in this dion" in rows["dion + cuda graphs"].reason
