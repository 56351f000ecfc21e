"""Host time of the fold paths (issue 17): per ``quantize_folded`` call (groups of 4 and whole
rows, along rows and along tokens) and per MXLinear forward + backward per GEMM method, at
shapes small enough that the GPU waits on the host (K = 2048: whole rows are quantize + the
two-launch row fold; and Llama-8B's 4096 -> 4096 layer, where GPU and host take about as long),
each with the whole-row fold's launch plan (``plans.RowFoldPlan``) and
without it (its ``run_row_fold`` and ``make_row_fold`` stubbed, as before the plan); then the
Python functions that take the host's time (cProfile) for the whole-row path.

    python benchmarks/fold_host.py --out DIR   (writes DIR.md; needs a GPU)

The MXLinear rowwise step is profiled twice: by own time and by cumulative time (the call tree).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from ocpmx import native
from ocpmx.native import fold, plans

CALLS = 300


def per_call(fn, calls: int = CALLS) -> float:
    """Host µs a call: ``calls`` calls queued without a sync (the GPU work is far shorter)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host / calls * 1e6


def profile(fn, calls: int = 100, top: int = 30, sort: str = "tottime") -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(sort).print_stats(top)
    return s.getvalue()


def cases():
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    out = {}
    for group in (4, None):
        for axis in (-1, 0):
            out[f"quantize_folded group={group} axis={axis} H16 pow2"] = (
                lambda g=group, a=axis: fold.quantize_folded(x, "e2m1", g, axis=a,
                                                             rotation="hadamard16", pow2=True))
    mx = native.quantize(x, "e2m1")
    out["quantize e2m1 (plain)"] = lambda: native.quantize(x, "e2m1")
    out["fold(mx, None) (stored codes, whole rows)"] = lambda: fold.fold(mx, None)
    out["fold(mx, 4) (stored codes)"] = lambda: fold.fold(mx, 4)
    xin = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for method in ("bf16", "fp8_cublas", "fp8_cublas_rowwise"):
        lin = native.MXLinear(2048, 2048, bias=False, recipe="mxfp4_all_h16", method=method,
                              device="cuda", dtype=torch.bfloat16)

        def step(lin=lin):
            lin(xin).float().sum().backward()
        out[f"MXLinear 2048 -> 2048, 2048 tokens, fwd + bwd, mxfp4_all_h16, {method}"] = step
    # Llama-8B's 4096 -> 4096 projections at 8192 tokens: along tokens the operands are 256
    # blocks long (the column kernel, then the fold of its codes). Its GPU time a step (about
    # 1.3 ms under 'bf16', 0.9 ms rowwise) is close to the host's: a row of these can read the
    # GPU's time, not the host's (the cProfile is the host's either way)
    x8 = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for method in ("bf16", "fp8_cublas_rowwise"):
        lin = native.MXLinear(4096, 4096, bias=False, recipe="mxfp4_all_h16", method=method,
                              device="cuda", dtype=torch.bfloat16)

        def step8(lin=lin):
            lin(x8).float().sum().backward()
        out[f"MXLinear 4096 -> 4096, 8192 tokens, fwd + bwd, mxfp4_all_h16, {method}"] = step8
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/fold_host")
    args = p.parse_args()
    lines = [f"# Host time of the fold paths: {torch.cuda.get_device_name()}", "",
             f"torch {torch.__version__}; host µs a call, {CALLS} calls (MXLinear: 100) queued "
             "without a sync; 'no row plan': the whole-row fold's launches through "
             "``launch.run`` each call", "", "| call | host µs, no row plan | with it |",
             "|---|---|---|"]
    todo = cases()
    real = plans.run_row_fold, plans.make_row_fold
    times = {}
    for planned in (False, True):
        plans.clear()
        plans.run_row_fold, plans.make_row_fold = (real if planned else
                                                   (lambda *a: False, lambda *a: None))
        for name, fn in todo.items():
            times.setdefault(name, []).append(per_call(fn, 100 if "MXLinear" in name else CALLS))
            print(name, planned, f"{times[name][-1]:.1f}", flush=True)
    for name, (off, on) in times.items():
        lines.append(f"| {name} | {off:.1f} | {on:.1f} |")
    rowwise, rowwise8 = [fn for name, fn in todo.items() if name.endswith("fp8_cublas_rowwise")]
    lines += ["", "## cProfile: quantize_folded group=None axis=-1 (with the row plan)", "",
              "```", profile(todo["quantize_folded group=None axis=-1 H16 pow2"]), "```", "",
              "## cProfile: MXLinear fp8_cublas_rowwise step (with the row plan)", "", "```",
              profile(rowwise, 50, 40), "```", "",
              "## cProfile: the same, by cumulative time", "", "```",
              profile(rowwise, 50, 60, "cumulative"), "```", "",
              "## cProfile: MXLinear 4096 -> 4096, 8192 tokens, fp8_cublas_rowwise, by own time",
              "", "```", profile(rowwise8, 20, 40), "```"]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
