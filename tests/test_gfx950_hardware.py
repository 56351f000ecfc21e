"""quantize(..., conversion='gfx950') on an MI350X/MI355X (``ocpmx.native.kernels.gfx950``)
against AMD's conversion model (``emulator.gfx950``), bit for bit: gfx950's own conversion
instructions where the kernel has them (FP4, E4M3, E5M2; stochastic rounding from float32), the
kernel's software conversion for the rest (its stochastic cases from bfloat16/float16 check the
software path against the model, not the silicon: the kernel has no 16-bit-source stochastic
instruction). The check that proves the model, and the kernel, on the chip. It needs one: on any
other machine it skips (the kernel's compilation for gfx950 and its instructions are checked
everywhere by tests/test_audit.py). Run on a gfx950 machine with
``pytest tests/test_gfx950_hardware.py -rA`` and send the log back (docs/conformance-on-new-
hardware.md, section 6)."""
import ml_dtypes
import numpy as np
import pytest
import torch

from ocpmx import emulator, native
from ocpmx.native.dispatch import gfx950

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and gfx950(torch.device("cuda"))),
    reason="needs an AMD gfx950 GPU (MI350X/MI355X): the instructions exist nowhere else")


def _operand(rng, rows, k, dtype):
    """Blocks of Gaussian values times powers of two across the E8M0 range, with NaN, +-Inf,
    zeros, subnormal float32 and values just past each format's largest after the scale."""
    x = rng.standard_normal((rows, k)) * np.exp2(rng.integers(-140, 120, (rows, k // 32)))\
        .repeat(32, 1)
    x = x.astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    x[1, :32] = np.float32(1e-42)                 # a block of float32 subnormals
    x[2, :32] = np.linspace(-500.0, 500.0, 32)    # E4M3 overflow under the floor rule
    x[3, :32] = np.float32(-0.0)
    return torch.from_numpy(x).to(dtype)


@pytest.mark.parametrize("fmt", ["e2m1", "e4m3", "e5m2"])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rule", ["floor", "even"])
def test_hardware_is_amds_model(fmt, rounding, dtype, rule):
    # (stochastic from bfloat16/float16: the kernel's software conversion on gfx950 too)
    rng = np.random.default_rng(hash((fmt, rounding, str(dtype), rule)) % 2**32)
    x = _operand(rng, 64, 512, dtype)
    for axis in (-1, 0):
        got = native.quantize(x.cuda(), fmt, axis=axis, rounding=rounding, seed=11,
                              scale_rule=rule, conversion="gfx950").to_emulator()
        src = x.float().numpy() if dtype == torch.float32 else x.view(torch.int16).numpy()
        if dtype != torch.float32:
            src = src.view(ml_dtypes.bfloat16 if dtype == torch.bfloat16 else np.float16)
        want = emulator.quantize(src, fmt, axis=axis, rounding=rounding, seed=11,
                                 scale_rule=rule, conversion="gfx950")
        assert np.array_equal(got.scales, want.scales), (axis, "scales")
        bad = np.argwhere(got.codes != want.codes)
        assert not len(bad), (f"axis={axis}: {len(bad)} codes differ, first at {bad[0]}: "
                              f"got {got.codes[tuple(bad[0])]:#04x}, "
                              f"model {want.codes[tuple(bad[0])]:#04x}")


def test_refusals_and_software_cases():
    """What the kernel does not do is refused; what gfx950's instructions lack in the kernel
    (FP6, stochastic from 16-bit sources) runs in software there, as the model says."""
    x = torch.randn(32, 64, device="cuda")
    with pytest.raises(ValueError, match="without a rotation"):
        native.quantize(x, "e2m1", conversion="gfx950", rotation="hadamard16")
    for fmt, src in (("e3m2", x), ("e2m1", x.bfloat16())):
        got = native.quantize(src, fmt, conversion="gfx950", rounding="stochastic", seed=3)
        want = emulator.quantize(src.float().cpu().numpy() if src.dtype == torch.float32 else
                                 src.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16),
                                 fmt, conversion="gfx950", rounding="stochastic", seed=3)
        assert np.array_equal(got.to_emulator().codes, want.codes)
