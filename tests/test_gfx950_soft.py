"""AMD gfx950's conversion in software on the Triton backend (issue 18: AMD's stochastic
rounding beside the project's own): ``native.quantize(..., conversion='gfx950')`` off a gfx950
GPU runs ``kernels.gfx950.quantize_gfx950_kernel`` with ``HW=False`` (``convert_soft``), which
must give the bits of AMD's conversion model (``emulator.gfx950``) code for code and scale for
scale: every bfloat16 and float16 bit pattern as a source, both roundings, every float format,
on the interpreter here and on the GPU where there is one (a gfx950 GPU runs the instructions
instead: tests/test_gfx950_hardware.py)."""
import ml_dtypes
import numpy as np
import pytest
import torch

from native_util import devices
from ocpmx import emulator, native
from ocpmx.native.dispatch import gfx950

FORMATS = ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2")
SOURCES = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16}


def _soft_devices():
    return [d for d in devices() if not gfx950(torch.device(d))]


def _check(x: torch.Tensor, src: np.ndarray, fmt, device, **kw):
    got = native.quantize(x.to(device), fmt, conversion="gfx950", backend="triton",
                          **kw).to_emulator()
    want = emulator.quantize(src, fmt, conversion="gfx950", **kw)
    assert np.array_equal(got.scales, want.scales), "scales"
    bad = np.argwhere(got.codes != want.codes)
    assert not len(bad), (f"{len(bad)} codes differ, first at {bad[0]}: source "
                          f"{src[tuple(bad[0])]!r}, got {got.codes[tuple(bad[0])]:#04x}, model "
                          f"{want.codes[tuple(bad[0])]:#04x}")


def _every_16bit_pattern(dtype) -> tuple[torch.Tensor, np.ndarray]:
    """All 2^16 bit patterns of a 16-bit float in blocks of neighbours by magnitude (each
    element under the scale its own binade sets: the top of the element grid, overflow past the
    largest code), then a quarter of them shuffled (blocks spanning the whole range: subnormal
    targets, flushes to zero, NaN and Inf blocks)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    mag = np.abs(bits.view(SOURCES[dtype]).astype(np.float32))
    mag[np.isnan(mag)] = np.inf
    rng = np.random.default_rng(7)
    raw = np.concatenate([bits[np.argsort(mag, kind="stable")],
                          rng.permutation(bits)[: 1 << 14]]).reshape(-1, 1024)
    return torch.from_numpy(raw.view(np.int16)).view(dtype), raw.view(SOURCES[dtype])


@pytest.mark.parametrize("device", _soft_devices())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_16bit_source_converts_as_amds_model(device, dtype, fmt):
    """Under stochastic rounding a 16-bit source adds its own (fewer) random bits (rule 8)."""
    x, src = _every_16bit_pattern(dtype)
    for rounding in ("rne", "stochastic"):
        _check(x, src, fmt, device, rounding=rounding, seed=5)


@pytest.mark.parametrize("device", _soft_devices())
@pytest.mark.parametrize("rule", ["floor", "ceil", "rceil", "even"])
def test_float32_any_axis_every_rule(device, rule):
    """float32 blocks across the E8M0 range with NaN, +-Inf, zeros, float32 subnormals and
    values past each format's largest; along the last axis and along tokens (axis 0)."""
    rng = np.random.default_rng(len(rule))
    x = rng.standard_normal((64, 256)) * np.exp2(rng.integers(-140, 120, (64, 8))).repeat(32, 1)
    x = x.astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    x[1, :32] = np.float32(1e-42)
    x[2, :32] = np.linspace(-500.0, 500.0, 32)
    x[3, :32] = np.float32(-0.0)
    for fmt in FORMATS:
        for rounding, axis in (("rne", -1), ("stochastic", -1), ("stochastic", 0)):
            _check(torch.from_numpy(x), x, fmt, device, rounding=rounding, seed=11, axis=axis,
                   scale_rule=rule)


@pytest.mark.parametrize("device", _soft_devices())
def test_stochastic_words_follow_the_seed(device):
    """A different seed gives different codes (the words are drawn, not fixed), the same seed
    the same codes, and RNE differs from both: what the model check above could not show if
    the kernel ignored its words in the same way as a model that did."""
    x = torch.randn(16, 256) * 3
    q = [native.quantize(x.to(device), "e2m1", rounding=r, seed=s, conversion="gfx950",
                         backend="triton").data.cpu() for r, s in
         (("stochastic", 1), ("stochastic", 1), ("stochastic", 2), ("rne", 1))]
    assert torch.equal(q[0], q[1])
    assert not torch.equal(q[0], q[2]) and not torch.equal(q[0], q[3])


@pytest.mark.parametrize("device", _soft_devices())
def test_keys_dequantize_and_compile_take_the_same_bits(device):
    """What MXLinear runs: the seed read from a key tensor (as compiled graphs and CUDA graphs
    take per-step bits), ``quantize_dequantize``, and both under ``torch.compile``; each the
    bits of ``quantize(..., seed=)``."""
    torch.manual_seed(0)
    x = (torch.randn(64, 128) * 5).bfloat16().to(device)
    kw = dict(rounding="stochastic", scale_rule="even", conversion="gfx950", axis=0)
    want = native.quantize(x, "e2m1", seed=21, **kw)
    keys = torch.tensor([21, 0], dtype=torch.int64, device=device)
    assert torch.equal(native.quantize(x, "e2m1", keys=keys, **kw).data, want.data)
    want_qdq = native.dequantize(want, torch.bfloat16)
    assert torch.equal(native.quantize_dequantize(x, "e2m1", keys=keys, **kw), want_qdq)
    f = torch.compile(lambda t, k: (native.quantize(t, "e2m1", keys=k, **kw).data,
                                    native.quantize_dequantize(t, "e2m1", keys=k, **kw)),
                      fullgraph=True, backend="aot_eager")
    data, qdq = f(x, keys)
    assert torch.equal(data, want.data) and torch.equal(qdq, want_qdq)
    # and the OCP conversion differs: the argument reached the kernel
    assert not torch.equal(native.quantize(x, "e2m1", seed=21, rounding="stochastic",
                                           scale_rule="even", axis=0).data, want.data)


@pytest.mark.parametrize("device", _soft_devices())
def test_refusals_name_the_problem(device):
    x = torch.randn(32, 64, device=device)
    with pytest.raises(ValueError, match="MXINT8 has no"):
        native.quantize(x, "int8", conversion="gfx950", backend="triton")
    with pytest.raises(ValueError, match="without a rotation"):
        native.quantize(x, "e2m1", conversion="gfx950", rotation="hadamard16", backend="triton")
    with pytest.raises(ValueError, match="blocks of 32"):
        native.quantize(x, "e2m1", conversion="gfx950", block_size=16, backend="triton")
    with pytest.raises(ValueError, match="takes no rotation"):
        native.GemmRecipe("mxfp4", rotation="hadamard16", conversion="gfx950")
    with pytest.raises(ValueError, match="MX formats only"):
        native.GemmRecipe("bf16", conversion="gfx950")
    assert native.GemmRecipe("mxfp4", conversion="OCP").conversion == "ocp"  # one spelling
    with pytest.raises(ValueError, match="folds OCP conversions only"):
        lin = native.MXLinear(64, 32, recipe="mxfp4_wgrad_sr_gfx950", method="fp8_exact",
                              device=device)
        lin(torch.randn(32, 64, device=device, requires_grad=True)).sum().backward()
