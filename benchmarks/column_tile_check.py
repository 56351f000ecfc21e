"""Column-kernel tiles on a GPU, each timed and checked: bf16 8192 x 14336 quantized along
axis 0 (tokens) to MXFP4 and quantize-dequantized (no rotation / H16 / H16 + stochastic), of
copy in the same run; and the codes and scales (values) of every tile compared bit for bit
with the transpose path's on uniformly random bf16 bit patterns (every class of value: NaN,
Inf, subnormals, zeros), 117 M elements.

  python benchmarks/column_tile_check.py [--tiles TILE ...]
  python benchmarks/column_tile_check.py --fold [--tiles TILE ...]

``--fold``: ``native.fold.quantize_folded`` along tokens instead (MXLinear's Wgrad operands
under the fold methods): groups of 4 blocks with 2^R (``fp8_cublas``) without a rotation, with
H16 and with H16 + stochastic rounding, each tile's codes, exponents, 2^R, MX scales and
counts against the transpose path's; of copy = bytes moved (bf16 in; E4M3 codes, scales,
exponents, 2^R out) against the copy's rate. A fold takes whole groups per program: a tile's
blocks along K become the least common multiple of its own and the group's. Also the axis-0
fold kernel (``kernels.both_axes.columns_fold_kernel``, ``--fold-columns`` tiles; stochastic
rounding goes through the transpose there).

TILE: ColumnTile's fields comma-separated (columns, warps, kblocks, hide, kb_fast, vec,
maxnreg, split, const_stride, serial, joint, quarters), e.g.
"128,2,2,True,True,2,None,False,False,True".
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
             "const_stride", "serial", "joint", "quarters")
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
    ap.add_argument("--fold", action="store_true",
                    help="time and check quantize_folded along tokens (group 4, 2^R)")
    ap.add_argument("--fold-columns", nargs="*", default=["64,4", "32,2", "32,1", "64,2"],
                    metavar="COLUMNS,WARPS", help="with --fold: also the axis-0 fold kernel "
                    "(Tuning columns_fold='both_axes') at each fold_columns tile")
    args = ap.parse_args()
    tiles = {}  # every tile read before the GPU work starts
    for spec in args.tiles:
        try:
            tiles[spec] = parse(spec)
        except (ValueError, TypeError) as e:
            ap.error(f"--tiles {spec!r}: {e}")
    if args.fold:
        for spec in args.fold_columns:
            cols, warps = (int(v) for v in spec.split(","))
            tiles[f"axis0 {spec}"] = (cols, warps)
        sys.exit(check_folds(tiles))
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


FOLD_FIELDS = ("codes", "exponents", "scales", "stats", "pow2")


def bits_of(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bits (2^R is float32: NaN groups compare by their bits)."""
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def check_folds(tiles: dict) -> int:
    """--fold: each tile's quantize_folded along tokens timed (of copy) and compared field for
    field with the transpose path's; returns 1 where some tile's bits differ."""
    from ocpmx.native import fold
    m, k, group = gb.TOKENS, 14336, 4
    src = gb.rotating(lambda: torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    dst = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    copy_ms = gb.bench(lambda: dst.copy_(src()))
    nbytes = m * k * (2 + 1) + m * k // 32 + m * k // 32 // group * 8
    g = torch.Generator(device="cuda").manual_seed(0)
    # random bf16 patterns (NaN, Inf, subnormals, zeros) and, for the fold's range, normal
    # values whose blocks lie up to 2^12 apart within a group (some past E2M1's 14 octaves)
    bits = torch.randint(-32768, 32768, (m, k), device="cuda", dtype=torch.int32,
                         generator=g).to(torch.int16).view(torch.bfloat16)
    spread = (torch.randn(m, k, device="cuda", generator=g) * torch.exp2(torch.randint(
        -6, 7, (m // 32, k), device="cuda", generator=g).float()).repeat_interleave(32, 0)
    ).to(torch.bfloat16)
    tr = dataclasses.replace(gb.GPU, columns="transpose", columns_fold="transpose")

    def qf(x, rot, rnd, tun):
        return fold.quantize_folded(x, "e2m1", group, axis=0, pow2=True, rotation=rot,
                                    rounding=rnd, scale_rule="even", seed=5, tuning=tun)

    ref = {(c, i): qf(x, *c, tr) for c in CASES for i, x in enumerate((bits, spread))}
    print(f"copy {copy_ms:.4f} ms; {torch.cuda.get_device_name()}; fold group {group} 2^R",
          flush=True)
    bad = 0
    for spec in ["default", "transpose"] + list(tiles):
        if spec == "default":
            tun = native.default_tuning(src().device)
        elif spec == "transpose":
            tun = tr
        elif spec.startswith("axis0 "):  # the axis-0 fold kernel (stochastic: the transpose)
            tun = dataclasses.replace(gb.GPU, columns_fold="both_axes",
                                      fold_columns=tiles[spec])
        else:
            tun = dataclasses.replace(gb.GPU, columns_fold="kernel", cols32_fold=tiles[spec])
        out = []
        for rot, rnd in CASES:
            diff = [f for i, x in enumerate((bits, spread)) for f in FOLD_FIELDS
                    if not torch.equal(bits_of(getattr(qf(x, rot, rnd, tun), f)),
                                       bits_of(getattr(ref[((rot, rnd), i)], f)))]
            ms = gb.bench(lambda: qf(src(), rot, rnd, tun))
            bad += bool(diff)
            out.append(f"fold {rot or 'none'} {rnd} {nbytes / ms / (4 * m * k / copy_ms):.3f}"
                       f" ({ms:.4f} ms)" + (f" BITS DIFFER: {sorted(set(diff))}" if diff else ""))
        print(f"{spec} | " + "; ".join(out), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    main()
