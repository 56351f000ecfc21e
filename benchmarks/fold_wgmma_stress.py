"""A race detector for the Gluon folded GEMM (``native.fold.folded_matmul_wgmma``): the same
GEMM launched many times, each result compared bit for bit with the Triton kernel's
(``folded_matmul(kernel="triton")``), on operands like tests/test_fold.py's (E2M1 blocks with
scales over 2^+-12). A synchronization bug shows as a few outputs that differ in a few of the
launches; the count of such launches and of the outputs is printed per configuration.

  python benchmarks/fold_wgmma_stress.py [--shape MxNxK] [--repeats R] [--configs ...]

configs: ``promote,group[,plain|lookahead|quarters]`` (promote 0 or 1; the promoted form's
kernel, else ``native.fold.WGMMA_LOOKAHEAD`` decides), e.g. ``0,4 0,32 1,4,plain 1,4,quarters``.
"""
from __future__ import annotations

import argparse

import torch

from fold_wgmma_probe import LOOKAHEADS, dims  # (this script's folder is on sys.path)


def config_arg(text: str) -> str:
    """An argparse type: PROMOTE,GROUP[,LOOKAHEAD] (module doc), kept as the text."""
    promote, *rest = text.split(",")
    if promote not in ("0", "1") or len(rest) not in (1, 2) or not rest[0].isdigit() or \
            rest[1:] and (promote != "1" or rest[1] not in LOOKAHEADS):
        raise argparse.ArgumentTypeError(
            f"a config is 0|1,GROUP[,{'|'.join(LOOKAHEADS)} (promoted only)], got {text!r}")
    return text


def operands(m, n, k, seed=0):
    from ocpmx import native
    g = torch.Generator(device="cuda").manual_seed(seed)

    def one(rows):
        v = torch.randn(rows, k, device="cuda", generator=g)
        s = torch.randint(-12, 13, (rows, k // 32), device="cuda", generator=g).float()
        return native.quantize(v * torch.exp2(s).repeat_interleave(32, 1), "e2m1")
    return one(m), one(n)


def main():
    from ocpmx.native import fold
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="8192x4096x4096", type=dims(3))
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--configs", nargs="+", default=["0,4", "0,32", "1,4,plain", "1,4,lookahead"],
                   type=config_arg)
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    qa, qb = operands(m, n, k)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"shape {args.shape}, {args.repeats} launches per output type")
    for config in args.configs:
        promote, group, *extra = config.split(",")
        promote, group = bool(int(promote)), int(group)
        fa, fb = fold.fold(qa, group, True), fold.fold(qb, group, True)
        for out, iv in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
            want = fold.folded_matmul(fa, fb, out, promote=promote, kernel="triton").view(iv)
            bad, outputs = 0, 0
            for _ in range(args.repeats):
                # (passed only where asked: an older tree's kernel may lack the argument)
                kw = {"lookahead": LOOKAHEADS[extra[0]]} if extra else {}
                got = fold.folded_matmul_wgmma(fa, fb, out, promote=promote, **kw).view(iv)
                d = int((got != want).sum())
                bad += d > 0
                outputs += d
            print(f"{config} {str(out)[6:]}: {bad} of {args.repeats} launches differ "
                  f"({outputs} outputs in all)", flush=True)


if __name__ == "__main__":
    main()
