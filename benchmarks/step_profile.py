"""Where one `Muon.step()`'s GPU time goes: its kernels by kind, from torch.profiler, beside the step's time.

    python benchmarks/step_profile.py [--set llama24] [--orthogonalizer polar_express] [--option cuda_graphs=false]
                                      [--steps 3] [--warmup 3] [--top 12] [--scale 1]

Builds the set's parameters as benchmarks/gpu_step.py does (fp32, N(0, 1), seed 0) and our Muon as its rows do
(flatten=True, the orthogonalizer, each `--option NAME=VALUE`: true, false, none, bf16, fp16, fp32 or a number),
takes `--warmup` steps, times `--steps` steps by CUDA events, then profiles `--steps` more. Prints the step's
median ms against its summed kernel ms (the difference: the GPU idle between kernels, launch and host overhead);
per kind (KINDS: the symmetric-product kernel, our fused elementwise kernels, cuBLAS products, the rest) the
kernel ms per step, its share and launches per step; then the `--top` kernels by time, and the `--top` ATen ops
(with their input shapes) by their kernels' time. CUDA only.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_step  # noqa: E402
import optimizers  # noqa: E402

KINDS = (
    ("symmetric kernel", ("_upper_tiles",), ()),
    ("fused elementwise", ("_momentum", "_apply", "_divide", "_scaled_cast"), ()),
    ("cuBLAS product", (), ("gemm", "nvjet", "xmma", "cutlass", "cublas")),
)
"""Kinds of kernel: (label, prefixes of our Triton kernels' names, substrings of a library kernel's lower-cased
name); the first kind that matches. Any other kernel is "other" (torch's elementwise passes, reductions, copies)."""


def kind(name: str) -> str:
    """The kind (KINDS) of the kernel named `name`, else "other"."""
    for label, prefixes, parts in KINDS:
        if name.startswith(prefixes) or any(p in name.lower() for p in parts):
            return label
    return "other"


def option(text: str) -> tuple[str, object]:
    """`NAME=VALUE` as (name, value): true/false/none as bool/None, bf16/fp16/fp32 as torch dtypes, a number as int
    or float, else the string."""
    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"--option takes NAME=VALUE, got {text!r}")
    words = {"true": True, "false": False, "none": None, "bf16": torch.bfloat16, "fp16": torch.float16,
             "fp32": torch.float32}
    if raw.lower() in words:
        return name, words[raw.lower()]
    for cast in (int, float):
        try:
            return name, cast(raw)
        except ValueError:
            pass
    return name, raw


def kernel_times(prof: profile) -> dict[str, tuple[float, int]]:
    """Per kernel name: (total device µs, launches) over the profiled region (the device-side spans of user
    annotations, such as the step's own `Optimizer.step#...`, are not kernels)."""
    out: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            out[e.name][0] += e.time_range.elapsed_us()
            out[e.name][1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def op_times(prof: profile) -> dict[tuple[str, str], tuple[float, int]]:
    """Per (ATen op, its input shapes) that launched kernels itself: (its kernels' total device µs, launches)."""
    out: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CPU and e.kernels:
            key = (e.name, str(e.input_shapes))
            out[key][0] += sum(k.duration for k in e.kernels)
            out[key][1] += len(e.kernels)
    return {k: (v[0], v[1]) for k, v in out.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="llama24", choices=sorted(gpu_step.SETS))
    p.add_argument("--orthogonalizer", default="polar_express")
    p.add_argument("--option", type=option, action="append", default=[])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--scale", type=float, default=1.0)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("step_profile.py profiles CUDA kernels: no CUDA device")
    device = torch.device("cuda")
    params = gpu_step.make_params(gpu_step.SETS[args.set](args.scale), device)
    opt = optimizers.Muon(params, flatten=True, orthogonalizer=args.orthogonalizer, **dict(args.option))
    label = f"{args.set}, {args.orthogonalizer}" + "".join(f", {k}={v}" for k, v in args.option)
    step_ms = statistics.median(gpu_step._times_ms(opt.step, args.warmup, args.steps, device))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(args.steps):
            opt.step()
        torch.cuda.synchronize(device)
    times = kernel_times(prof)
    by_kind: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for name, (us, n) in times.items():
        by_kind[kind(name)][0] += us
        by_kind[kind(name)][1] += n
    total = sum(us for us, _ in times.values()) / 1e3 / args.steps
    print(f"## {label}: step {step_ms:.2f} ms (median of {args.steps}), kernels {total:.2f} ms, "
          f"between kernels {step_ms - total:.2f} ms")
    print("| kind | ms/step | share | launches/step |\n|---|---:|---:|---:|")
    for name, (us, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        ms = us / 1e3 / args.steps
        print(f"| {name} | {ms:.2f} | {ms / total:.1%} | {n / args.steps:g} |")
    print("\n| kernel | kind | ms/step | launches/step |\n|---|---|---:|---:|")
    for name, (us, n) in sorted(times.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"| {name[:90]} | {kind(name)} | {us / 1e3 / args.steps:.2f} | {n / args.steps:g} |")
    print("\n| op | input shapes | ms/step | launches/step |\n|---|---|---:|---:|")
    for (name, shapes), (us, n) in sorted(op_times(prof).items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"| {name} | {shapes[:120]} | {us / 1e3 / args.steps:.2f} | {n / args.steps:g} |")
    print(flush=True)


if __name__ == "__main__":
    main()
