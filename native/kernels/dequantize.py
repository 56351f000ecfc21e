"""Dequantize kernel: MX codes and scales (K-major) -> float32 or bfloat16 values."""
from __future__ import annotations

import triton
import triton.language as tl

from .common import decode_values, f32_to_bf16_bits


@triton.jit
def dequantize_kernel(data_ptr, scale_ptr, out_ptr, n_rows, K,
                      # the format
                      IS_INT: tl.constexpr, BITS: tl.constexpr, SIGN: tl.constexpr,
                      EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                      EMAX: tl.constexpr, MAXC: tl.constexpr, NANC: tl.constexpr,
                      INFC: tl.constexpr, NEGMAX: tl.constexpr, RNUM: tl.constexpr,
                      RSHIFT: tl.constexpr, SUBQ: tl.constexpr, MAXV: tl.constexpr,
                      ENVELOPE: tl.constexpr,
                      # the numerics
                      PACK: tl.constexpr, OUT_BF16: tl.constexpr,
                      # the tile, and what the shape implies
                      ROWS: tl.constexpr, KB: tl.constexpr, BS: tl.constexpr,
                      EVEN: tl.constexpr, BIG: tl.constexpr):
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
    out = decode_values(code, sc, IS_INT=IS_INT, BITS=BITS, EBITS=EBITS, MBITS=MBITS,
                        BIAS=BIAS, NANC=NANC, INFC=INFC, SUBQ=SUBQ)
    if OUT_BF16:  # out_ptr is the bf16 output viewed as int16
        out = f32_to_bf16_bits(out)
    tl.store(out_ptr + rows[:, None] * K + cols[None, :], out, mask=mask)
