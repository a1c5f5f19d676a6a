"""microsoft/dion (commit 0a059a4): near fp32's range Muon's and NorMuon's updates vanish.

Their steps are invariant to the gradient's scale: U / ||U||_F is the same matrix for G and 2^107 G.
dion casts U to bf16 and divides it by 1.02 ||U||_F + eps, whose sum of squares (fp32) overflows once
entries reach 2^64 / sqrt(count) (2^60 for this 12 x 20 matrix): the norm is inf, X0 is 0, and the
parameter only decays. Needs only torch and dion. Prints the update norms at gradient scales 1 and 2^107 and
exits 1 when the second vanishes for either optimizer.
"""

import sys

import torch

import dion

torch.compiler.set_stance("force_eager")  # the same compiled; eager avoids compile time


def update(cls: type, scale: float) -> float:
    torch.manual_seed(0)
    weight = torch.randn(12, 20) * 0.02
    param = torch.nn.Parameter(weight.clone())
    opt = cls([param], lr=0.02, mu=0.95, weight_decay=0.0)
    param.grad = torch.randn(12, 20) * scale
    opt.step()
    return (param.detach() - weight).norm().item()


vanished = False
for cls in (dion.Muon, dion.NorMuon):
    plain, huge = update(cls, 1.0), update(cls, 2.0**107)
    print(f"dion.{cls.__name__} update norm: gradient x 1 -> {plain:.3g}, gradient x 2^107 -> {huge:.3g}")
    vanished |= huge < 0.01 * plain
sys.exit(1 if vanished else 0)
