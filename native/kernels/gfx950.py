"""Block quantize on gfx950 (MI355X) through its own conversion instructions: the native side
of ``ocpmx.emulator.gfx950`` (``quantize(..., conversion="gfx950")``), which defines the bits.

The kernel computes each 32-block's scale code with the project's scale rule (``block_scale``,
the same as every quantize kernel; the hardware does not choose scales), hands the code to the
instruction as its FP32 scale operand (the code in the exponent field: ``code << 23``) and lets
the instruction convert (``INSTRUCTIONS``):

  RNE         ``v_cvt_scalef32_pk_{fp4,fp8,bf8}_f32 dst, x0, x1, scale``: two neighbouring
              elements per instruction (one block, one scale), the FP4 pair in dst's low byte,
              the FP8/BF8 pair in its low half-word;
  stochastic  one element per instruction, each with its own random word (the model's
              ``sr_words``: word i % 4 of Philox4x32-10(seed, counter i // 4), i the K-major
              element index): ``v_cvt_scalef32_sr_pk_fp4_f32 dst, {x, 0}, word, scale`` (the
              source is a 64-bit register pair; our element in the low slot, which takes the
              word itself, not its V_PRNG_B32 successor) and ``v_cvt_scalef32_sr_{fp8,bf8}_f32
              dst, x, word, scale``.

With the instructions, sources are converted from float32; bfloat16 and float16 inputs are
widened exactly first, so the bits are the model's for a float32 source (for RNE the same as a
16-bit source; under stochastic rounding a 16-bit source's own instruction takes fewer random
bits, which the kernel has no instruction for). Only gfx950 assembles these instructions: that
variant runs on a gfx950 GPU, and compiles for one anywhere (``ocpmx audit --arch gfx950``
checks that each variant holds its instruction). FP6 (the PK32 forms, 32 elements from 16
register pairs), stochastic rounding from 16-bit sources and rotations have no instruction here
(``HW_FORMATS``, ``INSTRUCTIONS``).

Everything else, and everything on other chips (NVIDIA GPUs, the CPU interpreter), the same
kernel converts in software (``HW=False``, ``convert_soft``): rules 1-8 of ``emulator.gfx950``
in integer arithmetic, from the input's own type (float32, bfloat16 or float16: under
stochastic rounding a 16-bit source takes its own, smaller number of random bits, as AMD's
host model of the 16-bit-source instructions says; not measured on silicon here), every float
format (FP4, FP6, FP8), the same scales and random words. So an H100 run can reproduce, bit for
bit, what AMD's model says gfx950's conversions give (issue 18: AMD's stochastic rounding
beside the project's own).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import block_scale, load_key, philox_words

# (format, stochastic) -> the instruction (its mnemonic is also what the audit looks for)
INSTRUCTIONS = {
    ("e2m1", False): "v_cvt_scalef32_pk_fp4_f32",
    ("e4m3", False): "v_cvt_scalef32_pk_fp8_f32",
    ("e5m2", False): "v_cvt_scalef32_pk_bf8_f32",
    ("e2m1", True): "v_cvt_scalef32_sr_pk_fp4_f32",
    ("e4m3", True): "v_cvt_scalef32_sr_fp8_f32",
    ("e5m2", True): "v_cvt_scalef32_sr_bf8_f32",
}
HW_FORMATS = ("e2m1", "e4m3", "e5m2")  # with instructions in this kernel


@triton.jit
def _pair(x0, x1, scale, INSN: tl.constexpr):
    """The packed RNE conversion of two elements under one scale: dst's low 16 bits."""
    return tl.inline_asm_elementwise(INSN + " $0, $1, $2, $3", "=v,v,v,v", [x0, x1, scale],
                                     dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _one_sr(x, word, scale, FP4: tl.constexpr, INSN: tl.constexpr):
    """The stochastic conversion of one element with its own random word: dst's low byte
    (FP4: the low nibble)."""
    if FP4:  # the source is a register pair: the element, then 0.0
        src = x.to(tl.uint32, bitcast=True).to(tl.uint64)
    else:
        src = x
    return tl.inline_asm_elementwise(INSN + " $0, $1, $2, $3", "=v,v,v,v", [src, word, scale],
                                     dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def convert_soft(u, code, word, SMB: tl.constexpr, SEB: tl.constexpr, SBIAS: tl.constexpr,
                 MBITS: tl.constexpr, BIAS: tl.constexpr, EMAX: tl.constexpr,
                 MAXC: tl.constexpr, SIGN: tl.constexpr, NAN_OUT: tl.constexpr,
                 OVF_OUT: tl.constexpr, SR: tl.constexpr):
    """gfx950's scaled conversion of one element (``emulator.gfx950._convert_one``, rules
    1-8) in integer arithmetic: ``u`` the source's raw bits (int32, a 16-bit source
    zero-extended), ``code`` the E8M0 scale code (int32), ``word`` the random word (uint32; SR
    only). Returns the code (int32). Every shift stays below 32 bits: the significand has at
    most 24 bits, and shifts past it are clamped where the result is already 0."""
    EMASK: tl.constexpr = (1 << SEB) - 1
    K: tl.constexpr = SMB - MBITS                       # source bits below the kept mantissa
    EMIN: tl.constexpr = 1 - BIAS
    sign = tl.where(((u >> (SMB + SEB)) & 1) != 0, SIGN, 0)
    ef = (u >> SMB) & EMASK
    frac = u & ((1 << SMB) - 1)
    # subnormal input: normalize (rule 3); frac < 2^23 converts to float32 exactly, whose
    # exponent gives frac's bit length
    flen = ((frac.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126
    norm = SMB + 1 - flen
    m = tl.where(ef == 0, frac << tl.where(ef == 0, tl.minimum(norm, 31), 0), frac | (1 << SMB))
    e = tl.where(ef == 0, 1 - SBIAS - norm, ef - SBIAS) - (code - 127)   # the scale (rule 2)
    d = tl.where(e < EMIN, EMIN - e, 0)                 # extra shift into the subnormal range
    if SR:  # the word's top K bits added below the kept mantissa, then truncated (rule 8)
        t = m >> tl.minimum(d, 31)
        n = (t + (word >> (32 - K)).to(tl.int32)) >> K
    else:   # nearest, ties to even (rule 4); sh > SMB + 1 rounds to 0 as SMB + 2 does
        sh = tl.minimum(K + d, SMB + 2)
        n = m >> sh
        rem = m & ((1 << sh) - 1)
        half = 1 << (sh - 1)
        n += ((rem > half) | ((rem == half) & ((n & 1) == 1))).to(tl.int32)
    mag = ((tl.maximum(e, EMIN) + BIAS - 1) << MBITS) + n   # a carry moves into the exponent
    out = sign | tl.where((e > EMAX) | (mag > MAXC), OVF_OUT, mag)       # overflow (rule 7)
    out = tl.where((ef == 0) & (frac == 0), sign, out)                    # +-0 (rule 5)
    out = tl.where((ef == EMASK) & (frac == 0), sign | OVF_OUT, out)      # +-Inf (rule 7)
    return tl.where(((ef == EMASK) & (frac != 0)) | (code == 255), sign | NAN_OUT, out)  # 1, 6


@triton.jit(do_not_specialize=["seed"])
def quantize_gfx950_kernel(x_ptr, data_ptr, scale_ptr, n_blocks, seed,
                           FP4: tl.constexpr, SR: tl.constexpr, INSN: tl.constexpr,
                           RULE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                           RNUM: tl.constexpr, RSHIFT: tl.constexpr, NB: tl.constexpr,
                           HW: tl.constexpr = True, SRC: tl.constexpr = 0,
                           SMB: tl.constexpr = 23, SEB: tl.constexpr = 8,
                           SBIAS: tl.constexpr = 127, BIAS: tl.constexpr = 0,
                           MAXC: tl.constexpr = 0, SIGN: tl.constexpr = 0,
                           NAN_OUT: tl.constexpr = 0, OVF_OUT: tl.constexpr = 0):
    """NB blocks of 32 contiguous elements (K-major: the quantized axis last) per program:
    codes (FP4 packed two per byte, low nibble first; other formats one per byte) and E8M0
    scales. ``HW``: gfx950's instructions (``x_ptr`` any float type); else ``convert_soft``
    with ``x_ptr`` the source's raw bits (``SRC`` 0: float32 as int32, 1: bfloat16 and 2:
    float16 as int16) and the remaining constexprs its and the format's parameters. ``seed``:
    an integer, or a pointer to one (MXLinear's key buffer, ``common.load_key``)."""
    blk = tl.program_id(0).to(tl.int64) * NB + tl.arange(0, NB)
    ok = blk < n_blocks
    j = tl.arange(0, 32)
    flat = blk[:, None] * 32 + j[None, :]                     # K-major element index
    if HW:
        x = tl.load(x_ptr + flat, mask=ok[:, None], other=0).to(tl.float32)
        u = x.to(tl.int32, bitcast=True)
    else:
        u = tl.load(x_ptr + flat, mask=ok[:, None], other=0).to(tl.int32)
        if SRC == 0:
            x = u.to(tl.float32, bitcast=True)
        else:
            u = u & 0xFFFF
            if SRC == 1:
                x = (u << 16).to(tl.float32, bitcast=True)
            else:
                x = u.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    amax = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    _, _, code = block_scale(amax, RULE, EMAX, MBITS, RNUM, RSHIFT)
    tl.store(scale_ptr + blk, code.to(tl.uint8), mask=ok)
    if HW and not SR:
        scale = (code << 23).to(tl.float32, bitcast=True)[:, None]  # the code as an exponent
        x0, x1 = tl.split(tl.reshape(x, (NB, 16, 2)))
        out = _pair(x0, x1, tl.broadcast_to(scale, (NB, 16)), INSN)
        if FP4:
            tl.store(data_ptr + blk[:, None] * 16 + tl.arange(0, 16)[None, :],
                     (out & 0xFF).to(tl.uint8), mask=ok[:, None])
        else:
            pair = tl.join((out & 0xFF).to(tl.uint8), ((out >> 8) & 0xFF).to(tl.uint8))
            tl.store(data_ptr + flat, tl.reshape(pair, (NB, 32)), mask=ok[:, None])
    else:
        if SR:
            w0, w1, w2, w3 = philox_words(load_key(seed), flat // 4)
            r = flat % 4
            word = tl.where(r < 2, tl.where(r == 0, w0, w1), tl.where(r == 2, w2, w3))
        else:
            word = tl.zeros((NB, 32), tl.uint32)
        if HW:
            scale = (code << 23).to(tl.float32, bitcast=True)[:, None]
            out = _one_sr(x, word, tl.broadcast_to(scale, (NB, 32)), FP4, INSN)
        else:
            out = convert_soft(u, tl.broadcast_to(code[:, None], (NB, 32)), word, SMB, SEB,
                               SBIAS, MBITS, BIAS, EMAX, MAXC, SIGN, NAN_OUT, OVF_OUT, SR)
        if FP4:
            lo, hi = tl.split(tl.reshape(out & 0xF, (NB, 16, 2)))
            tl.store(data_ptr + blk[:, None] * 16 + tl.arange(0, 16)[None, :],
                     (lo | (hi << 4)).to(tl.uint8), mask=ok[:, None])
        else:
            tl.store(data_ptr + flat, (out & 0xFF).to(tl.uint8), mask=ok[:, None])
