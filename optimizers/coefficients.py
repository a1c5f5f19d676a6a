"""Orthogonalizer coefficient tables used by the optimizers.

Each step is p(x) = a x + b x^3 + c x^5. The oracles keep an independent copy;
tests/test_coefficients.py asserts the two agree.
"""

from __future__ import annotations

Coefficients = tuple[float, float, float]

NEWTON_SCHULZ_QUINTIC: Coefficients = (3.4445, -4.7750, 2.0315)
"""Keller Jordan, "Muon: An optimizer for hidden layers in neural networks" (2024)."""

POLAR_EXPRESS: tuple[Coefficients, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
"""Amsel et al., "The Polar Express" (2025), arXiv:2505.16932, Algorithm 1."""

POLAR_EXPRESS_SAFETY = 1.01
"""Algorithm 1: all but the last polynomial become (a/s, b/s^3, c/s^5); the
normaliser is ||X||_F * s + eps."""

DEFAULT_STEPS = 5


def schedule(name: str, steps: int) -> list[Coefficients]:
    """Per-step coefficients of a polynomial orthogonalizer."""
    if name == "newton_schulz":
        return [NEWTON_SCHULZ_QUINTIC] * steps
    s = POLAR_EXPRESS_SAFETY
    safe = [(a / s, b / s**3, c / s**5) for a, b, c in POLAR_EXPRESS[:-1]] + [POLAR_EXPRESS[-1]]
    return [safe[min(i, len(safe) - 1)] for i in range(steps)]


def normaliser_scale(name: str) -> float:
    """The factor on ||X||_F in the normaliser of orthogonalizer `name`."""
    return POLAR_EXPRESS_SAFETY if name == "polar_express" else 1.0
