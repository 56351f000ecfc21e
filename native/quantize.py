"""MX quantize / dequantize on torch tensors: Triton kernels on the GPU (or the Triton CPU
interpreter), the Numba emulator on request. Every backend gives the same bits.

Backends
  'triton'    the kernels in ``kernels.py``; a CUDA/ROCm tensor, or a CPU tensor when
              ``TRITON_INTERPRET=1`` was set before Triton was imported (the interpreter).
  'emulator'  ``ocpmx.emulator`` (Numba, CPU); the result is moved to the input's device.
The default is 'triton' for GPU tensors and under the interpreter, else 'emulator'.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy as np
import torch
import triton

from .. import emulator
from ..emulator.params import format_params, resolve
from ..emulator.rotation import Rotation, as_rotation
from ..spec import BLOCK_SIZE, ElementFormat
from . import kernels

BACKENDS = ("triton", "emulator")
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


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
        return dequantize(self, dtype, backend=backend)


def _check_input(x, fmt, axis, block_size, rotation):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("cannot block-quantize a 0-d tensor")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a tensor of {x.dim()} dimensions")
    axis %= x.dim()
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if x.shape[axis] % block_size:
        raise ValueError(f"axis {axis} has length {x.shape[axis]}, not divisible by the block "
                         f"size {block_size}")
    if rotation is not None and block_size % rotation.size:
        raise ValueError(f"block_size {block_size} is not a multiple of the rotation size "
                         f"{rotation.size}")
    return axis


def quantize(x: torch.Tensor, fmt, *, axis: int = -1, block_size: int = BLOCK_SIZE,
             scale_rule: str = "floor", rounding: str = "rne", seed: int = 0, rotation=None,
             int8_min: int = -127, backend: str | None = None) -> MXTensor:
    """Quantize ``x`` to MX format ``fmt`` in blocks along ``axis``; same arguments and the same
    bits as ``ocpmx.emulator.quantize`` (rotation fused into the kernel, stochastic rounding
    from Philox(seed, flat element index))."""
    fmt, rule_id, round_id = resolve(fmt, scale_rule, rounding)
    rot = as_rotation(rotation)
    axis = _check_input(x, fmt, axis, block_size, rot)
    backend = pick_backend(x.device, backend)
    moved_shape = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:]) + (x.shape[axis],)
    k = x.shape[axis]
    pack = pack_factor(fmt)
    if backend == "emulator":
        # a copy: Tensor.numpy() would pin the caller's storage (FSDP2 frees unsharded
        # parameters by resizing their storage to 0, which a NumPy view forbids)
        mx = emulator.quantize(_numpy_copy(x), fmt, axis=axis,
                               block_size=block_size, scale_rule=scale_rule, rounding=rounding,
                               seed=seed, rotation=rot, int8_min=int8_min)
        codes = np.ascontiguousarray(np.moveaxis(mx.codes, axis, -1))
        if pack == 2:
            codes = emulator.pack(codes, fmt)
        scales = np.ascontiguousarray(np.moveaxis(mx.scales, axis, -1))
        return MXTensor(torch.from_numpy(codes).to(x.device), torch.from_numpy(scales).to(x.device),
                        fmt, axis, tuple(x.shape), block_size, rot)
    if block_size & (block_size - 1) or (pack == 2 and block_size < 2):
        raise ValueError(f"the Triton kernel needs a power-of-two block size, got {block_size}")
    fp = _params(fmt, int8_min)
    x = x.detach().contiguous()
    inner = math.prod(x.shape[axis + 1:])
    rows = math.prod(moved_shape[:-1])
    data = torch.empty(moved_shape[:-1] + (k // pack,), dtype=torch.uint8, device=x.device)
    scales = torch.empty(moved_shape[:-1] + (k // block_size,), dtype=torch.uint8, device=x.device)
    if x.numel():
        consts, signs, rot_scale = kernel_args(x, fmt, fp, rot, rule_id, round_id, pack)
        seed64 = seed & 0xFFFFFFFFFFFFFFFF
        nblk = k // block_size
        if rows32_applies(block_size, inner, round_id):
            _rows32(x, axis, inner, data, scales, rows * nblk, signs, seed64, rot_scale, consts)
        else:
            rows_tile, kb, warps = quantize_tile(inner, block_size, nblk)
            grid = (triton.cdiv(rows, rows_tile), triton.cdiv(nblk, kb))
            kernels.quantize_kernel[grid](
                x.view(torch.int16) if x.dtype == torch.bfloat16 else x, data, scales, signs,
                rows, k, inner, seed64, rot_scale, BS=block_size,
                ROWS=rows_tile, KB=kb, LOG2_ROT=(rot.size.bit_length() - 1) if rot else 0,
                INNER1=inner == 1, EVEN=rows % rows_tile == 0 and nblk % kb == 0,
                num_warps=warps, **consts)
    return MXTensor(data, scales, fmt, axis, tuple(x.shape), block_size, rot)


@functools.lru_cache(maxsize=256)
def _params(fmt, int8_min: int = -127) -> tuple[int, ...]:
    """The format table's parameters as Python ints (cached: this runs on every call)."""
    return tuple(int(v) for v in format_params(fmt, int8_min))


def kernel_args(x, fmt, fp, rot, rule_id, round_id, pack):
    """(constexprs, sign mask, rotation scale) shared by the quantize kernels."""
    consts = dict(
        ROT=rot.size if rot else 0, SIGNS=rot is not None and rot.sign_seed is not None,
        STOCH=round_id == 1, RULE=rule_id, IS_INT=fp[0] == 1, MBITS=fp[3], BIAS=fp[4],
        EMAX=fp[5], MAXC=fp[6], NANC=fp[7], INFC=fp[8], NEGMAX=fp[9], RNUM=fp[10],
        RSHIFT=fp[11], SIGN=1 << (fp[1] - 1), PACK=pack, IN_BF16=x.dtype == torch.bfloat16,
        BIG=x.numel() >= 2**31 - 2**20)
    return consts, sign_mask(rot), float(rot.scale) if rot else 1.0


def sign_mask(rot: Rotation | None) -> int:
    """The rotation's signs as bits (bit p set: position p negated), a kernel argument."""
    if rot is None or rot.sign_seed is None:
        return 0
    return _sign_mask(rot.size, rot.sign_seed)


@functools.lru_cache(maxsize=4096)
def _sign_mask(size: int, sign_seed: int) -> int:
    # cached: a fixed-sign recipe asks for the same mask in every GEMM of every step
    return int(sum(1 << p for p, v in enumerate(Rotation(size, sign_seed).signs()) if v < 0))


def rows32_applies(block_size: int, inner: int, round_id: int) -> bool:
    """Whether the 32-block row kernel serves: blocks of 32, along the last axis, or along
    another one with RNE (see ``_rows32``)."""
    return block_size == 32 and (inner == 1 or round_id == 0)


def _rows32(x, axis, inner, data, scales, n_blocks, signs, seed64, rot_scale, consts, **qdq):
    """The 32-block row kernel. Along the last axis (Fprop, Dgrad) it reads the input directly;
    along another axis (Wgrad contracts over tokens) a transposed copy, which costs one copy
    but avoids the strided tile kernel (2-10x slower with a rotation on an H200 in the
    ablation). The bits are the same: the output layout is the moved-axis one either way.
    Stochastic rounding keys its random bits by the element's index in the input, so off the
    last axis it keeps the tile kernel (``rows32_applies``)."""
    src = x if inner == 1 else move_axis_last(x, axis)
    nb, warps, maxnreg = rows32_tile(qdq=bool(qdq))
    opts = {"maxnreg": maxnreg} if maxnreg and x.device.type == "cuda" and not torch.version.hip \
        and not interpreting() else {}
    kernels.quantize_rows32_kernel[(triton.cdiv(n_blocks, nb),)](
        src.view(torch.int32) if src.dtype == torch.bfloat16 else src, data, scales,
        signs, n_blocks, seed64, rot_scale, NB=nb, EVEN=n_blocks % nb == 0,
        FOLD=fold_applies(consts, x.dtype), num_warps=warps, **opts, **consts, **qdq)


def fold_applies(consts: dict, dtype: torch.dtype) -> bool:
    """Whether the row kernel may fold H16's 1/4 into the block scale (``FOLD``, see
    ``kernels.quantize_rows32_kernel``): H16 on bf16 or float16 input (x/4 exact), a float
    format, RNE."""
    return (consts["ROT"] == 16 and dtype in (torch.bfloat16, torch.float16)
            and not consts["IS_INT"] and not consts["STOCH"])


def quantize_dequantize(x: torch.Tensor, fmt, *, axis: int = -1, block_size: int = BLOCK_SIZE,
                        scale_rule: str = "floor", rounding: str = "rne", seed: int = 0,
                        rotation=None, backend: str | None = None) -> torch.Tensor:
    """``dequantize(quantize(x, ...), torch.bfloat16)``, bit for bit, in one pass where the
    32-block row kernel applies (a float format, Triton backend, blocks of 32, RNE or the last
    axis): the operand of a bf16 GEMM on chips without MX units, without writing and reading
    back the packed codes. Elsewhere it is literally that composition. Returns the input's
    shape (a view of a K-major buffer, as ``dequantize`` does)."""
    fmt_r, rule_id, round_id = resolve(fmt, scale_rule, rounding)
    rot = as_rotation(rotation)
    ax = _check_input(x, fmt_r, axis, block_size, rot)
    inner = math.prod(x.shape[ax + 1:])
    if (pick_backend(x.device, backend) == "emulator" or fmt_r.kind == "int" or x.numel() == 0
            or not rows32_applies(block_size, inner, round_id)):
        mx = quantize(x, fmt, axis=axis, block_size=block_size, scale_rule=scale_rule,
                      rounding=rounding, seed=seed, rotation=rotation, backend=backend)
        return dequantize(mx, torch.bfloat16, backend=backend)
    fp = _params(fmt_r)
    x = x.detach().contiguous()
    k = x.shape[ax]
    moved = tuple(x.shape[:ax]) + tuple(x.shape[ax + 1:]) + (k,)
    out = torch.empty(moved, dtype=torch.bfloat16, device=x.device)
    consts, signs, rot_scale = kernel_args(x, fmt_r, fp, rot, rule_id, round_id,
                                                pack_factor(fmt_r))
    n_blocks = out.numel() // 32
    _rows32(x, ax, inner, out.view(torch.int32), out, n_blocks, signs,
            seed & 0xFFFFFFFFFFFFFFFF, rot_scale, consts, **qdq_args(fmt_r))
    return out.movedim(-1, ax)


def qdq_args(fmt: ElementFormat) -> dict:
    """The row kernel's constexprs for its quantize-dequantize mode (a float format)."""
    return dict(QDQ=True, BITS=fmt.bits, EBITS=fmt.ebits, SUBQ=2.0 ** (1 - fmt.bias - fmt.mbits),
                MAXV=float(fmt.max_normal))


def encode(x: torch.Tensor, fmt, *, rounding: str = "rne", seed: int = 0, int8_min: int = -127,
           backend: str | None = None) -> torch.Tensor:
    """Element conversion with scale 2^0 (``ocpmx.emulator.encode``): float values -> uint8
    codes, one per element, same shape; stochastic rounding counter = flat index."""
    fmt, _, round_id = resolve(fmt, "floor", rounding)
    _check_input(x.reshape(-1) if isinstance(x, torch.Tensor) else x, fmt, -1, 1, None)
    backend = pick_backend(x.device, backend)
    if backend == "emulator":
        codes = emulator.encode(_numpy_copy(x), fmt, rounding=rounding,
                                seed=seed, int8_min=int8_min)
        return torch.from_numpy(codes).to(x.device)
    flat = x.detach().contiguous().reshape(-1)
    width = 1024
    n = flat.numel()
    padded = -(-n // width) * width
    if padded != n:
        flat = torch.cat([flat, flat.new_zeros(padded - n)])
    rows = padded // width
    out = torch.empty(padded, dtype=torch.uint8, device=x.device)
    if n:
        fp = _params(fmt, int8_min)
        rows_tile, kb, warps = quantize_tile(1, 1, width)
        kernels.quantize_kernel[(triton.cdiv(rows, rows_tile), triton.cdiv(width, kb))](
            flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat, out, out, 0,
            rows, width, 1, seed & 0xFFFFFFFFFFFFFFFF, 1.0, BS=1, ROWS=rows_tile, KB=kb, ROT=0,
            LOG2_ROT=0, SIGNS=False, STOCH=round_id == 1, RULE=0, IS_INT=fp[0] == 1,
            MBITS=fp[3], BIAS=fp[4], EMAX=fp[5], MAXC=fp[6], NANC=fp[7], INFC=fp[8],
            NEGMAX=fp[9], RNUM=fp[10], RSHIFT=fp[11], SIGN=1 << (fp[1] - 1), PACK=1,
            IN_BF16=flat.dtype == torch.bfloat16, BIG=padded >= 2**31 - 2**20,
            INNER1=True,
            EVEN=rows % rows_tile == 0 and width % kb == 0, CAST=True, num_warps=warps)
    return out[:n].reshape(x.shape)


def dequantize(mx: MXTensor, dtype: torch.dtype = torch.float32, *,
               backend: str | None = None) -> torch.Tensor:
    """MX codes and scales -> values in the input's shape: float32 exactly (the emulator's
    ``dequantize``); bfloat16 is that float32 rounded to nearest even. Rotations are not undone."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"dequantize gives float32 or bfloat16, got {dtype}")
    backend = pick_backend(mx.device, backend)
    if backend == "emulator":
        out = torch.from_numpy(emulator.dequantize(mx.to_emulator()))
        return out.to(dtype).to(mx.device)
    k = mx.shape[mx.axis]
    moved = mx.data.shape[:-1] + (k,)
    rows = math.prod(moved[:-1])
    out = torch.empty(moved, dtype=dtype, device=mx.device)
    if out.numel():
        bs = mx.block_size
        nblk = k // bs
        rows_tile, kb, warps = quantize_tile(1, bs, nblk)
        grid = (triton.cdiv(rows, rows_tile), triton.cdiv(nblk, kb))
        bf16 = dtype == torch.bfloat16
        f = mx.fmt
        kernels.dequantize_kernel[grid](
            mx.data, mx.scales_kmajor, out.view(torch.int16) if bf16 else out, rows, k, BS=bs,
            ROWS=rows_tile, KB=kb, PACK=pack_factor(f), OUT_BF16=bf16,
            EVEN=rows % rows_tile == 0 and nblk % kb == 0, BIG=out.numel() >= 2**31 - 2**20,
            IS_INT=f.kind == "int", BITS=f.bits, EBITS=f.ebits, MBITS=f.mbits, BIAS=f.bias,
            NANC=(f.nan_codes[0] & ~f.sign_bit) if f.nan_codes else -1,
            INFC=f.inf_code if f.inf_code is not None else -1,
            SUBQ=2.0 ** (-f.mbits) if f.kind == "int" else 2.0 ** (1 - f.bias - f.mbits),
            num_warps=warps)
    return out.movedim(-1, mx.axis)


def move_axis_last(x: torch.Tensor, axis: int) -> torch.Tensor:
    """``x.movedim(axis, -1).contiguous()`` for a contiguous ``x``, through a Triton tiled
    transpose: torch's strided copy of a transposed bf16 8192 x 14336 ran at ~15% of copy
    bandwidth on an H200 (results/native_gpu)."""
    k = x.shape[axis]
    inner = math.prod(x.shape[axis + 1:])
    outer = x.numel() // max(1, k * inner)
    if outer > 65535:  # the grid's third dimension
        return x.movedim(axis, -1).contiguous()
    out = torch.empty(x.shape[:axis] + x.shape[axis + 1:] + (k,), dtype=x.dtype, device=x.device)
    if x.numel():
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
        bk, bi = (64, 64) if not interpreting() else (128, 128)
        kernels.transpose_kernel[(triton.cdiv(k, bk), triton.cdiv(inner, bi), outer)](
            x.view(bits), out.view(bits), k, inner, BK=bk, BI=bi,
            EVEN=k % bk == 0 and inner % bi == 0, num_warps=4)
    return out


def _numpy_copy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(device="cpu", dtype=torch.float32, copy=True).numpy()


# Tile shapes (rows, blocks per row, warps); they change speed, never bits. The benchmark
# sweeps them through TILE_OVERRIDE.
TILE_OVERRIDE: dict | None = None


def quantize_tile(inner: int, block_size: int, nblk: int) -> tuple[int, int, int]:
    if interpreting():  # few, large programs: the interpreter's cost is per program
        kb = min(_pow2_floor(max(1, 256 // block_size)), triton.next_power_of_2(nblk))
        return 64, max(1, kb), 4
    key = "rows" if inner == 1 else "cols"
    rows, elems, warps = (TILE_OVERRIDE or {}).get(key) or \
        ((16, 256, 4) if inner == 1 else (64, 64, 4))
    kb = max(1, min(_pow2_floor(max(1, elems // block_size)), triton.next_power_of_2(nblk)))
    return rows, kb, warps


def rows32_tile(qdq: bool = False) -> tuple[int, int, int | None]:
    """(blocks per program, warps, register cap or None) of the 32-block row kernel (``qdq``:
    its quantize-dequantize form, key 'rows32_qdq'). The default, 32 blocks on one warp, was
    the fastest or within noise of it on an H200 for both forms (results/native_gpu); one warp
    also keeps the tile's NaN/Inf vote inside the warp. The packed-code form is capped at 72
    registers on NVIDIA GPUs (ptxas otherwise takes 80, which holds fewer warps per SM; 72 was
    3% faster on an H200, 64 spills); a cap changes speed, never bits."""
    tile = (TILE_OVERRIDE or {}).get("rows32_qdq" if qdq else "rows32")
    if tile is None:
        tile = (512, 4) if interpreting() else ((32, 1) if qdq else (32, 1, 72))
    return (tuple(tile) + (None,))[:3]


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)

