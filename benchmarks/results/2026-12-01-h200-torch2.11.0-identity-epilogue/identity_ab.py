"""24-layer step, Gram NS + Triton + fused elementwise: W = aI + bA + cA² formed by the kernel's epilogue
(this stop) against the published form (aX + BX by baddbmm, Q Z + aQ, ...), interleaved rounds on one
optimizer, then one profiled step of each (kernel sums by name)."""
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, "benchmarks")
import gpu_step  # noqa: E402
import optimizers  # noqa: E402
from optimizers import elementwise, gram_newton_schulz, symmetric  # noqa: E402

symmetric.TRITON = elementwise.TRITON = True
FUSED = symmetric.adds_identity


def mode(fused: bool) -> None:
    fn = FUSED if fused else (lambda a: False)
    symmetric.adds_identity = gram_newton_schulz.adds_identity = fn


ps = gpu_step.make_params(gpu_step.SETS["llama24"](1.0), torch.device("cuda"))
opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz")
times = defaultdict(list)
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for fused in ((True, False) if rnd % 2 == 0 else (False, True)):
        mode(fused)
        for _ in range(2):
            opt.step()
        for _ in range(4):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); opt.step(); e.record(); torch.cuda.synchronize()
            times[fused].append(s.elapsed_time(e))
for fused in (False, True):
    t = times[fused]
    print(f"{'W by the epilogue' if fused else 'published form   '}: median {statistics.median(t):.2f} ms "
          f"(n={len(t)}, min {min(t):.2f}, max {max(t):.2f})")
print(f"ratio published / epilogue: {statistics.median(times[False]) / statistics.median(times[True]):.4f}")
print("Gram NS:", gram_newton_schulz.STATS)
for fused in (False, True):
    mode(fused)
    opt.step(); torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        opt.step(); torch.cuda.synchronize()
    sums = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            sums[ev.name[:60]][0] += ev.device_time_total / 1e3 if hasattr(ev, "device_time_total") else ev.cuda_time_total / 1e3
            sums[ev.name[:60]][1] += 1
    total = sum(v[0] for k, v in sums.items() if not k.startswith("Optimizer.step"))
    print(f"== {'epilogue' if fused else 'published'}: kernels sum {total:.2f} ms")
    for k, (ms, n) in sorted(sums.items(), key=lambda kv: -kv[1][0])[:14]:
        print(f"  {ms:9.3f} ms {n:4d}x  {k}")
