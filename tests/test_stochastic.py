"""Stochastic rounding: exact bits from Philox, reproducibility, unbiasedness."""
import numpy as np
from reference import philox_ref, quantize_block, sr_bits_ref

from ocpmx.emulator import decode_table, dequantize, quantize, random_bits


def test_philox_known_answers():
    # Random123 known-answer vectors for philox4x32_10
    assert philox_ref(0, [0, 0, 0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert philox_ref(0xFFFFFFFFFFFFFFFF, [0xFFFFFFFF] * 4) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert philox_ref(0x299F31D0A4093822, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]) == \
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_numba_philox_matches_reference():
    offs = np.array([0, 1, 2, 31, 2**32 - 1, 2**32, 2**40 + 7], dtype=np.uint64)
    for seed in (0, 1, 2**32 + 5, 0xDEADBEEFCAFE):
        got = random_bits(seed, offs)
        want = [philox_ref(seed, [int(o) & 0xFFFFFFFF, int(o) >> 32, 0, 0])[0] for o in offs]
        assert list(got) == want


def test_philox_one_thread_and_thread_pool_give_the_same_words():
    """Short draws (random signs) run on one thread, long ones on Numba's pool: the words must
    not depend on which, on either side of the threshold (checked against the reference)."""
    from ocpmx.emulator import philox
    n = philox.SERIAL_BELOW
    seed = 0x1234_5678_9ABC
    long = random_bits(seed, np.arange(n + 3))  # the pool
    short = np.concatenate([random_bits(seed, np.arange(i, min(i + 1000, n + 3)))
                            for i in range(0, n + 3, 1000)])  # one thread each
    assert np.array_equal(long, short)
    for o in (0, n - 1, n, n + 2):
        assert int(long[o]) == philox_ref(seed, [o, 0, 0, 0])[0]


def test_sr_random_bits_definition():
    """The 8 random bits per element (16 elements per Philox call), three ways: the spec's plain
    Python definition, the emulator's Numba version, and the test reference."""
    from ocpmx.emulator.philox import stochastic_bits
    from ocpmx.spec.philox import stochastic_bits as definition
    for seed in (0, 1234, 2**63 + 5):
        for i in (0, 1, 2, 3, 4, 7, 8, 9, 12, 15, 16, 17, 31, 2**32 * 16 + 3, 2**40 + 11):
            want = sr_bits_ref(seed, i)
            assert definition(seed, i) == want
            assert int(stochastic_bits(np.uint64(seed), np.uint64(i))) == want


def test_sr_bits_match_reference():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 64)) * 3).astype(np.float32)
    for name in ("e2m1", "e4m3", "int8"):
        mx = quantize(x, name, rounding="stochastic", seed=1234)
        bits = np.array([sr_bits_ref(1234, i) for i in range(x.size)]).reshape(x.shape)
        for r in range(3):
            for b in range(2):
                sl = slice(32 * b, 32 * b + 32)
                sc, codes = quantize_block([float(v) for v in x[r, sl]], name, "floor",
                                           rbits=[int(v) for v in bits[r, sl]])
                assert mx.scales[r, b] == sc and list(mx.codes[r, sl]) == codes


def test_sr_counter_is_the_index_in_the_kmajor_layout():
    """Elements are counted in the K-major layout (the quantized axis last), so quantizing a
    tensor along axis 0 draws the same bits as quantizing its transpose along axis 1, whatever
    the memory layout; and the bits are those of the reference at the K-major index."""
    x = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    a = quantize(x, "e2m1", axis=0, rounding="stochastic", seed=7)
    b = quantize(np.ascontiguousarray(x.T), "e2m1", axis=1, rounding="stochastic", seed=7)
    assert np.array_equal(a.codes, b.codes.T) and np.array_equal(a.scales, b.scales.T)
    col = 5  # K-major row 5: column 5 of x, 64 elements in two blocks
    bits = [sr_bits_ref(7, col * 64 + t) for t in range(64)]
    for blk in range(2):
        sl = slice(32 * blk, 32 * blk + 32)
        sc, codes = quantize_block([float(v) for v in x[sl, col]], "e2m1", "floor",
                                   rbits=bits[sl])
        assert a.scales[blk, col] == sc and list(a.codes[sl, col]) == codes
    # reproducible, and the seed matters
    assert np.array_equal(a.codes, quantize(x, "e2m1", axis=0, rounding="stochastic", seed=7).codes)
    assert not np.array_equal(a.codes, quantize(x, "e2m1", axis=0, rounding="stochastic", seed=8).codes)


def test_sr_is_unbiased():
    table = decode_table(__import__("ocpmx").spec.FORMATS["e2m1"])
    x = np.full((4096, 32), 2.5, np.float32)
    x[:, 0] = 6.0  # fixes the scale at 2^0
    x[:, 1] = 0.3
    y = dequantize(quantize(x, "e2m1", rounding="stochastic", seed=3))
    assert set(np.unique(y[:, 2:])) == {2.0, 3.0}
    assert abs(y[:, 2:].mean() - 2.5) < 0.01
    assert abs(y[:, 1].mean() - 0.3) < 0.02
    assert table[1] == 0.5
    # values on the grid are never moved
    assert np.all(y[:, 0] == 6.0)
