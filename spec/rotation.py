"""Block Hadamard rotations: the one rotation type, and the one parser of rotation names.

A rotation of size n (16 or 32) acts on every consecutive group of n elements along the
quantization axis (a 16-point rotation acts on each half of a 32-element block). It is the
orthonormal Sylvester-Hadamard transform H_n / sqrt(n), optionally preceded by a diagonal of
random signs drawn from Philox.

Defined order of operations, so that every kernel can match it bit for bit:
  1. signs: x_j <- -x_j where bit 0 of philox(sign_seed, j) is 1, j the position in the group
     (exact);
  2. butterfly stages h = 1, 2, 4, ..., n/2: for each pair (i, i + h) inside each 2h-chunk,
     (a, b) <- (a + b, a - b), each a float32 add (round to nearest even);
  3. one float32 multiply by float32(1 / sqrt(n)) (0.25 for n = 16, exact);
  4. every NaN becomes +qNaN (0x7FC00000): IEEE 754 leaves a NaN result's sign open (x86
     gives Inf - Inf a negative NaN, GPUs a positive canonical one), and formats with a NaN
     code (E4M3, E5M2) would otherwise encode that sign.

Names (``parse_rotation``): None or 'none'; 'hadamard16', 'hadamard32'; 'random_sign16:SEED',
'random_sign32:SEED' (random signs drawn from SEED); 'signs16:MASK', 'signs32:MASK' (explicit
signs, MASK an integer, 0x-prefixed hex or decimal, bit p set: position p negated); or a
``Rotation``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .philox import philox_word

ROTATION_SIZES = (16, 32)
ROTATION_NAMES = ("none", "hadamard16", "hadamard32", "random_sign16:SEED", "random_sign32:SEED",
                  "signs16:MASK", "signs32:MASK")


@dataclass(frozen=True)
class Rotation:
    """A block Hadamard rotation: ``size`` 16 or 32; ``sign_seed`` None for the deterministic
    Sylvester matrix, or an int for random signs drawn from Philox with that seed; or ``mask``,
    the signs given explicitly (bit p set: position p negated)."""

    size: int = 16
    sign_seed: int | None = None
    mask: int | None = None

    def __post_init__(self):
        if self.size not in ROTATION_SIZES:
            raise ValueError(f"rotation size must be 16 or 32, got {self.size}")
        if self.mask is not None:
            if self.sign_seed is not None:
                raise ValueError("a rotation takes a sign_seed or a mask, not both")
            if not 0 <= self.mask < 1 << self.size:
                raise ValueError(f"a {self.size}-point rotation's sign mask must be in "
                                 f"[0, 2^{self.size}), got {self.mask:#x}")

    @property
    def has_signs(self) -> bool:
        """Whether the signs may differ from +1 (drawn from a seed, or given)."""
        return self.sign_seed is not None or self.mask is not None

    @property
    def scale(self) -> np.float32:
        """float32(1 / sqrt(size)), the multiply of step 3."""
        return np.float32(0.25) if self.size == 16 else np.float32(1.0 / np.sqrt(32.0))

    @property
    def name(self) -> str:
        """The name ``parse_rotation`` reads back."""
        if self.mask is not None:
            return f"signs{self.size}:{self.mask:#x}"
        if self.sign_seed is None:
            return f"hadamard{self.size}"
        return f"random_sign{self.size}:{self.sign_seed}"

    def sign_mask(self) -> int:
        """The signs as the bits of one integer (bit p set: position p negated); 0 for none."""
        if self.mask is not None:
            return self.mask
        return sum(1 << p for p, neg in enumerate(_sign_bits(self.size, self.sign_seed)) if neg)

    def signs(self) -> np.ndarray:
        """float32[size] of +-1 (all +1 for the deterministic rotation)."""
        m = self.sign_mask()
        return np.array([-1.0 if (m >> p) & 1 else 1.0 for p in range(self.size)], np.float32)

    def matrix(self) -> np.ndarray:
        """The rotation as a float64 matrix R (rows = outputs), y = R @ x; for references only."""
        h = np.array([[1.0]])
        while h.shape[0] < self.size:
            h = np.block([[h, h], [h, -h]])
        return h * np.float64(self.scale) * self.signs().astype(np.float64)[None, :]


@lru_cache(maxsize=4096)
def _sign_bits(size: int, sign_seed: int | None) -> tuple[bool, ...]:
    # cached: a fixed-sign recipe asks for the same signs in every GEMM of every step
    if sign_seed is None:
        return (False,) * size
    return tuple(bool(philox_word(sign_seed & (2**64 - 1), j) & 1) for j in range(size))


def parse_rotation(rotation) -> Rotation | None:
    """None for no rotation, else the ``Rotation`` a name (see the module doc) or object means."""
    if rotation is None or isinstance(rotation, Rotation):
        return rotation
    if isinstance(rotation, str):
        if rotation == "none":
            return None
        for size in ROTATION_SIZES:
            if rotation == f"hadamard{size}":
                return Rotation(size)
            head = f"random_sign{size}:"
            if rotation.startswith(head) and rotation[len(head):].isdigit():
                return Rotation(size, int(rotation[len(head):]))
            head = f"signs{size}:"
            if rotation.startswith(head):
                try:
                    return Rotation(size, mask=int(rotation[len(head):], 0))
                except ValueError as e:
                    if "sign mask" in str(e):
                        raise

    raise ValueError(f"unknown rotation {rotation!r}; expected None or one of "
                     f"{', '.join(ROTATION_NAMES)}, or a Rotation(size, sign_seed)")
