"""Element conversion: rounding midpoints, saturation, signed zero, all bf16 inputs vs ml_dtypes."""
import ml_dtypes
import numpy as np
import pytest

from ocpmx.emulator import cast, decode, decode_table, quantize
from ocpmx.spec import FORMATS

FLOATS = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1"]
ML = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn, "e3m2": ml_dtypes.float6_e3m2fn,
      "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def finite_positive(name):
    """(codes, values) of the finite non-negative codes, in increasing order."""
    f = FORMATS[name]
    table = decode_table(f)
    codes = [c for c in range(f.max_code + 1)]
    return codes, [table[c] for c in codes]


def nextafter32(v, direction):
    return np.nextafter(np.float32(v), np.float32(direction), dtype=np.float32)


@pytest.mark.parametrize("name", FLOATS + ["int8"])
def test_every_midpoint_and_one_ulp_either_side(name):
    """Midpoint between neighbours ties to the even code; one float32 ulp away goes to the nearer."""
    f = FORMATS[name]
    table = decode_table(f)
    if f.kind == "int":
        codes = list(range(128))
    else:
        codes, _ = finite_positive(name)
    xs, want = [], []
    for lo, hi in zip(codes[:-1], codes[1:]):
        a, b = table[lo], table[hi]
        mid = (a + b) / 2
        assert np.float32(mid) == mid
        even = lo if lo % 2 == 0 else hi
        xs += [mid, nextafter32(mid, -1), nextafter32(mid, 10**6)]
        want += [even, lo, hi]
    xs = np.array(xs, np.float32)
    for sign in (1, -1):
        got = cast(sign * xs, name)
        vals = decode(got, name)
        expect = np.array([table[c] for c in want], np.float32) * sign
        assert np.array_equal(vals, expect), name


@pytest.mark.parametrize("name", FLOATS + ["int8"])
def test_saturation(name):
    f = FORMATS[name]
    big = np.array([f.max_normal, f.max_normal * 1.01, f.max_normal * 4, 1e17, 3e38], np.float32)
    assert np.all(decode(cast(big, name), name) == np.float32(f.max_normal))
    assert np.all(decode(cast(-big, name), name) == -np.float32(f.max_normal))
    assert np.all(decode(cast(np.array([1e300, -1e300]), name), name) == [f.max_normal, -f.max_normal])
    # +-Inf: the Inf code where the format has one (E5M2), else saturate to +-max
    inf = decode(cast(np.array([np.inf, -np.inf], np.float32), name), name)
    want = [np.inf, -np.inf] if f.inf_code is not None else [f.max_normal, -f.max_normal]
    assert np.array_equal(inf, np.array(want, np.float32))


def test_int8_min_option():
    x = np.array([-2.0, -1.99, -5.0], np.float32)
    assert list(cast(x, "int8")) == [0x81, 0x81, 0x81]          # clamp to -127/64
    assert list(cast(x, "int8", int8_min=-128)) == [0x80, 0x81, 0x80]  # -2.0 allowed
    with pytest.raises(ValueError, match="int8_min"):
        cast(x, "int8", int8_min=-126)


@pytest.mark.parametrize("name", FLOATS)
def test_negative_values_round_to_negative_zero(name):
    f = FORMATS[name]
    tiny = np.array([-f.min_subnormal / 2, -f.min_subnormal / 4, -1e-30, -0.0], np.float32)
    codes = cast(tiny, name)
    assert np.all(codes == f.sign_bit)
    assert np.all(cast(-tiny, name) == 0)


def test_int8_has_no_negative_zero():
    assert list(cast(np.array([-0.0, -1e-3], np.float32), "int8")) == [0, 0]


ALL_BF16 = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16)


@pytest.mark.parametrize("name", FLOATS)
def test_all_bf16_inputs_against_ml_dtypes(name):
    """Bit-exact where ml_dtypes follows the spec; its documented deviations are checked as such:
    NaN -> -0 in FP4/FP6 (no NaN code; we write +0), and FP8 `astype` that overflows to NaN
    (E4M3) or Inf (E5M2) instead of saturating."""
    f = FORMATS[name]
    x = ALL_BF16.astype(np.float32)
    ours = cast(ALL_BF16, name)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = x.astype(ML[name]).view(np.uint8)
    nan = np.isnan(x)
    overflow = np.abs(x) > f.max_normal  # +-Inf included
    follows = ~nan & ~(overflow & (f.bits == 8))
    assert np.array_equal(ours[follows], ref[follows])
    # deviations, each exactly as documented
    ref_vals = decode(ref, name)
    if f.nan_codes:
        assert np.all(np.isin(ours[nan], f.nan_codes))
        assert np.all(np.isnan(ref_vals[nan]))
    else:
        assert np.all(ours[nan] == 0)
        # ml_dtypes: NaN -> a zero of the opposite sign (+NaN -> -0, -NaN -> +0)
        assert np.array_equal(ref[nan], np.where(np.signbit(x[nan]), 0, f.sign_bit))
    if f.bits == 8:
        over = np.isfinite(x) & (np.abs(x) >= f.max_normal * (1 + 2.0 ** -(f.mbits + 1)))
        assert over.sum() > 1000
        assert np.all(np.abs(decode(ours[over], name)) == f.max_normal)  # we saturate
        assert np.all(~np.isfinite(ref_vals[over]))  # ml_dtypes: NaN (E4M3) or Inf (E5M2)


def test_all_bf16_int8_against_formula():
    """MXINT8 element conversion vs an independent numpy formula: round(x * 64) half-even, clamp."""
    x = ALL_BF16.astype(np.float32)
    fin = np.isfinite(x)
    ours = cast(ALL_BF16, "int8")[fin]
    ref = np.clip(np.rint(x[fin].astype(np.float64) * 64), -127, 127).astype(np.int8).view(np.uint8)
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("name", FLOATS + ["int8"])
def test_float64_and_bf16_inputs(name):
    rng = np.random.default_rng(1)
    x32 = (rng.standard_normal(4096) * 4).astype(np.float32)
    assert np.array_equal(cast(x32, name), cast(x32.astype(np.float64), name))
    xb = x32.astype(ml_dtypes.bfloat16)
    assert np.array_equal(cast(xb, name), cast(xb.astype(np.float32), name))
    # a float64 value just above a float32-representable midpoint rounds up in float64
    f = FORMATS[name]
    a, b = decode_table(f)[2], decode_table(f)[3]
    mid = (a + b) / 2
    assert decode(cast(np.array([mid + 1e-12]), name), name)[0] == np.float32(b)


def test_bad_inputs():
    with pytest.raises(TypeError, match="float32, float64 or bfloat16"):
        cast(np.arange(4, dtype=np.int32), "e2m1")
    with pytest.raises(TypeError, match="float16"):
        quantize(np.zeros(32, np.float16), "e2m1")
    with pytest.raises(ValueError, match="unknown MX element format"):
        quantize(np.zeros(32, np.float32), "e3m3")
    with pytest.raises(ValueError, match="not divisible by the block size 32"):
        quantize(np.zeros((4, 48), np.float32), "e2m1")
    with pytest.raises(ValueError, match="unknown scale_rule"):
        quantize(np.zeros(32, np.float32), "e2m1", scale_rule="round")
    with pytest.raises(ValueError, match="unknown rounding"):
        quantize(np.zeros(32, np.float32), "e2m1", rounding="rtz")
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        quantize(np.zeros((32, 32), np.float32), "e2m1", axis=2)
