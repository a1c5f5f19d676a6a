"""microsoft/dion (commit 0a059a4): NorMuon(flatten=True) normalises the rows of a conv kernel's
trailing kh x kw slices, not the rows (output channels) of the flattened matrix it orthogonalized.

With flatten=True a [out, in, k] kernel is orthogonalized as the matrix [out, in*k], but the
variance buffer is `zeros_like(p[..., 0:1])` and the row statistics and norm restore run over the
last dim of the unflattened update. So a kernel does not step as the same weights stored as the
[out, in*k] matrix, though flatten=True promises exactly that view. Needs only torch and dion.
Prints the relative difference of the two updates and exits 1 when the defect shows.
"""

import sys

import torch

import dion

torch.compiler.set_stance("force_eager")  # the same compiled; eager avoids compile time


def update(weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    param = torch.nn.Parameter(weight.clone())
    opt = dion.NorMuon([param], lr=0.02, mu=0.95, weight_decay=0.0, flatten=True)
    param.grad = grad.clone()
    opt.step()
    return (param.detach() - weight).reshape(weight.shape[0], -1)


torch.manual_seed(0)
weight, grad = torch.randn(8, 4, 5) * 0.02, torch.randn(8, 4, 5)  # a Conv1d(4, 8, 5) kernel
as_kernel = update(weight, grad)
as_matrix = update(weight.reshape(8, 20), grad.reshape(8, 20))
rel = ((as_kernel - as_matrix).norm() / as_matrix.norm()).item()
print(f"NorMuon(flatten=True): conv kernel vs its [out, in*k] matrix, relative difference {rel:.3g}")
sys.exit(1 if rel > 0.05 else 0)
