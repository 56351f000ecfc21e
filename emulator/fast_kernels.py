"""The golden model's fast path (Numba): float32 input with RNE, the common case, bit-identical to
``reference_kernels.quantize_rows`` (the tests check the two equal on every bf16 input and on
random blocks; ``quantize(..., path='reference')`` selects the reference).

The block amax and the element loop are written so that LLVM vectorizes them: slices of known
length, ``max`` instead of a branch, and for FP4 (8 magnitudes) a sum of threshold compares.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .reference_kernels import CLS_INF, CLS_NAN, nan_block_code, scale_exponent


@nb.njit(cache=True, parallel=True)
def quantize_rows_fast(x, rows, k, block, kf, thresholds, rule, nthreads, codes, scales):
    """Block-quantize float32 ``x`` (rows, k) along its last axis with RNE.

    The block is scaled by 2^-s in float32 (exact for every element that can round to a nonzero
    code: only values far below half the element's smallest subnormal can underflow), then each
    element is rounded with integer RNE on its bits (element-normal range) or with the float32
    adder's RNE after adding 2^(emin - mbits + 23) (element-subnormal range, whose float32 ulp is
    the element's quantum). Works for every float format and MXINT8 (quantum 2^-6). A format
    with 8 magnitudes (FP4) is encoded instead by counting the rounding thresholds it passes
    (``ocpmx.spec.rounding_thresholds``; ties go to the even code).
    """
    nblk = k // block
    total = rows * nblk
    is_int = kf.is_int
    mbits = kf.mbits
    maxc = kf.max_code
    sign_bit = np.uint32(kf.sign_bit)
    if is_int:
        min_norm = np.float32(np.inf)  # everything goes through the adder path
        magic = np.float32(2.0 ** (23 - mbits))  # float32 ulp 2^-6, the MXINT8 quantum
    else:
        min_norm = np.float32(2.0 ** (1 - kf.bias))
        magic = np.float32(2.0 ** (1 - kf.bias - mbits + 23))
    magic_arr = np.empty(1, np.float32)
    magic_arr[0] = magic
    magic_bits = magic_arr.view(np.uint32)[0]
    shift = np.uint32(23 - mbits)
    rebias = np.uint32((127 - kf.bias) << mbits)
    count = not is_int and kf.magnitudes == 8
    if count:  # hoisted: seven loop-invariant scalars, compared like constants
        t0, t1, t2, t3 = thresholds[0], thresholds[1], thresholds[2], thresholds[3]
        t4, t5, t6 = thresholds[4], thresholds[5], thresholds[6]
    else:
        t0 = t1 = t2 = t3 = t4 = t5 = t6 = np.float32(0)
    per = (total + nthreads - 1) // nthreads
    for t in nb.prange(nthreads):
        buf = np.empty(block, np.float32)
        bits = buf.view(np.uint32)
        xb = x.view(np.uint32)
        for b in range(t * per, min(total, (t + 1) * per)):
            base = (b // nblk) * k + (b % nblk) * block
            # slices (non-negative, known length) and max(): loops the compiler vectorizes
            blk = xb[base:base + block]
            amax = np.uint32(0)
            for j in range(block):
                amax = max(amax, blk[j] & np.uint32(0x7FFFFFFF))
            s, acls = scale_exponent(amax, 23, 0xFF, 127, kf, rule)
            if acls == CLS_NAN or acls == CLS_INF:
                scales[b] = 0xFF
                for j in range(block):
                    codes[base + j] = np.uint8(nan_block_code(xb[base + j], 23, 0xFF, 127, kf))
                continue
            scales[b] = np.uint8(s + 127)
            inv = np.float32(2.0 ** (-s))
            if count:  # FP4, the hot case: branch-free compares that the compiler vectorizes
                xf = x[base:base + block]
                out = codes[base:base + block]
                for j in range(block):
                    y = abs(xf[j]) * inv  # exact wherever the code can be nonzero (see above)
                    # the code counts the rounding thresholds y passes; at a tie the even code
                    # wins: '>' where the lower neighbour is even, '>=' where the upper one is;
                    # past the last threshold the code saturates at the largest
                    c = ((y > t0) + (y >= t1) + (y > t2) + (y >= t3) + (y > t4) + (y >= t5)
                         + (y > t6))
                    out[j] = np.uint8(c | ((blk[j] >> np.uint32(31)) * sign_bit))
                continue
            for j in range(block):
                buf[j] = abs(x[base + j]) * inv
            for j in range(block):
                y = buf[j]
                neg = (xb[base + j] >> np.uint32(31)) != 0
                if y >= min_norm:
                    yb = bits[j]
                    lsb = (yb >> shift) & np.uint32(1)
                    mag = ((yb + (np.uint32(1) << (shift - np.uint32(1))) - np.uint32(1) + lsb) >> shift) - rebias
                else:
                    buf[j] = y + magic
                    mag = bits[j] - magic_bits
                if mag > maxc:
                    mag = np.uint32(maxc)
                if is_int:
                    if neg:
                        codes[base + j] = np.uint8((np.uint32(256) - mag) & np.uint32(0xFF))
                    else:
                        codes[base + j] = np.uint8(mag)
                else:
                    codes[base + j] = np.uint8(mag | (sign_bit if neg else np.uint32(0)))
