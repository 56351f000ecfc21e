"""The one lowering of a format into what kernels compute with.

``lower(fmt)`` gives a ``KernelFormat``: the format table's derived parameters as named plain
values. The emulator's Numba kernels take it as an argument (a NamedTuple of scalars: one
compiled kernel serves every format) and read its fields by name; ``KernelFormat.constexprs()``
gives every Triton launch site the same values under the kernels' constexpr names. Nothing
else restates a format's parameters.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .formats import ElementFormat, get_format

INT8_MINS = (-127, -128)


class KernelFormat(NamedTuple):
    """A format's parameters for kernels (integers unless noted; -1 where a code is absent).

    is_int      MXINT8 (two's complement fixed point) rather than a float format
    bits        code width; ``sign_bit`` = 1 << (bits - 1)
    ebits, mbits, bias, emax   as in ``ElementFormat``
    max_code    largest finite magnitude code
    nan_code    the positive NaN code, or -1 (no NaN code)
    inf_code    the +Inf code, or -1 (no Inf code)
    neg_max     largest magnitude (in codes) a negative value may take: max_code, or
                max_code + 1 for MXINT8 with int8_min = -128
    rceil_num, rceil_shift   max_normal / 2^emax = rceil_num / 2^rceil_shift (the rceil rule)
    subnormal_quantum   float: 2^(1 - bias - mbits), the smallest subnormal (MXINT8: 2^-mbits)
    max_normal  float: the largest finite value
    envelope    a float format with two exponent bits (E2M1, E2M3): its RNE code is the minimum
                of three rounded lines (native kernels' ``envelope_code``)
    magnitudes  number of finite magnitudes (max_code + 1); FP4 has 8, which the emulator's fast
                path encodes by counting rounding thresholds (``rounding_thresholds``)
    """

    is_int: bool
    bits: int
    sign_bit: int
    ebits: int
    mbits: int
    bias: int
    emax: int
    max_code: int
    nan_code: int
    inf_code: int
    neg_max: int
    rceil_num: int
    rceil_shift: int
    subnormal_quantum: float
    max_normal: float
    envelope: bool
    magnitudes: int

    def constexprs(self) -> dict:
        """The Triton kernels' format constexprs (every kernel takes this same set)."""
        return dict(IS_INT=self.is_int, BITS=self.bits, SIGN=self.sign_bit, EBITS=self.ebits,
                    MBITS=self.mbits, BIAS=self.bias, EMAX=self.emax, MAXC=self.max_code,
                    NANC=self.nan_code, INFC=self.inf_code, NEGMAX=self.neg_max,
                    RNUM=self.rceil_num, RSHIFT=self.rceil_shift, SUBQ=self.subnormal_quantum,
                    MAXV=self.max_normal, ENVELOPE=self.envelope)


@lru_cache(maxsize=None)
def _lower(fmt: ElementFormat, int8_min: int) -> KernelFormat:
    is_int = fmt.kind == "int"
    if is_int:
        rnum, rshift = fmt.max_code, fmt.mbits  # 127 / 2^6
    else:
        rnum, rshift = (1 << fmt.mbits) | (fmt.max_code & ((1 << fmt.mbits) - 1)), fmt.mbits
    return KernelFormat(
        is_int=is_int, bits=fmt.bits, sign_bit=fmt.sign_bit, ebits=fmt.ebits, mbits=fmt.mbits,
        bias=fmt.bias, emax=fmt.emax, max_code=fmt.max_code,
        nan_code=fmt.nan_codes[0] if fmt.nan_codes else -1,
        inf_code=fmt.inf_code if fmt.inf_code is not None else -1,
        neg_max=fmt.max_code + (1 if (is_int and int8_min == -128) else 0),
        rceil_num=rnum, rceil_shift=rshift,
        subnormal_quantum=2.0 ** (-fmt.mbits) if is_int else fmt.min_subnormal,
        max_normal=float(fmt.max_normal),
        envelope=not is_int and fmt.ebits == 2, magnitudes=fmt.max_code + 1)


def lower(fmt, int8_min: int = -127) -> KernelFormat:
    """The ``KernelFormat`` of an element format (name or ``ElementFormat``); ``int8_min`` is
    MXINT8's most negative code value, -127 (default, symmetric) or -128."""
    if int8_min not in INT8_MINS:
        raise ValueError(f"int8_min must be -127 or -128, got {int8_min}")
    return _lower(get_format(fmt), int8_min)


@lru_cache(maxsize=None)
def rounding_thresholds(fmt: ElementFormat) -> np.ndarray:
    """float32[max_code]: threshold c lies midway between magnitude codes c and c + 1 (exact in
    float32 for every format with few magnitudes). Under RNE a magnitude y rounds to the number
    of thresholds it passes, a tie going to the even code: ``y > t_c`` for even c, ``y >= t_c``
    for odd c (consecutive codes alternate in parity); past the last one it saturates."""
    vals = [fmt.value(c) for c in range(fmt.max_code + 1)]
    t = np.array([(a + b) / 2 for a, b in zip(vals, vals[1:])], np.float64)
    out = t.astype(np.float32)
    if not np.array_equal(out.astype(np.float64), t):
        raise ValueError(f"{fmt.name}: a rounding threshold is not a float32 number")
    out.setflags(write=False)
    return out
