"""The test suite's interpreter speed-up (``tests/interpreter_speed.py``) changes no result: the
same kernels under Triton's interpreter as shipped give the same bits."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import interpreter_speed

_RUN = """
import json, sys
sys.path.insert(0, {tests!r})
import interpreter_speed
installed = interpreter_speed.install()
import numpy as np, torch
from ocpmx import native
g = torch.Generator().manual_seed(3)
x = (torch.randn(96, 64, generator=g) * 8).to(torch.bfloat16)
out = {{"installed": installed}}
for axis in (0, 1):
    for rot, rnd in ((None, "rne"), ("hadamard16", "stochastic")):
        mx = native.quantize(x, "e2m1", axis=axis, rotation=rot, rounding=rnd, seed=7)
        out[f"{{axis}} {{rot}} {{rnd}}"] = [mx.data.view(torch.uint8).flatten().tolist(),
                                          mx.scales_kmajor.view(torch.uint8).flatten().tolist()]
    qdq = native.quantize_dequantize(x, "e2m1", axis=axis, rotation="hadamard16")
    out[f"{{axis}} qdq"] = qdq.view(torch.int16).flatten().tolist()
print(json.dumps(out))
"""


def _run(as_is):
    env = {k: v for k, v in os.environ.items() if k != "OCPMX_INTERPRETER_AS_IS"}
    env["TRITON_INTERPRET"] = "1"
    if as_is:
        env["OCPMX_INTERPRETER_AS_IS"] = "1"
    code = _RUN.format(tests=str(Path(__file__).parent))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_interpreter_speedup_changes_no_bits():
    """Row and column kernels (helpers, Triton's own ``tl.sum``/``tl.max``, H16, stochastic
    rounding, quantize-dequantize) in two fresh processes, one with the speed-up and one
    without: identical codes, scales and values."""
    pytest.importorskip("triton")
    fast, stock = _run(as_is=False), _run(as_is=True)
    assert fast.pop("installed") is True and stock.pop("installed") is False
    assert fast.keys() == stock.keys() and len(fast) == 6
    for key in fast:
        assert fast[key] == stock[key], key


def test_install_is_refused_by_the_switch(monkeypatch):
    monkeypatch.setenv("OCPMX_INTERPRETER_AS_IS", "1")
    assert interpreter_speed.install() is False
