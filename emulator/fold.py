"""Folding an MX operand into FP8 E4M3 with one power-of-two scale per group of blocks: how an
FP4/FP6 GEMM runs on FP8 tensor cores (Hopper) with the MX products unchanged.

Every E2M1 value times 2^d is an exact E4M3 value for d in [-8, 6] (6 * 2^6 = 384 <= 448;
0.5 * 2^-8 = 2^-9, E4M3's smallest subnormal); E2M3 for d in [-6, 5], E3M2 for [-5, 4]
(``shift_range``, computed from the table, not restated). So within a group of 32-blocks along K
(``group`` blocks, or a whole row), an element of block b with scale exponent s_b is stored as
the E4M3 code of value(code) * 2^(s_b - R), and the group keeps 2^R, R = (the largest s_b among
the group's blocks holding a nonzero finite element) - d_max. Blocks whose s_b lies within
d_max - d_min of that largest one fold exactly; a block further below is rounded to nearest
E4M3 (ties to even; its smallest elements may become zero), and the elements that change are
counted (``Folded.inexact``), never silently. A block whose scale is NaN (0xFF) folds to zero
codes and marks its group's exponent NAN_EXPONENT: the GEMM multiplies that group's partial
sum by NaN, so every output it reaches is NaN, as with the MX block (NaN is carried outside
the FP8 products: how an MMA unit treats NaN inputs is not ours to rely on). An all-zero group
gets R = 0.

The folded form keeps the MX block scales, so the MX operand stays recoverable: ``unfold``
returns the codes and scales exactly where the fold was exact (tested on every code under
every scale).

A GEMM of two folded operands multiplies exactly on FP8 hardware (each E4M3 product is exact);
what differs is how a K = 32 dot sums its products, and how the dots' partial sums are added.
``folded_matmul`` gives both models of the dot:

``dot="exact"``  the 32 products summed exactly (what the interpreter computes);
``dot="hopper"``  Hopper's FP8 wgmma, measured bit for bit on an H100 (Triton 3.6,
    ``benchmarks/fold_probe.py``; 221,184 outputs of E2M1, E2M3 and E3M2 operands at groups
    of 1, 4 and 32 blocks, results/native_gpu/fold_probe.md): each product a*b exact, with
    the exponent e_a + e_b of its unbiased E4M3 factors (floor(log2|x|), E4M3's emin -6 for a
    subnormal; not renormalized: the product's significand lies in [1, 4)); every nonzero
    product truncated toward zero to a multiple of 2^(E - 13), E the largest such exponent
    among the 32; the truncated products summed exactly; the sum truncated toward zero to 14
    significant bits. The accumulator C does not take part (Triton's ``max_num_imprecise_acc
    = 32`` zeroes the wgmma's partial sum and adds it to C in float32, round to nearest even).
    Folded E2M1 products span at most 7 octaves and 4 significant bits, so the two models agree
    for E2M1; for E2M3 they rarely differ, for E3M2 mostly. Cases the measurement did not
    reach: NaN and Inf inputs (the fold keeps them out of the products), a subnormal float32
    result of the dot.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..spec import BLOCK_SIZE, E8M0, FORMATS, ElementFormat
from .block_quantize import MXArray
from .decode import decode_table

TARGET = FORMATS["e4m3"]
NAN_EXPONENT = -(2**31)  # the exponent of a group holding a NaN-scale block


@lru_cache(maxsize=None)
def shift_range(fmt: ElementFormat, target: ElementFormat = TARGET) -> tuple[int, int]:
    """(d_min, d_max): the shifts d for which every ``fmt`` value times 2^d is a ``target``
    value (exact), derived from the two formats' tables."""
    vals = decode_table(fmt)[: fmt.num_codes]
    vals = vals[np.isfinite(vals)]
    target_vals = set(decode_table(target)[: target.num_codes].tolist())
    ok = [d for d in range(-64, 64) if all(float(v) * 2.0**d in target_vals for v in vals)]
    if not ok:
        raise ValueError(f"{fmt.name} does not fold into {target.name} at any shift")
    lo, hi = min(ok), max(ok)
    if ok != list(range(lo, hi + 1)):
        raise AssertionError(f"{fmt.name}: the exact shifts are not an interval")
    return lo, hi


@dataclass
class Folded:
    """An MX operand (rows, K), quantized along K, folded into E4M3.

    codes       uint8 E4M3 codes (rows, K)
    scales      uint8 E8M0: the MX block scales (rows, K / 32), kept so the operand is
                recoverable
    exponents   int32 R per (row, group): the group's power-of-two scale 2^R (NAN_EXPONENT:
                the group holds a NaN block)
    group       blocks per group (K / 32 for whole rows)
    fmt         the MX element format folded
    inexact     number of elements whose folded value differs from the MX value (blocks more
                than d_max - d_min octaves below their group's largest)
    """

    codes: np.ndarray
    scales: np.ndarray
    exponents: np.ndarray
    group: int
    fmt: ElementFormat
    inexact: int

    def values(self) -> np.ndarray:
        """float64 (rows, K): what the FP8 GEMM multiplies, in true units (E4M3 value times the
        group scale)."""
        e4m3 = decode_table(TARGET)[self.codes]
        return e4m3 * np.repeat(_scale(self.exponents), self.group * BLOCK_SIZE, axis=1)


# the MX element formats whose every value, times 2^d over a range of shifts, is an E4M3 value
FOLD_FORMATS = ("e2m1", "e2m3", "e3m2")


def fold(mx: MXArray, group: int | None = None) -> Folded:
    """Fold a 2-D MX operand quantized along its last axis into E4M3 with a power-of-two scale
    per ``group`` blocks (None: the whole row). See the module doc."""
    if not isinstance(mx, MXArray):
        raise TypeError(f"fold takes an MXArray, got {type(mx).__name__}")
    if mx.codes.ndim != 2 or mx.axis != 1 or mx.block_size != BLOCK_SIZE:
        raise ValueError("fold takes a 2-D MXArray quantized along axis 1 in blocks of 32")
    fmt = mx.fmt
    if fmt.name not in FOLD_FORMATS:
        raise ValueError(f"only FP4/FP6 formats fold into E4M3 exactly over a range of scales, "
                         f"not {fmt.name}")
    d_min, d_max = shift_range(fmt)
    rows, k = mx.codes.shape
    nblk = k // BLOCK_SIZE
    g = nblk if group is None else group
    if g < 1 or nblk % g:
        raise ValueError(f"group {group} does not divide the {nblk} blocks of a row")
    vals = decode_table(fmt)[mx.codes].reshape(rows, nblk, BLOCK_SIZE)
    s = mx.scales.astype(np.int64) - E8M0.bias
    nan_block = mx.scales == E8M0.nan_code
    nonzero = (vals != 0).any(axis=2) & ~nan_block
    # R per (row, group): the largest exponent among blocks with a nonzero element, minus d_max
    big = np.where(nonzero, s, np.iinfo(np.int64).min).reshape(rows, nblk // g, g).max(axis=2)
    r = np.where(big == np.iinfo(np.int64).min, 0, big - d_max)
    shift = s - np.repeat(r, g, axis=1)  # d per block
    scaled = vals * np.exp2(shift)[:, :, None].astype(np.float64)
    from .block_quantize import cast  # noqa: PLC0415 - E4M3 RNE cast of the shifted values
    codes = cast(scaled.reshape(rows, k).astype(np.float64), TARGET).reshape(rows, nblk, BLOCK_SIZE)
    codes[nan_block] = 0
    exact = decode_table(TARGET)[codes] == scaled
    inexact = int(((~exact) & ~nan_block[:, :, None]).sum())
    r = np.where(nan_block.reshape(rows, nblk // g, g).any(axis=2), NAN_EXPONENT, r)
    return Folded(codes.reshape(rows, k), mx.scales.copy(), r.astype(np.int32), g, fmt, inexact)


def _scale(exponents: np.ndarray) -> np.ndarray:
    """2^R as float64, NaN for NAN_EXPONENT."""
    e = exponents.astype(np.float64)
    return np.where(exponents == NAN_EXPONENT, np.nan, np.exp2(np.where(
        exponents == NAN_EXPONENT, 0, e)))


def unfold(f: Folded) -> MXArray:
    """The MX operand back from its folded form: exact wherever the fold was exact."""
    rows, k = f.codes.shape
    nblk = k // BLOCK_SIZE
    s = f.scales.astype(np.int64) - E8M0.bias
    r = np.repeat(f.exponents.astype(np.int64), f.group, axis=1)
    nan_group = r == NAN_EXPONENT
    if nan_group.any():  # the group's R again, from its finite nonzero blocks
        d_max = shift_range(f.fmt)[1]
        nz = (f.codes.reshape(rows, nblk, BLOCK_SIZE) & 0x7F).any(axis=2) & \
            (f.scales != E8M0.nan_code)
        big = np.where(nz, s, np.iinfo(np.int64).min).reshape(rows, nblk // f.group, f.group)
        big = big.max(axis=2)
        redo = np.where(big == np.iinfo(np.int64).min, 0, big - d_max)
        r = np.where(nan_group, np.repeat(redo, f.group, axis=1), r)
    shift = s - r
    vals = decode_table(TARGET)[f.codes].reshape(rows, nblk, BLOCK_SIZE) * \
        np.exp2(-shift)[:, :, None].astype(np.float64)
    from .block_quantize import cast  # noqa: PLC0415
    codes = cast(vals.reshape(rows, k), f.fmt)
    nan_block = f.scales == E8M0.nan_code
    codes.reshape(rows, nblk, BLOCK_SIZE)[nan_block] = 0  # FP4/FP6 have no NaN code
    return MXArray(codes, f.scales.copy(), f.fmt, 1, BLOCK_SIZE)


DOTS = ("exact", "hopper")


def _e4m3_exponents(v: np.ndarray) -> np.ndarray:
    """floor(log2|v|) of E4M3 values, E4M3's emin (-6) for subnormals and zero."""
    a = np.abs(v)
    return np.where(a >= 2.0**-6, np.floor(np.log2(np.where(a > 0, a, 1.0))), -6).astype(np.int64)


def hopper_dot32(av: np.ndarray, bv: np.ndarray, c: np.ndarray | None = None) -> np.ndarray:
    """Hopper's FP8 wgmma dot of 32 products (module doc): av (..., 32) and bv (..., 32)
    float64 E4M3 values, broadcast against each other; float64 results (each a float32 of at
    most 14 significant bits).

    c: the accumulator the wgmma adds into (float32 values, shaped as the result), or None for
    a zeroed one (measured). With c, the rule extended the way MMA-Sim (arXiv 2511.10909)
    describes Hopper's FP8 accumulation: c takes part in the alignment like one more term, its
    exponent floor(log2|c|), and is truncated to the same grid. Measured: bit for bit on an
    H100 for every case of ``benchmarks/fold_probe.py`` (E2M1, E2M3, E3M2; groups of 4 and 32
    blocks chained; 73,728 outputs; results/native_gpu/fold_probe.md), where the promoted
    model and the exact sums differ in nearly every output."""
    p = av * bv
    pe = _e4m3_exponents(av) + _e4m3_exponents(bv)
    low = np.iinfo(np.int64).min // 2
    pe = np.where(p == 0, low, pe)
    big = pe.max(axis=-1)
    if c is not None:
        c = np.broadcast_to(np.asarray(c, np.float64), big.shape)
        fin = (c != 0) & np.isfinite(c)  # Inf/NaN pass through the sum below
        ce = np.where(fin, np.floor(np.log2(np.where(fin, np.abs(c), 1.0))), low)
        big = np.maximum(big, ce.astype(np.int64))
    ulp = np.exp2(np.maximum(big, -1000) - 13).astype(np.float64)
    s = (np.trunc(p / ulp[..., None]) * ulp[..., None]).sum(axis=-1)  # below 2^20 ulp: exact
    if c is not None:
        s = s + np.trunc(c / ulp) * ulp  # exact: c's grid multiple has at most 14 bits above ulp
    m, e = np.frexp(s)
    return np.ldexp(np.trunc(m * 2.0**14) / 2.0**14, e)


def folded_matmul(a: Folded, b: Folded, dot: str = "exact", promote: int = BLOCK_SIZE
                  ) -> np.ndarray:
    """C = A Bᵀ (float32) as an FP8 GEMM on folded operands computes it with every K = 32 dot
    promoted at once (Triton ``tl.dot`` with ``max_num_imprecise_acc=32``): in each group g,
    T_g = the block partials P_b added in K order into a float32 sum from 0 (round to nearest
    even), P_b = block b's K = 32 dot of E4M3 values by ``dot`` ("exact", or "hopper": the
    measured wgmma rule, module doc); then acc = fl(acc + fl(T_g * 2^(R_a + R_b))) over the
    groups in K order. With one group per row (``group=None`` when folding) and exact dots that
    is fl(T * 2^(R_a + R_b)): the ``fp32_sequential`` model in units of the group scale, equal
    to it wherever no partial sum is subnormal or overflows in true units.

    promote: how far along K the tensor core accumulates before the sum leaves it: 32 (above:
    every K = 32 dot from a zeroed accumulator, then added in float32), the group's 32 *
    group (``tl.dot`` without ``max_num_imprecise_acc``, ``native.fold``'s promote=False: the
    group's dots chained, P_b = dot(block b, C = P_(b-1)), T_g = the last), or any multiple of
    32 between (spans of promote / 32 blocks from the group's first, the last one shorter where
    they do not divide it, each chained from a zeroed accumulator, T_g = the spans' results
    added in float32 in K order: cuBLAS's rowwise FP8 GEMM, ``HOPPER_FP8_CUBLAS_ROWWISE``). Chained "exact" dots are fl32(C + the exact block
    sum), the sums promotion gives; chained "hopper" dots take C into ``hopper_dot32``'s
    alignment (measured on an H100, see there)."""
    if dot not in DOTS:
        raise ValueError(f"unknown dot {dot!r}; expected one of {DOTS}")
    if promote < BLOCK_SIZE or promote % BLOCK_SIZE:
        raise ValueError(f"promote must be a multiple of {BLOCK_SIZE}, got {promote}")
    span = min(promote // BLOCK_SIZE, a.group)  # blocks chained in the tensor core
    chained = dot == "hopper" and span > 1
    if a.codes.shape[1] != b.codes.shape[1] or a.group != b.group:
        raise ValueError("folded operands need the same K and the same group")
    e4 = decode_table(TARGET)
    av = e4[a.codes]
    bv = e4[b.codes]
    rows_a, k = a.codes.shape
    nblk = k // BLOCK_SIZE
    acc = np.zeros((rows_a, b.codes.shape[0]), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for g0 in range(0, nblk, a.group):
            t = np.zeros_like(acc)
            for s0 in range(g0, g0 + a.group, span):
                c = np.zeros_like(acc)  # the tensor core's sum over one span
                for blk in range(s0, min(s0 + span, g0 + a.group)):
                    cols = slice(blk * BLOCK_SIZE, (blk + 1) * BLOCK_SIZE)
                    if dot == "exact":
                        partial = av[:, cols] @ bv[:, cols].T  # exact in float64 and float32
                    else:
                        partial = np.empty(acc.shape)
                        for r0 in range(0, rows_a, 64):  # bounded (rows, N, 32) temporaries
                            partial[r0:r0 + 64] = hopper_dot32(
                                av[r0:r0 + 64, None, cols], bv[None, :, cols],
                                c[r0:r0 + 64] if chained else None)
                    c = partial.astype(np.float32) if chained else c + partial.astype(np.float32)
                t = c if s0 == g0 else t + c  # spans promoted: float32 adds in K order
            gi = g0 // a.group
            scale = _scale(a.exponents[:, gi])[:, None] * _scale(b.exponents[:, gi])[None, :]
            acc = acc + (t.astype(np.float64) * scale).astype(np.float32)
    return acc


@dataclass(frozen=True)
class FoldedModel:
    """An accumulation model (``emulator.mx_matmul(a, b, model)``): the MX GEMM as an FP8
    tensor-core GEMM of folded operands computes it. The operands are folded in groups of
    gcd(K / 32, ``group``) blocks (``group=None``: one group per row, K / 32 blocks), each
    K = 32 dot summed by ``dot`` ("exact" or "hopper"), every dot promoted at once
    (``chained=False``) or the dots chained in the tensor core (``chained=True``) over each
    group or, with ``chain``, over spans of ``chain`` blocks whose sums are added in float32
    (``folded_matmul``'s promote). Blocks more than the format's fold range below their
    group's largest are rounded when folded, as ``fold`` says: part of the model."""
    group: int | None
    chained: bool
    dot: str = "hopper"
    chain: int | None = None

    def __post_init__(self):
        if self.group is not None and self.group < 1:
            raise ValueError(f"group must be at least 1 (or None: whole rows), got {self.group}")
        if self.dot not in DOTS:
            raise ValueError(f"unknown dot {self.dot!r}; expected one of {DOTS}")
        if self.chain is not None and (not self.chained or self.chain < 1):
            raise ValueError(f"chain (blocks per tensor-core chain) is for chained models and "
                             f"at least 1, got chain={self.chain}, chained={self.chained}")

    def group_for(self, k: int) -> int:
        """The group a contraction of length k is folded in."""
        nblk = k // BLOCK_SIZE
        return nblk if self.group is None else math.gcd(nblk, self.group)

    def promote_for(self, k: int) -> int:
        """``folded_matmul``'s promote for a contraction of length k."""
        g = self.group_for(k)
        if not self.chained:
            return BLOCK_SIZE
        return BLOCK_SIZE * (g if self.chain is None else min(self.chain, g))

    def matmul(self, a: MXArray, b: MXArray) -> np.ndarray:
        k = a.codes.shape[1]
        g = self.group_for(k)
        return folded_matmul(fold(a, g), fold(b, g), self.dot, promote=self.promote_for(k))


# what ocpmx.native.mx_matmul(method="fp8_exact") and (method="fp8") compute on Hopper
HOPPER_FP8_EXACT = FoldedModel(4, chained=False)
HOPPER_FP8_CHAINED = FoldedModel(32, chained=True)
# what ocpmx.native.mx_matmul(method="fp8_cublas") computes on an H100: cuBLAS's blockwise
# 1 x 128 FP8 GEMM (torch._scaled_mm, torch 2.11 + CUDA 13.0) chains each 128-wide K tile's
# four K = 32 wgmmas and promotes once per tile; the conformance fold probe inferred it unaided
# and it reproduced every output tested (results/native_gpu/fp8_cublas_model_h100.md). cuBLAS
# picks its kernel per shape and version: the tests and the conformance check say where it held.
HOPPER_FP8_CUBLAS = FoldedModel(4, chained=True)
# method="fp8_cublas_rowwise": whole rows folded (one exponent per row), cuBLAS's FP8 GEMM with
# rowwise scales (torch._scaled_mm, scale_a (M, 1), scale_b (1, N); use_fast_accum=False):
# each 128-wide K tile's four K = 32 wgmmas chained, the tiles' sums added in float32 in K
# order, the row and column scales applied once at the end. Bit for bit on an H200 for every
# output kept (torch 2.11 + CUDA 13.0, M x N x K up to 8192 x 4096 x 14336, float32 and bf16
# outputs; benchmarks/cublas_rowwise_probe.py, results/native_gpu/cublas_rowwise_h200.md).
HOPPER_FP8_CUBLAS_ROWWISE = FoldedModel(None, chained=True, chain=4)
