"""emerging-optimizers 0.3.0: importing its optimizers imports triton, which the package does not declare.

`emerging_optimizers.orthogonalized_optimizers` imports `muon`, which imports `triton_kernels`, whose
`syrk.py` does `import triton` unconditionally, while the wheel's requirements are only torch and
absl-py. Where triton is absent (a CPU-only torch build, macOS, Windows) the package cannot be
imported at all, although its Muon runs in plain torch unless `use_syrk=True`.
Needs only torch and emerging-optimizers (Python >= 3.12). Hides triton as a CPU-only torch would
lack it; exits 1 while the import fails on triton and the metadata does not declare it.
"""

import importlib.metadata
import sys

import torch  # noqa: F401  # imported first, with triton visible, as any user has it

try:
    requires = importlib.metadata.requires("emerging-optimizers") or []
except importlib.metadata.PackageNotFoundError:
    print("emerging-optimizers is not installed")
    sys.exit(2)
declared = any(r.lower().startswith("triton") for r in requires)
sys.modules["triton"] = None  # type: ignore[assignment]  # as if triton were not installed
try:
    import emerging_optimizers.orthogonalized_optimizers  # noqa: F401
except ImportError as exc:
    if getattr(exc, "name", None) != "triton":
        print(f"cannot import emerging-optimizers here for another reason: {exc}")
        sys.exit(2)
    print(f"without triton the import fails: {exc}; declared requirements: {requires}")
    sys.exit(0 if declared else 1)
print("imports without triton")
