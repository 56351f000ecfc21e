"""Flatten the spec table into the integer parameters the Numba kernels take.

Kernels receive plain ints (one tuple per format) so one compiled kernel serves every
format; the values all come from ``ocpmx.spec.FORMATS``.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ..spec import ElementFormat, get_format
from ..spec.rules import check_rounding, check_scale_rule

SCALE_RULE_IDS = {"floor": 0, "ceil": 1, "rceil": 2, "even": 3}
ROUNDING_IDS = {"rne": 0, "stochastic": 1}


@lru_cache(maxsize=None)
def format_params(fmt: ElementFormat, int8_min: int = -127) -> np.ndarray:
    """int64[12]: is_int, bits, ebits, mbits, bias, emax, max_code, nan_code, inf_code,
    neg_max_mag, rceil_num, rceil_shift.

    nan_code / inf_code are -1 where the format has none. neg_max_mag is the largest
    magnitude a negative value may take (128 for MXINT8 with int8_min=-128).
    The rceil threshold is max_normal / 2^emax = rceil_num / 2^rceil_shift.
    """
    if int8_min not in (-127, -128):
        raise ValueError(f"int8_min must be -127 or -128, got {int8_min}")
    is_int = fmt.kind == "int"
    nan = fmt.nan_codes[0] if fmt.nan_codes else -1
    inf = fmt.inf_code if fmt.inf_code is not None else -1
    neg_max = fmt.max_code + (1 if (is_int and int8_min == -128) else 0)
    if is_int:
        rnum, rshift = fmt.max_code, fmt.mbits  # 127 / 2^6
    else:
        rnum, rshift = (1 << fmt.mbits) | (fmt.max_code & ((1 << fmt.mbits) - 1)), fmt.mbits
    return np.array([int(is_int), fmt.bits, fmt.ebits, fmt.mbits, fmt.bias, fmt.emax, fmt.max_code,
                     nan, inf, neg_max, rnum, rshift], dtype=np.int64)


def resolve(fmt, scale_rule: str = "floor", rounding: str = "rne"):
    fmt = get_format(fmt)
    return fmt, SCALE_RULE_IDS[check_scale_rule(scale_rule)], ROUNDING_IDS[check_rounding(rounding)]
