"""The OCP MX v1.0 formats as one table of independent parameters.

Every other property (bias, emax, max normal, min subnormal, NaN/Inf codes, the
largest finite code) is derived from these parameters, never restated.

Spec references (OCP Microscaling Formats (MX) v1.0):
  * §5.1  MX-compliant format: k = 32 elements share one scale X.
  * §5.3  Scale data type E8M0.
  * §5.4  Element data types: FP8 (E4M3, E5M2, per the OCP FP8 spec), FP6 (E3M2,
          E2M3), FP4 (E2M1), INT8.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

BLOCK_SIZE = 32  # §5.1, k = 32 for every concrete MX format


@dataclass(frozen=True)
class ElementFormat:
    """Independent parameters of one MX element format.

    kind        "float" (sign / exponent / mantissa) or "int" (two's complement
                fixed point with ``mbits`` fraction bits, §5.4.3).
    ebits       exponent bits (0 for int).
    mbits       mantissa bits (fraction bits for int).
    specials    how the all-ones exponent is used (float only):
                "ieee"  -> Inf at mantissa 0, NaN otherwise (E5M2),
                "nan_mantissa_all_ones" -> NaN only at S.1111.111, no Inf (E4M3),
                "none"  -> every code is finite (FP6, FP4).
    section     the spec section that defines the format.
    """

    name: str
    kind: str
    ebits: int
    mbits: int
    specials: str
    section: str

    # ---- derived -----------------------------------------------------------------
    @cached_property
    def bits(self) -> int:
        return (1 + self.ebits + self.mbits) if self.kind == "float" else self.mbits + 2

    @cached_property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1 if self.kind == "float" else 0

    @cached_property
    def sign_bit(self) -> int:
        return 1 << (self.bits - 1)

    @cached_property
    def max_code(self) -> int:
        """Largest code magnitude (sign bit clear) that encodes a finite value."""
        if self.kind == "int":
            return (1 << (self.bits - 1)) - 1
        top = (1 << (self.ebits + self.mbits)) - 1
        if self.specials == "ieee":
            return top - (1 << self.mbits)  # exponent all ones reserved
        if self.specials == "nan_mantissa_all_ones":
            return top - 1
        return top

    @cached_property
    def emax(self) -> int:
        """Exponent of the largest power of two that is <= max normal (§6.3's emax_elem)."""
        if self.kind == "int":
            return 0
        return (self.max_code >> self.mbits) - self.bias

    @cached_property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 0 if self.kind == "int" else 1 - self.bias

    @cached_property
    def max_normal(self) -> float:
        if self.kind == "int":
            return self.max_code / (1 << self.mbits)
        mant = self.max_code & ((1 << self.mbits) - 1)
        return (1 + mant / (1 << self.mbits)) * 2.0**self.emax

    @cached_property
    def min_normal(self) -> float:
        return 2.0**self.emin if self.kind == "float" else 1.0

    @cached_property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mbits)

    @cached_property
    def inf_code(self) -> int | None:
        """Code of +Inf, or None (only IEEE-style formats have Inf)."""
        if self.specials == "ieee":
            return ((1 << self.ebits) - 1) << self.mbits
        return None

    @cached_property
    def nan_codes(self) -> tuple[int, ...]:
        """Every code that decodes to NaN (both signs)."""
        if self.specials == "ieee":
            exp = ((1 << self.ebits) - 1) << self.mbits
            mags = [exp | m for m in range(1, 1 << self.mbits)]
        elif self.specials == "nan_mantissa_all_ones":
            mags = [(1 << (self.ebits + self.mbits)) - 1]
        else:
            return ()
        return tuple(sorted(mags + [self.sign_bit | m for m in mags]))

    @cached_property
    def num_codes(self) -> int:
        return 1 << self.bits

    def value(self, code: int) -> float:
        """The value of one element code, by the format's definition (§5.4; the readable
        scalar path every table and kernel is checked against)."""
        if not 0 <= code < self.num_codes:
            raise ValueError(f"code {code:#x} out of range for {self.name} ({self.bits} bits)")
        if self.kind == "int":
            signed = code - self.num_codes if code & self.sign_bit else code
            return signed / (1 << self.mbits)
        if code in self.nan_codes:
            return math.nan
        sign = -1.0 if code & self.sign_bit else 1.0
        if self.inf_code is not None and (code & ~self.sign_bit) == self.inf_code:
            return sign * math.inf
        exp = (code >> self.mbits) & ((1 << self.ebits) - 1)
        mant = code & ((1 << self.mbits) - 1)
        if exp == 0:  # subnormal
            return sign * mant * 2.0 ** (self.emin - self.mbits)
        return sign * (1 + mant / (1 << self.mbits)) * 2.0 ** (exp - self.bias)

    def __repr__(self) -> str:  # short, readable in error messages and reports
        return f"ElementFormat({self.name})"


@dataclass(frozen=True)
class ScaleFormat:
    """E8M0 (§5.3): an unsigned 8-bit biased exponent; 0xFF is NaN; no zero, sign or Inf."""

    name: str
    ebits: int
    section: str

    @cached_property
    def bias(self) -> int:
        return (1 << (self.ebits - 1)) - 1

    @cached_property
    def nan_code(self) -> int:
        return (1 << self.ebits) - 1

    @cached_property
    def emin(self) -> int:
        return -self.bias

    @cached_property
    def emax(self) -> int:
        return self.nan_code - 1 - self.bias


# The table. Adding a format means adding one row here.
FORMATS: dict[str, ElementFormat] = {
    f.name: f
    for f in (
        ElementFormat("e4m3", "float", 4, 3, "nan_mantissa_all_ones", "§5.4.1 (OCP FP8 E4M3)"),
        ElementFormat("e5m2", "float", 5, 2, "ieee", "§5.4.1 (OCP FP8 E5M2)"),
        ElementFormat("e3m2", "float", 3, 2, "none", "§5.4.2 (FP6 E3M2)"),
        ElementFormat("e2m3", "float", 2, 3, "none", "§5.4.2 (FP6 E2M3)"),
        ElementFormat("e2m1", "float", 2, 1, "none", "§5.4.3 (FP4 E2M1)"),
        ElementFormat("int8", "int", 0, 6, "none", "§5.4.4 (INT8, two's complement x 2^-6)"),
    )
}

E8M0 = ScaleFormat("e8m0", 8, "§5.3 (E8M0 scale)")

# Common aliases accepted at the API boundary; the canonical names above are used everywhere else.
ALIASES = {
    "fp4": "e2m1", "mxfp4": "e2m1", "fp4_e2m1": "e2m1", "mxfp4_e2m1": "e2m1",
    "fp6_e3m2": "e3m2", "fp6_e2m3": "e2m3", "mxfp6_e3m2": "e3m2", "mxfp6_e2m3": "e2m3",
    "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2", "mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2",
    "mxint8": "int8",
}

# Element dtypes of torch and ml_dtypes that hold exactly one MX element format's codes (the same
# bits: tests/test_interop.py), by the dtype's name. ``get_format`` takes the dtype objects
# (torch.float8_e4m3fn, ml_dtypes.float6_e2m3fn, numpy.dtype(ml_dtypes.float4_e2m1fn)) and their
# names as strings ("float8_e4m3fn", "torch.float8_e4m3fn").
DTYPE_NAMES = {
    "float4_e2m1fn_x2": "e2m1",  # torch: two E2M1 codes per byte, element 0 in the low nibble
    "float4_e2m1fn": "e2m1",     # ml_dtypes: one code per byte (low 4 bits)
    "float6_e2m3fn": "e2m3",     # ml_dtypes: one code per byte (low 6 bits)
    "float6_e3m2fn": "e3m2",
    "float8_e4m3fn": "e4m3",     # torch and ml_dtypes: OCP E4M3 (NaN at S.1111.111, no Inf)
    "float8_e5m2": "e5m2",       # torch and ml_dtypes: OCP E5M2 (IEEE-style Inf and NaN)
}

# Names that look like MX formats but are not one (or not one format): refused with the reason.
NOT_MX = {
    "float8_e4m3fnuz": "FNUZ E4M3 (bias 8, NaN at 0x80, no -0; AMD MI300) is another format "
                       "than OCP E4M3, not an MX element format: use float8_e4m3fn or 'e4m3'",
    "float8_e5m2fnuz": "FNUZ E5M2 (bias 16, NaN at 0x80, no Inf or -0) is another format than "
                       "OCP E5M2, not an MX element format: use float8_e5m2 or 'e5m2'",
    "float8_e4m3b11fnuz": "E4M3 with bias 11 (FNUZ) is not an MX element format",
    "float8_e4m3": "ml_dtypes' IEEE-style E4M3 (Inf at 0x78, NaN at 0x79-0x7F) is another format "
                   "than OCP E4M3: use float8_e4m3fn or 'e4m3'",
    "float8_e3m4": "E3M4 is not an MX element format",
    "float8_e8m0fnu": "E8M0 is the MX scale format, not an element format",
    "mxfp8": "MXFP8 names two element formats: 'mxfp8_e4m3' or 'mxfp8_e5m2'",
    "fp8": "FP8 names two element formats: 'fp8_e4m3' or 'fp8_e5m2'",
    "mxfp6": "MXFP6 names two element formats: 'mxfp6_e2m3' or 'mxfp6_e3m2'",
    "fp6": "FP6 names two element formats: 'fp6_e2m3' or 'fp6_e3m2'",
}

_ACCEPTED = ("an ElementFormat; a name (e2m1, e2m3, e3m2, e4m3, e5m2, int8) or an alias "
             "(mxfp4, fp4, mxfp6_e2m3, mxfp6_e3m2, mxfp8_e4m3, mxfp8_e5m2, mxint8, ...); "
             "a torch dtype (float4_e2m1fn_x2, float8_e4m3fn, float8_e5m2); an ml_dtypes type "
             "or numpy dtype (float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, float8_e4m3fn, "
             "float8_e5m2); or such a dtype's name")


def _dtype_name(fmt) -> tuple[str, str] | None:
    """(library, dtype name) of a torch dtype, an ml_dtypes scalar type or a numpy dtype, found
    from the object's type and module (neither torch nor numpy is imported here); else None."""
    cls = type(fmt)
    if cls.__module__ == "torch" and cls.__name__ == "dtype":
        return "torch", str(fmt).removeprefix("torch.")
    if isinstance(fmt, type) and fmt.__module__.partition(".")[0] in ("ml_dtypes", "numpy"):
        return fmt.__module__.partition(".")[0], fmt.__name__  # ml_dtypes.float8_e4m3fn
    if cls.__module__.partition(".")[0] == "numpy" and isinstance(getattr(fmt, "type", None),
                                                                 type):  # a numpy dtype
        return fmt.type.__module__.partition(".")[0], fmt.type.__name__
    return None


def get_format(fmt) -> ElementFormat:
    """The element format named or typed by ``fmt``.

    Accepts an ElementFormat; a canonical name or an alias (``ALIASES``, case-insensitive); a
    torch dtype or an ml_dtypes type/numpy dtype that stores one MX format's codes bit for bit
    (``DTYPE_NAMES``: torch.float4_e2m1fn_x2, torch/ml_dtypes float8_e4m3fn and float8_e5m2,
    ml_dtypes float4_e2m1fn, float6_e2m3fn, float6_e3m2fn), or such a dtype's name. Other
    formats with similar names (FNUZ FP8, ml_dtypes' IEEE-style float8_e4m3, the E8M0 scale,
    the ambiguous 'mxfp8'/'fp6') raise a ValueError saying why; unknown names a ValueError
    listing the valid ones; other objects a TypeError naming what was given and what is
    accepted. Imports neither torch nor ml_dtypes.
    """
    if isinstance(fmt, ElementFormat):
        return fmt
    lib = None
    if isinstance(fmt, str):
        key = fmt.strip().lower()
        for prefix in ("torch.", "ml_dtypes.", "np.", "numpy."):
            key = key.removeprefix(prefix)
    else:
        found = _dtype_name(fmt)
        if found is None:
            raise TypeError(f"format must be {_ACCEPTED}; got {fmt!r} of type "
                            f"{type(fmt).__module__}.{type(fmt).__qualname__}")
        lib, key = found
    if key in NOT_MX:
        raise ValueError(f"{fmt!r}: {NOT_MX[key]}")
    if lib is not None:  # a dtype object: only the dtypes that hold an MX format's codes
        if lib not in ("torch", "ml_dtypes") or key not in DTYPE_NAMES:
            hint = (" (MXINT8 codes are int8 two's complement x 2^-6: pass 'int8')"
                    if key == "int8" else "")
            raise ValueError(f"{lib} dtype {fmt!r} holds no MX element format's codes{hint}; "
                             f"accepted dtypes: torch float4_e2m1fn_x2, float8_e4m3fn, "
                             f"float8_e5m2; ml_dtypes float4_e2m1fn, float6_e2m3fn, "
                             f"float6_e3m2fn, float8_e4m3fn, float8_e5m2")
        return FORMATS[DTYPE_NAMES[key]]
    key = ALIASES.get(key, DTYPE_NAMES.get(key, key))
    try:
        return FORMATS[key]
    except KeyError:
        raise ValueError(
            f"unknown MX element format {fmt!r}; expected one of {sorted(FORMATS)}, an alias "
            f"({', '.join(sorted(ALIASES))}) or a dtype name ({', '.join(sorted(DTYPE_NAMES))})"
        ) from None
