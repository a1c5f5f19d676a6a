"""Accuracy of Gram Newton–Schulz against the FP64 spectral map, next to the standard iteration.

For each coefficient schedule, compute dtype, restart schedule and test spectrum, prints the
worst normwise relative error ||X - f(G)|| / ||f(G)|| over the aspect ratios (1 to 16), where f is
the exact spectral map of the same schedule (oracles.spectral_map), and the same for the standard
iteration in the same dtype. A row where Gram NS without restarts is more than LOSS times worse than
the standard iteration is marked "restart matters"; one where even the published restart schedule
is, "LOSES ACCURACY with the published restarts".

Asked for bf16, Gram NS iterates in fp16 (optimizers/gram_newton_schulz.py HALF_ITERATES), so its "bf16"
rows show that; the rows "bf16 iterated in bf16" show the iteration as it was before (HALF_ITERATES
emptied), with its standard column in bf16 too. The low-rank finding behind HALF_ITERATES shows on
small matrices: `--sizes 4x5,8x12,12x20`.

`--device cuda --triton` runs both iterations with the Triton kernels fused=None takes on CUDA
(optimizers/kernels.py): from symmetric.TRITON_ROWS rows (e.g. `--sizes 2048x4096,2048x2048`) and in bf16/fp16
their symmetric products run on the Triton kernel, which
forms each step's polynomial aI + bA + cA² in one rounding (optimizers/symmetric.py `polynomial_product`);
without `--triton` the same rows run the published form. The closing line counts the kernel's products.

    python benchmarks/gram_ns_accuracy.py [--sizes 64x64,64x128,32x512,16x256] [--seed 0] [--device cpu]
                                          [--triton] [--dtypes fp16,bf16] [--schedules polar_express]
"""

from __future__ import annotations

import argparse
import contextlib
import time
import warnings
from unittest import mock

import numpy as np
import torch

from optimizers.coefficients import normaliser_scale, schedule
from optimizers import gram_newton_schulz as gram
from optimizers.counters import Stats, counting
from optimizers.gram_newton_schulz import RESTARTS, gram_newton_schulz, normalised, standard_steps
from optimizers.kernels import TORCH, Kernels, available
from oracles import Orthogonalizer, spectral_map

SPECTRA = {
    "gaussian": None,
    "cond 1e2": lambda k: np.logspace(0, -2, k),
    "cond 1e4": lambda k: np.logspace(0, -4, k),
    "cond 1e6": lambda k: np.logspace(0, -6, k),
    "clustered near 0": lambda k: np.r_[1.0, np.full(k - 1, 1e-3)],
    "rank-deficient": lambda k: np.r_[np.ones(k - k // 2), np.zeros(k // 2)],
    "low rank (harness)": lambda k: np.where(np.arange(k) < max(1, k // 8), 1.0, 1e-2),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
          "bf16 iterated in bf16": torch.bfloat16}
"""The last: Gram NS as it was before bf16 iterated in fp16 (HALF_ITERATES emptied while it runs)."""
RESTART_SCHEDULES = ((), RESTARTS, (2, 4), (1, 2, 3, 4))
LOSS = 10.0
"""How many times the standard iteration's error counts as a loss of accuracy."""


def matrix(rng: np.random.Generator, m: int, n: int, spectrum) -> np.ndarray:
    if spectrum is None:
        return rng.standard_normal((m, n))
    k = min(m, n)
    u = np.linalg.qr(rng.standard_normal((m, k)))[0]
    v = np.linalg.qr(rng.standard_normal((n, k)))[0]
    return (u * spectrum(k)) @ v.T


def rel(x: torch.Tensor, ref: np.ndarray) -> float:
    out = x.double().cpu().numpy()
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref)) if np.all(np.isfinite(out)) else float("inf")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64x64,64x128,32x512,16x256")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--triton", action="store_true", help="symmetric products on the Triton kernel (CUDA)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma-separated, of {list(DTYPES)}")
    parser.add_argument("--schedules", default="polar_express,newton_schulz")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    device = torch.device(args.device)
    unknown = [name for name in args.dtypes.split(",") if name not in DTYPES]
    if unknown:
        parser.error(f"unknown --dtypes {unknown}: of {list(DTYPES)}")
    dtypes = {name: DTYPES[name] for name in args.dtypes.split(",")}
    if args.triton and (device.type != "cuda" or not available()):
        parser.error("--triton needs --device cuda and triton installed")
    chosen = Kernels(on=True) if args.triton else TORCH
    torch.set_num_threads(1)
    start = time.perf_counter()
    products = 0
    print(f"torch {torch.__version__}; sizes {args.sizes}; device {device}; Triton kernels {args.triton}; "
          "worst relative error over sizes (fallbacks / matrices)")
    print("| schedule | dtype | spectrum | standard | " + " | ".join(f"gram restarts {list(r)}" for r in
                                                              RESTART_SCHEDULES) + " | verdict |")
    print("|---" * (5 + len(RESTART_SCHEDULES)) + "|")
    for name in args.schedules.split(","):
        coefficients, scale = schedule(name, 5), normaliser_scale(name)
        normaliser = Orthogonalizer.named(name).normaliser
        for dtype_name, dtype in dtypes.items():
            for spectrum_name, spectrum in SPECTRA.items():
                rng = np.random.default_rng(args.seed)
                mats = [matrix(rng, m, n, spectrum) for m, n in sizes]
                refs = [spectral_map(g, coefficients, normaliser) for g in mats]
                with counting(Stats()) as stats:
                    std = max(rel(_standard(g, coefficients, scale, dtype, device, chosen), ref)
                              for g, ref in zip(mats, refs))
                products += stats.products
                cells, worst = [], {}
                for restarts in RESTART_SCHEDULES:
                    as_before = mock.patch.object(gram, "HALF_ITERATES", {}) if dtype_name.endswith(
                        "iterated in bf16") else contextlib.nullcontext()
                    with as_before, counting(Stats()) as stats, warnings.catch_warnings():
                        warnings.simplefilter("ignore", RuntimeWarning)  # the fallbacks are this table's cells
                        err = max(rel(gram_newton_schulz(torch.from_numpy(g)[None].to(device), coefficients, scale,
                                                         1e-7, dtype, restarts, kernels=chosen)[0], ref)
                                  for g, ref in zip(mats, refs))
                    products += stats.products
                    worst[restarts] = err
                    cells.append(f"{err:.1e} ({stats.fallbacks}/{stats.gram})")
                verdict = ""
                if worst[RESTARTS] > LOSS * std:
                    verdict = "LOSES ACCURACY with the published restarts"
                elif worst[()] > LOSS * std:
                    verdict = "restart matters"
                print(f"| {name} | {dtype_name} | {spectrum_name} | {std:.1e} | " + " | ".join(cells) + f" | {verdict} |")
    counted = f"; {products} products on the Triton kernel" if args.triton else ""
    print(f"\n{time.perf_counter() - start:.1f} s{counted}")


def _standard(g: np.ndarray, coefficients, scale: float, dtype: torch.dtype, device: torch.device,
              chosen: Kernels) -> torch.Tensor:
    x = torch.from_numpy(g)[None].to(device)
    tall = x.size(-2) > x.size(-1)
    wide = normalised(x.mT if tall else x, scale, 1e-7, dtype, kernels=chosen)
    out = standard_steps(wide, coefficients, chosen)
    return (out.mT if tall else out)[0]


if __name__ == "__main__":
    main()
