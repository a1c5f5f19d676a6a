"""Symmetric products of GPT-2/ConvNeXt sizes: cuBLAS (bmm / baddbmm, with its input copy) vs the Triton kernel's variants."""
import sys, statistics, torch
from optimizers import symmetric_triton as k
dev = "cuda"
def t(fn, n=50):
    for _ in range(5): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts) * 1e3
variants = sys.argv[1].split(",") if len(sys.argv) > 1 else ["base", "tma"]
print("| shape | kind | cuBLAS us | " + " | ".join(f"{v} us" for v in variants) + " |")
for dt in (torch.float16, torch.bfloat16):
  for (b, m, kk) in [(12, 768, 2304), (12, 768, 3072), (12, 768, 768), (12, 512, 2048), (9, 384, 1536), (3, 768, 3072), (24, 1024, 4096), (12, 1536, 4096)]:
    x = torch.randn(b, m, kk, device=dev, dtype=dt) / kk**0.5
    r = torch.bmm(x, x.mT)
    for kind in ("gram", "poly"):
        if kind == "gram":
            cub = lambda: torch.bmm(x, x.mT)
            tri = [lambda v=v: k.symmetric_baddbmm(None, x, x.mT, 0.0, 1.0, variant=v) for v in variants]
        else:
            cub = lambda: torch.baddbmm(r, r, r, beta=-2.0, alpha=1.5)
            tri = [lambda v=v: k.symmetric_baddbmm(r, r, r, -2.0, 1.5, variant=v) for v in variants]
        row = [t(cub)]
        for f in tri:
            try: row.append(t(f))
            except Exception as exc: row.append(float("nan")); print("fail", type(exc).__name__, str(exc)[:100])
        print(f"| {dt} {b}x{m}x{kk if kind=='gram' else m} | {kind} | " + " | ".join(f"{v:.1f}" for v in row) + " |", flush=True)
