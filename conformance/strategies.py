"""Hypothesis strategies for MX conformance, grouped by theme as floating-point test suites do
(TestFloat, FPgen). Each draws a float32 array of blocks (n, 32) for one element format; users
can reuse them in their own tests::

    from ocpmx.conformance.strategies import THEMES
    @given(THEMES["midpoints"]("e2m1"))
    def test_mine(x): ...

Themes: midpoints, near_midpoints, saturation, underflow, scale_boundaries, specials, random.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ..emulator.decode import decode_table
from ..spec import BLOCK_SIZE as BLOCK, get_format


def _grid(fmt) -> np.ndarray:
    """Finite non-negative element values, increasing."""
    f = get_format(fmt)
    t = decode_table(f)
    if f.kind == "int":
        return np.arange(0, f.max_code + 1) / (1 << f.mbits)
    return np.array([t[c] for c in range(f.max_code + 1)])


def _f32(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float64).astype(np.float32)


def _assemble(draw, fmt, fill, n_blocks):
    """n blocks whose scale is pinned by an anchor element max * 2^e (so the block's shared
    exponent is e under the floor rule), the other 31 elements from ``fill``."""
    f = get_format(fmt)
    rows = []
    for _ in range(n_blocks):
        e = draw(st.integers(-100, 100))
        vals = draw(st.lists(fill, min_size=BLOCK - 1, max_size=BLOCK - 1))
        signs = draw(st.lists(st.sampled_from([-1.0, 1.0]), min_size=BLOCK, max_size=BLOCK))
        row = np.array([f.max_normal] + vals, dtype=np.float64) * np.array(signs) * 2.0**e
        pos = draw(st.integers(0, BLOCK - 1))
        row[[0, pos]] = row[[pos, 0]]
        rows.append(row)
    return _f32(rows)


@st.composite
def midpoints(draw, fmt, n_blocks=4):
    """Every element an exact tie between two neighbouring element values (RNE's hard case)."""
    g = _grid(fmt)
    mids = list((g[:-1] + g[1:]) / 2)
    return _assemble(draw, fmt, st.sampled_from(mids), n_blocks)


@st.composite
def near_midpoints(draw, fmt, n_blocks=4):
    """One float32 ulp either side of a tie: the vicinity of every rounding boundary."""
    g = _grid(fmt)
    mids = (g[:-1] + g[1:]) / 2
    x = _assemble(draw, fmt, st.sampled_from(list(mids)), n_blocks)
    direction = draw(st.sampled_from([-np.inf, np.inf]))
    anchor = np.abs(x) == np.abs(x).max(axis=1, keepdims=True)
    return np.where(anchor, x, np.nextafter(x, np.float32(direction)).astype(np.float32))


@st.composite
def saturation(draw, fmt, n_blocks=4):
    """Elements between max and the next power of two of the block (they must saturate to ±max,
    not overflow), next to ordinary ones."""
    f = get_format(fmt)
    top = 2.0 ** (f.emax + 1)
    fill = st.one_of(st.floats(f.max_normal, top, exclude_max=True, width=32),
                     st.sampled_from(list(_grid(fmt))))
    return _assemble(draw, fmt, fill, n_blocks)


@st.composite
def underflow(draw, fmt, n_blocks=4):
    """Elements around half the smallest subnormal (ties to zero, just above it), subnormals of
    the element format, and float32 subnormal inputs."""
    f = get_format(fmt)
    q = f.min_subnormal
    fill = st.sampled_from([q / 2, q / 4, q * 0.75, q, q * 1.5, q / 2 * (1 + 2.0**-20), 0.0])
    x = _assemble(draw, fmt, fill, n_blocks)
    if draw(st.booleans()):  # a block of float32 subnormals (amax below 2^-126)
        k = draw(st.integers(1, 2**23 - 1))
        x[0] = (np.arange(BLOCK, dtype=np.uint32) * 7919 % k + 1).astype(np.uint32).view(np.float32)
    return x


@st.composite
def scale_boundaries(draw, fmt, n_blocks=4):
    """amax at and one float32 ulp around 2^k and max * 2^k, for k over the whole range, and
    tiny (subnormal) and huge amax."""
    f = get_format(fmt)
    rows = []
    for _ in range(n_blocks):
        k = draw(st.integers(-140, 127))
        base = draw(st.sampled_from([2.0**k, f.max_normal * 2.0**k]))
        a = np.float32(min(base, 3.0e38))
        a = draw(st.sampled_from([a, np.nextafter(a, np.float32(0)), np.nextafter(a, np.float32(np.inf))]))
        if not np.isfinite(a):
            a = np.float32(3.0e38)
        frac = np.array(draw(st.lists(st.floats(0, 1, width=32), min_size=BLOCK, max_size=BLOCK)))
        row = (frac * np.float64(a)).astype(np.float32)
        row[draw(st.integers(0, BLOCK - 1))] = a
        rows.append(row * np.float32(draw(st.sampled_from([-1, 1]))))
    return np.stack(rows).astype(np.float32)


@st.composite
def specials(draw, fmt, n_blocks=4):
    """Zero, -0, NaN and ±Inf: all-zero and all -0 blocks, and specials among finite values."""
    pool = [0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -3.0, 1e-30, 1e30]
    rows = [np.zeros(BLOCK), -np.zeros(BLOCK)]
    for _ in range(n_blocks):
        rows.append(np.array(draw(st.lists(st.sampled_from(pool), min_size=BLOCK, max_size=BLOCK))))
    return _f32(rows)


@st.composite
def random_values(draw, fmt, n_blocks=4):
    """Normal values at a random scale, or a wide lognormal (magnitudes over ~40 octaves)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if draw(st.booleans()):
        x = rng.standard_normal((n_blocks, BLOCK)) * 2.0 ** draw(st.integers(-60, 60))
    else:
        x = np.exp(rng.standard_normal((n_blocks, BLOCK)) * 5.0) * rng.choice([-1, 1], (n_blocks, BLOCK))
    return _f32(x)


THEMES = {"midpoints": midpoints, "near_midpoints": near_midpoints, "saturation": saturation,
          "underflow": underflow, "scale_boundaries": scale_boundaries, "specials": specials,
          "random": random_values}


def exactly_summable_operand(rng: np.random.Generator, rows: int, k: int, fmt):
    """(codes, scales) of a K-major MX operand (rows, k) whose products and partial sums are all
    exact in float32 for any summation order: e2m1 codes of any value, FP8 codes with exponents
    in [-1, 2], scales 2^-1..2^1. A GEMM of two such operands must be bit-exact everywhere."""
    f = get_format(fmt)
    if f.bits == 4:
        codes = rng.integers(0, 16, (rows, k), dtype=np.uint8)
    else:
        exp = rng.integers(f.bias - 1, f.bias + 2, (rows, k))
        mant = rng.integers(0, 1 << f.mbits, (rows, k))
        sign = rng.integers(0, 2, (rows, k))
        codes = ((sign << (f.bits - 1)) | (exp << f.mbits) | mant).astype(np.uint8)
    return codes, rng.integers(126, 129, (rows, k // BLOCK), dtype=np.uint8)
