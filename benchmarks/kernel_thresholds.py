"""The figures that decide the sizes from which the default (fused=None, optimizers/kernels.py) takes the Triton
kernels: symmetric.TRITON_ROWS (rows from which a symmetric product takes the kernel), symmetric.GRAPHED_ROWS (the
same in a megabatch a CUDA graph records) and elementwise.MIN_NUMEL (elements from which an elementwise launch
takes the fused kernels).

    python benchmarks/kernel_thresholds.py [--products] [--elementwise] [--graphed] [--reps 20] [--rounds 8]
    TRITON_INTERPRET=1 python benchmarks/kernel_thresholds.py --quick      # CPU smoke run (tiny sizes)

--products: for each row count m of ROWS and each product of a Newton–Schulz step (X Xᵀ of a wide stack of
m x 3m matrices; bA + cA² and W = aI + bA + cA² of a stack of m x m matrices: optimizers/symmetric.py), in bf16,
a stack of about WORK multiply-adds, times the torch path (symmetric products by blocks or one cuBLAS product,
as fused=False runs them) against the kernel (optimizers/symmetric_triton.py, its default variant, compiled
first), each a median of --reps by CUDA events, and prints a row per (m, product) with both times and the
kernel's speedup. Its crossover line names the smallest m of ROWS from which the kernel is at least as fast on
every product (and on every larger m): the value for symmetric.TRITON_ROWS.

--elementwise: for each launch size n of NUMELS (a megabatch of 4 fp32 matrices of n / 4 elements each, COLS wide),
times the torch passes against the fused kernels (optimizers/elementwise_triton.py) for the momentum
(M <- mu M + G: two torch._foreach_* passes), the apply (X <- X decay + alpha O: two foreach passes) and
the normaliser's divide into bf16 (torch.div into a bf16 output), as a step issues them: the wall time of --reps
calls issued back to back and synchronised once, over --reps (so that the host's issue time counts, which is
what makes small launches lose). Its crossover line names the smallest n from which the kernels are at least
as fast on every pass (and on every larger n): the value for elementwise.MIN_NUMEL.

--graphed: whole default steps (Muon(flatten=True), no option set: every megabatch in the plan's CUDA graph) of
gpu_step.py's GRAPHED_SETS, Polar Express and Gram Newton–Schulz, with symmetric.GRAPHED_ROWS set to each row
count of ROWS below TRITON_ROWS and to TRITON_ROWS itself (the kernel in a graph only where it is used eagerly),
a fresh optimizer each on the same parameters, in blocks of steps taken in turns (the order reversed every
other turn): median step ms, the speedup over TRITON_ROWS and the first step. A threshold under which no product
of a set takes the kernel is that set's baseline step, not a measurement. Its crossover line names the smallest
row count from which every threshold is at least as fast as TRITON_ROWS on every set and orthogonalizer: the
value for symmetric.GRAPHED_ROWS. CUDA only.

Without a GPU (and without --quick) it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_step  # noqa: E402

import optimizers  # noqa: E402
from optimizers import elementwise, launches, symmetric  # noqa: E402
from optimizers.algorithms.base import decoupled_apply_all  # noqa: E402
from optimizers.kernels import TORCH, Kernels, available  # noqa: E402

ROWS = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)
"""Row counts of the products measured (GPT-2 small's 768 and the 24-layer set's 4096 among them)."""

WORK = 2 * 4096**3
"""Multiply-adds of one measured stack (its batch is chosen to reach about this many)."""

NUMELS = tuple(1 << e for e in range(16, 27))
"""Elements of one measured launch: 64 Ki to 64 Mi."""

ANY_SIZE = Kernels(on=True, sized=False)
"""The kernels at every size (fused=True): the thresholds under measure are not applied."""

QUICK_ROWS, QUICK_WORK, QUICK_NUMELS = (16, 32), 2 * 32**3, (1 << 8, 1 << 10)
"""--quick: tiny sizes, under Triton's CPU interpreter."""


def timed_events(fn: Callable[[], object], reps: int) -> float:
    """Median ms of `reps` calls after a warm-up call: CUDA events on CUDA, the host clock elsewhere."""
    fn()
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def timed_issued(fn: Callable[[], object], reps: int) -> float:
    """ms per call of `reps` calls issued back to back and synchronised once, after a warm-up call."""
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / reps


def crossover(results: dict[int, list[float]]) -> int | None:
    """The smallest size from which every ratio (torch time / kernel time) of it and of every larger size is at
    least 1; None where the largest size loses."""
    found = None
    for size in sorted(results, reverse=True):
        if min(results[size]) < 1.0:
            break
        found = size
    return found


def products(rows: tuple[int, ...], work: int, reps: int, device: torch.device, dtype: torch.dtype) -> int | None:
    """Print the --products rows; return the crossover row count."""
    print("| m | product | batch | torch ms | kernel ms | kernel speedup |")
    print("|---:|---|---:|---:|---:|---:|")
    results: dict[int, list[float]] = {}
    for m in rows:
        gen = torch.Generator(device=device).manual_seed(m)
        k = 3 * m
        batch = max(1, round(work / (m * m * k)))
        x = (torch.randn(batch, m, k, generator=gen, device=device) / (m ** 0.5 + k ** 0.5)).to(dtype)
        a = torch.bmm(x, x.mT)
        a = (a + a.mT) / 2
        a = a[: max(1, round(work / m**3))]
        kinds = {
            "X Xᵀ": lambda kernels: symmetric.symmetric_bmm(x, x.mT, kernels=kernels),
            "bA + cA²": lambda kernels: symmetric.symmetric_baddbmm(a, a, a, beta=-4.775, alpha=2.0315,
                                                                    kernels=kernels),
            "aI + bA + cA²": lambda kernels: symmetric.polynomial_product(a, a, 3.4445, -4.775, 2.0315, kernels),
        }
        ratios = []
        for name, fn in kinds.items():
            plain = timed_events(lambda: fn(TORCH), reps)
            fast = timed_events(lambda: fn(ANY_SIZE), reps)
            ratios.append(plain / fast)
            stack = x.shape[0] if name == "X Xᵀ" else a.shape[0]
            print(f"| {m} | {name} | {stack} | {plain:.3f} | {fast:.3f} | {plain / fast:.2f} |", flush=True)
        results[m] = ratios
    found = crossover(results)
    print(f"products crossover: the kernel is at least as fast from {found} rows on every product"
          f" -> symmetric.TRITON_ROWS = {found} (now {symmetric.TRITON_ROWS})" if found is not None else
          "products crossover: the kernel loses at the largest size measured", flush=True)
    return found


COLS = 1024
"""Columns of the matrices the elementwise rows launch over (4 matrices of n / (4 COLS) x COLS): a step's
parameters are matrices, and the apply kernel walks their rows."""


def passes(numels: tuple[int, ...], reps: int, device: torch.device) -> int | None:
    """Print the --elementwise rows; return the crossover launch size."""
    print("| elements | pass | torch ms | kernels ms | kernels speedup |")
    print("|---:|---|---:|---:|---:|")
    results: dict[int, list[float]] = {}
    for n in numels:
        gen = torch.Generator(device=device).manual_seed(n)
        each = max(1, n // 4)
        rows, cols = (each // COLS, COLS) if each % COLS == 0 else (1, each)  # parameters as a step holds them
        bufs = [torch.randn(each, generator=gen, device=device) for _ in range(4)]
        grads = [torch.randn(each, generator=gen, device=device) for _ in range(4)]
        xs = [b.clone().reshape(rows, cols) for b in bufs]
        matrices = torch.randn(4, rows, cols, generator=gen, device=device)
        updates = list(matrices.unbind(0))
        x = torch.randn(4, rows, cols, generator=gen, device=device)
        d = torch.rand(4, 1, 1, generator=gen, device=device) + 1.0
        group = {"lr": 0.02, "weight_decay": 0.1}
        half = torch.float16 if device.type == "cpu" else torch.bfloat16  # the interpreter truncates to bf16

        def momentum_torch() -> None:
            torch._foreach_mul_(bufs, 0.95)
            torch._foreach_add_(bufs, grads)

        kinds = {
            "momentum": (momentum_torch, lambda: elementwise.momentum_(bufs, grads, 0.95, ANY_SIZE)),
            "apply": (lambda: decoupled_apply_all(xs, updates, group, 1.0),
                      lambda: elementwise.apply_(xs, matrices, 1 - 0.02 * 0.1, -0.02, ANY_SIZE)),
            "divide": (lambda: torch.div(x, d, out=torch.empty_like(x, dtype=half)),
                       lambda: elementwise.divide(x, d, half, ANY_SIZE)),
        }
        ratios = []
        for name, (plain_fn, fast_fn) in kinds.items():
            plain, fast = timed_issued(plain_fn, reps), timed_issued(fast_fn, reps)
            ratios.append(plain / fast)
            print(f"| {n} | {name} | {plain:.4f} | {fast:.4f} | {plain / fast:.2f} |", flush=True)
        results[n] = ratios
    found = crossover(results)
    print(f"elementwise crossover: the kernels are at least as fast from {found} elements on every pass"
          f" -> elementwise.MIN_NUMEL = {found} (now {elementwise.MIN_NUMEL})" if found is not None else
          "elementwise crossover: the kernels lose at the largest size measured", flush=True)
    return found


GRAPHED_SETS = ("gpt2_small", "convnext_t")
"""gpu_step.py's sets whose megabatches the default captures (each within graphs.MAX_NUMEL) and whose matrices have
fewer than TRITON_ROWS rows."""


def graphed_steps(rows: tuple[int, ...], rounds: int, device: torch.device) -> int | None:
    """Print the --graphed rows; return the crossover row count."""
    candidates = tuple(r for r in rows if r < symmetric.TRITON_ROWS) + (symmetric.TRITON_ROWS,)
    default = symmetric.GRAPHED_ROWS
    print("| set | orthogonalizer | GRAPHED_ROWS | kernel products | step ms | speedup | first step s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    results: dict[int, list[float]] = {r: [] for r in candidates[:-1]}
    try:
        for set_name in GRAPHED_SETS:
            params = gpu_step.make_params(gpu_step.SETS[set_name](1.0), device)
            for orth in ("polar_express", "gram_newton_schulz"):
                opts, first = {}, {}
                for r in candidates:
                    symmetric.GRAPHED_ROWS = r
                    t0 = time.perf_counter()
                    opts[r] = optimizers.Muon(params, flatten=True, orthogonalizer=orth)
                    opts[r].step()
                    launches.wait()
                    torch.cuda.synchronize(device)
                    first[r] = time.perf_counter() - t0
                    gpu_step._times_ms(opts[r].step, 5, 1, device)
                times: dict[int, list[float]] = {r: [] for r in candidates}
                for turn in range(rounds):
                    for r in candidates[:: 1 if turn % 2 == 0 else -1]:
                        symmetric.GRAPHED_ROWS = r
                        times[r] += gpu_step._times_ms(opts[r].step, 1, 10, device)
                base = statistics.median(times[symmetric.TRITON_ROWS])
                for r in candidates:
                    ms = statistics.median(times[r])
                    products = opts[r].stats.products
                    if r in results and products:
                        results[r].append(base / ms)
                    print(f"| {set_name} | {orth} | {r} | {products} | {ms:.2f} | {base / ms:.2f} | {first[r]:.2f} |",
                          flush=True)
                del opts
            del params
            torch.cuda.empty_cache()
    finally:
        symmetric.GRAPHED_ROWS = default
    found = crossover({r: v for r, v in results.items() if v})
    print(f"graphed crossover: in a graph, every step is at least as fast from {found} rows"
          f" -> symmetric.GRAPHED_ROWS = {found} (now {default})" if found is not None else
          "graphed crossover: no threshold below TRITON_ROWS is faster on every step", flush=True)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--products", action="store_true", help="the symmetric products' rows (default: both)")
    parser.add_argument("--elementwise", action="store_true", help="the elementwise passes' rows (default: both)")
    parser.add_argument("--graphed", action="store_true", help="whole steps with graphs (default: with both, on CUDA)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=8, help="--graphed: turns of blocks of 10 steps each")
    parser.add_argument("--quick", action="store_true", help="CPU smoke run under TRITON_INTERPRET=1, tiny sizes")
    args = parser.parse_args(argv)
    both = not (args.products or args.elementwise or args.graphed)
    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if not (torch.cuda.is_available() or args.quick) or not available():
        print("needs CUDA and triton (or --quick with triton, under its CPU interpreter)")
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    reps = 1 if args.quick else args.reps
    print(f"torch {torch.__version__}; "
          f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU (interpreter)'}", flush=True)
    if args.products or both:
        # the interpreter's bf16 dot is wrong (tests/test_symmetric_triton.py): fp16 on CPU
        dtype = torch.float16 if device.type == "cpu" else torch.bfloat16
        products(QUICK_ROWS if args.quick else ROWS, QUICK_WORK if args.quick else WORK, reps, device, dtype)
    if args.elementwise or both:
        passes(QUICK_NUMELS if args.quick else NUMELS, reps, device)
    if (args.graphed or both) and device.type == "cuda":
        graphed_steps(ROWS, args.rounds, device)
    elif args.graphed:
        print("--graphed: whole steps with CUDA graphs need CUDA")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
