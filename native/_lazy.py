"""Triton and the kernel modules, imported where a kernel first runs, not when ``ocpmx.native``
is imported: the emulator-backed CPU path (``backend='emulator'``, MXLinear on CPU tensors,
training on a CPU) works where Triton is not installed (macOS, Windows)."""
from __future__ import annotations

import importlib


class LazyModule:
    """A module imported on first attribute access."""

    def __init__(self, name: str):
        self._name = name
        self._module = None

    def __getattr__(self, attr):
        if self._module is None:
            try:
                self._module = importlib.import_module(self._name)
            except ImportError as e:
                raise ImportError(f"the Triton kernels need Triton ({e}); install the 'gpu' "
                                  f"extra, or use backend='emulator' on CPU tensors") from e
        return getattr(self._module, attr)


triton = LazyModule("triton")
kernels = LazyModule("ocpmx.native.kernels")
