"""Tuning: tile shapes, warps and register caps of the native kernels, as explicit objects.

Tuning changes speed, never bits (the tests run the kernels under several tunings and compare
bits). Every native operation takes ``tuning=`` (None: ``default_tuning()``), so a benchmark
sweeps tiles by passing objects, never by setting a global.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace

import torch

from ._lazy import triton

from .dispatch import blackwell, interpreting


@dataclass(frozen=True)
class RowTile:
    """The 32-block row kernel: ``blocks`` per program on ``warps`` warps; ``maxnreg`` caps the
    registers per thread (on Hopper, where it was measured; None: no cap)."""
    blocks: int
    warps: int
    maxnreg: int | None = None


@dataclass(frozen=True)
class ColumnTile:
    """The 32-block column kernel: ``kblocks`` blocks of 32 elements along the quantized axis
    (fewer where the axis's block count is not a multiple) times ``columns`` positions of the
    other axes per program, on ``warps`` warps; ``hide``: the compiler sees only ``vec``
    contiguous columns, so loads are at most ``vec`` elements wide (bf16: 2 bytes at 1, 4 at
    2; wider only where alignment is provable: ``inner`` a multiple of 16) and, with
    ``columns / vec`` >= 32 ``warps``, each thread holds ``vec`` columns whole (no data
    crosses threads); else vectorized loads and a layout conversion; ``kb_fast``: programs
    along the quantized axis launched first (their outputs are neighbours); ``maxnreg`` caps
    the registers per thread on Hopper, as ``RowTile``'s (None: no cap; a fold takes none);
    ``split``: bf16 loaded as 4-byte words of two neighbouring columns, a thread's even column
    quantized and then its odd one (half the float32 values live at a time; ``columns`` even;
    bf16 with an even number of columns and no fold only, elsewhere the tile runs unsplit);
    ``const_stride``: the row stride (the positions of the other axes, ``inner``) compiled in,
    so that the tile's rows load at immediate offsets from one base pointer (one compile per
    distinct ``inner``; not with ``split``, and only where the offsets fit the load's 24-bit
    immediate); ``serial``: the program's blocks along K quantized one after another (a
    32-row load and its stores each, one block's values live at a time), not all at once
    (not with a fold, whose groups a program holds whole: there the tile runs at once);
    ``joint`` (with ``serial``, two or four blocks along K, eight with ``quarters``; 4-bit
    codes, no quantize-dequantize; with ``split`` only with ``quarters``): the passes keep
    their codes and scales and the last stores them all, so that each column's 16 ``kblocks``
    code bytes (whole sectors) go out in back-to-back stores, with ``quarters`` its scale
    bytes as one word (elsewhere plain ``serial``);
    ``quarters`` (one block along K at a time: ``kblocks`` 1 or ``serial``): each block loaded
    as four 8-row quarters in the row kernel's layout, instead of one tile reshaped (no layout
    conversion where each thread holds its columns whole); serial passes then run as a loop."""
    columns: int
    warps: int
    kblocks: int = 1
    hide: bool = True
    kb_fast: bool = False
    vec: int = 1
    maxnreg: int | None = None
    split: bool = False
    const_stride: bool = False
    serial: bool = False
    joint: bool = False
    quarters: bool = False

    def __post_init__(self):
        if self.vec < 1 or self.vec & (self.vec - 1) or self.columns % self.vec:
            raise ValueError(f"ColumnTile vec must be a power of two dividing columns "
                             f"({self.columns}), got {self.vec}")
        if self.joint and not self.serial:
            raise ValueError("a joint ColumnTile stores its serial passes together: it takes "
                             "serial=True")
        if self.split and self.columns % 2:
            raise ValueError(f"a split ColumnTile takes an even number of columns, got "
                             f"{self.columns}")

    def blocks_along(self, n_blocks: int) -> int:
        """Blocks along the quantized axis per program: ``kblocks`` halved until it divides
        ``n_blocks`` (every program takes whole blocks, none masked along K)."""
        kb = self.kblocks
        while n_blocks % kb:
            kb //= 2
        return kb


@dataclass(frozen=True)
class StridedTile:
    """The strided tile kernels (quantize along any axis, dequantize, casts): ``rows`` rows of
    about ``elems`` elements (whole blocks, a power of two of them) on ``warps`` warps."""
    rows: int
    elems: int
    warps: int

    def blocks_per_row(self, block_size: int, n_blocks: int) -> int:
        kb = max(1, self.elems // block_size)
        kb = 1 << (kb.bit_length() - 1)  # a power of two
        return max(1, min(kb, triton.next_power_of_2(n_blocks)))


@dataclass(frozen=True)
class Tuning:
    """Tiles of every native kernel.

    rows32 / rows32_qdq  the 32-block row kernel, quantize and quantize-dequantize
    columns              blocks of 32 along a non-last axis (quantize): 'transpose' (a tiled
                         transpose, then the row kernel), 'kernel' (the one-pass column kernel)
                         or 'both_axes' (along axis 0, ``kernels.both_axes.columns_kernel`` with
                         the ``both_axes`` tile where it applies: RNE, no rotation or a fixed
                         Hadamard one, a float format; the column kernel elsewhere)
    cols32               the 32-block column kernel's tile
    columns_qdq / cols32_qdq    the same for quantize-dequantize, and
    columns_fold / cols32_fold  for the fold into E4M3 (None: as ``columns`` / ``cols32``;
                         'both_axes' inherited from ``columns`` folds through the column
                         kernel; set here, along axis 0 through
                         ``kernels.both_axes.columns_fold_kernel`` with the ``fold_columns``
                         tile where it applies: RNE, no random signs, groups of at most
                         ``FOLD_COLUMNS_MAX_GROUP`` blocks; the transpose elsewhere. On an
                         H100 it is no faster than the transpose at any tile timed:
                         results/native_gpu/column_fold_check_h100.txt)
    cols32_sr            the column kernel's tile under stochastic rounding, quantize and
                         quantize-dequantize alike (None: the operation's own; not the fold)
    cols32_unrotated     the column kernel's quantize tile for 4-bit codes (FP4) under RNE
                         without a rotation (None: ``cols32``)
    last_axis / other_axis   the strided quantize kernel along the last axis / another one
    dequantize           the dequantize kernel
    transpose            (BK, BI) of the tiled transpose
    both_axes            (columns, warps) per program of the ``kernels.both_axes`` kernels
                         (32 rows by ``columns``): the both-axes quantize-dequantize and the
                         'both_axes' column path
    both_axes_blocks     32-blocks along axis 0 per program of the 'both_axes' column path's
                         quantize (not quantize-dequantize): 1, 2 or 4 (halved where they do
                         not tile the axis); more blocks store each column's codes in longer
                         runs
    both_axes_quarters   the 'both_axes' column path's quantize-dequantize with a rotation
                         loads each column's block as four 8-row quarters, each thread's
                         columns whole (the rotation's butterflies inside threads), not rows
                         of columns (butterflies across threads: warp shuffles); the same bits
    fold_columns         (columns, warps) per program of ``columns_fold_kernel`` (one fold
                         group along axis 0, 32 x group rows, by ``columns``)
    linear_both_axes     MXLinear quantize-dequantizes X in Fprop and ∇Y in backward along both
                         axes in one pass (``quantize_dequantize_both_axes``) where its recipe
                         gives both of the operand's GEMMs the same RNE numerics (no rotation
                         or a fixed Hadamard one; GEMM method 'bf16'); the same bits either
                         way. Each layer then keeps X along tokens for its backward instead of
                         X: in eager mode Linears that share an input (wq, wk, wv) keep a copy
                         each (compiled, identical calls merge). On where timed (H100).
    """
    rows32: RowTile = RowTile(32, 1, 72)
    rows32_qdq: RowTile = RowTile(32, 1)
    columns: str = "transpose"
    cols32: ColumnTile = ColumnTile(64, 2)
    columns_qdq: str | None = None
    cols32_qdq: ColumnTile | None = None
    columns_fold: str | None = None
    cols32_fold: ColumnTile | None = None
    cols32_sr: ColumnTile | None = None
    cols32_unrotated: ColumnTile | None = None
    last_axis: StridedTile = StridedTile(16, 256, 4)
    other_axis: StridedTile = StridedTile(64, 64, 4)
    dequantize: StridedTile = StridedTile(16, 256, 4)
    transpose: tuple[int, int] = (64, 64)
    both_axes: tuple[int, int] = (128, 4)
    both_axes_blocks: int = 1
    both_axes_quarters: bool = False
    fold_columns: tuple[int, int] = (64, 4)
    linear_both_axes: bool = False
    notes: str = field(default="", compare=False)

    def __post_init__(self):
        if self.columns not in ("transpose", "kernel", "both_axes"):
            raise ValueError(f"columns must be 'transpose', 'kernel' or 'both_axes', "
                             f"got {self.columns!r}")
        if self.columns_qdq not in (None, "transpose", "kernel", "both_axes"):
            raise ValueError(f"columns_qdq must be None, 'transpose', 'kernel' or 'both_axes', "
                             f"got {self.columns_qdq!r}")
        if self.columns_fold not in (None, "transpose", "kernel", "both_axes"):
            raise ValueError(f"columns_fold must be None, 'transpose', 'kernel' or "
                             f"'both_axes', got {self.columns_fold!r}")
        cols, warps = self.fold_columns
        if cols < 32 or cols & (cols - 1) or warps < 1 or warps & (warps - 1):
            raise ValueError(f"fold_columns takes (columns, warps), powers of two, columns >= "
                             f"32; got {self.fold_columns}")
        if self.both_axes_blocks not in (1, 2, 4):
            raise ValueError(f"both_axes_blocks must be 1, 2 or 4, got {self.both_axes_blocks}")
        cols, warps = self.both_axes
        if cols < 32 or cols & (cols - 1) or warps < 1 or warps & (warps - 1):
            raise ValueError(f"both_axes takes (columns, warps), powers of two, columns >= 32; "
                             f"got {self.both_axes}")

    def column_path(self, op: str = "quantize", stochastic: bool = False, *,
                    unrotated_fp4: bool = False) -> tuple[str, ColumnTile]:
        """('transpose', 'kernel' or 'both_axes', the column tile) for blocks along a non-last
        axis of ``op``: 'quantize', 'qdq' (quantize-dequantize) or 'fold' (into E4M3:
        'both_axes' only where ``columns_fold`` says so; inherited from ``columns``, the column
        kernel); ``stochastic``: under stochastic rounding
        (``cols32_sr``, where set, for quantize and qdq); ``unrotated_fp4``: 4-bit codes
        without a rotation (``cols32_unrotated``, where set, for quantize under RNE). Under
        'both_axes' the tile is the column kernel's for the calls the both-axes kernel does not
        take (``launch.kernel32`` decides)."""
        if op == "quantize":
            path, tile = self.columns, self.cols32
            if unrotated_fp4 and not stochastic and self.cols32_unrotated is not None:
                tile = self.cols32_unrotated
        elif op in ("qdq", "fold"):
            path, tile = getattr(self, f"columns_{op}"), getattr(self, f"cols32_{op}")
            path, tile = path or self.columns, tile or self.cols32
        else:
            raise ValueError(f"op must be 'quantize', 'qdq' or 'fold', got {op!r}")
        if stochastic and op != "fold" and self.cols32_sr is not None:
            tile = self.cols32_sr
        if op == "fold" and path == "both_axes" and self.columns_fold != "both_axes":
            path = "kernel"  # ('both_axes' inherited from ``columns``: the column kernel)
        return path, tile


# On an H200 (results/native_gpu): 32 blocks on one warp was the fastest row tile or within
# noise of it for both forms (one warp also keeps the tile's NaN/Inf vote inside the warp); the
# packed-code form capped at 72 registers was 3% faster than ptxas's 80 (64 spills). Columns:
# with one column per thread the one-pass column kernel ran at 14% of copy on an H100 (its
# 2-byte loads do not stream), the transpose + row kernel at about 35%: 'transpose' stays for
# GPUs not measured with the column-pair tiles (the H100 and the H200 below were).
GPU = Tuning(notes="GPU defaults (row tiles tuned on an H200)")
# On an H100 (sixteenth session, commit bdce5fc, two GPUs of one host within 0.3%:
# results/native_gpu/archive/bench_columns_h100_2026-11-26a.md and its _repeat): the column kernel
# with a column pair per thread (4-byte loads, no shuffles), programs along K first, quantizes
# bf16 8192 x 14336 along tokens at 0.50 / 0.55 / 0.49 of copy (no rotation / H16 / H16 +
# stochastic) against the transpose path's 0.37 / 0.37 / 0.30. Timed again
# (results/native_gpu/archive/bench_columns_h100_2026-11-26b.md, eighteenth session, 4beed8c, GPU
# 2 of four H100s while two others trained; the rows both runs have within 2.1%, most within 1%):
# the same 0.50 / 0.56 / 0.49. The split tiles (``ColumnTile(split=True)``) lost there, 0.21-0.23
# / 0.19 / 0.12, and stay non-default (the split tiles that load [32, columns] tiles; compiled by
# the hosts' Triton 3.6, this tile split takes
# 166-168 registers and 290-354 warp shuffles, where Triton 3.9 gives 95-127 and 2:
# results/native_gpu/sass_columns_split.txt). Quantize-dequantize takes the column kernel with the
# H200's tile, ``ColumnTile(64, 1, kb_fast=True, vec=2)``: 0.63 / 0.56 (no rotation / H16) against
# the transpose path's 0.46 / 0.48 (this quantize tile: 0.42 / 0.33; the split tiles 0.45-0.46, as
# the transpose; the sixteenth session did not time this tile for it). The fold keeps the
# transpose: a program folds whole groups along K (32 blocks per column at method 'fp8''s groups),
# far past these tiles' registers.
# Twentieth session (one H100; results/native_gpu/column_probe_h100.md and
# column_tile_check_h100.txt): a probe with the quantize kernel's loads and stores and no
# arithmetic capped at 0.57-0.58 of copy with one 32-block along K per program (each column's 16
# code bytes half a 32-byte sector; its writes alone at 0.12-0.15 of copy's bandwidth), and ran at
# 0.87-0.88 with two blocks; ``const_stride``'s 1.8 fewer instructions per element gained 1-2% on
# the one-block tiles. With two blocks per program the real kernel gains less than the probe for
# quantize and more for quantize-dequantize (whose bf16 stores were whole lines already, so its
# gain is not the sectors': more rows in flight per program, not analysed): quantize (128, 2, 2)
# with the stride compiled in 0.55 / 0.70 / 0.45 of copy (no rotation / H16 / H16 + SR; 0.51 /
# 0.68 / 0.43 without it, 0.50 / 0.55 / 0.49 with one block; the same order in a second sweep),
# quantize-dequantize (64, 2, 2) 0.80 / 0.78 (against 0.63 / 0.56); every tile's bits equal to the
# transpose path's on 117 M random bf16 patterns on the GPU, and the d8d96d7 defaults over every
# bf16 value. Four blocks at once lost (quantize 0.02-0.31: registers). Where K / 32 is odd the
# launcher runs one block per program. (Compiled for sm_90a by Triton 3.9, (128, 2, 2) and
# (64, 1, 2) at once spill (64-77 spill stores without a rotation, 16-19 with H16); their
# ``serial`` forms, a block at a time, spill none (results/native_gpu/sass_columns_kb2.txt), and
# lose: quantize at most 0.56 / 0.57, quantize-dequantize 0.56 / 0.37 (column_tile_check_h100.txt,
# twenty-first session), a column's two half sectors stored a pass apart do not merge
# (column_probe_h100.md, mode serial: 0.34-0.48).) Stochastic rounding keeps a one-block tile
# for quantize and quantize-dequantize alike (``cols32_sr``): (64, 1, kb_fast, vec 2), quantize
# H16 + SR 0.49 of copy (bench_columns_h100.md) against 0.43-0.45 with the two-block quantize
# tile and 0.14 with
# (64, 2, 2), whose H16 + SR compiles to 353 shuffles and a spill; quantize-dequantize under SR
# runs the tile it ran before d8d96d7.
# Twenty-first session (results/native_gpu/archive/step_shapes_h100_2026-11-26.md: the
# quantize-dequantize calls of a 125m and a 30m step at their own shapes, each against a
# same-shape copy in CUDA graphs): the
# row kernel's quantize-dequantize with 16 blocks a program ran the step's bf16 activations
# (32768 tokens x 128-2048) at 0.88-1.00 of copy without a rotation and 0.77-0.98 with H16,
# against 0.71-0.90 / 0.74-0.95 with the GPU default's 32, and the fp32 weights at 0.86-1.03
# against 0.65-0.93 (8 blocks: 0.89-0.98 on the weights, 0.49-0.60 on the activations).
# Twenty-fourth session (results/native_gpu/step_both_axes_h100.md,
# results/train_speed/both_axes/): X and ∇Y quantize-dequantized along both axes in one pass
# took 11.5 ms of a 125m mxfp4_all step against the two calls' 14.3 (0.81-0.84 of its 6-byte
# stream at the large shapes, bits equal), and 125m training with CUDA graphs ran mxfp4_all at
# 0.84x bf16 against 0.79x (mxfp4_all_h16 0.85x against 0.80x): on by default here.
# Twenty-fifth session: quantize-dequantize along axis 0 through ``kernels.both_axes.
# columns_kernel`` ran bf16 8192 x 14336 at 0.92-0.95 of copy with every tile, no rotation and
# H16, against the column kernel's 0.80 / 0.78 (results/native_gpu/bench_columns_kernel_h100.md;
# bits equal), and at the 125m and 30m step's shapes (step_shapes_h100.md, the kernel's first
# form) in 7.2-7.5 ms a 125m step against 8.8. (64, 2) is within 3% of the best tile at every
# shape there and for the both-axes pass (step_both_axes_h100.md: the best tile without a
# rotation, 1% behind (128, 4) with H16). Quantize (codes) along axis 0 stays the column
# kernel's: the axis-0 kernel wrote it at 0.48-0.52 of copy against 0.56 / 0.70, and its
# half-block tiles (61-74 registers) at 0.41-0.45 (twenty-sixth session, same file): not an
# occupancy bound.
# Twenty-eighth session (results/native_gpu/column_tile_check_h100.txt, bits equal to the
# transpose path's on 117 M random bf16 patterns): without a rotation the two-block quantize
# tile spills (80 spill stores, Triton 3.6); its ``serial`` + ``joint`` form (a block at a
# time, each column's 32 code bytes stored together) spills none and runs at 0.72 of copy
# against 0.555 (the stride compiled in; 0.68-0.70 without), while with H16 it loses (0.66
# against 0.70) and under stochastic rounding too (0.48 against the one-block SR tile's 0.52):
# ``cols32_unrotated`` takes it for RNE without a rotation only. The one-block SR tile with
# the stride compiled in (``const_stride``, 1.8 instructions per element fewer) ran H16 + SR
# at 0.537 of copy against 0.520 without, quantize-dequantize under SR 0.504 against 0.469
# (column_tile_check_h100_sr.txt, same run); joint two-block SR tiles lose (0.48-0.49, also
# capped at 192 registers, which spills none).
H100 = Tuning(rows32_qdq=RowTile(16, 1),
              columns="kernel", cols32=ColumnTile(128, 2, 2, kb_fast=True, vec=2,
                                                 const_stride=True),
              cols32_unrotated=ColumnTile(128, 2, 2, kb_fast=True, vec=2, const_stride=True,
                                          serial=True, joint=True),
              columns_qdq="both_axes", cols32_qdq=ColumnTile(64, 2, 2, kb_fast=True, vec=2),
              columns_fold="transpose",
              cols32_sr=ColumnTile(64, 1, kb_fast=True, vec=2, const_stride=True),
              both_axes=(64, 2), linear_both_axes=True,
              notes="GPU defaults, H100 column kernel for quantize, the axis-0 kernel for qdq, "
                    "16-block qdq rows, MXLinear's both-axes pass, a joint serial tile for "
                    "quantize without a rotation")
# Earlier H200 defaults (results/native_gpu/archive/bench_columns_h200_2026-11-26_1bbd32c.md,
# seventeenth session, GPU 0 of a four-H200 host while the other three trained; the transpose rows
# within 0.3% of an earlier run on another such host): a column pair per thread on one warp
# quantizes along tokens at 0.42 / 0.43 / 0.38 of copy (no rotation / H16 / H16 + stochastic)
# against the transpose path's 0.36 / 0.35 / 0.26, and, programs along K first, quantize-
# dequantizes at 0.53 / 0.51 against 0.45 / 0.47 (the quantize tile there: 0.46 / 0.41). The fold
# keeps the transpose, as on the H100.
# Thirty-third session, one H200 (results/native_gpu/column_tile_check_h200.txt,
# bench_columns_kernel_h200.md; every tile's bits equal to the transpose path's): quantize along
# tokens ran at 0.41 / 0.42 of copy (no rotation / H16) with the tiles the H200 had before, the
# H100's two-block tile at 0.44 / 0.53; the ``quarters`` tiles (one column a thread, no layout
# conversion) with their serial passes as a loop (63-78 registers with H16 under Triton 3.6)
# and every block of a column stored together (``joint``): two blocks 0.57 / 0.65, four
# (32, 1, 4) 0.63 / 0.68, and under stochastic rounding 0.44 (the old tile 0.41). Quantize-
# dequantize goes through the axis-0 kernel, (128, 2): 0.85-0.86 / 0.70 against the column
# kernel's 0.53 / 0.51; under stochastic rounding through this tile (0.50; 0.38 before).
_H200_COLUMNS = ColumnTile(32, 1, 4, kb_fast=True, vec=1, const_stride=True, serial=True,
                           joint=True, quarters=True)
# Thirty-fourth session (column_tile_check_h200.txt, runs 4-6): without a rotation, the four
# blocks of a column pair per thread (``split``: 4-byte loads, a warp reading 128 bytes of a row
# per instruction) quantize at 0.69 against this tile's 0.63; with H16 and under stochastic
# rounding the pair tile is slower (0.66 / 0.38 against 0.69 / 0.44). Quantize-dequantize with H16
# along tokens through the axis-0 kernel loading quarters (``both_axes_quarters``): 0.74-0.76 at
# (128, 2) against 0.70 with its butterflies across threads, 0.47-0.78 across tiles ((64, 2) and
# (128, 4) 0.78, but those run qdq without a rotation at 0.81-0.82 against 0.86)
# (results/native_gpu/bench_columns_kernel_h200.md, same bits).
H200 = Tuning(columns="kernel", cols32=_H200_COLUMNS,
              cols32_unrotated=ColumnTile(64, 1, 4, kb_fast=True, vec=1, split=True,
                                          serial=True, joint=True, quarters=True),
              columns_qdq="both_axes", cols32_qdq=ColumnTile(64, 1, kb_fast=True, vec=2),
              cols32_sr=_H200_COLUMNS, columns_fold="transpose", both_axes=(128, 2),
              both_axes_quarters=True,
              notes="GPU defaults, H200: the column kernel's four-block quarters tile for "
                    "quantize (and any stochastic rounding; a column pair a thread without a "
                    "rotation), the axis-0 kernel for qdq (quarter loads with a rotation)")
# Under the interpreter the cost is per program: few, large programs.
INTERPRETER = Tuning(rows32=RowTile(512, 4), rows32_qdq=RowTile(512, 4),
                     columns="kernel", cols32=ColumnTile(256, 4),
                     last_axis=StridedTile(64, 256, 4), other_axis=StridedTile(64, 256, 4),
                     dequantize=StridedTile(64, 256, 4), transpose=(128, 128),
                     notes="Triton CPU interpreter")


# sm_100a (``ocpmx audit --arch sm_100a``, results/audit): the strided kernel's 64 x 64 tile along
# a non-last axis spilled (255 registers, 56 STL) for int8, blocks of 16, stochastic rounding;
# 32 rows do not. Eight warps instead also removed the spill but changed bits on an H100 under
# Triton 3.6 (blocks of 2), so the row count, not the warps, changes here, and on sm_100 only.
# Not yet run on a Blackwell GPU (tile choices must not change bits: the GPU tests check that).
BLACKWELL = Tuning(other_axis=StridedTile(32, 64, 4), notes="H200-tuned, sm_100a spill fix")


def default_tuning(device=None) -> Tuning:
    """The tiles for tensors on ``device`` (None: a device of the GPU defaults)."""
    if interpreting():
        return INTERPRETER
    if device is None:
        return GPU
    if not isinstance(device, torch.device) or device.index is None:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # the current one, named
            device = torch.device("cuda", torch.cuda.current_device())
    return _device_tuning(device)


# OCPMX_LINEAR_BOTH_AXES=1 (or 0) turns ``Tuning.linear_both_axes`` on (off) over every GPU's
# default, to time MXLinear both ways without a code change (benchmarks/train_speed.sh); the
# same bits either way
_LINEAR_BOTH_AXES = os.environ.get("OCPMX_LINEAR_BOTH_AXES")
# OCPMX_COLUMNS_QDQ=transpose / kernel / both_axes: ``Tuning.columns_qdq`` over every GPU's
# default, likewise (a bad value is named when the tuning is first looked up)
_COLUMNS_QDQ = os.environ.get("OCPMX_COLUMNS_QDQ")


@functools.lru_cache(maxsize=64)
def _device_tuning(device) -> Tuning:
    t = _gpu_tuning(torch.device(device))
    if _LINEAR_BOTH_AXES in ("0", "1"):
        t = replace(t, linear_both_axes=_LINEAR_BOTH_AXES == "1")
    if _COLUMNS_QDQ:
        try:
            t = replace(t, columns_qdq=_COLUMNS_QDQ)
        except ValueError as e:
            raise ValueError(f"OCPMX_COLUMNS_QDQ: {e}") from None
    return t


def _gpu_tuning(device: torch.device) -> Tuning:
    if blackwell(device):
        return BLACKWELL
    # by name, not compute capability: the H100 boards (SXM, PCIe, NVL) share the tuning that
    # was measured on the SXM one, the H200 boards the H200 SXM's; H800 and GH200 keep the GPU
    # defaults until measured
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if name.startswith("NVIDIA H100"):
            return H100
        if name.startswith("NVIDIA H200"):
            return H200
    return GPU
