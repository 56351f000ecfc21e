"""GPU benchmarks of the native backend; every figure against a baseline timed in the same run.

  python benchmarks/gpu_bench.py --out results/native_gpu [--sections quantize gemm linear numerics emulate fold host columns]

quantize  bf16 -> packed MXFP4 (+ fused H16) throughput in GB/s against a device-to-device copy
gemm      TFLOP/s on Llama 3.1-8B shapes (8192 tokens): dot_scaled MXFP4 vs cuBLAS bf16 and
          FP8 torch._scaled_mm; also dequantize-to-bf16 + cuBLAS, the other way to run MXFP4 on
          a chip without MX units
linear    MXLinear forward + backward per recipe against nn.Linear bf16
numerics  how the chip's dot_scaled sums compare with the emulator's accumulation models
emulate   method='emulate' (a declared accumulation model, bit for bit) against cuBLAS bf16
fold      quantize_folded (issue 17) against a copy and the plain quantize
columns   the column kernel's tiles and the both-axes module's axis-0 kernel against the
          transpose path (axis 0, issue 18); columns_both: only the latter, the default and
          the transpose
host      host time per eager call of each operation, cached compiled kernels against
          Triton's own launch (issue 18)

Writes <out>/bench.json and <out>/bench.md (device, versions, command). Timings: medians of
triton.testing.do_bench (CUDA events), inputs random normal, several input sets rotated for
the memory-bound kernels so that L2 cannot hold them.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import triton
from triton.testing import do_bench

from ocpmx import emulator, native
from ocpmx.native import fold
from ocpmx.native.tensor import pack_factor
from ocpmx.native.tuning import GPU, ColumnTile, RowTile
from ocpmx.spec import Rotation, get_format

LLAMA_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144)]  # (K = in, N = out)
TOKENS = 8192


def bench(fn, rep=200):
    return do_bench(fn, warmup=50, rep=rep, return_mode="median")  # ms


def graphed_ms(fn, inputs):
    """ms per call of fn(x) for x in inputs, captured once in a CUDA graph and replayed."""
    for x in inputs:  # compile and warm up outside the capture
        fn(x)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for x in inputs:
            fn(x)
    return bench(g.replay) / len(inputs)


class StreamRows:
    """The rows of a bandwidth probe: each case's ms, GB/s of the bytes it moves and that
    against a device copy's GB/s (``copy_ms`` for ``copy_bytes``, timed in the same run; its
    row first), printed as they come; ``write`` saves them as NAME.json and NAME.md."""

    def __init__(self, copy_ms: float, copy_bytes: int, copy_case: str = "torch copy bf16"):
        self.rows = []
        self.copy_gbs = copy_bytes / copy_ms / 1e6
        self.add(copy_case, copy_ms, copy_bytes)

    def add(self, case: str, ms: float, nbytes: int, **kw) -> None:
        gbs = nbytes / ms / 1e6
        self.rows.append(dict(case=case, ms=ms, gbs=gbs, of_copy=gbs / self.copy_gbs, **kw))
        print(f"{case:70s} {ms:.4f} ms {gbs:7.0f} GB/s {gbs / self.copy_gbs:.3f}", flush=True)

    def write(self, out, name: str) -> None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        head = header()
        (out / f"{name}.json").write_text(json.dumps(dict(header=head, rows=self.rows), indent=1))
        (out / f"{name}.md").write_text(to_markdown(head, self.rows))


def rotating(make, n=4):
    """n input sets used in turn, so repeated calls do not hit in L2."""
    sets = [make() for _ in range(n)]
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % n
        return sets[state["i"]]
    return nxt


def copy_baseline(rows, m, k):
    """The bandwidth baseline of a section: a rotating bf16 [m, k] source and a destination,
    a copy between them timed and its row appended; (source, destination, copy GB/s)."""
    src = rotating(lambda: torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    dst = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    copy_ms = bench(lambda: dst.copy_(src()))
    copy_gbs = 2 * m * k * 2 / copy_ms / 1e6
    rows.append(dict(case="copy bf16 (read + write)", ms=copy_ms, gbs=copy_gbs, of_copy=1.0))
    return src, dst, copy_gbs


def section_quantize(rows):
    out = []
    m, k = TOKENS, 14336
    src = rotating(lambda: torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
    dst = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    copy_ms = bench(lambda: dst.copy_(src()))
    copy_bytes = 2 * m * k * 2
    copy_gbs = copy_bytes / copy_ms / 1e6
    out.append(dict(case="copy bf16 (read + write)", ms=copy_ms, gbs=copy_gbs, of_copy=1.0))
    nbytes4 = m * k * 2 + m * k // 2 + m * k // 32
    best = {}
    # row-kernel tiles: (blocks per program, warps) and (blocks, warps, register cap)
    row_tiles = [RowTile(32, 1), RowTile(64, 2), RowTile(128, 4)]
    capped = [RowTile(32, 1, 64), RowTile(32, 1, 72), RowTile(64, 2, 72)]
    for key, tiles, axis in (("rows32", row_tiles + capped, -1), ("rows32_qdq", row_tiles, -1),
                             ("cols32", [ColumnTile(32, 1), ColumnTile(64, 2),
                                         ColumnTile(128, 4), ColumnTile(256, 8)], 0)):
        for tile in tiles:  # tile shapes change speed only; the tests pin the bits
            tuning = dataclasses.replace(GPU, **{key: tile},
                                         **({"columns": "kernel"} if key == "cols32" else {}))
            rnd = "rne"
            if key == "rows32_qdq":
                fn, nb, what = (lambda: native.quantize_dequantize(
                    src(), "e2m1", rotation="hadamard16", scale_rule="even",
                    tuning=tuning)), copy_bytes, "qdq"
            else:
                fn, nb, what = (lambda: native.quantize(
                    src(), "e2m1", axis=axis, rotation="hadamard16", scale_rule="even",
                    rounding=rnd, tuning=tuning)), nbytes4, rnd
            ms = bench(fn)
            gbs = nb / ms / 1e6
            out.append(dict(case=f"tile sweep {key} {tile} e2m1 H16 {what}", ms=ms, gbs=gbs,
                            of_copy=gbs / copy_gbs))
            if key not in best or ms < best[key][0]:
                best[key] = (ms, tile)
    out.append(dict(case=f"fastest tiles {({k: t for k, (_, t) in best.items()})}; the rows "
                         "below use this GPU's defaults (ocpmx.native.default_tuning: "
                         f"{native.default_tuning(dst.device).notes})"))
    # the same call replayed from a CUDA graph (4 input sets, no launch gaps, no Python): if
    # this is much faster than the plain timing, the plain one measured the host, not the GPU
    for name, fn in (("copy bf16", lambda s: dst.copy_(s)),
                     ("quantize e2m1 axis=-1 rot=hadamard16 rne", lambda s: native.quantize(
                         s, "e2m1", rotation="hadamard16", scale_rule="even")),
                     ("quantize_dequantize e2m1 -> bf16 axis=-1 rot=hadamard16",
                      lambda s: native.quantize_dequantize(s, "e2m1", rotation="hadamard16",
                                                           scale_rule="even"))):
        ms = graphed_ms(fn, [src() for _ in range(4)])
        nb = nbytes4 if name.startswith("quantize e2m1") else copy_bytes
        out.append(dict(case=f"CUDA graph: {name}", ms=ms, gbs=nb / ms / 1e6,
                        of_copy=nb / ms / 1e6 / copy_gbs))
    for fmt in ("e2m1", "e4m3"):
        for rot in (None, "hadamard16", "hadamard32", Rotation(16, 7)):
            for axis in (-1, 0):
                for rnd in ("rne", "stochastic"):
                    if fmt == "e4m3" and (rot not in (None, "hadamard16") or rnd == "stochastic"):
                        continue
                    ms = bench(lambda: native.quantize(src(), fmt, axis=axis, rotation=rot,
                                                       rounding=rnd, scale_rule="even"))
                    nbytes = m * k * 2 + m * k * (4 if fmt == "e2m1" else 8) // 8 + m * k // 32
                    gbs = nbytes / ms / 1e6
                    name = "random_sign" if isinstance(rot, Rotation) else rot
                    out.append(dict(case=f"quantize {fmt} axis={axis} rot={name} {rnd}", ms=ms,
                                    gbs=gbs, of_copy=gbs / copy_gbs))
    # the ablation's Wgrad operands (30m, 32 x 1024 tokens per micro-batch), along tokens: the
    # path that made its rotated arms slow (results/ablation)
    for width in (512, 1792):
        small = rotating(lambda: torch.randn(32768, width, device="cuda", dtype=torch.bfloat16))
        for rot in (None, "hadamard16", Rotation(16, 7)):
            ms = bench(lambda: native.quantize(small(), "e2m1", axis=0, rotation=rot,
                                               scale_rule="even"))
            name = "random_sign" if isinstance(rot, Rotation) else rot
            out.append(dict(case=f"ablation Wgrad operand 32768x{width} axis=0 rot={name}",
                            ms=ms, gbs=32768 * width * 2.5 / ms / 1e6))
    # host time per call (a tiny tensor: the GPU time is negligible). plain timings above put
    # the kernel right after do_bench's 256 MB L2 flush; a host slower than that flush (~60 us
    # on an H200) shows up in them as a launch gap, which the CUDA-graph rows do not have
    tiny = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    tiny_dst = torch.empty_like(tiny)
    for name, fn in (("copy_", lambda: tiny_dst.copy_(tiny)),
                     ("quantize e2m1 H16", lambda: native.quantize(
                         tiny, "e2m1", rotation="hadamard16", scale_rule="even")),
                     ("quantize e2m1", lambda: native.quantize(tiny, "e2m1", scale_rule="even"))):
        out.append(dict(case=f"host time per call, {name} (us, best of 5 x 500)",
                        us=host_us(fn)))
    # the transpose behind the columns path: Triton tiled kernel against torch's strided copy
    for name, fn in (("triton move_axis_last", lambda: native.move_axis_last(src(), 0)),
                     ("torch movedim().contiguous()",
                      lambda: src().movedim(0, -1).contiguous())):
        ms = bench(fn)
        out.append(dict(case=f"transpose bf16 {m}x{k} ({name})", ms=ms, gbs=copy_bytes / ms / 1e6,
                        of_copy=copy_bytes / ms / 1e6 / copy_gbs))
    # what a bf16 GEMM on Hopper is fed: one quantize-dequantize pass against the two kernels
    for rot in (None, "hadamard16"):
        for axis in (-1, 0):
            for name, fn in (
                    ("quantize_dequantize", lambda: native.quantize_dequantize(
                        src(), "e2m1", axis=axis, rotation=rot, scale_rule="even")),
                    ("quantize + dequantize", lambda: native.dequantize(native.quantize(
                        src(), "e2m1", axis=axis, rotation=rot, scale_rule="even"),
                        torch.bfloat16))):
                ms = bench(fn)
                out.append(dict(case=f"{name} e2m1 -> bf16 axis={axis} rot={rot}", ms=ms,
                                gbs=copy_bytes / ms / 1e6, of_copy=copy_bytes / ms / 1e6 / copy_gbs))
    mx = native.quantize(src(), "e2m1")
    ms = bench(lambda: native.dequantize(mx, torch.bfloat16))
    nbytes = m * k * 2 + m * k // 2 + m * k // 32
    out.append(dict(case="dequantize e2m1 -> bf16", ms=ms, gbs=nbytes / ms / 1e6,
                    of_copy=nbytes / ms / 1e6 / copy_gbs))
    rows.extend(out)


def section_gemm(rows):
    for k, n in LLAMA_SHAPES:
        m = TOKENS
        flop = 2 * m * n * k
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        t_bf16 = bench(lambda: a @ b.t())
        a8, sa = native.fp8_per_tensor(a)
        b8, sb = native.fp8_per_tensor(b)
        t_fp8 = bench(lambda: torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb,
                                               out_dtype=torch.bfloat16))
        qa, qb = native.quantize(a, "e2m1"), native.quantize(b, "e2m1")
        ds = dict(out_dtype=torch.bfloat16, method="dot_scaled")
        native.mx_matmul(qa, qb, **ds)  # autotune outside the timing
        t_mx = bench(lambda: native.mx_matmul(qa, qb, **ds))
        cfg = getattr(native.gemm._tuned_kernel(), "best_config", None)
        q8a, q8b = native.quantize(a, "e4m3"), native.quantize(b, "e4m3")
        native.mx_matmul(q8a, q8b, **ds)
        t_mx8 = bench(lambda: native.mx_matmul(q8a, q8b, **ds))
        t_deq = bench(lambda: native.mx_matmul(qa, qb, out_dtype=torch.bfloat16, method="bf16"))
        # issue 17: MXFP4 folded into E4M3, then the FP8 GEMM of folded operands (tiles
        # autotuned per shape, outside the timing), at each method's group
        # (native.gemm.FOLD_GROUPS: 4 blocks promoted, 32 chained); fold time apart
        g_exact, g_fp8 = native.gemm.FOLD_GROUPS["fp8_exact"], native.gemm.FOLD_GROUPS["fp8"]
        # (the GEMM: the Gluon kernel on sm_90, ``folded_matmul(kernel='auto')``, beside the
        # Triton kernel; the same bits)
        fa, fb = fold.fold(qa, g_exact, pow2=True), fold.fold(qb, g_exact, pow2=True)
        fold.folded_matmul(fa, fb, torch.bfloat16, kernel="triton")
        t_fgemm = bench(lambda: fold.folded_matmul(fa, fb, torch.bfloat16))
        t_fgemm_t = bench(lambda: fold.folded_matmul(fa, fb, torch.bfloat16, kernel="triton"))
        fcfg = fold.tuned_tile(True, m, n, k, g_exact)
        ca, cb = fold.fold(qa, g_fp8, pow2=True), fold.fold(qb, g_fp8, pow2=True)
        fold.folded_matmul(ca, cb, torch.bfloat16, promote=False, kernel="triton")
        t_fchain = bench(lambda: fold.folded_matmul(ca, cb, torch.bfloat16, promote=False))
        t_fchain_t = bench(lambda: fold.folded_matmul(ca, cb, torch.bfloat16, promote=False,
                                                      kernel="triton"))
        ccfg = fold.tuned_tile(False, m, n, k, g_fp8)
        kern = "Gluon" if fold.wgmma_supported(fa, fb, torch.bfloat16) is None else "Triton"
        t_exact_e2e = bench(lambda: native.mx_matmul(qa, qb, out_dtype=torch.bfloat16,
                                                     method="fp8_exact"))
        t_fp8_e2e = bench(lambda: native.mx_matmul(qa, qb, out_dtype=torch.bfloat16,
                                                   method="fp8"))
        # cuBLAS's blockwise 1 x 128 FP8 GEMM on operands folded at group 4 (method fp8_cublas)
        s_a, s_b = fold.blockwise_scales(fa, fb)
        a8, b8 = fa.codes.view(torch.float8_e4m3fn), fb.codes.view(torch.float8_e4m3fn)
        t_cublas = bench(lambda: torch._scaled_mm(a8, b8.t(), scale_a=s_a, scale_b=s_b,
                                                  out_dtype=torch.bfloat16))
        t_cublas_e2e = bench(lambda: native.mx_matmul(qa, qb, out_dtype=torch.bfloat16,
                                                      method="fp8_cublas"))
        # whole rows folded, cuBLAS's rowwise-scaled FP8 GEMM (method fp8_cublas_rowwise)
        ra, rb = fold.fold(qa, None), fold.fold(qb, None)
        r_a, r_b = fold.rowwise_scales(ra, rb)
        r8a, r8b = ra.codes.view(torch.float8_e4m3fn), rb.codes.view(torch.float8_e4m3fn)
        t_rowwise = bench(lambda: torch._scaled_mm(r8a, r8b.t(), scale_a=r_a, scale_b=r_b,
                                                   out_dtype=torch.bfloat16))
        t_rowwise_e2e = bench(lambda: native.mx_matmul(qa, qb, out_dtype=torch.bfloat16,
                                                       method="fp8_cublas_rowwise"))
        t_fold_rows = bench(lambda: fold.fold(qa, None))
        t_fold = bench(lambda: fold.fold(qa, g_fp8))
        cases = (("cuBLAS bf16", t_bf16, None), ("FP8 _scaled_mm", t_fp8, None),
                 ("dot_scaled mxfp4", t_mx, cfg), ("dot_scaled mxfp8", t_mx8, None),
                 ("mxfp4 method=bf16 (dequantize + cuBLAS bf16)", t_deq, None),
                 (f"mxfp4 method=fp8_exact (GEMM only: folded group {g_exact}, promoted, "
                  f"{kern})", t_fgemm, None),
                 (f"mxfp4 method=fp8 (GEMM only: folded group {g_fp8}, chained, {kern})",
                  t_fchain, None),
                 (f"mxfp4 folded FP8 GEMM promoted (group {g_exact}, GEMM only, Triton kernel)",
                  t_fgemm_t, fcfg),
                 (f"mxfp4 folded FP8 GEMM chained (group {g_fp8}, GEMM only, Triton kernel)",
                  t_fchain_t, ccfg),
                 ("mxfp4 method=fp8_exact (fold both + GEMM)", t_exact_e2e, None),
                 ("mxfp4 method=fp8 (fold both + GEMM)", t_fp8_e2e, None),
                 (f"mxfp4 folded FP8 _scaled_mm blockwise 1x128 (group {g_exact}, GEMM only)",
                  t_cublas, None),
                 ("mxfp4 method=fp8_cublas (fold both + GEMM)", t_cublas_e2e, None),
                 ("mxfp4 folded FP8 _scaled_mm rowwise (whole rows, GEMM only)", t_rowwise,
                  None),
                 ("mxfp4 method=fp8_cublas_rowwise (fold both + GEMM)", t_rowwise_e2e, None))
        rows.append(dict(case=f"fold A M={m} K={k} mxfp4 -> e4m3 (group {g_fp8})", ms=t_fold,
                         of_bf16=t_bf16 / t_fold))
        rows.append(dict(case=f"fold A M={m} K={k} mxfp4 -> e4m3 (whole rows)", ms=t_fold_rows,
                         of_bf16=t_bf16 / t_fold_rows))
        for name, t, config in cases:  # config: the autotuned tile, where one was tuned
            rows.append(dict(case=f"gemm M={m} N={n} K={k} {name}", ms=t,
                             tflops=flop / t / 1e9, of_bf16=t_bf16 / t,
                             config=str(config) if config is not None else ""))


def section_linear(rows):
    t, d_in, d_out = TOKENS, 4096, 14336
    x = torch.randn(t, d_in, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(t, d_out, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.Linear(d_in, d_out, bias=False, device="cuda", dtype=torch.bfloat16)

    def step(mod):
        x.grad = None
        for p in mod.parameters():
            p.grad = None
        mod(x).backward(gy)
    t_ref = bench(lambda: step(ref), rep=100)
    rows.append(dict(case=f"linear fwd+bwd T={t} {d_in}->{d_out} nn.Linear bf16", ms=t_ref,
                     of_bf16=1.0))
    # each recipe under method auto (on Hopper: fp8_cublas for FP4 operands, bf16 for the
    # rest), and the main MXFP4 recipes under each other GEMM method that takes them
    cases = [(name, "auto") for name in native.RECIPES]
    cases += [(name, m) for name in ("mxfp4_all", "mxfp4_all_h16", "mxfp4_wgrad",
                                     "mxfp4_wgrad_h16")
              for m in ("bf16", "fp8", "fp8_cublas", "fp8_cublas_rowwise")]
    for name, method in cases:
        lin = native.MXLinear(d_in, d_out, bias=False, recipe=name, device="cuda", method=method)
        step(lin)
        ms = bench(lambda: step(lin), rep=100)
        rows.append(dict(case=f"linear fwd+bwd T={t} {d_in}->{d_out} {name} method={method}",
                         ms=ms, of_bf16=t_ref / ms))


def section_numerics(rows):
    """Fraction of dot_scaled outputs bit-equal to each emulator accumulation model."""
    rng = np.random.default_rng(0)
    m, n, k = 128, 128, 4096
    for fmt in ("e2m1", "e4m3"):
        a = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda()
        b = torch.from_numpy(rng.standard_normal((n, k)).astype(np.float32)).cuda()
        qa, qb = native.quantize(a, fmt), native.quantize(b, fmt)
        ea, eb = qa.to_emulator(), qb.to_emulator()
        exact = emulator.mx_matmul(ea, eb, "exact").astype(np.float64)
        for method, model in itertools.product(("dot_scaled", "bf16"), (
                "exact", "fp32_sequential", "hopper_bf16", "hopper_fp8")):
            got = native.mx_matmul(qa, qb, method=method).cpu().numpy()
            want = emulator.mx_matmul(ea, eb, model)
            rel = np.abs(got.astype(np.float64) - exact) / np.abs(exact).clip(1e-30)
            rows.append(dict(case=f"numerics {fmt} {m}x{n}x{k} method={method} vs {model}",
                             bit_equal=float(np.mean(got.view(np.uint32) == want.view(np.uint32))),
                             max_rel_vs_exact=float(rel.max()),
                             median_rel_vs_exact=float(np.median(rel))))


def section_emulate(rows):
    """method='emulate' (issue 23): a chip's accumulation model reproduced bit for bit in a Triton
    GEMM (the chunked models: int64 products aligned one by one; fp32_sequential: the float32
    kernel), against cuBLAS bf16 and dot_scaled on the same shape (smaller than the Llama
    shapes: the emulation is slow by design)."""
    m, n, k = 2048, 4096, 4096
    flop = 2 * m * n * k
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    t_bf16 = bench(lambda: a @ b.t())
    rows.append(dict(case=f"emulate M={m} N={n} K={k} cuBLAS bf16", ms=t_bf16,
                     tflops=flop / t_bf16 / 1e9, of_bf16=1.0))
    for fmt in ("e2m1", "e4m3"):
        qa, qb = native.quantize(a, fmt), native.quantize(b, fmt)
        native.mx_matmul(qa, qb, method="dot_scaled")
        t = bench(lambda: native.mx_matmul(qa, qb, method="dot_scaled"))
        rows.append(dict(case=f"emulate M={m} N={n} K={k} {fmt} dot_scaled (not emulated)",
                         ms=t, tflops=flop / t / 1e9, of_bf16=t_bf16 / t))
        for model in ("hopper_bf16", "fp32_sequential", "hopper_fp8"):
            native.mx_matmul(qa, qb, method="emulate", model=model)
            t = bench(lambda: native.mx_matmul(qa, qb, method="emulate", model=model), rep=1000)
            rows.append(dict(case=f"emulate M={m} N={n} K={k} {fmt} method=emulate {model}",
                             ms=t, tflops=flop / t / 1e9, of_bf16=t_bf16 / t))


def section_fold(rows):
    """Issue 17: the quantize pass that writes the folded E4M3 operand (``quantize_folded``)
    against a copy and against the plain quantize of the same input, rows and columns (Wgrad's
    operands), H16 and stochastic rounding; and its host time per call."""
    m, k = TOKENS, 14336
    src, dst, copy_gbs = copy_baseline(rows, m, k)
    for group, pow2 in ((4, True), (4, False), (32, False)):
        for rot in (None, "hadamard16"):
            for axis in (-1, 0):
                for rnd in ("rne", "stochastic"):
                    if rnd == "stochastic" and (group, pow2) != (4, True):
                        continue
                    ms = bench(lambda: fold.quantize_folded(
                        src(), "e2m1", group, axis=axis, pow2=pow2, rotation=rot,
                        rounding=rnd, scale_rule="even"))
                    # bf16 in; E4M3 codes, MX scales, group exponents (and 2^R) out
                    nbytes = m * k * (2 + 1) + m * k // 32 + m * k // 32 // group * (
                        4 + 4 * pow2)
                    plain = bench(lambda: native.quantize(
                        src(), "e2m1", axis=axis, rotation=rot, rounding=rnd,
                        scale_rule="even"))
                    gbs = nbytes / ms / 1e6
                    rows.append(dict(
                        case=f"quantize_folded e2m1 group {group}{' pow2' if pow2 else ''} "
                             f"axis={axis} rot={rot} {rnd}", ms=ms, gbs=gbs,
                        of_copy=gbs / copy_gbs, of_quantize=plain / ms))
    # the fold of stored codes (``fold.fold``: ``mx_matmul``'s fp8 methods on MXTensors)
    q = native.quantize(src(), "e2m1", scale_rule="even")
    for group, pow2 in ((4, True), (32, False)):
        ms = bench(lambda: fold.fold(q, group) if not pow2 else fold.fold_kmajor(
            q.data, q.scales_kmajor, k, q.fmt, group, pow2=True))
        nbytes = m * k * (0.5 + 1) + m * k // 32 + m * k // 32 // group * (4 + 4 * pow2)
        gbs = nbytes / ms / 1e6
        rows.append(dict(case=f"fold e2m1 group {group}{' pow2' if pow2 else ''} (from codes)",
                         ms=ms, gbs=gbs, of_copy=gbs / copy_gbs))
    tiny = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    for name, fn in (("quantize e2m1", lambda: native.quantize(tiny, "e2m1")),
                     ("quantize_folded e2m1 group 4 pow2",
                      lambda: fold.quantize_folded(tiny, "e2m1", 4, pow2=True))):
        rows.append(dict(case=f"host time per call, {name} (us, best of 5 x 500)",
                         us=host_us(fn)))


COLUMN_TILES = [
    # a column per thread (2-byte loads): 0.15 of copy on H100; the cols32 default
    ColumnTile(64, 2),
    # vectorized loads and a layout conversion (hundreds of warp shuffles): the best of them
    # (0.45 on H100 without a rotation) and one more; the others spilled and ran at 0.02-0.13
    # (results/native_gpu/archive/bench_columns_h100_2026-11-25.md)
    ColumnTile(64, 4, 4, False, True), ColumnTile(32, 2, 8, False, True),
    # a column pair per thread (4-byte loads, 128 bytes of a row per warp instruction): no
    # spill compiled for sm_90, ~24 SASS instructions per element (kernel_sass.py --columns);
    # (128, 2, kb_fast) is the H100 default for quantize (0.49-0.56 of copy), (64, 1) the H200
    # default for quantize (0.38-0.43), (64, 1, kb_fast) both GPUs' default for
    # quantize-dequantize (H100 0.56-0.63, H200 0.51-0.53)
    ColumnTile(64, 1, vec=2), ColumnTile(128, 2, vec=2), ColumnTile(256, 4, vec=2),
    ColumnTile(128, 2, 1, True, True, vec=2), ColumnTile(64, 1, 1, True, True, vec=2),
    ColumnTile(256, 4, 1, True, True, vec=2), ColumnTile(512, 8, 1, True, True, vec=2),
    # the H100 default's tile at 154 registers (12 warps an SM) capped at 128 (16 warps; 18
    # words spilled, compiled for sm_90): occupancy against spills
    ColumnTile(128, 2, 1, True, True, vec=2, maxnreg=128),
    ColumnTile(256, 4, 1, True, True, vec=2, maxnreg=128),
    # four columns per thread (8-byte loads): spills a little compiled for sm_90
    ColumnTile(256, 2, vec=4),
    # the pair as 4-byte words, its even column quantized, then its odd one (``split``): 95-96
    # registers compiled for sm_90 with Triton 3.9 (RNE, no rotation or H16; 124-128 with SR)
    # against 154-247 unsplit, no spill (kernel_sass.py --columns; two pairs per thread, 256
    # columns on 2 warps, take 255 again): the H100 and H200 defaults' tiles split, and 256 on
    # 4 warps. Timed on an H100 (Triton 3.6, results/native_gpu/bench_columns_h100.md): slower
    # than unsplit, quantize 0.21-0.23 / 0.19 / 0.12 of copy (no rotation / H16 / H16 + SR)
    # against 0.48-0.51 / 0.47-0.56 / 0.48-0.49 unsplit; quantize-dequantize 0.45-0.46 (as
    # the transpose; unsplit 0.32-0.63, the default (64, 1, kb_fast) 0.63 / 0.56 with no
    # rotation / H16). No default takes them. Triton 3.6 (the GPU hosts') compiles the H100
    # tile split to 166-168 registers with 290-354 warp shuffles and 1.6-2.7x the instructions
    # per element (results/native_gpu/sass_columns_split.txt): the likely reason
    ColumnTile(128, 2, 1, True, True, vec=2, split=True),
    ColumnTile(64, 1, vec=2, split=True), ColumnTile(64, 1, 1, True, True, vec=2, split=True),
    ColumnTile(256, 4, 1, True, True, vec=2, split=True),
    # the row stride compiled in (``const_stride``): the tile's 32 loads at immediate offsets
    # from one base pointer, ~1.8 SASS instructions per element fewer (Triton 3.6 and 3.9,
    # kernel_sass.py --columns); on an H100 within 1-2% of the same tiles without it
    # (results/native_gpu/bench_columns_h100.md, 0401580): the one-block tiles are bound by
    # their stores (column_probe.py), not by instructions
    ColumnTile(128, 2, 1, True, True, vec=2, const_stride=True),
    ColumnTile(64, 1, 1, True, True, vec=2, const_stride=True),
    ColumnTile(64, 1, vec=2, const_stride=True),
    # two blocks along K per program: each column's codes a whole 32-byte sector; the H100
    # defaults since d8d96d7 (quantize (128, 2, 2), qdq (64, 2, 2):
    # results/native_gpu/column_tile_check_h100.txt)
    ColumnTile(128, 2, 2, True, True, vec=2), ColumnTile(64, 2, 2, True, True, vec=2),
    ColumnTile(64, 1, 2, True, True, vec=2), ColumnTile(256, 4, 2, True, True, vec=2),
    ColumnTile(128, 2, 2, True, True, vec=2, const_stride=True),
    # the blocks along K one after another (``serial``): one block's registers (no spill under
    # Triton 3.9, where the two-block tiles at once spill), each column's codes still written
    # by one program. They lose on an H100 (results/native_gpu/column_tile_check_h100.txt:
    # quantize at most 0.56 / 0.57 of copy, qdq 0.56 / 0.37, none / H16): a column's half
    # sectors stored a pass apart do not merge (column_probe.py's serial mode)
    ColumnTile(128, 2, 2, True, True, vec=2, serial=True),
    ColumnTile(64, 1, 2, True, True, vec=2, serial=True),
    ColumnTile(128, 2, 4, True, True, vec=2, serial=True),
    ColumnTile(64, 1, 4, True, True, vec=2, serial=True)]


BOTH_AXES_TILES = ((64, 2), (128, 2), (128, 4), (256, 4))
# quantize along axis 0 through the axis-0 kernel: the tiles above hold a column's whole block
# per thread (sm_90, Triton 3.6, E2M1: 122-254 registers, 16-byte code stores) and wrote it at
# 0.48-0.52 of copy on an H100 (bench_columns_kernel_h100.md), slower than their qdq (0.92-0.95)
# though fewer bytes; these hold half a block per thread (61-74 registers, 8-byte stores;
# 30-39 instructions per element against 24-28) or a block on one warp, and ran slower still
# there (0.41-0.45): the registers are not the bound
BOTH_AXES_QUANTIZE_TILES = BOTH_AXES_TILES + ((32, 1), (32, 2), (64, 4), (128, 8))
# and with 2 or 4 blocks along axis 0 a program (``Tuning.both_axes_blocks``: each column's
# codes stored 32 or 64 bytes at a time, whole sectors; sm_90 SASS, Triton 3.6: 230-249
# registers for 2 warps / 64 columns / 2 blocks, no spill, 23-27 instructions per element)
BOTH_AXES_BLOCK_TILES = ((64, 2, 2), (32, 1, 2), (128, 4, 2), (64, 4, 2), (32, 2, 4),
                         (64, 4, 4))


def both_axes_ways(field: str, tiles=BOTH_AXES_TILES) -> list:
    """(name, tuning) for each tile of ``kernels.both_axes.columns_kernel`` along axis 0:
    ``field`` 'columns' (quantize) or 'columns_qdq'; a tile (columns, warps) or (columns,
    warps, blocks along axis 0 a program)."""
    return [(f"both_axes{tuple(t)}",
             dataclasses.replace(GPU, **{field: "both_axes"}, both_axes=tuple(t[:2]),
                                 both_axes_blocks=t[2] if len(t) > 2 else 1))
            for t in tiles]


def section_columns(rows, short: bool = False):
    """Issue 18: blocks of 32 along tokens (Wgrad's operands, axis 0 of bf16 8192 x 14336 ->
    MXFP4) through the one-pass column kernel per tile (``ColumnTile``: columns, warps, blocks
    along K, loads of ``vec`` columns per thread or vectorized, launch order) and through the
    both-axes module's axis-0 kernel per tile (``columns='both_axes'``), against a copy,
    the transpose + row kernel path and the default of this GPU (``default_tuning``);
    then quantize-dequantize along tokens through the default, the transpose, the vec tiles
    and the axis-0 kernel (``columns_qdq='both_axes'``). ``short``: the default, the
    transpose and the axis-0 kernel's tiles only. Every row's bits are compared with the
    transpose path's (``bits_equal``: codes and scale bytes, or the bf16 values; the row
    kernel on the transposed input, so independent of every column path timed)."""
    m, k = TOKENS, 14336
    src, dst, copy_gbs = copy_baseline(rows, m, k)
    nbytes = m * k * 2 + m * k // 2 + m * k // 32
    transpose = ("transpose", dataclasses.replace(GPU, columns="transpose",
                                                  columns_qdq="transpose"))
    kernel_ways = [] if short else [
        (str(t), dataclasses.replace(GPU, columns="kernel", cols32=t)) for t in COLUMN_TILES]
    # what a call without tuning= runs on this GPU (``default_tuning``: per GPU model)
    default = ("default", native.default_tuning(src().device))
    x = src()

    def timed(case, fn, want, gbs_of_ms, of_copy):
        try:
            got = fn(x)
            ms = bench(lambda: fn(src()))
        except Exception as e:  # a tile that does not compile: say so, go on
            rows.append(dict(case=f"{case}: {type(e).__name__}"))
            return
        same = all(torch.equal(g, w) for g, w in zip(got, want))
        rows.append(dict(case=case, ms=ms, gbs=gbs_of_ms(ms), of_copy=of_copy(ms),
                         bits_equal=same))

    for rot, rnd in ((None, "rne"), ("hadamard16", "rne"), ("hadamard16", "stochastic")):
        def quantize(t, tuning):
            q = native.quantize(t, "e2m1", axis=0, rotation=rot, rounding=rnd,
                                scale_rule="even", tuning=tuning)
            return q.data, q.scales_kmajor
        want = quantize(x, transpose[1])
        ways = [default, transpose] + kernel_ways + (
            both_axes_ways("columns", BOTH_AXES_QUANTIZE_TILES + BOTH_AXES_BLOCK_TILES)
            if rnd == "rne" else [])
        for name, tuning in ways:
            timed(f"columns {name} e2m1 rot={rot} {rnd}",
                  lambda t, tuning=tuning: quantize(t, tuning), want,
                  lambda ms: nbytes / ms / 1e6, lambda ms: nbytes / ms / 1e6 / copy_gbs)
    # quantize-dequantize along tokens (what a bf16 Wgrad GEMM is fed: 2 bytes read and 2
    # written per element, a copy's traffic), through the transpose and the vec tiles
    # and the axis-0 kernel
    qdq_ways = [default, transpose] + [
        (str(t), dataclasses.replace(GPU, columns_qdq="kernel", cols32_qdq=t))
        for t in COLUMN_TILES if t.vec > 1 and not short] + both_axes_ways("columns_qdq")
    for rot in (None, "hadamard16"):
        def qdq(t, tuning):
            return (native.quantize_dequantize(t, "e2m1", axis=0, rotation=rot,
                                               scale_rule="even", tuning=tuning),)
        want = qdq(x, transpose[1])
        for name, tuning in qdq_ways:
            timed(f"columns qdq {name} e2m1 -> bf16 rot={rot}",
                  lambda t, tuning=tuning: qdq(t, tuning), want,
                  lambda ms: 2 * m * k * 2 / ms / 1e6,
                  lambda ms: 2 * m * k * 2 / ms / 1e6 / copy_gbs)


def section_columns_both(rows):
    """The short form of ``section_columns``: this GPU's default, the transpose and the
    both-axes module's axis-0 kernel per tile (a minute or so)."""
    section_columns(rows, short=True)


HOST_REPEATS = 15  # rounds of every case and launch path in ``section_host``


def host_us(fn, calls: int = 500, repeats: int = 5) -> float:
    """Host time per call of ``fn`` in microseconds (best of ``repeats`` x ``calls``, after a
    warm-up; the GPU is synchronized between repeats only, so a host slower than the GPU
    measures the host)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return min(per_call)


def gpu_us(fn, calls: int = 200) -> float:
    """GPU time per call of ``fn`` in microseconds: the calls queued behind a ~0.1 s spin
    kernel, then run back to back, timed by CUDA events (a row whose ``host_us`` is not above
    this is bound by the GPU, not by the host)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(200_000_000)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


def section_host(rows):
    """Issue 18: host time per eager call of each native operation on a tiny input (the GPU
    time negligible): ``us`` with per-call plans (``native.plans``: quantize,
    quantize-dequantize and, since a766863, quantize_dequantize_both_axes; quantize_folded
    since the thirty-first session), ``us_no_plans``
    through the cached compiled kernels alone (``native.fastlaunch``), ``us_triton_launch``
    through Triton's own launch (``kernel[grid]``), ``us_plans_getitem`` with plans but the
    compiled kernel launched through ``CompiledKernel[grid]`` (``fastlaunch.DIRECT`` off),
    ``us_plans_tensors`` with plans passing the tensors themselves instead of their addresses
    (``fastlaunch.takes_addresses`` off: Triton's launcher then checks each pointer with the
    driver), in the same run; ``gpu_us`` the GPU's own time per call (with plans): where it is
    not below ``us`` the row measures the GPU, not the host. And one MXLinear forward +
    backward. Baseline: ``copy_`` of the same tensor."""
    from ocpmx.native import fastlaunch, plans
    tiny = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(tiny)
    q = native.quantize(tiny, "e2m1")
    qw = native.quantize(torch.randn(256, 1024, device="cuda"), "e2m1")
    lin = native.MXLinear(1024, 256, bias=False, recipe="mxfp4_all_h16").cuda().bfloat16()
    xg = tiny.clone().requires_grad_()
    fa = fold.quantize_folded(tiny, "e2m1", 32)
    fw = fold.quantize_folded(torch.randn(256, 1024, device="cuda"), "e2m1", 32)
    steps = {}  # (128 tokens: cuBLAS's blockwise Wgrad takes K in multiples of 128)
    x128 = torch.randn(128, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for method in ("fp8_cublas", "fp8"):
        layer = native.MXLinear(1024, 256, bias=False, recipe="mxfp4_all_h16",
                                method=method).cuda().bfloat16()
        steps[method] = (lambda layer: lambda: layer(x128).sum().backward())(layer)

    def step():
        lin(xg).sum().backward()

    cases = [("copy_", lambda: dst.copy_(tiny)),
             ("quantize e2m1", lambda: native.quantize(tiny, "e2m1")),
             ("quantize e2m1 H16", lambda: native.quantize(tiny, "e2m1", rotation="hadamard16")),
             ("quantize e2m1 axis=0 H16", lambda: native.quantize(
                 tiny, "e2m1", axis=0, rotation="hadamard16")),
             ("quantize e2m1 stochastic", lambda: native.quantize(
                 tiny, "e2m1", rounding="stochastic", seed=3)),
             ("quantize_dequantize e2m1 H16", lambda: native.quantize_dequantize(
                 tiny, "e2m1", rotation="hadamard16")),
             # (against the two one-axis calls it replaces in MXLinear)
             ("quantize_dequantize_both_axes e2m1 H16",
              lambda: native.quantize_dequantize_both_axes(tiny, "e2m1", rotation="hadamard16")),
             ("dequantize e2m1 -> bf16", lambda: native.dequantize(q, torch.bfloat16)),
             ("mx_matmul e2m1 64x1024 @ 1024x256", lambda: native.mx_matmul(q, qw)),
             ("quantize_folded e2m1 group 4 pow2",
              lambda: fold.quantize_folded(tiny, "e2m1", 4, pow2=True)),
             # (Wgrad's operands: along tokens, through this GPU's default column path)
             ("quantize_folded e2m1 group 4 pow2 axis=0 (128 x 1024)",
              lambda: fold.quantize_folded(x128.detach(), "e2m1", 4, pow2=True, axis=0)),
             ("folded_matmul chained group 32 64x1024 @ 1024x256",
              lambda: fold.folded_matmul(fa, fw, promote=False)),
             ("MXLinear 1024->256 mxfp4_all_h16 fwd+bwd", step),
             ("MXLinear 128x1024->256 mxfp4_all_h16 method=fp8_cublas fwd+bwd",
              steps["fp8_cublas"]),
             ("MXLinear 128x1024->256 mxfp4_all_h16 method=fp8 fwd+bwd", steps["fp8"])]
    stepping = (step, *steps.values())
    takes_addresses = fastlaunch.takes_addresses
    modes = {  # launch path -> (fastlaunch on, plan devices, direct launcher, addresses)
        "triton": (False, (), True, True), "fast": (True, (), True, True),
        "plans_getitem": (True, ("cuda",), False, True),
        "plans_tensors": (True, ("cuda",), True, False), "plans": (True, ("cuda",), True, True)}

    def set_mode(mode):
        enabled, plan_devices, direct, addresses = modes[mode]
        fastlaunch.ENABLED, plans.DEVICE_TYPES, fastlaunch.DIRECT = enabled, plan_devices, direct
        fastlaunch.takes_addresses = takes_addresses if addresses else (lambda k: False)
        plans.clear()

    # every (case, launch path) once per round, HOST_REPEATS rounds, the best round kept: a
    # host's slow spells (seconds long, up to 1.5x on the H100 hosts) reach every row alike,
    # and the best of many short rounds finds the quiet spells
    times = {(name, mode): float("inf") for name, _ in cases for mode in modes}
    for _ in range(HOST_REPEATS):
        for name, fn in cases:
            for mode in modes:
                set_mode(mode)
                t = host_us(fn, calls=50 if fn in stepping else 200, repeats=1)
                times[name, mode] = min(times[name, mode], t)
    set_mode("plans")
    for name, fn in cases:
        t = {mode: times[name, mode] for mode in modes}
        rows.append(dict(case=f"host time per call, {name} (us, best of {HOST_REPEATS})",
                         us=t["plans"], gpu_us=gpu_us(fn, 20 if fn in stepping else 200),
                         us_plans_tensors=t["plans_tensors"],
                         us_plans_getitem=t["plans_getitem"], us_no_plans=t["fast"],
                         us_triton_launch=t["triton"], speedup=t["triton"] / t["plans"]))


def section_stochastic(rows):
    """Issue 18's stochastic rounding against RNE and a copy in one run (bf16 8192 x 14336):
    rows and columns (axis 0, this GPU's default path), no rotation and H16, FP4, FP6 and FP8
    elements, and the gfx950 conversion's stochastic rounding (rows, no rotation); first the
    row kernel's tiles under stochastic rounding (E2M1). Row names as in ``quantize``, with
    ``conversion=gfx950`` appended where it is not 'ocp'."""
    m, k = TOKENS, 14336
    src, dst, copy_gbs = copy_baseline(rows, m, k)
    nbytes4 = m * k * 2 + m * k // 2 + m * k // 32
    for rot in (None, "hadamard16"):  # row tiles (speed only; the tests pin the bits)
        for tile in (RowTile(32, 1, 72), RowTile(32, 1), RowTile(32, 1, 96), RowTile(64, 2),
                     RowTile(64, 2, 72), RowTile(128, 4)):
            tuning = dataclasses.replace(native.default_tuning(dst.device), rows32=tile)
            ms = bench(lambda: native.quantize(src(), "e2m1", rotation=rot, scale_rule="even",
                                               rounding="stochastic", tuning=tuning))
            rows.append(dict(case=f"tile sweep rows32 {tile} e2m1 rot={rot} stochastic", ms=ms,
                             gbs=nbytes4 / ms / 1e6, of_copy=nbytes4 / ms / 1e6 / copy_gbs))
    for fmt, axes in (("e2m1", (-1, 0)), ("e3m2", (-1,)), ("e4m3", (-1,))):
        # bytes moved: the bf16 input, the codes as stored (FP6 one a byte), the scales
        nbytes = m * k * 2 + m * k // pack_factor(get_format(fmt)) + m * k // 32
        for axis in axes:
            for rot in (None, "hadamard16"):
                for rnd, conv in (("rne", "ocp"), ("stochastic", "ocp"),
                                  ("stochastic", "gfx950")):
                    if conv == "gfx950" and (axis, rot) != (-1, None):
                        continue  # (gfx950's conversion: rows without a rotation)
                    ms = bench(lambda: native.quantize(src(), fmt, axis=axis, rotation=rot,
                                                       rounding=rnd, scale_rule="even",
                                                       conversion=conv))
                    tail = "" if conv == "ocp" else f" conversion={conv}"
                    rows.append(dict(case=f"quantize {fmt} axis={axis} rot={rot} {rnd}{tail}",
                                     ms=ms, gbs=nbytes / ms / 1e6,
                                     of_copy=nbytes / ms / 1e6 / copy_gbs))


SECTIONS = {"quantize": section_quantize, "gemm": section_gemm, "linear": section_linear,
            "numerics": section_numerics, "emulate": section_emulate, "fold": section_fold,
            "host": section_host, "columns": section_columns,
            "columns_both": section_columns_both,
            "stochastic": section_stochastic}


def header():
    p = torch.cuda.get_device_properties(0)
    return dict(device=p.name, capability=f"{p.major}.{p.minor}", torch=torch.__version__,
                triton=triton.__version__, cuda=torch.version.cuda, python=platform.python_version(),
                command="python " + " ".join(sys.argv), date=time.strftime("%Y-%m-%d %H:%M:%S"))


def to_markdown(head, rows):
    lines = ["# Native backend GPU benchmark", "", *(f"- {k}: `{v}`" for k, v in head.items()), ""]
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    lines.append("| " + " | ".join(keys) + " |")
    lines.append("|" + "---|" * len(keys))
    for r in rows:
        cells = [f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="results/native_gpu")
    ap.add_argument("--sections", nargs="+", choices=list(SECTIONS),
                    default=[s for s in SECTIONS if s not in ("columns_both", "stochastic")])
    # (columns_both: part of columns; stochastic: rows of quantize and columns)
    args = ap.parse_args()
    torch.manual_seed(0)
    head = header()
    rows = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for s in args.sections:
        t0 = time.time()
        SECTIONS[s](rows)
        print(f"[{s}] {time.time() - t0:.1f} s", flush=True)
        (out / "bench.json").write_text(json.dumps(dict(header=head, rows=rows), indent=1))
        (out / "bench.md").write_text(to_markdown(head, rows))
    print(to_markdown(head, rows))


if __name__ == "__main__":
    main()
