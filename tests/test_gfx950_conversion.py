"""The gfx950 conversion model (issue 20): ``quantize``/``cast(..., conversion="gfx950")``.

(1) Values worked out by hand from AMD's documentation (the rule numbers are those of the
    ``ocpmx.emulator.gfx950`` docstring, which names the source of each).
(2) Exhaustively over all bf16 and all float16 inputs (and 2^16 float32 bit patterns), every
    format, several scales, RNE and SR with explicit words, against the independent scalar
    model in ``tests/amd_reference.py``, code for code.
(3) Where gfx950 and the OCP model agree and where they differ, counted.
"""
import math
import struct

import ml_dtypes
import numpy as np
import pytest

import amd_reference as ref
from ocpmx import emulator
from ocpmx.conformance.suite import all_bf16_blocks
from ocpmx.emulator import gfx950
from ocpmx.spec import get_format
from ocpmx.spec.philox import philox4x32
from ocpmx.spec.rules import Conversion

FORMATS = ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2")
ALL16 = np.arange(1 << 16, dtype=np.uint32)
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
STORE = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}


def f32bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def conv(source, bits, fmt, scale, word=None):
    """The emulator's gfx950 code for one element given by its raw bits."""
    x = np.array([bits], STORE[source]).view(DTYPES[source])
    words = None if word is None else np.array([word], np.uint32)
    return int(gfx950.convert(x, fmt, scale, rounding="rne" if word is None else "stochastic",
                              words=words)[0])


NAN, NEG_NAN = 0x7FC00000, 0xFFC00000
INF, NEG_INF = 0x7F800000, 0xFF800000
# (format, source, raw bits, scale code, random word or None, expected code, the rule applied)
HAND = [
    # rule 7: E2M1 has no Inf/NaN; 7.0 = 1.75*4 ties to 8 (even), past the max 6 -> saturate
    ("e2m1", "float32", f32bits(7.0), 127, None, 0x7, "overflow saturates FP4"),
    ("e2m1", "float32", f32bits(-7.0), 127, None, 0xF, "overflow saturates FP4, sign kept"),
    ("e2m1", "float32", f32bits(100.0), 127, None, 0x7, "overflow saturates FP4"),
    # rule 6: NaN -> the NaN slot, which for FP4/FP6 is the largest magnitude, with its sign
    ("e2m1", "float32", NAN, 127, None, 0x7, "NaN -> +max"),
    ("e2m1", "float32", NEG_NAN, 127, None, 0xF, "-NaN -> -max"),
    ("e2m3", "float32", NAN, 127, None, 0x1F, "NaN -> +7.5"),
    ("e3m2", "float32", NEG_NAN, 127, None, 0x3F, "-NaN -> -28"),
    ("e4m3", "float32", NEG_NAN, 127, None, 0xFF, "-NaN -> S.1111.111"),
    ("e5m2", "float32", NAN, 127, None, 0x7E, "NaN -> S.11111.10"),
    ("e5m2", "float32", NEG_NAN, 127, None, 0xFE, "-NaN -> S.11111.10"),
    # rule 7: +-Inf
    ("e2m1", "float32", INF, 127, None, 0x7, "Inf -> +max"),
    ("e2m1", "float32", NEG_INF, 127, None, 0xF, "-Inf -> -max"),
    ("e3m2", "float32", NEG_INF, 127, None, 0x3F, "-Inf -> -max"),
    ("e4m3", "float32", INF, 127, None, 0x7F, "Inf -> NaN (E4M3 has no Inf)"),
    ("e5m2", "float32", NEG_INF, 127, None, 0xFC, "-Inf -> -Inf"),
    # rule 4: ties to even
    ("e2m1", "float32", f32bits(5.0), 127, None, 0x6, "5 ties between 4 and 6 -> 4 (even)"),
    ("e2m1", "float32", f32bits(3.5), 127, None, 0x6, "3.5 ties between 3 and 4 -> 4 (even)"),
    ("e2m1", "float32", f32bits(0.25), 127, None, 0x0, "0.25 ties between 0 and 0.5 -> 0"),
    ("e2m1", "float32", f32bits(0.75), 127, None, 0x2, "0.75 ties between 0.5 and 1 -> 1"),
    # rule 7: E4M3 overflow is NaN; 464 is the tie between 448 (S.1111.110) and 480
    ("e4m3", "float32", f32bits(464.0), 127, None, 0x7E, "464 ties to 448 (even)"),
    ("e4m3", "float32", f32bits(465.0), 127, None, 0x7F, "465 rounds to 480: NaN"),
    ("e4m3", "float32", f32bits(-1000.0), 127, None, 0xFF, "-1000 overflows: -NaN"),
    # rule 7: E5M2 overflow is Inf (hardware; the host model would write 0x7B)
    ("e5m2", "float32", f32bits(57344.0), 127, None, 0x7B, "the max"),
    ("e5m2", "float32", f32bits(61439.0), 127, None, 0x7B, "below the midpoint 61440"),
    ("e5m2", "float32", f32bits(61440.0), 127, None, 0x7C, "midpoint ties up (odd max): Inf"),
    # rule 5: signed zero
    ("e2m1", "float32", 0x80000000, 127, None, 0x8, "-0 -> -0"),
    ("e2m1", "float32", f32bits(-0.1), 127, None, 0x8, "-0.1 rounds to -0"),
    ("e4m3", "float32", 0x80000000, 127, None, 0x80, "-0 -> -0"),
    # rule 2: the scale's exponent is subtracted before the one rounding
    ("e2m1", "float32", f32bits(1.0), 126, None, 0x4, "1 / 2^-1 = 2"),
    ("e2m1", "float32", f32bits(3.0), 128, None, 0x3, "3 / 2 = 1.5"),
    ("e2m1", "float32", f32bits(1.0), 130, None, 0x0, "1 / 8 = 0.125 -> 0"),
    ("e2m1", "float32", 0x7F7FFFFF, 254, None, 0x4, "float32 max / 2^127 -> 2"),
    # rules 1, 3: scale 0x00 is 2^-127 (not zero), subnormal inputs are normalized, not flushed
    ("e2m1", "float32", 0x00400000, 0x00, None, 0x2, "2^-127 (a float32 subnormal) / 2^-127 = 1"),
    ("e4m3", "bfloat16", 0x0001, 0x00, None, 0x08, "bf16 2^-133 / 2^-127 = 2^-6, min normal"),
    ("e4m3", "bfloat16", 0x0001, 127, None, 0x00, "bf16 2^-133 under 2^0 -> 0"),
    ("e4m3", "float16", 0x0001, 112, None, 0x01, "f16 2^-24 / 2^-15 = 2^-9, min subnormal"),
    ("e2m1", "float32", f32bits(1.0), 0x00, None, 0x7, "1 / 2^-127 overflows: +max"),
    ("e5m2", "float32", f32bits(1.0), 0x00, None, 0x7C, "1 / 2^-127 overflows: Inf"),
    # rule 1: scale 0xFF (NaN) makes every element the NaN output, zeros included
    ("e2m1", "float32", f32bits(1.0), 0xFF, None, 0x7, "NaN scale -> +max"),
    ("e2m1", "float32", f32bits(-1.0), 0xFF, None, 0xF, "NaN scale -> -max"),
    ("e2m1", "float32", 0x00000000, 0xFF, None, 0x7, "NaN scale, 0 -> +max"),
    ("e2m1", "float32", 0x80000000, 0xFF, None, 0xF, "NaN scale, -0 -> -max"),
    ("e2m3", "float32", f32bits(1.0), 0xFF, None, 0x1F, "NaN scale -> +7.5"),
    ("e4m3", "float32", 0x00000000, 0xFF, None, 0x7F, "NaN scale -> NaN"),
    ("e5m2", "float32", f32bits(1.0), 0xFF, None, 0x7E, "NaN scale -> NaN"),
    # rule 8, float32 -> E2M1: k = 23 - 1 = 22 bits, the word's top 22 (word >> 10) are added.
    # 1.25 = 1.0 + 0.25: the dropped quarter is 2^21 of 2^22; it carries iff word >= 2^31
    ("e2m1", "float32", f32bits(1.25), 127, 0x80000000, 0x3, "carry: 1.25 -> 1.5"),
    ("e2m1", "float32", f32bits(1.25), 127, 0x7FFFFFFF, 0x2, "no carry: 1.25 -> 1.0"),
    ("e2m1", "float32", f32bits(1.25), 127, 0x7FFFFC00, 0x2, "word >> 10 = 2^21 - 1: no carry"),
    ("e2m1", "float32", f32bits(1.25), 127, 0x800003FF, 0x3, "the low 10 bits are ignored"),
    # the carry propagates into the exponent: 1.75 -> 2.0
    ("e2m1", "float32", f32bits(1.75), 127, 0x80000000, 0x4, "carry into the exponent"),
    ("e2m1", "float32", f32bits(1.75), 127, 0x7FFFFFFF, 0x3, "no carry: 1.5"),
    # 5.5 = 4 * 1.375: dropped 0.375 of the 0.5 step = 0x300000 of 2^22: carry iff word >= 2^30
    ("e2m1", "float32", f32bits(5.5), 127, 0x40000000, 0x7, "carry: 6"),
    ("e2m1", "float32", f32bits(5.5), 127, 0x3FFFFFFF, 0x6, "no carry: 4"),
    # E4M3, k = 20: 460 = 448 + 0.375 step (0x60000 of 2^20): carry iff word >= 0xA0000000,
    # and the carry lands on S.1111.111: an in-range value becomes NaN
    ("e4m3", "float32", f32bits(460.0), 127, 0xA0000000, 0x7F, "SR carry onto NaN"),
    ("e4m3", "float32", f32bits(460.0), 127, 0x9FFFFFFF, 0x7E, "no carry: 448"),
    # subnormal target: 0.375 = 0.75 of E2M1's 0.5 step: carry iff word >= 2^30
    ("e2m1", "float32", f32bits(0.375), 127, 0x40000000, 0x1, "carry: 0.5"),
    ("e2m1", "float32", f32bits(0.375), 127, 0x3FFFFFFF, 0x0, "no carry: 0"),
    # bfloat16 -> E2M1: k = 7 - 1 = 6 bits, word >> 26
    ("e2m1", "bfloat16", 0x3FA0, 127, 0x80000000, 0x3, "bf16 1.25: carry"),
    ("e2m1", "bfloat16", 0x3FA0, 127, 0x83FFFFFF, 0x3, "bf16: only the top 6 bits count"),
    ("e2m1", "bfloat16", 0x3FA0, 127, 0x7FFFFFFF, 0x2, "bf16 1.25: no carry"),
    # bf16 0x3EC1 = 0.25 * 1.1000001b: for the subnormal target the significand is shifted
    # right by 2 first, losing its last 1; from float32 that bit stays: word 0x3F000000 carries
    # only from float32 (0x304000 + 0xFC000 = 2^22), not from bf16 (48 + 15 < 64)
    ("e2m1", "bfloat16", 0x3EC1, 127, 0x3F000000, 0x0, "bf16 source: truncated, no carry"),
    ("e2m1", "float32", 0x3EC10000, 127, 0x3F000000, 0x1, "float32 source: carry"),
]


@pytest.mark.parametrize("fmt,source,bits,scale,word,want,why", HAND,
                         ids=[f"{h[0]}-{h[1]}-{h[2]:#x}-s{h[3]}-{h[6]}" for h in HAND])
def test_hand_worked_values(fmt, source, bits, scale, word, want, why):
    got = conv(source, bits, fmt, scale, word)
    assert got == want, f"{why}: got {got:#04x}, expected {want:#04x}"
    # the independent model agrees with the hand-worked value too
    assert ref.convert(bits, source, fmt, scale, word) == want


def test_public_api_and_errors():
    x = np.array([7.0, np.nan, -np.inf, 0.3], np.float32)
    assert emulator.cast(x, "e2m1", conversion="gfx950").tolist() == [0x7, 0x7, 0xF, 0x1]
    assert emulator.cast(x, "e2m1").tolist() == [0x7, 0x0, 0xF, 0x1]  # OCP default unchanged
    assert emulator.cast(x, "e2m1", conversion=Conversion.GFX950).tolist() == [0x7, 0x7, 0xF, 0x1]
    with pytest.raises(ValueError, match="MXINT8 has no such instruction"):
        emulator.quantize(np.zeros((1, 32), np.float32), "int8", conversion="gfx950")
    with pytest.raises(ValueError, match="MXINT8"):
        emulator.cast(x, "mxint8", conversion="gfx950")
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        emulator.quantize(np.zeros((1, 32)), "e2m1", conversion="gfx950")
    with pytest.raises(ValueError, match="unknown conversion 'amd'"):
        emulator.quantize(np.zeros((1, 32), np.float32), "e2m1", conversion="amd")
    with pytest.raises(ValueError, match="needs words"):
        gfx950.convert(x, "e2m1", rounding="stochastic")
    # a rotation is applied in float32 first; E2M1 saturates like OCP, so on finite data the two
    # models agree code for code
    xr = np.random.default_rng(4).standard_normal((64, 8)).astype(np.float32) * 50
    a = emulator.quantize(xr, "e2m1", axis=0, rotation="hadamard16", conversion="gfx950")
    b = emulator.quantize(xr, "e2m1", axis=0, rotation="hadamard16")
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    assert a.rotation == b.rotation and a.axis == 0
    # float16 input, which the OCP path does not take
    h = np.array([[1.0, -3.0, 65504.0, 2.0**-24] * 8], np.float16)
    mx = emulator.quantize(h, "e4m3", conversion="gfx950")
    # amax 65504 = 1.999 * 2^15: floor scale 2^(15 - 8); 1 / 2^7 = 4 * 2^-9 (subnormal 0x04),
    # -3 / 2^7 = -1.5 * 2^-6 (0x8C), 65504 / 2^7 = 511.75 rounds past 448: NaN, 2^-31 -> 0
    assert mx.scales.tolist() == [[127 + 15 - 8]]
    assert mx.codes[0, :4].tolist() == [0x04, 0x8C, 0x7F, 0x00]


def test_prng_and_words():
    """V_PRNG_B32 by hand (ISA: (w << 1) ^ (w[31] ? 197 : 0)); the bulk Philox words against the
    plain-Python definition, including a counter past 2^32."""
    assert gfx950.prng_b32([1, 0x80000000, 0xFFFFFFFF, 0]).tolist() == [2, 197, 0xFFFFFF3B, 0]
    for seed in (0, 7, 2**63 + 12345):
        words = gfx950.sr_words(seed, 37)
        want = [philox4x32(seed, (i // 4, 0, 0, 0))[i % 4] for i in range(37)]
        assert words.tolist() == want
    c = 2**32 + 5
    got = gfx950.philox4(np.uint64(9), np.uint64(c))  # the shared emulator.philox.philox4
    assert [int(w) for w in got] == list(philox4x32(9, (c & 0xFFFFFFFF, c >> 32, 0, 0)))


def test_quantize_stochastic_reproduces_the_instruction_fed_philox_words():
    """quantize(x, fmt, rounding='stochastic', conversion='gfx950', seed=7) along axis 0: each
    element's code is what the instruction gives for its block's scale and the word of its
    K-major index i (the quantized axis last, as the project's SR counts elements): word i % 4
    of Philox(seed, i // 4), computed in plain Python here. Along axis -1, and for a cast, the
    index is the flat one."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 6)) * np.array([1, 10, 1e-3, 300, 1e4, 0.5])).astype(np.float32)
    x[3, 1] = np.nan
    for fmt in FORMATS:
        mx = emulator.quantize(x, fmt, axis=0, rounding="stochastic", seed=7, conversion="gfx950")
        ocp = emulator.quantize(x, fmt, axis=0)
        assert np.array_equal(mx.scales, ocp.scales)  # the block scale is the emulator's rule
        for i in range(x.size):
            c, r = divmod(i, x.shape[0])  # K-major: x[r, c] has index c * 64 + r
            word = philox4x32(7, (i // 4, 0, 0, 0))[i % 4]
            want = ref.convert(f32bits(float(x[r, c])), "float32", fmt, int(mx.scales[r // 32, c]),
                               word)
            assert mx.codes[r, c] == want, (fmt, r, c)
    xt = np.ascontiguousarray(x.T)  # the same elements along the last axis: flat index
    for fmt in FORMATS:
        a = emulator.quantize(xt, fmt, rounding="stochastic", seed=7, conversion="gfx950")
        b = emulator.quantize(x, fmt, axis=0, rounding="stochastic", seed=7, conversion="gfx950")
        assert np.array_equal(a.codes.T, b.codes)
    words = gfx950.sr_words(11, xt.size).reshape(xt.shape)
    assert np.array_equal(emulator.cast(xt, "e4m3", rounding="stochastic", seed=11,
                                        conversion="gfx950"),
                          gfx950.convert(xt, "e4m3", 127, rounding="stochastic", words=words))


def _check_against_reference(source, fmt, bits, scales, words=None):
    x = bits.astype(STORE[source]).view(DTYPES[source])
    for scale in scales:
        got = gfx950.convert(x, fmt, scale, rounding="rne" if words is None else "stochastic",
                             words=words)
        if words is None:
            want = [ref.convert(int(b), source, fmt, scale) for b in bits]
        else:
            want = [ref.convert(int(b), source, fmt, scale, int(w)) for b, w in zip(bits, words)]
        bad = np.flatnonzero(got != np.array(want, np.uint8))
        assert bad.size == 0, [f"{source} {int(bits[i]):#x} scale {scale} => got {got[i]:#04x}, "
                               f"expected {want[i]:#04x}" for i in bad[:5]]


def _f32_sample():
    rng = np.random.default_rng(1)
    b = rng.integers(0, 2**32, size=1 << 16, dtype=np.uint64).astype(np.uint32)
    specials = [0, 0x80000000, 1, 0x807FFFFF, 0x00800000, INF, NEG_INF, NAN, 0x7F800001,
                0xFFFFFFFF, 0x7F7FFFFF, f32bits(448.0), f32bits(464.0), f32bits(6.0),
                f32bits(7.0), f32bits(61440.0)]
    return np.concatenate([np.array(specials, np.uint32), b])


# every scale range: 0x00 pushes bf16 values past every format's max, 0xFE deep into its
# subnormals, 0x64/0x8C shift the window; 0xFF is the NaN scale
RNE_SCALES = {"bfloat16": (0x00, 0x64, 0x7F, 0x8C, 0xFE, 0xFF), "float16": (0x6E, 0x7F, 0x88),
              "float32": (0x00, 0x7F, 0xFE)}
SR_SCALES = {"bfloat16": (0x78, 0x7F, 0x85), "float16": (0x7F, 0x86), "float32": (0x7F,)}


@pytest.mark.parametrize("source", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_exhaustive_rne_against_independent_model(source, fmt):
    bits = _f32_sample() if source == "float32" else ALL16
    _check_against_reference(source, fmt, bits, RNE_SCALES[source])


@pytest.mark.parametrize("source", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_exhaustive_stochastic_against_independent_model(source, fmt):
    bits = _f32_sample() if source == "float32" else ALL16
    rng = np.random.default_rng(2)
    words = rng.integers(0, 2**32, size=bits.size, dtype=np.uint64).astype(np.uint32)
    words[::7] = 0xFFFFFFFF          # the extremes of the add
    words[1::7] = 0
    words[2::7] = 0x80000000
    _check_against_reference(source, fmt, bits, SR_SCALES[source], words)


def test_dequantize_equals_amds_scaled_upcast():
    """V_CVT_SCALEF32_PK_F32_* (AMD's to_float, rule 9) on every code under every scale code
    equals the emulator's exact OCP decode: no gfx950 variant of dequantize is needed."""
    for fmt in FORMATS:
        n = 1 << get_format(fmt).bits
        codes = np.tile(np.arange(max(n, 32)) % n, (256, 1)).astype(np.uint8)
        scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], codes.shape[1] // 32, axis=1)
        got = emulator.dequantize(emulator.MXArray(codes, scales, get_format(fmt), 1))
        for (r, c), g in np.ndenumerate(got):
            want = ref.upcast_float32(int(codes[r, c]), fmt, r)
            if math.isnan(want):
                assert np.isnan(g), (fmt, r, c)
            else:
                assert np.float32(want).view(np.uint32) == g.view(np.uint32), (fmt, r, c, want, g)


def test_stochastic_rounding_is_unbiased_over_all_word_prefixes():
    """For a normal target, the 2^k distinct word prefixes average to the input exactly
    (sum over r of floor((t + r) / 2^k) = t); bf16 -> E2M1 uses k = 6."""
    x = ALL16.astype(np.uint16).view(ml_dtypes.bfloat16)
    xf = x.astype(np.float32)
    keep = np.isfinite(xf) & (np.abs(xf) >= 1.0) & (np.abs(xf) <= 6.0)
    x, xf = x[keep], xf[keep]
    total = np.zeros(x.size)
    for r in range(64):
        words = np.full(x.size, r << 26, np.uint32)
        total += emulator.decode(gfx950.convert(x, "e2m1", rounding="stochastic", words=words),
                                 "e2m1")
    assert np.array_equal(total / 64, xf.astype(np.float64))


# ---- (3) gfx950 against the OCP model -----------------------------------------------------

def _in_range(a, fmt):
    """|a| rounds (RNE) to at most the format's max: below max + half its step, or on that
    midpoint when the max has an even mantissa (E4M3's 448 = S.1111.110)."""
    f = get_format(fmt)
    mid = f.max_normal + 2.0 ** (f.emax - f.mbits - 1)
    return (a < mid) | ((a == mid) & (f.max_code % 2 == 0))


# measured: which inputs differ (all bf16 inputs, scale 2^0), by class: NaN, Inf, overflow
CAST_DIFFERENCES = {
    "e2m1": {"nan": 254, "inf": 0, "overflow": 0},     # NaN: OCP 0, gfx950 +-max
    "e2m3": {"nan": 254, "inf": 0, "overflow": 0},
    "e3m2": {"nan": 254, "inf": 0, "overflow": 0},
    "e4m3": {"nan": 0, "inf": 2, "overflow": 30510},   # OCP saturates to +-448, gfx950 NaN
    "e5m2": {"nan": 254, "inf": 0, "overflow": 28704},  # NaN code 0x7D vs 0x7E; +-57344 vs Inf
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_cast_agrees_with_ocp_on_every_in_range_input(fmt):
    x = (ALL16 << 16).view(np.float32)
    ocp, amd = emulator.cast(x, fmt), emulator.cast(x, fmt, conversion="gfx950")
    differ = ocp != amd
    with np.errstate(invalid="ignore"):   # signalling NaN payloads widen with a warning
        a = np.abs(x.astype(np.float64))
    finite = np.isfinite(x)
    inr = finite & _in_range(np.where(finite, a, 0), fmt)
    assert not (differ & inr).any()   # every finite in-range input: the same code
    classes = {"nan": np.isnan(x), "inf": np.isinf(x), "overflow": finite & ~inr}
    assert {k: int((differ & v).sum()) for k, v in classes.items()} == CAST_DIFFERENCES[fmt]
    assert differ.sum() == sum(CAST_DIFFERENCES[fmt].values())


# measured on all bf16 inputs in blocks (the conformance suite's all_bf16_blocks): elements that
# differ outside NaN-scale blocks (all in the overflow class), per scale rule
QUANTIZE_OVERFLOW_DIFFERENCES = {("e4m3", "floor"): 1187, ("e4m3", "even"): 632,
                                 ("e5m2", "floor"): 534}


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_differs_from_ocp_only_by_overflow_and_nan_scale_blocks(fmt):
    xb = all_bf16_blocks()
    with np.errstate(invalid="ignore"):
        xb16 = xb.astype(ml_dtypes.bfloat16)  # exact: the values are bf16 numbers
    for rule in ("floor", "ceil", "rceil", "even"):
        ocp = emulator.quantize(xb, fmt, scale_rule=rule)
        amd = emulator.quantize(xb16, fmt, scale_rule=rule, conversion="gfx950")
        assert np.array_equal(ocp.scales, amd.scales)
        nan_block = np.repeat(ocp.scales == 0xFF, 32, axis=-1)
        differ = (ocp.codes != amd.codes) & ~nan_block
        s = np.repeat(ocp.scales.astype(np.int64) - 127, 32, axis=-1)
        with np.errstate(invalid="ignore", over="ignore"):
            y = np.abs(xb.astype(np.float64)) * np.exp2(-s.astype(np.float64))
        overflow = ~_in_range(np.where(nan_block, 0, y), fmt)
        assert not (differ & ~overflow).any(), (fmt, rule)
        assert int(differ.sum()) == QUANTIZE_OVERFLOW_DIFFERENCES.get((fmt, rule), 0), (fmt, rule)
        # NaN-scale blocks decode to NaN either way
        assert np.isnan(emulator.dequantize(amd)[nan_block]).all()


def test_native_quantize_takes_the_gfx950_conversion():
    """native.quantize(..., conversion='gfx950'): the emulator's model on the emulator backend
    (every format, both roundings, either axis, bit for bit); on the Triton backend only a
    gfx950 GPU has the instructions (kernels.gfx950, compile-checked by tests/test_audit.py):
    elsewhere a clear error, never the OCP conversion in its place."""
    import torch
    from ocpmx import native
    from ocpmx.native import interpreting
    rng = np.random.default_rng(4)
    x = rng.standard_normal((32, 64)).astype(np.float32) * np.float32(40.0)
    x[0, :3] = [np.nan, np.inf, 1e30]
    for fmt in ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2"):
        for rnd, axis in (("rne", -1), ("stochastic", 0)):
            got = native.quantize(torch.from_numpy(x), fmt, axis=axis, rounding=rnd, seed=9,
                                  scale_rule="even", conversion="gfx950", backend="emulator")
            want = emulator.quantize(x, fmt, axis=axis, rounding=rnd, seed=9, scale_rule="even",
                                     conversion="gfx950")
            em = got.to_emulator()
            assert np.array_equal(em.codes, want.codes) and np.array_equal(em.scales,
                                                                           want.scales)
    ocp = native.quantize(torch.from_numpy(x), "e2m1", backend="emulator").to_emulator()
    assert not np.array_equal(ocp.codes, native.quantize(
        torch.from_numpy(x), "e2m1", conversion="gfx950", backend="emulator").to_emulator().codes)
    if interpreting():  # the Triton backend off gfx950: the kernel's software conversion
        for fmt in ("e2m1", "e3m2"):
            got = native.quantize(torch.from_numpy(x), fmt, rounding="stochastic", seed=9,
                                  conversion="gfx950", backend="triton").to_emulator()
            want = emulator.quantize(x, fmt, rounding="stochastic", seed=9, conversion="gfx950")
            assert np.array_equal(got.codes, want.codes)
    with pytest.raises(ValueError, match="conversion"):
        native.quantize(torch.from_numpy(x), "e2m1", conversion="mi300")
