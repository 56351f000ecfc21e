"""Triton kernels: fused block-rotate + MX quantize, dequantize, and the MX GEMM.

The quantize kernel is a transcription of the emulator's integer algorithm
(``ocpmx.emulator.kernels``): the scale exponent and every element code are computed from the
float32 bits with integer arithmetic, so the kernel is bit-exact to the golden model by
construction, and the tests check that it is. Floating-point arithmetic appears in two places:
the rotation, whose order of operations (signs, butterfly stages h = 1, 2, ..., one multiply by
float32(1/sqrt(n))) is the emulator's, each step a single IEEE float32 add or multiply (for
H16 on bf16 or float16 input the multiply by 1/4 is exact and goes into the block scale
instead: FOLD in ``quantize_rows32_kernel``); and the RNE path's scaling and rounding by the
float32 adder (``round_on_grid``; for formats with two exponent bits, E2M1 and E2M3, three
such roundings whose minimum is the code: ``envelope_code``), where an FMA contraction
changes nothing either.

Layout of the quantized output ("K-major"): the quantized axis is the last one; FP4 codes are
packed two per byte along it, element 0 in the low nibble, other formats one code per byte;
scales are uint8 E8M0 codes, one per block, rows = every position of the other axes. This is the
layout ``tl.dot_scaled`` takes for an operand packed along its contraction dimension.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bf16_bits_to_f32(v):
    """bf16 bits (int16) -> float32, exactly (subnormals included; the Triton 3.9 interpreter's
    own bf16 -> fp32 cast mishandles bf16 subnormals)."""
    return (v.to(tl.int32) << 16).to(tl.float32, bitcast=True)


@triton.jit
def f32_to_bf16_bits(x):
    """float32 -> bf16 bits (int16), round to nearest even, NaN kept quiet. Done on the bits so
    that the GPU and the interpreter (whose bf16 cast truncates) give the same result."""
    u = x.to(tl.int32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    r = tl.where((u & 0x7FFFFFFF) > 0x7F800000, (u >> 16) | 0x40, r)
    return r.to(tl.int16)


@triton.jit
def block_scale(amax, RULE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                RNUM: tl.constexpr, RSHIFT: tl.constexpr):
    """Shared exponent s from the amax bits, exactly (emulator: scale_exponent); returns
    (s, special, scale code): special marks a block holding NaN or Inf (scale 0xFF)."""
    a_ef = amax >> 23
    a_mf = amax & 0x7FFFFF
    a_sub = (a_mf.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127  # floor(log2 mf)
    a_lg = tl.where(a_ef > 0, a_ef - 127, a_sub - 149)
    a_frac = tl.where(a_ef > 0, a_mf,
                      (a_mf << tl.where(a_mf > 0, 23 - a_sub, 0)) & 0x7FFFFF)
    s = a_lg - EMAX
    if RULE == 1:  # ceil
        s += (a_frac != 0).to(tl.int32)
    elif RULE == 2:  # rceil: mantissa of amax above the mantissa of max
        s += (((a_frac.to(tl.int64) + (1 << 23)) << RSHIFT) > (RNUM << 23)).to(tl.int32)
    elif RULE == 3:  # even: amax mantissa rounded to the element's bits, ties up
        s += (a_frac + (1 << (22 - MBITS)) >= (1 << 23)).to(tl.int32)
    s = tl.minimum(tl.maximum(s, -127), 127)
    s = tl.where(amax == 0, -127, s)
    special = a_ef == 255
    return s, special, tl.where(special, 255, s + 127)


@triton.jit
def round_on_grid(ab, sb, special, MBITS: tl.constexpr, BIAS: tl.constexpr,
                  CAST: tl.constexpr):
    """RNE of y = |v| / 2^s (``ab``: |v|'s float32 bits) on the element grid by the float32
    adder: (f, magic bits, z = y + magic). f is y's exponent field clamped below at the
    element-subnormal binade (E = 1 - BIAS), so that z's low bits hold
    round(y / 2^(E - MBITS)), ties to even, with magic = 2^(E - MBITS + 23). Under a block
    scale y < 2^(emax + 1), so magic is finite; an element cast (CAST: scale 2^0) can bring a
    huge y, for which f is also clamped above at 231: it lands far above the largest code and
    saturates. (In a NaN/Inf block y is 0 or NaN; the NaN/Inf elements' codes are replaced
    afterwards, so what the arithmetic gives them does not matter.)

    y = |v| / 2^s is exact wherever it can round to a nonzero value (2^-s is a normal float32:
    s <= 126 for every float format); an FMA with the add changes nothing. In a NaN/Inf block
    2^-s is replaced by 0, so finite elements become zeros of their sign on their own."""
    inv = tl.where(special, 0, (127 - sb) << 23).to(tl.float32, bitcast=True)
    y = ab.to(tl.float32, bitcast=True) * inv
    f = tl.maximum(y.to(tl.int32, bitcast=True) >> 23, 128 - BIAS)
    if CAST:
        f = tl.minimum(f, 231)
    magic = (f + (23 - MBITS)) << 23
    return f, magic, y + magic.to(tl.float32, bitcast=True)


@triton.jit
def envelope_code(ab, sb, special, MBITS: tl.constexpr, MAXC: tl.constexpr, OFF: tl.constexpr,
                  SAT: tl.constexpr):
    """RNE magnitude codes of y = |v| / 2^(s + OFF) for a float format with two exponent bits
    (E2M1, E2M3: bias 1, binades [0, 2), [2, 4), [4, 8) with quanta q_j = 2^(j - MBITS)),
    plus 2^23's float32 bits (0x4B000000): the caller masks them off or subtracts them once
    per packed word.

    The code as a function of the real y, before rounding, is piecewise linear: y / q_j +
    j 2^MBITS on binade j (the subnormals share binade 0's quantum). It is continuous and its
    slope halves at each binade, so it is concave: the minimum of its three lines. RNE is
    monotone, so it commutes with that minimum, and so does adding an even integer:
    code = min_j (rne(y / q_j) + j 2^MBITS). Each term is one float32 add to 2^23 + j 2^MBITS
    (the adder rounds at 1 there), so the three results' bits, read as integers, hold the
    terms: one three-way integer min gives the code. No per-element exponent or magic number
    (``round_on_grid`` needs 5 integer instructions per element, this 1).

    Saturation at MAXC (SAT) is needed only where y can reach the top code's rounding
    boundary: the floor scale rule and element casts. ceil, rceil and even choose s so that
    the block's largest y rounds to at most the largest normal.

    Exactness: y / q_j is exact wherever it can round to a nonzero value (as in
    ``round_on_grid``; an FMA contraction changes nothing). When OFF >= MBITS the factors
    2^(MBITS - j - s - OFF) are finite float32 numbers (s >= -127), one per block, and each
    term is a single multiply-add of |v|; otherwise y is formed first (y < 2^3: no overflow).
    In a NaN/Inf block 2^-s is replaced by 0."""
    inv = tl.where(special, 0, (127 - OFF - sb) << 23).to(tl.float32, bitcast=True)
    x = ab.to(tl.float32, bitcast=True)
    if OFF >= MBITS:  # one factor per block and term
        k0 = inv * (1 << MBITS)
        k1 = inv * ((1 << MBITS) * 0.5)
        k2 = inv * ((1 << MBITS) * 0.25)
    else:
        x = x * inv
        k0: tl.constexpr = (1 << MBITS) * 1.0
        k1: tl.constexpr = (1 << MBITS) * 0.5
        k2: tl.constexpr = (1 << MBITS) * 0.25
    a0 = (x * k0 + 8388608.0).to(tl.int32, bitcast=True)
    a1 = (x * k1 + (8388608.0 + (1 << MBITS))).to(tl.int32, bitcast=True)
    a2 = (x * k2 + (8388608.0 + (2 << MBITS))).to(tl.int32, bitcast=True)
    m = tl.minimum(tl.minimum(a0, a1), a2)
    if SAT:
        m = tl.minimum(m, 0x4B000000 + MAXC)
    return m


@triton.jit
def encode(ab, neg, sb, special, any_special, flat, seed, OFF: tl.constexpr, STOCH: tl.constexpr,
           IS_INT: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
           MAXC: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr, NEGMAX: tl.constexpr,
           SIGN: tl.constexpr, CAST: tl.constexpr = False, NAN_POS: tl.constexpr = False,
           SAT: tl.constexpr = True, RAW: tl.constexpr = False):
    """Element codes (int32) of float32 magnitude bits ``ab`` with signs ``neg`` under the
    shared exponent ``sb`` (broadcastable to ab's shape); ``flat`` holds the elements' flat
    indices (the stochastic-rounding counters); CAST: element casts (scale 2^0, no block).
    ``OFF``: the RNE float path divides |v| by 2^(s + OFF) (FOLD in
    ``quantize_rows32_kernel``); the others need OFF = 0. NAN_POS: NaN gets the positive NaN
    code (after a rotation, whose NaN is +qNaN: ``ocpmx.emulator.rotation``). SAT = False: the
    scale rule keeps every code at most MAXC (not floor; see ``envelope_code``). RAW (E2M1,
    RNE; ``raw_word``): magnitude codes without the sign, plus 0x4B000000; a NaN's code is
    0x4B000000 minus its sign bit's code, so that adding the signs later gives it code 0."""
    if IS_INT or STOCH:  # exact integer path (emulator: encode)
        ef = ab >> 23
        mf = ab & 0x7FFFFF
        sub = (mf.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127
        lg = tl.where(ef > 0, ef - 127, sub - 149)  # floor(log2 |v|)
        m = tl.where(ef > 0, mf | 0x800000, mf).to(tl.int64)
        e = tl.where(ef > 0, ef - 150, -149)  # |v| = m * 2^e
        if IS_INT:
            ee = tl.zeros_like(lg)
            qe = tl.zeros_like(lg) - MBITS
        else:
            ee = tl.maximum(lg - sb, 1 - BIAS)
            qe = ee - MBITS
        # shift >= 1 for every finite element of a finite block (the scale puts |v| / 2^s
        # below 2^(emax + 1)); capped at 63 so every shift amount below stays defined.
        sh = tl.minimum(tl.maximum(qe + sb - e, 1), 63).to(tl.int64)
        n = m >> sh
        rem = m - (n << sh)
        if STOCH:
            flat_u = flat.to(tl.uint64)
            lo = (flat_u & 0xFFFFFFFF).to(tl.uint32)
            hi = (flat_u >> 32).to(tl.uint32)
            zero = lo * 0
            rb, _, _, _ = tl.philox(seed, lo, hi, zero, zero)
            rb = rb.to(tl.int64) & 0xFFFFFFFF
            frac32 = tl.where(sh <= 32, rem << tl.maximum(32 - sh, 0),
                              rem >> tl.maximum(sh - 32, 0))
            up = rb < frac32
        else:
            half = (rem * 0 + 1) << (sh - 1)
            up = (rem > half) | ((rem == half) & ((n & 1) == 1))
        n = n + up.to(tl.int64)
        if IS_INT:
            n = tl.minimum(n, tl.where(neg, NEGMAX, MAXC))
            code = tl.where(neg, (-n) & 0xFF, n).to(tl.int32)
            sign = tl.zeros_like(code)
        else:
            sign = tl.where(neg, SIGN, 0)
            mag = tl.minimum(((ee + BIAS - 1) << MBITS).to(tl.int64) + n, MAXC).to(tl.int32)
            code = sign | mag
    elif BIAS == 1:  # two exponent bits (E2M1, E2M3), RNE: the code is a concave envelope
        m = envelope_code(ab, sb, special, MBITS, MAXC, OFF, SAT or CAST)
        sign = tl.where(neg, SIGN, 0)
        if RAW:  # no sign: the caller puts the signs in per word (``sign_nibbles``)
            code = m
        else:
            code = sign | (m & (SIGN - 1))
    else:  # float formats, RNE: the emulator's fast path (quantize_rows_f32_rne), same bits
        # (only NaN and Inf elements need the fix-up below)
        f, magic, z = round_on_grid(ab, sb + OFF, special, MBITS, BIAS, CAST)
        # the code: the count of quanta in z's low bits plus the codes below the binade (a
        # carry into the next binade lands on its first code)
        mag = z.to(tl.int32, bitcast=True) - magic + ((f - (128 - BIAS)) << MBITS)
        sign = tl.where(neg, SIGN, 0)
        code = sign | tl.minimum(mag, MAXC)
    # NaN and Inf keep their encoding (they occur only in blocks whose scale is NaN)
    if RAW:  # no NaN code (0, no sign: its sign bit, added later, is taken off here), Inf
        # saturates (its sign added later)
        tl.static_assert(NANC < 0 and INFC < 0, "RAW codes are for formats without NaN or Inf codes")
        nan_code = 0x4B000000 - sign
        inf_code = tl.zeros_like(code) + (0x4B000000 + MAXC)
    else:
        if NANC >= 0 and NAN_POS:
            nan_code = tl.zeros_like(code) + NANC
        elif NANC >= 0:
            nan_code = sign | NANC
        else:
            nan_code = tl.zeros_like(code)
        if IS_INT:
            inf_code = tl.where(neg, (-NEGMAX) & 0xFF, MAXC)
        elif INFC >= 0:
            inf_code = sign | INFC
        else:
            inf_code = sign | MAXC
    if IS_INT or STOCH:
        # zeros, and finite values in a NaN/Inf block, become zeros of their sign (the fast
        # path gets both from 2^-s = 0 in such blocks)
        code = tl.where((ab == 0) | special, sign, code)
    # not from the arithmetic above: the bits of Inf * 0 differ between x86 and GPUs. Only
    # blocks whose scale is NaN hold NaN or Inf, so the selects run only where one exists.
    if any_special:  # tested on the float |v| (a compare with |.| needs no abs instruction)
        mag_f = ab.to(tl.float32, bitcast=True)
        code = tl.where(mag_f == float("inf"), inf_code, tl.where(mag_f != mag_f, nan_code, code))
    return code


@triton.jit
def rotation_signs(sign_mask, pos):
    """+-1.0 for positions ``pos`` inside a rotation group: bit ``pos`` of ``sign_mask`` (the
    host packs the emulator's ``Rotation.signs``, one bit per position, into this integer
    argument), so a random-sign rotation sends no tensor to the device: a host-to-device copy
    per call made every training step wait under GPU sharing."""
    return tl.where(((sign_mask >> pos) & 1) == 1, -1.0, 1.0)


@triton.jit
def quantize_kernel(x_ptr, data_ptr, scale_ptr, sign_mask, n_rows, K, inner, seed, rot_scale,
                    BS: tl.constexpr, ROWS: tl.constexpr, KB: tl.constexpr, ROT: tl.constexpr,
                    LOG2_ROT: tl.constexpr, STOCH: tl.constexpr, RULE: tl.constexpr, IS_INT: tl.constexpr,
                    MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                    MAXC: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr,
                    NEGMAX: tl.constexpr, RNUM: tl.constexpr, RSHIFT: tl.constexpr,
                    SIGN: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                    INNER1: tl.constexpr, BIG: tl.constexpr,
                    EVEN: tl.constexpr, SIGNS: tl.constexpr, CAST: tl.constexpr = False):
    """Quantize ROWS rows x KB blocks of BS elements of x (CAST: convert each element with
    scale 2^0 instead; no scales are stored).

    Row r of the K-major view is (o, i) = (r // inner, r % inner) of the input seen as
    (outer, K, inner); element (r, c) sits at flat index o*K*inner + c*inner + i, which is also
    its stochastic-rounding counter (the emulator's).
    """
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
        for st in tl.static_range(LOG2_ROT):  # stages h = 2^st = 1, 2, ..., ROT / 2
            t = tl.reshape(g, (ROWS * KB * (BS // ROT), ROT >> (st + 1), 2, 1 << st))
            a, b = tl.split(tl.permute(t, (0, 1, 3, 2)))
            t = tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2))
            g = tl.reshape(t, (ROWS * KB * (BS // ROT), ROT))
        g = g * rot_scale
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
        s, special, scale = block_scale(tl.max(ab, axis=1), RULE, EMAX, MBITS, RNUM, RSHIFT)
        any_special = tl.max(special.to(tl.int32), axis=0) > 0
    code = encode(ab, neg, s[:, None], special[:, None], any_special,
                  tl.reshape(flat, (ROWS * KB, BS)), seed, 0,
                  STOCH,
                  IS_INT, MBITS, BIAS, MAXC, NANC, INFC, NEGMAX, SIGN, CAST, ROT > 0)

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


@triton.jit
def fwht8(g, N: tl.constexpr):
    """Butterfly stages h = 1, 2, 4 on each row of g [N, 8] (in registers: each thread holds
    whole rows of 8 after a 16-byte load)."""
    for st in tl.static_range(3):
        t = tl.reshape(g, (N, 4 >> st, 2, 1 << st))
        a, b = tl.split(tl.permute(t, (0, 1, 3, 2)))
        g = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (N, 8))
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
def rounded_values(ab, neg, sb, special, off, MBITS: tl.constexpr, BIAS: tl.constexpr,
                   MAXV: tl.constexpr):
    """float32 values of the RNE-quantized elements, ``decode(encode(.)) * 2^s`` without the
    codes: the rounding ``encode`` uses (``round_on_grid``), then saturation at the largest
    normal, 2^s (exact: at most MBITS + 1 significant bits), the sign as a bit, NaN for a
    NaN/Inf block."""
    _, magic, z = round_on_grid(ab, sb + off, special, MBITS, BIAS, False)
    r = tl.minimum(z - magic.to(tl.float32, bitcast=True), MAXV)
    two_s = tl.where(sb == -127, 0x00400000, (sb + 127) << 23).to(tl.float32, bitcast=True)
    val = (r * two_s).to(tl.int32, bitcast=True) | (neg.to(tl.int32) << 31)
    return tl.where(special, float("nan"), val.to(tl.float32, bitcast=True))


@triton.jit
def store_bf16_pairs(out_ptr, blk, val, part: tl.constexpr, valid, NB: tl.constexpr,
                     EVEN: tl.constexpr, EXACT: tl.constexpr):
    """Quarter ``part`` [NB, 8] of float32 values as bf16 (cut when EXACT: every value is a
    bf16 number; else rounded to nearest even), stored as int32 pairs [NB, 4]."""
    if EXACT:
        b = (val.to(tl.int32, bitcast=True) >> 16) & 0xFFFF
    else:
        b = f32_to_bf16_bits(val).to(tl.int32) & 0xFFFF
    lo, hi = tl.split(tl.reshape(b, (NB, 4, 2)))
    off = blk[:, None] * 16 + part * 4 + tl.arange(0, 4)[None, :]
    if EVEN:
        tl.store(out_ptr + off, lo | (hi << 16))
    else:
        tl.store(out_ptr + off, lo | (hi << 16), mask=valid[:, None] & (off >= 0))


@triton.jit
def store_qdq(out_ptr, blk, code, scale, part: tl.constexpr, valid, NB: tl.constexpr,
              EVEN: tl.constexpr, BITS: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
              BIAS: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr, SUBQ: tl.constexpr):
    """Quarter ``part`` of 32-element blocks as bf16 values (the dequantize kernel's decode
    and rounding), stored as int32 pairs [NB, 4] (``out_ptr``: bf16 data viewed as int32)."""
    val = decode_values(code, scale.to(tl.int32)[:, None], False, BITS, EBITS, MBITS, BIAS,
                        NANC, INFC, SUBQ)
    store_bf16_pairs(out_ptr, blk, val, part, valid, NB, EVEN, BIAS + MBITS <= 7)


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
    if EVEN:
        tl.store(data_ptr + off, val)
    else:
        tl.store(data_ptr + off, val, mask=valid[:, None] & (off >= 0))


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
    q0 = fwht8(q0, q0.shape[0])
    q1 = fwht8(q1, q1.shape[0])
    q2 = fwht8(q2, q2.shape[0])
    q3 = fwht8(q3, q3.shape[0])
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
def quantize_rows32_kernel(x_ptr, data_ptr, scale_ptr, sign_mask, n_blocks, seed, rot_scale,
                           NB: tl.constexpr, ROT: tl.constexpr, SIGNS: tl.constexpr,
                           STOCH: tl.constexpr, RULE: tl.constexpr, IS_INT: tl.constexpr,
                           MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                           MAXC: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr,
                           NEGMAX: tl.constexpr, RNUM: tl.constexpr, RSHIFT: tl.constexpr,
                           SIGN: tl.constexpr, PACK: tl.constexpr, IN_BF16: tl.constexpr,
                           BIG: tl.constexpr, EVEN: tl.constexpr,
                           QDQ: tl.constexpr = False, BITS: tl.constexpr = 0,
                           EBITS: tl.constexpr = 0, SUBQ: tl.constexpr = 0.0,
                           MAXV: tl.constexpr = 0.0, FOLD: tl.constexpr = False):
    """Blocks of 32 along the last axis of a contiguous tensor: block b is elements
    [32 b, 32 b + 32) of the flat input, so the tensor is one sequence of blocks. Each block is
    held as four quarters of 8 (one 16-byte load each), which keeps the whole butterfly in
    registers: stages h = 1, 2, 4 inside a quarter, h = 8 and h = 16 between quarters. Same
    bits as ``quantize_kernel`` (and the emulator).

    FOLD (H16 on bf16 or float16 input, a float format, RNE): the rotation's 1/4 goes into the
    block scale instead of a multiply per element. The emulator rotates as signs, butterfly
    stages, then v = fl(T * 1/4). On bf16 or float16 input every x is a multiple of 2^-133
    (resp. 2^-24), so every butterfly intermediate and T are multiples of it too, and T/4 is a
    float32 number: v = T / 4 exactly (Inf and NaN stay what they are). So max|v| = max|T| / 4
    (one multiply per block, exact), and the elements' RNE input y = |v| * 2^-s =
    |T| * 2^-(s + 2): the same real number, rounded once either way, 2^-(s + 2) being a float32
    number (|v| < 2^126 gives s <= 124 for every float format). Same bits as the emulator.

    QDQ: instead of codes and scales, write the dequantized values as bf16 (data_ptr: the
    output viewed as int32 pairs), the bits of ``dequantize(quantize(x), bfloat16)``: on chips
    without MX units this is what feeds a bf16 GEMM, without the packed round trip."""
    pid = tl.program_id(0)
    blk = pid * NB + tl.arange(0, NB)
    if BIG:
        blk = blk.to(tl.int64)
    valid = blk < n_blocks
    j = tl.arange(0, 8)[None, :]
    base = blk[:, None] * 32 + j  # flat index of each element of quarter 0
    q0 = load_f32(x_ptr, blk, 0, valid, NB, EVEN, IN_BF16)
    q1 = load_f32(x_ptr, blk, 1, valid, NB, EVEN, IN_BF16)
    q2 = load_f32(x_ptr, blk, 2, valid, NB, EVEN, IN_BF16)
    q3 = load_f32(x_ptr, blk, 3, valid, NB, EVEN, IN_BF16)
    if ROT > 0:
        r0, r1, r2, r3 = rotate_quarters(q0, q1, q2, q3, sign_mask, rot_scale, ROT, SIGNS,
                                         not FOLD)
    else:
        r0, r1, r2, r3 = q0, q1, q2, q3
    amax = block_amax(r0.to(tl.int32, bitcast=True), r1.to(tl.int32, bitcast=True),
                      r2.to(tl.int32, bitcast=True), r3.to(tl.int32, bitcast=True))
    # the elements are divided by 2^(s + OFF)
    OFF: tl.constexpr = 2 if FOLD else 0
    # packed FP4 codes from the envelope (encode's RAW): 2^23's bits come off once per word
    RAW: tl.constexpr = PACK == 2 and not QDQ and not STOCH and not IS_INT and BIAS == 1
    # (a code word per quarter from 3 float multiply-adds, a 3-way min, an integer multiply-add
    # and a funnel shift per element: 14.5 SASS instructions per element with H16 on sm_90,
    # 18.3 with round_on_grid and the sign merged per element)
    if FOLD:  # r holds the rotation without its 1/4, which goes into the scale (see above)
        amax = (amax.to(tl.float32, bitcast=True) * 0.25).to(tl.int32, bitcast=True)
    u0 = r0.to(tl.int32, bitcast=True)
    u1 = r1.to(tl.int32, bitcast=True)
    u2 = r2.to(tl.int32, bitcast=True)
    u3 = r3.to(tl.int32, bitcast=True)
    a0 = u0 & 0x7FFFFFFF
    a1 = u1 & 0x7FFFFFFF
    a2 = u2 & 0x7FFFFFFF
    a3 = u3 & 0x7FFFFFFF
    s, special, scale = block_scale(amax, RULE, EMAX, MBITS, RNUM, RSHIFT)
    sb = s[:, None]
    sp = special[:, None]
    any_special = tl.max(special.to(tl.int32), axis=0) > 0
    if QDQ and not STOCH:  # RNE values straight from the rounded magnitudes: no codes
        ex = BIAS + MBITS <= 7
        store_bf16_pairs(data_ptr, blk, rounded_values(a0, u0 < 0, sb, sp, OFF, MBITS, BIAS, MAXV), 0,
                         valid, NB, EVEN, ex)
        store_bf16_pairs(data_ptr, blk, rounded_values(a1, u1 < 0, sb, sp, OFF, MBITS, BIAS, MAXV), 1,
                         valid, NB, EVEN, ex)
        store_bf16_pairs(data_ptr, blk, rounded_values(a2, u2 < 0, sb, sp, OFF, MBITS, BIAS, MAXV), 2,
                         valid, NB, EVEN, ex)
        store_bf16_pairs(data_ptr, blk, rounded_values(a3, u3 < 0, sb, sp, OFF, MBITS, BIAS, MAXV), 3,
                         valid, NB, EVEN, ex)
    elif RAW:  # packed E2M1 from the envelope: each quarter's word, signs added per word
        w0 = raw_word(a0, u0, sb, sp, any_special, OFF, MBITS, MAXC, NANC, INFC, SIGN, RULE == 0,
                      NB)
        w1 = raw_word(a1, u1, sb, sp, any_special, OFF, MBITS, MAXC, NANC, INFC, SIGN, RULE == 0,
                      NB)
        w2 = raw_word(a2, u2, sb, sp, any_special, OFF, MBITS, MAXC, NANC, INFC, SIGN, RULE == 0,
                      NB)
        w3 = raw_word(a3, u3, sb, sp, any_special, OFF, MBITS, MAXC, NANC, INFC, SIGN, RULE == 0,
                      NB)
        store_words(data_ptr, blk, w0, w1, w2, w3, valid, NB, EVEN)
        store_scales(scale_ptr, blk, scale, valid, EVEN)
    else:
        c0 = encode(a0, u0 < 0, sb, sp, any_special, base, seed, OFF, STOCH, IS_INT, MBITS, BIAS, MAXC, NANC, INFC,
                    NEGMAX, SIGN, False, ROT > 0, RULE == 0)
        c1 = encode(a1, u1 < 0, sb, sp, any_special, base + 8, seed, OFF, STOCH, IS_INT, MBITS, BIAS, MAXC, NANC,
                    INFC, NEGMAX, SIGN, False, ROT > 0, RULE == 0)
        c2 = encode(a2, u2 < 0, sb, sp, any_special, base + 16, seed, OFF, STOCH, IS_INT, MBITS, BIAS, MAXC, NANC,
                    INFC, NEGMAX, SIGN, False, ROT > 0, RULE == 0)
        c3 = encode(a3, u3 < 0, sb, sp, any_special, base + 24, seed, OFF, STOCH, IS_INT, MBITS, BIAS, MAXC, NANC,
                    INFC, NEGMAX, SIGN, False, ROT > 0, RULE == 0)
        if QDQ:
            store_qdq(data_ptr, blk, c0, scale, 0, valid, NB, EVEN, BITS, EBITS, MBITS, BIAS, NANC, INFC, SUBQ)
            store_qdq(data_ptr, blk, c1, scale, 1, valid, NB, EVEN, BITS, EBITS, MBITS, BIAS, NANC, INFC, SUBQ)
            store_qdq(data_ptr, blk, c2, scale, 2, valid, NB, EVEN, BITS, EBITS, MBITS, BIAS, NANC, INFC, SUBQ)
            store_qdq(data_ptr, blk, c3, scale, 3, valid, NB, EVEN, BITS, EBITS, MBITS, BIAS, NANC, INFC, SUBQ)
        else:
            if PACK == 2:  # the block's 16 code bytes as four int32 words: one 16-byte store per block
                store_words(data_ptr, blk, nibbles_to_word(c0), nibbles_to_word(c1),
                            nibbles_to_word(c2), nibbles_to_word(c3), valid, NB, EVEN)
            else:
                store_codes(data_ptr, blk, c0, 0, valid, NB, PACK, EVEN)
                store_codes(data_ptr, blk, c1, 1, valid, NB, PACK, EVEN)
                store_codes(data_ptr, blk, c2, 2, valid, NB, PACK, EVEN)
                store_codes(data_ptr, blk, c3, 3, valid, NB, PACK, EVEN)
            store_scales(scale_ptr, blk, scale, valid, EVEN)


@triton.jit
def raw_word(ab, u, sb, special, any_special, OFF: tl.constexpr, MBITS: tl.constexpr,
             MAXC: tl.constexpr, NANC: tl.constexpr, INFC: tl.constexpr, SIGN: tl.constexpr,
             SAT: tl.constexpr, NB: tl.constexpr):
    """One quarter [NB, 8] of E2M1 blocks (RNE) as packed code words [NB]: the magnitudes from
    ``encode``'s RAW envelope codes, their bias removed once per word, then the signs from
    ``sign_nibbles`` added (the nibbles' sign bits are clear before)."""
    c = encode(ab, u < 0, sb, special, any_special, 0, 0, OFF, False, False, MBITS, 1, MAXC,
               NANC, INFC, 0, SIGN, False, False, SAT, True)
    return nibbles_to_word(c, True) + (sign_nibbles(u, NB) & -0x77777778)


@triton.jit
def store_words(data_ptr, blk, w0, w1, w2, w3, valid, NB: tl.constexpr, EVEN: tl.constexpr):
    """The four code words [NB] of each block (quarters 0-3): one 16-byte store per block."""
    words = tl.reshape(tl.permute(tl.join(tl.join(w0, w1), tl.join(w2, w3)), (0, 2, 1)), (NB, 4))
    woff = blk[:, None] * 4 + tl.arange(0, 4)[None, :]
    wptr = data_ptr.to(tl.pointer_type(tl.int32))
    if EVEN:
        tl.store(wptr + woff, words)
    else:
        tl.store(wptr + woff, words, mask=valid[:, None] & (woff >= 0))


@triton.jit
def store_scales(scale_ptr, blk, scale, valid, EVEN: tl.constexpr):
    if EVEN:
        tl.store(scale_ptr + blk, scale.to(tl.uint8))
    else:
        tl.store(scale_ptr + blk, scale.to(tl.uint8), mask=valid)


@triton.jit
def decode_values(code, sc, IS_INT: tl.constexpr, BITS: tl.constexpr, EBITS: tl.constexpr,
                  MBITS: tl.constexpr, BIAS: tl.constexpr, NANC: tl.constexpr,
                  INFC: tl.constexpr, SUBQ: tl.constexpr):
    """float32 value(code) * 2^(sc - 127), one rounding; scale code 0xFF or a NaN code -> NaN.
    Element values are built from the code's bits (the format table's parameters)."""
    is_nan = code < 0  # no NaN code unless the format has one
    if IS_INT:  # two's complement x 2^-MBITS
        val = ((code << 24) >> 24).to(tl.float32) * SUBQ
    else:
        mag = code & ((1 << (BITS - 1)) - 1)
        e = mag >> MBITS
        mnt = mag & ((1 << MBITS) - 1)
        normal = (((e - BIAS + 127) << 23) | (mnt << (23 - MBITS))).to(tl.float32, bitcast=True)
        val = tl.where(e == 0, mnt.to(tl.float32) * SUBQ, normal)
        if INFC >= 0:  # IEEE-like specials (e5m2): all-ones exponent
            top = e == (1 << EBITS) - 1
            val = tl.where(top, float("inf"), val)
            is_nan = top & (mnt != 0)
        elif NANC >= 0:  # e4m3: only S.1111.111 is NaN
            is_nan = mag == NANC
        # the sign goes in as a bit: a select of -val (seen on sm_90) can lose the sign of 0
        val = (val.to(tl.int32, bitcast=True) | ((code >> (BITS - 1)) << 31)).to(
            tl.float32, bitcast=True)
    # 2^(sc - 127) as float32 bits; code 0 is the subnormal 2^-127
    f = tl.where(sc == 0, 0x00400000, sc << 23).to(tl.float32, bitcast=True)
    out = tl.where((sc == 255) | is_nan, float("nan"), val * f)
    return out


@triton.jit
def dequantize_kernel(data_ptr, scale_ptr, out_ptr, n_rows, K,
                      BS: tl.constexpr, ROWS: tl.constexpr, KB: tl.constexpr,
                      PACK: tl.constexpr, OUT_BF16: tl.constexpr, EVEN: tl.constexpr,
                      BIG: tl.constexpr, IS_INT: tl.constexpr, BITS: tl.constexpr,
                      EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                      NANC: tl.constexpr, INFC: tl.constexpr, SUBQ: tl.constexpr):
    """out[r, c] = value(code) * 2^(scale - 127) in float32 (one rounding); scale 0xFF -> NaN.
    Element values are built from the code's bits (the format table's parameters); the
    output is K-major like the input; bfloat16 output (OUT_BF16) rounds that float32 once more,
    to nearest even."""
    pid_r = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = pid_r * ROWS + tl.arange(0, ROWS)
    if BIG:
        rows = rows.to(tl.int64)
    cols = pid_k * (KB * BS) + tl.arange(0, KB * BS)
    if EVEN:
        mask = None
    else:
        mask = (rows < n_rows)[:, None] & (cols < K)[None, :]
    if PACK == 2:
        byte = tl.load(data_ptr + rows[:, None] * (K // 2) + (cols // 2)[None, :], mask=mask)
        code = (byte.to(tl.int32) >> ((cols % 2) * 4)[None, :]) & 0xF
    else:
        code = tl.load(data_ptr + rows[:, None] * K + cols[None, :], mask=mask).to(tl.int32)
    sc = tl.load(scale_ptr + rows[:, None] * (K // BS) + (cols // BS)[None, :], mask=mask)
    sc = sc.to(tl.int32)
    out = decode_values(code, sc, IS_INT, BITS, EBITS, MBITS, BIAS, NANC, INFC, SUBQ)
    if OUT_BF16:  # out_ptr is the bf16 output viewed as int16
        out = f32_to_bf16_bits(out)
    tl.store(out_ptr + rows[:, None] * K + cols[None, :], out, mask=mask)


@triton.jit
def transpose_kernel(x_ptr, y_ptr, K, I, BK: tl.constexpr, BI: tl.constexpr,
                     EVEN: tl.constexpr):
    """y[b, i, k] = x[b, k, i] for x (B, K, I) and y (B, I, K), both contiguous: a tile of
    BK x BI read along i and written along k (Triton converts the layout through shared
    memory in between, so both sides are coalesced). Moves bits, any 1/2/4-byte dtype."""
    pb = tl.program_id(2).to(tl.int64)
    k = tl.program_id(0) * BK + tl.arange(0, BK)
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    src = x_ptr + pb * K * I + k[:, None].to(tl.int64) * I + i[None, :]
    dst = y_ptr + pb * K * I + i[None, :].to(tl.int64) * K + k[:, None]
    if EVEN:
        tl.store(dst, tl.load(src))
    else:
        m = (k < K)[:, None] & (i < I)[None, :]
        tl.store(dst, tl.load(src, mask=m), mask=m)


@triton.jit
def mx_gemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K,
                   FMT_A: tl.constexpr, FMT_B: tl.constexpr, PACK_A: tl.constexpr,
                   PACK_B: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   OUT_BF16: tl.constexpr):
    """C[M, N] = A B^T for K-major MX operands A (M, K) and B (N, K), fp32 accumulation by
    ``tl.dot_scaled``; C is float32, or bfloat16 rounded to nearest even (OUT_BF16)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m

    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    ka = tl.arange(0, BLOCK_K // PACK_A)
    kb = tl.arange(0, BLOCK_K // PACK_B)
    ks = tl.arange(0, BLOCK_K // BS)
    a_ptrs = a_ptr + rm[:, None] * (K // PACK_A) + ka[None, :]
    b_ptrs = b_ptr + rn[None, :] * (K // PACK_B) + kb[:, None]  # (BLOCK_K / PACK_B, BLOCK_N)
    sa_ptrs = sa_ptr + rm[:, None] * (K // BS) + ks[None, :]
    sb_ptrs = sb_ptr + rn[:, None] * (K // BS) + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm < M)[:, None] & (ka < k_left // PACK_A)[None, :], other=0)
        b = tl.load(b_ptrs, mask=(rn < N)[None, :] & (kb < k_left // PACK_B)[:, None], other=0)
        sa = tl.load(sa_ptrs, mask=(rm < M)[:, None] & (ks < k_left // BS)[None, :], other=127)
        sb = tl.load(sb_ptrs, mask=(rn < N)[:, None] & (ks < k_left // BS)[None, :], other=127)
        acc = tl.dot_scaled(a, sa, FMT_A, b, sb, FMT_B, acc)
        a_ptrs += BLOCK_K // PACK_A
        b_ptrs += BLOCK_K // PACK_B
        sa_ptrs += BLOCK_K // BS
        sb_ptrs += BLOCK_K // BS
    cmask = (rm < M)[:, None] & (rn < N)[None, :]
    if OUT_BF16:  # c_ptr is the bf16 output viewed as int16
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], f32_to_bf16_bits(acc), mask=cmask)
    else:
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=cmask)
