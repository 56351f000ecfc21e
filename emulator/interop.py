"""Emulator MX arrays as ml_dtypes-typed NumPy arrays, and back.

ml_dtypes stores every one of its small float types one code per byte, in the low bits, with the
sign in the format's top bit: exactly our code layout (``MXArray.codes``). So the typed arrays
are views of the same bytes, no copy:

  e2m1  ml_dtypes.float4_e2m1fn    e4m3  ml_dtypes.float8_e4m3fn
  e2m3  ml_dtypes.float6_e2m3fn    e5m2  ml_dtypes.float8_e5m2
  e3m2  ml_dtypes.float6_e3m2fn    int8  numpy.int8 (two's complement; value = int8 x 2^-6)
  scale ml_dtypes.float8_e8m0fnu

Decoding (``.astype(np.float32)``) agrees with ours on every code, bit for bit, except the bits
of a NaN: ml_dtypes keeps the code's sign (E4M3 0xFF, E5M2 0xFD..0xFF give -NaN), we write
+qNaN; and a NaN scale (0xFF) makes the whole block NaN in both. So ``codes.astype(f32) *
repeat(scales.astype(f32))`` equals ``dequantize`` except for NaN signs (tests/test_interop.py).
FP4 and FP6 have no NaN code, so they agree bit for bit outside NaN-scale blocks. Encoding is where ml_dtypes differs
(``astype`` from float: FP4/FP6 NaN -> a zero of the opposite sign, where we write +0; E4M3
overflow -> NaN and E5M2 overflow -> Inf, where the spec saturates: tests/test_conversion.py):
quantize with ``ocpmx.emulator.quantize``, then view.

A byte with bits above an FP4/FP6 code (never written by ml_dtypes' casts or by us): ml_dtypes
takes the magnitude from the bits below the sign bit and makes the value negative when any bit
at or above the sign bit is set (0x11 as float4_e2m1fn is -0.5). ``from_ml_dtypes`` maps such
bytes to the code of that value (a copy); clean codes are taken as a view.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..spec import BLOCK_SIZE, get_format, parse_rotation
from .block_quantize import MXArray

ML_DTYPES = {
    "e2m1": np.dtype(ml_dtypes.float4_e2m1fn), "e2m3": np.dtype(ml_dtypes.float6_e2m3fn),
    "e3m2": np.dtype(ml_dtypes.float6_e3m2fn), "e4m3": np.dtype(ml_dtypes.float8_e4m3fn),
    "e5m2": np.dtype(ml_dtypes.float8_e5m2), "int8": np.dtype(np.int8),
}
E8M0_DTYPE = np.dtype(ml_dtypes.float8_e8m0fnu)


def ml_dtype(fmt) -> np.dtype:
    """The NumPy dtype (ml_dtypes; int8 for MXINT8) that holds ``fmt``'s codes one per byte."""
    return ML_DTYPES[get_format(fmt).name]


def codes_as_ml_dtypes(mx: MXArray) -> np.ndarray:
    """``mx.codes`` viewed as the format's ml_dtypes type (numpy.int8 for MXINT8), no copy."""
    return mx.codes.view(ml_dtype(mx.fmt))


def scales_as_ml_dtypes(mx: MXArray) -> np.ndarray:
    """``mx.scales`` viewed as ``ml_dtypes.float8_e8m0fnu``, no copy."""
    return mx.scales.view(E8M0_DTYPE)


def from_ml_dtypes(codes: np.ndarray, scales: np.ndarray, *, axis: int = -1,
                   block_size: int = BLOCK_SIZE, rotation=None, fmt=None) -> MXArray:
    """An MXArray from ml_dtypes-typed codes (the format follows from the dtype; numpy.int8 or
    uint8 codes need ``fmt``) and float8_e8m0fnu (or uint8) scales, in the MXArray layout
    (scales: the codes' shape with ``axis`` divided by ``block_size``)."""
    codes, scales = np.asarray(codes), np.asarray(scales)
    if codes.dtype in (np.dtype(np.uint8), np.dtype(np.int8)):
        if fmt is None and codes.dtype == np.int8:
            fmt = "int8"
        if fmt is None:
            raise TypeError("uint8 codes do not say their format: pass fmt=")
        f = get_format(fmt)
    else:
        f = get_format(codes.dtype)
        if fmt is not None and get_format(fmt) is not f:
            raise ValueError(f"fmt {get_format(fmt).name} disagrees with the codes' dtype "
                             f"{codes.dtype} ({f.name})")
    if scales.dtype not in (E8M0_DTYPE, np.dtype(np.uint8)):
        raise TypeError(f"scales must be ml_dtypes.float8_e8m0fnu or uint8, got {scales.dtype}")
    raw = codes.view(np.uint8)
    if f.bits < 8 and raw.size and raw.max() >= f.num_codes:  # the value ml_dtypes reads
        mag = raw & np.uint8(f.sign_bit - 1)
        raw = np.where(raw >= f.sign_bit, mag | np.uint8(f.sign_bit), mag).astype(np.uint8)
    if codes.ndim == 0 or not -codes.ndim <= axis < codes.ndim:
        raise ValueError(f"axis {axis} is out of range for codes of shape {codes.shape}")
    axis %= codes.ndim
    expect = codes.shape[:axis] + (codes.shape[axis] // block_size,) + codes.shape[axis + 1:]
    if codes.shape[axis] % block_size or scales.shape != expect:
        raise ValueError(f"scales of shape {scales.shape} do not match codes of shape "
                         f"{codes.shape} blocked by {block_size} along axis {axis} "
                         f"(expected {expect})")
    return MXArray(raw, scales.view(np.uint8), f, axis, block_size, parse_rotation(rotation))
