"""Host time of one folded GEMM call on Hopper: the Gluon kernel launched through Gluon's
``kernel[grid]`` against the same kernel through fastlaunch (``native.fold.WGMMA_FAST_LAUNCH``),
and the Triton folded kernel, on a GEMM small enough that the GPU waits for the host
(256 x 256 x 1024 by default). Each: 1000 calls enqueued back to back, then one synchronize:
microseconds per call of the host's wall time, and of the stream's (CUDA events around the
loop: equal to the host's where the GPU waits for it, lower bound of the GPU's own time
otherwise). The bits of the three paths are compared too.

  python benchmarks/fold_wgmma_host.py [--shape MxNxK] [--calls N]
"""
from __future__ import annotations

import argparse
import time

import torch

from fold_wgmma_probe import dims  # (this script's folder is on sys.path)


def main():
    from ocpmx import native
    from ocpmx.native import fastlaunch, fold
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="256x256x1024", type=dims(3))
    p.add_argument("--calls", type=int, default=1000)
    args = p.parse_args()
    m, n, k = (int(v) for v in args.shape.split("x"))
    g = torch.Generator(device="cuda").manual_seed(0)
    qa = native.quantize(torch.randn(m, k, device="cuda", generator=g), "e2m1")
    qb = native.quantize(torch.randn(n, k, device="cuda", generator=g), "e2m1")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, shape {args.shape}, "
          f"{args.calls} calls each")
    print("| method | path | host us / call | stream us / call | bits |\n|---|---|---|---|---|")
    for method, group, promote in (("fp8", 32, False), ("fp8_exact", 4, True)):
        fa, fb = fold.fold(qa, group, True), fold.fold(qb, group, True)
        want = fold.folded_matmul(fa, fb, torch.bfloat16, promote=promote, kernel="triton")
        for path in ("triton", "gluon kernel[grid]", "gluon fastlaunch"):
            fold.WGMMA_FAST_LAUNCH = path == "gluon fastlaunch"
            kernel = "triton" if path == "triton" else "gluon"

            def call():
                return fold.folded_matmul(fa, fb, torch.bfloat16, promote=promote, kernel=kernel)
            got = call()
            for _ in range(20):
                call()
            torch.cuda.synchronize()
            fast0 = fastlaunch.STATS.fast
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            for _ in range(args.calls):
                call()
            end.record()
            torch.cuda.synchronize()
            host = (time.perf_counter() - t0) / args.calls * 1e6
            gpu = start.elapsed_time(end) / args.calls * 1e3
            same = torch.equal(got.view(torch.int16), want.view(torch.int16))
            bits = "equal" if same else "DIFFER"
            direct = fastlaunch.STATS.fast - fast0
            print(f"| {method} | {path}{f' ({direct} direct)' if direct else ''} | {host:.1f} | "
                  f"{gpu:.1f} | {bits} |", flush=True)
    fold.WGMMA_FAST_LAUNCH = False


if __name__ == "__main__":
    main()
