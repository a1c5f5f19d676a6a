"""Why does dion's Muon step the 24-layer set in ~150 ms? Param moves per shape, wall time, kernel profile."""
import sys, time, collections, torch
sys.path.insert(0, "benchmarks")
import gpu_step
from dion import Muon as DionMuon
from torch.profiler import profile, ProfilerActivity
torch._dynamo.config.recompile_limit = 100
dev = torch.device("cuda")
ps = gpu_step.make_params(gpu_step.llama24(1.0), dev)
firsts = {}
for i, p in enumerate(ps):
    firsts.setdefault(tuple(p.shape), []).append(i)
watch = [idx[0] for idx in firsts.values()] + [idx[-1] for idx in firsts.values()]
before = {i: ps[i].detach().clone() for i in watch}
opt = DionMuon(ps, flatten=True)
t = time.perf_counter(); opt.step(); torch.cuda.synchronize(); print(f"first step {time.perf_counter()-t:.1f} s", flush=True)
for i in watch:
    d = (ps[i].detach() - before[i]).float()
    print(f"param {i} {tuple(ps[i].shape)}: |dX| {d.norm():.4g}  nonzero {int((d != 0).sum())}/{d.numel()}  finite {bool(torch.isfinite(ps[i]).all())}", flush=True)
for _ in range(2):
    torch.cuda.synchronize(); t = time.perf_counter(); opt.step(); torch.cuda.synchronize(); print(f"step wall {1e3*(time.perf_counter()-t):.1f} ms", flush=True)
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    opt.step(); torch.cuda.synchronize()
evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
by, n = collections.Counter(), collections.Counter()
for e in evs:
    by[e.name[:90]] += e.device_time / 1e3; n[e.name[:90]] += 1
print(f"{len(evs)} kernels, {sum(by.values()):.1f} ms summed")
for k, v in by.most_common(14):
    print(f"{v:9.3f} ms {n[k]:5d}x  {k}")
