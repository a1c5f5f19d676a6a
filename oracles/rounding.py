"""Floating-point formats in NumPy alone: rounding to a narrower format, and ULPs.

bfloat16 has no NumPy dtype; it is float32 with the low 16 mantissa bits dropped.
Rounding is round-to-nearest-even on the float32 bit pattern, the rule torch and
the hardware use. fp64 -> bf16 goes through fp32 (two roundings), as torch does.
"""

from __future__ import annotations

import numpy as np

FORMATS = ("fp64", "fp32", "bf16", "fp16")

_MANTISSA_BITS = {"fp64": 52, "fp32": 23, "bf16": 7, "fp16": 10}


def _check(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown floating format {fmt!r}; expected one of {FORMATS}")


def round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    """Values of `x` rounded to format `fmt`, returned as float64."""
    _check(fmt)
    x = np.asarray(x, dtype=np.float64)
    if fmt == "fp64":
        return x.copy()
    if fmt == "fp16":
        return x.astype(np.float16).astype(np.float64)
    single = x.astype(np.float32)
    if fmt == "fp32":
        return single.astype(np.float64)
    # round half to even on the top 16 bits, in place on the uint32 pattern: a finite pattern is at most
    # 0xFF7FFFFF, so adding 0x7FFF + its lsb never wraps; inf and NaN keep their pattern
    bits = single.view(np.uint32)
    finite = np.isfinite(single)
    rounded = bits >> 16
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits
    rounded &= np.uint32(0xFFFF0000)
    np.copyto(bits, rounded, where=finite)
    return single.astype(np.float64)


def round_direction(x: np.ndarray, fmt: str) -> np.ndarray:
    """`x` rounded to `fmt`'s precision as an orthogonalizer's input is: scaled by the power of two that puts
    its largest |entry| in [0.5, 1), rounded, scaled back. The rounding of every entry is `round_to`'s wherever
    that neither overflows nor leaves the normal range; a direction beyond `fmt`'s range (fp64 gradients near
    1e300 computed in fp32) keeps its values, as the exact scaling of a normaliser keeps them."""
    x = np.asarray(x, dtype=np.float64)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak == 0.0 or not np.isfinite(peak):
        return round_to(x, fmt)
    shift = -int(np.frexp(peak)[1])
    return np.ldexp(round_to(np.ldexp(x, shift), fmt), -shift)


OPMATH = {"bf16": "fp32", "fp16": "fp32"}
"""The format torch computes an elementwise op on tensors of a 16-bit format in, and holds a Python
scalar operand (a momentum coefficient) in: fp32 ("opmath"), on CPU and CUDA alike; the result is
then rounded to the tensor's format. Formats not listed compute in themselves."""


def opmath(fmt: str) -> str:
    """The format an elementwise op on `fmt` tensors computes in (OPMATH)."""
    _check(fmt)
    return OPMATH.get(fmt, fmt)


def stored(x: np.ndarray, fmt: str) -> np.ndarray:
    """The exact result `x` of an elementwise op as a tensor of format `fmt` stores it: rounded to
    opmath(fmt), then to `fmt`."""
    return round_to(round_to(x, opmath(fmt)), fmt)


def machine_epsilon(fmt: str) -> float:
    """Distance from 1.0 to the next representable value in `fmt`."""
    _check(fmt)
    return 2.0 ** -_MANTISSA_BITS[fmt]


def ulp(x: np.ndarray, fmt: str) -> np.ndarray:
    """Spacing of format `fmt` at each |x| (normal range), as float64.

    ulp(x) = 2^(floor(log2|x|) - mantissa_bits); at zero the smallest normal's ulp.
    """
    _check(fmt)
    x = np.abs(np.asarray(x, dtype=np.float64))
    tiny = {"fp64": np.finfo(np.float64).tiny, "fp32": np.finfo(np.float32).tiny,
            "bf16": np.finfo(np.float32).tiny, "fp16": np.finfo(np.float16).tiny}[fmt]
    _, exponent = np.frexp(np.maximum(x, tiny))
    return np.ldexp(1.0, exponent - 1 - _MANTISSA_BITS[fmt])
