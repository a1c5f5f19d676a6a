"""dtensor-muon 0.1.0: Muon with flatten=True (its default) raises on a 3-D+ DTensor parameter
sharded unevenly on dim 1, e.g. a Conv3d(3, 6, (2, 3, 3)) weight [6, 3, 2, 3, 3] as Shard(1) over
2 ranks (pieces of 2 and 1 input channels): `grad.view(grad.size(0), -1)` on the DTensor fails,
"Cannot flatten unevenly sharded tensor". An even Shard(1) split of the same weight steps.
Needs only torch and dtensor-muon (2 CPU processes over gloo; the CPU run passes
use_triton=False to its `zeropower`, as its Triton kernels need CUDA). Exits 1 when it raises.
"""

import functools
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import dtensor_muon.optim.optim as dm


def rank(r: int, store_path: str, results) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=r, world_size=2)
    dm.zeropower = functools.partial(dm.zeropower, use_triton=False)  # CPU: its pure-torch loops
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    weight, grad = torch.randn(6, 3, 2, 3, 3) * 0.02, torch.randn(6, 3, 2, 3, 3)
    param = torch.nn.Parameter(distribute_tensor(weight, mesh, [Shard(1)]))
    opt = dm.Muon([param], lr=0.02)
    param.grad = distribute_tensor(grad, mesh, [Shard(1)])
    try:
        opt.step()
        results[r] = "stepped"
    except RuntimeError as exc:
        results[r] = f"raised: {str(exc).splitlines()[0]}"
    dist.destroy_process_group()


if __name__ == "__main__":
    with tempfile.NamedTemporaryFile() as store:
        results = mp.Manager().dict()
        mp.spawn(rank, args=(store.name, results), nprocs=2)
    print(f"rank 0 {results[0]}")
    sys.exit(1 if any(v.startswith("raised") for v in results.values()) else 0)
