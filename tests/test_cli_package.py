"""`ocpmx quantize` end to end, and the installed package layout."""
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
from ocpmx.emulator import quantize, unpack

ROOT = Path(__file__).resolve().parents[1]


def test_quantize_npy(tmp_path, capsys):
    x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "x.mx.safetensors"
    assert main(["quantize", str(tmp_path / "x.npy"), "--format", "e2m1", "--rotation", "hadamard16",
                 "-o", str(out), "--json"]) == 0
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
    assert main(["quantize", str(path), "--axis", "0", "--format", "e4m3", "--scale-rule", "even"]) == 0
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
    with pytest.raises(SystemExit, match="choose one with --key"):
        main(["quantize", str(tmp_path / "two.safetensors")])
    np.save(tmp_path / "i.npy", np.zeros(32, np.int32))
    assert main(["quantize", str(tmp_path / "i.npy")]) == 2
    assert "float32, float64 or bfloat16" in capsys.readouterr().err


def test_demo_runs(capsys):
    assert main(["demo", "--rows", "8"]) == 0
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
