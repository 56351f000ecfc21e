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

Sources are converted from float32; bfloat16 and float16 inputs are widened exactly first, so
the bits are the model's for a float32 source (for RNE the same as a 16-bit source; under
stochastic rounding a 16-bit source's own instruction would take fewer random bits, so the
host asks for float32 input there). Only gfx950 assembles these instructions: the kernel runs
on a gfx950 GPU, and compiles for one anywhere (``ocpmx audit --arch gfx950`` checks that each
variant holds its instruction). FP6 (the PK32 forms, 32 elements from 16 register pairs) and
rotations are not here yet.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .common import block_scale, philox_words

# (format, stochastic) -> the instruction (its mnemonic is also what the audit looks for)
INSTRUCTIONS = {
    ("e2m1", False): "v_cvt_scalef32_pk_fp4_f32",
    ("e4m3", False): "v_cvt_scalef32_pk_fp8_f32",
    ("e5m2", False): "v_cvt_scalef32_pk_bf8_f32",
    ("e2m1", True): "v_cvt_scalef32_sr_pk_fp4_f32",
    ("e4m3", True): "v_cvt_scalef32_sr_fp8_f32",
    ("e5m2", True): "v_cvt_scalef32_sr_bf8_f32",
}
FORMATS = ("e2m1", "e4m3", "e5m2")


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


@triton.jit(do_not_specialize=["seed"])
def quantize_gfx950_kernel(x_ptr, data_ptr, scale_ptr, n_blocks, seed,
                           FP4: tl.constexpr, SR: tl.constexpr, INSN: tl.constexpr,
                           RULE: tl.constexpr, EMAX: tl.constexpr, MBITS: tl.constexpr,
                           RNUM: tl.constexpr, RSHIFT: tl.constexpr, NB: tl.constexpr):
    """NB blocks of 32 contiguous elements (K-major: the quantized axis last) per program:
    codes (FP4 packed two per byte, low nibble first; FP8 one per byte) and E8M0 scales."""
    blk = tl.program_id(0).to(tl.int64) * NB + tl.arange(0, NB)
    ok = blk < n_blocks
    j = tl.arange(0, 32)
    flat = blk[:, None] * 32 + j[None, :]                     # K-major element index
    x = tl.load(x_ptr + flat, mask=ok[:, None], other=0).to(tl.float32)
    amax = tl.max(x.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    _, _, code = block_scale(amax, RULE, EMAX, MBITS, RNUM, RSHIFT)
    tl.store(scale_ptr + blk, code.to(tl.uint8), mask=ok)
    scale = (code << 23).to(tl.float32, bitcast=True)[:, None]  # the code in the exponent field
    if SR:
        w0, w1, w2, w3 = philox_words(seed, flat // 4)
        r = flat % 4
        word = tl.where(r < 2, tl.where(r == 0, w0, w1), tl.where(r == 2, w2, w3))
        out = _one_sr(x, word, tl.broadcast_to(scale, (NB, 32)), FP4, INSN)
        if FP4:
            lo, hi = tl.split(tl.reshape(out & 0xF, (NB, 16, 2)))
            tl.store(data_ptr + blk[:, None] * 16 + tl.arange(0, 16)[None, :],
                     (lo | (hi << 4)).to(tl.uint8), mask=ok[:, None])
        else:
            tl.store(data_ptr + flat, (out & 0xFF).to(tl.uint8), mask=ok[:, None])
    else:
        x0, x1 = tl.split(tl.reshape(x, (NB, 16, 2)))
        out = _pair(x0, x1, tl.broadcast_to(scale, (NB, 16)), INSN)
        if FP4:
            tl.store(data_ptr + blk[:, None] * 16 + tl.arange(0, 16)[None, :],
                     (out & 0xFF).to(tl.uint8), mask=ok[:, None])
        else:
            pair = tl.join((out & 0xFF).to(tl.uint8), ((out >> 8) & 0xFF).to(tl.uint8))
            tl.store(data_ptr + flat, tl.reshape(pair, (NB, 32)), mask=ok[:, None])
