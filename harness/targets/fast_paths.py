"""Our optimizer with a GPU fast path demanded, so that the harness judges the fast path itself against
the FP64 oracle: `ours-triton` (Muon(fused=True): the Triton kernel for the symmetric products, and
the fused momentum, normaliser and apply kernels on fp32 parameters) and `ours-graphs` (Muon(cuda_graphs=True):
the small megabatches' orthogonalizations captured once per plan, in one graph on parallel streams, and
replayed).

Each declares ours' conventions and answers `unsupported` for every case its fast path cannot engage, with
the reason, so that every pass is a judged run of the fast path, never ours' eager path passing under
another name:

  ours-triton  CUDA with triton installed, one process, a polynomial orthogonalizer (not SVD), bf16 compute
               (Gram Newton-Schulz then iterates in fp16: both kernel dtypes), and a matrix whose short side
               reaches symmetric.TRITON_ROWS (2048), from which the default (fused=None) takes the kernel too:
               the GPU tier's bf16 cases (`--tier gpu`).
  ours-graphs  CUDA, one process, Muon or NorMuon, an orthogonalizer of algorithms.muon.CAPTURED, and 3 steps
               or more (the first creates the state, the second is a fresh plan's eager first step, the
               third captures and replays, later ones replay),
               every megabatch captured whatever its size (True; the default, None, captures those of up to
               graphs.MAX_NUMEL elements, and `ours` judges it): the CI tier's multi-step cases and the GPU
               tier's.

    python -m harness run --backend cuda --target ours-triton --tier gpu --out out-triton
    python -m harness run --backend cuda --target ours-graphs --out out-graphs
"""

from __future__ import annotations

import torch

import optimizers
from cases import Case, matrix_shape
from harness.targets.ours import OursMuon
from optimizers import kernels, symmetric
from optimizers.algorithms.muon import CAPTURED


def _cuda() -> str | None:
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"no CUDA device visible (torch {torch.__version__}, {build}); the fast path runs on CUDA only"
    return None


class OursTriton(OursMuon):
    """optimizers.Muon(fused=True)."""

    name = "ours-triton"

    def version(self) -> str:
        return super().version() + ", fused=True"

    def unsupported(self, case: Case) -> str | None:
        if case.world_size > 1:
            return "ours-triton judges one process (the kernel is the same under a layout); distributed cases: ours"
        if case.orthogonalizer in ("svd", "none") or case.compute_dtype != "bf16":
            return (f"the Triton kernel forms bf16/fp16 symmetric products of the polynomial orthogonalizers; "
                    f"this case computes {case.orthogonalizer} in {case.compute_dtype}")
        _, m, n = matrix_shape(case.shape, case.flatten)
        if min(m, n) < symmetric.TRITON_ROWS:
            return (f"its matrices ({m} x {n}) have a short side below symmetric.TRITON_ROWS = {symmetric.TRITON_ROWS}, "
                    f"the size from which the default takes the kernel (the GPU tier's cases engage it)")
        why = _cuda()
        if why is None and not kernels.available():
            why = "triton cannot be imported here (pip install triton)"
        return why

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        return optimizers.Muon(params, **self.options(case), fused=True)


class OursGraphs(OursMuon):
    """optimizers.Muon(cuda_graphs=True)."""

    name = "ours-graphs"

    def version(self) -> str:
        return super().version() + ", cuda_graphs=True"

    def unsupported(self, case: Case) -> str | None:
        if case.world_size > 1:
            return "CUDA graphs capture single-process megabatches only; distributed cases: ours"
        if case.optimizer not in ("muon", "normuon") or case.orthogonalizer not in CAPTURED:
            return (f"CUDA graphs capture Muon and NorMuon with {', '.join(CAPTURED)}; this case is "
                    f"{case.optimizer} with {case.orthogonalizer} (eager)")
        if case.steps < 3:
            return (f"{case.steps} step(s): the first step creates the state and the second runs a fresh plan's "
                    f"first step eagerly; the third captures the plan's graph and replays it")
        return _cuda()

    def make(self, params: list[torch.nn.Parameter], case: Case) -> torch.optim.Optimizer:
        return optimizers.Muon(params, **self.options(case), cuda_graphs=True)


def triton() -> OursTriton:
    return OursTriton()


def cuda_graphs() -> OursGraphs:
    return OursGraphs()
