"""The public MX operations on torch tensors: quantize, quantize_dequantize, dequantize and cast.

Same arguments and the same bits as the emulator's operations (``ocpmx.emulator``), on the
backend that suits the tensor's device (``ocpmx.native.dispatch``); ``tuning=`` picks tiles
(``ocpmx.native.tuning``), never bits.

Under ``torch.compile`` each operation is one ``torch.library`` custom op
(``ocpmx.native.library``: fake-tensor implementations, CPU through the emulator), so a graph
holding them compiles whole; in eager mode the same implementation runs without the op
dispatcher's host overhead. ``keys``: an optional int64 tensor [seed, sign mask] on the data's
device from which the kernels read the stochastic-rounding seed and the rotation's signs (in
place of ``seed`` and the rotation's own signs): how a compiled graph or a CUDA graph takes
per-step random bits without recompiling or re-capturing (MXLinear's key buffer).
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

import ml_dtypes
import numpy as np
import torch

from .. import emulator
from ..spec import BLOCK_SIZE, Rotation, Rounding, ScaleRule, get_format, parse_rotation
from ..spec.rules import Conversion
from . import launch, plans
from .dispatch import pick_backend
from .launch import Numerics
from .tensor import MXTensor, pack_factor
from .tuning import Tuning, default_tuning

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


BF16_NAN = 0x7FC0  # the bf16 NaN every backend writes (the kernels' float32 quiet NaN, cut)


def _check_input(x, axis, block_size, rotation) -> int:
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


def _check_keys(keys, x) -> None:
    if keys is None:
        return
    if not isinstance(keys, torch.Tensor) or keys.dtype != torch.int64 or keys.shape != (2,):
        raise TypeError("keys must be an int64 tensor [seed, sign mask] of shape (2,)")
    if keys.device != x.device:
        raise ValueError(f"keys are on {keys.device}, the data on {x.device}")


def numerics(fmt, scale_rule="floor", rounding="rne", rotation=None,
             int8_min: int = -127, conversion="ocp") -> Numerics:
    """The ``Numerics`` of a quantize call's arguments (names parsed, errors named; parsed once
    per distinct arguments: this sits on every call's host path)."""
    try:
        return _numerics(fmt, scale_rule, rounding, rotation, int8_min, conversion)
    except TypeError:  # an unhashable argument: parse it (and name what is wrong) uncached
        return _numerics.__wrapped__(fmt, scale_rule, rounding, rotation, int8_min, conversion)


@functools.lru_cache(maxsize=256)
def _numerics(fmt, scale_rule, rounding, rotation, int8_min, conversion) -> Numerics:
    return Numerics(get_format(fmt), ScaleRule.parse(scale_rule), Rounding.parse(rounding),
                    parse_rotation(rotation), int8_min, Conversion.parse(conversion))


def _moved_shape(x: torch.Tensor, axis: int) -> tuple[int, ...]:
    return tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:]) + (x.shape[axis],)


def quantize(x: torch.Tensor, fmt, *, axis: int = -1, block_size: int = BLOCK_SIZE,
             scale_rule="floor", rounding="rne", seed: int = 0, rotation=None,
             int8_min: int = -127, backend: str | None = None, tuning: Tuning | None = None,
             keys: torch.Tensor | None = None, conversion="ocp") -> MXTensor:
    """Quantize ``x`` to MX format ``fmt`` in blocks along ``axis``; same arguments and the same
    bits as ``ocpmx.emulator.quantize`` (rotation fused into the kernel, stochastic rounding
    from Philox(seed, flat element index)). ``keys``: see the module doc.

    ``conversion``: 'ocp' (§6.3's element conversion) or 'gfx950' (AMD gfx950's scaled
    conversion instructions, ``ocpmx.emulator.gfx950``): through the emulator on the emulator
    backend, through the instructions themselves on a gfx950 GPU (FP4 and FP8; stochastic
    from float32), and otherwise on the Triton backend (NVIDIA GPUs, the interpreter, FP6 and
    16-bit stochastic sources on gfx950) through the same kernel converting in software
    (``kernels.gfx950.convert_soft``): the same bits everywhere (``_check_gfx950``). It takes
    ``keys`` and compiles like the OCP conversion."""
    pk = plans.key("quantize", x, (fmt, axis, block_size, scale_rule, rounding, rotation,
                                   int8_min, backend, tuning, conversion), keys)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call: the launch of the first (``native.plans``)
        _check_keys(keys, x)
        return plans.run(plan, x, seed, keys)
    n = numerics(fmt, scale_rule, rounding, rotation, int8_min, conversion)
    axis = _check_input(x, axis, block_size, n.rotation)
    _check_keys(keys, x)
    shape = tuple(x.shape)

    def result(data, scales):  # (a plan's too)
        return MXTensor(data, scales, n.fmt, axis, shape, block_size, n.rotation)
    if torch.compiler.is_compiling():
        from . import library
        data, scales = library.quantize(x, n, axis, block_size, seed, keys, backend)
    else:
        data, scales = quantize_kmajor(x, n, axis, block_size, seed, keys, backend, tuning,
                                       pk, result)
    return result(data, scales)


def _check_gfx950(x: torch.Tensor, n: Numerics, block_size: int) -> None:
    """What the gfx950 kernel (``conversion='gfx950'`` on the Triton backend) can do, checked
    before it is launched: every float format from float32, bfloat16 or float16, blocks of 32,
    no rotation (``launch.gfx950_rows`` picks the instructions or the software conversion)."""
    if n.fmt.kind == "int":
        raise ValueError(f"conversion='gfx950' has no {n.fmt.name} conversion (MXINT8 has no "
                         "V_CVT_SCALEF32 instruction); use conversion='ocp'")
    if n.rotation is not None or block_size != BLOCK_SIZE:
        raise ValueError("conversion='gfx950' on the Triton backend: blocks of 32 without a "
                         "rotation only; use backend='emulator'")


def quantize_kmajor(x, n: Numerics, axis: int, block_size: int, seed: int, keys, backend,
                    tuning, plan_key=None, result=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed data, scales) in the K-major layout: the implementation of ``quantize``
    (``plan_key``, ``result``: the call's combination and result for ``plans.make``)."""
    backend = pick_backend(x.device, backend)
    moved_shape = _moved_shape(x, axis)
    k = x.shape[axis]
    pack = pack_factor(n.fmt)
    if backend == "emulator":
        n, seed = _host_keys(n, seed, keys)
        # a copy: Tensor.numpy() would pin the caller's storage (FSDP2 frees unsharded
        # parameters by resizing their storage to 0, which a NumPy view forbids)
        # (gfx950's conversion reads the source's own type: rule 8 of emulator.gfx950)
        src = _numpy_copy(x) if n.conversion == Conversion.OCP else _numpy_source(x)
        mx = emulator.quantize(src, n.fmt, axis=axis, block_size=block_size,
                               scale_rule=n.scale_rule, rounding=n.rounding, seed=seed,
                               rotation=n.rotation, int8_min=n.int8_min,
                               conversion=n.conversion)
        codes = np.ascontiguousarray(np.moveaxis(mx.codes, axis, -1))
        if pack == 2:
            codes = emulator.pack(codes, n.fmt)
        scales = np.ascontiguousarray(np.moveaxis(mx.scales, axis, -1))
        return torch.from_numpy(codes).to(x.device), torch.from_numpy(scales).to(x.device)
    if n.conversion == Conversion.GFX950:
        _check_gfx950(x, n, block_size)
    if block_size & (block_size - 1) or (pack == 2 and block_size < 2):
        raise ValueError(f"the Triton kernel needs a power-of-two block size, got {block_size}")
    tuning = tuning or default_tuning(x.device)
    x = x.detach().contiguous()
    inner = math.prod(x.shape[axis + 1:])
    rows = math.prod(moved_shape[:-1])
    data = torch.empty(moved_shape[:-1] + (k // pack,), dtype=torch.uint8, device=x.device)
    scales = torch.empty(moved_shape[:-1] + (k // block_size,), dtype=torch.uint8, device=x.device)
    if x.numel():
        if n.conversion == Conversion.GFX950:
            if inner != 1:
                x = launch.move_axis_last(x, axis, tuning)
            launch.gfx950_rows(x, data, scales, rows * (k // block_size), n, seed, keys)
        elif launch.rows32_applies(block_size):
            done = launch.rows32(x, axis, inner, data, scales, rows * (k // block_size), n,
                                 seed, tuning, keys=keys)
            plans.make(plan_key, done, False, tuple(data.shape), tuple(scales.shape),
                       n, seed, keys, result)
        else:
            launch.strided(x, data, scales, rows, k, inner, block_size, n, seed, tuning,
                           keys=keys)
    return data, scales


def _host_keys(n: Numerics, seed: int, keys) -> tuple[Numerics, int]:
    """For the emulator: the numerics and seed with ``keys`` (a CPU tensor) read on the host."""
    if keys is None:
        return n, seed
    if keys.device.type != "cpu":
        raise ValueError("the emulator backend reads keys on the host: they must be a CPU tensor")
    key_seed, mask = (int(v) for v in keys.tolist())
    rot = n.rotation
    if rot is not None and rot.has_signs:
        rot = Rotation(rot.size, mask=mask & ((1 << rot.size) - 1))
    return replace(n, rotation=rot), key_seed


def quantize_dequantize(x: torch.Tensor, fmt, *, axis: int = -1, block_size: int = BLOCK_SIZE,
                        scale_rule="floor", rounding="rne", seed: int = 0, rotation=None,
                        backend: str | None = None, tuning: Tuning | None = None,
                        keys: torch.Tensor | None = None, conversion="ocp") -> torch.Tensor:
    """``dequantize(quantize(x, ...), torch.bfloat16)``, bit for bit, in one pass where the
    32-block kernels apply (a float format, Triton backend, blocks of 32, OCP conversion; any
    rounding, any axis: the row kernel along the last, the column kernel along another): the
    operand of a bf16 GEMM on chips without MX units, without writing and reading
    back the packed codes. Elsewhere it is literally that composition. Returns the input's
    shape (a view of a K-major buffer, as ``dequantize`` does). ``conversion``: as
    ``quantize``'s ('gfx950': always the composition)."""
    pk = plans.key("quantize_dequantize", x, (fmt, axis, block_size, scale_rule, rounding,
                                              rotation, backend, tuning, conversion), keys)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call: the launch of the first (``native.plans``)
        _check_keys(keys, x)
        return plans.run(plan, x, seed, keys)
    n = numerics(fmt, scale_rule, rounding, rotation, conversion=conversion)
    axis = _check_input(x, axis, block_size, n.rotation)
    _check_keys(keys, x)
    def result(data, out):  # the K-major values in the input's layout (a plan's too)
        return out if axis == out.dim() - 1 else out.movedim(-1, axis)
    if torch.compiler.is_compiling():
        from . import library
        out = library.quantize_dequantize(x, n, axis, block_size, seed, keys, backend)
    else:
        out = quantize_dequantize_kmajor(x, n, axis, block_size, seed, keys, backend, tuning,
                                         pk, result)
    return result(None, out)


def quantize_dequantize_kmajor(x, n: Numerics, axis: int, block_size: int, seed: int, keys,
                               backend, tuning, plan_key=None, result=None) -> torch.Tensor:
    """The bf16 values in the K-major layout: the implementation of ``quantize_dequantize``
    (``plan_key``, ``result``: as ``quantize_kmajor``'s)."""
    inner = math.prod(x.shape[axis + 1:])
    if (pick_backend(x.device, backend) == "emulator" or n.fmt.kind == "int" or x.numel() == 0
            or not launch.rows32_applies(block_size) or n.conversion != Conversion.OCP):
        data, scales = quantize_kmajor(x, n, axis, block_size, seed, keys, backend, tuning)
        return dequantize_kmajor(data, scales, n.fmt, x.shape[axis], block_size, torch.bfloat16,
                                 backend, tuning)
    tuning = tuning or default_tuning(x.device)
    x = x.detach().contiguous()
    out = torch.empty(_moved_shape(x, axis), dtype=torch.bfloat16, device=x.device)
    done = launch.rows32(x, axis, inner, out.view(torch.int32), out, out.numel() // 32, n, seed,
                         tuning, qdq=True, keys=keys)
    plans.make(plan_key, done, True, tuple(out.shape), (), n, seed, keys, result)
    return out


def quantize_dequantize_both_axes(x: torch.Tensor, fmt, *, scale_rule="floor", rounding="rne",
                                  seed: int = 0, rotation=None, backend: str | None = None,
                                  tuning: Tuning | None = None,
                                  keys: torch.Tensor | None = None,
                                  conversion="ocp") -> tuple[torch.Tensor, torch.Tensor]:
    """``(quantize_dequantize(x, fmt, axis=-1, ...), quantize_dequantize(x, fmt, axis=0, ...))``
    of a matrix ``x``, bit for bit: the operand of two bf16 GEMMs that contract x along
    different axes (X in Fprop and Wgrad, ∇Y in Dgrad and Wgrad). In one pass, reading x once
    (``kernels.both_axes``), where the kernel applies: the Triton backend, a float format, RNE,
    no rotation or a fixed Hadamard one (no random signs), the OCP conversion; elsewhere the two
    calls (with every option they take)."""
    pk = plans.key("quantize_dequantize_both_axes", x, (fmt, scale_rule, rounding, rotation,
                                                        backend, tuning, conversion), keys)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call: the launch of the first (``native.plans``)
        _check_keys(keys, x)
        rows, cols = plans.run_both_axes(plan, x)
        return rows, cols.t()
    n = numerics(fmt, scale_rule, rounding, rotation, conversion=conversion)
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"quantize_dequantize_both_axes takes a matrix, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    for axis in (1, 0):
        _check_input(x, axis, BLOCK_SIZE, n.rotation)
    _check_keys(keys, x)
    if not both_axes_applies(x, n, backend):
        kw = dict(scale_rule=scale_rule, rounding=rounding, seed=seed, rotation=rotation,
                  backend=backend, tuning=tuning, keys=keys, conversion=conversion)
        return (quantize_dequantize(x, fmt, axis=-1, **kw),
                quantize_dequantize(x, fmt, axis=0, **kw))
    if torch.compiler.is_compiling():
        from . import library
        rows, cols = library.quantize_dequantize_both_axes(x, n, backend)
    else:
        rows, cols = both_axes_impl(x, n, tuning, pk)
    return rows, cols.t()  # (the one-axis call's layout: a view of the K-major values)


def both_axes_applies(x: torch.Tensor, n: Numerics, backend: str | None) -> bool:
    """Whether ``quantize_dequantize_both_axes`` runs its one-pass kernel on the matrix ``x``:
    what ``kernels.both_axes.qdq_both_axes_kernel`` takes, on a grid CUDA can launch with
    the narrowest tile (32 columns a program), so with every tile (not read here: no tuning
    lookup while compiling). The shape's multiples of 32 are the callers' checks
    (``_check_input``)."""
    return (pick_backend(x.device, backend) == "triton" and launch.both_axes_takes(n)
            and x.numel() > 0 and launch.both_axes_grid(*x.shape, 32) is not None)


def both_axes_impl(x: torch.Tensor, n: Numerics, tuning: Tuning | None, plan_key=None):
    """The one-pass kernel's (values along the last axis, values along axis 0 K-major: x's
    transpose). ``plan_key``: the call's combination, for ``plans.make_both_axes``."""
    x = x.detach().contiguous()
    rows = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    cols = torch.empty(x.shape[::-1], dtype=torch.bfloat16, device=x.device)
    done = launch.qdq_both_axes(x, rows, cols, n, tuning or default_tuning(x.device))
    plans.make_both_axes(plan_key, rows, cols, done, n.rot_scale)
    return rows, cols


def cast(x: torch.Tensor, fmt, *, rounding="rne", seed: int = 0, int8_min: int = -127,
         backend: str | None = None, tuning: Tuning | None = None) -> torch.Tensor:
    """Element conversion with scale 2^0 (``ocpmx.emulator.cast``): float values -> uint8
    codes, one per element, same shape; stochastic rounding counter = flat index."""
    n = numerics(fmt, "floor", rounding, None, int8_min)
    _check_input(x.reshape(-1) if isinstance(x, torch.Tensor) else x, -1, 1, None)
    if torch.compiler.is_compiling():
        from . import library
        return library.cast(x, n, seed, backend)
    return cast_impl(x, n, seed, backend, tuning)


def cast_impl(x, n: Numerics, seed: int, backend, tuning) -> torch.Tensor:
    backend = pick_backend(x.device, backend)
    if backend == "emulator":
        codes = emulator.cast(_numpy_copy(x), n.fmt, rounding=n.rounding, seed=seed,
                              int8_min=n.int8_min)
        return torch.from_numpy(codes).to(x.device)
    flat = x.detach().contiguous().reshape(-1)
    width = 1024
    count = flat.numel()
    padded = -(-count // width) * width
    if padded != count:
        flat = torch.cat([flat, flat.new_zeros(padded - count)])
    out = torch.empty(padded, dtype=torch.uint8, device=x.device)
    if count:
        launch.strided(flat, out, out, padded // width, width, 1, 1, n, seed,
                       tuning or default_tuning(x.device), cast=True)
    return out[:count].reshape(x.shape)


def dequantize(mx: MXTensor, dtype: torch.dtype = torch.float32, *,
               backend: str | None = None, tuning: Tuning | None = None) -> torch.Tensor:
    """MX codes and scales -> values in the input's shape: float32 exactly (the emulator's
    ``dequantize``); bfloat16 is that float32 rounded to nearest even. Rotations are not undone."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"dequantize gives float32 or bfloat16, got {dtype}")
    k = mx.shape[mx.axis]
    if torch.compiler.is_compiling():
        from . import library
        out = library.dequantize(mx.data, mx.scales_kmajor, mx.fmt, k, mx.block_size, dtype,
                                 backend)
    else:
        out = dequantize_kmajor(mx.data, mx.scales_kmajor, mx.fmt, k, mx.block_size, dtype,
                                backend, tuning)
    return out.movedim(-1, mx.axis)


def dequantize_kmajor(data, scales, fmt, k: int, block_size: int, dtype, backend,
                      tuning) -> torch.Tensor:
    """Values in the K-major layout: the implementation of ``dequantize``."""
    backend = pick_backend(data.device, backend)
    fmt = get_format(fmt)
    if backend == "emulator":
        codes = data.cpu().numpy()
        if pack_factor(fmt) == 2:
            codes = emulator.unpack(codes, fmt)
        mx = emulator.MXArray(codes, scales.cpu().numpy(), fmt, codes.ndim - 1, block_size)
        out = torch.from_numpy(emulator.dequantize(mx)).to(dtype)
        if dtype == torch.bfloat16:  # NaN as the kernels write it (torch's CPU cast: 0xFFFF)
            out.view(torch.int16)[torch.isnan(out)] = BF16_NAN
        return out.to(data.device)
    out = torch.empty(data.shape[:-1] + (k,), dtype=dtype, device=data.device)
    if out.numel():
        launch.dequantize(data, scales, out, k, block_size, fmt,
                          tuning or default_tuning(out.device))
    return out


def move_axis_last(x: torch.Tensor, axis: int, tuning: Tuning | None = None) -> torch.Tensor:
    """``x.movedim(axis, -1).contiguous()`` for a contiguous ``x`` (a Triton tiled transpose)."""
    axis %= x.dim()
    if torch.compiler.is_compiling():
        from . import library
        return library.move_axis_last(x, axis)
    return launch.move_axis_last(x, axis, tuning or default_tuning(x.device))


def _numpy_copy(x: torch.Tensor) -> np.ndarray:
    return x.detach().to(device="cpu", dtype=torch.float32, copy=True).numpy()


def _numpy_source(x: torch.Tensor) -> np.ndarray:
    """A copy of ``x`` in its own type: float32, float16, or bfloat16 as ml_dtypes'."""
    t = x.detach().to(device="cpu", copy=True)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()
