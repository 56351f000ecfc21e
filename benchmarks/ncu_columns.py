"""The column (along-tokens) quantize kernels and the row kernel under Nsight Compute.

  ncu --section SpeedOfLight --section WarpStateStats --section Occupancy \
      --section MemoryWorkloadAnalysis -k regex:"quantize|columns" --launch-count 8 \
      python benchmarks/ncu_columns.py

E2M1, RNE, bf16 8192 x 14336: along axis 0 through this GPU's default (the column kernel),
the both-axes module's axis-0 kernel with two blocks a program and with one
(``Tuning.both_axes_blocks``), then along rows; each twice. ``--more``: then stochastic
rounding with H16 along tokens and along rows, and ``quantize_folded`` (groups of 4, 2^R)
along rows and along tokens, each twice. ``--tiles TILE ...`` (``column_tile_check.py``'s
TILE syntax): instead, each column tile along tokens twice without a rotation and twice with
H16, then the row kernel twice. Launches only: the numbers come from ncu
(results/native_gpu/ncu_columns_h100.txt).
"""
import dataclasses
import sys

import torch

from ocpmx import native
from ocpmx.native import fold


def main():
    x = torch.randn(8192, 14336, device="cuda", dtype=torch.bfloat16)
    d = native.default_tuning(x.device)
    if "--tiles" in sys.argv:
        from column_tile_check import parse
        specs = sys.argv[sys.argv.index("--tiles") + 1:]
        specs = specs[:next((i for i, a in enumerate(specs) if a.startswith("--")), len(specs))]
        for spec in specs:
            t = dataclasses.replace(d, columns="kernel", cols32=parse(spec),
                                    cols32_unrotated=None)
            for rot in (None, None, "hadamard16", "hadamard16"):
                native.quantize(x, "e2m1", axis=0, rotation=rot, scale_rule="even", tuning=t)
        for _ in range(2):
            native.quantize(x, "e2m1", scale_rule="even")
        torch.cuda.synchronize()
        return
    for t in (d, dataclasses.replace(d, columns="both_axes", both_axes=(64, 2),
                                     both_axes_blocks=2),
              dataclasses.replace(d, columns="both_axes", both_axes=(64, 2))):
        for _ in range(2):
            native.quantize(x, "e2m1", axis=0, scale_rule="even", tuning=t)
    for _ in range(2):
        native.quantize(x, "e2m1", scale_rule="even")
    if "--more" in sys.argv:  # stochastic rounding along tokens and rows (H16), the fold of
        # groups of 4 along rows and along tokens (2^R)
        for axis in (0, -1):
            for _ in range(2):
                native.quantize(x, "e2m1", axis=axis, rotation="hadamard16",
                                rounding="stochastic", scale_rule="even", seed=1)
        for axis in (-1, 0):
            for _ in range(2):
                fold.quantize_folded(x, "e2m1", 4, axis=axis, pow2=True, scale_rule="even")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
