"""DeepSpeed 0.19.8: near fp32's range SingleDeviceMuon's update vanishes (both ns_method values).

Muon's step is invariant to the gradient's scale: U / ||U||_F is the same matrix for G and 2^107 G.
Each method divides U (standard: cast to bf16 first) by ||U||_F + 1e-7, whose sum of squares (fp32)
overflows once entries reach 2^64 / sqrt(count) (2^60 for this 12 x 20 matrix): the norm is inf,
X0 is 0, and the parameter only decays. Needs only torch and deepspeed (DS_ACCELERATOR=cpu on a CPU
machine). Prints the update norms at gradient scales 1 and 2^107 and exits 1 when the second vanishes.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from deepspeed.runtime.zero.muon.original_muon import SingleDeviceMuon  # noqa: E402

torch.compiler.set_stance("force_eager")  # the same compiled; eager avoids compile time


def update(method: str, scale: float) -> float:
    torch.manual_seed(0)
    weight = torch.randn(12, 20) * 0.02
    param = torch.nn.Parameter(weight.clone())
    opt = SingleDeviceMuon([param], lr=0.02, momentum=0.95, weight_decay=0.0, ns_method=method)
    param.grad = torch.randn(12, 20) * scale
    opt.step()
    return (param.detach() - weight).norm().item()


vanished = False
for method in ("standard", "gram"):
    plain, huge = update(method, 1.0), update(method, 2.0**107)
    print(f"SingleDeviceMuon ({method}) update norm: gradient x 1 -> {plain:.3g}, gradient x 2^107 -> {huge:.3g}")
    vanished |= huge < 0.01 * plain
sys.exit(1 if vanished else 0)
