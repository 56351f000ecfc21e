"""Conversion and dot-product rules of OCP MX v1.0, and the choices the spec leaves open.

Each rule names its section. The implementation-defined choices are explicit, named
options (the enums below); the defaults are what the spec says (or, where it says nothing, the
choice named in DEFAULT_CHOICES with the reason). The enums' integer values are what the
kernels (Numba and Triton) compare against; names are what users write.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class _Named(enum.IntEnum):
    """An option that users name by a lower-case string and kernels read as an int."""

    @property
    def label(self) -> str:
        return self.name.lower()

    def __str__(self) -> str:
        return self.label

    @classmethod
    def parse(cls, value) -> "_Named":
        """The member for a name ('even'), a member, or its int; a ValueError names the options."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                pass
        argument = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()  # ScaleRule: scale_rule
        raise ValueError(f"unknown {argument} {value!r}; "
                         f"expected one of {[m.label for m in cls]}")


class ScaleRule(_Named):
    """Scale rule: how the shared exponent is chosen from the block's amax (§6.3).

    All are computed exactly from the exponent and mantissa bits of amax (never a float log2)."""

    FLOOR = 0  # §6.3: s = floor(log2 amax) - emax_elem (the spec's rule, default)
    CEIL = 1   # s = ceil(log2 amax) - emax_elem
    RCEIL = 2  # NVIDIA cuBLAS/TE: s = ceil(log2(amax / max_elem))
    EVEN = 3   # torchao EVEN / AMD Quark: amax mantissa rounded to the element's bits first


class Rounding(_Named):
    """Rounding: how an element value between two codes is rounded (§6.3 requires RNE)."""

    RNE = 0         # §6.3: round to nearest, ties to even (default)
    STOCHASTIC = 1  # up with probability frac8 / 2^8 (``ocpmx.spec.philox.stochastic_bits``)


class Conversion(_Named):
    """Conversion model: whose rules turn one element value under a block scale into a code.

    The block's scale is always chosen by the ``ScaleRule``; the conversion model decides how
    the element is converted under it (rounding, overflow, NaN/Inf, the scale codes 0x00 and
    0xFF). ``emulator.gfx950`` documents the GFX950 rules and their sources."""

    OCP = 0     # OCP MX v1.0 §6.3 as the emulator implements it (default)
    GFX950 = 1  # AMD gfx950 (CDNA4, MI355X) V_CVT_SCALEF32_* conversion instructions


# descriptions, by name (help texts and reports)
SCALE_RULES: dict[str, str] = {
    "floor": "§6.3: s = floor(log2 amax) - emax_elem (the spec's rule, default)",
    "ceil": "s = ceil(log2 amax) - emax_elem (no element ever saturates; loses one binade)",
    "rceil": "NVIDIA cuBLAS/TE: s = ceil(log2(amax / max_elem)), the smallest s with amax <= max*2^s",
    "even": "torchao EVEN / AMD Quark: round amax's mantissa to the element's mantissa bits "
            "(nearest, ties up) before taking floor(log2) - emax_elem",
}
ROUNDINGS: dict[str, str] = {
    "rne": "§6.3: round to nearest, ties to even (default)",
    "stochastic": "round up iff r < frac8: frac8 the first 8 bits of the fraction (truncated), "
                  "r 8 random bits of Philox4x32-10 keyed by seed, 16 elements of consecutive "
                  "K-major indices per call (ocpmx.spec.philox.stochastic_bits)",
}
CONVERSIONS: dict[str, str] = {
    "ocp": "OCP MX v1.0 §6.3: RNE (or this project's stochastic rounding), saturate to +-max, "
           "NaN -> the format's NaN code or 0 (default)",
    "gfx950": "AMD gfx950 V_CVT_SCALEF32_*: the scale's exponent subtracted before one RNE "
              "rounding (or add-random-bits-and-truncate SR); FP4/FP6 saturate, E4M3 overflow "
              "-> NaN, E5M2 overflow -> Inf, NaN -> the format's NaN slot with its sign",
}
assert list(SCALE_RULES) == [m.label for m in ScaleRule]
assert list(CONVERSIONS) == [m.label for m in Conversion]
assert list(ROUNDINGS) == [m.label for m in Rounding]

# §6.2 "Dot product": Dot(A, B) = X_A * X_B * sum_i P_A,i * P_B,i; internal precision and
# order of the sum are implementation-defined; the result should be FP32.
DOT_SECTION = "§6.2 (MX dot product; internal precision implementation-defined)"
CONVERSION_SECTION = "§6.3 (conversion from scalars to MX)"


@dataclass(frozen=True)
class Choice:
    name: str
    default: object
    options: tuple
    why: str


# The choices the spec leaves to the implementation, with the defaults this project uses.
DEFAULT_CHOICES: tuple[Choice, ...] = (
    Choice("scale_rule", "floor", tuple(SCALE_RULES), "§6.3 says floor(log2 amax) - emax_elem"),
    Choice("rounding", "rne", tuple(ROUNDINGS), "§6.3 requires RNE"),
    Choice("overflow", "saturate", ("saturate",),
           "§6.3: normal values that exceed the element's max are clamped to +-max"),
    Choice("nonfinite_block_scale", 0xFF, (0xFF,),
           "a block holding NaN or +-Inf gets scale NaN (0xFF) so the whole block decodes to NaN "
           "(§5.3: a NaN scale makes every element NaN)"),
    Choice("zero_block_scale", 0x00, (0x00,),
           "an all-zero block has no exponent; it gets the smallest code, 2^-127"),
    Choice("scale_exponent_clamp", (-127, 127), ((-127, 127),),
           "the shared exponent is clamped to the E8M0 range (§5.3)"),
    Choice("signed_zero", "kept", ("kept",),
           "negative values that round to zero give -0 in float element formats"),
    Choice("int8_min", -127, (-127, -128),
           "MXINT8 (§5.4.4) saturates to +-127/64; -128 (code 0x80 = -2.0) is an option"),
    Choice("nonfinite_block_elements", "nan->nan code or 0, inf->inf code or max, finite->0",
           ("nan->nan code or 0, inf->inf code or max, finite->0",),
           "element codes of a NaN-scale block do not matter to the value (the block is NaN); "
           "this project writes these codes so that kernels can match the emulator bit for bit"),
)
