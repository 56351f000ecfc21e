"""Philox4x32-10 (Salmon et al., SC'11), the counter-based generator behind stochastic rounding
and random-sign rotations: the definition, in plain Python, and the random bits each use.

The stream is Triton's ``tl.randint(seed, offset)``: key (k0, k1) = (seed & 0xffffffff,
seed >> 32), counter (c0, c1, c2, c3) = (offset & 0xffffffff, offset >> 32, 0, 0), ten rounds,
first output word. The emulator's Numba version (``ocpmx.emulator.philox``) computes the same
words in bulk; the tests check both against Random123's known answers.
"""
from __future__ import annotations

_M32 = 0xFFFFFFFF
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57  # the round multipliers
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85      # the key schedule's increments (golden ratio, sqrt 3)


def philox4x32(seed: int, counter: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The four output words of Philox4x32-10 for a 64-bit key and a 4-word counter."""
    k0, k1 = seed & _M32, (seed >> 32) & _M32
    c0, c1, c2, c3 = (c & _M32 for c in counter)
    for _ in range(10):
        p0, p2 = ROUND_A * c0, ROUND_B * c2
        c0, c1, c2, c3 = ((p2 >> 32) ^ c1 ^ k0) & _M32, p2 & _M32, \
            ((p0 >> 32) ^ c3 ^ k1) & _M32, p0 & _M32
        k0, k1 = (k0 + KEY_A) & _M32, (k1 + KEY_B) & _M32
    return c0, c1, c2, c3


def philox_word(seed: int, offset: int) -> int:
    """``tl.randint(seed, offset)``: the first word for counter (offset lo, offset hi, 0, 0)."""
    return philox4x32(seed, (offset & _M32, (offset >> 32) & _M32, 0, 0))[0]


# Stochastic rounding's random bits (Rounding.STOCHASTIC): SR_BITS per element. Elements are
# counted by their index in the K-major layout (the quantized axis moved last: the layout of
# the quantized output and of tl.dot_scaled's operands; for an element cast, the flat index).
# The SR_GROUP elements of indices c * SR_GROUP .. c * SR_GROUP + SR_GROUP - 1 (half a
# 32-block) share one Philox4x32-10 call with counter (c lo, c hi, 0, 0); element j of a group
# takes bits [SR_BITS * (j % SR_PER_WORD), ... + SR_BITS) of word j // SR_PER_WORD.
# Eight bits: an unrotated bf16 input has 8 significant bits, so in an element format's normal
# range its dropped fraction has at most 7 - MBITS bits and is compared whole. Values in the
# element's subnormal binade, float16 and float32 inputs, and rotated inputs (a Hadamard
# rotation's sums carry more significant bits than bf16) can lose fraction bits past the
# eighth: a bias below 2^-8 of an element quantum. Sixteen elements a call halve Philox's cost
# per element.
SR_BITS = 8
SR_PER_WORD = 32 // SR_BITS
SR_GROUP = 4 * SR_PER_WORD


def stochastic_bits(seed: int, index: int) -> int:
    """The SR_BITS random bits of the element at (K-major) index ``index``."""
    c, j = divmod(index, SR_GROUP)
    word = philox4x32(seed, (c & _M32, (c >> 32) & _M32, 0, 0))[j // SR_PER_WORD]
    return (word >> (SR_BITS * (j % SR_PER_WORD))) & ((1 << SR_BITS) - 1)
