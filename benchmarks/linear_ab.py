"""MXLinear forward + backward against ``nn.Linear`` bf16, by default at Llama-8B shapes (8192
tokens, 4096 -> 14336), timed in interleaved rounds (every module once per round, ROUNDS rounds,
the median ratio reported with its spread), eager and replayed from a CUDA graph (GPU time
without the host's), on one GPU: what ``gpu_bench.py --sections linear`` measures once.
``--shapes TOKENSxINxOUT ...``: several shapes one after another (where a GEMM method starts to
pay for its passes: ``native.gemm.HOPPER_AUTO``).

    python benchmarks/linear_ab.py --out DIR [--cases RECIPE:METHOD ...] [--shapes T x I x O ...]
    (DIR.md, DIR.json)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from triton.testing import do_bench

from ocpmx import native

TOKENS, D_IN, D_OUT = 8192, 4096, 14336
REF = "nn.Linear bf16"


def measure(tokens: int, d_in: int, d_out: int, cases: list[str], rounds: int):
    """Rows (one per module: ms per round, eager and graphed, ratios against nn.Linear's in the
    same round, host ms a step) and the modules whose step could not be captured."""
    x = torch.randn(tokens, d_in, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(tokens, d_out, device="cuda", dtype=torch.bfloat16)
    mods = {REF: torch.nn.Linear(d_in, d_out, bias=False, device="cuda", dtype=torch.bfloat16)}
    for c in cases:
        recipe, _, method = c.partition(":")
        mods[f"{recipe} method={method}"] = native.MXLinear(d_in, d_out, bias=False,
                                                            recipe=recipe, device="cuda",
                                                            method=method)

    def step(mod):
        x.grad = None
        for p in mod.parameters():
            p.grad = None
        mod(x).backward(gy)

    graphs, errors = {}, {}
    for name, mod in mods.items():
        for _ in range(3):
            step(mod)
        torch.cuda.synchronize()
        try:  # the step captured once, replayed
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step(mod)
            torch.cuda.current_stream().wait_stream(s)
            x.grad = None
            for p in mod.parameters():
                p.grad = None
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                mod(x).backward(gy)
            graphs[name] = g
        except Exception as e:  # noqa: BLE001 - a step that cannot be captured is a result
            errors[name] = f"{type(e).__name__}: {str(e)[:200]}"
    eager = {n: [] for n in mods}
    graphed = {n: [] for n in graphs}
    host = {n: [] for n in mods}
    for _ in range(rounds):
        for name, mod in mods.items():
            eager[name].append(do_bench(lambda: step(mod), warmup=10, rep=50,
                                        return_mode="median"))
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(5):
                step(mod)
            host[name].append((time.perf_counter() - t0) / 5 * 1e3)  # ms a step of host time
            torch.cuda.synchronize()
            if name in graphs:
                graphed[name].append(do_bench(graphs[name].replay, warmup=10, rep=50,
                                              return_mode="median"))
    rows = []
    for name in mods:
        row = dict(shape=[tokens, d_in, d_out], case=name, eager_ms=eager[name],
                   host_ms=host[name])
        row["eager_ratio"] = [a / b for a, b in zip(eager[REF], eager[name])]
        if name in graphed and REF in graphed:
            row["graphed_ms"] = graphed[name]
            row["graphed_ratio"] = [a / b for a, b in zip(graphed[REF], graphed[name])]
        if name in errors:
            row["graph_error"] = errors[name]
        rows.append(row)
        print(row, flush=True)
    del graphs, mods
    torch.cuda.empty_cache()
    return rows, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cases", nargs="+", default=[
        "mxfp4_all_h16:fp8_cublas_rowwise", "mxfp4_all:fp8_cublas_rowwise",
        "mxfp4_all_h16:fp8_cublas"])
    ap.add_argument("--shapes", nargs="+", default=[f"{TOKENS}x{D_IN}x{D_OUT}"],
                    help="TOKENSxINxOUT, e.g. 32768x768x2048 (125m's FFN up)")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    rows, errors = [], {}
    for t, i, o in shapes:
        r, e = measure(t, i, o, args.cases, args.rounds)
        rows += r
        errors.update({f"{t}x{i}x{o} {n}": v for n, v in e.items()})
    head = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                rounds=args.rounds, shapes=[list(s) for s in shapes])
    with open(args.out + ".json", "w") as f:
        json.dump(dict(head=head, rows=rows), f, indent=1)

    def med(v):
        return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else ""
    with open(args.out + ".md", "w") as f:
        f.write(f"# MXLinear fwd+bwd vs nn.Linear, interleaved rounds: {head}\n\n"
                "median (min-max) over rounds; ratio = nn.Linear's ms / the case's, per round\n\n"
                "| tokens x in x out | case | eager ms | x nn.Linear eager | CUDA graph ms "
                "| x nn.Linear graphed | host ms a step |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {'x'.join(map(str, r['shape']))} | {r['case']} | {med(r['eager_ms'])} | "
                    f"{med(r['eager_ratio'])} | {med(r.get('graphed_ms', []))} | "
                    f"{med(r.get('graphed_ratio', []))} | {med(r['host_ms'])} |\n")
        for n, e in errors.items():
            f.write(f"\n- {n}: not captured: {e}\n")


if __name__ == "__main__":
    main()
