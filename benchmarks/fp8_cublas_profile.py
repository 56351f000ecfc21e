"""Where ``native.mx_matmul(method="fp8_cublas")``'s time goes (issue 17): each stage timed
alone (both folds, the blockwise scales, ``torch._scaled_mm``) beside the whole call and cuBLAS
bf16, and the whole call's kernels under ``torch.profiler`` (one GPU, one run).

    python benchmarks/fp8_cublas_profile.py --out DIR   (writes DIR.md and DIR.json)
"""
from __future__ import annotations

import argparse
import json

import torch
from triton.testing import do_bench

from ocpmx import native
from ocpmx.native import fold

SHAPES = ((8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336))


def stage_times(m, n, k) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g)
    qa, qb = native.quantize(x, "e2m1"), native.quantize(w, "e2m1")
    fa, fb = fold.fold(qa, 4), fold.fold(qb, 4)
    s_a, s_b = fold.blockwise_scales(fa, fb)
    a8, b8 = fa.codes.view(torch.float8_e4m3fn), fb.codes.view(torch.float8_e4m3fn)
    xb, wb = x.bfloat16(), w.bfloat16()
    t = {"cuBLAS bf16": do_bench(lambda: xb @ wb.T),
         "fold A (group 4)": do_bench(lambda: fold.fold(qa, 4)),
         "fold B (group 4)": do_bench(lambda: fold.fold(qb, 4)),
         "fold A (group 4, writing cuBLAS's scales)": do_bench(
             lambda: fold.fold_kmajor(qa.data, qa.scales_kmajor, k, qa.fmt, 4, pow2=True)),
         "group_scales A": do_bench(lambda: fold.group_scales(fa)),
         "blockwise_scales (A and B)": do_bench(lambda: fold.blockwise_scales(fa, fb)),
         "_scaled_mm (scales made once)": do_bench(
             lambda: torch._scaled_mm(a8, b8.t(), scale_a=s_a, scale_b=s_b,
                                      out_dtype=torch.bfloat16)),
         "_scaled_mm (scales made each call)": do_bench(
             lambda: torch._scaled_mm(a8, b8.t(), *fold.blockwise_scales(fa, fb),
                                      out_dtype=torch.bfloat16)),
         "mx_matmul fp8_cublas (whole)": do_bench(
             lambda: native.mx_matmul(qa, qb, out_dtype=torch.bfloat16, method="fp8_cublas"))}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            native.mx_matmul(qa, qb, out_dtype=torch.bfloat16, method="fp8_cublas")
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)
    return {"shape": [m, n, k], "ms": t, "profile": table}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = [stage_times(*s) for s in SHAPES]
    lines = [f"# fp8_cublas stages, {torch.cuda.get_device_name()}, torch {torch.__version__}",
             "", "ms per call (triton.testing.do_bench), ratio = cuBLAS bf16 time / this", ""]
    for r in rows:
        bf16 = r["ms"]["cuBLAS bf16"]
        lines += [f"## M, N, K = {r['shape']}", "", "| stage | ms | × bf16 |", "|---|---|---|"]
        lines += [f"| {k} | {v:.4f} | {bf16 / v:.2f} |" for k, v in r["ms"].items()]
        lines += ["", "Profile of 5 whole calls:", "", "```", r["profile"], "```", ""]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines))
    with open(args.out + ".json", "w") as f:
        json.dump([{k: v for k, v in r.items() if k != "profile"} for r in rows], f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
