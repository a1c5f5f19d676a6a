"""A case's inputs as tensors of its parameter dtype, and their exact FP64 values.

Data is generated in FP64 (cases.data), rounded once to the parameter dtype, and
the oracle is fed the rounded values: target and reference see the same numbers.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from cases import Case, gradient, initial_parameter

TORCH_DTYPES: Mapping[str, torch.dtype] = types.MappingProxyType({"fp64": torch.float64, "fp32": torch.float32,
                                        "bf16": torch.bfloat16, "fp16": torch.float16})
"""The torch dtype of each floating-format name used in cases and reports."""


@dataclass(frozen=True)
class Inputs:
    params: list[torch.Tensor]
    grads: list[list[torch.Tensor]]
    flatten: bool

    def scaled(self, factor: float) -> "Inputs":
        """Same parameters, gradients multiplied by `factor` (exact for powers of two)."""
        return Inputs(self.params, [[g * factor for g in step] for step in self.grads], self.flatten)

    def member(self, i: int) -> "Inputs":
        """Megabatch member i alone."""
        return Inputs([self.params[i]], [[step[i]] for step in self.grads], self.flatten)

    def reshaped(self, shape: tuple[int, ...]) -> "Inputs":
        """Every tensor viewed as `shape` (the equivalent 2-D parameter)."""
        return Inputs([p.reshape(shape) for p in self.params],
                      [[g.reshape(shape) for g in step] for step in self.grads], self.flatten)


def make_inputs(case: Case) -> Inputs:
    """Initial parameters and per-step gradients of `case` in its parameter dtype."""
    dtype = TORCH_DTYPES[case.param_dtype]
    params = [torch.from_numpy(initial_parameter(case, i)).to(dtype) for i in range(case.megabatch)]
    grads = [[torch.from_numpy(gradient(case, i, k)).to(dtype) for i in range(case.megabatch)]
             for k in range(case.steps)]
    return Inputs(params, grads, case.flatten)


def f64(t: torch.Tensor) -> np.ndarray:
    """Exact FP64 NumPy copy of a tensor of any floating dtype."""
    return t.detach().to("cpu", torch.float64).numpy()
