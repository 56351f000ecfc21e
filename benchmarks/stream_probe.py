"""Memory-side ceiling of the MXFP4 quantize stream on a GPU: synthetic kernels with the row
quantize kernel's bytes (2 read and 0.53 written per bf16 element) and a dialed amount of ALU
work, timed beside a device copy and the real kernel in the same run.

  python benchmarks/stream_probe.py --out DIR

Each probe program reads NB 32-element bf16 blocks and writes 16 code bytes and 1 scale byte
per block, as ``kernels.quantize_rows32_kernel`` does. Knobs:

layout   ``quarters``: thread i holds block i as four 16-byte loads 64 bytes apart (the real
         kernel's layout); ``coalesced``: each warp load instruction reads 512 contiguous bytes
work     integer hash rounds per 32-bit input word (3 SASS instructions each: 1.5 per element);
         it cannot be folded, so the ALU cost grows with it
hints    ``none``, or loads evict_first and stores .cs (streaming: do not keep in L2)

No probe computes anything meaningful; they answer "how fast can this byte stream go with
this much work per element", the bound the quantize kernel is compared with.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import gpu_bench as gb
from ocpmx import native
from ocpmx.spec import Rotation


@triton.jit
def mix(w, WORK: tl.constexpr):
    for _ in tl.static_range(WORK):
        w = (w ^ (w >> 13)) * -1640531535
    return w


@triton.jit
def probe_kernel(x_ptr, code_ptr, scale_ptr, NB: tl.constexpr, WORK: tl.constexpr,
                 COALESCED: tl.constexpr, HINTS: tl.constexpr, WRITE: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    ev: tl.constexpr = "evict_first" if HINTS else ""
    cm: tl.constexpr = ".cs" if HINTS else ""
    if COALESCED:  # row r of the tile: block r // 4, quarter r % 4 (one 16-byte load each)
        r = tl.arange(0, NB * 4)
        w = tl.load(x_ptr + (pid * NB * 4 + r)[:, None] * 4 + tl.arange(0, 4)[None, :],
                    eviction_policy=ev)
        s = tl.sum(mix(w, WORK), axis=1)  # one code word per quarter
        if WRITE:
            tl.store(code_ptr + pid * NB * 4 + r, s, cache_modifier=cm)
            tl.store(scale_ptr + pid * NB + r // 4, s.to(tl.uint8), mask=(r % 4) == 0,
                     cache_modifier=cm)
        else:
            tl.store(code_ptr + pid, tl.sum(s, axis=0))
    else:  # thread i: block i, quarters 64 bytes apart, as the quantize kernel
        blk = pid * NB + tl.arange(0, NB)
        q = tl.arange(0, 4)[None, :]
        w0 = mix(tl.load(x_ptr + blk[:, None] * 16 + q, eviction_policy=ev), WORK)
        w1 = mix(tl.load(x_ptr + blk[:, None] * 16 + 4 + q, eviction_policy=ev), WORK)
        w2 = mix(tl.load(x_ptr + blk[:, None] * 16 + 8 + q, eviction_policy=ev), WORK)
        w3 = mix(tl.load(x_ptr + blk[:, None] * 16 + 12 + q, eviction_policy=ev), WORK)
        words = (w0 + w1) ^ (w2 + w3)  # [NB, 4]: the block's 16 code bytes
        if WRITE:
            tl.store(code_ptr + blk[:, None] * 4 + q, words, cache_modifier=cm)
            tl.store(scale_ptr + blk, tl.sum(words, axis=1).to(tl.uint8), cache_modifier=cm)
        else:
            tl.store(code_ptr + pid, tl.sum(tl.sum(words, axis=1), axis=0))


@triton.jit
def copy_kernel(x_ptr, y_ptr, NB: tl.constexpr):
    """bf16 copy as int32 words, 16-byte accesses, 512 contiguous bytes per warp instruction."""
    pid = tl.program_id(0).to(tl.int64)
    off = (pid * NB * 4 + tl.arange(0, NB * 4))[:, None] * 4 + tl.arange(0, 4)[None, :]
    tl.store(y_ptr + off, tl.load(x_ptr + off))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiles", nargs="+", default=["32,1", "64,2", "128,4"])
    ap.add_argument("--work", nargs="+", type=int, default=[0, 2, 4, 6, 8, 10, 12])
    args = ap.parse_args()
    m, k = gb.TOKENS, 14336
    n_blocks = m * k // 32
    src = gb.rotating(lambda: torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    dst = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    codes = torch.empty(n_blocks * 4, device="cuda", dtype=torch.int32)
    scales = torch.empty(n_blocks, device="cuda", dtype=torch.uint8)
    copy_bytes = 4 * m * k
    q_bytes = 2 * m * k + 17 * n_blocks
    rows = gb.StreamRows(gb.bench(lambda: dst.copy_(src())), copy_bytes)
    row = rows.add
    for nb in (32, 64, 128):
        for warps in (1, 2, 4):
            if nb // warps < 16:
                continue
            grid = (n_blocks // nb,)
            ms = gb.bench(lambda: copy_kernel[grid](src().view(torch.int32), dst.view(torch.int32),
                                                    NB=nb, num_warps=warps))
            row(f"triton copy bf16 ({nb}, {warps})", ms, copy_bytes)
    for tile in args.tiles:
        nb, warps = (int(v) for v in tile.split(","))
        grid = (n_blocks // nb,)
        for coalesced in (False, True):
            for hints in (False, True):
                for work in args.work:
                    for write in ((True, False) if work == 0 else (True,)):
                        def run():
                            probe_kernel[grid](src().view(torch.int32), codes, scales, NB=nb,
                                               WORK=work, COALESCED=coalesced, HINTS=hints,
                                               WRITE=write, num_warps=warps)
                        ms = gb.bench(run)
                        name = (f"probe ({nb}, {warps}) {'coalesced' if coalesced else 'quarters'}"
                                f"{' hints' if hints else ''} work {work}"
                                f"{'' if write else ' read-only'}")
                        row(name, ms, q_bytes if write else 2 * m * k, tile=[nb, warps],
                            coalesced=coalesced, hints=hints, work=work, write=write)
    rot = Rotation(16)
    for qdq in (False, True):
        name = "quantize_dequantize" if qdq else "quantize"
        fn = (lambda x: native.quantize_dequantize(x, "e2m1", rotation=rot, scale_rule="even")) \
            if qdq else (lambda x: native.quantize(x, "e2m1", rotation=rot, scale_rule="even"))
        nbytes = copy_bytes if qdq else q_bytes
        row(f"{name} e2m1 H16 rows", gb.bench(lambda: fn(src())), nbytes)
        row(f"CUDA graph: {name} e2m1 H16 rows",
            gb.graphed_ms(fn, [src() for _ in range(4)]), nbytes)
    row("CUDA graph: torch copy bf16", gb.graphed_ms(lambda x: dst.copy_(x), [src() for _ in range(4)]),
        copy_bytes)
    rows.write(args.out, "probe")


if __name__ == "__main__":
    main()
