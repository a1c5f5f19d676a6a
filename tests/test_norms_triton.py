"""The normaliser's overflow-safe cast by Triton (optimizers/elementwise_triton.py `scaled_and_cast`, taken by
optimizers/norms.py `scaled_and_cast` where `kernels` allow): the cast, its norm and the scales are the torch
form's (`downscale`, then `torch.mul(x, scale, out=<dtype>)`, then `frobenius`), bit for bit, for stacks that
need no scale, stacks mixing scaled and unscaled matrices (products falling into the subnormal range too), NaN,
+-inf and empty matrices, row-major stacks and the transposed views of tall ones, in every stack and cast dtype
the orthogonalizers pass; Polar Express and Gram Newton-Schulz with the kernel give the torch passes' bits.
Skipped without triton; on CPU under Triton's interpreter, on CUDA at a real layer's size too."""

from __future__ import annotations

import math
import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton's import, which reads it (this process has no GPU to leak to)
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from optimizers import elementwise, norms, symmetric  # noqa: E402
from optimizers import elementwise_triton as triton_kernels  # noqa: E402
from optimizers.kernels import TORCH, Kernels  # noqa: E402
from optimizers.orthogonalize import orthogonalize  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ANY_SIZE = Kernels(on=True, sized=False)
"""What fused=True takes on this device: the kernels at every size."""

INPUTS = [torch.float32, torch.bfloat16]
"""(An fp64 stack keeps the torch form: elementwise.CAST_INPUTS.)"""
OUTPUTS = [torch.bfloat16, torch.float16, torch.float32]
SHAPE = (4, 50, 96)
"""Four matrices of 4800 entries: two programs each (elementwise_triton.BLOCK), the second's share masked."""


@pytest.fixture
def launched(monkeypatch):
    """Counts the kernel's runs (a decline runs none)."""
    calls = []
    original = triton_kernels.scaled_and_cast

    def counted(*args):
        calls.append(1)
        return original(*args)
    monkeypatch.setattr(triton_kernels, "scaled_and_cast", counted)
    return calls


def torch_form(x: torch.Tensor, limit: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The cast, its norm and the scales as torch computes them (norms.scaled_and_cast's torch form)."""
    scale = norms.downscale(x, (-2, -1), limit)
    cast = torch.mul(x, scale, out=torch.empty_like(x, dtype=dtype))
    return cast, norms.frobenius(cast, (-2, -1), keepdim=True), scale.to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and strides, and the same bits where a value is not NaN, NaN in the same places (a NaN's
    payload is the hardware's)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride():
        return False
    nan = a.isnan()
    integer = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(nan, b.isnan()) and torch.equal(a.view(integer)[~nan], b.view(integer)[~nan])


def stack(case: str, source: torch.dtype, dtype: torch.dtype, layout: str, shape=SHAPE) -> torch.Tensor:
    """Seeded Gaussian matrices [B, m, n] in `source` (B >= 4), row-major or the transposed view of a tall stack;
    case "mixed": matrix 1 beyond the limit (2^100; 2^20, beyond fp16's range, for an fp16 cast) with a row
    whose scaled products fall into `dtype`'s subnormal range, matrix 3 at exactly the limit (not scaled);
    "nan": a NaN (and in matrix 3 a NaN beside an inf, whose largest entry is NaN: not scaled); "inf": a -inf
    (scale NaN), each in the last program's share."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    limit = norms.entry_limit(shape[1] * shape[2], dtype, 1.0)
    if case == "mixed":
        big = 2.0 ** (20 if dtype == torch.float16 else 100)
        x[1] *= big
        x[1, 0] *= 2.0 ** (-18 if dtype == torch.float16 else -128)
        x[3] /= x[3].abs().max()
        x[3] *= limit  # the largest |entry| exactly the limit (1 times a power of two)
    elif case == "nan":
        x[2, -1, -1] = math.nan
        x[3, -1, -2:] = torch.tensor([math.nan, math.inf])
    elif case == "inf":
        x[0, -1, -1] = -math.inf
    x = x.to(source).to(DEVICE)
    return x.transpose(-2, -1).contiguous().mT if layout == "columns" else x


@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("case", ["plain", "mixed", "nan", "inf"])
@pytest.mark.parametrize("dtype", OUTPUTS, ids=str)
@pytest.mark.parametrize("source", INPUTS, ids=str)
def test_the_kernel_gives_the_torch_forms_bits(source, dtype, case, layout, launched):
    x = stack(case, source, dtype, layout)
    limit = norms.entry_limit(x.size(-2) * x.size(-1), dtype, 1.0)
    got = norms.scaled_and_cast(x, (-2, -1), limit, dtype, ANY_SIZE)
    want = torch_form(x, limit, dtype)
    assert launched == [1]
    assert all(same_bits(a, b) for a, b in zip(got, want)), [same_bits(a, b) for a, b in zip(got, want)]
    scaled = want[2].flatten() != 1
    assert scaled.tolist() == [case == "inf", case == "mixed", False, False]
    if launched:  # each matrix's last program left its count 0
        assert not triton_kernels._ARRIVALS[str(x.device)].counts.any()
    if case == "mixed":  # the subnormal products are there to compare
        tiny = want[0][1].abs()
        assert bool(((tiny > 0) & (tiny < torch.finfo(dtype).tiny)).any())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_the_comparison_catches_a_wrong_rounding_or_scale(dtype):
    """Negative controls on the mixed stack: the cast truncated instead of rounded to nearest even, or the scale
    of the scaled matrix doubled, does not pass `same_bits`."""
    x = stack("mixed", torch.float32, dtype, "rows")
    cast, _, scale = torch_form(x, norms.entry_limit(x.size(-2) * x.size(-1), dtype, 1.0), dtype)
    ulp = 2 ** (23 - {torch.bfloat16: 7, torch.float16: 10}[dtype])  # fp32's bits below dtype's last
    scaled = x * scale
    truncated = (scaled.view(torch.int32) & -ulp).view(torch.float32)  # towards zero: the low bits cleared
    assert not same_bits(truncated.to(dtype), cast)
    doubled = torch.mul(x, scale * torch.tensor([1, 2, 1, 1], device=x.device).view(-1, 1, 1),
                        out=torch.empty_like(x, dtype=dtype))
    assert not same_bits(doubled, cast)


@pytest.mark.parametrize("shape", [(3, 0, 5), (3, 4, 0), (0, 4, 5)])
def test_empty_matrices_keep_the_torch_form(shape, launched):
    """An empty stack or empty matrices: declined (no entry to take), the results without kernels (norm 0, scale
    1), bit for bit."""
    x = torch.randn(shape, device=DEVICE)
    limit = norms.entry_limit(shape[1] * shape[2], torch.bfloat16, 1.0)
    got = norms.scaled_and_cast(x, (-2, -1), limit, torch.bfloat16, ANY_SIZE)
    want = norms.scaled_and_cast(x, (-2, -1), limit, torch.bfloat16, TORCH)
    assert launched == [] and all(same_bits(a, b) for a, b in zip(got, want))


def test_the_kernel_declines_what_it_cannot_run(launched):
    """Kernels off, an fp64 stack, a sliced (not dense) stack, a limit fp32 cannot hold: nothing run (None)."""
    x = stack("plain", torch.float32, torch.float32, "rows")
    assert elementwise.scaled_and_cast(x, 2.0 ** 40, torch.bfloat16, TORCH) is None
    assert elementwise.scaled_and_cast(x.double(), 2.0 ** 40, torch.float64, ANY_SIZE) is None
    assert elementwise.scaled_and_cast(x[:, :, :7], 2.0 ** 40, torch.bfloat16, ANY_SIZE) is None
    assert elementwise.scaled_and_cast(x.double(), 2.0 ** 400, torch.float32, ANY_SIZE) is None
    assert elementwise.scaled_and_cast(x, 1.0 + 2.0 ** -40, torch.bfloat16, ANY_SIZE) is None
    assert launched == []


@pytest.mark.parametrize("name, compute_dtype", [("polar_express", torch.bfloat16), ("polar_express", torch.float16),
                                                 ("gram_newton_schulz", torch.bfloat16),
                                                 ("gram_newton_schulz", torch.float16)])
def test_the_orthogonalizers_give_the_torch_passes_bits(name, compute_dtype, launched, monkeypatch):
    """A tall fp32 stack mixing scaled and unscaled matrices, orthogonalized with the kernels (the symmetric
    products kept torch's, whose kernel rounds differently: tests/test_symmetric_triton.py) and without. Gram
    Newton-Schulz forms its normaliser in fp32 (the kernel's copy, scaled where it must be)."""
    monkeypatch.setattr(symmetric, "_kernel_for", lambda a, chosen: None)
    x = stack("mixed", torch.float64, compute_dtype, "rows", shape=(4, 96, 50)).float()
    want = orthogonalize(x, name, 5, 1e-7, compute_dtype, kernels=TORCH)
    got = orthogonalize(x, name, 5, 1e-7, compute_dtype, kernels=ANY_SIZE)
    assert launched and same_bits(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a real layer's size: CUDA")
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_a_real_layer_size_on_cuda(layout, launched):
    """GPT-2's MLP stack (12 x 3072 x 768 and its transpose; many programs a matrix), mixed, fp32 to bf16."""
    x = stack("mixed", torch.float32, torch.bfloat16, layout, shape=(12, 768, 3072)).to(DEVICE)
    limit = norms.entry_limit(768 * 3072, torch.bfloat16, 1.0)
    got = norms.scaled_and_cast(x, (-2, -1), limit, torch.bfloat16, ANY_SIZE)
    assert launched == [1] and all(same_bits(a, b) for a, b in zip(got, torch_form(x, limit, torch.bfloat16)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
def test_a_capture_before_the_first_launch_takes_the_torch_form_and_later_captures_the_kernel(monkeypatch):
    """Under a CUDA graph's capture before the device has its arrival counts (a zeroing there would be captured,
    not run), the kernel declines and the torch form is captured; once an eager launch has made them, a capture
    takes the kernel, on two side streams at once (a graph's megabatches: each launch its own counts). Every
    replay gives the torch form's bits and leaves the counts 0."""
    monkeypatch.setattr(triton_kernels, "_ARRIVALS", {})
    calls = []
    original = triton_kernels.scaled_and_cast
    monkeypatch.setattr(triton_kernels, "scaled_and_cast", lambda *a: calls.append(1) or original(*a))
    x = stack("mixed", torch.float32, torch.bfloat16, "rows").to(DEVICE)
    limit = norms.entry_limit(x.size(-2) * x.size(-1), torch.bfloat16, 1.0)
    want = torch_form(x, limit, torch.bfloat16)

    def captured(streams: int) -> list:
        graph, side = torch.cuda.CUDAGraph(), [torch.cuda.Stream() for _ in range(streams)]
        results = []
        with torch.cuda.graph(graph):
            origin = torch.cuda.current_stream()
            for stream in side:
                stream.wait_stream(origin)
                with torch.cuda.stream(stream):
                    results.append(norms.scaled_and_cast(x, (-2, -1), limit, torch.bfloat16, ANY_SIZE))
                origin.wait_stream(stream)
        for _ in range(2):
            graph.replay()
            torch.cuda.synchronize()
            assert all(same_bits(a, b) for got in results for a, b in zip(got, want))
        return results

    captured(1)
    assert calls == [] and str(x.device) not in triton_kernels._ARRIVALS
    eager = norms.scaled_and_cast(x, (-2, -1), limit, torch.bfloat16, ANY_SIZE)
    assert calls == [1] and all(same_bits(a, b) for a, b in zip(eager, want))
    captured(2)
    assert calls == [1, 1, 1] and not triton_kernels._ARRIVALS[str(x.device)].counts.any()
