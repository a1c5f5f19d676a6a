"""Time the Triton symmetric-product kernel's variants (optimizers/symmetric_triton.py, issue 13) against
cuBLAS's full product, on the stacks of the 24-layer step.

    python benchmarks/symmetric_kernel.py [--reps 10] [--variants base,even,...] [--shapes 0,1,2,3] [--sweep]
    TRITON_INTERPRET=1 python benchmarks/symmetric_kernel.py --quick     # CPU smoke run (tiny shapes)

Shapes (bf16): (96, 4096, 4096) X Xᵀ; (72, 4096, 11008) X Xᵀ; (96, 4096, 4096) beta A + alpha A·A
(baddbmm); (72, 4096, 4096) beta R + alpha R·R (baddbmm, as in Gram Newton-Schulz). Per shape: cuBLAS
(torch.bmm / torch.baddbmm of the full product), optimizers/symmetric.py's torch row blocks, then each
variant of the kernel (and with --sweep some other launch settings of the descriptor variants), each
timed by CUDA events, median of --reps after 2 warm-up calls (the first compiles). Each row, printed as
measured (flushed, so a crash keeps the rows before it): ms, "exec" TFLOP/s (the multiply-adds the row
actually runs: the full product for cuBLAS, the computed tiles for the kernel), "equiv" TFLOP/s (the
full product's FLOPs over the time), the speedup over cuBLAS, max |got - cuBLAS| / max |cuBLAS|, and the
mirror: "exact" (the result equals its transpose bitwise), "tiles" (every tile above the diagonal
tiles is the exact transpose of its mirror, diagonal tiles computed whole: the base kernel), or "NO".
A variant that falls back (optimizers.symmetric_triton.resolve) says which ran. A failure (compile,
launch) is printed in its row and the run goes on. The closing lines name the fastest variant per shape
whose error is within 4x cuBLAS's own bf16 rounding bound and whose mirror holds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from optimizers import symmetric  # noqa: E402

SHAPES = [  # (label, batch, m, k, kind): kind "gram" is X Xᵀ, "poly" is beta C + alpha C·C
    ("X Xᵀ 96x4096x4096", 96, 4096, 4096, "gram"),
    ("X Xᵀ 72x4096x11008", 72, 4096, 11008, "gram"),
    ("A + A·A 96x4096x4096", 96, 4096, 4096, "poly"),
    ("R + R·R 72x4096x4096", 72, 4096, 4096, "poly"),
]
QUICK_SHAPES = [("X Xᵀ 2x40x72", 2, 40, 72, "gram"), ("A + A·A 2x48x48", 2, 48, 48, "poly"),
                ("X Xᵀ 2x33x47 (masked)", 2, 33, 47, "gram")]
BETA, ALPHA = -4.775, 2.0315
SWEEP = [("tma", 8, 4), ("tma", 4, 4), ("rect", 8, 4), ("rect", 8, 2), ("persistent", 8, 4)]
"""--sweep: (variant, warps, stages) beyond each variant's own launch."""


def operands(batch, m, k, kind, device, dtype, seed=0):
    """(input or None, a, b) for the product; spectral norms about 1 (no overflow in C·C)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(batch, m, k, generator=g, device=device, dtype=dtype) / (m ** 0.5 + k ** 0.5)
    if kind == "gram":
        return None, x, x.mT
    c = torch.bmm(x, x.mT)
    c = (c + c.mT) / 2  # bitwise symmetric: the sum commutes
    del x
    return c, c, c


def cublas(input, a, b):
    return torch.bmm(a, b) if input is None else torch.baddbmm(input, a, b, beta=BETA, alpha=ALPHA)


def timed(fn, reps, device, warmup=2):
    """(median ms of `reps` calls after `warmup` calls, last result)."""
    out = None
    for _ in range(warmup):
        out = fn()
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            out = fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times), out
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        del out
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out


def mirror(got, tile):
    if torch.equal(got, got.mT):
        return "exact"
    m = got.size(-1)
    for lo in range(0, m, tile):
        hi = min(lo + tile, m)
        if not torch.equal(got[:, lo:hi, hi:], got[:, hi:, lo:hi].mT):
            return "NO"
    return "tiles"


def tiles_computed(kernel, name, m, tile):
    """Entries (in tile_m x tile_n tiles) the variant computes, as a fraction of m²."""
    v = kernel.VARIANTS[name]
    pairs = kernel.pair_list(-(-m // tile), 1, v.tile_n)
    return len(pairs) * tile * tile * v.tile_n / (m * m)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--variants", default=None, help="comma-separated variant names (default: all)")
    p.add_argument("--shapes", default=None, help="comma-separated indices into the shape list")
    p.add_argument("--sweep", action="store_true", help="also other warps/stages of the descriptor variants")
    p.add_argument("--quick", action="store_true", help="CPU smoke run under TRITON_INTERPRET=1, tiny shapes")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    args = p.parse_args(argv)
    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        from optimizers import symmetric_triton as kernel  # noqa: PLC0415 - optional: needs triton
    except ImportError as e:
        print(f"no triton: {e}")
        return 1
    import triton  # noqa: PLC0415

    device = torch.device("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    if device.type == "cpu" and not kernel.interpreted():
        print("no GPU: run with --quick (TRITON_INTERPRET=1)")
        return 1
    # the interpreter's bf16 tl.dot is wrong (tests/test_symmetric_triton.py): fp16 on CPU
    dtype = torch.float16 if device.type == "cpu" or args.dtype == "fp16" else torch.bfloat16
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = [shapes[int(i)] for i in args.shapes.split(",")]
    names = args.variants.split(",") if args.variants else list(kernel.VARIANTS)
    runs = [(n, None, None) for n in names]
    if args.sweep:
        runs += [r for r in SWEEP if r[0] in names]
    tile, tile_k = (16, 16) if args.quick else (kernel.TILE, kernel.TILE_K)
    reps, warmup = (1, 1) if args.quick else (args.reps, 2)
    print(f"# symmetric product kernel variants: torch {torch.__version__}, triton {triton.__version__}, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU (interpreter)'}, {dtype}, "
          f"tensor descriptors: {kernel.descriptors_available()}, VARIANT = {kernel.VARIANT!r}", flush=True)
    print("| shape | row | ran | ms | exec TFLOP/s | equiv TFLOP/s | x cuBLAS | max rel diff | mirror |", flush=True)
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    winners, failures = [], 0
    started = time.time()
    for label, batch, m, k, kind in shapes:
        input, a, b = operands(batch, m, k, kind, device, dtype)
        alpha = 1.0 if input is None else ALPHA  # X Xᵀ: the plain product (bmm)
        full = 2.0 * batch * m * m * k
        ms_ref, ref = timed(lambda: cublas(input, a, b), reps, device, warmup)
        ref = ref.float()
        scale = ref.abs().max().item()
        bound = torch.finfo(dtype).eps * scale  # about one rounding of the largest entry
        print(f"| {label} | cuBLAS | {'bmm' if input is None else 'baddbmm'} | {ms_ref:.2f} | "
              f"{full / ms_ref / 1e9:.0f} | {full / ms_ref / 1e9:.0f} | 1.00 | 0 | "
              f"{mirror(cublas(input, a, b), tile)} |", flush=True)

        def row(name, ran, fn, exec_fraction, warps=None, stages=None):
            nonlocal failures
            tag = name if warps is None else f"{name} (warps {warps}, stages {stages})"
            try:
                ms, got = timed(fn, reps, device, warmup)
            except Exception as e:  # noqa: BLE001 - a variant that cannot compile or launch is a row, not the end
                failures += 1
                print(f"| {label} | {tag} | {ran} | failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''} "
                      f"| | | | | |", flush=True)
                return None
            diff = (got.float() - ref).abs().max().item() / scale
            mir = mirror(got, tile)
            print(f"| {label} | {tag} | {ran} | {ms:.2f} | {exec_fraction * full / ms / 1e9:.0f} | "
                  f"{full / ms / 1e9:.0f} | {ms_ref / ms:.2f} | {diff:.2e} | {mir} |", flush=True)
            del got
            return ms, diff, mir

        block = symmetric.BLOCK if m >= 2 * symmetric.BLOCK else max(1, m // 4)
        nb = symmetric.blocks(m, block)
        row("torch row blocks", f"{nb} blocks", lambda: symmetric._lower_blocks(input, a, b, BETA, alpha, block),
            (nb + 1) / (2 * nb))
        best = None
        for name, warps, stages in runs:
            ran = kernel.resolve(name, input, a, b, tile, tile_k)
            fn = (lambda name=name, warps=warps, stages=stages: kernel.symmetric_baddbmm(
                input, a, b, BETA, alpha, tile=tile, tile_k=tile_k, variant=name, warps=warps, stages=stages))
            result = row(name, ran, fn, tiles_computed(kernel, ran, m, tile), warps, stages)
            if result and result[1] <= 4 * bound / scale and result[2] != "NO":
                tag = name if warps is None else f"{name} (warps {warps}, stages {stages})"
                tag = tag if ran == name else f"{tag}, ran {ran}"
                if best is None or result[0] < best[1]:
                    best = (tag, result[0])
        winners.append((label, best, ms_ref))
        del input, a, b, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(flush=True)
    for label, best, ms_ref in winners:
        if best is None:
            print(f"{label}: no variant passed")
        else:
            print(f"{label}: fastest {best[0]} at {best[1]:.2f} ms ({ms_ref / best[1]:.2f}x cuBLAS)")
    print(f"total {time.time() - started:.0f} s, {failures} failed rows", flush=True)
    return 0 if all(best is not None for _, best, _ in winners) else 1


if __name__ == "__main__":
    raise SystemExit(main())
