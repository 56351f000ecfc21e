"""ocpmx: reference implementation of OCP Microscaling (MX) arithmetic and MXFP4 pretraining.

Subpackages: ``ocpmx.spec`` (format table and rules), ``ocpmx.emulator`` (Numba golden
model), ``ocpmx.native`` (Triton kernels and MXLinear), ``ocpmx.conformance`` and
``ocpmx.llama_train``.
"""
__version__ = "0.1.0"
