"""The golden model: bit-exact OCP MX v1.0 cast/decode, block quantize, packing, Hadamard
rotations and MX dot products with explicit accumulation models (Numba)."""
from .numba_cache import drop_stale as _drop_stale

_drop_stale()  # before any kernel loads its cache (see numba_cache)
from ..spec.rotation import Rotation, parse_rotation
from .accumulate import HOPPER_BF16, HOPPER_FP8, MODELS, ChunkedModel, mx_dot, mx_matmul
from .block_quantize import MXArray, cast, dequantize, quantize
from .interop import codes_as_ml_dtypes, from_ml_dtypes, ml_dtype, scales_as_ml_dtypes
from .decode import cast_scale, decode, decode_code, decode_scale, decode_table
from . import gfx950
from .packing import pack, unpack
from .philox import random_bits
from .rotation import rotate

__all__ = [
    "HOPPER_BF16", "HOPPER_FP8", "MODELS", "ChunkedModel", "mx_dot", "mx_matmul",
    "MXArray", "Rotation", "cast", "cast_scale", "decode", "decode_code", "decode_scale",
    "decode_table", "dequantize", "gfx950", "pack", "parse_rotation", "quantize", "random_bits",
    "rotate", "unpack",
    "codes_as_ml_dtypes", "from_ml_dtypes", "ml_dtype", "scales_as_ml_dtypes",
]
