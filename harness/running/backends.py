"""Where a case runs: the backends of `python -m harness run --backend ...`.

  cpu   one process, CPU tensors                     single-process cases
  cuda  one process, tensors on the current GPU      single-process cases
  gloo  a pool of CPU ranks (harness/running/pool.py)        distributed cases
  nccl  a pool of ranks, one GPU each                distributed cases

A backend that cannot run a case here (no GPU, fewer GPUs than ranks, a torchrun world
too small, a GPU-tier case on a CPU backend) says why; the runner records that case as skipped with the reason, never as pass.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist

from cases import Case, axes
from harness.running.inputs import Inputs
from harness.targets.base import Target


@dataclass(frozen=True)
class Backend:
    """bitwise_relations: two runs of the same kernels agree bitwise here. Not on GPUs: cuBLAS picks
    kernels by batch size, so a megabatch and its members alone differ in the last bits (measured
    on an H200, fp64: 1e-15 relative), and they are judged with the policy's relation tolerance."""

    name: str
    distributed: bool
    device_type: str

    @property
    def bitwise_relations(self) -> bool:
        return self.device_type == "cpu"

    def accepts(self, case: Case) -> bool:
        """Distributed backends run distributed cases; the others single-process ones."""
        return self.distributed == (case.layout != "single")

    def unavailable(self, case: Case, max_world: int | None = None) -> str | None:
        """Why `case` cannot run on this backend here (None if it can); `max_world`: the ranks
        a torchrun world offers."""
        if self.device_type != "cuda" and case.layer in axes.GPU_LAYERS:
            return (f"{self.name}: {case.layer} ({case.shape_text}) is a GPU-tier layer, run on CUDA only "
                    f"(--backend cuda): it is sized to engage the GPU fast paths, and its FP64 oracle costs "
                    f"minutes per step on a CPU")
        if self.device_type == "cuda" and not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            return f"{self.name}: no CUDA device visible (torch {torch.__version__}, {build})"
        if not self.distributed:
            return None
        if not (dist.is_available() and (dist.is_gloo_available() if self.name == "gloo"
                                         else dist.is_nccl_available())):
            return f"{self.name}: this torch build has no {self.name} process groups"
        if self.name == "nccl" and torch.cuda.device_count() < case.world_size and max_world is None:
            return (f"nccl: world size {case.world_size} needs {case.world_size} GPUs (one per rank), "
                    f"{torch.cuda.device_count()} visible")
        if max_world is not None and case.world_size > max_world:
            return f"{self.name}: the torchrun world has {max_world} ranks, the case needs {case.world_size}"
        return None

    def device(self) -> torch.device:
        """The device of a single-process case's tensors."""
        return torch.device("cuda", torch.cuda.current_device()) if self.device_type == "cuda" else torch.device("cpu")


BACKENDS: Mapping[str, Backend] = types.MappingProxyType({b.name: b for b in (
    Backend("cpu", False, "cpu"), Backend("cuda", False, "cuda"),
    Backend("gloo", True, "cpu"), Backend("nccl", True, "cuda"),
)})


def get(name: str) -> Backend:
    """The backend called `name`; ValueError lists the known ones."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def natural(case: Case) -> Backend:
    """The backend a case runs on when none is named: cpu, or gloo for a distributed case."""
    return BACKENDS["gloo" if case.layout != "single" else "cpu"]


def judged_as(target: Target, backend: Backend) -> Target:
    """`target` as judged on `backend`: a copy whose relations are not bitwise where the
    backend's kernels make them inexact (see Backend)."""
    if backend.bitwise_relations or not (target.exact_relations or target.exact_equivalents):
        return target
    inexact = copy.copy(target)
    inexact.exact_relations = inexact.exact_equivalents = False
    return inexact


def on_device(inputs: Inputs, device: torch.device) -> Inputs:
    """`inputs` with every tensor moved to `device`."""
    return Inputs([p.to(device) for p in inputs.params], [[g.to(device) for g in step] for step in inputs.grads],
                  inputs.flatten)
