"""Philox4x32-10 in bulk (Numba): the words of ``ocpmx.spec.philox`` (the definition, in plain
Python), for stochastic rounding inside the kernels and for many offsets at once. A GPU kernel
calling ``tl.randint(seed, element_index)`` draws the same bits.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..spec import philox as definition

_ROUND_A = np.uint64(definition.ROUND_A)
_ROUND_B = np.uint64(definition.ROUND_B)
_KEY_A = np.uint64(definition.KEY_A)
_KEY_B = np.uint64(definition.KEY_B)
_MASK = np.uint64(0xFFFFFFFF)


SR_BITS = definition.SR_BITS
SR_GROUP = definition.SR_GROUP
SR_PER_WORD = definition.SR_PER_WORD


@nb.njit(cache=True, inline="always")
def philox4(seed, offset):
    """The four 32-bit outputs of Philox4x32-10 for (seed, counter (offset lo, offset hi, 0, 0));
    both uint64."""
    k0 = seed & _MASK
    k1 = (seed >> np.uint64(32)) & _MASK
    c0 = offset & _MASK
    c1 = (offset >> np.uint64(32)) & _MASK
    c2 = np.uint64(0)
    c3 = np.uint64(0)
    for _ in range(10):
        p0 = _ROUND_A * c0
        p2 = _ROUND_B * c2
        n0 = ((p2 >> np.uint64(32)) ^ c1 ^ k0) & _MASK
        n2 = ((p0 >> np.uint64(32)) ^ c3 ^ k1) & _MASK
        c1 = p2 & _MASK
        c3 = p0 & _MASK
        c0 = n0
        c2 = n2
        k0 = (k0 + _KEY_A) & _MASK
        k1 = (k1 + _KEY_B) & _MASK
    return c0, c1, c2, c3


@nb.njit(cache=True, inline="always")
def philox_word(seed, offset):
    """First 32-bit output of Philox4x32-10 for (seed, offset); both uint64 (tl.randint)."""
    return philox4(seed, offset)[0]


@nb.njit(cache=True, inline="always")
def stochastic_bits(seed, index):
    """Stochastic rounding's random bits of the element at flat index ``index`` (uint64s):
    ``ocpmx.spec.philox.stochastic_bits``, the definition."""
    w = philox4(seed, index // np.uint64(SR_GROUP))
    j = index % np.uint64(SR_GROUP)
    q = j // np.uint64(SR_PER_WORD)
    word = w[0] if q == 0 else (w[1] if q == 1 else (w[2] if q == 2 else w[3]))
    return (word >> (np.uint64(SR_BITS) * (j % np.uint64(SR_PER_WORD)))) & \
        np.uint64((1 << SR_BITS) - 1)


@nb.njit(cache=True, parallel=True)
def _philox_array(seed, offsets, out):
    for i in nb.prange(offsets.size):
        out[i] = philox_word(seed, offsets[i])


@nb.njit(cache=True)
def _philox_array_serial(seed, offsets, out):
    for i in range(offsets.size):
        out[i] = philox_word(seed, offsets[i])


# Below this many words one thread is faster than waking Numba's pool: a random-sign rotation
# draws 16 words per GEMM operand, and a parallel launch per draw cost ~1 ms on a 16-core host
# (and far more with several training processes competing for the cores).
SERIAL_BELOW = 1 << 14


def random_bits(seed: int, offsets) -> np.ndarray:
    """uint32 words for each offset (any integer array); equal to ``tl.randint(seed, offsets)``."""
    offs = np.ascontiguousarray(np.asarray(offsets).astype(np.uint64)).ravel()
    out = np.empty(offs.size, np.uint64)
    fill = _philox_array_serial if offs.size < SERIAL_BELOW else _philox_array
    fill(np.uint64(seed & 0xFFFFFFFFFFFFFFFF), offs, out)
    return out.astype(np.uint32).reshape(np.shape(offsets))
