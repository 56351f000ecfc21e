"""The float32/RNE fast kernel must equal the readable reference kernel bit for bit."""
import ml_dtypes
import numpy as np
import pytest

from ocpmx.emulator import quantize

ALL_BF16_BLOCKS = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32).reshape(-1, 32)


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("rule", ["floor", "ceil", "rceil", "even"])
def test_fast_equals_reference(name, rule):
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal((2048, 32)) * np.exp(rng.normal(0, 10, (2048, 1)))).astype(np.float32)
    x = np.concatenate([ALL_BF16_BLOCKS, wide, np.sort(wide, axis=1)])
    a = quantize(x, name, scale_rule=rule, path="fast")
    b = quantize(x, name, scale_rule=rule, path="reference")
    assert np.array_equal(a.scales, b.scales)
    assert np.array_equal(a.codes, b.codes)


def test_path_really_switches(monkeypatch):
    """'reference' runs the reference kernel, 'fast' and 'auto' (float32, RNE) the fast one, and
    'fast' refuses what it cannot do."""
    import ocpmx.emulator.fast_kernels as fast
    import ocpmx.emulator.reference_kernels as ref
    calls = []
    monkeypatch.setattr(ref, "quantize_rows", lambda *a: calls.append("reference"))
    monkeypatch.setattr(fast, "quantize_rows_fast", lambda *a: calls.append("fast"))
    x = np.ones((1, 32), np.float32)
    for path in ("reference", "fast", "auto"):
        quantize(x, "e2m1", path=path)
    quantize(x, "e2m1", rounding="stochastic")
    assert calls == ["reference", "fast", "fast", "reference"]
    with pytest.raises(ValueError, match="fast path takes float32 data"):
        quantize(x.astype(np.float64), "e2m1", path="fast")
    with pytest.raises(ValueError, match="unknown path"):
        quantize(x, "e2m1", path="quick")
