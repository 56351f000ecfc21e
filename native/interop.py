"""Native MX tensors and the rest of the torch ecosystem: torch's typed dtypes and torchao.

The bytes already match; these functions only relabel them (views, no copies, where the layouts
allow) and say clearly what the other side cannot hold.

torch dtypes (``data_as_torch_dtype`` / ``scales_as_torch_dtype``, views of ``data`` and
``scales_kmajor``; ``from_torch_dtypes`` the other way):
  e2m1  torch.float4_e2m1fn_x2  two codes per byte, element 0 in the low nibble (our packing).
                                torch has no conversions for it (``.float()`` raises
                                NotImplementedError in torch 2.13): it is a storage type.
  e4m3  torch.float8_e4m3fn     ``.float()`` equals our decode bit for bit, except NaN's bits
  e5m2  torch.float8_e5m2       (torch keeps the code's sign in the NaN, we write +qNaN).
  int8  torch.int8              two's complement; the element's value is int8 x 2^-6.
  e2m3, e3m2                    torch has no FP6 dtype: a TypeError says so.
  scale torch.float8_e8m0fnu    ``.float()`` equals our decode (2^(code-127), 2^-127 included);
                                0xFF is NaN in both (torch's NaN has payload 1: 0x7F800001).

torchao (``to_torchao`` / ``from_torchao``; torchao imported only when called):
  torchao's ``MXTensor`` holds e2m1 (qdata uint8, packed as ours), e4m3 and e5m2 (qdata
  float8_e4m3fn / float8_e5m2), e2m3 and e3m2 ("fp6_e2m3"/"fp6_e3m2": qdata uint8, one code per
  byte, as ours); scales float8_e8m0fnu. It has no MXINT8 (ValueError). Its blocks run along
  the last dimension, or for a 2-D tensor along the first as a transposed view (what torchao's
  ``aten.t`` makes); other axes of tensors with more than two dimensions are refused
  (ValueError) unless ``kmajor=True`` exports the K-major layout itself (the quantized axis
  moved last; the torchao tensor then has that moved shape). torchao has no rotation field: a
  rotated MXTensor is refused unless ``drop_rotation=True`` (values are the rotated ones in
  both libraries; neither dequantize undoes the rotation). torchao's dequantize of
  ``to_torchao(mx)`` equals ``mx.dequantize()`` bit for bit on every code under every scale,
  float32 and bfloat16, except the bits of NaN (a NaN scale or an FP8 NaN code: torchao's NaN
  comes out as e.g. 0x7FF00000 or 0xFFFF0000, ours is 0x7FC00000; the positions agree).
"""
from __future__ import annotations

import math

import torch

from ..spec import BLOCK_SIZE, ElementFormat, Rotation, get_format, parse_rotation
from .tensor import MXTensor, pack_factor

# our format -> the torch dtype that holds its codes in ``MXTensor.data``'s layout
TORCH_DTYPES: dict[str, torch.dtype] = {
    "e2m1": torch.float4_e2m1fn_x2, "e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
    "int8": torch.int8,
}
# torchao's element dtypes: torch dtypes, or torchao's strings for FP6 (qdata uint8)
_TORCHAO_ELEM = {"e2m1": "float4_e2m1fn_x2", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2",
                 "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2"}
TORCHAO_ORIG_DTYPES = (torch.float32, torch.bfloat16)


# ---- torch dtypes -------------------------------------------------------------------------------
def torch_dtype(fmt) -> torch.dtype:
    """The torch dtype that holds ``fmt``'s codes as ``MXTensor.data`` stores them."""
    f = get_format(fmt)
    if f.name not in TORCH_DTYPES:
        raise TypeError(f"torch has no dtype for {f.name} (FP6): MXTensor.data holds its codes "
                        f"as uint8, one per byte (low 6 bits); ml_dtypes has float6_{f.name}fn "
                        f"(ocpmx.emulator.codes_as_ml_dtypes), torchao takes it as uint8 "
                        f"(to_torchao)")
    return TORCH_DTYPES[f.name]


def data_as_torch_dtype(mx: MXTensor) -> torch.Tensor:
    """``mx.data`` viewed as torch's dtype for the format (no copy: the same bytes)."""
    return mx.data.view(torch_dtype(mx.fmt))


def scales_as_torch_dtype(mx: MXTensor) -> torch.Tensor:
    """``mx.scales_kmajor`` viewed as ``torch.float8_e8m0fnu`` (no copy: the same bytes)."""
    return mx.scales_kmajor.view(torch.float8_e8m0fnu)


def _as_uint8(t: torch.Tensor, what: str) -> torch.Tensor:
    if t.element_size() != 1:
        raise TypeError(f"{what} must have one-byte elements, got {t.dtype}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def from_torch_dtypes(data: torch.Tensor, scales: torch.Tensor, *, fmt=None, axis: int = -1,
                      block_size: int = BLOCK_SIZE, rotation=None) -> MXTensor:
    """An MXTensor from typed tensors in its K-major layout (the quantized axis last; ``axis``
    says where it sits in the tensor's own shape): ``data`` float4_e2m1fn_x2 / float8_e4m3fn /
    float8_e5m2 (the format follows from the dtype) or uint8/int8 with ``fmt``; ``scales``
    float8_e8m0fnu or uint8, one per block. Shares their storage (uint8 views)."""
    typed = data.dtype not in (torch.uint8, torch.int8)
    if typed:
        f = get_format(data.dtype)
        if fmt is not None and get_format(fmt) is not f:
            raise ValueError(f"fmt {get_format(fmt).name} disagrees with data's dtype "
                             f"{data.dtype} ({f.name})")
    elif fmt is None:
        raise TypeError(f"{data.dtype} data does not say its format: pass fmt=")
    else:
        f = get_format(fmt)
    if scales.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"scales must be float8_e8m0fnu or uint8, got {scales.dtype}")
    if data.dim() == 0:
        raise ValueError("data must have at least one dimension")
    d, s = _as_uint8(data, "data"), _as_uint8(scales, "scales")
    k = d.shape[-1] * pack_factor(f)
    if k % block_size or tuple(s.shape) != tuple(d.shape[:-1]) + (k // block_size,):
        raise ValueError(f"scales of shape {tuple(s.shape)} do not match data of shape "
                         f"{tuple(d.shape)} ({k} {f.name} elements per row) with block size "
                         f"{block_size}")
    if not -d.dim() <= axis < d.dim():
        raise ValueError(f"axis {axis} is out of range for {d.dim()} dimensions")
    axis %= d.dim()
    moved = tuple(d.shape[:-1]) + (k,)
    shape = moved[:axis] + (k,) + moved[axis:-1]
    return MXTensor(d, s, f, axis, shape, block_size, parse_rotation(rotation))


# ---- torchao ------------------------------------------------------------------------------------
def _torchao():
    """torchao's mx_tensor module, or an ImportError saying what needs it."""
    try:
        from torchao.prototype.mx_formats import mx_tensor
    except ImportError as e:
        raise ImportError(
            "ocpmx.native's torchao interop (to_torchao, from_torchao, MXRecipeConfig) needs "
            "torchao with torchao.prototype.mx_formats (pip install torchao; the dev extra "
            f"installs it): {e}") from e
    return mx_tensor


def _torchao_elem(f: ElementFormat):
    from torchao.prototype.mx_formats.constants import SUPPORTED_ELEM_DTYPES
    name = _TORCHAO_ELEM.get(f.name)
    elem = getattr(torch, name) if name and name.startswith("float") else name
    if elem is None or elem not in SUPPORTED_ELEM_DTYPES:
        raise ValueError(f"torchao's MXTensor has no {f.name} element (it takes "
                         f"{SUPPORTED_ELEM_DTYPES}); MXINT8 stays in ocpmx")
    return elem


def to_torchao(mx: MXTensor, orig_dtype: torch.dtype = torch.float32, *, kmajor: bool = False,
               drop_rotation: bool = False):
    """``mx`` as torchao's ``MXTensor`` (``torchao.prototype.mx_formats.mx_tensor``), sharing
    its storage: qdata is ``mx.data`` (viewed as float8 for e4m3/e5m2), scale is
    ``mx.scales_kmajor`` viewed as float8_e8m0fnu.

    orig_dtype: torchao's high-precision dtype (its ``dequantize()`` default and the dtype the
    subclass reports): float32 (default: our dequantize's exact values) or bfloat16.
    Layout: blocks along the last axis go as they are; a 2-D tensor blocked along axis 0 goes
    as torchao's transposed view (``qdata.t()``, ``scale.t()``, what torchao's ``aten.t``
    gives); other axes raise a ValueError unless ``kmajor=True`` (export the K-major layout,
    the quantized axis moved last, as a tensor of that moved shape).
    A rotation is not representable in torchao: refused unless ``drop_rotation=True``."""
    mxt = _torchao()
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
    elem = _torchao_elem(mx.fmt)
    if orig_dtype not in TORCHAO_ORIG_DTYPES:
        raise ValueError(f"torchao's MX tensors take float32 or bfloat16 as orig_dtype, got "
                         f"{orig_dtype}")
    if mx.rotation is not None and not drop_rotation:
        raise ValueError(f"this MXTensor was rotated ({mx.rotation}) before quantizing and "
                         "torchao's MXTensor has no field for that; pass drop_rotation=True to "
                         "export the rotated-domain codes anyway (dequantize gives the rotated "
                         "values in both libraries)")
    data = mx.data.contiguous()
    if isinstance(elem, torch.dtype) and elem != torch.float4_e2m1fn_x2:
        data = data.view(elem)  # MXFP8: qdata carries the float8 dtype
    scale = mx.scales_kmajor.contiguous().view(torch.float8_e8m0fnu)
    nd = len(mx.shape)
    if kmajor or mx.axis == nd - 1:
        qdata = data
    elif nd == 2 and mx.axis == 0:
        if mx.shape[1] == 1:
            raise ValueError(f"a ({mx.shape[0]}, 1) tensor blocked along axis 0: torchao tells "
                             "a transposed view by non-contiguity, and a (K, 1) view is "
                             "contiguous; use kmajor=True (a (1, K) tensor)")
        qdata, scale = data.t(), scale.t()
    else:
        raise ValueError(
            f"torchao's MXTensor blocks along the last dimension (or, for a 2-D tensor, the "
            f"first, as a transposed view); this MXTensor of shape {tuple(mx.shape)} is blocked "
            f"along axis {mx.axis}. Pass kmajor=True to export the K-major layout (shape "
            f"{tuple(mx.data.shape[:-1]) + (mx.shape[mx.axis],)}), or quantize "
            f"x.movedim({mx.axis}, -1)")
    return mxt.MXTensor(qdata, scale, elem, mx.block_size, orig_dtype,
                        KernelPreference.EMULATED, None, False)


def from_torchao(t, *, rotation: Rotation | str | None = None) -> MXTensor:
    """torchao's ``MXTensor`` as ours, sharing its storage where the layout allows (qdata and
    a plain scale: uint8 views; swizzled scales are unswizzled, a copy). Blocks along the last
    dimension give ``axis = ndim - 1``; a 2-D transposed view (torchao's ``.t()``) gives
    ``axis = 0``. torchao's orig_dtype is not kept (our dequantize takes the dtype). ``rotation``
    records a rotation applied before quantizing, which torchao cannot carry."""
    mxt = _torchao()
    if not isinstance(t, mxt.MXTensor):
        raise TypeError(f"from_torchao takes torchao.prototype.mx_formats.mx_tensor.MXTensor, "
                        f"got {type(t).__module__}.{type(t).__qualname__}")
    qdata, scale = t.qdata, t.scale
    if type(qdata).__name__ == "DTensor" or type(scale).__name__ == "DTensor":
        raise TypeError("a distributed torchao MXTensor (DTensor qdata/scale): convert each "
                        "shard's local tensor, or gather it first")
    f = get_format(t.elem_dtype)  # torch dtypes and torchao's 'fp6_*' names are both known
    shape, bs = tuple(t.shape), t.block_size
    transposed = qdata.dim() == 2 and not qdata.is_contiguous() and qdata.t().is_contiguous()
    if qdata.is_contiguous():
        axis, data = len(shape) - 1, qdata
    elif transposed:
        axis, data = 0, qdata.t()
    else:
        raise ValueError(f"torchao MXTensor with qdata of shape {tuple(qdata.shape)} and "
                         f"strides {qdata.stride()}: only contiguous qdata (blocks along the "
                         f"last dimension) or a 2-D transposed view (blocks along the first) "
                         f"have a defined layout")
    moved = tuple(shape[:axis]) + tuple(shape[axis + 1:])  # the K-major leading shape
    if shape[axis] % bs:
        raise ValueError(f"torchao MXTensor of shape {shape}: axis {axis} is not a multiple of "
                         f"its block size {bs}")
    if t.is_swizzled_scales:  # torchao's MXTensor.dequantize, to the K-major (rows, K/bs)
        from torchao.prototype.mx_formats.utils import from_blocked
        if transposed:
            scale = scale.transpose(-2, -1)
        scales = from_blocked(scale, math.prod(moved), shape[axis] // bs)
    else:
        scales = scale.t() if transposed else scale
    scales = scales.reshape(*moved, shape[axis] // bs)
    expect = moved + (shape[axis] // pack_factor(f),)
    if tuple(data.shape) != expect:
        raise ValueError(f"torchao MXTensor of shape {shape} with qdata {tuple(qdata.shape)} "
                         f"does not match the {f.name} layout (expected {expect} K-major)")
    return MXTensor(_as_uint8(data, "qdata"), _as_uint8(scales.contiguous(), "scale"), f, axis,
                    shape, bs, parse_rotation(rotation))
