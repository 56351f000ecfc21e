"""Triton MX kernels and MXLinear (see the native-backend issue)."""
