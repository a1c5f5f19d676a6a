"""Where the 24-layer step (Gram NS + Triton + fused elementwise) leaves the GPU idle: one profiled step's
kernels against its wall interval (CUDA events), the idle time before the first kernel, between kernels
(the largest gaps named by the kernel after them) and after the last."""
import statistics
import sys

import torch

sys.path.insert(0, "benchmarks")
import gpu_step  # noqa: E402
import optimizers  # noqa: E402
from optimizers import elementwise, symmetric  # noqa: E402

symmetric.TRITON = elementwise.TRITON = True
ps = gpu_step.make_params(gpu_step.SETS["llama24"](1.0), torch.device("cuda"))
opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz")
for _ in range(4):
    opt.step()
torch.cuda.synchronize()
t = []
for _ in range(6):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); opt.step(); e.record(); torch.cuda.synchronize(); t.append(s.elapsed_time(e))
print(f"steps ms: {[round(x, 2) for x in t]}, median {statistics.median(t):.2f}")
for rep in range(2):
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
    gaps = []
    for prev, nxt in zip(kernels, kernels[1:]):
        g = nxt.time_range.start - prev.time_range.end
        if g > 0:
            gaps.append((g / 1e3, nxt.name[:50], prev.name[:40]))
    print(f"== profiled step {rep}: host step {(step.time_range.end - step.time_range.start) / 1e3:.2f} ms; "
          f"kernels {len(kernels)} busy {busy:.2f} ms; first kernel {(first - step.time_range.start) / 1e3:.2f} ms "
          f"after the step began; kernels span {(last - first) / 1e3:.2f} ms; idle between {sum(g for g, _, _ in gaps):.2f} ms")
    for g, name, prev in sorted(gaps, reverse=True)[:8]:
        print(f"   gap {g:7.3f} ms before {name} (after {prev})")
