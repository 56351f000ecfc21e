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

Compiled for sm_90 under Triton 3.6.0 (this machine, 2026-11-27/28; groups of 32 blocks, BK =
128): the nested loop (``ws_folded_gemm``) warp-specializes on 4 warps: 128 x 128 at 168
registers and no spill (255 and 59 spill stores unspecialized), 64 x 128 at 168 (206
unspecialized); with 8 warps the pass does not apply; 64 x 256 on 4 warps fails in
ConvertTritonGPUToLLVM. The one-loop variants (``ws_folded_gemm_flat``, the group's epilogue
under an ``if``; ``ws_folded_gemm_desc``, every access through a descriptor) are never
warp-specialized by Triton 3.6 and spill at 128 x 128 (384 / 70 spill stores): the GPU run
times the nested kernel only (``--variants`` to add them).

On an H100 (2026-11-28, Triton 3.6; results/native_gpu/fold_gemm_ws_h100.txt): every run that
completed gave the library kernel's bits. Warp-specialized 64 x 128 on 4 warps: 0.72-0.84x
cuBLAS bf16 (0.68-0.81x unspecialized); 128 x 128 on 4 warps specialized: an illegal memory
access, twice (each combination now runs in a process of its own, so a fault loses one line);
unspecialized 0.83-0.99x; 128 x 128 on 8 warps (not specialized) 0.90-1.12x; the library's
chained kernel 1.05-1.20x in the same processes. Warp specialization as Triton 3.6 does it for
sm_90 does not bring method "fp8" toward 1.5x.
"""
from __future__ import annotations

import argparse
import itertools
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


@triton.jit
def ws_folded_gemm_flat(a_desc, b_desc, ea_ptr, eb_ptr, c_ptr, M, N, K,
                        GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, NUM_SMS: tl.constexpr, WS: tl.constexpr):
    """``ws_folded_gemm`` with one loop along K per tile (the group's epilogue under an
    ``if`` at its last step), the shape of Triton's warp-specialized persistent tutorials:
    the same sums in the same order."""
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
        t = tl.zeros((BM, BN), tl.float32)
        for kk in range(K // BK):
            t = tl.dot(a_desc.load([m0, kk * BK]), b_desc.load([n0, kk * BK]).T, t)
            if kk % STEPS == STEPS - 1:
                g = kk // STEPS
                ea = tl.load(ea_ptr + rm * n_groups + g)
                eb = tl.load(eb_ptr + rn * n_groups + g)
                acc += (t * _pow2(ea)[:, None]) * _pow2(eb)[None, :]
                t = tl.zeros((BM, BN), tl.float32)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)


@triton.jit
def ws_folded_gemm_desc(a_desc, b_desc, pa_desc, pb_desc, c_desc, M, N, K,
                        GROUP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BK: tl.constexpr, NUM_SMS: tl.constexpr, WS: tl.constexpr):
    """``ws_folded_gemm_flat`` with every global access through a tensor descriptor: each
    group's 2^R read from the fold's group-major float32 2^R (``pow2=True``: (K / (32 GROUP),
    rows), a [1, BM] block a group) and C stored through one; no pointer arithmetic in the
    warp-specialized loop. 2^R as float32 is the value ``_pow2`` builds (every exponent within
    the rank-1 epilogue's range is a normal float32): the same products."""
    n_n = N // BN
    tiles = (M // BM) * n_n
    STEPS: tl.constexpr = GROUP * 32 // BK
    for tile in tl.range(tl.program_id(0), tiles, NUM_SMS, flatten=True, warp_specialize=WS):
        m0 = (tile // n_n) * BM
        n0 = (tile % n_n) * BN
        acc = tl.zeros((BM, BN), tl.float32)
        t = tl.zeros((BM, BN), tl.float32)
        for kk in range(K // BK):
            t = tl.dot(a_desc.load([m0, kk * BK]), b_desc.load([n0, kk * BK]).T, t)
            if kk % STEPS == STEPS - 1:
                g = kk // STEPS
                pa = pa_desc.load([g, m0]).reshape(BM)
                pb = pb_desc.load([g, n0]).reshape(BN)
                acc += (t * pa[:, None]) * pb[None, :]
                t = tl.zeros((BM, BN), tl.float32)
        c_desc.store([m0, n0], acc)


VARIANTS = ("nested", "flat", "desc")


def parse(spec: str) -> tuple:
    bm, bn, stages, warps = (int(v) for v in spec.split(","))
    return bm, bn, stages, warps


def compile_only(configs, variants):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import kernel_sass as ks  # (it sets the launch's Hopper options: here only)
    for variant, (bm, bn, stages, warps), ws in itertools.product(variants, configs,
                                                                  (False, True)):
        if variant == "desc":
            fn = ws_folded_gemm_desc
            sig = {"a_desc": f"tensordesc<fp8e4nv[{bm},{BK}]>",
                   "b_desc": f"tensordesc<fp8e4nv[{bn},{BK}]>",
                   "pa_desc": f"tensordesc<fp32[1,{bm}]>", "pb_desc": f"tensordesc<fp32[1,{bn}]>",
                   "c_desc": f"tensordesc<fp32[{bm},{bn}]>", "M": "i32", "N": "i32", "K": "i32"}
        else:
            fn = ws_folded_gemm if variant == "nested" else ws_folded_gemm_flat
            sig = {"a_desc": f"tensordesc<fp8e4nv[{bm},{BK}]>",
                   "b_desc": f"tensordesc<fp8e4nv[{bn},{BK}]>", "ea_ptr": "*i32",
                   "eb_ptr": "*i32", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32"}
        consts = dict(GROUP=GROUP, BM=bm, BN=bn, BK=BK, NUM_SMS=132, WS=ws)
        args = list(sig)
        src = ASTSource(fn, {**sig, **{c: "constexpr" for c in consts}},
                        constexprs={(fn.arg_names.index(c),): v for c, v in consts.items()},
                        attrs={(args.index(a),): [["tt.divisibility", 16]]
                               for a in args if a.endswith("_ptr") or a in ("M", "N", "K")})
        name = (f"{variant} {bm}x{bn} stages {stages} warps {warps} "
                f"{'WS' if ws else 'no WS'}")
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


def launcher(variant: str, a, b, c, m: int, n: int, k: int, bm: int, bn: int,
             stages: int, warps: int, ws: bool, sms: int, bk: int = BK, interp: bool = False):
    """A function launching ``variant``'s kernel on folded operands ``a``, ``b`` (``desc``:
    with their 2^R, ``pow2=True``) into float32 ``c``."""
    grid = (min(sms, (m // bm) * (n // bn)),)
    ad = TensorDescriptor.from_tensor(a.codes.view(torch.float8_e4m3fn), [bm, bk])
    bd = TensorDescriptor.from_tensor(b.codes.view(torch.float8_e4m3fn), [bn, bk])
    opts = {} if interp else dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False)
    common = dict(GROUP=a.group, BM=bm, BN=bn, BK=bk, NUM_SMS=sms, WS=ws, **opts)
    if variant == "desc":
        pa = TensorDescriptor.from_tensor(a.pow2, [1, bm])
        pb = TensorDescriptor.from_tensor(b.pow2, [1, bn])
        cd = TensorDescriptor.from_tensor(c, [bm, bn])
        return lambda: ws_folded_gemm_desc[grid](ad, bd, pa, pb, cd, m, n, k, **common)
    kernel = ws_folded_gemm if variant == "nested" else ws_folded_gemm_flat
    return lambda: kernel[grid](ad, bd, a.exponents, b.exponents, c, m, n, k, **common)


SHAPES = ((8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336), (8192, 6144, 4096))


def on_gpu(configs, variants, one: bool = False):
    """Each (variant, configuration, WS) in a process of its own (``--one``): a kernel that
    faults (Hopper's warp specialization in Triton 3.6 did, with an illegal address) takes
    down its CUDA context, not the run. Returns 1 if any bits differ or any run failed."""
    if not one:
        import subprocess
        print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}, triton "
              f"{triton.__version__}; groups of {GROUP}, BK {BK}", flush=True)
        bad = 0
        for variant in variants:
            for bm, bn, stages, warps in configs:
                for ws in (False, True):
                    cmd = [sys.executable, os.path.abspath(__file__), "--one", "--variants",
                           variant, "--configs", f"{bm},{bn},{stages},{warps}"] + \
                        (["--ws"] if ws else [])
                    try:
                        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                        out, rc = r.stdout + r.stderr[-600:], r.returncode
                    except subprocess.TimeoutExpired:
                        out, rc = "timed out (300 s)", 124
                    print(out.rstrip(), flush=True)
                    if rc:
                        print(f"  {variant} {bm}x{bn} s{stages} w{warps} WS {ws}: FAILED "
                              f"rc={rc}", flush=True)
                    bad += rc != 0
        return 1 if bad else 0
    import gpu_bench as gb
    from ocpmx.native import fold
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    (variant,), ((bm, bn, stages, warps),), ws = variants, configs, ONE_WS
    bad = 0
    for m, n, k in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a = fold.quantize_folded(x, "e2m1", GROUP, scale_rule="even", pow2=True)
        b = fold.quantize_folded(w, "e2m1", GROUP, scale_rule="even", pow2=True)
        assert int(a.wide) == 0 and int(b.wide) == 0, "the rank-1 epilogue only"
        want = fold.folded_matmul(a, b, promote=False)  # the library's chained kernel
        bf16 = gb.bench(lambda: x @ w.T)
        lib = gb.bench(lambda: fold.folded_matmul(a, b, promote=False))
        flops = 2 * m * n * k
        c = torch.zeros(m, n, device="cuda", dtype=torch.float32)
        run = launcher(variant, a, b, c, m, n, k, bm, bn, stages, warps, ws, sms)
        name = f"{variant} {bm}x{bn} stages {stages} warps {warps} {'WS' if ws else 'no WS'}"
        run()
        same = torch.equal(c.view(torch.int32), want.view(torch.int32))
        bad += not same
        ms = gb.bench(run)
        print(f"M={m} N={n} K={k}: {name}: {ms:.4f} ms, {flops / ms / 1e9:.0f} TFLOP/s, "
              f"{bf16 / ms:.3f}x cuBLAS bf16 ({bf16:.4f} ms), library chained "
              f"{bf16 / lib:.3f}x, bits {'equal' if same else 'DIFFER'}", flush=True)
    return 1 if bad else 0


ONE_WS = False


def interpret(variants) -> int:
    """--interpret: each variant's bits against the library's chained kernel on CPU tensors
    (WS on: the interpreter runs the loop as written)."""
    from ocpmx.native import fold
    g = torch.Generator().manual_seed(0)
    bad = 0
    for m, n, k, group, bm, bn in ((64, 32, 256, 4, 32, 16), (32, 64, 512, 8, 16, 32)):
        block_exps = torch.randint(-4, 5, (m, k // 32), generator=g)
        x = torch.randn(m, k, generator=g) * torch.exp2(block_exps).repeat_interleave(32, 1)
        w = torch.randn(n, k, generator=g)
        a = fold.quantize_folded(x, "e2m1", group, scale_rule="even", pow2=True)
        b = fold.quantize_folded(w, "e2m1", group, scale_rule="even", pow2=True)
        want = fold.folded_matmul(a, b, promote=False)
        for variant in variants:
            c = torch.zeros(m, n, dtype=torch.float32)
            launcher(variant, a, b, c, m, n, k, bm, bn, 1, 4, True, 3, bk=32, interp=True)()
            same = torch.equal(c.view(torch.int32), want.view(torch.int32))
            bad += not same
            print(f"{variant}: M={m} N={n} K={k} group {group} tile {bm}x{bn}: bits "
                  f"{'equal' if same else 'DIFFER'}", flush=True)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--configs", nargs="+", default=["128,128,3,4", "64,128,4,4", "64,128,3,4",
                                                      "128,128,3,8"])
    ap.add_argument("--variants", nargs="+", default=["nested"], choices=VARIANTS,
                    help="(--interpret checks every variant unless given)")
    ap.add_argument("--one", action="store_true", help="(one variant, configuration and WS "
                    "setting in this process: what the GPU run starts per combination)")
    ap.add_argument("--ws", action="store_true", help="(with --one: warp-specialized)")
    args = ap.parse_args()
    configs = [parse(s) for s in args.configs]
    if args.interpret:
        given = any(a.startswith("--variants") for a in sys.argv)
        sys.exit(interpret(args.variants if given else VARIANTS))
    if args.compile_only:
        compile_only(configs, args.variants)
    else:
        global ONE_WS
        ONE_WS = args.ws
        sys.exit(on_gpu(configs, args.variants, args.one))


if __name__ == "__main__":
    main()
