"""MX dot product accumulation models against exact rational arithmetic and hand-computed cases."""
from fractions import Fraction

import numpy as np
import pytest

from ocpmx.emulator import ChunkedModel, MXArray, dequantize, mx_dot, mx_matmul, quantize
from ocpmx.spec import FORMATS


def exact_f32(a, b):
    """float32 nearest-even to the exact sum of products, computed with Fractions."""
    da, db = dequantize(a).astype(np.float64), dequantize(b).astype(np.float64)
    out = np.empty((da.shape[0], db.shape[0]), np.float32)
    for i in range(da.shape[0]):
        for j in range(db.shape[0]):
            s = sum((Fraction(float(x)) * Fraction(float(y)) for x, y in zip(da[i], db[j])), Fraction(0))
            out[i, j] = round_f32(s)
    return out


def round_f32(s: Fraction) -> np.float32:
    c = np.float32(float(s))  # candidate; fix double rounding by checking neighbours
    best = c
    for cand in (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))):
        if abs(Fraction(float(cand)) - s) < abs(Fraction(float(best)) - s):
            best = cand
        elif abs(Fraction(float(cand)) - s) == abs(Fraction(float(best)) - s) and cand != best:
            best = cand if (np.float32(cand).view(np.uint32) & 1) == 0 else best
    return best


@pytest.mark.parametrize("fa,fb", [("e2m1", "e2m1"), ("e4m3", "e5m2"), ("e3m2", "e2m3"), ("int8", "e4m3")])
def test_exact_model_against_fractions(fa, fb):
    rng = np.random.default_rng(hash((fa, fb)) % 2**32)
    x = (rng.standard_normal((5, 128)) * np.exp(rng.normal(0, 6, (5, 4)).repeat(32, 1))).astype(np.float32)
    w = (rng.standard_normal((4, 128)) * 1e3).astype(np.float32)
    a, b = quantize(x, fa), quantize(w, fb)
    assert np.array_equal(mx_matmul(a, b, "exact"), exact_f32(a, b))


def mx_from_values(vals, name="e4m3"):
    """An MXArray whose elements are exactly `vals` (scale 2^0)."""
    x = np.asarray(vals, np.float32)[None, :]
    mx = quantize(x, name, scale_rule="floor")
    mx.scales[:] = 127
    from ocpmx.emulator import cast
    mx.codes[:] = cast(x, name)
    assert np.array_equal(dequantize(mx), x)
    return mx


def dot(a, b, model):
    return mx_matmul(a, b, model)[0, 0]


def test_exact_vs_sequential_by_hand():
    # 2^24 + 1 - 2^24: exact gives 1; a float32 running sum of blocks loses the 1 in block 1
    big, one = 2.0**8, 1.0  # element values; products big*big = 2^16
    a = np.zeros(64, np.float32)
    b = np.zeros(64, np.float32)
    a[0], b[0] = big, big           # 2^16
    a[1], b[1] = 2.0**-8, 2.0**-8   # 2^-16, below float32 half-ulp of 2^16 once added
    a[32], b[32] = -big, big        # -2^16 in block 2
    A, B = mx_from_values(a), mx_from_values(b)
    assert dot(A, B, "exact") == np.float32(2.0**-16)
    # block 1 = 2^16 + 2^-16 rounds to 2^16 in float32, so the running sum ends at 0
    assert dot(A, B, "fp32_sequential") == np.float32(0.0)
    # chunk of 32 with F=13 bits: 2^-16 is 32 bits below 2^16 and is truncated away
    assert dot(A, B, ChunkedModel(32, 13)) == np.float32(0.0)
    assert dot(A, B, ChunkedModel(64, 40)) == np.float32(2.0**-16)


def test_chunked_truncation_vs_rounding_by_hand():
    # terms 1 and 3*2^-4 in one chunk, F=2: quantum 2^-2; 0.1875 -> trunc 0, rne 0.25
    a = np.zeros(32, np.float32)
    a[0], a[1] = 1.0, 0.1875
    A = mx_from_values(a)
    B = mx_from_values(np.r_[1.0, 1.0, np.zeros(30)].astype(np.float32))
    assert dot(A, B, ChunkedModel(32, 2, "truncate", "rne")) == np.float32(1.0)
    assert dot(A, B, ChunkedModel(32, 2, "rne", "rne")) == np.float32(1.25)
    assert dot(A, B, ChunkedModel(32, 8, "truncate", "rne")) == np.float32(1.1875)


def test_chunk_boundaries_and_accumulator_alignment():
    # chunk 1: 2^8*2^8 = 2^16; chunk 2: 1.0 -> accumulator 2^16 aligned with F=13 drops it
    a = np.zeros(64, np.float32)
    a[0], a[16] = 2.0**8, 1.0
    b = np.zeros(64, np.float32)
    b[0], b[16] = 2.0**8, 1.0
    A, B = mx_from_values(a), mx_from_values(b)
    assert dot(A, B, ChunkedModel(16, 13)) == np.float32(2.0**16)
    assert dot(A, B, ChunkedModel(16, 17)) == np.float32(2.0**16 + 1)
    assert dot(A, B, "exact") == np.float32(2.0**16 + 1)


def test_output_rounding_rtz_vs_rne():
    # 1 + (1.5*2^-12)(1.5*2^-13) = 1 + 0.5625 ulp(1): RNE rounds up, RTZ down
    a = np.zeros(64, np.float32)
    a[0], a[32] = 1.0, 1.5
    A, B = mx_from_values(a), mx_from_values(a)
    A.scales[0, 1], B.scales[0, 1] = 127 - 12, 127 - 13
    assert dot(A, B, "exact") == np.float32(1 + 2.0**-23)
    assert dot(A, B, ChunkedModel(64, 40, "truncate", "rne")) == np.float32(1 + 2.0**-23)
    assert dot(A, B, ChunkedModel(64, 40, "truncate", "rtz")) == np.float32(1.0)
    assert dot(A, B, "fp32_sequential") == np.float32(1 + 2.0**-23)


def test_mx_dot_1d():
    x = np.random.default_rng(9).standard_normal(64).astype(np.float32)
    a, b = quantize(x, "e2m1"), quantize(x[::-1].copy(), "e4m3")
    assert mx_dot(a, b) == mx_matmul(quantize(x[None], "e2m1"), quantize(x[::-1][None].copy(), "e4m3"))[0, 0]


def test_specials():
    x = np.ones((1, 32), np.float32)
    nanblk = x.copy()
    nanblk[0, 3] = np.nan
    A, B = quantize(nanblk, "e2m1"), quantize(x, "e2m1")
    assert np.isnan(mx_matmul(A, B)[0, 0])
    inf = x.copy()
    inf[0, 0] = np.inf
    A = quantize(np.full((1, 32), 448, np.float32), "e5m2")
    A.codes[0, 0] = FORMATS["e5m2"].inf_code
    assert mx_matmul(A, quantize(x, "e5m2"))[0, 0] == np.inf
    Z = quantize(np.zeros((1, 32), np.float32), "e5m2")
    assert np.isnan(mx_matmul(A, Z)[0, 0])  # Inf * 0


def test_errors():
    a = quantize(np.ones((2, 64), np.float32), "e2m1")
    b = quantize(np.ones((2, 32), np.float32), "e2m1")
    with pytest.raises(ValueError, match="contraction lengths differ"):
        mx_matmul(a, b)
    with pytest.raises(ValueError, match="unknown accumulation model"):
        mx_matmul(a, a, "kahan")
    with pytest.raises(ValueError, match="quantized along its last axis"):
        mx_matmul(quantize(np.ones((64, 2), np.float32), "e2m1", axis=0), a)
    with pytest.raises(TypeError, match="MXArray"):
        mx_matmul(np.ones((2, 64)), a)
    with pytest.raises(ValueError, match="frac_bits"):
        ChunkedModel(16, 60)
    assert isinstance(a, MXArray)
