"""Probe (issue 17): what Hopper's FP8 tensor cores compute for the folded MXFP4/MXFP6 GEMM.

``native.fold.folded_matmul`` promotes every K = 32 FP8 dot at once (``max_num_imprecise_acc
=32``), or with ``promote=False`` chains a group's dots in the tensor core (rows with
``promote`` = 32 * group: they test ``hopper_dot32``'s chained-accumulator hypothesis). The
emulator's ``folded_matmul`` takes each such dot as exact. This probe compares the GPU's bits,
per format and group, with the two models of the K = 32 dot of
``emulator.fold.folded_matmul``: ``dot="exact"`` and ``dot="hopper"`` (the wgmma rule fitted to
this probe's first run, 2026-11-23; that run compared against the accumulate module's
``HOPPER_FP8`` chunk model instead, which matched nothing the exact model missed).
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

from ocpmx import native
from ocpmx.emulator.fold import fold, folded_matmul
from ocpmx.native import fold as native_fold


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
                for promote in (True, False):  # every K = 32 dot promoted / the group chained
                    p = 32 if promote else 32 * group
                    got = native_fold.folded_matmul(fa, fb, promote=promote).cpu().numpy()
                    row = dict(fmt=fmt, block_spread_sd=spread, group=group, promote=p,
                               fold_bits_equal=codes_ok,
                               inexact_blocks=int(ea.inexact + eb.inexact),
                               vs_exact_dots=compare(got, folded_matmul(ea, eb, promote=p)),
                               vs_hopper_dots=compare(got, folded_matmul(ea, eb, "hopper",
                                                                         promote=p)))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    if args.save:  # the operands and the GPU's bits, for fitting on a CPU
                        Path(args.out).mkdir(parents=True, exist_ok=True)
                        np.savez_compressed(
                            Path(args.out) / f"{fmt}_s{spread:g}_g{group}_p{p}.npz",
                            a_codes=ea.codes, a_exp=ea.exponents, b_codes=eb.codes,
                            b_exp=eb.exponents, group=group, promote=p, got=got)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    head = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__)
    (out / "fold_probe.json").write_text(json.dumps(dict(header=head, rows=rows), indent=1))


if __name__ == "__main__":
    main()
