"""The golden model: bit-exact OCP MX v1.0 encode/decode, block quantization, packing,
Hadamard rotations and MX dot products with explicit accumulation models (Numba)."""
from .accumulate import HOPPER_BF16, HOPPER_FP8, MODELS, ChunkedModel, mx_dot, mx_matmul
from .decode import decode, decode_code, decode_scale, decode_table, encode_scale
from .packing import pack, unpack
from .philox import random_bits
from .block_quantize import MXArray, dequantize, encode, quantize
from .rotation import Rotation, as_rotation, rotate

__all__ = [
    "HOPPER_BF16", "HOPPER_FP8", "MODELS", "ChunkedModel", "mx_dot", "mx_matmul",
    "MXArray", "Rotation", "as_rotation", "decode", "decode_code", "decode_scale", "decode_table",
    "dequantize", "encode", "encode_scale", "pack", "quantize", "random_bits", "rotate", "unpack",
]
