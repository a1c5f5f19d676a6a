"""24-layer step, Gram NS + Triton + fused elementwise: Gram divergence flags read one megabatch later, with
the checked megabatches first (optimizers/plan.py `Pending`, `run_order`: this stop) against reading each
megabatch's flags at once in plan order (the previous behaviour, restored here by monkeypatching),
interleaved rounds on one optimizer; then one profiled step of each: idle GPU before the first kernel and
between kernels."""
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, "benchmarks")
import gpu_step  # noqa: E402
import optimizers  # noqa: E402
from optimizers import elementwise, plan, symmetric  # noqa: E402

symmetric.TRITON = elementwise.TRITON = True
PIPELINED = (plan.Pending, plan.run_order)


class AtOnce(plan.Pending):
    """Settles as it is made (the flags read at once), and never again."""

    def __post_init__(self):
        plan.Pending.settle(self)

    def settle(self):
        pass


def mode(pipelined: bool) -> None:
    plan.Pending, plan.run_order = PIPELINED if pipelined else (AtOnce, lambda p: list(range(len(p.megabatches))))


def gaps(opt, label):
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
    for g, name, prev in sorted(between, reverse=True)[:4]:
        print(f"   gap {g:7.3f} ms before {name} (after {prev})")


ps = gpu_step.make_params(gpu_step.SETS["llama24"](1.0), torch.device("cuda"))
opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz")
times = defaultdict(list)
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for pipelined in ((True, False) if rnd % 2 == 0 else (False, True)):
        mode(pipelined)
        for _ in range(2):
            opt.step()
        for _ in range(4):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); opt.step(); e.record(); torch.cuda.synchronize()
            times[pipelined].append(s.elapsed_time(e))
for pipelined in (False, True):
    t = times[pipelined]
    print(f"{'flags read one megabatch later' if pipelined else 'flags read at once           '}: median "
          f"{statistics.median(t):.2f} ms (n={len(t)}, min {min(t):.2f}, max {max(t):.2f})")
print(f"ratio at once / later: {statistics.median(times[False]) / statistics.median(times[True]):.4f}")
print("Gram NS:", optimizers.gram_newton_schulz.STATS)
for pipelined in (False, True):
    mode(pipelined)
    opt.step()
    for rep in range(2):
        gaps(opt, f"{'later' if pipelined else 'at once'} #{rep}")
