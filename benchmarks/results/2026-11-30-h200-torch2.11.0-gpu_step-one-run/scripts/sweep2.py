"""Careful sweep of the TMA kernel's (TILE_K, warps, stages) per product kind of the 24-layer step, interleaved rounds."""
import statistics, sys, time, torch
from optimizers import symmetric_triton as st
dev = torch.device("cuda")
def t_ms(fn, reps=3):
    fn(); torch.cuda.synchronize(); out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out)
g = torch.Generator(device=dev).manual_seed(0)
def stack(kind, bt, m, k):
    if kind == "gram":
        x = torch.randn(bt, m, k, device=dev, dtype=torch.float16, generator=g) / 100
        return (None, x, x.mT)
    if kind == "gram-t":
        x = torch.randn(bt, k, m, device=dev, dtype=torch.float16, generator=g).mT / 100
        return (None, x, x.mT)
    x = torch.randn(bt, m, m, device=dev, dtype=torch.float16, generator=g) / 100
    r = torch.bmm(x, x.mT); r = (r + r.mT) / 2
    return (r, r, r)
shapes = [("XXt 96x4096x4096 (squares)", "gram", 96, 4096, 4096), ("XXt 48x4096x11008 by columns (tall)", "gram-t", 48, 4096, 11008),
          ("XXt 24x4096x11008 (wide)", "gram", 24, 4096, 11008), ("aC + C·C 96x4096", "poly", 96, 4096, 4096),
          ("aC + C·C 48x4096", "poly", 48, 4096, 4096), ("aC + C·C 24x4096", "poly", 24, 4096, 4096)]
configs = [(64, 4, 4), (64, 4, 5), (64, 4, 6), (64, 8, 4), (64, 8, 5), (128, 4, 3), (128, 8, 3)]
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
for label, kind, bt, m, k in shapes:
    ops = stack(kind, bt, m, k)
    ab = (-4.7, 2.0) if kind == "poly" else (1.0, 1.0)
    res = {c: [] for c in configs}
    t0 = time.perf_counter()
    for c in configs:  # compile
        try:
            st.symmetric_baddbmm(*ops, *ab, tile_k=c[0], variant="tma", warps=c[1], stages=c[2])
        except Exception as e:
            print(f"  {c}: {type(e).__name__} {str(e).splitlines()[0][:100] if str(e) else ''}", flush=True); res.pop(c)
    for _ in range(rounds):
        for c in list(res):
            res[c].append(t_ms(lambda: st.symmetric_baddbmm(*ops, *ab, tile_k=c[0], variant="tma", warps=c[1], stages=c[2])))
    base = statistics.median(res[configs[0]])
    print(f"== {label} ({time.perf_counter()-t0:.0f} s)", flush=True)
    for c, ts in sorted(res.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  tk={c[0]:3d} w={c[1]} s={c[2]}: median {statistics.median(ts):.2f} ms  [{' '.join(f'{t:.2f}' for t in ts)}]  x{base/statistics.median(ts):.3f} of (64,4,4)", flush=True)
    del ops; torch.cuda.empty_cache()
