"""The native backend: Triton MX kernels (fused rotate + quantize, dequantize, MX GEMM through
``tl.dot_scaled``) on torch tensors, their baselines, and MXLinear with per-GEMM recipes.

Needs the ``gpu`` extra (torch, triton). On a CPU the kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``, Triton >= 3.8); the same API falls back to the emulator otherwise.
"""
from .gemm import bf16_matmul, fp8_matmul, fp8_per_tensor, mx_matmul
from .linear import MXLinear, convert_linears, mix_seed, recipe_gemm, set_step
from .quantize import MXTensor, dequantize, encode, interpreting, quantize, quantize_dequantize
from .recipes import GEMMS, RECIPES, GemmRecipe, Recipe, get_recipe

__all__ = [
    "GEMMS", "RECIPES", "GemmRecipe", "MXLinear", "MXTensor", "Recipe", "bf16_matmul",
    "convert_linears", "dequantize", "encode", "fp8_matmul", "fp8_per_tensor", "get_recipe",
    "interpreting", "mix_seed", "mx_matmul", "quantize", "quantize_dequantize", "recipe_gemm", "set_step",
]
