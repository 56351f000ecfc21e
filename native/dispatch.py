"""Where the native operations run: the backend (an implementation of the MX operations) for a
tensor's device.

  'triton'    the Triton kernels (``ocpmx.native.kernels``); a CUDA/ROCm tensor, or a CPU tensor
              when ``TRITON_INTERPRET=1`` was set before Triton was imported (the interpreter).
  'emulator'  ``ocpmx.emulator`` (Numba, CPU); the result is moved to the input's device.
The default is 'triton' for GPU tensors and under the interpreter, else 'emulator'. Every
backend gives the same bits.
"""
from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("triton", "emulator")


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pick_backend(device: torch.device, backend: str | None) -> str:
    if backend is None:
        return "triton" if (device.type != "cpu" or interpreting()) else "emulator"
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if backend == "triton" and device.type == "cpu" and not interpreting():
        raise RuntimeError(
            "backend='triton' got a CPU tensor, but the Triton interpreter is off: set "
            "TRITON_INTERPRET=1 before importing triton, move the tensor to a GPU, or use "
            "backend='emulator'")
    return backend


def nvidia(device: torch.device) -> bool:
    """A CUDA device of NVIDIA's (not ROCm, not the interpreter)."""
    return device.type == "cuda" and not torch.version.hip and not interpreting()


@functools.lru_cache(maxsize=None)
def _arch(index: int) -> tuple[int, str]:
    """(compute capability major, AMD gcnArchName or '') of CUDA/ROCm device ``index``, read
    once: the checks below sit on every kernel launch's host path."""
    p = torch.cuda.get_device_properties(index)
    return p.major, getattr(p, "gcnArchName", "")


def _device_arch(device: torch.device) -> tuple[int, str]:
    return _arch(device.index if device.index is not None else torch.cuda.current_device())


def hopper(device: torch.device) -> bool:
    """An NVIDIA Hopper GPU (sm_90): where the row kernel's register cap was measured (on
    sm_100a the same cap made 54 variants spill: ``ocpmx audit --arch sm_100a``)."""
    return nvidia(device) and _device_arch(device)[0] == 9


def blackwell(device: torch.device) -> bool:
    """An NVIDIA Blackwell data-centre GPU (sm_100): where some GEMM tiles spill registers
    (``ocpmx audit --arch sm_100a``; ``gemm.spilling_configs``)."""
    return nvidia(device) and _device_arch(device)[0] == 10


def gfx950(device: torch.device) -> bool:
    """An AMD gfx950 GPU (MI350X/MI355X, CDNA4) under ROCm: where the conversion instructions of
    ``conversion='gfx950'`` exist."""
    if device.type != "cuda" or not torch.version.hip or interpreting():
        return False
    return _device_arch(device)[1].split(":")[0] == "gfx950"
