"""Devices the native tests run on: the GPU when there is one, the CPU through the Triton
interpreter otherwise (both when a GPU machine also sets TRITON_INTERPRET=1); the SASS facts
of ``benchmarks/kernel_sass.py`` for the compile-only tests."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ocpmx.native import interpreting

DEVICES = (["cuda"] if torch.cuda.is_available() else []) + (["cpu"] if interpreting() else [])


def devices():
    if not DEVICES:  # pragma: no cover
        pytest.fail("no device for the Triton kernels: neither a GPU nor TRITON_INTERPRET=1")
    return DEVICES


def kernel_sass(*args):
    """``benchmarks/kernel_sass.py ARGS --json`` (sm_90a SASS through the installed Triton, no
    GPU; run without TRITON_INTERPRET): the JSON of its last line."""
    tool = Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_sass.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(tool), *map(str, args), "--json"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def as_hopper(monkeypatch):
    """Make ``native.gemm`` see a Hopper GPU without MX units, not under the interpreter (what
    ``auto_method`` decides on), whatever the machine: the host logic of 'auto' on a CPU."""
    from ocpmx.native import gemm
    monkeypatch.setattr(gemm, "interpreting", lambda: False)
    monkeypatch.setattr(gemm, "has_mx_units", lambda d: False)
    monkeypatch.setattr(gemm, "hopper", lambda d: True)
