"""MXFP4/MXFP6 operands folded into FP8 E4M3 for Hopper's FP8 tensor cores (issue 17): the
native side of ``ocpmx.emulator.fold``, which defines the fold and the folded GEMM's sums.

``fold(mx, group)`` turns an MXTensor (K-major codes and E8M0 scales) into E4M3 codes and one
power-of-two exponent per group of ``group`` 32-blocks along K; ``folded_matmul(a, b)`` is the
FP8 GEMM of two folded operands with every K = 32 partial sum promoted at once.

Bits against the emulator (``emulator.fold``): the fold itself is bit for bit on every device
(H100 included). The GEMM is the emulator's ``folded_matmul`` with ``dot=dot_model(device)``:
"exact" dots under the interpreter, Hopper's measured FP8 wgmma rule on an H100 (every format
and group size; ``benchmarks/fold_probe.py``, results/native_gpu/fold_probe.md). Not yet fused
into the quantize pass. The kernel measured at 123-127 TFLOP/s on an H100 at Llama-8B shapes,
0.15-0.18x cuBLAS bf16 (results/native_gpu/bench_gemm_h100.md), had a float64 scale epilogue
per group and a nested group loop (K = 128 per dot changed nothing); the present one (float32
epilogue, one flat loop, 3 pipeline stages; same bits, tested through the interpreter) is not
yet measured on a GPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..emulator.fold import TARGET, shift_range
from ..spec import BLOCK_SIZE, ElementFormat, lower
from . import launch
from ._lazy import kernels, triton
from .dispatch import hopper, interpreting
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
    if mx.block_size != BLOCK_SIZE:
        raise ValueError(f"fold takes blocks of {BLOCK_SIZE}, got {mx.block_size}")
    return fold_kmajor(mx.data, mx.scales_kmajor, mx.shape[mx.axis], mx.fmt, group)


def fold_kmajor(data: torch.Tensor, scales: torch.Tensor, k: int, fmt: ElementFormat,
                group: int = 4) -> FoldedTensor:
    """``fold`` on K-major codes (packed for FP4) and scales: (rows, K / pack), (rows, K / 32)."""
    if fmt.name not in ("e2m1", "e2m3", "e3m2"):
        raise ValueError(f"only FP4/FP6 formats fold into E4M3 exactly, not {fmt.name}")
    nblk = k // BLOCK_SIZE
    if group < 1 or nblk % group:
        raise ValueError(f"group {group} does not divide the {nblk} blocks along K")
    rows = math.prod(data.shape[:-1])
    codes = torch.empty(rows, k, dtype=torch.uint8, device=data.device)
    exps = torch.empty(rows, nblk // group, dtype=torch.int32, device=data.device)
    n_groups = rows * nblk // group
    if n_groups:
        t = lower(TARGET)
        ng = 16
        launch.run(kernels.fold.fold_kernel, (triton.cdiv(n_groups, ng),), data, scales, codes,
                   exps, n_groups, **lower(fmt).constexprs(), PACK=pack_factor(fmt),
                   D_MAX=shift_range(fmt)[1], T_MBITS=t.mbits, T_BIAS=t.bias,
                   T_MAXC=t.max_code, T_NANC=t.nan_code, T_SIGN=t.sign_bit, GROUP=group, NG=ng)
    return FoldedTensor(codes, exps, scales.reshape(rows, nblk), group, fmt)


def dot_model(device) -> str | None:
    """The emulator's ``folded_matmul(..., dot=...)`` that gives this device's bits: "exact"
    for CPU tensors (the interpreter), "hopper" on an sm_90 GPU (measured on an H100), None on
    other GPUs (not measured)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "exact"
    return "hopper" if hopper(device) else None


def folded_matmul(a: FoldedTensor, b: FoldedTensor, out_dtype: torch.dtype = torch.float32,
                  *, k_per_dot: int | None = None) -> torch.Tensor:
    """A Bᵀ of two folded operands (rows, K): the emulator's ``folded_matmul`` with
    ``dot=dot_model(device)``, bit for bit. ``k_per_dot``: K of one ``tl.dot`` (a multiple of 32 dividing
    32 * group; default 32 under the interpreter, up to 128 on a GPU)."""
    if a.codes.shape[1] != b.codes.shape[1] or a.group != b.group:
        raise ValueError("folded operands need the same K and the same group")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    m, k = a.codes.shape
    n = b.codes.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.codes.device)
    if m and n:
        bm = bn = 32 if interpreting() else 128
        kt = k_per_dot or (32 if interpreting() else 32 * math.gcd(a.group, 4))
        if kt % 32 or (32 * a.group) % kt:
            raise ValueError(f"k_per_dot {kt} must be a multiple of 32 dividing the group's "
                             f"{32 * a.group} elements")
        launch.run(kernels.fold.folded_gemm_kernel, (triton.cdiv(m, bm), triton.cdiv(n, bn)),
                   a.codes, b.codes, a.exponents, b.exponents,
                   c.view(torch.int16) if out_dtype == torch.bfloat16 else c, m, n, k,
                   GROUP=a.group, BLOCK_M=bm, BLOCK_N=bn, KT=kt,
                   OUT_BF16=out_dtype == torch.bfloat16,
                   num_warps=4 if interpreting() else 8, num_stages=1 if interpreting() else 3,
                   enable_fp_fusion=False)  # the epilogue's product is rounded, then added
    return c
