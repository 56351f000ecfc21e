"""MX GEMM through tl.dot_scaled, against the emulator's accumulation models.

Accumulation order is not bit-exact across chips by nature, so: inputs whose every partial sum
is exact in float32 must give bit-exact results; random inputs must stay inside the float32
accumulation bound, and the measured difference is printed (pytest -s) and recorded.
"""
import numpy as np
import pytest
import torch

from ocpmx import emulator, native
from ocpmx.conformance.strategies import exactly_summable_operand
from ocpmx.native import MXTensor
from ocpmx.spec import get_format
from native_util import devices

PAIRS = [("e2m1", "e2m1"), ("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e2m1", "e4m3")]


def exact_operand(rng, rows, k, fmt, device):
    """The conformance suite's exactly summable operand, as an MXTensor on ``device``."""
    f = get_format(fmt)
    codes, scales = exactly_summable_operand(rng, rows, k, fmt)
    data = emulator.pack(codes, f) if f.bits == 4 else codes
    return MXTensor(torch.from_numpy(data).to(device), torch.from_numpy(scales).to(device), f, 1,
                    (rows, k))


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_exactly_summable_inputs_are_bit_exact(device, fa, fb):
    rng = np.random.default_rng(0)
    a = exact_operand(rng, 40, 256, fa, device)
    b = exact_operand(rng, 24, 256, fb, device)
    got = native.mx_matmul(a, b).cpu().numpy()
    want = emulator.mx_matmul(a.to_emulator(), b.to_emulator(), "exact")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    got16 = native.mx_matmul(a, b, out_dtype=torch.bfloat16).cpu()
    assert torch.equal(got16, torch.from_numpy(want).to(torch.bfloat16))


def accumulation_bound(a, b):
    """|fl(sum) - sum| <= gamma_K * sum|a_k b_k| for any order of float32 additions."""
    da = np.abs(emulator.dequantize(a).astype(np.float64))
    db = np.abs(emulator.dequantize(b).astype(np.float64))
    k = da.shape[1]
    return (k * 2.0**-24 / (1 - k * 2.0**-24)) * (da @ db.T)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fa,fb", PAIRS)
def test_training_gemms_on_random_inputs(device, fa, fb, record_property):
    """Fprop, Dgrad and Wgrad orientations (operands quantized along rows or columns)."""
    rng = np.random.default_rng(1)
    t, n_in, n_out = 96, 64, 160
    x = torch.from_numpy(rng.standard_normal((t, n_in)).astype(np.float32)).to(device)
    w = torch.from_numpy(rng.standard_normal((n_out, n_in)).astype(np.float32)).to(device)
    dy = torch.from_numpy(rng.standard_normal((t, n_out)).astype(np.float32)).to(device)
    cases = {"fprop": ((x, -1), (w, -1)), "dgrad": ((dy, -1), (w, 0)), "wgrad": ((dy, 0), (x, 0))}
    worst = 0.0
    for name, ((p, pa), (q, qa)) in cases.items():
        a = native.quantize(p, fa, axis=pa, rotation="hadamard16")
        b = native.quantize(q, fb, axis=qa, rotation="hadamard16")
        got = native.mx_matmul(a, b).cpu().numpy().astype(np.float64)
        ea = emulator.quantize(p.cpu().numpy(), fa, axis=pa, rotation="hadamard16")
        eb = emulator.quantize(q.cpu().numpy(), fb, axis=qa, rotation="hadamard16")
        if pa == 0:
            ea = emulator.MXArray(ea.codes.T.copy(), ea.scales.T.copy(), ea.fmt, 1)
        if qa == 0:
            eb = emulator.MXArray(eb.codes.T.copy(), eb.scales.T.copy(), eb.fmt, 1)
        want = emulator.mx_matmul(ea, eb, "exact").astype(np.float64)
        assert got.shape == want.shape
        bound = accumulation_bound(ea, eb) + np.abs(want) * 2.0**-24  # + the final rounding
        assert np.all(np.abs(got - want) <= bound), name
        worst = max(worst, float(np.max(np.abs(got - want) / bound)))
    record_property("max |got - exact| / bound", worst)
    print(f"\n{device} {fa}x{fb}: max |dot_scaled - exact| = {worst:.3g} of the fp32 bound")


@pytest.mark.parametrize("device", devices())
def test_bf16_method_forms_the_same_products(device):
    """method='bf16' (dequantize + one bf16 GEMM): exactly summable inputs give the exact sum."""
    rng = np.random.default_rng(5)
    a = exact_operand(rng, 40, 256, "e2m1", device)
    b = exact_operand(rng, 24, 256, "e4m3", device)
    want = emulator.mx_matmul(a.to_emulator(), b.to_emulator(), "exact")
    got = native.mx_matmul(a, b, method="bf16").cpu().numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="unknown method"):
        native.mx_matmul(a, b, method="cublas")


@pytest.mark.parametrize("device", devices())
def test_emulator_backend_and_models(device):
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((32, 128)).astype(np.float32)).to(device)
    a, b = native.quantize(x, "e2m1"), native.quantize(x[:16], "e2m1")
    got = native.mx_matmul(a, b, backend="emulator", model="hopper_bf16")
    want = emulator.mx_matmul(a.to_emulator(), b.to_emulator(), "hopper_bf16")
    assert np.array_equal(got.cpu().numpy(), want) and got.device == x.device


def test_gemm_errors():
    d = devices()[0]
    x = torch.zeros(32, 64, device=d)
    a = native.quantize(x, "e2m1")
    with pytest.raises(ValueError, match="contraction lengths differ"):
        native.mx_matmul(a, native.quantize(torch.zeros(8, 32, device=d), "e2m1"))
    with pytest.raises(ValueError, match="different rotations"):
        native.mx_matmul(a, native.quantize(x, "e2m1", rotation="hadamard16"))
    with pytest.raises(ValueError, match="tl.dot_scaled takes"):
        native.mx_matmul(a, native.quantize(x, "e3m2"))
    with pytest.raises(ValueError, match="block size 32"):
        native.mx_matmul(a, native.quantize(x, "e2m1", block_size=16))
    with pytest.raises(TypeError, match="MXTensor"):
        native.mx_matmul(a, x)
    meta = MXTensor(a.data.to("meta"), a.scales_kmajor.to("meta"), a.fmt, 1, a.shape)
    with pytest.raises(ValueError, match="different devices"):
        native.mx_matmul(a, meta)
    with pytest.raises(TypeError, match="out_dtype"):
        native.mx_matmul(a, a, out_dtype=torch.float16)


def test_baselines():
    rng = np.random.default_rng(3)
    a = torch.from_numpy(rng.standard_normal((64, 128)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal((32, 128)).astype(np.float32))
    assert torch.equal(native.bf16_matmul(a, b), a.bfloat16() @ b.bfloat16().t())
    a8, sa = native.fp8_per_tensor(a, "e4m3")
    assert a8.dtype == torch.float8_e4m3fn and a8.float().abs().max() == 448.0
    assert float(sa) == float(a.abs().max() / 448.0)
    b8, sb = native.fp8_per_tensor(b, "e5m2")
    assert b8.dtype == torch.float8_e5m2 and b8.float().abs().max() == 57344.0
    got = native.fp8_matmul(a, b, "e4m3", "e5m2", out_dtype=torch.float32)
    assert torch.equal(got, (a8.float() * sa) @ (b8.float() * sb).t())
    rel = (got - a @ b.t()).norm() / (a @ b.t()).norm()
    assert 1e-4 < rel < 0.1  # FP8 error: present, and small
    z8, zs = native.fp8_per_tensor(torch.zeros(4, 4))
    assert float(zs) == 1.0 and torch.equal(z8.float(), torch.zeros(4, 4))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="a measured fact about Triton's dot_scaled decomposition on sm_90")
def test_hopper_decomposition_is_the_hopper_bf16_model():
    """On sm_90 Triton upcasts the MX operands to bf16 and runs a bf16 wgmma; measured on H100
    (Triton 3.6): bit-equal to the emulator's ChunkedModel(16 products, 25 fraction bits,
    truncation, round toward zero) on random e4m3 inputs (e2m1 products sum exactly here)."""
    rng = np.random.default_rng(4)
    a = torch.from_numpy(rng.standard_normal((64, 4096)).astype(np.float32)).cuda()
    b = torch.from_numpy(rng.standard_normal((64, 4096)).astype(np.float32)).cuda()
    qa, qb = native.quantize(a, "e4m3"), native.quantize(b, "e4m3")
    got = native.mx_matmul(qa, qb, method="dot_scaled").cpu().numpy()
    want = emulator.mx_matmul(qa.to_emulator(), qb.to_emulator(), "hopper_bf16")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    exact = emulator.mx_matmul(qa.to_emulator(), qb.to_emulator(), "exact")
    assert not np.array_equal(got, exact)  # the model is not trivially the exact sum here
