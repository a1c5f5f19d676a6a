"""What the overflow-safe normaliser (optimizers/norms.py) costs on CPU: the polynomial orthogonalizers'
X / (factor ||X||_F + eps), unscaled (cast, norm, divide: not overflow-safe), always scaled (max |entry|,
power-of-two scale, multiply, norm, divide: what runs off CPU) and as it runs on CPU (`scaled_and_cast`:
cast and norm, the largest-entry pass only where a norm exceeds the limit), beside the whole
orthogonalization (Polar Express, 5 steps). "added" is each safe form's time over the unscaled one.

Process CPU time of each, the minimum over --reps runs taken in turns (so that a loaded, shared machine
slows both alike), one thread.

  python benchmarks/normaliser_overhead.py [--reps 40]

With --device (cuda; cpu for a smoke run of the same tables), what the overflow-safe forms off CPU (no host
synchronisation, CUDA graphs stay valid) cost there: the torch form (`downscale`, then the scaled cast: the
largest-entry pass always runs) and the form shipped where the Triton kernels run (`scaled_and_cast` with the
kernels fused=None takes: one launch that casts, takes each matrix's largest entry and scales where it must), two
tables:
  1. per stack, the megabatches of GPT-2 small, ConvNeXt-T and the 24-layer set (benchmarks/gpu_step.py's sets,
     --scale shrinking every dim), in fp32 as Muon stacks its fp32 momentum, cast to the device's default
     compute dtype (bf16 on CUDA): the median ms over --reps turns (CUDA events; host clock on CPU) of
     unscaled, the torch form, the shipped form and the whole orthogonalize(x, "polar_express", 5, ...) with
     the Triton kernels the default fused=None takes; "added": each safe form minus unscaled, and that as a
     share of the orthogonalization;
  2. whole steps of our Muon (gpu_step.py's rows "ours (X)" and "ours (X, cuda graphs)", Polar Express and
     Gram Newton-Schulz, on its parameters) with the torch form (`torch_form`), as shipped, and with the pass
     skipped off CPU (`pass_skipped`: cast, norm, scale 1), a fresh optimizer each on the same parameters,
     after --warmup steps each, in blocks of steps taken in turns over --rounds turns (the order reversed
     every other turn; about --budget seconds of steps per variant): median step ms of each, the ms each safe
     form adds to the skipped step and its share of that form's step, and the GPU kernels one step runs in
     each (torch.profiler, CUDA only).
     Each orthogonalizer eager (cuda_graphs=False) and captured whole (cuda_graphs=True, every megabatch in the
     plan's graph; optimizers/graphs.py); the default, cuda_graphs=None, captures those of up to
     graphs.MAX_NUMEL elements.

  python benchmarks/normaliser_overhead.py --device cuda [--reps 40] [--rounds 10] [--budget 3] [--scale 1]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import math
import os
import statistics
import sys
import time
from typing import Callable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile

from optimizers import gram_newton_schulz, kernels, launches
from optimizers.algorithms.muon import default_compute_dtype
from optimizers.coefficients import normaliser_scale
from optimizers.norms import denominator, downscale, entry_limit, frobenius, scaled_and_cast
from optimizers.orthogonalize import orthogonalize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_step  # noqa: E402

STACKS = ((200, 12, 20), (200, 64, 64), (16, 256, 512), (4, 512, 1024))
FACTOR = normaliser_scale("polar_express")
STACK_SETS = ("gpt2_small", "convnext_t", "llama24")
"""The sets whose megabatches table 1 times."""
STEP_SETS = ("gpt2_small", "convnext_t", "llama24")
"""The sets whose steps table 2 times, the fastest first."""
ORTHOGONALIZERS = ("polar_express", "gram_newton_schulz")
CALLERS = (sys.modules["optimizers.orthogonalize"], gram_newton_schulz)
"""The modules that call `scaled_and_cast` (by the name they imported)."""


def unscaled(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = x.to(dtype)
    return x / (frobenius(x, (-2, -1), keepdim=True) * FACTOR + 1e-7)


def scaled(x: torch.Tensor) -> torch.Tensor:
    scale = downscale(x, (-2, -1), entry_limit(x.size(-2) * x.size(-1), torch.float32, FACTOR))
    x = torch.mul(x, scale, out=torch.empty_like(x, dtype=torch.float32))
    return x / denominator(frobenius(x, (-2, -1), keepdim=True), FACTOR, 1e-7, scale)


def shortcut(x: torch.Tensor, dtype: torch.dtype = torch.float32, fused: kernels.Kernels = kernels.TORCH
             ) -> torch.Tensor:
    limit = entry_limit(x.size(-2) * x.size(-1), dtype, FACTOR)
    x, norm, scale = scaled_and_cast(x, (-2, -1), limit, dtype, fused)
    return x / denominator(norm, FACTOR, 1e-7, scale)


def cpu_seconds(run: Callable[[], object]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def cpu_table(reps: int) -> None:
    """The CPU table of the module docstring's first part."""
    torch.set_num_threads(1)
    print(f"{'stack':<18} {'unscaled':>10} {'scaled':>10} {'cpu form':>10} {'orthogonalize':>14} "
          f"{'scaled added/orth':>18} {'cpu form added/orth':>20}")
    for shape in STACKS:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        runs = {"unscaled": lambda: unscaled(x), "scaled": lambda: scaled(x), "cpu": lambda: shortcut(x),
                "orth": lambda: orthogonalize(x, "polar_express", 5, 1e-7, torch.float32)}
        best = {name: float("inf") for name in runs}
        for _ in range(reps):
            for name, run in runs.items():
                best[name] = min(best[name], cpu_seconds(run))
        added = {name: (best[name] - best["unscaled"]) / best["orth"] for name in ("scaled", "cpu")}
        print(f"{'x'.join(map(str, shape)):<18} {best['unscaled'] * 1e3:8.3f}ms {best['scaled'] * 1e3:8.3f}ms "
              f"{best['cpu'] * 1e3:8.3f}ms {best['orth'] * 1e3:12.3f}ms {added['scaled']:18.1%} "
              f"{added['cpu']:20.1%}", flush=True)


def megabatches(set_name: str, scale: float) -> list[tuple[int, ...]]:
    """The stacks [B, m, n] Muon orthogonalizes for gpu_step's set: its same-shape matrices, each flattened
    to 2-D, in the order they first appear."""
    counts = collections.Counter((s[0], math.prod(s[1:])) for s in gpu_step.SETS[set_name](scale))
    return [(count, *shape) for shape, count in counts.items()]


def stack_table(device: torch.device, reps: int, scale: float) -> None:
    """Table 1 of the module docstring."""
    dtype = default_compute_dtype(device)
    print("| stack | input -> compute | unscaled ms | torch form ms | shipped ms | orthogonalize ms | "
          "added torch form ms (/ orth) | added shipped ms (/ orth) |\n|---|---|---:|---:|---:|---:|---:|---:|",
          flush=True)
    for shape in (s for name in STACK_SETS for s in megabatches(name, scale)):
        x = torch.randn(shape, generator=torch.Generator(device).manual_seed(0), device=device)
        fused = kernels.of(None, x)
        runs = {"unscaled": lambda: unscaled(x, dtype), "torch": lambda: shortcut(x, dtype),
                "shipped": lambda: shortcut(x, dtype, fused),
                "orth": lambda: orthogonalize(x, "polar_express", 5, 1e-7, dtype, kernels=fused)}
        for run in runs.values():  # warm-up, and any Triton kernel compiled
            run()
        launches.wait()
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(reps):
            for name, run in runs.items():
                times[name] += gpu_step._times_ms(run, 0, 1, device)
        ms = {name: statistics.median(t) for name, t in times.items()}
        added = {name: ms[name] - ms["unscaled"] for name in ("torch", "shipped")}
        print(f"| {'x'.join(map(str, shape))} | {str(x.dtype)[6:]} -> {str(dtype)[6:]} | {ms['unscaled']:.3f} | "
              f"{ms['torch']:.3f} | {ms['shipped']:.3f} | {ms['orth']:.3f} | "
              f"{added['torch']:.3f} ({added['torch'] / ms['orth']:.1%}) | "
              f"{added['shipped']:.3f} ({added['shipped'] / ms['orth']:.1%}) |", flush=True)


def without_pass(x: torch.Tensor, dims: tuple[int, ...], limit: float, dtype: torch.dtype,
                 fused: kernels.Kernels = kernels.TORCH) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`scaled_and_cast` without its largest-entry pass off CPU: the cast, its norm and scale 1 (what the
    normaliser cost before it was overflow-safe); on CPU as shipped."""
    if x.device.type == "cpu":
        return scaled_and_cast(x, dims, limit, dtype, fused)
    cast = x.to(dtype)
    return cast, frobenius(cast, dims, keepdim=True), torch.ones((), dtype=dtype)


def torch_only(x: torch.Tensor, dims: tuple[int, ...], limit: float, dtype: torch.dtype,
               fused: kernels.Kernels = kernels.TORCH) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`scaled_and_cast` without the Triton kernels, whatever `fused` allows: the torch form off CPU."""
    return scaled_and_cast(x, dims, limit, dtype)


@contextlib.contextmanager
def replaced(form: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> Iterator[None]:
    """`form` in place of `scaled_and_cast` in every module that calls it; restored after."""
    for module in CALLERS:
        module.scaled_and_cast = form
    try:
        yield
    finally:
        for module in CALLERS:
            module.scaled_and_cast = scaled_and_cast


def pass_skipped() -> contextlib.AbstractContextManager:
    """Steps with `without_pass`."""
    return replaced(without_pass)


def torch_form() -> contextlib.AbstractContextManager:
    """Steps with the torch form (`torch_only`)."""
    return replaced(torch_only)


def gpu_kernels(opt: torch.optim.Optimizer) -> str:
    """The GPU kernels one `opt.step()` runs (device copies and memsets left out), by torch.profiler's CUDA
    activity; or why there is no count."""
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            opt.step()
            torch.cuda.synchronize()
    except RuntimeError as exc:  # a profiler that cannot run here: the timings stand without the count
        return f"profiler failed: {str(exc)[:60]}"
    return str(sum(e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
                   for e in prof.events()))


def step_rows(set_name: str, device: torch.device, args: argparse.Namespace) -> None:
    """Table 2's rows of one set: per orthogonalizer and option, the torch form, shipped and the pass skipped."""
    shapes = gpu_step.SETS[set_name](args.scale)
    params = gpu_step.make_params(shapes, device)
    rows = {c.label: c for c in gpu_step.contenders(any(len(s) > 2 for s in shapes), False)}
    variants: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
        "torch": torch_form, "shipped": contextlib.nullcontext, "skipped": pass_skipped}
    for orth in ORTHOGONALIZERS:
        for option, row in (("cuda_graphs=False", "no graphs"), ("cuda_graphs=True", "cuda graphs")):
            make = rows[f"ours ({orth}, {row})"].make
            opts: dict[str, torch.optim.Optimizer] = {}
            for name, context in variants.items():
                with context():
                    opts[name] = make(params)
                    opts[name].step()
                    launches.wait()
                    step_ms = gpu_step._times_ms(opts[name].step, args.warmup, 1, device)[0]
            block = max(1, round(args.budget / args.rounds / (step_ms * 1e-3)))
            times: dict[str, list[float]] = {name: [] for name in variants}
            for turn in range(args.rounds):
                for name in list(variants)[:: 1 if turn % 2 == 0 else -1]:
                    with variants[name]():
                        times[name] += gpu_step._times_ms(opts[name].step, 0, block, device)
            ms = {name: statistics.median(t) for name, t in times.items()}
            added = {name: ms[name] - ms["skipped"] for name in ("torch", "shipped")}
            counts: dict[str, str] = {}
            for name, context in variants.items():
                with context():
                    counts[name] = gpu_kernels(opts[name]) if device.type == "cuda" else "-"
            print(f"| {set_name} | {orth} | {option} | {len(times['shipped'])} ({args.rounds} x {block}) | "
                  f"{ms['torch']:.3f} | {ms['shipped']:.3f} | {ms['skipped']:.3f} | "
                  f"{ms['shipped'] / ms['torch']:.4f} | {added['torch']:.3f} ({added['torch'] / ms['torch']:.1%}) | "
                  f"{added['shipped']:.3f} ({added['shipped'] / ms['shipped']:.1%}) | "
                  f"{counts['torch']} / {counts['shipped']} / {counts['skipped']} |", flush=True)
            del opts
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()


def device_tables(args: argparse.Namespace) -> None:
    """The two tables of the module docstring's second part."""
    start = time.perf_counter()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__}; device {name}; scale {args.scale}; triton kernels "
          f"{'on' if kernels.available() else 'off'}\n", flush=True)
    stack_table(device, args.reps, args.scale)
    print("\n| set | orthogonalizer | options | steps each (turns x block) | torch form ms | shipped ms | "
          "pass skipped ms | shipped / torch form | added torch form ms (% of step) | added shipped ms (% of step) | "
          "GPU kernels torch form / shipped / skipped |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
          flush=True)
    for set_name in STEP_SETS:
        step_rows(set_name, device, args)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(f"\ntotal {time.perf_counter() - start:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--device", default=None, help="the tables of the forms off CPU, on this device")
    parser.add_argument("--scale", type=float, default=1.0, help="with --device: shrink every dim")
    parser.add_argument("--rounds", type=int, default=10, help="with --device: turns of step blocks per variant")
    parser.add_argument("--budget", type=float, default=3.0, help="with --device: seconds of steps per variant")
    parser.add_argument("--warmup", type=int, default=3, help="with --device: steps per variant before timing")
    args = parser.parse_args()
    if args.device is None:
        cpu_table(args.reps)
    else:
        device_tables(args)


if __name__ == "__main__":
    main()
