"""microsoft/dion (commit 0a059a4): Muon(flatten=True) on a sharded (DTensor Shard(0)) parameter
orthogonalizes it as ONE ROW, even alone. The sharded path pads the megabatch to a multiple of the
world size and each rank reassembles its share as a stack [per_rank, *shape] (here [1, 8, 4, 5] for a
single Conv1d(4, 8, 5) weight); `muon_update_newton_schulz` then flattens that stack with
`X.flatten(start_dim=1)` into [1, 160] instead of the parameter's [8, 20] matrix view. The same line
as the single-device megabatch finding (dion-megabatch-flatten-mixes-layers.py), reached here by a
megabatch of ONE: the orthogonalized "matrix" is the row U / ||U||, so the update is the momentum's
direction, not its polar factor.
Needs only torch and dion (2 CPU processes over gloo). Prints the relative difference of the sharded
step from the same step on one device (which is correct) and how closely it follows U / ||U||;
exits 1 when the defect shows.
"""

import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import dion

torch.compiler.set_stance("force_eager")  # the defect is the same compiled; eager avoids compile time
LR = 0.02


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(8, 4, 5) * 0.02, torch.randn(8, 4, 5)  # one Conv1d(4, 8, 5) weight and its gradient


def rank(r: int, store_path: str, results) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=r, world_size=2)
    torch.compiler.set_stance("force_eager")
    mesh = init_device_mesh("cpu", (2,))
    weight, grad = inputs()
    param = torch.nn.Parameter(distribute_tensor(weight, mesh, [Shard(0)]))
    opt = dion.Muon([param], lr=LR, mu=0.95, weight_decay=0.0, flatten=True, distributed_mesh=mesh)
    param.grad = distribute_tensor(grad, mesh, [Shard(0)])
    opt.step()
    full = param.full_tensor()
    if r == 0:
        results["sharded"] = full.detach().clone()
    dist.destroy_process_group()


if __name__ == "__main__":
    weight, grad = inputs()
    alone = torch.nn.Parameter(weight.clone())
    opt = dion.Muon([alone], lr=LR, mu=0.95, weight_decay=0.0, flatten=True)
    alone.grad = grad.clone()
    opt.step()
    with tempfile.NamedTemporaryFile() as store:
        results = mp.Manager().dict()
        mp.spawn(rank, args=(store.name, results), nprocs=2)
    sharded = results["sharded"]
    step_alone, step_sharded = alone.detach() - weight, sharded - weight
    rel = ((step_sharded - step_alone).norm() / step_alone.norm()).item()
    row = -grad / grad.norm()  # the orthogonalized 1 x 160 row is U / ||U|| (up to the schedule's p(1))
    cosine = torch.nn.functional.cosine_similarity(step_sharded.flatten(), row.flatten(), dim=0).item()
    print(f"one Shard(0) parameter, flatten=True, 2 ranks: its step vs the same step on one device: "
          f"relative difference {rel:.3g}; cosine of the sharded step with -U/||U||: {cosine:.4f}")
    sys.exit(1 if rel > 0.05 else 0)
