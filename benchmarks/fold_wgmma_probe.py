"""Issue 17: the Gluon folded FP8 GEMM (``native.fold.folded_matmul_wgmma``, kernel
``native.kernels.fold_wgmma``) against the library's Triton kernel (``folded_matmul``, the same
sums) on an H100/H200: bits and speed at Llama-8B's shapes (8192 tokens), beside cuBLAS bf16 and
cuBLAS FP8 per tensor, in one process per configuration (a kernel fault loses one line).

  python benchmarks/fold_wgmma_probe.py [--shapes KxN ...] [--configs method,BN,STAGES ...]

method: ``exact`` (group 4, every K = 32 promoted: method fp8_exact) or ``chained`` (group 32,
the group's wgmmas chained: method fp8); a fourth field (exact only): ``lookahead`` (wgmmas per
column half, each in flight while the partial before it is added), ``quarters`` (per column
quarter, two in flight) or ``plain`` (one wgmma per K = 32 slice, waited for at once); without
it, ``native.fold.WGMMA_LOOKAHEAD`` decides.
Bits: float32 and bf16 outputs on three operand sets
(normal; rows scaled by 2^[-20, 20]; a wide operand, 2^60, which the Triton kernel's general
epilogue computes), compared as integers. Times: ``triton.testing.do_bench`` medians, the GEMM
alone (operands folded beforehand), TFLOP/s and the ratio to cuBLAS bf16 in the same process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

TOKENS = 8192
SHAPES = ["4096x4096", "4096x14336", "14336x4096", "4096x6144"]  # K (in) x N (out)
CONFIGS = ["exact,128,4,plain", "exact,128,4,lookahead", "chained,128,4"]
GROUPS = {"exact": (4, True), "chained": (32, False)}
# a config's fourth field: folded_matmul_wgmma's lookahead (fold_wgmma_stress.py takes it too)
LOOKAHEADS = {"plain": 0, "lookahead": 1, "quarters": 2}


def dims(count: int):
    """An argparse type: ``count`` positive integers joined by 'x' (a bad one: a one-line
    usage error, exit status 2), kept as the text (fold_wgmma_stress.py, fold_wgmma_host.py
    take it too)."""
    def parse(text: str) -> str:
        parts = text.split("x")
        if len(parts) != count or not all(v.isdigit() and int(v) > 0 for v in parts):
            raise argparse.ArgumentTypeError(
                f"expected {count} positive integers joined by 'x', got {text!r}")
        return text
    return parse


def config_arg(text: str) -> str:
    """An argparse type: METHOD,BN,STAGES[,LOOKAHEAD] (module doc), kept as the text."""
    method, *rest = text.split(",")
    if method not in GROUPS or len(rest) not in (2, 3) or not all(
            v.isdigit() for v in rest[:2]) or rest[2:] and (
            method != "exact" or rest[2] not in LOOKAHEADS):
        raise argparse.ArgumentTypeError(
            f"a config is {'|'.join(GROUPS)},BN,STAGES[,{'|'.join(LOOKAHEADS)} (exact only)], "
            f"got {text!r}")
    return text


def operands(m, n, k, group, case, seed=0):
    from ocpmx.native.fold import quantize_folded
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((m, k), device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn((n, k), device="cuda", generator=g).to(torch.bfloat16)
    if case == "spread":  # rows 2^-20 .. 2^20 apart, and blocks inside a row too
        x = x * torch.exp2(torch.randint(-20, 21, (m, 1), device="cuda", generator=g).float()
                           ).to(torch.bfloat16)
        w = w * torch.exp2(torch.randint(-6, 7, (1, k), device="cuda", generator=g).float()
                           ).to(torch.bfloat16)
    if case == "wide":
        x = x * 2.0 ** 60
    return (quantize_folded(x, "e2m1", group, pow2=True),
            quantize_folded(w, "e2m1", group, pow2=True))


def one(shape: str, config: str) -> dict:
    from triton.testing import do_bench
    from ocpmx.native.fold import folded_matmul, folded_matmul_wgmma
    k, n = (int(v) for v in shape.split("x"))
    m = TOKENS
    method, bn, stages, *extra = config.split(",")
    bn, stages = int(bn), int(stages)
    lookahead = LOOKAHEADS[extra[0]] if extra else None
    group, promote = GROUPS[method]
    row = dict(shape=f"{m}x{n}x{k}", method=" ".join([method, *extra]), bn=bn, stages=stages)
    bits = []
    for case in ("normal", "spread", "wide"):
        a, b = operands(m, n, k, group, case)
        for out in (torch.float32, torch.bfloat16):
            ref = folded_matmul(a, b, out, promote=promote, kernel="triton")
            got = folded_matmul_wgmma(a, b, out, promote=promote, bn=bn, stages=stages,
                                      lookahead=lookahead)
            iv = torch.int32 if out == torch.float32 else torch.int16
            diff = int((ref.view(iv) != got.view(iv)).sum())
            bits.append(f"{case}/{str(out)[6:]}:{'equal' if diff == 0 else f'{diff} differ'}")
    row["bits"] = " ".join(bits)
    a, b = operands(m, n, k, group, "normal")
    flops = 2 * m * n * k

    def tf(ms):
        return round(flops / ms / 1e9, 1)
    xb = torch.randn((m, k), device="cuda").to(torch.bfloat16)
    wb = torch.randn((n, k), device="cuda").to(torch.bfloat16)
    bf16 = do_bench(lambda: xb @ wb.T, warmup=50, rep=300, return_mode="median")
    x8, w8 = xb.to(torch.float8_e4m3fn), wb.to(torch.float8_e4m3fn)
    one_ = torch.ones((), device="cuda")
    fp8 = do_bench(lambda: torch._scaled_mm(x8, w8.T, one_, one_, out_dtype=torch.bfloat16),
                   warmup=50, rep=300, return_mode="median")
    lib = do_bench(lambda: folded_matmul(a, b, torch.bfloat16, promote=promote, kernel="triton"),
                   warmup=50,
                   rep=300, return_mode="median")
    glu = do_bench(lambda: folded_matmul_wgmma(a, b, torch.bfloat16, promote=promote, bn=bn,
                                               stages=stages, lookahead=lookahead),
                   warmup=50, rep=300, return_mode="median")
    row.update(bf16_tflops=tf(bf16), fp8_tflops=tf(fp8), triton_tflops=tf(lib),
               gluon_tflops=tf(glu), gluon_of_bf16=round(bf16 / glu, 3),
               triton_of_bf16=round(bf16 / lib, 3))
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES, type=dims(2))
    p.add_argument("--configs", nargs="+", default=CONFIGS, type=config_arg)
    p.add_argument("--one", nargs=2, metavar=("SHAPE", "CONFIG"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print("ROW " + json.dumps(one(*args.one)), flush=True)
        return
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    import triton
    print(f"triton {triton.__version__}\n")
    cols = ["shape", "method", "bn", "stages", "bits", "bf16_tflops", "fp8_tflops",
            "triton_tflops", "gluon_tflops", "triton_of_bf16", "gluon_of_bf16"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols), flush=True)
    for config in args.configs:
        for shape in args.shapes:
            try:  # a hung kernel (a synchronization bug) costs 3 minutes, not the hold
                r = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", shape,
                                    config], capture_output=True, text=True, timeout=180)
            except subprocess.TimeoutExpired:
                print(f"| {shape} | {config} | FAILED: no result in 180 s (hung?) |", flush=True)
                continue
            rows = [line[4:] for line in r.stdout.splitlines() if line.startswith("ROW ")]
            if rows:
                row = json.loads(rows[0])
                print("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |", flush=True)
            else:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                print(f"| {shape} | {config} | FAILED rc={r.returncode}: "
                      f"{' / '.join(tail)[:300]} |", flush=True)


if __name__ == "__main__":
    main()
