"""The axes a case varies along, with their allowed values: one table each.

Layers are named shapes: the kind (what module the weight belongs to) and the
weight shape. Odd shapes (tall, 1 x n, kernel 1) are layers of their own.
"""

from __future__ import annotations

LAYERS: dict[str, tuple[str, tuple[int, ...]]] = {
    # name: (kind, weight shape)
    "linear": ("linear", (12, 20)),
    "linear_tall": ("linear", (24, 6)),
    "linear_row": ("linear", (1, 16)),
    "conv1d": ("conv1d", (8, 4, 5)),
    "conv2d": ("conv2d", (8, 4, 3, 3)),
    "conv2d_k1": ("conv2d", (8, 4, 1, 1)),
    "conv2d_tall": ("conv2d", (40, 2, 2, 2)),
    "conv3d": ("conv3d", (6, 3, 2, 3, 3)),
}
"""CI-sized layers. Nightly adds the larger ones below."""

NIGHTLY_LAYERS: dict[str, tuple[str, tuple[int, ...]]] = {
    "linear_wide_big": ("linear", (64, 256)),
    "linear_tall_big": ("linear", (384, 96)),
    "conv1d_big": ("conv1d", (64, 32, 7)),
    "conv2d_big": ("conv2d", (64, 32, 3, 3)),
    "conv3d_big": ("conv3d", (32, 16, 3, 3, 3)),
}

GPU_LAYERS: dict[str, tuple[str, tuple[int, ...]]] = {
    "linear_gpu": ("linear", (2048, 4096)),
    "linear_gpu_tall": ("linear", (4096, 2048)),
    "conv2d_gpu": ("conv2d", (2048, 512, 3, 3)),
    "linear_gpu_mid": ("linear", (768, 2304)),
}
"""Layers of the GPU tier only (cases/tiers.py "gpu"), sized to engage the fast paths that start at a size:
the symmetric products by blocks (optimizers/symmetric.py) and the Triton kernel (symmetric.TRITON_ROWS) from a
short side of 2 * BLOCK = 2048 rows, and any peer's kernels from smaller sizes (gram-newton-schulz's from
256). Aspect 2 and more (the conv flattened: 2048 x 4608) keeps a Gaussian direction well conditioned
(condition ~6), where the bf16 reference is well posed. `linear_gpu_mid` (GPT-2 small's attention projection)
reaches the kernel only where a CUDA graph records its megabatch (from symmetric.GRAPHED_ROWS rows, below
TRITON_ROWS), as the default cuda_graphs=None does. Their cases run on CUDA only (harness/running/backends.py):
the FP64 oracle of one 2048 x 4096 step is an SVD of that size, minutes on a loaded 2-core machine. Not in
`all_layers()`: no covering array or strategy draws them."""

VECTOR_LAYERS: dict[str, tuple[str, tuple[int, ...]]] = {
    "bias": ("vector", (16,)),
    "embedding": ("embedding", (40, 8)),
}
"""Layers of the elementwise algorithms only (AdamW, the fallback for what Muon must not orthogonalize): a
1-D bias or norm weight, and an embedding table. Not in `all_layers()`: the matrix algorithms' covering
arrays and strategies never draw them."""

LAYER_KINDS = ("linear", "conv1d", "conv2d", "conv3d", "vector", "embedding")
MEGABATCH_SIZES = (1, 2, 3, 5)
DTYPES = ("fp64", "fp32", "bf16")
ORTHOGONALIZERS = ("newton_schulz", "polar_express", "svd")
"""The covering arrays' orthogonalizers."""
GRAM = "gram_newton_schulz"
"""Gram Newton-Schulz (Polar Express schedule, Muon's default restarts): its cases come from a generator
of their own (cases/tiers.py), so that the covering arrays do not depend on it."""
NO_ORTHOGONALIZER = "none"
"""The orthogonalizer of an elementwise algorithm's cases (AdamW): none."""
EVERY_ORTHOGONALIZER = ORTHOGONALIZERS + (GRAM,)
ORTH_TOKENS = {"newton_schulz": "ns", "polar_express": "pe", "svd": "svd", GRAM: "gns", NO_ORTHOGONALIZER: "none"}
ADJUST_LR = ("spectral_norm", "rms_norm", "none")
GRADIENTS = ("gaussian", "lowrank", "rankdef", "zero", "tiny", "huge")
EXTREME_GRADIENT = "extreme"
"""Gaussian gradients scaled to EXTREME_HEADROOM binades below the parameter dtype's largest finite power of two
(cases/data.py): a normaliser that squares before scaling overflows there. Not an axis of the covering arrays:
written cases (cases/tiers.py) of every matrix algorithm."""
EXTREME_HEADROOM = 20
"""Binades left between an extreme gradient and overflow: a momentum sums at most 1 / (1 - 0.9) = 10 of them
(2^4), a Nesterov direction adds one more; judged by `reference` (the FP64 oracle, its normaliser's eps
modelled exactly) and `finite`."""
NONFINITE_GRADIENT = "nonfinite"
"""Gaussian gradients with one NaN element in the first member's last gradient (cases/data.py): judged only by
the `nonfinite` check, against the one documented policy of every algorithm (optimizers/algorithms/base.py, as
torch.optim's): the NaN reaches that parameter in the step it arrives, the other members step as without it.
Not an axis of the covering arrays: written cases (cases/tiers.py)."""
DEGENERATE_GRADIENTS = ("rankdef", "zero", "tiny", "huge", EXTREME_GRADIENT)
VECTOR_GRADIENTS = ("gaussian", "zero", "tiny", "huge")
"""The gradient kinds of a 1-D parameter (no matrix view: no rank to set)."""
FRACTIONS = (0.25, 0.5, 1.0)
SCOPES = ("local", "global")
STEPS = (1, 3)
"""Steps per case: one step, and three so that momentum (and NorMuon's variance) accumulate."""
WEIGHT_DECAYS = (0.0, 0.1)
"""The weight decays of the hand-written generators and the original covering arrays (their ids are frozen)."""
DECAYS = (0.0, 1e-4, 0.01, 0.1)
"""Every weight decay of the full axis space (cases/space.py): the small values people train with, at which
1 - lr wd rounds to 1 in bf16, and a large one."""
LRS = (0.02, 0.05)
"""Every lr of the full axis space."""

DTYPE_PAIRS = (("fp64", "fp64"), ("fp64", "fp32"), ("fp32", "fp32"), ("fp32", "bf16"),
               ("bf16", "fp32"), ("bf16", "bf16"))
"""(parameter dtype, compute dtype) pairs a case may have: compute in the parameter's
precision or one step coarser, as implementations do (torch.optim.Muon: always bf16)."""
ELEMENTWISE_DTYPE_PAIRS = (("fp64", "fp64"), ("fp32", "fp32"), ("bf16", "bf16"))
"""An elementwise algorithm computes in its parameter's dtype."""

LR = 0.02
MOMENTUM = 0.95
BETA2 = 0.95
"""NorMuon's row second-moment decay (Li et al., 2025 default)."""
EF_DECAY = 0.95
"""Dion2's error-feedback decay: the momentum's default, so that fraction 1 is Muon at its default momentum."""

HYPER_DEFAULTS = {"lr": LR, "momentum": MOMENTUM, "beta2": BETA2, "ef_decay": EF_DECAY}
"""A case's hyper-parameters and their values where its id does not name them."""
CONSTRUCTIONS = ("explicit", "defaults")
"""How a case's optimizer is built: "explicit" passes every hyper-parameter the case sets; "defaults" passes
only what the target's documented defaults leave to the case (the lr, the parameter and compute formats), so
that the case's other values are those defaults and a changed default fails the case. Defaults cases are rows
of a target's own tier (harness/running/selection.py: `defaults_rows`), never of the global tiers."""
HYPER_VALUES = {"momentum": (0.95, 0.9), "beta2": (0.95, 0.99), "ef_decay": (0.95, 0.9)}
"""The values of each algorithm-specific hyper-parameter in the full axis space: the default and another,
each varied on its own, so that a defect swapping two of them shows."""
PARAM_SCALE = 0.02
"""Initial parameters are N(0, PARAM_SCALE^2): small enough that a bf16 parameter's
rounding (relative 2^-9) stays a few percent of a Muon update of lr ~ 0.02."""


def all_layers() -> dict[str, tuple[str, tuple[int, ...]]]:
    """CI and nightly layers together."""
    return {**LAYERS, **NIGHTLY_LAYERS}


def known_layers() -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every layer a case may name: CI, nightly, the GPU tier's and the elementwise algorithms'."""
    return {**all_layers(), **GPU_LAYERS, **VECTOR_LAYERS}


def compute_ok(orthogonalizer: str, compute_dtype: str) -> bool:
    """False for "svd" with bf16: an SVD runs in fp32 at least, so that pair is no distinct case."""
    return not (orthogonalizer == "svd" and compute_dtype == "bf16")


def flatten_values(layer: str) -> tuple[bool, ...]:
    """The flatten values a layer's cases take in the hand-written generators: both for a 3-D+ layer,
    False for a matrix."""
    return (False, True) if len(all_layers()[layer][1]) > 2 else (False,)
