"""Where an MXLinear forward + backward spends its GPU time: the kernels of one step at Llama-8B
shapes (8192 tokens, 4096 -> 14336, bf16), per recipe and GEMM method, from the PyTorch
profiler (device time per kernel name, summed over the profiled steps, divided by the steps),
beside ``nn.Linear`` bf16 profiled the same way. What the GEMMs take and what the quantize and
fold passes take, so that a speed target's bound can be read off (the GEMMs alone against
``nn.Linear``'s). GPU only.

  python benchmarks/mxlinear_kernels.py --out DIR [--cases RECIPE:METHOD ...] [--steps N]

Writes DIR/mxlinear_kernels.md and .json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench as gb  # noqa: E402
from ocpmx import native  # noqa: E402

T, D_IN, D_OUT = gb.TOKENS, 4096, 14336
GEMM_NAMES = ("gemm", "nvjet", "sm90_xmma", "cutlass", "matmul", "_scaled_mm")


def kind(name: str) -> str:
    """'gemm' for a GEMM kernel's name, else 'pass'."""
    low = name.lower()
    return "gemm" if any(g in low for g in GEMM_NAMES) else "pass"


def profile(mod, x, gy, steps: int) -> list[dict]:
    def step():
        x.grad = None
        for p in mod.parameters():
            p.grad = None
        mod(x).backward(gy)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    out = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        r = out.setdefault(e.name, dict(kernel=e.name, calls=0, us=0.0))
        r["calls"] += 1
        r["us"] += e.device_time
    rows = sorted(out.values(), key=lambda r: -r["us"])
    for r in rows:
        r["calls"] /= steps
        r["us"] /= steps
        r["kind"] = kind(r["kernel"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", nargs="+", default=[
        "mxfp4_all:fp8_cublas", "mxfp4_all_h16:fp8_cublas", "mxfp4_all:bf16",
        "mxfp4_wgrad_h16:fp8_cublas", "mxfp4_all_h16:fp8_cublas_rowwise"])
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    cases = []
    for c in args.cases:
        recipe, _, method = c.partition(":")
        if recipe not in native.RECIPES or not method:
            ap.error(f"--cases {c!r}: RECIPE:METHOD with a recipe of {sorted(native.RECIPES)}")
        cases.append((recipe, method))
    os.makedirs(args.out, exist_ok=True)
    x = torch.randn(T, D_IN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(T, D_OUT, device="cuda", dtype=torch.bfloat16)
    mods = [("nn.Linear bf16", torch.nn.Linear(D_IN, D_OUT, bias=False, device="cuda",
                                                 dtype=torch.bfloat16))]
    mods += [(f"{r} method={m}", native.MXLinear(D_IN, D_OUT, bias=False, recipe=r,
                                                  device="cuda", method=m)) for r, m in cases]
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                  triton=triton.__version__, shape=[T, D_IN, D_OUT], steps=args.steps,
                  cases={})
    md = [f"# MXLinear forward + backward, kernels per step ({T} tokens, {D_IN} -> {D_OUT})",
          "", f"- device: `{result['device']}`; torch `{result['torch']}`, triton "
          f"`{result['triton']}`", f"- command: `python benchmarks/mxlinear_kernels.py "
          f"{' '.join(sys.argv[1:])}`", ""]
    for name, mod in mods:
        rows = profile(mod, x, gy, args.steps)
        gemm = sum(r["us"] for r in rows if r["kind"] == "gemm")
        passes = sum(r["us"] for r in rows if r["kind"] == "pass")
        result["cases"][name] = dict(gemm_us=gemm, pass_us=passes, kernels=rows)
        head = (f"## {name}: GEMMs {gemm / 1e3:.3f} ms, other kernels {passes / 1e3:.3f} ms, "
                f"sum {(gemm + passes) / 1e3:.3f} ms")
        print(head, flush=True)
        md += [head, "", "| kernel | kind | calls | us |", "|---|---|---|---|"]
        md += [f"| `{r['kernel'][:90]}` | {r['kind']} | {r['calls']:g} | {r['us']:.1f} |"
               for r in rows]
        md.append("")
    with open(os.path.join(args.out, "mxlinear_kernels.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "mxlinear_kernels.md"), "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
