"""AMD gfx950 (CDNA4, MI355X) scaled conversions as a named conversion model.

``quantize(x, fmt, conversion="gfx950")`` and ``cast(..., conversion="gfx950")`` come here.

What is AMD's and what is ours
------------------------------
*AMD's*: the element conversion. gfx950 converts with ``V_CVT_SCALEF32_PK_FP4_{F32,F16,BF16}``,
``V_CVT_SCALEF32_PK_{FP8,BF8}_*``, ``V_CVT_SCALEF32_PK32_{FP6,BF6}_*`` and the stochastic forms
``V_CVT_SCALEF32_SR_*``; each takes the block scale as an *input* (an FP32 operand whose exponent
field is the E8M0 code). ``convert`` models one such conversion of one element under one scale
code, for e2m1 (FP4), e2m3 (FP6), e3m2 (BF6), e4m3 (FP8) and e5m2 (BF8), from float32, float16
and bfloat16 sources.

*Ours*: which scale a block gets (the emulator's ``scale_rule``, default §6.3's floor; the
hardware does not choose it), the layout (codes one per element, scales along ``axis``), and for
stochastic rounding which random word each element gets: word ``i % 4`` of Philox4x32-10 with
key ``seed`` and counter ``(c & 0xffffffff, c >> 32, 0, 0)``, ``c = i // 4``, for the element of
index ``i`` (``sr_words``). Elements are counted as the project's stochastic rounding counts
them (``ocpmx.spec.philox``): by their index in the K-major layout, the quantized axis moved
last (for ``axis=-1`` the flat index of the input; for a cast, the flat index).

The rules (each with where it was read)
---------------------------------------
[ISA]  AMD Instinct CDNA4 ISA reference guide, §12.11 VOP3A: V_CVT_SCALEF32_PK_FP4_F32 (opcode
       573) and siblings (565-602): ``scale = exponent(S2.f32)``, the scale operand's 8-bit
       exponent field; the SR forms take ``randomVal = S1.u32`` for the first element and
       ``v_prng_b32(randomVal)`` for each next one of the same instruction; V_PRNG_B32.
[HOST] ROCm HIP ``amd_hip_ocp_host.hpp`` (namespace ``fcbx``: ``from_float``,
       ``from_float_sr``, ``to_float``, ``nan``, ``inf``, the ``encodings`` table) and
       ``amd_hip_ocp_fp.hpp`` (``__amd_scale_to_float``; every scaled wrapper uses the Mx
       encodings with ``sat = true``): AMD's public host-side model of these instructions.
[HW]   Measurements on gfx950 by others: ROCm/rocm-systems issue #9556 (through
       v_cvt_scalef32_pk_fp8_f16: E4M3 448 + 18 -> 0x7f NaN, E5M2 57344 + 4096 -> +Inf);
       triton-lang/triton PR #7327 (AMD: the scaled FP8 conversions are non-saturating; Triton
       clamps in software before them).

1. Scale code c (E8M0): 0x00..0xFE scale by 2^(c - 127); 0x00 is 2^-127, a scale like any other
   (not zero; the FP32 operand built as c << 23 is 0.0, whose exponent field the instruction
   reads) [ISA; HOST __amd_scale_to_float, from_float]. 0xFF is a NaN scale: every element of
   the block, zeros included, becomes the format's NaN output with its own sign [HOST
   from_float: the NaN-scale test precedes the zero test].
2. The scale is applied by subtracting its exponent from the input's exponent, exactly; there
   is one rounding, at the target's precision [HOST from_float: ``srcExp -= scale_exp``].
3. Subnormal inputs (float32, float16, bfloat16) are normalized first, never flushed [HOST
   from_float: the normalization loop for Mx encodings].
4. Rounding is to nearest, ties to even, with round and sticky bits, into subnormal targets too
   [ISA "round toward nearest even"; HOST from_float].
5. Negative values keep their sign; one that rounds to zero gives -0 [HOST zero(sign)].
6. NaN input -> the NaN output with the input's sign: E2M1 S.11.1 (+-6), E2M3 S.11.111 (+-7.5),
   E3M2 S.111.11 (+-28) (FP4/FP6 have no NaN code: the host model's ``nan()`` returns the
   largest magnitude), E4M3 S.1111.111 (NaN), E5M2 S.11111.10 (NaN) [HOST nan()].
7. Overflow (the rounded magnitude above the largest finite value) and +-Inf input:
   E2M1/E2M3/E3M2 -> +-max (saturate; [HOST] ``inf()`` is ``nan()``, i.e. max, for these);
   E4M3 -> S.1111.111, NaN [HOST inf<E4M3Mx, sat=true> = 0x7F; HW #9556];
   E5M2 -> S.11111.00, +-Inf [ISA non-saturating per PR #7327; HW #9556].
   The host model instead saturates E5M2 to +-57344 (0x7B, its ``sat = true`` branch); the
   measured hardware does not, and this model follows the hardware. The ISA gives these
   instructions no saturation control (the VOP3 clamp bit, §6.5, clamps float results to
   [0, 1]; the unscaled FP8 conversions "ignore OMOD and clamp"); software clamps before
   converting, as Triton does (PR #7327) and RCCL's open fix proposes (rocm-systems PR
   #9554). AMD's instruction emulator rocjitsu models a MODE.FP16_OVFL bit that saturates the
   *unscaled* FP8 conversions; it is not modelled here.
8. Stochastic rounding [HOST from_float_sr; ISA V_CVT_SR_FP8_F32 uses S1[31:12]]: with
   k = (source fraction bits) - (target mantissa bits) (f32 -> e2m1: 22; bf16 -> e4m3: 4), the
   top k bits of the 32-bit random word are added to the k source bits below the kept
   mantissa, and the sum is truncated; a carry propagates into the exponent. For subnormal
   targets the source significand is first shifted right, truncating, to the subnormal
   exponent (bits below the source precision there are lost before the add); the result can
   overflow like rule 7 (E4M3: an in-range value just below 480 may become NaN).
   float16/bfloat16 sources use their own fraction width (fewer random bits); for normal
   targets this equals converting to float32 first, for subnormal targets it can differ.
   The packed SR instructions take one word for their first element and derive the next ones
   with V_PRNG_B32 [ISA]; to feed each element its own word, as here, a kernel issues one SR
   conversion per element (element in the low slot) or uses the single-element FP8 forms.
9. The scaled upcasts (V_CVT_SCALEF32_PK_F32_FP4 etc.) return value * 2^(c-127) exactly,
   +-Inf past the float32 range ("gfx950 HW behavior" in to_float), NaN for a NaN code or scale
   [HOST to_float]: the same float32 as OCP's exact decode, so ``dequantize`` needs no gfx950
   variant (checked on every code under every scale in the tests).

MXINT8 has no such instruction: ``conversion="gfx950"`` with int8 raises a ValueError.
"""
from __future__ import annotations

import ml_dtypes
import numba as nb
import numpy as np

from ..spec import BLOCK_SIZE, get_format, parse_rotation
from ..spec.rules import Rounding
from .philox import philox4

# Sources: name -> (fraction bits, exponent bits, exponent bias, storage dtype)
SOURCES = {
    "float32": (23, 8, 127, np.uint32),
    "float16": (10, 5, 15, np.uint16),
    "bfloat16": (7, 8, 127, np.uint16),
}

# (NaN output, overflow and Inf output) magnitude codes per format; the element's sign is added.
SPECIAL_OUTPUTS = {
    "e2m1": (0x7, 0x7),    # no NaN/Inf codes: both give S.11.1 = +-6 (rules 6, 7)
    "e2m3": (0x1F, 0x1F),  # +-7.5
    "e3m2": (0x1F, 0x1F),  # +-28
    "e4m3": (0x7F, 0x7F),  # S.1111.111 is E4M3's NaN: NaN, Inf and overflow all give NaN
    "e5m2": (0x7E, 0x7C),  # NaN S.11111.10 (host model); Inf and overflow -> Inf (hardware)
}
FORMATS = tuple(SPECIAL_OUTPUTS)
NAN_SCALE = 0xFF
UNIT_SCALE = 127  # 2^0: what ``cast`` converts under



def _target(fmt):
    """The element format's parameters for the kernel, or a ValueError for MXINT8."""
    f = get_format(fmt)
    if f.name not in SPECIAL_OUTPUTS:
        raise ValueError(f"conversion='gfx950' has no {f.name} conversion: gfx950's "
                         f"V_CVT_SCALEF32_* instructions convert to {', '.join(FORMATS)} only "
                         f"(MXINT8 has no such instruction); use conversion='ocp'")
    nan_out, ovf_out = SPECIAL_OUTPUTS[f.name]
    return f, (f.mbits, f.bias, f.emin, f.emax, f.max_code, f.sign_bit, nan_out, ovf_out)


def _source(x):
    """(raw bits as uint32, layout) for a float32, float16 or bfloat16 array."""
    x = np.asarray(x)
    if x.dtype == ml_dtypes.bfloat16:
        name = "bfloat16"
    elif x.dtype in (np.float32, np.float16):
        name = x.dtype.name
    else:
        raise TypeError(f"conversion='gfx950' takes float32, float16 or bfloat16 input (the "
                        f"V_CVT_SCALEF32 source types), got {x.dtype}")
    mb, eb, bias, store = SOURCES[name]
    bits = np.ascontiguousarray(x).view(store).astype(np.uint32)
    return bits, (mb, eb, bias)


# ------------------------------------------------------------------------------------------
# The conversion of one element (rules 1-8)
# ------------------------------------------------------------------------------------------

@nb.njit(cache=True, inline="always")
def _convert_one(u, smb, seb, sbias, code, tgt, sr, word):
    mbits, bias, emin, emax, max_code, sign_bit, nan_out, ovf_out = tgt
    u = np.int64(u)
    emask = (np.int64(1) << seb) - 1
    sign = np.int64(sign_bit) if (u >> (smb + seb)) & 1 else np.int64(0)
    ef = (u >> smb) & emask
    frac = u & ((np.int64(1) << smb) - 1)
    if (ef == emask and frac != 0) or code == 0xFF:   # NaN input or NaN scale (rules 1, 6)
        return sign | nan_out
    if ef == emask:                                  # +-Inf (rule 7)
        return sign | ovf_out
    if ef == 0 and frac == 0:                        # +-0 (rule 5)
        return sign
    if ef == 0:                                      # subnormal input: normalize (rule 3)
        m = frac
        e = np.int64(1) - sbias
        while m < (np.int64(1) << smb):
            m <<= 1
            e -= 1
    else:
        m = frac | (np.int64(1) << smb)
        e = ef - sbias
    e -= np.int64(code) - 127                        # apply the scale exactly (rule 2)
    if e > emax:
        return sign | ovf_out
    k = smb - mbits                                  # source bits below the kept mantissa
    d = emin - e if e < emin else np.int64(0)        # extra shift into the subnormal range
    if sr:                                           # add the word's top k bits, truncate (rule 8)
        t = (m >> d) if d < 32 else np.int64(0)
        n = (t + (np.int64(word) >> (32 - k))) >> k
    else:                                            # round to nearest, ties to even (rule 4)
        sh = k + d
        if sh > smb + 1:
            n = np.int64(0)
        else:
            n = m >> sh
            rem = m & ((np.int64(1) << sh) - 1)
            half = np.int64(1) << (sh - 1)
            if rem > half or (rem == half and (n & 1) == 1):
                n += 1
    ee = e if e > emin else np.int64(emin)
    mag = ((ee + bias - 1) << mbits) + n            # a carry out of n moves into the exponent
    if mag > max_code:                               # overflow (rule 7)
        return sign | ovf_out
    return sign | mag


@nb.njit(cache=True, parallel=True)
def _convert_array(u, smb, seb, sbias, codes, tgt, sr, words, out):
    for i in nb.prange(u.size):
        w = words[i] if sr else np.uint32(0)
        out[i] = np.uint8(_convert_one(u[i], smb, seb, sbias, codes[i], tgt, sr, w))


def convert(x, fmt, scale_codes=UNIT_SCALE, *, rounding="rne", words=None) -> np.ndarray:
    """gfx950's scaled conversion of each element of ``x`` under its E8M0 scale code.

    x            float32, float16 or bfloat16 (ml_dtypes) array: the instruction's source type.
    scale_codes  uint8 E8M0 codes, broadcast against ``x`` (default 127, scale 2^0).
    rounding     'rne' (V_CVT_SCALEF32_PK_*) or 'stochastic' (V_CVT_SCALEF32_SR_*).
    words        uint32 random words, one per element (same shape as ``x``), for 'stochastic'.
    Returns uint8 codes, one per element.
    """
    _, tgt = _target(fmt)
    rnd = Rounding.parse(rounding)
    bits, (smb, seb, sbias) = _source(x)
    codes = np.asarray(scale_codes)
    if codes.dtype != np.uint8:
        if codes.dtype.kind not in "iu" or codes.size and (codes.min() < 0 or codes.max() > 255):
            raise ValueError("scale_codes must be E8M0 codes in 0..255")
        codes = codes.astype(np.uint8)
    codes = np.ascontiguousarray(np.broadcast_to(codes, bits.shape))
    sr = rnd == Rounding.STOCHASTIC
    if sr:
        if words is None:
            raise ValueError("stochastic rounding needs words: one uint32 random word per element")
        w = np.asarray(words)
        if w.shape != bits.shape or w.dtype != np.uint32:
            raise ValueError(f"words must be uint32 of the input's shape {bits.shape}, got "
                             f"{w.dtype} {w.shape}")
        w = np.ascontiguousarray(w).reshape(-1)
    else:
        w = np.zeros(1, np.uint32)
    out = np.empty(bits.shape, np.uint8)
    if bits.size:
        _convert_array(bits.reshape(-1), smb, seb, sbias, codes.reshape(-1), tgt, sr, w,
                       out.reshape(-1))
    return out


# ------------------------------------------------------------------------------------------
# Random words: one per element, four per Philox4x32-10 call
# ------------------------------------------------------------------------------------------

@nb.njit(cache=True, parallel=True)
def _words(seed, n, out):
    for c in nb.prange((n + 3) // 4):
        w = philox4(seed, np.uint64(c))
        for j in range(4):
            i = 4 * c + j
            if i < n:
                out[i] = np.uint32(w[j])


def sr_words(seed: int, n: int) -> np.ndarray:
    """uint32[n]: the random word of the element of index i is word i % 4 of
    Philox4x32-10(key = seed, counter = (c & 0xffffffff, c >> 32, 0, 0)), c = i // 4
    (``ocpmx.spec.philox.philox4x32`` gives the same words in plain Python)."""
    out = np.empty(int(n), np.uint32)
    if n:
        _words(np.uint64(seed & 0xFFFFFFFFFFFFFFFF), int(n), out)
    return out


def prng_b32(words) -> np.ndarray:
    """V_PRNG_B32 [ISA]: the LFSR step ``(w << 1) ^ (197 if w's top bit else 0)`` (32 bits).
    The packed SR instructions use S1 for their first element and this step for each next."""
    w = np.asarray(words, dtype=np.uint32)
    return ((w << np.uint32(1)) ^ np.where(w >> np.uint32(31), np.uint32(197), np.uint32(0))
            ).astype(np.uint32)


# ------------------------------------------------------------------------------------------
# Block quantization and cast under the gfx950 model
# ------------------------------------------------------------------------------------------

def quantize(x, fmt, *, axis: int = -1, block_size: int = BLOCK_SIZE, scale_rule="floor",
             rounding="rne", seed: int = 0, rotation=None, int8_min: int = -127,
             path: str = "auto"):
    """``emulator.quantize(..., conversion="gfx950")``: the block scale from the emulator's
    ``scale_rule`` (ours), each element converted by gfx950's rules under it (AMD's, see the
    module docstring). Stochastic rounding feeds the element of K-major index i (its index with
    the quantized axis moved last; the flat index for ``axis=-1``) the word
    ``sr_words(seed, x.size)[i]``. Input float32, float16 or bfloat16 (a ``rotation`` is
    applied in float32, which is then the source type)."""
    from .block_quantize import MXArray, _check_axis
    from .block_quantize import quantize as ocp_quantize
    from .rotation import rotate_last_axis

    f, _ = _target(fmt)
    rnd = Rounding.parse(rounding)
    if path not in ("auto", "reference"):
        raise ValueError(f"path {path!r} does not apply to conversion='gfx950' (one kernel)")
    x = np.asarray(x)
    _source(x[:0])  # the dtype check, before any work
    axis = _check_axis(x, axis, block_size)
    rot = parse_rotation(rotation)
    if rot is not None and block_size % rot.size:
        raise ValueError(f"block_size {block_size} is not a multiple of the rotation size "
                         f"{rot.size}")
    moved = np.moveaxis(x, axis, -1)
    if rot is not None:
        moved = rotate_last_axis(moved.astype(np.float32), rot)
    moved = np.ascontiguousarray(moved)
    # the scale: the emulator's rule on the same values (float16/bfloat16 widen exactly)
    scales = ocp_quantize(moved.astype(np.float32), f, axis=-1, block_size=block_size,
                          scale_rule=scale_rule).scales
    words = None
    if rnd == Rounding.STOCHASTIC:
        words = sr_words(seed, moved.size).reshape(moved.shape)  # K-major index
    codes = convert(moved, f, np.repeat(scales, block_size, axis=-1), rounding=rnd, words=words)
    return MXArray(np.moveaxis(codes, -1, axis), np.moveaxis(scales, -1, axis), f, axis,
                   block_size, rot)


def cast(x, fmt, *, rounding="rne", seed: int = 0, int8_min: int = -127) -> np.ndarray:
    """``emulator.cast(..., conversion="gfx950")``: the scaled conversion under scale 2^0
    (code 127); stochastic words ``sr_words(seed, x.size)`` by flat index."""
    _target(fmt)
    x = np.asarray(x)
    words = None
    if Rounding.parse(rounding) == Rounding.STOCHASTIC:
        words = sr_words(seed, x.size).reshape(x.shape)
    return convert(x, fmt, UNIT_SCALE, rounding=rounding, words=words)
