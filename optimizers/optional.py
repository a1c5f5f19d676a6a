"""Our optional Triton modules (optimizers/symmetric_triton.py, optimizers/elementwise_triton.py): imported on
first use, once, and None where triton cannot be imported (CPU installs: triton is never a hard dependency)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

LOADED: dict[str, ModuleType | None] = {}
"""By module name under `optimizers`: the module, or None where its import failed. Memoization of the import
(an import is tried once per process)."""


def triton_module(name: str) -> ModuleType | None:
    """optimizers.<name>, or None where triton cannot be imported (tried once)."""
    if name not in LOADED:
        try:
            LOADED[name] = importlib.import_module(f"optimizers.{name}")
        except ImportError:
            LOADED[name] = None
    return LOADED[name]


def interpreted() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1): the kernels then run on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
