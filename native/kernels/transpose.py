"""A tiled transpose of the last two axes (moves bits; any 1/2/4-byte dtype)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def transpose_kernel(x_ptr, y_ptr, K, I, BK: tl.constexpr, BI: tl.constexpr,
                     EVEN: tl.constexpr):
    """y[b, i, k] = x[b, k, i] for x (B, K, I) and y (B, I, K), both contiguous: a tile of
    BK x BI read along i and written along k (Triton converts the layout through shared
    memory in between, so both sides are coalesced)."""
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
