"""The float32/RNE fast kernel must equal the generic integer kernel bit for bit."""
import ml_dtypes
import numpy as np
import pytest

import ocpmx.emulator.block_quantize as q
from ocpmx.emulator import quantize

ALL_BF16_BLOCKS = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32).reshape(-1, 32)


@pytest.fixture
def generic():
    def run(*args, **kw):
        q._GENERIC_ONLY = True
        try:
            return quantize(*args, **kw)
        finally:
            q._GENERIC_ONLY = False
    return run


@pytest.mark.parametrize("name", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2", "int8"])
@pytest.mark.parametrize("rule", ["floor", "ceil", "rceil", "even"])
def test_fast_equals_generic(name, rule, generic):
    rng = np.random.default_rng(0)
    wide = (rng.standard_normal((2048, 32)) * np.exp(rng.normal(0, 10, (2048, 1)))).astype(np.float32)
    x = np.concatenate([ALL_BF16_BLOCKS, wide, np.sort(wide, axis=1)])
    a = quantize(x, name, scale_rule=rule)
    b = generic(x, name, scale_rule=rule)
    assert np.array_equal(a.scales, b.scales)
    assert np.array_equal(a.codes, b.codes)


def test_generic_flag_really_switches(generic, monkeypatch):
    calls = []
    import ocpmx.emulator.kernels as k
    monkeypatch.setattr(k, "quantize_rows", lambda *a: calls.append(1))
    generic(np.ones((1, 32), np.float32), "e2m1")
    assert calls == [1]
