"""benchmarks/step_profile.py off a GPU: each kernel name's kind, the --option parser, and the refusal to run
without CUDA (its profile is of CUDA kernels)."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks"))
import step_profile  # noqa: E402


@pytest.mark.parametrize("name, kind", [
    ("_upper_tiles_persistent", "symmetric kernel"),
    ("_upper_tiles_tma", "symmetric kernel"),
    ("_momentum", "fused elementwise"),
    ("_scaled_cast", "fused elementwise"),
    ("_divide", "fused elementwise"),
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT", "cuBLAS product"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", "cuBLAS product"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps>>", "other"),
    ("Memcpy DtoD (Device -> Device)", "other"),
])
def test_each_kernel_name_has_its_kind(name, kind):
    assert step_profile.kind(name) == kind


@pytest.mark.parametrize("text, parsed", [
    ("cuda_graphs=false", ("cuda_graphs", False)), ("fused=True", ("fused", True)),
    ("fused=none", ("fused", None)), ("ns_steps=4", ("ns_steps", 4)), ("lr=0.02", ("lr", 0.02)),
    ("compute_dtype=bf16", ("compute_dtype", torch.bfloat16)), ("orthogonalizer=svd", ("orthogonalizer", "svd")),
])
def test_options_parse_as_python_values(text, parsed):
    assert step_profile.option(text) == parsed


@pytest.mark.parametrize("text", ["fused", "=true"])
def test_an_option_without_name_or_value_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
        step_profile.option(text)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_cuda_it_refuses_before_building_anything():
    with pytest.raises(SystemExit, match="no CUDA device"):
        step_profile.main(["--set", "gpt2_small", "--scale", "0.01"])
