"""Block Hadamard rotations along the quantization axis, bit-exact in float32 (the order of
operations is defined in ``ocpmx.spec.rotation``)."""
from __future__ import annotations

import numba as nb
import numpy as np

from ..spec.rotation import Rotation, parse_rotation


@nb.njit(cache=True, parallel=True)
def _fwht_rows(x, n, signs, scale):
    groups = x.size // n
    for g in nb.prange(groups):
        base = g * n
        for j in range(n):
            x[base + j] = x[base + j] * signs[j]
        h = 1
        while h < n:
            for i in range(0, n, 2 * h):
                for j in range(i, i + h):
                    a = x[base + j]
                    b = x[base + j + h]
                    x[base + j] = np.float32(a + b)
                    x[base + j + h] = np.float32(a - b)
            h *= 2
        for j in range(n):
            v = np.float32(x[base + j] * scale)
            # a NaN's sign after arithmetic is not IEEE-defined (x86 makes Inf - Inf negative,
            # GPUs return a positive canonical NaN): the rotation's NaN is +qNaN everywhere
            x[base + j] = v if v == v else np.float32(np.nan)


def rotate_last_axis(x: np.ndarray, rotation: Rotation) -> np.ndarray:
    """Rotate a float32 array along its last axis (length divisible by rotation.size); new array."""
    if x.shape[-1] % rotation.size:
        raise ValueError(f"axis length {x.shape[-1]} is not divisible by the rotation size {rotation.size}")
    out = np.array(x, dtype=np.float32, order="C", copy=True)
    _fwht_rows(out.reshape(-1), rotation.size, rotation.signs(), rotation.scale)
    return out


def rotate(x, rotation, axis: int = -1) -> np.ndarray:
    """Apply a block rotation (a ``Rotation`` or a name, see ``ocpmx.spec.parse_rotation``) along
    ``axis`` to a float array (computed in float32)."""
    rot = parse_rotation(rotation)
    x = np.asarray(x, dtype=np.float32)
    if rot is None:
        return x.copy()
    moved = np.moveaxis(x, axis, -1)
    return np.moveaxis(rotate_last_axis(moved, rot), -1, axis)
