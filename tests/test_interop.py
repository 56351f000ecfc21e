"""Interop (issue 22): torch dtypes and aliases as formats, torch dtype views of native MX tensors,
ml_dtypes-typed emulator codes, torchao's MXTensor both ways, and a torchao-style quantize_.

Comparisons are of bytes (codes, scale codes) and of float bits (``.view(int32)``), never values
within a tolerance. NaN: where two libraries write different NaN bits the test says so and
compares the NaN positions, and checks the documented difference itself."""
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from ocpmx import emulator, native
from ocpmx.spec import FORMATS, get_format

try:
    import torchao  # noqa: F401
    from torchao.prototype.mx_formats.mx_tensor import MXTensor as AOMXTensor
    HAVE_TORCHAO = True
except ImportError:  # pragma: no cover - the dev extra installs torchao
    HAVE_TORCHAO = False
needs_torchao = pytest.mark.skipif(not HAVE_TORCHAO, reason="torchao is not importable")

TORCHAO_FORMATS = ("e2m1", "e4m3", "e5m2", "e2m3", "e3m2")
ML = {"e2m1": ml_dtypes.float4_e2m1fn, "e2m3": ml_dtypes.float6_e2m3fn,
      "e3m2": ml_dtypes.float6_e3m2fn, "e4m3": ml_dtypes.float8_e4m3fn,
      "e5m2": ml_dtypes.float8_e5m2, "int8": np.int8}


def bits(t):
    """float32 bits of a torch tensor or NumPy array, as a NumPy int32 array."""
    a = t.detach().float().numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float32)
    return np.ascontiguousarray(a).view(np.int32)


def assert_same_bits(got, want, nan_bits_may_differ=False):
    g, w = bits(got), bits(want)
    assert g.shape == w.shape
    if nan_bits_may_differ:
        gn, wn = np.isnan(g.view(np.float32)), np.isnan(w.view(np.float32))
        assert np.array_equal(gn, wn)
        g, w = g[~gn], w[~wn]
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, f"{bad.size} differ, first at {bad[0]}: {g.flat[bad[0]]:#010x} " \
                          f"!= {w.flat[bad[0]]:#010x}"


def every_code_array(fmt, axis=-1):
    """An MXArray holding every code of ``fmt`` under every scale code: row r has scale codes
    (r + block) % 256, each block cycles through all codes."""
    f = get_format(fmt)
    k = max(f.num_codes, 32)
    codes = np.tile((np.arange(k) % f.num_codes).astype(np.uint8), (256, 1))
    nb = k // 32
    scales = ((np.arange(256)[:, None] + np.arange(nb)[None, :]) % 256).astype(np.uint8)
    mx = emulator.MXArray(codes, scales, f, 1)
    if axis in (0, -2):
        mx = emulator.MXArray(codes.T.copy(), scales.T.copy(), f, 0)
    return mx


def native_from_emulator(mx):
    """The native MXTensor of an emulator MXArray (K-major data, FP4 packed)."""
    codes = np.ascontiguousarray(np.moveaxis(mx.codes, mx.axis, -1))
    if native.tensor.pack_factor(mx.fmt) == 2:
        codes = emulator.pack(codes, mx.fmt)
    scales = np.ascontiguousarray(np.moveaxis(mx.scales, mx.axis, -1))
    return native.MXTensor(torch.from_numpy(codes), torch.from_numpy(scales), mx.fmt, mx.axis,
                           tuple(mx.codes.shape), mx.block_size)


def sample(shape=(64, 96), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 4
    x.view(-1)[::37] = 0.0
    x.view(-1)[5::41] *= 1e4  # outliers: saturation and small scales in one tensor
    return x


# ---- 4. formats: torch dtypes, ml_dtypes types, aliases -----------------------------------------
@pytest.mark.parametrize("obj,name", [
    (torch.float4_e2m1fn_x2, "e2m1"), (torch.float8_e4m3fn, "e4m3"), (torch.float8_e5m2, "e5m2"),
    (ml_dtypes.float4_e2m1fn, "e2m1"), (ml_dtypes.float6_e2m3fn, "e2m3"),
    (ml_dtypes.float6_e3m2fn, "e3m2"), (ml_dtypes.float8_e4m3fn, "e4m3"),
    (ml_dtypes.float8_e5m2, "e5m2"), (np.dtype(ml_dtypes.float4_e2m1fn), "e2m1"),
    (np.dtype(ml_dtypes.float8_e5m2), "e5m2"),
    ("mxfp4", "e2m1"), ("fp4", "e2m1"), ("MXFP4", "e2m1"), ("mxfp6_e2m3", "e2m3"),
    ("mxfp6_e3m2", "e3m2"), ("mxfp8_e4m3", "e4m3"), ("mxfp8_e5m2", "e5m2"), ("mxint8", "int8"),
    ("fp6_e2m3", "e2m3"), ("fp6_e3m2", "e3m2"),  # torchao's FP6 element names
    ("float8_e4m3fn", "e4m3"), ("torch.float4_e2m1fn_x2", "e2m1"), ("float6_e3m2fn", "e3m2"),
])
def test_get_format_accepts_dtypes_and_aliases(obj, name):
    assert get_format(obj) is FORMATS[name]


@pytest.mark.parametrize("obj,err,match", [
    (torch.float8_e4m3fnuz, ValueError, "FNUZ E4M3.*not an MX element format"),
    (torch.float8_e5m2fnuz, ValueError, "FNUZ E5M2"),
    (ml_dtypes.float8_e4m3fnuz, ValueError, "FNUZ E4M3"),
    (ml_dtypes.float8_e4m3, ValueError, "IEEE-style E4M3"),
    (torch.float8_e8m0fnu, ValueError, "scale format"),
    (ml_dtypes.float8_e8m0fnu, ValueError, "scale format"),
    (torch.int8, ValueError, "pass 'int8'"),
    (torch.bfloat16, ValueError, "torch dtype torch.bfloat16 holds no MX"),
    (np.dtype(np.float32), ValueError, "numpy dtype"),
    ("mxfp8", ValueError, "two element formats"),
    ("e9m9", ValueError, "unknown MX element format 'e9m9'"),
    (3, TypeError, "got 3 of type builtins.int"),
    (int, TypeError, "got <class 'int'>"),
    (object, TypeError, "torch dtype"),
])
def test_get_format_refuses_clearly(obj, err, match):
    with pytest.raises(err, match=match):
        get_format(obj)


def test_get_format_imports_neither_torch_nor_ml_dtypes():
    code = ("import sys; from ocpmx.spec import get_format; get_format('mxfp4'); "
            "get_format('torch.float8_e4m3fn'); "
            "print(sorted(m for m in ('torch', 'ml_dtypes') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_dtypes_accepted_as_formats_by_the_api():
    x = sample((8, 64))
    ref = native.quantize(x, "e2m1")
    for fmt in (torch.float4_e2m1fn_x2, ml_dtypes.float4_e2m1fn, "mxfp4", "fp4"):
        q = native.quantize(x, fmt)
        assert q.fmt is FORMATS["e2m1"] and torch.equal(q.data, ref.data)
    e = emulator.quantize(x.numpy(), "e2m3")
    e2 = emulator.quantize(x.numpy(), ml_dtypes.float6_e2m3fn)
    assert np.array_equal(e.codes, e2.codes) and np.array_equal(e.scales, e2.scales)
    assert torch.equal(native.cast(x, torch.float8_e5m2), native.cast(x, "mxfp8_e5m2"))


# ---- 2. torch dtype views ---------------------------------------------------------------------
@pytest.mark.parametrize("fmt,dtype", [("e2m1", torch.float4_e2m1fn_x2),
                                       ("e4m3", torch.float8_e4m3fn),
                                       ("e5m2", torch.float8_e5m2), ("int8", torch.int8)])
def test_torch_dtype_views_share_the_bytes(fmt, dtype):
    q = native.quantize(sample(), fmt, axis=0)
    d, s = q.data_as_torch_dtype(), q.scales_as_torch_dtype()
    assert d.dtype == dtype and s.dtype == torch.float8_e8m0fnu
    assert d.data_ptr() == q.data.data_ptr() and s.data_ptr() == q.scales_kmajor.data_ptr()
    assert d.shape == q.data.shape and s.shape == q.scales_kmajor.shape
    assert torch.equal(d.view(torch.uint8), q.data)
    assert torch.equal(s.view(torch.uint8), q.scales_kmajor)
    # and back, sharing storage again
    b = native.MXTensor.from_torch_dtypes(d, s, axis=q.axis, fmt="int8" if fmt == "int8" else None)
    assert b.fmt is q.fmt and b.axis == q.axis and b.shape == q.shape
    assert b.data.data_ptr() == q.data.data_ptr() and torch.equal(b.data, q.data)
    assert torch.equal(b.scales_kmajor, q.scales_kmajor)


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_torch_float8_conversion_equals_our_decode(fmt):
    """torch's own float8 -> float32 of the view equals our decode on all 256 codes; NaN bits
    differ (torch keeps the code's sign, we write +qNaN), NaN positions agree."""
    f = get_format(fmt)
    codes = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    q = native.MXTensor(codes, torch.full((8, 1), 127, dtype=torch.uint8), f, 1, (8, 32))
    ours = emulator.decode_table(f)[:256]
    got = q.data_as_torch_dtype().float().reshape(-1)
    assert_same_bits(got, ours, nan_bits_may_differ=True)
    assert_same_bits(got, q.dequantize().reshape(-1), nan_bits_may_differ=True)
    neg_nan = got[f.nan_codes[-1]]  # the documented difference: 0xFF -> -NaN in torch
    assert torch.isnan(neg_nan) and torch.signbit(neg_nan)


def test_torch_e8m0_conversion_equals_our_decode():
    s = torch.arange(256, dtype=torch.uint8)
    got = s.view(torch.float8_e8m0fnu).float()
    with np.errstate(over="ignore"):
        ours = emulator.decode_scale(s.numpy())
    assert_same_bits(got[:255], ours[:255])  # 2^-127 (a float32 subnormal) to 2^127
    assert torch.isnan(got[255]) and np.isnan(ours[255])  # NaN bits differ: 0x7F800001 in torch


def test_torch_dtype_limits_reported():
    q = native.quantize(sample((4, 64)), "e2m1")
    with pytest.raises((NotImplementedError, RuntimeError)):  # torch 2.13: a storage-only dtype
        q.data_as_torch_dtype().float()  # when this starts working, update native/interop.py
    for fmt in ("e2m3", "e3m2"):
        with pytest.raises(TypeError, match="torch has no dtype for .* \\(FP6\\)"):
            native.quantize(sample((4, 64)), fmt).data_as_torch_dtype()
    with pytest.raises(TypeError, match="pass fmt="):
        native.from_torch_dtypes(q.data, q.scales_kmajor)
    with pytest.raises(ValueError, match="disagrees"):
        native.from_torch_dtypes(q.data_as_torch_dtype(), q.scales_kmajor, fmt="e4m3")
    with pytest.raises(ValueError, match="do not match"):
        native.from_torch_dtypes(q.data_as_torch_dtype(), q.scales_kmajor[:, :1])


# ---- 3. ml_dtypes-typed emulator codes -----------------------------------------------------------
@pytest.mark.parametrize("fmt", list(ML))
def test_ml_dtypes_views_share_the_bytes(fmt):
    mx = emulator.quantize(sample().numpy(), fmt, axis=0)
    c, s = emulator.codes_as_ml_dtypes(mx), emulator.scales_as_ml_dtypes(mx)
    assert c.dtype == np.dtype(ML[fmt]) and s.dtype == np.dtype(ml_dtypes.float8_e8m0fnu)
    assert np.shares_memory(c, mx.codes) and np.shares_memory(s, mx.scales)
    assert np.array_equal(c.view(np.uint8), mx.codes)
    back = emulator.from_ml_dtypes(c, s, axis=mx.axis)
    assert back.fmt is mx.fmt and back.axis == mx.axis
    assert np.array_equal(back.codes, mx.codes) and np.array_equal(back.scales, mx.scales)


@pytest.mark.parametrize("fmt", list(ML))
def test_ml_dtypes_values_times_scale_equal_dequantize(fmt):
    """Every code under every scale: ml_dtypes' decode x E8M0 decode == our dequantize bit for
    bit. FP4/FP6 agree everywhere; FP8's NaN codes keep their sign in ml_dtypes (checked), a
    NaN scale gives NaN in both (bits may differ there, positions agree)."""
    mx = every_code_array(fmt)
    f = mx.fmt
    vals = emulator.codes_as_ml_dtypes(mx).astype(np.float32)
    if fmt == "int8":
        vals = vals * np.float32(2.0 ** -f.mbits)  # MXINT8: int8 x 2^-6
    scale = np.repeat(emulator.scales_as_ml_dtypes(mx).astype(np.float32), 32, axis=1)
    with np.errstate(over="ignore"):  # code x 2^127 overflows to Inf, as dequantize does
        got = vals * scale
    ours = emulator.dequantize(mx)
    assert_same_bits(got, ours, nan_bits_may_differ=True)
    finite_scale = np.repeat(mx.scales != 0xFF, 32, axis=1)
    if not f.nan_codes:  # no NaN codes: identical bits wherever the scale is not NaN
        assert_same_bits(got[finite_scale], ours[finite_scale])
    else:  # the documented difference: ml_dtypes' NaN from a negative NaN code is negative
        neg = finite_scale & (mx.codes == f.nan_codes[-1])
        assert np.all(np.signbit(got[neg])) and not np.any(np.signbit(ours[neg]))


def test_ml_dtypes_fp4_fp6_layout_and_upper_bits():
    """One code per byte in the low bits, sign in the format's top bit. Bytes with bits above
    the code: ml_dtypes reads the magnitude below the sign bit and a negative sign from any bit
    at or above it; from_ml_dtypes gives the code of that value."""
    for fmt in ("e2m1", "e2m3", "e3m2"):
        f = get_format(fmt)
        codes = np.arange(f.num_codes, dtype=np.uint8)
        typed = codes.view(ML[fmt])
        assert_same_bits(typed.astype(np.float32), emulator.decode_table(f)[:f.num_codes])
        assert np.all(np.signbit(typed.astype(np.float32)) == (codes >= f.sign_bit))
        dirty = np.arange(256, dtype=np.uint8)[None]  # every byte, clean and not
        mx = emulator.from_ml_dtypes(dirty.view(ML[fmt]), np.full((1, 8), 127, np.uint8))
        assert mx.codes.max() < f.num_codes
        assert_same_bits(emulator.dequantize(mx), dirty.view(ML[fmt]).astype(np.float32))
        src = np.tile(typed, 64 // f.num_codes)[None]
        clean = emulator.from_ml_dtypes(src, np.full((1, 2), 127, np.uint8))
        assert np.shares_memory(clean.codes, src)  # clean codes: a view, no copy


def test_ml_dtypes_from_astype_and_errors():
    x = np.linspace(-6, 6, 64, dtype=np.float32).reshape(2, 32)
    typed = x.astype(ml_dtypes.float4_e2m1fn)  # ml_dtypes' own cast (RNE, in range here)
    ones = np.full((2, 1), 127, np.uint8).view(ml_dtypes.float8_e8m0fnu)
    mx = emulator.from_ml_dtypes(typed, ones)
    assert_same_bits(emulator.dequantize(mx), typed.astype(np.float32))
    assert np.array_equal(mx.codes, emulator.cast(x, "e2m1"))
    with pytest.raises(TypeError, match="pass fmt="):
        emulator.from_ml_dtypes(mx.codes, mx.scales)
    with pytest.raises(ValueError, match="do not match"):
        emulator.from_ml_dtypes(typed, np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError, match="IEEE-style"):
        emulator.from_ml_dtypes(x.astype(ml_dtypes.float8_e4m3), mx.scales)


# ---- 1. torchao's MXTensor ---------------------------------------------------------------------
@needs_torchao
@pytest.mark.parametrize("fmt", TORCHAO_FORMATS)
@pytest.mark.parametrize("axis", [-1, 0])
def test_torchao_round_trip_bit_for_bit(fmt, axis):
    q = native.quantize(sample(), fmt, axis=axis, scale_rule="even")
    t = q.to_torchao()
    assert isinstance(t, AOMXTensor) and tuple(t.shape) == q.shape and t.block_size == 32
    assert t.dtype == torch.float32 and t.scale.dtype == torch.float8_e8m0fnu
    assert t.qdata.dtype == {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}.get(
        fmt, torch.uint8)
    assert t.qdata.untyped_storage().data_ptr() == q.data.data_ptr()  # no copy
    back = native.MXTensor.from_torchao(t)
    assert back.fmt is q.fmt and back.axis == q.axis and back.shape == q.shape
    assert torch.equal(back.data, q.data) and torch.equal(back.scales_kmajor, q.scales_kmajor)
    assert back.data.data_ptr() == q.data.data_ptr()


@needs_torchao
@pytest.mark.parametrize("fmt", TORCHAO_FORMATS)
@pytest.mark.parametrize("axis", [-1, 0])
def test_torchao_dequantize_equals_ours_every_code(fmt, axis):
    """torchao's own dequantize of to_torchao() == our dequantize, bit for bit, on every code
    under every scale code (NaN scales included), both layouts."""
    q = native_from_emulator(every_code_array(fmt, axis))
    t = q.to_torchao()
    # NaN (a NaN scale, FP8 NaN codes) comes out with other NaN bits in torchao (its NaN times
    # the element, e.g. 0x7FF00000, 0xFFFF0000); every other element is bit-identical
    assert_same_bits(t.dequantize(torch.float32), q.dequantize(), nan_bits_may_differ=True)
    assert_same_bits(t.dequantize(torch.bfloat16), q.dequantize(torch.bfloat16),
                     nan_bits_may_differ=True)
    finite = ~torch.isnan(q.dequantize())
    assert finite.sum() > finite.numel() // 2  # the comparison above is mostly not NaN


@needs_torchao
@pytest.mark.parametrize("fmt,elem", [("e2m1", torch.float4_e2m1fn_x2),
                                      ("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2),
                                      ("e2m3", "fp6_e2m3"), ("e3m2", "fp6_e3m2")])
def test_torchao_quantized_tensors_import(fmt, elem):
    """torchao's to_mx output (its FLOOR and EVEN rules), imported, equals our quantize."""
    x = sample((32, 128))
    for rule in ("floor", "even"):
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        t = AOMXTensor.to_mx(x, elem, 32, getattr(ScaleCalculationMode, rule.upper()))
        got, want = native.MXTensor.from_torchao(t), native.quantize(x, fmt, scale_rule=rule)
        assert torch.equal(got.data, want.data) and torch.equal(got.scales_kmajor,
                                                                want.scales_kmajor)
        tt = native.MXTensor.from_torchao(t.t())  # torchao's transposed view: blocks on dim 0
        want = native.quantize(x.t().contiguous(), fmt, axis=0, scale_rule=rule)
        assert tt.axis == 0 and tt.shape == want.shape and torch.equal(tt.data, want.data)
        assert torch.equal(tt.scales_kmajor, want.scales_kmajor)


@needs_torchao
@pytest.mark.parametrize("elem", [torch.float4_e2m1fn_x2, torch.float8_e4m3fn])
def test_torchao_swizzled_scales_import(elem):
    x = sample((256, 160))
    plain = native.MXTensor.from_torchao(AOMXTensor.to_mx(x, elem, 32))
    for t in (AOMXTensor.to_mx(x, elem, 32, is_swizzled_scales=True),):
        for view in (t, t.t()):
            got = native.MXTensor.from_torchao(view)
            assert_same_bits(got.dequantize(), view.dequantize(torch.float32))
        got = native.MXTensor.from_torchao(t)
        assert torch.equal(got.scales_kmajor, plain.scales_kmajor)
        assert torch.equal(got.data, plain.data)


@needs_torchao
def test_torchao_limits_reported():
    with pytest.raises(ValueError, match="no int8 element"):
        native.quantize(sample((4, 64)), "int8").to_torchao()
    q3 = native.quantize(sample((2, 64, 32)), "e4m3", axis=1)
    with pytest.raises(ValueError, match="blocked along axis 1.*kmajor=True"):
        q3.to_torchao()
    t = q3.to_torchao(kmajor=True)  # the K-major layout itself: shape (2, 32, 64)
    assert tuple(t.shape) == (2, 32, 64)
    assert_same_bits(t.dequantize(torch.float32), q3.dequantize().movedim(1, -1))
    qr = native.quantize(sample((4, 64)), "e2m1", rotation="hadamard16")
    with pytest.raises(ValueError, match="rotated.*drop_rotation=True"):
        qr.to_torchao()
    back = native.MXTensor.from_torchao(qr.to_torchao(drop_rotation=True),
                                        rotation="hadamard16")
    assert back.rotation == qr.rotation and torch.equal(back.data, qr.data)
    with pytest.raises(ValueError, match="kmajor=True"):
        native.quantize(sample((64, 1)), "e2m1", axis=0).to_torchao()
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        native.quantize(sample((4, 64)), "e2m1").to_torchao(torch.float16)
    with pytest.raises(TypeError, match="takes torchao"):
        native.MXTensor.from_torchao(torch.zeros(4, 32))


def test_missing_torchao_gives_a_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchao.prototype.mx_formats", None)
    q = native.quantize(sample((4, 64)), "e2m1")
    with pytest.raises(ImportError, match="needs torchao"):
        q.to_torchao()
    with pytest.raises(ImportError, match="needs torchao"):
        native.MXTensor.from_torchao(object())


# ---- 5. quantize_ with MXRecipeConfig ------------------------------------------------------------
class Net(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.a = nn.Linear(64, 64)
        self.blk = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
        self.output = nn.Linear(64, 32)

    def forward(self, x):
        return self.output(self.blk(self.a(x)))


def run(model, step=3):
    """Outputs and every parameter gradient, one forward + backward at ``step``."""
    native.set_step(model, step)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y = model(x)
    y.square().sum().backward()
    return [y.detach(), x.grad] + [p.grad for p in model.parameters()]


def layer_ids(model):
    return {n: m.layer_id for n, m in model.named_modules() if isinstance(m, native.MXLinear)}


SR = "mxfp4_all_sr_wgrad"  # stochastic rounding in Wgrad: the bits depend on the layer id
EMU = dict(backend="emulator")  # the Triton interpreter (TRITON_INTERPRET=1) is slower here


def same_run(a, b):
    return all(torch.equal(u.view(torch.int32), v.view(torch.int32)) for u, v in zip(a, b))


@needs_torchao
def test_torchao_quantize_equals_convert_linears():
    from torchao.quantization import quantize_
    ref = native.convert_linears(Net(), SR, rules=[("output", None)], **EMU)
    m = Net()
    w = m.a.weight
    quantize_(m, native.MXRecipeConfig(SR, **EMU), filter_fn=lambda mod, fqn: isinstance(
        mod, nn.Linear) and fqn != "output")
    assert m.a.weight is w and type(m.output) is nn.Linear  # same Parameters, head left alone
    assert m.a.context.backend == "emulator" and m.blk[2].recipe.name == SR
    assert layer_ids(m) == layer_ids(ref) == {"a": 0, "blk.0": 1, "blk.2": 2}
    assert same_run(run(m), run(ref))
    # the check has teeth: other layer ids give other bits
    shifted = native.convert_linears(Net(), SR, rules=[("a", None), ("output", None)], **EMU)
    shifted.a = native.MXLinear.from_linear(shifted.a, SR, layer_id=7, **EMU)
    assert not same_run(run(shifted), run(ref))


@needs_torchao
def test_layer_ids_when_the_filter_skips_a_middle_layer():
    """Unbound config under torchao: ids count converted layers only (documented difference);
    a bound config and ocpmx.native.quantize_ give convert_linears' ids and bits."""
    from torchao.quantization import quantize_
    ref = native.convert_linears(Net(), SR, rules=[("blk.0", None)], **EMU)
    keep = lambda mod, fqn: isinstance(mod, nn.Linear) and fqn != "blk.0"  # noqa: E731
    unbound = Net()
    quantize_(unbound, native.MXRecipeConfig(SR, **EMU), filter_fn=keep)
    assert layer_ids(unbound) == {"a": 0, "blk.2": 1, "output": 2}
    assert layer_ids(ref) == {"a": 0, "blk.2": 2, "output": 3}
    bound = Net()
    quantize_(bound, native.MXRecipeConfig(SR, **EMU).bind(bound), filter_fn=keep)
    ours = native.quantize_(Net(), native.MXRecipeConfig(SR, **EMU),
                            filter_fn=lambda m, fqn: fqn != "blk.0")  # no Linear check needed
    assert layer_ids(bound) == layer_ids(ours) == layer_ids(ref)
    r = run(ref)
    assert same_run(run(bound), r) and same_run(run(ours), r)
    assert not same_run(run(unbound), r)


@needs_torchao
def test_torchao_config_registration_and_errors():
    from torchao.core.config import AOBaseConfig
    from torchao.quantization import quantize_
    from torchao.quantization.transform_module import _QUANTIZE_CONFIG_HANDLER
    cfg = native.MXRecipeConfig("mxfp4_all_h16", seed=3)
    assert isinstance(cfg, AOBaseConfig) and native.MXRecipeConfig in _QUANTIZE_CONFIG_HANDLER
    m = Net()
    with pytest.raises(TypeError, match="isinstance\\(m, nn.Linear\\)"):  # the model itself
        quantize_(m, cfg, filter_fn=lambda mod, fqn: fqn != "output")
    quantize_(m, cfg)  # torchao's default filter: every Linear
    assert {type(c) for c in (m.a, m.blk[0], m.blk[2], m.output)} == {native.MXLinear}
    assert m.a.context.seed == 3 and m.a.recipe.name == "mxfp4_all_h16"
    with pytest.raises(ValueError, match="unknown recipe"):
        native.MXRecipeConfig("nope")
    with pytest.raises(ValueError, match="not a Linear layer of the model"):
        native.MXRecipeConfig(SR, **EMU).bind(Net()).layer_id(nn.Linear(32, 32))


def test_native_quantize_without_filter_matches_convert_linears():
    ref = native.convert_linears(Net(), SR, **EMU)
    m = native.quantize_(Net(), native.MXRecipeConfig(SR, **EMU))
    assert layer_ids(m) == layer_ids(ref) == {"a": 0, "blk.0": 1, "blk.2": 2, "output": 3}
    with pytest.raises(TypeError, match="takes an MXRecipeConfig"):
        native.quantize_(Net(), "mxfp4_all")


# ---- 6. the name -------------------------------------------------------------------------------
@needs_torchao
def test_native_mxtensor_is_a_container_torchaos_is_a_tensor():
    q = native.quantize(sample((4, 64)), "e4m3")
    assert not isinstance(q, torch.Tensor) and isinstance(q.to_torchao(), torch.Tensor)
    assert native.MXTensor.__module__ == "ocpmx.native.tensor"
