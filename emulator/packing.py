"""Packing element codes into bytes along the last axis.

FP4 (§5.4.3): two codes per byte, element 0 in the low nibble (PyTorch
float4_e2m1fn_x2, Triton dot_scaled, torchao, ONNX, AMD).
FP6 (§5.4.2): four codes per three bytes, little-endian bit order: code i of a group
occupies bits [6i, 6i + 6) of the 24-bit little-endian word.
FP8 / INT8: one code per byte (packing is the identity).
"""
from __future__ import annotations

import numpy as np

from ..spec import ElementFormat, get_format


def pack(codes: np.ndarray, fmt) -> np.ndarray:
    """uint8 codes (one per element) -> packed bytes along the last axis."""
    fmt = get_format(fmt)
    codes = _check_codes(codes, fmt)
    if fmt.bits == 8:
        return codes.copy()
    if fmt.bits == 4:
        _check_multiple(codes, 2, fmt)
        return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    if fmt.bits == 6:
        _check_multiple(codes, 4, fmt)
        c = codes.astype(np.uint32)
        word = c[..., 0::4] | (c[..., 1::4] << 6) | (c[..., 2::4] << 12) | (c[..., 3::4] << 18)
        out = np.stack([(word >> (8 * i)) & 0xFF for i in range(3)], axis=-1).astype(np.uint8)
        return out.reshape(*codes.shape[:-1], codes.shape[-1] // 4 * 3)
    raise AssertionError(f"no packing for {fmt.bits}-bit codes")


def unpack(packed: np.ndarray, fmt) -> np.ndarray:
    """Inverse of ``pack``: packed bytes -> uint8 codes, one per element."""
    fmt = get_format(fmt)
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise TypeError(f"packed data must be uint8, got {packed.dtype}")
    if fmt.bits == 8:
        return packed.copy()
    if fmt.bits == 4:
        out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8)
        out[..., 0::2] = packed & 0x0F
        out[..., 1::2] = packed >> 4
        return out
    if packed.shape[-1] % 3:
        raise ValueError(f"FP6 packed length {packed.shape[-1]} is not a multiple of 3")
    b = packed.reshape(*packed.shape[:-1], -1, 3).astype(np.uint32)
    word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
    out = np.stack([(word >> (6 * i)) & 0x3F for i in range(4)], axis=-1).astype(np.uint8)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] // 3 * 4)


def _check_codes(codes, fmt: ElementFormat) -> np.ndarray:
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise TypeError(f"codes must be uint8, got {codes.dtype}")
    if fmt.bits < 8 and codes.size and int(codes.max()) >= fmt.num_codes:
        raise ValueError(f"code {int(codes.max()):#x} does not fit in {fmt.bits} bits ({fmt.name})")
    return codes


def _check_multiple(codes, n, fmt):
    if codes.shape[-1] % n:
        raise ValueError(f"{fmt.name} packs {n} codes per group; last axis {codes.shape[-1]} is not a multiple")
