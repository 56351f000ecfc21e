"""Does cuBLAS's blockwise FP8 GEMM (``native.mx_matmul(method="fp8_cublas")``) sum as the
emulator's ``hopper_fp8_cublas`` model says at every shape a training run gives it? cuBLAS
picks its kernel per shape (split-K, stream-K, tile): each shape below (the Fprop, Dgrad and
Wgrad GEMMs of the 30m, 125m and 8B presets, and small ones) is compared bit for bit with the
Triton folded GEMM chained at groups of 4 blocks, itself bit for bit the model on an H100
(tests/test_fold.py); differing outputs and their distance in ulps are counted, and the cuBLAS
kernel that ran is named (torch.profiler).

    python benchmarks/fp8_cublas_model_check.py --out DIR   (writes DIR.md and DIR.json)
"""
from __future__ import annotations

import argparse
import json

import torch

from ocpmx import native
from ocpmx.conformance.suite import ulp_distance
from ocpmx.native import fold

TOKENS = 32 * 1024  # the small presets' step: 32 sequences of 1024
SHAPES = {  # (M, N, K) of A B^T
    "small": [(16, 16, 128), (16, 4096, 4096), (48, 32, 1024), (256, 256, 256)],
    "30m": [(TOKENS, 768, 512), (TOKENS, 1792, 512), (TOKENS, 512, 1792),   # Fprop
            (TOKENS, 512, 768), (TOKENS, 512, 3584),                       # Dgrad
            (768, 512, TOKENS), (3584, 512, TOKENS), (512, 1792, TOKENS)],  # Wgrad
    "125m": [(TOKENS, 1280, 768), (TOKENS, 768, 2048), (1280, 768, TOKENS),
             (4096, 768, TOKENS), (768, 2048, TOKENS)],
    "8b": [(8192, 6144, 4096), (8192, 28672, 4096), (8192, 4096, 14336),
           (6144, 4096, 8192), (28672, 4096, 8192), (4096, 14336, 8192)],
}


def kernel_name(fn) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if "fold" not in e.key and e.device_type ==
             torch.autograd.DeviceType.CUDA]
    return "; ".join(n[:90] for n in names)


def check(m, n, k, fmt, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def operand(rows):
        v = torch.randn(rows, k, device="cuda", generator=g)
        s = torch.randint(-8, 9, (rows, k // 32), device="cuda", generator=g).float()
        return native.quantize(v * torch.exp2(s).repeat_interleave(32, 1), fmt)
    qa, qb = operand(m), operand(n)
    got = native.mx_matmul(qa, qb, method="fp8_cublas")
    want = fold.folded_matmul(fold.fold(qa, 4), fold.fold(qb, 4), promote=False)
    d = ulp_distance(got.cpu().numpy(), want.cpu().numpy())
    return dict(shape=[m, n, k], fmt=fmt, outputs=int(d.size), differ=int((d != 0).sum()),
                max_ulp=int(d.max()), kernel=kernel_name(
                    lambda: native.mx_matmul(qa, qb, method="fp8_cublas")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for preset, shapes in SHAPES.items():
        for i, (m, n, k) in enumerate(shapes):
            for fmt in (("e2m1", "e3m2") if preset == "small" else ("e2m1",)):
                r = dict(preset=preset, **check(m, n, k, fmt, seed=i))
                rows.append(r)
                print(r, flush=True)
                torch.cuda.empty_cache()
    bad = sum(r["differ"] for r in rows)
    lines = [f"# fp8_cublas against the hopper_fp8_cublas model, {torch.cuda.get_device_name()}",
             "", f"torch {torch.__version__}, CUDA {torch.version.cuda}; operands: normal "
             "values, block scales 2^-8..2^8; reference: the Triton folded GEMM chained at "
             "groups of 4 blocks (bit for bit the model on an H100).", "",
             f"**{bad} differing outputs in {sum(r['outputs'] for r in rows)}.**", "",
             "| preset | M, N, K | format | outputs differing | max ulp | cuBLAS kernel |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['preset']} | {r['shape']} | {r['fmt']} | {r['differ']} of {r['outputs']} | "
              f"{r['max_ulp']} | `{r['kernel']}` |" for r in rows]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
