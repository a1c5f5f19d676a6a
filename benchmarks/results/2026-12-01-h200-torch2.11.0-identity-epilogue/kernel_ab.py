"""The symmetric kernel's epilogue before (every tile transposed in registers, for the diagonal tiles' mirror;
every tile stored twice) and after (only diagonal tiles transpose, and are stored once): each stack of the
24-layer step, then the 24-layer step itself (Gram NS + Triton + fused elementwise), rounds interleaved.
The "before" module is the committed kernel of 963170c, carried as .devcarry/old_symmetric_triton.py."""
import importlib.util
import statistics
import sys
from collections import defaultdict

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import gpu_step  # noqa: E402
import optimizers  # noqa: E402
from optimizers import elementwise, symmetric, symmetric_triton as new  # noqa: E402

spec = importlib.util.spec_from_file_location("old_symmetric_triton", ".devcarry/old_symmetric_triton.py")
old = sys.modules["old_symmetric_triton"] = importlib.util.module_from_spec(spec)  # dataclasses look it up
spec.loader.exec_module(old)
KERNELS = {"before": old, "after": new}


def ms(fn, reps=7):
    fn(); torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); t.append(s.elapsed_time(e))
    return statistics.median(t)


torch.manual_seed(0)
for label, batch, m, k, kind in [("X Xt 96x4096x4096", 96, 4096, 4096, "gram"),
                                  ("X Xt 36x4096x11008, X by columns", 36, 4096, 11008, "gram-t"),
                                  ("A + A.A 96x4096x4096", 96, 4096, 4096, "poly"),
                                  ("aI + bR + cR.R 72x4096x4096", 72, 4096, 4096, "identity")]:
    if kind == "gram-t":
        x = (torch.randn(batch, k, m, device="cuda") / (m ** 0.5 + k ** 0.5)).to(torch.bfloat16).mT
    else:
        x = (torch.randn(batch, m, k, device="cuda") / (m ** 0.5 + k ** 0.5)).to(torch.bfloat16)
    if kind in ("poly", "identity"):
        x = torch.bmm(x, x.mT); x = (x + x.mT) / 2
        args, kw = (x, x, x, -4.775, 2.0315), ({"identity": 3.4445} if kind == "identity" else {})
    else:
        args, kw = (None, x, x.mT), {}
    full = 2.0 * batch * m * m * k
    computed = full * len(new.pair_list(m // new.TILE)) * new.TILE ** 2 / m ** 2
    times = defaultdict(list)
    for rnd in range(4):
        for name in (("before", "after") if rnd % 2 == 0 else ("after", "before")):
            times[name].append(ms(lambda: KERNELS[name].symmetric_baddbmm(*args, **kw)))
    same = torch.equal(old.symmetric_baddbmm(*args, **kw), new.symmetric_baddbmm(*args, **kw))
    got = new.symmetric_baddbmm(*args, **kw)
    print(f"== {label}: same bits {same}, symmetric {torch.equal(got, got.mT)}")
    for name in ("before", "after"):
        t = statistics.median(times[name])
        print(f"  {name:7s} {t:8.2f} ms  {computed / t / 1e9:7.1f} TFLOP/s  rounds {[round(v, 2) for v in times[name]]}")
    print(f"  before / after: {statistics.median(times['before']) / statistics.median(times['after']):.4f}")
    del x, args, got

symmetric.TRITON = elementwise.TRITON = True
ps = gpu_step.make_params(gpu_step.SETS["llama24"](1.0), torch.device("cuda"))
opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz")
steps = defaultdict(list)
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for name in (("before", "after") if rnd % 2 == 0 else ("after", "before")):
        symmetric.triton_kernel = lambda mod=KERNELS[name]: mod
        for _ in range(2):
            opt.step()
        for _ in range(4):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); opt.step(); e.record(); torch.cuda.synchronize()
            steps[name].append(s.elapsed_time(e))
print("== 24-layer step, Gram NS + Triton + fused elementwise")
for name in ("before", "after"):
    t = steps[name]
    print(f"  {name:7s} median {statistics.median(t):.2f} ms (n={len(t)}, min {min(t):.2f}, max {max(t):.2f})")
print(f"  before / after: {statistics.median(steps['before']) / statistics.median(steps['after']):.4f}")
print("products by module:", old.STATS.products, new.STATS.products)
