"""Count the kernels one `Muon.step()` launches, by op, with torch.profiler on CPU (no GPU needed).

The CPU step runs the same ATen ops in the same order as the CUDA step, so the count of ops that do
work is the count of kernels a CUDA step launches, give or take (on CUDA a baddbmm adds a device copy
of its input, a reduction may take two kernels, a torch._foreach_* call takes one launch per ~100
tensors' chunk). Counted: an op under the step that does work, not descending into it; a view or
dispatch-only op (reshape, mT, to, matmul, ...) is looked through to the ops it runs.

    python benchmarks/step_kernels.py [--set gpt2_small] [--scale 0.1] [--orthogonalizer gram_newton_schulz]
                                      [--compute-dtype bf16] [--nesterov] [--weight-decay 0.0] [--by-op]

Prints `kernels N (top-level ops M)` and, with --by-op, one line per op name with its count.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_step  # noqa: E402
import optimizers  # noqa: E402

LOOKED_THROUGH = frozenset("aten::" + n for n in (
    "empty empty_like empty_strided view reshape _reshape_alias as_strided mT t transpose expand unbind select "
    "slice detach alias unsqueeze squeeze diagonal resolve_conj resolve_neg promote_types result_type is_nonzero "
    "item _local_scalar_dense to _to_copy lift_fresh set_ unflatten flatten permute contiguous matmul _unsafe_view "
    "narrow split chunk movedim").split())
"""Ops that launch no kernel themselves (views, metadata, dispatch to other ops): their children count."""

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def count(opt: torch.optim.Optimizer) -> tuple[collections.Counter, int]:
    """(kernel-launching ops of one `opt.step()` by name, number of top-level ATen ops), after two warm-up steps."""
    for _ in range(2):
        opt.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        opt.step()
    events = [e for e in prof.events() if e.name.startswith("aten::")]
    children: dict[int, list] = collections.defaultdict(list)
    roots = []
    for e in events:
        parent = e.cpu_parent
        if parent is not None and parent.name.startswith("Optimizer.step"):
            roots.append(e)
        elif parent is not None:
            children[id(parent)].append(e)
    kernels: collections.Counter = collections.Counter()

    def walk(e) -> None:
        if e.name in LOOKED_THROUGH:
            for child in children[id(e)]:
                walk(child)
        else:
            kernels[e.name] += 1
    for root in roots:
        walk(root)
    return kernels, len(roots)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", default="gpt2_small", choices=sorted(gpu_step.SETS))
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--orthogonalizer", default="gram_newton_schulz")
    parser.add_argument("--compute-dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--nesterov", action="store_true")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--by-op", action="store_true")
    args = parser.parse_args(argv)
    params = gpu_step.make_params(gpu_step.SETS[args.set](args.scale), torch.device("cpu"))
    opt = optimizers.Muon(params, flatten=True, orthogonalizer=args.orthogonalizer, nesterov=args.nesterov,
                          weight_decay=args.weight_decay, compute_dtype=DTYPES[args.compute_dtype])
    kernels, top = count(opt)
    print(f"{args.set} x{args.scale} {args.orthogonalizer} {args.compute_dtype}: kernels {sum(kernels.values())} "
          f"(top-level ops {top})")
    if args.by_op:
        for name, n in kernels.most_common():
            print(f"  {n:5d} {name}")


if __name__ == "__main__":
    main()
