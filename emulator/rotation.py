"""Block Hadamard rotations along the quantization axis, bit-exact in float32.

A rotation of size n (16 or 32) acts on every consecutive group of n elements along the
axis (a 16-point rotation acts on each half of a 32-element block). It is the orthonormal
Sylvester-Hadamard transform H_n / sqrt(n), optionally preceded by a diagonal of random
signs drawn from Philox (``random_sign``).

Defined order of operations, so that a kernel can match it bit for bit:
  1. signs: x_j <- -x_j where bit 0 of philox(sign_seed, j) is 1, j the position in the group
     (exact);
  2. butterfly stages h = 1, 2, 4, ..., n/2: for each pair (i, i + h) inside each 2h-chunk,
     (a, b) <- (a + b, a - b), each a float32 add (round to nearest even);
  3. one float32 multiply by float32(1 / sqrt(n)) (0.25 for n = 16, exact);
  4. every NaN becomes +qNaN (0x7FC00000): IEEE 754 leaves a NaN result's sign open (x86
     gives Inf - Inf a negative NaN, GPUs a positive canonical one), and formats with a NaN
     code (E4M3, E5M2) would otherwise encode that sign.
"""
from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np

from .philox import random_bits

ROTATION_NAMES = ("hadamard16", "hadamard32")


@dataclass(frozen=True)
class Rotation:
    """A block Hadamard rotation: ``size`` 16 or 32; ``sign_seed`` None for the deterministic
    Sylvester matrix, or an int for random signs drawn from Philox with that seed."""

    size: int = 16
    sign_seed: int | None = None

    def __post_init__(self):
        if self.size not in (16, 32):
            raise ValueError(f"rotation size must be 16 or 32, got {self.size}")

    @property
    def scale(self) -> np.float32:
        return np.float32(0.25) if self.size == 16 else np.float32(1.0 / np.sqrt(32.0))

    def signs(self) -> np.ndarray:
        """float32[size] of +-1 (all +1 for the deterministic rotation)."""
        if self.sign_seed is None:
            return np.ones(self.size, np.float32)
        bits = random_bits(self.sign_seed, np.arange(self.size))
        return np.where(bits & 1, np.float32(-1), np.float32(1)).astype(np.float32)

    def matrix(self) -> np.ndarray:
        """The rotation as a float64 matrix R (rows = outputs), y = R @ x; for references only."""
        h = np.array([[1.0]])
        while h.shape[0] < self.size:
            h = np.block([[h, h], [h, -h]])
        return h * np.float64(self.scale) * self.signs().astype(np.float64)[None, :]


def as_rotation(rotation) -> Rotation | None:
    """Accept None, a Rotation, 'hadamard16', 'hadamard32', or ('random_sign', size, seed)."""
    if rotation is None or rotation == "none":
        return None
    if isinstance(rotation, Rotation):
        return rotation
    if rotation == "hadamard16":
        return Rotation(16)
    if rotation == "hadamard32":
        return Rotation(32)
    raise ValueError(
        f"unknown rotation {rotation!r}; expected None, 'hadamard16', 'hadamard32' or "
        "Rotation(size, sign_seed)")


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
    """Apply a block rotation along ``axis`` to a float array (computed in float32)."""
    rot = as_rotation(rotation)
    x = np.asarray(x, dtype=np.float32)
    if rot is None:
        return x.copy()
    moved = np.moveaxis(x, axis, -1)
    return np.moveaxis(rotate_last_axis(moved, rot), -1, axis)
