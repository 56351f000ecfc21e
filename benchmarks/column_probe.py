"""Memory-side ceiling of the column (axis-0) quantize stream on a GPU: synthetic kernels with
the column kernel's access pattern and almost no arithmetic, timed beside a device copy and the
real column kernel in the same run.

  python benchmarks/column_probe.py --out DIR

The input is bf16 (K, N) read as int32 words (column pairs), quantized along K (Wgrad's
operands: K = tokens). A probe program reads the tile of rows 32 KB kt .. 32 KB (kt + 1) - 1
and word columns BW n .. BW n + BW - 1, each thread one word column and all its rows (the
column kernel's ``HIDE``, vec 2 layout: a warp reads 128 contiguous bytes of a row per
instruction), sums each quarter of a 32-block (8 rows) to one word, and writes the K-major
codes as the column kernel does: column c's block b at bytes c K / 2 + 16 b of the output
(16 bytes per column and block, in N rows K / 2 bytes apart), plus one scale byte per column
and block. Modes:

read      the reads only (one word per program written)
write     the writes only (values from the indices)
both      the reads and the writes
trans     ``both``, the quarter words transposed (``tl.trans``) before the store, so that each
          column's 16 bytes can go out as one store
serial    ``both`` one 32-row block at a time (load, sum, store its 16 bytes per column), the KB
          blocks of a program one after another: the column kernel's ``ColumnTile.serial``

No probe computes anything meaningful; they answer "how fast can this access pattern go",
the bound the column kernel's 0.5-0.63 of copy is compared with.
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import gpu_bench as gb
from ocpmx import native
from ocpmx.spec import Rotation

MODES = {"read": 0, "write": 1, "both": 2, "trans": 3, "serial": 4}


@triton.jit
def column_probe_kernel(x_ptr, code_ptr, scale_ptr, K, NW, BW: tl.constexpr, KB: tl.constexpr,
                        MODE: tl.constexpr, KB_FAST: tl.constexpr):
    if KB_FAST:
        kt = tl.program_id(0)
        n = tl.program_id(1)
    else:
        kt = tl.program_id(1)
        n = tl.program_id(0)
    rows = (kt * 32 * KB + tl.arange(0, 32 * KB)).to(tl.int64)
    cols = n * BW + tl.arange(0, BW)
    c0 = (2 * cols).to(tl.int64)
    kw = K // 8  # code words per output row (a column's K / 2 bytes)
    if MODE == 4:
        for j in tl.static_range(KB):
            r = (kt * 32 * KB + j * 32 + tl.arange(0, 32)).to(tl.int64)
            w = tl.load(x_ptr + r[:, None] * NW + cols[None, :])  # [32, BW] words
            s = tl.sum(tl.reshape(w, (4, 8, BW)), axis=1)        # [4, BW]
            q = tl.arange(0, 4)[:, None]
            tl.store(code_ptr + c0[None, :] * kw + (kt * KB + j) * 4 + q, s)
            tl.store(code_ptr + (c0[None, :] + 1) * kw + (kt * KB + j) * 4 + q, s ^ 0x5A5A)
            sc = tl.sum(s, axis=0)
            tl.store(scale_ptr + c0 * (K // 32) + kt * KB + j, sc.to(tl.uint8))
            tl.store(scale_ptr + (c0 + 1) * (K // 32) + kt * KB + j, (sc >> 8).to(tl.uint8))
        return
    if MODE != 1:
        w = tl.load(x_ptr + rows[:, None] * NW + cols[None, :])  # [32 KB, BW] words
        s = tl.sum(tl.reshape(w, (KB * 4, 8, BW)), axis=1)       # a word per quarter
    else:
        s = tl.arange(0, KB * 4)[:, None] * 7 + cols[None, :]
    if MODE == 0:
        tl.store(code_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1),
                 tl.sum(tl.sum(s, axis=1), axis=0))
        return
    if MODE == 3:
        t = tl.trans(s)  # [BW, KB * 4]
        j = tl.arange(0, KB * 4)[None, :]
        tl.store(code_ptr + c0[:, None] * kw + kt * KB * 4 + j, t)
        tl.store(code_ptr + (c0[:, None] + 1) * kw + kt * KB * 4 + j, t ^ 0x5A5A)
    else:
        j = tl.arange(0, KB * 4)[:, None]
        tl.store(code_ptr + c0[None, :] * kw + kt * KB * 4 + j, s)
        tl.store(code_ptr + (c0[None, :] + 1) * kw + kt * KB * 4 + j, s ^ 0x5A5A)
    sc = tl.reshape(tl.sum(tl.reshape(s, (KB, 4, BW)), axis=1), (KB, BW))
    b = tl.arange(0, KB)[:, None]
    tl.store(scale_ptr + c0[None, :] * (K // 32) + kt * KB + b, sc.to(tl.uint8))
    tl.store(scale_ptr + (c0[None, :] + 1) * (K // 32) + kt * KB + b, (sc >> 8).to(tl.uint8))


def probe(x_words: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, k: int, n: int,
          bw: int, kb: int, mode: str, kb_fast: bool, warps: int) -> None:
    nw = n // 2
    tiles = (k // (32 * kb), nw // bw)
    grid = tiles if kb_fast else tiles[::-1]
    column_probe_kernel[grid](x_words, codes, scales, k, nw, BW=bw, KB=kb, MODE=MODES[mode],
                              KB_FAST=kb_fast, num_warps=warps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiles", nargs="+", default=["32,1,1", "64,2,1", "128,4,1", "32,1,2",
                                                   "64,2,2", "32,1,4"],
                    help="BW,warps,KB: word columns (pairs of bf16 columns), warps, 32-blocks")
    args = ap.parse_args()
    k, n = gb.TOKENS, 14336
    src = gb.rotating(lambda: torch.randn(k, n, device="cuda", dtype=torch.bfloat16))
    dst = torch.empty(k, n, device="cuda", dtype=torch.bfloat16)
    codes = torch.empty(n * k // 8, device="cuda", dtype=torch.int32)
    scales = torch.empty(n * k // 32, device="cuda", dtype=torch.uint8)
    copy_bytes = 4 * k * n
    read_bytes = 2 * k * n
    write_bytes = k * n // 2 + k * n // 32
    rows = gb.StreamRows(gb.bench(lambda: dst.copy_(src())), copy_bytes)
    row = rows.add
    for tile in args.tiles:
        bw, warps, kb = (int(v) for v in tile.split(","))
        for kb_fast in (True, False):
            for mode in MODES:
                nbytes = {"read": read_bytes, "write": write_bytes}.get(mode,
                                                                       read_bytes + write_bytes)
                ms = gb.bench(lambda: probe(src().view(torch.int32), codes, scales, k, n, bw, kb,
                                            mode, kb_fast, warps))
                row(f"probe ({bw}, {warps}, {kb}){' kb_fast' if kb_fast else ''} {mode}", ms,
                    nbytes, tile=[bw, warps, kb], kb_fast=kb_fast, mode=mode)
    for rot in (None, Rotation(16)):
        fn = (lambda x: native.quantize(x, "e2m1", axis=0, rotation=rot, scale_rule="even"))
        name = f"quantize e2m1 axis=0{' H16' if rot else ''} (the column kernel, default tile)"
        row(name, gb.bench(lambda: fn(src())), read_bytes + write_bytes)
        row(f"CUDA graph: {name}", gb.graphed_ms(fn, [src() for _ in range(4)]),
            read_bytes + write_bytes)
    row("CUDA graph: torch copy bf16",
        gb.graphed_ms(lambda x: dst.copy_(x), [src() for _ in range(4)]), copy_bytes)
    rows.write(args.out, "column_probe")


if __name__ == "__main__":
    main()
