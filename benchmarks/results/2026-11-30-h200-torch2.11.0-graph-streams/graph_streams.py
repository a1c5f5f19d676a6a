"""Small sets: step median, host time per step, GPU kernel sum, and a multi-stream graph probe."""
import sys, time, statistics, collections, torch
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import symmetric, elementwise, gram_newton_schulz as gram
from optimizers.algorithms.muon import orthogonalize_group
from optimizers.matrix_view import as_matrices
from torch.profiler import profile, ProfilerActivity

def ev_times(fn, n):
    out = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); out.append(s.elapsed_time(e))
    return out

CFG = {"convnext_t": ("polar_express", False), "gpt2_small": ("gram_newton_schulz", True)}
for name in sys.argv[1].split(","):
    for orth in ("polar_express", "gram_newton_schulz"):
        fused = orth == "gram_newton_schulz"
        elementwise.TRITON = fused
        ps = gpu_step.make_params(gpu_step.SETS[name](1.0), torch.device("cuda"))
        opt = optimizers.Muon(ps, flatten=True, orthogonalizer=orth, cuda_graphs=True)
        for _ in range(5): opt.step()
        torch.cuda.synchronize()
        t = ev_times(opt.step, 30)
        host = []
        for _ in range(30):
            torch.cuda.synchronize(); t0 = time.perf_counter(); opt.step(); host.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            opt.step(); torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        ksum = sum(e.device_time for e in evs) / 1e3
        by = collections.Counter()
        for e in evs: by[e.name[:50]] += e.device_time / 1e3
        print(f"== {name} {orth} fusedelem={fused}: step median {statistics.median(t):.3f} ms (min {min(t):.3f}); host {statistics.median(host):.3f} ms; {len(evs)} kernels {ksum:.3f} ms summed")
        for k, v in by.most_common(8): print(f"     {v:7.3f} ms  {k}")
        group = opt.param_groups[0]
        shapes = collections.OrderedDict()
        for p in ps: shapes.setdefault(tuple(p.shape), []).append(p)
        stacks = [as_matrices(torch.stack([p.grad for p in v]), True).contiguous() for v in shapes.values()]
        stacks.sort(key=lambda x: -x.numel())
        print(f"   {len(stacks)} megabatches: " + ", ".join(f"{x.shape[0]}x{x.shape[1]}x{x.shape[2]}" for x in stacks))
        upd = lambda x: orthogonalize_group(x, group)
        for S in (1, 2, 4, 8):
            streams = [torch.cuda.Stream() for _ in range(S)]
            with gram.deferred_checks():
                for x in stacks: upd(x)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with gram.deferred_checks(), torch.cuda.graph(g):
                main = torch.cuda.current_stream(); outs = []
                for i, x in enumerate(stacks):
                    s = streams[i % S] if S > 1 else main
                    s.wait_stream(main)
                    with torch.cuda.stream(s): outs.append(upd(x))
                for s in streams[:len(stacks)] if S > 1 else []: main.wait_stream(s)
            for _ in range(3): g.replay()
            r = ev_times(g.replay, 40)
            print(f"   one graph, all megabatches, {S} streams: {statistics.median(r):.3f} ms")
            del g, outs
        del opt, ps; torch.cuda.empty_cache()
