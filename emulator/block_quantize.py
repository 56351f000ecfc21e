"""Block quantization (OCP MX v1.0 §6.3) and dequantization: the emulator's public API."""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numba
import numpy as np

from ..spec import (BLOCK_SIZE, ElementFormat, Rotation, Rounding, ScaleRule, get_format, lower,
                    parse_rotation, rounding_thresholds)
from . import fast_kernels, packing, reference_kernels
from .decode import decode_table
from .rotation import rotate_last_axis
from ..spec.rules import Conversion

# the fast kernel's threshold argument where it encodes without thresholds: read-only like
# ``rounding_thresholds``'s arrays, so that Numba compiles one signature, not two
_NO_THRESHOLDS = np.zeros(7, np.float32)
_NO_THRESHOLDS.setflags(write=False)


@dataclass
class MXArray:
    """An MX-quantized tensor.

    codes   uint8, one element code per element, same shape as the input.
    scales  uint8 E8M0 codes; the input's shape with the quantized axis divided by block_size.
    fmt     the element format (``ocpmx.spec.ElementFormat``).
    axis    the quantized (block) axis, normalized to be non-negative.
    rotation  the rotation applied before quantizing (None for none); dequantize does not undo it.
    """

    codes: np.ndarray
    scales: np.ndarray
    fmt: ElementFormat
    axis: int
    block_size: int = BLOCK_SIZE
    rotation: Rotation | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.codes.shape

    def pack(self) -> np.ndarray:
        """Codes packed along the quantized axis (FP4: 2 per byte, low nibble first; FP6: 4 per 3 bytes)."""
        moved = np.moveaxis(self.codes, self.axis, -1)
        return np.moveaxis(packing.pack(moved, self.fmt), -1, self.axis)

    def dequantize(self) -> np.ndarray:
        return dequantize(self)


_INPUT_LAYOUTS = {
    np.dtype(np.float32): (np.uint32, reference_kernels.F32),
    np.dtype(np.float64): (np.uint64, reference_kernels.F64),
}
PATHS = ("auto", "reference", "fast")


def _as_supported(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        return x.astype(np.float32)  # exact
    if x.dtype not in _INPUT_LAYOUTS:
        raise TypeError(f"input dtype must be float32, float64 or bfloat16 (ml_dtypes), got {x.dtype}")
    return x


def _check_axis(x: np.ndarray, axis: int, block_size: int) -> int:
    if x.ndim == 0:
        raise ValueError("cannot block-quantize a 0-d array")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for an array of {x.ndim} dimensions")
    axis %= x.ndim
    if not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if x.shape[axis] % block_size:
        raise ValueError(
            f"axis {axis} has length {x.shape[axis]}, not divisible by the block size {block_size}")
    return axis


def quantize(x, fmt, *, axis: int = -1, block_size: int = BLOCK_SIZE, scale_rule="floor",
             rounding="rne", seed: int = 0, rotation=None, int8_min: int = -127,
             path: str = "auto", conversion="ocp") -> MXArray:
    """Quantize ``x`` to MX format ``fmt`` in blocks of ``block_size`` along ``axis``.

    scale_rule: 'floor' (§6.3, default), 'ceil', 'rceil' (NVIDIA), 'even' (torchao/AMD)
                (or an ``ocpmx.spec.ScaleRule``).
    rounding:   'rne' (§6.3, default) or 'stochastic' (8 random bits per element from
                Philox4x32-10 keyed by ``seed``, counted by the element's index in the K-major
                layout, the quantized axis last: ``ocpmx.spec.philox.stochastic_bits``).
    rotation:   None, 'hadamard16', 'hadamard32', 'random_sign16:SEED', or a ``Rotation``;
                applied in float32 along ``axis`` before quantizing (float64 inputs are rounded
                to float32 first).
    int8_min:   -127 (default, symmetric) or -128 for MXINT8.
    path:       'auto' (the fast kernel where it applies: float32 data and RNE), 'reference'
                (the readable reference kernel), or 'fast' (an error where it does not apply).
                Both give the same bits; the choice exists to test that.
    conversion: 'ocp' (default: the element conversion of §6.3 as above) or 'gfx950' (AMD
                gfx950's V_CVT_SCALEF32_* element conversion under the scale ``scale_rule``
                chose: ``ocpmx.emulator.gfx950``; float32/float16/bfloat16 input, no MXINT8).
    """
    if Conversion.parse(conversion) == Conversion.GFX950:
        from . import gfx950
        return gfx950.quantize(x, fmt, axis=axis, block_size=block_size, scale_rule=scale_rule,
                               rounding=rounding, seed=seed, rotation=rotation,
                               int8_min=int8_min, path=path)
    fmt = get_format(fmt)
    rule, rnd = ScaleRule.parse(scale_rule), Rounding.parse(rounding)
    kf = lower(fmt, int8_min)
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; expected one of {PATHS}")
    x = _as_supported(x)
    axis = _check_axis(x, axis, block_size)
    rot = parse_rotation(rotation)
    if rot is not None and block_size % rot.size:
        raise ValueError(f"block_size {block_size} is not a multiple of the rotation size {rot.size}")
    moved = np.moveaxis(x, axis, -1)
    if rot is not None:
        moved = rotate_last_axis(moved.astype(np.float32), rot)
    moved = np.ascontiguousarray(moved)
    uint, layout = _INPUT_LAYOUTS[moved.dtype]
    k = moved.shape[-1]
    rows = moved.size // k if k else 0
    codes = np.empty(moved.shape, np.uint8)
    scales = np.empty(moved.shape[:-1] + (k // block_size,), np.uint8)
    fast = moved.dtype == np.float32 and rnd == Rounding.RNE
    if path == "fast" and not fast:
        raise ValueError("the fast path takes float32 data (after the rotation) and RNE")
    if moved.size and fast and path != "reference":
        thresholds = rounding_thresholds(fmt) if kf.magnitudes == 8 and not kf.is_int \
            else _NO_THRESHOLDS
        fast_kernels.quantize_rows_fast(moved.reshape(-1), rows, k, block_size, kf, thresholds,
                                        int(rule), numba.get_num_threads(), codes.reshape(-1),
                                        scales.reshape(-1))
    elif moved.size:
        reference_kernels.quantize_rows(moved.reshape(-1).view(uint), rows, k, block_size,
                                        *layout, kf, int(rule), int(rnd),
                                        np.uint64(seed & 0xFFFFFFFFFFFFFFFF),
                                        codes.reshape(-1), scales.reshape(-1))
    return MXArray(np.moveaxis(codes, -1, axis), np.moveaxis(scales, -1, axis), fmt, axis,
                   block_size, rot)


def dequantize(mx: MXArray) -> np.ndarray:
    """MX codes and scales -> float32 values, exactly (overflow past float32 gives +-Inf)."""
    codes = np.ascontiguousarray(np.moveaxis(mx.codes, mx.axis, -1))
    scales = np.ascontiguousarray(np.moveaxis(mx.scales, mx.axis, -1))
    if codes.dtype != np.uint8 or scales.dtype != np.uint8:
        raise TypeError("MXArray codes and scales must be uint8")
    k = codes.shape[-1]
    if scales.shape != codes.shape[:-1] + (k // mx.block_size,):
        raise ValueError(f"scales shape {scales.shape} does not match codes {codes.shape} "
                         f"with block size {mx.block_size}")
    out = np.empty(codes.shape, np.float32)
    if codes.size:
        reference_kernels.dequantize_rows(codes.reshape(-1), scales.reshape(-1), codes.size // k, k,
                                mx.block_size, decode_table(mx.fmt), out.reshape(-1))
    return np.moveaxis(out, -1, mx.axis)


def cast(x, fmt, *, rounding="rne", seed: int = 0, int8_min: int = -127,
         conversion="ocp") -> np.ndarray:
    """Element conversion with no scale (scale 2^0): float values -> uint8 codes.

    Same rounding and saturation as ``quantize``; NaN -> the format's NaN code (or 0 where it
    has none); +-Inf -> the Inf code (E5M2) or +-max. ``conversion='gfx950'``: AMD gfx950's
    scaled conversion under scale code 127 instead (``ocpmx.emulator.gfx950``).
    """
    if Conversion.parse(conversion) == Conversion.GFX950:
        from . import gfx950
        return gfx950.cast(x, fmt, rounding=rounding, seed=seed, int8_min=int8_min)
    fmt = get_format(fmt)
    rnd = Rounding.parse(rounding)
    kf = lower(fmt, int8_min)
    x = np.ascontiguousarray(_as_supported(x))
    uint, layout = _INPUT_LAYOUTS[x.dtype]
    out = np.empty(x.shape, np.uint8)
    if x.size:
        reference_kernels.cast_elements(x.reshape(-1).view(uint), *layout, kf, int(rnd),
                                        np.uint64(seed & 0xFFFFFFFFFFFFFFFF), out.reshape(-1))
    return out
