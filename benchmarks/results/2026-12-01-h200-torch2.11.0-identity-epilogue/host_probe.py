"""Host work of the 24-layer step (Gram NS + Triton + fused elementwise): cProfile of one step after warm-up,
the functions by own time and by cumulative time (the waits on the divergence flags show as `item`/`__bool__`)."""
import cProfile
import io
import pstats
import sys

import torch

sys.path.insert(0, "benchmarks")
import gpu_step  # noqa: E402
import optimizers  # noqa: E402
from optimizers import elementwise, symmetric  # noqa: E402

symmetric.TRITON = elementwise.TRITON = True
ps = gpu_step.make_params(gpu_step.SETS["llama24"](1.0), torch.device("cuda"))
opt = optimizers.Muon(ps, flatten=True, orthogonalizer="gram_newton_schulz")
for _ in range(4):
    opt.step()
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
opt.step()
prof.disable()
torch.cuda.synchronize()
for key in ("tottime", "cumulative"):
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(key).print_stats(35)
    print(f"===== by {key}")
    print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:9000])
