"""Folding FP4/FP6 MX operands into E4M3 with group scales (emulator.fold): the exact range from
the tables, the round trip on every code under every scale, out-of-range blocks counted, and the
folded GEMM against the emulator's own accumulation models."""
from pathlib import Path

import numpy as np
import pytest

from ocpmx import emulator
from ocpmx.emulator.fold import (NAN_EXPONENT, Folded, fold, folded_matmul, hopper_dot32,
                                 shift_range, unfold)
from ocpmx.spec import FORMATS, get_format


def test_shift_ranges_worked_out_by_hand():
    # E2M1: 6 * 2^6 = 384 <= 448 (E4M3's max), 6 * 2^7 = 768 is not E4M3; 0.5 * 2^-8 = 2^-9 is
    # E4M3's smallest subnormal, 0.5 * 2^-9 is not. E2M3 (max 7.5 = 15/2, quantum 1/8):
    # 7.5 * 2^5 = 240, 1/8 * 2^-6 = 2^-9. E3M2 (max 28, quantum 1/16): 28 * 2^4 = 448,
    # 1/16 * 2^-5 = 2^-9.
    assert shift_range(get_format("e2m1")) == (-8, 6)
    assert shift_range(get_format("e2m3")) == (-6, 5)
    assert shift_range(get_format("e3m2")) == (-5, 4)


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
def test_every_code_under_every_scale_round_trips(name):
    f = FORMATS[name]
    n = f.num_codes
    codes = np.tile(np.arange(32) % n, (256, 1)).astype(np.uint8)  # every code in every row
    scales = np.arange(256, dtype=np.uint8)[:, None]  # one block per row: every scale code
    mx = emulator.MXArray(codes, scales, f, 1)
    folded = fold(mx)
    assert folded.inexact == 0
    back = unfold(folded)
    finite = scales[:, 0] != 0xFF
    assert np.array_equal(back.codes[finite], codes[finite])
    assert np.array_equal(back.scales, scales)
    # the folded values are the MX values, in true units (float64: the largest scales pass
    # float32's range; a NaN scale gives NaN)
    want = emulator.decode_table(f)[codes] * np.where(
        finite, np.exp2(scales[:, 0].astype(np.float64) - 127), np.nan)[:, None]
    got = folded.values()
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    assert same.all()


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
def test_spread_of_block_exponents(name):
    """Two blocks of one group whose scales differ by `spread` octaves: exact up to
    d_max - d_min, then the smaller block's smallest elements round (counted)."""
    f = FORMATS[name]
    d_min, d_max = shift_range(f)
    codes = np.tile(np.arange(1, 33) % f.max_code + 1, (1, 2)).astype(np.uint8)  # nonzero
    for spread in range(0, 24):
        scales = np.array([[127, 127 - spread]], np.uint8)
        folded = fold(emulator.MXArray(codes, scales, f, 1))
        if spread <= d_max - d_min:
            assert folded.inexact == 0, spread
            assert np.array_equal(unfold(folded).codes, codes)
        else:
            assert folded.inexact > 0, spread
        assert folded.exponents[0, 0] == 0 - d_max  # the larger block sets R


def test_groups_nan_and_zero_blocks():
    f = FORMATS["e2m1"]
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (3, 256), dtype=np.uint8)
    codes[1, 32:64] = 0  # an all-zero block with an extreme scale does not set R
    scales = rng.integers(120, 134, (3, 8), dtype=np.uint8)
    scales[1, 1] = 254
    scales[2, 3] = 0xFF  # a NaN block: zero codes, its group's exponent marked
    folded = fold(emulator.MXArray(codes, scales, f, 1), group=4)
    assert folded.exponents.shape == (3, 2) and folded.inexact == 0
    assert (folded.codes[2, 96:128] == 0).all() and folded.exponents[2, 0] == NAN_EXPONENT
    assert np.isnan(folded.values()[2, :128]).all() and not np.isnan(folded.values()[2, 128:]).any()
    back = unfold(folded)
    assert np.array_equal(back.codes[2, 128:], codes[2, 128:])
    assert np.array_equal(back.codes[2, :96], codes[2, :96])
    assert folded.exponents[1, 0] == int(max(scales[1, [0, 2, 3]])) - 127 - 6
    with pytest.raises(ValueError, match="does not divide"):
        fold(emulator.MXArray(codes, scales, f, 1), group=3)
    with pytest.raises(ValueError, match="only FP4/FP6"):
        fold(emulator.quantize(rng.standard_normal((2, 64)).astype(np.float32), "e4m3"))


def test_folded_gemm_is_the_fp32_sequential_model():
    """Row-folded, promoted every block: the emulator's fp32_sequential model (an independent
    implementation) on ordinary data; group folding: the per-group formula."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((24, 512)) * np.exp(rng.normal(0, 2, (24, 1)))).astype(np.float32)
    w = (rng.standard_normal((16, 512)) * np.exp(rng.normal(0, 2, (1, 512)))).astype(np.float32)
    a, b = emulator.quantize(x, "e2m1"), emulator.quantize(w, "e2m1")
    fa, fb = fold(a), fold(b)
    assert fa.inexact == 0 and fb.inexact == 0
    got = folded_matmul(fa, fb)
    want = emulator.mx_matmul(a, b, "fp32_sequential")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # groups of 4 blocks: each group's partial sums in float32, then scaled and accumulated
    ga, gb = fold(a, group=4), fold(b, group=4)
    got4 = folded_matmul(ga, gb)
    vals_a, vals_b = ga.values(), gb.values()
    ref = np.zeros((24, 16), np.float32)
    for g0 in range(0, 512, 128):
        t = np.zeros((24, 16), np.float32)
        for k0 in range(g0, g0 + 128, 32):
            sa = np.exp2(-np.repeat(ga.exponents[:, g0 // 128:g0 // 128 + 1], 1, axis=1))
            sb = np.exp2(-np.repeat(gb.exponents[:, g0 // 128:g0 // 128 + 1], 1, axis=1))
            pa = vals_a[:, k0:k0 + 32] * sa
            pb = vals_b[:, k0:k0 + 32] * sb
            t = (t + (pa @ pb.T).astype(np.float32)).astype(np.float32)
        r = np.exp2(ga.exponents[:, g0 // 128][:, None] + gb.exponents[:, g0 // 128][None, :]
                    .astype(np.float64))
        ref = (ref + (t.astype(np.float64) * r).astype(np.float32)).astype(np.float32)
    assert np.array_equal(got4.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
def test_native_fold_of_every_code_at_every_shift(device, name):
    """The fold kernel against the emulator's fold on every code at every shift from the
    format's largest down to 40 octaves below its group's largest block (exact, then rounded
    to nearest even E4M3, then zero: the GPU encodes with its conversion instruction, the
    interpreter with ``encode``), with each row's rounded-element count; scales 2^-127 to
    2^127 for the group's reference block, and a NaN block."""
    pytest.importorskip("torch")
    from ocpmx.conformance.backends import TritonBackend
    from ocpmx.native import fold as native_fold
    f = FORMATS[name]
    every = np.arange(32) % f.num_codes
    codes, scales = [], []
    for ref in (1, 60, 127, 200, 254):
        for spread in range(41):
            codes.append(np.r_[np.full(32, f.max_code), every])
            scales.append([ref, max(ref - spread, 0)])
    codes.append(np.r_[every, every])
    scales.append([255, 127])
    codes, scales = np.array(codes, np.uint8), np.array(scales, np.uint8)
    mx = TritonBackend(device)._mx(codes, scales, name, 1, 32)
    want = fold(emulator.MXArray(codes, scales, f, 1), 2)
    got = native_fold.fold(mx, 2)
    assert np.array_equal(got.codes.cpu().numpy(), want.codes)
    assert np.array_equal(got.exponents.cpu().numpy(), want.exponents)
    assert int(got.inexact.item()) == want.inexact > 0


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
def test_native_fold_and_folded_gemm_are_the_emulators(device, name):
    """The Triton fold kernel and the folded FP8 GEMM, bit for bit against the emulator: group
    sizes 1, 4 and a whole row, a block far below its group (rounded), a NaN block, a zero
    block, bf16 output."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((24, 512)) * np.exp(rng.normal(0, 2, (24, 1)))).astype(np.float32)
    w = (rng.standard_normal((40, 512)) * np.exp(rng.normal(0, 3, (1, 512)))).astype(np.float32)
    x[3, :32] *= 2.0**-30
    x[5, 64:96] = 0.0
    w[7, 200] = np.nan
    qa = native.quantize(torch.from_numpy(x).to(device), name)
    qb = native.quantize(torch.from_numpy(w).to(device), name)
    for group in (1, 4, 16):
        before = int(native_fold.inexact_total(device).item())
        fa, fb = native_fold.fold(qa, group), native_fold.fold(qb, group)
        ea, eb = fold(qa.to_emulator(), group), fold(qb.to_emulator(), group)
        assert int(native_fold.inexact_total(device).item()) - before == ea.inexact + eb.inexact
        assert np.array_equal(fa.codes.cpu().numpy(), ea.codes)
        assert np.array_equal(fa.exponents.cpu().numpy(), ea.exponents)
        assert np.array_equal(fb.codes.cpu().numpy(), eb.codes)
        # the rounded elements, counted as the emulator counts them (x's block 30 octaves
        # below its group), and added to the device's running total
        assert int(fa.inexact.item()) == ea.inexact and int(fb.inexact.item()) == eb.inexact
        assert ea.inexact > 0 or group == 1
        dot = native_fold.dot_model(device)
        if dot is None:
            continue  # a GPU whose FP8 dot is not measured: the fold's bits are checked above
        want = folded_matmul(ea, eb, dot)
        got = native_fold.folded_matmul(fa, fb).cpu().numpy()
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (group, int((~same).sum()))
        # the group's dots chained in the tensor core (promote=False): on Hopper the chained
        # dot of emulator.fold.hopper_dot32 (C inside the alignment)
        want_c = folded_matmul(ea, eb, dot, promote=32 * group)
        got_c = native_fold.folded_matmul(fa, fb, promote=False).cpu().numpy()
        same = (got_c.view(np.uint32) == want_c.view(np.uint32)) | \
            (np.isnan(got_c) & np.isnan(want_c))
        assert same.all(), ("chained", group, int((~same).sum()))
        if device != "cpu":  # the autotuned tile of the launch that computed, reported
            cfg = native_fold.tuned_tile(False, 24, 40, 512, group)
            assert (cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.num_warps,
                    cfg.num_stages) in native_fold.FOLD_CONFIGS[False]
            # repeated calls launch the chosen tile straight (``fold.tuned_launch``, through
            # the fast launch's compiled kernels), with the first calls' bits, NaNs included
            from ocpmx.native import fastlaunch
            launched = fastlaunch.STATS.fast + fastlaunch.STATS.first
            for promote, before_bits in ((True, got), (False, got_c)):
                again = native_fold.folded_matmul(fa, fb, promote=promote).cpu().numpy()
                assert np.array_equal(again.view(np.uint32), before_bits.view(np.uint32)), \
                    promote
            # (two launches a GEMM; each the first of its specialization through the fast
            # launch, so counted as ``first`` not ``fast``, but not through the autotuner)
            assert fastlaunch.STATS.fast + fastlaunch.STATS.first >= launched + 4
        got16 = native_fold.folded_matmul(fa, fb, torch.bfloat16).float().cpu().numpy()
        want16 = torch.from_numpy(want).bfloat16().float().numpy()
        assert np.array_equal(np.isnan(got16), np.isnan(want16))
        assert np.array_equal(got16[~np.isnan(got16)], want16[~np.isnan(want16)])
    assert fold(qa.to_emulator(), 4).inexact > 0  # the far block was rounded, and counted


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_longer_dots_load_the_same_tiles(device):
    """k_per_dot 64 and 128 (a GPU runs 128 for groups of 4) against 32: on a GPU Triton splits
    the longer dot into K = 32 wgmmas promoted one by one, the same sums; under the interpreter
    one float32 dot, exact here (E2M1: every partial sum fits 24 bits). Bit for bit against the
    emulator; a k_per_dot not dividing the group is refused; fixed tiles give the same bits."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(5)
    qa = native.quantize(torch.from_numpy(rng.standard_normal((40, 512)).astype(np.float32))
                         .to(device), "e2m1", scale_rule="even")
    qb = native.quantize(torch.from_numpy(rng.standard_normal((24, 512)).astype(np.float32))
                         .to(device), "e2m1", scale_rule="even")
    fa, fb = native_fold.fold(qa, 4), native_fold.fold(qb, 4)
    want = folded_matmul(fold(qa.to_emulator(), 4), fold(qb.to_emulator(), 4))
    for kt in (32, 64, 128):
        got = native_fold.folded_matmul(fa, fb, k_per_dot=kt).cpu().numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), kt
    with pytest.raises(ValueError, match="k_per_dot 96"):
        native_fold.folded_matmul(fa, fb, k_per_dot=96)
    # a fixed tile instead of the autotuned one (the tile sweep's path): the same bits
    for tile in ((16, 64, 4, 1), (64, 16, 4, 1)):
        got = native_fold.folded_matmul(fa, fb, tile=tile).cpu().numpy()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), tile


def _rows_at_exponents(rng, p, k=256):
    """Rows whose every 32-block peaks at 1.5 * 2^p[i] (E2M1, FLOOR scales: scale exponent
    p - 2, group exponent R = p - 8), the rest normal values well below that peak."""
    x = (rng.standard_normal((len(p), k)) * np.exp2(np.asarray(p, float) - 3)[:, None])
    x[:, ::32] = 1.5 * np.exp2(np.asarray(p, float))[:, None]
    return x.astype(np.float32)


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_rank1_epilogue_to_its_bound_and_the_wide_flag(device):
    """The folded GEMM's two epilogues (``kernels.fold.RANK1_EXP``): operands whose group
    exponents reach exactly +-RANK1_EXP take the per-row-times-per-column one (the dot times
    up to 2^(2 RANK1_EXP) and down to 2^(-2 RANK1_EXP)), one row past the bound makes its
    operand ``wide`` and the GEMM take the general one. Both are the emulator's bits, and the
    outputs the two operands share are the same bits under either epilogue. ``wide`` is
    checked against the exponents themselves."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    from ocpmx.native.kernels import fold as kfold
    bound = int(kfold.RANK1_EXP.value)
    rng = np.random.default_rng(11)
    pa = np.r_[bound + 8, -bound + 8, rng.integers(-bound + 8, bound + 9, 30)]  # R = p - 8
    pb = np.r_[bound + 8, -bound + 8, rng.integers(-bound + 8, bound + 9, 14)]
    xa, xb = _rows_at_exponents(rng, pa), _rows_at_exponents(rng, pb)
    xb_wide = np.concatenate([xb, _rows_at_exponents(rng, [bound + 9])])  # R = bound + 1
    got, want = {}, {}
    for name, xbb in (("rank1", xb), ("wide", xb_wide)):
        qa = native.quantize(torch.from_numpy(xa).to(device), "e2m1")
        qb = native.quantize(torch.from_numpy(xbb).to(device), "e2m1")
        fa, fb = native_fold.fold(qa, 4), native_fold.fold(qb, 4)
        ea, eb = fold(qa.to_emulator(), 4), fold(qb.to_emulator(), 4)
        for f, e in ((fa, ea), (fb, eb)):
            beyond = (e.exponents == NAN_EXPONENT) | (np.abs(e.exponents) > bound)
            assert int(f.wide.item()) == int(beyond.any())
        assert np.abs(ea.exponents).max() == bound and ea.exponents.min() == -bound
        assert int(fb.wide.item()) == (name == "wide")
        want[name] = folded_matmul(ea, eb)
        got[name] = native_fold.folded_matmul(fa, fb).cpu().numpy()
        assert np.array_equal(got[name].view(np.uint32), want[name].view(np.uint32)), name
    w = np.abs(want["rank1"][want["rank1"] != 0])
    # the epilogue's products at both ends
    assert w.max() > 2.0**(2 * bound + 10) and w.min() < 2.0**(25 - 2 * bound)
    shared = got["wide"][:, :len(pb)]
    assert np.array_equal(shared.view(np.uint32), got["rank1"].view(np.uint32))


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_folded_operand_with_a_nan_block_is_wide(device):
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    x = np.random.default_rng(12).standard_normal((4, 256)).astype(np.float32)
    q = native.quantize(torch.from_numpy(x).to(device), "e2m1")
    assert int(native_fold.fold(q, 4).wide.item()) == 0
    q.scales.view(-1)[5] = 0xFF  # a NaN scale
    f = native_fold.fold(q, 4)
    assert int(f.wide.item()) == 1 and (f.exponents == NAN_EXPONENT).sum() == 1


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_group_scales_far_from_one(device):
    """Exponent sums R_a + R_b below float32's normal range (results are float32 subnormals,
    rounded once) beside a row of ordinary magnitude in the same tile: the emulator's bits."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(7)
    x = rng.standard_normal((40, 256)).astype(np.float32) * np.float32(2.0**-80)
    w = rng.standard_normal((24, 256)).astype(np.float32) * np.float32(2.0**-60)
    x[0] = rng.standard_normal(256).astype(np.float32)  # ordinary row: the normal-range sums
    w[0] = rng.standard_normal(256).astype(np.float32)
    qa = native.quantize(torch.from_numpy(x).to(device), "e2m1")
    qb = native.quantize(torch.from_numpy(w).to(device), "e2m1")
    ea, eb = fold(qa.to_emulator(), 4), fold(qb.to_emulator(), 4)
    assert (ea.exponents[1:, None, 0] + eb.exponents[None, 1:, 0] < -126).all()
    want = folded_matmul(ea, eb)
    got = native_fold.folded_matmul(native_fold.fold(qa, 4), native_fold.fold(qb, 4)).cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert (np.abs(want[1:, 1:]) < np.float32(2.0**-126)).mean() > 0.9  # subnormal results
    assert (want[1:, 1:] != 0).mean() > 0.5


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_group_scales_past_float32s_range(device):
    """Exponent sums R_a + R_b above 127 (the kernel's scale takes two float32 multiplies):
    results near float32's largest and overflowing to +-Inf, bit for bit the emulator's."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(8)
    x = rng.standard_normal((36, 128)).astype(np.float32) * np.float32(2.0**80)
    w = rng.standard_normal((20, 128)).astype(np.float32) * np.float32(2.0**34)
    w[1::2] *= np.float32(2.0**30)  # half the columns past the range
    qa = native.quantize(torch.from_numpy(x).to(device), "e2m1")
    qb = native.quantize(torch.from_numpy(w).to(device), "e2m1")
    ea, eb = fold(qa.to_emulator(), 4), fold(qb.to_emulator(), 4)
    assert (ea.exponents[:, None, 0] + eb.exponents[None, :, 0] > 127).mean() > 0.4
    want = folded_matmul(ea, eb)
    got = native_fold.folded_matmul(native_fold.fold(qa, 4), native_fold.fold(qb, 4)).cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isinf(want).mean() > 0.2 and (np.isfinite(want) & (np.abs(want) > 2.0**110)).any()


def test_hopper_dot_reproduces_measured_h100_bits():
    """``folded_matmul(dot="hopper")`` against outputs an H100 computed (rows of three cases of
    benchmarks/fold_probe.py, 2026-11-23, Triton 3.6: tests/data/h100_folded_gemm.npz holds the
    folded operands and the GPU's float32 outputs): bit for bit, where the exact-dot model is
    not (E2M3: 2 outputs, E3M2: most)."""
    data = np.load(Path(__file__).parent / "data" / "h100_folded_gemm.npz")
    differs = {}
    for case in ("e2m1_s2_g32", "e2m3_s0_g1", "e3m2_s2_g4"):
        fmt = FORMATS[case.split("_")[0]]
        group = int(data[f"{case}/group"])
        a = Folded(data[f"{case}/a_codes"], None, data[f"{case}/a_exp"], group, fmt, 0)
        b = Folded(data[f"{case}/b_codes"], None, data[f"{case}/b_exp"], group, fmt, 0)
        got = data[f"{case}/got"]
        hop = folded_matmul(a, b, "hopper")
        assert np.array_equal(hop.view(np.uint32), got.view(np.uint32)), case
        differs[case] = int((folded_matmul(a, b, "exact").view(np.uint32)
                             != got.view(np.uint32)).sum())
    assert differs["e2m1_s2_g32"] == 0 and differs["e2m3_s0_g1"] == 2
    assert differs["e3m2_s2_g4"] > 300


def test_chained_hopper_dots_reproduce_measured_h100_bits():
    """``folded_matmul(dot="hopper", promote=32 group)``, the chained model (each later K = 32
    wgmma aligned together with the running sum C), against outputs an H100 computed with
    ``native.fold.folded_matmul(..., promote=False)`` (12 x 12 outputs of four cases of
    benchmarks/fold_probe.py, 2026-11-23, Triton 3.6: tests/data/h100_folded_gemm_chained.npz):
    bit for bit; the promoted model and the exact sums differ from nearly every output."""
    data = np.load(Path(__file__).parent / "data" / "h100_folded_gemm_chained.npz")
    cases = sorted({k.split("/")[0] for k in data.files})
    assert len(cases) == 4
    for case in cases:
        fmt = FORMATS[case.split("_")[0]]
        group, promote = int(data[f"{case}/group"]), int(data[f"{case}/promote"])
        assert promote == 32 * group
        a = Folded(data[f"{case}/a_codes"], None, data[f"{case}/a_exp"], group, fmt, 0)
        b = Folded(data[f"{case}/b_codes"], None, data[f"{case}/b_exp"], group, fmt, 0)
        got = data[f"{case}/got"].view(np.uint32)
        assert np.array_equal(folded_matmul(a, b, "hopper", promote=promote).view(np.uint32),
                              got), case
        assert (folded_matmul(a, b, "hopper", promote=32).view(np.uint32) != got).mean() > 0.9
        assert (folded_matmul(a, b, "exact", promote=promote).view(np.uint32) != got).mean() > 0.9


def test_hopper_dot_by_hand():
    """The rule on products worked out by hand (E4M3 exponents: 256 = 2^8, 240 = 1.875 * 2^7,
    128 = 2^7, 64 = 2^6, 0.125 = 2^-3)."""
    def dot(pairs):
        a, b = np.zeros(32), np.zeros(32)
        for i, (x, y) in enumerate(pairs):
            a[i], b[i] = x, y
        return hopper_dot32(a, b), a @ b
    # 2^16 beside 2^-6: the grid is 2^(16 - 13), the small product truncates to zero, toward
    # zero whatever its sign (floor would give 65528 for the negative one)
    assert dot([(256, 256), (0.125, 0.125)]) == (65536.0, 65536.015625)
    assert dot([(256, 256), (0.125, -0.125)]) == (65536.0, 65535.984375)
    # E = 14 (grid 2^1): sixteen products 1.265625 each truncate to zero
    assert dot([(240, 240)] + [(1.125, 1.125)] * 16)[0] == 57600.0
    # one exponent (E = 0, grid 2^-13): seventeen products 3.515625 sum exactly (12 bits)
    assert dot([(1.875, 1.875)] * 17)[0] == 17 * 3.515625
    # E = 13, grid 2^0: 8192 + 1 = 8193 keeps its 14 significant bits; 8192 * 2 + 1 = 16385
    # has 15, and the sum is truncated to 14: 16384
    assert dot([(128, 64), (1, 1)])[0] == 8193.0
    assert dot([(128, 64), (128, 64), (1, 1)]) == (16384.0, 16385.0)


def test_chained_hopper_dot_by_hand():
    """The chained dot (the accumulator C in the alignment, the hypothesis of hopper_dot32):
    C = 2^20 sets the grid to 2^7, so a product 1 truncates to zero (promotion would give
    fl32(2^20 + 1) = 1048577); C = 3 (exponent 1) beside 3.515625 (exponent 0): grid 2^-12, all
    exact, 6.515625; a negative C truncates toward zero like a product."""
    def dot(pairs, c):
        a, b = np.zeros(32), np.zeros(32)
        for i, (x, y) in enumerate(pairs):
            a[i], b[i] = x, y
        return float(hopper_dot32(a, b, np.float64(c)))
    assert dot([(1, 1)], 2.0**20) == 2.0**20
    assert dot([(1.875, 1.875)], 3.0) == 6.515625
    # C = -(2^14 + 1): exponent 14, grid 2^1: C truncates to -16384, the product 256 stays
    assert dot([(16, 16)], -(2.0**14 + 1)) == -16384.0 + 256.0
    # C zero takes no part: the zeroed accumulator's rule
    assert dot([(128, 64), (1, 1)], 0.0) == 8193.0
    # Inf or NaN in C passes through
    assert dot([(1, 1)], np.inf) == np.inf and np.isnan(dot([(1, 1)], np.nan))


def test_chained_exact_dots_are_the_promoted_sums():
    """dot="exact" chained (the interpreter's dot: C + the exact block sum, rounded once) gives
    the promoted sums; dot="hopper" chained differs from promoted where C's grid cuts products,
    and chained over spans of 2 blocks (promote 64, the spans added in float32) from both; a
    promote that is not a multiple of 32 is refused."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((16, 256)) * np.exp(rng.normal(0, 2, (16, 8))).repeat(32, 1))
    w = (rng.standard_normal((12, 256)) * np.exp(rng.normal(0, 2, (12, 8))).repeat(32, 1))
    for name in ("e2m1", "e3m2"):
        fa = fold(emulator.quantize(x.astype(np.float32), name), 4)
        fb = fold(emulator.quantize(w.astype(np.float32), name), 4)
        assert np.array_equal(folded_matmul(fa, fb, "exact", promote=128).view(np.uint32),
                              folded_matmul(fa, fb, "exact").view(np.uint32))
    hop_c = folded_matmul(fa, fb, "hopper", promote=128)
    assert (hop_c.view(np.uint32) != folded_matmul(fa, fb, "hopper").view(np.uint32)).any()
    hop_2 = folded_matmul(fa, fb, "hopper", promote=64)
    assert (hop_2.view(np.uint32) != hop_c.view(np.uint32)).any()
    assert (hop_2.view(np.uint32) != folded_matmul(fa, fb, "hopper").view(np.uint32)).any()
    with pytest.raises(ValueError, match="multiple of 32"):
        folded_matmul(fa, fb, "hopper", promote=48)
    with pytest.raises(ValueError, match="unknown dot"):
        q = fold(emulator.quantize(np.ones((2, 32), np.float32), "e2m1"), 1)
        folded_matmul(q, q, "wgmma")


def test_dot_model_of_a_cpu_tensor_is_exact():
    from ocpmx.native import fold as native_fold
    assert native_fold.dot_model("cpu") == "exact"


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_mx_matmul_method_fp8_exact(device):
    """native.mx_matmul(method='fp8_exact' and 'fp8'): the fold (groups of gcd(K / 32,
    FOLD_GROUPS[method]) blocks: 4 and 32) and the folded GEMM, bit for bit the emulator's
    folded_matmul under the device's dot model, along rows and along columns (Wgrad's
    operands), H16 on both; FP8 operands are refused with the reason. MXLinear takes the
    method too."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(11)
    for k, axis in ((1024, -1), (192, -1), (256, 0)):
        shape_a, shape_b = ((48, k), (40, k)) if axis == -1 else ((k, 48), (k, 40))
        a = torch.from_numpy(rng.standard_normal(shape_a).astype(np.float32)).to(device)
        b = torch.from_numpy(rng.standard_normal(shape_b).astype(np.float32)).to(device)
        qa = native.quantize(a, "e2m1", axis=axis, scale_rule="even", rotation="hadamard16")
        qb = native.quantize(b, "e2m1", axis=axis, scale_rule="even", rotation="hadamard16")
        ea = qa.to_emulator()
        eb = qb.to_emulator()
        if axis == 0:
            ea = emulator.MXArray(ea.codes.T, ea.scales.T, ea.fmt, 1, 32, ea.rotation)
            eb = emulator.MXArray(eb.codes.T, eb.scales.T, eb.fmt, 1, 32, eb.rotation)
        for method in ("fp8_exact", "fp8"):
            group = int(np.gcd(k // 32, native.gemm.FOLD_GROUPS[method]))
            promote = 32 if method == "fp8_exact" else 32 * group
            got = native.mx_matmul(qa, qb, method=method, backend="triton").cpu().numpy()
            want = folded_matmul(fold(ea, group), fold(eb, group), native_fold.dot_model(device),
                                 promote=promote)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (k, axis, method)
    q8 = native.quantize(a, "e4m3", axis=axis)
    with pytest.raises(ValueError, match="only FP4/FP6 formats fold"):
        native.mx_matmul(q8, q8, method="fp8_exact", backend="triton")
    lin = native.MXLinear(256, 64, recipe="mxfp4_all_h16", backend="triton", method="fp8_exact",
                          device=device)
    x = torch.randn(64, 256, device=device, requires_grad=True)
    lin(x).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(lin.weight.grad).all()


_SM90_COMPILE = r"""
import json, os, re, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ocpmx.audit.check import _nvidia_facts
from ocpmx.native import fold
from ocpmx.native.kernels import fold as kfold
sig = {"a_ptr": "*u8", "b_ptr": "*u8", "ea_ptr": "*i32", "eb_ptr": "*i32", "wide_a_ptr": "*i64",
       "wide_b_ptr": "*i64", "c_ptr": "*i16", "M": "i32", "N": "i32", "K": "i32",
       "GROUP": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "KT": "constexpr",
       "OUT_BF16": "constexpr", "RANK1": "constexpr", "PROMOTE": "constexpr",
       "GROUP_M": "constexpr", "SPAN": "constexpr"}
attrs = {(i,): [["tt.divisibility", 16]] for i in range(10)}  # as a launch specializes them
out = []
for promote, rank1, bm, bn, w, s in json.loads(sys.argv[1]):
    consts = {"GROUP": 4 if promote else 32, "BLOCK_M": bm, "BLOCK_N": bn, "KT": 128,
              "OUT_BF16": True, "RANK1": rank1, "PROMOTE": promote, "GROUP_M": 8, "SPAN": 0}
    k = triton.compile(ASTSource(kfold.folded_gemm_kernel, sig, consts, attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=w, num_stages=s, enable_fp_fusion=False))
    ptx = k.asm["ptx"]
    facts = _nvidia_facts(k)
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\w+)\.f32\.e4m3\.e4m3 \{[^}]*\}, (\S+)",
                       ptx)
    out.append(dict(config=[promote, rank1, bm, bn, w, s], spills=facts["spills"],
                    shapes=sorted({m for m, _ in wgmma}),
                    a_from_registers=any(a.startswith("{") for _, a in wgmma),
                    promoted_adds=len(re.findall(r"add\.rn\.f32", ptx)),
                    shared=int(k.metadata.shared)))
print(json.dumps(out))
"""


def test_folded_gemm_tiles_compile_for_sm90_without_spills():
    """The folded GEMM's Hopper tiles (``native.fold.FOLD_CONFIGS``), compiled for sm_90a
    without the chip (the installed Triton and its ptxas; on the GPU host Triton 3.6 compiles
    it too, which once failed there alone): the promoted tiles spill at most 2 registers, the
    chained ones no more than measured, both wgmma operands come from shared memory (an A
    through registers costs registers, the first kernel's 320-register spill), and every tile
    fits Hopper's 227 KiB of shared memory, the general epilogue's launch (RANK1=False)
    included.
    A regression here is a lost factor in speed, found on a CPU."""
    import json
    import os
    import subprocess
    import sys

    from ocpmx.native.fold import FOLD_CONFIGS
    configs = [[True, True, *c] for c in FOLD_CONFIGS[True]] + \
        [[False, True, *c] for c in FOLD_CONFIGS[False]] + \
        [[p, False, *FOLD_CONFIGS[p][0]] for p in (True, False)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # ocpmx installed
    r = subprocess.run([sys.executable, "-c", _SM90_COMPILE, json.dumps(configs)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert [f["config"] for f in facts] == configs
    for f in facts:
        bn = f["config"][3]
        assert f["shapes"] == [f"m64n{bn}k32"] and not f["a_from_registers"], f
        assert f["shared"] <= 232448, f
    fast = [f for f in facts if f["config"][1]]
    for f in fast:
        # promoted 64-wide tiles with a bf16 output: at most 2 registers spilled (measured, the
        # first kernel spilled 55). Chained tiles at group 32: the group sum beside the
        # accumulator spills (Triton 3.9: 167 stores at 64 x 256 per warpgroup, 20 at
        # 64 x 128; the accumulator is touched once per group), bounded here at 1.5x that
        bound = 2 if f["config"][0] else {256: 250, 128: 30}[f["config"][3]]
        assert f["spills"].get("STL", 0) <= bound, f
    # promotion adds each K = 32 partial in float32 (4 adds per output for a K = 128 dot); the
    # chained form adds once per group (the epilogue)
    def adds_per_output(f):
        _, _, bm, bn, w, _ = f["config"]
        return f["promoted_adds"] / (bm * bn / (32 * w))
    promoted = [adds_per_output(f) for f in fast if f["config"][0]]
    chained = [adds_per_output(f) for f in fast if not f["config"][0]]
    assert min(promoted) >= 4 and max(chained) == 1, (promoted, chained)


def test_folded_models_in_the_emulators_mx_matmul():
    """``emulator.mx_matmul(a, b, "hopper_fp8_exact" / "hopper_fp8_chained" / ...)``: the fold
    in gcd(K / 32, group) blocks (whole rows for the rowwise model) and the folded GEMM's sums,
    as composed by hand; named models are the FoldedModels native.gemm's fold methods use."""
    from ocpmx.emulator.fold import (HOPPER_FP8_CHAINED, HOPPER_FP8_CUBLAS,
                                     HOPPER_FP8_CUBLAS_ROWWISE, HOPPER_FP8_EXACT, FoldedModel)
    from ocpmx.native import gemm
    rng = np.random.default_rng(13)
    for k in (192, 2048):
        x = (rng.standard_normal((12, k)) * np.exp(rng.normal(0, 2, (1, k)))).astype(np.float32)
        w = rng.standard_normal((10, k)).astype(np.float32)
        a, b = emulator.quantize(x, "e2m3"), emulator.quantize(w, "e2m3")
        for name, group, promote in (("hopper_fp8_exact", 4, lambda g: 32),
                                     ("hopper_fp8_chained", 32, lambda g: 32 * g),
                                     ("hopper_fp8_cublas", 4, lambda g: 32 * g)):
            g = int(np.gcd(k // 32, group))
            want = folded_matmul(fold(a, g), fold(b, g), "hopper", promote=promote(g))
            got = emulator.mx_matmul(a, b, name)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (k, name)
        # whole rows (6 blocks at K = 192: spans of 4 and 2), spans of 4 blocks chained
        want = folded_matmul(fold(a, None), fold(b, None), "hopper", promote=128)
        got = emulator.mx_matmul(a, b, "hopper_fp8_cublas_rowwise")
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), k
    assert emulator.accumulate.MODELS["hopper_fp8_exact"] is HOPPER_FP8_EXACT
    assert gemm.FOLD_MODELS == {"fp8_exact": HOPPER_FP8_EXACT, "fp8": HOPPER_FP8_CHAINED,
                                "fp8_cublas": HOPPER_FP8_CUBLAS,
                                "fp8_cublas_rowwise": HOPPER_FP8_CUBLAS_ROWWISE}
    rowwise = HOPPER_FP8_CUBLAS_ROWWISE
    assert (rowwise.group_for(14336), rowwise.promote_for(14336), rowwise.promote_for(64)) == \
        (448, 128, 64)
    with pytest.raises(ValueError, match="unknown dot"):
        FoldedModel(4, False, "tensor")
    with pytest.raises(ValueError, match="chain"):
        FoldedModel(None, False, "hopper", 4)  # a chain length needs a chained model
    with pytest.raises(ValueError, match="multiple of 32"):
        folded_matmul(fold(a, 4), fold(b, 4), "hopper", promote=48)
    with pytest.raises(ValueError, match="only FP4/FP6"):
        emulator.mx_matmul(emulator.quantize(w, "e4m3"), emulator.quantize(w, "e4m3"),
                           "hopper_fp8_chained")


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_native_emulate_runs_a_folded_model_where_its_dot_is_the_devices(device):
    """``native.mx_matmul(method="emulate", model=<FoldedModel>)``: the folded FP8 GEMM where
    the device's FP8 dot is the model's (the emulator's bits), a ValueError naming both dots
    where it is not."""
    import torch
    from ocpmx import native
    from ocpmx.emulator.fold import FoldedModel
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(14)
    x = torch.from_numpy(rng.standard_normal((16, 1024)).astype(np.float32)).to(device)
    w = torch.from_numpy(rng.standard_normal((24, 1024)).astype(np.float32)).to(device)
    qa, qb = native.quantize(x, "e2m1"), native.quantize(w, "e2m1")
    dot = native_fold.dot_model(device)
    if dot is None:
        pytest.skip("this GPU's FP8 dot is not measured")
    other = "exact" if dot == "hopper" else "hopper"
    for model in (FoldedModel(32, True, dot), FoldedModel(4, False, dot)):
        got = native.mx_matmul(qa, qb, method="emulate", model=model, backend="triton")
        want = emulator.mx_matmul(qa.to_emulator(), qb.to_emulator(), model)
        assert np.array_equal(got.cpu().numpy().view(np.uint32), want.view(np.uint32)), model
    with pytest.raises(ValueError,
                       match=f"'{other}' FP8 tensor cores do; this device's are '{dot}'"):
        native.mx_matmul(qa, qb, method="emulate", model=FoldedModel(4, False, other),
                         backend="triton")


def test_group_scales_are_the_powers_of_two_float32_holds():
    """``native.fold.group_scales``: 2^R from the bits for every R from -160 to 140 and the NaN
    group, against NumPy's float32 ldexp (subnormals, 0 below 2^-149, Inf above 2^127)."""
    import torch
    from ocpmx.native import fold as native_fold
    r = np.r_[np.arange(-160, 141), NAN_EXPONENT].astype(np.int32)[None, :]
    f = native_fold.FoldedTensor(None, torch.from_numpy(r), None, 4, FORMATS["e2m1"], None)
    got = native_fold.group_scales(f).numpy()
    with np.errstate(over="ignore", under="ignore"):
        want = np.where(r == NAN_EXPONENT, np.float32(np.nan),
                        np.ldexp(np.float32(1), np.where(r == NAN_EXPONENT, 0, r)))
    assert want.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_blockwise_scales_have_the_layout_cublas_takes():
    """``native.fold.blockwise_scales``: A's 2^R (M, K / 128) outer-dim-major (stride (1, M)),
    B's (K / 128, N) contiguous, the values ``group_scales``'s."""
    import torch
    from ocpmx.native import fold as native_fold
    ea = torch.arange(-6, 6, dtype=torch.int32).reshape(4, 3)  # M = 4, K = 384
    eb = torch.arange(0, 15, dtype=torch.int32).reshape(5, 3)  # N = 5
    fa = native_fold.FoldedTensor(None, ea, None, 4, FORMATS["e2m1"], None)
    fb = native_fold.FoldedTensor(None, eb, None, 4, FORMATS["e2m1"], None)
    sa, sb = native_fold.blockwise_scales(fa, fb)
    assert sa.shape == (4, 3) and sa.stride() == (1, 4)
    assert sb.shape == (3, 5) and sb.is_contiguous()
    assert torch.equal(sa, torch.exp2(ea.float())) and torch.equal(sb, torch.exp2(eb.float()).t())


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_fold_writes_cublas_scales(device):
    """``fold_kmajor(..., pow2=True)``: the fold writes 2^R group-major in the same pass, equal
    to ``group_scales`` (NaN, zero and far blocks included), and ``blockwise_scales`` hands them
    to cuBLAS as views in the layout it takes."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(16)
    x = rng.standard_normal((6, 1024)) * np.exp2(rng.integers(-120, 120, (6, 32))).repeat(32, 1)
    x[2, :256] = 0
    x[4, 700] = np.nan
    q = native.quantize(torch.from_numpy(x.astype(np.float32)).to(device), "e2m1")
    f = native_fold.fold_kmajor(q.data, q.scales_kmajor, 1024, q.fmt, 4, pow2=True)
    plain = native_fold.fold(q, 4)
    assert f.pow2.shape == (8, 6) and f.pow2.is_contiguous()
    want = native_fold.group_scales(plain)
    assert torch.equal(f.pow2.t().view(torch.int32), want.view(torch.int32))
    assert torch.equal(f.codes, plain.codes) and torch.equal(f.exponents, plain.exponents)
    sa, sb = native_fold.blockwise_scales(f, f)
    assert sa.stride() == (1, 6) and sb.is_contiguous()
    assert torch.equal(sa.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_method_fp8_cublas(device, monkeypatch):
    """``mx_matmul(method="fp8_cublas")``: cuBLAS's blockwise 1 x 128 FP8 GEMM of operands
    folded in groups of 4 blocks, bit for bit ``emulator.fold.HOPPER_FP8_CUBLAS`` (the model the
    conformance probe inferred on an H100) on random, outlier-heavy (block scales 2^+-40 apart),
    exactly summable and far-scaled (2^+-60) operands; a NaN block's row NaN. On a CPU, and for
    K not a multiple of 128 or M, N not multiples of 16, a ValueError that says why."""
    import torch
    from ocpmx import native
    from ocpmx.conformance.backends import TritonBackend
    from ocpmx.conformance.strategies import exactly_summable_operand
    from ocpmx.emulator.fold import HOPPER_FP8_CUBLAS
    rng = np.random.default_rng(15)
    x = torch.from_numpy(rng.standard_normal((48, 1024)).astype(np.float32)).to(device)
    w = torch.from_numpy(rng.standard_normal((32, 1024)).astype(np.float32)).to(device)
    qa, qb = native.quantize(x, "e2m1"), native.quantize(w, "e2m1")
    if device == "cpu":
        with pytest.raises(ValueError, match="CUDA"):
            native.mx_matmul(qa, qb, method="fp8_cublas", backend="triton")
        return
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("blockwise FP8 _scaled_mm's model was measured on sm_90")
    spread = torch.exp2(torch.from_numpy(rng.integers(-40, 41, (48, 32))).float()).to(device)
    outl = x * spread.repeat_interleave(32, 1)
    far = x * torch.exp2(torch.from_numpy(rng.choice([-60.0, 60.0], (48, 1))).float().to(device))
    (ec, es), (fc, fs) = (exactly_summable_operand(rng, r, 1024, "e2m1") for r in (48, 32))
    mx = TritonBackend(device)._mx  # MXTensors from codes and scales
    cases = [(qa, qb), (native.quantize(outl, "e2m1"), qb), (native.quantize(far, "e2m1"), qb),
             (native.quantize(outl, "e3m2"), native.quantize(w, "e3m2")),
             (mx(ec, es, "e2m1", 1, 32), mx(fc, fs, "e2m1", 1, 32))]
    for a, b in cases:
        got = native.mx_matmul(a, b, method="fp8_cublas").cpu().numpy()
        want = emulator.mx_matmul(a.to_emulator(), b.to_emulator(), HOPPER_FP8_CUBLAS)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), a.fmt.name
    # method "auto" with HOPPER_AUTO = "fp8_cublas": this method where it applies, "bf16" for
    # an MXFP8 operand
    monkeypatch.setattr(native.gemm, "HOPPER_AUTO", "fp8_cublas")
    assert torch.equal(native.mx_matmul(qa, qb).view(torch.int32),
                       native.mx_matmul(qa, qb, method="fp8_cublas").view(torch.int32))
    q8a, q8b = native.quantize(x, "e4m3"), native.quantize(w, "e4m3")
    assert torch.equal(native.mx_matmul(q8a, q8b).view(torch.int32),
                       native.mx_matmul(q8a, q8b, method="bf16").view(torch.int32))
    xn = x.clone()
    xn[3, 500] = float("nan")
    got = native.mx_matmul(native.quantize(xn, "e2m1"), qb, method="fp8_cublas").cpu().numpy()
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, 0)).any()
    q160 = native.quantize(x[:, :160], "e2m1")
    with pytest.raises(ValueError, match="multiple of 128"):
        native.mx_matmul(q160, q160, method="fp8_cublas")
    q40 = native.quantize(x[:40], "e2m1")
    with pytest.raises(ValueError, match="multiples of 16"):
        native.mx_matmul(q40, qb, method="fp8_cublas")


@pytest.mark.parametrize("m, n, k", [(8192, 4096, 4096), (8192, 14336, 4096),
                                     (8192, 4096, 14336), (4096, 14336, 8192)])
def test_method_fp8_cublas_at_llama_shapes(m, n, k):
    """At Llama-8B shapes (cuBLAS picks its kernel per shape), ``fp8_cublas`` gives the bits of
    the Triton folded GEMM chained at groups of 4 blocks, itself bit for bit the emulator's
    ``HOPPER_FP8_CUBLAS`` on an H100 (test_native_fold_and_folded_gemm_are_the_emulators):
    random operands with block scales spread over 2^+-8."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (cuBLAS's blockwise FP8 GEMM and Hopper's dot)")
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    g = torch.Generator(device="cuda").manual_seed(m + n + k)

    def operand(rows):
        v = torch.randn(rows, k, device="cuda", generator=g)
        s = torch.randint(-8, 9, (rows, k // 32), device="cuda", generator=g).float()
        return native.quantize(v * torch.exp2(s).repeat_interleave(32, 1), "e2m1")
    qa, qb = operand(m), operand(n)
    got = native.mx_matmul(qa, qb, method="fp8_cublas")
    want = native_fold.folded_matmul(native_fold.fold(qa, 4), native_fold.fold(qb, 4),
                                     promote=False)
    diff = (got.view(torch.int32) != want.view(torch.int32)).sum().item()
    assert diff == 0, f"{diff} of {m * n} outputs differ"
    # bf16 output: the float32 sum rounded to nearest even
    got16 = native.mx_matmul(qa, qb, method="fp8_cublas", out_dtype=torch.bfloat16)
    diff = (got16.view(torch.int16) != want.bfloat16().view(torch.int16)).sum().item()
    assert diff == 0, f"bf16 output: {diff} of {m * n} differ"


def test_auto_method_on_hopper_and_fit_method(monkeypatch):
    """``auto_method``: on an sm_90 GPU without MX units ``HOPPER_AUTO`` ('bf16' today; with
    'fp8_cublas' and torch 2.11+, that), from M x N x K = ``HOPPER_AUTO_LARGE_MNK`` up
    'fp8_cublas_rowwise'; elsewhere the size does not matter; and ``fit_method`` hands
    'fp8_cublas' back to 'bf16' for operands it refuses (an MXFP8 operand, K not a multiple of
    128, M or N not of 16); other methods pass through."""
    import torch
    from ocpmx.native import gemm
    e2m1, e3m2, e4m3 = FORMATS["e2m1"], FORMATS["e3m2"], FORMATS["e4m3"]
    __import__("native_util").as_hopper(monkeypatch)
    dev = torch.device("cpu")
    assert gemm.auto_method(dev) == gemm.HOPPER_AUTO == "bf16"  # host-bound: see HOPPER_AUTO
    # by size: tokens x in x out from 2^37 (Llama-8B's 4096 -> 4096 at 8192 tokens) up, the
    # rowwise method
    assert gemm.HOPPER_AUTO_LARGE_MNK == 8192 * 4096 * 4096
    assert gemm.auto_method(dev, 8192 * 4096 * 4096) == gemm.HOPPER_AUTO_LARGE \
        == "fp8_cublas_rowwise"
    assert gemm.auto_method(dev, 8192 * 4096 * 14336) == "fp8_cublas_rowwise"  # Llama-8B's FFN
    assert gemm.auto_method(dev, 8192 * 4096 * 4096 - 1) == "bf16"
    assert gemm.auto_method(dev, 8192 * 4096 * 1024) == "bf16"  # its K and V projections
    assert gemm.auto_method(dev, 32768 * 768 * 2048) == "bf16"  # 125m's FFN
    monkeypatch.setattr(gemm, "HOPPER_AUTO", "fp8_cublas")
    assert gemm.auto_method(dev) == "fp8_cublas"
    monkeypatch.setattr(gemm, "hopper", lambda d: False)
    assert gemm.auto_method(dev) == gemm.auto_method(dev, 1 << 40) == "bf16"
    monkeypatch.setattr(gemm, "has_mx_units", lambda d: True)
    assert gemm.auto_method(dev) == gemm.auto_method(dev, 1 << 40) == "dot_scaled"
    fit = gemm.fit_method
    assert fit("fp8_cublas", e2m1, e3m2, 32, 16, 1024) == "fp8_cublas"
    assert fit("fp8_cublas", e2m1, e4m3, 32, 16, 1024) == "bf16"
    assert fit("fp8_cublas", e2m1, e2m1, 32, 16, 96) == "bf16"
    assert fit("fp8_cublas", e2m1, e2m1, 24, 16, 128) == "bf16"
    assert fit("fp8_cublas", e2m1, e2m1, 32, 40, 128) == "bf16"
    assert fit("dot_scaled", e2m1, e4m3, 1, 1, 32) == "dot_scaled"


def test_auto_method_compiles_with_dynamic_sizes(monkeypatch):
    """``auto_method`` under torch.compile (fullgraph) with dynamic shapes, as ``mx_matmul``
    and MXLinear call it with a GEMM's M x N x K: the device part is a constant
    (``_auto_kind``), the size a guard; each size on both sides of
    ``HOPPER_AUTO_LARGE_MNK`` gives the eager choice (a symbolic size inside an
    ``assume_constant_result`` function failed the second, dynamic, call)."""
    import torch
    from ocpmx.native import gemm
    __import__("native_util").as_hopper(monkeypatch)
    monkeypatch.setattr(gemm, "HOPPER_AUTO_LARGE_MNK", 40 * 40 * 64)

    def f(x):
        method = gemm.auto_method(x.device, x.shape[0] * x.shape[1] * 64)
        return x + (1.0 if method == "fp8_cublas_rowwise" else 0.0)
    torch._dynamo.reset()
    try:
        for dynamic in (None, True):
            cf = torch.compile(f, fullgraph=True, dynamic=dynamic, backend="eager")
            for n in (4, 40, 5, 50, 39):
                x = torch.zeros(n, n)
                assert torch.equal(cf(x), f(x)), (dynamic, n)
                assert float(cf(x)[0, 0]) == (1.0 if n >= 40 else 0.0), (dynamic, n)
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("recipe, method", [("mxfp4_all", "fp8_cublas"),
                                            ("mxfp4_all_h16", "fp8_cublas"),
                                            ("mxfp4_all_h16", "fp8_cublas_rowwise"),
                                            ("mxfp4_all_sr_wgrad", "fp8_cublas_rowwise")])
def test_mxlinear_fp8_cublas_is_the_hopper_fp8_cublas_model(recipe, method, monkeypatch):
    """MXLinear's three GEMMs through cuBLAS (``method="fp8_cublas"`` or
    ``"fp8_cublas_rowwise"``, and ``"auto"`` on Hopper: with ``HOPPER_AUTO`` 'fp8_cublas', or
    for rowwise a layer whose tokens x in x out reaches ``HOPPER_AUTO_LARGE_MNK``, here lowered
    to this layer's) give the bits of the same layer summed under the emulator's
    ``hopper_fp8_cublas`` model (``hopper_fp8_cublas_rowwise``; ``accumulation=``, on the GPU
    the Triton folded GEMM): output, input gradient and weight gradient."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (cuBLAS's blockwise FP8 GEMM and Hopper's dot)")
    from ocpmx import native
    if method == native.gemm.HOPPER_AUTO_LARGE:  # "auto" picks it by the layer's size
        monkeypatch.setattr(native.gemm, "HOPPER_AUTO_LARGE_MNK", 256 * 256 * 384)
    else:
        monkeypatch.setattr(native.gemm, "HOPPER_AUTO", method)
    torch.manual_seed(0)
    x = torch.randn(2, 128, 256, dtype=torch.bfloat16, device="cuda")
    gy = torch.randn(2, 128, 384, dtype=torch.bfloat16, device="cuda")
    outs, weights = {}, None
    for name, kw in ((method, dict(method=method)), ("auto", {}),
                     ("model", dict(accumulation=f"hopper_{method}"))):
        lin = native.MXLinear(256, 384, recipe=recipe, layer_id=1, seed=5, device="cuda", **kw)
        if weights is None:
            weights = {k: v.clone() for k, v in lin.state_dict().items()}
        lin.load_state_dict(weights)  # the same layer each time
        xi = x.clone().requires_grad_(True)
        y = lin(xi)
        y.backward(gy)
        outs[name] = (y, xi.grad, lin.weight.grad)
    for name in (method, "auto"):
        for what, got, want in zip(("y", "dgrad", "wgrad"), outs[name], outs["model"]):
            assert torch.equal(got.view(torch.int16 if got.dtype == torch.bfloat16 else
                                        torch.int32),
                               want.view(torch.int16 if want.dtype == torch.bfloat16 else
                                         torch.int32)), (name, what)


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name, group, axis, rotation, rounding, dtype", [
    ("e2m1", 4, -1, "hadamard16", "rne", "bfloat16"),
    ("e2m1", 32, -1, None, "stochastic", "float32"),
    ("e2m1", 1, 0, "hadamard16", "rne", "bfloat16"),
    ("e3m2", 4, 0, None, "rne", "float32"),
    ("e2m3", 8, -1, "random_sign16:12345", "stochastic", "bfloat16")])
def test_quantize_folded_is_fold_of_quantize(device, name, group, axis, rotation, rounding,
                                             dtype):
    """``native.fold.quantize_folded``: the quantize row kernel folding in its own pass gives
    the bits of ``fold(quantize(x))``: E4M3 codes, group exponents, MX scales, cuBLAS's 2^R,
    the wide flag and the rounded-element count (a block 40 octaves below its group, a zero
    block, a NaN block; 7 rows, so the last program is partly masked), along rows and along
    columns (through the transpose), with rotations and stochastic rounding; and the MX codes
    come back from the folded form (``emulator.fold.unfold``)."""
    import torch
    from ocpmx import native
    from ocpmx.emulator.fold import Folded, unfold
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(group)
    x = rng.standard_normal((7, 1024)) * np.exp2(rng.integers(-3, 4, (7, 32))).repeat(32, 1)
    x[3, :32] *= 2.0**-40
    x[5, 64:96] = 0
    x[6, 300] = np.nan
    xt = torch.from_numpy(x.astype(np.float32)).to(getattr(torch, dtype)).to(device)
    if axis == 0:
        xt = xt.t().contiguous()
    kw = dict(axis=axis, rounding=rounding, rotation=rotation, seed=11)
    got = native_fold.quantize_folded(xt, name, group, pow2=True, **kw)
    mx = native.quantize(xt, name, **kw)
    want = native_fold.fold(mx, group)
    for field in ("codes", "exponents", "scales", "stats"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert torch.equal(got.pow2.t().view(torch.int32),
                       native_fold.group_scales(want).view(torch.int32))
    # the far block is rounded where it shares a group; the NaN block flags the operand wide
    assert (int(got.inexact.item()) > 0) == (group > 1) and int(got.wide.item()) == 1
    back = unfold(Folded(got.codes.cpu().numpy(), got.scales.cpu().numpy(),
                         got.exponents.cpu().numpy(), group, FORMATS[name],
                         int(got.inexact.item())))
    mx_codes = np.moveaxis(mx.to_emulator().codes, axis, -1)  # K-major: x's rows either way
    rows = [r for r in range(7) if r not in (3, 6)]  # not the rounded or the NaN row
    assert np.array_equal(back.codes[rows], mx_codes[rows])
    assert np.array_equal(back.scales, got.scales.cpu().numpy())
    if device == "cpu":  # the emulator backend: its quantize and fold, the same bits
        emu = native_fold.quantize_folded(xt, name, group, pow2=True, backend="emulator", **kw)
        for field in ("codes", "exponents", "scales", "stats"):
            assert torch.equal(getattr(emu, field), getattr(got, field)), field
        assert torch.equal(emu.pow2.view(torch.int32), got.pow2.view(torch.int32))
    with pytest.raises(ValueError, match="power of two dividing"):
        native_fold.quantize_folded(xt, name, 3, axis=axis)
    with pytest.raises(ValueError, match="only FP4/FP6"):
        native_fold.quantize_folded(xt, "e4m3", 4, axis=axis)


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name, rotation, group, axis, dtype, rule, pow2", [
    ("e2m1", None, 4, -1, "bfloat16", "even", True),
    ("e2m1", "hadamard16", 32, -1, "bfloat16", "floor", True),
    ("e2m1", "hadamard16", 1, 0, "bfloat16", "even", False),
    ("e3m2", None, 8, -1, "float32", "floor", True),
    ("e2m3", "hadamard16", 4, 0, "float16", "ceil", True),
    ("e2m3", "random_sign16:12345", 2, -1, "bfloat16", "rceil", False),
    ("e3m2", "hadamard16", 2, 0, "float32", "even", True)], ids=str)
def test_rne_quantize_folded_of_every_bf16_value(device, name, rotation, group, axis, dtype,
                                                 rule, pow2):
    """The RNE fold in the quantize pass folds the rounded magnitudes, not the codes
    (``kernels.fold.fold_values``: per-program branches for a NaN block and for blocks that
    may round): every 16-bit pattern of the input dtype (bf16 / float16: every value; float32:
    65,536 random bit patterns), shuffled into 63 x 1024 (a last program cut short; groups hold
    blocks far apart, NaN, Inf, zeros and subnormals among them), plus a copy without NaN/Inf
    with a block 2^-20 below the rest of its group (and one 2^-60 below where the dtype holds
    it) and a row of zero groups; every scale rule
    among the cases (floor saturates), the rotation's 1/4 in the scale (bf16 and float16 under
    H16) and not; along rows and columns; with the default tiles and with small ones (a row
    tile of 32 blocks, the column kernel folding along columns), so that programs take and skip
    each branch. Its E4M3 codes, group exponents, MX scales, 2^R, wide flag and rounded-element
    count equal ``fold(quantize(x))``'s (through the codes)."""
    import dataclasses
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    rng = np.random.default_rng(group)
    n = 63 * 1024
    if dtype == "float32":
        x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
        x = x * np.float32(1.0)  # (a copy as float32)
    else:
        bits = np.resize(rng.permutation(np.arange(1 << 16, dtype=np.uint16)), n)
        x = bits.view(np.float16 if dtype == "float16" else np.uint16)
        x = x.astype(np.float32) if dtype == "float16" else \
            (x.astype(np.uint32) << 16).view(np.float32)
    x = x.reshape(63, 1024).copy()
    clean = np.where(np.isfinite(x), x, 1.0).astype(np.float32)
    clean = np.clip(clean, -2.0**100, 2.0**100)  # (float16 and float32 alike)
    clean[7, 32:64] *= np.float32(2.0**-20)  # blocks far below the rest of their group
    clean[9, 256:288] *= np.float32(2.0**-60)  # (zero in float16)
    clean[11, :1024] = 0.0  # a whole row of zero blocks (all-zero groups)
    base = native.default_tuning()
    small = dataclasses.replace(base, rows32=native.RowTile(32, 1),
                                columns_fold="kernel", cols32_fold=native.ColumnTile(16, 1, 4))
    for data in (x, clean):
        xt = torch.from_numpy(data).to(getattr(torch, dtype)).to(device)
        if axis == 0:
            xt = xt.t().contiguous()
        kw = dict(axis=axis, rotation=rotation, scale_rule=rule)
        want = native_fold.fold(native.quantize(xt, name, **kw), group)
        for tuning in (base, small):
            got = native_fold.quantize_folded(xt, name, group, pow2=pow2, tuning=tuning, **kw)
            for field in ("codes", "exponents", "scales", "stats"):
                assert torch.equal(getattr(got, field), getattr(want, field)), \
                    (field, data is x, tuning is small)
            if pow2:
                assert torch.equal(got.pow2.t().view(torch.int32),
                                   native_fold.group_scales(want).view(torch.int32))
            else:
                assert got.pow2 is None
    # the far blocks rounded (a group of one block rounds nothing)
    assert (int(got.stats[1]) > 0) == (group > 1)


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2"])
@pytest.mark.parametrize("rotation", [None, "hadamard16", "random_sign16:12345"])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_quantize_folded_along_columns_in_one_pass(device, name, rotation, rounding,
                                                    monkeypatch):
    """``quantize_folded`` along a non-last axis (Wgrad's operands, quantized along tokens)
    under ``Tuning(columns="kernel")``: the column kernel folds in its one pass (no transpose:
    ``launch.move_axis_last`` is never called) and gives the bits of the transpose + row kernel
    path and of the emulator backend: E4M3 codes, group exponents, MX scales, 2^R, the wide
    flag and the rounded-element count. 3-D inputs along axis 0 (K = 8 blocks, one outer
    position, 48 columns: three whole column tiles, two programs along K at groups of 4) and
    axis 1 (K = 4 blocks, two outer positions of 24 columns: the second tile cut short, its
    masked columns' block indices running into the next outer position's rows), bf16 and
    float32, pow2 on and off, groups of 2, 4 and 8 blocks (the column tile's 4 blocks along K
    raised to 8 at groups of 8); a block 40 octaves below its group (rounded), a zero block
    and a NaN block. (Small shapes: the interpreter's cost is per program.)"""
    import dataclasses
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    from ocpmx.native import launch
    rng = np.random.default_rng(7)
    base = native.default_tuning()  # (its row tile: few programs under the interpreter)
    tiles = [native.ColumnTile(16, 1, 4)]
    if device != "cpu":  # on a GPU also the H100 default's tile (a column pair per thread)
        tiles.append(native.tuning.H100.cols32)
    transpose = dataclasses.replace(base, columns="transpose")
    transposed = []
    move_axis_last = launch.move_axis_last
    monkeypatch.setattr(launch, "move_axis_last",
                        lambda *a, **kw: transposed.append(1) or move_axis_last(*a, **kw))
    for axis, dtype, pow2, group in ((0, torch.bfloat16, True, 4), (0, torch.float32, False, 8),
                                     (1, torch.bfloat16, False, 2), (1, torch.float32, True, 4)):
        k = 256 if axis == 0 else 128
        # the operand's K-major rows (48), quantized along K, an octave spread between blocks
        spread = np.exp2(rng.integers(-3, 4, (48, k // 32)).repeat(32, 1))
        xk = rng.standard_normal((48, k)) * spread
        xk[5, 32:64] *= 2.0**-40
        xk[27, :32] = 0
        xk[44, 96:128] = np.nan
        if axis == 0:
            xs = np.moveaxis(xk.reshape(6, 8, k), -1, 0)  # (K, 6, 8)
        else:
            xs = xk.reshape(2, 24, k).transpose(0, 2, 1)  # (2, K, 24)
        x = torch.from_numpy(np.ascontiguousarray(xs, np.float32)).to(dtype).to(device)
        kw = dict(axis=axis, pow2=pow2, rounding=rounding, rotation=rotation, seed=11)
        wants = {"transpose": native_fold.quantize_folded(x, name, group, tuning=transpose, **kw),
                 "emulator": native_fold.quantize_folded(x, name, group, backend="emulator", **kw)}
        assert transposed  # the reference went the other way
        transposed.clear()
        for tile in tiles:
            kernel = dataclasses.replace(base, columns="kernel", cols32=tile)
            got = native_fold.quantize_folded(x, name, group, tuning=kernel, **kw)
            assert not transposed, "the column kernel did not fold: the input was transposed"
            for ref, want in wants.items():
                for field in ("codes", "exponents", "scales", "stats"):
                    assert torch.equal(getattr(got, field), getattr(want, field)), \
                        (ref, tile, axis, dtype, field)
                if pow2:
                    assert torch.equal(got.pow2.view(torch.int32),
                                       want.pow2.view(torch.int32)), (ref, tile, axis, dtype)
                else:
                    assert got.pow2 is None and want.pow2 is None
            # the far block was rounded; the NaN block flags the operand wide
            assert int(got.inexact.item()) > 0 and int(got.wide.item()) == 1


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("recipe, method", [
    ("mxfp4_all_h16", "fp8_exact"), ("mxfp4_all_sr_wgrad", "fp8"),
    ("mxfp4_all_h16", "fp8_cublas"), ("mxfp4_all_sr_wgrad", "fp8_cublas"),
    # (the Triton methods' other two: each recipe and each method already runs above)
    pytest.param("mxfp4_all_h16", "fp8", marks=pytest.mark.exhaustive),
    pytest.param("mxfp4_all_sr_wgrad", "fp8_exact", marks=pytest.mark.exhaustive)])
def test_mxlinear_folds_in_the_quantize_pass(device, method, recipe, monkeypatch):
    """MXLinear under a fold method quantizes each operand straight into its folded form
    (``fold.quantize_folded``, eager mode): output, input and weight gradients bit for bit
    those of quantize, then ``mx_matmul(method=...)`` folding apart (compiled:
    test_fold_path_compiles_whole_with_eager_bits)."""
    import torch
    from ocpmx import native
    if method == "fp8_cublas" and (device == "cpu" or
                                   torch.cuda.get_device_capability(device)[0] != 9):
        pytest.skip("cuBLAS's blockwise FP8 GEMM: an sm_90 GPU")
    torch.manual_seed(0)
    x = torch.randn(2, 64, 256, dtype=torch.bfloat16, device=device)
    gy = torch.randn(2, 64, 128, dtype=torch.bfloat16, device=device)
    outs, weights, calls = [], None, []
    folded = native.linear.quantize_folded
    monkeypatch.setattr(native.linear, "quantize_folded",
                        lambda *a, **kw: calls.append(1) or folded(*a, **kw))
    for fused in (True, False):
        if not fused:  # the two-pass path: quantize, then mx_matmul folds
            monkeypatch.setattr(native.linear, "FOLD_METHODS", ())
        lin = native.MXLinear(256, 128, recipe=recipe, layer_id=2, seed=3, method=method,
                              backend="triton", device=device)
        if weights is None:
            weights = {k: v.clone() for k, v in lin.state_dict().items()}
        lin.load_state_dict(weights)
        native.set_step(lin, 5)
        xi = x.clone().requires_grad_(True)
        y = lin(xi)
        y.backward(gy)
        outs.append((y, xi.grad, lin.weight.grad))
        assert len(calls) == 6  # the fused run: three GEMMs x two operands; the other: none
    for what, got, want in zip(("y", "dgrad", "wgrad"), *outs):
        assert torch.equal(got.view(torch.int16 if got.dtype == torch.bfloat16 else torch.int32),
                           want.view(torch.int16 if want.dtype == torch.bfloat16 else
                                     torch.int32)), what


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("method,recipe", [("fp8_exact", "mxfp4_all_h16"),
                                           ("fp8", "mxfp4_all_sr_wgrad"),
                                           ("fp8_cublas", "mxfp4_all_h16")])
def test_fold_path_compiles_whole_with_eager_bits(device, method, recipe, monkeypatch):
    """Under torch.compile (fullgraph) MXLinear keeps the one-pass fold: ``quantize_folded`` and
    the folded GEMM are the custom ops ``ocpmx::quantize_folded`` / ``ocpmx::folded_product``
    (not the two-pass quantize + mx_matmul), no graph break, and the eager bits in the output
    and both gradients, over two steps (stochastic rounding's keys reach the graph)."""
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    from ocpmx.native import gemm
    if method == "fp8_cublas" and (device == "cpu" or
                                   torch.cuda.get_device_capability(device)[0] != 9):
        pytest.skip("cuBLAS's blockwise FP8 GEMM: an sm_90 GPU")
    torch.manual_seed(0)
    # cuBLAS's blockwise GEMM wants K in 128s: Wgrad's K is the 128 tokens there
    t, k, n = (64, 256, 128) if method == "fp8_cublas" else (32, 128, 64)
    x = torch.randn(2, t, k, dtype=torch.bfloat16, device=device)
    gy = torch.randn(2, t, n, dtype=torch.bfloat16, device=device)
    lin = native.MXLinear(k, n, recipe=recipe, layer_id=2, seed=3, method=method,
                          backend="triton", device=device)
    from ocpmx.native import plans
    calls = {"fold": 0, "gemm": 0}
    kmajor, product = native_fold.quantize_folded_kmajor, gemm.folded_product

    def count(name, fn):
        return lambda *a, **kw: calls.__setitem__(name, calls[name] + 1) or fn(*a, **kw)
    monkeypatch.setattr(native_fold, "quantize_folded_kmajor", count("fold", kmajor))
    # (a repeated fold takes its plan on a GPU: the op's implementation runs it instead)
    monkeypatch.setattr(plans, "run_fold", count("fold", plans.run_fold))
    monkeypatch.setattr(gemm, "folded_product", count("gemm", product))

    def run(fn, s):
        native.set_step(lin, s)
        lin.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_(True)
        y = fn(xi)
        y.backward(gy)
        return [t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)
                for t in (y.detach(), xi.grad, lin.weight.grad.clone())]

    torch._dynamo.reset()
    assert torch._dynamo.explain(lin)(x).graph_break_count == 0
    torch._dynamo.reset()
    compiled = torch.compile(lin, fullgraph=True, backend="aot_eager")
    for s in (1, 2):
        want = run(lin, s)
        before = dict(calls)
        got = run(compiled, s)
        assert (calls["fold"] - before["fold"], calls["gemm"] - before["gemm"]) == (6, 3)
        for what, g, w in zip(("y", "dgrad", "wgrad"), got, want):
            assert torch.equal(g, w), (what, s)


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name, rotation, group, dtype, rule, pow2, width", [
    ("e2m1", None, 4, "bfloat16", "even", True, 63),
    ("e2m1", "hadamard16", 4, "bfloat16", "floor", True, 64),
    ("e2m1", "hadamard32", 2, "float32", "rceil", False, 40),
    ("e2m3", "hadamard16", 1, "float16", "ceil", True, 96),
    ("e3m2", None, 2, "float32", "floor", True, 33)], ids=str)
def test_fold_along_tokens_in_the_axis0_kernel(device, name, rotation, group, dtype, rule,
                                               pow2, width, monkeypatch):
    """``Tuning(columns_fold="both_axes")``: ``quantize_folded`` along axis 0 (Wgrad's
    operands) through ``kernels.both_axes.columns_fold_kernel``, one fold group of each
    column per program, no transpose: the bits of the transpose + row kernel path (E4M3
    codes, group exponents, MX scales, 2^R, wide flag, rounded-element count) on every
    16-bit pattern of the dtype (float32: random bit patterns) spread over K = 1024 rows
    and ``width`` columns (a last column tile cut short where it is not a multiple of the
    tile's), NaN, Inf, zeros and subnormals among them, and on a copy without NaN/Inf with
    blocks far below the rest of their group (rounded), a column of zeros and a group whose
    one nonzero block rounds to zero. Calls it does
    not take (stochastic rounding, random signs, groups past ``FOLD_COLUMNS_MAX_GROUP``) go
    through the transpose, with the same bits."""
    import dataclasses
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    from ocpmx.native import launch
    rng = np.random.default_rng(group + width)
    n = 1024 * width
    if dtype == "float32":
        x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
        x = x * np.float32(1.0)
    else:
        bits = np.resize(rng.permutation(np.arange(1 << 16, dtype=np.uint16)), n)
        x = bits.view(np.float16 if dtype == "float16" else np.uint16)
        x = x.astype(np.float32) if dtype == "float16" else \
            (x.astype(np.uint32) << 16).view(np.float32)
    x = x.reshape(1024, width).copy()
    clean = np.clip(np.where(np.isfinite(x), x, 1.0).astype(np.float32), -2.0**100, 2.0**100)
    clean[32:64, 3] *= np.float32(2.0**-20)  # blocks far below the rest of their group
    clean[256:288, 5] *= np.float32(2.0**-60)
    clean[:, 7] = 0.0  # a column of zero groups
    # a group whose only nonzero block rounds to zero (2^-133 under a scale clamped at 2^-127):
    # all-zero for R, as in the row kernel (an R from the input's amax would differ)
    clean[:, 9] = 0.0
    clean[:32, 9] = np.float32(2.0**-133)
    base = native.default_tuning()
    fast = dataclasses.replace(base, columns_fold="both_axes", fold_columns=(32, 2))
    slow = dataclasses.replace(base, columns_fold="transpose")
    launched = []
    run = launch.run
    monkeypatch.setattr(launch, "run", lambda k, *a, **kw: launched.append(k) or run(k, *a, **kw))
    for data in (x, clean):
        xt = torch.from_numpy(data).to(getattr(torch, dtype)).to(device)
        kw = dict(axis=0, rotation=rotation, scale_rule=rule, pow2=pow2)
        want = native_fold.quantize_folded(xt, name, group, tuning=slow, **kw)
        launched.clear()
        got = native_fold.quantize_folded(xt, name, group, tuning=fast, **kw)
        assert launched == [launch.kernels.both_axes.columns_fold_kernel]
        for field in ("codes", "exponents", "scales", "stats"):
            assert torch.equal(getattr(got, field), getattr(want, field)), (field, data is x)
        if pow2:
            assert torch.equal(got.pow2.view(torch.int32), want.pow2.view(torch.int32))
        else:
            assert got.pow2 is None
    assert (int(got.stats[1]) > 0) == (group > 1)  # the far blocks rounded
    # the calls it does not take: through the transpose and the row kernel, the same bits
    xt = torch.from_numpy(clean[:256]).to(getattr(torch, dtype)).to(device)
    for kw in (dict(rounding="stochastic", seed=3), dict(rotation="random_sign16:77")):
        for g in ({group, 8} if not kw.get("rounding") else {group}):
            launched.clear()
            got = native_fold.quantize_folded(xt, name, g, axis=0, tuning=fast, **kw)
            assert launch.kernels.transpose.transpose_kernel in launched
            want = native_fold.quantize_folded(xt, name, g, axis=0, tuning=slow, **kw)
            for field in ("codes", "exponents", "scales", "stats"):
                assert torch.equal(getattr(got, field), getattr(want, field)), (field, kw, g)
    launched.clear()
    native_fold.quantize_folded(xt, name, 8, axis=0, tuning=fast)  # (a group of 8 blocks)
    assert launch.kernels.transpose.transpose_kernel in launched


def test_hopper_fp8_cublas_rowwise_reproduces_an_h200():
    """``HOPPER_FP8_CUBLAS_ROWWISE`` (each 128 of K chained in the tensor core, the spans added
    in float32, the row and column scales once at the end) against cuBLAS's rowwise FP8 GEMM on
    an H200 (torch 2.11 + CUDA 13.0, ``benchmarks/cublas_rowwise_probe.py``): corners of
    outputs of GEMMs up to 8192 x 4096 x 14336, E4M3 operands of every finite code or E2M1
    values shifted per block, rows scaled by 2^-20..2^20; float32 and bf16 outputs bit for bit.
    The other chain lengths (every K = 32 promoted, 64, 256 of K, the whole row) miss."""
    data = np.load(Path(__file__).parent / "data" / "h200_cublas_rowwise.npz")
    tags = sorted({k.rsplit("_", 1)[0] for k in data if k.endswith("_shape")})
    assert len(tags) == 8
    import torch
    misses = {1: 0, 2: 0, 8: 0, None: 0}
    for tag in tags:
        a, b = data[f"{tag}_a"], data[f"{tag}_b"]
        k = a.shape[1]
        assert k == data[f"{tag}_shape"][2]

        def folded(codes, r):
            return Folded(codes, np.zeros((codes.shape[0], k // 32), np.uint8),
                          r.reshape(-1, 1), k // 32, FORMATS["e2m1"], 0)
        fa, fb = folded(a, data[f"{tag}_ra"]), folded(b, data[f"{tag}_rb"])
        want = folded_matmul(fa, fb, "hopper", promote=128)
        got32 = data[f"{tag}_out_f32"]
        assert np.array_equal(got32.view(np.uint32), want.view(np.uint32)), tag
        want16 = torch.from_numpy(want).bfloat16().float().numpy()
        assert np.array_equal(data[f"{tag}_out_bf16"].view(np.uint32), want16.view(np.uint32))
        for chain in misses:
            other = folded_matmul(fa, fb, "hopper", promote=32 * (chain or k // 32))
            misses[chain] += int((other.view(np.uint32) != got32.view(np.uint32)).sum())
    assert all(v > 0 for v in misses.values()), misses


def test_which_folds_the_quantize_pass_takes():
    """``fused_in_quantize``: powers of two of at most ``FUSED_FOLD_MAX_GROUP`` blocks on any
    path; on the row kernel (the last axis, or another through the transpose) groups and whole
    rows up to ``FUSED_ROW_FOLD_MAX_GROUP`` blocks padded to a power of two, a row of another
    length only where it fills ``FUSED_ROW_MIN_FILL`` of its padding (through the transpose
    where plain quantize runs the column kernel only up to ``FUSED_COLUMN_FOLD_MAX_GROUP``);
    the column kernels nothing larger or of another length. Decided from shapes alone, on
    every device."""
    import dataclasses
    import torch
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    base = native.default_tuning()
    rows = base
    transpose = dataclasses.replace(base, columns="transpose", columns_fold="transpose")
    column = dataclasses.replace(base, columns="kernel", columns_fold="kernel")
    both = dataclasses.replace(base, columns_fold="both_axes")
    # plain quantize on the column kernel, the fold through the transpose (the H200's and the
    # H100's defaults): the transpose only up to FUSED_COLUMN_FOLD_MAX_GROUP blocks, padded
    mixed = dataclasses.replace(base, columns="kernel", columns_fold="transpose")
    cases = [  # (shape, axis, group, tuning, fused)
        ((4, 64 * 32), -1, 4, rows, True), ((4, 64 * 32), -1, 64, rows, True),
        ((4, 24 * 32), -1, 24, rows, True), ((4, 448 * 32), -1, 448, rows, False),
        ((4, 256 * 32), -1, 256, rows, True), ((4, 200 * 32), -1, 200, rows, True),
        ((4, 512 * 32), -1, 512, rows, False), ((4, 520 * 32), -1, 520, rows, False),
        ((4, 1024 * 32), -1, 1024, rows, False), ((4, 33 * 32), -1, 33, rows, False),
        ((4, 3 * 32), -1, 3, rows, True), ((4, 5 * 32), -1, 5, rows, False),
        ((24 * 32, 1), 0, 24, column, True),  # (nothing after the axis: the row kernel)
        ((64 * 32, 8), 0, 64, transpose, True), ((24 * 32, 8), 0, 24, transpose, True),
        ((64 * 32, 8), 0, 4, column, True), ((64 * 32, 8), 0, 32, column, True),
        ((64 * 32, 8), 0, 64, column, False), ((24 * 32, 8), 0, 24, column, False),
        ((64 * 32, 8), 0, 4, both, True), ((64 * 32, 8), 0, 64, both, False),
        ((24 * 32, 8), 0, 24, mixed, True), ((64 * 32, 8), 0, 64, mixed, True),
        ((48 * 32, 8), 0, 48, mixed, True), ((128 * 32, 8), 0, 128, mixed, False),
        ((256 * 32, 8), 0, 256, mixed, False), ((128 * 32, 8), 0, 4, mixed, True),
        ((256 * 32, 8), 0, 256, transpose, True)]
    for shape, axis, group, tuning, fused in cases:
        x = torch.empty(shape)
        assert native_fold.fused_in_quantize(x, axis, group, tuning) == fused, (shape, group)
    assert native_fold.FUSED_ROW_FOLD_MAX_GROUP == 256 and native_fold.FUSED_ROW_MIN_FILL == 0.75
    assert native_fold.FUSED_COLUMN_FOLD_MAX_GROUP == 64


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name, nblk, axis, rotation, rounding, dtype, fused", [
    ("e2m1", 7, -1, None, "rne", "float32", True),  # padded to 8; fold: one chunk, masked
    ("e2m1", 530, -1, "hadamard16", "rne", "bfloat16", False),  # > 512 blocks: chunks of
    #                                                      FOLD_ROW_LONG_CHUNK, the last short
    ("e3m2", 70, 0, None, "rne", "float32", False),  # axis 0 (Wgrad's); 70 of 128: too empty;
    #                                                   chunks of FOLD_ROW_CHUNK, the last short
    ("e2m3", 64, -1, "random_sign16:7", "stochastic", "bfloat16", True),  # a power of two
    ("e3m2", 24, -1, "hadamard16", "stochastic", "bfloat16", True)])  # padded to 32 blocks
def test_whole_row_fold_is_the_emulators(device, name, nblk, axis, rotation, rounding, dtype,
                                         fused):
    """``quantize_folded(x, fmt, None)`` and ``fold(mx, None)``: one exponent per whole row, any
    number of blocks (quantize, then ``fold_rows_kernel``: a program per ``fold_row_chunk``
    blocks of a row and a finishing launch per row; rows of at most FUSED_ROW_FOLD_MAX_GROUP
    (256) blocks along the last axis the quantize kernel folds in its own pass,
    ``fused_in_quantize``, a program per row padded to a power of two, and ``fold(mx, None)``
    takes the two launches), bit for bit ``emulator.fold.fold(mx, None)``: codes, exponents
    (a row of zeros: 0; a NaN block: NAN_EXPONENT), the rounded elements of blocks more than
    the fold range below their row's largest, the wide flag, 2^R as cuBLAS's rowwise scale;
    the MX codes come back (``unfold``) from every row the fold kept exact. ``fused``: whether
    the case's quantize pass folds (``fused_in_quantize``, on every device)."""
    import torch
    from ocpmx import native
    from ocpmx.emulator import MXArray
    from ocpmx.emulator.fold import unfold
    from ocpmx.native import fold as native_fold
    rows, k = 6, nblk * 32
    rng = np.random.default_rng(nblk)
    x = rng.standard_normal((rows, k)) * np.exp2(rng.integers(-4, 5, (rows, nblk))).repeat(32, 1)
    x[1, -32:] *= 2.0**-30  # a far block: rounded
    x[0, 32:64] = 0         # a zero block does not set R
    x[3] = 0                # a row of zeros: R = 0
    x[2, 40] = np.nan       # a NaN block: the row's R is NAN_EXPONENT
    xt = torch.from_numpy(x.astype(np.float32)).to(getattr(torch, dtype)).to(device)
    if axis == 0:
        xt = xt.t().contiguous()
    kw = dict(axis=axis, rotation=rotation, rounding=rounding, seed=5)
    assert native_fold.fused_in_quantize(xt, axis, nblk, native.default_tuning(xt.device)) == fused
    got = native_fold.quantize_folded(xt, name, None, pow2=True, **kw)
    mx = native.quantize(xt, name, **kw)
    ref = native_fold.fold(mx, None)
    e = mx.to_emulator()
    want = emulator.fold.fold(MXArray(np.moveaxis(e.codes, axis, -1),
                                      np.moveaxis(e.scales, axis, -1), FORMATS[name], 1), None)
    for f in (got, ref):
        assert f.group == nblk and f.exponents.shape == (rows, 1)
        assert np.array_equal(f.codes.cpu().numpy(), want.codes)
        assert np.array_equal(f.exponents.cpu().numpy(), want.exponents)
        assert int(f.inexact.item()) == want.inexact > 0
        assert int(f.wide.item()) == 1  # the NaN row
    assert want.exponents[3, 0] == 0 and want.exponents[2, 0] == NAN_EXPONENT
    assert torch.equal(got.pow2.view(torch.int32),
                       native_fold.group_scales(got).t().contiguous().view(torch.int32))
    sa, sb = native_fold.rowwise_scales(got, ref)
    assert sa.shape == (rows, 1) and sb.shape == (1, rows)
    back = unfold(Folded(got.codes.cpu().numpy(), got.scales.cpu().numpy(),
                         got.exponents.cpu().numpy(), nblk, FORMATS[name], 0))
    keep = [0, 3, 4, 5]  # not the rounded or the NaN row
    assert np.array_equal(back.codes[keep], np.moveaxis(e.codes, axis, -1)[keep])
    with pytest.raises(ValueError, match="whole rows"):
        native_fold.rowwise_scales(native_fold.fold(mx, 1), ref)
    for group in (3, nblk // 2 if nblk % 2 == 0 else nblk + 1):  # not a power of two, not
        if group & (group - 1):                                  # the row, or not dividing it
            with pytest.raises(ValueError, match="power of two dividing"):
                native_fold.quantize_folded(xt, name, group, **kw)


@pytest.mark.parametrize("device", __import__("native_util").devices())
def test_method_fp8_cublas_rowwise(device):
    """``mx_matmul(method="fp8_cublas_rowwise")``: cuBLAS's rowwise FP8 GEMM of operands folded
    whole rows, bit for bit ``emulator.fold.HOPPER_FP8_CUBLAS_ROWWISE`` (fitted to an H200's
    outputs) on random, outlier-heavy (block scales 2^+-40 apart: rounded folds, part of the
    model), exactly summable and E3M2 operands, K = 1024 and K = 160 (spans of 4 and 1 blocks);
    a NaN block's row NaN. On a CPU, and for M or N not multiples of 16, a ValueError."""
    import torch
    from ocpmx import native
    from ocpmx.conformance.backends import TritonBackend
    from ocpmx.conformance.strategies import exactly_summable_operand
    from ocpmx.emulator.fold import HOPPER_FP8_CUBLAS_ROWWISE
    rng = np.random.default_rng(16)
    x = torch.from_numpy(rng.standard_normal((48, 1024)).astype(np.float32)).to(device)
    w = torch.from_numpy(rng.standard_normal((32, 1024)).astype(np.float32)).to(device)
    qa, qb = native.quantize(x, "e2m1"), native.quantize(w, "e2m1")
    if device == "cpu":
        with pytest.raises(ValueError, match="CUDA"):
            native.mx_matmul(qa, qb, method="fp8_cublas_rowwise", backend="triton")
        return
    if torch.cuda.get_device_capability(device)[0] != 9:
        pytest.skip("the rowwise FP8 _scaled_mm's model was measured on sm_90")
    spread = torch.exp2(torch.from_numpy(rng.integers(-40, 41, (48, 32))).float()).to(device)
    outl = x * spread.repeat_interleave(32, 1)
    (ec, es), (fc, fs) = (exactly_summable_operand(rng, r, 1024, "e2m1") for r in (48, 32))
    mx = TritonBackend(device)._mx
    cases = [(qa, qb), (native.quantize(outl, "e2m1"), qb),
             (native.quantize(outl, "e3m2"), native.quantize(w, "e3m2")),
             (mx(ec, es, "e2m1", 1, 32), mx(fc, fs, "e2m1", 1, 32)),
             (native.quantize(outl[:, :160], "e2m1"), native.quantize(w[:, :160], "e2m1"))]
    for a, b in cases:
        for out_dtype in (torch.float32, torch.bfloat16):
            got = native.mx_matmul(a, b, method="fp8_cublas_rowwise", out_dtype=out_dtype)
            want = emulator.mx_matmul(a.to_emulator(), b.to_emulator(), HOPPER_FP8_CUBLAS_ROWWISE)
            want = torch.from_numpy(want).to(out_dtype)
            assert torch.equal(got.cpu().view(torch.int16 if out_dtype == torch.bfloat16 else
                                              torch.int32),
                               want.view(torch.int16 if out_dtype == torch.bfloat16 else
                                         torch.int32)), (a.fmt.name, a.shape, out_dtype)
    xn = x.clone()
    xn[3, 500] = float("nan")
    got = native.mx_matmul(native.quantize(xn, "e2m1"), qb, method="fp8_cublas_rowwise")
    got = got.cpu().numpy()
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, 0)).any()
    with pytest.raises(ValueError, match="multiples of 16"):
        native.mx_matmul(native.quantize(x[:40], "e2m1"), qb, method="fp8_cublas_rowwise")


@pytest.mark.parametrize("m, n, k", [(8192, 14336, 4096), (8192, 4096, 14336),
                                     (4096, 14336, 8192)])
def test_method_fp8_cublas_rowwise_at_llama_shapes(m, n, k):
    """At Llama-8B shapes ``fp8_cublas_rowwise`` gives the bits of the Triton folded GEMM on
    whole rows chained over spans of 4 blocks (``folded_matmul(span=4)``: Hopper's chained
    dot, the model's sums): random operands with block scales spread over 2^+-8; float32 and
    bf16 outputs."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (cuBLAS's rowwise FP8 GEMM and Hopper's dot)")
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    g = torch.Generator(device="cuda").manual_seed(m + n + k)

    def operand(rows):
        v = torch.randn(rows, k, device="cuda", generator=g)
        s = torch.randint(-8, 9, (rows, k // 32), device="cuda", generator=g).float()
        return native.quantize(v * torch.exp2(s).repeat_interleave(32, 1), "e2m1")
    qa, qb = operand(m), operand(n)
    want = native_fold.folded_matmul(native_fold.fold(qa, None), native_fold.fold(qb, None),
                                     promote=False, span=4)
    got = native.mx_matmul(qa, qb, method="fp8_cublas_rowwise")
    diff = (got.view(torch.int32) != want.view(torch.int32)).sum().item()
    assert diff == 0, f"{diff} of {m * n} outputs differ"
    got16 = native.mx_matmul(qa, qb, method="fp8_cublas_rowwise", out_dtype=torch.bfloat16)
    diff = (got16.view(torch.int16) != want.bfloat16().view(torch.int16)).sum().item()
    assert diff == 0, f"bf16 output: {diff} of {m * n} differ"


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("nblk", [24, 96])
def test_axis0_whole_rows_take_either_route_with_the_same_bits(device, nblk, monkeypatch):
    """Whole rows along axis 0 where plain quantize runs the column kernel and the fold's path
    is the transpose (the H100's and H200's tunings): up to ``FUSED_COLUMN_FOLD_MAX_GROUP``
    blocks the transpose and the row kernel's fused fold, longer rows the column kernel then
    the fold of its codes; each route, forced both ways, gives the emulator's codes, exponents
    and scales."""
    import dataclasses
    import torch
    from ocpmx import native
    from ocpmx.emulator import MXArray
    from ocpmx.native import fold as native_fold
    from ocpmx.native import plans
    tuning = dataclasses.replace(native.default_tuning(torch.device(device)), columns="kernel",
                                 columns_fold="transpose")
    rng = np.random.default_rng(nblk)
    x = rng.standard_normal((nblk * 32, 2)) * np.exp2(rng.integers(-3, 4, (nblk, 1))).repeat(32, 0)
    xt = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).to(device)
    kw = dict(axis=0, rotation="hadamard16", pow2=True, tuning=tuning)
    assert native_fold.fused_in_quantize(xt, 0, nblk, tuning) == (nblk <= 64)
    e = native.quantize(xt, "e2m1", axis=0, rotation="hadamard16",  # (the transpose: quicker
                        tuning=dataclasses.replace(tuning, columns="transpose")  # under the
                        ).to_emulator()  # interpreter than the column kernel, the same bits)
    want = emulator.fold.fold(MXArray(np.moveaxis(e.codes, 0, -1), np.moveaxis(e.scales, 0, -1),
                                      FORMATS["e2m1"], 1), None)
    for limit, fused in ((0, False), (1 << 10, True)):  # each route forced
        monkeypatch.setattr(native_fold, "FUSED_COLUMN_FOLD_MAX_GROUP", limit)
        plans.clear()
        assert native_fold.fused_in_quantize(xt, 0, nblk, tuning) == fused
        got = native_fold.quantize_folded(xt, "e2m1", None, **kw)
        assert np.array_equal(got.codes.cpu().numpy(), want.codes), limit
        assert np.array_equal(got.exponents.cpu().numpy(), want.exponents), limit
        assert np.array_equal(got.scales.cpu().numpy(), np.moveaxis(e.scales, 0, -1)), limit
    plans.clear()


@pytest.mark.parametrize("device", __import__("native_util").devices())
@pytest.mark.parametrize("name, path", [("e2m1", "words"), ("e2m1", "bytes"),
                                        ("e2m1", "misaligned"), ("e2m1", "words4"),
                                        ("e3m2", "words")])
def test_whole_row_fold_every_code_under_every_shift(device, name, path, monkeypatch):
    """``fold(mx, None)`` (``fold_rows_kernel``) on stored codes and scales made by hand: every
    code of the format under every shift of its fold range (a row of shifts D_MAX down to
    -5 folds in integer arithmetic for E2M1, a row reaching D_MIN and below through the float
    conversion), and rows whose largest scale's blocks hold only zero codes (R from the codes:
    the row folded again), bit for bit the emulator's fold. E2M1's integer path three ways:
    in 32-bit words (``FOLD_ROW_WORDS``, aligned codes; and codes 4 bytes past a 16-byte
    boundary: word loads without the 128-bit ones), a byte at a time, and codes one byte past an
    aligned address (the byte path whatever ``FOLD_ROW_WORDS`` says)."""
    import torch
    from ocpmx.conformance.backends import TritonBackend
    from ocpmx.emulator.fold import shift_range
    from ocpmx.native import fold as native_fold
    from ocpmx.native import plans
    monkeypatch.setattr(native_fold, "FOLD_ROW_WORDS", path != "bytes")
    plans.clear()  # (a plan made under the other setting would run its launches)
    fmt = FORMATS[name]
    d_min, d_max = shift_range(fmt)
    codes = np.arange(fmt.num_codes, dtype=np.uint8)
    nblk = 24
    block = np.resize(codes, 32)
    rows = []
    for low in (-5, d_min, d_min - 3):  # shifts d_max .. low, then repeated
        shifts = np.resize(np.arange(d_max, low - 1, -1), nblk)
        rows.append((np.tile(block, nblk), 140 + shifts - d_max))
    # the largest scale's blocks all zeros (R from the codes), or one of them nonzero
    zero_top = np.tile(block, nblk)
    zero_top[:64] = 0
    rows.append((zero_top, np.r_[[200, 200], np.full(nblk - 2, 130)]))
    one_top = np.tile(block, nblk)
    one_top[:32] = 0
    rows.append((one_top, np.r_[[200, 200], np.full(nblk - 2, 130)]))
    c = np.stack([r[0] for r in rows]).astype(np.uint8)
    s = np.stack([r[1] for r in rows]).astype(np.uint8)
    mx = TritonBackend(device)._mx(c, s, name, 1, 32)
    if path in ("misaligned", "words4"):
        off = 1 if path == "misaligned" else 4
        buf = torch.zeros(mx.data.numel() + off, dtype=torch.uint8, device=mx.data.device)
        mx.data = buf[off:].view(mx.data.shape).copy_(mx.data)
        assert mx.data.data_ptr() % 16 == off
    got = native_fold.fold(mx, None)
    plans.clear()
    want = emulator.fold.fold(emulator.MXArray(c, s, fmt, 1), None)
    assert np.array_equal(got.codes.cpu().numpy(), want.codes)
    assert np.array_equal(got.exponents.cpu().numpy(), want.exponents)
    assert int(got.inexact.item()) == want.inexact > 0
    assert want.exponents[3, 0] == 130 - 127 - d_max and want.exponents[4, 0] == 200 - 127 - d_max


@pytest.mark.parametrize("promote, group", [(True, 4), (False, 32), (True, 8), (False, 4)])
@pytest.mark.parametrize("m, n, k", [(8192, 4096, 4096), (200, 136, 2048), (132, 136, 1024)])
def test_wgmma_folded_gemm_gives_the_triton_kernels_bits(promote, group, m, n, k, monkeypatch):
    """The Gluon folded GEMM (``native.fold.folded_matmul_wgmma``: TMA, a producer warp, two
    consumer warpgroups, persistent) gives ``folded_matmul``'s bits (the Triton kernel's, the
    emulator's model) for each promotion and group, ragged tiles included, on operands with
    block scales over 2^+-12 (float32 and bf16 outputs; 2^R from the fold's group-major
    ``pow2`` and from the exponents), and again over 20 launches (a race shows in some launches
    only: benchmarks/fold_wgmma_stress.py found one in 11-20% of them), these through
    fastlaunch's direct call of the compiled kernel (``WGMMA_FAST_LAUNCH``); the promoted form
    plain and with LOOKAHEAD (halves at 128 and 64 columns, quarters); on a wide operand (an
    exponent past RANK1_EXP) the kernel's own general epilogue (WIDE) or, without it, the
    Triton kernel's behind a launch that computes nothing. On the small cases the emulator's
    sums as well."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU (the Gluon kernel is Hopper's)")
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    g = torch.Generator(device="cuda").manual_seed(m + n + k + group)

    def operand(rows, big=0.0, nan=False):
        v = torch.randn(rows, k, device="cuda", generator=g)
        s = torch.randint(-12, 13, (rows, k // 32), device="cuda", generator=g).float() + big
        x = v * torch.exp2(s).repeat_interleave(32, 1)
        if nan:  # a NaN block: its group's exponent NAN_EXPONENT, NaN down its row's outputs
            x[3, 40] = float("nan")
        return native.quantize(x, "e2m1")
    qa, qb = operand(m), operand(n)
    for pow2 in (False, True):
        # 2^R written by the fold kernel (pow2), or built from the exponents by the host
        fa, fb = native_fold.fold(qa, group, pow2), native_fold.fold(qb, group, pow2)
        assert (fa.pow2 is not None) == pow2
        for out, iv in ((torch.float32, torch.int32), (torch.bfloat16, torch.int16)):
            want = native_fold.folded_matmul(fa, fb, out, promote=promote, kernel="triton")
            got = native_fold.folded_matmul(fa, fb, out, promote=promote, kernel="gluon")
            diff = (got.view(iv) != want.view(iv)).sum().item()
            assert diff == 0, f"{out}: {diff} of {m * n} outputs differ"
    from ocpmx.native import fastlaunch
    monkeypatch.setattr(native_fold, "WGMMA_FAST_LAUNCH", True)  # launches after the first:
    fast = fastlaunch.STATS.fast  # the compiled kernel called directly (fastlaunch)
    for launch in range(20):  # (the loop's last: bf16 from the fold's 2^R)
        again = native_fold.folded_matmul(fa, fb, out, promote=promote, kernel="gluon")
        assert torch.equal(again.view(iv), want.view(iv)), f"launch {launch}"
    assert fastlaunch.STATS.fast - fast >= 19 or not fastlaunch.ENABLED
    monkeypatch.setattr(native_fold, "WGMMA_FAST_LAUNCH", False)
    fw = native_fold.fold(operand(n, big=60.0, nan=True), group)
    assert fw.wide.item() != 0
    want = native_fold.folded_matmul(fa, fw, promote=promote, kernel="triton")
    want_ab = native_fold.folded_matmul(fa, fb, promote=promote, kernel="triton")
    # the wide GEMM: the Triton kernel's general epilogue behind the Gluon launch, then (WIDE)
    # the Gluon kernel's own; and a GEMM without wide operands through the WIDE kernel
    want_wa = native_fold.folded_matmul(fw, fa, promote=promote, kernel="triton")
    assert want_wa[3].isnan().all() and want[:, 3].isnan().all()
    for wide_in_gluon in (False, True):
        monkeypatch.setattr(native_fold, "WGMMA_WIDE", wide_in_gluon)
        got = native_fold.folded_matmul(fa, fw, promote=promote)  # 'auto': Gluon's launch
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), wide_in_gluon
        got = native_fold.folded_matmul(fw, fa, promote=promote)  # A wide
        assert torch.equal(got.view(torch.int32), want_wa.view(torch.int32)), wide_in_gluon
        got = native_fold.folded_matmul(fa, fb, promote=promote)
        assert torch.equal(got.view(torch.int32), want_ab.view(torch.int32)), wide_in_gluon
    if promote:  # the promoted form's variants: the same sums in another order of issue
        for kw in (dict(lookahead=False), dict(lookahead=True), dict(bn=64, lookahead=True),
                   dict(lookahead=2)):
            got = native_fold.folded_matmul_wgmma(fa, fb, promote=True, **kw)
            assert torch.equal(got.view(torch.int32), want_ab.view(torch.int32)), kw
    monkeypatch.setattr(native_fold, "WGMMA_WIDE", False)
    if m * n <= 200 * 136:  # (M = 130 faulted: TMA reads 2^R rows starting on 16 bytes)
        ea, eb = fold(qa.to_emulator(), group), fold(qb.to_emulator(), group)
        ref = folded_matmul(ea, eb, "hopper", promote=32 if promote else 32 * group)
        got = native_fold.folded_matmul(fa, fb, promote=promote, kernel="gluon").cpu().numpy()
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_folded_matmul_kernel_choice_is_checked():
    """``folded_matmul(kernel=...)``: an unknown kernel and the Gluon one where it cannot run
    (off sm_90, a span) are refused by name, and so are the Gluon kernel's bad options (a
    lookahead not 0, 1 or 2; fewer than 2 stages; a tile width not 64 or 128); 'auto' falls
    back to the Triton kernel."""
    torch = pytest.importorskip("torch")
    from ocpmx import native
    from ocpmx.native import fold as native_fold
    x = torch.randn(32, 256)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not native.interpreting():
        pytest.skip("CPU tensors reach the Triton kernels through the interpreter only")
    f = native_fold.fold(native.quantize(x.to(device), "e2m1"), 4)
    with pytest.raises(ValueError, match="kernel must be"):
        native_fold.folded_matmul(f, f, kernel="cutlass")
    with pytest.raises(ValueError, match="no tile, k_per_dot or span"):
        native_fold.folded_matmul(f, f, kernel="gluon", k_per_dot=32)
    with pytest.raises(ValueError, match="sm_90 only|tiles are 128 x 128"):  # M = 32
        native_fold.folded_matmul(f, f, kernel="gluon")
    with pytest.raises(ValueError, match="lookahead is 0, 1 or 2, got 3"):
        native_fold.folded_matmul_wgmma(f, f, lookahead=3)
    with pytest.raises(ValueError, match="at least 2 stages"):
        native_fold.folded_matmul_wgmma(f, f, stages=1)
    with pytest.raises(ValueError, match="bn is 64 or 128, got 96"):
        native_fold.folded_matmul_wgmma(f, f, bn=96)
    want = native_fold.folded_matmul(f, f, kernel="triton")
    assert torch.equal(native_fold.folded_matmul(f, f).view(torch.int32), want.view(torch.int32))


def test_gluon_gemm_refuses_rows_tma_cannot_take(monkeypatch):
    """``fold.wgmma_supported`` names what the Gluon kernel cannot take (M or N not a
    multiple of 4: a group's 2^R run would start off 16 bytes, which faulted on an H200; tiles
    larger than the operands; groups of fewer than 4 blocks), so 'auto' keeps those on the
    Triton kernel: checked on the host, as if on sm_90."""
    torch = pytest.importorskip("torch")
    from ocpmx.native import fold as native_fold
    from ocpmx.spec import get_format
    monkeypatch.setattr(native_fold, "gluon_gemm_device", lambda device: True)

    def folded(rows, k=1024, group=4):
        return native_fold.FoldedTensor(torch.zeros(rows, k, dtype=torch.uint8),
                                        torch.zeros(rows, k // (32 * group), dtype=torch.int32),
                                        torch.zeros(rows, k // 32, dtype=torch.uint8), group,
                                        get_format("e2m1"), torch.zeros(2, dtype=torch.int64))
    assert native_fold.wgmma_supported(folded(132), folded(136), torch.float32) is None
    assert "multiples of 4" in native_fold.wgmma_supported(folded(130), folded(136),
                                                           torch.float32)
    assert "multiples of 4" in native_fold.wgmma_supported(folded(132), folded(138),
                                                           torch.float32)
    assert "16 bytes" in native_fold.wgmma_supported(folded(132), folded(132), torch.bfloat16)
    assert "tiles are" in native_fold.wgmma_supported(folded(64), folded(136), torch.float32)
    assert "multiples of 4 blocks" in native_fold.wgmma_supported(
        folded(132, group=2), folded(136, group=2), torch.float32)
    assert "up to 32" in native_fold.wgmma_supported(  # a whole row's group: Triton's
        folded(132, k=2048, group=64), folded(136, k=2048, group=64), torch.float32)
    assert native_fold.wgmma_supported(folded(132, group=32), folded(136, group=32),
                                       torch.bfloat16) is None
    with pytest.raises(ValueError, match="at least 2 stages"):
        native_fold.folded_matmul_wgmma(folded(132), folded(136), stages=1)


_SM90_GLUON = r"""
import json, os, sys
os.environ.pop("TRITON_INTERPRET", None)
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
from triton.runtime.jit import mangle_type
from ocpmx.audit.check import _nvidia_facts
from ocpmx.native import fold
from ocpmx.native.kernels import fold_wgmma
fn = fold_wgmma.folded_gemm_wgmma_kernel
half, bk = fold.WGMMA_HALF_M, fold.WGMMA_BK

def desc(shape, block, dtype, gtype):
    return mangle_type(TensorDescriptor.from_tensor(
        torch.empty(shape, dtype=dtype), block,
        gl.NVMMASharedLayout.get_default_for(block, gtype)))
out = []
W = fold.WGMMA_BN
for promote, group, wide, lookahead, bn in (
        (True, 4, False, 0, W), (False, 32, False, 0, W), (True, 4, True, 0, W),
        (False, 32, True, 0, W), (True, 4, True, 1, W), (True, 8, False, 1, W),
        (True, 4, False, 1, 64), (True, 4, True, 2, W), (True, 8, False, 2, W)):
    parts = (1, 2, 4)[lookahead]  # wgmmas per K = 32 slice (column parts of the tile)
    sig = {"a_desc": desc((8192, 4096), [2 * half, bk], torch.float8_e4m3fn, gl.float8e4nv),
           "b_desc": desc((4096, 4096), [bn, bk], torch.float8_e4m3fn, gl.float8e4nv),
           "c_desc": desc((8192, 4096), [half, bn // parts], torch.int16, gl.int16),
           "pa_desc": desc((8192 * 32,), [2 * half], torch.float32, gl.float32),
           "pb_desc": desc((4096 * 32,), [bn], torch.float32, gl.float32),
           "wide_a_ptr": "*i64", "wide_b_ptr": "*i64", "M": "i32", "N": "i32", "K": "i32"}
    consts = dict(GROUP=group, BN=bn, BK=bk, STAGES=fold.WGMMA_STAGES, PROMOTE=promote,
                  OUT_BF16=True, GROUP_M=8, WIDE=wide, LOOKAHEAD=lookahead)
    sig.update({c: "constexpr" for c in consts})
    src = GluonASTSource(fn, sig, {(fn.arg_names.index(c),): v for c, v in consts.items()},
                         {(i,): [["tt.divisibility", 16]] for i in (5, 6)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=4, maxnreg=168, enable_fp_fusion=False))
    facts = _nvidia_facts(k)
    sass = facts["text"]
    out.append(dict(promote=promote, group=group, wide=wide, lookahead=lookahead,
                    spills=facts["spills"], shared=int(k.metadata.shared),
                    qgmma=sass.count(f"QGMMA.64x{bn // parts}x32.F32.E4M3.E4M3"),
                    depbar=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1"),
                    depbar2=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x2"),
                    setmaxnreg=sass.count("USETMAXREG")))
print(json.dumps(out))
"""


def test_gluon_folded_gemm_compiles_for_sm90_without_spills():
    """The Gluon folded GEMM (``kernels.fold_wgmma``) compiled for sm_90a without the chip
    (the installed Triton and its ptxas; the GPU host's Triton 3.6 gave the same SASS as the
    tree whose bits were checked on an H200): both forms warp-specialized (register budgets
    set per partition), no register spilled, its stages within Hopper's 227 KiB of shared
    memory, and the wgmmas a consumer issues per K step: four K = 32 ones promoted one by one
    (PROMOTE), or one K = 128 dot (chained); two consumers. A spill or a lost stage here is a
    lost factor in speed, found on a CPU. Also with WIDE (the general epilogue in the kernel,
    ``native.fold.WGMMA_WIDE``) and LOOKAHEAD (``WGMMA_LOOKAHEAD``: 1, a wgmma per column half,
    each left in flight while the partial before it is added: waits that leave one pending;
    2, per column quarter with two in flight)."""
    import json
    import os
    import subprocess
    import sys
    pytest.importorskip("triton.experimental.gluon")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _SM90_GLUON], env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for f in json.loads(r.stdout.strip().splitlines()[-1]):
        assert not f["spills"], f
        assert f["setmaxnreg"] > 0 and f["shared"] <= 232448, f
        # two consumers, 4 K = 32 wgmmas each per 128 of K; chained: one group of 8 steps,
        # each step's K = 128 dot issued as 4 wgmmas, unrolled
        # (K = 256 groups: two steps, unrolled; lookahead: a wgmma per column half or
        # quarter)
        parts = (1, 2, 4)[f["lookahead"]]
        assert f["qgmma"] == (2 * parts * f["group"] if f["promote"] else 2 * 8 * 4), f
        # promoted with lookahead 1: each half-slice wgmma after a group's first slice waits
        # for the one before it only; with 2, every quarter wgmma from the third waits for
        # the one two before it, and the group's last but one is waited for with one left;
        # without, every wgmma is waited for at once (chained: one step behind)
        want = {0: 0 if f["promote"] else 2 * 7, 1: 2 * 2 * (f["group"] - 1), 2: 2}
        assert f["depbar"] == want[f["lookahead"]], f
        assert f["depbar2"] == (2 * (4 * f["group"] - 2) if f["lookahead"] == 2 else 0), f


def test_gluon_rank1_fma_premises_hold_on_the_whole_range():
    """The Gluon kernel's promoted epilogue (``kernels.fold_wgmma._rank1_add``) computes
    acc + (T 2^ea) 2^eb as one fused multiply-add with s = 2^(ea + eb) built from the float
    bits: the same bits as the three rounded operations exactly when both products are exact
    float32 values and s's bits are 2^(ea + eb). Checked here in numpy (GPU-free) over the
    range the kernel takes: |ea|, |eb| <= RANK1_EXP, T = 0 or a float32 multiple of 2^-18
    below 1024 * 448^2 (a group of at most WGMMA_MAX_GROUP blocks of E4M3 products), the
    extremes included; and the fused form against the three operations on random
    accumulators (numpy's float32 ops round to nearest even)."""
    from ocpmx.native import fold as native_fold
    from ocpmx.native.kernels.fold import RANK1_EXP
    bound = int(RANK1_EXP)
    top = native_fold.WGMMA_MAX_GROUP * 32 * 448.0 ** 2  # |T| below this
    rng = np.random.default_rng(0)
    # T: multiples of 2^-18 with 24-bit significands, from 2^-18 up to the top, both signs
    mant = rng.integers(1, 1 << 24, 4000)
    scale = np.exp2(rng.integers(0, 28, 4000).astype(np.float64) - 18)
    largest = float(np.nextafter(np.float32(top), np.float32(0)))
    # the extremes first, met by the extreme exponents below: the largest T at 2^+100, the
    # smallest at 2^-100 (overflow and subnormal edges)
    t = np.concatenate([[largest, 2.0 ** -18, largest, 2.0 ** -18], mant * scale])
    t = t[np.abs(t) < top]
    t = (t * rng.choice([-1.0, 1.0], t.size)).astype(np.float32)
    assert t.dtype == np.float32
    assert np.all(np.float64(t) % 2.0 ** -18 == 0) and np.abs(t).max() > 2.0 ** 27.5
    ea = rng.integers(-bound, bound + 1, t.size)
    eb = rng.integers(-bound, bound + 1, t.size)
    ea[:4], eb[:4] = (bound, -bound, bound, -bound), (bound, -bound, -bound, bound)
    sa, sb = np.exp2(ea).astype(np.float32), np.exp2(eb).astype(np.float32)
    # s from the bits as the kernel builds it: (bits(sa) - 127 << 23) + bits(sb)
    s = ((sa.view(np.int32) - (127 << 23)) + sb.view(np.int32)).view(np.float32)
    assert np.array_equal(np.float64(s), np.exp2(ea + eb))
    first = t * sa  # float32 products
    second = first * sb
    assert np.array_equal(np.float64(first), np.float64(t) * np.exp2(ea))  # exact
    assert np.array_equal(np.float64(second), np.float64(t) * np.exp2(ea + eb))  # exact
    assert np.all(np.abs(second[second != 0]) >= 2.0 ** -126)  # normal: no subnormal
    # so acc + T s rounds once either way: the fused form's bits are the three operations'
    acc = (rng.standard_normal(t.size) * np.exp2(rng.integers(-60, 60, t.size))).astype(
        np.float32)
    three = acc + second
    fused = np.float32(np.float64(acc) + np.float64(t) * np.float64(s))  # exact sum in float64
    exact = np.abs(np.log2(np.abs(acc) + 1e-300) - np.log2(np.abs(second) + 1e-300)) < 28
    assert exact.sum() > 300  # (where the float64 sum is exact: both within 28 octaves)
    assert np.array_equal(three[exact].view(np.int32), fused[exact].view(np.int32))
