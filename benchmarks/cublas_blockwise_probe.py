"""Which scale layout ``torch._scaled_mm`` takes for FP8 blockwise 1 x 128 scaling of folded MX
operands (issue 17, ``method="fp8_cublas"``), how its sums compare with the emulator's folded
models, and its speed beside cuBLAS bf16 (one GPU, one run).

Folded at groups of 4 blocks, an MXFP4 operand is E4M3 codes with one power-of-two exponent per
1 x 128 block: exactly cuBLAS's blockwise 1 x 128 FP8 operand, scales 2^R in float32. The
script tries the candidate scale layouts, keeps those whose result equals the exact product
within 1e-2 relative (a wrong layout scrambles the scales: errors of order 1), then counts the
outputs whose bits equal each emulator model (cuBLAS's accumulation is not documented).

    python benchmarks/cublas_blockwise_probe.py --out DIR   (writes DIR.md and DIR.json)
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import triton
from triton.testing import do_bench

from ocpmx import emulator, native
from ocpmx.emulator.fold import FoldedModel
from ocpmx.native import fold

SHAPES = ((512, 512, 1024), (8192, 6144, 4096), (8192, 4096, 14336))


def layouts(sa, sb):
    """Candidate (scale_a, scale_b) pairs: a (M, K/128) outer-dim-major, b as (N, K/128) or
    (K/128, N), each contiguous or outer-dim-major."""
    a_om = sa.t().contiguous().t()
    return {"b (N,K/128) outer-major": (a_om, sb.t().contiguous().t()),
            "b (N,K/128) contiguous": (a_om, sb.contiguous()),
            "b (K/128,N) contiguous": (a_om, sb.t().contiguous()),
            "b (K/128,N) view of (N,K/128)": (a_om, sb.t())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    for m, n, k in SHAPES:
        rng = np.random.default_rng(0)
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda()
        w = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).cuda()
        qa, qb = native.quantize(x, "e2m1"), native.quantize(w, "e2m1")
        fa, fb = fold.fold(qa, 4), fold.fold(qb, 4)
        a8 = fa.codes.view(torch.float8_e4m3fn)
        b8 = fb.codes.view(torch.float8_e4m3fn)
        sa, sb = fold.group_scales(fa), fold.group_scales(fb)
        exact = (native.dequantize(qa).double() @ native.dequantize(qb).double().T)
        small = m * n * k <= 2**28
        if small:
            ea, eb = qa.to_emulator(), qb.to_emulator()
            models = {"exact": emulator.mx_matmul(ea, eb, "exact"),
                      "fp32_sequential": emulator.mx_matmul(ea, eb, "fp32_sequential"),
                      "hopper_fp8_exact": emulator.mx_matmul(ea, eb, "hopper_fp8_exact"),
                      "chained group 4": emulator.mx_matmul(ea, eb, FoldedModel(4, True))}
        xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
        t_bf16 = do_bench(lambda: xb @ wb.T)
        flops = 2 * m * n * k
        for name, (s_a, s_b) in layouts(sa, sb).items():
            row = dict(shape=[m, n, k], layout=name)
            try:
                out = torch._scaled_mm(a8, b8.t(), scale_a=s_a, scale_b=s_b,
                                       out_dtype=torch.float32)
                torch.cuda.synchronize()
                rel = ((out.double() - exact).abs().max() / exact.abs().max()).item()
                row.update(max_rel_err=rel, ok=rel < 1e-2)
                if row["ok"]:
                    t = do_bench(lambda: torch._scaled_mm(a8, b8.t(), scale_a=s_a, scale_b=s_b,
                                                          out_dtype=torch.bfloat16))
                    row.update(ms=t, of_bf16=t_bf16 / t, tflops=flops / t / 1e9,
                               bf16_ms=t_bf16)
                    if small:
                        got = out.cpu().numpy().view(np.uint32)
                        row["bits_equal"] = {mn: int((got == v.view(np.uint32)).sum())
                                             for mn, v in models.items()}
                        row["outputs"] = int(got.size)
            except Exception as e:  # noqa: BLE001 - a layout cuBLAS refuses
                row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__, cuda=torch.version.cuda,
               date=time.strftime("%Y-%m-%d %H:%M"))
    json.dump(dict(env=env, rows=rows), open(args.out + ".json", "w"), indent=1)
    write_markdown(args.out + ".md", env, rows)


def write_markdown(path, env, rows):
    with open(path, "w") as f:
        f.write(f"# torch._scaled_mm blockwise 1 x 128 on folded MXFP4 (group 4): {env}\n\n"
                "| M x N x K | scale layout | max rel err | x cuBLAS bf16 | TFLOP/s | "
                "outputs bit-equal to each model | error |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            err = " ".join(r.get("error", "").split())[:120]
            f.write(f"| {'x'.join(map(str, r['shape']))} | {r['layout']} | "
                    f"{r.get('max_rel_err', '')} | {r.get('of_bf16', '')} | "
                    f"{r.get('tflops', '')} | {r.get('bits_equal', '')} of "
                    f"{r.get('outputs', '')} | {err} |\n")


if __name__ == "__main__":
    main()
