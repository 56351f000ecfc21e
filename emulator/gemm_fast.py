"""Fast path of ``mx_matmul``: the same bits as the reference kernel (``accumulate.py``,
``_gemm_reference``), with the products summed by vectorized floating-point arithmetic that is
exact by construction.

OCP MX v1.0 §6.2: Dot(A, B) = X_A * X_B * sum_i P_A,i * P_B,i, one shared scale X per block of
32 elements. The reference kernel evaluates every product into a multi-word integer, one output
at a time. Here the work is split in two:

1. **Partial sums (O(M*N*K), vectorized).** K is cut into *segments* of s elements that lie in
   one block and in one accumulation chunk: s = block for ``exact`` and ``fp32_sequential``,
   s = gcd(L, block) for a ``ChunkedModel`` with chunk L (L may divide the block, be a
   multiple of it, or neither: L = 48 gives segments of 16). Each element code is decoded to an
   integer on a per-format grid, value = I * 2^gamma (E2M1: multiples of 2^-1, E2M3 2^-3, E3M2
   2^-4, E4M3 2^-9, E5M2 2^-16, INT8 2^-6). In a segment every product of row m of A and row n
   of B then equals I_a * I_b * 2^E with one E = gamma_a + gamma_b + (X_a - 127) + (X_b - 127),
   so the segment's partial sum is P * 2^E with the integer P = sum_k I_a,k * I_b,k. P is
   computed in float32 where s * max|I_a| * max|I_b| <= 2^24 (E2M1, E2M3, E3M2, INT8 among
   themselves) and in float64 where it is <= 2^53 (the rest): every partial sum of integers
   within that bound is exact, whatever the order of the additions (FMA and reassociation
   included). Where one product alone can pass 2^53 (E5M2 x E4M3, E5M2 x E5M2) an operand is
   split by element exponent into two *planes* (the small and the large values, each on its own
   grid), and each pair of planes gives its own exact partial sum. Four rows of A go against
   all of B^T at a time (a register-blocked loop over n); ranges of rows run on threads.
2. **The model's combination (O(M*N*K/s), elementwise over the outputs).** Only here do the
   models differ:

   ``exact``  the terms P * 2^E (an integer below 2^53 times a power of two: exact in float64)
     are summed in float64. All terms of an output are multiples of 2^g, g the smallest
     element exponent in A's block plus that in B's, so the float64 sum is exact while the sum
     of the magnitudes stays below 2^53 * 2^g. That is tracked per output, and the sum rounded
     once to float32 (RNE). An output that fails the bound (blocks 2^40 apart, say) is
     recomputed by the reference's multi-word integer sum.
   ``fp32_sequential``  each block's exact value P * 2^E is rounded to float32 and added into
     the float32 accumulator, as in the reference. With planes a block's value is the sum of
     its plane terms; where that float64 sum could be inexact, the multi-word sum decides.
   ``ChunkedModel``  the reference aligns every product and the accumulator of a chunk to
     q = lead - F, lead the largest leading-bit exponent among them, truncating (or rounding)
     each one on its own. A partial sum knows no single product, so the step from it is taken
     only where it provably truncates none: q <= the lowest possible set bit of a product
     (the row's smallest element exponent plus the column's, scales applied), and the
     accumulator either keeps its bits at 2^q or q is known exactly (the accumulator's leading
     bit is at least the products' bound: the row's largest element's times the column's,
     times 2). Then the aligned sum is align(acc, q) + sum P * 2^E, a multiple of 2^q below
     (L + 1) * 2^(F + 1) <= 2^53: exact in float64, rounded to float32 (RNE, or RTZ by
     dropping the low 29 fraction bits of a normal result). The other (output, chunk) pairs -
     a product truncated for real (common for E4M3 under F = 13), q uncertain, a subnormal or
     -0 accumulator, an RTZ result outside the normal range - take the reference's step
     product by product, vectorized over those outputs: products in float64 (exact), q from
     the largest |product|, each aligned with trunc/rint after scaling by 2^-q (exact), the
     aligned integers summed exactly. An accumulator at +-Inf (RNE overflow) stays there.

Special values (NaN/Inf codes, the NaN scale 0xFF) take no part in the sums (their grid value
is 0); a mask pass then applies the reference's rules to the outputs that meet one. Where no
plane split of at most two planes keeps the partial sums exact, or where a ChunkedModel has
(L + 1) * 2^(F + 1) > 2^53, the fast path does not apply and ``mx_matmul`` runs the reference.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numba as nb
import numpy as np
from numba import types
from numba.extending import intrinsic

from ..spec import ElementFormat
from .accumulate import _NL, _RNE, _limb_add, _limbs_to_f32, _product, sig_exp_tables

_BIG = 1 << 20                 # sentinel exponent of an empty segment (no nonzero element)
_EXACT, _SEQUENTIAL, _CHUNKED = 0, 1, 2
_QCLAMP = 1000                 # |q| clamp before 2^q is built (real q lie within +-400)
_F32_MAX = float(np.finfo(np.float32).max)
_F32_DOWN = np.float32(1.0 - 2.0**-24)   # x * _F32_DOWN: the float32 below a normal x > 2^-126


# ------------------------------------------------------------------------------------------
# Bit casts (vectorizable, unlike array views that alias)
# ------------------------------------------------------------------------------------------
@intrinsic
def _i64_as_f64(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float64))
    return types.float64(types.int64), codegen


@intrinsic
def _f64_as_i64(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int64))
    return types.int64(types.float64), codegen


@intrinsic
def _f32_as_i32(typingctx, x):
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.int32))
    return types.int32(types.float32), codegen


@nb.njit(cache=True, inline="always")
def _pow2(e):
    """2^e as float64 for -1022 <= e <= 1023 (built from the bits: the loops stay vectorized)."""
    return _i64_as_f64(np.int64(e + 1023) << 52)


@nb.njit(cache=True, inline="always")
def _lead(x):
    """floor(log2 |x|) of a nonzero normal float64; -_BIG for 0."""
    return ((_f64_as_i64(x) >> 52) & 0x7FF) - 1023 if x != 0 else np.int64(-_BIG)


# ------------------------------------------------------------------------------------------
# Planning: integer grids per format pair
# ------------------------------------------------------------------------------------------
def _grid(fmt: ElementFormat, lo: int, hi: int):
    """One plane: the finite nonzero codes with exponent in [lo, hi] as integers on the grid
    2^gamma (gamma the smallest exponent there). Returns (gamma, value table, max |integer|)."""
    sig, exp, special = sig_exp_tables(fmt)
    inplane = (sig != 0) & (special == 0) & (exp >= lo) & (exp <= hi)
    gamma = int(exp[inplane].min())
    vals = np.where(inplane, sig * np.ldexp(1.0, np.where(inplane, exp - gamma, 0)), 0.0)
    return gamma, vals, float(np.abs(vals).max())


def _planes(fmt: ElementFormat, split: bool):
    """[(lo, hi)] exponent ranges: the whole format, or the split that keeps the larger of the
    two planes' integer ranges smallest."""
    sig, exp, special = sig_exp_tables(fmt)
    e = exp[(sig != 0) & (special == 0)]
    lo, hi = int(e.min()), int(e.max())
    if not split or lo == hi:
        return [(lo, hi)]
    t = min(range(lo + 1, hi + 1), key=lambda t: max(_grid(fmt, lo, t - 1)[2], _grid(fmt, t, hi)[2]))
    return [(lo, t - 1), (t, hi)]


@lru_cache(maxsize=None)
def plan(fmt_a: ElementFormat, fmt_b: ElementFormat, s: int):
    """(dtype, plane tables of A, plane tables of B) for segments of s elements, or None if no
    split of at most two planes per operand keeps every partial sum an exact float64 integer."""
    for split_a, split_b in ((False, False), (True, False), (False, True), (True, True)):
        pa = [_grid(fmt_a, lo, hi) for lo, hi in _planes(fmt_a, split_a)]
        pb = [_grid(fmt_b, lo, hi) for lo, hi in _planes(fmt_b, split_b)]
        bound = max(s * va * vb for _, _, va in pa for _, _, vb in pb)
        dtype = np.float32 if bound <= 2.0**24 and not (split_a or split_b) else np.float64
        if bound <= 2.0**53:
            return dtype, _plane_tables(fmt_a, pa, dtype), _plane_tables(fmt_b, pb, dtype)
    return None


def _plane_tables(fmt: ElementFormat, planes, dtype):
    """Per plane and code: integer value, exponent of the leading bit, exponent of the lowest
    set bit (codes outside the plane: 0, -_BIG, _BIG); and per plane its grid exponent."""
    sig, exp, _ = sig_exp_tables(fmt)
    bitlen = np.array([int(abs(v)).bit_length() for v in sig])
    n = len(planes)
    vals = np.zeros((n, 256), dtype)
    lead = np.full((n, 256), -_BIG, np.int32)
    low = np.full((n, 256), _BIG, np.int32)
    gammas = np.zeros(n, np.int64)
    for p, (gamma, v, _) in enumerate(planes):
        inplane = v != 0
        vals[p] = v
        lead[p, inplane] = (exp + bitlen - 1)[inplane]
        low[p, inplane] = exp[inplane]
        gammas[p] = gamma
    return vals, lead, low, gammas


@nb.njit(cache=True, parallel=True)
def _prepare(codes, scales, block, s, vals, lead, low, gammas, Q, qpow, qlead, qlow):
    """Per (segment j, plane p, row r): 2^(gamma_p + scale), the largest leading-bit exponent
    and the smallest element exponent, scale applied; and (unless Q is empty) the integer
    grid values Q[p, r, k]. A block with the NaN scale 0xFF contributes nothing (the mask
    pass makes its outputs NaN)."""
    R, K = codes.shape
    for r in nb.prange(R):
        crow = codes[r]
        for p in range(vals.shape[0]):
            if Q.shape[2]:
                vp, Qr = vals[p], Q[p, r]
                for k in range(K):
                    Qr[k] = vp[crow[k]] if scales[r, k // block] != 0xFF else 0
            ldp, lwp = lead[p], low[p]
            for j in range(K // s):
                k0 = j * s
                sc = scales[r, k0 // block]
                e = np.int64(sc) - 127
                ld, lo = -_BIG, _BIG
                for k in range(k0, k0 + s):
                    ld = max(ld, ldp[crow[k]])
                    lo = min(lo, lwp[crow[k]])
                if sc == 0xFF:
                    ld, lo = -_BIG, _BIG
                qpow[j, p, r] = _pow2(gammas[p] + e)
                qlead[j, p, r] = ld + e if ld > -_BIG else -_BIG
                qlow[j, p, r] = lo + e if lo < _BIG else _BIG


@nb.njit(cache=True, parallel=True)
def _values_transposed(codes, scales, block, vals, Qt):
    """Qt[p, k, r] = the integer grid value of codes[r, k] (0 under the NaN scale), written in
    64 x 64 tiles."""
    R, K = codes.shape
    nkt = -(-K // 64)
    for t in nb.prange(vals.shape[0] * nkt):
        p, k0 = t // nkt, t % nkt * 64
        vp = vals[p]
        for r0 in range(0, R, 64):
            for k in range(k0, min(k0 + 64, K)):
                for r in range(r0, min(r0 + 64, R)):
                    Qt[p, k, r] = vp[codes[r, k]] if scales[r, k // block] != 0xFF else 0


def _operand(codes, scales, block, s, tables, rows_to, transpose):
    """Grid values (planes, rows_to, K) (rows past R are 0), or transposed (planes, K, R), and
    the segment statistics (segments, planes, rows_to) of one operand."""
    R, K = codes.shape
    vals, lead, low, gammas = tables
    dtype = vals.dtype
    npl, nseg = len(gammas), K // s
    qpow = np.ones((nseg, npl, rows_to))
    qlead = np.full((nseg, npl, rows_to), -_BIG, np.int32)
    qlow = np.full((nseg, npl, rows_to), _BIG, np.int32)
    if transpose:
        Q = np.empty((npl, K, R), dtype)
        _values_transposed(codes, scales, block, vals, Q)
        _prepare(codes, scales, block, s, vals, lead, low, gammas, np.empty((0, 0, 0), dtype),
                 qpow, qlead, qlow)
    else:
        Q = np.empty((npl, rows_to, K), dtype)
        Q[:, R:] = 0
        _prepare(codes, scales, block, s, vals, lead, low, gammas, Q, qpow, qlead, qlow)
    return Q, qpow, qlead, qlow


# ------------------------------------------------------------------------------------------
# Partial sums: 4 rows of A against all of B^T over one segment
# ------------------------------------------------------------------------------------------
@nb.njit(cache=True, fastmath={"contract", "reassoc"})
def _partials(Q, Bt, m0, k0, s, P):
    """P[r, n] = sum over the segment [k0, k0 + s) of Q[m0 + r, k] * Bt[k, n], r < 4.

    Integer-valued operands with every partial sum below 2^24 (float32) or 2^53 (float64):
    each addition is exact, so any order (and FMA) gives the same value."""
    N = Bt.shape[1]
    k4 = k0 + s - s % 4
    first = True
    for k in range(k0, k4, 4):
        b0, b1, b2, b3 = Bt[k], Bt[k + 1], Bt[k + 2], Bt[k + 3]
        a00, a01, a02, a03 = Q[m0, k], Q[m0, k + 1], Q[m0, k + 2], Q[m0, k + 3]
        a10, a11, a12, a13 = Q[m0 + 1, k], Q[m0 + 1, k + 1], Q[m0 + 1, k + 2], Q[m0 + 1, k + 3]
        a20, a21, a22, a23 = Q[m0 + 2, k], Q[m0 + 2, k + 1], Q[m0 + 2, k + 2], Q[m0 + 2, k + 3]
        a30, a31, a32, a33 = Q[m0 + 3, k], Q[m0 + 3, k + 1], Q[m0 + 3, k + 2], Q[m0 + 3, k + 3]
        P0, P1, P2, P3 = P[0], P[1], P[2], P[3]
        if first:
            for n in range(N):
                x0, x1, x2, x3 = b0[n], b1[n], b2[n], b3[n]
                P0[n] = (a00 * x0 + a01 * x1) + (a02 * x2 + a03 * x3)
                P1[n] = (a10 * x0 + a11 * x1) + (a12 * x2 + a13 * x3)
                P2[n] = (a20 * x0 + a21 * x1) + (a22 * x2 + a23 * x3)
                P3[n] = (a30 * x0 + a31 * x1) + (a32 * x2 + a33 * x3)
        else:
            for n in range(N):
                x0, x1, x2, x3 = b0[n], b1[n], b2[n], b3[n]
                P0[n] += (a00 * x0 + a01 * x1) + (a02 * x2 + a03 * x3)
                P1[n] += (a10 * x0 + a11 * x1) + (a12 * x2 + a13 * x3)
                P2[n] += (a20 * x0 + a21 * x1) + (a22 * x2 + a23 * x3)
                P3[n] += (a30 * x0 + a31 * x1) + (a32 * x2 + a33 * x3)
        first = False
    for k in range(k4, k0 + s):   # segments whose length is not a multiple of 4
        b0 = Bt[k]
        for r in range(4):
            a = Q[m0 + r, k]
            Pr = P[r]
            if first:
                for n in range(N):
                    Pr[n] = a * b0[n]
            else:
                for n in range(N):
                    Pr[n] += a * b0[n]
        first = False


# ------------------------------------------------------------------------------------------
# Elementwise combination per model (one output row, all n)
# ------------------------------------------------------------------------------------------
@nb.njit(cache=True)
def _add_terms(Pr, rpow, rlead, rlow, cpow, clead, clow, init, chunked, tsum, tabs, tlead, tlow):
    """Add the terms P * 2^E to the running sums tsum (init: start them). Exact models also
    track sum |term| (tabs) and the lowest possible set bit low_a + low_b of nonzero terms
    (tlow); chunked ones a bound on the products' leading bit (lead_a + lead_b + 1, tlead)
    and their lowest set bit, zero terms included: products that cancel in P still get
    truncated one by one. One loop per array written: a loop that writes several arrays
    needs more run-time overlap checks than LLVM makes, and stays scalar."""
    N = Pr.shape[0]
    for n in range(N):
        t = np.float64(Pr[n]) * (rpow * cpow[n])
        tsum[n] = t if init else tsum[n] + t
    if chunked:
        for n in range(N):
            ld = rlead + clead[n] + 1
            tlead[n] = ld if init else max(tlead[n], ld)
    else:
        for n in range(N):
            t = abs(np.float64(Pr[n]) * (rpow * cpow[n]))
            tabs[n] = t if init else tabs[n] + t
    for n in range(N):
        lo = rlow + clow[n] if chunked or Pr[n] != 0 else _BIG
        tlow[n] = lo if init else min(tlow[n], lo)


@nb.njit(cache=True)
def _round_f32(v, out_rtz):
    """float64 -> float32, to nearest even or toward zero (overflow then gives +-max): the RNE
    cast, stepped back by one toward zero where it rounded away."""
    r = np.float32(v)
    if out_rtz:
        ar = abs(np.float64(r))
        if ar == np.inf:
            m = _F32_MAX
        elif ar <= 2.0**-126:
            m = ar - 2.0**-149
        else:
            m = np.float64(np.float32(ar) * _F32_DOWN)
        r = np.float32(math.copysign(m, v)) if ar > abs(v) else r
    return r


@nb.njit(cache=True, inline="always")
def _round_f32_normal(v, out_rtz):
    """(float32 of v, ok): RNE by the cast; RTZ by dropping the low 29 of the 52 fraction
    bits, exact only for results in the normal float32 range (or 0): ok is False elsewhere
    (then ``_round_f32``). Branch-free, unlike ``_round_f32``, so the loops vectorize."""
    if out_rtz:
        vb = _f64_as_i64(v)
        e11 = (vb >> 52) & 0x7FF
        ok = ((e11 >= 1023 - 126) & (e11 <= 1023 + 127)) | (v == 0)
        return np.float32(_i64_as_f64(vb & ~np.int64((1 << 29) - 1))), ok
    return np.float32(v), True


@nb.njit(cache=True)
def _chunk_fast(Pr, rpow, rlead, rlow, cpow, clead, clow, alone, tsum, tlead, tlow, acc, F,
                align_rne, out_rtz, new):
    """One chunk step for all n, where it provably truncates no product. The chunk's terms
    are Pr * rpow * cpow plus (unless alone) those gathered in tsum/tlead/tlow. new[n] gets
    the new accumulator, or NaN where the step does not apply: a product may be truncated,
    q is not known exactly, acc is subnormal or -0, or (RTZ) the result is not a normal
    float32; there the caller takes the product-by-product step. Returns the number of NaNs.
    (acc is only read and the result goes to another array: a loop that also writes one of
    the arrays it reads needs more run-time overlap checks than LLVM makes, and stays scalar.
    For the same reason the float32 bits come from a bit cast, not from an int32 view.)"""
    nflag = 0
    for n in range(acc.shape[0]):
        csum = np.float64(Pr[n]) * (rpow * cpow[n])
        lp = rlead + clead[n] + 1       # the products' leading bit is at most lp ...
        lo = rlow + clow[n]             # ... and their lowest set bit at least lo
        if not alone:
            csum += tsum[n]
            lp = max(lp, tlead[n])
            lo = min(lo, tlow[n])
        b = _f32_as_i32(acc[n])
        e8 = (b >> 23) & 0xFF
        x = np.float64(acc[n])
        la = e8 - 127 if e8 != 0 else -_BIG       # leading bit of acc (normal or zero)
        q = max(la, lp) - F                        # an upper bound; exact where la >= lp
        qc = min(max(q, -_QCLAMP), _QCLAMP)
        y = x * _pow2(-qc)
        y = np.rint(y) if align_rne else np.trunc(y)
        xa = y * _pow2(qc)                         # acc aligned to 2^q
        ok = (q <= lo) & ((la >= lp) | (xa == x)) & ((e8 != 0) | (b == 0))
        v = xa + csum                              # exact: see the module docstring
        r, normal = _round_f32_normal(v, out_rtz)
        ok &= normal
        r = np.float32(0.0) if v == 0 else r
        inf = e8 == 0xFF                           # +-Inf (RNE overflow) stays
        new[n] = acc[n] if inf else (r if ok else np.float32(np.nan))
        nflag += not (ok or inf)
    return nflag


@nb.njit(cache=True)
def _chunk_products(QA, apow, alead, QB, bpow, blead, s, m, c0, c1, F, align_rne, out_rtz, acc,
                    new, idx, cnt, dense, plead, sub, pmax, psum, w):
    """The chunk step product by product for n = idx[i], i < cnt (dense: for all n, with
    the results kept where new[n] is NaN), exactly as the reference does it: q = lead - F
    with the lead of the largest |product| or of acc; every product and acc are aligned to
    2^q on their own (the largest product is looked for only where acc's leading bit is
    below the products' bound). Products are formed in float64 from the grid integers and
    powers of two (exact); the aligned integers add up exactly (below (L + 1) * 2^(F + 1)
    <= 2^53)."""
    npa, npb = QA.shape[0], QB.shape[0]
    ncol = acc.shape[0] if dense else cnt
    # the products' leading bit is at most plead: where acc's is not below, q needs no products
    plead[:ncol] = -_BIG
    for j in range(c0 // s, c1 // s):
        for pa in range(npa):
            for pb in range(npb):
                ra, bl = alead[j, pa, m] + 1, blead[j, pb]
                for i in range(ncol):
                    plead[i] = max(plead[i], ra + bl[i if dense else idx[i]])
    nsub = 0   # the outputs whose q depends on the largest product: sub[:nsub]
    for i in range(ncol):
        n = i if dense else idx[i]
        if _lead(np.float64(acc[n])) < plead[i] and new[n] != new[n]:
            sub[nsub] = i
            nsub += 1
    pmax[:ncol] = 0.0
    for k in range(c0, c1 if nsub else c0):
        j = k // s
        for pa in range(npa):
            a = np.float64(QA[pa, m, k]) * apow[j, pa, m]
            if a == 0:
                continue
            for pb in range(npb):
                b, bp = QB[pb, k], bpow[j, pb]
                if dense and nsub * 4 > ncol:   # (a larger pmax elsewhere changes no q)
                    for n in range(ncol):
                        pmax[n] = max(pmax[n], abs(a * (np.float64(b[n]) * bp[n])))
                else:
                    for t in range(nsub):
                        i = sub[t]
                        n = i if dense else idx[i]
                        pmax[i] = max(pmax[i], abs(a * (np.float64(b[n]) * bp[n])))
    for i in range(ncol):   # psum <- acc aligned, in units of 2^q; pmax <- 2^-q
        x = np.float64(acc[i if dense else idx[i]])
        q = max(_lead(x), _lead(pmax[i])) - F
        qc = min(max(q, -_QCLAMP), _QCLAMP)
        y = x * _pow2(-qc)
        psum[i] = np.rint(y) if align_rne else np.trunc(y)
        pmax[i] = _pow2(-qc) if pmax[i] != 0 or x != 0 else 0.0   # 0: no term at all
    for j in range(c0 // s, c1 // s):
        for pb in range(npb):   # w = 2^(column scale) * 2^-q
            bp = bpow[j, pb]
            for i in range(ncol):
                w[pb, i] = bp[i if dense else idx[i]] * pmax[i]
        for k in range(j * s, j * s + s):
            for pa in range(npa):
                a = np.float64(QA[pa, m, k]) * apow[j, pa, m]
                if a == 0:
                    continue
                for pb in range(npb):
                    b, wb = QB[pb, k], w[pb]
                    if dense:
                        for n in range(ncol):
                            y = a * np.float64(b[n]) * wb[n]
                            psum[n] += np.rint(y) if align_rne else np.trunc(y)
                    else:
                        for i in range(cnt):
                            y = a * np.float64(b[idx[i]]) * wb[i]
                            psum[i] += np.rint(y) if align_rne else np.trunc(y)
    nbad = 0
    for i in range(ncol):
        n = i if dense else idx[i]
        v = psum[i] / pmax[i] if pmax[i] != 0 else 0.0
        r, ok = _round_f32_normal(v, out_rtz)
        # pmax == 0: no nonzero product and acc == +-0, so acc stays
        r = acc[n] if pmax[i] == 0 else (np.float32(0.0) if v == 0 else r)
        todo = new[n] != new[n]
        nbad += todo and not ok
        new[n] = r if todo and ok else new[n]
    if nbad:   # RTZ results outside the normal range
        for i in range(ncol):
            n = i if dense else idx[i]
            if new[n] != new[n]:
                new[n] = _round_f32(psum[i] / pmax[i], out_rtz)


@nb.njit(cache=True)
def _sum_exact(ac, asc, bc, bsc, m, n, k0, k1, block, tabs_a, tabs_b, limbs):
    """float32 (RNE) of the exact sum of the products over [k0, k1), by the reference's
    multi-word integer; special products are left out."""
    sig_a, exp_a, sp_a = tabs_a
    sig_b, exp_b, sp_b = tabs_b
    limbs[:] = 0
    for k in range(k0, k1):
        s, e, sp = _product(ac[m, k], bc[n, k], asc[m, k // block], bsc[n, k // block],
                            sig_a, exp_a, sp_a, sig_b, exp_b, sp_b)
        if sp == 0 and s != 0:
            _limb_add(limbs, s, e)
    return _limbs_to_f32(limbs, _RNE)


# ------------------------------------------------------------------------------------------
# The kernel
# ------------------------------------------------------------------------------------------
@nb.njit(cache=True)
def _exact_enough(tabs, tlow):
    """A float64 sum of terms that are multiples of 2^tlow is exact if the sum of their
    magnitudes (tabs, itself rounded up to a relative 2^-52 or so) stays below 2^52 * 2^tlow."""
    return tabs <= _pow2(min(tlow, 900) + 52)


@nb.njit(cache=True, nogil=True)
def _row_groups(g0, g1, QA, apow, alead, alow, QB, bpow, blead, blow, s, model, L, F, align_rne,
                out_mode, ac, asc, bc, bsc, block, tabs_a, tabs_b, out, nslow):
    """Output rows 4*g0 .. 4*g1-1 (those below M); nslow[g] counts the exact fallbacks taken
    for rows 4g..4g+3. Releases the GIL: ``gemm_fast`` runs row ranges on threads."""
    npa, Mp, K = QA.shape
    npb, _, N = QB.shape
    M = out.shape[0]
    npair = npa * npb
    out_rtz = out_mode != _RNE
    P = np.empty((npair, 4, N), QA.dtype)  # partial sums of the segment, per plane pair
    acc = np.empty((4, N), np.float32)     # fp32_sequential / chunked accumulator
    new = np.empty((4, N), np.float32)     # next chunk's accumulator (swapped with acc)
    tsum = np.empty((4, N))                # terms gathered so far (exact: all of K)
    tabs = np.empty((4, N))                # and the sum of their magnitudes,
    tlead = np.empty((4, N), np.int64)     # the products' largest possible leading bit,
    tlow = np.empty((4, N), np.int64)      # their smallest possible lowest set bit
    idx = np.empty(N, np.int64)            # work arrays of the product-by-product step
    plead = np.empty(N, np.int64)
    sub = np.empty(N, np.int64)
    pmax = np.empty(N)
    psum = np.empty(N)
    w = np.empty((npb, N))
    limbs = np.zeros(_NL, np.int64)
    for g in range(g0, g1):
        m0 = 4 * g
        nslow_g = 0
        acc[:] = 0.0
        for j in range(K // s):
            k0 = j * s
            for pa in range(npa):
                for pb in range(npb):
                    _partials(QA[pa], QB[pb], m0, k0, s, P[pa * npb + pb])
            chunk_first = k0 % L == 0
            chunk_last = (k0 + s) % L == 0 or k0 + s == K
            for r in range(4):
                m = m0 + r
                if m >= M:
                    break
                if model == _SEQUENTIAL and npair == 1:   # block value, exact in float64
                    Pr, rp, cp, a = P[0, r], apow[j, 0, m], bpow[j, 0], acc[r]
                    for n in range(N):
                        t = np.float64(Pr[n]) * (rp * cp[n]) + 0.0   # +0.0: the sum of none is +0
                        a[n] = np.float32(a[n] + np.float32(t))
                    continue
                for i in range(npair):
                    pa, pb = i // npb, i % npb
                    if model == _CHUNKED and chunk_last and i == npair - 1:
                        break      # the chunk's last term goes into the step itself
                    _add_terms(P[i, r], apow[j, pa, m], alead[j, pa, m], alow[j, pa, m],
                               bpow[j, pb], blead[j, pb], blow[j, pb],
                               i == 0 and (j == 0 if model == _EXACT else
                                           model == _SEQUENTIAL or chunk_first),
                               model == _CHUNKED, tsum[r], tabs[r], tlead[r], tlow[r])
                if model == _SEQUENTIAL:   # planes: the block's float64 sum must be exact
                    a = acc[r]
                    for n in range(N):
                        if _exact_enough(tabs[r, n], tlow[r, n]):
                            a[n] = np.float32(a[n] + np.float32(tsum[r, n] + 0.0))
                        else:
                            nslow_g += 1
                            a[n] = np.float32(a[n] + _sum_exact(ac, asc, bc, bsc, m, n, k0,
                                                                k0 + s, block, tabs_a, tabs_b,
                                                                limbs))
                elif model == _CHUNKED and chunk_last:
                    i = npair - 1
                    pa, pb = i // npb, i % npb
                    nf = _chunk_fast(P[i, r], apow[j, pa, m], alead[j, pa, m], alow[j, pa, m],
                                     bpow[j, pb], blead[j, pb], blow[j, pb],
                                     chunk_first and npair == 1, tsum[r], tlead[r], tlow[r],
                                     acc[r], F, align_rne, out_rtz, new[r])
                    if nf:
                        nslow_g += nf
                        c0 = (k0 + s - 1) // L * L
                        cnt = 0
                        if nf * 4 <= N:   # few: list them
                            for n in range(N):
                                if new[r, n] != new[r, n]:
                                    idx[cnt] = n
                                    cnt += 1
                        _chunk_products(QA, apow, alead, QB, bpow, blead, s, m, c0, k0 + s, F,
                                        align_rne, out_rtz, acc[r], new[r], idx, cnt,
                                        nf * 4 > N, plead, sub, pmax, psum, w)
            if model == _CHUNKED and chunk_last:
                acc, new = new, acc
        for r in range(4):
            m = m0 + r
            if m >= M:
                break
            if model == _EXACT:
                for n in range(N):
                    if _exact_enough(tabs[r, n], tlow[r, n]):
                        out[m, n] = np.float32(tsum[r, n])
                    else:
                        nslow_g += 1
                        out[m, n] = _sum_exact(ac, asc, bc, bsc, m, n, 0, K, block, tabs_a,
                                               tabs_b, limbs)
            else:
                out[m, :] = acc[r]
        nslow[g] = nslow_g


# ------------------------------------------------------------------------------------------
# Special values
# ------------------------------------------------------------------------------------------
@nb.njit(cache=True, parallel=True)
def _apply_specials(ac, asc, bc, bsc, block, sig_a, sp_a, sig_b, sp_b, out):
    """Outputs with a special product: NaN if any is NaN (a NaN code, Inf * 0, a NaN scale)
    or if +Inf and -Inf meet, else that Inf (the reference's ``_special_sum``)."""
    M, K = ac.shape
    N = bc.shape[0]
    col_nan = np.zeros(N, np.bool_)
    col_sp = np.zeros(N, np.bool_)
    for n in range(N):
        for b in range(bsc.shape[1]):
            col_nan[n] |= bsc[n, b] == 0xFF
        for k in range(K):
            col_sp[n] |= sp_b[bc[n, k]] != 0
    for m in nb.prange(M):
        row_nan = False
        for b in range(asc.shape[1]):
            row_nan |= asc[m, b] == 0xFF
        row_sp = False
        for k in range(K):
            row_sp |= sp_a[ac[m, k]] != 0
        for n in range(N):
            if row_nan or col_nan[n]:
                out[m, n] = np.nan
                continue
            if not (row_sp or col_sp[n]):
                continue
            nan = pos = neg = False
            for k in range(K):
                va, vb = sp_a[ac[m, k]], sp_b[bc[n, k]]
                if va == 0 and vb == 0:
                    continue
                if va == 0:
                    va = np.float64(sig_a[ac[m, k]])
                if vb == 0:
                    vb = np.float64(sig_b[bc[n, k]])
                p = va * vb
                nan |= p != p
                pos |= p > 0
                neg |= p < 0
            out[m, n] = np.nan if nan or (pos and neg) else (np.inf if pos else -np.inf)


# ------------------------------------------------------------------------------------------
def gemm_fast(ac, asc, bc, bsc, block, fmt_a, fmt_b, model, L, F, align_rne, out_mode,
              stats=None):
    """C = A @ B^T like ``accumulate._gemm_reference`` (model 0 exact, 1 fp32_sequential,
    2 chunked), or None where the fast path does not apply. A dict ``stats`` receives the
    number of exact fallbacks ('fallbacks': outputs for exact, (output, block) for
    fp32_sequential, (output, chunk) for chunked) and the number of such steps ('steps')."""
    M, K = ac.shape
    N = bc.shape[0]
    if model == _CHUNKED:
        if (L + 1) * 2.0 ** (F + 1) > 2.0**53:
            return None
        s = math.gcd(L, block)
    else:
        s, L = block, 1
    if M == 0 or N == 0 or K == 0:
        return np.zeros((M, N), np.float32)   # the empty sum is +0
    p = plan(fmt_a, fmt_b, s)
    if p is None:
        return None
    threads = nb.get_num_threads()
    if M * N * K < 1 << 22:   # small: one thread (waking workers would cost more)
        nb.set_num_threads(1)
    try:
        out, nslow = _gemm(ac, asc, bc, bsc, block, fmt_a, fmt_b, model, L, F, align_rne,
                           out_mode, s, *p)
    finally:
        nb.set_num_threads(threads)
    if stats is not None:
        stats["fallbacks"] = int(nslow.sum())
        stats["steps"] = M * N * (1 if model == _EXACT else K // block if model == _SEQUENTIAL
                                  else -(-K // L))
    return out


def _gemm(ac, asc, bc, bsc, block, fmt_a, fmt_b, model, L, F, align_rne, out_mode, s, dtype,
          tables_a, tables_b):
    M, K = ac.shape
    N = bc.shape[0]
    Mp = -(-M // 4) * 4
    QA, apow, alead, alow = _operand(ac, asc, block, s, tables_a, Mp, False)
    QB, bpow, blead, blow = _operand(bc, bsc, block, s, tables_b, N, True)
    tabs_a, tabs_b = sig_exp_tables(fmt_a), sig_exp_tables(fmt_b)
    out = np.empty((M, N), np.float32)
    G = Mp // 4
    nslow = np.zeros(G, np.int64)
    args = (QA, apow, alead, alow, QB, bpow, blead, blow, s, model, L, F, align_rne, out_mode,
            ac, asc, bc, bsc, block, tabs_a, tabs_b, out, nslow)
    threads = min(nb.get_num_threads(), G)
    if threads == 1:
        _row_groups(0, G, *args)
    else:   # threads on row ranges (a prange kernel would double the compile time)
        bounds = np.linspace(0, G, min(G, 4 * threads) + 1).astype(int)
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda i: _row_groups(bounds[i], bounds[i + 1], *args),
                          range(len(bounds) - 1)))
    _apply_specials(ac, asc, bc, bsc, block, tabs_a[0], tabs_a[2], tabs_b[0], tabs_b[2], out)
    return out, nslow
