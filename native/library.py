"""The native operations as ``torch.library`` ops (namespace ``ocpmx``, defined by ``_op``), so that
``torch.compile`` keeps graphs holding them whole (``fullgraph=True``): each op has a fake-tensor
implementation (shapes and dtypes only) and one implementation for every device (CUDA/ROCm:
the Triton kernels; CPU: the emulator, or the Triton interpreter). The public functions of
``ocpmx.native`` call these ops while compiling and the same implementations directly in eager
mode, so compiled and eager runs give the same bits.

Arguments are plain values: formats and options by name, the rotation by its name
(``ocpmx.spec.Rotation.name``), seeds as signed 64-bit integers; random keys read from
device memory come as an optional int64 tensor [seed, sign mask] (``keys``).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..spec import BLOCK_SIZE, Rounding, ScaleRule, get_format, parse_rotation
from ..spec.rules import Conversion
from . import fold, gemm, launch, ops, plans
from .launch import Numerics
from .tensor import pack_factor
from .tuning import default_tuning

_M64 = (1 << 64) - 1
_LIB = torch.library.Library("ocpmx", "DEF")


def _op(name: str):
    """Define ``ocpmx::name`` with the decorated function's signature as its schema and the
    function as its implementation on every device; the decorated name becomes the op
    (``torch.ops.ocpmx.name.default``). A ``torch.library.Library`` op rather than a
    ``torch.library.custom_op``: the latter's Python dispatch cost ~10 us a call more on the CPU
    machine (a bare op: 13.4 against 3.4 us), and a compiled training step calls these ops
    hundreds of times (a 125m step ~500 quantize calls). They are not differentiable (their
    outputs require no gradient, as the eager functions' do not): MXLinear's autograd function
    differentiates around them."""
    def define(fn):
        schema = torch.library.infer_schema(fn, mutates_args=())
        _LIB.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        # not differentiable: autograd falls through, so outputs are plain tensors, as the
        # eager functions' (which read their input detached) are
        _LIB.impl(name, torch.library.fallthrough_kernel, "Autograd")
        return getattr(torch.ops.ocpmx, name).default
    return define


def _signed(seed: int) -> int:
    """A 64-bit seed as the signed integer a custom op's ``int`` argument holds."""
    seed &= _M64
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _numerics(fmt: str, scale_rule: str, rounding: str, rotation: str, int8_min: int,
              conversion: str = "ocp") -> Numerics:
    return Numerics(get_format(fmt), ScaleRule.parse(scale_rule), Rounding.parse(rounding),
                    parse_rotation(rotation), int8_min, Conversion.parse(conversion))


def _args(n: Numerics) -> tuple:
    return (n.fmt.name, n.scale_rule.label, n.rounding.label,
            n.rotation.name if n.rotation is not None else "none", n.int8_min)


def _moved(shape, axis: int) -> list[int]:
    return list(shape[:axis]) + list(shape[axis + 1:]) + [shape[axis]]


# ---- quantize ---------------------------------------------------------------------------------

@_op("quantize")
def quantize_op(x: Tensor, fmt: str, scale_rule: str, rounding: str, rotation: str,
                int8_min: int, axis: int, block_size: int, seed: int, keys: Optional[Tensor],
                backend: str, conversion: str) -> tuple[Tensor, Tensor]:
    pk = plans.key("ocpmx::quantize", x, (fmt, scale_rule, rounding, rotation, int8_min, axis,
                                         block_size, backend, conversion), keys)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call (``native.plans``)
        return plan_run(plan, x, seed, keys)
    n = _numerics(fmt, scale_rule, rounding, rotation, int8_min, conversion)
    return ops.quantize_kmajor(x, n, axis, block_size, seed & _M64, keys, backend or None, None,
                               pk, plans.as_launched)


def plan_run(plan, x: Tensor, seed: int, keys: Optional[Tensor]):
    """A custom op's implementation through a plan (``native.plans``; the ops' results are
    K-major, as the plans keep them)."""
    ops._check_keys(keys, x)
    return plans.run(plan, x, seed, keys)  # (``launch.random_args`` takes the seed mod 2^64)


@torch.library.register_fake("ocpmx::quantize")
def _(x, fmt, scale_rule, rounding, rotation, int8_min, axis, block_size, seed, keys, backend,
      conversion):
    moved = _moved(x.shape, axis)
    k = moved[-1]
    data = x.new_empty(moved[:-1] + [k // pack_factor(get_format(fmt))], dtype=torch.uint8)
    return data, x.new_empty(moved[:-1] + [k // block_size], dtype=torch.uint8)


def quantize(x, n: Numerics, axis: int, block_size: int, seed: int, keys, backend):
    return quantize_op(x, *_args(n), axis, block_size, _signed(seed), keys, backend or "",
                       n.conversion.label)


# ---- quantize-dequantize ----------------------------------------------------------------------

@_op("quantize_dequantize")
def quantize_dequantize_op(x: Tensor, fmt: str, scale_rule: str, rounding: str, rotation: str,
                           axis: int, block_size: int, seed: int, keys: Optional[Tensor],
                           backend: str, conversion: str) -> Tensor:
    pk = plans.key("ocpmx::quantize_dequantize", x, (fmt, scale_rule, rounding, rotation, axis,
                                                    block_size, backend, conversion), keys)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call (``native.plans``)
        return plan_run(plan, x, seed, keys)
    n = _numerics(fmt, scale_rule, rounding, rotation, -127, conversion)
    return ops.quantize_dequantize_kmajor(x, n, axis, block_size, seed & _M64, keys,
                                          backend or None, None, pk, _values)


def _values(data: Tensor, out: Tensor) -> Tensor:
    return out


@torch.library.register_fake("ocpmx::quantize_dequantize")
def _(x, fmt, scale_rule, rounding, rotation, axis, block_size, seed, keys, backend,
      conversion):
    return x.new_empty(_moved(x.shape, axis), dtype=torch.bfloat16)


def quantize_dequantize(x, n: Numerics, axis: int, block_size: int, seed: int, keys, backend):
    return quantize_dequantize_op(x, *_args(n)[:4], axis, block_size, _signed(seed), keys,
                                  backend or "", n.conversion.label)


# ---- quantize-dequantize along both axes --------------------------------------------------------

@_op("quantize_dequantize_both_axes")
def quantize_dequantize_both_axes_op(x: Tensor, fmt: str, scale_rule: str, rotation: str,
                                     backend: str) -> tuple[Tensor, Tensor]:
    pk = plans.key("ocpmx::quantize_dequantize_both_axes", x, (fmt, scale_rule, rotation,
                                                               backend), None)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call (``native.plans``)
        return plans.run_both_axes(plan, x)
    n = _numerics(fmt, scale_rule, "rne", rotation, -127)
    return ops.both_axes_impl(x, n, None, pk)


@torch.library.register_fake("ocpmx::quantize_dequantize_both_axes")
def _(x, fmt, scale_rule, rotation, backend):
    return (x.new_empty(x.shape, dtype=torch.bfloat16),
            x.new_empty(x.shape[::-1], dtype=torch.bfloat16))


def quantize_dequantize_both_axes(x, n: Numerics, backend):
    """(RNE and the OCP conversion: the numerics the one-pass kernel takes.)"""
    return quantize_dequantize_both_axes_op(x, *_args(n)[:2], _args(n)[3], backend or "")


# ---- dequantize -------------------------------------------------------------------------------

@_op("dequantize")
def dequantize_op(data: Tensor, scales: Tensor, fmt: str, k: int, block_size: int,
                  dtype: torch.dtype, backend: str) -> Tensor:
    return ops.dequantize_kmajor(data, scales, fmt, k, block_size, dtype, backend or None, None)


@torch.library.register_fake("ocpmx::dequantize")
def _(data, scales, fmt, k, block_size, dtype, backend):
    return data.new_empty(list(data.shape[:-1]) + [k], dtype=dtype)


def dequantize(data, scales, fmt, k: int, block_size: int, dtype, backend):
    return dequantize_op(data, scales, get_format(fmt).name, k, block_size, dtype, backend or "")


# ---- cast -------------------------------------------------------------------------------------

@_op("cast")
def cast_op(x: Tensor, fmt: str, rounding: str, int8_min: int, seed: int, backend: str) -> Tensor:
    n = _numerics(fmt, "floor", rounding, "none", int8_min)
    return ops.cast_impl(x, n, seed & _M64, backend or None, None)


@torch.library.register_fake("ocpmx::cast")
def _(x, fmt, rounding, int8_min, seed, backend):
    return x.new_empty(x.shape, dtype=torch.uint8)


def cast(x, n: Numerics, seed: int, backend):
    return cast_op(x, n.fmt.name, n.rounding.label, n.int8_min, _signed(seed), backend or "")


# ---- the transpose ----------------------------------------------------------------------------

@_op("move_axis_last")
def move_axis_last_op(x: Tensor, axis: int) -> Tensor:
    if axis == x.dim() - 1:  # nothing moves; an op's output must not alias its input
        return x.clone(memory_format=torch.contiguous_format)
    return launch.move_axis_last(x.contiguous(), axis, default_tuning(x.device))


@torch.library.register_fake("ocpmx::move_axis_last")
def _(x, axis):
    return x.new_empty(_moved(x.shape, axis))


def move_axis_last(x, axis: int):
    return move_axis_last_op(x, axis)


# ---- the MX GEMM ------------------------------------------------------------------------------

@_op("mx_matmul")
def mx_matmul_op(a_data: Tensor, a_scales: Tensor, b_data: Tensor, b_scales: Tensor,
                 fmt_a: str, fmt_b: str, k: int, out_dtype: torch.dtype, method: str,
                 model: str, backend: str) -> Tensor:
    return gemm.mx_matmul_kmajor(a_data, a_scales, b_data, b_scales, get_format(fmt_a),
                                 get_format(fmt_b), k, out_dtype, backend or None, method, model,
                                 tune=True)


@torch.library.register_fake("ocpmx::mx_matmul")
def _(a_data, a_scales, b_data, b_scales, fmt_a, fmt_b, k, out_dtype, method, model, backend):
    return a_data.new_empty((a_data.shape[0], b_data.shape[0]), dtype=out_dtype)


def mx_matmul(a_data, a_scales, b_data, b_scales, fmt_a, fmt_b, k: int, out_dtype, method: str,
              model: str, backend):
    return mx_matmul_op(a_data, a_scales, b_data, b_scales, fmt_a.name, fmt_b.name, k, out_dtype,
                        method, model, backend or "")


# ---- the fold methods' operands and GEMM (issue 17) ---------------------------------------------
# A FoldedTensor travels as its tensors (codes, exponents, scales, stats and 2^R, the last an
# empty tensor when not asked); its group and format as plain values. The fold also adds its
# rounded-element count to the device's running total (``fold.inexact_total``) as in eager mode:
# a side effect the op does not declare, since the total is no argument of it (the kernel adds
# to a buffer at a fixed address, which a CUDA graph replays).

@_op("quantize_folded")
def quantize_folded_op(x: Tensor, fmt: str, scale_rule: str, rounding: str, rotation: str,
                       axis: int, group: int, pow2: bool, seed: int, keys: Optional[Tensor],
                       backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    pk = plans.key("ocpmx::quantize_folded", x, (fmt, scale_rule, rounding, rotation, axis,
                                                 group, pow2, backend), keys)
    plan = plans.find(pk)
    if plan is not None:  # a repeated call (``native.plans``)
        ops._check_keys(keys, x)
        return plans.run_fold(plan, x, seed, keys)
    n = _numerics(fmt, scale_rule, rounding, rotation, -127)
    f = fold.quantize_folded_kmajor(x, n, axis, group, pow2, seed & _M64, keys, backend or None,
                                    None, pk, _folded_parts)
    return _folded_parts(f.codes, f.exponents, f.scales, f.stats, f.pow2)


def _folded_parts(codes: Tensor, exps: Tensor, scales: Tensor, stats: Tensor,
                  p2: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The op's results (2^R an empty tensor where none was asked)."""
    return (codes, exps, scales, stats,
            p2 if p2 is not None else codes.new_empty((0,), dtype=torch.float32))


@torch.library.register_fake("ocpmx::quantize_folded")
def _(x, fmt, scale_rule, rounding, rotation, axis, group, pow2, seed, keys, backend):
    k = x.shape[axis]
    rows = x.numel() // k if k else 0
    nblk = k // BLOCK_SIZE
    return (x.new_empty((rows, k), dtype=torch.uint8),
            x.new_empty((rows, nblk // group), dtype=torch.int32),
            x.new_empty((rows, nblk), dtype=torch.uint8),
            x.new_empty((2,), dtype=torch.int64),
            x.new_empty((nblk // group, rows) if pow2 else (0,), dtype=torch.float32))


def quantize_folded(x, n: Numerics, axis: int, group: int, pow2: bool, seed: int, keys,
                    backend) -> "fold.FoldedTensor":
    codes, exps, scales, stats, p2 = quantize_folded_op(
        x, *_args(n)[:4], axis, group, pow2, _signed(seed), keys, backend or "")
    return fold.FoldedTensor(codes, exps, scales, group, n.fmt, stats, p2 if pow2 else None)


@_op("folded_product")
def folded_product_op(method: str, fmt_a: str, a_codes: Tensor, a_exponents: Tensor,
                      a_scales: Tensor, a_stats: Tensor, a_pow2: Tensor, fmt_b: str,
                      b_codes: Tensor, b_exponents: Tensor, b_scales: Tensor, b_stats: Tensor,
                      b_pow2: Tensor, group: int, out_dtype: torch.dtype) -> Tensor:
    def folded(fmt, codes, exps, scales, stats, p2):
        return fold.FoldedTensor(codes, exps, scales, group, get_format(fmt), stats,
                                 p2 if p2.numel() else None)
    return gemm.folded_product(method, folded(fmt_a, a_codes, a_exponents, a_scales, a_stats,
                                              a_pow2),
                               folded(fmt_b, b_codes, b_exponents, b_scales, b_stats, b_pow2),
                               out_dtype)


@torch.library.register_fake("ocpmx::folded_product")
def _(method, fmt_a, a_codes, a_exponents, a_scales, a_stats, a_pow2, fmt_b, b_codes,
      b_exponents, b_scales, b_stats, b_pow2, group, out_dtype):
    return a_codes.new_empty((a_codes.shape[0], b_codes.shape[0]), dtype=out_dtype)


def folded_product(method: str, fa: "fold.FoldedTensor", fb: "fold.FoldedTensor",
                   out_dtype) -> Tensor:
    if fa.group != fb.group:
        raise ValueError("folded operands need the same group")
    empty = fa.codes.new_empty((0,), dtype=torch.float32)

    def parts(f):
        return (f.fmt.name, f.codes, f.exponents, f.scales, f.stats,
                f.pow2 if f.pow2 is not None else empty)
    return folded_product_op(method, *parts(fa), *parts(fb), fa.group, out_dtype)
