"""Quantize-dequantize along both axes of a 2-D tensor in one pass: one read of X, the values
of ``quantize_dequantize(X, axis=-1)`` and of ``quantize_dequantize(X, axis=0)`` written in
the layouts those calls write (the second K-major: X's transpose), for the two bf16 GEMMs an
MX GEMM without MX units makes of X (Fprop along its rows, Wgrad along its tokens; ∇Y likewise
for Dgrad and Wgrad): 6 bytes of traffic per bf16 element instead of 8.

A program holds 32 rows (one block along axis 0) by BN columns (BN / 32 blocks along the last
axis): each column's 32 values are one block of the axis-0 operand, each row's 32-column
pieces blocks of the row operand; the two sets of blocks are scaled, rounded (RNE) and
dequantized independently with the 32-block kernels' helpers, so each output has the bits the
one-axis kernels give. A fixed Hadamard rotation (16 or 32 points, no random signs) rotates
each output's blocks along its own axis first, in the emulator's order (butterfly stages
h = 1, 2, 4, ... then the multiply by 1/sqrt(size)). Float formats, RNE; rows a multiple of
32, and columns too where the row values are written (``native.ops`` refuses other shapes;
the axis-0 values alone take any width, the last program masked).
Compiled for sm_90 (Triton 3.6, E2M1, bf16 in, 128 columns on 4 warps): 45 SASS instructions
per element without a rotation (59 with H16: its transposes go through shared memory), no
spill, 128-bit loads and stores (the K-major output's too, through shared memory), against
15.3 for the row kernel's quantize-dequantize plus 33.1 for the column kernel's (H100 tiles,
no rotation). The axis-0 values alone (WRITE_ROWS False): 28.8 (33.7 with H16), no spill.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import block_scale
from .quantize import bf16_bits, fwht, load_tile_f32, rounded_values


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
                         BN: tl.constexpr, EVEN: tl.constexpr, BIG: tl.constexpr,
                         WRITE_ROWS: tl.constexpr):
    """x [n_rows, n_cols] (bf16 as int16 bits, float16 or float32) -> bf16 bits (int16):
    ``rows_ptr`` [n_rows, n_cols] quantize-dequantized along the last axis, ``cols_ptr``
    [n_cols, n_rows] (K-major: x's transpose, the layout the one-axis call returns a view of)
    quantize-dequantized along axis 0; ROT > 0: rotated first by the ROT-point Hadamard along
    each axis, times ``rot_scale``. Program (i, j): rows 32 i .. 32 i + 31, columns BN j ..
    EVEN: n_cols a multiple of BN (no mask); BIG: 2^31 elements or more (64-bit offsets).
    WRITE_ROWS False: the values along axis 0 only (``rows_ptr`` unused): ``quantize_dequantize``
    along axis 0 in this kernel's layout of the work (``Tuning.columns_qdq='both_axes'``)."""
    tl.static_assert(not IS_INT, "float formats only")
    tl.static_assert(BN % 32 == 0, "BN: whole blocks along the last axis")
    EXACT: tl.constexpr = BIAS + MBITS <= 7
    r = tl.program_id(0) * 32 + tl.arange(0, 32)
    c = tl.program_id(1) * BN + tl.arange(0, BN)
    if BIG:
        offs = r.to(tl.int64)[:, None] * n_cols + c[None, :]
        offs_t = c.to(tl.int64)[:, None] * n_rows + r[None, :]
    else:
        offs = r[:, None] * n_cols + c[None, :]
        offs_t = c[:, None] * n_rows + r[None, :]
    mask = (c < n_cols)[None, :] & (r >= 0)[:, None]
    x = load_tile_f32(x_ptr, offs, mask, IN_BF16=IN_BF16, EVEN=EVEN)
    if ROT > 0:  # each axis's own rotation of its blocks
        xc = fwht(tl.reshape(tl.trans(x), (BN * 32 // ROT, ROT)), BN * 32 // ROT, ROT)
        xc = tl.trans(tl.reshape(xc * rot_scale, (BN, 32)))
    else:
        xc = x
    # along axis 0: each column's 32 values are a block (stored transposed, as bf16 bits)
    u = xc.to(tl.int32, bitcast=True)
    ab = u & 0x7FFFFFFF
    cols = _qdq_values(ab, u < 0, tl.max(ab, axis=0)[None, :], RULE=RULE, EMAX=EMAX,
                       MBITS=MBITS, BIAS=BIAS, RNUM=RNUM, RSHIFT=RSHIFT, MAXV=MAXV)
    cols = tl.trans(bf16_bits(cols, EXACT=EXACT).to(tl.int16))
    if EVEN:
        tl.store(cols_ptr + offs_t, cols)
    else:
        tl.store(cols_ptr + offs_t, cols, mask=tl.trans(mask))
    if WRITE_ROWS:  # along the last axis: 32-column pieces of each row
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
