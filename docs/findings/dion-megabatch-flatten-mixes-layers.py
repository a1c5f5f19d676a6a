"""microsoft/dion (commit 0a059a4): Muon(flatten=True) orthogonalizes a megabatch of same-shape
parameters as ONE matrix. With N > 1 parameters of one shape on a single device,
`muon_update_newton_schulz` receives the stacked [N, *shape] tensor and flattens it with
`X.flatten(start_dim=1)` into [N, prod(shape)], so every parameter's update depends on the others.
A parameter stepped next to another must step exactly as it does alone; here it does not.
The same holds for 2-D weights with flatten=True, and on the distributed path, whose per-rank
stacks go through the same call (even a single parameter under Shard(1) becomes one row).
Needs only torch and dion. Prints the relative difference and exits 1 when the defect shows.
"""

import sys

import torch

import dion

torch.compiler.set_stance("force_eager")  # the defect is the same compiled; eager avoids compile time


def step(weights: list[torch.Tensor], grads: list[torch.Tensor]) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    opt = dion.Muon(params, lr=0.02, mu=0.95, weight_decay=0.0, flatten=True)
    for p, g in zip(params, grads):
        p.grad = g.clone()
    opt.step()
    return [p.detach() for p in params]


torch.manual_seed(0)
weights = [torch.randn(8, 4, 3, 3) * 0.02 for _ in range(2)]  # two conv kernels of one shape
grads = [torch.randn(8, 4, 3, 3) for _ in range(2)]
together = step(weights, grads)[0]
alone = step(weights[:1], grads[:1])[0]
rel = ((together - alone).norm() / (alone - weights[0]).norm()).item()
print(f"update of parameter 0 stepped with a second parameter vs alone: relative difference {rel:.3g}")
sys.exit(1 if rel > 0.05 else 0)
