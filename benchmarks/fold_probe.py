"""Probe (issue 17): what Hopper's FP8 tensor cores compute for the folded MXFP4/MXFP6 GEMM.

``native.fold.folded_matmul`` promotes every K = 32 FP8 dot at once (``max_num_imprecise_acc
=32``). The emulator's ``folded_matmul`` takes each such dot as exact. This probe compares the
GPU's bits, per format and group, with two models of the K = 32 dot:
  * exact: ``emulator.fold.folded_matmul``;
  * hopper_fp8: the dot by the emulator's ``HOPPER_FP8`` chunked model (align the 32 products
    to the largest exponent, truncate to 13 fraction bits, sum, round toward zero), then the
    same float32 promotion and group scaling.
Writes OUT/fold_probe.json (and with --save each case's operands and output) and prints
one JSON line per case.
    python benchmarks/fold_probe.py --out /tmp/probe
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from ocpmx import emulator, native
from ocpmx.emulator.accumulate import HOPPER_FP8
from ocpmx.emulator.fold import TARGET, fold, folded_matmul
from ocpmx.emulator.block_quantize import MXArray
from ocpmx.native import fold as native_fold
from ocpmx.spec import BLOCK_SIZE, get_format


def hopper_fp8_model(fa, fb) -> np.ndarray:
    """folded_matmul with each K = 32 dot by HOPPER_FP8 instead of exact."""
    e4 = get_format(TARGET)
    k = fa.codes.shape[1]
    nblk = k // BLOCK_SIZE
    acc = np.zeros((fa.codes.shape[0], fb.codes.shape[0]), np.float32)
    unit = lambda rows: np.full((rows, 1), 127, np.uint8)  # scale 2^0
    with np.errstate(invalid="ignore", over="ignore"):
        for g0 in range(0, nblk, fa.group):
            t = np.zeros_like(acc)
            for blk in range(g0, g0 + fa.group):
                cols = slice(blk * BLOCK_SIZE, (blk + 1) * BLOCK_SIZE)
                a = MXArray(np.ascontiguousarray(fa.codes[:, cols]), unit(len(fa.codes)), e4, 1,
                            BLOCK_SIZE, None)
                b = MXArray(np.ascontiguousarray(fb.codes[:, cols]), unit(len(fb.codes)), e4, 1,
                            BLOCK_SIZE, None)
                t = (t + emulator.mx_matmul(a, b, HOPPER_FP8)).astype(np.float32)
            gi = g0 // fa.group
            sa = np.exp2(fa.exponents[:, gi].astype(np.float64))
            sb = np.exp2(fb.exponents[:, gi].astype(np.float64))
            acc = (acc + (t.astype(np.float64) * sa[:, None] * sb[None, :])).astype(np.float32)
    return acc


def compare(got, want) -> dict:
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    fin = np.isfinite(got) & np.isfinite(want) & ~same
    ulp = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))
    rel = np.abs(got[fin] - want[fin]) / np.maximum(np.abs(want[fin]), 1e-30)
    return {"differ": int((~same).sum()), "of": int(same.size),
            "max_ulp": int(ulp[fin].max()) if fin.any() else 0,
            "max_rel": float(rel.max()) if fin.any() else 0.0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/fold_probe")
    ap.add_argument("--save", action="store_true", help="also save each case's operands and "
                    "GPU output (OUT/<fmt>_s<spread>_g<group>.npz)")
    args = ap.parse_args()
    rows = []
    rng = np.random.default_rng(1)
    for fmt in ("e2m1", "e2m3", "e3m2"):
        for spread in (0.0, 2.0):
            x = (rng.standard_normal((128, 1024)) * np.exp(rng.normal(0, spread, (128, 1024 // 32))
                                                             ).repeat(32, 1)).astype(np.float32)
            w = (rng.standard_normal((96, 1024)) * np.exp(rng.normal(0, spread, (96, 1024 // 32))
                                                            ).repeat(32, 1)).astype(np.float32)
            qa, qb = native.quantize(torch.from_numpy(x).cuda(), fmt), \
                native.quantize(torch.from_numpy(w).cuda(), fmt)
            for group in (1, 4, 32):
                fa, fb = native_fold.fold(qa, group), native_fold.fold(qb, group)
                ea, eb = fold(qa.to_emulator(), group), fold(qb.to_emulator(), group)
                codes_ok = bool(np.array_equal(fa.codes.cpu().numpy(), ea.codes)
                                and np.array_equal(fa.exponents.cpu().numpy(), ea.exponents))
                got = native_fold.folded_matmul(fa, fb).cpu().numpy()
                row = dict(fmt=fmt, block_spread_sd=spread, group=group, fold_bits_equal=codes_ok,
                           inexact_blocks=int(ea.inexact + eb.inexact),
                           vs_exact_dots=compare(got, folded_matmul(ea, eb)),
                           vs_hopper_fp8_dots=compare(got, hopper_fp8_model(ea, eb)))
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.save:  # the raw operands and the GPU's bits, for fitting a model on a CPU
                    Path(args.out).mkdir(parents=True, exist_ok=True)
                    np.savez_compressed(Path(args.out) / f"{fmt}_s{spread:g}_g{group}.npz",
                                        a_codes=ea.codes, a_exp=ea.exponents, b_codes=eb.codes,
                                        b_exp=eb.exponents, group=group, got=got)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__)
    (out / "fold_probe.json").write_text(json.dumps(dict(header=head, rows=rows), indent=1))


if __name__ == "__main__":
    main()
