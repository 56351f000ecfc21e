"""Bad inputs to the `ocpmx` command line: exit status 2, one line on stderr naming the problem,
no traceback; and non-finite inputs reported honestly."""
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
from safetensors.numpy import save_file

from ocpmx.cli import main


def fails(capsys, *argv) -> str:
    """Run ``ocpmx argv`` in-process; check exit status 2 and one line on stderr; return it."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2, (code, err, captured.out)
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def run(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ocpmx.cli", *map(str, argv)],
                          capture_output=True, text=True)


@pytest.fixture
def x_npy(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32))
    return path


@pytest.fixture
def q_file(tmp_path, x_npy, capsys):
    path = tmp_path / "x.mx.safetensors"
    assert main(["quantize", str(x_npy), "-o", str(path)]) == 0
    capsys.readouterr()
    return path


def test_missing_input_file(tmp_path):
    r = run("quantize", tmp_path / "nope.npy")  # a real process: no traceback anywhere
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"ocpmx quantize: error: {tmp_path / 'nope.npy'}: "
                                             f"no such file"]


def test_missing_input_file_dequantize(tmp_path, capsys):
    assert "no such file" in fails(capsys, "dequantize", tmp_path / "nope.safetensors",
                                   "-o", tmp_path / "y.npy")


def test_directory_as_input(tmp_path, capsys):
    (tmp_path / "d.npy").mkdir()
    assert "is a directory" in fails(capsys, "quantize", tmp_path / "d.npy")


def test_unsupported_input_suffix(tmp_path, capsys):
    (tmp_path / "x.txt").write_text("1 2 3")
    assert "expected a .npy or .safetensors file" in fails(capsys, "quantize", tmp_path / "x.txt")


def test_output_directory_missing(tmp_path, x_npy, capsys):
    out = tmp_path / "no" / "such" / "q.safetensors"
    err = fails(capsys, "quantize", x_npy, "-o", out)
    assert str(out) in err and "does not exist" in err and ".tmp" not in err


def test_output_under_a_file_checked_before_reading(tmp_path, capsys):
    """The output is checked before any work: the unreadable input is never opened."""
    (tmp_path / "garbage.safetensors").write_bytes(b"\xff" * 100)
    (tmp_path / "f").write_text("a file")
    out = tmp_path / "f" / "q.safetensors"
    err = fails(capsys, "quantize", tmp_path / "garbage.safetensors", "-o", out)
    assert str(out) in err and "not a directory" in err and ".tmp" not in err


def test_output_directory_not_writable(tmp_path, x_npy, capsys):
    import os
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        err = fails(capsys, "quantize", x_npy, "-o", ro / "q.safetensors")
    finally:
        ro.chmod(0o700)
    assert str(ro / "q.safetensors") in err and "cannot write" in err and ".tmp" not in err


def test_output_directory_not_writable_message(tmp_path, x_npy, capsys, monkeypatch):
    """As root the test above cannot make a directory unwritable: make the probe fail instead.
    The message names the user's path, not the probe's temporary file."""
    import types

    from ocpmx import cli

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "tmpXYZ"))
    monkeypatch.setattr(cli, "tempfile", types.SimpleNamespace(TemporaryFile=refuse))
    out = tmp_path / "q.safetensors"
    err = fails(capsys, "quantize", x_npy, "-o", out)
    assert f"output {out}: cannot write in {tmp_path}: Permission denied" in err
    assert "tmpXYZ" not in err and not out.exists()


def test_output_is_a_directory(tmp_path, x_npy, capsys):
    (tmp_path / "d.safetensors").mkdir()
    assert "is a directory" in fails(capsys, "quantize", x_npy, "-o", tmp_path / "d.safetensors")


def test_output_suffix(tmp_path, x_npy, q_file, capsys):
    assert "expected a .safetensors file name" in fails(capsys, "quantize", x_npy, "-o",
                                                        tmp_path / "q.npy")
    assert "expected a .npy or .safetensors file name" in fails(
        capsys, "dequantize", q_file, "-o", tmp_path / "y.txt")


def test_dequantize_output_unwritable(tmp_path, q_file, capsys):
    (tmp_path / "f").write_text("a file")
    err = fails(capsys, "dequantize", q_file, "-o", tmp_path / "f" / "y.npy")
    assert str(tmp_path / "f" / "y.npy") in err and ".tmp" not in err


def test_garbage_safetensors(tmp_path):
    (tmp_path / "g.safetensors").write_bytes(b"garbage" * 10)
    r = run("quantize", tmp_path / "g.safetensors")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "not a valid .safetensors file" in r.stderr and "g.safetensors" in r.stderr


def test_truncated_safetensors(tmp_path, q_file, capsys):
    data = q_file.read_bytes()
    (tmp_path / "t.safetensors").write_bytes(data[:-10])
    assert "not a valid .safetensors file" in fails(capsys, "quantize", tmp_path / "t.safetensors")
    assert "not a valid .safetensors file" in fails(capsys, "dequantize", tmp_path / "t.safetensors",
                                                    "-o", tmp_path / "y.npy")


def test_corrupt_npy(tmp_path, capsys):
    (tmp_path / "c.npy").write_bytes(b"\x93NUMPY garbage")
    assert "not a valid .npy file" in fails(capsys, "quantize", tmp_path / "c.npy")


def test_wrong_key_lists_the_keys(tmp_path, capsys):
    save_file({"a": np.zeros(32, np.float32), "b": np.ones(32, np.float32)},
              str(tmp_path / "two.safetensors"))
    err = fails(capsys, "quantize", tmp_path / "two.safetensors", "--key", "c")
    assert "no tensor 'c'" in err and "['a', 'b']" in err
    assert "choose one with --key" in fails(capsys, "quantize", tmp_path / "two.safetensors")


def test_wrong_key_dequantize(tmp_path, q_file, capsys):
    err = fails(capsys, "dequantize", q_file, "--key", "w", "-o", tmp_path / "y.npy")
    assert "'w'" in err and "['x']" in err


def test_dequantize_of_a_file_that_holds_no_mx_tensor(tmp_path, capsys):
    save_file({"a": np.zeros(32, np.float32)}, str(tmp_path / "plain.safetensors"))
    assert "holds no MX tensor" in fails(capsys, "dequantize", tmp_path / "plain.safetensors",
                                         "-o", tmp_path / "y.npy")


def test_empty_array(tmp_path, capsys):
    np.save(tmp_path / "e.npy", np.zeros((0, 32), np.float32))
    assert "is empty (shape (0, 32))" in fails(capsys, "quantize", tmp_path / "e.npy")


@pytest.mark.parametrize("array", [np.zeros((2, 32), np.complex64), np.array(["a"] * 32),
                                   np.arange(32, dtype=np.int32)], ids=["complex", "str", "int"])
def test_wrong_dtype(tmp_path, capsys, array):
    np.save(tmp_path / "w.npy", array)
    err = fails(capsys, "quantize", tmp_path / "w.npy")
    assert f"has dtype {array.dtype.name}" in err and "expected float32" in err


def test_object_array(tmp_path, capsys):
    np.save(tmp_path / "o.npy", np.array([None] * 32, dtype=object), allow_pickle=True)
    assert "dtype object" in fails(capsys, "quantize", tmp_path / "o.npy")


def test_wrong_dtype_safetensors(tmp_path, capsys):
    save_file({"i": np.zeros(32, np.int64)}, str(tmp_path / "i.safetensors"))
    assert "has dtype I64" in fails(capsys, "quantize", tmp_path / "i.safetensors")


def test_float16_accepted(tmp_path, capsys):
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float16)
    save_file({"h": x}, str(tmp_path / "h.safetensors"))
    assert main(["quantize", str(tmp_path / "h.safetensors"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["relative_error"] > 0


@pytest.mark.parametrize("axis", ["2", "-3"])
def test_axis_out_of_range(x_npy, capsys, axis):
    assert f"axis {axis} is out of range" in fails(capsys, "quantize", x_npy, "--axis", axis)


def test_block_size_does_not_divide(x_npy, capsys):
    assert "not divisible by the block size 48" in fails(capsys, "quantize", x_npy,
                                                         "--block-size", "48")


@pytest.mark.parametrize("size", ["0", "-32", "x"])
def test_block_size_not_positive(x_npy, capsys, size):
    err = fails(capsys, "quantize", x_npy, "--block-size", size)
    assert "--block-size" in err and "positive integer" in err


def test_unknown_format(x_npy, capsys):
    err = fails(capsys, "quantize", x_npy, "--format", "float8_e4m3fnuz")
    assert "FNUZ" in err and "--format" in err


def test_all_nan_input_is_reported_honestly(tmp_path, capsys):
    np.save(tmp_path / "n.npy", np.full((2, 32), np.nan, np.float32))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["quantize", str(tmp_path / "n.npy")]) == 0
        text = capsys.readouterr().out
        assert main(["quantize", str(tmp_path / "n.npy"), "--json"]) == 0
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], \
        [str(w.message) for w in caught]
    assert "relative error        undefined" in text and "relative error        0" not in text
    assert "64 NaN, 0 Inf" in text and "NaN blocks            2" in text
    stats = json.loads(capsys.readouterr().out)
    assert stats["relative_error"] is None and stats["nan_inputs"] == 64
    assert stats["error_elements"] == 0


def test_some_non_finite_inputs(tmp_path, capsys):
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    x[0, 3], x[1, 40] = np.nan, np.inf
    np.save(tmp_path / "m.npy", x)
    assert main(["quantize", str(tmp_path / "m.npy"), "--format", "e4m3", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["nan_inputs"], stats["inf_inputs"], stats["nan_blocks"]) == (1, 1, 2)
    assert stats["error_elements"] == 64 and 0 < stats["relative_error"] < 0.1


def test_conform_unwritable_report_fails_before_the_suite(tmp_path, capsys):
    (tmp_path / "f").write_text("a file")
    report = tmp_path / "f" / "r.json"
    err = fails(capsys, "conform", "--backend", "emulator", "--report", report)
    assert str(report) in err and "--report" in err
    assert not (tmp_path / "f").is_dir()


def test_conform_report_fails_before_the_suite_prints(tmp_path):
    (tmp_path / "f").write_text("a file")
    r = run("conform", "--backend", "emulator", "--report", tmp_path / "f" / "r.json")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stdout == ""  # no header, no check ran
    assert len(r.stderr.strip().splitlines()) == 1
