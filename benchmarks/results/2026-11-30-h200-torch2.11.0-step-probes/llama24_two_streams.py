"""llama24 orthogonalizations only: serial vs two streams (eager, deferred checks), Gram NS, Triton on."""
import sys, statistics, collections, torch
sys.path.insert(0, "benchmarks")
import gpu_step, optimizers
from optimizers import symmetric, elementwise, gram_newton_schulz as gram
from optimizers.algorithms.muon import orthogonalize_group
from optimizers.matrix_view import as_matrices
symmetric.TRITON = elementwise.TRITON = True
shapes = collections.Counter(gpu_step.SETS["llama24"](1.0))
group = dict(orthogonalizer="gram_newton_schulz", ns_steps=None, eps=1e-7, compute_dtype=torch.bfloat16,
             ns_coefficients=None, gram_restarts=(2,))
stacks = [torch.randn((n,) + s, device="cuda") for s, n in shapes.items()]
stacks.sort(key=lambda x: -x.numel())
print([tuple(x.shape) for x in stacks])
def ev(fn, n=5):
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b))
    return statistics.median(out), out
streams = [torch.cuda.Stream() for _ in range(2)]
def serial():
    with gram.deferred_checks():
        for x in stacks: orthogonalize_group(x, group, torch.float16)
def two():
    main = torch.cuda.current_stream()
    with gram.deferred_checks():
        for i, x in enumerate(stacks):
            s = streams[0] if i == 0 else streams[1]
            s.wait_stream(main)
            with torch.cuda.stream(s): orthogonalize_group(x, group, torch.float16)
    for s in streams: main.wait_stream(s)
serial(); two(); torch.cuda.synchronize()
for name, fn in [("serial", serial), ("two streams", two), ("serial", serial), ("two streams", two)]:
    m, t = ev(fn)
    print(f"{name}: median {m:.1f} ms  ({' '.join(f'{x:.1f}' for x in t)})")
