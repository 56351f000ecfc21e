"""MXLinear: a Linear layer whose Fprop, Dgrad and Wgrad each follow their own recipe entry.

Master weights (and so the optimizer state) stay in the parameter's dtype (fp32); each GEMM
quantizes its operands along its contraction dimension:
  fprop  Y  = X Wᵀ   X and W along in-features
  dgrad  ∇X = ∇Y W   ∇Y and W along out-features (W quantized along its other axis)
  wgrad  ∇W = ∇Yᵀ X  ∇Y and X along tokens

Output dtype: as ``nn.Linear``'s under a bfloat16 autocast: Y and the Dgrad GEMM's output are
bfloat16 (∇X is then cast to X's dtype), whatever X's dtype; otherwise X's dtype where it is
float32 or bfloat16, else float32 (so not ``nn.Linear``'s under a float16 autocast or for a
float16 X) (``output_dtype``). Wgrad's GEMM writes float32.

Devices: on GPU tensors the Triton kernels; on CPU tensors the emulator (Numba) by default, or
the Triton interpreter with ``backend='triton'`` (TRITON_INTERPRET=1). The quantized operands are
bit-identical on every path; the products are fp32 ``tl.dot_scaled`` on the GPU and under the
interpreter, and a float32 torch matmul of the dequantized operands on the emulator path.

Random bits (stochastic rounding, random-sign rotations) are keyed by (seed, layer, step,
micro-batch, GEMM, operand), so a resumed run draws the same bits as an uninterrupted one. The
training loop tells the layers the step with ``set_step``, which writes each layer's keys into a
small device buffer that the kernels read: a compiled graph, or a CUDA graph, then needs no
recompiling or re-capturing from step to step.

Under ``torch.compile`` the layer traces whole (``fullgraph=True``): its autograd function calls
the ``ocpmx`` custom ops (``ocpmx.native.library``), with the same bits as in eager mode.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .. import emulator
from ..spec import BLOCK_SIZE, Rotation, get_format, parse_rotation
from .baselines import bf16_matmul, fp8_matmul
from .dispatch import pick_backend
from .fold import gluon_gemm_device, quantize_folded
from .gemm import (CUBLAS_METHODS, FOLD_METHODS, FOLD_MODELS, auto_method, bf16_product,
                   check_cublas_shapes, fit_method, folded_product, mx_matmul)
from .ops import (both_axes_applies, dequantize, numerics, quantize, quantize_dequantize,
                  quantize_dequantize_both_axes)
from .recipes import (FP8_ELEMENT, GEMMS, OPERANDS, RANDOM_SIGN_SIZE, GemmRecipe, Recipe,
                      check_accumulation, get_recipe)
from .tuning import default_tuning

_MASK64 = (1 << 64) - 1


def mix_seed(*values: int) -> int:
    """A 64-bit seed from integers (SplitMix64 chained over the values); deterministic."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h


@dataclass(frozen=True)
class GemmContext:
    """What a layer's GEMMs need besides their operands (MXLinear's saved state): the keys of
    its random bits (run seed, layer, optimizer step, micro-batch) and where its MX GEMMs run
    (``backend``: None, 'triton' or 'emulator'; ``method``: see ``mx_matmul``)."""

    seed: int = 0
    layer: int = 0
    step: int = 0
    micro: int = 0
    backend: str | None = None
    method: str = "auto"
    accumulation: str | None = None  # an emulator model name: the MX GEMMs' sums (CPU)

    def rotation(self, g: GemmRecipe, gemm: str) -> Rotation | None:
        """The rotation GEMM ``gemm`` applies under recipe entry ``g`` in this context."""
        if g.rotation == "random_sign":  # re-drawn every step (and micro-batch, layer, GEMM)
            return Rotation(RANDOM_SIGN_SIZE, mix_seed(self.seed, 1, self.layer, self.step,
                                                       self.micro, GEMMS.index(gemm)))
        if g.rotation == "random_sign_fixed":  # one draw for the run
            return Rotation(RANDOM_SIGN_SIZE, mix_seed(self.seed, 2))
        return parse_rotation(g.rotation)

    def rounding_seed(self, gemm: str, operand: int) -> int:
        """The stochastic-rounding seed of operand 0 or 1 of GEMM ``gemm``."""
        return mix_seed(self.seed, 3, self.layer, self.step, self.micro, GEMMS.index(gemm),
                        operand)

    def keys(self, recipe: Recipe) -> list[int]:
        """The layer's random keys for this step, as ``key_buffer`` holds them: for GEMM g and
        operand j, [rounding seed, sign mask of a re-drawn random-sign rotation (else 0)], as
        signed 64-bit integers."""
        out = []
        for gemm in GEMMS:
            g = recipe.gemm(gemm)
            rot = self.rotation(g, gemm) if g.rotation == "random_sign" else None
            mask = rot.sign_mask() if rot is not None else 0
            for j in range(2):
                out += [_signed(self.rounding_seed(gemm, j)), mask]
        return out


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def needs_keys(g: GemmRecipe) -> bool:
    """Whether GEMM recipe entry ``g`` draws random bits that change with the step."""
    return g.is_mx and (g.rotation == "random_sign" or "stochastic" in g.rounding)


def recipe_gemm(gemm: str, g: GemmRecipe, a: torch.Tensor, a_axis: int, b: torch.Tensor,
                b_axis: int, out_dtype: torch.dtype, ctx: GemmContext,
                bias: torch.Tensor | None = None,
                keys: torch.Tensor | None = None, ready=(None, None)) -> torch.Tensor:
    """One training GEMM under recipe entry ``g``: contracts ``a`` along ``a_axis`` with ``b``
    along ``b_axis`` (2-D operands); returns (a's other dim, b's other dim) in ``out_dtype``,
    plus ``bias`` (Fprop). The one place that decides how each precision computes.

    ``keys``: the layer's key buffer (``GemmContext.keys``, shape (3, 2, 2) on the operands'
    device); where ``g`` draws per-step random bits the kernels read them there, else from
    ``ctx`` on the host. ``ready``: per operand, its quantize-dequantized values where the
    caller already has them (``both_axes_values``; GEMM method 'bf16' only), else None."""
    am = a if a_axis == 1 else a.t()
    bm = b if b_axis == 1 else b.t()
    if g.precision == "bf16":  # exactly what nn.Linear's forward and backward compute
        if gemm == "fprop":
            return F.linear(am.to(torch.bfloat16), bm.to(torch.bfloat16),
                            None if bias is None else bias.to(torch.bfloat16)).to(out_dtype)
        return _add_bias(bf16_matmul(am, bm, out_dtype), bias)
    # the recipe fixes the precision of the MX and FP8 GEMMs: not an ambient autocast (which
    # AOT autograd would also apply to the backward it traces under the forward's autocast)
    with torch.autocast(a.device.type, enabled=False):
        if bias is None:
            return _quantized_gemm(gemm, g, a, a_axis, b, b_axis, out_dtype, ctx, keys, ready)
        # the bias joins the float32 products, then one rounding to out_dtype
        y = _quantized_gemm(gemm, g, a, a_axis, b, b_axis, torch.float32, ctx, keys, ready)
        return (y + bias.float()).to(out_dtype)


def mx_method(g: GemmRecipe, device: torch.device, m: int, n: int, k: int,
              ctx: GemmContext) -> str:
    """How an M x N x K MX GEMM under ``g`` multiplies: 'emulator' on the emulator backend,
    else ``ctx.method``, with 'auto' resolved on ``device`` (``auto_method``, ``fit_method``;
    where that gives a fold method and ``g`` converts other than OCP's way: 'bf16')."""
    if pick_backend(device, ctx.backend) == "emulator":
        return "emulator"
    method = ctx.method
    if method == "auto":
        fmt = get_format(g.element)
        method = fit_method(auto_method(device, m * n * k), fmt, fmt, m, n, k)
        if method in FOLD_METHODS and g.conversion != "ocp":
            method = "bf16"  # the folds take OCP conversions only
    return method


@torch.compiler.assume_constant_result
def linear_both_axes(device: torch.device) -> bool:
    """``Tuning.linear_both_axes`` of ``device``'s tuning (a constant under torch.compile)."""
    return default_tuning(device).linear_both_axes


def both_axes_values(t: torch.Tensor, uses, ctx: GemmContext, keys):
    """Operand ``t`` of two GEMMs that contract it along different axes, quantize-dequantized
    along both in one pass (``quantize_dequantize_both_axes``: (along its last axis, along
    axis 0)) where that can be; else (None, None). ``uses``: two (gemm, recipe entry, operand
    index, M, N, K). It can where both GEMMs are MX GEMMs of method 'bf16' without an
    accumulation model, give ``t`` the same format and quantize options but the axis, and
    those are what the one-pass kernel takes (``ops.both_axes_applies``: RNE, no rotation or a
    fixed Hadamard one, the OCP conversion): the same bits as the GEMMs' own calls."""
    if ctx.accumulation is not None or t.dim() != 2:
        return None, None
    found = []
    for gemm, g, j, m, n, k in uses:
        if not g.is_mx or mx_method(g, t.device, m, n, k, ctx) != "bf16":
            return None, None
        kw = dict(_operand_options(gemm, g, 1, 1, ctx, keys)[j])
        kw.pop("axis")  # (the axes differ: that is the point)
        if set(kw) != {"scale_rule", "rounding", "rotation", "backend"}:
            return None, None  # (random bits or another conversion: not the kernel's)
        found.append((g.element, kw))
    if found[0] != found[1]:
        return None, None
    element, kw = found[0]
    n = numerics(element, kw["scale_rule"], kw["rounding"], kw["rotation"])
    if not both_axes_applies(t, n, kw["backend"]):
        return None, None
    return quantize_dequantize_both_axes(t, element, **kw)


def _quantized_gemm(gemm: str, g: GemmRecipe, a, a_axis: int, b, b_axis: int, out_dtype,
                    ctx: GemmContext, keys, ready=(None, None)) -> torch.Tensor:
    """The FP8 and MX precisions of ``recipe_gemm``."""
    am = a if a_axis == 1 else a.t()
    bm = b if b_axis == 1 else b.t()
    if g.precision == "fp8":
        names = OPERANDS[gemm]
        return fp8_matmul(am, bm, FP8_ELEMENT[names[0]], FP8_ELEMENT[names[1]], out_dtype)
    if ctx.accumulation is not None:
        return _emulated_gemm(gemm, g, a, a_axis, b, b_axis, out_dtype, ctx, keys)
    method = mx_method(g, a.device, am.shape[0], bm.shape[0], am.shape[1], ctx)
    on_emulator = method == "emulator"
    if any(r is not None for r in ready) and method != "bf16":
        raise ValueError(f"quantize-dequantized operands feed GEMM method 'bf16', not {method!r}")
    if method in FOLD_METHODS and not on_emulator:
        if g.conversion != "ocp":
            raise ValueError(f"GEMM method {method!r} folds OCP conversions only; recipe "
                             f"conversion={g.conversion!r} needs method 'auto', 'bf16' or "
                             "'dot_scaled'")
        return _folded_gemm(method, gemm, g, a, a_axis, b, b_axis, out_dtype, ctx, keys,
                            am.shape[0], bm.shape[0], am.shape[1])
    ops = []
    for t, kw, done in zip((a, b), _operand_options(gemm, g, a_axis, b_axis, ctx, keys), ready):
        # without MX units: one quantize-dequantize pass per operand feeds a bf16 GEMM (the
        # same bits as dequantize(quantize(.)), without the packed round trip)
        ops.append(done if done is not None else
                   quantize_dequantize(t, g.element, **kw) if method == "bf16"
                   else quantize(t, g.element, **kw))
    if on_emulator:
        da = dequantize(ops[0], backend="emulator")
        db = dequantize(ops[1], backend="emulator")
        da = da if a_axis == 1 else da.t()
        db = db if b_axis == 1 else db.t()
        return (da @ db.t()).to(out_dtype)
    if method == "bf16":
        return bf16_product(ops[0] if a_axis == 1 else ops[0].t(),
                            ops[1] if b_axis == 1 else ops[1].t(), out_dtype)
    return mx_matmul(ops[0], ops[1], out_dtype=out_dtype, backend=ctx.backend, method=method)


def _folded_gemm(method: str, gemm: str, g: GemmRecipe, a, a_axis: int, b, b_axis: int,
                 out_dtype, ctx: GemmContext, keys, m: int, n: int, k: int) -> torch.Tensor:
    """A fold method's M x N x K GEMM on operands folded in their quantize pass
    (``fold.quantize_folded``: one kernel per operand, no fold launch): the bits of
    ``mx_matmul(quantize(a), quantize(b), method=method)``. Under ``torch.compile`` the two
    are the custom ops ``ocpmx::quantize_folded`` and ``ocpmx::folded_product``."""
    if method in CUBLAS_METHODS:
        check_cublas_shapes(a.device, m, n, k, method)
    group = FOLD_MODELS[method].group_for(k)
    # 2^R group-major for cuBLAS's scales and for the Gluon kernel (sm_90), which reads them
    # through TMA: written in the quantize pass, not built on the host a call
    pow2 = method in CUBLAS_METHODS or gluon_gemm_device(a.device)
    fa, fb = (quantize_folded(t, g.element, group, pow2=pow2, **kw)
              for t, kw in zip((a, b), _operand_options(gemm, g, a_axis, b_axis, ctx, keys)))
    return folded_product(method, fa, fb, out_dtype)


def _operand_options(gemm: str, g: GemmRecipe, a_axis: int, b_axis: int, ctx: GemmContext,
                     keys) -> list[dict]:
    """The quantize options of GEMM ``gemm``'s two operands under recipe entry ``g``: axis,
    scale rule, rounding, rotation, and where random bits come from (the layer's key buffer
    when the kernels read it, else a seed from ``ctx``)."""
    keyed = keys is not None and needs_keys(g)
    if keyed and g.rotation == "random_sign":  # the signs come from the keys
        rot = Rotation(RANDOM_SIGN_SIZE, mask=0)
    else:
        rot = ctx.rotation(g, gemm)
    out = []
    for j, axis in enumerate((a_axis, b_axis)):
        kw = dict(axis=axis, scale_rule=g.scale_rule, rounding=g.rounding[j], rotation=rot,
                  backend=ctx.backend)
        if g.conversion != "ocp":
            kw["conversion"] = g.conversion
        if keyed:
            kw["keys"] = keys[GEMMS.index(gemm), j]
        elif g.rounding[j] == "stochastic":
            kw["seed"] = ctx.rounding_seed(gemm, j)
        out.append(kw)
    return out


def _emulated_gemm(gemm: str, g: GemmRecipe, a, a_axis: int, b, b_axis: int, out_dtype,
                   ctx: GemmContext, keys) -> torch.Tensor:
    """An MX GEMM whose products are summed under the emulator's accumulation model
    ``ctx.accumulation``: the operands quantized as in any MX GEMM, then the model's sum, bit
    for bit (CPU: ``emulator.mx_matmul``; GPU: ``mx_matmul(method='emulate')``), rounded once
    to ``out_dtype``."""
    arrays = []
    for t, kw in zip((a, b), _operand_options(gemm, g, a_axis, b_axis, ctx, keys)):
        mx = quantize(t, g.element, **kw)
        if a.device.type != "cpu":  # the GPU: the Triton GEMM of the same model (it contracts
            arrays.append(mx)       # the quantized axes, whichever they are)
            continue
        mx = mx.to_emulator()
        if kw["axis"] == 0:  # (K, rows) quantized along K -> the (rows, K) view mx_matmul takes
            mx = emulator.MXArray(mx.codes.T, mx.scales.T, mx.fmt, 1, mx.block_size,
                                  mx.rotation)
        arrays.append(mx)
    if a.device.type != "cpu":
        return mx_matmul(arrays[0], arrays[1], out_dtype=out_dtype, backend="triton",
                         method="emulate", model=ctx.accumulation)
    out = emulator.mx_matmul(arrays[0], arrays[1], ctx.accumulation)
    return torch.from_numpy(out).to(out_dtype)


def _add_bias(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return y if bias is None else y + bias.to(y.dtype)


def _own_dtype(x: torch.Tensor) -> torch.dtype:
    """MXLinear's output dtype without a bfloat16 autocast: ``x``'s where it is float32 or
    bfloat16, else float32."""
    return x.dtype if x.dtype in (torch.float32, torch.bfloat16) else torch.float32


def output_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of MXLinear's Fprop output and of its Dgrad GEMM's. Under a bfloat16 autocast
    on ``x``'s device it is bfloat16 whatever ``x`` is, as ``nn.Linear`` returns (the GEMM
    writes bfloat16 and ∇X is cast to X's dtype after it, as autocast's own cast does);
    otherwise ``_own_dtype(x)`` (a device without autocast, e.g. 'meta', included). Wgrad's
    GEMM writes float32 (the weight's gradient, cast to the weight's dtype)."""
    device = x.device.type
    if _autocast_available(device) and torch.is_autocast_enabled(device) and \
            torch.get_autocast_dtype(device) == torch.bfloat16:
        return torch.bfloat16
    return _own_dtype(x)


# Whether a device type has autocast, per type: a dict lookup, which Dynamo traces; it cannot
# trace ``torch.amp.is_autocast_available`` (a C builtin in PyTorch 2.11): the graph broke in
# MXLinear.forward and tracing the autograd function after the break failed (an assertion in
# Dynamo's higher-order-op code). Filled here for the usual types, eagerly for the rest.
_AUTOCAST = {t: torch.amp.is_autocast_available(t) for t in ("cpu", "cuda", "meta")}


def _autocast_available(device_type: str) -> bool:
    known = _AUTOCAST.get(device_type)
    if known is None:
        known = _AUTOCAST[device_type] = torch.amp.is_autocast_available(device_type)
    return known


class _MXLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, keys, recipe: Recipe, ctx: GemmContext,
                both_axes: bool = False, out_dtype: torch.dtype | None = None):
        """``both_axes``: X and ∇Y quantize-dequantized along both axes in one pass where the
        recipe allows (``MXLinear.forward`` decides: ``Tuning.linear_both_axes``, and only
        where the weight gets a gradient). ``out_dtype``: Y's and the Dgrad GEMM's dtype
        (``output_dtype``; None: ``_own_dtype(x)``, as without autocast)."""
        x2 = x.reshape(-1, x.shape[-1])
        if out_dtype is None:
            out_dtype = _own_dtype(x)
        x_rows = x_cols = None
        if both_axes:
            # X along in-features (Fprop) and along tokens (Wgrad, kept for the backward
            # instead of X) in one pass, where the recipe allows
            t, n = x2.shape[0], weight.shape[0]
            x_rows, x_cols = both_axes_values(
                x2, (("fprop", recipe.fprop, 0, t, n, x2.shape[1]),
                     ("wgrad", recipe.wgrad, 1, n, x2.shape[1], t)), ctx, keys)
        y = recipe_gemm("fprop", recipe.fprop, x2, 1, weight, 1, out_dtype, ctx, bias, keys,
                        ready=(x_rows, None))
        fctx.save_for_backward(x2 if x_cols is None else x_cols, weight, keys)
        fctx.x_ready = x_cols is not None  # (the saved X is Wgrad's operand, quantized)
        fctx.recipe, fctx.ctx, fctx.both_axes = recipe, ctx, both_axes
        fctx.has_bias, fctx.x_shape, fctx.bias_dtype = bias is not None, x.shape, \
            None if bias is None else bias.dtype
        fctx.x_dtype, fctx.out_dtype = x.dtype, out_dtype
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(fctx, gy):
        x_saved, weight, keys = fctx.saved_tensors  # (X, or X quantized for Wgrad: x_ready)
        recipe, ctx = fctx.recipe, fctx.ctx
        gy2 = gy.reshape(-1, gy.shape[-1])
        gx = gw = gb = None
        dy_rows = dy_cols = None
        if fctx.both_axes and fctx.needs_input_grad[0] and fctx.needs_input_grad[1]:
            # ∇Y along out-features (Dgrad) and along tokens (Wgrad) in one pass
            t, n, k = gy2.shape[0], gy2.shape[1], weight.shape[1]
            dy_rows, dy_cols = both_axes_values(gy2, (("dgrad", recipe.dgrad, 0, t, k, n),
                                                      ("wgrad", recipe.wgrad, 0, n, k, t)),
                                                ctx, keys)
        if fctx.needs_input_grad[0]:
            gx = recipe_gemm("dgrad", recipe.dgrad, gy2, 1, weight, 0, fctx.out_dtype, ctx,
                             keys=keys, ready=(dy_rows, None))
            gx = gx.to(fctx.x_dtype).reshape(fctx.x_shape)
        if fctx.needs_input_grad[1]:
            gw = recipe_gemm("wgrad", recipe.wgrad, gy2, 0, x_saved, 0, torch.float32, ctx,
                             keys=keys, ready=(dy_cols, x_saved if fctx.x_ready else None))
            gw = gw.to(weight.dtype)
        if fctx.has_bias and fctx.needs_input_grad[2]:
            gb = gy2.float().sum(0).to(fctx.bias_dtype)
        return gx, gw, gb, None, None, None, None, None


class MXLinear(nn.Linear):
    """``nn.Linear`` whose three GEMMs follow ``recipe`` (a name from ``RECIPES`` or a Recipe).

    layer_id and seed key the random bits; ``backend`` None (GPU: Triton; CPU: emulator),
    'emulator' or 'triton' (on CPU: the Triton interpreter). ``method``: how a Triton-backend MX
    GEMM multiplies ('auto', 'dot_scaled', or 'bf16': quantize-dequantize each operand in one
    pass, then a bf16 GEMM; see ``mx_matmul``). ``accumulation``: an emulator accumulation model
    ('exact', 'fp32_sequential', 'hopper_bf16', 'hopper_fp8'; default the recipe's, usually
    None) under which every MX GEMM sums its products bit for bit (``emulator.mx_matmul``), to
    train under a chip's numerics: on CPU tensors through the emulator, on a GPU through the
    Triton GEMM ``mx_matmul(method='emulate')`` (every model but 'exact'); eager mode only;
    bf16 GEMMs are unaffected, per-tensor fp8 ones refuse it. Weights are quantized afresh in
    every GEMM: no cache, because under FSDP2 an all-gathered weight keeps its storage and its
    version counter across optimizer steps, and a cache keyed on them served stale weights (found
    by the FSDP2 resume test)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe="bf16", layer_id: int = 0, seed: int = 0, backend: str | None = None,
                 method: str = "auto", accumulation: str | None = None, device=None,
                 dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = get_recipe(recipe)
        check_mx_shapes(self.recipe, in_features, out_features)
        accumulation = accumulation if accumulation is not None else self.recipe.accumulation
        check_accumulation(accumulation)
        fp8 = [g for g in GEMMS if self.recipe.gemm(g).precision == "fp8"]
        if accumulation is not None and fp8:
            raise ValueError(f"accumulation={accumulation!r} applies to MX GEMMs; recipe "
                             f"{self.recipe.name} runs {', '.join(fp8)} in per-tensor fp8")
        # step-free: the step keys random bits through the key buffer only, so that a compiled
        # graph, which guards on this object, stays valid from step to step
        self.context = GemmContext(seed=seed, layer=layer_id, backend=backend, method=method,
                                   accumulation=accumulation)
        self.step, self.micro = 0, 0
        self.keyed = any(needs_keys(self.recipe.gemm(g)) for g in GEMMS)
        # (GEMM, operand) -> [rounding seed, sign mask]; written by set_step, read by the kernels
        self.register_buffer("key_buffer", torch.zeros(len(GEMMS), 2, 2, dtype=torch.int64,
                                                       device=device), persistent=False)
        self._keys_written = None

    @property
    def layer_id(self) -> int:
        return self.context.layer

    def set_step(self, step: int, micro: int = 0) -> None:
        """Set the optimizer step and micro-batch that key this layer's random bits, and write
        its key buffer (asynchronously: a pinned host copy on a GPU, no synchronization)."""
        self.step, self.micro = step, micro
        self._write_keys()

    def _write_keys(self) -> None:
        state = (self.step, self.micro)
        if not self.keyed or self._keys_written == state or self.key_buffer.is_meta:
            return
        ctx = replace(self.context, step=self.step, micro=self.micro)
        host = torch.tensor(ctx.keys(self.recipe), dtype=torch.int64)
        if self.key_buffer.is_cuda:  # the caching host allocator keeps the block until copied
            self.key_buffer.copy_(host.pin_memory().view(self.key_buffer.shape), non_blocking=True)
        else:
            self.key_buffer.copy_(host.view(self.key_buffer.shape))
        self._keys_written = state

    def _apply(self, fn, *args, **kwargs):
        self._keys_written = None  # a moved or re-materialized buffer is written afresh
        return super()._apply(fn, *args, **kwargs)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe, **kwargs) -> MXLinear:
        """An MXLinear sharing ``linear``'s parameters (same Parameter objects)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  recipe=recipe, device="meta", **kwargs)
        new.weight = linear.weight
        new.bias = linear.bias
        new.key_buffer = torch.zeros_like(new.key_buffer, device=linear.weight.device)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recipe.wgrad.is_mx and self.training and torch.is_grad_enabled():
            tokens = x.numel() // x.shape[-1]
            if tokens % BLOCK_SIZE:
                raise ValueError(f"{self.recipe.name}: Wgrad contracts over tokens, and "
                                 f"{tokens} tokens are not divisible by the block size "
                                 f"{BLOCK_SIZE}")
        if not torch.compiler.is_compiling():  # compiled callers call set_step (outside)
            self._write_keys()
        elif self.context.accumulation is not None:
            raise NotImplementedError(f"accumulation={self.context.accumulation!r} runs "
                                      "eagerly (the emulator's GEMM is not a custom op)")
        elif any(self.recipe.gemm(g).precision == "fp8" for g in GEMMS):
            raise NotImplementedError(
                f"{self.recipe.name}: the hand-written per-tensor FP8 baseline gives other "
                "numbers under torch.compile than in eager mode (FP8-sized differences, not "
                "understood); run it eagerly")
        both_axes = (torch.is_grad_enabled() and self.weight.requires_grad
                     and linear_both_axes(x.device))
        return _MXLinearFn.apply(x, self.weight, self.bias,
                                 self.key_buffer if self.keyed else None, self.recipe,
                                 self.context, both_axes, output_dtype(x))

    def extra_repr(self) -> str:
        acc = self.context.accumulation
        return (f"{super().extra_repr()}, recipe={self.recipe.name}, layer_id={self.layer_id}"
                + (f", accumulation={acc}" if acc else ""))


def check_mx_shapes(recipe: Recipe, in_features: int, out_features: int) -> None:
    for g, dim, what in (("fprop", in_features, "in_features"),
                         ("dgrad", out_features, "out_features")):
        if recipe.gemm(g).is_mx and dim % BLOCK_SIZE:
            raise ValueError(f"recipe {recipe.name}: {g} contracts over {what} = {dim}, not "
                             f"divisible by the MX block size {BLOCK_SIZE}")


def convert_linears(model: nn.Module, recipe="bf16", rules=(), *, seed: int = 0,
                    backend: str | None = None, method: str = "auto",
                    accumulation: str | None = None) -> nn.Module:
    """Replace every ``nn.Linear`` in ``model`` by an MXLinear (in place; returns ``model``).

    rules: (pattern, recipe) pairs matched with fnmatch against the module's qualified name;
    the first match wins, otherwise ``recipe``. A rule with recipe None leaves the layer as it
    is, e.g. ``rules=[("output", None)]`` keeps the output head an ``nn.Linear`` in bf16.
    Layer ids (which key random bits) follow the module order. ``accumulation``: see
    MXLinear."""
    layer = 0
    targets = []
    for name, mod in model.named_modules():
        if type(mod) is nn.Linear or isinstance(mod, MXLinear):
            chosen = recipe
            for pattern, r in rules:
                if fnmatch.fnmatchcase(name, pattern):
                    chosen = r
                    break
            if chosen is not None:
                targets.append((name, mod, chosen, layer))
            layer += 1
    for name, mod, chosen, lid in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, MXLinear.from_linear(mod, chosen, layer_id=lid, seed=seed,
                                                    backend=backend, method=method,
                                                    accumulation=accumulation))
    return model


def set_step(model: nn.Module, step: int, micro: int = 0) -> None:
    """Tell every MXLinear the optimizer step and micro-batch (they key the random bits)."""
    for mod in model.modules():
        if isinstance(mod, MXLinear):
            mod.set_step(step, micro)
