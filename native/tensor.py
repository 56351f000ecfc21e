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

    A plain container (a dataclass holding two uint8 torch tensors and the format), not a
    ``torch.Tensor`` subclass: torch ops do not dispatch on it and autograd does not see it.
    torchao's ``torchao.prototype.mx_formats.mx_tensor.MXTensor`` is such a subclass, with the
    same bytes; ``to_torchao()`` / ``MXTensor.from_torchao(t)`` convert between the two.

    data          uint8: the input with the quantized axis moved last, codes packed along it
                  (FP4: two per byte, element 0 in the low nibble; other formats one per byte).
    scales_kmajor uint8 E8M0 codes, the same leading shape, one per block.
    shape         the input's shape; ``axis`` its quantized axis (non-negative).
    ``codes`` and ``scales`` give the emulator's layout (``ocpmx.emulator.MXArray``);
    ``data_as_torch_dtype()`` and ``scales_as_torch_dtype()`` the same bytes as torch's
    float4_e2m1fn_x2 / float8_e4m3fn / float8_e5m2 and float8_e8m0fnu (``ocpmx.native.interop``).
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

    # ---- interop (ocpmx.native.interop) -----------------------------------------------------
    def data_as_torch_dtype(self) -> torch.Tensor:
        """``data`` viewed as torch's dtype for the format, no copy: float4_e2m1fn_x2 (FP4,
        two codes per byte), float8_e4m3fn, float8_e5m2, int8 (MXINT8: value = int8 x 2^-6);
        FP6 has no torch dtype (TypeError)."""
        from .interop import data_as_torch_dtype
        return data_as_torch_dtype(self)

    def scales_as_torch_dtype(self) -> torch.Tensor:
        """``scales_kmajor`` viewed as ``torch.float8_e8m0fnu``, no copy."""
        from .interop import scales_as_torch_dtype
        return scales_as_torch_dtype(self)

    @classmethod
    def from_torch_dtypes(cls, data: torch.Tensor, scales: torch.Tensor, *, fmt=None,
                          axis: int = -1, block_size: int = BLOCK_SIZE,
                          rotation=None) -> MXTensor:
        """From typed K-major tensors (``data`` float4_e2m1fn_x2 / float8_e4m3fn / float8_e5m2,
        or uint8 with ``fmt``; ``scales`` float8_e8m0fnu or uint8), sharing their storage."""
        from .interop import from_torch_dtypes
        return from_torch_dtypes(data, scales, fmt=fmt, axis=axis, block_size=block_size,
                                 rotation=rotation)

    def to_torchao(self, orig_dtype: torch.dtype = torch.float32, *, kmajor: bool = False,
                   drop_rotation: bool = False):
        """torchao's ``MXTensor`` sharing these bytes (needs torchao; see
        ``ocpmx.native.interop.to_torchao`` for what torchao cannot hold)."""
        from .interop import to_torchao
        return to_torchao(self, orig_dtype, kmajor=kmajor, drop_rotation=drop_rotation)

    @classmethod
    def from_torchao(cls, t, *, rotation=None) -> MXTensor:
        """From torchao's ``MXTensor`` (needs torchao; ``ocpmx.native.interop.from_torchao``)."""
        from .interop import from_torchao
        return from_torchao(t, rotation=rotation)
