"""The golden model's reference kernels (Numba): exact scale selection and element encoding,
written to be read against the spec. ``fast_kernels`` holds the fast path for the common case
(float32 input, RNE); the tests check the two equal.

All arithmetic is on integers taken from the IEEE bits of the input, so every result
is exact by construction (no float log2, no float division). A value is split into
(sign, M, E) with |v| = M * 2^E and M normalized to p = mant_bits + 1 bits.

Conversion follows OCP MX v1.0 §6.3; the choices it leaves open are the defaults
listed in ``ocpmx.spec.rules.DEFAULT_CHOICES``. Format parameters come as a
``ocpmx.spec.KernelFormat`` (``kf``); scale rules and roundings as the ints of
``ocpmx.spec.ScaleRule`` and ``ocpmx.spec.Rounding``.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..spec.rules import Rounding, ScaleRule
from .philox import SR_BITS, stochastic_bits

# the options as constants Numba folds into the code
CEIL, RCEIL, EVEN = int(ScaleRule.CEIL), int(ScaleRule.RCEIL), int(ScaleRule.EVEN)
STOCHASTIC = int(Rounding.STOCHASTIC)

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
def scale_exponent(ua, mb, emask, fbias, kf, rule):
    """Shared exponent s from the amax magnitude bits; returns (s, cls of amax).

    rule: a ``ScaleRule`` (floor is §6.3's). s is clamped to [-127, 127].
    """
    neg, m, e, cls = split(ua, mb, emask, fbias)
    if cls != CLS_FINITE:
        return np.int64(-127), cls
    lg = e + mb  # floor(log2 amax), exact
    s = lg - kf.emax
    if rule == CEIL:  # ceil(log2 amax) - emax
        if m != (np.int64(1) << mb):
            s += 1
    elif rule == RCEIL:  # ceil(log2(amax / max)): mantissa of amax > mantissa of max
        if (m << kf.rceil_shift) > (kf.rceil_num << mb):
            s += 1
    elif rule == EVEN:  # round amax's mantissa to the element's mantissa bits, ties up
        if m + (np.int64(1) << (mb - 1 - kf.mbits)) >= (np.int64(1) << (mb + 1)):
            s += 1
    if s < -127:
        s = np.int64(-127)
    if s > 127:
        s = np.int64(127)
    return s, cls


@nb.njit(cache=True, inline="always")
def encode(neg, m, e, cls, s, kf, rounding, rbits, mb):
    """Element code of (-1)^neg * m * 2^e / 2^s; RNE or stochastic: up iff rbits (SR_BITS random
    bits) < the fraction's first SR_BITS bits (truncated).

    Overflow saturates to +-max; the sign of zero is kept (float formats).
    """
    is_int = kf.is_int
    sign = np.int64(0)
    if neg != 0 and not is_int:
        sign = np.int64(kf.sign_bit)
    if cls == CLS_ZERO:
        return sign
    if cls == CLS_NAN:
        return (sign | kf.nan_code) if kf.nan_code >= 0 else np.int64(0)
    if cls == CLS_INF:
        if is_int:
            return (-kf.neg_max) & 0xFF if neg else np.int64(kf.max_code)
        return sign | (kf.inf_code if kf.inf_code >= 0 else kf.max_code)
    mbits = kf.mbits
    if is_int:
        qe = np.int64(-mbits)  # quantum 2^-6 relative to X
        ee = np.int64(0)
    else:
        lg = e + mb - s  # floor(log2(v / X)); m is normalized to mb + 1 bits
        ee = lg if lg > 1 - kf.bias else np.int64(1 - kf.bias)  # clamped to the subnormal one
        qe = ee - mbits
    shift = qe + s - e  # bits of m below the element's quantum
    if shift <= 0:
        if -shift >= 62 - mb:  # far past any element's range: keep n finite, saturation follows
            n = np.int64(1) << 40
        else:
            n = m << (-shift)
    elif shift >= 62:
        n = np.int64(0)
        if rounding == STOCHASTIC:
            k = shift - SR_BITS
            frac = (m >> k) if k < 63 else np.int64(0)
            if np.int64(rbits) < frac:
                n = np.int64(1)
    else:
        n = m >> shift
        rem = m & ((np.int64(1) << shift) - 1)
        if rounding != STOCHASTIC:
            half = np.int64(1) << (shift - 1)
            if rem > half or (rem == half and (n & 1) == 1):
                n += 1
        else:  # the fraction's first SR_BITS bits
            if shift <= SR_BITS:
                frac = rem << (SR_BITS - shift)
            else:
                frac = rem >> (shift - SR_BITS)
            if np.int64(rbits) < frac:
                n += 1
    if is_int:
        limit = np.int64(kf.neg_max if neg else kf.max_code)
        if n > limit:
            n = limit
        return ((-n) & 0xFF) if neg else n
    mag = ((ee + kf.bias - 1) << mbits) + n
    if mag > kf.max_code:
        mag = np.int64(kf.max_code)
    return sign | mag


@nb.njit(cache=True, inline="always")
def nan_block_code(u, mb, emask, fbias, kf):
    """Element code in a block whose scale is NaN (0xFF): NaN and Inf keep their own encoding,
    finite values become a zero of their sign (the choice in spec.rules.DEFAULT_CHOICES)."""
    neg, m, e, cls = split(u, mb, emask, fbias)
    if cls == CLS_FINITE:
        cls = CLS_ZERO
    return encode(neg, m, e, cls, np.int64(-127), kf, 0, np.uint64(0), mb)


@nb.njit(cache=True, parallel=True)
def quantize_rows(u, rows, k, block, mb, emask, fbias, kf, rule, rounding, seed, codes, scales):
    """Block-quantize a (rows, k) array of raw float bits along its last axis: the reference
    algorithm, any input width, every scale rule and rounding.

    Stochastic rounding counts each element by its index in this layout (the quantized axis
    last: K-major), r * k + col.
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
        s, acls = scale_exponent(amax, mb, emask, fbias, kf, rule)
        if acls == CLS_NAN or acls == CLS_INF:
            scales[b] = 0xFF
            for j in range(block):
                codes[base + j] = np.uint8(nan_block_code(u[base + j], mb, emask, fbias, kf))
            continue
        scales[b] = np.uint8(s + 127)
        for j in range(block):
            neg, m, e, cls = split(u[base + j], mb, emask, fbias)
            rb = np.uint64(0)
            if rounding == STOCHASTIC:
                rb = stochastic_bits(seed, np.uint64(base + j))
            codes[base + j] = np.uint8(encode(neg, m, e, cls, s, kf, rounding, rb, mb))


@nb.njit(cache=True, parallel=True)
def cast_elements(u, mb, emask, fbias, kf, rounding, seed, out):
    """Element conversion with scale 2^0 (a plain cast to the element format)."""
    for i in nb.prange(u.size):
        neg, m, e, cls = split(u[i], mb, emask, fbias)
        rb = np.uint64(0)
        if rounding == STOCHASTIC:
            rb = stochastic_bits(seed, np.uint64(i))
        out[i] = np.uint8(encode(neg, m, e, cls, np.int64(0), kf, rounding, rb, mb))


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
