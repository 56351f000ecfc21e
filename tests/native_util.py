"""Devices the native tests run on: the GPU when there is one, the CPU through the Triton
interpreter otherwise (both when a GPU machine also sets TRITON_INTERPRET=1)."""
import pytest
import torch

from ocpmx.native import interpreting

DEVICES = (["cuda"] if torch.cuda.is_available() else []) + (["cpu"] if interpreting() else [])


def devices():
    if not DEVICES:  # pragma: no cover
        pytest.fail("no device for the Triton kernels: neither a GPU nor TRITON_INTERPRET=1")
    return DEVICES
