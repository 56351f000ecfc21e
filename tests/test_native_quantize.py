"""Triton quantize / dequantize kernels: bit-exact to the emulator (codes and scale bytes).

Runs on the GPU when there is one, else on the CPU through the Triton interpreter.
"""
import dataclasses

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ocpmx import emulator, native
from ocpmx.emulator import Rotation
from ocpmx.spec import get_format
from native_util import devices, kernel_sass

FORMATS = ["e2m1", "e4m3", "e5m2", "e3m2", "e2m3", "int8"]
RULES = ["floor", "ceil", "rceil", "even"]
ROTATIONS = [None, "hadamard16", "hadamard32", Rotation(16, 11), Rotation(32, 2**63 + 2**40 + 3)]


def all_bf16_blocks(seed):
    """All 65,536 bf16 bit patterns as float32, in a (2048, 32) array: shuffled into blocks (so
    that specials, tiny and huge values meet in one block) then, in the second half of the
    rows, in sorted order (so that blocks of neighbouring magnitudes probe every scale)."""
    bits = np.arange(1 << 16, dtype=np.uint32) << 16
    x = bits.view(np.float32)
    rng = np.random.default_rng(seed)
    shuffled = x[rng.permutation(x.size)][: x.size // 2]
    ordered = np.sort(x[np.isfinite(x)])
    ordered = ordered[np.linspace(0, ordered.size - 1, x.size // 2).astype(int)]
    return np.concatenate([shuffled, ordered]).reshape(-1, 32)


def assert_same(mx, ref):
    codes, scales = mx.codes.cpu().numpy(), mx.scales.cpu().numpy()
    assert codes.shape == ref.codes.shape and scales.shape == ref.scales.shape
    bad = np.argwhere(scales != ref.scales)
    assert bad.size == 0, f"{len(bad)} scale bytes differ, first at {bad[0]}: " \
        f"{scales[tuple(bad[0])]:#04x} != {ref.scales[tuple(bad[0])]:#04x}"
    bad = np.argwhere(codes != ref.codes)
    assert bad.size == 0, f"{len(bad)} codes differ, first at {bad[0]}: " \
        f"{codes[tuple(bad[0])]:#04x} != {ref.codes[tuple(bad[0])]:#04x}"


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_every_bf16_input_every_rule(device, fmt, rounding):
    x = all_bf16_blocks(0)
    # the bf16 bit patterns themselves (torch's float32 -> bf16 cast would rewrite NaN payloads)
    hi = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    xt = torch.from_numpy(hi).view(torch.bfloat16).to(device)
    for rule in RULES:
        mx = native.quantize(xt, fmt, scale_rule=rule, rounding=rounding, seed=77)
        ref = emulator.quantize(x, fmt, scale_rule=rule, rounding=rounding, seed=77)
        assert_same(mx, ref)
        out = native.dequantize(mx).cpu().numpy()
        assert np.array_equal(out.view(np.uint32), emulator.dequantize(ref).view(np.uint32))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2"])
@pytest.mark.parametrize("rotation", ROTATIONS, ids=str)
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_rotation_both_axes(device, fmt, rotation, rounding):
    """Fused rotation + quantize along rows (axis -1) and columns (axis 0), float32, bf16 and
    float16, under the floor, rceil and even scale rules: each (dtype, axis) under one rule, in
    turn, so every rule meets both axes and two dtypes (every rule on every input:
    test_every_bf16_input_every_rule)."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((96, 128)) * np.exp2(rng.integers(-20, 20, (96, 1)))).astype(np.float32)
    x[:, 5] *= 300.0  # an outlier column: the rotation spreads it
    rules = ("floor", "rceil", "even")
    for d, dtype in enumerate((torch.float32, torch.bfloat16, torch.float16)):
        # float16 has a narrow range: brought down so that most rows stay finite
        xt = torch.from_numpy(x * 2.0**-14 if dtype == torch.float16 else x).to(device=device,
                                                                                 dtype=dtype)
        xn = xt.float().cpu().numpy()
        for a, axis in enumerate((-1, 0)):
            rule = rules[(d + 2 * a) % 3]
            mx = native.quantize(xt, fmt, axis=axis, scale_rule=rule, rounding=rounding,
                                 seed=5, rotation=rotation)
            ref = emulator.quantize(xn, fmt, axis=axis, scale_rule=rule, rounding=rounding,
                                    seed=5, rotation=rotation)
            assert_same(mx, ref)


@pytest.mark.parametrize("device", devices())
def test_special_blocks_and_subnormal_inputs(device):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    x[0, :32] = 0.0
    x[0, 32:] = -0.0
    x[1, 3] = np.nan
    x[2, 40] = -np.inf
    x[3, 0] = np.inf
    x[3, 1] = np.nan
    x[4, :32] = np.float32(1e-45) * np.arange(32)  # float32 subnormals only
    x[5, 32:] = np.float32(3e38)
    x[6, :] = np.float32(2.0**-127)  # amax at the bottom of E8M0
    for fmt in FORMATS:
        for rule in RULES:
            for rnd in ("rne", "stochastic"):
                mx = native.quantize(torch.from_numpy(x).to(device), fmt, scale_rule=rule,
                                     rounding=rnd, seed=9, int8_min=-128 if fmt == "int8" else -127)
                ref = emulator.quantize(x, fmt, scale_rule=rule, rounding=rnd, seed=9,
                                        int8_min=-128 if fmt == "int8" else -127)
                assert_same(mx, ref)
                got = native.dequantize(mx).cpu().numpy()
                assert np.array_equal(got.view(np.uint32), emulator.dequantize(ref).view(np.uint32))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("rounding", ["stochastic", "rne"])
def test_any_axis_of_a_3d_tensor_and_block_sizes(device, rounding):
    """Every axis and block size; with RNE and 32-blocks along a non-last axis this is the
    transposed-copy path through the row kernel, with and without rotations."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 64, 6)).astype(np.float32)
    x[1, :5, 2] *= 1e3  # an outlier column: saturation and flushing inside some blocks
    for axis in (0, 1, 2, -2):
        for bs in (2, 16, 32, 64):
            if x.shape[axis] % bs:
                continue
            rots = (None, "hadamard16", Rotation(16, 5)) if bs % 16 == 0 else (None,)
            for rot in rots:
                mx = native.quantize(torch.from_numpy(x).to(device), "e2m1", axis=axis,
                                     block_size=bs, rounding=rounding, seed=3, rotation=rot)
                ref = emulator.quantize(x, "e2m1", axis=axis, block_size=bs, rounding=rounding,
                                        seed=3, rotation=rot)
                assert_same(mx, ref)


def bf16_bits(t):
    return t.contiguous().view(torch.int16).cpu().numpy()


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2", "e3m2"])
def test_quantize_dequantize_is_the_composition(device, fmt):
    """The one-pass quantize-dequantize gives the bf16 bits of dequantize(quantize(x)): every
    bf16 value (NaN, Inf, subnormals) as 32-blocks under every scale rule; rotations along both
    axes, RNE and stochastic (stochastic off the last axis is the composition itself), 3-D."""
    allbf = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    allbf = allbf.reshape(-1, 64).to(device)
    for rule in ("floor", "ceil", "rceil", "even"):
        got = native.quantize_dequantize(allbf, fmt, scale_rule=rule)
        want = native.dequantize(native.quantize(allbf, fmt, scale_rule=rule), torch.bfloat16)
        assert got.shape == want.shape
        assert np.array_equal(bf16_bits(got), bf16_bits(want)), rule
    rng = np.random.default_rng(5)
    x = torch.from_numpy((rng.standard_normal((32, 32, 64)) *
                          np.exp(rng.normal(0, 3, (32, 1, 64)))).astype(np.float32)).to(device)
    for axis in (0, 1, 2):
        for rot in (None, "hadamard16", Rotation(16, 2**63 + 9))[::1 if fmt == "e2m1" else 2]:
            for rnd in ("rne", "stochastic")[:2 if fmt == "e2m1" else 1]:
                kw = dict(axis=axis, rotation=rot, rounding=rnd, seed=4, scale_rule="even")
                got = native.quantize_dequantize(x.bfloat16(), fmt, **kw)
                want = native.dequantize(native.quantize(x.bfloat16(), fmt, **kw), torch.bfloat16)
                assert np.array_equal(bf16_bits(got), bf16_bits(want)), (axis, rot, rnd)
    with pytest.raises(ValueError, match="divisible"):
        native.quantize_dequantize(x[:, :, :40], fmt)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fmt", ["e2m1", "e4m3"])
def test_h16_on_every_bf16_value(device, fmt):
    """H16 on bf16 input puts its 1/4 into the block scale (QUARTER_IN_SCALE in
    quantize_rows32_kernel): every bf16 value in 32-blocks, shuffled (NaN and Inf in most
    blocks) and in order (blocks of subnormals, of huge values whose sums overflow), one
    32-block tile per program, every scale rule, deterministic and random signs, RNE and
    stochastic rounding (which takes the 1/4 into the scale too), codes, scales and
    quantize-dequantize."""
    tuning = native.Tuning(rows32=native.RowTile(32, 1), rows32_qdq=native.RowTile(32, 1))
    x = all_bf16_blocks(1)
    x = x[x.shape[0] // 2 - 64:]  # 64 shuffled blocks (NaN, Inf in every tile), all in order
    hi = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    xt = torch.from_numpy(hi).view(torch.bfloat16).to(device)
    big = np.abs(x[64:]).max(axis=1)
    assert (big < 2.0**-126).sum() >= 2 and (big > 2.0**125).sum() > 10
    for rot in ("hadamard16", Rotation(16, 12)):
        for rule in RULES:
            for rnd in ("rne", "stochastic")[:2 if rule in ("floor", "even") else 1]:
                kw = dict(scale_rule=rule, rotation=rot, rounding=rnd, seed=5)
                mx = native.quantize(xt, fmt, tuning=tuning, **kw)
                ref = emulator.quantize(x, fmt, **kw)
                assert_same(mx, ref)
                got = native.quantize_dequantize(xt, fmt, tuning=tuning, **kw)
                want = emulator.dequantize(ref).astype(ml_dtypes.bfloat16).view(np.int16)
                assert np.array_equal(bf16_bits(got), want), (rot, rule, rnd)


@pytest.mark.parametrize("device", devices())
def test_h16_where_the_quarter_is_inexact(device):
    """On float32 input x/4 can be inexact (subnormals), so the fold must not apply there:
    single nonzero subnormals per block, the rotation spreads them (every output is +-x, the
    emulator rounds x/4), next to float16's every value, where the fold applies and is exact."""
    low = np.array([(1 << m) | k for m in range(1, 23) for k in (1, 2, 3, 5)], np.uint32)
    x = np.zeros((low.size, 32), np.float32)
    x[:, 0] = low.view(np.float32)
    x[::2, 17] = -low[::2].view(np.float32)
    for rule in ("floor", "even"):
        for fmt in ("e2m1", "e4m3"):
            mx = native.quantize(torch.from_numpy(x).to(device), fmt, scale_rule=rule,
                                 rotation="hadamard16")
            assert_same(mx, emulator.quantize(x, fmt, scale_rule=rule, rotation="hadamard16"))
    f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).reshape(-1, 32)
    mx = native.quantize(torch.from_numpy(f16).to(device), "e2m1", rotation="hadamard16")
    assert_same(mx, emulator.quantize(f16.astype(np.float32), "e2m1", rotation="hadamard16"))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("tile", [(32, 1), (64, 2), (16, 1)], ids=str)
def test_row_kernel_tiles_and_a_ragged_last_one(device, tile):
    """The row kernel at the GPU's tile shapes ((16, 1): the H100's quantize-dequantize) gives
    the emulator's bits: nine full tiles and a last one cut short (masked loads and stores),
    NaN/Inf and zero blocks in tiles that are not the first, a negative NaN and Inf - Inf under
    rotations; codes, scales and the quantize-dequantize output."""
    tuning = native.Tuning(rows32=native.RowTile(*tile), rows32_qdq=native.RowTile(*tile))
    nb = tile[0]
    n_blocks = 9 * nb + 17
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((n_blocks, 32)) *
         np.exp2(rng.integers(-30, 30, (n_blocks, 1)))).astype(np.float32)
    x[-1, 3] = np.nan  # in the cut-short last tile
    x[-2, 9] = -np.nan  # a negative NaN: after a rotation every NaN is +qNaN
    x[nb + 1, 7] = -np.inf  # second tile
    x[nb + 1, 6] = np.inf  # Inf - Inf in the rotation (x86 makes it a negative NaN)
    x[2 * nb + 5] = 0.0
    for dtype in (torch.float32, torch.bfloat16):
        xt = torch.from_numpy(x).to(device=device, dtype=dtype)
        xn = xt.float().cpu().numpy()
        for fmt in ("e2m1", "e4m3"):
            for rot in (None, "hadamard16", Rotation(32, 3)):
                mx = native.quantize(xt, fmt, rotation=rot, scale_rule="even", tuning=tuning)
                assert_same(mx, emulator.quantize(xn, fmt, rotation=rot, scale_rule="even"))
                got = native.quantize_dequantize(xt, fmt, rotation=rot, scale_rule="even",
                                                 tuning=tuning)
                want = native.dequantize(native.quantize(xt, fmt, rotation=rot,
                                                         scale_rule="even"), torch.bfloat16)
                assert np.array_equal(bf16_bits(got), bf16_bits(want)), (dtype, fmt, rot)


@pytest.mark.parametrize("device", devices())
def test_move_axis_last_is_movedim(device):
    """The tiled transpose behind the non-last-axis path moves bits exactly like torch's
    movedim + contiguous: 1-, 2- and 4-byte dtypes (bf16 NaN payloads included), tile-even and
    ragged shapes, 2-D and 3-D."""
    from ocpmx.native import move_axis_last
    g = torch.Generator().manual_seed(4)
    for shape, axis in (((128, 64), 0), ((100, 37), 0), ((3, 70, 130), 1), ((5, 64, 2), 0),
                        ((2, 3, 4), 2), ((0, 8), 0)):
        bits = torch.randint(-2**15, 2**15, shape, generator=g, dtype=torch.int32)
        for x in (bits.to(torch.int16).view(torch.bfloat16), bits.float(),
                  bits.to(torch.uint8)):
            x = x.to(device)
            want = x.movedim(axis, -1).contiguous()
            got = move_axis_last(x, axis)
            assert got.shape == want.shape and got.is_contiguous()
            assert torch.equal(got.reshape(-1).view(torch.uint8),
                               want.reshape(-1).view(torch.uint8)), (shape, x.dtype)


@pytest.mark.parametrize("device", devices())
def test_packed_layout_is_what_dot_scaled_takes(device):
    """FP4 packed along the quantized axis, element 0 in the low nibble; scales K-major."""
    x = torch.tensor([[0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5] * 4], device=device)
    mx = native.quantize(x, "e2m1")  # amax 6: scale 2^0, codes 1, 2, ..., 7, 0x9
    assert mx.data.shape == (1, 16) and mx.data.dtype == torch.uint8
    assert mx.data[0, :4].tolist() == [0x21, 0x43, 0x65, 0x97]
    assert mx.scales_kmajor.tolist() == [[127]]
    col = native.quantize(x.t().contiguous(), "e2m1", axis=0)  # the same values down a column
    assert torch.equal(col.data, mx.data) and torch.equal(col.scales_kmajor, mx.scales_kmajor)
    assert col.codes.shape == (32, 1) and col.scales.shape == (1, 1)


@pytest.mark.parametrize("device", devices())
def test_dequantize_bf16_is_float32_rounded(device):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((16, 64)) * 1e3).astype(np.float32)
    mx = native.quantize(torch.from_numpy(x).to(device), "e4m3")
    f32 = emulator.dequantize(mx.to_emulator())
    got = native.dequantize(mx, torch.bfloat16).cpu().float().numpy()
    assert np.array_equal(got, f32.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_emulator_backend_gives_the_same_tensor():
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((32, 64)).astype(np.float32))
    for axis in (-1, 0):
        a = native.quantize(x, "e2m1", axis=axis, rounding="stochastic", seed=1, backend="emulator",
                            rotation="hadamard16")
        b = emulator.quantize(x.numpy(), "e2m1", axis=axis, rounding="stochastic", seed=1,
                              rotation="hadamard16")
        assert_same(a, b)
        assert np.array_equal(native.dequantize(a, backend="emulator").numpy(),
                              emulator.dequantize(b))


@settings(max_examples=25)
@given(rows=st.integers(1, 40), nblk=st.integers(1, 5), fmt=st.sampled_from(FORMATS),
       rule=st.sampled_from(RULES), rnd=st.sampled_from(["rne", "stochastic"]),
       axis=st.sampled_from([0, 1]), log_scale=st.integers(-140, 120),
       seed=st.integers(0, 2**64 - 1), rot=st.sampled_from(ROTATIONS))
def test_random_shapes_match_the_emulator(rows, nblk, fmt, rule, rnd, axis, log_scale, seed, rot):
    device = devices()[0]
    rng = np.random.default_rng(rows * 7 + nblk)
    x = (rng.standard_normal((rows, nblk * 32)) * np.exp2(float(log_scale))).astype(np.float32)
    if axis == 0:
        x = np.ascontiguousarray(x.T)
    mx = native.quantize(torch.from_numpy(x).to(device), fmt, axis=axis, scale_rule=rule,
                         rounding=rnd, seed=seed, rotation=rot)
    assert_same(mx, emulator.quantize(x, fmt, axis=axis, scale_rule=rule, rounding=rnd, seed=seed,
                                      rotation=rot))


def test_bad_input_errors(monkeypatch):
    x = torch.zeros(4, 64)
    with pytest.raises(ValueError, match="not divisible by the block size 32"):
        native.quantize(torch.zeros(4, 48), "e2m1")
    with pytest.raises(TypeError, match="float32, bfloat16 or float16, got torch.int32"):
        native.quantize(torch.zeros(4, 64, dtype=torch.int32), "e2m1")
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        native.quantize(np.zeros((4, 64), np.float32), "e2m1")
    with pytest.raises(ValueError, match="unknown"):
        native.quantize(x, "e9m9")
    with pytest.raises(ValueError, match="unknown scale_rule"):
        native.quantize(x, "e2m1", scale_rule="nearest")
    with pytest.raises(ValueError, match="out of range"):
        native.quantize(x, "e2m1", axis=2)
    with pytest.raises(ValueError, match="power-of-two block size"):
        native.quantize(torch.zeros(4, 48, device=devices()[0]), "e2m1", block_size=48, backend="triton")
    with pytest.raises(ValueError, match="unknown backend"):
        native.quantize(x, "e2m1", backend="cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        native.quantize(x, "e2m1", backend="triton")


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_every_code_with_every_scale(device, fmt):
    """Every element code under every E8M0 code (0x00 = 2^-127, 0xFF = NaN), float32 and bf16."""
    spec = get_format(fmt)
    n = 1 << spec.bits
    width = max(32, n)
    codes = np.tile(np.arange(width, dtype=np.int64) % n, (256, 1)).astype(np.uint8)
    scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], width // 32, axis=1)
    ref = emulator.MXArray(codes, scales, spec, 1)
    data = emulator.pack(codes, spec) if spec.bits == 4 else codes
    mx = native.MXTensor(torch.from_numpy(data).to(device), torch.from_numpy(scales).to(device),
                         spec, 1, codes.shape)
    want = emulator.dequantize(ref)
    got = native.dequantize(mx).cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    got16 = native.dequantize(mx, torch.bfloat16).cpu().float().numpy()
    want16 = want.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(got16.view(np.uint32), want16.view(np.uint32))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_element_cast_every_bf16_input(device, fmt, rounding):
    """native.cast (scale 2^0) against emulator.cast on all 65,536 bf16 bit patterns."""
    bits = (np.arange(1 << 16, dtype=np.uint32) << 16)
    x = bits.view(np.float32)
    hi = (bits >> 16).astype(np.uint16).view(np.int16)
    for xt in (torch.from_numpy(hi).view(torch.bfloat16).to(device),
               torch.from_numpy(x.copy()).to(device)):
        got = native.cast(xt, fmt, rounding=rounding, seed=4).cpu().numpy()
        want = emulator.cast(x, fmt, rounding=rounding, seed=4)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, f"{bad.size} differ, first {x[bad[0]]!r}: {got[bad[0]]:#x} != {want[bad[0]]:#x}"
    odd = torch.from_numpy(x[:1000].reshape(10, 100).copy()).to(device)  # not a multiple of 1024
    assert np.array_equal(native.cast(odd, fmt).cpu().numpy(), emulator.cast(x[:1000], fmt).reshape(10, 100))


# the other split tiles gpu_bench times (the H200 default's two tiles and 256 columns on 4
# warps, split), checked over every bf16 value on a GPU before one becomes a default
SPLIT_ON_GPU = [(64, 1, 1, True, False, 2, None, True), (64, 1, 1, True, True, 2, None, True),
                (256, 4, 1, True, True, 2, None, True)]


# the row stride compiled in (``ColumnTile.const_stride``): the two H100 default tiles, and
# four blocks along K per program
CONST_STRIDE = [(128, 2, 1, True, True, 2, None, False, True),
                (64, 1, 1, True, True, 2, None, False, True),
                (32, 1, 4, False, True, 1, None, False, True)]
# blocks along K one after another (``ColumnTile.serial``), as (tile, count): 10 blocks along K
# (four per program halved to two), with the row stride compiled in (each pass's own base
# pointer), split into column pairs; 8 blocks along K (four passes) with 16 columns a program
# (48 columns: no program cut short, the unmasked path)
SERIAL = [((64, 1, 4, True, True, 2, None, False, False, True), 480),
          ((32, 1, 2, True, False, 2, None, False, True, True), 480),
          ((64, 1, 2, True, True, 2, None, True, False, True), 480),
          ((16, 1, 4, True, True, 2, None, False, False, True), 384),
          # ``joint``: the two passes' codes stored together (two blocks along K; the 3-D
          # case's five blocks run one block a program, not serial), with and without the row
          # stride compiled in
          ((64, 1, 2, True, True, 2, None, False, False, True, True), 480),
          ((32, 1, 2, True, False, 2, None, False, True, True, True), 480),
          # four blocks stored together, unrolled (the 2-D case's 8 blocks)
          ((16, 1, 4, True, True, 2, None, False, False, True, True), 384)]

# ``quarters``: each block loaded as four [columns, 8] quarters (no layout conversion): one column
# per thread with the stride compiled in, a split column pair per thread (one block, and two
# serial blocks as a loop), and joint serial tiles of one column per thread, two, four and eight
# blocks along K (the 2-D case's 8 blocks: KB 4 and 8; the 3-D case's 4: KB 4)
QUARTERS = [((32, 1, 1, True, True, 1, None, False, True, False, False, True), 480),
            ((32, 1, 1, True, False, 2, None, True, False, False, False, True), 480),
            ((32, 1, 2, True, True, 1, None, False, False, True, True, True), 480),
            ((16, 1, 4, True, True, 1, None, False, True, True, True, True), 384),
            ((16, 1, 8, True, True, 1, None, False, True, True, True, True), 384),
            ((32, 1, 2, True, True, 2, None, True, False, True, False, True), 480)]


# The numerics each tile case runs, as (shape, format, rotation), both roundings and
# quantize-dequantize with each: the whole product (8) for the per-GPU defaults, the full-value
# (64, 2) tile and the transpose. The other tiles differ in layout and masks, not in numerics:
# each runs one of three covers (``COLUMN_COVERS``, in turn along the list of tiles: two cases
# that give every value of each factor once, so every tile meets both shapes, both formats,
# with and without H16; three tiles in a row give every pair of two factors' values) in the
# default run, the other 6 marked ``exhaustive`` (``pytest -m exhaustive``; the GPU session
# runs them).
COLUMN_NUMERICS = [(s, f, r) for s in (0, 1) for f in ("e2m1", "e4m3")
                   for r in (None, "hadamard16")]
COLUMN_COVERS = [[(0, "e2m1", None), (1, "e4m3", "hadamard16")],
                 [(0, "e4m3", "hadamard16"), (1, "e2m1", None)],
                 [(0, "e2m1", "hadamard16"), (1, "e4m3", None)]]
COLUMN_CASES = [("kernel", (64, 2), 1920), ("kernel", (32, 1), 480),
                ("kernel", (32, 1, 4, False, True), 480),
                ("kernel", (16, 1, 8, True, False), 480),
                ("kernel", (64, 1, 1, True, False, 2), 480),
                ("kernel", (32, 1, 2, True, True, 4), 480),
                ("kernel", (128, 2, 1, True, True, 2), 480),
                ("kernel", (128, 2, 1, True, True, 2, 128), 480),
                ("H100", None, 480), ("H200", None, 480),
                ("kernel", (128, 2, 1, True, True, 2, None, True), 480),
                *[("kernel", t, 480) for t in SPLIT_ON_GPU],
                *[("kernel", t, 480) for t in CONST_STRIDE],
                *[("kernel", t, c) for t, c in SERIAL],
                *[("kernel", t, c) for t, c in QUARTERS],
                ("transpose", (64, 2), 480)]


def _column_params():
    covers = 0
    for columns, tile, count in COLUMN_CASES:
        if columns != "kernel" or count == 1920:
            yield pytest.param(columns, tile, count, "all")
        else:
            i, covers = covers % len(COLUMN_COVERS), covers + 1
            yield pytest.param(columns, tile, count, f"cover{i}")
            yield pytest.param(columns, tile, count, f"rest{i}", marks=pytest.mark.exhaustive)


def column_numerics(numerics: str) -> list:
    """The (shape, format, rotation) cases of ``numerics``: 'all', 'cover<i>' or 'rest<i>'."""
    if numerics == "all":
        return COLUMN_NUMERICS
    cover = COLUMN_COVERS[int(numerics[-1])]
    return cover if numerics.startswith("cover") else [c for c in COLUMN_NUMERICS
                                                       if c not in cover]


def test_column_covers_meet_every_value_and_every_pair():
    """Each cover gives every value of each factor once; three in a row (the tiles take them in
    turn), every pair of two factors' values; a cover and its rest, the whole product."""
    for i, cover in enumerate(COLUMN_COVERS):
        for f in range(3):
            assert {c[f] for c in cover} == {c[f] for c in COLUMN_NUMERICS}
        assert sorted(cover + column_numerics(f"rest{i}"), key=str) == sorted(COLUMN_NUMERICS,
                                                                              key=str)
    union = [c for cover in COLUMN_COVERS for c in cover]
    for f, g in ((0, 1), (0, 2), (1, 2)):
        assert {(c[f], c[g]) for c in union} == {(c[f], c[g]) for c in COLUMN_NUMERICS}


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("columns,tile,count,numerics", list(_column_params()), ids=str)
def test_columns_every_bf16_value(device, columns, tile, count, numerics):
    """Blocks of 32 along a non-last axis, both ways (the one-pass column kernel; a tiled transpose,
    then the row kernel): every bf16 value (61,440 of them; a quarter of them in the other cases;
    under the interpreter the cost is per program, so the full set takes the larger tile) in blocks
    along axis 0, a last column tile cut short (masked), as a 3-D tensor too; codes, scales and
    quantize-dequantize, RNE and stochastic rounding, with and without H16. Column tiles with
    several blocks along K per program (4; 8, halved to 2 and to 1 where 10 and 5 blocks do not
    divide), vectorized loads, loads of 2 and 4 columns per thread (``vec``), either launch order;
    (128, 2, 1, True, True, 2) was the H100 default's quantize tile, also with a register cap of 128
    (applied on Hopper only); "H100" and "H200" are the per-GPU defaults themselves
    (``tuning.H100``, ``tuning.H200``, with the default row tiles: each one tile for quantize,
    another for quantize-dequantize; the H100's take two blocks along K per program and the H200's
    quantize tile four, so the 2-D case, 10 blocks, runs them with KB 2 and the 3-D case, 5 blocks,
    with KB 1); ``split`` tiles load column pairs as 4-byte words and quantize the even columns,
    then the odd ones (48 columns: a program of 128 cut short; several programs along the columns in
    ``test_split_column_tile_runs_unsplit_where_it_cannot``); ``const_stride`` tiles load their rows
    at offsets from one base pointer (``CONST_STRIDE``); ``serial`` tiles quantize their blocks
    along K one after another (``SERIAL``); ``quarters`` tiles load each block as four quarters in
    the row kernel's layout (``QUARTERS``). ``numerics``: which (shape, format, rotation)
    combinations run (``column_numerics``: all, one of the covers, or its rest)."""
    import dataclasses
    if tile in SPLIT_ON_GPU and device == "cpu":
        pytest.skip("the other split tiles on a GPU only: under the interpreter the (128, 2) "
                    "split tile runs the same program text; their compiled code differs")
    rows = dict(rows32=native.default_tuning().rows32,
                rows32_qdq=native.default_tuning().rows32_qdq)
    if columns in ("H100", "H200"):
        tuning = dataclasses.replace(getattr(native.tuning, columns), **rows)
        if tuning.columns_qdq == "both_axes":  # (the column kernel's qdq tile under test here;
            # the axis-0 kernel the H100 runs instead: tests/test_both_axes.py)
            tuning = dataclasses.replace(tuning, columns_qdq="kernel")
        assert tuning.column_path("qdq")[0] == tuning.column_path()[0] == "kernel"
        assert tuning.column_path("qdq")[1] != tuning.column_path()[1]
    else:
        tuning = native.Tuning(columns=columns, cols32=native.ColumnTile(*tile), **rows)
    blocks = all_bf16_blocks(2)[:1920][::1920 // count]
    # column n of block row b holds blocks[48 b + n]: 48 columns, so both tiles end ragged
    rows = count // 48
    x = np.ascontiguousarray(blocks.reshape(rows, 48, 32).transpose(0, 2, 1).reshape(-1, 48))
    hi = (x.view(np.uint32) >> 16).astype(np.uint16).view(np.int16)
    xt = torch.from_numpy(hi).view(torch.bfloat16).to(device)
    run = column_numerics(numerics)
    for which, (shape, axis) in enumerate(((x.shape, 0), ((2, rows * 16, 48), 1))):
        xs, xn = xt.reshape(shape), x.reshape(shape)
        for fmt in ("e2m1", "e4m3"):
            for rot in (None, "hadamard16"):
                if (which, fmt, rot) not in run:
                    continue
                for rnd in ("rne", "stochastic"):
                    mx = native.quantize(xs, fmt, axis=axis, rotation=rot, rounding=rnd,
                                         seed=5, scale_rule="even", tuning=tuning)
                    ref = emulator.quantize(xn, fmt, axis=axis, rotation=rot, rounding=rnd,
                                            seed=5, scale_rule="even")
                    assert_same(mx, ref)
                got = native.quantize_dequantize(xs, fmt, axis=axis, rotation=rot,
                                                 scale_rule="even", tuning=tuning)
                want = emulator.dequantize(emulator.quantize(xn, fmt, axis=axis, rotation=rot,
                                                             scale_rule="even"))
                assert np.array_equal(bf16_bits(got),
                                      want.astype(ml_dtypes.bfloat16).view(np.int16))


def test_column_pair_tile_compiles_for_sm90_without_spills():
    """The column tile that loads a column pair per thread (``ColumnTile(vec=2)``), compiled
    for sm_90a without the chip (the installed Triton and its ptxas, ``kernel_sass.py
    --columns``), with and without H16: 4-byte loads (LDG.E: 128 contiguous bytes of a row per
    warp instruction, against 64 with a column per thread), each block's 16 code bytes in one
    16-byte store, no register spilled, no warp shuffle moving data (the vectorized tiles'
    layout conversions compile to hundreds), and under 28 instructions per element (24 with
    Triton 3.9, NaN/Inf fix-ups included; the row kernel: 20.5 with H16). A regression here
    loses what the tile exists for, found on a CPU (on an H100 it runs at 0.49-0.56 of copy,
    results/native_gpu/bench_columns_h100.md; the GPU host compiles with Triton 3.6). The tile
    is the H100's one-block quantize tile of before d8d96d7; the two-block tiles at once
    spill (``test_serial_column_tile_does_not_spill_for_sm90``)."""
    # the H100's one-block tile (programs along K launched first)
    facts = kernel_sass("--columns", "--tile", 128, 2, 1, 1, 1, 2, "--rotations", 0, 16)
    assert [f["rotation"] for f in facts] == [0, 16]
    for f in facts:
        assert f["loads"] == ["LDG.E"] and "STG.E.128" in f["stores"], f
        assert f["STL"] == 0 and f["LDL"] == 0 and f["SHFL"] <= 2, f
        assert f["per_element"] < 28, f


def test_serial_column_tile_does_not_spill_for_sm90():
    """``ColumnTile(serial=True)`` with two and four blocks along K per program, compiled for
    sm_90a without the chip (``kernel_sass.py --columns``), RNE with and without H16: no
    register spilled, 4-byte loads and 16-byte code stores, and no more instructions per element
    than the one-block tile (< 28), where the same tiles quantizing their blocks at once spill
    (Triton 3.9: 64-77 spill stores without a rotation, 16-19 with H16: (128, 2, 2) and
    (64, 1, 2) in results/native_gpu/sass_columns_kb2.txt).
    A regression here loses what the option exists for."""
    for kb in (2, 4):
        facts = kernel_sass("--columns", "--tile", 128, 2, kb, 1, 1, 2, 0, 0, 0, 1,
                            "--rotations", 0, 16)
        assert [f["rotation"] for f in facts] == [0, 16]
        for f in facts:
            assert "serial=True" in f["tile"], f
            assert f["loads"] == ["LDG.E"] and "STG.E.128" in f["stores"], f
            assert f["STL"] == 0 and f["LDL"] == 0, f
            assert f["per_element"] < 28, f


@pytest.mark.parametrize("device", devices())
def test_quarters_tiles_in_both_load_forms_and_with_64_bit_offsets(device, monkeypatch):
    """``ColumnTile(quarters=True)`` in either load form (``launch.quarter_form``: the other
    Triton versions' form compiled and run here too) and with 64-bit offsets (``BIG``, forced
    on a small tensor by lowering ``launch.BIG_NUMEL``): codes and scales equal to the
    emulator's, RNE and stochastic rounding, with H16, NaN, Inf and a masked width; tiles: four
    joint serial blocks of one column a thread with the stride compiled in, and two serial
    blocks of a split column pair, stored apart and jointly."""
    import itertools

    from ocpmx.native import launch, ops
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((256, 40)) * np.exp2(rng.integers(-8, 8, (256, 40)))).astype(
        np.float32)
    x[5, 3], x[70, 9], x[200, 39] = np.nan, np.inf, -np.inf
    x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    t = torch.from_numpy(x).to(torch.bfloat16).to(device)
    tiles = (native.ColumnTile(32, 1, 4, True, True, 1, const_stride=True, serial=True,
                               joint=True, quarters=True),
             native.ColumnTile(32, 1, 2, True, True, 2, split=True, serial=True, quarters=True),
             native.ColumnTile(32, 1, 2, True, True, 1, split=True, serial=True, joint=True,
                               quarters=True))
    for form, big, tile in itertools.product((1, 2), (False, True), tiles):
        monkeypatch.setattr(launch, "quarter_form", lambda form=form: form)
        monkeypatch.setattr(launch, "BIG_NUMEL", 1 if big else 2**31)
        tuning = native.Tuning(columns="kernel", cols32=tile, cols32_sr=tile)
        consts = launch.cols32_constexprs(ops.numerics("e2m1", "even", "rne", None),
                                          torch.bfloat16, 256, 40, 256 * 40, tile, False)[0]
        assert consts["QUARTERS"] == form and consts["BIG"] is big and consts["SERIAL"]
        assert consts["JOINT"] is tile.joint and consts["SPLIT"] is tile.split
        for rnd in ("rne", "stochastic"):
            mx = native.quantize(t, "e2m1", axis=0, rotation="hadamard16", rounding=rnd,
                                 seed=9, scale_rule="even", tuning=tuning)
            assert_same(mx, emulator.quantize(x, "e2m1", axis=0, rotation="hadamard16",
                                              rounding=rnd, seed=9, scale_rule="even"))


def test_quarters_column_tile_converts_no_layout_for_sm90():
    """The H200's quantize tile along tokens (``ColumnTile(quarters=True)``: each block loaded
    as four quarters in the row kernel's layout, four serial blocks stored together) compiled
    for sm_90a without the chip with H16: in the form ``launch.quarter_form`` picks for the
    installed Triton, no warp shuffle but the NaN/Inf vote's, no spill, under 96 registers
    (Triton 3.6: 69; 3.9: 80); in the other form Triton converts the layout (over 100 warp
    shuffles). What the tile exists for: on an H200 it quantizes along tokens at 0.635 / 0.69
    of copy against 0.41 / 0.42 (results/native_gpu/bench_quantize.md)."""
    from ocpmx.native import launch
    chosen = launch.quarter_form()
    facts = {}
    for form in (1, 2):
        (facts[form],) = kernel_sass("--columns", "--tile", 32, 1, 4, 1, 1, 1, 0, 0, 1, 1, 1,
                                     1, "--rotations", 16, "--quarter-form", form)
    good, other = facts[chosen], facts[3 - chosen]
    assert "quarters=True" in good["tile"] and "joint=True" in good["tile"]
    assert good["SHFL"] <= 2 and good["STL"] == 0 and good["registers"] < 96, good
    assert good["loads"] == ["LDG.E.U16"] and "STG.E.128" in good["stores"], good
    # (the other form converts: were a Triton to lay both forms out alike, quarter_form's
    # version rule would be worth revisiting, so this says so)
    assert other["SHFL"] > 100, ("the other load form converts no layout either", other)
    # the H200's tile without a rotation (``cols32_unrotated``: a column pair a thread, split
    # into its even and odd columns, four joint blocks): 4-byte loads, no spill, no layout
    # conversion but the NaN/Inf vote's shuffles (Triton 3.6 and 3.9: 167 registers)
    (pair,) = kernel_sass("--columns", "--tile", 64, 1, 4, 1, 1, 1, 0, 1, 0, 1, 1, 1,
                          "--rotations", 0)
    assert "split=True" in pair["tile"] and "joint=True" in pair["tile"], pair
    assert pair["SHFL"] <= 2 and pair["STL"] == 0 and pair["loads"] == ["LDG.E"], pair


def test_joint_column_tile_spills_less_than_two_blocks_at_once_for_sm90():
    """The H100's quantize tile without a rotation (``Tuning.cols32_unrotated``: two blocks
    along K, ``serial`` + ``joint``) compiled for sm_90a without the chip, against the same
    tile quantizing its blocks at once (the H100's ``cols32``): under 3 times fewer register
    spills (Triton 3.6, the GPU hosts': 0 against 80; Triton 3.9: 20 against 67), the same
    4-byte loads and 16-byte code stores. What the tile exists for: on an H100 it quantizes
    along tokens at 0.72 of copy against 0.555 (results/native_gpu/column_tile_check_h100.txt)."""
    facts = {}
    for joint in ("0", "1"):
        (facts[joint],) = kernel_sass("--columns", "--tile", 128, 2, 2, 1, 1, 2, 0, 0, 1, joint,
                                      joint, "--rotations", 0)
    assert "joint=True" in facts["1"]["tile"] and "joint=False" in facts["0"]["tile"]
    for f in facts.values():
        assert f["loads"] == ["LDG.E"] and "STG.E.128" in f["stores"], f
    assert 3 * facts["1"]["STL"] < facts["0"]["STL"], facts


def _triton_version():
    import triton
    return tuple(int(p) for p in triton.__version__.split(".")[:2])


@pytest.mark.skipif(_triton_version() < (3, 9), reason=(
    "a fact about Triton 3.9's compiler: Triton 3.6 (the GPU hosts') compiles the split tile "
    "to 166-168 registers and more instructions per element than unsplit, so no split tile "
    "that loads [32, columns] tiles is a default there (results/native_gpu/"
    "sass_columns_split.txt; the H200's split quarters tile loads no such tile)"))
def test_split_column_tile_halves_the_registers_for_sm90():
    """``ColumnTile(split=True)``, compiled for sm_90a without the chip (``kernel_sass.py
    --columns``) by Triton 3.9: loading a thread's column pair as 4-byte words and quantizing
    its even column, then its odd one, keeps at most ~100 registers under RNE (no rotation and
    H16) and 128 under stochastic rounding, where the same tile unsplit takes 154-247 under RNE
    (8-13 warps an SM, against 20 split) and 128-166 under stochastic rounding (8 random bits an
    element: with H16 already 128), without a spill or more instructions per element."""
    facts = {}
    for split in (0, 1):
        for f in kernel_sass("--columns", "--tile", 128, 2, 1, 1, 1, 2, 0, split,
                             "--rotations", 0, 16, "--rounding", "rne", "stochastic"):
            facts[split, f["rotation"], f["rounding"]] = f
    for (split, rot, rnd), f in facts.items():
        if not split:
            continue
        unsplit = facts[0, rot, rnd]
        assert f["loads"] == ["LDG.E"] and "STG.E.128" in f["stores"], f
        assert f["STL"] == 0 and f["LDL"] == 0, f
        assert f["registers"] <= (104 if rnd == "rne" else 128), f
        assert f["registers"] < 0.85 * unsplit["registers"] or \
            (rnd == "stochastic" and f["registers"] <= unsplit["registers"] <= 128), (f, unsplit)
        assert f["per_element"] <= unsplit["per_element"], (f, unsplit)


def test_const_stride_column_tile_drops_the_address_arithmetic_for_sm90():
    """``ColumnTile(const_stride=True)``, compiled for sm_90a without the chip: with the row
    stride compiled in, the tile's 32 loads take immediate offsets from one base pointer, and
    the kernel runs at least one SASS instruction per element fewer (Triton 3.6 and 3.9 both
    ~1.8: 23.6 -> 21.8 all told, 16.9 -> 15.0 on the path without NaN/Inf), with no spill and
    the same loads and stores. Whether that is faster on a GPU is for ``gpu_bench.py
    --sections columns`` to say (not the default yet)."""
    facts = {}
    for const in (0, 1):
        for f in kernel_sass("--columns", "--tile", 128, 2, 1, 1, 1, 2, 0, 0, const,
                             "--rotations", 0, 16, "--rounding", "rne"):
            facts[const, f["rotation"]] = f
    for rot in (0, 16):
        plain, const = facts[0, rot], facts[1, rot]
        assert const["per_element"] <= plain["per_element"] - 1.0, (const, plain)
        assert const["STL"] == 0 and const["LDL"] == 0, const
        assert (const["loads"], const["stores"]) == (plain["loads"], plain["stores"])


def test_const_stride_applies_where_the_offsets_fit():
    """The launch compiles the stride in (``INNER``) only for a ``const_stride`` tile, not
    split, and where the last row's offset fits a load's signed 24-bit immediate."""
    from ocpmx.native import launch, ops
    n = ops.numerics("e2m1", "floor", "rne", None)
    const = native.ColumnTile(64, 1, vec=2, const_stride=True)
    plain = native.ColumnTile(64, 1, vec=2)
    split = native.ColumnTile(64, 1, vec=2, split=True, const_stride=True)

    def inner_of(tile, dtype, inner, k=256):
        return launch.cols32_constexprs(n, dtype, k, inner, k * inner, tile, False)[0]["INNER"]
    assert inner_of(const, torch.bfloat16, 14336) == 14336
    assert inner_of(plain, torch.bfloat16, 14336) == 0
    assert inner_of(split, torch.bfloat16, 14336) == 0
    assert inner_of(const, torch.bfloat16, 135301) == 0       # 31 x 135301 x 2 >= 2^23
    assert inner_of(const, torch.bfloat16, 135300) == 135300  # just under
    assert inner_of(const, torch.float32, 67651) == 0         # 4-byte elements: half as far
    assert inner_of(const, torch.float32, 67650) == 67650


def test_stochastic_rounding_takes_its_column_tile():
    """The launch of a quantize or quantize-dequantize along a non-last axis takes
    ``Tuning.cols32_sr`` under stochastic rounding and the operation's own tile otherwise."""
    import dataclasses
    from ocpmx.native import launch, ops
    tuning = dataclasses.replace(native.default_tuning(), columns="kernel",
                                 cols32=native.ColumnTile(32, 1, 2, vec=2),
                                 cols32_qdq=native.ColumnTile(64, 1, 2, vec=2),
                                 cols32_sr=native.ColumnTile(16, 1, 1, vec=2))
    x = torch.zeros(256, 64, dtype=torch.bfloat16)
    for rounding, qdq, bn, kb in (("rne", False, 32, 2), ("rne", True, 64, 2),
                                  ("stochastic", False, 16, 1), ("stochastic", True, 16, 1)):
        n = ops.numerics("e2m1", "floor", rounding, None)
        k32 = launch.kernel32(x, 0, 64, 256 * 64 // 32, n, tuning, qdq)
        assert (k32.consts["BN"], k32.consts["KB"]) == (bn, kb), (rounding, qdq)


def test_serial_applies_to_several_blocks_without_a_fold():
    """The launch runs a ``serial`` tile's blocks along K one after another (``SERIAL``) only
    where a program has more than one and no fold (whose groups a program holds at once)."""
    from ocpmx.native import launch, ops
    n = ops.numerics("e2m1", "floor", "rne", None)
    serial = native.ColumnTile(64, 1, 2, vec=2, serial=True)

    def consts(tile, k):
        return launch.cols32_constexprs(n, torch.bfloat16, k, 64, k * 64, tile, False)
    c, _, kb = consts(serial, 256)
    assert c["SERIAL"] and c["KB"] == kb == 2
    c, _, kb = consts(serial, 96)  # 3 blocks: one per program
    assert not c["SERIAL"] and kb == 1
    assert not consts(native.ColumnTile(64, 1, 2, vec=2), 256)[0]["SERIAL"]
    e = torch.zeros(1, dtype=torch.int32)
    fold = launch.FoldOutput(2, e, None, e, e, 64, 6, False)  # groups of two blocks
    c, _, kb = launch.cols32_constexprs(n, torch.bfloat16, 256, 64, 256 * 64, serial, False,
                                        fold)
    assert not c["SERIAL"] and kb == 2 and c["FOLD_GROUP"] == 2


def test_column_fold_uses_the_gpu_conversion_only_with_one_column_per_thread():
    """The column kernel's fold encodes E4M3 with the GPU's conversion (``HW_CVT``, where the
    fold asks for it) only in tiles of vec = 1: on an H100 under Triton 3.6 that conversion
    gave wrong codes in vec = 2 tiles (results/native_gpu/column_fold_cvt_h100.txt), which
    ``encode`` gets right; the rest of the fold's key is unchanged."""
    from ocpmx.native import launch, ops
    n = ops.numerics("e2m1", "floor", "rne", None)
    e = torch.zeros(1, dtype=torch.int32)
    for hw in (True, False):
        fold = launch.FoldOutput(2, e, e, e, e, 64, 6, hw)
        for vec, want in ((1, hw), (2, False), (4, False)):
            c = launch.cols32_constexprs(n, torch.bfloat16, 256, 64, 256 * 64,
                                         native.ColumnTile(64, 1, 2, vec=vec), False, fold)[0]
            assert (c["HW_CVT"], c["FOLD_GROUP"], c["D_MAX"], c["POW2"]) == (want, 2, 6, True)


@pytest.mark.parametrize("device", devices())
def test_split_column_tile_runs_unsplit_where_it_cannot(device):
    """A split tile splits only bf16 with an even number of columns (``SPLIT`` in the launch),
    and elsewhere (float32, float16, an odd number of columns) runs as the same tile unsplit:
    the emulator's bits every way, a ragged last program included."""
    import dataclasses
    from ocpmx.native import launch, ops
    tile = native.ColumnTile(32, 1, vec=2, split=True)
    tuning = dataclasses.replace(native.default_tuning(), columns="kernel", cols32=tile)
    n = ops.numerics("e2m1", "floor", "rne", None)
    rng = np.random.default_rng(11)
    for dtype, cols, split in ((torch.bfloat16, 50, True), (torch.bfloat16, 33, False),
                               (torch.float32, 50, False), (torch.float16, 50, False)):
        consts = launch.cols32_constexprs(n, dtype, 64, cols, 64 * cols, tile, False)[0]
        assert consts["SPLIT"] is split, (dtype, cols)
        x = torch.from_numpy(rng.standard_normal((64, cols)).astype(np.float32)).to(dtype)
        xn = x.float().numpy()
        for rot, rnd in ((None, "rne"), ("hadamard16", "stochastic")):
            assert_same(native.quantize(x.to(device), "e2m1", axis=0, rotation=rot, rounding=rnd,
                                        seed=2, tuning=tuning),
                        emulator.quantize(xn, "e2m1", axis=0, rotation=rot, rounding=rnd, seed=2))
    # bf16 whose pairs are not 4-byte words (a contiguous tensor at an odd element offset)
    flat = torch.from_numpy(rng.standard_normal(64 * 50 + 1).astype(np.float32))
    x = flat.to(torch.bfloat16).to(device)[1:].view(64, 50)
    assert x.is_contiguous() and x.data_ptr() % 4 == 2
    assert_same(native.quantize(x, "e2m1", axis=0, tuning=tuning),
                emulator.quantize(x.float().cpu().numpy(), "e2m1", axis=0))
    with pytest.raises(ValueError, match="split ColumnTile takes an even number of columns"):
        native.ColumnTile(33, 1, split=True)


@pytest.mark.parametrize("device", devices())
def test_column_path_per_operation(device, monkeypatch):
    """``Tuning.column_path``: quantize takes ``columns`` / ``cols32``; quantize-dequantize
    ``columns_qdq`` / ``cols32_qdq`` and the fold ``columns_fold`` / ``cols32_fold``, each None
    meaning "as quantize"; the H100 and H200 defaults take the kernel for quantize, 'both_axes' for
    quantize-dequantize (the axis-0 kernel; its column tile for what that kernel leaves: stochastic
    rounding takes ``cols32_sr`` where set), the transpose for the fold. The launch follows it:
    under a split of the paths (the kernel for quantize, the transpose for quantize-dequantize and
    the fold) a quantize along axis 0 never transposes, a quantize-dequantize and a fold do, all
    with the emulator's bits. Bad values are named."""
    import dataclasses
    from ocpmx.native import fold as native_fold
    from ocpmx.native import launch, tuning as T
    a, b, c = native.ColumnTile(32, 1), native.ColumnTile(16, 1, 2), native.ColumnTile(64, 2)
    same = native.Tuning(columns="kernel", cols32=a)
    assert same.column_path("qdq") == same.column_path("fold") == ("kernel", a)
    split = native.Tuning(columns="kernel", cols32=a, columns_qdq="transpose",
                          columns_fold="transpose")
    assert split.column_path() == ("kernel", a)
    assert split.column_path("qdq") == split.column_path("fold") == ("transpose", a)
    other = native.Tuning(columns="transpose", cols32=a, columns_qdq="kernel", cols32_qdq=b,
                          columns_fold="kernel", cols32_fold=c)
    assert other.column_path() == ("transpose", a)
    assert other.column_path("qdq") == ("kernel", b) and other.column_path("fold") == ("kernel", c)
    assert T.H100.column_path() == ("kernel", native.ColumnTile(128, 2, 2, True, True, 2,
                                                                const_stride=True))
    assert T.H100.column_path("qdq") == ("both_axes",
                                         native.ColumnTile(64, 2, 2, True, True, 2))
    assert T.H100.column_path("fold")[0] == "transpose"
    # stochastic rounding: the H100's one-block tile for quantize and qdq, not for the fold;
    # tunings without an SR tile keep the operation's own
    sr = native.ColumnTile(64, 1, 1, True, True, 2, const_stride=True)
    assert T.H100.column_path("quantize", True) == ("kernel", sr)
    assert T.H100.column_path("qdq", True) == ("both_axes", sr)  # (the column kernel runs SR)
    assert T.H100.column_path("fold", True) == T.H100.column_path("fold")
    quarters = native.ColumnTile(32, 1, 4, True, True, 1, const_stride=True, serial=True,
                                 joint=True, quarters=True)
    assert T.H200.column_path() == T.H200.column_path("quantize", True) == ("kernel", quarters)
    assert T.H200.column_path("qdq", True) == ("both_axes", quarters)
    assert T.H200.column_path("qdq") == ("both_axes", native.ColumnTile(64, 1, 1, True, True, 2))
    assert T.H200.column_path("fold")[0] == "transpose"
    # FP4 without a rotation the H100 quantizes (RNE) with its joint serial tile; not under
    # stochastic rounding, not quantize-dequantize, not the fold; other tunings keep cols32
    joint = native.ColumnTile(128, 2, 2, True, True, 2, const_stride=True, serial=True,
                              joint=True)
    assert T.H100.column_path("quantize", unrotated_fp4=True) == ("kernel", joint)
    assert T.H100.column_path("quantize", True, unrotated_fp4=True) == ("kernel", sr)
    assert T.H100.column_path("qdq", unrotated_fp4=True) == T.H100.column_path("qdq")
    assert T.H100.column_path("fold", unrotated_fp4=True) == T.H100.column_path("fold")
    pair = native.ColumnTile(64, 1, 4, True, True, 1, split=True, serial=True, joint=True,
                             quarters=True)  # the H200's: a column pair a thread
    assert T.H200.column_path("quantize", unrotated_fp4=True) == ("kernel", pair)
    assert T.H200.column_path("quantize", True, unrotated_fp4=True) == ("kernel", quarters)
    assert T.GPU.column_path("quantize", unrotated_fp4=True) == T.GPU.column_path()
    with pytest.raises(ValueError, match="joint ColumnTile .* takes serial=True"):
        native.ColumnTile(64, 1, 2, joint=True)
    with pytest.raises(ValueError, match="columns_qdq must be None, 'transpose', 'kernel' or "
                                         "'both_axes'"):
        native.Tuning(columns_qdq="rows")
    with pytest.raises(ValueError, match="columns_fold must be None, 'transpose', 'kernel' or "
                                         "'both_axes'"):
        native.Tuning(columns_fold="rows")
    with pytest.raises(ValueError, match="fold_columns takes .* powers of two"):
        native.Tuning(fold_columns=(48, 2))
    with pytest.raises(ValueError, match="both_axes_blocks must be 1, 2 or 4, got 3"):
        native.Tuning(both_axes_blocks=3)
    # 'both_axes': the column tile for what the axis-0 kernel leaves; a fold inheriting it
    # takes the column kernel, a fold set to it the axis-0 fold kernel (test_fold.py)
    one_pass = native.Tuning(columns="both_axes", cols32=a, columns_qdq="both_axes",
                             cols32_qdq=b)
    assert one_pass.column_path("qdq") == ("both_axes", b)
    assert one_pass.column_path() == ("both_axes", a)
    assert one_pass.column_path("fold") == ("kernel", a)
    assert native.Tuning(columns_fold="both_axes").column_path("fold")[0] == "both_axes"
    with pytest.raises(ValueError, match="columns must be 'transpose', 'kernel' or 'both_axes'"):
        native.Tuning(columns="rows")
    with pytest.raises(ValueError, match="op must be 'quantize', 'qdq' or 'fold'"):
        same.column_path("dequantize")
    base = native.default_tuning()  # the interpreter's row tiles (few programs)
    tuning = dataclasses.replace(base, columns="kernel",
                                 cols32=native.ColumnTile(64, 2, 1, True, True, 2),
                                 columns_qdq="transpose", columns_fold="transpose")
    moved = []
    move_axis_last = launch.move_axis_last
    monkeypatch.setattr(launch, "move_axis_last",
                        lambda *a, **kw: moved.append(1) or move_axis_last(*a, **kw))
    x = np.random.default_rng(3).standard_normal((64, 48)).astype(np.float32)
    xt = torch.from_numpy(x).to(device)
    assert_same(native.quantize(xt, "e2m1", axis=0, rotation="hadamard16", tuning=tuning),
                emulator.quantize(x, "e2m1", axis=0, rotation="hadamard16"))
    assert not moved, "quantize along axis 0 went through the transpose"
    got = native.quantize_dequantize(xt, "e2m1", axis=0, rotation="hadamard16", tuning=tuning)
    assert moved, "quantize-dequantize did not take the transpose path"
    want = emulator.dequantize(emulator.quantize(x, "e2m1", axis=0, rotation="hadamard16"))
    assert np.array_equal(bf16_bits(got), want.astype(ml_dtypes.bfloat16).view(np.int16))
    moved.clear()
    folded = native_fold.quantize_folded(xt, "e2m1", 2, axis=0, tuning=tuning)
    assert moved, "the fold did not take the transpose path"
    want = native_fold.quantize_folded(xt.cpu(), "e2m1", 2, axis=0, backend="emulator")
    for field in ("codes", "exponents", "scales", "stats"):
        assert torch.equal(getattr(folded, field).cpu(), getattr(want, field)), field
    # the launch passes the rotation and the format: the H100's joint serial tile (JOINT)
    # runs E2M1 without a rotation only; E4M3 (8-bit codes) and H16 take the two-block tile
    xb = torch.zeros(256, 256, dtype=torch.bfloat16, device=device)
    for fmt, rot, joint in (("e2m1", None, True), ("e2m1", Rotation(16), False),
                            ("e4m3", None, False)):
        n = native.ops.numerics(fmt, "even", "rne", rot)
        k32 = launch.kernel32(xb, 0, 256, 256 * 256 // 32, n, T.H100)
        assert k32.consts["JOINT"] is joint and k32.consts["SERIAL"] is joint, (fmt, rot)
    # the joint tile where every program's columns exist (EVEN: the unmasked stores; the
    # every-value test's 48 columns cut its last program short)
    tile = native.ColumnTile(64, 1, 2, True, True, 2, serial=True, joint=True)
    xe = np.random.default_rng(4).standard_normal((128, 64)).astype(np.float32)
    xe[3, 5], xe[70, 63] = np.nan, -np.inf
    xb = torch.from_numpy(xe).to(device).bfloat16()
    ref_in = xb.float().cpu().numpy()
    k32 = launch.kernel32(xb, 0, 64, 128 * 64 // 32, native.ops.numerics("e2m1", "even", "rne",
                                                                        None),
                          native.Tuning(columns="kernel", cols32=tile))
    assert k32.consts["JOINT"] and k32.consts["EVEN"]
    for rot in (None, "hadamard16"):
        assert_same(native.quantize(xb, "e2m1", axis=0, rotation=rot, scale_rule="even",
                                    tuning=native.Tuning(columns="kernel", cols32=tile)),
                    emulator.quantize(ref_in, "e2m1", axis=0, rotation=rot, scale_rule="even"))


def test_default_tuning_per_gpu(monkeypatch):
    """The default tiles per GPU: an H100 (any of its boards) gets ``tuning.H100`` and an H200
    ``tuning.H200`` (each the column kernel for quantize along tokens, measured faster there
    than the transpose path, with its own tile; for quantize-dequantize the H200 the column
    kernel too, the H100 the both-axes module's axis-0 kernel; the fold on the transpose), a
    Blackwell GPU ``BLACKWELL``, any
    other GPU (an H800: not measured) the GPU defaults; a device named without an index means
    the current one."""
    from ocpmx.native import tuning as T
    names = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H200", 2: "NVIDIA H100 NVL", 3: "NVIDIA B200",
             4: "NVIDIA H800", 5: "NVIDIA H200 NVL", 6: "NVIDIA GH200 480GB"}
    monkeypatch.setattr(T, "interpreting", lambda: False)
    monkeypatch.setattr(T, "blackwell", lambda d: d.index == 3)
    monkeypatch.setattr(T.torch.cuda, "get_device_name", lambda d: names[d.index])
    T._device_tuning.cache_clear()
    try:
        assert T.default_tuning("cuda:0") is T.H100
        assert T.default_tuning("cuda:1") is T.H200
        assert T.default_tuning("cuda:2") is T.H100
        assert T.default_tuning("cuda:3") is T.BLACKWELL
        assert T.default_tuning("cuda:4") is T.GPU
        assert T.default_tuning("cuda:5") is T.H200
        assert T.default_tuning("cuda:6") is T.GPU  # (GH200: not measured)
        assert T.default_tuning() is T.GPU
        # "cuda" without an index: the current device's, resolved on every call (cached per
        # index, so a later set_device is followed)
        for current, want in ((2, T.H100), (1, T.H200), (4, T.GPU), (0, T.H100)):
            monkeypatch.setattr(T.torch.cuda, "current_device", lambda c=current: c)
            assert T.default_tuning("cuda") is want
            assert T.default_tuning(T.torch.device("cuda")) is want
    finally:
        T._device_tuning.cache_clear()


def test_column_tile_register_cap_applies_on_hopper_only():
    """A column tile's ``maxnreg`` reaches the launch options on Hopper, never elsewhere (other
    chips and the interpreter take no such option) and never for a fold (as the row kernel's
    cap: a fold's extra state spills under it); None adds nothing."""
    from ocpmx.native import launch, ops
    n = ops.numerics("e2m1", "even", "rne", None)
    capped, plain = native.ColumnTile(128, 2, vec=2, maxnreg=128), native.ColumnTile(128, 2, vec=2)
    args = (n, torch.bfloat16, 256, 512, 256 * 512)
    assert launch.cols32_constexprs(*args, capped, False, on_hopper=True)[0]["maxnreg"] == 128
    assert "maxnreg" not in launch.cols32_constexprs(*args, capped, False)[0]
    assert "maxnreg" not in launch.cols32_constexprs(*args, plain, False, on_hopper=True)[0]
    t = torch.zeros(1, dtype=torch.int32)
    fold = launch.FoldOutput(group=4, exponents=t, pow2=None, stats=t, total=t, rows=1,
                             d_max=14, hw_cvt=False)
    consts = launch.cols32_constexprs(*args, capped, False, fold, on_hopper=True)[0]
    assert consts["FOLD_GROUP"] == 4 and "maxnreg" not in consts


def test_row_fold_of_a_large_group_keeps_the_tiles_blocks_per_warp(monkeypatch):
    """A fold group larger than the row tile (whole rows folded in the row kernel's pass: up
    to ``fold.FUSED_ROW_FOLD_MAX_GROUP`` blocks by default, 512 timed) gets a program of one
    group on the tile's warps times group / blocks (``launch.fold_tile``: measured 4 warps
    for 128 blocks against the 32-block tile's one), no register cap, at most
    ``FOLD_MAX_WARPS``; a whole row of another length a program per
    row padded to the next power of two (ROW_NB, never EVEN; the grid advances a row); groups
    the tile holds keep the tile; quantize without a fold, the tile and its cap."""
    from ocpmx.native import launch, ops
    n = ops.numerics("e2m1", "floor", "rne", "hadamard16")
    t = torch.zeros(1, dtype=torch.int32)
    tuning = dataclasses.replace(native.default_tuning(), rows32=native.RowTile(32, 1, 72))
    for group, nb, warps, row in ((4, 32, 1, 0), (32, 32, 1, 0), (64, 64, 2, 0),
                                  (128, 128, 4, 0), (24, 32, 1, 24), (448, 512, 16, 448),
                                  (7, 8, 1, 7)):
        fold = launch.FoldOutput(group=group, exponents=t, pow2=None, stats=t, total=t,
                                 rows=1, d_max=14, hw_cvt=False)
        consts, got = launch.rows32_constexprs(n, torch.bfloat16, group << 10, tuning, False,
                                               torch.device("cpu"), fold)
        assert (got, consts["NB"], consts["num_warps"]) == (row or nb, nb, warps), group
        assert consts["ROW_NB"] == row and consts["EVEN"] == (row == 0), group
        assert consts["FOLD_GROUP"] == group and "maxnreg" not in consts
    wide = dataclasses.replace(tuning, rows32=native.RowTile(32, 2))
    assert launch.fold_tile(wide.rows32, 128) == native.RowTile(128, 8)
    assert launch.fold_tile(native.RowTile(8, 1), 512) == native.RowTile(512, 16)  # (the cap)
    monkeypatch.setattr(launch, "hopper", lambda device: True)
    consts, nb = launch.rows32_constexprs(n, torch.bfloat16, 1 << 12, tuning, False,
                                          torch.device("cpu"))
    assert (nb, consts["num_warps"], consts["maxnreg"]) == (32, 1, 72)


def test_column_launch_passes_the_register_cap(monkeypatch):
    """The launch wiring of the cap: a quantize along axis 0 through a capped column tile
    launches the column kernel with ``maxnreg`` where ``launch.hopper`` says Hopper (patched
    here; the launch itself recorded, not run), and without it for a fold or elsewhere."""
    import dataclasses
    from ocpmx.native import fold as native_fold
    from ocpmx.native import launch
    tile = native.ColumnTile(64, 2, vec=2, maxnreg=128)
    tuning = dataclasses.replace(native.default_tuning(), columns="kernel", cols32=tile)
    launches = []
    monkeypatch.setattr(launch, "run",
                        lambda kernel, grid, *a, **kw: launches.append((kernel, kw)))
    x = torch.zeros(64, 48, dtype=torch.bfloat16, device=devices()[0])
    for on_hopper in (True, False):
        monkeypatch.setattr(launch, "hopper", lambda device, h=on_hopper: h)
        launches.clear()
        native.quantize(x, "e2m1", axis=0, tuning=tuning)
        native_fold.quantize_folded(x, "e2m1", 2, axis=0, tuning=tuning)
        cols = [kw for k, kw in launches if k is launch.kernels.quantize.quantize_cols32_kernel]
        assert len(cols) == 2, launches  # the quantize and the fold, both one column pass
        assert cols[0].get("maxnreg") == (128 if on_hopper else None), cols[0]
        assert cols[1]["FOLD_GROUP"] == 2 and "maxnreg" not in cols[1]


def test_column_tile_vec_is_checked():
    """A column tile's ``vec`` (columns per thread's load) must be a power of two dividing its
    columns: anything else is named, not launched."""
    assert native.ColumnTile(64, 2, vec=4).vec == 4
    for bad in (dict(columns=64, vec=3), dict(columns=2, vec=4), dict(columns=64, vec=0)):
        with pytest.raises(ValueError, match="vec must be a power of two dividing columns"):
            native.ColumnTile(warps=1, **bad)


@pytest.mark.parametrize("device", devices())
def test_bf16_values_carry_the_same_nan_bits_on_every_backend(device):
    """bf16 values of a NaN block (``dequantize(.., torch.bfloat16)``, ``quantize_dequantize``)
    are the same bits on the emulator backend as from the kernels (0x7FC0: torch's CPU cast
    writes 0xFFFF, which the emulator path replaces)."""
    x = torch.randn(4, 64)
    x[1, 40] = float("nan")
    x[2, 3] = float("inf")
    for fmt in ("e2m1", "e4m3"):
        want = native.dequantize(native.quantize(x.to(device), fmt), torch.bfloat16)
        got = native.dequantize(native.quantize(x, fmt, backend="emulator"), torch.bfloat16,
                                backend="emulator")
        assert np.array_equal(bf16_bits(got), bf16_bits(want)), fmt
        assert (bf16_bits(got)[1, 32:] == 0x7FC0).all()
        assert np.array_equal(bf16_bits(native.quantize_dequantize(x, fmt, backend="emulator")),
                              bf16_bits(native.quantize_dequantize(x.to(device), fmt))), fmt


@pytest.mark.parametrize("device", devices())
def test_bf16_blocks_along_a_leading_axis_with_size_one_axes_after(device):
    """bf16 with blocks along axis 0 of (64, 1), or axis 1 of (2, 64, 1): the row kernel reads
    the tensor flat (its last axis of 1 cannot be viewed as 4-byte pairs; that raised before):
    quantize and quantize-dequantize with the emulator's bits, through the column path's
    default and through the transpose."""
    import dataclasses
    x = torch.randn(2, 64, 1, dtype=torch.bfloat16) * 3
    for t, axis in ((x[0], 0), (x, 1)):
        ref = emulator.quantize(t.float().numpy(), "e2m1", axis=axis, scale_rule="even")
        want = torch.from_numpy(emulator.dequantize(ref)).to(torch.bfloat16)
        base = native.default_tuning(torch.device(device))
        for tuning in (None, dataclasses.replace(base, columns="transpose",
                                                 columns_qdq="transpose")):
            td = t.to(device)
            assert_same(native.quantize(td, "e2m1", axis=axis, scale_rule="even",
                                        tuning=tuning), ref)
            got = native.quantize_dequantize(td, "e2m1", axis=axis, scale_rule="even",
                                             tuning=tuning)
            assert got.shape == t.shape
            assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("axis, tile", [
    (-1, None),  # the row kernel, its last program cut short
    (0, native.ColumnTile(16, 1, 2, True, True, 2, None, False, False, True, True)),  # joint
    # joint quarters (a scale word per column), one column and a column pair a thread
    (0, native.ColumnTile(16, 1, 2, True, True, 1, serial=True, joint=True, quarters=True)),
    (0, native.ColumnTile(16, 1, 2, True, True, 1, split=True, serial=True, joint=True,
                          quarters=True)),
    (0, native.ColumnTile(16, 1, 2))])  # two blocks at once
def test_masked_blocks_store_nothing_past_the_outputs(device, axis, tile):
    """The 32-block kernels' stores where the grid does not tile the tensor (``store_blocks``
    and the joint tile's stores): the blocks that do not exist write nothing. The outputs are
    the heads of larger buffers filled with a sentinel, whose tails must stay as they were;
    the heads hold the emulator's codes and scales."""
    from ocpmx.native import launch, ops
    n = ops.numerics("e2m1", "even", "rne", None)
    rows, k = 40, 64  # 40 K-major rows of 2 blocks: no tile divides them
    x = torch.randn((rows, k) if axis == -1 else (k, rows)).bfloat16().to(device)
    tuning = native.default_tuning(x.device)
    if tile is not None:
        tuning = dataclasses.replace(tuning, columns="kernel", cols32=tile,
                                     cols32_unrotated=None)
    data_buf = torch.full((rows * k // 2 + 4096,), 0xA5, dtype=torch.uint8, device=device)
    scale_buf = torch.full((rows * k // 32 + 4096,), 0x5A, dtype=torch.uint8, device=device)
    data = data_buf[:rows * k // 2].view(rows, k // 2)
    scales = scale_buf[:rows * k // 32].view(rows, k // 32)
    launch.rows32(x, axis % 2, rows if axis == 0 else 1, data, scales, rows * k // 32, n, 0,
                  tuning)
    assert (data_buf[rows * k // 2:] == 0xA5).all() and (scale_buf[rows * k // 32:] == 0x5A).all()
    want = native.quantize(x.cpu(), "e2m1", axis=axis, scale_rule="even", backend="emulator")
    assert torch.equal(data.cpu(), want.data) and torch.equal(scales.cpu(), want.scales_kmajor)
