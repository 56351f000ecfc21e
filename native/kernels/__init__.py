"""Triton kernels, one module per family: ``common`` (bit conversions, block scale, element
encode and decode, shared by every family), ``quantize`` (the strided tile kernel and the
32-block row and column kernels), ``dequantize``, ``gemm`` (``tl.dot_scaled``), ``emulate`` (a
GEMM under a declared accumulation model, bit for bit the emulator's), ``fold`` (FP4/FP6 into
E4M3, and the FP8 GEMM of folded operands), ``both_axes`` (a matrix in 32-row tiles:
quantize-dequantize along both axes in one pass, and along axis 0 alone quantize or
quantize-dequantize), ``gfx950`` (block quantize through gfx950's own
conversion instructions, AMD's conversion model) and ``transpose``.

Launch code lives in ``ocpmx.native.launch``; these modules hold only ``@triton.jit``
functions. Every kernel takes the format's parameters as one block of constexprs
(``ocpmx.spec.KernelFormat.constexprs``: IS_INT, BITS, SIGN, EBITS, MBITS, BIAS, EMAX, MAXC,
NANC, INFC, NEGMAX, RNUM, RSHIFT, SUBQ, MAXV, ENVELOPE) and the options as the named constants
of ``common`` (scale rules FLOOR..EVEN, roundings RNE and STOCHASTIC).
"""
from . import both_axes, common, dequantize, emulate, fold, gemm, gfx950, quantize, transpose

__all__ = ["both_axes", "common", "dequantize", "emulate", "fold", "gemm", "gfx950", "quantize",
           "transpose"]
