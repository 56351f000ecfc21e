"""The whole-row fold's tile (blocks per program: ``native.fold.FOLD_ROW_CHUNK`` and, for rows
past ``FOLD_ROW_LONG`` blocks, ``FOLD_ROW_LONG_CHUNK``, both set to each chunk timed; warps:
``FOLD_ROW_WARPS``) on a GPU at Llama-8B operand shapes: ms, GB/s of the bytes it moves (packed
codes and scales in, E4M3 codes out) against a device copy, and the bits against the default
tile, and the default tile with E2M1's integer path in 32-bit words and a byte at a time
(``FOLD_ROW_WORDS``); beside it the group-4 fold (the blockwise method's) and the two passes
MXLinear's rowwise method runs per operand (quantize, then the whole-row fold) against the fused
quantize + group-4 fold and the whole-row fold in the row kernel's pass
(``fold.fused_in_quantize``: rows of at most ``FUSED_ROW_FOLD_MAX_GROUP`` blocks padded to a
power of two; ``--row-limit``: longer ones too) on the default tile and on ``--fused-warps``
warps. ``--axis0 KxM ...``: whole rows along axis 0 both ways (``FUSED_COLUMN_FOLD_MAX_GROUP``:
the transpose and the fused fold, or the column kernel and the fold of its codes), alone
without ``--shapes``. Each time is the device's, from a CUDA graph of ten calls (the first run, in
results/native_gpu/archive/, timed eager calls: host-bound).

    python benchmarks/fold_rows_sweep.py --out DIR   (writes DIR.md and DIR.json)
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch
from triton.testing import do_bench

from ocpmx import native
from ocpmx.native import fold, plans
from ocpmx.native.tuning import RowTile

SHAPES = ((8192, 4096), (14336, 4096), (8192, 14336), (4096, 14336), (14336, 8192),
          (32768, 768))


def bench(fn, calls: int = 10):
    """ms a call of ``fn`` on the device: ``calls`` calls captured in a CUDA graph, replayed (the
    host's time per call, two launches and the outputs' allocation, would otherwise set it at
    these sizes)."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return do_bench(g.replay, warmup=10, rep=50, return_mode="median") / calls


def copy_ms(numel: int) -> float:
    """ms of a device copy of ``numel`` bf16 elements' bytes (the baseline of every row)."""
    src = torch.empty(numel * 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return bench(lambda: dst.copy_(src))


def axis0_routes(shapes) -> list[dict]:
    """Whole rows along axis 0 of K x M bf16 inputs (H16, 2^R) both ways
    ``fold.fused_in_quantize`` can send them where plain quantize runs the column kernel: the
    transpose and the row kernel's fused fold, or the column kernel then the fold of the stored
    codes; ms, of copy (bf16 in and out, as the row cases), the bits compared."""
    rows = []
    kw = dict(axis=0, rotation="hadamard16", pow2=True)
    limit = fold.FUSED_COLUMN_FOLD_MAX_GROUP
    for k, m in shapes:
        x = torch.randn(k, m, device="cuda", dtype=torch.bfloat16)
        t_copy = copy_ms(k * m)
        out = {}
        for name, value in (("transpose + fused fold", 1 << 20),
                            ("column kernel + fold of the codes", 0)):
            fold.FUSED_COLUMN_FOLD_MAX_GROUP = value
            plans.clear()
            fused = fold.fused_in_quantize(x, 0, k // 32, native.default_tuning(x.device))
            out[name] = fold.quantize_folded(x, "e2m1", None, **kw)
            t = bench(lambda: fold.quantize_folded(x, "e2m1", None, **kw))
            rows.append(dict(shape=[k, m], case=f"axis 0 whole rows H16: {name} "
                             f"(fused_in_quantize {fused})", ms=t, of_copy=t_copy / t))
        fold.FUSED_COLUMN_FOLD_MAX_GROUP = limit
        plans.clear()
        a, b = out.values()
        same = all(torch.equal(getattr(a, n), getattr(b, n))
                   for n in ("codes", "exponents", "scales", "stats", "pow2"))
        rows[-1]["same_bits"] = rows[-2]["same_bits"] = same
        t_q = bench(lambda: native.quantize(x, "e2m1", axis=0, rotation="hadamard16"))
        rows.append(dict(shape=[k, m], case="axis 0 quantize H16 (packed)", ms=t_q,
                         of_copy=t_copy / t_q))
        rows.append(dict(shape=[k, m], case="torch copy bf16", ms=t_copy))
        for r in rows[-4:]:
            print(r, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 64, 128, 256])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--fused-warps", type=int, nargs="*", default=[1, 2, 4, 8],
                    help="warps of the row kernel folding whole rows in its pass")
    ap.add_argument("--row-limit", type=int, default=0,
                    help="time the fused whole-row fold up to this many blocks (padded) too")
    ap.add_argument("--shapes", nargs="*", help="M x K shapes, e.g. 8192x4096 (default: "
                    "Llama-8B's operands and a 125m one)")
    ap.add_argument("--axis0", nargs="*", default=[],
                    help="K x M shapes quantized along axis 0 (Wgrad's operands, W in Dgrad): "
                         "whole rows through the transpose and the fused fold against the "
                         "column kernel then the fold of its codes (FUSED_COLUMN_FOLD_MAX_GROUP)")
    args = ap.parse_args()
    rows = axis0_routes([tuple(map(int, v.split("x"))) for v in args.axis0])
    default = (fold.FOLD_ROW_CHUNK, fold.FOLD_ROW_LONG_CHUNK, fold.FOLD_ROW_WARPS)
    shapes = [tuple(map(int, v.split("x"))) for v in args.shapes] if args.shapes else SHAPES
    if args.axis0 and not args.shapes:  # (the axis-0 routes alone)
        shapes = []
    for m, k in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_copy = copy_ms(m * k)
        copy_gbs = 4 * m * k / t_copy / 1e6
        qa = native.quantize(x, "e2m1", rotation="hadamard16")
        moved = qa.data.numel() + qa.scales_kmajor.numel() + m * k  # in + out, bytes
        want = fold.fold(qa, None)
        for chunk, warps in itertools.product(args.chunks, args.warps):
            fold.FOLD_ROW_CHUNK = fold.FOLD_ROW_LONG_CHUNK = chunk
            fold.FOLD_ROW_WARPS = warps
            try:
                got = fold.fold(qa, None)
                same = torch.equal(got.codes, want.codes) and torch.equal(got.exponents,
                                                                          want.exponents)
                t = bench(lambda: fold.fold(qa, None))
                row = dict(shape=[m, k], case=f"fold whole rows chunk {chunk} warps {warps}",
                           ms=t, gbs=moved / t / 1e6, of_copy=moved / t / 1e6 / copy_gbs,
                           same_bits=same)
            except Exception as e:  # noqa: BLE001 - a tile that does not compile is a result
                row = dict(shape=[m, k], case=f"fold whole rows chunk {chunk} warps {warps}",
                           error=f"{type(e).__name__}: {str(e)[:160]}")
            print(row, flush=True)
            rows.append(row)
        fold.FOLD_ROW_CHUNK, fold.FOLD_ROW_LONG_CHUNK, fold.FOLD_ROW_WARPS = default
        words_default = fold.FOLD_ROW_WORDS
        for words in (True, False):  # E2M1's integer path in 32-bit words or a byte at a time
            fold.FOLD_ROW_WORDS = words
            plans.clear()
            got = fold.fold(qa, None)
            t = bench(lambda: fold.fold(qa, None))
            rows.append(dict(shape=[m, k], case=f"fold whole rows, the default tile, "
                             f"{'32-bit words' if words else 'bytes'}", ms=t,
                             gbs=moved / t / 1e6, of_copy=moved / t / 1e6 / copy_gbs,
                             same_bits=torch.equal(got.codes, want.codes)))
            print(rows[-1], flush=True)
        fold.FOLD_ROW_WORDS = words_default
        plans.clear()
        t4 = bench(lambda: fold.fold(qa, 4))
        rows.append(dict(shape=[m, k], case="fold group 4 (blockwise)", ms=t4,
                         gbs=moved / t4 / 1e6, of_copy=moved / t4 / 1e6 / copy_gbs))
        kw = dict(rotation="hadamard16", pow2=True)
        t_q = bench(lambda: native.quantize(x, "e2m1", rotation="hadamard16"))
        limit = fold.FUSED_ROW_FOLD_MAX_GROUP
        fold.FUSED_ROW_FOLD_MAX_GROUP = 0  # every whole row: quantize, then fold
        plans.clear()  # (a plan made under one limit would run under another)
        two = fold.quantize_folded(x, "e2m1", None, **kw)
        t_two = bench(lambda: fold.quantize_folded(x, "e2m1", None, **kw))
        fold.FUSED_ROW_FOLD_MAX_GROUP = limit
        plans.clear()
        t_fused = bench(lambda: fold.quantize_folded(x, "e2m1", 4, **kw))
        cases = [("quantize_folded whole rows H16, the default path",
                  bench(lambda: fold.quantize_folded(x, "e2m1", None, **kw)))]
        nblk = k // 32
        padded = 1 << (nblk - 1).bit_length()
        if padded <= max(limit, args.row_limit):  # fused in the row kernel's pass: a program
            fold.FUSED_ROW_FOLD_MAX_GROUP = max(limit, args.row_limit)  # per row, padded, on
            plans.clear()
            base = native.default_tuning(x.device)  # the default warps and on fixed ones
            for warps in [None] + args.fused_warps:
                tuning = base if warps is None else dataclasses.replace(
                    base, rows32=RowTile(padded, warps))
                name = "the default tile" if warps is None else f"warps {warps}"
                try:
                    fused = fold.quantize_folded(x, "e2m1", None, tuning=tuning, **kw)
                    same = all(torch.equal(getattr(fused, n), getattr(two, n))
                               for n in ("codes", "exponents", "scales", "stats", "pow2"))
                    cases.append((f"quantize_folded whole rows H16 fused ({nblk} blocks in "
                                  f"{padded}) {name}, bits equal: {same}",
                                  bench(lambda: fold.quantize_folded(x, "e2m1", None,
                                                                     tuning=tuning, **kw))))
                except Exception as e:  # noqa: BLE001 - a tile that does not compile
                    print("fused whole rows:", type(e).__name__, str(e)[:160], flush=True)
            fold.FUSED_ROW_FOLD_MAX_GROUP = limit
            plans.clear()
        for case, t in (*cases, ("quantize H16 (packed)", t_q),
                        ("quantize_folded whole rows H16 (quantize + fold)", t_two),
                        ("quantize_folded group 4 H16 (one pass)", t_fused)):
            rows.append(dict(shape=[m, k], case=case, ms=t,
                             of_copy=(2 * m * k) * 2 / t / 1e6 / copy_gbs))
        rows.append(dict(shape=[m, k], case="torch copy bf16", ms=t_copy, gbs=copy_gbs))
        for r in rows[-(4 + len(cases)):]:
            print(r, flush=True)
    head = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    with open(args.out + ".json", "w") as f:
        json.dump(dict(head=head, rows=rows), f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"# Whole-row fold tiles: {head}\n\n| M x K | case | ms | GB/s | of copy | bits |\n"
                "|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['shape'][0]}x{r['shape'][1]} | {r['case']} | {r.get('ms', '')} | "
                    f"{r.get('gbs', '')} | {r.get('of_copy', '')} | "
                    f"{r.get('same_bits', r.get('error', ''))} |\n")


if __name__ == "__main__":
    main()
