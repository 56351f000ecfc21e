"""MX dot product accumulation models against exact rational arithmetic and hand-computed cases,
and mx_matmul's fast path (emulator/gemm_fast.py) against the reference kernel, bit for bit."""
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

from ocpmx.emulator import (ChunkedModel, MXArray, decode_table, dequantize, mx_dot, mx_matmul,
                            quantize)
from ocpmx.spec import FORMATS, get_format


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
    rng = np.random.default_rng(zlib.crc32(f"{fa} {fb}".encode()))  # (hash() varies by process)
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
    big = 2.0**8  # an element value; products big*big = 2^16
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


# ------------------------------------------------------------------------------------------
# The fast path (emulator/gemm_fast.py) against the reference kernel, bit for bit
# ------------------------------------------------------------------------------------------
FMTS = ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "int8"]
MODELS = ["exact", "fp32_sequential", "hopper_bf16", "hopper_fp8",
          ChunkedModel(8, 20, "rne", "rne"), ChunkedModel(64, 30, "truncate", "rtz"),
          ChunkedModel(48, 13, "rne", "rtz"), ChunkedModel(16, 4, "truncate", "rne")]
KINDS = ["random", "outliers", "summable", "codes", "specials", "extreme"]


def _codes(rng, fmt, shape, finite=True, small=False):
    f = get_format(fmt)
    t = decode_table(f)[:f.num_codes]
    ok = np.isfinite(t) if finite else np.ones(len(t), bool)
    if small:   # values k/8 with |v| <= 4: every sum of products is exact in float32
        ok &= (np.abs(t) <= 4) & (t * 8 == np.round(t * 8))
    return rng.choice(np.flatnonzero(ok), shape).astype(np.uint8)


def make_operand(rng, fmt, rows, k, kind, block=32):
    """An MX operand (rows, k) of one kind:
    random    normal values, block magnitudes spread over about 2^+-6;
    outliers  heavy-tailed (Student t, 1.5 degrees) with blocks 2^+-40 away from the rest;
    summable  small grid values, scales 2^-1..2^1 (the exact sum fits a float32);
    codes     uniformly random finite codes, scales 2^-20..2^20;
    specials  as codes, plus NaN/Inf codes, NaN scales 0xFF, scales 0x00 and all-zero blocks;
    extreme   random codes under scales near 2^-127 and 2^127 (overflow, subnormals, zero)."""
    nblk = k // block
    if kind in ("random", "outliers"):
        if kind == "random":
            x, mag = rng.standard_normal((rows, k)), rng.normal(0, 3, (rows, nblk))
        else:
            x, mag = rng.standard_t(1.5, (rows, k)), rng.choice([-40, 0, 0, 0, 40], (rows, nblk))
        x = x * np.exp2(mag).repeat(block, 1)
        return quantize(x.astype(np.float32), fmt, block_size=block)
    scales = rng.integers(107, 148, (rows, nblk)).astype(np.uint8)
    codes = _codes(rng, fmt, (rows, k), small=kind == "summable")
    if kind == "summable":
        scales = rng.integers(126, 129, (rows, nblk)).astype(np.uint8)
    elif kind == "specials":
        codes = np.where(rng.random((rows, k)) < 0.01, _codes(rng, fmt, (rows, k), finite=False), codes)
        scales[rng.random((rows, nblk)) < 0.05] = 0xFF
        scales[rng.random((rows, nblk)) < 0.1] = 0
        codes.reshape(rows, nblk, block)[rng.random((rows, nblk)) < 0.2] = 0
    elif kind == "extreme":
        scales = np.where(rng.random((rows, 1)) < 0.5, rng.integers(0, 6, (rows, nblk)),
                          rng.integers(249, 255, (rows, nblk))).astype(np.uint8)
    return MXArray(codes.astype(np.uint8), scales, get_format(fmt), 1, block)


def assert_paths_agree(a, b, model):
    want = mx_matmul(a, b, model, path="reference")
    got = mx_matmul(a, b, model, path="fast")
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert len(bad) == 0, (f"{a.fmt.name} x {b.fmt.name} {model}: {len(bad)} of {got.size} differ, "
                           f"first at {tuple(bad[0])}: fast {got[tuple(bad[0])]!r}, "
                           f"reference {want[tuple(bad[0])]!r}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fb", FMTS)
@pytest.mark.parametrize("fa", FMTS)
def test_fast_path_equals_reference(fa, fb, kind):
    rng = np.random.default_rng([FMTS.index(fa), FMTS.index(fb), KINDS.index(kind)])
    a = make_operand(rng, fa, 6, 192, kind)
    b = make_operand(rng, fb, 5, 192, kind)
    for model in MODELS:
        assert_paths_agree(a, b, model)


@st.composite
def gemm_cases(draw):
    fa, fb = draw(st.sampled_from(FMTS)), draw(st.sampled_from(FMTS))
    model = draw(st.one_of(
        st.sampled_from(["exact", "fp32_sequential", "hopper_bf16", "hopper_fp8"]),
        st.builds(ChunkedModel, st.integers(1, 80), st.integers(0, 40),
                  st.sampled_from(["truncate", "rne"]), st.sampled_from(["rtz", "rne"]))))
    block = draw(st.sampled_from([32, 32, 16, 64]))
    m, n, nblk = draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(st.integers(1, 5))
    kind = draw(st.sampled_from(KINDS))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return (make_operand(rng, fa, m, nblk * block, kind, block),
            make_operand(rng, fb, n, nblk * block, kind, block), model)


@given(gemm_cases())
def test_fast_path_equals_reference_random_models(case):
    """Any format pair, block size, chunk length (dividing, multiple of or unrelated to the
    block) and fraction bits."""
    assert_paths_agree(*case)


def test_fast_path_special_values_by_hand():
    f = get_format("e5m2")
    one, inf, nan = 0x3C, f.inf_code, f.nan_codes[0]
    x = np.full((1, 64), one, np.uint8)

    def mx(codes, scales=(127, 127)):
        return MXArray(np.asarray(codes, np.uint8).reshape(1, 64), np.array([scales], np.uint8), f, 1)

    cases = {
        "Inf": (mx(np.r_[inf, x[0, 1:]]), mx(x), np.inf),
        "-Inf": (mx(np.r_[inf | 0x80, x[0, 1:]]), mx(x), -np.inf),
        "Inf*0": (mx(np.r_[inf, x[0, 1:]]), mx(np.r_[0, x[0, 1:]]), np.nan),
        "Inf-Inf": (mx(np.r_[inf, inf | 0x80, x[0, 2:]]), mx(x), np.nan),
        "NaN": (mx(np.r_[x[0, :40], nan, x[0, 41:]]), mx(x), np.nan),
        "scale 0xFF": (mx(x, (127, 0xFF)), mx(x), np.nan),
        "scale 0xFF, zero block": (mx(np.r_[x[0, :32], np.zeros(32)], (127, 0xFF)), mx(x), np.nan),
        "scale 0x00": (mx(x, (0, 127)), mx(x, (254, 127)), 64.0),   # 2^-127 * 2^127 * 32 + 32
        "all zero": (mx(np.zeros(64)), mx(x), 0.0),
        "underflow": (mx(x, (0, 0)), mx(x, (0, 0)), 0.0),
        "overflow": (mx(x, (254, 254)), mx(x, (254, 254)), np.inf),
    }
    for name, (a, b, want) in cases.items():
        for model in MODELS:
            got = mx_matmul(a, b, model)
            assert_paths_agree(a, b, model)
            if model in ("exact", "fp32_sequential") or (name != "overflow" and not np.isfinite(want)):
                assert np.array_equal(got, [[want]], equal_nan=True), (name, model, got)


def test_tiny_and_huge_sums_round_like_ieee():
    """Sums far below the least float32 subnormal round to zero (the reference used to shift
    by more than 63 bits there), and an accumulator that overflowed to Inf stays Inf."""
    f = get_format("e4m3")
    codes = np.zeros((1, 64), np.uint8)
    codes[0, 0], codes[0, 32] = 0x7E, 0x38   # 448 in block 1, 1.0 in block 2
    tiny = MXArray(codes, np.array([[0, 0]], np.uint8), f, 1)          # 448^2 * 2^-254
    huge = MXArray(codes, np.array([[254, 127]], np.uint8), f, 1)      # 448^2 * 2^254, then 1
    for path in ("reference", "fast"):
        for model in MODELS:
            assert mx_matmul(tiny, tiny, model, path=path)[0, 0] == 0
        assert mx_matmul(huge, huge, ChunkedModel(16, 20, "truncate", "rne"), path=path)[0, 0] == np.inf
        assert mx_matmul(huge, huge, "hopper_bf16", path=path)[0, 0] == np.finfo(np.float32).max
    assert np.array_equal(mx_matmul(tiny, tiny, "exact"), exact_f32(tiny, tiny))


def test_matmul_path_really_switches(monkeypatch):
    import ocpmx.emulator.accumulate as acc
    import ocpmx.emulator.gemm_fast as fast
    calls = []
    real_ref, real_fast = acc._gemm_reference, fast.gemm_fast
    monkeypatch.setattr(acc, "_gemm_reference", lambda *a: calls.append("reference") or real_ref(*a))
    monkeypatch.setattr(fast, "gemm_fast", lambda *a: calls.append("fast") or real_fast(*a))
    a = quantize(np.ones((2, 64), np.float32), "e2m1")
    for path in ("reference", "fast", "auto"):
        mx_matmul(a, a, path=path)
    assert calls == ["reference", "fast", "fast"]
    wide = ChunkedModel(64, 48)   # (L + 1) * 2^(F + 1) > 2^53: the reference only
    calls.clear()
    mx_matmul(a, a, wide)
    assert calls == ["fast", "reference"]
    with pytest.raises(ValueError, match="fast path does not apply"):
        mx_matmul(a, a, wide, path="fast")
    with pytest.raises(ValueError, match="unknown path"):
        mx_matmul(a, a, path="quick")


def test_exact_sum_wider_than_float64():
    """1 + 2^-24 + 2^-55 needs 56 bits: a float64 sum loses 2^-55 and leaves a tie that rounds
    to 1; the exact sum rounds up. The fast path must see that its float64 sum is not exact."""
    a = np.zeros(96, np.float32)
    a[0], a[32], a[64] = 1.0, 1.0, 1.0
    A, B = mx_from_values(a), mx_from_values(np.ones(96, np.float32))
    A.scales[0, 1], A.scales[0, 2] = 127 - 24, 127 - 55
    for path in ("reference", "fast"):
        assert mx_matmul(A, B, "exact", path=path)[0, 0] == np.float32(1 + 2.0**-23)
    assert mx_matmul(A, B, "exact")[0, 0] == exact_f32(A, B)[0, 0]


@pytest.mark.parametrize("chunk", [32, 64])
def test_chunk_products_that_cancel_are_still_truncated_one_by_one(chunk):
    # chunk 1: 16. chunk 2: 0.75 + 0.25 - 1 = 0 exactly, but with F = 4 each product is
    # aligned to q = 4 - 4 = 0 on its own: 0 + 0 - 1, so the accumulator becomes 15.
    # (chunk 64: the cancelling block is the first of two in its chunk.)
    a = np.zeros(2 * chunk, np.float32)
    a[0], a[chunk], a[chunk + 1], a[chunk + 2] = 16.0, 0.75, 0.25, -1.0
    A, B = mx_from_values(a), mx_from_values(np.ones(2 * chunk, np.float32))
    for path in ("reference", "fast"):
        assert mx_matmul(A, B, ChunkedModel(chunk, 4), path=path)[0, 0] == np.float32(15.0)
        assert mx_matmul(A, B, ChunkedModel(chunk, 4, "rne", "rne"), path=path)[0, 0] == 16.0
