"""Error statistics of a quantization: what `ocpmx quantize` prints and experiments log."""
from __future__ import annotations

import numpy as np

from .block_quantize import MXArray, dequantize
from .decode import decode_scale
from .rotation import rotate


def unrotate(y: np.ndarray, mx: MXArray) -> np.ndarray:
    """Undo the block rotation of a dequantized tensor (float64; for measuring error only)."""
    if mx.rotation is None:
        return y.astype(np.float64)
    r = mx.rotation.matrix()  # orthonormal: inverse = transpose
    moved = np.moveaxis(y.astype(np.float64), mx.axis, -1)
    groups = moved.reshape(*moved.shape[:-1], -1, r.shape[0])
    back = (groups @ r).reshape(moved.shape)  # x = R^T y, applied per group as y @ R
    return np.moveaxis(back, -1, mx.axis)


def error_stats(x, mx: MXArray) -> dict:
    """relative_error (||deq - x|| / ||x||, in the input's space), saturated_fraction (elements
    clamped to +-max), zero_flushed_fraction (nonzero inputs that became 0), nan_blocks, and
    scale_histogram {exponent: count} of the E8M0 scales (NaN scales under 'nan')."""
    x64 = np.asarray(x, dtype=np.float64)
    deq = dequantize(mx)
    finite_blocks = mx.scales != 0xFF
    xs = x64
    if mx.rotation is not None:
        xs = rotate(x64.astype(np.float32), mx.rotation, mx.axis).astype(np.float64)
    scale = np.repeat(decode_scale(mx.scales).astype(np.float64), mx.block_size, axis=mx.axis)
    ok = np.isfinite(xs) & np.isfinite(scale)
    scaled = np.where(ok, np.abs(xs) / np.where(ok, scale, 1.0), 0.0)
    saturated = ok & (scaled > mx.fmt.max_normal)
    flushed = ok & (xs != 0) & (deq == 0)
    err = unrotate(deq, mx) - x64
    fin = np.isfinite(err)
    denom = np.linalg.norm(x64[fin])
    rel = float(np.linalg.norm(err[fin]) / denom) if denom > 0 else 0.0
    exps, counts = np.unique(mx.scales[finite_blocks].astype(np.int64) - 127, return_counts=True)
    hist = {int(e): int(c) for e, c in zip(exps, counts)}
    if (~finite_blocks).any():
        hist["nan"] = int((~finite_blocks).sum())
    n = max(xs.size, 1)
    return {
        "relative_error": rel,
        "saturated_fraction": float(saturated.sum() / n),
        "zero_flushed_fraction": float(flushed.sum() / n),
        "nan_blocks": int((~finite_blocks).sum()),
        "scale_histogram": hist,
    }
