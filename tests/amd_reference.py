"""A second, independent model of AMD gfx950's scaled conversions, for the tests only.

Written from AMD's descriptions (CDNA4 ISA §12.11, V_CVT_SCALEF32_*; ROCm HIP
``amd_hip_ocp_host.hpp``, ``from_float`` / ``from_float_sr`` / ``to_float``) as *value*
arithmetic, one element at a time, in plain Python: the input's exact value is taken with
``float.as_integer_ratio``, divided by the scale exactly, and then rounded on the element
format's grid. It shares no code with ``ocpmx.emulator.gfx950`` (which works on the bit
fields) nor with ``ocpmx.spec``: the formats' parameters and AMD's special outputs are typed
here by hand.
"""
from __future__ import annotations

import math
import struct

# name -> (mantissa bits, exponent bias, largest finite value); the smallest normal is
# 2^(1 - bias), the smallest subnormal 2^(1 - bias - mantissa bits).
FORMATS = {
    "e2m1": (1, 1, 6.0),
    "e2m3": (3, 1, 7.5),
    "e3m2": (2, 3, 28.0),
    "e4m3": (3, 7, 448.0),
    "e5m2": (2, 15, 57344.0),
}
SIGN_BIT = {"e2m1": 0x8, "e2m3": 0x20, "e3m2": 0x20, "e4m3": 0x80, "e5m2": 0x80}
# AMD's outputs for NaN (and under a NaN scale), and for Inf and overflow, sign added:
NAN_OUT = {"e2m1": 0x7, "e2m3": 0x1F, "e3m2": 0x1F, "e4m3": 0x7F, "e5m2": 0x7E}
OVERFLOW_OUT = {"e2m1": 0x7, "e2m3": 0x1F, "e3m2": 0x1F, "e4m3": 0x7F, "e5m2": 0x7C}
# source type -> fraction bits (the stochastic form adds that many minus the target's mantissa
# bits of the random word)
SOURCE_FRACTION_BITS = {"float32": 23, "float16": 10, "bfloat16": 7}


def source_value(bits: int, source: str) -> tuple[int, float]:
    """(sign, value as a Python float, exact) of raw source bits."""
    if source == "float32":
        v = struct.unpack("<f", struct.pack("<I", bits))[0]
        return bits >> 31, v
    if source == "bfloat16":
        v = struct.unpack("<f", struct.pack("<I", bits << 16))[0]
        return bits >> 15, v
    if source == "float16":
        v = struct.unpack("<e", struct.pack("<H", bits))[0]
        return bits >> 15, v
    raise ValueError(source)


def _grid(fmt):
    """value -> magnitude code of every finite value of the format, from its definition."""
    m, bias, vmax = FORMATS[fmt]
    out = {}
    for code in range(1 << 7):
        e, f = code >> m, code & ((1 << m) - 1)
        v = math.ldexp(f, 1 - bias - m) if e == 0 else math.ldexp((1 << m) + f, e - bias - m)
        if v > vmax:
            break
        out[v] = code
    return out


GRID = {f: _grid(f) for f in FORMATS}


def _floor_log2(num: int, den: int) -> int:
    """floor(log2(num / den)) for positive integers, den a power of two."""
    return num.bit_length() - den.bit_length()


def convert(bits: int, source: str, fmt: str, scale_code: int, sr_word: int | None = None) -> int:
    """The code gfx950 writes for one element (raw ``bits`` of type ``source``) under the E8M0
    ``scale_code``: RNE, or with ``sr_word`` the stochastic form fed that 32-bit word."""
    m, bias, vmax = FORMATS[fmt]
    sign_bit, emin = SIGN_BIT[fmt], 1 - bias
    negative, v = source_value(bits, source)
    sign = sign_bit if negative else 0
    # specials first; a NaN scale (0xFF) turns every element, zeros too, into the NaN output
    if math.isnan(v) or scale_code == 0xFF:
        return sign | NAN_OUT[fmt]
    if math.isinf(v):
        return sign | OVERFLOW_OUT[fmt]
    if v == 0:
        return sign
    # y = |v| / 2^(scale_code - 127), exactly, as num / den with den a power of two
    num, den = abs(v).as_integer_ratio()
    s = scale_code - 127
    if s >= 0:
        den <<= s
    else:
        num <<= -s
    e = _floor_log2(num, den)                 # y in [2^e, 2^(e+1))
    q = max(e, emin) - m                      # the target's quantum at y
    if sr_word is None:
        # round y / 2^q to the nearest integer, ties to the even one
        if q >= 0:
            whole, rest, unit = divmod(num, den << q) + (den << q,)
        else:
            whole, rest, unit = divmod(num << -q, den) + (den,)
        if 2 * rest > unit or (2 * rest == unit and whole % 2 == 1):
            whole += 1
    else:
        # AMD: the source significand, cut (truncated) to the source's own precision at the
        # target's exponent max(e, emin); add the word's top k bits below the kept mantissa;
        # truncate. k = source fraction bits - target mantissa bits.
        pf = SOURCE_FRACTION_BITS[source]
        k = pf - m
        u = max(e, emin) - pf                 # the source's precision there: 2^u
        t = (num << -u) // den if u < 0 else num // (den << u)
        whole = (t + (sr_word >> (32 - k))) >> k
    value = math.ldexp(whole, q)
    if value > vmax:
        return sign | OVERFLOW_OUT[fmt]
    return sign | GRID[fmt][value]


def upcast_float32(code: int, fmt: str, scale_code: int) -> float:
    """V_CVT_SCALEF32_PK_F32_*: the float32 value gfx950 gives for an element code under a scale
    code (as ``to_float``: NaN code or NaN scale -> NaN; E5M2's Inf code -> Inf; the scaled
    value's exponent past float32's range -> Inf; else the exact value, rounded to float32)."""
    import numpy as np
    m, bias, vmax = FORMATS[fmt]
    sign_bit = SIGN_BIT[fmt]
    mag = code & (sign_bit - 1)
    sgn = -1.0 if code & sign_bit else 1.0
    if scale_code == 0xFF or (fmt == "e4m3" and mag == 0x7F) or (fmt == "e5m2" and mag > 0x7C):
        return float("nan")
    if fmt == "e5m2" and mag == 0x7C:
        return sgn * math.inf
    value = {c: v for v, c in GRID[fmt].items()}[mag]
    if value == 0:
        return sgn * 0.0
    scaled = math.ldexp(value, scale_code - 127)
    if math.frexp(scaled)[1] - 1 > 127:       # biased exponent >= 255: "gfx950 HW behavior"
        return sgn * math.inf
    return float(np.float32(sgn * scaled))
