"""`ocpmx quantize` end to end, and the installed package layout."""
import argparse
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ocpmx.cli import main
from ocpmx.emulator import dequantize, quantize, unpack

ROOT = Path(__file__).resolve().parents[1]


def test_quantize_npy(tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "x.mx.safetensors"
    assert main(["quantize", str(tmp_path / "x.npy"), "--format", "e2m1", "--rotation", "hadamard16",
                 "-o", str(out), "--json", "--plain-u8"]) == 0  # the layout of earlier versions
    stats = json.loads(capsys.readouterr().out)
    t = load_file(str(out))
    ref = quantize(x, "e2m1", rotation="hadamard16")
    assert np.array_equal(unpack(t["x.codes"], "e2m1"), ref.codes)
    assert np.array_equal(t["x.scales"], ref.scales)
    assert 0.05 < stats["relative_error"] < 0.3
    assert sum(stats["scale_histogram"].values()) == 64 * 4
    assert 0 <= stats["saturated_fraction"] < 0.1 and 0 < stats["zero_flushed_fraction"] < 0.3


def test_quantize_safetensors_bf16_and_axis(tmp_path, capsys):
    x = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    xb = x.astype(ml_dtypes.bfloat16)
    # write a BF16 safetensors file by hand (numpy has no bf16 dtype for safetensors.numpy)
    path = tmp_path / "w.safetensors"
    header = json.dumps({"w": {"dtype": "BF16", "shape": list(x.shape),
                               "data_offsets": [0, x.size * 2]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + xb.view(np.uint16).tobytes())
    assert main(["quantize", str(path), "--axis", "0", "--format", "e4m3", "--scale-rule", "even",
                 "--plain-u8"]) == 0
    text = capsys.readouterr().out
    assert "relative error" in text and "scale histogram" in text
    t = load_file(str(tmp_path / "w.e4m3.safetensors"))
    ref = quantize(xb, "e4m3", axis=0, scale_rule="even")
    assert np.array_equal(t["w.codes"], ref.codes) and np.array_equal(t["w.scales"], ref.scales)


def test_quantize_errors(tmp_path, capsys):
    np.save(tmp_path / "bad.npy", np.zeros((3, 30), np.float32))
    assert main(["quantize", str(tmp_path / "bad.npy")]) == 2
    assert "not divisible by the block size 32" in capsys.readouterr().err
    save_file({"a": np.zeros(32, np.float32), "b": np.zeros(32, np.float32)}, str(tmp_path / "two.safetensors"))
    assert main(["quantize", str(tmp_path / "two.safetensors")]) == 2
    assert "choose one with --key" in capsys.readouterr().err
    np.save(tmp_path / "i.npy", np.zeros(32, np.int32))
    assert main(["quantize", str(tmp_path / "i.npy")]) == 2
    assert "expected float32, float64, float16 or bfloat16" in capsys.readouterr().err


FORMATS = ["e2m1", "e4m3", "e5m2", "e3m2", "e2m3", "int8"]
NATIVE = {"e2m1": "F4", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "e3m2": "U8", "e2m3": "U8",
          "int8": "I8"}


def _header(path):
    data = Path(path).read_bytes()
    return json.loads(data[8:8 + int.from_bytes(data[:8], "little")])


def _heavy_tailed(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(2 * rng.standard_normal(shape))
    x.flat[::37] = 0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("plain", [False, True], ids=["native", "plain_u8"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_dequantize_round_trip_bit_exact(tmp_path, capsys, fmt, plain):
    """quantize -> file -> dequantize equals emulator.dequantize of the same MX data, byte for
    byte, in both storage forms, through .npy and .safetensors outputs."""
    x = _heavy_tailed((8, 96))
    np.save(tmp_path / "x.npy", x)
    q = tmp_path / "x.mx.safetensors"
    assert main(["quantize", str(tmp_path / "x.npy"), "-f", fmt, "-o", str(q), "--json"]
                + ["--plain-u8"] * plain) == 0
    header = _header(q)
    assert header["x.codes"]["dtype"] == ("U8" if plain else NATIVE[fmt])
    assert header["x.scales"]["dtype"] == ("U8" if plain else "F8_E8M0")
    meta = header["__metadata__"]
    assert (meta["format"], meta["axis"], meta["block_size"], json.loads(meta["shape"])) == \
        (fmt, "1", "32", [8, 96])
    assert meta["storage"] == ("plain_u8" if plain else "native")
    ref = dequantize(quantize(x, fmt))
    assert main(["dequantize", str(q), "-o", str(tmp_path / "y.npy")]) == 0
    assert np.load(tmp_path / "y.npy").tobytes() == ref.tobytes()
    assert main(["dequantize", str(q), "-o", str(tmp_path / "y.safetensors")]) == 0
    y = load_file(str(tmp_path / "y.safetensors"))["x"]
    assert y.dtype == np.float32 and y.tobytes() == ref.tobytes()


@pytest.mark.parametrize("fmt,shape,axis,rotation", [
    ("e2m1", (64, 6), 0, "random_sign16:3"),  # F4 packs along the last axis, not the block axis
    ("e2m1", (64, 3), 0, None),               # odd last dimension: the codes fall back to U8
    ("e3m2", (2, 64, 4), 1, "hadamard32"),
    ("int8", (3, 4, 32), -1, None),
])
def test_round_trip_other_axes_and_rotations(tmp_path, capsys, fmt, shape, axis, rotation):
    x = _heavy_tailed(shape, seed=2)
    np.save(tmp_path / "x.npy", x)
    q = tmp_path / "q.safetensors"
    args = ["quantize", str(tmp_path / "x.npy"), "-f", fmt, "--axis", str(axis), "-o", str(q)]
    assert main(args + (["--rotation", rotation] if rotation else [])) == 0
    assert main(["dequantize", str(q), "-o", str(tmp_path / "y.npy")]) == 0
    ref = dequantize(quantize(x, fmt, axis=axis, rotation=rotation))
    assert np.load(tmp_path / "y.npy").tobytes() == ref.tobytes()
    if shape == (64, 3):
        assert _header(q)["x.codes"]["dtype"] == "U8"


def test_native_file_loads_in_torch_as_mx_dtypes(tmp_path, capsys):
    """safetensors.torch reads the native file as torch's MX dtypes, decoding to our values."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file as load_torch
    x = _heavy_tailed((4, 64), seed=3)
    np.save(tmp_path / "x.npy", x)
    for fmt, dtype in (("e2m1", torch.float4_e2m1fn_x2), ("e4m3", torch.float8_e4m3fn),
                       ("e5m2", torch.float8_e5m2), ("int8", torch.int8)):
        q = tmp_path / f"{fmt}.safetensors"
        assert main(["quantize", str(tmp_path / "x.npy"), "-f", fmt, "-o", str(q)]) == 0
        t = load_torch(str(q))
        assert t["x.codes"].dtype == dtype and t["x.scales"].dtype == torch.float8_e8m0fnu
        mx = quantize(x, fmt)
        if fmt == "e2m1":  # torch has no float4 arithmetic: compare the bytes
            assert t["x.codes"].shape == (4, 32)
            assert np.array_equal(unpack(t["x.codes"].view(torch.uint8).numpy(), fmt), mx.codes)
            continue
        values = t["x.codes"].float() * (1 / 64 if fmt == "int8" else 1)
        scales = t["x.scales"].float().repeat_interleave(32, dim=-1)
        assert np.array_equal((values * scales).numpy(), dequantize(mx))


def test_dequantize_reads_files_of_earlier_versions(tmp_path, capsys):
    """The layout ocpmx quantize wrote before native dtypes: U8 codes packed along the axis."""
    x = _heavy_tailed((64, 8), seed=4)
    mx = quantize(x, "e2m1", axis=0)
    meta = {"format": "e2m1", "axis": "0", "block_size": "32", "scale_rule": "floor",
            "rounding": "rne", "seed": "0", "rotation": "none", "shape": "[64, 8]",
            "packing": "along axis; FP4 element 0 in the low nibble; FP6 4 codes per 3 bytes LE"}
    save_file({"w.codes": np.ascontiguousarray(mx.pack()), "w.scales": np.ascontiguousarray(mx.scales)},
              str(tmp_path / "old.safetensors"), metadata=meta)
    assert main(["dequantize", str(tmp_path / "old.safetensors"), "-o", str(tmp_path / "y.npy")]) == 0
    assert np.load(tmp_path / "y.npy").tobytes() == dequantize(mx).tobytes()


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "float8_e4m3fn", "torch.float8_e4m3fn",
                                  "float4_e2m1fn_x2", "MXFP4", "mxint8", "float6_e3m2fn"])
def test_format_by_alias_or_dtype_name(tmp_path, capsys, name):
    from ocpmx.spec import get_format
    x = _heavy_tailed((2, 32), seed=5)
    np.save(tmp_path / "x.npy", x)
    q = tmp_path / "q.safetensors"
    assert main(["quantize", str(tmp_path / "x.npy"), "--format", name, "-o", str(q)]) == 0
    fmt = get_format(name).name
    assert _header(q)["__metadata__"]["format"] == fmt
    assert main(["quantize", str(tmp_path / "x.npy"), "--format", name]) == 0  # default name
    assert (tmp_path / f"x.{fmt}.safetensors").is_file()


def test_help_of_every_flag():
    """Every flag of quantize, dequantize, demo, audit and conform has a help text; defaults
    are shown; quantize explains its scale rule default."""
    from ocpmx.cli import build_parser
    parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for command in ("quantize", "dequantize", "demo", "audit", "conform"):
        for action in subs[command]._actions:
            assert action.help, (command, action.dest)
            if action.default not in (None, False, argparse.SUPPRESS) and action.dest != "help":
                assert "default" in action.help, (command, action.dest)
    text = subs["quantize"].format_help()
    assert "§6.3" in text and "AMD" in text and "(default: floor)" in text
    assert "float4_e2m1fn_x2" in text and "mxfp4" in text
    assert "later" not in parser.description  # the stale "(and later the kernels, ...)"


def test_demo_runs(capsys):
    # --no-train: the training part writes OUT/demo-tiny-mxfp4_all_h16 (under the current
    # directory by default) and is refused when a run is already there
    assert main(["demo", "--rows", "8", "--no-train"]) == 0
    out = capsys.readouterr().out
    assert "hadamard16" in out and "e2m1" in out


def test_console_script_installed():
    r = subprocess.run([sys.executable, "-m", "ocpmx.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "quantize" in r.stdout


def test_wheel_has_only_the_ocpmx_namespace(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next(tmp_path.glob("ocpmx-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ocpmx", next(t for t in tops if t.endswith(".dist-info"))}
    for sub in ("spec", "emulator", "native", "conformance", "llama_train"):
        assert f"ocpmx/{sub}/__init__.py" in names
    assert not any(n.startswith("ocpmx/tests") for n in names)
    for backend in ("triton", "torch", "ml_dtypes", "torchao", "gfloat"):  # package data
        assert f"ocpmx/conformance/deviations/{backend}.json" in names


def test_the_emulator_path_needs_no_triton():
    """Without Triton (macOS, Windows): ocpmx.native imports, quantizes CPU tensors on the
    emulator and trains an MXLinear forward and backward; the Triton backend says what is
    missing."""
    import subprocess
    import sys
    code = """
import sys
sys.modules["triton"] = None  # import triton fails, as where it is not installed
import torch
from ocpmx import native
x = torch.randn(64, 64, requires_grad=True)
q = native.quantize(x.detach(), "e2m1")
lin = native.MXLinear(64, 32, recipe="mxfp4_all_h16")
lin(x).sum().backward()
assert x.grad is not None and "triton" not in sys.modules or sys.modules["triton"] is None
from ocpmx.native import _lazy
try:
    _lazy.kernels.quantize  # what a kernel launch touches first
except ImportError as e:
    print("IMPORT-ERROR:", e)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in __import__("os").environ.items()
                                            if k != "TRITON_INTERPRET"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "IMPORT-ERROR: the Triton kernels need Triton" in done.stdout
