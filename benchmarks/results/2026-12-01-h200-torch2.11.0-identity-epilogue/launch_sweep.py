"""Launches of the symmetric kernel (this stop's epilogue) on the 24-layer step's stacks: (TILE_K, warps, stages),
medians of 5 calls, 4 rounds interleaved in rotating order; the ratio is against the default (64, 4, 4)."""
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, ".")
from optimizers import symmetric_triton as st  # noqa: E402

LAUNCHES = [(64, 4, 4), (128, 4, 3), (64, 4, 5), (64, 8, 4), (128, 8, 3), (64, 4, 3)]


def ms(fn, reps=5):
    fn(); torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
    return statistics.median(t)


torch.manual_seed(0)
for label, batch, m, k, kind in [("X Xt 96x4096x4096", 96, 4096, 4096, "gram"),
                                  ("X Xt 48x4096x11008", 48, 4096, 11008, "gram"),
                                  ("X Xt 24x4096x11008, X by columns", 24, 4096, 11008, "gram-t"),
                                  ("aI + bA + cA.A 96x4096x4096", 96, 4096, 4096, "identity"),
                                  ("R W 72x4096x4096", 72, 4096, 4096, "product")]:
    if kind == "gram-t":
        x = (torch.randn(batch, k, m, device="cuda") / (m ** 0.5 + k ** 0.5)).to(torch.float16).mT
    else:
        x = (torch.randn(batch, m, k, device="cuda") / (m ** 0.5 + k ** 0.5)).to(torch.float16)
    if kind in ("identity", "product"):
        x = torch.bmm(x, x.mT); x = (x + x.mT) / 2
        args, kw = ((x, x, x, -4.775, 2.0315), {"identity": 3.4445}) if kind == "identity" else ((None, x, x), {})
    else:
        args, kw = (None, x, x.mT), {}
    times = defaultdict(list)
    for rnd in range(4):
        order = LAUNCHES[rnd % len(LAUNCHES):] + LAUNCHES[:rnd % len(LAUNCHES)]
        for tk, w, s in order:
            times[(tk, w, s)].append(ms(lambda: st.symmetric_baddbmm(*args, tile_k=tk, warps=w, stages=s, **kw)))
    base = statistics.median(times[LAUNCHES[0]])
    print(f"== {label} (fp16)")
    for launch in sorted(LAUNCHES, key=lambda c: statistics.median(times[c])):
        t = statistics.median(times[launch])
        print(f"  tk={launch[0]:3d} w={launch[1]} s={launch[2]}: {t:7.2f} ms  x{base / t:.3f}  rounds {[round(v, 2) for v in times[launch]]}")
    del x, args
