"""The Triton symmetric product (optimizers/symmetric_triton.py): skipped without triton; on CPU it runs
under Triton's interpreter (TRITON_INTERPRET=1) in fp16 (the interpreter's bf16 tl.dot is wrong: a
16 x 16 product came out 2e10 off), on CUDA in bf16 and fp16 at sizes that engage it."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():  # before triton's import, which reads it (this process has no GPU to leak to)
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from optimizers.counters import Stats, counting  # noqa: E402
from optimizers.kernels import TORCH, Kernels  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    from optimizers import symmetric_triton
    return symmetric_triton


def device():
    return "cuda" if torch.cuda.is_available() else "cpu"


def tiles(kernel):
    """Small tiles under the interpreter (seconds), the GPU's own on CUDA."""
    return dict(tile=16, tile_k=16) if kernel.interpreted() else {}


def stack(*shape, seed=0, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device=device(), dtype=dtype)


def dtypes():
    return [torch.float16, torch.bfloat16] if torch.cuda.is_available() else [torch.float16]


def assert_one_rounding(got, exact, dtype):
    """Within 2 units of `dtype`'s rounding of the fp32-accumulated result (of its largest entry)."""
    bound = 2 * torch.finfo(dtype).eps * exact.abs().max()
    assert (got.float() - exact).abs().max() <= bound, float((got.float() - exact).abs().max() / bound)


def computed(m, tile):
    """The entries the kernel computes (tiles on and above the diagonal); the rest are their mirror."""
    t = torch.arange(m, device=device()) // tile
    return t[:, None] <= t[None, :]


def assert_mirrored(got, tile):
    """Every tile above the diagonal is the exact transpose of its mirror below."""
    m = got.size(-1)
    for lo in range(0, m, tile):
        hi = min(lo + tile, m)
        assert torch.equal(got[:, lo:hi, hi:], got[:, hi:, lo:hi].mT)


VARIANTS = ["base", "even", "tma", "persistent"]


def product(kernel, *args, variant, **kwargs):
    """kernel.symmetric_baddbmm by `variant`."""
    return kernel.symmetric_baddbmm(*args, variant=variant, **kwargs)


def assert_exact_mirror(got, kernel, variant):
    """The variants other than "base" mirror the diagonal tiles too: the whole result is symmetric."""
    if variant != "base":
        assert torch.equal(got, got.mT)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("b, m, k", [(2, 40, 70), (1, 48, 16), (3, 33, 47), (2, 40, 72)])
def test_gram_matrix_by_upper_tiles(kernel, b, m, k, variant):
    """X Xᵀ with m and k not multiples of the tiles (masked edges; TMA's zero fill where the rows are
    16-byte aligned, 40 x 72), transposed operand as a view, by each variant (issue 13)."""
    for dtype in dtypes():
        x = stack(b, m, k, dtype=dtype) if kernel.interpreted() else stack(b, 8 * m, 64 * k, dtype=dtype)
        got = product(kernel, None, x, x.mT, **tiles(kernel), variant=variant)
        assert_one_rounding(got, x.float() @ x.float().mT, dtype)
        assert_mirrored(got, tiles(kernel).get("tile", kernel.TILE))
        assert_exact_mirror(got, kernel, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gram_matrix_of_a_stack_stored_by_columns(kernel, variant):
    """X Xᵀ for X a transposed view (a tall matrix's transpose, as Gram Newton-Schulz orients it): the
    descriptor variants read Xᵀ's rows (both operands by columns) instead of falling back to "base"."""
    for dtype in dtypes():
        shape = (2, 72, 40) if kernel.interpreted() else (2, 4608, 320)
        x = stack(*shape, seed=5, dtype=dtype).mT
        if kernel.VARIANTS[variant].descriptors and kernel.descriptors_available():
            assert kernel.resolve(variant, None, x, x.mT, **tiles(kernel)) == variant
        got = product(kernel, None, x, x.mT, **tiles(kernel), variant=variant)
        assert_one_rounding(got, x.float() @ x.float().mT, dtype)
        assert_mirrored(got, tiles(kernel).get("tile", kernel.TILE))
        assert_exact_mirror(got, kernel, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", [40, 48])
def test_polynomial_products_with_input(kernel, variant, m):
    """beta R + alpha R R and a product of two commuting symmetric matrices (R and bR + cR²), by each
    variant: b not transposed (its rows loaded as they are), an input C; m = 40 cuts the last tiles."""
    for dtype in dtypes():
        shape = (2, m, 64) if kernel.interpreted() else (2, 51 * m, 4096)
        x = stack(*shape, seed=1, dtype=dtype)
        # spectral norm about 1, as Gram NS's iterates have: a Gaussian m x k has ||x||_2 ~ sqrt(m) + sqrt(k).
        # (Frobenius-normalised at 2048 x 4096, R R held fp16 subnormals, spacing 6e-8 above the bound.)
        x = x / (x.size(-2) ** 0.5 + x.size(-1) ** 0.5)
        r = (x.float() @ x.float().mT).to(dtype)
        r = (r + r.mT) / 2  # bitwise symmetric, as the kernel's own products are
        got = product(kernel, r, r, r, -4.775, 2.0315, **tiles(kernel), variant=variant)
        exact = -4.775 * r.float() + 2.0315 * (r.float() @ r.float())
        assert_one_rounding(got, exact, dtype)
        assert_exact_mirror(got, kernel, variant)
        z = exact.to(dtype)  # R Z is symmetric only up to the rounding of Z: compare the upper triangle
        got = product(kernel, None, r, z, **tiles(kernel), variant=variant)
        mask = computed(r.size(-1), tiles(kernel).get("tile", kernel.TILE))
        if variant != "base":  # the others compute each entry on or above the diagonal
            mask = torch.ones_like(mask).triu()
        assert_one_rounding(got[:, mask], (r.float() @ z.float())[:, mask], dtype)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_identity_is_added_to_the_diagonal_before_the_one_rounding(kernel, variant):
    """identity = a: aI + bR + cR² with each diagonal entry rounded once from fp32 (within one rounding of
    the exact sum), every other entry the bits of the product without it; m = 40 cuts the last tiles."""
    for dtype in dtypes():
        shape = (2, 40, 64) if kernel.interpreted() else (2, 2040, 4096)
        x = stack(*shape, seed=5, dtype=dtype)
        x = x / (x.size(-2) ** 0.5 + x.size(-1) ** 0.5)
        r = (x.float() @ x.float().mT).to(dtype)
        r = (r + r.mT) / 2
        plain = product(kernel, r, r, r, -4.775, 2.0315, **tiles(kernel), variant=variant)
        got = product(kernel, r, r, r, -4.775, 2.0315, **tiles(kernel), variant=variant, identity=3.4445)
        eye = torch.eye(r.size(-1), dtype=torch.bool, device=r.device).expand_as(r)
        assert torch.equal(got[~eye], plain[~eye])
        exact = 3.4445 + (-4.775 * r.float() + 2.0315 * (r.float() @ r.float())).diagonal(dim1=-2, dim2=-1)
        diagonal = got.diagonal(dim1=-2, dim2=-1).float()
        assert ((diagonal - exact).abs() <= torch.finfo(dtype).eps * exact.abs()).all()
        # negative control: the identity-free product is 3.4 off on the diagonal
        assert (plain.diagonal(dim1=-2, dim2=-1).float() - exact).abs().min() > 3.0
        assert_exact_mirror(got, kernel, variant)


def test_a_nonsymmetric_product_is_detected(kernel):
    """Negative control: the mirror assumes symmetry, so an asymmetric product comes out wrong."""
    a, b = stack(1, 40, 24, seed=2), stack(1, 24, 40, seed=3)
    if not kernel.interpreted():
        a, b = stack(1, 512, 256, seed=2), stack(1, 256, 512, seed=3)
    got = kernel.symmetric_baddbmm(None, a, b, **tiles(kernel))
    assert (got.float() - a.float() @ b.float()).abs().max() > 1.0


def test_bad_operands_are_refused_before_any_launch(kernel):
    x = stack(1, 32, 16)
    with pytest.raises(ValueError, match="takes"):
        kernel.symmetric_baddbmm(None, x.float(), x.float().mT)
    with pytest.raises(ValueError, match="square products"):
        kernel.symmetric_baddbmm(None, x, x)


def polar_express_on_kernel(kernel, monkeypatch, small, large, seed):
    """A run(compute_dtype) of Polar Express by gram_newton_schulz on a stack of shape `small` under the
    interpreter (tiles and TRITON_ROWS shrunk to match) or `large` on CUDA, with the kernel loaded as
    optimizers.symmetric's; returns (run, the stack)."""
    from optimizers import optional, symmetric
    from optimizers.coefficients import normaliser_scale, schedule
    from optimizers.gram_newton_schulz import gram_newton_schulz

    monkeypatch.setitem(optional.LOADED, "symmetric_triton", kernel)
    if kernel.interpreted():
        monkeypatch.setattr(symmetric, "BLOCK", 16)
        monkeypatch.setattr(symmetric, "TRITON_ROWS", 32)
        monkeypatch.setattr(kernel, "TILE", 16)
        monkeypatch.setattr(kernel, "TILE_K", 16)
    x = stack(*(small if kernel.interpreted() else large), seed=seed).double()
    coefficients = schedule("polar_express", 5)

    def run(compute, kernels=TORCH):
        return gram_newton_schulz(x, coefficients, normaliser_scale("polar_express"), 1e-7, compute,
                                  kernels=kernels).double()

    return run, x


SIZED = Kernels(on=True)
"""The kernels fused=None takes on CUDA: products from symmetric.TRITON_ROWS rows (shrunk under the interpreter)."""


def test_the_blocked_products_take_the_kernel_when_asked(kernel, monkeypatch):
    """Kernels allowed (the default on CUDA) route a product that would be split into blocks to the kernel
    (counted in the counting scope), and the Gram Newton-Schulz iteration through it stays within the plain
    products' error; not allowed, none does."""
    from optimizers import symmetric

    run, x = polar_express_on_kernel(kernel, monkeypatch, (1, 32, 96), (1, 2048, 6144), seed=4)
    with counting(Stats()) as stats:
        exact, plain = run(torch.float64), run(torch.float16)
    assert stats.products == 0
    square = x[:, :, : x.size(1)].half().to(device())
    assert symmetric.adds_identity(square, SIZED) and not symmetric.adds_identity(square, TORCH)  # W = aI + Z
    with counting(Stats()) as stats:
        fast = run(torch.float16, SIZED)
    assert stats.products > 0 and sum(stats.variants.values()) == stats.products
    assert (fast - exact).norm() <= 1.5 * (plain - exact).norm(), ((fast - exact).norm(), (plain - exact).norm())


@pytest.mark.parametrize("restarts", [(), (2,), (1, 3)])
def test_the_gram_iteration_on_the_kernel_keeps_r_current(kernel, monkeypatch, restarts):
    """Kernels allowed, a wide stack's Gram iteration forms W = aI + Z on the kernel and updates Q W and (R W) W:
    with any restarts it converges without a divergence fallback, within the plain products' error of the fp64
    result (a mutant that updated R only where it is never read diverged, and the fallback's standard iteration
    passed the accuracy comparison)."""
    from optimizers.coefficients import normaliser_scale, schedule
    from optimizers.gram_newton_schulz import gram_newton_schulz

    run, x = polar_express_on_kernel(kernel, monkeypatch, (1, 32, 96), (1, 2048, 6144), seed=5)

    def gram(compute, kernels=TORCH):
        return gram_newton_schulz(x, schedule("polar_express", 5), normaliser_scale("polar_express"), 1e-7, compute,
                                  restarts=restarts, kernels=kernels).double()
    exact, plain = gram(torch.float64), gram(torch.float16)
    with counting(Stats()) as stats:
        fast = gram(torch.float16, SIZED)
    assert stats.products > 0 and stats.fallbacks == 0  # a stale R diverges, and its fallback would hide it
    assert (fast - exact).norm() <= 1.5 * (plain - exact).norm(), ((fast - exact).norm(), (plain - exact).norm())


def test_the_standard_iteration_takes_w_from_the_kernel(kernel, monkeypatch):
    """Kernels allowed, a square stack's Newton-Schulz steps form W = aI + bA + cA² on the kernel and
    X' = W X by a plain product, within the plain products' error of the fp64 result; negative control: a
    kernel that drops the identity is caught by the same comparison."""
    from optimizers.coefficients import schedule

    run, _ = polar_express_on_kernel(kernel, monkeypatch, (2, 32, 32), (2, 2048, 2048), seed=6)
    coefficients = schedule("polar_express", 5)
    exact, plain = run(torch.float64), run(torch.float16)
    identities = []
    real = kernel.symmetric_baddbmm
    monkeypatch.setattr(kernel, "symmetric_baddbmm",
                        lambda *a, identity=0.0, **k: identities.append(identity) or real(*a, identity=identity, **k))
    fast = run(torch.float16, SIZED)
    assert [i for i in identities if i] == [a for a, _, _ in coefficients]  # one W per step, with its a
    assert (fast - exact).norm() <= 1.5 * (plain - exact).norm(), ((fast - exact).norm(), (plain - exact).norm())
    monkeypatch.setattr(kernel, "symmetric_baddbmm", lambda *a, identity=0.0, **k: real(*a, **k))
    lost = run(torch.float16, SIZED)
    assert not (lost - exact).norm() <= 10 * (plain - exact).norm()  # far off, or not finite


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (a 4 GiB stack)")
def test_a_batch_offset_past_int32_is_addressed_in_int64(kernel):
    """The second matrix of this stack starts 2^31 elements in (as the 48th of 4096 x 11008 bf16 does):
    int32 batch offsets wrapped and faulted (an illegal memory access on an H200, 72 x 4096 x 11008).
    Every variant (the descriptor ones: a 4 GiB batch stride in the descriptor, int64 masked stores)."""
    buffer = torch.zeros(2**31 + 256 * 128, dtype=torch.bfloat16, device="cuda")
    a = buffer.as_strided((2, 256, 128), (2**31, 128, 1))
    a.copy_(stack(2, 256, 128, seed=7, dtype=torch.bfloat16))
    exact = torch.bmm(a.float(), a.float().mT)
    for variant in VARIANTS:
        assert_one_rounding(kernel.symmetric_baddbmm(None, a, a.mT, variant=variant), exact, torch.bfloat16)


def test_a_matrix_past_int32_offsets_is_not_usable(kernel):
    """Offsets within one matrix stay int32: a matrix spanning 2^31 elements, or a product with 2^31
    entries, takes the torch path."""
    assert kernel.int32_offsets((72, 4096, 11008), (4096 * 11008, 11008, 1))
    assert not kernel.int32_offsets((1, 2, 16), (0, 2**31, 1))
    assert not kernel.int32_offsets((1, 46341, 16), (0, 16, 1))
    assert kernel.usable(stack(1, 32, 16)) and not kernel.usable(stack(1, 32, 16).float())


@pytest.mark.parametrize("m, tile", [(4096, 128), (40, 16), (33, 16), (48, 16), (300, 128), (96, 16)])
@pytest.mark.parametrize("group", [0, 8])
def test_tile_pairs_cover_the_upper_triangle_once(kernel, m, tile, group):
    """Every entry (r, c), c >= r, lies in exactly one listed tile (row block i, column block j >= i):
    the T (T + 1) / 2 upper tiles, and the grouped order is a permutation of the row-major one."""
    tiles = -(-m // tile)
    pairs = kernel.pair_list(tiles, group)
    assert sorted(pairs) == kernel.pair_list(tiles) and len(set(pairs)) == len(pairs)
    assert all(i <= j < tiles for i, j in pairs) and len(pairs) == tiles * (tiles + 1) // 2
    cover = torch.zeros(tiles * tile, tiles * tile, dtype=torch.int32)
    for i, j in pairs:
        cover[i * tile:(i + 1) * tile, j * tile:(j + 1) * tile] += 1
    upper = torch.ones(m, m, dtype=torch.bool).triu()
    assert (cover[:m, :m][upper] == 1).all()
    if m == 4096:
        assert len(pairs) == 528  # of the 1024 128 x 128 tiles: 0.52 of the full product
        assert kernel._pairs(tiles, torch.device("cpu"), group).shape == (528, 2)


def test_variants_fall_back_where_they_cannot_run(kernel, monkeypatch):
    """resolve: "even" needs m, k multiples of the tiles; the descriptor variants need 16-byte aligned
    rows (a, b or bᵀ, input, the m x m output) and triton's tensor descriptors; else "base" runs."""
    t = dict(tile=16, tile_k=16)
    x = stack(1, 32, 32)
    assert kernel.resolve("even", None, x, x.mT, **t) == "even"
    assert kernel.resolve("even", None, stack(1, 32, 40), stack(1, 32, 40).mT, **t) == "base"
    aligned, odd_k, odd_m = stack(1, 40, 72), stack(1, 40, 70), stack(1, 36, 72)
    runs = "tma" if kernel.descriptors_available() else "base"
    assert kernel.resolve("tma", None, aligned, aligned.mT, **t) == runs
    assert kernel.resolve("tma", None, odd_k, odd_k.mT, **t) == "base"  # 70 x 2 bytes per row
    assert kernel.resolve("tma", None, odd_m, odd_m.mT, **t) == "base"  # the output's rows: 36 x 2 bytes
    c = stack(1, 40, 40)
    assert kernel.resolve("tma", c, c, c, **t) == runs
    assert kernel.resolve("tma", c.mT.contiguous().mT, c, c, **t) == "base"  # input by columns
    monkeypatch.setattr(kernel, "_TensorDescriptor", None)
    assert kernel.resolve("tma", None, aligned, aligned.mT, **t) == "base"
    with pytest.raises(ValueError, match="unknown variant"):
        kernel.resolve("fastest", None, x, x.mT)


def test_the_default_is_persistent_at_4_warps_4_stages_the_fastest_measured(kernel):
    """VARIANT is "persistent" launched with 4 warps and 4 stages: on one H200 (torch 2.11, triton 3.6) the
    fastest over the stacks of benchmarks/symmetric_kernel.py (1.84-2.08x cuBLAS; issue 13)."""
    assert kernel.VARIANT == "persistent" and set(VARIANTS) == set(kernel.VARIANTS)
    persistent = kernel.VARIANTS["persistent"]
    assert persistent.descriptors and persistent.persistent and (persistent.warps, persistent.stages) == (4, 4)


def test_a_persistent_launch_takes_one_program_per_sm(kernel):
    """The persistent variant's grid: min(work items, programs) programs, each looping over its share of the
    (matrix, tile) items; one per SM on CUDA (few under the interpreter, each taking several items)."""
    if not kernel.descriptors_available():
        pytest.skip("no tensor descriptors in this triton")
    x = stack(5, 40, 32)
    fn, grid, _, _ = kernel.launch_plan(kernel.VARIANTS["persistent"], None, x, x.mT, torch.empty(5, 40, 40),
                                        tile=16, tile_k=16)
    items = 5 * 6  # 3 x 3 tiles, 6 on or above the diagonal, in each of 5 matrices
    assert fn is kernel._upper_tiles_persistent and grid == (min(items, kernel.programs(x.device)),)
    if not torch.cuda.is_available():
        assert grid == (kernel.INTERPRETED_PROGRAMS,)


def test_a_default_variant_that_fails_to_compile_falls_back_to_base(kernel, monkeypatch):
    """A default (VARIANT) that this triton cannot compile warns once and runs "base" from then on; a
    variant named in the call raises."""
    plan = kernel.launch_plan

    def broken(v, *args, **kwargs):
        if v.descriptors:
            raise RuntimeError("out of resources: shared memory")
        return plan(v, *args, **kwargs)

    x = stack(1, 32, 32)
    monkeypatch.setattr(kernel, "launch_plan", broken)
    monkeypatch.setattr(kernel, "BROKEN", {})
    monkeypatch.setattr(kernel, "VARIANT", "tma")
    if not kernel.descriptors_available():
        pytest.skip("no tensor descriptors in this triton: tma resolves to base")
    with pytest.warns(UserWarning, match="running 'base'"):
        got = kernel.symmetric_baddbmm(None, x, x.mT, **tiles(kernel))
    assert_one_rounding(got, x.float() @ x.float().mT, torch.float16)
    assert "tma" in kernel.BROKEN and kernel.resolve(None, None, x, x.mT) == "base"
    with pytest.raises(RuntimeError, match="out of resources"):
        kernel.symmetric_baddbmm(None, x, x.mT, **tiles(kernel), variant="tma")
    with kernel.variant("tma"), pytest.raises(RuntimeError, match="out of resources"):  # chosen: no fallback
        kernel.symmetric_baddbmm(None, x, x.mT, **tiles(kernel))


def test_a_variant_scope_chooses_the_variant_of_every_call_naming_none(kernel, monkeypatch):
    """Within `variant(name)` (benchmarks) a product that names no variant runs `name`, in place of the default
    and of its stand-in while that compiles; outside it the default again; a call naming one keeps its own; an
    unknown name is refused. Counted by the variant that ran. The stack is a whole tile, so that "even" runs as
    itself (a 32 x 32 stack under the GPU's own tiles of 128 ran "base")."""
    n = 32 if kernel.interpreted() else max(kernel.TILE, kernel.TILE_K)
    x = stack(1, n, n)
    monkeypatch.setattr(kernel, "WARMING", {"persistent"})
    default = kernel.resolve(None, None, x, x.mT, **tiles(kernel))
    with kernel.variant("base"):
        assert kernel.resolve(None, None, x, x.mT) == "base" and kernel.slow_default() is None
        assert kernel.resolve("even", None, x, x.mT, **tiles(kernel)) == "even"
        with counting(Stats()) as stats:
            got = kernel.symmetric_baddbmm(None, x, x.mT, **tiles(kernel))
    assert stats.variants == {"base": 1}
    assert_one_rounding(got, x.float() @ x.float().mT, torch.float16)
    assert kernel.resolve(None, None, x, x.mT, **tiles(kernel)) == default
    assert default == ("tma" if kernel.descriptors_available() else "base")  # the stand-in while it warms
    with pytest.raises(ValueError, match="unknown variant"):
        with kernel.variant("fastest"):
            pass


@pytest.mark.skipif(torch.cuda.is_available(), reason="the --quick smoke run is the interpreter's")
def test_the_benchmark_runs_quick(kernel, capsys):
    """benchmarks/symmetric_kernel.py --quick: every row measured, checked against the plain product."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "symmetric_kernel.py"
    spec = importlib.util.spec_from_file_location("symmetric_kernel_benchmark", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--quick", "--variants", "base,even,tma", "--shapes", "0,1"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| X") or line.startswith("| A")]
    assert len(rows) == 2 * 5 and not any("failed" in line for line in rows), out
    assert "fastest" in out and "| NO |" not in out and "-> VARIANT = " in out


def test_the_variants_compile_for_sm90_within_an_h200_block(kernel):
    """benchmarks/symmetric_kernel.py --compile-only (no GPU: triton's own ptxas) compiles the default,
    "persistent" at its 4 warps and 4 stages, for sm_90 as a launch would specialise it, pipelined (async
    wgmma), by TMA, in at most 227 KiB of shared memory, without spills. In a process of its own: this
    one may run triton's interpreter."""
    import pathlib
    import subprocess
    import sys

    import triton

    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("this triton has no bundled ptxas")
    root = pathlib.Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "symmetric_kernel.py"), "--compile-only",
                           "--variants", "persistent", "--no-sweep", "--shapes", "2"],
                          capture_output=True, text=True, env=env, cwd=root, timeout=600)
    if done.returncode == 2:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stdout + done.stderr
    row = [line for line in done.stdout.splitlines() if "| persistent |" in line]
    assert len(row) == 1, done.stdout
    cells = [c.strip() for c in row[0].split("|")]
    assert cells[3] == "persistent" and cells[6] == "yes" and cells[8] in ("0", "") and cells[9:11] == ["yes", "yes"], row
