"""An independent, slow, scalar reference of OCP MX v1.0 block quantization for the tests.

Written from the spec text with Python's exact arithmetic (fractions, math.frexp); it shares
nothing with the Numba kernels except the decoded value of each code.
"""
import math
from fractions import Fraction

from ocpmx.emulator import decode_code
from ocpmx.spec import FORMATS

SR_BITS = 8  # stochastic rounding: random bits per element, 16 elements per Philox call


def philox_ref(seed, counter):
    """Philox4x32-10 (Salmon et al. 2011), all four counter words and output words."""
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    c = list(counter)
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & 0xFFFFFFFF, p1 & 0xFFFFFFFF,
             ((p0 >> 32) ^ c[3] ^ k1) & 0xFFFFFFFF, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return c


def _floor_log2(a: float) -> int:
    return math.frexp(a)[1] - 1


def scale_exp(amax: float, name: str, rule: str) -> int:
    f = FORMATS[name]
    e = _floor_log2(amax)
    mant = Fraction(amax) / Fraction(2) ** e
    if rule == "floor":
        s = e - f.emax
    elif rule == "ceil":
        s = e - f.emax + (mant != 1)
    elif rule == "rceil":
        s = e - f.emax + (mant > Fraction(f.max_normal) / Fraction(2) ** f.emax)
    elif rule == "even":
        q = math.floor(mant * 2 ** f.mbits + Fraction(1, 2))
        s = e - f.emax + (q >= 2 ** (f.mbits + 1))
    else:
        raise ValueError(rule)
    return max(-127, min(127, s))


def encode_value(v: Fraction, negative: bool, name: str, rbits=None, int8_min=-127) -> int:
    """Nearest finite code to v (ties to the even code), saturating; with rbits, stochastic."""
    f = FORMATS[name]
    if f.kind == "int":
        cands = [(Fraction(c, 64), c) for c in range(0, 128)]
        if negative and int8_min == -128:
            cands.append((Fraction(128, 64), 128))
    else:
        cands = [(Fraction(decode_code(f, c)), c) for c in range(f.max_code + 1)]
    a = abs(v)
    lower = max((cv for cv in cands if cv[0] <= a), key=lambda t: t[0])
    uppers = [cv for cv in cands if cv[0] > a]
    if not uppers:
        pick = lower
    else:
        upper = min(uppers, key=lambda t: t[0])
        if rbits is None:
            dl, du = a - lower[0], upper[0] - a
            pick = lower if dl < du else upper if du < dl else (lower if lower[1] % 2 == 0 else upper)
        else:
            frac = (a - lower[0]) / (upper[0] - lower[0])
            bits = math.floor(frac * 2**SR_BITS)  # the fraction's first SR_BITS bits
            pick = upper if rbits < bits else lower
    code = pick[1]
    if f.kind == "int":
        return (-code) & 0xFF if negative else code
    return code | (f.sign_bit if negative else 0)


def sr_bits_ref(seed, index):
    """Stochastic rounding's random bits of the element at flat index ``index``: 8 bits, the
    sixteen elements 16c .. 16c + 15 sharing Philox(seed, (c lo, c hi, 0, 0)); element j takes
    byte j % 4 (the lowest first) of word j // 4."""
    c, j = divmod(index, 16)
    word = philox_ref(seed, [c & 0xFFFFFFFF, c >> 32, 0, 0])[j // 4]
    return (word >> (8 * (j % 4))) & 0xFF


def quantize_block(values, name, rule="floor", rbits=None, int8_min=-127):
    """(scale code, [element codes]) of one block of Python floats (finite or not)."""
    f = FORMATS[name]
    if any(math.isnan(v) or math.isinf(v) for v in values):
        return 0xFF, None
    amax = max(abs(v) for v in values)
    if amax == 0:
        s = -127
    else:
        s = scale_exp(amax, name, rule)
    codes = []
    for i, v in enumerate(values):
        neg = math.copysign(1.0, v) < 0
        r = None if rbits is None else rbits[i]
        codes.append(encode_value(Fraction(v) / Fraction(2) ** s, neg, name, r, int8_min)
                     if v != 0 else (f.sign_bit if neg and f.kind == "float" else 0))
    return s + 127, codes
