"""Tile, group and K-per-dot sweep of the chained folded GEMM (issue 17) on one GPU: every
configuration's time beside cuBLAS bf16 and FP8 ``_scaled_mm`` measured in the same run, and
whether its bits equal the autotuned kernel's for the same group (the tile and the K of one
``tl.dot`` must never change the bits).

    python benchmarks/fold_tile_sweep.py --out DIR    (writes DIR.md and DIR.json)
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
import triton
from triton.testing import do_bench

from ocpmx import native
from ocpmx.native import fold

SHAPES = ((8192, 6144, 4096), (8192, 4096, 14336))
TILES = ((128, 128, 8, 3), (128, 128, 8, 4), (128, 256, 8, 3), (256, 128, 8, 3))


def folded(fa, fb, kt, tile):
    return fold.folded_matmul(fa, fb, torch.bfloat16, k_per_dot=kt, promote=False, tile=tile)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--groups", default="4,8,16")
    ap.add_argument("--tiles", default=";".join(",".join(map(str, t)) for t in TILES),
                    help="BM,BN,warps,stages;...")
    ap.add_argument("--kts", default="128,256", help="K per tl.dot to try (<= 32 group)")
    args = ap.parse_args()
    tiles = [tuple(map(int, t.split(","))) for t in args.tiles.split(";")]
    rows = []
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        t_bf16 = do_bench(lambda: x @ w.T)
        x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        t_fp8 = do_bench(lambda: torch._scaled_mm(x8, w8.T, one, one, out_dtype=torch.bfloat16))
        flops = 2 * m * n * k
        rows.append(dict(shape=[m, n, k], case="cuBLAS bf16", ms=t_bf16, of_bf16=1.0,
                         tflops=flops / t_bf16 / 1e9))
        rows.append(dict(shape=[m, n, k], case="FP8 _scaled_mm", ms=t_fp8,
                         of_bf16=t_bf16 / t_fp8, tflops=flops / t_fp8 / 1e9))
        qa, qb = native.quantize(x, "e2m1"), native.quantize(w, "e2m1")
        for group in map(int, args.groups.split(",")):
            if (k // 32) % group:
                continue
            fa, fb = fold.fold(qa, group), fold.fold(qb, group)
            ref = fold.folded_matmul(fa, fb, torch.bfloat16, promote=False)
            for kt in [t for t in map(int, args.kts.split(",")) if (32 * group) % t == 0]:
                for bm, bn, warps, stages in tiles:
                    case = dict(shape=[m, n, k], case="folded chained", group=group, kt=kt,
                                tile=[bm, bn, warps, stages])
                    try:
                        tile = (bm, bn, warps, stages)
                        got = folded(fa, fb, kt, tile)
                        torch.cuda.synchronize()
                        t = do_bench(lambda: folded(fa, fb, kt, tile))
                        case.update(ms=t, of_bf16=t_bf16 / t, tflops=flops / t / 1e9,
                                    bits_equal_autotuned=bool(torch.equal(
                                        got.view(torch.int16), ref.view(torch.int16))))
                    except Exception as e:  # noqa: BLE001 - a tile that does not compile
                        case.update(error=f"{type(e).__name__}: {str(e)[:160]}")
                    rows.append(case)
                    print(json.dumps(case), flush=True)
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M"))
    json.dump(dict(env=env, rows=rows), open(args.out + ".json", "w"), indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"# Chained folded GEMM sweep: {env}\n\n"
                "| M x N x K | case | group | K per dot | tile (BM, BN, warps, stages) | ms | "
                "x cuBLAS bf16 | TFLOP/s | bits = autotuned |\n"
                "|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {'x'.join(map(str, r['shape']))} | {r['case']} | {r.get('group', '')} | "
                    f"{r.get('kt', '')} | {r.get('tile', '')} | "
                    + (f"{r['ms']:.4g} | {r['of_bf16']:.3f} | {r['tflops']:.0f} | "
                       f"{r.get('bits_equal_autotuned', '')} |\n" if "ms" in r
                       else f"{r['error']} | | | |\n"))
    assert math.isfinite(rows[0]["ms"])


if __name__ == "__main__":
    main()
