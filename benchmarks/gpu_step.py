"""Median optimizer step time of our Muon (each orthogonalizer) beside peers, on three parameter sets.

    python benchmarks/gpu_step.py [--sets gpt2_small,llama24,convnext_t] [--steps 10] [--device cuda]

Prints one Markdown table: median step ms (CUDA events; host clock on CPU) after warm-up, the first
step's wall time (compilation and autotuning included), the Newton–Schulz TFLOP of one step and the
rate it achieved against a measured dense bf16 matmul peak. Peers run when installed:
torch.optim.Muon (2-D only), dion's Muon (`dion`), the gram-newton-schulz package's Muon
(`gram_newton_schulz`, pure-torch path: its CuTe kernels need `quack`). A peer that cannot take a
parameter set says so in its cell. `--scale` shrinks every dim (for a CPU smoke run).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

import optimizers


def gpt2_small(s: float) -> list[tuple[int, ...]]:
    """GPT-2 small: 12 layers of c_attn, c_proj, c_fc, mlp c_proj (48 matrices)."""
    d = _dim(768, s)
    return [shape for _ in range(12) for shape in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d))]


def llama24(s: float) -> list[tuple[int, ...]]:
    """24 layers of q, k, v, o (4096 x 4096), gate, up (11008 x 4096), down (4096 x 11008): 168 matrices."""
    d, f = _dim(4096, s), _dim(11008, s)
    return [shape for _ in range(24) for shape in ((d, d),) * 4 + ((f, d), (f, d), (d, f))]


def convnext_t(s: float) -> list[tuple[int, ...]]:
    """ConvNeXt-T's weights: stem 4x4 conv, per block a 7x7 depthwise conv and two pointwise linears,
    2x2 downsampling convs, and the classifier (depths 3, 3, 9, 3; widths 96, 192, 384, 768)."""
    widths = [_dim(w, s) for w in (96, 192, 384, 768)]
    shapes: list[tuple[int, ...]] = [(widths[0], 3, 4, 4)]
    for stage, (depth, w) in enumerate(zip((3, 3, 9, 3), widths)):
        if stage:
            shapes.append((w, widths[stage - 1], 2, 2))
        shapes += [shape for _ in range(depth) for shape in ((w, 1, 7, 7), (4 * w, w), (w, 4 * w))]
    return shapes + [(1000, widths[-1])]


SETS: dict[str, Callable[[float], list[tuple[int, ...]]]] = {
    "gpt2_small": gpt2_small, "llama24": llama24, "convnext_t": convnext_t}


def _dim(n: int, s: float) -> int:
    return max(2, int(round(n * s)))


def ns_tflop(shapes: list[tuple[int, ...]], steps: int = 5) -> float:
    """TFLOP of `steps` standard Newton–Schulz steps on every flattened matrix: 4 m^2 n + 2 m^3 per step."""
    total = 0.0
    for shape in shapes:
        m, n = sorted((shape[0], math.prod(shape[1:])))
        total += steps * (4 * m * m * n + 2 * m**3)
    return total / 1e12


def matmul_peak(device: torch.device) -> float:
    """Measured dense bf16 matmul TFLOP/s (8192^3, median of 10 after 3 warm-ups; CUDA only)."""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    ms = _median_ms(lambda: a @ b, 3, 10, device)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def _median_ms(fn: Callable[[], object], warmup: int, steps: int, device: torch.device) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def contenders(flatten_ok: bool) -> dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer] | str]:
    """name -> factory(params), or the reason it cannot run."""
    out: dict[str, Callable | str] = {}
    for orth in optimizers.ORTHOGONALIZERS if hasattr(optimizers, "ORTHOGONALIZERS") else (
            "polar_express", "newton_schulz"):
        if orth != "svd":
            out[f"ours ({orth})"] = lambda ps, orth=orth: optimizers.Muon(ps, flatten=True, orthogonalizer=orth)
    if hasattr(torch.optim, "Muon"):
        out["torch.optim.Muon"] = (lambda ps: torch.optim.Muon(ps)) if not flatten_ok else "rejects convs (2-D only)"
    try:
        from dion import Muon as DionMuon  # noqa: PLC0415 - optional peer
        out["dion"] = lambda ps: DionMuon(ps, flatten=True)
    except ImportError as exc:
        out["dion"] = f"not installed ({exc.name})"
    try:
        from gram_newton_schulz import Muon as GramMuon  # noqa: PLC0415 - optional peer
        out["gram-newton-schulz"] = lambda ps: GramMuon(ps, ns_use_kernels=False)
    except ImportError as exc:
        out["gram-newton-schulz"] = f"not installed ({exc.name})"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    peak = matmul_peak(device) if device.type == "cuda" else math.nan
    print(f"torch {torch.__version__}; device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
          f"measured bf16 matmul peak {peak:.0f} TFLOP/s; median of {args.steps} steps after {args.warmup}")
    print("| set | matrices | NS TFLOP/step | optimizer | median step ms | first step s | TFLOP/s | % of peak |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for name in args.sets.split(","):
        shapes = SETS[name](args.scale)
        flops = ns_tflop(shapes)
        gen = torch.Generator(device="cpu").manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(device)) for s in shapes]
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(device)
        for label, make in contenders(any(len(s) > 2 for s in shapes)).items():
            if isinstance(make, str):
                print(f"| {name} | {len(shapes)} | {flops:.3g} | {label} | {make} | | | |")
                continue
            try:
                opt = make(params)
                t0 = time.perf_counter()
                opt.step()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                first = time.perf_counter() - t0
                ms = _median_ms(opt.step, args.warmup, args.steps, device)
            except Exception as exc:  # a peer that cannot run this set: say why in its cell
                print(f"| {name} | {len(shapes)} | {flops:.3g} | {label} | failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:80]} | | | |")
                continue
            rate = flops / (ms * 1e-3)
            print(f"| {name} | {len(shapes)} | {flops:.3g} | {label} | {ms:.2f} | {first:.2f} | {rate:.0f} | "
                  f"{100 * rate / peak:.0f} |", flush=True)
            del opt
        del params
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
