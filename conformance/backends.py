"""Backends: thin adapters that expose one implementation's MX operations to the suite.

A backend implements any of
  cast(x, fmt)                                          -> codes (element conversion, scale 2^0)
  quantize(x, fmt, axis, block_size, scale_rule, rounding, seed) -> (codes, scales)
  dequantize(codes, scales, fmt, axis, block_size)      -> float32 values
  gemm(a_codes, a_scales, b_codes, b_scales, fmt_a, fmt_b) -> float32 (M, N) = A Bᵀ
on NumPy arrays (x float32; codes uint8 one per element, scales uint8 E8M0, both in the
emulator's layout; gemm operands K-major). An operation it lacks raises NotImplementedError,
or ``supports`` says no: the suite reports 'not-supported'.

Backends are found by name (built in, or the entry-point group ``ocpmx.backends``), or given
as ``path/to/file.py:ClassName`` / ``module:ClassName``.
"""
from __future__ import annotations

import importlib
import importlib.util
import platform
from importlib.metadata import entry_points, version
from pathlib import Path

import numpy as np

from .. import emulator
from ..spec import BLOCK_SIZE, get_format


def kmajor_packed(codes, scales, fmt, axis):
    """Codes and scales in the emulator's layout -> the K-major packed layout (``quantize_packed``:
    the quantized axis last, FP4 two codes per byte, element 0 in the low nibble)."""
    codes = np.moveaxis(np.asarray(codes, np.uint8), axis, -1)
    data = emulator.pack(codes, fmt) if get_format(fmt).bits == 4 else codes
    return (np.ascontiguousarray(data),
            np.ascontiguousarray(np.moveaxis(np.asarray(scales, np.uint8), axis, -1)))


class Backend:
    """Base class; subclasses override the operations they have."""

    name = "base"

    def info(self) -> dict:
        """Versions and device, for the report header."""
        return {"python": platform.python_version(), "numpy": np.__version__}

    def supports(self, op: str, fmt: str, **options) -> bool | str:
        """True, or a reason string when (op, fmt, options) is not supported."""
        return True

    def cast(self, x, fmt):
        raise NotImplementedError

    def quantize(self, x, fmt, axis=-1, block_size=32, scale_rule="floor", rounding="rne", seed=0):
        raise NotImplementedError

    def dequantize(self, codes, scales, fmt, axis=-1, block_size=32):
        raise NotImplementedError

    def gemm(self, a_codes, a_scales, b_codes, b_scales, fmt_a, fmt_b):
        raise NotImplementedError

    def quantize_packed(self, x, fmt, axis=-1, **opts):
        """Optional: the packed bytes and scales in the K-major layout (quantized axis last, FP4
        two per byte, element 0 in the low nibble), for the layout checks."""
        raise NotImplementedError


class EmulatorBackend(Backend):
    """The golden model itself (its own checks are against the spec tables, in the tests)."""

    name = "emulator"

    def info(self):
        import numba
        return {**super().info(), "numba": numba.__version__, "device": "cpu"}

    def cast(self, x, fmt):
        if fmt == "e8m0":
            return emulator.cast_scale(x)
        return emulator.cast(x, fmt)

    def quantize(self, x, fmt, axis=-1, block_size=32, scale_rule="floor", rounding="rne", seed=0):
        mx = emulator.quantize(x, fmt, axis=axis, block_size=block_size, scale_rule=scale_rule,
                               rounding=rounding, seed=seed)
        return mx.codes, mx.scales

    def dequantize(self, codes, scales, fmt, axis=-1, block_size=32):
        return emulator.dequantize(emulator.MXArray(codes, scales, get_format(fmt),
                                                    axis % codes.ndim, block_size))

    def quantize_packed(self, x, fmt, axis=-1, **opts):
        mx = emulator.quantize(x, fmt, axis=axis, **opts)
        return kmajor_packed(mx.codes, mx.scales, fmt, mx.axis)

    def gemm(self, a_codes, a_scales, b_codes, b_scales, fmt_a, fmt_b):
        a = emulator.MXArray(a_codes, a_scales, get_format(fmt_a), 1)
        b = emulator.MXArray(b_codes, b_scales, get_format(fmt_b), 1)
        return emulator.mx_matmul(a, b, "exact")


class TritonBackend(Backend):
    """``ocpmx.native``'s Triton kernels: the current GPU, or the CPU through the Triton
    interpreter (TRITON_INTERPRET=1). GEMM through ``tl.dot_scaled``."""

    name = "triton"

    gemm_method = "dot_scaled"  # native.mx_matmul's method for the GEMM checks

    def __init__(self, device: str | None = None):
        import torch

        from ..native import interpreting
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu" and not interpreting():
            raise RuntimeError("the triton backend on CPU needs TRITON_INTERPRET=1 set before "
                               "Triton is imported (ocpmx conform sets it when --device cpu)")
        self.device = device
        self.torch = torch

    def info(self):
        import torch
        import triton
        out = {**super().info(), "torch": torch.__version__, "triton": triton.__version__}
        if self.device.startswith("cuda"):
            p = torch.cuda.get_device_properties(self.device)
            out.update(device=p.name, capability=f"{p.major}.{p.minor}",
                       cuda=torch.version.cuda, driver=_nvidia_driver())
        else:
            out.update(device="cpu (Triton interpreter)")
        return out

    def supports(self, op, fmt, **options):
        if fmt == "e8m0":
            return "no standalone E8M0 cast (the kernels write scales only through quantize)"
        from ..native.gemm import DOT_SCALED_FORMATS, FOLD_FORMATS, FOLD_METHODS
        if op == "gemm" and self.gemm_method in FOLD_METHODS:
            if fmt not in FOLD_FORMATS:
                return (f"method {self.gemm_method!r} folds {', '.join(FOLD_FORMATS)} into E4M3 "
                        f"(not {fmt})")
        elif op == "gemm" and fmt not in DOT_SCALED_FORMATS:
            return f"tl.dot_scaled takes {', '.join(DOT_SCALED_FORMATS)} (not {fmt})"
        bs = options.get("block_size", BLOCK_SIZE)
        if op in ("quantize", "dequantize") and bs & (bs - 1):
            return f"the kernels take power-of-two block sizes (not {bs})"
        return True

    def _t(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def cast(self, x, fmt):
        from .. import native
        return native.cast(self._t(x), fmt, backend="triton").cpu().numpy()

    def quantize(self, x, fmt, axis=-1, block_size=32, scale_rule="floor", rounding="rne", seed=0):
        from .. import native
        mx = native.quantize(self._t(x), fmt, axis=axis, block_size=block_size,
                             scale_rule=scale_rule, rounding=rounding, seed=seed, backend="triton")
        return mx.codes.cpu().numpy(), mx.scales.cpu().numpy()

    def quantize_packed(self, x, fmt, axis=-1, **opts):
        from .. import native
        mx = native.quantize(self._t(x), fmt, axis=axis, backend="triton", **opts)
        return mx.data.cpu().numpy(), mx.scales_kmajor.cpu().numpy()

    def _mx(self, codes, scales, fmt, axis, block_size):
        from ..native.tensor import MXTensor
        axis %= codes.ndim
        data, sk = kmajor_packed(codes, scales, fmt, axis)
        return MXTensor(self._t(data), self._t(sk), get_format(fmt), axis, codes.shape,
                        block_size)

    def dequantize(self, codes, scales, fmt, axis=-1, block_size=32):
        from .. import native
        mx = self._mx(codes, scales, fmt, axis, block_size)
        return native.dequantize(mx, backend="triton").cpu().numpy()

    def gemm(self, a_codes, a_scales, b_codes, b_scales, fmt_a, fmt_b):
        from .. import native
        a = self._mx(a_codes, a_scales, fmt_a, 1, BLOCK_SIZE)
        b = self._mx(b_codes, b_scales, fmt_b, 1, BLOCK_SIZE)
        return native.mx_matmul(a, b, backend="triton", method=self.gemm_method,
                                tune=False).cpu().numpy()


class TritonGfx950Backend(TritonBackend):
    """``native.quantize(..., conversion='gfx950')``: on a gfx950 GPU, gfx950's own conversion
    instructions (``ocpmx.native.kernels.gfx950``; FP6, which they lack in the kernel, in
    software); on another GPU or under the Triton
    interpreter, the same kernel converting in software (``kernels.gfx950.convert_soft``);
    elsewhere AMD's conversion model through the emulator backend (the report's header says
    which). Known differences from OCP: ``deviations/triton_gfx950.json`` (AMD's documented
    conversion semantics). Dequantize and GEMM are the Triton backend's."""

    name = "triton_gfx950"

    def __init__(self, device: str | None = None):
        super().__init__(device)
        from ..emulator import gfx950 as model
        from ..native.dispatch import gfx950, pick_backend
        device = self.torch.device(self.device)
        self.hardware = gfx950(device)
        # what native.quantize(conversion='gfx950') runs on: the kernel, or the model
        self.backend = pick_backend(device, None)
        self.formats = model.FORMATS

    def info(self):
        conversion = ("gfx950 instructions (kernels.gfx950; FP6 in software, "
                      "kernels.gfx950.convert_soft)" if self.hardware else
                      "gfx950 model in software (kernels.gfx950.convert_soft; no gfx950 GPU "
                      "here)" if self.backend == "triton" else
                      "gfx950 model (emulator; no gfx950 GPU here)")
        return {**super().info(), "conversion": conversion}

    def supports(self, op, fmt, **options):
        if op == "cast":
            return "no standalone cast with conversion='gfx950' (quantize checks the conversion)"
        if op == "quantize":
            if fmt not in self.formats:
                return f"conversion='gfx950' converts {', '.join(self.formats)} here (not {fmt})"
            if self.backend == "triton" and options.get("block_size", BLOCK_SIZE) != BLOCK_SIZE:
                return "the gfx950 kernel takes blocks of 32"
        return super().supports(op, fmt, **options)

    def quantize(self, x, fmt, axis=-1, block_size=32, scale_rule="floor", rounding="rne", seed=0):
        from .. import native
        if rounding != "rne":
            raise NotImplementedError(
                "the suite's stochastic checks draw OCP's random stream; gfx950's stochastic "
                "rounding is checked against emulator.gfx950 directly "
                "(tests/test_gfx950_hardware.py, tests/test_gfx950_soft.py)")
        mx = native.quantize(self._t(x), fmt, axis=axis, block_size=block_size,
                             scale_rule=scale_rule, rounding=rounding, seed=seed,
                             conversion="gfx950", backend=self.backend)
        return mx.codes.cpu().numpy(), mx.scales.cpu().numpy()

    def quantize_packed(self, x, fmt, axis=-1, **opts):
        from .. import native
        mx = native.quantize(self._t(x), fmt, axis=axis, conversion="gfx950",
                             backend=self.backend, **opts)
        return mx.data.cpu().numpy(), mx.scales_kmajor.cpu().numpy()


class TorchBackend(Backend):
    """PyTorch's own casts: float8_e4m3fn, float8_e5m2 (elements) and float8_e8m0fnu (the
    scale, checked as a cast of powers and non-powers of two). PyTorch has no MX block
    quantization in core; float4_e2m1fn_x2 has no conversion kernels (2.13)."""

    name = "torch"
    DTYPES = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e8m0": "float8_e8m0fnu"}

    def info(self):
        import torch
        return {**super().info(), "torch": torch.__version__, "device": "cpu"}

    def supports(self, op, fmt, **options):
        if op != "cast":
            return "PyTorch core has no MX block quantization, dequantization or MX GEMM"
        if fmt not in self.DTYPES:
            return f"no torch dtype with conversions for {fmt}"
        return True

    def cast(self, x, fmt):
        import torch
        dt = getattr(torch, self.DTYPES[fmt])
        return torch.from_numpy(np.ascontiguousarray(x)).to(dt).view(torch.uint8).numpy()


class MlDtypesBackend(Backend):
    """ml_dtypes' element casts (``astype``), run as documented."""

    name = "ml_dtypes"

    def info(self):
        return {**super().info(), "ml_dtypes": version("ml_dtypes"), "device": "cpu"}

    def supports(self, op, fmt, **options):
        if op != "cast":
            return "ml_dtypes has element types only (no MX blocks)"
        if fmt not in _ml_types():
            return f"ml_dtypes has no {fmt} type"
        return True

    def cast(self, x, fmt):
        return np.asarray(x, np.float32).astype(_ml_types()[fmt]).view(np.uint8)


class TorchaoBackend(Backend):
    """torchao's MX quantization (``torchao.prototype.mx_formats.mx_tensor.to_mx`` /
    ``to_dtype``), run as documented: blocks along the last axis, scaling modes FLOOR, CEIL,
    RCEIL, EVEN; elements float4_e2m1fn_x2 (packed), float8_e4m3fn, float8_e5m2."""

    name = "torchao"
    ELEM = {"e2m1": "float4_e2m1fn_x2", "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}

    def __init__(self):
        import torchao  # noqa: F401 - fail early when absent
        from torchao.prototype.mx_formats import mx_tensor
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        self.mx, self.modes = mx_tensor, ScaleCalculationMode

    def info(self):
        import torch
        return {**super().info(), "torchao": version("torchao"), "torch": torch.__version__,
                "device": "cpu"}

    def supports(self, op, fmt, **options):
        if op not in ("quantize", "dequantize"):
            return f"the adapter covers torchao's MX quantize/dequantize, not {op}"
        if fmt not in self.ELEM:
            return f"torchao's to_mx takes {tuple(self.ELEM)} here, not {fmt}"
        return True

    def quantize(self, x, fmt, axis=-1, block_size=32, scale_rule="floor", rounding="rne", seed=0):
        import torch
        if rounding != "rne":
            raise NotImplementedError("torchao's to_mx rounds to nearest even only")
        moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))
        flat = torch.from_numpy(moved.reshape(-1, moved.shape[-1]))
        scale, data = self.mx.to_mx(flat, getattr(torch, self.ELEM[fmt]), block_size,
                                    getattr(self.modes, scale_rule.upper()))
        codes = data.view(torch.uint8).numpy()
        if fmt == "e2m1":
            codes = emulator.unpack(codes, fmt)
        codes = np.moveaxis(codes.reshape(moved.shape), -1, axis)
        scales = scale.view(torch.uint8).numpy().reshape(*moved.shape[:-1], -1)
        return codes, np.moveaxis(scales, -1, axis)

    def dequantize(self, codes, scales, fmt, axis=-1, block_size=32):
        import torch
        moved = np.ascontiguousarray(np.moveaxis(codes, axis, -1))
        data = emulator.pack(moved, fmt) if fmt == "e2m1" else moved
        dt = getattr(torch, self.ELEM[fmt])
        d = torch.from_numpy(data.reshape(-1, data.shape[-1])).view(dt)
        sc = torch.from_numpy(np.ascontiguousarray(np.moveaxis(scales, axis, -1)).reshape(-1))
        out = self.mx.to_dtype(d, sc.view(torch.float8_e8m0fnu), dt, block_size, torch.float32)
        return np.moveaxis(out.numpy().reshape(moved.shape), -1, axis)


class GfloatBackend(Backend):
    """gfloat (graphcore-research), run as documented: ``round_float``/``encode_float`` with
    saturation for elements; per block ``compute_scale_amax`` (a float log2 of the amax) and
    ``encode_block``. Scalar Python code: slow, exact."""

    name = "gfloat"
    BLOCK = {"e2m1": "format_info_mxfp4_e2m1", "e2m3": "format_info_mxfp6_e2m3",
             "e3m2": "format_info_mxfp6_e3m2", "e4m3": "format_info_mxfp8_e4m3",
             "e5m2": "format_info_mxfp8_e5m2", "int8": "format_info_mxint8"}

    def __init__(self):
        import gfloat
        import gfloat.formats
        self.g, self.f = gfloat, gfloat.formats

    def info(self):
        return {**super().info(), "gfloat": version("gfloat"), "device": "cpu"}

    def supports(self, op, fmt, **options):
        if op not in ("cast", "quantize"):
            return f"the adapter covers gfloat's element and block encoding, not {op}"
        if fmt not in self.BLOCK and fmt != "e8m0":
            return f"gfloat has no {fmt} block format"
        if op == "quantize" and fmt == "e8m0":
            return "e8m0 is the scale format"
        return True

    def cast(self, x, fmt):
        g = self.g
        fi = self.f.format_info_ocp_e8m0 if fmt == "e8m0" else getattr(self.f, self.BLOCK[fmt]).etype
        enc = [g.encode_float(fi, g.round_float(fi, float(v), sat=True)) for v in np.ravel(x)]
        return (np.array(enc, dtype=np.int64) & 0xFF).astype(np.uint8).reshape(np.shape(x))

    def quantize(self, x, fmt, axis=-1, block_size=32, scale_rule="floor", rounding="rne", seed=0):
        if scale_rule != "floor" or rounding != "rne" or block_size != 32:
            raise NotImplementedError("gfloat's documented block path: floor scale, RNE, k=32")
        g, fi = self.g, getattr(self.f, self.BLOCK[fmt])
        moved = np.ascontiguousarray(np.moveaxis(x, axis, -1)).astype(np.float64)
        blocks = moved.reshape(-1, 32)
        codes, scales = np.empty(blocks.shape, np.uint8), np.empty(len(blocks), np.uint8)
        for i, vals in enumerate(blocks):
            scale = g.compute_scale_amax(fi.etype.emax, vals)
            enc = list(g.encode_block(fi, scale, vals / scale))
            scales[i] = enc[0] & 0xFF
            codes[i] = np.array(enc[1:], dtype=np.int64) & 0xFF
        codes = np.moveaxis(codes.reshape(moved.shape), -1, axis)
        scales = np.moveaxis(scales.reshape(*moved.shape[:-1], -1), -1, axis)
        return codes, scales


def _ml_types():
    import ml_dtypes
    return {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
            "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn,
            "e2m1": ml_dtypes.float4_e2m1fn, "e8m0": ml_dtypes.float8_e8m0fnu}


def _nvidia_driver() -> str:
    try:
        import subprocess
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


class TritonFp8ExactBackend(TritonBackend):
    """The Triton backend with GEMMs through ``native.mx_matmul(method="fp8_exact")``: FP4/FP6
    operands folded into E4M3, an FP8 GEMM promoting every K = 32 (``emulator.fold``)."""
    name = "triton_fp8_exact"
    gemm_method = "fp8_exact"


class TritonFp8Backend(TritonBackend):
    """The Triton backend with GEMMs through ``native.mx_matmul(method="fp8")``: folded in
    groups of 32 blocks, each group's dots chained in the tensor core."""
    name = "triton_fp8"
    gemm_method = "fp8"


class TritonFp8CublasBackend(TritonBackend):
    """The Triton backend with GEMMs through ``native.mx_matmul(method="fp8_cublas")``: folded
    in groups of 4 blocks (one exponent per 1 x 128), summed by cuBLAS's blockwise FP8 GEMM
    (``torch._scaled_mm``), whose accumulation is not documented: the fold probe infers it.
    cuBLAS takes M and N in multiples of 16 and K in multiples of 128: the backend pads the
    operands with zero blocks (scale 1, codes 0: they add nothing to any sum) and returns the
    M x N corner."""
    name = "triton_fp8_cublas"
    gemm_method = "fp8_cublas"

    def supports(self, op, fmt, **options):
        if op == "gemm" and not self.device.startswith("cuda"):
            return (f"method {self.gemm_method!r} is torch._scaled_mm's FP8 GEMM: a CUDA GPU "
                    "only")
        return super().supports(op, fmt, **options)

    def gemm(self, a_codes, a_scales, b_codes, b_scales, fmt_a, fmt_b):
        def pad(codes, scales, rows):
            (r, k), kp = codes.shape, -(-codes.shape[1] // 128) * 128
            c = np.zeros((rows, kp), codes.dtype)
            s = np.full((rows, kp // BLOCK_SIZE), 127, np.uint8)
            c[:r, :k], s[:r, :k // BLOCK_SIZE] = codes, scales
            return c, s
        m, n = a_codes.shape[0], b_codes.shape[0]
        a = pad(a_codes, a_scales, -(-m // 16) * 16)
        b = pad(b_codes, b_scales, -(-n // 16) * 16)
        return super().gemm(*a, *b, fmt_a, fmt_b)[:m, :n]


class TritonFp8CublasRowwiseBackend(TritonFp8CublasBackend):
    """The Triton backend with GEMMs through ``native.mx_matmul(method="fp8_cublas_rowwise")``:
    whole rows folded, summed by cuBLAS's rowwise-scaled FP8 GEMM; padded as the blockwise
    backend is (zero blocks add nothing and leave every row's exponent as it is)."""
    name = "triton_fp8_cublas_rowwise"
    gemm_method = "fp8_cublas_rowwise"


BUILTIN = {"emulator": EmulatorBackend, "triton": TritonBackend,
           "triton_fp8_exact": TritonFp8ExactBackend, "triton_fp8": TritonFp8Backend,
           "triton_fp8_cublas": TritonFp8CublasBackend,
           "triton_fp8_cublas_rowwise": TritonFp8CublasRowwiseBackend,
           "triton_gfx950": TritonGfx950Backend, "torch": TorchBackend,
           "ml_dtypes": MlDtypesBackend, "torchao": TorchaoBackend, "gfloat": GfloatBackend}
# Peers: built in, usable when their package is installed.
PEERS = {"torchao": "torchao", "gfloat": "gfloat"}


def load_backend(spec: str, **kwargs) -> Backend:
    """A backend by name (built in or entry point ``ocpmx.backends``), or ``file.py:Class`` /
    ``module:Class``."""
    if spec in PEERS and importlib.util.find_spec(PEERS[spec]) is None:
        raise LookupError(f"peer backend {spec!r}: the package {PEERS[spec]!r} is not installed "
                          f"(pip install {PEERS[spec]})")
    if spec in BUILTIN:
        return BUILTIN[spec](**kwargs)
    for ep in entry_points(group="ocpmx.backends"):
        if ep.name == spec:
            return ep.load()(**kwargs)
    if ":" in spec:
        where, cls = spec.rsplit(":", 1)
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise LookupError(f"backend file {where} does not exist")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        if not hasattr(module, cls):
            raise LookupError(f"{where} has no class {cls}")
        return getattr(module, cls)(**kwargs)
    known = sorted(BUILTIN) + sorted(ep.name for ep in entry_points(group="ocpmx.backends"))
    raise LookupError(f"unknown backend {spec!r}; known: {', '.join(known)}, or file.py:Class")
