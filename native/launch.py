"""Launch code: what each kernel is given, from the numerics (what is computed), the tuning
(tiles) and the shapes. Every launch of the package goes through ``run``, so one place sees them
all (the compile audit records them there), except a per-call plan's repeated launches
(``native.plans``), which stop while anything else is patched in as ``run``.

``Numerics`` is the part that fixes the bits: the format, the scale rule, the rounding, the
rotation. Its ``constexprs`` are the one lowering of those choices for every launch site
(``ocpmx.spec.KernelFormat.constexprs`` for the format, the named option values for the rest).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch

from ..spec import ElementFormat, Rotation, Rounding, ScaleRule, lower
from ..spec.rules import Conversion
from . import fastlaunch
from ._lazy import kernels
from .dispatch import gfx950, hopper, interpreting
from .tensor import pack_factor
from .tuning import ColumnTile, Tuning

# tensors at least this large index with 64-bit offsets (a margin below 2^31 for the tiles)
BIG_NUMEL = 2**31 - 2**20


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch grids (``triton.cdiv`` is a jit function in Triton >= 3.8, whose
    host call costs microseconds)."""
    return -(-a // b)


def run(kernel, grid, *args, **constexprs):
    """Launch ``kernel`` on ``grid``: every ``triton.jit`` kernel launch of ``ocpmx.native``
    goes through here (the Gluon folded GEMM, ``fold.folded_matmul_wgmma``, too where
    ``fold.WGMMA_FAST_LAUNCH`` is on: its arguments are TMA descriptors).

    A compiled ``triton.jit`` kernel on a GPU is launched through ``fastlaunch`` (the compiled
    kernel cached per specialization, called directly: Triton's own launch binds and hashes
    every argument, ~60 us a call with the quantize kernels' 40 constexprs); anything else
    (the interpreter, an autotuned kernel) through Triton's ``kernel[grid]``."""
    if fastlaunch.ENABLED:
        done = fastlaunch.launch(kernel, grid, args, constexprs)
        if done is not None:
            return done
    return kernel[grid](*args, **constexprs)


@dataclass(frozen=True)
class Numerics:
    """What a quantize kernel computes: these fix the bits (tuning never does)."""

    fmt: ElementFormat
    scale_rule: ScaleRule = ScaleRule.FLOOR
    rounding: Rounding = Rounding.RNE
    rotation: Rotation | None = None
    int8_min: int = -127
    conversion: Conversion = Conversion.OCP  # GFX950: the kernel of gfx950's instructions

    @property
    def pack(self) -> int:
        return pack_factor(self.fmt)

    @functools.cached_property  # (frozen dataclass: computed once per Numerics)
    def sign_mask(self) -> int:
        return self.rotation.sign_mask() if self.rotation is not None else 0

    @functools.cached_property
    def rot_scale(self) -> float:
        return float(self.rotation.scale) if self.rotation is not None else 1.0

    def constexprs(self, in_dtype: torch.dtype) -> dict:
        """The quantize kernels' format block and numerics constexprs (cached)."""
        return _constexprs(self, in_dtype)

    def quarter_in_scale(self, in_dtype: torch.dtype) -> bool:
        """Whether the row and column kernels may put H16's 1/4 into the block scale
        (``QUARTER_IN_SCALE``, see ``kernels.quantize.quantize_rows32_kernel``): H16 on bf16 or
        float16 input (x/4 exact), a float format, RNE or stochastic rounding (each divides |v|
        by the block's 2^s in one float32 multiply: by 2^(s + 2) the same real number)."""
        r = self.rotation
        return (r is not None and r.size == 16 and in_dtype in (torch.bfloat16, torch.float16)
                and self.fmt.kind != "int")


@functools.lru_cache(maxsize=1024)
def _constexprs(n: Numerics, in_dtype: torch.dtype) -> dict:
    r = n.rotation
    return dict(**lower(n.fmt, n.int8_min).constexprs(), RULE=int(n.scale_rule),
                ROUNDING=int(n.rounding), ROT=r.size if r else 0,
                SIGNS=r is not None and r.has_signs, PACK=n.pack,
                IN_BF16=in_dtype == torch.bfloat16)


def rows32_applies(block_size: int) -> bool:
    """Whether the 32-block kernels serve (``rows32``: the row kernel along the last axis, the
    column kernel along another): blocks of 32, any rounding."""
    return block_size == 32


@dataclass(frozen=True)
class FoldOutput:
    """Where the 32-block kernels write their operand folded into E4M3 instead of packed codes
    (``native.fold.quantize_folded``): blocks per group, each group's exponent (int32), 2^R
    group-major (float32) or None, the fold's stats and the device's running count (int64),
    the rows (for 2^R's layout), and the fold's constants (``kernels.fold``)."""
    group: int
    exponents: torch.Tensor
    pow2: torch.Tensor | None
    stats: torch.Tensor
    total: torch.Tensor
    rows: int
    d_max: int
    hw_cvt: bool

    @property
    def key(self) -> tuple:
        """What the kernels compile for: (FOLD_GROUP, D_MAX, POW2, HW_CVT)."""
        return self.group, self.d_max, self.pow2 is not None, self.hw_cvt

    def args(self) -> tuple:
        """The kernels' output arguments exp_ptr, pow2_ptr, stats_ptr, total_ptr."""
        return (self.exponents, self.pow2 if self.pow2 is not None else self.exponents,
                self.stats, self.total)


NO_FOLD_KEY = (0, 0, False, False)  # ``FoldOutput.key`` of a launch without a fold


def fold_constexprs(key: tuple) -> dict:
    """The 32-block kernels' fold constexprs from ``FoldOutput.key`` (or ``NO_FOLD_KEY``)."""
    group, d_max, pow2, hw_cvt = key
    return dict(FOLD_GROUP=group, D_MAX=d_max, POW2=pow2, HW_CVT=hw_cvt)


def rows32_constexprs(n: Numerics, in_dtype: torch.dtype, n_blocks: int, tuning: Tuning,
                      qdq: bool, device: torch.device,
                      fold: FoldOutput | None = None) -> tuple[dict, int]:
    """(constexprs and launch options, blocks a program advances) of the 32-block row kernel.
    A fold takes at least one whole group per program: a group larger than the tile on as many
    more warps (``fold_tile``); a group that is not a power of two (a whole row) in a program
    per row, its tile the next power of two, the rest masked (the kernel's ROW_NB)."""
    tile = tuning.rows32_qdq if qdq else tuning.rows32
    padded = fold is not None and fold.group & (fold.group - 1) != 0
    if fold and (fold.group > tile.blocks or padded):
        tile = fold_tile(tile, fold.group)
    nb = tile.blocks  # (a power of two: whole groups, the group itself where fold_tile ran)
    row_nb = fold.group if padded else 0
    return _rows32_constexprs(n, in_dtype, tile, qdq, hopper(device),
                              fold.key if fold else NO_FOLD_KEY, nb,
                              n_blocks * 32 >= BIG_NUMEL, n_blocks % nb == 0 and not padded,
                              row_nb), row_nb or nb


def fold_tile(tile, group: int):
    """The row tile of a fold whose ``group`` is larger than ``tile.blocks`` or not a power of
    two (a whole row): a program of one group, padded to the next power of two, the tile's
    blocks per warp kept (its warps times that over its blocks, at least one), no register cap.
    H200, the 32-block tile on one warp, H16 (results/native_gpu/fold_rows_fused_warps_h200.md
    and fold_rows_h200.md), the fastest or within 1% of it at every row length timed: 128
    blocks on 4 warps 0.78-0.80 of copy (2 warps 0.72-0.75, 1 warp 0.52-0.54, 8 warps 0.25);
    256 blocks on 8 warps 0.72 (4 warps 0.68, 16 warps 0.22); 448 in 512 on 16 warps 0.58-0.59
    (8 warps 0.54-0.55, 4 warps 0.48-0.49); 24 in 32 on one warp 0.66 (4 warps 0.20). Warps do
    not change bits; at most ``FOLD_MAX_WARPS``."""
    blocks = 1 << (group - 1).bit_length()
    warps = min(FOLD_MAX_WARPS, max(1, tile.warps * blocks // tile.blocks))
    return replace(tile, blocks=blocks, warps=warps, maxnreg=None)


# the most warps ``fold_tile`` gives a program (more blocks per warp beyond): 512 threads, what
# a 512-block row on the 32-block, one-warp tile takes, within every GPU's limit (NVIDIA's
# 1024 threads, AMD's 16 wave64s)
FOLD_MAX_WARPS = 16


@functools.lru_cache(maxsize=1024)
def _rows32_constexprs(n: Numerics, in_dtype: torch.dtype, tile, qdq: bool, on_hopper: bool,
                       fold_key: tuple, nb: int, big: bool, even: bool, row_nb: int) -> dict:
    return dict(**n.constexprs(in_dtype), QDQ=qdq,
                QUARTER_IN_SCALE=n.quarter_in_scale(in_dtype), **fold_constexprs(fold_key),
                NB=nb, BIG=big, EVEN=even, ROW_NB=row_nb, num_warps=tile.warps,
                **register_cap(tile, on_hopper, fold_key))


def register_cap(tile, on_hopper: bool, fold_key: tuple) -> dict:
    """The launch option capping a 32-block kernel's registers: the tile's ``maxnreg`` on
    Hopper, where it was measured, and never for a fold (under the row tile's 72 the E3M2 fold
    spilled when compiled for sm_90 with Triton 3.6; without it, 75-79 registers and no
    spill)."""
    return {"maxnreg": tile.maxnreg} if tile.maxnreg and on_hopper and \
        fold_key == NO_FOLD_KEY else {}


def random_args(n: Numerics, seed: int, keys: torch.Tensor | None,
                addresses: bool = False) -> tuple:
    """The quantize kernels' seed and sign-mask arguments: integers, or (``keys``: int64
    [seed, sign mask] on the data's device) pointers the kernels read them from: its two
    one-element slices, or with ``addresses`` their addresses (``native.plans``)."""
    if keys is None:
        return seed & 0xFFFFFFFFFFFFFFFF, n.sign_mask
    if addresses:
        first = keys.data_ptr()
        return first, first + keys.stride(0) * keys.element_size()
    return keys[0:1], keys[1:2]


@dataclass(frozen=True, eq=False)
class Kernel32:
    """One launch of a 32-block kernel (the row kernel, the column kernel or the both-axes
    module's axis-0 kernel, which takes the column kernel's arguments) for fixed numerics,
    shape, dtype, device, alignment and tuning: all of it but the per-call tensors and random
    arguments, which ``args`` puts in place. ``rows32`` builds one per call;
    ``native.plans`` keeps them for repeated calls."""
    kernel: object
    grid: tuple
    view: torch.dtype | None  # the raw-bits type the input is passed as (bf16), or None
    sizes: tuple              # the size arguments after sign_mask: (n_blocks,) or (k, inner)
    rot_scale: float
    tail: tuple               # the arguments after the four output pointers
    consts: dict              # constexprs and launch options
    flat: bool = False        # x viewed flat first (the row kernel's input whose last axis
    #                           is 1 or odd: blocks along a leading axis, size-1 axes after it)

    def args(self, x: torch.Tensor | int, data, scales, seed_arg, sign_arg,
             fold: FoldOutput | None = None) -> tuple:
        """The positional arguments of one launch (``random_args`` gives seed and sign).
        The tensors may be given as their addresses (integers: ``native.plans``' launches of
        a compiled kernel), the input then as it is (its view is the same address)."""
        return self.args_with(x, data, scales, seed_arg, sign_arg,
                              fold.args() if fold else (scales, scales, scales, scales))

    def args_with(self, x: torch.Tensor | int, data, scales, seed_arg, sign_arg,
                  outs: tuple) -> tuple:
        """``args`` with the four fold outputs given as they are (``FoldOutput.args``'s
        order; a launch without a fold passes ``scales`` four times), tensors or addresses."""
        if type(x) is not int:
            if self.flat:
                x = x.view(-1)
            if self.view is not None:
                x = x.view(self.view)
        return (x, data, scales, sign_arg, *self.sizes, seed_arg, self.rot_scale, *outs,
                *self.tail)

    def launch(self, args: tuple):
        """Launch with ``args`` through ``run``; returns what ``run`` returns."""
        return run(self.kernel, self.grid, *args, **self.consts)


def kernel32(x: torch.Tensor, axis: int, inner: int, n_blocks: int, n: Numerics,
             tuning: Tuning, qdq: bool = False,
             fold: FoldOutput | None = None) -> Kernel32 | None:
    """The one 32-block kernel launch of ``rows32`` over a contiguous ``x`` (its shape, dtype,
    device and alignment): the row kernel along the last axis, along another per
    ``tuning.column_path`` the column kernel, or under 'both_axes' the axis-0 kernel where it
    applies (``columns32``; the column kernel elsewhere); None where the column path is the
    transpose or the column kernel's grid does not fit (then ``rows32`` transposes and runs
    the row kernel)."""
    bf16 = x.dtype == torch.bfloat16
    if inner == 1:
        consts, nb = rows32_constexprs(n, x.dtype, n_blocks, tuning, qdq, x.device, fold)
        return Kernel32(kernels.quantize.quantize_rows32_kernel, (cdiv(n_blocks, nb),),
                        torch.int32 if bf16 else None, (n_blocks,), n.rot_scale,
                        (fold.rows,) if fold else (1,), consts,
                        flat=bf16 and x.dim() > 0 and x.shape[-1] % 2 == 1)
    path, tile = tuning.column_path(
        "fold" if fold else "qdq" if qdq else "quantize", n.rounding == Rounding.STOCHASTIC,
        unrotated_fp4=n.rotation is None and pack_factor(n.fmt) == 2)
    k = x.shape[axis]
    if path == "both_axes":
        k32 = columns32(x, k, inner, n, tuning, qdq, fold)
        if k32 is not None:
            return k32
        if fold:  # (the column kernel's fold runs at a tenth of the transpose path's speed)
            return None
        path = "kernel"  # (the calls the both-axes kernel does not take)
    if path != "kernel":
        return None
    consts, bn, kb = cols32_constexprs(n, x.dtype, k, inner, x.numel(), tile, qdq, fold,
                                       hopper(x.device), x.data_ptr() % 4 == 0)
    grid = cols32_grid(k, inner, x.numel() // (k * inner), bn, kb, tile.kb_fast)
    if grid is None:
        return None
    # bf16 as raw bits: a column pair per 4-byte word where the tile splits
    view = (torch.int32 if consts["SPLIT"] else torch.int16) if bf16 else None
    return Kernel32(kernels.quantize.quantize_cols32_kernel, grid, view, (k, inner),
                    n.rot_scale, (x.numel() // 32, fold.rows) if fold else (0, 1), consts)


FOLD_COLUMNS_MAX_GROUP = 4  # the largest fold group ``columns_fold_kernel`` takes (a program
#                            holds 32 x group rows: at 32 blocks, 1024 rows, it would spill)


def columns32(x: torch.Tensor, k: int, inner: int, n: Numerics, tuning: Tuning,
              qdq: bool, fold: FoldOutput | None = None) -> Kernel32 | None:
    """``kernels.both_axes.columns_kernel``'s launch over a contiguous ``x`` quantized along
    an axis with nothing but size-1 axes before it (k rows, ``inner`` columns: x flattened to
    a matrix) with the ``both_axes`` tile, or None where that kernel does not apply: axes of
    more than one element before the quantized one, an integer format, stochastic rounding,
    random signs, another conversion than OCP's, or a grid past CUDA's limits. ``fold``:
    ``kernels.both_axes.columns_fold_kernel``'s launch (one fold group along axis 0 per
    program, the ``fold_columns`` tile), where the group has at most
    ``FOLD_COLUMNS_MAX_GROUP`` blocks."""
    if x.numel() != k * inner or not both_axes_takes(n):
        return None
    if fold:
        if fold.group > FOLD_COLUMNS_MAX_GROUP or k % (32 * fold.group):
            return None
        bn = min(tuning.fold_columns[0], max(32, 1 << (inner - 1).bit_length()))
        grid = (k // (32 * fold.group), -(-inner // bn))
        if grid[0] >= 2**31 or grid[1] >= 2**16:
            return None
        consts = _columns_fold_constexprs(n, x.dtype, bn, tuning.fold_columns[1],
                                          inner % bn == 0, x.numel() >= BIG_NUMEL, fold.key)
        return Kernel32(kernels.both_axes.columns_fold_kernel, grid,
                        torch.int16 if x.dtype == torch.bfloat16 else None, (k, inner),
                        n.rot_scale, (x.numel() // 32, fold.rows), consts)
    bn = both_axes_columns(tuning, inner)
    kb = 1 if qdq else tuning.both_axes_blocks  # blocks along axis 0 per program: quantize
    while kb > 1 and k % (32 * kb):  # (halved until they tile axis 0)
        kb //= 2
    grid = both_axes_grid(k // kb, inner, bn)
    if grid is None:
        return None
    # (quantize-dequantize with a rotation: quarter loads, the butterflies inside threads)
    quarters = quarter_form() if qdq and n.rotation is not None and \
        tuning.both_axes_quarters else 0
    consts = _columns_constexprs(n, x.dtype, bn, tuning.both_axes[1], inner % bn == 0,
                                 x.numel() >= BIG_NUMEL, qdq, kb, quarters)
    return Kernel32(kernels.both_axes.columns_kernel, grid,
                    torch.int16 if x.dtype == torch.bfloat16 else None, (k, inner),
                    n.rot_scale, (0, 1), consts)


@functools.lru_cache(maxsize=256)
def _columns_fold_constexprs(n: Numerics, in_dtype: torch.dtype, bn: int, warps: int,
                             even: bool, big: bool, fold_key: tuple) -> dict:
    group, d_max, pow2, hw_cvt = fold_key
    return dict(n.constexprs(in_dtype), GROUP=group, D_MAX=d_max, POW2=pow2, HW_CVT=hw_cvt,
                BN=bn, EVEN=even, BIG=big, num_warps=warps)


@functools.lru_cache(maxsize=256)
def _columns_constexprs(n: Numerics, in_dtype: torch.dtype, bn: int, warps: int, even: bool,
                        big: bool, qdq: bool, kb: int = 1, quarters: int = 0) -> dict:
    return dict(n.constexprs(in_dtype), QDQ=qdq, BN=bn, EVEN=even, BIG=big, KB=kb,
                QUARTERS=quarters, num_warps=warps)


def rows32(x: torch.Tensor, axis: int, inner: int, data: torch.Tensor, scales: torch.Tensor,
           n_blocks: int, n: Numerics, seed: int, tuning: Tuning, qdq: bool = False,
           keys: torch.Tensor | None = None, fold: FoldOutput | None = None):
    """The 32-block kernels over a contiguous ``x``: along the last axis (Fprop, Dgrad) the row
    kernel; along another (Wgrad contracts over tokens) per ``tuning.column_path`` of the
    operation the one-pass column kernel (or the both-axes module's axis-0 kernel, see
    ``kernel32``), or a tiled transpose then the row kernel. The output
    is K-major, and the bits the same, every way (stochastic rounding counts K-major indices).
    ``qdq``: ``data`` is the bf16 output viewed as int32 pairs (quantize-dequantize),
    ``scales`` unused. ``fold``: ``data`` gets E4M3 codes, one byte per element, either kernel
    folding in its own pass. Returns (the ``Kernel32`` launched, its arguments, what ``run``
    returned, the transpose that went first: None, or (axis, tuning), the arguments of
    ``move_axis_last`` that gave the kernel its input)."""
    seed_arg, sign_arg = random_args(n, seed, keys)
    k32 = kernel32(x, axis, inner, n_blocks, n, tuning, qdq, fold)
    if k32 is not None:
        args = k32.args(x, data, scales, seed_arg, sign_arg, fold)
        return k32, args, k32.launch(args), None
    x = move_axis_last(x, axis, tuning)
    k32 = kernel32(x, x.dim() - 1, 1, n_blocks, n, tuning, qdq, fold)
    args = k32.args(x, data, scales, seed_arg, sign_arg, fold)
    return k32, args, k32.launch(args), (axis, tuning)


def cols32_constexprs(n: Numerics, in_dtype: torch.dtype, k: int, inner: int, numel: int,
                      tile: ColumnTile, qdq: bool, fold: FoldOutput | None = None,
                      on_hopper: bool = False, aligned: bool = True) -> tuple[dict, int, int]:
    """(constexprs and launch options, columns per program, blocks along K per program) of the
    32-block column kernel. A fold takes whole groups along K per program: its blocks along K
    per program are the least common multiple of the tile's and the group's size (both divide
    K / 32, so it does too). The tile's register cap applies on Hopper (``on_hopper``) and not
    to a fold (as the row kernel's). ``ColumnTile.split`` applies to bf16 input with an even
    ``inner``, 4-byte ``aligned`` (its pairs whole words), and no fold (elsewhere the tile runs
    unsplit: the same bits); ``ColumnTile.serial`` to more than one block along K per program
    and no fold (a fold's groups are quantized at once); ``ColumnTile.quarters`` to one block
    along K per program or a serial tile (in ``quarter_form``'s form); ``ColumnTile.joint``
    to a serial tile of 2 or 4 blocks (8 with quarters) of 4-bit codes, quantize only, split
    only with quarters."""
    kb = tile.blocks_along(k // 32)
    if fold:
        kb = math.lcm(kb, fold.group)
    split = tile.split and in_dtype == torch.bfloat16 and inner % 2 == 0 and aligned and \
        not fold
    # the last row's immediate offset within a load's signed 24-bit range
    size = 2 if in_dtype != torch.float32 else 4
    const = tile.const_stride and not split and (32 * kb - 1) * inner * size < 2**23
    fold_key = fold.key if fold else NO_FOLD_KEY
    if fold and tile.vec > 1:
        # a tile whose threads hold vec > 1 columns folds with ``encode``, not the GPU's E4M3
        # conversion: on an H100 under Triton 3.6 that conversion gave wrong codes in such
        # tiles (~1,500 of 12,288 elements of an E2M1 fold, codes of other elements; every
        # vec = 1 tile and the row kernel right; the same tiles right with ``encode``), cause
        # not isolated (results/native_gpu/column_fold_cvt_h100.txt)
        fold_key = fold_key[:3] + (False,)
    serial = tile.serial and kb > 1 and not fold
    quarters = quarter_form() if tile.quarters and (kb == 1 or serial) else 0
    # (joint: 2 or 4 blocks of 4-bit codes per program, 8 with quarters; quantize only;
    # split only with quarters)
    joint = tile.joint and serial and (kb in (2, 4) or kb == 8 and quarters > 0) and \
        not qdq and (quarters > 0 or not split) and pack_factor(n.fmt) == 2
    return _cols32_constexprs(n, in_dtype, tile, qdq, on_hopper,
                              fold_key, kb, numel >= BIG_NUMEL,
                              inner % tile.columns == 0, split,
                              inner if const else 0, serial, joint, quarters), tile.columns, kb


@functools.cache
def quarter_form() -> int:
    """How the column kernel loads a ``ColumnTile(quarters=True)`` quarter
    (``kernels.quantize.column_quarter``'s FORM) under the installed Triton: its coalescing
    lays the first of two equally contiguous dimensions across threads up to 3.6 (1: loaded
    as [columns, 8]) and the last from 3.7 on (2: loaded as [8, columns], then transposed).
    Checked on sm_90 SASS (no warp shuffles, no shared-memory layout conversion) under 3.6,
    3.7, 3.8 and 3.9 (``tests/test_native_quantize.py``, ``kernel_sass.py``)."""
    import triton
    major, minor = (int(v) for v in triton.__version__.split(".")[:2])
    return 1 if (major, minor) <= (3, 6) else 2


@functools.lru_cache(maxsize=1024)
def _cols32_constexprs(n: Numerics, in_dtype: torch.dtype, tile: ColumnTile, qdq: bool,
                       on_hopper: bool, fold_key: tuple, kb: int, big: bool,
                       even: bool, split: bool = False, stride: int = 0,
                       serial: bool = False, joint: bool = False,
                       quarters: int = 0) -> dict:
    return dict(**n.constexprs(in_dtype), QDQ=qdq, QUARTER_IN_SCALE=n.quarter_in_scale(in_dtype),
                **fold_constexprs(fold_key), BN=tile.columns, KB=kb, HIDE=tile.hide,
                VEC=tile.vec, KB_FAST=tile.kb_fast, BIG=big, EVEN=even, SPLIT=split,
                INNER=stride, SERIAL=serial, JOINT=joint, QUARTERS=quarters,
                num_warps=tile.warps,
                **register_cap(tile, on_hopper, fold_key))


def qdq_both_axes(x: torch.Tensor, rows_out: torch.Tensor, cols_out: torch.Tensor,
                  n: Numerics, tuning: Tuning) -> tuple:
    """``kernels.both_axes.qdq_both_axes_kernel`` on a contiguous 2-D ``x`` (rows and columns
    multiples of 32; a grid of 32-column programs within ``both_axes_grid``'s limits, so one
    of the tile's too): its quantize-dequantized values along the last axis into ``rows_out``
    (x's shape), along axis 0 into ``cols_out`` (x's transpose, contiguous); ``n``: RNE, a
    float format, no rotation or a Hadamard one without random signs. Returns (grid, the
    positional arguments, the constexprs, what ``run`` returned): what a per-call plan keeps
    (``plans.make_both_axes``)."""
    n_rows, n_cols = x.shape
    bn = both_axes_columns(tuning, n_cols)
    consts = _both_axes_constexprs(n, x.dtype, bn, tuning.both_axes[1], n_cols % bn == 0,
                                   x.numel() >= BIG_NUMEL)
    grid = both_axes_grid(n_rows, n_cols, bn)
    args = both_axes_args(x, rows_out, cols_out, n.rot_scale)
    return grid, args, consts, run(kernels.both_axes.qdq_both_axes_kernel, grid, *args, **consts)


def both_axes_args(x: torch.Tensor | int, rows_out, cols_out, rot_scale: float,
                   shape: tuple | None = None) -> tuple:
    """The positional arguments of ``qdq_both_axes_kernel`` (bf16 as int16 bit patterns). The
    tensors may be given as their addresses (integers: ``native.plans``' launches of a compiled
    kernel), with ``shape``, x's."""
    if type(x) is int:
        return (x, rows_out, cols_out, *shape, rot_scale)
    return (x.view(torch.int16) if x.dtype == torch.bfloat16 else x, rows_out.view(torch.int16),
            cols_out.view(torch.int16), x.shape[0], x.shape[1], rot_scale)


def both_axes_takes(n: Numerics) -> bool:
    """Whether the ``kernels.both_axes`` kernels compute numerics ``n``: a float format, RNE,
    no rotation or one without random signs, the OCP conversion."""
    return (n.fmt.kind != "int" and n.rounding == Rounding.RNE
            and (n.rotation is None or not n.rotation.has_signs)
            and n.conversion == Conversion.OCP)


def both_axes_columns(tuning: Tuning, n_cols: int) -> int:
    """Columns per program of the ``kernels.both_axes`` kernels on ``n_cols`` columns: the
    tuning's, but none wider than the matrix (rounded up to a power of two) and none narrower
    than 32 (masked columns past n_cols)."""
    return min(tuning.both_axes[0], max(32, 1 << (n_cols - 1).bit_length()))


def both_axes_grid(n_rows: int, n_cols: int, bn: int) -> tuple[int, int] | None:
    """The grid of ``kernels.both_axes`` with ``bn`` columns per program on an n_rows x n_cols
    matrix, or None where it exceeds CUDA's limits (then the caller takes the two calls)."""
    grid = (n_rows // 32, -(-n_cols // bn))
    return grid if grid[0] < 2**31 and grid[1] < 2**16 else None


@functools.lru_cache(maxsize=256)
def _both_axes_constexprs(n: Numerics, in_dtype: torch.dtype, bn: int, warps: int, even: bool,
                          big: bool) -> dict:
    c = n.constexprs(in_dtype)  # (RNE, no random signs, values out: no such constexprs)
    return dict({k: v for k, v in c.items() if k not in ("ROUNDING", "SIGNS", "PACK")},
                BN=bn, EVEN=even, BIG=big, num_warps=warps)


def cols32_grid(k: int, inner: int, outer: int, bn: int, kb: int, kb_fast: bool):
    """The column kernel's grid, or None where a dimension exceeds CUDA's limits (then the
    caller transposes and runs the row kernel)."""
    along, across = k // (32 * kb), cdiv(inner, bn)
    grid = (along, across, outer) if kb_fast else (across, along, outer)
    return grid if grid[1] <= 65535 and grid[2] <= 65535 else None


# the software gfx950 conversion's sources: dtype -> (emulator.gfx950.SOURCES name, the
# kernel's SRC, the raw-bits view it loads)
_GFX950_SOURCES = {torch.float32: ("float32", 0, torch.int32),
                   torch.bfloat16: ("bfloat16", 1, torch.int16),
                   torch.float16: ("float16", 2, torch.int16)}


def gfx950_rows(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, n_blocks: int,
                n: Numerics, seed: int, keys: torch.Tensor | None = None) -> None:
    """``kernels.gfx950.quantize_gfx950_kernel`` over a contiguous K-major ``x`` (blocks of 32
    along the last axis): the conversions of ``conversion='gfx950'``, by gfx950's own
    instructions on a gfx950 GPU where the kernel has them (FP4 and FP8; stochastic from
    float32), else in software (``kernels.gfx950.convert_soft``): the same bits."""
    sr = n.rounding == Rounding.STOCHASTIC
    c = lower(n.fmt).constexprs()
    nb = 256 if interpreting() else 16  # (the interpreter's cost is per program)
    consts = dict(FP4=n.fmt.name == "e2m1", SR=sr, RULE=int(n.scale_rule), EMAX=c["EMAX"],
                  MBITS=c["MBITS"], RNUM=c["RNUM"], RSHIFT=c["RSHIFT"], NB=nb, num_warps=4)
    if gfx950(x.device) and n.fmt.name in kernels.gfx950.HW_FORMATS and \
            (x.dtype == torch.float32 or not sr):
        consts["INSN"] = kernels.gfx950.INSTRUCTIONS[(n.fmt.name, sr)]
    else:
        from ..emulator.gfx950 import SOURCES, SPECIAL_OUTPUTS
        name, src, bits = _GFX950_SOURCES[x.dtype]
        smb, seb, sbias, _ = SOURCES[name]
        nan_out, ovf_out = SPECIAL_OUTPUTS[n.fmt.name]
        consts.update(INSN="", HW=False, SRC=src, SMB=smb, SEB=seb, SBIAS=sbias,
                      BIAS=c["BIAS"], MAXC=c["MAXC"], SIGN=c["SIGN"], NAN_OUT=nan_out,
                      OVF_OUT=ovf_out)
        x = x.view(bits)
    seed_arg, _ = random_args(n, seed, keys)
    run(kernels.gfx950.quantize_gfx950_kernel, (cdiv(n_blocks, nb),), x, data, scales,
        n_blocks, seed_arg, **consts)


def strided(x: torch.Tensor, data: torch.Tensor, scales: torch.Tensor, rows: int, k: int,
            inner: int, block_size: int, n: Numerics, seed: int, tuning: Tuning,
            cast: bool = False, keys: torch.Tensor | None = None) -> None:
    """The strided tile kernel: blocks of any size along any axis, or element casts (``cast``:
    block_size 1, no scales)."""
    tile = tuning.last_axis if inner == 1 else tuning.other_axis
    nblk = k // block_size
    kb = tile.blocks_per_row(block_size, nblk)
    consts = n.constexprs(x.dtype)
    if cast:  # one code per byte, whatever the format
        consts = {**consts, "PACK": 1}
    seed_arg, sign_arg = random_args(n, seed, keys)
    run(kernels.quantize.quantize_kernel, (cdiv(rows, tile.rows), cdiv(nblk, kb)),
        x.view(torch.int16) if x.dtype == torch.bfloat16 else x, data, scales, sign_arg,
        rows, k, inner, seed_arg, n.rot_scale, **consts, CAST=cast, ROWS=tile.rows, KB=kb,
        BS=block_size, INNER1=inner == 1, BIG=x.numel() >= BIG_NUMEL,
        EVEN=rows % tile.rows == 0 and nblk % kb == 0, num_warps=tile.warps)


def dequantize(data: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, k: int,
               block_size: int, fmt: ElementFormat, tuning: Tuning) -> None:
    """Codes and scales (K-major) -> ``out`` (float32, or bfloat16 rounded to nearest even)."""
    rows = math.prod(out.shape[:-1])
    tile = tuning.dequantize
    nblk = k // block_size
    kb = tile.blocks_per_row(block_size, nblk)
    bf16 = out.dtype == torch.bfloat16
    run(kernels.dequantize.dequantize_kernel,
        (cdiv(rows, tile.rows), cdiv(nblk, kb)),
        data, scales, out.view(torch.int16) if bf16 else out, rows, k,
        **lower(fmt).constexprs(), PACK=pack_factor(fmt), OUT_BF16=bf16, ROWS=tile.rows, KB=kb,
        BS=block_size, EVEN=rows % tile.rows == 0 and nblk % kb == 0,
        BIG=out.numel() >= BIG_NUMEL, num_warps=tile.warps)


def move_axis_last(x: torch.Tensor, axis: int, tuning: Tuning) -> torch.Tensor:
    """``x.movedim(axis, -1).contiguous()`` for a contiguous ``x``, through a Triton tiled
    transpose: torch's strided copy of a transposed bf16 8192 x 14336 ran at ~15% of copy
    bandwidth on an H200 (results/native_gpu)."""
    k = x.shape[axis]
    inner = math.prod(x.shape[axis + 1:])
    outer = x.numel() // max(1, k * inner)
    if outer > 65535:  # the grid's third dimension
        return x.movedim(axis, -1).contiguous()
    out = torch.empty(x.shape[:axis] + x.shape[axis + 1:] + (k,), dtype=x.dtype, device=x.device)
    if x.numel():
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
        bk, bi = tuning.transpose
        run(kernels.transpose.transpose_kernel, (cdiv(k, bk), cdiv(inner, bi), outer),
            x.view(bits), out.view(bits), k, inner, BK=bk, BI=bi,
            EVEN=k % bk == 0 and inner % bi == 0, num_warps=4)
    return out
