"""The baselines the MX GEMMs are measured against: bf16, and per-tensor scaled FP8."""
from __future__ import annotations

import torch

from .dispatch import interpreting
from .ops import move_axis_last

def bf16_matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16):
    """A Bᵀ in bfloat16 (cuBLAS on the GPU), a: (M, K), b: (N, K)."""
    return (a.to(torch.bfloat16) @ b.to(torch.bfloat16).t()).to(out_dtype)


FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_per_tensor(x: torch.Tensor, fmt: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor scaled FP8: (x / s).to(fp8) with s = amax / max (1 for an all-zero tensor);
    returns (fp8 tensor, float32 scale s)."""
    dt = FP8_DTYPES[fmt]
    amax = x.detach().abs().max().float()
    scale = torch.where(amax > 0, amax / torch.finfo(dt).max, torch.ones_like(amax))
    return (x.float() / scale).to(dt), scale


def _row_major(t: torch.Tensor) -> torch.Tensor:
    """``t.contiguous()``; a transposed 2-D view goes through the Triton tiled transpose
    (torch's strided copy of a transpose ran at ~15% of copy bandwidth on an H200)."""
    if t.is_contiguous():
        return t
    if t.dim() == 2 and t.t().is_contiguous() and (t.is_cuda or interpreting()):
        return move_axis_last(t.t(), 0)
    return t.contiguous()


def fp8_matmul(a: torch.Tensor, b: torch.Tensor, fmt_a: str = "e4m3", fmt_b: str = "e4m3",
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A Bᵀ with per-tensor FP8 scaling (E4M3 forward, E5M2 for gradients), a: (M, K), b: (N, K).
    ``torch._scaled_mm`` on the GPU; on the CPU the same FP8 operands multiplied in float32."""
    a8, sa = fp8_per_tensor(a, fmt_a)  # elementwise: keeps a transposed view's layout
    b8, sb = fp8_per_tensor(b, fmt_b)
    a8, b8 = _row_major(a8), _row_major(b8)  # then transposes 1-byte data, not bf16
    if a.is_cuda:  # cuBLASLt wants A row-major and B column-major
        return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    return ((a8.float() * sa) @ (b8.float() * sb).t()).to(out_dtype)
