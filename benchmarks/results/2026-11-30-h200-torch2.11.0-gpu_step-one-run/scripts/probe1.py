"""Call 1 probe: (a) how well memory-bound passes overlap the compute-bound products on a side stream;
(b) a sweep of the TMA kernel's group size and TILE_K on the 24-layer stacks."""
import dataclasses, statistics, sys, torch
from optimizers import symmetric_triton as st, elementwise_triton as et
dev = torch.device("cuda")
def t_ms(fn, reps=5):
    fn(); torch.cuda.synchronize(); out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out)
side = torch.cuda.Stream()
def both(compute, memory):
    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        compute()
        with torch.cuda.stream(side):
            memory()
        main.wait_stream(side)
    return run
g = torch.Generator(device=dev).manual_seed(0)
x = torch.randn(96, 4096, 4096, device=dev, dtype=torch.bfloat16, generator=g) / 90
a = st.symmetric_baddbmm(None, x, x.mT)
bufs = [torch.randn(4096, 4096, device=dev, generator=g) for _ in range(96)]
grads = [torch.randn(4096, 4096, device=dev, generator=g) for _ in range(96)]
params = [torch.randn(4096, 4096, device=dev, generator=g) for _ in range(96)]
out = torch.empty_like(x)
compute = {
    "triton poly 96x4096": lambda: st.symmetric_baddbmm(a, a, a, -4.7, 2.0),
    "triton XXt 96x4096": lambda: st.symmetric_baddbmm(None, x, x.mT),
    "cuBLAS bmm 96x4096": lambda: torch.bmm(a, x),
}
memory = {
    "momentum 1.6G fp32": lambda: et.momentum_(bufs, grads, 0.95),
    "copy 96x4096 bf16": lambda: out.copy_(x),
    "apply 1.6G fp32 <- bf16": lambda: et.apply_(params, x, 0.999, -0.01),
}
print("| compute | memory | compute ms | memory ms | sum | together | hidden % of memory |")
for cn, cf in compute.items():
    tc = t_ms(cf)
    for mn, mf in memory.items():
        tm = t_ms(mf); tb = t_ms(both(cf, mf))
        print(f"| {cn} | {mn} | {tc:.2f} | {tm:.2f} | {tc+tm:.2f} | {tb:.2f} | {100*(tc+tm-tb)/tm:.0f} |", flush=True)
del bufs, grads, params, out; torch.cuda.empty_cache()
# (b) sweep
shapes = [("XXt 96x4096x4096", 96, 4096, 4096, "gram"), ("XXt 72x4096x11008", 72, 4096, 11008, "gram"),
          ("poly 72x4096x4096", 72, 4096, 4096, "poly")]
configs = [("tma", 64, 4, 4, 8), ("tma", 64, 4, 4, 4), ("tma", 64, 4, 4, 16), ("tma", 64, 4, 4, 32),
           ("tma", 128, 4, 3, 8), ("tma", 128, 4, 2, 8), ("tma", 128, 8, 3, 8), ("tma", 64, 4, 5, 8), ("tma", 32, 4, 6, 8)]
for label, bt, m, k, kind in shapes:
    del x, a; torch.cuda.empty_cache()
    x = torch.randn(bt, m, k, device=dev, dtype=torch.bfloat16, generator=g) / 100
    a = st.symmetric_baddbmm(None, x, x.mT) if kind == "poly" else None
    ops = (None, x, x.mT) if kind == "gram" else (a, a, a)
    full = t_ms(lambda: torch.bmm(ops[1], ops[2]))
    print(f"== {label}: cuBLAS {full:.2f} ms", flush=True)
    for name, tk, w, s, grp in configs:
        key = f"sweep{grp}"
        st.VARIANTS[key] = dataclasses.replace(st.VARIANTS["tma"], group=grp)
        try:
            ms = t_ms(lambda: st.symmetric_baddbmm(*ops, -4.7 if kind == "poly" else 1.0, 2.0 if kind == "poly" else 1.0,
                                                   tile_k=tk, variant=key, warps=w, stages=s))
            print(f"  tk={tk} w={w} s={s} group={grp}: {ms:.2f} ms  x{full/ms:.3f}", flush=True)
        except Exception as e:
            print(f"  tk={tk} w={w} s={s} group={grp}: {type(e).__name__} {str(e).splitlines()[0][:100] if str(e) else ''}", flush=True)
