"""Blocks of 32 along axis 0 of a matrix, a program = 32 rows (one block along axis 0) by BN
columns, loaded as rows are stored: each column's 32 values are one block, reduced across the
tile's rows, its outputs written K-major (x's transpose) through shared memory.

``qdq_both_axes_kernel``: quantize-dequantize along both axes in one pass: one read of X, the
values of ``quantize_dequantize(X, axis=-1)`` and of ``quantize_dequantize(X, axis=0)`` written
in the layouts those calls write (the second K-major), for the two bf16 GEMMs an MX GEMM
without MX units makes of X (Fprop along its rows, Wgrad along its tokens; ∇Y likewise for
Dgrad and Wgrad): 6 bytes of traffic per bf16 element instead of 8. Each row's 32-column
pieces are the row operand's blocks (BN / 32 of them per row).

``columns_kernel``: along axis 0 alone, codes and scales (``quantize``) or values
(``quantize_dequantize``), the launch ``launch.kernel32`` makes under ``Tuning.columns`` /
``columns_qdq`` = 'both_axes' (the column kernel's positional arguments, so per-call plans
take it too).

Both: float formats, RNE, no rotation or a fixed Hadamard one (16 or 32 points, no random
signs), which rotates each output's blocks along its own axis first, in the emulator's order
(butterfly stages h = 1, 2, 4, ... then the multiply by 1/sqrt(size)); the blocks are scaled,
rounded and encoded (or dequantized) with the 32-block kernels' helpers, so each output has
the bits the one-axis kernels give. Rows a multiple of 32, and columns too where the row
values are written (``native.ops`` refuses other shapes; along axis 0 alone any width, the
last program masked).
Compiled for sm_90 (Triton 3.6, E2M1, bf16 in, 128 columns on 4 warps): the both-axes kernel
45 SASS instructions per element without a rotation (59 with H16: its transposes go through
shared memory), no spill, 128-bit loads and stores (the K-major output's too, through shared
memory), against 15.3 for the row kernel's quantize-dequantize plus 33.1 for the column
kernel's (H100 tiles, no rotation). ``columns_kernel`` (64 columns on 2 warps): quantize
23.8 (27.7 with H16), quantize-dequantize 24.7 (33.8), no spill; its quantize-dequantize with
a rotation from quarter loads (``QUARTERS``, ``Tuning.both_axes_quarters``; 128 columns on 2
warps) 26.5 and no shuffle, against 33.0 and 112 shuffles.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import RNE, block_scale, pow2_scale
from .fold import NAN_EXP, T_SUBQ, e4m3_codes, group_exponents, rounded, store_group_exponents
from .quantize import (bf16_bits, column_block_quarters, fwht, load_tile_f32, quarter_codes,
                       rotate_quarters, rounded_magnitudes, rounded_values, side_by_side,
                       signed, store_blocks, store_scales)


@triton.jit
def _qdq_values(ab, neg, amax, RULE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                BIAS: tl.constexpr, RNUM: tl.constexpr, RSHIFT: tl.constexpr,
                MAXV: tl.constexpr):
    """The RNE quantize-dequantize values (float32) of elements ``ab`` (|x|'s float32 bits),
    ``neg`` (their signs) in blocks whose amax bits ``amax`` broadcast against them."""
    s, special, _ = block_scale(amax, RULE=RULE, EMAX=EMAX, MBITS=MBITS, RNUM=RNUM,
                                RSHIFT=RSHIFT)
    return rounded_values(ab, neg, s, special, 0, MBITS=MBITS, BIAS=BIAS, MAXV=MAXV)


@triton.jit
def _tile(x_ptr, n_rows, n_cols, IN_BF16: tl.constexpr, BN: tl.constexpr,
          EVEN: tl.constexpr, BIG: tl.constexpr, ROWS: tl.constexpr = 32):
    """Program (i, j)'s tile: rows ROWS i .. ROWS i + ROWS - 1, columns BN j .. (float32
    [ROWS, BN]), its offsets in x, the same positions' offsets in x's transpose, and the mask
    of the columns that exist (EVEN: n_cols a multiple of BN, nothing masked; BIG: 64-bit
    offsets)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    if BIG:
        offs = r.to(tl.int64)[:, None] * n_cols + c[None, :]
        offs_t = c.to(tl.int64)[:, None] * n_rows + r[None, :]
    else:
        offs = r[:, None] * n_cols + c[None, :]
        offs_t = c[:, None] * n_rows + r[None, :]
    mask = (c < n_cols)[None, :] & (r >= 0)[:, None]
    return load_tile_f32(x_ptr, offs, mask, IN_BF16=IN_BF16, EVEN=EVEN), offs, offs_t, mask


@triton.jit
def _columns_rotated(x, rot_scale, ROT: tl.constexpr, BN: tl.constexpr,
                     ROWS: tl.constexpr = 32):
    """A [ROWS, BN] tile (ROWS / 32 blocks of each column) with each column's blocks rotated
    by the ROT-point Hadamard (ROT 0: as it is)."""
    if ROT > 0:
        xc = fwht(tl.reshape(tl.trans(x), (BN * ROWS // ROT, ROT)), BN * ROWS // ROT, ROT)
        return tl.trans(tl.reshape(xc * rot_scale, (BN, ROWS)))
    return x


@triton.jit
def _pairs_in_thread(x, BN: tl.constexpr, ROWS: tl.constexpr = 32):
    """x [ROWS, BN] itself, in a layout whose threads hold neighbouring pairs along axis 0 (a
    split and join of the pairs, no arithmetic): Triton then keeps each column's block
    reductions and code packing inside threads, as the rotation's butterflies do. Compiled for
    sm_90 (Triton 3.6, E2M1, bf16, 64 columns on 2 warps): quantize 23.8 SASS instructions per
    element and 1 shuffle against 39.2 and 93 without it; quantize-dequantize 24.7 against
    28.9."""
    a, b = tl.split(tl.reshape(tl.trans(x), (BN * ROWS // 2, 2)))
    return tl.trans(tl.reshape(tl.join(a, b), (BN, ROWS)))


@triton.jit
def _store_t(ptr, offs_t, val, mask, EVEN: tl.constexpr):
    """A [ROWS, BN] tile ``val`` stored transposed at ``offs_t`` (K-major)."""
    if EVEN:
        tl.store(ptr + offs_t, tl.trans(val))
    else:
        tl.store(ptr + offs_t, tl.trans(val), mask=tl.trans(mask))


@triton.jit
def qdq_both_axes_kernel(x_ptr, rows_ptr, cols_ptr, n_rows, n_cols, rot_scale,
                         # the format (``KernelFormat.constexprs``; the float ones read here)
                         IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                         EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                         EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                         INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                         RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                         ENVELOPE: tl.constexpr,
                         # the numerics, the input, the tile
                         RULE: tl.constexpr, ROT: tl.constexpr, IN_BF16: tl.constexpr,
                         BN: tl.constexpr, EVEN: tl.constexpr, BIG: tl.constexpr):
    """x [n_rows, n_cols] (bf16 as int16 bits, float16 or float32) -> bf16 bits (int16):
    ``rows_ptr`` [n_rows, n_cols] quantize-dequantized along the last axis, ``cols_ptr``
    [n_cols, n_rows] (K-major: x's transpose, the layout the one-axis call returns a view of)
    quantize-dequantized along axis 0; ROT > 0: rotated first by the ROT-point Hadamard along
    each axis, times ``rot_scale``. Program (i, j): rows 32 i .. 32 i + 31, columns BN j ..
    EVEN: n_cols a multiple of BN (no mask); BIG: 2^31 elements or more (64-bit offsets)."""
    tl.static_assert(not IS_INT, "float formats only")
    tl.static_assert(BN % 32 == 0, "BN: whole blocks along the last axis")
    EXACT: tl.constexpr = BIAS + MBITS <= 7
    x, offs, offs_t, mask = _tile(x_ptr, n_rows, n_cols, IN_BF16=IN_BF16, BN=BN, EVEN=EVEN,
                                  BIG=BIG)
    # along axis 0: each column's 32 values are a block (stored transposed, as bf16 bits)
    u = _columns_rotated(x, rot_scale, ROT=ROT, BN=BN).to(tl.int32, bitcast=True)
    ab = u & 0x7FFFFFFF
    cols = _qdq_values(ab, u < 0, tl.max(ab, axis=0)[None, :], RULE=RULE, EMAX=EMAX,
                       MBITS=MBITS, BIAS=BIAS, RNUM=RNUM, RSHIFT=RSHIFT, MAXV=MAXV)
    _store_t(cols_ptr, offs_t, bf16_bits(cols, EXACT=EXACT).to(tl.int16), mask, EVEN=EVEN)
    # along the last axis: 32-column pieces of each row
    if ROT > 0:
        xr = fwht(tl.reshape(x, (32 * BN // ROT, ROT)), 32 * BN // ROT, ROT)
        xr = tl.reshape(xr * rot_scale, (32, BN))
    else:
        xr = x
    u = xr.to(tl.int32, bitcast=True)
    ab3 = tl.reshape(u & 0x7FFFFFFF, (32, BN // 32, 32))
    rows = _qdq_values(ab3, tl.reshape(u < 0, (32, BN // 32, 32)),
                       tl.max(ab3, axis=2)[:, :, None], RULE=RULE, EMAX=EMAX, MBITS=MBITS,
                       BIAS=BIAS, RNUM=RNUM, RSHIFT=RSHIFT, MAXV=MAXV)
    rows = bf16_bits(tl.reshape(rows, (32, BN)), EXACT=EXACT).to(tl.int16)
    if EVEN:
        tl.store(rows_ptr + offs, rows)
    else:
        tl.store(rows_ptr + offs, rows, mask=mask)


@triton.jit
def _columns_blocks(x_ptr, data_ptr, scale_ptr, K, inner, rot_scale, RULE: tl.constexpr,
                    ROUNDING: tl.constexpr, ROT: tl.constexpr, ENVELOPE: tl.constexpr,
                    MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                    MAXC: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr,
                    NEGMAX: tl.constexpr, SIGN: tl.constexpr, RNUM: tl.constexpr,
                    RSHIFT: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                    BN: tl.constexpr, EVEN: tl.constexpr, BIG: tl.constexpr, KB: tl.constexpr):
    """``columns_kernel``'s quantize with KB blocks along axis 0 per program: rows 32 KB i ..
    of columns BN j .., each column's KB blocks quantized as that kernel quantizes one, and
    their codes and scales stored together (each column's 16 KB or 32 KB code bytes, KB scale
    bytes)."""
    ROWS: tl.constexpr = 32 * KB
    x, offs, offs_t, mask = _tile(x_ptr, K, inner, IN_BF16=IN_BF16, BN=BN, EVEN=EVEN, BIG=BIG,
                                  ROWS=ROWS)
    if ROT > 0:
        x = _columns_rotated(x, rot_scale, ROT=ROT, BN=BN, ROWS=ROWS)
    else:
        x = _pairs_in_thread(x, BN=BN, ROWS=ROWS)
    u = tl.reshape(x.to(tl.int32, bitcast=True), (KB, 32, BN))
    ab = u & 0x7FFFFFFF
    amax = tl.max(ab, axis=1)  # [KB, BN]
    s, special, scale = block_scale(amax, RULE=RULE, EMAX=EMAX, MBITS=MBITS, RNUM=RNUM,
                                    RSHIFT=RSHIFT)
    any_special = tl.max(tl.reshape(special.to(tl.int32), (KB * BN,)), axis=0) > 0
    code = quarter_codes(ab, u, s[:, None, :], special[:, None, :], any_special, 0, OFF=0,
                         RULE=RULE, ROUNDING=ROUNDING, ROT=ROT, IS_INT=False,
                         ENVELOPE=ENVELOPE, MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC,
                         INFC=INFC, NEGMAX=NEGMAX, SIGN=SIGN)  # [KB, 32, BN]
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    cmask = c < inner
    if BIG:
        first = c.to(tl.int64) * (K // 32) + tl.program_id(0) * KB  # each column's first block
    else:
        first = c * (K // 32) + tl.program_id(0) * KB
    if PACK == 2:  # each block's 16 code bytes as four int32 words (as ``columns_kernel``),
        # a column's KB blocks' words one after another: one 16 KB-byte store per column
        w = tl.sum(tl.reshape(code, (KB, 4, 8, BN)) << (tl.arange(0, 8) * 4)[None, None, :, None],
                   axis=2)
        woff = first[:, None] * 4 + tl.arange(0, 4 * KB)[None, :]
        store_blocks(data_ptr.to(tl.pointer_type(tl.int32)), woff,
                     tl.trans(tl.reshape(w, (4 * KB, BN))), cmask, EVEN=EVEN)
    else:  # a byte per code: the K-major layout is x's transpose
        _store_t(data_ptr, offs_t, tl.reshape(code, (ROWS, BN)).to(tl.uint8), mask, EVEN=EVEN)
    store_blocks(scale_ptr, first[:, None] + tl.arange(0, KB)[None, :],
                 tl.trans(scale).to(tl.uint8), cmask, EVEN=EVEN)


@triton.jit
def _qdq_quarters(x_ptr, data_ptr, K, inner, rot_scale, RULE: tl.constexpr, ROT: tl.constexpr,
                  EMAX: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                  RNUM: tl.constexpr, RSHIFT: tl.constexpr, MAXV: tl.constexpr,
                  IN_BF16: tl.constexpr, BN: tl.constexpr, EVEN: tl.constexpr,
                  BIG: tl.constexpr, FORM: tl.constexpr):
    """``columns_kernel``'s quantize-dequantize with a rotation, a program's block of each
    column held whole by one thread as four quarters [BN, 8] (rows 8p .. 8p + 7 of the block in
    quarter p), rotated as the row kernel rotates (``rotate_quarters``), the values stored as a
    [BN, 32] tile at their K-major offsets."""
    kt = tl.program_id(0)
    c = tl.max_contiguous(tl.program_id(1) * BN + tl.arange(0, BN), 1)
    o = tl.program_id(2)  # (0: a matrix; a tensor, for ``column_quarter``'s 64-bit offsets)
    q0, q1, q2, q3 = column_block_quarters(x_ptr, o, kt, 0, c, K, inner, KB=1, BIG=BIG,
                                           INNER=0, SPLIT=False, IN_BF16=IN_BF16, EVEN=EVEN,
                                           FORM=FORM)
    q0, q1, q2, q3 = rotate_quarters(q0, q1, q2, q3, 0, rot_scale, ROT=ROT, SIGNS=False,
                                     SCALE=True)
    x = side_by_side(side_by_side(q0, q1), side_by_side(q2, q3))  # [BN, 32]
    u = x.to(tl.int32, bitcast=True)
    ab = u & 0x7FFFFFFF
    val = _qdq_values(ab, u < 0, tl.max(ab, axis=1)[:, None], RULE=RULE, EMAX=EMAX,
                      MBITS=MBITS, BIAS=BIAS, RNUM=RNUM, RSHIFT=RSHIFT, MAXV=MAXV)
    r = kt * 32 + tl.arange(0, 32)
    if BIG:
        offs = c.to(tl.int64)[:, None] * K + r[None, :]
    else:
        offs = c[:, None] * K + r[None, :]
    out = bf16_bits(val, EXACT=BIAS + MBITS <= 7).to(tl.int16)
    ptr = data_ptr.to(tl.pointer_type(tl.int16))
    if EVEN:
        tl.store(ptr + offs, out)
    else:
        tl.store(ptr + offs, out, mask=(c < inner)[:, None] & (r >= 0)[None, :])


@triton.jit(do_not_specialize=["seed", "sign_mask"])
def columns_kernel(x_ptr, data_ptr, scale_ptr, sign_mask, K, inner, seed, rot_scale,
                   # the column kernel's fold outputs and sizes (no fold here: unused)
                   exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_blocks, n_rows,
                   # the format
                   IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                   EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                   EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                   INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                   RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                   ENVELOPE: tl.constexpr,
                   # the numerics, the input, the tile
                   RULE: tl.constexpr, ROUNDING: tl.constexpr, ROT: tl.constexpr,
                   SIGNS: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                   QDQ: tl.constexpr, BN: tl.constexpr, EVEN: tl.constexpr,
                   BIG: tl.constexpr, KB: tl.constexpr = 1, QUARTERS: tl.constexpr = 0):
    """x [K, inner] (bf16 as int16 bits, float16 or float32) quantized along axis 0 into the
    K-major layout every quantize writes (row i of the output: column i of x, its K / 32
    blocks in order): codes (``data_ptr``; PACK 2: two per byte, the even element in the low
    nibble) and scales (``scale_ptr``: [inner, K / 32]), or with QDQ the bf16 values
    (``data_ptr``: [inner, K] bf16, any pointer type; ``scale_ptr`` unused). The column
    kernel's positional arguments (``quantize.quantize_cols32_kernel``), so that
    ``launch.Kernel32`` launches either; ``sign_mask``, ``seed`` and the fold's are unused
    (RNE, no random signs, no fold). Program (i, j): block i of columns BN j .. BN j + BN - 1;
    with KB > 1 (quantize only) blocks KB i .. KB i + KB - 1 of those columns, so that each
    column's codes are stored 16 KB (FP4) or 32 KB bytes at a time: a 16-byte store is half a
    32-byte sector, and half-sector stores a program apart do not merge (``column_probe.py``).
    EVEN: inner a multiple of BN; BIG: 2^31 elements or more. ``QUARTERS`` 1 or 2 (QDQ with a
    rotation): each column's block loaded as four 8-row quarters, each thread's columns whole
    (``quantize.column_quarter``, QUARTERS its form), so that the rotation's butterflies stay
    inside threads (``_qdq_quarters``)."""
    tl.static_assert(not IS_INT, "float formats only")
    if QUARTERS:
        tl.static_assert(QDQ and ROT > 0, "QUARTERS: quantize-dequantize with a rotation")
        _qdq_quarters(x_ptr, data_ptr, K, inner, rot_scale, RULE=RULE, ROT=ROT, EMAX=EMAX,
                      MBITS=MBITS, BIAS=BIAS, RNUM=RNUM, RSHIFT=RSHIFT, MAXV=MAXV,
                      IN_BF16=IN_BF16, BN=BN, EVEN=EVEN, BIG=BIG, FORM=QUARTERS)
        return
    tl.static_assert(ROUNDING == RNE, "round to nearest even only")
    tl.static_assert(not SIGNS, "no random signs")
    tl.static_assert(BN % 32 == 0, "BN: a multiple of 32")
    if KB > 1:
        tl.static_assert(not QDQ, "several blocks per program: quantize only")
        _columns_blocks(x_ptr, data_ptr, scale_ptr, K, inner, rot_scale, RULE=RULE,
                        ROUNDING=ROUNDING, ROT=ROT, ENVELOPE=ENVELOPE, MBITS=MBITS, BIAS=BIAS,
                        EMAX=EMAX, MAXC=MAXC, NANC=NANC, INFC=INFC, NEGMAX=NEGMAX, SIGN=SIGN,
                        RNUM=RNUM, RSHIFT=RSHIFT, PACK=PACK, IN_BF16=IN_BF16, BN=BN, EVEN=EVEN,
                        BIG=BIG, KB=KB)
        return
    x, offs, offs_t, mask = _tile(x_ptr, K, inner, IN_BF16=IN_BF16, BN=BN, EVEN=EVEN, BIG=BIG)
    if ROT > 0:
        u = _columns_rotated(x, rot_scale, ROT=ROT, BN=BN).to(tl.int32, bitcast=True)
    else:
        u = _pairs_in_thread(x, BN=BN).to(tl.int32, bitcast=True)
    ab = u & 0x7FFFFFFF
    amax = tl.max(ab, axis=0)
    if QDQ:
        val = _qdq_values(ab, u < 0, amax[None, :], RULE=RULE, EMAX=EMAX, MBITS=MBITS,
                          BIAS=BIAS, RNUM=RNUM, RSHIFT=RSHIFT, MAXV=MAXV)
        _store_t(data_ptr.to(tl.pointer_type(tl.int16)), offs_t,
                 bf16_bits(val, EXACT=BIAS + MBITS <= 7).to(tl.int16), mask, EVEN=EVEN)
    else:
        s, special, scale = block_scale(amax, RULE=RULE, EMAX=EMAX, MBITS=MBITS, RNUM=RNUM,
                                        RSHIFT=RSHIFT)
        any_special = tl.max(special.to(tl.int32), axis=0) > 0
        code = quarter_codes(ab, u, s[None, :], special[None, :], any_special, 0, OFF=0,
                             RULE=RULE, ROUNDING=ROUNDING, ROT=ROT, IS_INT=IS_INT,
                             ENVELOPE=ENVELOPE, MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC,
                             INFC=INFC, NEGMAX=NEGMAX, SIGN=SIGN)
        c = tl.program_id(1) * BN + tl.arange(0, BN)
        if BIG:
            blk = c.to(tl.int64) * (K // 32) + tl.program_id(0)
        else:
            blk = c * (K // 32) + tl.program_id(0)
        if PACK == 2:  # a block's 16 code bytes as four int32 words, element 8p + e in word p
            # bits 4e .. 4e + 3: one 16-byte store per column
            w = tl.sum(tl.reshape(code, (4, 8, BN)) << (tl.arange(0, 8) * 4)[None, :, None],
                       axis=1)
            woff = blk[:, None] * 4 + tl.arange(0, 4)[None, :]
            wptr = data_ptr.to(tl.pointer_type(tl.int32))
            if EVEN:
                tl.store(wptr + woff, tl.trans(w))
            else:
                tl.store(wptr + woff, tl.trans(w), mask=(c < inner)[:, None] & (woff >= 0))
        else:  # a byte per code: the K-major layout is x's transpose
            _store_t(data_ptr, offs_t, code.to(tl.uint8), mask, EVEN=EVEN)
        store_scales(scale_ptr, blk, scale, c < inner, EVEN=EVEN)


@triton.jit(do_not_specialize=["seed", "sign_mask"])
def columns_fold_kernel(x_ptr, data_ptr, scale_ptr, sign_mask, K, inner, seed, rot_scale,
                        # the fold's outputs and sizes, as the column kernel's
                        exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_blocks, n_rows,
                        # the format
                        IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                        EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                        EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                        INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                        RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                        ENVELOPE: tl.constexpr,
                        # the numerics, the input
                        RULE: tl.constexpr, ROUNDING: tl.constexpr, ROT: tl.constexpr,
                        SIGNS: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                        # the fold, the tile
                        GROUP: tl.constexpr, D_MAX: tl.constexpr, POW2: tl.constexpr,
                        HW_CVT: tl.constexpr, BN: tl.constexpr, EVEN: tl.constexpr,
                        BIG: tl.constexpr):
    """``quantize_folded`` along axis 0 of x [K, inner] (Wgrad's operands, folded along
    tokens) in one pass, the row kernel's RNE fold (``quantize.fold_quarters`` from the
    rounded magnitudes) on columns: program (i, j) loads rows 32 GROUP i .. (one fold group
    of each column) at columns BN j .., quantizes each column's GROUP blocks (amax along axis
    0), takes the group's exponent R from the blocks whose rounded values are not all zero,
    and writes the K-major outputs: E4M3 codes (``data_ptr`` [inner, K], x's transpose,
    through shared memory), MX scales [inner, K / 32], R per group (``exp_ptr``
    [inner, K / (32 GROUP)]; with POW2 2^R group-major, ``pow2_ptr`` [K / (32 GROUP), inner]:
    one contiguous row per program) and the stats (``fold.store_group_exponents``). The
    column kernel's positional arguments (``launch.Kernel32``); ``sign_mask`` and ``seed``
    unused (RNE, no random signs). Float FP4/FP6 formats, RNE, no rotation or a fixed
    Hadamard one (as ``columns_kernel``: the rotation times ``rot_scale``). K a multiple of
    32 GROUP; EVEN: inner a multiple of BN; BIG: 2^31 elements or more."""
    tl.static_assert(not IS_INT, "only FP4/FP6 formats fold into E4M3")
    tl.static_assert(ROUNDING == RNE, "round to nearest even only")
    tl.static_assert(not SIGNS, "no random signs")
    tl.static_assert(BN % 32 == 0, "BN: a multiple of 32")
    ROWS: tl.constexpr = 32 * GROUP
    i = tl.program_id(0)
    r = i * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    if BIG:
        offs = r.to(tl.int64)[:, None] * inner + c[None, :]
        col = c.to(tl.int64)
    else:
        offs = r[:, None] * inner + c[None, :]
        col = c
    cmask = c < inner
    mask = cmask[None, :] & (r >= 0)[:, None]
    x = load_tile_f32(x_ptr, offs, mask, IN_BF16=IN_BF16, EVEN=EVEN)
    if ROT > 0:
        x = _columns_rotated(x, rot_scale, ROT=ROT, BN=BN, ROWS=ROWS)
    else:
        x = _pairs_in_thread(x, BN=BN, ROWS=ROWS)
    u = tl.reshape(x.to(tl.int32, bitcast=True), (GROUP, 32, BN))
    ab = u & 0x7FFFFFFF
    amax = tl.max(ab, axis=1)
    s, special, scale = block_scale(amax, RULE=RULE, EMAX=EMAX, MBITS=MBITS, RNUM=RNUM,
                                    RSHIFT=RSHIFT)  # [GROUP, BN] each
    q = signed(rounded_magnitudes(ab, s[:, None, :], special[:, None, :], 0, MBITS=MBITS,
                                  BIAS=BIAS, MAXV=MAXV), u)
    # the row kernel's test, a nonzero rounded magnitude in the block, from the amax alone:
    # the rounding is monotone, so the block's largest rounded magnitude is the amax's (a NaN
    # block's does not count: R skips it)
    nz = rounded_magnitudes(amax, s, special, 0, MBITS=MBITS, BIAS=BIAS, MAXV=MAXV) > 0
    sc = scale.to(tl.int32)
    g_r, nan = group_exponents(tl.trans(sc), tl.trans(nz), D_MAX=D_MAX)  # [BN]
    d = sc - 127 - g_r[None, :]  # each block's shift
    # the fold (``fold.fold_values`` on one tile: the same operations)
    two_d = pow2_scale(tl.minimum(tl.maximum(d, -127), 127))[:, None, :]
    v = q * two_d
    f = e4m3_codes(v, HW_CVT=HW_CVT)
    nan_block = (sc == 255)[:, None, :]
    f = tl.where(nan_block, 0, f)
    low = (two_d * SUBQ < T_SUBQ) & nz[:, None, :] & ~nan_block & cmask[None, None, :]
    n_changed = tl.sum(tl.reshape((rounded(v) & low).to(tl.int32), (ROWS * BN,)),
                       axis=0).to(tl.int64)
    # codes K-major (row = column of x): each program's columns get ROWS contiguous bytes
    codes = tl.trans(tl.reshape(f, (ROWS, BN))).to(tl.uint8)
    store_blocks(data_ptr, col[:, None] * K + r[None, :], codes, cmask, EVEN=EVEN)
    blk = col[:, None] * (K // 32) + i * GROUP + tl.arange(0, GROUP)[None, :]  # [BN, GROUP]
    store_blocks(scale_ptr, blk, tl.trans(scale).to(tl.uint8), cmask, EVEN=EVEN)
    groups = K // ROWS
    store_group_exponents(tl.where(nan, NAN_EXP, g_r), col * groups + i, cmask, exp_ptr,
                          pow2_ptr, stats_ptr, total_ptr, n_blocks // GROUP, n_rows, n_changed,
                          POW2=POW2)
