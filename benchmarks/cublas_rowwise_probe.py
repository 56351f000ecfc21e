"""cuBLAS's FP8 GEMM with ROWWISE scales (``torch._scaled_mm``, scale_a (M, 1), scale_b (1, N))
on operands folded one exponent per whole row (issue 17): its speed beside cuBLAS bf16,
per-tensor FP8 and blockwise 1 x 128 at Llama-8B shapes, and its sums saved for the
emulator's models (``benchmarks/cublas_rowwise_fit.py`` compares them on a CPU).

A row folded whole (``emulator.fold.fold(mx, None)``) is E4M3 codes with one power-of-two
scale 2^R per row: exactly cuBLAS's rowwise FP8 operand. Timing and bits alike take E4M3 codes
drawn at random (every finite code; or E2M1 values shifted by a random d in [-8, 6] per block,
what a whole-row fold of MXFP4 holds); the accumulation does not depend on where they came
from.

    python benchmarks/cublas_rowwise_probe.py --out DIR [--sections speed bits]
        (writes DIR.md, DIR.json and, for the bits, DIR_s<i>.npz per shape)
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import triton
from triton.testing import do_bench

SPEED_SHAPES = ((8192, 14336, 4096), (8192, 4096, 14336), (14336, 4096, 8192),
                (8192, 4096, 4096), (8192, 6144, 4096))
BITS_SHAPES = ((16, 16, 128), (64, 64, 1024), (256, 256, 4096), (128, 128, 14336),
               (8192, 4096, 14336), (14336, 4096, 8192))
CORNER = 128  # rows and columns of a large output kept for the fit


def e4m3_codes(rows, k, kind, g):
    """uint8 E4M3 codes (rows, k), finite: 'any' every finite code alike; 'e2m1' E2M1 values
    times 2^d, d in [-8, 6] drawn per 32-block (exact E4M3 values)."""
    if kind == "any":
        c = torch.randint(0, 256, (rows, k), device="cuda", generator=g, dtype=torch.int32)
        c = torch.where((c & 0x7F) == 0x7F, c - 1, c)  # no NaN
        return c.to(torch.uint8)
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], device="cuda")
    idx = torch.randint(0, 8, (rows, k), device="cuda", generator=g)
    sign = torch.randint(0, 2, (rows, k), device="cuda", generator=g) * 2 - 1
    d = torch.randint(-8, 7, (rows, k // 32), device="cuda", generator=g).float()
    v = e2m1[idx] * sign * torch.exp2(d).repeat_interleave(32, 1)
    return v.to(torch.float8_e4m3fn).view(torch.uint8)


def rowwise(a8, b8, sa, sb, out_dtype=torch.bfloat16, fast=False):
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype,
                            use_fast_accum=fast)


def kernel_names(fn) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return "; ".join(e.key[:100] for e in prof.key_averages()
                     if e.device_type == torch.autograd.DeviceType.CUDA)


def speed(rows):
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, n, k in SPEED_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a8 = e4m3_codes(m, k, "e2m1", g).view(torch.float8_e4m3fn)
        b8 = e4m3_codes(n, k, "e2m1", g).view(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        sa = torch.exp2(torch.randint(-4, 5, (m, 1), device="cuda", generator=g).float())
        sb = torch.exp2(torch.randint(-4, 5, (1, n), device="cuda", generator=g).float())
        ba = torch.exp2(torch.randint(-4, 5, (k // 128, m), device="cuda", generator=g)
                        .float()).t()
        bb = torch.exp2(torch.randint(-4, 5, (k // 128, n), device="cuda", generator=g).float())
        cases = {
            "cuBLAS bf16": lambda: a @ b.T,
            "FP8 per-tensor": lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                       out_dtype=torch.bfloat16),
            "FP8 rowwise": lambda: rowwise(a8, b8, sa, sb),
            "FP8 rowwise fast_accum": lambda: rowwise(a8, b8, sa, sb, fast=True),
            "FP8 blockwise 1x128": lambda: torch._scaled_mm(a8, b8.t(), scale_a=ba,
                                                            scale_b=bb,
                                                            out_dtype=torch.bfloat16),
        }
        base = None
        for name, fn in cases.items():
            row = dict(shape=[m, n, k], case=name)
            try:
                fn()
                torch.cuda.synchronize()
                ms = do_bench(fn, warmup=50, rep=200, return_mode="median")
                base = base or ms
                row.update(ms=ms, of_bf16=base / ms, tflops=2 * m * n * k / ms / 1e9,
                           kernel=kernel_names(fn))
            except Exception as e:  # noqa: BLE001 - a refused configuration is a result
                row.update(error=f"{type(e).__name__}: {str(e)[:200]}")
            print(row, flush=True)
            rows.append(row)


def bits(rows, arrays):
    g = torch.Generator(device="cuda").manual_seed(1)
    for i, (m, n, k) in enumerate(BITS_SHAPES):
        for kind in ("any", "e2m1"):
            a = e4m3_codes(m, k, kind, g)
            b = e4m3_codes(n, k, kind, g)
            ra = torch.randint(-20, 21, (m, 1), device="cuda", generator=g)
            rb = torch.randint(-20, 21, (1, n), device="cuda", generator=g)
            sa, sb = torch.exp2(ra.float()), torch.exp2(rb.float())
            a8, b8 = a.view(torch.float8_e4m3fn), b.view(torch.float8_e4m3fn)
            cm, cn = min(m, CORNER), min(n, CORNER)
            tag = f"s{i}_{kind}"
            arrays[f"{tag}_a"] = a[:cm].cpu().numpy()
            arrays[f"{tag}_b"] = b[:cn].cpu().numpy()
            arrays[f"{tag}_ra"] = ra[:cm, 0].cpu().numpy()
            arrays[f"{tag}_rb"] = rb[0, :cn].cpu().numpy()
            for out_name, dt, fast in (("bf16", torch.bfloat16, False),
                                       ("f32", torch.float32, False),
                                       ("bf16_fast", torch.bfloat16, True)):
                row = dict(shape=[m, n, k], operands=kind, out=out_name, tag=tag)
                try:
                    out = rowwise(a8, b8, sa, sb, dt, fast)
                    first = rowwise(a8, b8, sa, sb, dt, fast)
                    torch.cuda.synchronize()
                    row["repeatable"] = bool(torch.equal(out.view(torch.int16 if dt ==
                                             torch.bfloat16 else torch.int32),
                                             first.view(torch.int16 if dt == torch.bfloat16
                                                        else torch.int32)))
                    arrays[f"{tag}_out_{out_name}"] = out[:cm, :cn].float().cpu().numpy()
                    row["kernel"] = kernel_names(lambda: rowwise(a8, b8, sa, sb, dt, fast))
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                print(row, flush=True)
                rows.append(row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--sections", nargs="+", default=["speed", "bits"],
                    choices=["speed", "bits"])
    args = ap.parse_args()
    head = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, cuda=torch.version.cuda,
                date=time.strftime("%Y-%m-%d %H:%M"))
    speed_rows, bit_rows, arrays = [], [], {}
    if "speed" in args.sections:
        speed(speed_rows)
    if "bits" in args.sections:
        bits(bit_rows, arrays)
    for i in range(len(BITS_SHAPES)):  # one file per shape (a returned file's size limit)
        np.savez_compressed(f"{args.out}_s{i}.npz",
                            **{t: v for t, v in arrays.items() if t.startswith(f"s{i}_")})
    with open(args.out + ".json", "w") as f:
        json.dump(dict(head=head, speed=speed_rows, bits=bit_rows), f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(f"# torch._scaled_mm FP8 with rowwise scales: {head}\n\n")
        f.write("| M x N x K | case | ms | x cuBLAS bf16 | TFLOP/s | kernel / error |\n")
        f.write("|---|---|---|---|---|---|\n")
        for r in speed_rows:
            f.write(f"| {'x'.join(map(str, r['shape']))} | {r['case']} | {r.get('ms', '')} | "
                    f"{r.get('of_bf16', '')} | {r.get('tflops', '')} | "
                    f"{r.get('kernel', r.get('error', ''))} |\n")
        f.write("\n| M x N x K | operands | out | repeatable | kernel / error |\n")
        f.write("|---|---|---|---|---|\n")
        for r in bit_rows:
            f.write(f"| {'x'.join(map(str, r['shape']))} | {r['operands']} | {r['out']} | "
                    f"{r.get('repeatable', '')} | {r.get('kernel', r.get('error', ''))} |\n")


if __name__ == "__main__":
    main()
