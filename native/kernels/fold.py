"""Folding FP4/FP6 MX operands into FP8 E4M3 with one power-of-two scale per group of blocks,
and the FP8 GEMM of two folded operands (``ocpmx.emulator.fold`` defines both; the tests
compare bit for bit).

The fold of block b in a group with exponent R (``kernels.quantize``: in the quantize pass, or
``fold_kernel`` on stored codes): every element's value times 2^(s_b - R), as an
E4M3 code (exact for s_b - R in the format's shift range; else rounded to nearest E4M3, which
the host counts from the emulator's definition when asked). R = (the largest s_b among the
group's blocks holding a nonzero element) - D_MAX; a NaN-scale block gives E4M3 NaN codes.

The GEMM: per K tile of one group (GROUP blocks), four (GROUP) K = 32 FP8 dots, each exact,
each added to the tile's float32 sum T from 0 (``max_num_imprecise_acc=32``: the partial of
one wgmma promoted at once, round to nearest even), then acc += fl(T * 2^(R_a + R_b)), one
rounding to float32 (``_group_scale``: two float32 multiplies, the first exact).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...emulator.fold import NAN_EXPONENT, TARGET
from ...spec import lower
from .common import RNE, encode, f32_to_bf16_bits, pow2_scale, tile_ids

NAN_EXP = tl.constexpr(NAN_EXPONENT)


# |exponent| bound of the per-row times per-column form (T * 2^ea) * 2^eb: T is 0 or a
# multiple of 2^-18 below 2^42 (E4M3 products, at most 2^17.2 each, K < 2^24 of them: the host
# checks K), so T * 2^ea is an exact normal float32 for |ea| <= 50 and the one rounding is the
# second multiply's: fl32(T * 2^(ea + eb)), as _group_scale's form gives it. (The Gluon kernel,
# ``fold_wgmma``, computes the same form; some operands of an 8B training step have group
# exponents between 40 and 50 in magnitude, so a bound of 40 sent most of its GEMMs to the
# general epilogue: results/train_speed/h200_8b_fp8_gluon/.)
RANK1_EXP = tl.constexpr(50)


# the fold's target, E4M3 (``emulator.fold.TARGET``), as the kernels' constants
_T = lower(TARGET)
T_MBITS = tl.constexpr(_T.mbits)
T_BIAS = tl.constexpr(_T.bias)
T_MAXC = tl.constexpr(_T.max_code)
T_NANC = tl.constexpr(_T.nan_code)
T_SIGN = tl.constexpr(_T.sign_bit)
T_SUBQ = tl.constexpr(_T.subnormal_quantum)


@triton.jit
def group_exponents(sc, nonzero, D_MAX: tl.constexpr):
    """Blocks [NG, GROUP] (E8M0 codes ``sc``, ``nonzero``: the block holds a nonzero code) ->
    (R [NG]: each group's exponent, the largest nonzero non-NaN block's minus D_MAX, 0 for an
    all-zero group; nan [NG]: the group holds a NaN block, whose R is then NAN_EXP)."""
    r = tl.max(tl.where(nonzero & (sc != 255), sc - 127, -1000), axis=1)
    r = tl.where(r == -1000, 0, r - D_MAX)
    return r, tl.max((sc == 255).to(tl.int32), axis=1) > 0


@triton.jit
def code_units(code, BITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
               SUBQ: tl.constexpr):
    """MX codes (int32) of an FP4/FP6 format (no NaN or Inf codes) -> their values in units of
    the block scale, signed float32 (-0 for a negative zero code): what ``fold_values`` takes,
    the values the row kernel's RNE fold hands it, built from the code's bits."""
    mag = code & ((1 << (BITS - 1)) - 1)
    e = mag >> MBITS
    mnt = mag & ((1 << MBITS) - 1)
    normal = ((e - BIAS + 127) << 23) | (mnt << (23 - MBITS))
    val = tl.where(e == 0, (mnt.to(tl.float32) * SUBQ).to(tl.int32, bitcast=True), normal)
    return (val | ((code >> (BITS - 1)) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def fold_values(q0, q1, q2, q3, shift, nan_block, nonzero, mask, SUBQ: tl.constexpr,
                HW_CVT: tl.constexpr):
    """The fold of a program's four quarters from the elements' values in units of their block's
    scale (``q``: signed float32, -0 for a negative element rounded to zero; from stored codes
    ``code_units``): (E4M3 codes of each quarter, the rounded elements' count, int64). Each
    element's value times 2^shift, the shift [NB, 1] clamped to [-127, 127] (2^-127 a float32
    subnormal), is q * 2^shift exactly (q has at most MBITS + 1 <= 4 significant bits and a
    quantum of at least SUBQ, and SUBQ * 2^-127 is above float32's 2^-149), so one float32
    multiply gives the value the E4M3 code rounds. q * 2^shift
    is a multiple of SUBQ * 2^shift, so a block with SUBQ * 2^shift >= 2^-9 (E4M3's quantum)
    rounds no element, nor does a block of zeros (``nonzero`` [NB, 1] False; its shift is
    -127 - R): the per-element test runs only where a block of the program may, and
    a NaN block's codes are cleared only where the program holds one (both branches per
    program, not per element)."""
    two_d = pow2_scale(tl.minimum(tl.maximum(shift, -127), 127))
    v0 = q0 * two_d
    v1 = q1 * two_d
    v2 = q2 * two_d
    v3 = q3 * two_d
    f0 = e4m3_codes(v0, HW_CVT=HW_CVT)
    f1 = e4m3_codes(v1, HW_CVT=HW_CVT)
    f2 = e4m3_codes(v2, HW_CVT=HW_CVT)
    f3 = e4m3_codes(v3, HW_CVT=HW_CVT)
    if tl.max(tl.max(nan_block.to(tl.int32), axis=1), axis=0) > 0:
        f0 = tl.where(nan_block, 0, f0)
        f1 = tl.where(nan_block, 0, f1)
        f2 = tl.where(nan_block, 0, f2)
        f3 = tl.where(nan_block, 0, f3)
    low = (two_d * SUBQ < T_SUBQ) & nonzero & ~nan_block & mask  # [NB, 8]: may round
    n = tl.zeros((), tl.int32)
    if tl.max(tl.max(low.to(tl.int32), axis=1), axis=0) > 0:
        ch = (rounded(v0) & low).to(tl.int32) + (rounded(v1) & low).to(tl.int32) \
            + (rounded(v2) & low).to(tl.int32) + (rounded(v3) & low).to(tl.int32)
        n = tl.sum(tl.sum(ch, axis=1), axis=0)
    return f0, f1, f2, f3, n.to(tl.int64)


@triton.jit
def e4m3_codes(v, HW_CVT: tl.constexpr):
    """E4M3 codes (int32) of float32 values ``v`` with |v| <= 448 (a fold's), RNE."""
    if HW_CVT:
        # the GPU's float32 -> E4M3 conversion (sm_89+: cvt.rn.satfinite, round to nearest
        # even): |v| <= 448 always (shifts stop at D_MAX), so saturation never acts and the
        # code is the spec's RNE encoding, ``encode``'s bits (tests/test_fold.py checks every
        # code under every shift on the GPU); one instruction for ~40 integer operations
        return v.to(tl.float8e4nv).to(tl.uint8, bitcast=True).to(tl.int32)
    u = v.to(tl.int32, bitcast=True)
    return encode(u & 0x7FFFFFFF, u < 0, 0, False, False, 0, OFF=0, ROUNDING=RNE,
                  IS_INT=False, ENVELOPE=False, MBITS=T_MBITS, BIAS=T_BIAS, MAXC=T_MAXC,
                  NANC=T_NANC, INFC=-1, NEGMAX=T_MAXC, SIGN=T_SIGN, CAST=True)


@triton.jit
def rounded(v):
    """float32 values ``v`` (|v| <= 448) that are not E4M3 numbers: not a multiple of E4M3's
    subnormal quantum 2^-9. The others are: v <= 448, and v's mantissa bits (the element
    format's MBITS <= 3 = E4M3's) fit wherever |v| >= 2^-6. (Comparing v with the code's value
    converted back to float32 instead counted thousands of exact elements on an H100 under
    Triton 3.6 though the codes were right; the cause was not isolated.)"""
    t = tl.abs(v) * (1.0 / T_SUBQ)  # exact: a power-of-two scaling of a small float32
    return t != tl.floor(t)


@triton.jit
def store_group_exponents(r, q, valid, exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_groups,
                          rows, n_changed, POW2: tl.constexpr):
    """Store groups ``q``'s exponents R (and with POW2 their 2^R group-major), flag an R
    beyond the GEMM's rank-1 epilogue in stats[0], add the rounded elements to stats[1] and
    the device's running total."""
    tl.store(exp_ptr + q, r, mask=valid)
    if POW2:
        per_row = n_groups // rows
        tl.store(pow2_ptr + (q % per_row) * rows + q // per_row, _pow2_any(r), mask=valid)
    wide = tl.max(((r < -RANK1_EXP) | (r > RANK1_EXP)).to(tl.int32) * valid.to(tl.int32), axis=0)
    if wide > 0:
        tl.atomic_or(stats_ptr, 1)
    if n_changed > 0:
        tl.atomic_add(stats_ptr + 1, n_changed)
        tl.atomic_add(total_ptr, n_changed)


@triton.jit
def store_row_scale(r, row, exp_ptr, pow2_ptr, POW2: tl.constexpr):
    """A whole row's fold exponent R at exp_ptr[row], and with POW2 2^R at pow2_ptr[row]."""
    tl.store(exp_ptr + row, r)
    if POW2:
        tl.store(pow2_ptr + row, _pow2_any(r))


@triton.jit
def store_row_exponent(r, row, exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_changed,
                       POW2: tl.constexpr):
    """``store_group_exponents`` for one group that is a whole row (``fold_rows_kernel``): its
    exponent R (scalar), 2^R at pow2_ptr[row] with POW2 (cuBLAS's rowwise scale), the flags
    and counts."""
    store_row_scale(r, row, exp_ptr, pow2_ptr, POW2=POW2)
    if (r < -RANK1_EXP) | (r > RANK1_EXP):
        tl.atomic_or(stats_ptr, 1)
    if n_changed > 0:
        tl.atomic_add(stats_ptr + 1, n_changed)
        tl.atomic_add(total_ptr, n_changed)


@triton.jit
def _pow2_any(e):
    """2^e as float32 for any int32 e: normal, subnormal (from 2^-149), 0 below, Inf above;
    NaN for NAN_EXP (``native.fold.group_scales``' values)."""
    normal = ((tl.minimum(tl.maximum(e, -126), 127) + 127) << 23).to(tl.float32, bitcast=True)
    sub = (1 << (tl.minimum(tl.maximum(e, -149), -127) + 149)).to(tl.float32, bitcast=True)
    v = tl.where(e >= -126, normal, tl.where(e >= -149, sub, 0.0))
    v = tl.where(e > 127, float("inf"), v)
    return tl.where(e == NAN_EXP, float("nan"), v)


@triton.jit
def _pow2(e):
    """2^e as float32 for integer e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _group_scale(ea, eb):
    """2^(R_a + R_b) applied to a float32 tile T as (T * s1) * s2 with s1 = 2^e1, e1 = the
    exponent sum clamped to [-100, 100], s2 = 2^(sum - e1) clamped to [-126, 127]; NaN where a
    group holds a NaN block. T is 0 or 2^-18 <= |T| < 2^42 (see RANK1_EXP), so T * s1 is exact
    (a normal float32) or, only where e1 = 100 and |T| >= 2^28, Inf as the true product is; the
    one rounding is that of the second multiply:
    fl32(T * 2^(R_a + R_b)), the value the float64 form fl32(fl64(T) * 2^(R_a + R_b)) gives,
    subnormal, overflowing and vanishing results included (beyond the clamps the result is
    +-Inf or +-0 either way). Needs no float contraction: the launch sets
    enable_fp_fusion=False, so the product is rounded before it is added."""
    nan = (ea == NAN_EXP)[:, None] | (eb == NAN_EXP)[None, :]
    e = ea[:, None] + eb[None, :]
    e1 = tl.minimum(tl.maximum(e, -100), 100)
    e2 = tl.minimum(tl.maximum(e - e1, -126), 127)
    return tl.where(nan, float("nan"), _pow2(e1)), _pow2(e2)


@triton.jit
def _k_loop(a_rows, b_cols, ea_rows, eb_rows, row_ok, col_ok, n_groups,
            GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KT: tl.constexpr,
            PROMOTE: tl.constexpr, RANK1: tl.constexpr, SPAN: tl.constexpr):
    """The folded GEMM's K loop over one tile (``folded_gemm_kernel``): per group, T = the
    group's dot, then acc += T * 2^(R_a + R_b), as (T * 2^ea) * 2^eb where RANK1 (every
    exponent of both operands within RANK1_EXP) or through ``_group_scale``."""
    m_ok = row_ok[:, None]
    n_ok = col_ok[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g in range(0, n_groups):
        k0 = g * (GROUP * 32)
        if KT == GROUP * 32:  # one dot per group
            a = tl.load(a_rows + k0, mask=m_ok, other=0.0)
            b = tl.load(b_cols + k0, mask=n_ok, other=0.0)
            if PROMOTE:  # K = 32 wgmmas, each promoted at once
                t = tl.dot(a, b, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32),
                           max_num_imprecise_acc=32)
            else:  # chained in the tensor core
                t = tl.dot(a, b, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32))
        elif SPAN < GROUP:  # chained over spans of SPAN blocks (the last one shorter where
            t = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # they do not divide the group),
            for s in range((GROUP + SPAN - 1) // SPAN):         # the spans added in float32
                c = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for j in range(0, tl.minimum(SPAN, GROUP - s * SPAN) * 32 // KT):
                    kj = k0 + s * (SPAN * 32) + j * KT
                    a = tl.load(a_rows + kj, mask=m_ok, other=0.0)
                    b = tl.load(b_cols + kj, mask=n_ok, other=0.0)
                    c = tl.dot(a, b, c)
                t += c
        else:
            t = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for j in range(GROUP * 32 // KT):  # a loop, not unrolled (unrolled, 16 blocks
                a = tl.load(a_rows + k0 + j * KT, mask=m_ok,  # overflowed shared memory)
                            other=0.0)
                b = tl.load(b_cols + k0 + j * KT, mask=n_ok, other=0.0)
                if PROMOTE:
                    t = tl.dot(a, b, t, max_num_imprecise_acc=32)
                else:
                    t = tl.dot(a, b, t)
        ea = tl.load(ea_rows + g, mask=row_ok, other=0)
        eb = tl.load(eb_rows + g, mask=col_ok, other=0)
        if RANK1:
            acc += (t * _pow2(ea)[:, None]) * _pow2(eb)[None, :]
        else:
            s1, s2 = _group_scale(ea, eb)
            acc += (t * s1) * s2
    return acc


@triton.jit
def folded_gemm_kernel(a_ptr, b_ptr, ea_ptr, eb_ptr, wide_a_ptr, wide_b_ptr, c_ptr, M, N, K,
                       GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       KT: tl.constexpr, OUT_BF16: tl.constexpr, RANK1: tl.constexpr,
                       PROMOTE: tl.constexpr = True, GROUP_M: tl.constexpr = 8,
                       SPAN: tl.constexpr = 0):
    """C[M, N] = A Bᵀ for folded operands: A (M, K), B (N, K) E4M3 codes, group exponents
    ea (M, K / (32 GROUP)), eb (N, K / (32 GROUP)) (module doc for the order of additions).

    KT: the K of one ``tl.dot`` (32, or a multiple of 32 dividing the group's 32 GROUP). With
    ``max_num_imprecise_acc=32`` Triton splits a dot of K = KT into KT / 32 wgmmas, each into a
    zeroed partial sum, each partial added to the accumulator in K order (Triton's WGMMA
    lowering): the same sums as KT = 32, in fewer, longer dots. The interpreter has no such
    split (its dot is one float32 matmul), so the host passes KT = 32 there. With KT = 32
    GROUP (the GPU default) the K loop is one flat loop, one dot and one epilogue per step:
    the form Triton's software pipeliner overlaps with the next step's loads.

    PROMOTE=False: no ``max_num_imprecise_acc``, so the tensor core accumulates a whole group
    (its dots chained, each adding into the last's output) and only the group sum leaves it:
    one float32 epilogue per group instead of one per 32 of K (``emulator.fold.folded_matmul``
    with promote = 32 GROUP). SPAN (with PROMOTE=False; 0: the whole group): the dots chained
    over spans of SPAN blocks only, each span's sum added to the group's in float32
    (promote = 32 SPAN: cuBLAS's rowwise GEMM, ``HOPPER_FP8_CUBLAS_ROWWISE``).

    Registers decide the speed on Hopper: with PROMOTE the KT / 32 partial sums of one dot are
    live at once beside the accumulator, so a 64 x 128 warpgroup tile (64 registers per sum)
    spills (compiled for sm_90a); 64 x 64 warpgroup tiles do not (``FOLD_CONFIGS`` in
    ``native.fold``). A 1-D grid in GROUP_M-row bands for L2 reuse."""
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    # E4M3 pointers: the loads feed the wgmma from shared memory (a bitcast after the load
    # would route A through registers)
    a_ptr = a_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    b_ptr = b_ptr.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    m0 = pid_m * BLOCK_M
    n0 = pid_n * BLOCK_N
    lm = tl.arange(0, BLOCK_M)  # rows and columns inside the tile
    ln = tl.arange(0, BLOCK_N)
    rm = m0 + lm
    rn = n0 + ln
    kk = tl.arange(0, KT)
    n_groups = K // (32 * GROUP)
    # the tile's first row as a 64-bit scalar offset, 32-bit offsets inside the tile (a tensor
    # of 64-bit addresses cost two registers per element)
    a_rows = a_ptr + m0.to(tl.int64) * K + (lm[:, None] * K + kk[None, :])
    b_cols = b_ptr + n0.to(tl.int64) * K + (ln[None, :] * K + kk[:, None])
    ea_rows = ea_ptr + rm * n_groups
    eb_rows = eb_ptr + rn * n_groups
    # RANK1: this launch computes the GEMM if neither operand has a group exponent beyond
    # RANK1_EXP (the common case; the epilogue (T * 2^ea) * 2^eb), else the launch with
    # RANK1=False does (``_group_scale``); the host launches both. One loop per kernel: a
    # branch inside the K loop stops Triton 3.6's software pipeliner ("PassManager::run
    # failed" on sm_90), and two loops in one kernel take twice the shared memory.
    wide = tl.load(wide_a_ptr) | tl.load(wide_b_ptr)
    if RANK1:
        mine = wide == 0
    else:
        mine = wide != 0
    if mine:
        acc = _k_loop(a_rows, b_cols, ea_rows, eb_rows, rm < M, rn < N, n_groups, GROUP,
                      BLOCK_M, BLOCK_N, KT, PROMOTE, RANK1, GROUP if SPAN == 0 else SPAN)
        cmask = (rm < M)[:, None] & (rn < N)[None, :]
        c_tile = c_ptr + m0.to(tl.int64) * N + n0 + (lm[:, None] * N + ln[None, :])
        if OUT_BF16:  # c_ptr is the bf16 output viewed as int16
            tl.store(c_tile, f32_to_bf16_bits(acc), mask=cmask)
        else:
            tl.store(c_tile, acc, mask=cmask)
