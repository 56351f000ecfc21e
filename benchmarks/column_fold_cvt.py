"""The column kernel's fold (``quantize_folded`` along tokens) per column tile against the
transpose path, bit for bit, with and without the GPU's float32 -> E4M3 conversion (the
``cvt=False`` rows patch ``native.fold._e4m3_cvt``): how the wrong codes of vec > 1 tiles under
Triton 3.6 were found (results/native_gpu/column_fold_cvt_h100.txt, run at 5246c8f; since
eb25b2c those tiles fold with ``encode``, so at later trees both rows should say OK). GPU only.

  python benchmarks/column_fold_cvt.py
"""
import dataclasses

import numpy as np
import torch

from ocpmx import native
from ocpmx.native import fold as nf
from ocpmx.native import tuning as T
torch.manual_seed(0)
base = native.default_tuning()
transpose = dataclasses.replace(base, columns="transpose")
H = T.H100.cols32
tiles = {"h100": H,
         "no_const": dataclasses.replace(H, const_stride=False),
         "vec1": dataclasses.replace(H, vec=1),
         "nohide": dataclasses.replace(H, hide=False),
         "kb4": dataclasses.replace(H, kblocks=4),
         "cols64": dataclasses.replace(H, columns=64),
         "no_kbfast": dataclasses.replace(H, kb_fast=False),
         "16_1_4": native.ColumnTile(16, 1, 4),
         "64_1_2_v2": native.ColumnTile(64, 1, 2, kb_fast=True, vec=2),
         "qdq_h100": T.H100.cols32_qdq}


def case(seed, shape, axis, group, dtype, rotation, pow2, special):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-3, 4, shape))
    if special:
        x.reshape(-1)[:32] *= 2.0**-40
    x = torch.from_numpy(x.astype(np.float32)).to(dtype).cuda()
    kw = dict(axis=axis, pow2=pow2, rounding="rne", rotation=rotation, seed=11)
    want = nf.quantize_folded(x, "e2m1", group, tuning=transpose, **kw)
    out = []
    for name, tile in tiles.items():
        for cvt in (True, False):
            orig = nf._e4m3_cvt
            if not cvt:
                nf._e4m3_cvt = lambda d: False
            try:
                tuning = dataclasses.replace(base, columns="kernel", cols32=tile)
                got = nf.quantize_folded(x, "e2m1", group, tuning=tuning, **kw)
            except Exception as e:
                out.append(f"{name} cvt={cvt}: ERROR {type(e).__name__}: {str(e)[:100]}")
                continue
            finally:
                nf._e4m3_cvt = orig
            bad = []
            for f in ("codes", "exponents", "scales", "stats"):
                g, w = getattr(got, f), getattr(want, f)
                if not torch.equal(g, w):
                    idx = (g != w).nonzero()
                    first = tuple(idx[0])
                    bad.append(f"{f}: {len(idx)} differ, first {idx[:3].tolist()} got "
                               f"{g[first].item()} want {w[first].item()}")
            out.append(f"{name} cvt={cvt}: " + ("OK" if not bad else "; ".join(bad)))
    return out


for args in [(7, (256, 6, 8), 0, 4, torch.bfloat16, None, True, True),
             (7, (256, 6, 8), 0, 4, torch.bfloat16, None, True, False),
             (7, (256, 6, 8), 0, 4, torch.bfloat16, "hadamard16", True, True),
             (8, (512, 256), 0, 4, torch.bfloat16, None, False, False),
             (9, (1024, 4096), 0, 4, torch.bfloat16, None, True, False),
             (9, (1024, 4096), 0, 32, torch.bfloat16, None, True, False),
             (10, (256, 6, 8), 0, 4, torch.float32, None, True, False)]:
    print("CASE", args[:4], args[4], args[5:], flush=True)
    for l in case(*args):
        print("  ", l, flush=True)
