"""Numba kernels of the golden model: exact scale selection and element encoding.

All arithmetic is on integers taken from the IEEE bits of the input, so every result
is exact by construction (no float log2, no float division). A value is split into
(sign, M, E) with |v| = M * 2^E and M normalized to p = mant_bits + 1 bits.

Conversion follows OCP MX v1.0 §6.3; the choices it leaves open are the defaults
listed in ``ocpmx.spec.rules.DEFAULT_CHOICES``.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .philox import philox_word

# input float layouts: (mantissa bits, exponent mask, exponent bias)
F32 = (23, 0xFF, 127)
F64 = (52, 0x7FF, 1023)

CLS_ZERO, CLS_FINITE, CLS_INF, CLS_NAN = 0, 1, 2, 3


@nb.njit(cache=True, inline="always")
def split(u, mb, emask, fbias):
    """Raw float bits (as uint64) -> (neg, M, E, cls); |v| = M * 2^E, M has mb+1 bits."""
    u = np.uint64(u)
    neg = np.int64((u >> np.uint64(mb + (8 if emask == 0xFF else 11))) & np.uint64(1))
    ef = np.int64((u >> np.uint64(mb)) & np.uint64(emask))
    mf = np.int64(u & np.uint64((1 << mb) - 1))
    if ef == emask:
        return neg, np.int64(0), np.int64(0), (CLS_NAN if mf != 0 else CLS_INF)
    if ef == 0:
        if mf == 0:
            return neg, np.int64(0), np.int64(0), CLS_ZERO
        m = mf
        e = np.int64(1 - fbias - mb)
        while m < (np.int64(1) << mb):
            m <<= 1
            e -= 1
        return neg, m, e, CLS_FINITE
    return neg, mf | (np.int64(1) << mb), ef - fbias - mb, CLS_FINITE


@nb.njit(cache=True, inline="always")
def scale_exponent(ua, mb, emask, fbias, fp, rule):
    """Shared exponent s from the amax magnitude bits; returns (s, cls of amax).

    rule: 0 floor (§6.3), 1 ceil, 2 rceil, 3 even. s is clamped to [-127, 127].
    """
    neg, m, e, cls = split(ua, mb, emask, fbias)
    if cls != CLS_FINITE:
        return np.int64(-127), cls
    lg = e + mb  # floor(log2 amax), exact
    emax = fp[5]
    s = lg - emax
    if rule == 1:  # ceil(log2 amax) - emax
        if m != (np.int64(1) << mb):
            s += 1
    elif rule == 2:  # ceil(log2(amax / max)): mantissa of amax > mantissa of max
        if (m << fp[11]) > (fp[10] << mb):
            s += 1
    elif rule == 3:  # round amax's mantissa to the element's mantissa bits, ties up
        if m + (np.int64(1) << (mb - 1 - fp[3])) >= (np.int64(1) << (mb + 1)):
            s += 1
    if s < -127:
        s = np.int64(-127)
    if s > 127:
        s = np.int64(127)
    return s, cls


@nb.njit(cache=True, inline="always")
def encode(neg, m, e, cls, s, fp, rounding, rbits, mb):
    """Element code of (-1)^neg * m * 2^e / 2^s; RNE (rounding 0) or stochastic (1, with rbits).

    Overflow saturates to +-max; the sign of zero is kept (float formats).
    """
    is_int = fp[0]
    sign = np.int64(0)
    if neg != 0 and is_int == 0:
        sign = np.int64(1) << (fp[1] - 1)
    if cls == CLS_ZERO:
        return sign
    if cls == CLS_NAN:
        return (sign | fp[7]) if fp[7] >= 0 else np.int64(0)
    if cls == CLS_INF:
        if is_int:
            return (-fp[9]) & 0xFF if neg else fp[6]
        return sign | (fp[8] if fp[8] >= 0 else fp[6])
    mbits = fp[3]
    if is_int:
        qe = -mbits  # quantum 2^-6 relative to X
        ee = np.int64(0)
    else:
        lg = e + mb - s  # floor(log2(v / X)); m is normalized to mb + 1 bits
        ee = lg if lg > 1 - fp[4] else 1 - fp[4]  # element exponent, clamped to the subnormal one
        qe = ee - mbits
    shift = qe + s - e  # bits of m below the element's quantum
    if shift <= 0:
        if -shift >= 62 - mb:  # far past any element's range: keep n finite, saturation follows
            n = np.int64(1) << 40
        else:
            n = m << (-shift)
    elif shift >= 62:
        n = np.int64(0)
        if rounding == 1:
            k = shift - 32
            frac32 = (m >> k) if k < 63 else np.int64(0)
            if np.int64(rbits) < frac32:
                n = np.int64(1)
    else:
        n = m >> shift
        rem = m & ((np.int64(1) << shift) - 1)
        if rounding == 0:
            half = np.int64(1) << (shift - 1)
            if rem > half or (rem == half and (n & 1) == 1):
                n += 1
        else:
            if shift <= 32:
                frac32 = rem << (32 - shift)
            else:
                frac32 = rem >> (shift - 32)
            if np.int64(rbits) < frac32:
                n += 1
    if is_int:
        limit = fp[9] if neg else fp[6]
        if n > limit:
            n = limit
        return ((-n) & 0xFF) if neg else n
    mag = ((ee + fp[4] - 1) << mbits) + n
    if mag > fp[6]:
        mag = fp[6]
    return sign | mag


@nb.njit(cache=True, inline="always")
def nan_block_code(u, mb, emask, fbias, fp):
    """Element code in a block whose scale is NaN (0xFF): NaN and Inf keep their own encoding,
    finite values become a zero of their sign (the choice in spec.rules.DEFAULT_CHOICES)."""
    neg, m, e, cls = split(u, mb, emask, fbias)
    if cls == CLS_FINITE:
        cls = CLS_ZERO
    return encode(neg, m, e, cls, np.int64(-127), fp, 0, np.uint64(0), mb)


@nb.njit(cache=True, parallel=True)
def quantize_rows(u, rows, k, block, mb, emask, fbias, fp, rule, rounding, seed, inner,
                  codes, scales):
    """Block-quantize a (rows, k) array of raw float bits along its last axis.

    ``inner`` maps (row, col) back to the element's flat index in the caller's original
    layout (the counter for stochastic rounding): idx = ((row // inner) * k + col) * inner
    + row % inner.
    """
    nblk = k // block
    total = rows * nblk
    sign_mask = np.uint64((1 << (mb + (8 if emask == 0xFF else 11))) - 1)
    for b in nb.prange(total):
        r = b // nblk
        c0 = (b % nblk) * block
        base = r * k + c0
        amax = np.uint64(0)
        for j in range(block):
            a = np.uint64(u[base + j]) & sign_mask
            if a > amax:
                amax = a
        s, acls = scale_exponent(amax, mb, emask, fbias, fp, rule)
        if acls == CLS_NAN or acls == CLS_INF:
            scales[b] = 0xFF
            for j in range(block):
                codes[base + j] = np.uint8(nan_block_code(u[base + j], mb, emask, fbias, fp))
            continue
        scales[b] = np.uint8(s + 127)
        for j in range(block):
            neg, m, e, cls = split(u[base + j], mb, emask, fbias)
            rb = np.uint64(0)
            if rounding == 1:
                idx = ((r // inner) * k + c0 + j) * inner + (r % inner)
                rb = philox_word(seed, np.uint64(idx))
            codes[base + j] = np.uint8(encode(neg, m, e, cls, s, fp, rounding, rb, mb))


@nb.njit(cache=True, parallel=True)
def encode_elements(u, mb, emask, fbias, fp, rounding, seed, out):
    """Element conversion with scale 2^0 (a plain cast to the element format)."""
    for i in nb.prange(u.size):
        neg, m, e, cls = split(u[i], mb, emask, fbias)
        rb = np.uint64(0)
        if rounding == 1:
            rb = philox_word(seed, np.uint64(i))
        out[i] = np.uint8(encode(neg, m, e, cls, np.int64(0), fp, rounding, rb, mb))


@nb.njit(cache=True, parallel=True)
def dequantize_rows(codes, scales, rows, k, block, table, out):
    """out[r, j] = table[code] * 2^(scale - 127) rounded to float32; scale 0xFF -> NaN."""
    nblk = k // block
    for b in nb.prange(rows * nblk):
        sc = scales[b]
        base = (b // nblk) * k + (b % nblk) * block
        if sc == 0xFF:
            for j in range(block):
                out[base + j] = np.float32(np.nan)
        else:
            f = 2.0 ** (np.int64(sc) - 127)
            for j in range(block):
                out[base + j] = np.float32(table[codes[base + j]] * f)


@nb.njit(cache=True, parallel=True)
def quantize_rows_f32_rne(x, rows, k, block, fp, rule, nthreads, codes, scales):
    """Fast path for float32 input with RNE; bit-identical to ``quantize_rows`` (tested on every
    bf16 input and on random blocks).

    The block is scaled by 2^-s in float32 (exact for every element that can round to a nonzero
    code: only values far below half the element's smallest subnormal can underflow), then each
    element is rounded with integer RNE on its bits (element-normal range) or with the float32
    adder's RNE after adding 2^(emin - mbits + 23) (element-subnormal range, whose float32 ulp is
    the element's quantum). Works for every float format and MXINT8 (quantum 2^-6).
    """
    nblk = k // block
    total = rows * nblk
    is_int = fp[0]
    mbits = fp[3]
    bias = fp[4]
    maxc = fp[6]
    sign_bit = np.uint32(1) << np.uint32(fp[1] - 1)
    if is_int:
        min_norm = np.float32(np.inf)  # everything goes through the adder path
        magic = np.float32(2.0 ** (23 - mbits))  # float32 ulp 2^-6, the MXINT8 quantum
    else:
        min_norm = np.float32(2.0 ** (1 - bias))
        magic = np.float32(2.0 ** (1 - bias - mbits + 23))
    magic_arr = np.empty(1, np.float32)
    magic_arr[0] = magic
    magic_bits = magic_arr.view(np.uint32)[0]
    shift = np.uint32(23 - mbits)
    rebias = np.uint32((127 - bias) << mbits)
    e2m1 = not is_int and mbits == 1 and bias == 1 and maxc == 7
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
            s, acls = scale_exponent(amax, 23, 0xFF, 127, fp, rule)
            if acls == CLS_NAN or acls == CLS_INF:
                scales[b] = 0xFF
                for j in range(block):
                    codes[base + j] = np.uint8(nan_block_code(xb[base + j], 23, 0xFF, 127, fp))
                continue
            scales[b] = np.uint8(s + 127)
            inv = np.float32(2.0 ** (-s))
            if e2m1:  # FP4, the hot case: branch-free compares that the compiler vectorizes
                xf = x[base:base + block]
                out = codes[base:base + block]
                for j in range(block):
                    y = abs(xf[j]) * inv  # exact wherever the code can be nonzero (see above)
                    # E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6: the code counts the rounding
                    # thresholds y passes; at a tie (the midpoints) the even code wins, so '>'
                    # where the lower neighbour is even and '>=' where the upper one is; y > 5
                    # covers saturation
                    c = ((y > np.float32(0.25)) + (y >= np.float32(0.75)) + (y > np.float32(1.25))
                         + (y >= np.float32(1.75)) + (y > np.float32(2.5)) + (y >= np.float32(3.5))
                         + (y > np.float32(5.0)))
                    out[j] = np.uint8(c | ((blk[j] >> np.uint32(28)) & np.uint32(8)))
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
