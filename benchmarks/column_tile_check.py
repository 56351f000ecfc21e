"""Column-kernel tiles on a GPU, each timed and checked: bf16 8192 x 14336 quantized along
axis 0 (tokens) to MXFP4 and quantize-dequantized (no rotation / H16 / H16 + stochastic), of
copy in the same run; and the codes and scales (values) of every tile compared bit for bit
with the transpose path's on uniformly random bf16 bit patterns (every class of value: NaN,
Inf, subnormals, zeros), 117 M elements.

  python benchmarks/column_tile_check.py [--tiles TILE ...]

TILE: ColumnTile's fields comma-separated (columns, warps, kblocks, hide, kb_fast, vec,
maxnreg, split, const_stride, serial, joint), e.g. "128,2,2,True,True,2,None,False,False,True".
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

import gpu_bench as gb
from ocpmx import native
from ocpmx.native import ColumnTile

# (rotation, rounding) of each case, quantize and quantize-dequantize alike
CASES = ((None, "rne"), ("hadamard16", "rne"), ("hadamard16", "stochastic"))


def parse(spec: str) -> ColumnTile:
    v = [None if s == "None" else (s == "True") if s in ("True", "False") else int(s)
         for s in spec.split(",")]
    names = ("columns", "warps", "kblocks", "hide", "kb_fast", "vec", "maxnreg", "split",
             "const_stride", "serial", "joint")
    if not 2 <= len(v) <= len(names):
        raise ValueError(f"{len(v)} fields, expected 2 to {len(names)}")
    return ColumnTile(**dict(zip(names, v)))


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.data, b.data) and torch.equal(a.scales, b.scales)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", nargs="+", default=[
        "64,2,2,True,True,2", "64,2,2,True,True,2,None,False,True", "128,4,2,True,True,2",
        "128,2,2,True,True,2", "128,2,2,True,True,2,None,False,True", "256,4,2,True,True,2",
        "64,1,2,True,True,2", "64,2,2,True,True,2,128", "128,4,2,True,False,2",
        "128,2,2,True,True,2,None,False,False,True", "64,1,2,True,True,2,None,False,False,True",
        "128,2,4,True,True,2,None,False,False,True", "64,1,4,True,True,2,None,False,False,True",
        "64,2,4,True,True,2,None,False,False,True"])
    args = ap.parse_args()
    tiles = {}  # every tile read before the GPU work starts
    for spec in args.tiles:
        try:
            tiles[spec] = parse(spec)
        except (ValueError, TypeError) as e:
            ap.error(f"--tiles {spec!r}: {e}")
    m, k = gb.TOKENS, 14336
    src = gb.rotating(lambda: torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    dst = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    copy_ms = gb.bench(lambda: dst.copy_(src()))
    nq = m * k * 2 + m * k // 2 + m * k // 32
    g = torch.Generator(device="cuda").manual_seed(0)
    bits = torch.randint(-32768, 32768, (m, k), device="cuda", dtype=torch.int32,
                         generator=g).to(torch.int16).view(torch.bfloat16)
    tr = dataclasses.replace(gb.GPU, columns="transpose")

    def q(x, rot, rnd, tun):
        return native.quantize(x, "e2m1", axis=0, rotation=rot, rounding=rnd,
                               scale_rule="even", seed=5, tuning=tun)

    def qdq(x, rot, tun, rnd="rne"):
        return native.quantize_dequantize(x, "e2m1", axis=0, rotation=rot, scale_rule="even",
                                          rounding=rnd, seed=5, tuning=tun)

    ref = {c: q(bits, *c, tr) for c in CASES}
    ref.update({(rot, "qdq", rnd): qdq(bits, rot, tr, rnd) for rot, rnd in CASES})
    print(f"copy {copy_ms:.4f} ms; {torch.cuda.get_device_name()}", flush=True)
    bad = 0
    for spec in ["default"] + args.tiles:
        # a candidate serves every case, stochastic rounding too (cols32_sr None)
        tun = native.default_tuning(src().device) if spec == "default" else dataclasses.replace(
            gb.GPU, columns="kernel", cols32=tiles[spec], columns_qdq="kernel",
            cols32_qdq=tiles[spec], cols32_sr=None)
        out = []
        for rot, rnd in CASES:
            ok = same(q(bits, rot, rnd, tun), ref[(rot, rnd)])
            ms = gb.bench(lambda: q(src(), rot, rnd, tun))
            bad += not ok
            out.append(f"q {rot or 'none'} {rnd} {nq / ms / (4 * m * k / copy_ms):.3f}"
                       + ("" if ok else " BITS DIFFER"))
        for rot, rnd in CASES:
            ok = same(qdq(bits, rot, tun, rnd), ref[(rot, "qdq", rnd)])
            ms = gb.bench(lambda: qdq(src(), rot, tun, rnd))
            bad += not ok
            out.append(f"qdq {rot or 'none'} {rnd} {copy_ms / ms:.3f}"
                       + ("" if ok else " BITS DIFFER"))
        print(f"{spec} | " + "; ".join(out), flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
