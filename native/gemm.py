"""The MX GEMM through ``tl.dot_scaled`` and the baselines it is measured against.

``mx_matmul(a, b)`` contracts the quantized axis of ``a`` with the quantized axis of ``b``:
for a 2-D ``a`` quantized along axis 1 (M, K) and ``b`` along axis 1 (N, K) it is A Bᵀ; an
operand quantized along axis 0 is used transposed. The three training GEMMs are then
  Fprop  Y  = X Wᵀ   mx_matmul(q(X, axis=-1), q(W, axis=-1))
  Dgrad  ∇X = ∇Y W   mx_matmul(q(∇Y, axis=-1), q(W, axis=0))
  Wgrad  ∇W = ∇Yᵀ X  mx_matmul(q(∇Y, axis=0), q(X, axis=0))

Accumulation is fp32 inside ``tl.dot_scaled`` and is *not* bit-exact across chips by nature:
the order and width of the sums belong to the hardware (sm_100 and gfx950 MX units) or to
Triton's decomposition (Hopper and older: operands upcast to bf16, scale multiplied in, a bf16
dot with Hopper's accumulation; the CPU interpreter: a NumPy float32 matmul). The tests
measure the difference against the emulator's exact model and state it.
"""
from __future__ import annotations

import numpy as np
import torch

from .. import emulator
from ..spec import BLOCK_SIZE
from . import fold, launch
from .launch import cdiv
from ._lazy import kernels, triton
from .dispatch import blackwell, hopper, interpreting, pick_backend
from .ops import dequantize_kmajor
from .tensor import MXTensor, pack_factor

DOT_SCALED_FORMATS = ("e2m1", "e4m3", "e5m2")


def _configs():
    out = []
    for bm, bn, bk, w, s in [(128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (256, 128, 128, 8, 3),
                             (128, 128, 256, 8, 3), (128, 128, 128, 4, 4)]:
        out.append(triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8},
                                 num_warps=w, num_stages=s))
    return out


# gfx950 pads its LDS tiles: the compiled kernels use up to 1.5% more than the raw tile bytes
# (205,792 B for FP8 x FP8 at 128x128x256, 3 stages, against 202,752 B of tiles)
SMEM_MARGIN = 1.03


def smem_estimate(config: triton.Config, fmt_a: str, fmt_b: str) -> int:
    """Shared memory (LDS) bytes a GEMM config needs: ``num_stages`` buffers of the A and B
    tiles (FP4 two codes per byte) and their scales, with ``SMEM_MARGIN``. An upper bound of
    what Triton 3.9 allocated on gfx950 and sm_100a for every config of ``_configs`` and every
    format pair (``ocpmx audit`` compiles them and checks)."""
    kw = config.kwargs
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    pack = {name: 2 if name == "e2m1" else 1 for name in (fmt_a, fmt_b)}
    stage = bm * bk // pack[fmt_a] + bn * bk // pack[fmt_b] + (bm + bn) * bk // BLOCK_SIZE
    return int(config.num_stages * stage * SMEM_MARGIN)


def fitting_configs(configs, fmt_a: str, fmt_b: str, limit: int | None) -> list:
    """The configs whose ``smem_estimate`` fits in ``limit`` bytes (None: all of them)."""
    if limit is None:
        return list(configs)
    return [c for c in configs if smem_estimate(c, fmt_a, fmt_b) <= limit]


def _smem_limit(t: torch.Tensor) -> int | None:
    """The shared memory (LDS) per block of ``t``'s GPU; None on a CPU or the interpreter."""
    if interpreting() or t.device.type != "cuda":
        return None
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def spills_on_blackwell(config: triton.Config, fmt_a: str, fmt_b: str, out_bf16: bool,
                        ragged: bool) -> bool:
    """Whether Triton 3.9 spills registers compiling ``config`` for sm_100a (measured by
    ``ocpmx audit --arch sm_100a``, which compiles every config and checks again):
      * an fp32 output of more than 64 accumulators per thread (BLOCK_M x BLOCK_N over the
        threads) with M or N not a multiple of 16: the masked store spills ~250 registers;
      * an FP4 x FP8 product with BLOCK_K 256 and a bf16 output: 2 spilled registers."""
    kw = config.kwargs
    per_thread = kw["BLOCK_M"] * kw["BLOCK_N"] // (32 * config.num_warps)
    if not out_bf16 and ragged and per_thread > 64:
        return True
    return out_bf16 and kw["BLOCK_K"] == 256 and fmt_a == "e2m1" and fmt_b != "e2m1"


def _prune_configs(configs, named_args, **kwargs) -> list:
    """The autotuner's early prune: drop the configs that cannot launch on this device (on
    gfx950 the FP8 x FP8 128x128x256 3-stage tile needs more than its 160 KiB of LDS) and, on
    sm_100, those that spill registers (``spills_on_blackwell``)."""
    fa, fb, a = kwargs["FMT_A"], kwargs["FMT_B"], named_args["a_ptr"]
    kept = fitting_configs(configs, fa, fb, _smem_limit(a))
    if blackwell(a.device):
        ragged = named_args["M"] % 16 != 0 or named_args["N"] % 16 != 0
        kept = [c for c in kept
                if not spills_on_blackwell(c, fa, fb, kwargs["OUT_BF16"], ragged)]
    return kept


_tuned = None


def _tuned_kernel():
    """The GEMM kernel autotuned over tile shapes (tuning cannot change the bits of a single
    dot_scaled step, only the K-chunking the hardware sees; on MX units the result depends on
    BLOCK_K no more than on the unit itself). Configs over the device's shared memory are
    pruned before any is compiled."""
    global _tuned
    if _tuned is None:
        _tuned = triton.autotune(_configs(), key=["M", "N", "K", "FMT_A", "FMT_B"],
                                 prune_configs_by={"early_config_prune": _prune_configs})(
            kernels.gemm.mx_gemm_kernel)
    return _tuned


FOLD_FORMATS = emulator.fold.FOLD_FORMATS


def _as_operand(t: MXTensor, name: str, method: str = "dot_scaled",
                emulated: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(K-major data, scales) of a GEMM operand, checked for ``method`` (``emulated``: the
    emulator backend or method 'emulate', which take every format)."""
    if not isinstance(t, MXTensor):
        raise TypeError(f"{name} must be an ocpmx.native.MXTensor, got {type(t).__name__}")
    if len(t.shape) != 2:
        raise ValueError(f"{name} must be a 2-D MX tensor, got shape {t.shape}")
    if t.block_size != BLOCK_SIZE:
        raise ValueError(f"{name}: the MX GEMMs take block size {BLOCK_SIZE}, got {t.block_size}")
    if not emulated:
        if method in FOLD_METHODS and t.fmt.name not in FOLD_FORMATS:
            raise ValueError(f"{name}: method {method!r} folds {FOLD_FORMATS} (only FP4/FP6 "
                             f"formats fold into E4M3 exactly), got {t.fmt.name}")
        if method not in FOLD_METHODS and t.fmt.name not in DOT_SCALED_FORMATS:
            raise ValueError(f"{name}: tl.dot_scaled takes {DOT_SCALED_FORMATS}, got "
                             f"{t.fmt.name} (method 'emulate' takes every format)")
    return t.data, t.scales_kmajor


METHODS = ("auto", "dot_scaled", "bf16", "fp8_exact", "fp8", "fp8_cublas", "fp8_cublas_rowwise",
           "emulate")
# MX operands folded into E4M3 (native.fold); those summed by cuBLAS (torch._scaled_mm)
FOLD_METHODS = ("fp8_exact", "fp8", "fp8_cublas", "fp8_cublas_rowwise")
CUBLAS_METHODS = ("fp8_cublas", "fp8_cublas_rowwise")
# the fold methods' models (emulator.fold.FoldedModel: what each computes on Hopper) and their
# blocks per fold group (one E4M3 exponent per group; K / 32 not divisible: their gcd). The
# promoted path adds a float32 epilogue per 32 of K whatever the group; the chained one adds
# one per group, so its speed grows with the group (H100, 8192 x 6144 x 4096: 0.48x cuBLAS
# bf16 at 4 blocks, 0.77x at 16, 1.03x at 32; results/native_gpu/fold_tile_sweep*.md),
# and so does the reach of a fold's rounding (a block more than 14 octaves below its group's
# largest is rounded; counted in FoldedTensor.inexact)
FOLD_MODELS = {"fp8_exact": emulator.fold.HOPPER_FP8_EXACT,
               "fp8": emulator.fold.HOPPER_FP8_CHAINED,
               "fp8_cublas": emulator.fold.HOPPER_FP8_CUBLAS,
               "fp8_cublas_rowwise": emulator.fold.HOPPER_FP8_CUBLAS_ROWWISE}
FOLD_GROUPS = {method: model.group for method, model in FOLD_MODELS.items()}  # None: whole rows


def has_mx_units(device: torch.device) -> bool:
    """True where ``tl.dot_scaled`` runs on MX matrix units (sm_100+, gfx950)."""
    if device.type != "cuda":
        return False
    if torch.version.hip:
        return "gfx950" in torch.cuda.get_device_properties(device).gcnArchName
    return torch.cuda.get_device_capability(device)[0] >= 10


def mx_matmul(a: MXTensor, b: MXTensor, *, out_dtype: torch.dtype = torch.float32,
              backend: str | None = None, method: str = "auto", model="exact",
              tune: bool = True) -> torch.Tensor:
    """Σ_k A[m, k] B[n, k] over the quantized axes of two MX tensors (see the module doc).

    backend 'triton' with method
      'dot_scaled'  the Triton kernel: ``tl.dot_scaled``, fp32 accumulation;
      'bf16'        dequantize both operands to bf16 (exact for e2m1 and e4m3 values times any
                    scale in bf16's normal range; e5m2 too) and one cuBLAS bf16 GEMM with fp32
                    accumulation: the same products Triton's decomposition forms on chips
                    without MX units, about 3x faster there (results/native_gpu);
      'fp8_exact'   FP4/FP6 operands folded into E4M3 with one exponent per 4 blocks (a 128-wide
                    K tile; ``native.fold``), then an FP8 tensor-core GEMM promoting every
                    K = 32: bit for bit ``emulator.fold.folded_matmul(..., dot=
                    fold.dot_model(device))``. 0.42-0.50x cuBLAS bf16 on an H100 (one float32
                    epilogue per 32 of K; results/native_gpu/bench_gemm_h100.md);
      'fp8'         folded with one exponent per 32 blocks (``FOLD_GROUPS``), the group's K = 32
                    dots chained in the tensor core and only the group sum promoted (one
                    epilogue per 1024 of K): ``folded_matmul(..., promote=32 * group)``, the
                    chained Hopper dot measured bit for bit on an H100
                    (results/native_gpu/fold_probe.md). A block more than 14 octaves below its
                    group's largest is rounded when folded (``FoldedTensor.inexact``);
      'fp8_cublas'  folded in groups of 4 blocks, then cuBLAS's blockwise 1 x 128 FP8 GEMM
                    (``torch._scaled_mm``; CUDA sm_90+, K a multiple of 128, M and N of 16):
                    exact products; cuBLAS's sums are undocumented, inferred on an H100 as each
                    K tile's four dots chained and promoted once per tile
                    (``emulator.fold.HOPPER_FP8_CUBLAS``, bit for bit where tested);
                    1.30-1.49x cuBLAS bf16 for the GEMM alone on an H100
                    (results/native_gpu/cublas_blockwise.md);
      'fp8_cublas_rowwise'  whole rows folded (one exponent per row: a block more than the
                    format's fold range (14 octaves for E2M1, 11 for E2M3, 9 for E3M2)
                    below its row's largest is rounded, counted in ``FoldedTensor.inexact``), then cuBLAS's FP8 GEMM
                    with rowwise scales (CUDA sm_90+, M and N multiples of 16): each 128 of K
                    chained in the tensor core, promoted in float32, scaled once at the end
                    (``emulator.fold.HOPPER_FP8_CUBLAS_ROWWISE``, bit for bit on an H200);
                    1.68-1.77x cuBLAS bf16 for the GEMM alone there against blockwise's
                    1.22-1.39x (results/native_gpu/cublas_rowwise_h200.md);
      'emulate'     the products summed under the accumulation ``model`` ('fp32_sequential',
                    'hopper_bf16', 'hopper_fp8' or any ``ChunkedModel``), bit for bit the
                    emulator's ``mx_matmul`` (``kernels.emulate``): any chip's numerics on
                    any GPU, slowly (every product aligned one by one in int64);
      'auto'        'dot_scaled' on MX units and under the interpreter; on Hopper
                    'fp8_cublas_rowwise' from M x N x K = 2^37 up, 'bf16' below
                    (``HOPPER_AUTO_LARGE_MNK``, ``HOPPER_AUTO``: why); else 'bf16'.
    tune: autotune the dot_scaled tile per (M, N, K) (once per shape); False uses one fixed
    tile, for many small shapes (the conformance suite).
    backend 'emulator': the emulator's ``mx_matmul`` with accumulation ``model`` ('exact').
    Under ``torch.compile`` this is the custom op ``ocpmx::mx_matmul`` (``model`` by name)."""
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    emulated = method == "emulate" or pick_backend(a.device, backend) == "emulator"
    da, sa = _as_operand(a, "a", method, emulated)
    db, sb = _as_operand(b, "b", method, emulated)
    if a.device != b.device:
        raise ValueError(f"operands are on different devices: a on {a.device}, b on {b.device}")
    ka, kb_ = a.shape[a.axis], b.shape[b.axis]
    if ka != kb_:
        raise ValueError(f"contraction lengths differ: a has {ka}, b has {kb_}")
    if a.rotation != b.rotation:
        raise ValueError(f"operands carry different rotations ({a.rotation} vs {b.rotation}); "
                         "the product would not cancel them")
    if method == "auto" and pick_backend(a.device, backend) != "emulator":
        m, n = da.shape[0], db.shape[0]
        method = fit_method(auto_method(a.device, m * n * ka), a.fmt, b.fmt, m, n, ka)
    if torch.compiler.is_compiling():
        from . import library
        if not isinstance(model, str):
            raise TypeError("under torch.compile the accumulation model is given by name")
        return library.mx_matmul(da, sa, db, sb, a.fmt, b.fmt, ka, out_dtype, method, model,
                                 backend)
    return mx_matmul_kmajor(da, sa, db, sb, a.fmt, b.fmt, ka, out_dtype, backend, method, model,
                            tune)


def mx_matmul_kmajor(da, sa, db, sb, fmt_a, fmt_b, k: int, out_dtype, backend, method: str,
                     model, tune: bool) -> torch.Tensor:
    """The implementation of ``mx_matmul`` on K-major operands (rows, K): A Bᵀ."""
    m, n = da.shape[0], db.shape[0]
    if pick_backend(da.device, backend) == "emulator":
        ea = emulator.MXArray(_codes(da, fmt_a), sa.cpu().numpy(), fmt_a, 1)
        eb = emulator.MXArray(_codes(db, fmt_b), sb.cpu().numpy(), fmt_b, 1)
        return torch.from_numpy(emulator.mx_matmul(ea, eb, model)).to(out_dtype).to(da.device)
    if method == "emulate":
        return _emulate(da, sa, db, sb, fmt_a, fmt_b, k, model).to(out_dtype)
    if method in CUBLAS_METHODS:
        return _cublas(method, da, sa, db, sb, fmt_a, fmt_b, k, out_dtype)
    if method in FOLD_METHODS:
        return _folded(da, sa, db, sb, fmt_a, fmt_b, k, out_dtype, FOLD_MODELS[method])
    if method == "bf16":
        am = dequantize_kmajor(da, sa, fmt_a, k, BLOCK_SIZE, torch.bfloat16, backend, None)
        bm = dequantize_kmajor(db, sb, fmt_b, k, BLOCK_SIZE, torch.bfloat16, backend, None)
        return bf16_product(am, bm, out_dtype)
    c = torch.empty((m, n), dtype=out_dtype, device=da.device)
    if m == 0 or n == 0:
        return c
    meta = dict(FMT_A=fmt_a.name, FMT_B=fmt_b.name, PACK_A=pack_factor(fmt_a),
                PACK_B=pack_factor(fmt_b), BS=BLOCK_SIZE, OUT_BF16=out_dtype == torch.bfloat16)
    cv = c.view(torch.int16) if out_dtype == torch.bfloat16 else c
    if interpreting() or not tune:
        # one fixed tile; on sm_100a a BLOCK_M of 64 made Triton fall back to a bf16 MMA
        # (ocpmx audit): 128 x 64 gets the MX instruction there and on gfx950
        bm, bn, bk = (32, 32, 64) if interpreting() else (128, 64, 128)
        grid = (cdiv(m, bm) * cdiv(n, bn),)
        launch.run(kernels.gemm.mx_gemm_kernel, grid, da, db, sa, sb, cv, m, n, k, **meta,
                   BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=4)
    else:
        def grid(meta_):
            return (cdiv(m, meta_["BLOCK_M"]) * cdiv(n, meta_["BLOCK_N"]),)
        launch.run(_tuned_kernel(), grid, da, db, sa, sb, cv, m, n, k, **meta)
    return c


_EMULATE_TILE = 16


def _cublas(method: str, da, sa, db, sb, fmt_a, fmt_b, k: int, out_dtype) -> torch.Tensor:
    """``method='fp8_cublas'``: both operands folded in groups of 4 blocks (one exponent per
    1 x 128 block along K), then cuBLAS's blockwise-scaled FP8 GEMM (``torch._scaled_mm`` with
    scales 2^R, written by the folds in the layout ``fold.blockwise_scales`` hands cuBLAS);
    ``'fp8_cublas_rowwise'``: whole rows folded, cuBLAS's rowwise-scaled FP8 GEMM. The
    products are exact; cuBLAS does not document its sums: the conformance fold probe inferred
    ``emulator.fold.HOPPER_FP8_CUBLAS`` on an H100 and it reproduced every output tested;
    ``HOPPER_FP8_CUBLAS_ROWWISE`` was fitted to an H200's outputs
    (``benchmarks/cublas_rowwise_probe.py``)."""
    check_cublas_shapes(da.device, da.shape[0], db.shape[0], k, method)
    group = FOLD_MODELS[method].group_for(k)
    fa = fold.fold_kmajor(da, sa, k, fmt_a, group, pow2=True)
    fb = fold.fold_kmajor(db, sb, k, fmt_b, group, pow2=True)
    return folded_product(method, fa, fb, out_dtype)


def check_cublas_shapes(device, m: int, n: int, k: int, method: str = "fp8_cublas") -> None:
    """A ValueError saying why where cuBLAS ``method`` cannot take an M x N x K GEMM."""
    if device.type != "cuda":
        raise ValueError(f"method={method!r} is torch._scaled_mm's FP8 GEMM, a CUDA "
                         f"(sm_90+) feature; the operands are on {device}")
    problem = _cublas_shape_problem(m, n, k, method)
    if problem:
        raise ValueError(f"method={method!r}: {problem}")


def _cublas_shape_problem(m: int, n: int, k: int, method: str = "fp8_cublas") -> str | None:
    """Why cuBLAS's FP8 GEMM (blockwise for 'fp8_cublas', rowwise for 'fp8_cublas_rowwise')
    refuses an M x N x K GEMM, or None where it takes it."""
    if method == "fp8_cublas" and k % 128:
        return f"it scales 1 x 128 blocks along K: K = {k} is not a multiple of 128"
    if m % 16 or n % 16:
        return f"cuBLAS's FP8 GEMM takes M and N in multiples of 16, got M = {m}, N = {n}"
    return None


def folded_product(method: str, fa: fold.FoldedTensor, fb: fold.FoldedTensor,
                   out_dtype) -> torch.Tensor:
    """A fold method's GEMM A Bᵀ of two operands folded at that method's group (by
    ``fold.fold_kmajor`` or in the quantize pass, ``fold.quantize_folded``; 'fp8_cublas':
    with their 2^R written, ``pow2=True``). Under ``torch.compile``: the custom op
    ``ocpmx::folded_product`` (which runs this function)."""
    if torch.compiler.is_compiling():
        from . import library
        return library.folded_product(method, fa, fb, out_dtype)
    if method in CUBLAS_METHODS:
        scale_a, scale_b = (fold.blockwise_scales(fa, fb) if method == "fp8_cublas"
                            else fold.rowwise_scales(fa, fb))
        # use_fast_accum=False (the default, said here): the promotion the models describe
        return torch._scaled_mm(fa.codes.view(torch.float8_e4m3fn),
                                fb.codes.view(torch.float8_e4m3fn).t(), scale_a=scale_a,
                                scale_b=scale_b, out_dtype=out_dtype, use_fast_accum=False)
    return fold.folded_matmul(fa, fb, out_dtype, promote=not FOLD_MODELS[method].chained)


def _folded(da, sa, db, sb, fmt_a, fmt_b, k: int, out_dtype, model) -> torch.Tensor:
    """The folded FP8 GEMM (``native.fold``) with ``model``'s group and promotion; its dot is
    the device's (``fold.dot_model``)."""
    group = model.group_for(k)
    pow2 = fold.gluon_gemm_device(da.device)
    fa = fold.fold_kmajor(da, sa, k, fmt_a, group, pow2)
    fb = fold.fold_kmajor(db, sb, k, fmt_b, group, pow2)
    return fold.folded_matmul(fa, fb, out_dtype, promote=not model.chained,
                              span=model.chain if model.chained else None)


def _emulate(da, sa, db, sb, fmt_a, fmt_b, k: int, model) -> torch.Tensor:
    """``method='emulate'``: ``kernels.emulate`` under ``model``: the float32 kernel for
    fp32_sequential, the int64 one for the chunked models (where it measured faster on an
    H100, results/native_gpu/bench_emulate_h100.md)."""
    m, n = da.shape[0], db.shape[0]
    model = emulator.accumulate.MODELS.get(model, model) if isinstance(model, str) else model
    if isinstance(model, emulator.fold.FoldedModel):  # the folded GEMM where its dot is this
        dot = fold.dot_model(da.device)               # device's FP8 dot
        if dot != model.dot:
            raise ValueError(f"method='emulate': {model} sums its K = 32 dots as {model.dot!r} "
                             f"FP8 tensor cores do; this device's are {dot!r}: not reproducible "
                             "here (the emulator backend computes it anywhere)")
        return _folded(da, sa, db, sb, fmt_a, fmt_b, k, torch.float32, model)
    if model == "exact":
        raise ValueError("method='emulate' has no 'exact' model (an exact sum over all of K needs "
                         "a multi-word accumulator): use the emulator backend, "
                         "'fp32_sequential' or a ChunkedModel")
    if model == "fp32_sequential":
        mid, chunk, frac, align_rne, rtz = 1, BLOCK_SIZE, 0, False, False
        lo_a, hi_a = _exp_span(fmt_a)
        lo_b, hi_b = _exp_span(fmt_b)
        if (hi_a + hi_b) - (lo_a + lo_b) + 2 + 5 > 62:  # a block's exact sum in int64
            raise ValueError(f"method='emulate' with fp32_sequential cannot hold a block's exact "
                             f"sum of {fmt_a.name} x {fmt_b.name} products in 64 bits")
    elif isinstance(model, emulator.accumulate.ChunkedModel):
        mid, chunk, frac = 2, model.chunk, model.frac_bits
        align_rne, rtz = model.align == "rne", model.output == "rtz"
        if (chunk + 1).bit_length() + frac + 2 > 62:
            raise ValueError(f"method='emulate': a chunk of {chunk} at {frac} fraction bits "
                             f"does not fit a 64-bit sum")
    else:
        raise ValueError(f"unknown accumulation model {model!r}")
    c = torch.empty((m, n), dtype=torch.float32, device=da.device)
    if not (m and n):
        return c
    lo = _exp_span(fmt_a)[0] + _exp_span(fmt_b)[0]
    operands = dict(PACK_A=pack_factor(fmt_a), PACK_B=pack_factor(fmt_b), E0=lo)
    if mid == 1:  # fp32_sequential: the float32 kernel (2.2x the int64 one on an H100)
        va, vb = _value_tables(fmt_a, da.device), _value_tables(fmt_b, db.device)
        # the (BLOCK_M, BLOCK_N, 32) product tile lives in registers
        grid = (cdiv(m, 32), cdiv(n, 16))
        launch.run(kernels.emulate.emulate_gemm_fast_kernel, grid, da, db, sa, sb, *va, *vb, c,
                   m, n, k, INV_GRID=float(2.0 ** -lo), BLOCK_M=32, BLOCK_N=16, num_warps=4,
                   **operands)
        return c
    ta, tb = _tables(fmt_a, da.device), _tables(fmt_b, db.device)
    grid = (cdiv(m, _EMULATE_TILE), cdiv(n, _EMULATE_TILE))
    launch.run(kernels.emulate.emulate_gemm_kernel, grid, da, db, sa, sb, *ta, *tb, c,
               m, n, k, MODEL=mid, L=chunk, LP=triton.next_power_of_2(chunk), F=frac,
               ALIGN_RNE=align_rne, OUT_MODE=1 if rtz else 0, BLOCK_M=_EMULATE_TILE,
               BLOCK_N=_EMULATE_TILE, num_warps=4, **operands)
    return c


_TABLES: dict = {}


def _tables(fmt, device) -> tuple:
    """The format's (sig int64, exp int64, special float32) tables on ``device``."""
    key = (fmt.name, str(device))
    if key not in _TABLES:
        sig, exp, sp = emulator.accumulate.sig_exp_tables(fmt)
        _TABLES[key] = (torch.from_numpy(sig).to(device), torch.from_numpy(exp).to(device),
                        torch.from_numpy(sp.astype(np.float32)).to(device))
    return _TABLES[key]


def _value_tables(fmt, device) -> tuple:
    """The format's (value float32, special float32) tables on ``device``: value = sig * 2^exp
    (exact in float32 for every MX element format) for finite codes, 0 for NaN/Inf codes."""
    key = (fmt.name, str(device), "value")
    if key not in _TABLES:
        sig, exp, sp = emulator.accumulate.sig_exp_tables(fmt)
        val = np.ldexp(sig.astype(np.float64), exp)
        assert np.array_equal(val.astype(np.float32).astype(np.float64), val)
        _TABLES[key] = (torch.from_numpy(val.astype(np.float32)).to(device),
                        torch.from_numpy(sp.astype(np.float32)).to(device))
    return _TABLES[key]


def _exp_span(fmt) -> tuple[int, int]:
    """(lowest exponent, highest leading-bit exponent) of the format's finite nonzero values."""
    sig, exp, _ = emulator.accumulate.sig_exp_tables(fmt)
    nz = sig != 0
    lead = exp[nz] + np.floor(np.log2(np.abs(sig[nz]))).astype(np.int64)
    return int(exp[nz].min()), int(lead.max())


def _codes(data: torch.Tensor, fmt) -> np.ndarray:
    codes = data.cpu().numpy()
    return emulator.unpack(codes, fmt) if pack_factor(fmt) == 2 else codes


# What 'auto' runs on Hopper (sm_90) for an MX GEMM below ``HOPPER_AUTO_LARGE_MNK``. 'fp8_cublas'
# is a GEMM whose sums the emulator models bit for bit (MXFP4 GEMM with both folds 0.89-1.16x
# cuBLAS bf16 where 'bf16' gives 0.75-0.97x, H100, results/native_gpu/bench_gemm_h100.md), but a
# training step pays ~1 ms of host time per MX GEMM on that path: 30m/125m compiled ran at
# 0.16-0.26x bf16 (results/train_speed/fp8_cublas_auto/train_speed.md,
# results/native_gpu/mxlinear_host_h100.md). 'fp8_cublas_rowwise' (its sums fitted bit for bit
# on an H200) needs less GPU time than 'bf16' at every layer shape timed on an H200
# (results/native_gpu/linear_ab_shapes_h200.md, forward + backward: 1.07-1.09x at 125m's FFN
# layers, 1.34-1.55x from 8192 x 4096 x 4096 up), but spends more host time a layer step (1.5 ms
# at 8192 x 4096 x 4096 against 1.1 ms since the two-pass fold's plan, 2.0-2.5 ms before), so
# eager it loses below about 1.3 ms of GPU work (125m's layers), and 125m training with CUDA
# graphs ran no faster with it (0.85-0.88x bf16's tokens/s against 0.88-0.90x:
# results/train_speed/h200_rowwise/, h200_both_axes/). So small GEMMs stay 'bf16'.
HOPPER_AUTO = "bf16"
# ... and from this M x N x K up (tokens x in x out of a layer: its three GEMMs share the product)
# 'auto' on Hopper runs ``HOPPER_AUTO_LARGE``. At Llama-8B's 4096 -> 4096 projections (8192 x
# 4096 x 4096 = 2^37) rowwise ties 'bf16' eager (1.36 against 1.33 ms a layer step) and is 1.40x
# faster graphed (results/native_gpu/linear_ab_8b_h200.md); at its FFN layers (8192 x 4096 x
# 14336) 1.51x eager, 1.44x graphed; trained within the seed noise of 'bf16' (30m, 300 steps,
# three seeds: results/train_methods_h200/). Timed on an H200; an H100 has not timed the rowwise
# method (its slower memory makes the passes dearer, the GEMMs the same).
HOPPER_AUTO_LARGE = "fp8_cublas_rowwise"
HOPPER_AUTO_LARGE_MNK = 1 << 37
# torch._scaled_mm's blockwise 1 x 128 scaling as fp8_cublas calls it: measured with torch 2.11
_BLOCKWISE_SCALED_MM = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 11)


@torch.compiler.assume_constant_result
def _auto_kind(device: torch.device) -> str:
    """What ``auto_method`` depends on besides the GEMM's size: 'dot_scaled' (MX units, the
    interpreter), 'hopper' or 'bf16'; a constant under torch.compile (the size is not: a
    symbolic M x N x K cannot enter an ``assume_constant_result`` function)."""
    if interpreting() or has_mx_units(device):
        return "dot_scaled"
    return "hopper" if hopper(device) else "bf16"


def auto_method(device: torch.device, mnk: int | None = None) -> str:
    """'dot_scaled' on MX units and under the interpreter; on Hopper ``HOPPER_AUTO_LARGE`` for a
    GEMM whose M x N x K (``mnk``) is at least ``HOPPER_AUTO_LARGE_MNK``, else ``HOPPER_AUTO``
    (with torch 2.11 or later for 'fp8_cublas'; ``fit_method`` hands the GEMMs a cuBLAS method
    refuses to 'bf16'); else 'bf16'. Under torch.compile with dynamic shapes the size test is a
    guard of the graph."""
    kind = _auto_kind(device)
    if kind != "hopper":
        return kind
    if mnk is not None and mnk >= HOPPER_AUTO_LARGE_MNK:
        return HOPPER_AUTO_LARGE
    if HOPPER_AUTO != "fp8_cublas" or _BLOCKWISE_SCALED_MM:
        return HOPPER_AUTO
    return "bf16"


def fit_method(method: str, fmt_a, fmt_b, m: int, n: int, k: int) -> str:
    """``method`` as ``auto_method`` chose it, or 'bf16' where it is a cuBLAS fold method and
    the GEMM is one that method refuses: an operand that does not fold (MXFP8, MXINT8), K not a
    multiple of 128 (blockwise), or M, N not multiples of 16."""
    if method in CUBLAS_METHODS and (fmt_a.name not in FOLD_FORMATS
                                     or fmt_b.name not in FOLD_FORMATS
                                     or _cublas_shape_problem(m, n, k, method)):
        return "bf16"
    return method


def bf16_product(am: torch.Tensor, bm: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """A Bᵀ of dequantized bf16 operands (M, K) and (N, K), fp32 accumulation (cuBLAS). With a
    bfloat16 ``out_dtype`` cuBLAS rounds once on output, except that where torch allows it
    (``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, on by default) a
    split-K GEMM may add its partial sums in bf16, as ``nn.Linear``'s GEMMs do: accumulation
    order is not part of the MX numerics this path reproduces (the operands are)."""
    if not am.is_cuda:  # bf16 operands, float32 products and sums
        return (am.float() @ bm.float().t()).to(out_dtype)
    if out_dtype == torch.float32:
        return torch.mm(am, bm.t(), out_dtype=torch.float32)  # fp32 out, no bf16 rounding
    return am @ bm.t()
