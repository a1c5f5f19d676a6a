"""emerging-optimizers 0.3.0: Muon.step() refuses a bf16 (or any non-fp32) parameter and any parameter
that is not 2-D only after it has written: that parameter is already decayed and its momentum buffer
updated, and every parameter before it in the group has taken its whole step.

The constructor accepts both. The fp32 requirement is `newton_schulz`'s (TypeError "Input tensor x must
be in float32"), the 2-D one `orthogonalize`'s (ValueError); both run after `_apply_weight_decay_inplace`
and the momentum `lerp_`. A caller that catches the error is left with a half-applied step.
Needs only torch and emerging-optimizers (Python >= 3.12). Exits 1 while a refused step has written.
"""

import sys

import torch

try:
    from emerging_optimizers.orthogonalized_optimizers import Muon
except ImportError as exc:
    print(f"cannot import emerging-optimizers here: {exc}")
    sys.exit(2)

torch.manual_seed(0)
written = []
for name, refused in (("bf16", torch.randn(4, 6, dtype=torch.bfloat16)), ("3-D", torch.randn(4, 2, 3))):
    first, bad = torch.nn.Parameter(torch.randn(4, 6)), torch.nn.Parameter(refused)
    for p in (first, bad):
        p.grad = torch.randn_like(p)
    before = [first.detach().clone(), bad.detach().clone()]
    opt = Muon([first, bad], lr=0.1, weight_decay=0.1)
    try:
        opt.step()
    except (TypeError, ValueError) as exc:
        changed = [not torch.equal(p, b) for p, b in zip((first, bad), before)]
        momentum = bool(opt.state[bad]["momentum_buffer"].abs().sum() > 0)
        print(f"{name} parameter: step() raised {type(exc).__name__}: {exc}; first parameter stepped: {changed[0]}, "
              f"refused parameter decayed: {changed[1]}, its momentum written: {momentum}")
        if any(changed) or momentum:
            written.append(name)
    else:
        print(f"{name} parameter: stepped")
sys.exit(1 if written else 0)
