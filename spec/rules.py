"""Conversion and dot-product rules of OCP MX v1.0, and the choices the spec leaves open.

Each rule names its section. The implementation-defined choices are explicit, named
options; the defaults are what the spec says (or, where it says nothing, the choice
named in DEFAULT_CHOICES with the reason).
"""
from __future__ import annotations

from dataclasses import dataclass

# §6.3 "Conversion from vector of scalars to MX": X = 2^(floor(log2(amax)) - emax_elem),
# P_i = quantize_to_element(V_i / X), normal values clamped to the element's max.
# Scale rules: how the shared exponent is chosen from the block's amax. All are computed
# exactly from the exponent and mantissa bits of amax (never with a float log2).
SCALE_RULES: dict[str, str] = {
    "floor": "§6.3: s = floor(log2 amax) - emax_elem (the spec's rule, default)",
    "ceil": "s = ceil(log2 amax) - emax_elem (no element ever saturates; loses one binade)",
    "rceil": "NVIDIA cuBLAS/TE: s = ceil(log2(amax / max_elem)), the smallest s with amax <= max*2^s",
    "even": "torchao EVEN / AMD Quark: round amax's mantissa to the element's mantissa bits "
            "(nearest, ties up) before taking floor(log2) - emax_elem",
}

# §6.3 requires round-to-nearest-even; other roundings are allowed as extensions.
ROUNDINGS: dict[str, str] = {
    "rne": "§6.3: round to nearest, ties to even (default)",
    "stochastic": "round up with probability equal to the fraction's first 32 bits / 2^32, "
                  "compared against a Philox4x32-10 word keyed by (seed, element index)",
}

# §6.x "Dot product": Dot(A, B) = X_A * X_B * sum_i P_A,i * P_B,i; internal precision and
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


def check_scale_rule(rule: str) -> str:
    if rule not in SCALE_RULES:
        raise ValueError(f"unknown scale_rule {rule!r}; expected one of {sorted(SCALE_RULES)}")
    return rule


def check_rounding(rounding: str) -> str:
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; expected one of {sorted(ROUNDINGS)}")
    return rounding
