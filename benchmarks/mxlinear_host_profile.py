"""Host time of MXLinear training steps per GEMM method (issue 17/18): a stack of MXLinear
layers (the 30m preset's MLP widths, 32 x 1024 tokens) forward and backward, eager and under
torch.compile, per method: wall time per step, GPU busy time, and the host operations that
take the most CPU time (torch.profiler), to find where a method's steps wait on the host.

    python benchmarks/mxlinear_host_profile.py --out DIR   (writes DIR.md and DIR.json)
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from ocpmx import native

TOKENS, DIM, FFN, LAYERS = 32 * 1024, 512, 1792, 4


def model(recipe, method):
    layers = []
    for i in range(LAYERS):
        layers += [native.MXLinear(DIM, FFN, bias=False, recipe=recipe, method=method,
                                   layer_id=2 * i, device="cuda"),
                   native.MXLinear(FFN, DIM, bias=False, recipe=recipe, method=method,
                                   layer_id=2 * i + 1, device="cuda")]
    return torch.nn.Sequential(*layers)


def run(recipe, method, compiled):
    torch.manual_seed(0)
    net = model(recipe, method)
    fn = torch.compile(net) if compiled else net
    x = torch.randn(TOKENS, DIM, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def step():
        for p in net.parameters():
            p.grad = None
        fn(x).float().square().mean().backward()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(10):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        step()
        torch.cuda.synchronize()
    ev = prof.key_averages()
    gpu_ms = sum(e.self_device_time_total for e in ev) / 1e3
    top = sorted(ev, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return dict(recipe=recipe, method=method, mode="compiled" if compiled else "eager",
                wall_ms=sorted(walls)[len(walls) // 2] * 1e3, gpu_ms=gpu_ms,
                top_cpu=[dict(name=e.key[:80], self_cpu_ms=e.self_cpu_time_total / 1e3,
                              calls=e.count) for e in top])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--methods", nargs="+", default=["bf16", "fp8_cublas"])
    ap.add_argument("--recipes", nargs="+", default=["mxfp4_all"])
    args = ap.parse_args()
    rows = []
    for recipe in ["bf16"] + args.recipes:
        for method in (["auto"] if recipe == "bf16" else args.methods):
            for compiled in (False, True):
                r = run(recipe, method, compiled)
                rows.append(r)
                print(json.dumps(r)[:600], flush=True)
    lines = [f"# MXLinear host time per GEMM method, {torch.cuda.get_device_name()}", "",
             f"{LAYERS} x (MXLinear {DIM}->{FFN}, {FFN}->{DIM}), {TOKENS} tokens, forward + "
             "backward; median of 10 steps; GPU: kernel time in one profiled step", "",
             "| recipe | method | mode | step ms | GPU ms | GPU / step |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['recipe']} | {r['method']} | {r['mode']} | {r['wall_ms']:.1f} | "
              f"{r['gpu_ms']:.1f} | {r['gpu_ms'] / r['wall_ms']:.2f} |" for r in rows]
    for r in rows:
        lines += ["", f"## {r['recipe']} {r['method']} {r['mode']}: top host operations", "",
                  "| operation | self CPU ms | calls |", "|---|---|---|"]
        lines += [f"| `{t['name']}` | {t['self_cpu_ms']:.2f} | {t['calls']} |" for t in r["top_cpu"]]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
