"""24-layer step, Gram NS + Triton + fused elementwise, three modes interleaved on one optimizer:
  - "before": each megabatch's Gram flag read at once, megabatches in plan order, the normaliser's norm
    formed by its own pass, the "tma" kernel (the behaviour of af77bd9, restored by monkeypatching);
  - "both": flags read one megabatch later and the norms from the momentum launch, "tma";
  - "both+persistent": the same with the persistent kernel (symmetric_triton.VARIANTS["persistent"]).
Then one profiled step of each: idle GPU and the kernels' sums by name."""
import dataclasses
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, "benchmarks")
import gpu_step  # noqa: E402
import optimizers  # noqa: E402
from optimizers import elementwise, plan, symmetric, symmetric_triton  # noqa: E402

symmetric.TRITON = elementwise.TRITON = True
SHIPPED = (plan.Pending, plan.run_order, plan.takes_norms)


@dataclasses.dataclass
class AtOnce(plan.Pending):
    """Reads its flag and applies as it is made; its later `settle` does nothing."""

    def __post_init__(self):
        super().__post_init__()
        SHIPPED[0].settle(self)

    def settle(self):
        pass


def mode(name: str) -> None:
    pending, order, norms = SHIPPED
    if name == "before":
        pending, order = AtOnce, (lambda p: list(range(len(p.megabatches))))
        norms = lambda group, member: False  # noqa: E731
    plan.Pending, plan.run_order, plan.takes_norms = pending, order, norms
    symmetric_triton.VARIANT = "persistent" if name.endswith("persistent") else "tma"


def profiled(opt, label):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        with torch.profiler.record_function("timed_step"):
            opt.step()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = sorted((ev for ev in events if ev.device_type == torch.autograd.DeviceType.CUDA
                      and not ev.name.startswith(("timed_step", "Optimizer.step"))), key=lambda ev: ev.time_range.start)
    step = [ev for ev in events if ev.name == "timed_step" and ev.device_type == torch.autograd.DeviceType.CPU][0]
    busy = sum(ev.time_range.end - ev.time_range.start for ev in kernels) / 1e3
    first, last = kernels[0].time_range.start, max(ev.time_range.end for ev in kernels)
    between = []
    for prev, nxt in zip(kernels, kernels[1:]):
        g = nxt.time_range.start - prev.time_range.end
        if g > 0:
            between.append((g / 1e3, nxt.name[:50], prev.name[:40]))
    print(f"== {label}: host step {(step.time_range.end - step.time_range.start) / 1e3:.2f} ms; kernels {len(kernels)} "
          f"busy {busy:.2f} ms; first kernel {(first - step.time_range.start) / 1e3:.2f} ms after the step began; "
          f"span {(last - first) / 1e3:.2f} ms; idle between {sum(g for g, _, _ in between):.2f} ms")
    for g, name, prev in sorted(between, reverse=True)[:3]:
        print(f"   gap {g:7.3f} ms before {name} (after {prev})")
    sums = defaultdict(lambda: [0.0, 0])
    for ev in kernels:
        sums[ev.name[:60]][0] += (ev.time_range.end - ev.time_range.start) / 1e3
        sums[ev.name[:60]][1] += 1
    for k, (ms, n) in sorted(sums.items(), key=lambda kv: -kv[1][0])[:9]:
        print(f"  {ms:9.3f} ms {n:4d}x  {k}")


MODES = ("before", "both", "both+persistent")
ps = gpu_step.make_params(gpu_step.SETS["llama24"](1.0), torch.device("cuda"))
opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz")
times = defaultdict(list)
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for name in (MODES if rnd % 2 == 0 else MODES[::-1]):
        mode(name)
        for _ in range(2):
            opt.step()
        for _ in range(4):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); opt.step(); e.record(); torch.cuda.synchronize()
            times[name].append(s.elapsed_time(e))
for name in MODES:
    t = times[name]
    print(f"{name:16s}: median {statistics.median(t):.2f} ms (n={len(t)}, min {min(t):.2f}, max {max(t):.2f}); "
          f"before / {name} {statistics.median(times['before']) / statistics.median(t):.4f}")
print("Gram NS:", optimizers.gram_newton_schulz.STATS, "kernel variants:", symmetric_triton.STATS.variants)
for name in MODES:
    mode(name)
    opt.step()
    profiled(opt, name)
