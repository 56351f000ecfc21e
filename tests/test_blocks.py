"""Block quantization: special blocks, scale boundaries, scale rules, axes, against the scalar reference."""
import ml_dtypes
import numpy as np
import pytest
from reference import quantize_block, scale_exp

from ocpmx.emulator import dequantize, quantize
from ocpmx.spec import FORMATS

ALL = ["e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8"]
RULES = ["floor", "ceil", "rceil", "even"]


def check_against_reference(x, name, rule="floor"):
    mx = quantize(x, name, scale_rule=rule)
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            blk = [float(v) for v in x[r, 32 * b:32 * b + 32]]
            sc, codes = quantize_block(blk, name, rule)
            assert mx.scales[r, b] == sc, (name, rule, blk)
            if codes is not None:
                assert list(mx.codes[r, 32 * b:32 * b + 32]) == codes, (name, rule, blk)
    return mx


def block(amax, fill=0.3):
    x = np.full(32, fill * amax, np.float32)
    x[5] = amax
    x[9] = -0.7 * amax
    return x


def test_all_zero_and_negative_zero_blocks():
    for name in ALL:
        mx = quantize(np.zeros((1, 32), np.float32), name)
        assert mx.scales[0, 0] == 0 and np.all(mx.codes == 0)
        neg = quantize(np.full((1, 32), -0.0, np.float32), name)
        assert neg.scales[0, 0] == 0
        deq = dequantize(neg)
        assert np.all(deq == 0)
        if FORMATS[name].kind == "float":
            assert np.all(neg.codes == FORMATS[name].sign_bit) and np.all(np.signbit(deq))


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nonfinite_blocks_get_nan_scale(special):
    for name in ALL:
        x = np.ones((2, 32), np.float32)
        x[0, 7] = special
        mx = quantize(x, name)
        assert mx.scales[0, 0] == 0xFF and mx.scales[1, 0] != 0xFF
        deq = dequantize(mx)
        assert np.all(np.isnan(deq[0])) and np.all(deq[1] == 1)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("rule", RULES)
def test_scale_boundaries(name, rule):
    """amax one ulp below / at / above 2^k and max*2^k, FP32-subnormal amax, the largest finite
    amax, and amax small enough that the scale clamps to 2^-127."""
    f = FORMATS[name]
    rows = []
    for k in (-130, -20, -1, 0, 1, 7, 60, 126):
        for base in (2.0**k, f.max_normal * 2.0 ** (k - f.emax)):
            if not (1e-45 < base < 3.4e38):
                continue
            b = np.float32(base)
            for a in (np.nextafter(b, np.float32(0)), b, np.nextafter(b, np.float32(np.inf))):
                rows.append(block(a))
    for a in (np.float32(1e-45), np.float32(3e-42), np.finfo(np.float32).tiny,
              np.finfo(np.float32).max, np.float32(8 - 2**-21)):
        rows.append(block(a))
    x = np.stack(rows).astype(np.float32)
    check_against_reference(x, name, rule)


def test_scale_clamps_to_smallest():
    x = np.zeros((1, 32), np.float32)
    x[0, 0] = 1e-45  # 2^-149: floor(log2) - emax < -127
    for name in ALL:
        mx = quantize(x, name)
        assert mx.scales[0, 0] == 0, name
    # the decoded value is exact: 2^-127 times the element
    mx = quantize(np.full((1, 32), 2.0**-127, np.float32), "e2m1")
    assert mx.scales[0, 0] == 0 and np.all(dequantize(mx) == np.float32(2.0**-127))


def test_float32_log2_trap():
    """float32 log2(8 - 2^-21) rounds to 3.0; the exact rule gives floor = 2."""
    amax = np.float32(8 - 2**-21)
    assert np.log2(amax) == np.float32(3.0)  # the trap is real
    mx = quantize(block(amax)[None], "e2m1")
    assert mx.scales[0, 0] == 127 + 2 - 2


def test_rules_differ_where_documented():
    # amax mantissa 1.6: floor and even agree, rceil bumps (1.6 > 1.5 for e2m1)
    x = block(np.float32(1.6))[None]
    s = {r: int(quantize(x, "e2m1", scale_rule=r).scales[0, 0]) - 127 for r in RULES}
    assert s == {"floor": -2, "even": -2, "rceil": -1, "ceil": -1}
    x = block(np.float32(1.8))[None]  # mantissa >= 1.75: even bumps too
    s = {r: int(quantize(x, "e2m1", scale_rule=r).scales[0, 0]) - 127 for r in RULES}
    assert s == {"floor": -2, "even": -1, "rceil": -1, "ceil": -1}
    assert scale_exp(1.0, "e2m1", "ceil") == -2  # exact power of two: ceil == floor


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("rule", RULES)
def test_random_blocks_against_reference(name, rule):
    rng = np.random.default_rng(hash((name, rule)) % 2**32)
    x = (rng.standard_normal((6, 64)) * np.exp(rng.normal(0, 4, (6, 1)))).astype(np.float32)
    x[0, :32] = rng.integers(-12, 13, 32) / 4  # many exact ties
    check_against_reference(x, name, rule)


def test_any_axis_equals_moving_the_axis():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 3, 96)).astype(np.float32)
    for axis in (0, 2, -1):
        mx = quantize(x, "e2m1", axis=axis)
        ref = quantize(np.ascontiguousarray(np.moveaxis(x, axis, -1)), "e2m1")
        assert np.array_equal(np.moveaxis(mx.codes, axis, -1), ref.codes)
        assert np.array_equal(np.moveaxis(mx.scales, axis, -1), ref.scales)
        assert mx.scales.shape[axis] == x.shape[axis] // 32
    mx = quantize(x, "e4m3", axis=1, block_size=3)
    assert mx.scales.shape == (64, 1, 96)


def test_block_size_configurable():
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    mx = quantize(x, "e2m1", block_size=16)
    assert mx.scales.shape == (4, 4)
    for b in range(4):
        half = quantize(np.ascontiguousarray(x[:, 16 * b:16 * b + 16]), "e2m1", block_size=16)
        assert np.array_equal(half.scales[:, 0], mx.scales[:, b])


def test_input_dtypes_agree():
    x = np.random.default_rng(5).standard_normal((8, 64)).astype(ml_dtypes.bfloat16)
    a = quantize(x, "e2m1")
    b = quantize(x.astype(np.float32), "e2m1")
    c = quantize(x.astype(np.float64), "e2m1")
    for other in (b, c):
        assert np.array_equal(a.codes, other.codes) and np.array_equal(a.scales, other.scales)


def test_dequantize_is_exact():
    rng = np.random.default_rng(6)
    for name in ALL:
        x = rng.standard_normal((4, 64)).astype(np.float32) * 1000
        mx = quantize(x, name)
        from ocpmx.emulator import decode, decode_scale
        ref = decode(mx.codes, name).astype(np.float64) * np.repeat(
            decode_scale(mx.scales).astype(np.float64), 32, axis=1)
        assert np.array_equal(dequantize(mx), ref.astype(np.float32))
        assert np.array_equal(dequantize(mx).astype(np.float64), ref)  # no rounding happened
