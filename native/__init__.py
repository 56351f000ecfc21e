"""The native backend: Triton MX kernels (fused rotate + quantize, dequantize, MX GEMM through
``tl.dot_scaled``) on torch tensors, their baselines, and MXLinear with per-GEMM recipes.

Modules: ``ops`` (the public operations), ``tensor`` (``MXTensor``), ``gemm`` (``mx_matmul``),
``baselines`` (bf16 and per-tensor FP8), ``recipes`` (the recipe table), ``linear`` (MXLinear),
``tuning`` (tile objects), ``launch`` (what each kernel is given), ``dispatch`` (which backend
runs), ``kernels`` (the Triton kernels, by family), ``interop`` (torch dtype views, torchao's
MXTensor), ``torchao_config`` (``MXRecipeConfig`` and ``quantize_``, torchao-style; imported on
first use, since it imports torchao when installed).

Needs the ``gpu`` extra (torch, triton). On a CPU the kernels run under the Triton interpreter
(``TRITON_INTERPRET=1``, Triton >= 3.8); the same API falls back to the emulator otherwise.
"""
from .baselines import bf16_matmul, fp8_matmul, fp8_per_tensor
from .dispatch import BACKENDS, interpreting
from .gemm import METHODS, mx_matmul
from .linear import GemmContext, MXLinear, convert_linears, mix_seed, recipe_gemm, set_step
from .ops import (cast, dequantize, move_axis_last, quantize, quantize_dequantize,
                  quantize_dequantize_both_axes)
from .recipes import GEMMS, PRECISIONS, RECIPES, GemmRecipe, Recipe, get_recipe
from .interop import (data_as_torch_dtype, from_torch_dtypes, from_torchao, scales_as_torch_dtype,
                      to_torchao, torch_dtype)
from .tensor import MXTensor
from .tuning import ColumnTile, RowTile, StridedTile, Tuning, default_tuning

__all__ = [
    "BACKENDS", "ColumnTile", "GEMMS", "METHODS", "PRECISIONS", "RECIPES", "GemmContext", "GemmRecipe",
    "MXLinear", "MXTensor", "Recipe", "RowTile", "StridedTile", "Tuning", "bf16_matmul", "cast",
    "convert_linears", "default_tuning", "dequantize", "fp8_matmul", "fp8_per_tensor",
    "get_recipe", "interpreting", "mix_seed", "move_axis_last", "mx_matmul", "quantize",
    "quantize_dequantize", "quantize_dequantize_both_axes", "recipe_gemm", "set_step",
    # interop (native/interop.py; native/torchao_config.py, imported on first use: it imports
    # torchao when installed)
    "MXRecipeConfig", "data_as_torch_dtype", "from_torch_dtypes", "from_torchao",
    "linear_layer_ids", "quantize_", "scales_as_torch_dtype", "to_torchao", "torch_dtype",
]

_LAZY = {"MXRecipeConfig", "quantize_", "linear_layer_ids"}


def __getattr__(name):
    if name in _LAZY:
        from . import torchao_config
        return getattr(torchao_config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
