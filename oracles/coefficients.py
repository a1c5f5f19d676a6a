"""The oracles' own copy of every published orthogonalizer coefficient table.

Kept apart from `optimizers/` on purpose: tests assert the two copies agree, so a
typo in either one shows. Each polynomial step is p(x) = a x + b x^3 + c x^5.
"""

from __future__ import annotations

from typing import Sequence

Coefficients = tuple[float, float, float]

KELLER_JORDAN_QUINTIC: Coefficients = (3.4445, -4.7750, 2.0315)
"""Keller Jordan's quintic, used for every step ("Muon: An optimizer for hidden
layers in neural networks", 2024). It does not converge to the polar factor."""

POLAR_EXPRESS_RAW: tuple[Coefficients, ...] = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
    (1.875, -1.25, 0.375),
)
"""Polar Express degree-5 schedule, Amsel, Persson, Musco, Gower (2025),
arXiv:2505.16932, Algorithm 1. Steps beyond the table repeat the last entry."""

POLAR_EXPRESS_SAFETY = 1.01
"""Algorithm 1's safety factor: every polynomial but the last is evaluated at
x / 1.01, i.e. (a/s, b/s^3, c/s^5), and the normaliser is ||G||_F * 1.01 + eps."""


def polar_express_schedule(steps: int) -> list[Coefficients]:
    """The first `steps` Polar Express polynomials with the safety factor applied."""
    s = POLAR_EXPRESS_SAFETY
    table = [(a / s, b / s**3, c / s**5) for a, b, c in POLAR_EXPRESS_RAW[:-1]]
    table.append(POLAR_EXPRESS_RAW[-1])
    return [table[min(i, len(table) - 1)] for i in range(steps)]


def newton_schulz_schedule(steps: int) -> list[Coefficients]:
    """Keller Jordan's quintic repeated `steps` times."""
    return [KELLER_JORDAN_QUINTIC] * steps


YOU_QUINTICS: tuple[Coefficients, ...] = (
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
)
"""Five distinct quintics by Jiacheng You (x.com/YouJiacheng/status/1905861218138804534, 2025),
one per step: the Newton-Schulz schedule of heavyball, microsoft/dion and gram-newton-schulz."""

POLAR_EXPRESS_SAFETY_102: tuple[Coefficients, ...] = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
"""Polar Express degree-5 schedule for 5 steps optimised with safety 0.02 and cushion 2 (the
table of karpathy/nanochat, used by microsoft/dion and dtensor-muon with the normaliser
1.02 ||X||_F + eps). It is not POLAR_EXPRESS_RAW divided by 1.02: it was optimised anew."""

POLAR_EXPRESS_4DP: tuple[Coefficients, ...] = (
    (8.2051, -22.9019, 16.4607),
    (4.0664, -2.8612, 0.5184),
    (3.9096, -2.8234, 0.5250),
    (3.2856, -2.4153, 0.4853),
    (2.2779, -1.6198, 0.3985),
)
"""The first five entries of NVIDIA emerging-optimizers 0.3.0's "polar_express" table (muon_utils.py):
Polar Express's polynomials at x / 1.01, (a/1.01, b/1.01^3, c/1.01^5), to 4 decimals (the first a is
8.2051 where rounding gives 8.2052), run with no safety factor in the normaliser."""

GNS_SAFETY = 1.05
"""gram-newton-schulz 0.1.6 divides every Polar Express polynomial by this safety factor."""


def safety_scaled(table: Sequence[Coefficients], safety: float) -> tuple[Coefficients, ...]:
    """Every polynomial evaluated at x / safety: (a/s, b/s^3, c/s^5)."""
    return tuple((a / safety, b / safety**3, c / safety**5) for a, b, c in table)
