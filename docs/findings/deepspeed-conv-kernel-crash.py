"""DeepSpeed 0.19.8: SingleDeviceMuon raises on every 4-D (convolution) parameter.

`muon_update` flattens a 4-D update to [out, in*kh*kw] for Newton-Schulz, then returns
`torch.where(grad_is_finite, update, grad.to(orig_dtype))`, broadcasting the 2-D update
against the 4-D gradient: RuntimeError "The size of tensor a (36) must match the size of
tensor b (3) at non-singleton dimension 3". Both ns_method values are affected.
Needs only torch and deepspeed (DS_ACCELERATOR=cpu on a CPU machine). Exits 1 when it raises.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

from deepspeed.runtime.zero.muon.original_muon import SingleDeviceMuon  # noqa: E402

torch.compiler.set_stance("force_eager")  # the same error compiled; eager avoids compile time

kernel = torch.nn.Parameter(torch.randn(8, 4, 3, 3) * 0.02)  # a Conv2d(4, 8, 3) weight
opt = SingleDeviceMuon([kernel], lr=0.02, momentum=0.95)
kernel.grad = torch.randn(8, 4, 3, 3)
try:
    opt.step()
except RuntimeError as exc:
    print(f"SingleDeviceMuon.step() on a conv kernel raised: {exc}")
    sys.exit(1)
print("stepped a conv kernel")
