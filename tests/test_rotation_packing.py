"""Hadamard rotations (exact float32 butterfly) and FP4 / FP6 packing."""
import numpy as np
import pytest

from ocpmx.emulator import Rotation, pack, quantize, rotate, unpack


def butterfly_reference(v, rot):
    """Scalar float32 reference of the documented order: signs, stages h=1,2,..., scale."""
    v = [np.float32(a) * s for a, s in zip(v, rot.signs())]
    h = 1
    while h < rot.size:
        for i in range(0, rot.size, 2 * h):
            for j in range(i, i + h):
                a, b = v[j], v[j + h]
                v[j], v[j + h] = np.float32(a + b), np.float32(a - b)
        h *= 2
    return np.array([np.float32(a * rot.scale) for a in v], np.float32)


@pytest.mark.parametrize("rot", [Rotation(16), Rotation(32), Rotation(16, 5), Rotation(32, 9)])
def test_rotation_bit_exact_and_orthonormal(rot):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((8, 64)) * np.exp(rng.normal(0, 3, (8, 1)))).astype(np.float32)
    y = rotate(x, rot)
    for r in range(8):
        for g in range(64 // rot.size):
            seg = slice(g * rot.size, (g + 1) * rot.size)
            assert np.array_equal(y[r, seg], butterfly_reference(x[r, seg], rot))
    m = rot.matrix()
    assert np.allclose(m @ m.T, np.eye(rot.size), atol=1e-7)
    ref = (x.astype(np.float64).reshape(8, -1, rot.size) @ m.T).reshape(8, 64)
    assert np.max(np.abs(y - ref)) < 1e-5 * np.max(np.abs(x))


def test_rotation_nan_is_positive_quiet():
    """Step 4 of the documented order: NaN out of a rotation is +qNaN whatever its source (a
    negative NaN input, Inf - Inf, which x86 makes negative); Inf keeps its sign."""
    x = np.zeros((3, 16), np.float32)
    x[0, 2] = -np.nan
    x[1, 0], x[1, 1] = np.inf, np.inf  # stage 1: Inf + Inf, Inf - Inf
    x[2, 1] = -np.inf  # column 1 of H16 alternates: -Inf, +Inf, ...
    y = rotate(x, "hadamard16")
    bits = y.view(np.uint32)
    assert np.all(bits[0] == 0x7FC00000)
    assert np.isnan(y[1]).sum() == 8 and np.all(bits[1][np.isnan(y[1])] == 0x7FC00000)
    assert set(bits[2].tolist()) == {0x7F800000, 0xFF800000}
    assert quantize(x, "e4m3", block_size=16, rotation="hadamard16").codes[0, 0] == 0x7F


def test_hadamard16_matrix_is_sylvester():
    m = Rotation(16).matrix() * 4
    assert np.array_equal(m[0], np.ones(16)) and np.array_equal(m[1], np.tile([1, -1], 8))
    assert np.array_equal(np.abs(m), np.ones((16, 16)))


def test_random_signs_from_seed():
    a, b = Rotation(16, 1).signs(), Rotation(16, 2).signs()
    assert not np.array_equal(a, b) and set(np.unique(a)) <= {-1.0, 1.0}
    assert np.array_equal(a, Rotation(16, 1).signs())


def test_rotation_along_axis_and_in_quantize():
    x = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    y0 = rotate(x, "hadamard16", axis=0)
    assert np.array_equal(y0, rotate(x.T.copy(), "hadamard16").T)
    mx = quantize(x, "e2m1", axis=0, rotation="hadamard16")
    ref = quantize(y0, "e2m1", axis=0)
    assert np.array_equal(mx.codes, ref.codes) and np.array_equal(mx.scales, ref.scales)
    with pytest.raises(ValueError, match="unknown rotation"):
        quantize(x, "e2m1", rotation="hadamard8")
    with pytest.raises(ValueError, match="not a multiple of the rotation size"):
        quantize(x, "e2m1", block_size=8, rotation="hadamard16")


def test_fp4_nibble_order():
    codes = np.array([[0x1, 0x2, 0xF, 0x0]], np.uint8)
    assert list(pack(codes, "e2m1")[0]) == [0x21, 0x0F]  # element 0 in the low nibble
    assert np.array_equal(unpack(pack(codes, "e2m1"), "e2m1"), codes)


def test_fp6_layout_by_hand():
    codes = np.array([[0b000001, 0b000010, 0b000011, 0b111111]], np.uint8)
    word = 1 | (2 << 6) | (3 << 12) | (63 << 18)
    assert list(pack(codes, "e3m2")[0]) == [word & 0xFF, (word >> 8) & 0xFF, word >> 16]
    assert np.array_equal(unpack(pack(codes, "e3m2"), "e3m2"), codes)


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2", "e4m3", "int8"])
def test_pack_roundtrip_and_mxarray_pack(name):
    x = np.random.default_rng(2).standard_normal((64, 96)).astype(np.float32)
    for axis in (0, 1):
        mx = quantize(x, name, axis=axis)
        p = mx.pack()
        per = {4: 0.5, 6: 0.75, 8: 1.0}[mx.fmt.bits]
        assert p.shape[axis] == int(x.shape[axis] * per)
        back = np.moveaxis(unpack(np.moveaxis(p, axis, -1), name), -1, axis)
        assert np.array_equal(back, mx.codes)


def test_pack_errors():
    with pytest.raises(ValueError, match="does not fit in 4 bits"):
        pack(np.array([16, 0], np.uint8), "e2m1")
    with pytest.raises(ValueError, match="not a multiple"):
        pack(np.zeros(6, np.uint8), "e3m2")
    with pytest.raises(TypeError, match="uint8"):
        pack(np.zeros(4, np.int32), "e2m1")
