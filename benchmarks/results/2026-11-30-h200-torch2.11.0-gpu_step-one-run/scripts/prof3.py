"""llama24 and GPT-2 steps of ours' fastest configuration with kernel shapes: per-kernel CUDA time."""
import sys, collections, torch
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import symmetric, symmetric_triton, elementwise
from torch.profiler import profile, ProfilerActivity
name, *launch = sys.argv[1].split(":")
symmetric_triton.VARIANT = name
if launch:
    import dataclasses; symmetric_triton.VARIANTS[name] = dataclasses.replace(symmetric_triton.VARIANTS[name], warps=int(launch[0]), stages=int(launch[1]))
symmetric.TRITON_ROWS = int(sys.argv[2])
for set_name, opts in [("llama24", {}), ("gpt2_small", {"cuda_graphs": True})]:
    symmetric.TRITON = elementwise.TRITON = True
    ps = gpu_step.make_params(gpu_step.SETS[set_name](1.0), torch.device("cuda"))
    opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz", **opts)
    for _ in range(3): opt.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        opt.step(); torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"===== {set_name} {sys.argv[1:]}: {len(evs)} kernels, {sum(e.device_time for e in evs) / 1e3:.2f} ms summed")
    by, n = collections.Counter(), collections.Counter()
    for e in evs:
        by[e.name[:70]] += e.device_time / 1e3; n[e.name[:70]] += 1
    for k, v in by.most_common(16):
        print(f"{v:9.3f} ms {n[k]:5d}x  {k}")
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=40, max_shapes_column_width=70))
    del opt, ps; torch.cuda.empty_cache()
