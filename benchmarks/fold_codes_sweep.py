"""The fold of stored codes (``native.fold.fold_kmajor``, what ``mx_matmul``'s fp8 methods run
on MXTensors) per program shape: ``FOLD_BLOCKS`` 32-blocks per program on at most
``FOLD_WARPS`` warps (blocks per thread = their ratio), each shape's outputs compared field for
field with the default's and timed against a copy (E2M1 codes of bf16 8192 x 14336, groups of
4 with 2^R and of 32). GPU only.

  python benchmarks/fold_codes_sweep.py [--shapes BLOCKS,WARPS ...]
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_bench as gb  # noqa: E402
from column_tile_check import bits_of  # noqa: E402
from ocpmx import native  # noqa: E402
from ocpmx.native import fold  # noqa: E402

FIELDS = ("codes", "exponents", "stats", "pow2")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=[
        "128,4", "256,4", "512,4", "256,8", "512,8", "64,2", "1024,8"])
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    m, k = gb.TOKENS, 14336
    src = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    copy_ms = gb.bench(lambda: dst.copy_(src))
    q = native.quantize(src, "e2m1", scale_rule="even")
    # random codes and scales too (every code, NaN scales): bits of every case
    g = torch.Generator(device="cuda").manual_seed(0)
    rdata = torch.randint(0, 256, q.data.shape, device="cuda", generator=g).to(torch.uint8)
    rscales = torch.randint(0, 256, q.scales_kmajor.shape, device="cuda",
                            generator=g).to(torch.uint8)
    default = (fold.FOLD_BLOCKS, fold.FOLD_WARPS)
    print(f"copy {copy_ms:.4f} ms; {torch.cuda.get_device_name()}; default {default}",
          flush=True)

    def run(data, scales, group, pow2):
        return fold.fold_kmajor(data, scales, k, q.fmt, group, pow2=pow2)
    bad = 0
    refs = {}
    for shape in [default] + shapes:
        fold.FOLD_BLOCKS, fold.FOLD_WARPS = shape
        out = []
        for group, pow2 in ((4, True), (32, False)):
            diff = []
            for name, data, scales in (("real", q.data, q.scales_kmajor),
                                       ("random", rdata, rscales)):
                got = run(data, scales, group, pow2)
                key = (group, name)
                if key not in refs:
                    refs[key] = got
                for f in FIELDS:
                    a, b = getattr(got, f), getattr(refs[key], f)
                    if (a is None) != (b is None) or a is not None and not torch.equal(
                            bits_of(a), bits_of(b)):
                        diff.append(f"{name}:{f}")
            ms = gb.bench(lambda: run(q.data, q.scales_kmajor, group, pow2))
            nbytes = m * k * (0.5 + 1) + m * k // 32 + m * k // 32 // group * (4 + 4 * pow2)
            bad += bool(diff)
            out.append(f"group {group}{' pow2' if pow2 else ''} {ms:.4f} ms "
                       f"{nbytes / ms / (4 * m * k / copy_ms):.3f} of copy"
                       + (f" BITS DIFFER {diff}" if diff else ""))
        print(f"{shape} | " + "; ".join(out), flush=True)
    fold.FOLD_BLOCKS, fold.FOLD_WARPS = default
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
