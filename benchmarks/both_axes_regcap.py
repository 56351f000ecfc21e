"""Does a register cap speed up ``kernels.both_axes.columns_kernel``'s quantize along tokens?

  python benchmarks/both_axes_regcap.py [--tiles 64,2,2 128,4,2] [--caps 0 168 128]

Its two-block tiles (``Tuning.both_axes_blocks=2``) hold 230-249 registers a thread on sm_90
(Triton 3.6), four programs of two warps an SM; a probe with the same accesses and no
arithmetic runs at 0.87 of copy, the kernel at 0.62-0.64. Each (tile, cap) is launched with
``maxnreg`` added to the launch options (0: none), timed beside a device copy (bf16 8192 x
14336 along axis 0 to E2M1, RNE, no rotation and H16) and its codes and scale bytes compared
with the column kernel's default path. A measurement, not a library option: the cap is
patched into ``launch._columns_constexprs`` here only.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

import gpu_bench as gb
from ocpmx import native
from ocpmx.native import launch, plans


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", nargs="+", default=["64,2,1", "64,2,2", "128,4,2", "32,1,2"],
                    metavar="COLUMNS,WARPS,BLOCKS")
    ap.add_argument("--caps", nargs="+", type=int, default=[0, 168, 128])
    args = ap.parse_args()
    m, k = gb.TOKENS, 14336
    rows = []
    src, _, copy_gbs = gb.copy_baseline(rows, m, k)
    nbytes = m * k * 2 + m * k // 2 + m * k // 32
    x = src()
    real = launch._columns_constexprs
    cap = {"v": 0}

    def capped(*a, **kw):
        d = dict(real(*a, **kw))
        if cap["v"]:
            d["maxnreg"] = cap["v"]
        return d
    launch._columns_constexprs = capped
    default = native.default_tuning(x.device)
    print(f"copy {2 * m * k * 2 / copy_gbs / 1e6:.4f} ms; {torch.cuda.get_device_name()}",
          flush=True)
    bad = 0
    for rot in (None, "hadamard16"):
        def q(t, tuning):
            r = native.quantize(t, "e2m1", axis=0, rotation=rot, scale_rule="even",
                                tuning=tuning)
            return r.data, r.scales_kmajor
        cap["v"] = 0
        plans.clear()
        want = q(x, default)
        for spec in args.tiles:
            bn, w, kb = (int(v) for v in spec.split(","))
            tuning = dataclasses.replace(default, columns="both_axes", both_axes=(bn, w),
                                         both_axes_blocks=kb)
            for c in args.caps:
                cap["v"] = c
                plans.clear()
                try:
                    got = q(x, tuning)
                    ms = gb.bench(lambda: q(src(), tuning))
                except Exception as e:  # a cap the compiler refuses: say so, go on
                    print(f"rot={rot} tile {spec} cap {c}: {type(e).__name__}: {e}"[:300],
                          flush=True)
                    continue
                same = all(torch.equal(g, h) for g, h in zip(got, want))
                bad += not same
                print(f"rot={rot} tile {spec} cap {c or 'none'}: "
                      f"{nbytes / ms / 1e6 / copy_gbs:.3f} of copy ({ms:.4f} ms)"
                      + ("" if same else " BITS DIFFER"), flush=True)
    launch._columns_constexprs = real
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
