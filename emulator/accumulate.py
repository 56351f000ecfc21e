"""MX dot product / GEMM on quantized operands with explicit accumulation models.

OCP MX v1.0 §6.2 defines Dot(A, B) = X_A * X_B * sum_i P_A,i * P_B,i and leaves the
internal precision and order of the sum to the implementation. The models here make that
choice explicit so that a backend's result can be reproduced bit for bit:

``exact``            every product exactly, the exact sum, rounded once to float32 (RNE).
``fp32_sequential``  each 32-block's scaled dot product exactly, rounded to float32, then
                     added into a float32 accumulator block by block in K order.
``ChunkedModel``     (Fasi et al. 2021; MMA-Sim): K is cut into chunks of L products in K
                     order; within a chunk the products (scales folded in) and the running
                     float32 accumulator are aligned to the largest exponent among them,
                     keeping F fraction bits below it (the rest truncated toward zero or
                     rounded to nearest even), summed exactly, and the sum rounded to float32
                     (toward zero or to nearest even) to become the new accumulator.
                     Hopper bf16: L=16, F=25, truncate, round toward zero;
                     Hopper FP8: L=32, F=13.

Products are exact: each element is sig * 2^exp with an integer sig, so a product is an
integer times a power of two; sums are carried in a multi-word integer accumulator.
Special values follow IEEE 754: NaN anywhere (or a NaN scale) gives NaN; Inf * 0 gives NaN;
+Inf + -Inf gives NaN; an accumulator that overflowed to +-Inf stays there.

Two implementations give the same bits: ``_gemm_reference`` below, THE REFERENCE (every
product evaluated one by one, per output element, in K order: slow, meant to be read), and the
fast path of ``gemm_fast.py`` (block partial sums from vectorized exact float arithmetic, then
the model's combination elementwise; its docstring explains why that is exact).
``mx_matmul(..., path=...)`` picks one; tests/test_accumulate.py checks them against each other.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numba as nb
import numpy as np

from ..spec import ElementFormat
from .decode import decode_table
from .block_quantize import MXArray
from .fold import (HOPPER_FP8_CHAINED, HOPPER_FP8_CUBLAS, HOPPER_FP8_CUBLAS_ROWWISE,
                   HOPPER_FP8_EXACT, FoldedModel)

_NL = 26          # 32-bit limbs: 832 bits
_BASE = -416      # exponent of bit 0 of limb 0
_RNE, _RTZ = 0, 1


@dataclass(frozen=True)
class ChunkedModel:
    """Chunked-alignment accumulation: chunk length L, F fraction bits kept at alignment."""

    chunk: int
    frac_bits: int
    align: str = "truncate"    # or "rne"
    output: str = "rtz"        # or "rne"

    def __post_init__(self):
        if self.chunk < 1:
            raise ValueError(f"chunk length must be >= 1, got {self.chunk}")
        if not 0 <= self.frac_bits <= 48:
            raise ValueError(f"frac_bits must be in [0, 48], got {self.frac_bits}")
        if self.align not in ("truncate", "rne"):
            raise ValueError(f"align must be 'truncate' or 'rne', got {self.align!r}")
        if self.output not in ("rtz", "rne"):
            raise ValueError(f"output must be 'rtz' or 'rne', got {self.output!r}")


HOPPER_BF16 = ChunkedModel(16, 25, "truncate", "rtz")
# HOPPER_FP8 follows the published description and is not validated on hardware. The K = 32
# FP8 wgmma measured on an H100 (emulator.fold.hopper_dot32, results/native_gpu/fold_probe.md)
# differs: products keep unnormalized exponents (e_a + e_b) for the alignment, and the dot's
# result is truncated to 14 significant bits, outside any running accumulator.
HOPPER_FP8 = ChunkedModel(32, 13, "truncate", "rtz")
# the folded FP8 GEMMs of ocpmx.native (method "fp8_exact" and "fp8") on Hopper, measured bit
# for bit on an H100 (emulator.fold.FoldedModel)
MODELS = {"exact": "exact", "fp32_sequential": "fp32_sequential",
          "hopper_bf16": HOPPER_BF16, "hopper_fp8": HOPPER_FP8,
          "hopper_fp8_exact": HOPPER_FP8_EXACT, "hopper_fp8_chained": HOPPER_FP8_CHAINED,
          "hopper_fp8_cublas": HOPPER_FP8_CUBLAS,
          "hopper_fp8_cublas_rowwise": HOPPER_FP8_CUBLAS_ROWWISE}


@lru_cache(maxsize=None)
def sig_exp_tables(fmt: ElementFormat):
    """(sig int64[256], exp int64[256], special float64[256]): value = sig * 2^exp for finite
    codes; ``special`` holds NaN/+-Inf for non-finite codes and 0 elsewhere."""
    table = decode_table(fmt)
    sig = np.zeros(256, np.int64)
    exp = np.zeros(256, np.int64)
    special = np.zeros(256, np.float64)
    for c in range(256):
        v = table[c]
        if not np.isfinite(v):
            special[c] = v
            continue
        if v == 0:
            continue
        m, e = np.frexp(v)          # v = m * 2^e, 0.5 <= |m| < 1
        s = int(m * 2**53)
        shift = (s & -s).bit_length() - 1
        sig[c] = s >> shift
        exp[c] = e - 53 + shift
    return sig, exp, special


@nb.njit(cache=True, inline="always")
def _limb_add(limbs, sig, exp):
    p = exp - _BASE
    i = p // 32
    v = sig << (p % 32)
    limbs[i] += v & 0xFFFFFFFF
    limbs[i + 1] += v >> 32


@nb.njit(cache=True)
def _round_parts(neg, mag, sticky, exp, mode):
    """Round (-1)^neg * (mag + s) * 2^exp to float32, where 0 <= s < 1 is nonzero iff sticky.

    mag < 2^62. Callers pass sticky only with mag wide enough (>= 25 bits) that the sticky
    bits lie below the float32 rounding position.
    """
    if mag == 0:
        return np.float32(-0.0) if neg else np.float32(0.0)
    lead = _bit_index(mag) + exp  # floor(log2 |v|)
    q = lead - 23 if lead - 23 > -149 else np.int64(-149)  # float32 quantum exponent
    sh = q - exp
    if sh <= 0:
        n = mag << (-sh)
    elif sh >= 63:  # |v| < 2^62 * 2^exp <= 2^(q-1) = 2^-150: below half the least subnormal
        n = np.int64(0)  # (fix: shifting by >= 64 is undefined and gave nonzero garbage)
    else:
        n = mag >> sh
        rem = mag & ((np.int64(1) << sh) - 1)
        half = np.int64(1) << (sh - 1)
        if mode == _RNE and (rem > half or (rem == half and (sticky or (n & 1) == 1))):
            n += 1
    val = np.float64(n) * 2.0 ** q
    if val >= 2.0 ** 128:
        val = np.inf if mode == _RNE else 3.4028234663852886e38
    r = np.float32(val)
    return -r if neg else r


@nb.njit(cache=True)
def _bit_index(x):
    n = -1
    while x > 0:
        x >>= 1
        n += 1
    return n


@nb.njit(cache=True)
def _limbs_to_f32(limbs, mode):
    """Round the exact value held in the limbs to float32 (limbs are consumed)."""
    for i in range(_NL - 1):
        c = limbs[i] >> 32
        limbs[i] &= 0xFFFFFFFF
        limbs[i + 1] += c
    neg = limbs[_NL - 1] < 0
    if neg:  # two's complement negate across limbs
        carry = np.int64(1)
        for i in range(_NL - 1):
            v = ((~limbs[i]) & 0xFFFFFFFF) + carry
            limbs[i] = v & 0xFFFFFFFF
            carry = v >> 32
        limbs[_NL - 1] = (~limbs[_NL - 1]) + carry
    top = _NL - 1
    while top >= 0 and limbs[top] == 0:
        top -= 1
    if top < 0:
        return np.float32(0.0)
    # take the two highest limbs (up to 64 bits) plus a sticky bit for everything below
    hi = limbs[top]
    lo = limbs[top - 1] if top >= 1 else np.int64(0)
    sticky = False
    for i in range(top - 1):
        if limbs[i] != 0:
            sticky = True
    # 62-bit window: drop enough low bits of lo to keep mag < 2^62
    hb = _bit_index(hi)
    drop = hb + 32 - 61 if hb + 32 > 61 else 0
    mag = (hi << (32 - drop)) | (lo >> drop)
    if drop > 0 and (lo & ((np.int64(1) << drop) - 1)) != 0:
        sticky = True
    exp = _BASE + (top - 1) * 32 + drop
    return _round_parts(neg, mag, sticky, exp, mode)


@nb.njit(cache=True)
def _special_sum(vals):
    """IEEE result for a sum containing non-finite terms (vals holds only those terms)."""
    pos = False
    negi = False
    for v in vals:
        if v != v:
            return np.float32(np.nan)
        if v > 0:
            pos = True
        else:
            negi = True
    if pos and negi:
        return np.float32(np.nan)
    return np.float32(np.inf) if pos else np.float32(-np.inf)


@nb.njit(cache=True)
def _product(ca, cb, sa, sb, sig_a, exp_a, sp_a, sig_b, exp_b, sp_b):
    """Exact product of two scaled elements: (sig, exp, special); special != 0 if non-finite."""
    spa = sp_a[ca]
    spb = sp_b[cb]
    if sa == 0xFF or sb == 0xFF:
        return np.int64(0), np.int64(0), np.nan
    if spa != 0 or spb != 0:
        va = spa if spa != 0 else np.float64(sig_a[ca])
        vb = spb if spb != 0 else np.float64(sig_b[cb])
        return np.int64(0), np.int64(0), va * vb  # Inf*0 -> NaN, Inf*x -> +-Inf
    return sig_a[ca] * sig_b[cb], exp_a[ca] + exp_b[cb] + (np.int64(sa) - 127) + (np.int64(sb) - 127), 0.0


@nb.njit(cache=True, parallel=True)
def _gemm_reference(ac, asc, bc, bsc, block, tabs_a, tabs_b, model, L, F, align_rne, out_mode, out):
    """THE REFERENCE KERNEL: every product evaluated exactly, per output element, in K order.

    ``mx_matmul(..., path="reference")`` runs it; the default fast path (``gemm_fast``) must
    give the same bits (tests/test_accumulate.py checks both against each other)."""
    M, K = ac.shape
    N = bc.shape[0]
    sig_a, exp_a, sp_a = tabs_a
    sig_b, exp_b, sp_b = tabs_b
    for m in nb.prange(M):
        limbs = np.zeros(_NL, np.int64)
        specials = np.empty(K, np.float64)
        sigs = np.empty(L + 1, np.int64)
        exps = np.empty(L + 1, np.int64)
        for n in range(N):
            nsp = 0
            acc = np.float32(0.0)
            limbs[:] = 0
            if model == 0:  # exact
                for k in range(K):
                    s, e, sp = _product(ac[m, k], bc[n, k], asc[m, k // block], bsc[n, k // block],
                                        sig_a, exp_a, sp_a, sig_b, exp_b, sp_b)
                    if sp != 0 or sp != sp:
                        specials[nsp] = sp
                        nsp += 1
                    elif s != 0:
                        _limb_add(limbs, s, e)
                acc = _limbs_to_f32(limbs, _RNE)
            elif model == 1:  # fp32 sequential, block by block
                for k0 in range(0, K, block):
                    limbs[:] = 0
                    for k in range(k0, k0 + block):
                        s, e, sp = _product(ac[m, k], bc[n, k], asc[m, k // block], bsc[n, k // block],
                                            sig_a, exp_a, sp_a, sig_b, exp_b, sp_b)
                        if sp != 0 or sp != sp:
                            specials[nsp] = sp
                            nsp += 1
                        elif s != 0:
                            _limb_add(limbs, s, e)
                    acc = np.float32(acc + _limbs_to_f32(limbs, _RNE))
            else:  # chunked alignment
                for k0 in range(0, K, L):
                    if not np.isfinite(acc):  # RNE overflow: +-Inf + finite stays +-Inf (fix:
                        break                 # frexp(Inf) gave an undefined integer, garbage)
                    cnt = 0
                    for k in range(k0, min(k0 + L, K)):
                        s, e, sp = _product(ac[m, k], bc[n, k], asc[m, k // block], bsc[n, k // block],
                                            sig_a, exp_a, sp_a, sig_b, exp_b, sp_b)
                        if sp != 0 or sp != sp:
                            specials[nsp] = sp
                            nsp += 1
                        elif s != 0:
                            sigs[cnt] = s
                            exps[cnt] = e
                            cnt += 1
                    if acc != 0:
                        mm, ee = math.frexp(np.float64(acc))
                        sigs[cnt] = np.int64(mm * 2.0 ** 24)
                        exps[cnt] = ee - 24
                        cnt += 1
                    if cnt == 0:
                        continue
                    lead = -(1 << 40)
                    for i in range(cnt):
                        ld = exps[i] + _bit_index(abs(sigs[i]))
                        if ld > lead:
                            lead = ld
                    q = lead - F
                    total = np.int64(0)
                    for i in range(cnt):
                        s = sigs[i]
                        e = exps[i]
                        if e >= q:
                            total += s << (e - q)
                        else:
                            sh = q - e
                            a = abs(s)
                            if sh >= 62:
                                t = np.int64(0)
                                if align_rne and sh == 62 and a > (np.int64(1) << 61):
                                    t = np.int64(1)
                            else:
                                t = a >> sh
                                if align_rne:
                                    rem = a & ((np.int64(1) << sh) - 1)
                                    half = np.int64(1) << (sh - 1)
                                    if rem > half or (rem == half and (t & 1) == 1):
                                        t += 1
                            total += -t if s < 0 else t
                    neg = total < 0
                    mag = -total if neg else total
                    if mag == 0:
                        acc = np.float32(0.0)
                    else:
                        acc = _round_parts(neg, mag, False, q, out_mode)
            if nsp > 0:
                acc = _special_sum(specials[:nsp])
            out[m, n] = acc


def _operand(x: MXArray, name: str):
    if not isinstance(x, MXArray):
        raise TypeError(f"{name} must be an MXArray (from ocpmx.emulator.quantize), got {type(x).__name__}")
    if x.codes.ndim != 2 or x.axis != 1:
        raise ValueError(f"{name} must be 2-D and quantized along its last axis (K); "
                         f"got shape {x.codes.shape}, axis {x.axis}")
    return np.ascontiguousarray(x.codes), np.ascontiguousarray(x.scales)


PATHS = ("auto", "reference", "fast")


def mx_matmul(a: MXArray, b: MXArray, model="exact", *, path: str = "auto") -> np.ndarray:
    """C[m, n] = sum_k A[m, k] * B[n, k] (A @ B^T) in float32, under an accumulation model.

    a: MXArray of shape (M, K), b: MXArray of shape (N, K), both quantized along K (axis 1)
    with the same block size. model: 'exact', 'fp32_sequential', 'hopper_bf16', 'hopper_fp8',
    a ``ChunkedModel``, or a folded FP8 GEMM: 'hopper_fp8_exact', 'hopper_fp8_chained',
    'hopper_fp8_cublas', 'hopper_fp8_cublas_rowwise' or a
    ``fold.FoldedModel`` (FP4/FP6 operands, blocks of 32; ``path`` does not apply).
    path: 'auto' (the fast kernel of ``gemm_fast`` where it applies, else the reference),
    'reference' (the per-element reference kernel ``_gemm_reference``), or 'fast' (an error
    where the fast kernel does not apply). Both give the same bits.
    """
    if path not in PATHS:
        raise ValueError(f"unknown path {path!r}; expected one of {PATHS}")
    ac, asc = _operand(a, "a")
    bc, bsc = _operand(b, "b")
    if ac.shape[1] != bc.shape[1]:
        raise ValueError(f"contraction lengths differ: a has K={ac.shape[1]}, b has K={bc.shape[1]}")
    if a.block_size != b.block_size:
        raise ValueError(f"block sizes differ: {a.block_size} vs {b.block_size}")
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown accumulation model {model!r}; expected one of {sorted(MODELS)} "
                             "or a ChunkedModel or FoldedModel")
        model = MODELS[model]
    if isinstance(model, FoldedModel):
        return model.matmul(a, b)
    if model == "exact":
        mid, L, F, al, om = 0, 1, 0, False, _RNE
    elif model == "fp32_sequential":
        mid, L, F, al, om = 1, 1, 0, False, _RNE
    elif isinstance(model, ChunkedModel):
        mid, L, F = 2, model.chunk, model.frac_bits
        al, om = model.align == "rne", (_RNE if model.output == "rne" else _RTZ)
    else:
        raise TypeError(f"model must be a name, a ChunkedModel or a FoldedModel, got {model!r}")
    if path != "reference":
        from .gemm_fast import gemm_fast   # imports this module's helpers
        out = gemm_fast(ac, asc, bc, bsc, a.block_size, a.fmt, b.fmt, mid, L, F, al, om)
        if out is not None:
            return out
        if path == "fast":
            raise ValueError(f"the fast path does not apply to {a.fmt.name} x {b.fmt.name} "
                             f"with block {a.block_size} under {model!r}")
    out = np.empty((ac.shape[0], bc.shape[0]), np.float32)
    _gemm_reference(ac, asc, bc, bsc, a.block_size, sig_exp_tables(a.fmt), sig_exp_tables(b.fmt),
                    mid, L, F, al, om, out)
    return out


def mx_dot(a: MXArray, b: MXArray, model="exact", *, path: str = "auto") -> np.float32:
    """Dot product of two 1-D MX vectors of equal length (§6.2)."""
    def as_row(x):
        if x.codes.ndim != 1:
            raise ValueError(f"mx_dot takes 1-D MXArrays, got shape {x.codes.shape}")
        return MXArray(x.codes[None, :], x.scales[None, :], x.fmt, 1, x.block_size, x.rotation)
    return mx_matmul(as_row(a), as_row(b), model, path=path)[0, 0]
