"""native.mx_matmul(method='emulate', model=...): the Triton GEMM that sums MX products under a
declared accumulation model, bit for bit the emulator's mx_matmul (issue 23), on the GPU and
through the interpreter: random and outlier-heavy operands, every format, special values,
overflow and subnormal results, and the models it refuses."""
import numpy as np
import pytest
import torch

from native_util import devices
from ocpmx import emulator, native
from ocpmx.emulator.accumulate import ChunkedModel

MODELS = {"hopper_bf16": "hopper_bf16", "hopper_fp8": "hopper_fp8",
          "fp32_sequential": "fp32_sequential",
          "chunk48_rne": ChunkedModel(48, 20, "rne", "rne"),
          "chunk8_trunc": ChunkedModel(8, 6, "truncate", "rne"),
          # chunks inside a block: RNE alignment, and int64 sums
          "chunk16_rne": ChunkedModel(16, 10, "rne", "rne"),
          "chunk32_f30": ChunkedModel(32, 30, "truncate", "rtz")}
# two format pairs per model keep the interpreter's time down; together they cover every format
PAIRS = {"hopper_bf16": [("e4m3", "e4m3"), ("e3m2", "e2m1")],
         "hopper_fp8": [("e5m2", "e4m3"), ("int8", "e2m3")],
         "fp32_sequential": [("e2m1", "e2m1"), ("e4m3", "e5m2")],
         "chunk48_rne": [("e2m3", "e3m2"), ("int8", "int8")],
         "chunk8_trunc": [("e4m3", "e2m1"), ("e5m2", "e2m1")],
         "chunk16_rne": [("e4m3", "e4m3"), ("e2m1", "e5m2")],
         "chunk32_f30": [("e5m2", "e5m2"), ("int8", "e4m3")]}


def _same(got, want):
    return (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))


def _check(x, w, fa, fb, model, device, edit=None):
    qa = native.quantize(torch.from_numpy(x).to(device), fa, backend="triton")
    qb = native.quantize(torch.from_numpy(w).to(device), fb, backend="triton")
    if edit is not None:
        edit(qa, qb)
    got = native.mx_matmul(qa, qb, method="emulate", model=model,
                           backend="triton").cpu().numpy()
    want = emulator.mx_matmul(qa.to_emulator(), qb.to_emulator(), model)
    same = _same(got, want)
    if not same.all():  # which side moved: the emulator's per-element reference decides
        ref = emulator.mx_matmul(qa.to_emulator(), qb.to_emulator(), model, path="reference")
        raise AssertionError(
            f"{int((~same).sum())} of {same.size} outputs differ; the emulator's fast path "
            f"{'equals' if _same(want, ref).all() else 'DIFFERS FROM'} its reference, the "
            f"kernel equals the reference in {int(_same(got, ref).sum())} outputs")
    return got


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("name", list(MODELS))
def test_emulate_is_the_emulators_model(device, name):
    """Random operands whose blocks are orders of magnitude apart (so alignments truncate),
    K = 160 (five blocks: chunks of 48 and 8 straddle them), ragged M and N."""
    rng = np.random.default_rng(len(name))
    for fa, fb in PAIRS[name]:
        x = (rng.standard_normal((19, 160)) *
             np.exp(rng.normal(0, 3, (19, 5))).repeat(32, 1)).astype(np.float32)
        w = (rng.standard_normal((21, 160)) *
             np.exp(rng.normal(0, 3, (21, 5))).repeat(32, 1)).astype(np.float32)
        got = _check(x, w, fa, fb, MODELS[name], device)
        if name == "hopper_bf16" and fa == "e4m3":  # the model is not the exact sum here
            qa, qb = emulator.quantize(x, fa), emulator.quantize(w, fb)
            assert not np.array_equal(got, emulator.mx_matmul(qa, qb, "exact"))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("name", ["hopper_bf16", "fp32_sequential", "chunk8_trunc"])
def test_emulate_special_values_and_range_ends(device, name):
    """NaN and Inf elements (a block holding one gets the NaN scale: whole rows of NaN),
    E5M2 Inf codes under a finite scale (put in by hand: +-Inf outputs, +Inf + -Inf and
    Inf * 0 = NaN), sums past float32's range (RNE: Inf; RTZ: the largest finite) and
    subnormal outputs."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    w[3, 7] = -np.inf
    x[4:6] *= np.float32(2.0**120)   # sums near and past 2^128
    w[4:6] *= np.float32(2.0**7)
    x[6:8] *= np.float32(2.0**-70)   # sums in float32's subnormal range
    w[6:8] *= np.float32(2.0**-70)
    x[9, 10] = 0.0
    x[2, 10] = x[2, 12] = 1.0

    def inf_codes(qa, qb):  # E5M2 codes of b: +Inf at (10, 10), -Inf at (11, 12) and (12, 10)
        qb.data[10, 10], qb.data[11, 12], qb.data[12, 10], qb.data[12, 12] = 0x7C, 0xFC, 0xFC, 0x7C
    got = _check(x, w, "e4m3", "e4m3", MODELS[name], device)
    assert np.isnan(got[0]).all() and np.isnan(got[1]).all() and np.isnan(got[:, 3]).all()
    tiny = np.abs(got[6:8, 6:8])
    assert ((tiny > 0) & (tiny < np.float32(2.0**-126))).any()
    if name == "hopper_bf16":  # RTZ output: the overflowing sums saturate
        assert (np.abs(got[4:6, 4:6]) == np.finfo(np.float32).max).any()
    else:  # RNE output: they are +-Inf
        assert np.isinf(got[4:6, 4:6]).any()
    got = _check(x, w, "e2m1", "e5m2", MODELS[name], device, inf_codes)
    assert got[2, 10] == np.inf and got[2, 11] == -np.inf and np.isnan(got[2, 12])
    assert np.isnan(got[9, 10])  # Inf * 0


@pytest.mark.parametrize("device", devices())
def test_emulate_refuses_what_it_cannot_hold(device):
    q = native.quantize(torch.ones(4, 64, device=device), "e5m2", backend="triton")
    with pytest.raises(ValueError, match="no 'exact' model"):
        native.mx_matmul(q, q, method="emulate", model="exact", backend="triton")
    with pytest.raises(ValueError, match="cannot hold a block's exact sum of e5m2 x e5m2"):
        native.mx_matmul(q, q, method="emulate", model="fp32_sequential", backend="triton")
    with pytest.raises(ValueError, match="does not fit a 64-bit sum"):
        native.mx_matmul(q, q, method="emulate", model=ChunkedModel(1 << 14, 48),
                          backend="triton")
    with pytest.raises(ValueError, match="unknown accumulation model"):
        native.mx_matmul(q, q, method="emulate", model="tpu", backend="triton")


@pytest.mark.parametrize("device", devices())
def test_mxlinear_accumulation_through_the_triton_gemm(device):
    """MXLinear(accumulation=...) takes the Triton emulate GEMM where the tensors are not on
    the CPU: on a GPU, MXLinear's own GEMM function with CUDA tensors; on the interpreter, the
    same quantize + emulate calls it makes. Either must equal the CPU emulator path of MXLinear
    for Fprop, Dgrad and Wgrad (operands along both axes)."""
    from ocpmx.native.linear import GemmContext, _emulated_gemm
    from ocpmx.native.recipes import get_recipe
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((32, 96)).astype(np.float32))
    gy = torch.from_numpy(rng.standard_normal((64, 32)).astype(np.float32))
    g = get_recipe("mxfp4_all_h16").fprop
    ctx = GemmContext(accumulation="hopper_bf16")
    for gemm, a, aa, b, ba in (("fprop", x, 1, w, 1), ("dgrad", gy, 1, w, 0),
                               ("wgrad", gy, 0, x, 0)):
        want = _emulated_gemm(gemm, g, a, aa, b, ba, torch.float32, ctx, None)
        if device == "cuda":
            got = _emulated_gemm(gemm, g, a.cuda(), aa, b.cuda(), ba, torch.float32, ctx,
                                 None).cpu()
        else:
            qa = native.quantize(a, "e2m1", axis=aa, scale_rule="even", rotation="hadamard16",
                                 backend="triton")
            qb = native.quantize(b, "e2m1", axis=ba, scale_rule="even", rotation="hadamard16",
                                 backend="triton")
            got = native.mx_matmul(qa, qb, method="emulate", model="hopper_bf16",
                                   backend="triton")
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), gemm
