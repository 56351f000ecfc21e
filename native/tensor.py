"""``MXTensor``: an MX-quantized torch tensor in the layout ``tl.dot_scaled`` takes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import emulator
from ..spec import BLOCK_SIZE, ElementFormat, Rotation


def pack_factor(fmt: ElementFormat) -> int:
    """Codes per byte in the packed data: 2 for FP4, else 1 (FP6 and INT8 keep one per byte)."""
    return 2 if fmt.bits == 4 else 1


@dataclass
class MXTensor:
    """An MX-quantized torch tensor in the K-major layout ``tl.dot_scaled`` takes.

    data          uint8: the input with the quantized axis moved last, codes packed along it
                  (FP4: two per byte, element 0 in the low nibble; other formats one per byte).
    scales_kmajor uint8 E8M0 codes, the same leading shape, one per block.
    shape         the input's shape; ``axis`` its quantized axis (non-negative).
    ``codes`` and ``scales`` give the emulator's layout (``ocpmx.emulator.MXArray``).
    """

    data: torch.Tensor
    scales_kmajor: torch.Tensor
    fmt: ElementFormat
    axis: int
    shape: tuple[int, ...]
    block_size: int = BLOCK_SIZE
    rotation: Rotation | None = None

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def codes(self) -> torch.Tensor:
        """uint8, one code per element, in the input's shape (unpacked on access)."""
        d = self.data
        if pack_factor(self.fmt) == 2:
            d = torch.stack([d & 0xF, d >> 4], dim=-1).reshape(*d.shape[:-1], d.shape[-1] * 2)
        return d.movedim(-1, self.axis).contiguous()

    @property
    def scales(self) -> torch.Tensor:
        """uint8 E8M0 codes, the input's shape with the quantized axis divided by block_size."""
        return self.scales_kmajor.movedim(-1, self.axis).contiguous()

    def to_emulator(self) -> emulator.MXArray:
        return emulator.MXArray(self.codes.cpu().numpy(), self.scales.cpu().numpy(), self.fmt,
                                self.axis, self.block_size, self.rotation)

    def dequantize(self, dtype: torch.dtype = torch.float32, backend: str | None = None):
        from .ops import dequantize
        return dequantize(self, dtype, backend=backend)
