"""Pieces every kernel family shares: bit conversions, the block scale, element encode and
decode. Each is a transcription of the emulator's integer algorithm
(``ocpmx.emulator.reference_kernels``): the scale exponent and every element code are computed
from the float32 bits with integer arithmetic, so the kernels are bit-exact to the golden model by
construction, and the tests check that they are. Floating-point arithmetic appears in two
places: the rotation (``ocpmx.spec.rotation``'s order of operations, each step a single IEEE
float32 add or multiply), and the RNE path's scaling and rounding by the float32 adder
(``round_on_grid``; for formats with two exponent bits, E2M1 and E2M3, three such roundings
whose minimum is the code: ``envelope_code``), where an FMA contraction changes nothing either.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...spec.philox import SR_BITS, SR_GROUP, SR_PER_WORD
from ...spec.rules import Rounding, ScaleRule

# the options, by name (the kernels' RULE and ROUNDING constexprs hold these values)
FLOOR = tl.constexpr(int(ScaleRule.FLOOR))
CEIL = tl.constexpr(int(ScaleRule.CEIL))
RCEIL = tl.constexpr(int(ScaleRule.RCEIL))
EVEN = tl.constexpr(int(ScaleRule.EVEN))
RNE = tl.constexpr(int(Rounding.RNE))
STOCHASTIC = tl.constexpr(int(Rounding.STOCHASTIC))
# stochastic rounding's random bits per element, and elements per Philox call
# (ocpmx.spec.philox.stochastic_bits)
RBITS = tl.constexpr(SR_BITS)
RMASK = tl.constexpr((1 << SR_BITS) - 1)
RGROUP = tl.constexpr(SR_GROUP)
RPER = tl.constexpr(SR_PER_WORD)  # elements per 32-bit word


@triton.jit
def tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of this program in a 1-D GEMM grid ordered in bands of GROUP_M tile rows
    (the programs running together share their A and B tiles in L2)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    band = GROUP_M * num_n
    first_m = (pid // band) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + (pid % band) % size_m, (pid % band) // size_m


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
    if RULE == CEIL:
        s += (a_frac != 0).to(tl.int32)
    elif RULE == RCEIL:  # mantissa of amax above the mantissa of max
        s += (((a_frac.to(tl.int64) + (1 << 23)) << RSHIFT) > (RNUM << 23)).to(tl.int32)
    elif RULE == EVEN:  # amax mantissa rounded to the element's bits, ties up
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
    (ENVELOPE: E2M1, E2M3; bias 1, binades [0, 2), [2, 4), [4, 8) with quanta
    q_j = 2^(j - MBITS)), plus 2^23's float32 bits (0x4B000000): the caller masks them off or
    subtracts them once per packed word.

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
def philox_words(seed, counter):
    """The four words of Philox4x32-10 keyed by ``seed`` for counter (counter lo, counter hi,
    0, 0), elementwise over ``counter`` (integers)."""
    c = counter.to(tl.uint64)
    lo = (c & 0xFFFFFFFF).to(tl.uint32)
    hi = (c >> 32).to(tl.uint32)
    zero = lo * 0
    return tl.philox(seed, lo, hi, zero, zero)


@triton.jit
def stochastic_bits(seed, flat):
    """Stochastic rounding's random bits (int64) of the elements at flat indices ``flat``: word
    j // RPER, bits RBITS * (j % RPER) up, of the Philox call of their group (j = flat mod
    RGROUP). One call per element: the generic path (the row kernel draws one call per group,
    ``quarter_bits``)."""
    w0, w1, w2, w3 = philox_words(seed, flat // RGROUP)
    j = flat % RGROUP
    q = j // RPER
    w = tl.where(q < 2, tl.where(q < 1, w0, w1), tl.where(q < 3, w2, w3))
    return ((w >> ((j % RPER) * RBITS).to(tl.uint32)) & RMASK).to(tl.int64)


@triton.jit
def quarter_bits(seed, counter):
    """The random bits (int64) of N groups of RGROUP = 16 consecutive elements as two [N, 8]
    quarters of a 32-block (elements 0-7 from words 0-1, 8-15 from words 2-3), one Philox call
    per group (``counter``: [N] group indices, flat index // RGROUP)."""
    tl.static_assert(RGROUP == 16 and RPER == 4, "a group is two quarters, four bytes a word")
    w0, w1, w2, w3 = philox_words(seed, counter)
    j = tl.arange(0, 8)[None, :]
    sh = ((j % 4) * RBITS).to(tl.uint32)
    first = tl.where(j < 4, w0[:, None], w1[:, None])
    second = tl.where(j < 4, w2[:, None], w3[:, None])
    return ((first >> sh) & RMASK).to(tl.int64), ((second >> sh) & RMASK).to(tl.int64)


@triton.jit
def stochastic_code(ab, sb, special, rbits, MBITS: tl.constexpr, BIAS: tl.constexpr,
                    MAXC: tl.constexpr, SAT: tl.constexpr):
    """Stochastically rounded magnitude codes of y = |v| / 2^s for a float format, in 32-bit
    integer arithmetic: the same bits as the emulator's exact path (up iff r < the fraction's
    first RBITS bits, truncated).

    y is exact wherever its code can be nonzero (as in ``round_on_grid``). With f its float32
    exponent field and sig its 24-bit significand, the element quantum is 2^(F - 127 - MBITS)
    with F = max(f, 128 - BIAS) (the subnormal binade shares the lowest normal one's quantum),
    so Y = sig >> (F - f + 23 - MBITS - RBITS) is y / quantum with RBITS fraction bits,
    truncated. The magnitude code is the codes below binade F plus (Y + RMASK - r) >> RBITS,
    which rounds up iff frac + RMASK - r >= 2^RBITS, i.e. iff r < frac (frac: the fraction's
    first RBITS bits); a carry past the binade lands on the next binade's first code. A
    float32-subnormal y (f = 0) shifts out entirely (it lies far below every element quantum),
    so the implicit bit needs no test. In a NaN/Inf block 2^-s is replaced by 0, as in
    ``round_on_grid``."""
    inv = tl.where(special, 0, (127 - sb) << 23).to(tl.float32, bitcast=True)
    y = (ab.to(tl.float32, bitcast=True) * inv).to(tl.int32, bitcast=True)
    f = y >> 23
    fl = tl.maximum(f, 128 - BIAS)
    sh = tl.minimum(fl - f + (23 - MBITS - RBITS), 31)
    big = ((y & 0x7FFFFF) | 0x800000) >> sh
    # (adding the codes below binade F before the shift, fl * 2^(MBITS + RBITS) + a constant,
    # is 0.2-1 SASS instruction per element fewer but an integer multiply-add, the pipe the
    # Philox rounds keep busy. Timed on an H100 in one run: 3-6% slower (E2M1 rows and H16
    # columns; rows with H16 and signs per word 0.70 against 0.72), faster only for rows
    # without a rotation with signs per word (0.735 against 0.71): not taken)
    mag = ((fl - (128 - BIAS)) << MBITS) + ((big + (RMASK - rbits.to(tl.int32))) >> RBITS)
    if SAT:
        mag = tl.minimum(mag, MAXC)
    return mag


@triton.jit
def encode(ab, neg, sb, special, any_special, rbits, OFF: tl.constexpr,
           ROUNDING: tl.constexpr, IS_INT: tl.constexpr, ENVELOPE: tl.constexpr,
           MBITS: tl.constexpr, BIAS: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
           INFC: tl.constexpr, NEGMAX: tl.constexpr, SIGN: tl.constexpr,
           CAST: tl.constexpr = False, NAN_POS: tl.constexpr = False, SAT: tl.constexpr = True,
           RAW: tl.constexpr = False):
    """Element codes (int32) of float32 magnitude bits ``ab`` with signs ``neg`` under the
    shared exponent ``sb`` (broadcastable to ab's shape); ``rbits``: stochastic rounding's RBITS
    random bits of each element (``stochastic_bits``; unused under RNE); CAST: element casts
    (scale 2^0, no block).
    ``OFF``: the float paths (RNE and stochastic) divide |v| by 2^(s + OFF) (QUARTER_IN_SCALE
    in ``quantize.quantize_rows32_kernel``); the integer path needs OFF = 0. NAN_POS: NaN gets the
    positive NaN code (after a rotation, whose NaN is +qNaN: ``ocpmx.spec.rotation``). SAT =
    False: the scale rule keeps every RNE code at most MAXC (not floor; see ``envelope_code``;
    stochastic rounding saturates regardless). RAW
    (E2M1, RNE; ``quantize.raw_word``): magnitude codes without the sign, plus 0x4B000000; a
    NaN's code is 0x4B000000 minus its sign bit's code, so that adding the signs later gives it
    code 0."""
    if ROUNDING == STOCHASTIC and not IS_INT:  # float formats: 32-bit integer arithmetic
        # always saturated: even where the scale rule keeps y below the top code's RNE
        # boundary (SAT False), y may exceed the largest normal and round up past it
        mag = stochastic_code(ab, sb + OFF, special, rbits, MBITS=MBITS, BIAS=BIAS,
                              MAXC=MAXC, SAT=True)
        sign = tl.where(neg, SIGN, 0)
        if RAW:  # no sign: the caller puts the signs in per word (``quantize.sign_nibbles``)
            code = mag
        else:
            code = sign | mag
    elif IS_INT:  # exact integer path (emulator: encode)
        ef = ab >> 23
        mf = ab & 0x7FFFFF
        m = tl.where(ef > 0, mf | 0x800000, mf).to(tl.int64)
        e = tl.where(ef > 0, ef - 150, -149)  # |v| = m * 2^e
        qe = tl.zeros_like(ef) - MBITS  # MXINT8: the quantum 2^-MBITS relative to the scale
        # shift >= 1 for every finite element of a finite block (the scale puts |v| / 2^s
        # below 2^(emax + 1)); capped at 63 so every shift amount below stays defined.
        sh = tl.minimum(tl.maximum(qe + sb - e, 1), 63).to(tl.int64)
        n = m >> sh
        rem = m - (n << sh)
        if ROUNDING == STOCHASTIC:  # up iff r < the fraction's first RBITS bits
            frac = tl.where(sh <= RBITS, rem << tl.maximum(RBITS - sh, 0),
                            rem >> tl.maximum(sh - RBITS, 0))
            up = rbits < frac
        else:
            half = (rem * 0 + 1) << (sh - 1)
            up = (rem > half) | ((rem == half) & ((n & 1) == 1))
        n = n + up.to(tl.int64)
        n = tl.minimum(n, tl.where(neg, NEGMAX, MAXC))
        code = tl.where(neg, (-n) & 0xFF, n).to(tl.int32)
        sign = tl.zeros_like(code)
    elif ENVELOPE:  # two exponent bits (E2M1, E2M3), RNE: the code is a concave envelope
        m = envelope_code(ab, sb, special, MBITS=MBITS, MAXC=MAXC, OFF=OFF, SAT=SAT or CAST)
        sign = tl.where(neg, SIGN, 0)
        if RAW:  # no sign: the caller puts the signs in per word (``quantize.sign_nibbles``)
            code = m
        else:
            code = sign | (m & (SIGN - 1))
    else:  # float formats, RNE: the emulator's fast path (quantize_rows_fast), same bits
        # (only NaN and Inf elements need the fix-up below)
        f, magic, z = round_on_grid(ab, sb + OFF, special, MBITS=MBITS, BIAS=BIAS, CAST=CAST)
        # the code: the count of quanta in z's low bits plus the codes below the binade (a
        # carry into the next binade lands on its first code)
        mag = z.to(tl.int32, bitcast=True) - magic + ((f - (128 - BIAS)) << MBITS)
        sign = tl.where(neg, SIGN, 0)
        code = sign | tl.minimum(mag, MAXC)
    # NaN and Inf keep their encoding (they occur only in blocks whose scale is NaN)
    if RAW:  # no NaN code (0, no sign: its sign bit, added later, is taken off here), Inf
        # saturates (its sign added later); RNE's codes carry the envelope's 0x4B000000
        tl.static_assert(NANC < 0 and INFC < 0, "RAW codes are for formats without NaN or Inf codes")
        raw_bias: tl.constexpr = 0 if ROUNDING == STOCHASTIC else 0x4B000000
        nan_code = raw_bias - sign
        inf_code = tl.zeros_like(code) + (raw_bias + MAXC)
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
    if IS_INT:
        # zeros, and finite values in a NaN/Inf block, become zeros (the float paths get both
        # from 2^-s = 0 in such blocks)
        code = tl.where((ab == 0) | special, sign, code)
    # not from the arithmetic above: the bits of Inf * 0 differ between x86 and GPUs. Only
    # blocks whose scale is NaN hold NaN or Inf, so the selects run only where one exists.
    if any_special:  # tested on the float |v| (a compare with |.| needs no abs instruction)
        mag_f = ab.to(tl.float32, bitcast=True)
        code = tl.where(mag_f == float("inf"), inf_code, tl.where(mag_f != mag_f, nan_code, code))
    return code


@triton.jit
def load_key(key):
    """A random-bit key (a stochastic-rounding seed or a rotation's sign mask): an integer
    argument, or a pointer to one in device memory. MXLinear passes pointers into its per-step
    key buffer, so that a compiled graph or a CUDA graph replays with the current step's keys;
    the public operations pass integers. (Kernels taking keys mark them ``do_not_specialize``:
    Triton would otherwise make an integer 1 a constexpr, which has no dtype.)"""
    if key.dtype.is_ptr():
        return tl.load(key)
    else:
        return key


@triton.jit
def rotation_signs(sign_mask, pos):
    """+-1.0 for positions ``pos`` inside a rotation group: bit ``pos`` of ``sign_mask``
    (``ocpmx.spec.Rotation.sign_mask``, one bit per position, an integer kernel argument), so a
    random-sign rotation sends no tensor to the device: a host-to-device copy per call made
    every training step wait under GPU sharing."""
    return tl.where(((sign_mask >> pos) & 1) == 1, -1.0, 1.0)


@triton.jit
def pow2_scale(e):
    """2^e as float32 for an integer e in [-127, 127]: an E8M0 scale's value (2^-127 the
    float32 subnormal 0x00400000)."""
    return tl.where(e == -127, 0x00400000, (e + 127) << 23).to(tl.float32, bitcast=True)


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
