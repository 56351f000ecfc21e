"""MXLinear: a Linear layer whose Fprop, Dgrad and Wgrad each follow their own recipe entry.

Master weights (and so the optimizer state) stay in the parameter's dtype (fp32); each GEMM
quantizes its operands along its contraction dimension:
  fprop  Y  = X Wᵀ   X and W along in-features
  dgrad  ∇X = ∇Y W   ∇Y and W along out-features (W quantized along its other axis)
  wgrad  ∇W = ∇Yᵀ X  ∇Y and X along tokens

Devices: on GPU tensors the Triton kernels; on CPU tensors the emulator (Numba) by default, or
the Triton interpreter with ``backend='triton'`` (TRITON_INTERPRET=1). The quantized operands are
bit-identical on every path; the products are fp32 ``tl.dot_scaled`` on the GPU and under the
interpreter, and a float32 torch matmul of the dequantized operands on the emulator path.

Random bits (stochastic rounding, random-sign rotations) are keyed by (seed, layer, step,
micro-batch, GEMM, operand), so a resumed run draws the same bits as an uninterrupted one. The
training loop tells the layers the step with ``set_step``.
"""
from __future__ import annotations

import fnmatch

import torch
import torch.nn.functional as F
from torch import nn

from ..emulator.rotation import Rotation
from .gemm import auto_method, bf16_matmul, bf16_product, fp8_matmul, mx_matmul
from .quantize import dequantize, pick_backend, quantize, quantize_dequantize
from .recipes import FP8_ELEMENT, GEMMS, MX_ELEMENT, OPERANDS, RANDOM_SIGN_SIZE, GemmRecipe, Recipe, get_recipe

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


def gemm_rotation(g: GemmRecipe, ctx: dict, gemm: str) -> Rotation | None:
    if g.rotation == "none":
        return None
    if g.rotation == "hadamard16":
        return Rotation(16)
    if g.rotation == "hadamard32":
        return Rotation(32)
    if g.rotation == "random_sign":
        return Rotation(RANDOM_SIGN_SIZE, mix_seed(ctx["seed"], 1, ctx["layer"], ctx["step"],
                                                   ctx["micro"], GEMMS.index(gemm)))
    return Rotation(RANDOM_SIGN_SIZE, mix_seed(ctx["seed"], 2))  # random_sign_fixed


def recipe_gemm(gemm: str, g: GemmRecipe, a: torch.Tensor, a_axis: int, b: torch.Tensor,
                b_axis: int, out_dtype: torch.dtype, ctx: dict) -> torch.Tensor:
    """One training GEMM under recipe entry ``g``: contracts ``a`` along ``a_axis`` with ``b``
    along ``b_axis`` (2-D operands); returns (a's other dim, b's other dim) in ``out_dtype``."""
    am = a if a_axis == 1 else a.t()
    bm = b if b_axis == 1 else b.t()
    if g.fmt == "bf16":
        return bf16_matmul(am, bm, out_dtype)
    names = OPERANDS[gemm]
    if g.fmt == "fp8":
        return fp8_matmul(am, bm, FP8_ELEMENT[names[0]], FP8_ELEMENT[names[1]], out_dtype)
    fmt = MX_ELEMENT[g.fmt]
    rot = gemm_rotation(g, ctx, gemm)
    backend = ctx["backend"]
    on_emulator = pick_backend(a.device, backend) == "emulator"
    method = ctx.get("method", "auto")
    method = auto_method(a.device) if method == "auto" and not on_emulator else method
    ops = []
    for j, (t, axis) in enumerate(((a, a_axis), (b, b_axis))):
        kw = dict(axis=axis, scale_rule=g.scale_rule, rounding=g.rounding[j], rotation=rot,
                  seed=mix_seed(ctx["seed"], 3, ctx["layer"], ctx["step"], ctx["micro"],
                                GEMMS.index(gemm), j), backend=backend)
        # without MX units: one quantize-dequantize pass per operand feeds a bf16 GEMM (the
        # same bits as dequantize(quantize(.)), without the packed round trip)
        ops.append(quantize_dequantize(t, fmt, **kw) if method == "bf16" and not on_emulator
                   else quantize(t, fmt, **kw))
    if on_emulator:
        da = dequantize(ops[0], backend="emulator")
        db = dequantize(ops[1], backend="emulator")
        da = da if a_axis == 1 else da.t()
        db = db if b_axis == 1 else db.t()
        return (da @ db.t()).to(out_dtype)
    if method == "bf16":
        return bf16_product(ops[0] if a_axis == 1 else ops[0].t(),
                            ops[1] if b_axis == 1 else ops[1].t(), out_dtype)
    return mx_matmul(ops[0], ops[1], out_dtype=out_dtype, backend=backend, method=method)


class _MXLinearFn(torch.autograd.Function):
    @staticmethod
    def forward(fctx, x, weight, bias, recipe: Recipe, ctx: dict):
        x2 = x.reshape(-1, x.shape[-1])
        out_dtype = x.dtype if x.dtype in (torch.float32, torch.bfloat16) else torch.float32
        if recipe.fprop.fmt == "bf16":  # the exact computation nn.Linear does
            y = F.linear(x2.to(torch.bfloat16), weight.to(torch.bfloat16),
                         None if bias is None else bias.to(torch.bfloat16)).to(out_dtype)
        else:
            y = recipe_gemm("fprop", recipe.fprop, x2, 1, weight, 1, out_dtype, ctx)
            if bias is not None:
                y = y + bias.to(out_dtype)
        fctx.save_for_backward(x2, weight)
        fctx.recipe, fctx.ctx = recipe, dict(ctx)
        fctx.has_bias, fctx.x_shape, fctx.bias_dtype = bias is not None, x.shape, \
            None if bias is None else bias.dtype
        return y.reshape(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(fctx, gy):
        x2, weight = fctx.saved_tensors
        recipe, ctx = fctx.recipe, fctx.ctx
        gy2 = gy.reshape(-1, gy.shape[-1])
        gx = gw = gb = None
        if fctx.needs_input_grad[0]:
            if recipe.dgrad.fmt == "bf16":
                gx = gy2.to(torch.bfloat16) @ weight.to(torch.bfloat16)
            else:
                gx = recipe_gemm("dgrad", recipe.dgrad, gy2, 1, weight, 0, torch.float32, ctx)
            gx = gx.to(x2.dtype).reshape(fctx.x_shape)
        if fctx.needs_input_grad[1]:
            if recipe.wgrad.fmt == "bf16":
                gw = gy2.to(torch.bfloat16).t() @ x2.to(torch.bfloat16)
            else:
                gw = recipe_gemm("wgrad", recipe.wgrad, gy2, 0, x2, 0, torch.float32, ctx)
            gw = gw.to(weight.dtype)
        if fctx.has_bias and fctx.needs_input_grad[2]:
            gb = gy2.float().sum(0).to(fctx.bias_dtype)
        return gx, gw, gb, None, None


class MXLinear(nn.Linear):
    """``nn.Linear`` whose three GEMMs follow ``recipe`` (a name from ``RECIPES`` or a Recipe).

    layer_id and seed key the random bits; ``backend`` None (GPU: Triton; CPU: emulator),
    'emulator' or 'triton' (on CPU: the Triton interpreter). ``method``: how a Triton-backend MX
    GEMM multiplies ('auto', 'dot_scaled', or 'bf16': quantize-dequantize each operand in one
    pass, then a bf16 GEMM; see ``mx_matmul``). Weights are quantized afresh in
    every GEMM: no cache, because under FSDP2 an all-gathered weight keeps its storage and its
    version counter across optimizer steps, and a cache keyed on them served stale weights (found
    by the FSDP2 resume test)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe="bf16", layer_id: int = 0, seed: int = 0, backend: str | None = None,
                 method: str = "auto", device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe = get_recipe(recipe)
        check_mx_shapes(self.recipe, in_features, out_features)
        self.layer_id, self.seed, self.backend, self.method = layer_id, seed, backend, method
        self.step, self.micro = 0, 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe, **kwargs) -> MXLinear:
        """An MXLinear sharing ``linear``'s parameters (same Parameter objects)."""
        new = cls(linear.in_features, linear.out_features, linear.bias is not None,
                  recipe=recipe, device="meta", **kwargs)
        new.weight = linear.weight
        new.bias = linear.bias
        return new

    @torch.compiler.disable  # under torch.compile the MX GEMMs run eagerly (a graph break):
    def forward(self, x: torch.Tensor) -> torch.Tensor:  # the kernels are Triton launches already
        if self.recipe.wgrad.is_mx and self.training and torch.is_grad_enabled():
            tokens = x.numel() // x.shape[-1]
            if tokens % 32:
                raise ValueError(f"{self.recipe.name}: Wgrad contracts over tokens, and "
                                 f"{tokens} tokens are not divisible by the block size 32")
        ctx = dict(seed=self.seed, layer=self.layer_id, step=self.step, micro=self.micro,
                   backend=self.backend, method=self.method)
        return _MXLinearFn.apply(x, self.weight, self.bias, self.recipe, ctx)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, recipe={self.recipe.name}, layer_id={self.layer_id}"


def check_mx_shapes(recipe: Recipe, in_features: int, out_features: int) -> None:
    for g, dim, what in (("fprop", in_features, "in_features"),
                         ("dgrad", out_features, "out_features")):
        if recipe.gemm(g).is_mx and dim % 32:
            raise ValueError(f"recipe {recipe.name}: {g} contracts over {what} = {dim}, not "
                             "divisible by the MX block size 32")


def convert_linears(model: nn.Module, recipe="bf16", rules=(), *, seed: int = 0,
                    backend: str | None = None) -> nn.Module:
    """Replace every ``nn.Linear`` in ``model`` by an MXLinear (in place; returns ``model``).

    rules: (pattern, recipe) pairs matched with fnmatch against the module's qualified name;
    the first match wins, otherwise ``recipe``. A rule with recipe None leaves the layer as it
    is, e.g. ``rules=[("output", None)]`` keeps the output head an ``nn.Linear`` in bf16.
    Layer ids (which key random bits) follow the module order."""
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
                                                    backend=backend))
    return model


def set_step(model: nn.Module, step: int, micro: int = 0) -> None:
    """Tell every MXLinear the optimizer step and micro-batch (they key the random bits)."""
    for mod in model.modules():
        if isinstance(mod, MXLinear):
            mod.step, mod.micro = step, micro
