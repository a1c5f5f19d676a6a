"""Names of floating formats used in cases and reports, and their torch dtypes."""

from __future__ import annotations

import torch

TORCH_DTYPES: dict[str, torch.dtype] = {"fp64": torch.float64, "fp32": torch.float32,
                                        "bf16": torch.bfloat16, "fp16": torch.float16}
NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}
