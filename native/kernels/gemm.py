"""The MX GEMM kernel: ``tl.dot_scaled`` over K-major MX operands."""
from __future__ import annotations

import triton
import triton.language as tl

from .common import f32_to_bf16_bits, tile_ids


@triton.jit
def mx_gemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, c_ptr, M, N, K,
                   FMT_A: tl.constexpr, FMT_B: tl.constexpr, PACK_A: tl.constexpr,
                   PACK_B: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   OUT_BF16: tl.constexpr):
    """C[M, N] = A B^T for K-major MX operands A (M, K) and B (N, K), fp32 accumulation by
    ``tl.dot_scaled``; C is float32, or bfloat16 rounded to nearest even (OUT_BF16)."""
    pid_m, pid_n = tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)

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
