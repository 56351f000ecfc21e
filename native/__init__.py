"""The native backend: Triton MX kernels (fused rotate + quantize, dequantize, MX GEMM through
``tl.dot_scaled``) on torch tensors, their baselines, and MXLinear with per-GEMM recipes.

Modules: ``ops`` (the public operations), ``tensor`` (``MXTensor``), ``gemm`` (``mx_matmul``),
``baselines`` (bf16 and per-tensor FP8), ``recipes`` (the recipe table), ``linear`` (MXLinear),
``tuning`` (tile objects), ``launch`` (what each kernel is given), ``dispatch`` (which backend
runs), ``kernels`` (the Triton kernels, by family).

Needs the ``gpu`` extra (torch, triton). On a CPU the kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``, Triton >= 3.8); the same API falls back to the emulator otherwise.
"""
from .baselines import bf16_matmul, fp8_matmul, fp8_per_tensor
from .dispatch import BACKENDS, interpreting
from .gemm import METHODS, mx_matmul
from .linear import GemmContext, MXLinear, convert_linears, mix_seed, recipe_gemm, set_step
from .ops import cast, dequantize, move_axis_last, quantize, quantize_dequantize
from .recipes import GEMMS, PRECISIONS, RECIPES, GemmRecipe, Recipe, get_recipe
from .tensor import MXTensor
from .tuning import ColumnTile, RowTile, StridedTile, Tuning, default_tuning

__all__ = [
    "BACKENDS", "ColumnTile", "GEMMS", "METHODS", "PRECISIONS", "RECIPES", "GemmContext", "GemmRecipe",
    "MXLinear", "MXTensor", "Recipe", "RowTile", "StridedTile", "Tuning", "bf16_matmul", "cast",
    "convert_linears", "default_tuning", "dequantize", "fp8_matmul", "fp8_per_tensor",
    "get_recipe", "interpreting", "mix_seed", "move_axis_last", "mx_matmul", "quantize",
    "quantize_dequantize", "recipe_gemm", "set_step",
]
