"""MXFP4/MXFP6 operands folded into FP8 E4M3 for Hopper's FP8 tensor cores (issue 17): the
native side of ``ocpmx.emulator.fold``, which defines the fold and the folded GEMM's sums.

``fold(mx, group)`` turns an MXTensor (K-major codes and E8M0 scales) into E4M3 codes and one
power-of-two exponent per group of ``group`` 32-blocks along K; ``folded_matmul(a, b)`` is the
FP8 GEMM of two folded operands with every K = 32 partial sum promoted at once.

Bits against the emulator (``emulator.fold``): the fold itself is bit for bit on every device
(H100 included). The GEMM equals the emulator's ``folded_matmul``, which takes every K = 32 FP8
dot as exact, under the interpreter for every format, and on Hopper's FP8 tensor cores for
E2M1 only (``models_exactly``): measured on an H100 (``benchmarks/fold_probe.py``,
results/native_gpu/fold_probe.md), E2M1 matched every output at groups of 1, 4 and 32 blocks;
E2M3 differed in 2 of 12,288 outputs and E3M2 in nearly all. The wgmma aligns the products of
a dot to the largest and truncates: E2M1's folded products span 7 octaves and survive it,
E2M3's 12 rarely do not, E3M2's 18 do not. That alignment is not modelled yet. Not yet fused
into the quantize pass; untuned (one 128 x 128 tile): 123-127 TFLOP/s on an H100 at Llama-8B
shapes, 0.15-0.18x cuBLAS bf16 (results/native_gpu/bench_gemm.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton

from ..emulator.fold import TARGET, shift_range
from ..spec import BLOCK_SIZE, ElementFormat, lower
from . import kernels, launch
from .dispatch import interpreting
from .tensor import MXTensor, pack_factor


@dataclass
class FoldedTensor:
    """codes: uint8 E4M3 (rows, K); exponents: int32 (rows, K / (32 group)); scales: the MX
    E8M0 scales (rows, K / 32), kept; group: blocks per group; fmt: the MX element format."""
    codes: torch.Tensor
    exponents: torch.Tensor
    scales: torch.Tensor
    group: int
    fmt: ElementFormat


def fold(mx: MXTensor, group: int = 4) -> FoldedTensor:
    """Fold an MX operand (its K-major rows, K along the last axis) with one exponent per
    ``group`` blocks; ``group`` must divide K / 32."""
    if mx.fmt.name not in ("e2m1", "e2m3", "e3m2"):
        raise ValueError(f"only FP4/FP6 formats fold into E4M3 exactly, not {mx.fmt.name}")
    if mx.block_size != BLOCK_SIZE:
        raise ValueError(f"fold takes blocks of {BLOCK_SIZE}, got {mx.block_size}")
    k = mx.shape[mx.axis]
    nblk = k // BLOCK_SIZE
    if group < 1 or nblk % group:
        raise ValueError(f"group {group} does not divide the {nblk} blocks along K")
    rows = math.prod(mx.data.shape[:-1])
    codes = torch.empty(rows, k, dtype=torch.uint8, device=mx.device)
    exps = torch.empty(rows, nblk // group, dtype=torch.int32, device=mx.device)
    n_groups = rows * nblk // group
    if n_groups:
        t = lower(TARGET)
        ng = 16
        launch.run(kernels.fold.fold_kernel, (triton.cdiv(n_groups, ng),), mx.data,
                   mx.scales_kmajor, codes, exps, n_groups, **lower(mx.fmt).constexprs(),
                   PACK=pack_factor(mx.fmt), D_MAX=shift_range(mx.fmt)[1], T_MBITS=t.mbits,
                   T_BIAS=t.bias, T_MAXC=t.max_code, T_NANC=t.nan_code, T_SIGN=t.sign_bit,
                   GROUP=group, NG=ng)
    return FoldedTensor(codes, exps, mx.scales_kmajor.reshape(rows, nblk), group, mx.fmt)


def models_exactly(fmt, device) -> bool:
    """Whether the emulator's ``folded_matmul`` gives this device's bits for operands folded
    from ``fmt``: always for CPU tensors (the interpreter), E2M1 only on a GPU (measured on
    Hopper; see the module doc)."""
    name = fmt if isinstance(fmt, str) else fmt.name
    return torch.device(device).type != "cuda" or name == "e2m1"


def folded_matmul(a: FoldedTensor, b: FoldedTensor,
                  out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A Bᵀ of two folded operands (rows, K): the emulator's ``folded_matmul``, bit for bit."""
    if a.codes.shape[1] != b.codes.shape[1] or a.group != b.group:
        raise ValueError("folded operands need the same K and the same group")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    m, k = a.codes.shape
    n = b.codes.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.codes.device)
    if m and n:
        bm = bn = 32 if interpreting() else 128
        launch.run(kernels.fold.folded_gemm_kernel, (triton.cdiv(m, bm), triton.cdiv(n, bn)),
                   a.codes, b.codes, a.exponents, b.exponents,
                   c.view(torch.int16) if out_dtype == torch.bfloat16 else c, m, n, k,
                   GROUP=a.group, BLOCK_M=bm, BLOCK_N=bn, OUT_BF16=out_dtype == torch.bfloat16,
                   num_warps=4 if interpreting() else 8)
    return c
