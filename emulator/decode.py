"""Decoding element and scale codes (§5.3, §5.4), derived from the format table."""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..spec import E8M0, ElementFormat, get_format


def decode_code(fmt, code: int) -> float:
    """Value of one element code, by the format's definition (``ElementFormat.value``)."""
    return get_format(fmt).value(code)


@lru_cache(maxsize=None)
def decode_table(fmt: ElementFormat) -> np.ndarray:
    """float64[256]: value of every code (codes past the format's width are NaN)."""
    table = np.full(256, np.nan)
    for c in range(fmt.num_codes):
        table[c] = fmt.value(c)
    table.setflags(write=False)
    return table


def decode(codes, fmt) -> np.ndarray:
    """Element codes -> float32 values (scale 2^0)."""
    fmt = get_format(fmt)
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"codes must be uint8, got {codes.dtype}")
    return decode_table(fmt)[codes].astype(np.float32)


def decode_scale(codes) -> np.ndarray:
    """E8M0 codes -> float32: 2^(c - 127); 0xFF -> NaN; code 0 is 2^-127 (an FP32 subnormal)."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"scale codes must be uint8, got {codes.dtype}")
    exps = codes.astype(np.int64) - E8M0.bias
    out = np.ldexp(np.ones(codes.shape), exps).astype(np.float32)
    out[codes == E8M0.nan_code] = np.nan
    return out


def cast_scale(values) -> np.ndarray:
    """float -> E8M0 code (§5.3): 2^floor(log2 v), taken from the exponent bits, clamped to
    [2^-127, 2^127]; NaN, +-Inf -> 0xFF. Exact for every power of two. E8M0 has no zero and no
    sign: zero or negative values raise."""
    v = np.asarray(values, dtype=np.float64)
    if np.any(v <= 0):
        raise ValueError("E8M0 has no zero or negative values; got a value <= 0")
    nonfinite = ~np.isfinite(v)
    _, e = np.frexp(np.where(nonfinite, 1.0, v))
    codes = np.clip(e.astype(np.int64) - 1 + E8M0.bias, 0, E8M0.nan_code - 1).astype(np.uint8)
    codes[nonfinite] = E8M0.nan_code
    return codes
