"""MXFP4/MXFP6 operands folded into FP8 E4M3 for Hopper's FP8 tensor cores (issue 17): the
native side of ``ocpmx.emulator.fold``, which defines the fold and the folded GEMM's sums.

``fold(mx, group)`` turns an MXTensor (K-major codes and E8M0 scales) into E4M3 codes and one
power-of-two exponent per group of ``group`` 32-blocks along K; ``folded_matmul(a, b)`` is the
FP8 GEMM of two folded operands with every K = 32 partial sum promoted at once.

Bits against the emulator (``emulator.fold``): the fold itself is bit for bit on every device
(H100 included). The GEMM is the emulator's ``folded_matmul`` with ``dot=dot_model(device)``:
"exact" dots under the interpreter, Hopper's measured FP8 wgmma rule on an H100, promoted
(every K = 32 dot alone) and chained (a group's dots accumulated in the tensor core) alike,
every format and group size (``benchmarks/fold_probe.py``, results/native_gpu/fold_probe.md).
Speed on an H100 at Llama-8B shapes (results/native_gpu/bench_gemm_h100.md, the tile and group
sweeps beside it): promoted at groups of 4 blocks 0.42-0.50x cuBLAS bf16, chained at groups of
32 blocks 1.00-1.24x; the float32 epilogue per group is what limits both.
``quantize_folded`` folds in the quantize kernel's own pass (MXLinear uses it, eager and
under torch.compile through the custom op ``ocpmx::quantize_folded``).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..emulator.decode import decode_table
from ..emulator.fold import FOLD_FORMATS, NAN_EXPONENT, TARGET, shift_range
from ..spec import BLOCK_SIZE, ElementFormat, lower
from . import launch
from .launch import cdiv
from ._lazy import kernels, triton
from .dispatch import hopper, interpreting
from .tensor import MXTensor, pack_factor


@dataclass
class FoldedTensor:
    """codes: uint8 E4M3 (rows, K); exponents: int32 (rows, K / (32 group)); scales: the MX
    E8M0 scales (rows, K / 32), kept; group: blocks per group; fmt: the MX element format;
    stats: int64 (2,) on the device, written by the fold: [0] nonzero where some exponent lies
    beyond the folded GEMM's per-row-times-per-column epilogue (|R| >
    ``kernels.fold.RANK1_EXP``, or a NaN group; then the GEMM takes its general epilogue, same
    bits, more work per output); [1] the elements the fold rounded (``inexact``)."""
    codes: torch.Tensor
    exponents: torch.Tensor
    scales: torch.Tensor
    group: int
    fmt: ElementFormat
    stats: torch.Tensor
    pow2: torch.Tensor | None = None  # float32 2^R group-major (K / (32 group), rows), if asked

    @property
    def wide(self) -> torch.Tensor:
        """(1,) int64: nonzero where an exponent needs the GEMM's general epilogue."""
        return self.stats[0:1]

    @property
    def inexact(self) -> torch.Tensor:
        """(1,) int64: the elements whose E4M3 code is not their exact MX value (blocks more
        than the format's fold range below their group's largest; ``emulator.fold``'s
        ``Folded.inexact``). A device tensor: reading it waits for the fold."""
        return self.stats[1:2]


def group_scales(f: FoldedTensor) -> torch.Tensor:
    """2^R per group as float32 (rows, K / (32 group)), built from the bits (exact for every
    R a float32 holds, subnormals included; 0 below, Inf above; NaN for a NaN group)."""
    e = f.exponents
    normal = ((e.clamp(-126, 127) + 127) << 23).view(torch.float32)
    sub = (torch.ones_like(e) << (e.clamp(-149, -127) + 149)).view(torch.float32)
    s = torch.where(e >= -126, normal, torch.where(e >= -149, sub, torch.zeros_like(normal)))
    s = torch.where(e > 127, torch.full_like(s, float("inf")), s)
    return torch.where(e == NAN_EXPONENT, torch.full_like(s, float("nan")), s)


def blockwise_scales(a: FoldedTensor, b: FoldedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale_a, scale_b) of two operands folded at groups of 4 blocks for cuBLAS's blockwise
    1 x 128 FP8 GEMM (``torch._scaled_mm(a, b.t(), ...)``): A's 2^R (M, K / 128) outer-dim-major,
    B's (K / 128, N) contiguous, the one layout torch 2.11 took on an H100
    (``benchmarks/cublas_blockwise_probe.py``)."""
    if a.pow2 is not None and b.pow2 is not None:  # written by the fold: no host work
        return a.pow2.t(), b.pow2
    return group_scales(a).t().contiguous().t(), group_scales(b).t().contiguous()


def rowwise_scales(a: FoldedTensor, b: FoldedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale_a, scale_b) of two operands folded whole rows (one exponent per row) for cuBLAS's
    rowwise FP8 GEMM (``torch._scaled_mm(a, b.t(), ...)``): 2^R as float32, A's (M, 1), B's
    (1, N)."""
    for f in (a, b):
        if f.exponents.shape[1] != 1:
            raise ValueError(f"rowwise scales take operands folded whole rows, got "
                             f"{f.exponents.shape[1]} groups per row")
    sa = a.pow2 if a.pow2 is not None else group_scales(a).t()
    sb = b.pow2 if b.pow2 is not None else group_scales(b).t()
    return sa.reshape(-1, 1), sb.reshape(1, -1)


_inexact_totals: dict = {}


def inexact_total(device) -> torch.Tensor:
    """The running count (int64, (1,), on ``device``) of elements every fold on that device has
    rounded since the process started or ``reset_inexact_total``: what a training run logs so
    that a rounded fold is never silent (reading it waits for the device). The custom op
    ``ocpmx::quantize_folded`` adds to it without declaring the mutation (the total is no
    argument of the op): read it outside a compiled region, not inside one. Under CUDA graphs
    (``torch.compile(mode="reduce-overhead")``) call this once before the first compiled call,
    so that the total lives outside the graphs' memory pool (``llama_train`` does)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _inexact_totals:
        _inexact_totals[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return _inexact_totals[device]


def reset_inexact_total(device) -> None:
    inexact_total(device).zero_()


def check_group(group: int, nblk: int) -> None:
    """A ValueError unless ``group`` blocks are a fold group of rows of ``nblk`` blocks: a power
    of two dividing them, or the whole row."""
    if group < 1 or nblk % group or (group & (group - 1) and group != nblk):
        raise ValueError(f"a fold group is a power of two dividing the {nblk} blocks along K, "
                         f"or all of them (a whole row), got {group}")


def fold(mx: MXTensor, group: int | None = 4, pow2: bool = False) -> FoldedTensor:
    """Fold an MX operand (its K-major rows, K along the last axis) with one exponent per
    ``group`` blocks (``check_group``; None: the whole row, as ``emulator.fold.fold``);
    ``pow2``: also each group's 2^R, group-major (``FoldedTensor.pow2``)."""
    if mx.block_size != BLOCK_SIZE:
        raise ValueError(f"fold takes blocks of {BLOCK_SIZE}, got {mx.block_size}")
    return fold_kmajor(mx.data, mx.scales_kmajor, mx.shape[mx.axis], mx.fmt, group, pow2)


def gluon_gemm_device(device: torch.device) -> bool:
    """Whether ``folded_matmul`` runs the Gluon kernel on ``device`` (sm_90, not under the
    interpreter), which reads the groups' 2^R: the folds that feed it write them
    (``pow2=True``) rather than the GEMM building them on the host each call."""
    return device.type == "cuda" and not interpreting() and hopper(device)


def quantize_folded(x: torch.Tensor, fmt, group: int | None = 4, *, axis: int = -1,
                    pow2: bool = False, scale_rule="floor", rounding="rne", seed: int = 0,
                    rotation=None, keys: torch.Tensor | None = None,
                    backend: str | None = None, tuning=None) -> FoldedTensor:
    """``fold(quantize(x, fmt, axis=axis, ...), group)`` in one pass: the 32-block quantize
    kernel writes the E4M3 codes of the folded operand (one byte per element), each group's
    exponent (and with ``pow2`` its 2^R for cuBLAS) and the MX scales, instead of packed codes;
    the bits of the two passes, the rounded-element count and the wide flag included. A group
    (``check_group``; None: the whole row: one exponent per row, cuBLAS's rowwise scales) the
    kernels do not hold (``fused_in_quantize``: more than ``FUSED_ROW_FOLD_MAX_GROUP`` blocks
    padded to a power of two, a row that fills less than ``FUSED_ROW_MIN_FILL`` of its
    padding, or off the row kernel more than ``FUSED_FOLD_MAX_GROUP`` or not a power of two)
    is those two passes: ``quantize`` (any axis, rotation and rounding) and the fold of the
    stored codes (``fold_kmajor``; whole rows by ``kernels.quantize.fold_rows_kernel``). Along
    another axis than the last (Wgrad's operands) the column kernel folds in its one pass
    where ``tuning.column_path('fold')`` says 'kernel' (``columns_fold``, or ``columns`` where
    that is None); under ``columns_fold='both_axes'`` the axis-0 fold kernel
    (``kernels.both_axes.columns_fold_kernel``: one fold group of each column per program;
    RNE, no random signs, groups of at most 4 blocks, a matrix); else the input goes through
    the transpose and the row kernel (``launch.rows32``). The MX codes stay recoverable
    (``emulator.fold.unfold``): the operand is the MX operand the emulator defines. On the
    emulator backend: the emulator's quantize and fold. Under ``torch.compile``: the custom
    op ``ocpmx::quantize_folded`` (the same implementation)."""
    from . import ops, plans
    pk = plans.key("quantize_folded", x, (fmt, group, axis, pow2, scale_rule, rounding,
                                          rotation, backend, tuning), keys)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call: the launch of the first (``native.plans``)
        ops._check_keys(keys, x)
        return plans.run_fold(plan, x, seed, keys)
    n = ops.numerics(fmt, scale_rule, rounding, rotation)
    if n.fmt.name not in FOLD_FORMATS:
        raise ValueError(f"only FP4/FP6 formats fold into E4M3 exactly, not {n.fmt.name}")
    axis = ops._check_input(x, axis, BLOCK_SIZE, n.rotation)
    ops._check_keys(keys, x)
    k = x.shape[axis]
    nblk = k // BLOCK_SIZE
    group = nblk if group is None else group
    check_group(group, nblk)
    if torch.compiler.is_compiling():
        from . import library
        return library.quantize_folded(x, n, axis, group, pow2, seed, keys, backend)
    fmt = n.fmt

    def result(codes, exps, scales, stats, p2):  # (a plan's too)
        return FoldedTensor(codes, exps, scales, group, fmt, stats, p2)
    return quantize_folded_kmajor(x, n, axis, group, pow2, seed, keys, backend, tuning, pk,
                                  result)


def quantize_folded_kmajor(x: torch.Tensor, n, axis: int, group: int, pow2: bool, seed: int,
                           keys, backend, tuning, plan_key=None, result=None) -> FoldedTensor:
    """The implementation of ``quantize_folded`` (checked arguments, numerics ``n``): its rows
    are the K-major rows of ``x`` along ``axis``. ``plan_key``, ``result``: the call's
    combination and what a plan made from it returns (``plans.make_fold``)."""
    from ..emulator import fold as emulator_fold
    from . import ops
    from .dispatch import pick_backend
    from .tuning import default_tuning
    k = x.shape[axis]
    nblk = k // BLOCK_SIZE
    rows = x.numel() // k if k else 0
    if pick_backend(x.device, backend) == "emulator":
        mx = ops.quantize(x, n.fmt, axis=axis, scale_rule=n.scale_rule, rounding=n.rounding,
                          seed=seed, rotation=n.rotation, keys=keys, backend="emulator")
        from ..emulator import MXArray
        from .gemm import _codes
        sk = mx.scales_kmajor.reshape(rows, nblk)
        f = emulator_fold.fold(MXArray(_codes(mx.data.reshape(rows, -1), n.fmt),
                                       sk.cpu().numpy(), n.fmt, 1), group)
        exps = torch.from_numpy(f.exponents.reshape(rows, nblk // group)).to(x.device)
        wide = bool(((exps.abs() > kernels.fold.RANK1_EXP.value) | (exps == NAN_EXPONENT)).any())
        stats = torch.tensor([int(wide), f.inexact], dtype=torch.int64, device=x.device)
        inexact_total(x.device).add_(f.inexact)
        f = FoldedTensor(torch.from_numpy(f.codes.reshape(rows, k)).to(x.device), exps,
                         sk, group, n.fmt, stats)
        if pow2:
            f.pow2 = group_scales(f).t().contiguous()
        return f
    tuning = tuning or default_tuning(x.device)
    if not fused_in_quantize(x, axis, group, tuning):  # quantize, then fold the codes
        from . import plans
        qk = None if plan_key is None else ("quantize of a two-pass fold", plan_key)
        data, scales = ops.quantize_kmajor(x, n, axis, BLOCK_SIZE, seed, keys, backend, tuning,
                                           qk, plans.as_launched)
        then = functools.partial(fold_kmajor, k=k, fmt=n.fmt, group=group, pow2=pow2)
        if result is not None:
            plans.make_two_pass_fold(plan_key, qk, then, result)
        return then(data, scales)
    x = x.detach().contiguous()
    codes = torch.empty(rows, k, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, nblk, dtype=torch.uint8, device=x.device)
    exps = torch.empty(rows, nblk // group, dtype=torch.int32, device=x.device)
    p2 = torch.empty(nblk // group, rows, dtype=torch.float32, device=x.device) if pow2 else None
    stats = torch.zeros(2, dtype=torch.int64, device=x.device)
    if x.numel():
        out = launch.FoldOutput(group, exps, p2, stats, inexact_total(x.device), rows,
                                shift_range(n.fmt)[1], _e4m3_cvt(x.device))
        done = launch.rows32(x, axis, math.prod(x.shape[axis + 1:]), codes, scales,
                             rows * nblk, n, seed, tuning, keys=keys, fold=out)
        if result is not None:
            from . import plans
            plans.make_fold(plan_key, done, out, k, n, seed, keys, result)
    return FoldedTensor(codes, exps, scales, group, n.fmt, stats, p2)


# the largest fold group every 32-block quantize kernel folds in its own pass (a program holds
# whole groups: the column kernel lcm(its tile's blocks along K, the group) blocks along K)
FUSED_FOLD_MAX_GROUP = 32
# the row kernel's, padded to a power of two (``launch.fold_tile``: a program of one group,
# the tile's blocks per warp; a whole row of another length padded to the next power of two).
# H200, 6c8eacf (results/native_gpu/fold_rows_h200.md, bf16, H16, 2^R, whole rows; the fold of
# stored codes in 32-bit words), one pass against quantize then fold: 24 blocks (125m's
# K = 768) in 32 on one warp 0.66 of copy against 0.39; 128 blocks (K = 4096) on 4 warps
# 0.78-0.80 against 0.58-0.61; 256 (K = 8192) on 8 warps 0.72 against 0.67; 448 (K = 14336) in
# 512 on 16 warps 0.58-0.59 against 0.66-0.69 (before the 32-bit words, 0.55-0.57: 512 was the
# limit until then); the same bits. Timed for E2M1: an FP6 row of 257-512 blocks now takes two
# passes too, its fold of stored codes on the float path (not timed; MXLinear's recipes fold
# E2M1 only)
FUSED_ROW_FOLD_MAX_GROUP = 256
# the least share of its padded tile a whole row of another length must fill to fold in the
# row kernel's pass (timed: 24 of 32 blocks, and 448 of 512 when the limit was 512; emptier
# tiles, e.g. 33 of 64, idle more lanes and were not timed: quantize, then fold)
FUSED_ROW_MIN_FILL = 0.75
# along another axis than the last where the fold's path is the transpose but plain quantize
# runs the column kernel (one read), the largest whole row or group (padded) that goes through
# the transpose and the row kernel's fused fold; longer ones are quantized by the column
# kernel, then their codes folded (fewer bytes: the transpose writes and reads the input
# again). H200, 35ec5f2 (results/native_gpu/fold_rows_axis0_h200.md, bf16, H16, 2^R, of a bf16
# copy): the transpose route against the column kernel's two passes, 24 blocks 0.27 against
# 0.15, 64 blocks 0.32 against 0.20-0.22, 128 blocks 0.44 against 0.47, 256 blocks 0.41
# against 0.49-0.52, 448 blocks 0.36 against 0.50; the same bits
FUSED_COLUMN_FOLD_MAX_GROUP = 64


def fused_in_quantize(x: torch.Tensor, axis: int, group: int, tuning) -> bool:
    """Whether ``quantize_folded`` folds ``group``-block groups of ``x`` along ``axis`` (a
    checked one, a checked group: not a power of two only as a whole row) in its quantize
    pass: a power of two of at most ``FUSED_FOLD_MAX_GROUP`` blocks on any path; up to
    ``FUSED_ROW_FOLD_MAX_GROUP`` blocks padded to a power of two (a whole row of another
    length filling at least ``FUSED_ROW_MIN_FILL`` of it) where the row kernel runs (along the
    last axis, or along another where ``tuning.column_path('fold')`` is the transpose; under
    'both_axes', whose fold kernel takes groups of at most 4 blocks and sends the rest through
    the transpose, too, not taken here), there only up to ``FUSED_COLUMN_FOLD_MAX_GROUP``
    blocks where plain quantize runs the column kernel (``tuning.columns``); else quantize,
    then fold the stored codes: the same bits."""
    padded = 1 << (group - 1).bit_length()
    if padded > FUSED_ROW_FOLD_MAX_GROUP or group < FUSED_ROW_MIN_FILL * padded:
        return False
    if group <= FUSED_FOLD_MAX_GROUP and group == padded:
        return True
    if math.prod(x.shape[axis % x.dim() + 1:]) == 1:  # along rows
        return True
    if tuning.column_path("fold")[0] != "transpose":
        return False
    return tuning.columns == "transpose" or padded <= FUSED_COLUMN_FOLD_MAX_GROUP
FOLD_BLOCKS = 128  # 32-blocks per program of the fold kernel (more where a group is larger)
FOLD_WARPS = 4  # its warps at most (FOLD_BLOCKS / (32 FOLD_WARPS) blocks per thread)
# the whole-row fold's tile (``kernels.quantize.fold_rows_kernel``): blocks per program, warps
# (H200, fold_rows_sweep.py, 32-bit words, results/native_gpu/fold_rows_chunks_h200.md: at
# Llama-8B operand shapes, rows of 128-448 blocks, 32 blocks on one warp 0.42-0.53 of copy, 64
# on one the same within 0.02 (worse by 0.03 at 256 blocks), more warps or 128 blocks slower;
# rows of 1024 blocks (125m's Wgrad operands) 64 blocks 1.19x faster than 32: 0.49-0.55 of copy
# against 0.41-0.46)
FOLD_ROW_CHUNK = 32
FOLD_ROW_LONG_CHUNK = 64  # for rows of more than FOLD_ROW_LONG blocks
FOLD_ROW_LONG = 512
FOLD_ROW_WARPS = 1
# the whole-row fold's integer E2M1 path on 32-bit words of codes where they are 4-byte
# aligned (``kernels.quantize.fold_chunk_e2m1_words``: four codes a byte-parallel operation; the
# same bits as a byte at a time, ``fold_chunk_e2m1``). sm_90 under Triton 3.6, rows of 256
# blocks: 214 instructions for a thread's block against 431, 64 registers either way, no spills
# (``benchmarks/kernel_sass.py --fold-rows 256``). H200, 6c8eacf (results/native_gpu/
# fold_rows_h200.md): 1.22-1.42x faster at Llama-8B operand shapes, 1.12-1.33x at 125m's
FOLD_ROW_WORDS = True


@functools.lru_cache(maxsize=None)
def integer_fold_shift(fmt: ElementFormat) -> int:
    """The smallest shift d from which ``fold_rows_kernel`` folds a block in integer arithmetic
    (``kernels.quantize.fold_chunk_e2m1``): E2M1 only (its one subnormal, 0.5, is the single
    special case), d where its smallest value 0.5 * 2^d is still an E4M3 normal (2^-6: d = -5);
    1000 (never) for other formats."""
    if fmt.name != "e2m1":
        return 1000
    smallest = float(min(v for v in decode_table(fmt)[:fmt.num_codes] if v > 0))
    return int(1 - lower(TARGET).bias - math.log2(smallest))


def fold_row_chunk(nblk: int) -> int:
    """Blocks per program of the whole-row fold (``fold_rows_kernel``) for rows of ``nblk``
    blocks: ``FOLD_ROW_LONG_CHUNK`` past ``FOLD_ROW_LONG`` blocks, else ``FOLD_ROW_CHUNK``."""
    return FOLD_ROW_LONG_CHUNK if nblk > FOLD_ROW_LONG else FOLD_ROW_CHUNK


def fold_kmajor(data: torch.Tensor, scales: torch.Tensor, k: int, fmt: ElementFormat,
                group: int | None = 4, pow2: bool = False) -> FoldedTensor:
    """``fold`` on K-major codes (packed for FP4) and scales: (rows, K / pack), (rows, K / 32).
    pow2: also write each group's 2^R as float32, group-major (``FoldedTensor.pow2``, what
    ``blockwise_scales`` and ``rowwise_scales`` hand cuBLAS), in the same pass."""
    if fmt.name not in FOLD_FORMATS:
        raise ValueError(f"only FP4/FP6 formats fold into E4M3 exactly, not {fmt.name}")
    nblk = k // BLOCK_SIZE
    group = nblk if group is None else group
    check_group(group, nblk)
    rows = math.prod(data.shape[:-1])
    if rows and group == nblk:  # whole rows, any length: a program per chunk of a row
        return _fold_rows(data, scales, k, fmt, rows, pow2)
    codes = torch.empty(rows, k, dtype=torch.uint8, device=data.device)
    exps = torch.empty(rows, nblk // group, dtype=torch.int32, device=data.device)
    stats = torch.zeros(2, dtype=torch.int64, device=data.device)
    p2 = (torch.empty(nblk // group, rows, dtype=torch.float32, device=data.device) if pow2
          else exps)  # (the kernel does not touch it without POW2)
    n_groups = rows * nblk // group
    if n_groups:
        ng = max(1, FOLD_BLOCKS // group)  # groups per program: a block per thread
        launch.run(kernels.quantize.fold_kernel, (cdiv(n_groups, ng),), data, scales, codes,
                   exps, p2, stats, inexact_total(data.device), n_groups, rows,
                   **lower(fmt).constexprs(), PACK=pack_factor(fmt),
                   D_MAX=shift_range(fmt)[1], GROUP=group, NG=ng, POW2=pow2,
                   HW_CVT=_e4m3_cvt(data.device),
                   num_warps=max(1, min(FOLD_WARPS, ng * group // 32)))
    return FoldedTensor(codes, exps, scales.reshape(rows, nblk), group, fmt, stats,
                        p2 if pow2 else None)


def _fold_rows(data: torch.Tensor, scales: torch.Tensor, k: int, fmt: ElementFormat, rows: int,
               pow2: bool) -> FoldedTensor:
    """``fold_kmajor`` of whole rows: ``kernels.quantize.fold_rows_kernel`` on (rows, chunks of
    ``fold_row_chunk(nblk)`` blocks), then ``fold_rows_finish_kernel`` a program per row. One
    zeroed buffer holds the stats and the per-row (seen, rounded) counts the first launch adds to.
    A repeated call of the same shape and options takes the two launches its first call left
    (``plans.RowFoldPlan``: no argument binding, no constexprs built)."""
    from . import plans
    nblk = k // BLOCK_SIZE
    codes = data.new_empty((rows, k), dtype=torch.uint8)
    exps = data.new_empty((rows, 1), dtype=torch.int32)
    counts = data.new_zeros(2 + 2 * rows, dtype=torch.int64)  # stats, then (rows, 2)
    stats, per_row = counts[:2], counts[2:].view(rows, 2)
    p2 = data.new_empty((1, rows), dtype=torch.float32) if pow2 else exps  # (untouched then)
    first = (data, scales, codes, exps, p2, stats, per_row, nblk)
    second = (data, scales, codes, exps, p2, stats, inexact_total(data.device), per_row, nblk)
    words = FOLD_ROW_WORDS and data.data_ptr() % 4 == 0  # E2M1 in 32-bit words (a plan each)
    chunk = fold_row_chunk(nblk)
    pk = plans.key("fold_rows", data, (fmt, pow2, tuple(scales.shape), scales.dtype,
                                       chunk, FOLD_ROW_WARPS, words), None)
    if not plans.run_row_fold(plans.find(pk), first, second):
        kw_first, kw_second = fold_rows_constexprs(fmt, nblk, pow2, _e4m3_cvt(data.device), words)
        launches = []
        for kernel, grid, args, kw in (
                (kernels.quantize.fold_rows_kernel, (rows, cdiv(nblk, chunk)), first,
                 kw_first),
                (kernels.quantize.fold_rows_finish_kernel, (rows,), second, kw_second)):
            launches.append((kernel, grid, args, kw, launch.run(kernel, grid, *args, **kw)))
        plans.make_row_fold(pk, launches)
    return FoldedTensor(codes, exps, scales.reshape(rows, nblk), nblk, fmt, stats,
                        p2 if pow2 else None)


def fold_rows_constexprs(fmt: ElementFormat, nblk: int, pow2: bool, hw_cvt: bool,
                         words: bool) -> tuple[dict, dict]:
    """The constexprs and launch options of the whole-row fold's two launches for rows of
    ``nblk`` blocks (``_fold_rows``; ``benchmarks/kernel_sass.py --fold-rows`` compiles the
    first with them): ``fold_rows_kernel``'s, then ``fold_rows_finish_kernel``'s."""
    consts = lower(fmt).constexprs()
    common = dict(PACK=pack_factor(fmt), D_MAX=shift_range(fmt)[1], NB=fold_row_chunk(nblk),
                  NBR=1 << (nblk - 1).bit_length(), POW2=pow2, HW_CVT=hw_cvt,
                  num_warps=FOLD_ROW_WARPS)
    return (dict(consts, D_INT=integer_fold_shift(fmt), WORDS=words, **common),
            dict({c: consts[c] for c in ("BITS", "SIGN", "MBITS", "BIAS", "SUBQ")}, **common))


def _e4m3_cvt(device) -> bool:
    """Whether the fold kernel may encode with the GPU's float32 -> E4M3 instruction: an NVIDIA
    GPU of sm_89 or later, not under the interpreter."""
    return (device.type == "cuda" and not interpreting() and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (8, 9))


def dot_model(device) -> str | None:
    """The emulator's ``folded_matmul(..., dot=...)`` that gives this device's bits: "exact"
    for CPU tensors (the interpreter), "hopper" on an sm_90 GPU (measured on an H100), None on
    other GPUs (not measured)."""
    device = torch.device(device)
    if device.type != "cuda":
        return "exact"
    return "hopper" if hopper(device) else None


def folded_matmul(a: FoldedTensor, b: FoldedTensor, out_dtype: torch.dtype = torch.float32,
                  *, k_per_dot: int | None = None, promote: bool = True,
                  tile: tuple[int, int, int, int] | None = None,
                  span: int | None = None, kernel: str = "auto") -> torch.Tensor:
    """A Bᵀ of two folded operands (rows, K): the emulator's ``folded_matmul`` with
    ``dot=dot_model(device)`` and ``promote=32`` (``promote=True``: every K = 32 dot leaves the
    tensor core at once) or ``promote=32 * group`` (False: the group's dots chained in the
    tensor core, one float32 epilogue per group; on Hopper measured bit for bit as the
    emulator's chained model). ``k_per_dot``: K of one ``tl.dot`` (a
    multiple of 32 dividing 32 * group; default 32 under the interpreter, up to 128 on a
    GPU). ``tile``: (BLOCK_M, BLOCK_N, warps, stages) instead of the autotuned tile (a tile
    never changes the bits; ``benchmarks/fold_tile_sweep.py``). ``span`` (chained only): the
    dots chained over spans of ``span`` blocks, the spans' sums added in float32
    (``promote=32 * span``: ``emulator.fold.HOPPER_FP8_CUBLAS_ROWWISE``'s sums).

    ``kernel``: 'triton' (``kernels.fold.folded_gemm_kernel``), 'gluon'
    (``folded_matmul_wgmma``: sm_90 only, groups of a multiple of 4 blocks, no span, tiles that
    fit the operands) or 'auto' (the default): Gluon where it takes the GEMM and no tile or
    ``k_per_dot`` is asked for, else Triton. The same sums either way (``tests/test_fold.py``
    on an H200: ragged tiles, wide operands and the emulator at 4dd8575, the final epilogue
    form at 8192 x 4096 x 4096 at 1607d21); Gluon is the fast one on Hopper
    (``results/native_gpu/fold_wgmma_h200.md``)."""
    if kernel not in ("auto", "triton", "gluon"):
        raise ValueError(f"kernel must be 'auto', 'triton' or 'gluon', got {kernel!r}")
    if a.codes.shape[1] != b.codes.shape[1] or a.group != b.group:
        raise ValueError("folded operands need the same K and the same group")
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    if kernel != "triton" and not (tile or k_per_dot or span):
        why = wgmma_supported(a, b, out_dtype)
        if why is None:
            return _wgmma_launch(a, b, out_dtype, promote, WGMMA_BN, WGMMA_STAGES)
        if kernel == "gluon":
            raise ValueError(f"folded_matmul(kernel='gluon'): {why}")
    elif kernel == "gluon":
        raise ValueError("folded_matmul(kernel='gluon') takes no tile, k_per_dot or span")
    m, k = a.codes.shape
    n = b.codes.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.codes.device)
    if m and n:
        if span is not None and (promote or span < 1):
            raise ValueError(f"span {span}: at least one block, chained (promote=False)")
        span = None if span is None or span >= a.group else span
        chain = math.gcd(span, a.group) if span else a.group  # divides every chain's blocks
        kt = k_per_dot or (32 if interpreting() else 32 * math.gcd(chain, 4))
        if kt % 32 or (32 * chain) % kt:
            raise ValueError(f"k_per_dot {kt} must be a multiple of 32 dividing the "
                             f"{32 * chain} elements of a chain")
        fixed = tile or ((32, 32, 4, 1) if interpreting() else None)
        bm_max = fixed[0] if fixed else BLOCK_M_MAX
        if bm_max * k >= 2**31:
            raise ValueError(f"folded_matmul: K = {k} is too long for the kernel's 32-bit "
                             f"offsets inside a tile (K < {2**31 // bm_max})")
        args, common = _triton_gemm_args(a, b, c, kt, promote, span)
        # two launches, one computing: RANK1=True unless an operand is wide (its kernel
        # returns at once otherwise), then RANK1=False (the kernel's doc says why)
        for rank1 in (True, False):
            if fixed:
                bm, bn, warps, stages = fixed
                launch.run(kernels.fold.folded_gemm_kernel,
                           (cdiv(m, bm) * cdiv(n, bn),), *args, BLOCK_M=bm,
                           BLOCK_N=bn, num_warps=warps, num_stages=stages, RANK1=rank1,
                           **common)
            else:
                tuned_launch(promote, args, rank1, common)
    return c


WGMMA_BK = 128  # K of one TMA stage in the Gluon kernel
WGMMA_BN = 128  # its tile's columns (a consumer warpgroup's: a group sum and the accumulator
WGMMA_HALF_M = 64  # of 64 x 128 float32 each) and a consumer warpgroup's rows (its HALF_M)
WGMMA_STAGES = 4  # TMA stages (results/native_gpu/fold_wgmma_h200.md: 4 beat 3)
WGMMA_MAX_GROUP = 32  # blocks: method fp8's groups; a whole row stays on the Triton kernel
# wide operands (a group exponent past RANK1_EXP) through the Gluon kernel's own general
# epilogue instead of a second launch of the Triton kernel's: the same bits (tests/test_fold.py's
# wgmma test, on an H200); an 8B training step 1.10x bf16 with it, 1.07x without
# (results/train_speed/h200_8b_fp8_gluon/)
WGMMA_WIDE = True
# the promoted form's wgmmas issued per column half of the tile, each in flight while the
# partial before it is added (1: kernels.fold_wgmma._lookahead_partition): the same bits, 4%
# faster on an H200 (results/native_gpu/fold_wgmma_h200.md); 2: per column quarter with two
# in flight (_quarter_partition), compiled for sm_90 without spills, NOT yet run on a GPU
WGMMA_LOOKAHEAD = 1
# the Gluon launch through launch.run (fastlaunch: the compiled kernel called directly, its
# descriptors encoded by Triton's launcher) instead of Gluon's kernel[grid], which binds and
# hashes every argument each call: written and tested on the CPU (the key), NOT yet run on a
# GPU (tests/test_fold.py's wgmma test turns it on and counts the direct launches)
WGMMA_FAST_LAUNCH = False


@functools.lru_cache(maxsize=None)
def _smem_layout(block: tuple, dtype: torch.dtype):
    """The NVMMA shared-memory layout of a TMA box of ``block`` elements of ``dtype`` (made
    once per box: the Gluon launch's five descriptors take one each)."""
    from triton.experimental.gluon import language as gl
    gtype = {torch.float8_e4m3fn: gl.float8e4nv, torch.float32: gl.float32,
             torch.int16: gl.int16}[dtype]
    return gl.NVMMASharedLayout.get_default_for(list(block), gtype)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def group_pow2(f: FoldedTensor) -> torch.Tensor:
    """2^R of every group as float32, group-major and flat (K / (32 group) runs of ``rows``
    values): ``f.pow2`` where the fold wrote it, else ``group_scales``'s."""
    p2 = f.pow2 if f.pow2 is not None else group_scales(f).t().contiguous()
    return p2.reshape(-1)


def wgmma_supported(a: FoldedTensor, b: FoldedTensor, out_dtype: torch.dtype,
                    bn: int = WGMMA_BN) -> str | None:
    """None where ``folded_matmul_wgmma`` can take these operands, else why not."""
    m, k = a.codes.shape
    n = b.codes.shape[0]
    if not gluon_gemm_device(a.codes.device):
        return "the Gluon folded GEMM runs on sm_90 only"
    if a.codes.shape[1] != b.codes.shape[1] or a.group != b.group:
        return "folded operands need the same K and the same group"
    if BLOCK_M_MAX * k >= 2**31:  # the Triton kernel's offsets (its launch for wide operands)
        return f"K = {k} is too long for the Triton kernel beside it"
    if m < 2 * WGMMA_HALF_M or n < bn:
        return f"its tiles are {2 * WGMMA_HALF_M} x {bn}: M = {m}, N = {n} is smaller"
    if (32 * a.group) % WGMMA_BK or a.group > WGMMA_MAX_GROUP:
        return (f"its groups are multiples of {WGMMA_BK // 32} blocks up to "
                f"{WGMMA_MAX_GROUP} (a group's K steps are unrolled), got {a.group}")
    if m % 4 or n % 4:  # a group's 2^R run of M (N) floats starts on 16 bytes; an H200
        return f"TMA needs M and N in multiples of 4, got M = {m}, N = {n}"  # faulted at 130
    if n % (4 if out_dtype == torch.float32 else 8):
        return "TMA stores need output rows of a multiple of 16 bytes"
    for t in (a.codes, b.codes):
        if t.data_ptr() % 16 or t.stride() != (k, 1):
            return "TMA loads need contiguous codes at a 16-byte aligned address"
    return None


def folded_matmul_wgmma(a: FoldedTensor, b: FoldedTensor, out_dtype: torch.dtype = torch.float32,
                        *, promote: bool = True, bn: int = WGMMA_BN,
                        stages: int = WGMMA_STAGES, lookahead: bool | int | None = None
                        ) -> torch.Tensor:
    """``folded_matmul(a, b, out_dtype, promote=promote)``'s bits through the Gluon kernel
    (``kernels.fold_wgmma``: TMA, a producer warp, two consumer warpgroups; sm_90 only). Wide
    operands (an exponent past ``RANK1_EXP``) take the general epilogue: the kernel's own
    (``WGMMA_WIDE``, the default) or, without it, the Triton kernel's, launched behind it (each
    launch checks the flags on the device and one of them computes). ``lookahead`` (the
    promoted form's): 0 or False, one wgmma per K = 32 slice, waited for at once; 1 or True,
    per column half, each in flight while the partial before it is added; 2, per column
    quarter with two in flight (default ``WGMMA_LOOKAHEAD``); the same bits every way."""
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")
    if stages < 2:  # the chained form holds a stage while it waits for the next
        raise ValueError(f"folded_matmul_wgmma: at least 2 stages, got {stages}")
    if lookahead not in (None, False, True, 0, 1, 2):
        raise ValueError(f"folded_matmul_wgmma: lookahead is 0, 1 or 2, got {lookahead!r}")
    if bn not in (64, 128):  # (Gluon's shapes are powers of two; registers were checked up
        raise ValueError(f"folded_matmul_wgmma: bn is 64 or 128, got {bn}")  # to 128)
    why = wgmma_supported(a, b, out_dtype, bn)
    if why:
        raise ValueError(f"folded_matmul_wgmma: {why}")
    return _wgmma_launch(a, b, out_dtype, promote, bn, stages, lookahead)


def _triton_gemm_args(a: FoldedTensor, b: FoldedTensor, c: torch.Tensor, kt: int,
                      promote: bool, span: int | None) -> tuple[tuple, dict]:
    """``kernels.fold.folded_gemm_kernel``'s runtime arguments and constexprs for C = A Bᵀ
    (less RANK1 and the tile), as ``folded_matmul`` and the Gluon launch's fallback pass them.
    enable_fp_fusion=False: the epilogue's product is rounded, then added."""
    m, k = a.codes.shape
    out16 = c.dtype == torch.bfloat16
    args = (a.codes, b.codes, a.exponents, b.exponents, a.wide, b.wide,
            c.view(torch.int16) if out16 else c, m, b.codes.shape[0], k)
    return args, dict(GROUP=a.group, KT=kt, OUT_BF16=out16, PROMOTE=bool(promote),
                      SPAN=span or 0, enable_fp_fusion=False)


def _wgmma_launch(a: FoldedTensor, b: FoldedTensor, out_dtype: torch.dtype, promote: bool,
                  bn: int, stages: int, lookahead: bool | int | None = None
                  ) -> torch.Tensor:
    """``folded_matmul_wgmma`` on operands ``wgmma_supported`` took."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from .kernels import fold_wgmma
    m, k = a.codes.shape
    n = b.codes.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.codes.device)
    bk = WGMMA_BK
    half = WGMMA_HALF_M
    c_out = c if out_dtype == torch.float32 else c.view(torch.int16)

    def desc(t, block):
        return TensorDescriptor.from_tensor(t, list(block), _smem_layout(block, t.dtype))
    a_desc = desc(a.codes.view(torch.float8_e4m3fn), (2 * half, bk))
    b_desc = desc(b.codes.view(torch.float8_e4m3fn), (bn, bk))
    lookahead = int(bool(promote) and (WGMMA_LOOKAHEAD if lookahead is None else lookahead))
    c_desc = desc(c_out, (half, bn >> lookahead))  # (lookahead 1, 2: column halves, quarters)
    pa_desc = desc(group_pow2(a), (2 * half,))
    pb_desc = desc(group_pow2(b), (bn,))
    grid = (min(cdiv(m, 2 * half) * cdiv(n, bn), _sm_count(a.codes.device)),)
    args = (a_desc, b_desc, c_desc, pa_desc, pb_desc, a.wide, b.wide, m, n, k)
    consts = dict(GROUP=a.group, BN=bn, BK=bk, STAGES=stages, PROMOTE=bool(promote),
                  OUT_BF16=out_dtype == torch.bfloat16, GROUP_M=8, WIDE=WGMMA_WIDE,
                  LOOKAHEAD=lookahead, num_warps=4, maxnreg=168,
                  enable_fp_fusion=False)  # products rounded, then added
    if WGMMA_FAST_LAUNCH:  # the compiled kernel called directly after the first launch
        launch.run(fold_wgmma.folded_gemm_wgmma_kernel, grid, *args, **consts)
    else:
        fold_wgmma.folded_gemm_wgmma_kernel[grid](*args, **consts)
    if not WGMMA_WIDE:  # the Triton kernel's general epilogue computes a wide GEMM
        args, common = _triton_gemm_args(a, b, c, 32 * math.gcd(a.group, 4), promote, None)
        tuned_launch(promote, args, False, common)
    return c


_chosen: dict = {}  # (promote, the autotuner's key, device) -> the chosen config's arguments


def tuned_launch(promote: bool, args: tuple, rank1: bool, common: dict) -> None:
    """One launch of the folded GEMM at the autotuned tile: the first of a shape through the
    autotuner (which times ``FOLD_CONFIGS`` and keeps the fastest), later ones straight to the
    kernel with that tile's arguments through ``launch.run`` (its compiled kernel cached:
    Triton's autotuner rebuilds its key and binds every argument on each call, ~2 x 40 us of
    host time a GEMM). The same kernel and tile either way: the same bits."""
    m, n, k = args[7:10]
    key = (bool(promote), m, n, k, common["GROUP"], common["KT"], rank1, args[6].dtype,
           args[0].device)
    chosen = _chosen.get(key)
    if chosen is not None:
        bm, bn = chosen["BLOCK_M"], chosen["BLOCK_N"]
        launch.run(kernels.fold.folded_gemm_kernel, (cdiv(m, bm) * cdiv(n, bn),), *args,
                   RANK1=rank1, **common, **chosen)
        return

    def grid(meta):
        return (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)
    tuned = _tuned_kernel(promote)
    launch.run(tuned, grid, *args, RANK1=rank1, **common)
    best = getattr(tuned, "best_config", None)
    if best is not None:
        _chosen[key] = best.all_kwargs()


# Tiles of the folded GEMM on a GPU (BLOCK_M, BLOCK_N, warps, stages), autotuned per shape (the
# tile never changes the bits: every output's sums are the same). Promoted (method fp8_exact,
# group 4): each warpgroup's tile is 64 x 64, where the dot's four partial sums and the
# accumulator fit in registers (compiled for sm_90a, ptxas -v: 64 x 128 spilled 220 bytes and
# serialized the wgmmas); Triton adds each partial right after its wgmma, so ptxas serializes
# them all the same (C7514). Chained (method fp8, group 32): 64 x 256 and 64 x 128 warpgroup
# tiles with 8 warps, the fastest measured on an H100 (results/native_gpu/
# fold_tile_sweep_groups16_32.md, group 32: 1.02-1.18x cuBLAS bf16; a 64 x 256 CTA with 4 warps
# 0.52-0.59x, a 128 x 256 one with 4 warps 0.16-0.17x) although the group sum beside the
# accumulator spills: the accumulator is touched once per group (32 blocks), outside the
# inner loop.
# tests/test_fold.py compiles them all for sm_90a.
FOLD_CONFIGS = {True: ((128, 64, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4), (64, 64, 4, 3)),
                False: ((128, 256, 8, 3), (128, 256, 8, 4), (128, 128, 8, 3), (128, 128, 8, 4))}
BLOCK_M_MAX = max(c[0] for cs in FOLD_CONFIGS.values() for c in cs)
_tuned: dict = {}


def _tuned_kernel(promote: bool = True):
    """The folded GEMM kernel autotuned over ``FOLD_CONFIGS[promote]``."""
    promote = bool(promote)
    if promote not in _tuned:
        configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
                   for bm, bn, w, s in FOLD_CONFIGS[promote]]
        # RANK1 in the key: the two launches are tuned apart (a tile can fit Hopper's shared
        # memory with one epilogue and not with the other)
        _tuned[promote] = triton.autotune(configs, key=["M", "N", "K", "GROUP", "KT", "RANK1"])(
            kernels.fold.folded_gemm_kernel)
    return _tuned[promote]


def tuned_tile(promote: bool, m: int, n: int, k: int, group: int):
    """The tile the autotuner chose for the launch that computes (RANK1=True) at this shape, or
    None before the first call (benchmarks report it)."""
    for key, config in _tuned_kernel(promote).cache.items():
        if tuple(key[:4]) == (m, n, k, group) and key[5] is True:
            return config
    return None
