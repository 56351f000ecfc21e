"""Quantize kernels: fused block rotation + MX quantize (and element casts, and the one-pass
quantize-dequantize), in three forms.

``quantize_rows32_kernel``  blocks of 32 along the last axis of a contiguous tensor: the fast
                            path (every training GEMM's operand).
``quantize_cols32_kernel``  blocks of 32 along a non-last axis in one pass (Wgrad's operands,
                            quantized along tokens): the row kernel's steps after the load.
``quantize_kernel``         any block size and axis (a strided tile), element casts, and
                            stochastic rounding along a non-last axis.

Both 32-block kernels can also fold an FP4/FP6 operand into E4M3 in the same pass (FOLD_GROUP:
``native.fold.quantize_folded``): under RNE from the elements' rounded magnitudes
(``kernels.fold.fold_values``: 22.8 SASS instructions per element for E2M1 in groups of 4 on
sm_90 against 41.3 through the codes), under stochastic rounding from the codes.

Layout of the quantized output ("K-major"): the quantized axis is the last one; FP4 codes are
packed two per byte along it, element 0 in the low nibble, other formats one code per byte;
scales are uint8 E8M0 codes, one per block, rows = every position of the other axes. This is the
layout ``tl.dot_scaled`` takes for an operand packed along its contraction dimension.

Constexprs: the format block (``ocpmx.spec.KernelFormat.constexprs``), the numerics (RULE,
ROUNDING, ROT and SIGNS, PACK, IN_BF16, CAST, QDQ, QUARTER_IN_SCALE), the fold (FOLD_GROUP,
D_MAX, POW2, HW_CVT), the tile (NB, or ROWS and KB, or BN and KB: tuning, which changes speed
and never bits) and what the shape implies (EVEN, BIG, INNER1, BS, ROW_NB).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import (FLOOR, STOCHASTIC, bf16_bits_to_f32, block_scale, decode_values,
                     encode, f32_to_bf16_bits, load_key, pow2_scale,
                     quarter_bits, rotation_signs, round_on_grid, stochastic_bits)
from .fold import (NAN_EXP, code_units, fold_values, group_exponents,
                   store_group_exponents, store_row_exponent, store_row_scale)


@triton.jit(do_not_specialize=["seed", "sign_mask"])
def quantize_kernel(x_ptr, data_ptr, scale_ptr, sign_mask, n_rows, K, inner, seed, rot_scale,
                    # the format
                    IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                    EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                    INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                    RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                    ENVELOPE: tl.constexpr,
                    # the numerics
                    RULE: tl.constexpr, ROUNDING: tl.constexpr, ROT: tl.constexpr,
                    SIGNS: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                    CAST: tl.constexpr,
                    # the tile, and what the shape implies
                    ROWS: tl.constexpr, KB: tl.constexpr, BS: tl.constexpr,
                    INNER1: tl.constexpr, BIG: tl.constexpr,
                    EVEN: tl.constexpr):
    """Quantize ROWS rows x KB blocks of BS elements of x (CAST: convert each element with
    scale 2^0 instead; no scales are stored).

    Row r of the K-major view is (o, i) = (r // inner, r % inner) of the input seen as
    (outer, K, inner); element (r, c) sits at flat index o*K*inner + c*inner + i; its
    stochastic-rounding counter is its K-major index r*K + c (the emulator's). ``seed`` and
    ``sign_mask``: integers or pointers (``common.load_key``).
    """
    if ROUNDING == STOCHASTIC:
        seed = load_key(seed)
    if SIGNS:
        sign_mask = load_key(sign_mask)
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * ROWS + tl.arange(0, ROWS)
    cols = pid_k * (KB * BS) + tl.arange(0, KB * BS)
    if BIG:  # 64-bit offsets only where the tensor needs them
        rws = rows.to(tl.int64)
    else:
        rws = rows
    if INNER1:
        flat = rws[:, None] * K + cols[None, :]
    else:
        o = rws // inner
        i = rws % inner
        flat = o[:, None] * K * inner + cols[None, :] * inner + i[:, None]
    if EVEN:  # the grid tiles the tensor exactly: no masks
        mask = None
    else:
        mask = (rows < n_rows)[:, None] & (cols < K)[None, :]
    if EVEN:
        xr = tl.load(x_ptr + flat)
    else:
        xr = tl.load(x_ptr + flat, mask=mask, other=0)
    if IN_BF16:  # x_ptr holds the bf16 bits as int16
        x = bf16_bits_to_f32(xr)
    else:
        x = xr.to(tl.float32)
    x = tl.reshape(x, (ROWS * KB, BS))

    if ROT > 0:  # block Hadamard along the block, groups of ROT elements
        g = tl.reshape(x, (ROWS * KB * (BS // ROT), ROT))
        if SIGNS:
            g = g * rotation_signs(sign_mask, tl.arange(0, ROT))[None, :]
        g = fwht(g, ROWS * KB * (BS // ROT), ROT) * rot_scale
        x = tl.reshape(g, (ROWS * KB, BS))

    u = x.to(tl.int32, bitcast=True)
    ab = u & 0x7FFFFFFF
    neg = u < 0

    if CAST:  # element conversion with scale 2^0 (every element its own 'block')
        s = tl.zeros((ROWS * KB,), tl.int32)
        special = s != 0
        scale = s
        any_special = True
    else:
        s, special, scale = block_scale(tl.max(ab, axis=1), RULE=RULE, EMAX=EMAX, MBITS=MBITS,
                                        RNUM=RNUM, RSHIFT=RSHIFT)
        any_special = tl.max(special.to(tl.int32), axis=0) > 0
    if ROUNDING == STOCHASTIC:  # counted in the K-major layout
        kmajor = rws[:, None] * K + cols[None, :]
        rbits = stochastic_bits(seed, tl.reshape(kmajor, (ROWS * KB, BS)))
    else:
        rbits = 0
    code = encode(ab, neg, s[:, None], special[:, None], any_special, rbits, OFF=0,
                  ROUNDING=ROUNDING,
                  IS_INT=IS_INT, ENVELOPE=ENVELOPE, MBITS=MBITS, BIAS=BIAS, MAXC=MAXC,
                  NANC=NANC, INFC=INFC, NEGMAX=NEGMAX, SIGN=SIGN, CAST=CAST, NAN_POS=ROT > 0)

    # ---- store: codes (packed for FP4) and scales ----
    code = tl.reshape(code, (ROWS, KB * BS))
    if PACK == 2:
        lo4, hi4 = tl.split(tl.reshape(code, (ROWS, KB * BS // 2, 2)))
        byte = (lo4 | (hi4 << 4)).to(tl.uint8)
        pcols = pid_k * (KB * BS // 2) + tl.arange(0, KB * BS // 2)
        if EVEN:
            pmask = None
        else:
            pmask = (rows < n_rows)[:, None] & (pcols < K // 2)[None, :]
        tl.store(data_ptr + rws[:, None] * (K // 2) + pcols[None, :], byte, mask=pmask)
    else:
        tl.store(data_ptr + rws[:, None] * K + cols[None, :], code.to(tl.uint8), mask=mask)
    if not CAST:
        scols = pid_k * KB + tl.arange(0, KB)
        if EVEN:
            smask = None
        else:
            smask = (rows < n_rows)[:, None] & (scols < K // BS)[None, :]
        tl.store(scale_ptr + rws[:, None] * (K // BS) + scols[None, :],
                 tl.reshape(scale, (ROWS, KB)).to(tl.uint8), mask=smask)


# ---- the 32-block row kernel and its pieces -----------------------------------------------

@triton.jit
def fwht(g, M: tl.constexpr, R: tl.constexpr):
    """Butterfly stages h = 1, 2, ..., R / 2 along the last axis of g [M, R] (R a power of two):
    the unnormalized Walsh-Hadamard transform of each row, in the emulator's order (the row
    kernel runs it on quarters of 8: in registers, each thread holding whole rows after a
    16-byte load; the strided and both-axes kernels on whole rotation groups)."""
    for st in tl.static_range(R.bit_length() - 1):
        t = tl.reshape(g, (M, (R // 2) >> st, 2, 1 << st))
        a, b = tl.split(tl.permute(t, (0, 1, 3, 2)))
        g = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (M, R))
    return g


@triton.jit
def load_f32(ptr, blk, part: tl.constexpr, valid, NB: tl.constexpr, EVEN: tl.constexpr,
             IN_BF16: tl.constexpr):
    """Quarter ``part`` (8 elements) of 32-element blocks ``blk`` as float32 [NB, 8], one
    16-byte load per block. bf16 input is read as int32 pairs (``ptr`` is the bf16 data viewed
    as int32): one shift or mask per element makes the float32 bits; float16 is converted
    exactly."""
    if IN_BF16:
        off = blk[:, None] * 16 + part * 4 + tl.arange(0, 4)[None, :]
        if EVEN:
            w = tl.load(ptr + off)
        else:
            w = tl.load(ptr + off, mask=valid[:, None] & (off >= 0), other=0)
        lo = (w << 16).to(tl.float32, bitcast=True)  # element 2i: the low half
        hi = (w & -65536).to(tl.float32, bitcast=True)  # element 2i + 1
        x = tl.reshape(tl.join(lo, hi), (NB, 8))
    else:
        off = blk[:, None] * 32 + part * 8 + tl.arange(0, 8)[None, :]
        if EVEN:
            x = tl.load(ptr + off)
        else:
            x = tl.load(ptr + off, mask=valid[:, None] & (off >= 0), other=0.0)
        x = x.to(tl.float32)
    return x


# the sum over j of 0x4B000000 << 4j, modulo 2^32 (as int32): what RAW codes add to a word
RAW_BIAS_WORD = tl.constexpr(-0x05000000)


@triton.jit
def sign_nibbles(u, NB: tl.constexpr):
    """[NB, 8] int32 (float32 bits) -> [NB] int32 whose bit 4j + 3 is element j's sign bit;
    the other bits hold the top of each element's exponent field (mask with 0x88888888). Each
    element costs one funnel shift: S = (S << 4) | (u_j >> 28), from element 7 down to 0."""
    ev, od = tl.split(tl.reshape(u.to(tl.uint32, bitcast=True), (NB, 4, 2)))  # 0 2 4 6 | 1 3 5 7
    e04, e26 = tl.split(tl.reshape(ev, (NB, 2, 2)))
    o15, o37 = tl.split(tl.reshape(od, (NB, 2, 2)))
    u0, u4 = tl.split(e04)
    u2, u6 = tl.split(e26)
    u1, u5 = tl.split(o15)
    u3, u7 = tl.split(o37)
    w = u7 >> 28
    w = (w << 4) | (u6 >> 28)
    w = (w << 4) | (u5 >> 28)
    w = (w << 4) | (u4 >> 28)
    w = (w << 4) | (u3 >> 28)
    w = (w << 4) | (u2 >> 28)
    w = (w << 4) | (u1 >> 28)
    w = (w << 4) | (u0 >> 28)
    return w.to(tl.int32, bitcast=True)


@triton.jit
def nibbles_to_word(code, RAW: tl.constexpr = False):
    """[N, 8] 4-bit codes -> [N] int32, element j in bits 4j..4j+3: the packed bytes of the 8
    codes read as a little-endian word (element 0 in the low nibble of byte 0). RAW: each code
    carries 0x4B000000 (``encode``), removed here for the whole word: the word is a sum, so
    the bias terms add up to a constant modulo 2^32."""
    w = tl.sum(code << (tl.arange(0, 8)[None, :] * 4), axis=1)
    if RAW:
        w = w - RAW_BIAS_WORD
    return w


@triton.jit
def rounded_magnitudes(ab, sb, special, off, MBITS: tl.constexpr, BIAS: tl.constexpr,
                       MAXV: tl.constexpr):
    """|decode(encode(.))| of the RNE-quantized elements in units of the block scale 2^s,
    without the codes: the rounding ``encode`` uses (``round_on_grid``), then saturation at
    the largest normal (float32, at most MBITS + 1 significant bits; not meaningful in a
    NaN/Inf block)."""
    _, magic, z = round_on_grid(ab, sb + off, special, MBITS=MBITS, BIAS=BIAS, CAST=False)
    return tl.minimum(z - magic.to(tl.float32, bitcast=True), MAXV)


@triton.jit
def signed(mag, u):
    """float32 magnitudes ``mag`` with the signs of the float32 bits ``u`` (-0 where ``u`` is
    negative and ``mag`` 0)."""
    return (mag.to(tl.int32, bitcast=True) | (u & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def rounded_values(ab, neg, sb, special, off, MBITS: tl.constexpr, BIAS: tl.constexpr,
                   MAXV: tl.constexpr):
    """float32 values of the RNE-quantized elements, ``decode(encode(.)) * 2^s`` without the
    codes: the rounding ``encode`` uses (``round_on_grid``), then saturation at the largest
    normal, 2^s (exact: at most MBITS + 1 significant bits), the sign as a bit, NaN for a
    NaN/Inf block."""
    r = rounded_magnitudes(ab, sb, special, off, MBITS=MBITS, BIAS=BIAS, MAXV=MAXV)
    val = (r * pow2_scale(sb)).to(tl.int32, bitcast=True) | (neg.to(tl.int32) << 31)
    return tl.where(special, float("nan"), val.to(tl.float32, bitcast=True))


@triton.jit
def bf16_bits(val, EXACT: tl.constexpr):
    """bf16 bits (int32, the low 16) of float32 values, as every quantize-dequantize writes
    them: cut when EXACT (every value is a bf16 number: E2M1, E2M3, E3M2 times any 2^s; NaN
    stays NaN), else rounded to nearest even."""
    if EXACT:
        return (val.to(tl.int32, bitcast=True) >> 16) & 0xFFFF
    return f32_to_bf16_bits(val).to(tl.int32) & 0xFFFF


@triton.jit
def store_blocks(ptr, off, val, valid, EVEN: tl.constexpr):
    """Store ``val`` [NB, W] at ``ptr + off``, row i belonging to block i: all of it where the
    grid tiles the tensor exactly (EVEN), else the rows of the blocks that exist (``valid``)."""
    if EVEN:
        tl.store(ptr + off, val)
    else:
        tl.store(ptr + off, val, mask=valid[:, None] & (off >= 0))


@triton.jit
def store_bf16_pairs(out_ptr, blk, val, part: tl.constexpr, valid, NB: tl.constexpr,
                     EVEN: tl.constexpr, EXACT: tl.constexpr):
    """Quarter ``part`` [NB, 8] of float32 values as bf16 (``bf16_bits``), stored as int32
    pairs [NB, 4]."""
    b = bf16_bits(val, EXACT=EXACT)
    lo, hi = tl.split(tl.reshape(b, (NB, 4, 2)))
    off = blk[:, None] * 16 + part * 4 + tl.arange(0, 4)[None, :]
    store_blocks(out_ptr, off, lo | (hi << 16), valid, EVEN=EVEN)


@triton.jit
def store_qdq(out_ptr, blk, code, scale, part: tl.constexpr, valid, NB: tl.constexpr,
              EVEN: tl.constexpr, BITS: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
              BIAS: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr, SUBQ: tl.constexpr):
    """Quarter ``part`` of 32-element blocks as bf16 values (the dequantize kernel's decode
    and rounding), stored as int32 pairs [NB, 4] (``out_ptr``: bf16 data viewed as int32)."""
    val = decode_values(code, scale.to(tl.int32)[:, None], IS_INT=False, BITS=BITS,
                        EBITS=EBITS, MBITS=MBITS, BIAS=BIAS, NANC=NANC, INFC=INFC, SUBQ=SUBQ)
    store_bf16_pairs(out_ptr, blk, val, part, valid, NB=NB, EVEN=EVEN,
                     EXACT=BIAS + MBITS <= 7)


@triton.jit
def store_codes(data_ptr, blk, code, part: tl.constexpr, valid, NB: tl.constexpr,
                PACK: tl.constexpr, EVEN: tl.constexpr):
    """Store the codes [NB, 8] of quarter ``part`` of 32-element blocks ``blk``."""
    if PACK == 2:
        lo4, hi4 = tl.split(tl.reshape(code, (NB, 4, 2)))
        off = blk[:, None] * 16 + part * 4 + tl.arange(0, 4)[None, :]
        val = (lo4 | (hi4 << 4)).to(tl.uint8)
    else:
        off = blk[:, None] * 32 + part * 8 + tl.arange(0, 8)[None, :]
        val = code.to(tl.uint8)
    store_blocks(data_ptr, off, val, valid, EVEN=EVEN)


@triton.jit
def rotate_quarters(q0, q1, q2, q3, sign_mask, rot_scale, ROT: tl.constexpr,
                    SIGNS: tl.constexpr, SCALE: tl.constexpr):
    """The block rotation of 32-element blocks held as quarters [NB, 8], in the emulator's
    order: signs, butterfly stages h = 1, 2, 4 inside a quarter, h = 8 and 16 between
    quarters, then (SCALE) the multiply by ``rot_scale``."""
    j = tl.arange(0, 8)[None, :]
    if SIGNS:  # signs by position inside the rotation group
        q0 = q0 * rotation_signs(sign_mask, j)
        q1 = q1 * rotation_signs(sign_mask, (8 % ROT) + j)
        q2 = q2 * rotation_signs(sign_mask, (16 % ROT) + j)
        q3 = q3 * rotation_signs(sign_mask, (24 % ROT) + j)
    q0 = fwht(q0, q0.shape[0], 8)
    q1 = fwht(q1, q1.shape[0], 8)
    q2 = fwht(q2, q2.shape[0], 8)
    q3 = fwht(q3, q3.shape[0], 8)
    q0, q1 = q0 + q1, q0 - q1  # h = 8
    q2, q3 = q2 + q3, q2 - q3
    if ROT == 32:  # h = 16
        q0, q2 = q0 + q2, q0 - q2
        q1, q3 = q1 + q3, q1 - q3
    if SCALE:
        q0 = q0 * rot_scale
        q1 = q1 * rot_scale
        q2 = q2 * rot_scale
        q3 = q3 * rot_scale
    return q0, q1, q2, q3


@triton.jit
def block_amax(u0, u1, u2, u3):
    """float32 bits of max |v| over each block held as quarters of int32 bits [NB, 8], without
    a per-element abs: as signed int32 the largest bits of a non-negative value win, as uint32
    those of a negative one (sign bit set); the larger of the two, sign cleared, is the
    largest |v| (NaN included: its bits exceed Inf's)."""
    smax = tl.max(tl.maximum(tl.maximum(u0, u1), tl.maximum(u2, u3)), axis=1)
    umax = tl.max(tl.maximum(tl.maximum(u0.to(tl.uint32, bitcast=True),
                                        u1.to(tl.uint32, bitcast=True)),
                             tl.maximum(u2.to(tl.uint32, bitcast=True),
                                        u3.to(tl.uint32, bitcast=True))), axis=1)
    return tl.maximum(smax, (umax & 0x7FFFFFFF).to(tl.int32, bitcast=True))


@triton.jit
def quarter_codes(ab, u, sb, special, any_special, rbits, OFF: tl.constexpr,
                  RULE: tl.constexpr, ROUNDING: tl.constexpr, ROT: tl.constexpr,
                  IS_INT: tl.constexpr, ENVELOPE: tl.constexpr, MBITS: tl.constexpr,
                  BIAS: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                  INFC: tl.constexpr, NEGMAX: tl.constexpr, SIGN: tl.constexpr):
    """Codes [NB, 8] of one quarter of the row kernel's blocks (``encode`` with the row
    kernel's options: NaN positive after a rotation, saturation only under the floor rule).
    ``rbits``: the quarter's stochastic-rounding bits [NB, 8] (0 under RNE)."""
    return encode(ab, u < 0, sb, special, any_special, rbits, OFF=OFF, ROUNDING=ROUNDING,
                  IS_INT=IS_INT, ENVELOPE=ENVELOPE, MBITS=MBITS, BIAS=BIAS, MAXC=MAXC,
                  NANC=NANC, INFC=INFC, NEGMAX=NEGMAX, SIGN=SIGN, CAST=False, NAN_POS=ROT > 0,
                  SAT=RULE == FLOOR)


@triton.jit
def raw_word(ab, u, sb, special, any_special, rbits, OFF: tl.constexpr,
             ROUNDING: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
             MAXC: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr, SIGN: tl.constexpr,
             SAT: tl.constexpr, NB: tl.constexpr):
    """One quarter [NB, 8] of E2M1 blocks as packed code words [NB]: the magnitudes from
    ``encode``'s RAW codes (RNE: the envelope's, their bias removed once per word; stochastic:
    ``stochastic_code``'s, ``rbits`` the quarter's random bits), then the signs from
    ``sign_nibbles`` added (the nibbles' sign bits are clear before): one funnel shift an
    element instead of a shift and a merge."""
    c = encode(ab, u < 0, sb, special, any_special, rbits, OFF=OFF, ROUNDING=ROUNDING,
               IS_INT=False, ENVELOPE=True, MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC,
               INFC=INFC, NEGMAX=0, SIGN=SIGN, CAST=False, NAN_POS=False, SAT=SAT, RAW=True)
    return nibbles_to_word(c, RAW=ROUNDING != STOCHASTIC) + (sign_nibbles(u, NB) & -0x77777778)


@triton.jit
def block_words(w0, w1, w2, w3, NB: tl.constexpr):
    """The four code words [NB] of each block (quarters 0-3) as [NB, 4], a block's 16 bytes."""
    return tl.reshape(tl.permute(tl.join(tl.join(w0, w1), tl.join(w2, w3)), (0, 2, 1)), (NB, 4))


@triton.jit
def store_words(data_ptr, blk, w0, w1, w2, w3, valid, NB: tl.constexpr, EVEN: tl.constexpr):
    """The four code words [NB] of each block (quarters 0-3): one 16-byte store per block."""
    words = block_words(w0, w1, w2, w3, NB=NB)
    woff = blk[:, None] * 4 + tl.arange(0, 4)[None, :]
    store_blocks(data_ptr.to(tl.pointer_type(tl.int32)), woff, words, valid, EVEN=EVEN)


@triton.jit
def store_scales(scale_ptr, blk, scale, valid, EVEN: tl.constexpr):
    if EVEN:
        tl.store(scale_ptr + blk, scale.to(tl.uint8))
    else:
        tl.store(scale_ptr + blk, scale.to(tl.uint8), mask=valid)


@triton.jit
def fold_quarters(c0, c1, c2, c3, scale, blk, valid, out_ptr, exp_ptr, pow2_ptr, stats_ptr,
                  total_ptr, n_blocks, n_rows, SIGN: tl.constexpr, BITS: tl.constexpr,
                  MBITS: tl.constexpr, BIAS: tl.constexpr, SUBQ: tl.constexpr,
                  GROUP: tl.constexpr, D_MAX: tl.constexpr, POW2: tl.constexpr,
                  HW_CVT: tl.constexpr, NB: tl.constexpr, EVEN: tl.constexpr,
                  FROM_CODES: tl.constexpr, ROW: tl.constexpr = 0):
    """NB blocks' elements (quarters c0..c3 [NB, 8]: MX codes, or with FROM_CODES False their
    values in units of the block scale, signed float32: ``fold_values``) and E8M0 scales [NB],
    whole groups of GROUP consecutive blocks (a row's K / 32 blocks divide into them; the GROUP
    consecutive entries of ``blk`` from a multiple of GROUP on are one group, in order), folded
    into E4M3 (``fold_kernel`` folds stored codes with it: the same bits). ``n_blocks``: the
    tensor's blocks (rows x K / 32). ``ROW`` > 0 (GROUP = NB): the program's blocks are one row
    of ROW blocks from its first on, the rest masked (``valid``: all-zero blocks, which R does
    not count), its group the row."""
    tl.static_assert(ROW == 0 or GROUP == NB, "a padded row is the program's one group")
    tl.static_assert(NB % GROUP == 0, "a program holds whole fold groups")
    NGP: tl.constexpr = NB // GROUP
    sc = scale.to(tl.int32)
    if FROM_CODES:
        nz = codes_nonzero(c0, c1, c2, c3, SIGN=SIGN)
    else:  # a nonzero magnitude (NaN only in a NaN block, which R ignores)
        nz = tl.maximum(tl.maximum(tl.max(tl.abs(c0), axis=1), tl.max(tl.abs(c1), axis=1)),
                        tl.maximum(tl.max(tl.abs(c2), axis=1), tl.max(tl.abs(c3), axis=1))) > 0
    sc2 = tl.reshape(sc, (NGP, GROUP))
    r, nan = group_exponents(sc2, tl.reshape(nz, (NGP, GROUP)), D_MAX=D_MAX)
    d = tl.reshape(sc2 - 127 - r[:, None], (NB,))[:, None]  # each block's shift
    nan_block = (sc == 255)[:, None]
    m = valid[:, None] & (tl.arange(0, 8)[None, :] >= 0)
    if FROM_CODES:  # the codes' values in units of the block scale
        c0 = code_units(c0, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ)
        c1 = code_units(c1, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ)
        c2 = code_units(c2, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ)
        c3 = code_units(c3, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ)
    f0, f1, f2, f3, n_changed = fold_values(c0, c1, c2, c3, d, nan_block, nz[:, None], m,
                                            SUBQ=SUBQ, HW_CVT=HW_CVT)
    store_codes(out_ptr, blk, f0, 0, valid, NB=NB, PACK=1, EVEN=EVEN)
    store_codes(out_ptr, blk, f1, 1, valid, NB=NB, PACK=1, EVEN=EVEN)
    store_codes(out_ptr, blk, f2, 2, valid, NB=NB, PACK=1, EVEN=EVEN)
    store_codes(out_ptr, blk, f3, 3, valid, NB=NB, PACK=1, EVEN=EVEN)
    if ROW > 0:  # (the masked blocks' indices run on into the next row)
        q = tl.min(tl.reshape(blk, (NGP, GROUP)), axis=1) // ROW
    else:
        q = tl.max(tl.reshape(blk, (NGP, GROUP)), axis=1) // GROUP  # the groups' indices
    # the groups that exist: a group's blocks exist together. (Not q < n_groups: in the column
    # kernel a masked column's indices run on into the next outer position's rows.)
    exists = tl.max(tl.reshape(valid.to(tl.int32), (NGP, GROUP)), axis=1) > 0
    store_group_exponents(tl.where(nan, NAN_EXP, r), q, exists, exp_ptr, pow2_ptr, stats_ptr,
                          total_ptr, n_blocks // (ROW if ROW > 0 else GROUP), n_rows,
                          n_changed, POW2=POW2)


@triton.jit
def load_quarter(data_ptr, blk, part: tl.constexpr, valid, NB: tl.constexpr,
                 PACK: tl.constexpr):
    """The codes (int32 [NB, 8]) of quarter ``part`` of 32-blocks ``blk`` of stored K-major
    codes (``store_codes``' layout): FP4 one 4-byte load of 8 nibbles, else 8 bytes."""
    if PACK == 2:
        off = blk[:, None] * 16 + part * 4 + tl.arange(0, 4)[None, :]
        b = tl.load(data_ptr + off, mask=valid[:, None] & (off >= 0), other=0).to(tl.int32)
        return tl.reshape(tl.join(b & 0xF, b >> 4), (NB, 8))
    off = blk[:, None] * 32 + part * 8 + tl.arange(0, 8)[None, :]
    return tl.load(data_ptr + off, mask=valid[:, None] & (off >= 0), other=0).to(tl.int32)


@triton.jit
def fold_kernel(data_ptr, scale_ptr, out_ptr, exp_ptr, pow2_ptr, stats_ptr, total_ptr,
                n_groups, rows,
                # the MX element format (the source)
                IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                ENVELOPE: tl.constexpr, PACK: tl.constexpr,
                # the fold: the largest exact shift; the tile; POW2: also write 2^R as float32
                # group-major (pow2_ptr[g, row]); HW_CVT: the GPU's E4M3 conversion
                D_MAX: tl.constexpr, GROUP: tl.constexpr, NG: tl.constexpr,
                POW2: tl.constexpr, HW_CVT: tl.constexpr):
    """The fold of stored MX codes (``native.fold.fold_kmajor``): NG groups of GROUP 32-blocks
    (K-major: group q is blocks q*GROUP .. q*GROUP+GROUP-1 of the flat block sequence, which a
    row's K / 32 blocks divide) -> E4M3 codes, R (and with POW2 2^R as float32 group-major,
    pow2_ptr[g, row]: cuBLAS's blockwise scale layout) and the stats (``fold_quarters``: [0]
    |= 1 where some R lies past the folded GEMM's rank-1 epilogue, [1] and total_ptr += the
    elements whose E4M3 code is not their exact value). A thread holds whole blocks as
    quarters, as the quantize row kernel does, and folds them with the row kernel's own
    ``fold_quarters`` (its stochastic-rounding fold, which starts from codes too): the same
    helpers and layout, the same bits. HW_CVT: the E4M3 codes by the GPU's conversion
    instruction, else by ``encode`` (the interpreter; the same bits)."""
    NB: tl.constexpr = NG * GROUP
    blk = tl.program_id(0) * NB + tl.arange(0, NB)
    valid = blk < n_groups * GROUP
    scale = tl.load(scale_ptr + blk, mask=valid, other=127)
    fold_quarters(load_quarter(data_ptr, blk, 0, valid, NB=NB, PACK=PACK),
                  load_quarter(data_ptr, blk, 1, valid, NB=NB, PACK=PACK),
                  load_quarter(data_ptr, blk, 2, valid, NB=NB, PACK=PACK),
                  load_quarter(data_ptr, blk, 3, valid, NB=NB, PACK=PACK),
                  scale, blk, valid, out_ptr, exp_ptr, pow2_ptr, stats_ptr, total_ptr,
                  n_groups * GROUP, rows, SIGN=SIGN, BITS=BITS, MBITS=MBITS, BIAS=BIAS,
                  SUBQ=SUBQ, GROUP=GROUP, D_MAX=D_MAX, POW2=POW2, HW_CVT=HW_CVT, NB=NB,
                  EVEN=False, FROM_CODES=True)


@triton.jit
def codes_nonzero(c0, c1, c2, c3, SIGN: tl.constexpr):
    """[NB]: the blocks whose codes (quarters c0..c3 [NB, 8]) hold a nonzero one (a magnitude
    bit set): the blocks a fold group's exponent counts."""
    return (tl.max(c0 & (SIGN - 1), axis=1) | tl.max(c1 & (SIGN - 1), axis=1)
            | tl.max(c2 & (SIGN - 1), axis=1) | tl.max(c3 & (SIGN - 1), axis=1)) > 0


@triton.jit
def block_nonzero(data_ptr, blk, valid, SIGN: tl.constexpr, NB: tl.constexpr,
                  PACK: tl.constexpr):
    """[NB]: the stored 32-blocks ``blk`` hold a nonzero code (``codes_nonzero`` of the
    loaded quarters, each reduced as it arrives: as one expression, sm_90 under Triton 3.6 took
    1.2% more instructions in ``fold_rows_finish_kernel`` for E3M2)."""
    m = tl.maximum(tl.max(load_quarter(data_ptr, blk, 0, valid, NB=NB, PACK=PACK)
                          & (SIGN - 1), axis=1),
                   tl.max(load_quarter(data_ptr, blk, 1, valid, NB=NB, PACK=PACK)
                          & (SIGN - 1), axis=1))
    m = tl.maximum(m, tl.max(load_quarter(data_ptr, blk, 2, valid, NB=NB, PACK=PACK)
                             & (SIGN - 1), axis=1))
    m = tl.maximum(m, tl.max(load_quarter(data_ptr, blk, 3, valid, NB=NB, PACK=PACK)
                             & (SIGN - 1), axis=1))
    return m > 0


@triton.jit
def fold_chunk_values(data_ptr, out_ptr, blk, valid, sc, d, big, BITS: tl.constexpr,
                      SIGN: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                      SUBQ: tl.constexpr, PACK: tl.constexpr, NB: tl.constexpr,
                      HW_CVT: tl.constexpr):
    """``fold_row_chunks``' float path for blocks ``blk`` (scale codes ``sc``, shifts ``d``):
    ``fold_values`` on the codes' values, as ``fold_quarters`` folds a group (the same bits).
    (the rounded elements, int64; whether a block of scale code ``big`` holds a nonzero code)."""
    c0 = load_quarter(data_ptr, blk, 0, valid, NB=NB, PACK=PACK)
    c1 = load_quarter(data_ptr, blk, 1, valid, NB=NB, PACK=PACK)
    c2 = load_quarter(data_ptr, blk, 2, valid, NB=NB, PACK=PACK)
    c3 = load_quarter(data_ptr, blk, 3, valid, NB=NB, PACK=PACK)
    nz = codes_nonzero(c0, c1, c2, c3, SIGN=SIGN)
    m = valid[:, None] & (tl.arange(0, 8)[None, :] >= 0)
    f0, f1, f2, f3, n = fold_values(
        code_units(c0, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ),
        code_units(c1, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ),
        code_units(c2, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ),
        code_units(c3, BITS=BITS, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ),
        d[:, None], (sc == 255)[:, None], nz[:, None], m, SUBQ=SUBQ, HW_CVT=HW_CVT)
    store_codes(out_ptr, blk, f0, 0, valid, NB=NB, PACK=1, EVEN=False)
    store_codes(out_ptr, blk, f1, 1, valid, NB=NB, PACK=1, EVEN=False)
    store_codes(out_ptr, blk, f2, 2, valid, NB=NB, PACK=1, EVEN=False)
    store_codes(out_ptr, blk, f3, 3, valid, NB=NB, PACK=1, EVEN=False)
    return n, tl.max((nz & (sc == big)).to(tl.int32), axis=0)


@triton.jit
def fold_chunk_e2m1(data_ptr, out_ptr, blk, valid, sc, d, big, NB: tl.constexpr):
    """``fold_row_chunks``' integer path for E2M1 blocks ``blk`` whose every shift d lies in
    [-5, 6]: value 2^(e-1) (1 + m/2) times 2^d is the E4M3 normal of exponent field e + 6 + d and
    mantissa m << 2, so its code is the E2M1 magnitude bits (e, m) shifted left by two plus
    (6 + d) << 3, the one subnormal 0.5 = 2^-1 less 4, and the sign moved to bit 7: exact, the
    conversion's codes. A block a row, its 16 bytes, its 32 codes in order. (whether a block of
    scale code ``big`` holds a nonzero code)."""
    bo = blk[:, None] * 16 + tl.arange(0, 16)[None, :]
    byte = tl.load(data_ptr + bo, mask=valid[:, None] & (bo >= 0), other=0).to(tl.int32)
    code = tl.reshape(tl.join(byte & 0xF, byte >> 4), (NB, 32))
    mag = code & 7
    e4 = (mag << 2) + ((6 + d) << 3)[:, None] - tl.where(mag == 1, 4, 0)
    e4 = tl.where(mag == 0, 0, e4) | ((code & 8) << 4)
    oo = blk[:, None] * 32 + tl.arange(0, 32)[None, :]
    tl.store(out_ptr + oo, e4.to(tl.uint8), mask=valid[:, None] & (oo >= 0))
    return tl.max(((tl.max(mag, axis=1) > 0) & (sc == big)).to(tl.int32), axis=0)


@triton.jit
def spread_nibbles(h):
    """The four nibbles of the low 16 bits of uint32 ``h``, one a byte, in order (nibble k in
    byte k: packed E2M1 codes, element 2i in the low nibble of byte i)."""
    h = (h | (h << 8)) & 0x00FF00FF
    return (h | (h << 4)) & 0x0F0F0F0F


@triton.jit
def e2m1_bytes_to_e4m3(x, c):
    """``fold_chunk_e2m1``'s conversion on four E2M1 codes at once, one a byte of uint32 ``x``
    (SWAR): magnitude bits m (3), the code m << 2 + c (c = (6 + d) << 3, 8 to 96) less 4 where
    m = 1, 0 where m = 0, the sign to bit 7. No byte carries into the next: m << 2 + c <= 124,
    and where m = 1, 4 + c - 4 >= 8. Byte tests by adding 0x7F (a byte of at most 7 sets its
    top bit exactly when it is nonzero)."""
    mag = x & 0x07070707
    nz = ((mag + 0x7F7F7F7F) >> 7) & 0x01010101  # 1 in each nonzero magnitude's byte
    not1 = (((mag ^ 0x01010101) + 0x7F7F7F7F) >> 7) & 0x01010101  # 0 where m = 1
    return ((mag << 2) + nz * c - ((not1 ^ 0x01010101) << 2)) | ((x & 0x08080808) << 4)


@triton.jit
def fold_chunk_e2m1_words(data_ptr, out_ptr, blk, valid, sc, d, big, NB: tl.constexpr):
    """``fold_chunk_e2m1`` in 32-bit words (the codes 4-byte aligned, ``WORDS``): a block's 16
    bytes as four uint32 of eight codes, each written as one uint64 of eight E4M3 codes, so
    the block's load and store keep one layout (no shuffles between them)."""
    wo = blk[:, None] * 4 + tl.arange(0, 4)[None, :]
    ok = valid[:, None] & (wo >= 0)
    w = tl.load(data_ptr.to(tl.pointer_type(tl.uint32)) + wo, mask=ok, other=0)
    c = (((6 + d) << 3).to(tl.uint32))[:, None]
    lo = e2m1_bytes_to_e4m3(spread_nibbles(w & 0xFFFF), c)
    hi = e2m1_bytes_to_e4m3(spread_nibbles(w >> 16), c)
    tl.store(out_ptr.to(tl.pointer_type(tl.uint64)) + wo,
             lo.to(tl.uint64) | (hi.to(tl.uint64) << 32), mask=ok)
    nonzero = tl.max(((w & 0x77777777) != 0).to(tl.int32), axis=1) > 0
    return tl.max((nonzero & (sc == big)).to(tl.int32), axis=0)


@triton.jit
def fold_chunk(data_ptr, out_ptr, blk, valid, sc, d, big, BITS: tl.constexpr,
               SIGN: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, SUBQ: tl.constexpr,
               PACK: tl.constexpr, NB: tl.constexpr, HW_CVT: tl.constexpr,
               D_INT: tl.constexpr, WORDS: tl.constexpr):
    """Fold blocks ``blk`` of a row (scale codes ``sc``, shifts ``d``): with D_INT < 1000 (E2M1)
    in integer arithmetic where every block shifts by at least D_INT and none is NaN
    (``fold_chunk_e2m1``; in 32-bit words with ``WORDS``: the codes 4-byte aligned), else by
    ``fold_chunk_values``. (the rounded elements, int64; whether a block of scale code ``big``
    holds a nonzero code)."""
    if D_INT < 1000:
        fast = (tl.min(tl.where(valid, d, 1000), axis=0) >= D_INT) & \
            (tl.max(((sc == 255) & valid).to(tl.int32), axis=0) == 0)
        if fast:
            n = tl.zeros((), tl.int64)
            if WORDS:
                s = fold_chunk_e2m1_words(data_ptr, out_ptr, blk, valid, sc, d, big, NB=NB)
            else:
                s = fold_chunk_e2m1(data_ptr, out_ptr, blk, valid, sc, d, big, NB=NB)
        else:
            n, s = fold_chunk_values(data_ptr, out_ptr, blk, valid, sc, d, big, BITS=BITS,
                                     SIGN=SIGN, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ, PACK=PACK,
                                     NB=NB, HW_CVT=HW_CVT)
    else:
        n, s = fold_chunk_values(data_ptr, out_ptr, blk, valid, sc, d, big, BITS=BITS,
                                 SIGN=SIGN, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ, PACK=PACK, NB=NB,
                                 HW_CVT=HW_CVT)
    return n, s


@triton.jit
def row_scale_max(scale_ptr, first, n_blocks_row, NBR: tl.constexpr):
    """(the largest non-NaN scale code of a row's blocks, -1 if none; 1 where one is NaN)."""
    j = tl.arange(0, NBR)
    ok = j < n_blocks_row
    sc = tl.load(scale_ptr + first + j, mask=ok, other=0).to(tl.int32)
    big = tl.max(tl.where(ok & (sc != 255), sc, -1), axis=0)
    return big, tl.max(((sc == 255) & ok).to(tl.int32), axis=0)


@triton.jit
def fold_rows_kernel(data_ptr, scale_ptr, out_ptr, exp_ptr, pow2_ptr, stats_ptr, row_ptr,
                     n_blocks_row,
                     # the MX element format (the source)
                     IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                     EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                     EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                     INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                     RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                     ENVELOPE: tl.constexpr, PACK: tl.constexpr,
                     # the fold: the largest exact shift; the smallest shift the integer path
                     # takes (1000: none); blocks per program, and a power of two holding a
                     # row's; 2^R per row; the conversion; WORDS: the integer path on 32-bit
                     # words of codes (the data 4-byte aligned)
                     D_MAX: tl.constexpr, D_INT: tl.constexpr, NB: tl.constexpr,
                     NBR: tl.constexpr, POW2: tl.constexpr, HW_CVT: tl.constexpr,
                     WORDS: tl.constexpr):
    """The fold of stored MX codes with one exponent per whole row (``native.fold.fold_kmajor``
    with group = K / 32, any number of blocks: ``emulator.fold.fold(mx, None)``), the first of
    two launches: a program per (row, NB blocks of it), ``fold_rows_finish_kernel`` after it.

    R is the largest scale exponent among the row's blocks holding a nonzero code, minus D_MAX
    (0 for a row of zeros; NAN_EXP with a NaN block). Each program reads the row's scales and
    takes their largest non-NaN code ``big``: a quantizer gives the block of the largest scale a
    nonzero code, so R is ``big`` - 127 - D_MAX, and the program folds its blocks under it
    (``fold_chunk``), noting in row_ptr[row, 0] whether one of its blocks of scale ``big``
    holds a nonzero code and adding its rounded elements to row_ptr[row, 1] (int64). The
    row's first program stores R (and with POW2 2^R at pow2_ptr[row], cuBLAS's rowwise
    scale)."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    first = row * n_blocks_row
    big, nan = row_scale_max(scale_ptr, first, n_blocks_row, NBR=NBR)
    r = tl.where(big < 0, 0, big - 127 - D_MAX)
    j = c * NB + tl.arange(0, NB)
    valid = j < n_blocks_row
    blk = first + j
    sc = tl.load(scale_ptr + blk, mask=valid, other=127).to(tl.int32)
    n, seen = fold_chunk(data_ptr, out_ptr, blk, valid, sc, sc - 127 - r, big, BITS=BITS,
                         SIGN=SIGN, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ, PACK=PACK, NB=NB,
                         HW_CVT=HW_CVT, D_INT=D_INT, WORDS=WORDS)
    if seen > 0:
        tl.atomic_or(row_ptr + 2 * row, 1)
    if n > 0:
        tl.atomic_add(row_ptr + 2 * row + 1, n)
    if c == 0:
        store_row_scale(tl.where(nan > 0, NAN_EXP, r), row, exp_ptr, pow2_ptr, POW2=POW2)


@triton.jit
def fold_rows_finish_kernel(data_ptr, scale_ptr, out_ptr, exp_ptr, pow2_ptr, stats_ptr,
                            total_ptr, row_ptr, n_blocks_row,
                            BITS: tl.constexpr, SIGN: tl.constexpr, MBITS: tl.constexpr,
                            BIAS: tl.constexpr, SUBQ: tl.constexpr, PACK: tl.constexpr,
                            D_MAX: tl.constexpr, NB: tl.constexpr, NBR: tl.constexpr,
                            POW2: tl.constexpr, HW_CVT: tl.constexpr):
    """The whole-row fold's second launch, a program per row: the row's rounded elements
    (row_ptr[row, 1]) added to stats_ptr[1] and the device's total, an R past the GEMM's rank-1
    epilogue flagged in stats_ptr[0]; where no block of the row's largest scale held a nonzero
    code (row_ptr[row, 0] = 0, codes and scales made otherwise than by a quantizer) R comes
    from the codes instead and the row is folded again (``fold_chunk_values``, chunk by chunk),
    its count recounted."""
    row = tl.program_id(0).to(tl.int64)
    first = row * n_blocks_row
    big, nan = row_scale_max(scale_ptr, first, n_blocks_row, NBR=NBR)
    n = tl.load(row_ptr + 2 * row + 1)
    rr = tl.load(exp_ptr + row)
    if (tl.load(row_ptr + 2 * row) == 0) & (big >= 0):
        top = tl.full((), -1000, tl.int32)
        for c in range(0, tl.cdiv(n_blocks_row, NB)):
            j = c * NB + tl.arange(0, NB)
            valid = j < n_blocks_row
            sc = tl.load(scale_ptr + first + j, mask=valid, other=0).to(tl.int32)
            nz = block_nonzero(data_ptr, first + j, valid, SIGN=SIGN, NB=NB, PACK=PACK)
            top = tl.maximum(top, tl.max(tl.where(nz & (sc != 255), sc - 127, -1000), axis=0))
        r = tl.where(top == -1000, 0, top - D_MAX)
        n = tl.zeros((), tl.int64)
        for c in range(0, tl.cdiv(n_blocks_row, NB)):
            j = c * NB + tl.arange(0, NB)
            valid = j < n_blocks_row
            blk = first + j
            sc = tl.load(scale_ptr + blk, mask=valid, other=127).to(tl.int32)
            nc, s = fold_chunk_values(data_ptr, out_ptr, blk, valid, sc, sc - 127 - r, -1,
                                      BITS=BITS, SIGN=SIGN, MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ,
                                      PACK=PACK, NB=NB, HW_CVT=HW_CVT)
            n += nc
        rr = tl.where(nan > 0, NAN_EXP, r)
        store_row_scale(rr, row, exp_ptr, pow2_ptr, POW2=POW2)
    store_row_exponent(rr, row, exp_ptr, pow2_ptr, stats_ptr, total_ptr, n, POW2=False)


@triton.jit(do_not_specialize=["seed", "sign_mask"])
def quantize_rows32_kernel(x_ptr, data_ptr, scale_ptr, sign_mask, n_blocks, seed, rot_scale,
                           # the fold's outputs (FOLD_GROUP > 0; else unused)
                           exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_rows,
                           # the format
                           IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                           EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                           EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                           INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                           RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                           ENVELOPE: tl.constexpr,
                           # the numerics
                           RULE: tl.constexpr, ROUNDING: tl.constexpr, ROT: tl.constexpr,
                           SIGNS: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                           QDQ: tl.constexpr, QUARTER_IN_SCALE: tl.constexpr,
                           # the fold into E4M3 (``kernels.fold``): blocks per group (0: none),
                           # the format's largest exact shift, 2^R for cuBLAS, the conversion
                           FOLD_GROUP: tl.constexpr, D_MAX: tl.constexpr, POW2: tl.constexpr,
                           HW_CVT: tl.constexpr,
                           # the tile, and what the shape implies
                           NB: tl.constexpr, BIG: tl.constexpr, EVEN: tl.constexpr,
                           # a program per whole row of ROW_NB blocks (0: NB blocks a program)
                           ROW_NB: tl.constexpr):
    """Blocks of 32 along the last axis of a contiguous tensor: block b is elements
    [32 b, 32 b + 32) of the flat input, so the tensor is one sequence of blocks. Each block is
    held as four quarters of 8 (one 16-byte load each), which keeps the whole butterfly in
    registers: stages h = 1, 2, 4 inside a quarter, h = 8 and h = 16 between quarters. Same
    bits as ``quantize_kernel`` (and the emulator).

    QUARTER_IN_SCALE (H16 on bf16 or float16 input, a float format): the rotation's 1/4
    goes into the block scale instead of a multiply per element. The emulator rotates as signs,
    butterfly stages, then v = fl(T * 1/4). On bf16 or float16 input every x is a multiple of
    2^-133 (resp. 2^-24), so every butterfly intermediate and T are multiples of it too, and T/4
    is a float32 number: v = T / 4 exactly (Inf and NaN stay what they are). So max|v| = max|T| / 4
    (one multiply per block, exact), and the elements' input y = |v| * 2^-s = |T| * 2^-(s + 2)
    (RNE's and stochastic rounding's alike): the same real number, rounded once either way,
    2^-(s + 2) being a float32 number (|v| < 2^126 gives s <= 124 for every float format). Same
    bits as the emulator.

    QDQ: instead of codes and scales, write the dequantized values as bf16 (data_ptr: the
    output viewed as int32 pairs), the bits of ``dequantize(quantize(x), bfloat16)``: on chips
    without MX units this is what feeds a bf16 GEMM, without the packed round trip.

    FOLD_GROUP > 0 (an FP4/FP6 format): instead of packed codes, write the operand folded into
    E4M3 in groups of FOLD_GROUP blocks (data_ptr: one byte per element; exp_ptr: each group's
    R; with POW2 pow2_ptr: 2^R group-major over ``n_rows`` rows; stats_ptr and total_ptr: the
    fold's flags and rounded-element counts), the bits of ``native.fold.fold(quantize(x))``,
    the MX scales stored as always. NB must be a multiple of FOLD_GROUP (unless ROW_NB).

    ROW_NB > 0 (a fold of whole rows of ROW_NB blocks, FOLD_GROUP = ROW_NB, any number up to
    NB, a power of two): program i holds row i, blocks [i ROW_NB, (i + 1) ROW_NB), in a tile of
    NB blocks whose last NB - ROW_NB are masked (loaded as zeros: all-zero blocks, which no
    group's exponent counts). EVEN is then False.

    ``seed`` and ``sign_mask``: integers or pointers (``common.load_key``)."""
    tl.static_assert(ROW_NB == 0 or (ROW_NB == FOLD_GROUP and ROW_NB <= NB and not EVEN),
                     "a program per whole row folds the row as one group, masked")
    if ROUNDING == STOCHASTIC:
        seed = load_key(seed)
    if SIGNS:
        sign_mask = load_key(sign_mask)
    STEP: tl.constexpr = ROW_NB if ROW_NB > 0 else NB  # blocks a program advances
    blk = tl.program_id(0) * STEP + tl.arange(0, NB)
    if BIG:
        blk = blk.to(tl.int64)
    if ROW_NB > 0:  # (the padding's indices run on into the next row)
        valid = tl.arange(0, NB) < ROW_NB
    else:
        valid = blk < n_blocks
    q0 = load_f32(x_ptr, blk, 0, valid, NB=NB, EVEN=EVEN, IN_BF16=IN_BF16)
    q1 = load_f32(x_ptr, blk, 1, valid, NB=NB, EVEN=EVEN, IN_BF16=IN_BF16)
    q2 = load_f32(x_ptr, blk, 2, valid, NB=NB, EVEN=EVEN, IN_BF16=IN_BF16)
    q3 = load_f32(x_ptr, blk, 3, valid, NB=NB, EVEN=EVEN, IN_BF16=IN_BF16)
    quantize_quarters(q0, q1, q2, q3, seed, blk, valid, data_ptr, scale_ptr,
                      sign_mask, rot_scale, IS_INT=IS_INT, BITS=BITS, SIGN=SIGN, EBITS=EBITS,
                      MBITS=MBITS, BIAS=BIAS, EMAX=EMAX, MAXC=MAXC, NANC=NANC, INFC=INFC,
                      NEGMAX=NEGMAX, RNUM=RNUM, RSHIFT=RSHIFT, SUBQ=SUBQ, MAXV=MAXV,
                      ENVELOPE=ENVELOPE, RULE=RULE, ROUNDING=ROUNDING, ROT=ROT, SIGNS=SIGNS,
                      PACK=PACK, QDQ=QDQ, QUARTER_IN_SCALE=QUARTER_IN_SCALE, NB=NB, EVEN=EVEN,
                      exp_ptr=exp_ptr, pow2_ptr=pow2_ptr, stats_ptr=stats_ptr,
                      total_ptr=total_ptr, n_blocks=n_blocks, n_rows=n_rows,
                      FOLD_GROUP=NB if ROW_NB > 0 else FOLD_GROUP, D_MAX=D_MAX, POW2=POW2,
                      HW_CVT=HW_CVT, SR_SIGN_WORDS=True, ROW=ROW_NB)


@triton.jit
def quantize_quarters(q0, q1, q2, q3, seed, blk, valid, data_ptr, scale_ptr, sign_mask,
                      rot_scale,
                      IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                      EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                      EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                      INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                      RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                      ENVELOPE: tl.constexpr, RULE: tl.constexpr, ROUNDING: tl.constexpr,
                      ROT: tl.constexpr, SIGNS: tl.constexpr, PACK: tl.constexpr,
                      QDQ: tl.constexpr, QUARTER_IN_SCALE: tl.constexpr, NB: tl.constexpr,
                      EVEN: tl.constexpr, exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_blocks,
                      n_rows, FOLD_GROUP: tl.constexpr, D_MAX: tl.constexpr,
                      POW2: tl.constexpr, HW_CVT: tl.constexpr, DEFER: tl.constexpr = False,
                      SR_SIGN_WORDS: tl.constexpr = False, ROW: tl.constexpr = 0):
    """Everything after the load, for NB 32-blocks held as quarters q0..q3 [NB, 8] (elements
    8p .. 8p + 7 of each block in quarter p): stochastic rounding's bits (two quarters are one
    group of 16, one Philox call each, counted at K-major block indices, so every kernel draws
    the same bits for an element), rotation, scale, codes (or bf16 values, QDQ), stores at
    K-major block indices ``blk`` [NB] (``valid`` masks the blocks that exist, unless EVEN).
    ``DEFER`` (4-bit codes, no QDQ, no fold): store nothing, return the blocks' code words
    (w0, w1, w2, w3: [NB] each, quarters 0-3) and scales [NB] for the caller to store.
    ``SR_SIGN_WORDS``: E2M1 codes under stochastic rounding take their signs per word
    (``raw_word``), as under RNE, instead of one shift and merge per element. Timed on one H100
    against the per-element merge in the same runs (``bench_sr_h100.md``): the row kernel with
    H16 0.700 -> 0.722 of copy, without a rotation level (0.71); the column kernel's SR tile
    0.547 -> 0.521 with H16 and 0.527 -> 0.479 without (more registers), so only the row kernel
    sets it. ``ROW`` > 0: the NB blocks are one row of ROW blocks and masked padding, folded
    as one group (``fold_quarters``' ROW)."""
    tl.static_assert(not DEFER or (PACK == 2 and not QDQ and FOLD_GROUP == 0),
                     "DEFER returns the code words of 4-bit codes")
    if ROUNDING == STOCHASTIC:
        b0, b1 = quarter_bits(seed, blk * 2)  # (two quarters: one stochastic-rounding group)
        b2, b3 = quarter_bits(seed, blk * 2 + 1)
    else:
        b0, b1, b2, b3 = 0, 0, 0, 0
    if ROT > 0:
        r0, r1, r2, r3 = rotate_quarters(q0, q1, q2, q3, sign_mask, rot_scale, ROT=ROT,
                                         SIGNS=SIGNS, SCALE=not QUARTER_IN_SCALE)
    else:
        r0, r1, r2, r3 = q0, q1, q2, q3
    amax = block_amax(r0.to(tl.int32, bitcast=True), r1.to(tl.int32, bitcast=True),
                      r2.to(tl.int32, bitcast=True), r3.to(tl.int32, bitcast=True))
    # the elements are divided by 2^(s + OFF)
    OFF: tl.constexpr = 2 if QUARTER_IN_SCALE else 0
    # packed FP4 magnitudes (encode's RAW), the signs added per word: under RNE from the
    # envelope (2^23's bits come off once per word), under stochastic rounding where the
    # caller asks (SR_SIGN_WORDS)
    RAW: tl.constexpr = PACK == 2 and not QDQ and not IS_INT and ENVELOPE and FOLD_GROUP == 0 \
        and (ROUNDING != STOCHASTIC or SR_SIGN_WORDS)
    # (a code word per quarter from 3 float multiply-adds, a 3-way min, an integer multiply-add
    # and a funnel shift per element: 14.5 SASS instructions per element with H16 on sm_90,
    # 18.3 with round_on_grid and the sign merged per element)
    if QUARTER_IN_SCALE:  # r holds the rotation without its 1/4, which goes into the scale
        amax = (amax.to(tl.float32, bitcast=True) * 0.25).to(tl.int32, bitcast=True)
    u0 = r0.to(tl.int32, bitcast=True)
    u1 = r1.to(tl.int32, bitcast=True)
    u2 = r2.to(tl.int32, bitcast=True)
    u3 = r3.to(tl.int32, bitcast=True)
    a0 = u0 & 0x7FFFFFFF
    a1 = u1 & 0x7FFFFFFF
    a2 = u2 & 0x7FFFFFFF
    a3 = u3 & 0x7FFFFFFF
    s, special, scale = block_scale(amax, RULE=RULE, EMAX=EMAX, MBITS=MBITS, RNUM=RNUM,
                                    RSHIFT=RSHIFT)
    sb = s[:, None]
    sp = special[:, None]
    any_special = tl.max(special.to(tl.int32), axis=0) > 0
    if FOLD_GROUP > 0 and ROUNDING != STOCHASTIC:
        # RNE: the fold from the rounded magnitudes, no codes (``fold_values``: the same bits
        # as folding the codes, with about half the instructions)
        tl.static_assert(not IS_INT, "only FP4/FP6 formats fold into E4M3")
        fold_quarters(signed(rounded_magnitudes(a0, sb, sp, OFF, MBITS=MBITS, BIAS=BIAS,
                                                MAXV=MAXV), u0),
                      signed(rounded_magnitudes(a1, sb, sp, OFF, MBITS=MBITS, BIAS=BIAS,
                                                MAXV=MAXV), u1),
                      signed(rounded_magnitudes(a2, sb, sp, OFF, MBITS=MBITS, BIAS=BIAS,
                                                MAXV=MAXV), u2),
                      signed(rounded_magnitudes(a3, sb, sp, OFF, MBITS=MBITS, BIAS=BIAS,
                                                MAXV=MAXV), u3),
                      scale, blk, valid, data_ptr, exp_ptr, pow2_ptr, stats_ptr, total_ptr,
                      n_blocks, n_rows, SIGN=SIGN, BITS=BITS, MBITS=MBITS, BIAS=BIAS,
                      SUBQ=SUBQ, GROUP=FOLD_GROUP, D_MAX=D_MAX,
                      POW2=POW2, HW_CVT=HW_CVT, NB=NB, EVEN=EVEN, FROM_CODES=False,
                      ROW=ROW)
        store_scales(scale_ptr, blk, scale, valid, EVEN=EVEN)
    elif QDQ and ROUNDING != STOCHASTIC:  # RNE values straight from the rounded magnitudes
        ex = BIAS + MBITS <= 7
        store_bf16_pairs(data_ptr, blk, rounded_values(a0, u0 < 0, sb, sp, OFF, MBITS=MBITS,
                                                       BIAS=BIAS, MAXV=MAXV),
                         0, valid, NB=NB, EVEN=EVEN, EXACT=ex)
        store_bf16_pairs(data_ptr, blk, rounded_values(a1, u1 < 0, sb, sp, OFF, MBITS=MBITS,
                                                       BIAS=BIAS, MAXV=MAXV),
                         1, valid, NB=NB, EVEN=EVEN, EXACT=ex)
        store_bf16_pairs(data_ptr, blk, rounded_values(a2, u2 < 0, sb, sp, OFF, MBITS=MBITS,
                                                       BIAS=BIAS, MAXV=MAXV),
                         2, valid, NB=NB, EVEN=EVEN, EXACT=ex)
        store_bf16_pairs(data_ptr, blk, rounded_values(a3, u3 < 0, sb, sp, OFF, MBITS=MBITS,
                                                       BIAS=BIAS, MAXV=MAXV),
                         3, valid, NB=NB, EVEN=EVEN, EXACT=ex)
    elif RAW:  # packed E2M1 magnitudes (RNE's envelope, or stochastic), signs added per word
        w0 = raw_word(a0, u0, sb, sp, any_special, b0, OFF=OFF, ROUNDING=ROUNDING,
                      MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC, SIGN=SIGN,
                      SAT=RULE == FLOOR, NB=NB)
        w1 = raw_word(a1, u1, sb, sp, any_special, b1, OFF=OFF, ROUNDING=ROUNDING,
                      MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC, SIGN=SIGN,
                      SAT=RULE == FLOOR, NB=NB)
        w2 = raw_word(a2, u2, sb, sp, any_special, b2, OFF=OFF, ROUNDING=ROUNDING,
                      MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC, SIGN=SIGN,
                      SAT=RULE == FLOOR, NB=NB)
        w3 = raw_word(a3, u3, sb, sp, any_special, b3, OFF=OFF, ROUNDING=ROUNDING,
                      MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC, SIGN=SIGN,
                      SAT=RULE == FLOOR, NB=NB)
        if not DEFER:
            store_words(data_ptr, blk, w0, w1, w2, w3, valid, NB=NB, EVEN=EVEN)
            store_scales(scale_ptr, blk, scale, valid, EVEN=EVEN)
    else:
        c0 = quarter_codes(a0, u0, sb, sp, any_special, b0, OFF=OFF, RULE=RULE,
                           ROUNDING=ROUNDING, ROT=ROT, IS_INT=IS_INT, ENVELOPE=ENVELOPE,
                           MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC,
                           NEGMAX=NEGMAX, SIGN=SIGN)
        c1 = quarter_codes(a1, u1, sb, sp, any_special, b1, OFF=OFF, RULE=RULE,
                           ROUNDING=ROUNDING, ROT=ROT, IS_INT=IS_INT, ENVELOPE=ENVELOPE,
                           MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC,
                           NEGMAX=NEGMAX, SIGN=SIGN)
        c2 = quarter_codes(a2, u2, sb, sp, any_special, b2, OFF=OFF, RULE=RULE,
                           ROUNDING=ROUNDING, ROT=ROT, IS_INT=IS_INT, ENVELOPE=ENVELOPE,
                           MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC,
                           NEGMAX=NEGMAX, SIGN=SIGN)
        c3 = quarter_codes(a3, u3, sb, sp, any_special, b3, OFF=OFF, RULE=RULE,
                           ROUNDING=ROUNDING, ROT=ROT, IS_INT=IS_INT, ENVELOPE=ENVELOPE,
                           MBITS=MBITS, BIAS=BIAS, MAXC=MAXC, NANC=NANC, INFC=INFC,
                           NEGMAX=NEGMAX, SIGN=SIGN)
        if FOLD_GROUP > 0:  # E4M3 codes of the folded operand (kernels.fold's steps)
            fold_quarters(c0, c1, c2, c3, scale, blk, valid, data_ptr, exp_ptr, pow2_ptr,
                          stats_ptr, total_ptr, n_blocks, n_rows, SIGN=SIGN, BITS=BITS,
                          MBITS=MBITS, BIAS=BIAS, SUBQ=SUBQ, GROUP=FOLD_GROUP, D_MAX=D_MAX,
                          POW2=POW2, HW_CVT=HW_CVT, NB=NB, EVEN=EVEN, FROM_CODES=True,
                          ROW=ROW)
            store_scales(scale_ptr, blk, scale, valid, EVEN=EVEN)
        elif QDQ:
            store_qdq(data_ptr, blk, c0, scale, 0, valid, NB=NB, EVEN=EVEN, BITS=BITS,
                      EBITS=EBITS, MBITS=MBITS, BIAS=BIAS, NANC=NANC, INFC=INFC, SUBQ=SUBQ)
            store_qdq(data_ptr, blk, c1, scale, 1, valid, NB=NB, EVEN=EVEN, BITS=BITS,
                      EBITS=EBITS, MBITS=MBITS, BIAS=BIAS, NANC=NANC, INFC=INFC, SUBQ=SUBQ)
            store_qdq(data_ptr, blk, c2, scale, 2, valid, NB=NB, EVEN=EVEN, BITS=BITS,
                      EBITS=EBITS, MBITS=MBITS, BIAS=BIAS, NANC=NANC, INFC=INFC, SUBQ=SUBQ)
            store_qdq(data_ptr, blk, c3, scale, 3, valid, NB=NB, EVEN=EVEN, BITS=BITS,
                      EBITS=EBITS, MBITS=MBITS, BIAS=BIAS, NANC=NANC, INFC=INFC, SUBQ=SUBQ)
        else:
            if PACK == 2:  # the block's 16 code bytes as four int32 words: one 16-byte store
                w0 = nibbles_to_word(c0)
                w1 = nibbles_to_word(c1)
                w2 = nibbles_to_word(c2)
                w3 = nibbles_to_word(c3)
                if not DEFER:
                    store_words(data_ptr, blk, w0, w1, w2, w3, valid, NB=NB, EVEN=EVEN)
            else:
                store_codes(data_ptr, blk, c0, 0, valid, NB=NB, PACK=PACK, EVEN=EVEN)
                store_codes(data_ptr, blk, c1, 1, valid, NB=NB, PACK=PACK, EVEN=EVEN)
                store_codes(data_ptr, blk, c2, 2, valid, NB=NB, PACK=PACK, EVEN=EVEN)
                store_codes(data_ptr, blk, c3, 3, valid, NB=NB, PACK=PACK, EVEN=EVEN)
            if not DEFER:
                store_scales(scale_ptr, blk, scale, valid, EVEN=EVEN)
    if DEFER:
        return w0, w1, w2, w3, scale


@triton.jit
def load_tile_f32(x_ptr, offs, mask, IN_BF16: tl.constexpr, EVEN: tl.constexpr):
    """A tile of the input as float32 (bf16 given as its int16 bits; float16 converted)."""
    if EVEN:
        x = tl.load(x_ptr + offs)
    else:
        x = tl.load(x_ptr + offs, mask=mask, other=0)
    if IN_BF16:
        return bf16_bits_to_f32(x)
    return x.to(tl.float32)


@triton.jit
def columns_to_quarters(t, BN: tl.constexpr, KB: tl.constexpr):
    """A [32 KB, BN] tile (KB blocks of 32 consecutive elements along the quantized axis, BN
    positions of the other axes) as the row kernel's quarters: four [BN KB, 8], row n KB + j
    holding block j of column n, quarter p its elements 8p .. 8p + 7 (Triton moves the data
    through shared memory)."""
    t = tl.permute(tl.reshape(t, (KB, 4, 8, BN)), (3, 0, 2, 1))  # (n, j, e, p): 32j + 8p + e
    lo, hi = tl.split(tl.reshape(t, (BN * KB, 8, 2, 2)))  # p = 2a + b: b = 0 | 1
    q0, q2 = tl.split(lo)
    q1, q3 = tl.split(hi)
    return q0, q1, q2, q3


@triton.jit
def column_rows(x_ptr, o, kt, k0, cols, K, inner, ROWS: tl.constexpr, KB: tl.constexpr,
                BIG: tl.constexpr, INNER: tl.constexpr, SPLIT: tl.constexpr,
                IN_BF16: tl.constexpr, EVEN: tl.constexpr, COLUMN_MAJOR: tl.constexpr = False):
    """The column kernel's load: rows k0 .. k0 + ROWS - 1 of the program's K tile (from
    element 32 KB kt of batch o on) at its columns ``cols``, as float32 [ROWS, BN]; SPLIT:
    ``cols`` are column pairs, their int32 words [ROWS, BN / 2]. ``INNER``: the row stride
    compiled in, the rows at immediate offsets from one base pointer. ``COLUMN_MAJOR``: the
    tile indexed [column, row] instead."""
    r = tl.arange(0, ROWS)
    k = kt * (32 * KB) + k0 + r
    if INNER and not SPLIT:  # no per-load 64-bit address arithmetic: rows from one base
        if BIG:
            base = x_ptr + (o.to(tl.int64) * K + kt * (32 * KB) + k0) * INNER
        else:
            base = x_ptr + (o * K + kt * (32 * KB) + k0) * INNER
        row0 = r
        stride = INNER
    else:
        if BIG:
            row0 = o.to(tl.int64) * K + k.to(tl.int64)
        else:
            row0 = o * K + k
        base = x_ptr
        stride = inner // 2 if SPLIT else inner
    width = inner // 2 if SPLIT else inner
    if COLUMN_MAJOR:
        offs = row0[None, :] * stride + cols[:, None]
        mask = (cols < width)[:, None] & (k >= 0)[None, :]
    else:
        offs = row0[:, None] * stride + cols[None, :]
        mask = (cols < width)[None, :] & (k >= 0)[:, None]
    if SPLIT:  # words of two columns
        if EVEN:
            out = tl.load(base + offs)
        else:
            out = tl.load(base + offs, mask=mask, other=0)
    else:
        out = load_tile_f32(base, offs, mask, IN_BF16=IN_BF16, EVEN=EVEN)
    return out


@triton.jit
def column_quarter(x_ptr, o, kt, k0, cols, K, inner, KB: tl.constexpr, BIG: tl.constexpr,
                   INNER: tl.constexpr, SPLIT: tl.constexpr, IN_BF16: tl.constexpr,
                   EVEN: tl.constexpr, FORM: tl.constexpr):
    """Rows k0 .. k0 + 7 of the program's K tile at its columns as a quarter [BN, 8] (as
    ``column_rows``), loaded so that Triton's coalescing lays the columns across threads and
    each thread holds its columns' 8 rows: the columns' contiguity is hidden (``HIDE``), so
    both dimensions look equally contiguous and the Triton version's tie-break decides which
    one goes across threads. FORM 1: loaded as [BN, 8] (Triton 3.6 lays the first such
    dimension across threads); FORM 2: loaded as [8, BN] and transposed (later versions lay
    the last); ``launch.quarter_form`` picks. The wrong form costs a layout conversion
    through shared memory and warp shuffles (same bits)."""
    if FORM == 1:
        q = column_rows(x_ptr, o, kt, k0, cols, K, inner, ROWS=8, KB=KB, BIG=BIG, INNER=INNER,
                        SPLIT=SPLIT, IN_BF16=IN_BF16, EVEN=EVEN, COLUMN_MAJOR=True)
    else:
        q = tl.trans(column_rows(x_ptr, o, kt, k0, cols, K, inner, ROWS=8, KB=KB, BIG=BIG,
                                 INNER=INNER, SPLIT=SPLIT, IN_BF16=IN_BF16, EVEN=EVEN))
    return q


@triton.jit
def column_block_quarters(x_ptr, o, kt, k0, cols, K, inner, KB: tl.constexpr,
                          BIG: tl.constexpr, INNER: tl.constexpr, SPLIT: tl.constexpr,
                          IN_BF16: tl.constexpr, EVEN: tl.constexpr, FORM: tl.constexpr):
    """The 32 rows k0 .. k0 + 31 of the program's K tile (one block of each column) as its
    four quarters [BN, 8] (``column_quarter``; rows 8p .. 8p + 7 in quarter p)."""
    q0 = column_quarter(x_ptr, o, kt, k0, cols, K, inner, KB=KB, BIG=BIG, INNER=INNER,
                        SPLIT=SPLIT, IN_BF16=IN_BF16, EVEN=EVEN, FORM=FORM)
    q1 = column_quarter(x_ptr, o, kt, k0 + 8, cols, K, inner, KB=KB, BIG=BIG, INNER=INNER,
                        SPLIT=SPLIT, IN_BF16=IN_BF16, EVEN=EVEN, FORM=FORM)
    q2 = column_quarter(x_ptr, o, kt, k0 + 16, cols, K, inner, KB=KB, BIG=BIG, INNER=INNER,
                        SPLIT=SPLIT, IN_BF16=IN_BF16, EVEN=EVEN, FORM=FORM)
    q3 = column_quarter(x_ptr, o, kt, k0 + 24, cols, K, inner, KB=KB, BIG=BIG, INNER=INNER,
                        SPLIT=SPLIT, IN_BF16=IN_BF16, EVEN=EVEN, FORM=FORM)
    return q0, q1, q2, q3


@triton.jit
def low_or_high(words, first):
    """The bf16 values in the int32 words' low halves (``first`` 0) or high halves, as
    float32."""
    if first == 0:
        v = tl.cast(words << 16, tl.float32, bitcast=True)
    else:
        v = tl.cast(words & -65536, tl.float32, bitcast=True)
    return v


@triton.jit(do_not_specialize=["seed", "sign_mask"])
def quantize_cols32_kernel(x_ptr, data_ptr, scale_ptr, sign_mask, K, inner, seed, rot_scale,
                           # the fold's outputs and the tensor's blocks (FOLD_GROUP > 0; else
                           # unused)
                           exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_blocks, n_rows,
                           # the format
                           IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                           EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                           EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                           INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                           RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                           ENVELOPE: tl.constexpr,
                           # the numerics
                           RULE: tl.constexpr, ROUNDING: tl.constexpr, ROT: tl.constexpr,
                           SIGNS: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                           QDQ: tl.constexpr, QUARTER_IN_SCALE: tl.constexpr,
                           # the fold into E4M3, as in the row kernel
                           FOLD_GROUP: tl.constexpr, D_MAX: tl.constexpr, POW2: tl.constexpr,
                           HW_CVT: tl.constexpr,
                           # the tile, and what the shape implies
                           BN: tl.constexpr, KB: tl.constexpr, HIDE: tl.constexpr,
                           VEC: tl.constexpr, KB_FAST: tl.constexpr, BIG: tl.constexpr,
                           EVEN: tl.constexpr, SPLIT: tl.constexpr = False,
                           INNER: tl.constexpr = 0, SERIAL: tl.constexpr = False,
                           JOINT: tl.constexpr = False, QUARTERS: tl.constexpr = 0):
    """Blocks of 32 along a non-last axis, in one pass: the input seen as (outer, K, inner)
    (quantized along K, the tokens of Wgrad's operands), the output K-major as everywhere
    (row r = o * inner + i, its K/32 blocks in order). A program loads the coalesced tile of
    K-elements 32 KB kt .. 32 KB (kt + 1) - 1 at inner positions BN n .. BN n + BN - 1
    (``KB_FAST``: kt = program_id(0), n = program_id(1), so that programs running together
    write neighbouring parts of the same output rows; else the other way round), turns it into
    the row kernel's quarters (``columns_to_quarters``: KB consecutive blocks of a column are
    neighbouring rows, their codes contiguous) and shares everything else with the row kernel
    (``quantize_quarters``): the same bits, without a transposed copy. K is a multiple of
    32 KB (the launcher picks KB so).

    FOLD_GROUP > 0: the fold into E4M3 as in the row kernel (its docstring; ``n_blocks``: the
    tensor's blocks, rows x K / 32). A program's blocks are, per column, KB consecutive blocks
    of one output row from a multiple of KB on, so with KB a multiple of FOLD_GROUP (the
    launcher picks KB so) they are whole fold groups, each group's blocks in order.

    ``HIDE``: show the compiler only VEC contiguous columns, so that loads are at most VEC
    elements wide and, with BN / VEC >= 32 num_warps, each thread takes VEC adjacent columns'
    elements (no data crosses threads; bf16 at VEC 2: 4-byte loads, a warp reading 128
    contiguous bytes of a row per instruction, against 64 at VEC 1); else loads are vectorized
    along the columns and Triton converts the layout. (The hint only narrows what Triton may
    vectorize; alignment it cannot prove keeps loads narrower, never wrong.)

    ``SPLIT`` (bf16 input, ``x_ptr`` its int32 words, ``inner`` even): each thread loads whole
    4-byte words, a pair of neighbouring columns each, and quantizes the pair's even columns
    (the words' low halves) and then its odd ones (the high halves) as two tiles of BN / 2
    columns, so that only one column's float32 values are live at a time besides the words.

    ``SERIAL``: the program's KB blocks along K one after another, each pass a 32-row load
    (four 8-row loads with ``QUARTERS``) and its stores (one block's values live at a time;
    each column's KB blocks of codes still written by this program, close together in time).
    Not with a fold. ``JOINT`` (``SERIAL``, KB = 2 or 4, 8 with ``QUARTERS``; 4-bit codes;
    with ``SPLIT`` only with ``QUARTERS``): the passes keep their code words and scales and the
    last stores them all, a column's 16 KB code bytes (whole 32-byte sectors) in back-to-back
    16-byte stores, as the two-block tiles write them; with ``QUARTERS`` its KB scale bytes as
    one word (``store_scale_word``).

    ``QUARTERS`` 1 or 2 (one block along K a pass: KB = 1 or ``SERIAL``): each quarter of a
    block (8 of its 32 rows) loaded on its own as the row kernel's quarter [BN, 8]
    (``column_quarter``: QUARTERS is its FORM), instead of one [32, BN] tile reshaped into
    quarters: where each thread holds its columns whole (``HIDE``, BN / VEC >= 32 num_warps)
    no value crosses threads (the reshape went through shared memory and warp shuffles under
    Triton 3.6). ``SERIAL`` passes then run as a loop the compiler keeps (one pass's loads in
    flight; unrolled, the compiler hoisted every pass's loads: 127-255 registers).

    Stochastic rounding counts elements in the K-major layout, so half a block is one group of
    16, as in the row kernel. ``seed`` and ``sign_mask``: integers or pointers
    (``common.load_key``)."""
    if ROUNDING == STOCHASTIC:
        seed = load_key(seed)
    if SIGNS:
        sign_mask = load_key(sign_mask)
    tl.static_assert(not (SERIAL and FOLD_GROUP > 0), "a fold quantizes its groups at once")
    tl.static_assert(FOLD_GROUP == 0 or KB % FOLD_GROUP == 0,
                     "a program's blocks along K are whole fold groups")
    if KB_FAST:
        kt = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:
        pid_n = tl.program_id(0)
        kt = tl.program_id(1)
    o = tl.program_id(2)
    # SERIAL: the program's KB blocks along K one after another, KP = 1 block per pass
    NS: tl.constexpr = KB if SERIAL else 1
    KP: tl.constexpr = 1 if SERIAL else KB
    tl.static_assert(not JOINT or (SERIAL and (KB == 2 or KB == 4 or (KB == 8 and QUARTERS))
                                   and PACK == 2 and not QDQ
                                   and FOLD_GROUP == 0 and (QUARTERS > 0 or not SPLIT)),
                     "JOINT: 2 or 4 serial passes of 4-bit codes (8 with QUARTERS; SPLIT "
                     "only with QUARTERS)")
    if SPLIT:
        tl.static_assert(IN_BF16, "SPLIT loads bf16 pairs as int32 words")
        PARTS: tl.constexpr = 2
        w = pid_n * (BN // 2) + tl.arange(0, BN // 2)
        if HIDE:
            w = tl.max_contiguous(w, 1)
    else:
        PARTS: tl.constexpr = 1
        if HIDE:
            n = tl.max_contiguous(pid_n * BN + tl.arange(0, BN), VEC)
        else:
            n = pid_n * BN + tl.arange(0, BN)
    cols = w if SPLIT else n
    # JOINT: every pass's code words and scales kept, stored together at the end
    if SERIAL and QUARTERS:  # a loop the compiler keeps: one pass's loads in flight at a time
        if JOINT:  # quarter p's words of block j at [n, j] of jq<p>, the scales in js (a
            # [BN, KB, 4] tile carried through the loop got a layout across threads: a
            # shared-memory layout conversion every pass); SPLIT: jq<p> and js the even
            # columns', jo<p> and jso the odd ones'
            jq0 = tl.zeros([BN // PARTS, KB], tl.int32)
            jq1 = tl.zeros([BN // PARTS, KB], tl.int32)
            jq2 = tl.zeros([BN // PARTS, KB], tl.int32)
            jq3 = tl.zeros([BN // PARTS, KB], tl.int32)
            js = tl.zeros([BN // PARTS, KB], tl.int32)
            if PARTS == 2:  # SPLIT: the odd columns' too
                jo0 = tl.zeros([BN // 2, KB], tl.int32)
                jo1 = tl.zeros([BN // 2, KB], tl.int32)
                jo2 = tl.zeros([BN // 2, KB], tl.int32)
                jo3 = tl.zeros([BN // 2, KB], tl.int32)
                jso = tl.zeros([BN // 2, KB], tl.int32)
        for ps in tl.range(0, NS, num_stages=1):
            even, odd = cols32_pass(
                x_ptr, data_ptr, scale_ptr, sign_mask, K, inner, seed, rot_scale, exp_ptr,
                pow2_ptr, stats_ptr, total_ptr, n_blocks, n_rows, cols, pid_n, kt, o, ps,
                IS_INT=IS_INT, BITS=BITS, SIGN=SIGN, EBITS=EBITS, MBITS=MBITS, BIAS=BIAS,
                EMAX=EMAX, MAXC=MAXC, NANC=NANC, INFC=INFC, NEGMAX=NEGMAX, RNUM=RNUM,
                RSHIFT=RSHIFT, SUBQ=SUBQ, MAXV=MAXV, ENVELOPE=ENVELOPE, RULE=RULE,
                ROUNDING=ROUNDING, ROT=ROT, SIGNS=SIGNS, PACK=PACK, IN_BF16=IN_BF16, QDQ=QDQ,
                QUARTER_IN_SCALE=QUARTER_IN_SCALE, FOLD_GROUP=FOLD_GROUP, D_MAX=D_MAX,
                POW2=POW2, HW_CVT=HW_CVT, BN=BN, KB=KB, BIG=BIG, EVEN=EVEN, SPLIT=SPLIT,
                INNER=INNER, NS=NS, KP=KP, PARTS=PARTS, JOINT=JOINT, QUARTERS=QUARTERS)
            if JOINT:  # pass ps's words and scales into place
                at = (tl.arange(0, KB) == ps)[None, :]
                jq0, jq1, jq2, jq3, js = joint_put(at, even, jq0, jq1, jq2, jq3, js)
                if PARTS == 2:
                    jo0, jo1, jo2, jo3, jso = joint_put(at, odd, jo0, jo1, jo2, jo3, jso)
        if JOINT:
            jw = joint_words(jq0, jq1, jq2, jq3)
            if PARTS == 2:  # the even and odd columns interleaved: column order
                jw = side_by_side_rows(jw, joint_words(jo0, jo1, jo2, jo3))
                js = side_by_side_rows(js, jso)
    else:
        for ps in tl.static_range(NS):
            out, _ = cols32_pass(
                x_ptr, data_ptr, scale_ptr, sign_mask, K, inner, seed, rot_scale, exp_ptr,
                pow2_ptr, stats_ptr, total_ptr, n_blocks, n_rows, cols, pid_n, kt, o, ps,
                IS_INT=IS_INT, BITS=BITS, SIGN=SIGN, EBITS=EBITS, MBITS=MBITS, BIAS=BIAS,
                EMAX=EMAX, MAXC=MAXC, NANC=NANC, INFC=INFC, NEGMAX=NEGMAX, RNUM=RNUM,
                RSHIFT=RSHIFT, SUBQ=SUBQ, MAXV=MAXV, ENVELOPE=ENVELOPE, RULE=RULE,
                ROUNDING=ROUNDING, ROT=ROT, SIGNS=SIGNS, PACK=PACK, IN_BF16=IN_BF16, QDQ=QDQ,
                QUARTER_IN_SCALE=QUARTER_IN_SCALE, FOLD_GROUP=FOLD_GROUP, D_MAX=D_MAX,
                POW2=POW2, HW_CVT=HW_CVT, BN=BN, KB=KB, BIG=BIG, EVEN=EVEN, SPLIT=SPLIT,
                INNER=INNER, NS=NS, KP=KP, PARTS=PARTS, JOINT=JOINT, QUARTERS=QUARTERS)
            if JOINT:
                w0, w1, w2, w3, scale = out
                words = block_words(w0, w1, w2, w3, NB=BN)
                if ps == 0:
                    words0, scale0 = words, scale
                elif ps == 1:
                    words1, scale1 = words, scale
                elif ps == 2:
                    words2, scale2 = words, scale
                else:
                    words3, scale3 = words, scale
        if JOINT:
            jw = side_by_side(words0, words1)
            js = tl.join(scale0, scale1)
            if KB == 4:
                jw = side_by_side(jw, side_by_side(words2, words3))
                js = side_by_side(js, tl.join(scale2, scale3))
    if JOINT:  # each column's KB blocks: 4 KB code words and KB scale bytes, stored together
        blk0, valid0 = column_blocks(pid_n, kt * NS, o, K, inner, 0, BN=BN, KB=1, STEP=1,
                                     BIG=BIG)
        woff = blk0[:, None] * 4 + tl.arange(0, 4 * KB)[None, :]
        store_blocks(data_ptr.to(tl.pointer_type(tl.int32)), woff, jw, valid0, EVEN=EVEN)
        if SERIAL and QUARTERS:  # a column's KB scale bytes as one 2-, 4- or 8-byte word
            store_scale_word(scale_ptr, blk0, js, valid0, KB=KB, EVEN=EVEN)
        else:
            soff = blk0[:, None] + tl.arange(0, KB)[None, :]
            store_blocks(scale_ptr, soff, js.to(tl.uint8), valid0, EVEN=EVEN)


@triton.jit
def store_scale_word(scale_ptr, blk0, js, valid, KB: tl.constexpr, EVEN: tl.constexpr):
    """The scale bytes [BN, KB] of KB consecutive blocks per column (from block ``blk0`` on,
    a multiple of KB: K / 32 is one) as one little-endian word of KB bytes per column: one
    store instead of KB (the scales are the launcher's own allocation, so the word is
    aligned)."""
    tl.static_assert(KB == 2 or KB == 4 or KB == 8, "a scale word holds 2, 4 or 8 bytes")
    sh = (8 * tl.arange(0, KB)).to(tl.int64)
    word = tl.sum(js.to(tl.int64) << sh[None, :], axis=1)  # the bytes do not overlap: an OR
    if KB == 2:
        ptr = scale_ptr.to(tl.pointer_type(tl.int16)) + blk0 // 2
        word = word.to(tl.int16)
    elif KB == 4:
        ptr = scale_ptr.to(tl.pointer_type(tl.int32)) + blk0 // 4
        word = word.to(tl.int32)
    else:
        ptr = scale_ptr.to(tl.pointer_type(tl.int64)) + blk0 // 8
    if EVEN:
        tl.store(ptr, word)
    else:
        tl.store(ptr, word, mask=valid)


@triton.jit
def joint_put(at, out, jq0, jq1, jq2, jq3, js):
    """A joint serial pass's code words of quarters 0-3 and scales (``out``: what
    ``cols32_part`` returns, [R] each) into column ``at`` ([1, KB] mask) of the carried
    [R, KB] tiles."""
    w0, w1, w2, w3, scale = out
    return (tl.where(at, w0[:, None], jq0), tl.where(at, w1[:, None], jq1),
            tl.where(at, w2[:, None], jq2), tl.where(at, w3[:, None], jq3),
            tl.where(at, scale[:, None], js))


@triton.jit
def joint_words(jq0, jq1, jq2, jq3):
    """The carried [R, KB] words of quarters 0-3 as [R, 4 KB]: block j's four at 4 j ..
    4 j + 3, a column's 16 KB code bytes in order."""
    R: tl.constexpr = jq0.shape[0]
    KB: tl.constexpr = jq0.shape[1]
    return tl.reshape(tl.permute(tl.join(tl.join(jq0, jq1), tl.join(jq2, jq3)), (0, 1, 3, 2)),
                      (R, 4 * KB))


@triton.jit
def side_by_side_rows(a, b):
    """[R, C] and [R, C] as [2 R, C]: row i of ``a`` at 2 i, of ``b`` at 2 i + 1."""
    R: tl.constexpr = a.shape[0]
    C: tl.constexpr = a.shape[1]
    return tl.reshape(side_by_side(a, b), (2 * R, C))


@triton.jit
def side_by_side(a, b):
    """[R, C] and [R, C] as [R, 2 C]: each row of ``a``, then the same row of ``b``."""
    R: tl.constexpr = a.shape[0]
    C: tl.constexpr = a.shape[1]
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (R, 2 * C))


@triton.jit
def cols32_pass(x_ptr, data_ptr, scale_ptr, sign_mask, K, inner, seed, rot_scale, exp_ptr,
                pow2_ptr, stats_ptr, total_ptr, n_blocks, n_rows, cols, pid_n, kt, o, ps,
                IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                ENVELOPE: tl.constexpr, RULE: tl.constexpr, ROUNDING: tl.constexpr,
                ROT: tl.constexpr, SIGNS: tl.constexpr, PACK: tl.constexpr,
                IN_BF16: tl.constexpr, QDQ: tl.constexpr, QUARTER_IN_SCALE: tl.constexpr,
                FOLD_GROUP: tl.constexpr, D_MAX: tl.constexpr, POW2: tl.constexpr,
                HW_CVT: tl.constexpr, BN: tl.constexpr, KB: tl.constexpr, BIG: tl.constexpr,
                EVEN: tl.constexpr, SPLIT: tl.constexpr, INNER: tl.constexpr,
                NS: tl.constexpr, KP: tl.constexpr, PARTS: tl.constexpr, JOINT: tl.constexpr,
                QUARTERS: tl.constexpr):
    """Pass ``ps`` of the column kernel (its docstring): load, quantize and store KP blocks
    along K of the program's columns ``cols``; ``JOINT``: store nothing, return what
    ``cols32_part`` returns for the pass's columns (SPLIT: the even ones', then the odd
    ones'; else the same twice), or (0, 0)."""
    if QUARTERS:  # the pass's block as four quarters, each loaded as [BN, 8]
        tl.static_assert(KP == 1, "QUARTERS: one block along K a pass")
        l0, l1, l2, l3 = column_block_quarters(x_ptr, o, kt, ps * 32, cols, K, inner, KB=KB,
                                               BIG=BIG, INNER=INNER, SPLIT=SPLIT,
                                               IN_BF16=IN_BF16, EVEN=EVEN, FORM=QUARTERS)
    else:  # the pass's rows as one [32 KP, BN] tile (SPLIT: its words)
        tile = column_rows(x_ptr, o, kt, ps * 32, cols, K, inner, ROWS=32 * KP, KB=KB,
                           BIG=BIG, INNER=INNER, SPLIT=SPLIT, IN_BF16=IN_BF16, EVEN=EVEN)
    for first in tl.static_range(PARTS):  # split: the words' low halves, then the high
        if QUARTERS:
            if not SPLIT:
                q0, q1, q2, q3 = l0, l1, l2, l3
            else:
                q0 = low_or_high(l0, first)
                q1 = low_or_high(l1, first)
                q2 = low_or_high(l2, first)
                q3 = low_or_high(l3, first)
        else:
            if SPLIT:
                t = low_or_high(tile, first)
            else:
                t = tile
            q0, q1, q2, q3 = columns_to_quarters(t, BN=BN // PARTS, KB=KP)
        # the pass's blocks are blocks kt KB + ps .. of their columns: as a program of KP
        # blocks at position kt NS + ps
        out = cols32_part(q0, q1, q2, q3, first, pid_n, kt * NS + ps, o, data_ptr,
                          scale_ptr, sign_mask, K, inner, seed, rot_scale, exp_ptr, pow2_ptr,
                          stats_ptr, total_ptr, n_blocks, n_rows, IS_INT=IS_INT, BITS=BITS,
                          SIGN=SIGN, EBITS=EBITS, MBITS=MBITS, BIAS=BIAS, EMAX=EMAX,
                          MAXC=MAXC, NANC=NANC, INFC=INFC, NEGMAX=NEGMAX, RNUM=RNUM,
                          RSHIFT=RSHIFT, SUBQ=SUBQ, MAXV=MAXV, ENVELOPE=ENVELOPE, RULE=RULE,
                          ROUNDING=ROUNDING, ROT=ROT, SIGNS=SIGNS, PACK=PACK, QDQ=QDQ,
                          QUARTER_IN_SCALE=QUARTER_IN_SCALE, FOLD_GROUP=FOLD_GROUP,
                          D_MAX=D_MAX, POW2=POW2, HW_CVT=HW_CVT, BN=BN // PARTS, KB=KP,
                          STEP=PARTS, BIG=BIG, EVEN=EVEN, DEFER=JOINT)
        if first == 0:
            out0 = out
    if JOINT:  # (KP = 1: the pass's one block of each column; SPLIT: out0 the even columns')
        return out0, out
    else:
        return 0, 0


@triton.jit
def column_blocks(pid_n, kt, o, K, inner, first, BN: tl.constexpr, KB: tl.constexpr,
                  STEP: tl.constexpr, BIG: tl.constexpr):
    """K-major block indices [BN KB] of a column-kernel program's blocks and whether each
    exists: block b is block kt KB + b % KB of column (pid_n BN + b // KB) STEP + first."""
    b = tl.arange(0, BN * KB)
    col = (pid_n * BN + b // KB) * STEP + first
    if BIG:
        blk = (o.to(tl.int64) * inner + col) * (K // 32) + kt * KB + b % KB
    else:
        blk = (o * inner + col) * (K // 32) + kt * KB + b % KB
    return blk, col < inner


@triton.jit
def cols32_part(q0, q1, q2, q3, first, pid_n, kt, o, data_ptr, scale_ptr, sign_mask, K, inner,
                seed, rot_scale, exp_ptr, pow2_ptr, stats_ptr, total_ptr, n_blocks, n_rows,
                IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                ENVELOPE: tl.constexpr, RULE: tl.constexpr, ROUNDING: tl.constexpr,
                ROT: tl.constexpr, SIGNS: tl.constexpr, PACK: tl.constexpr, QDQ: tl.constexpr,
                QUARTER_IN_SCALE: tl.constexpr, FOLD_GROUP: tl.constexpr,
                D_MAX: tl.constexpr, POW2: tl.constexpr, HW_CVT: tl.constexpr,
                BN: tl.constexpr, KB: tl.constexpr, STEP: tl.constexpr, BIG: tl.constexpr,
                EVEN: tl.constexpr, DEFER: tl.constexpr = False):
    """The column kernel after its load: the float32 quarters [BN KB, 8]
    (``columns_to_quarters``) of the program's columns ``first``, ``first`` + STEP, ... (of
    the BN STEP columns from pid_n BN STEP on), quantized into the K-major output as the row
    kernel's. ``DEFER`` (KB = 1): nothing stored; returns the code words of quarters 0-3 and
    the scales, each [BN] (``quantize_quarters``'s DEFER)."""
    blk, valid = column_blocks(pid_n, kt, o, K, inner, first, BN=BN, KB=KB, STEP=STEP, BIG=BIG)
    out = quantize_quarters(q0, q1, q2, q3, seed, blk, valid, data_ptr, scale_ptr,
                            sign_mask, rot_scale, IS_INT=IS_INT, BITS=BITS, SIGN=SIGN,
                            EBITS=EBITS, MBITS=MBITS, BIAS=BIAS, EMAX=EMAX, MAXC=MAXC,
                            NANC=NANC, INFC=INFC, NEGMAX=NEGMAX, RNUM=RNUM, RSHIFT=RSHIFT,
                            SUBQ=SUBQ, MAXV=MAXV, ENVELOPE=ENVELOPE, RULE=RULE,
                            ROUNDING=ROUNDING, ROT=ROT, SIGNS=SIGNS, PACK=PACK, QDQ=QDQ,
                            QUARTER_IN_SCALE=QUARTER_IN_SCALE, NB=BN * KB, EVEN=EVEN,
                            exp_ptr=exp_ptr, pow2_ptr=pow2_ptr, stats_ptr=stats_ptr,
                            total_ptr=total_ptr, n_blocks=n_blocks, n_rows=n_rows,
                            FOLD_GROUP=FOLD_GROUP, D_MAX=D_MAX, POW2=POW2, HW_CVT=HW_CVT,
                            DEFER=DEFER)
    if DEFER:
        return out
