"""An experiment for issue 17's ``method="fp8"`` target (>= 1.5x cuBLAS bf16): the chained folded
FP8 GEMM (``native.fold.folded_matmul(promote=False)``: each group's wgmmas chained in the tensor
core, one float32 epilogue per group) as a persistent kernel over TMA tensor descriptors whose
tile loop Triton warp-specializes (``tl.range(..., warp_specialize=True)``: on sm_90 Triton 3.6
runs Meta's Hopper pass, a producer warp group issuing the TMA loads and consumer warp groups
the wgmmas and the epilogue, so a group's epilogue no longer drains the MMA pipeline).

Not a library path yet. On a GPU it checks the output bit for bit against the library's chained
kernel (the same sums: the group's K = 32 wgmmas in K order, the accumulator chained, then
acc += (T * 2^ea) * 2^eb) and times both beside cuBLAS bf16 at Llama-8B shapes. Without a GPU,
``--compile-only`` compiles each configuration for sm_90 (the Triton installed) and prints
registers, spills, wgmmas and whether the loop was warp-specialized.

  python benchmarks/fold_gemm_ws.py [--compile-only] [--configs BM,BN,STAGES,WARPS ...]
  TRITON_INTERPRET=1 python benchmarks/fold_gemm_ws.py --interpret   # the indexing, on a CPU

``--interpret``: small operands through the Triton interpreter (K = 32 per dot, as the
library's kernel takes there), bit for bit against ``folded_matmul(promote=False)``: checks the
descriptors' indexing and the epilogue, not the GPU's sums.

Compiled for sm_90 under Triton 3.6.0 (this machine, 2026-11-27; groups of 32 blocks, BK =
128): 128 x 128 on 4 warps warp-specializes (168 registers, no spill, against 255 and 59 spill
stores unspecialized); with 8 warps the pass does not apply (242 registers, no spill, as
unspecialized); 128 x 256 spills (398 stores) and needs 279 KB of shared memory; 64 x 256 does
not compile; at groups of 4 blocks every tile spills. Not yet run on a GPU.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GROUP = 32  # blocks per fold group (method "fp8"'s)
BK = 128


@triton.jit
def _pow2(e):
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def ws_folded_gemm(a_desc, b_desc, ea_ptr, eb_ptr, c_ptr, M, N, K,
                   GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   NUM_SMS: tl.constexpr, WS: tl.constexpr):
    """C[M, N] (float32) = A Bᵀ of folded operands (E4M3 codes behind the descriptors, group
    exponents ea (M, K / (32 GROUP)), eb (N, ...)), every exponent within the rank-1 epilogue's
    range (``kernels.fold.RANK1_EXP``; the host checks the operands' wide flags). M, N
    multiples of BM, BN; K of 32 GROUP. Launched with fusion off, as the library's kernel: the
    epilogue's product is rounded, then added."""
    n_n = N // BN
    tiles = (M // BM) * n_n
    n_groups = K // (32 * GROUP)
    STEPS: tl.constexpr = GROUP * 32 // BK
    for tile in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True, warp_specialize=WS):
        m0 = (tile // n_n) * BM
        n0 = (tile % n_n) * BN
        rm = m0 + tl.arange(0, BM)
        rn = n0 + tl.arange(0, BN)
        acc = tl.zeros((BM, BN), tl.float32)
        for g in range(n_groups):
            t = tl.zeros((BM, BN), tl.float32)
            for j in range(STEPS):
                k = g * (GROUP * 32) + j * BK
                t = tl.dot(a_desc.load([m0, k]), b_desc.load([n0, k]).T, t)
            ea = tl.load(ea_ptr + rm * n_groups + g)
            eb = tl.load(eb_ptr + rn * n_groups + g)
            acc += (t * _pow2(ea)[:, None]) * _pow2(eb)[None, :]
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


def parse(spec: str) -> tuple:
    bm, bn, stages, warps = (int(v) for v in spec.split(","))
    return bm, bn, stages, warps


def compile_only(configs):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import kernel_sass as ks  # (it sets the launch's Hopper options: here only)
    fn = ws_folded_gemm
    for bm, bn, stages, warps in configs:
        for ws in (False, True):
            sig = {"a_desc": f"tensordesc<fp8e4nv[{bm},{BK}]>",
                   "b_desc": f"tensordesc<fp8e4nv[{bn},{BK}]>", "ea_ptr": "*i32",
                   "eb_ptr": "*i32", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"}
            consts = dict(GROUP=GROUP, BM=bm, BN=bn, BK=BK, NUM_SMS=132, WS=ws)
            src = ASTSource(fn, {**sig, **{c: "constexpr" for c in consts}},
                            constexprs={(fn.arg_names.index(c),): v for c, v in consts.items()},
                            attrs={(i,): [["tt.divisibility", 16]] for i in (2, 3, 4, 5, 6, 7)})
            name = f"{bm}x{bn} stages {stages} warps {warps} {'WS' if ws else 'no WS'}"
            try:
                ck = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                    options={"num_warps": warps, "num_stages": stages,
                                             "enable_fp_fusion": False})
            except Exception as e:  # a configuration the compiler refuses
                print(f"{name}: FAILS ({type(e).__name__})", flush=True)
                continue
            sass = ks.disassemble(ck.asm["cubin"])
            print(f"{name}: {ks.registers(sass)} registers, {sass.count('STL')} spill stores, "
                  f"{sass.count('QGMMA')} wgmmas, warp-specialized "
                  f"{'ttg.warp_return' in ck.asm['ttgir']}, shared {ck.metadata.shared}",
                  flush=True)


def on_gpu(configs):
    import gpu_bench as gb
    from ocpmx.native import fold
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton "
          f"{triton.__version__}; groups of {GROUP}, BK {BK}", flush=True)
    bad = 0
    for m, n, k in ((8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336),
                    (8192, 6144, 4096)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a = fold.quantize_folded(x, "e2m1", GROUP, scale_rule="even")
        b = fold.quantize_folded(w, "e2m1", GROUP, scale_rule="even")
        assert int(a.wide) == 0 and int(b.wide) == 0, "the rank-1 epilogue only"
        # the library's chained kernel (method "fp8")
        want = fold.folded_matmul(a, b, promote=False)
        bf16 = gb.bench(lambda: x @ w.T)
        lib = gb.bench(lambda: fold.folded_matmul(a, b, promote=False))
        flops = 2 * m * n * k
        print(f"M={m} N={n} K={k}: cuBLAS bf16 {bf16:.4f} ms; library chained "
              f"{lib:.4f} ms ({bf16 / lib:.3f}x bf16)", flush=True)
        a8 = a.codes.view(torch.float8_e4m3fn)
        b8 = b.codes.view(torch.float8_e4m3fn)
        for bm, bn, stages, warps in configs:
            for ws in (False, True):
                c = torch.empty(m, n, device="cuda", dtype=torch.float32)
                ad = TensorDescriptor.from_tensor(a8, [bm, BK])
                bd = TensorDescriptor.from_tensor(b8, [bn, BK])
                name = f"  {bm}x{bn} stages {stages} warps {warps} {'WS' if ws else 'no WS'}"

                def run():
                    ws_folded_gemm[(min(sms, (m // bm) * (n // bn)),)](
                        ad, bd, a.exponents, b.exponents, c, m, n, k, GROUP=GROUP, BM=bm,
                        BN=bn, BK=BK, NUM_SMS=sms, WS=ws, num_warps=warps, num_stages=stages,
                        enable_fp_fusion=False)
                try:
                    run()
                except Exception as e:
                    print(f"{name}: FAILS ({type(e).__name__}: {str(e)[:120]})", flush=True)
                    continue
                same = torch.equal(c.view(torch.int32), want.view(torch.int32))
                bad += not same
                ms = gb.bench(run)
                print(f"{name}: {ms:.4f} ms, {flops / ms / 1e9:.0f} TFLOP/s, "
                      f"{bf16 / ms:.3f}x bf16, bits {'equal' if same else 'DIFFER'}",
                      flush=True)
    return 1 if bad else 0


def interpret() -> int:
    """--interpret: the kernel's bits against the library's chained kernel on CPU tensors."""
    from ocpmx.native import fold
    g = torch.Generator().manual_seed(0)
    bad = 0
    for m, n, k, group, bm, bn in ((64, 32, 256, 4, 32, 16), (32, 64, 512, 8, 16, 32)):
        block_exps = torch.randint(-4, 5, (m, k // 32), generator=g)
        x = torch.randn(m, k, generator=g) * torch.exp2(block_exps).repeat_interleave(32, 1)
        w = torch.randn(n, k, generator=g)
        a = fold.quantize_folded(x, "e2m1", group, scale_rule="even")
        b = fold.quantize_folded(w, "e2m1", group, scale_rule="even")
        want = fold.folded_matmul(a, b, promote=False)
        c = torch.empty(m, n, dtype=torch.float32)
        ad = TensorDescriptor.from_tensor(a.codes.view(torch.float8_e4m3fn), [bm, 32])
        bd = TensorDescriptor.from_tensor(b.codes.view(torch.float8_e4m3fn), [bn, 32])
        ws_folded_gemm[(3,)](ad, bd, a.exponents, b.exponents, c, m, n, k, GROUP=group, BM=bm,
                             BN=bn, BK=32, NUM_SMS=3, WS=True)
        same = torch.equal(c.view(torch.int32), want.view(torch.int32))
        bad += not same
        print(f"M={m} N={n} K={k} group {group} tile {bm}x{bn}: bits "
              f"{'equal' if same else 'DIFFER'}", flush=True)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--configs", nargs="+", default=["128,128,3,4", "128,128,4,4",
                                                      "128,256,3,4", "128,128,3,8"])
    args = ap.parse_args()
    configs = [parse(s) for s in args.configs]
    if args.interpret:
        sys.exit(interpret())
    if args.compile_only:
        compile_only(configs)
    else:
        sys.exit(on_gpu(configs))


if __name__ == "__main__":
    main()
