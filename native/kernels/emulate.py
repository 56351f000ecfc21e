"""A GEMM that sums MX products under a declared accumulation model, bit for bit the emulator's
reference (``ocpmx.emulator.accumulate``): for training or checking under another chip's numerics
on any GPU (issue 23). Slow by design: every product is formed as an integer and aligned one by
one, as the model says, in int64 arithmetic.

Each element code is looked up in the format's table as sig * 2^exp (an odd integer times a
power of two; ``emulator.accumulate.sig_exp_tables``), so a product of two scaled elements is
sig_a sig_b * 2^(exp_a + exp_b + s_a + s_b - 254): exact. Non-finite products (a NaN or Inf
code, a NaN scale) are kept apart as flags and decide the output at the end, as in the
reference (NaN wins; +Inf and -Inf give NaN).

MODEL 1, ``fp32_sequential``: per 32-block, the exact sum of its products (int64, aligned to the
block's lowest possible exponent; the host checks that the format pair's span fits), rounded
to float32 (RNE) and added to the float32 accumulator.
MODEL 2, a ``ChunkedModel(L, F, align, output)``: per chunk of L products, the products and the
accumulator are aligned to q = lead - F (lead: the largest leading-bit exponent among them),
truncated (or rounded to nearest even) to multiples of 2^q, summed exactly, and the sum rounded
to float32 (RTZ or RNE); an accumulator at +-Inf stays there.
"""
from __future__ import annotations

import triton
import triton.language as tl

RNE_OUT = tl.constexpr(0)
RTZ_OUT = tl.constexpr(1)


@triton.jit
def _log2_floor(mag):
    """floor(log2(mag)) of int64 0 < mag < 2^62 (the float64 conversion may round up to the
    next power of two: corrected)."""
    f = mag.to(tl.float64)
    lg = ((f.to(tl.int64, bitcast=True) >> 52) & 0x7FF) - 1023
    return tl.where((tl.full(lg.shape, 1, tl.int64) << lg) > mag, lg - 1, lg)


@triton.jit
def _round_to_f32(total, q, MODE: tl.constexpr):
    """total * 2^q (int64 total, |total| < 2^62) rounded to float32: RNE (overflow to +-Inf) or
    RTZ (overflow to +-max); the emulator's ``_round_parts`` without sticky bits."""
    neg = total < 0
    mag = tl.where(neg, -total, total)
    nz = mag != 0
    safe = tl.where(nz, mag, 1)
    lead = _log2_floor(safe) + q
    qq = tl.maximum(lead - 23, -149)  # the float32 quantum exponent
    sh = qq - q
    up = tl.minimum(tl.maximum(-sh, 0), 62)
    dn = tl.minimum(tl.maximum(sh, 0), 62)
    n = tl.where(sh <= 0, safe << up, safe >> dn)
    if MODE == RNE_OUT:
        rem = safe - (n << dn)
        half = tl.where(dn > 0, tl.full(dn.shape, 1, tl.int64) << tl.maximum(dn - 1, 0), 0)
        bump = (sh > 0) & (sh < 63) & ((rem > half) | ((rem == half) & ((n & 1) == 1)))
        n = tl.where(bump, n + 1, n)
    n = tl.where(sh >= 63, 0, n)
    # n * 2^qq exactly in float64 (n <= 2^24, -149 <= qq), then exactly to float32
    val = n.to(tl.float64) * ((qq + 1023) << 52).to(tl.float64, bitcast=True)
    big = val >= 340282366920938463463374607431768211456.0  # 2^128
    if MODE == RNE_OUT:
        val = tl.where(big, float("inf"), val)
    else:
        val = tl.where(big, 3.4028234663852886e38, val)
    r = val.to(tl.float32)
    r = tl.where(neg, -r, r)
    return tl.where(nz, r, tl.where(neg, -0.0, 0.0))


@triton.jit
def _tile_start(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's rows and columns, the zeroed float32 accumulator and the special flags
    (NaN, +Inf, -Inf met among the products)."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    flag = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int1)
    return rm, rn, acc, flag, flag, flag


@triton.jit
def _store_tile(c_ptr, acc, nan, pinf, ninf, rm, rn, M, N):
    """The outputs: NaN where a NaN product or both infinities met, else the infinity met,
    else the accumulator (the reference's rule)."""
    acc = tl.where(nan | (pinf & ninf), float("nan"),
                   tl.where(pinf, float("inf"), tl.where(ninf, float("-inf"), acc)))
    cmask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc, mask=cmask)


@triton.jit
def _acc_parts(acc):
    """The float32 accumulator as sig * 2^exp (int64, |sig| < 2^24, from its bits) and its
    leading-bit exponent (-2^40 for zero)."""
    u = acc.to(tl.int32, bitcast=True)
    ef = (u >> 23) & 0xFF
    mant = (u & 0x7FFFFF).to(tl.int64)
    acc_sig = tl.where(ef > 0, mant | (1 << 23), mant)
    acc_sig = tl.where(u < 0, -acc_sig, acc_sig)
    acc_exp = tl.where(ef > 0, ef - 150, -149).to(tl.int64)
    acc_nz = acc != 0
    lead_acc = tl.where(acc_nz, acc_exp + _log2_floor(tl.where(acc_nz, tl.where(
        acc_sig < 0, -acc_sig, acc_sig), 1)), -(1 << 40))
    return acc_sig, acc_exp, lead_acc


@triton.jit
def _codes(data_ptr, rows, k, valid, K, PACK: tl.constexpr):
    """The element codes (int32) of rows x k of K-major data (FP4: two per byte, low first)."""
    if PACK == 2:
        byte = tl.load(data_ptr + rows[:, None] * (K // 2) + k[None, :] // 2, mask=valid,
                       other=0).to(tl.int32)
        return (byte >> ((k[None, :] % 2) * 4)) & 0xF
    return tl.load(data_ptr + rows[:, None] * K + k[None, :], mask=valid, other=0).to(tl.int32)


@triton.jit
def _operand_tile(data_ptr, scale_ptr, rows, k, R, K, PACK: tl.constexpr, sig_ptr, exp_ptr,
                  sp_ptr):
    """(sig, exp, special, scale) of a tile: rows (R,), k (LP,) -> (R, LP) each (scale: the
    E8M0 code of each element's block)."""
    valid = (rows < R)[:, None] & (k < K)[None, :]
    code = _codes(data_ptr, rows, k, valid, K, PACK)
    sc = tl.load(scale_ptr + rows[:, None] * (K // 32) + k[None, :] // 32, mask=valid,
                 other=127).to(tl.int32)
    sig = tl.load(sig_ptr + code)
    ex = tl.load(exp_ptr + code)
    sp = tl.load(sp_ptr + code)
    sig = tl.where(valid, sig, 0)
    sp = tl.where(valid, sp, 0.0)
    return sig, ex, sp, sc


@triton.jit
def emulate_gemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, sig_a_ptr, exp_a_ptr, sp_a_ptr,
                        sig_b_ptr, exp_b_ptr, sp_b_ptr, c_ptr, M, N, K,
                        PACK_A: tl.constexpr, PACK_B: tl.constexpr, MODEL: tl.constexpr,
                        L: tl.constexpr, LP: tl.constexpr, F: tl.constexpr,
                        ALIGN_RNE: tl.constexpr, OUT_MODE: tl.constexpr, E0: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """C[M, N] (float32) = A Bᵀ under MODEL (module doc). A (M, K), B (N, K) K-major codes
    (FP4 packed), E8M0 scales (rows, K / 32); per-format tables sig (int64), exp (int64),
    special (float32: NaN/+-Inf for non-finite codes, else 0). L: the chunk (32 for
    fp32_sequential), LP: L rounded up to a power of two; E0: the lowest exponent a product of
    the two formats can have before scales (fp32_sequential's alignment)."""
    rm, rn, acc, nan, pinf, ninf = _tile_start(BLOCK_M, BLOCK_N)
    lp = tl.arange(0, LP)
    for k0 in range(0, K, L):
        k = k0 + lp
        in_chunk = (lp < L) & (k < K)
        kk = tl.where(in_chunk, k, K)  # out-of-chunk lanes read nothing (masked as k >= K)
        sga, exa, spa, sca = _operand_tile(a_ptr, sa_ptr, rm, kk, M, K, PACK_A, sig_a_ptr,
                                           exp_a_ptr, sp_a_ptr)
        sgb, exb, spb, scb = _operand_tile(b_ptr, sb_ptr, rn, kk, N, K, PACK_B, sig_b_ptr,
                                           exp_b_ptr, sp_b_ptr)
        # the non-finite products: NaN scale, or a NaN/Inf code times anything
        scale_nan = (sca == 255)[:, None, :] | (scb == 255)[None, :, :]
        va = tl.where(spa != 0, spa, sga.to(tl.float32))
        vb = tl.where(spb != 0, spb, sgb.to(tl.float32))
        code_sp = (spa != 0)[:, None, :] | (spb != 0)[None, :, :]
        pv = va[:, None, :] * vb[None, :, :]
        special = scale_nan | code_sp
        nan = nan | (tl.sum((scale_nan | (code_sp & (pv != pv))).to(tl.int32), axis=2) > 0)
        pinf = pinf | (tl.sum((~scale_nan & code_sp & (pv == float("inf"))).to(tl.int32),
                              axis=2) > 0)
        ninf = ninf | (tl.sum((~scale_nan & code_sp & (pv == float("-inf"))).to(tl.int32),
                              axis=2) > 0)
        # the finite products: sig * 2^e exactly
        s = tl.where(special, 0, sga[:, None, :] * sgb[None, :, :])
        e = exa[:, None, :] + exb[None, :, :] + (sca - 127)[:, None, :].to(tl.int64) + \
            (scb - 127)[None, :, :].to(tl.int64)
        if MODEL == 1:  # fp32_sequential: one 32-block per chunk, its exact sum rounded once
            blk_a = tl.max(sca, axis=1).to(tl.int64) - 127  # one block: one scale per row
            blk_b = tl.max(scb, axis=1).to(tl.int64) - 127
            base = E0 + blk_a[:, None] + blk_b[None, :]  # the block's lowest possible exponent
            sh = tl.minimum(tl.maximum(e - base[:, :, None], 0), 62)
            total = tl.sum(s << sh, axis=2)
            acc = acc + _round_to_f32(total, base, RNE_OUT)
        else:  # a chunked model: align the chunk's products and the accumulator to lead - F
            a_abs = tl.where(s < 0, -s, s)
            lead_p = tl.where(s != 0, e + _log2_floor(tl.where(s != 0, a_abs, 1)), -(1 << 40))
            acc_sig, acc_exp, lead_acc = _acc_parts(acc)
            acc_nz = acc != 0
            lead = tl.maximum(tl.max(lead_p, axis=2), lead_acc)
            any_term = (tl.sum((s != 0).to(tl.int32), axis=2) > 0) | acc_nz
            q = lead - F
            # products
            t = _align(s, e, q[:, :, None], ALIGN_RNE)
            total = tl.sum(t, axis=2) + _align(acc_sig, acc_exp, q, ALIGN_RNE)
            new = _round_to_f32(total, q, OUT_MODE)
            keep = (acc != acc) | (acc == float("inf")) | (acc == float("-inf")) | ~any_term
            acc = tl.where(keep, acc, new)
    _store_tile(c_ptr, acc, nan, pinf, ninf, rm, rn, M, N)


@triton.jit
def _align(s, e, q, ALIGN_RNE: tl.constexpr):
    """s * 2^e on the grid 2^q: exact above it, truncated toward zero (or rounded to nearest
    even) below; as an integer multiple of 2^q."""
    a = tl.where(s < 0, -s, s)
    up = tl.minimum(tl.maximum(e - q, 0), 62)
    dn = tl.minimum(tl.maximum(q - e, 0), 62)
    t = tl.where(e >= q, a << up, a >> dn)
    if ALIGN_RNE:
        rem = a - (t << dn)
        half = tl.where(dn > 0, tl.full(dn.shape, 1, tl.int64) << tl.maximum(dn - 1, 0), 0)
        bump = (e < q) & (q - e < 62) & ((rem > half) | ((rem == half) & ((t & 1) == 1)))
        t = tl.where(bump, t + 1, t)
    t = tl.where((e < q) & (q - e >= 62), 0, t)
    return tl.where(s < 0, -t, t)


# ------------------------------------------------------------------------------------------
# The fast kernel: chunks that lie in one 32-block (L divides 32), products in float32
# ------------------------------------------------------------------------------------------
# fp32_sequential, where a block's products share one scale 2^s (s = X_a + X_b - 254): each
# product of two elements, p = v_a * v_b, is exact in float32 (at most 14 significant bits,
# |p| in [2^-32, 2^32) for every MX format pair), and p times 2^-E0 (E0 the pair's lowest
# product exponent) is an integer below 2^62 (the host checks the span), so the block's exact
# sum is an int64 sum of float -> int conversions. Bit for bit the reference kernel above and
# the emulator (tests/test_emulate_gemm.py; on an H100 too, results/native_gpu).
# The chunked models had a float32 form here as well (tree 0a74bf8: alignment by power-of-two
# scaling and float -> int truncation, bit for bit on an H100), but it ran 3x slower than the
# int64 kernel on an H100 for hopper_bf16 (0.017 against 0.048 TFLOP/s, E2M1) and no faster
# for hopper_fp8 (results/native_gpu/bench_emulate_h100.md), so it was removed.


@triton.jit
def _value_tile(data_ptr, scale_ptr, rows, k, kblock, R, K, PACK: tl.constexpr, val_ptr,
                sp_ptr):
    """(value, special, scale) of a chunk: value (R, L) float32 (0 for non-finite codes),
    special (R, L) float32 (NaN/+-Inf, else 0), scale (R,) int32, the chunk's block's E8M0."""
    valid_r = rows < R
    valid = valid_r[:, None] & (k < K)[None, :]
    code = _codes(data_ptr, rows, k, valid, K, PACK)
    sc = tl.load(scale_ptr + rows * (K // 32) + kblock, mask=valid_r, other=127).to(tl.int32)
    return tl.load(val_ptr + code), tl.load(sp_ptr + code), sc


@triton.jit
def emulate_gemm_fast_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, val_a_ptr, sp_a_ptr, val_b_ptr,
                             sp_b_ptr, c_ptr, M, N, K,
                             PACK_A: tl.constexpr, PACK_B: tl.constexpr, E0: tl.constexpr,
                             INV_GRID: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    """``emulate_gemm_kernel``'s result for ``fp32_sequential`` (the section comment above):
    value tables (float32) instead of sig/exp; INV_GRID = 2^-E0."""
    rm, rn, acc, nan, pinf, ninf = _tile_start(BLOCK_M, BLOCK_N)
    lk = tl.arange(0, 32)
    for k0 in range(0, K, 32):
        va, spa, sca = _value_tile(a_ptr, sa_ptr, rm, k0 + lk, k0 // 32, M, K, PACK_A,
                                   val_a_ptr, sp_a_ptr)
        vb, spb, scb = _value_tile(b_ptr, sb_ptr, rn, k0 + lk, k0 // 32, N, K, PACK_B,
                                   val_b_ptr, sp_b_ptr)
        scale_nan = (sca == 255)[:, None] | (scb == 255)[None, :]
        nan = nan | scale_nan
        n_sp = tl.sum((spa != 0).to(tl.int32)) + tl.sum((spb != 0).to(tl.int32))
        if n_sp > 0:  # a NaN/Inf code in the block: the reference's flags (rare: skipped else)
            code_sp = (spa != 0)[:, None, :] | (spb != 0)[None, :, :]
            pv = tl.where(spa != 0, spa, va)[:, None, :] * tl.where(spb != 0, spb, vb)[None, :, :]
            nan = nan | (tl.sum((code_sp & (pv != pv)).to(tl.int32), axis=2) > 0)
            fin = ~scale_nan
            pinf = pinf | (fin & (tl.sum((code_sp & (pv == float("inf"))).to(tl.int32),
                                         axis=2) > 0))
            ninf = ninf | (fin & (tl.sum((code_sp & (pv == float("-inf"))).to(tl.int32),
                                         axis=2) > 0))
        s = (sca - 127)[:, None] + (scb - 127)[None, :]  # the block's scale exponent (int32)
        p = va[:, None, :] * vb[None, :, :]  # exact
        # the block's exact sum, rounded once, added (RNE)
        total = tl.sum((p * INV_GRID).to(tl.int64), axis=2)
        acc = acc + _round_to_f32(total, (E0 + s).to(tl.int64), RNE_OUT)
    _store_tile(c_ptr, acc, nan, pinf, ninf, rm, rn, M, N)
