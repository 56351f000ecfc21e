"""The format table against values written out by hand from the OCP MX v1.0 spec tables."""
import math

import ml_dtypes
import numpy as np
import pytest

from ocpmx.emulator import decode, decode_code, decode_scale, cast_scale
from ocpmx.spec import E8M0, FORMATS, get_format

# (bias, emax, max normal, min subnormal, min normal) from the spec's tables (§5.3, §5.4)
SPEC = {
    "e4m3": (7, 8, 448.0, 2**-9, 2**-6),
    "e5m2": (15, 15, 57344.0, 2**-16, 2**-14),
    "e3m2": (3, 4, 28.0, 0.0625, 0.25),
    "e2m3": (1, 2, 7.5, 0.125, 1.0),
    "e2m1": (1, 2, 6.0, 0.5, 1.0),
}


@pytest.mark.parametrize("name", SPEC)
def test_derived_parameters(name):
    f = FORMATS[name]
    bias, emax, mx, mins, minn = SPEC[name]
    assert (f.bias, f.emax, f.max_normal, f.min_subnormal, f.min_normal) == (bias, emax, mx, mins, minn)


def test_int8_parameters():
    f = FORMATS["int8"]
    assert (f.bits, f.emax, f.max_normal, f.min_subnormal) == (8, 0, 127 / 64, 1 / 64)


def test_special_codes():
    assert FORMATS["e4m3"].nan_codes == (0x7F, 0xFF) and FORMATS["e4m3"].inf_code is None
    assert FORMATS["e5m2"].nan_codes == (0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF)
    assert FORMATS["e5m2"].inf_code == 0x7C
    for n in ("e3m2", "e2m3", "e2m1", "int8"):
        assert FORMATS[n].nan_codes == () and FORMATS[n].inf_code is None
    assert (E8M0.bias, E8M0.nan_code, E8M0.emin, E8M0.emax) == (127, 0xFF, -127, 127)


# Positive half of each small format, written out from the spec's tables (code 0 .. 2^(bits-1)-1).
E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
E2M3 = [0, .125, .25, .375, .5, .625, .75, .875,
        1, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
        2, 2.25, 2.5, 2.75, 3, 3.25, 3.5, 3.75,
        4, 4.5, 5, 5.5, 6, 6.5, 7, 7.5]
E3M2 = [0, .0625, .125, .1875, .25, .3125, .375, .4375,
        .5, .625, .75, .875, 1, 1.25, 1.5, 1.75,
        2, 2.5, 3, 3.5, 4, 5, 6, 7,
        8, 10, 12, 14, 16, 20, 24, 28]


@pytest.mark.parametrize("name,positive", [("e2m1", E2M1), ("e2m3", E2M3), ("e3m2", E3M2)])
def test_every_code_small_formats(name, positive):
    f = FORMATS[name]
    expected = positive + [-v for v in positive]
    got = [decode_code(f, c) for c in range(f.num_codes)]
    assert got == expected
    # the negative zero code decodes to -0
    assert math.copysign(1, got[f.sign_bit]) == -1
    assert np.array_equal(decode(np.arange(f.num_codes, dtype=np.uint8), name),
                          np.array(expected, np.float32))


@pytest.mark.parametrize("name,dtype", [("e4m3", ml_dtypes.float8_e4m3fn), ("e5m2", ml_dtypes.float8_e5m2)])
def test_every_code_fp8_against_ml_dtypes(name, dtype):
    codes = np.arange(256, dtype=np.uint8)
    ours = decode(codes, name)
    ref = codes.view(dtype).astype(np.float32)
    assert np.array_equal(ours, ref, equal_nan=True)
    num = ~np.isnan(ref)
    assert np.array_equal(np.signbit(ours[num]), np.signbit(ref[num]))  # -0 included


def test_fp8_spot_values_by_hand():
    e4m3, e5m2 = FORMATS["e4m3"], FORMATS["e5m2"]
    assert decode_code(e4m3, 0x7E) == 448 and decode_code(e4m3, 0x01) == 2**-9
    assert decode_code(e4m3, 0x08) == 2**-6 and decode_code(e4m3, 0x38) == 1.0
    assert math.isnan(decode_code(e4m3, 0x7F)) and decode_code(e4m3, 0xFE) == -448
    assert decode_code(e5m2, 0x7B) == 57344 and decode_code(e5m2, 0x7C) == math.inf
    assert decode_code(e5m2, 0xFC) == -math.inf and decode_code(e5m2, 0x01) == 2**-16
    assert decode_code(e5m2, 0x3C) == 1.0


def test_every_code_int8_twos_complement():
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(decode(codes, "int8"), codes.view(np.int8).astype(np.float32) / 64)


def test_every_scale_code():
    codes = np.arange(256, dtype=np.uint8)
    vals = decode_scale(codes)
    for c in range(255):
        assert vals[c] == np.float32(2.0 ** (c - 127)), c
    assert vals[0] == np.float32(2.0**-127) and vals[0] > 0  # the subnormal that `c << 23` gets wrong
    assert np.isnan(vals[255])
    ref = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(vals, ref, equal_nan=True)


def test_get_format_errors():
    with pytest.raises(ValueError, match="unknown MX element format 'e9m9'"):
        get_format("e9m9")
    with pytest.raises(TypeError):
        get_format(3)
    assert get_format("MXFP4") is FORMATS["e2m1"]


def test_every_scale_code_casts_back():
    codes = np.arange(255, dtype=np.uint8)
    assert np.array_equal(cast_scale(decode_scale(codes)), codes)
    assert np.array_equal(cast_scale(2.0 ** np.arange(-127, 128)), codes)
    # against ml_dtypes on exact powers of two (its cast rounds non-powers to nearest; ours floors)
    p = (2.0 ** np.arange(-127, 128)).astype(np.float32)
    assert np.array_equal(cast_scale(p), p.astype(ml_dtypes.float8_e8m0fnu).view(np.uint8))
    assert list(cast_scale([3.0, 1.5, 2.0**-140, 1e300, np.nan, np.inf])) == [128, 127, 0, 254, 255, 255]
    with pytest.raises(ValueError, match="no zero or negative"):
        cast_scale([1.0, 0.0])
