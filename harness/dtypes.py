"""The torch dtype of each floating-format name used in cases and reports."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"fp64": torch.float64, "fp32": torch.float32,
                                        "bf16": torch.bfloat16, "fp16": torch.float16}
