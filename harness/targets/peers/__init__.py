"""Adapters for the Muon implementations people run, one module per peer.

Each adapter imports its peer lazily: when the package is absent, every case of that
target is `unsupported` with the install command, never an error. Every adapter runs
its peer eagerly: `torch.compile` wrappers are bypassed with
`torch.compiler.set_stance("force_eager")` around each run (compiling costs 15-55 s per
new shape on 2 CPU cores and would dominate a run), so the eager arithmetic is judged.
Conventions are read from each peer's source; see each module's docstring.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import types
from types import ModuleType
from typing import Sequence

import torch

from cases import Case
from harness.targets.base import OptimizerTarget

FORMAT_OF = types.MappingProxyType(
    {torch.float64: "fp64", torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"})
"""torch dtype -> the oracle's format name."""


class PeerTarget(OptimizerTarget):
    """An adapter of a peer package: `package` is imported on construction; `distribution` is
    its PyPI name (for the version) and `extra` this project's pip extra that installs it."""

    package: str = ""
    distribution: str = ""
    extra: str = ""

    def __init__(self) -> None:
        self.module: ModuleType | None
        try:
            self.module = importlib.import_module(self.package)
        except ImportError:
            self.module = None

    @property
    def missing(self) -> str | None:
        """Why the peer cannot be imported here, or None."""
        if self.module is not None:
            return None
        return (f"package {self.distribution} is not installed: "
                f"pip install 'muon-conformance[{self.extra}]'")

    def version(self) -> str:
        try:
            found = importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            found = "not installed"
        return f"{self.distribution} {found} (torch {torch.__version__})"

    def unsupported(self, case: Case) -> str | None:
        return self.missing or self.peer_unsupported(case)

    def peer_unsupported(self, case: Case) -> str | None:
        """Why the (installed) peer cannot run `case`, or None."""
        return None

    def run(self, params: Sequence[torch.Tensor], grads: Sequence[Sequence[torch.Tensor]],
            case: Case) -> list[list[torch.Tensor]]:
        with torch.compiler.set_stance("force_eager"):
            return super().run(params, grads, case)
